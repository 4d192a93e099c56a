//! Logging setup: tracing to stderr or syslog; `RUST_LOG` overrides `--log-level`.
//!
//! Policy (from cloud-hypervisor): error = an operator's request failed or the process exits;
//! warn = abnormal but handled (malformed guest request, ignored option); info = rare lifecycle
//! events (listening, connected, disconnected); debug/trace = per request. Guest-caused errnos
//! are debug. Never log file contents, xattr values or Ceph secrets.
//!
//! The rust-vmm crates log through `log`; tracing-subscriber's `try_init` installs the
//! tracing-log bridge so their records arrive here too.

use std::io::{self, IsTerminal, Write};
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::args::LogLevel;
use crate::config::LogConfig;

const SYSLOG_SOCKET: &str = "/dev/log";
/// syslog facility LOG_DAEMON, shifted.
const LOG_DAEMON: u8 = 3 << 3;

fn filter_directive(level: LogLevel) -> &'static str {
    match level {
        LogLevel::Error => "error",
        LogLevel::Warn => "warn",
        LogLevel::Info => "info",
        LogLevel::Debug => "debug",
        LogLevel::Trace => "trace",
        LogLevel::Off => "off",
    }
}

/// Writes each formatted event as one datagram to /dev/log.
#[derive(Debug, Clone)]
struct Syslog {
    socket: Arc<UnixDatagram>,
    tag: Arc<str>,
}

/// One event's writer: knows the event's syslog priority.
#[derive(Debug)]
struct SyslogLine<'a> {
    syslog: &'a Syslog,
    priority: u8,
}

impl Write for SyslogLine<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let line = format!(
            "<{}>{}[{}]: {}",
            self.priority,
            self.syslog.tag,
            std::process::id(),
            text.trim_end()
        );
        // A lost log line must not take the daemon down.
        let _ = self.syslog.socket.send(line.as_bytes());
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Syslog {
    type Writer = SyslogLine<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        SyslogLine {
            syslog: self,
            priority: LOG_DAEMON | 6,
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        let severity = match *meta.level() {
            Level::ERROR => 3,
            Level::WARN => 4,
            Level::INFO => 6,
            Level::DEBUG | Level::TRACE => 7,
        };
        SyslogLine {
            syslog: self,
            priority: LOG_DAEMON | severity,
        }
    }
}

fn connect_syslog() -> io::Result<Syslog> {
    let socket = UnixDatagram::unbound()?;
    socket.connect(SYSLOG_SOCKET)?;
    Ok(Syslog {
        socket: Arc::new(socket),
        tag: Arc::from("ceph-virtiofsd"),
    })
}

/// Install the global subscriber. Call once, early in `main`.
pub fn init(config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(filter_directive(config.level)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(io::stderr().is_terminal());
    let result = if config.syslog {
        match connect_syslog() {
            Ok(syslog) => builder
                .with_ansi(false)
                .without_time()
                .with_target(false)
                .with_writer(syslog)
                .finish()
                .try_init(),
            Err(e) => {
                let r = builder.with_writer(io::stderr).finish().try_init();
                tracing::warn!(
                    error = %e,
                    "--syslog: cannot connect to {SYSLOG_SOCKET} (is a syslog daemon running?); logging to stderr"
                );
                r
            }
        }
    } else {
        builder.with_writer(io::stderr).finish().try_init()
    };
    if let Err(e) = result {
        eprintln!("ceph-virtiofsd: logging was already initialised: {e}");
    }
}
