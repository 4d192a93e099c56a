//! Logging setup: tracing to stderr or syslog; `RUST_LOG` overrides `--log-level`.
//!
//! Policy (from cloud-hypervisor): error = an operator's request failed or the process exits;
//! warn = abnormal but handled (malformed guest request, ignored option); info = rare lifecycle
//! events (listening, connected, disconnected); debug/trace = per request. Guest-caused errnos
//! are debug. Never log file contents, xattr values or Ceph secrets.
//!
//! The rust-vmm crates log through `log`; tracing-subscriber's `try_init` installs the
//! tracing-log bridge so their records arrive here too.
//!
//! A guest can make most warn/error lines happen at will (malformed chains, bad requests),
//! as fast as it can send them. So every line at info level and above goes through a token
//! bucket of its own call site ([`RateLimiter`]): a site may log [`BURST`] lines at once and
//! [`PER_SECOND`] a second after that; what it drops is counted and reported in one
//! "suppressed" line once it logs again (or at the latest a second after it went quiet, at
//! the next line logged). A flood at one site never pushes out another site's lines, and
//! the quarantine module's lines (its audit lines are rate-limited there, with their own
//! count) and those of an `audit` target are never limited. Debug and trace lines are per
//! request by design and are not limited: an operator turns them on knowingly.
//! fuse-backend-rs's info/warn/error lines are dropped: they report guest-caused request
//! errors (which our server logs at debug) and some carry a whole request body.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{self, IsTerminal, Write};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::{Event, Level, Metadata, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::format::Writer as FmtWriter;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// Log verbosity (`--log-level`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
    /// Logging disabled.
    Off,
}

/// Logging settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    pub level: LogLevel,
    pub syslog: bool,
    /// A request in flight this long is reported by the watchdog; zero = the watchdog is off.
    pub slow_request: Duration,
}

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

/// Lines a call site may log at once.
pub const BURST: u32 = 10;
/// Lines a call site may log per second once its burst is spent.
pub const PER_SECOND: u32 = 1;
/// Most call sites with a bucket of their own; past that, new sites share one.
const MAX_SITES: usize = 4096;
/// Targets never rate-limited: audit lines (limited at their source) and the quarantine
/// watcher's operator-facing lines.
const UNLIMITED_TARGETS: [&str; 2] = ["audit", "ceph_virtiofsd::quarantine"];
/// Targets whose info/warn/error lines are dropped (see the module documentation).
const DROPPED_TARGETS: [&str; 1] = ["fuse_backend_rs"];

/// Writes a "suppressed" report line, outside the tracing pipeline.
type Report = Box<dyn Fn(&str) + Send + Sync>;
type Clock = Box<dyn Fn() -> Instant + Send + Sync>;

/// One call site's token bucket.
#[derive(Debug)]
struct Bucket {
    /// Lines that may still be logged, in thousandths.
    milli_tokens: u64,
    refilled: Instant,
    suppressed: u64,
    last_suppressed: Instant,
    site: String,
}

#[derive(Debug, Default)]
struct Buckets {
    sites: HashMap<u64, Bucket>,
    last_sweep: Option<Instant>,
}

/// Per-call-site rate limiting of log lines (see the module documentation).
pub struct RateLimiter {
    buckets: Mutex<Buckets>,
    report: Report,
    clock: Clock,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter").finish_non_exhaustive()
    }
}

fn starts_with_any(target: &str, prefixes: &[&str]) -> bool {
    prefixes.iter().any(|p| {
        target
            .strip_prefix(p)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

impl RateLimiter {
    /// A limiter writing its "suppressed" lines with `report`, timed by `clock`.
    pub fn new(
        report: impl Fn(&str) + Send + Sync + 'static,
        clock: impl Fn() -> Instant + Send + Sync + 'static,
    ) -> Self {
        RateLimiter {
            buckets: Mutex::default(),
            report: Box::new(report),
            clock: Box::new(clock),
        }
    }

    /// Whether a line of `meta` may be logged now.
    pub fn admit(&self, meta: &Metadata<'_>) -> bool {
        let level = *meta.level();
        let target = meta.target();
        if level > Level::INFO {
            return true;
        }
        if starts_with_any(target, &DROPPED_TARGETS) {
            return false;
        }
        if starts_with_any(target, &UNLIMITED_TARGETS) {
            return true;
        }
        let mut h = DefaultHasher::new();
        (level.as_str(), target, meta.file(), meta.line()).hash(&mut h);
        let key = h.finish();
        let now = (self.clock)();
        let mut reports = Vec::new();
        let admitted = {
            let mut b = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
            let key = if b.sites.len() >= MAX_SITES && !b.sites.contains_key(&key) {
                0
            } else {
                key
            };
            let bucket = b.sites.entry(key).or_insert_with(|| Bucket {
                milli_tokens: u64::from(BURST) * 1000,
                refilled: now,
                suppressed: 0,
                last_suppressed: now,
                site: if key == 0 {
                    "(other sites)".to_owned()
                } else {
                    format!(
                        "{} {} {}:{}",
                        level,
                        target,
                        meta.file().unwrap_or("?"),
                        meta.line().unwrap_or(0)
                    )
                },
            });
            let elapsed = now.saturating_duration_since(bucket.refilled);
            let gained = u64::try_from(elapsed.as_millis())
                .unwrap_or(u64::MAX)
                .saturating_mul(u64::from(PER_SECOND));
            bucket.milli_tokens = bucket
                .milli_tokens
                .saturating_add(gained)
                .min(u64::from(BURST) * 1000);
            bucket.refilled = now;
            let admitted = bucket.milli_tokens >= 1000;
            if admitted {
                bucket.milli_tokens -= 1000;
                if bucket.suppressed > 0 {
                    reports.push((bucket.site.clone(), std::mem::take(&mut bucket.suppressed)));
                }
            } else {
                bucket.suppressed += 1;
                bucket.last_suppressed = now;
            }
            // Sites that went quiet while suppressing: report them too, once a second at most.
            let sweep_due = b.last_sweep.map_or(true, |t| {
                now.saturating_duration_since(t) >= Duration::from_secs(1)
            });
            if sweep_due {
                b.last_sweep = Some(now);
                for bucket in b.sites.values_mut() {
                    if bucket.suppressed > 0
                        && now.saturating_duration_since(bucket.last_suppressed)
                            >= Duration::from_secs(1)
                    {
                        reports.push((bucket.site.clone(), std::mem::take(&mut bucket.suppressed)));
                    }
                }
            }
            admitted
        };
        for (site, n) in reports {
            (self.report)(&format!(
                "suppressed {n} log lines from {site} (more than {PER_SECOND}/s after a burst of {BURST})"
            ));
        }
        admitted
    }
}

/// The tracing layer applying a [`RateLimiter`] to every event.
#[derive(Debug)]
pub struct RateLimit(pub Arc<RateLimiter>);

impl<S: Subscriber> Layer<S> for RateLimit {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        // Records bridged from `log` carry their real target and site in their fields.
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        self.0.admit(meta)
    }
}

/// A "suppressed" line as the stderr formatter would print a warning.
fn stderr_report(line: &str) {
    let mut time = String::new();
    let _ = SystemTime.format_time(&mut FmtWriter::new(&mut time));
    let _ = writeln!(Stderr, "{time}  WARN {}: {line}", module_path!());
}

/// Log lines dropped because stderr stayed full (see [`Stderr`]).
static STDERR_DROPPED: AtomicU64 = AtomicU64::new(0);

/// How long one line may wait for a full stderr pipe before it is dropped.
const STDERR_WAIT_MS: i32 = 20;

/// stderr for log lines, never failing. libcephfs makes fd 2 non-blocking when it creates its
/// context, so once whoever reads the daemon's stderr falls behind, a write fails with EAGAIN;
/// tracing-subscriber reports a failed write with `eprintln!`, which panics when stderr fails,
/// in whatever thread logged: a vring worker, whose queue then stopped for good (the hostile
/// suite's log flood). Here a line waits a little for room and is otherwise dropped and
/// counted; the count is written with the next line that gets through.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stderr;

impl Stderr {
    fn write_fd(buf: &[u8]) -> io::Result<usize> {
        // SAFETY: fd 2 is the process's stderr; buf is valid for buf.len() bytes.
        let n = unsafe { libc::write(2, buf.as_ptr().cast(), buf.len()) };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }

    fn wait_writable() -> bool {
        let mut p = libc::pollfd {
            fd: 2,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the duration of the call.
        unsafe { libc::poll(&mut p, 1, STDERR_WAIT_MS) > 0 }
    }

    /// Write all of `buf`, waiting at most once for room; false if it had to be given up.
    fn write_line(buf: &[u8]) -> bool {
        let mut rest = buf;
        let mut waited = false;
        while !rest.is_empty() {
            match Self::write_fd(rest) {
                Ok(0) => return false,
                Ok(n) => rest = rest.get(n..).unwrap_or_default(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !waited => {
                    waited = true;
                    if !Self::wait_writable() {
                        return false;
                    }
                }
                Err(_) => return false,
            }
        }
        true
    }
}

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let dropped = STDERR_DROPPED.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let note = format!(
                "ceph-virtiofsd: {dropped} log lines dropped: stderr was full (is the log \
                 collector keeping up?)\n"
            );
            if !Self::write_line(note.as_bytes()) {
                STDERR_DROPPED.fetch_add(dropped, Ordering::Relaxed);
            }
        }
        if !Self::write_line(buf) {
            STDERR_DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        // Never an error: the formatter would report it on stderr, and panic there.
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Stderr;
    fn make_writer(&'a self) -> Stderr {
        Stderr
    }
}

/// Install the global subscriber. Call once, early in `main`.
pub fn init(config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(filter_directive(config.level)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(io::stderr().is_terminal());
    let stderr_limit = || RateLimit(Arc::new(RateLimiter::new(stderr_report, Instant::now)));
    let result = if config.syslog {
        match connect_syslog() {
            Ok(syslog) => {
                let reporter = syslog.clone();
                let report = move |line: &str| {
                    let mut w = SyslogLine {
                        syslog: &reporter,
                        priority: LOG_DAEMON | 4,
                    };
                    let _ = w.write_all(line.as_bytes());
                };
                builder
                    .with_ansi(false)
                    .without_time()
                    .with_target(false)
                    .with_writer(syslog)
                    .finish()
                    .with(RateLimit(Arc::new(RateLimiter::new(report, Instant::now))))
                    .try_init()
            }
            Err(e) => {
                let r = builder
                    .with_writer(Stderr)
                    .finish()
                    .with(stderr_limit())
                    .try_init();
                tracing::warn!(
                    error = %e,
                    "--syslog: cannot connect to {SYSLOG_SOCKET} (is a syslog daemon running?); logging to stderr"
                );
                r
            }
        }
    } else {
        builder
            .with_writer(Stderr)
            .finish()
            .with(stderr_limit())
            .try_init()
    };
    if let Err(e) = result {
        eprintln!("ceph-virtiofsd: logging was already initialised: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything written, by the formatter and by the limiter's reports.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Capture {
        type Writer = Capture;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    impl Capture {
        fn lines(&self) -> Vec<String> {
            let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            String::from_utf8_lossy(&bytes)
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    fn count(lines: &[String], needle: &str) -> usize {
        lines.iter().filter(|l| l.contains(needle)).count()
    }

    /// A guest flooding one warning site gets a burst through, then one line a second and a
    /// count of what was dropped; the audit lines, another site's lines and debug lines still
    /// all arrive, and fuse-backend-rs's body-carrying error lines never do.
    #[test]
    fn hostile_log_flood_is_rate_limited_and_audit_lines_survive() {
        let capture = Capture::default();
        let now = Arc::new(Mutex::new(Instant::now()));
        let clock = {
            let now = now.clone();
            move || *now.lock().unwrap_or_else(PoisonError::into_inner)
        };
        let report = {
            let w = capture.clone();
            move |line: &str| {
                let _ = writeln!(w.clone(), "WARN {line}");
            }
        };
        let limiter = Arc::new(RateLimiter::new(report, clock));
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new("debug"))
            .with_writer(capture.clone())
            .finish()
            .with(RateLimit(limiter));
        // The log-to-tracing bridge, as `try_init` installs it (a no-op if another test did).
        let _ = tracing_log::LogTracer::init();
        let advance = |secs: u64| {
            let mut t = now.lock().unwrap_or_else(PoisonError::into_inner);
            *t += Duration::from_secs(secs);
        };
        tracing::subscriber::with_default(subscriber, || {
            let body = "B".repeat(4096);
            for i in 0..10_000 {
                tracing::warn!(i, "Malformed request from the guest");
                if i % 1000 == 0 {
                    tracing::warn!(target: "ceph_virtiofsd::quarantine", "quarantine: operation denied");
                    tracing::debug!("FUSE request done");
                    log::error!(target: "fuse_backend_rs::api::server::sync_io",
                        "fuse: bytes to cstr error: {body:?}");
                    tracing::error!(target: "fuse_backend_rs::api::server::sync_io",
                        "fuse: bytes to cstr error: {body:?}");
                }
            }
            tracing::info!("vhost-user frontend disconnected");
            advance(3);
            tracing::warn!(i = 10_000, "Malformed request from the guest");
        });
        let lines = capture.lines();
        // The burst, then after 3 s of silence one more line.
        assert_eq!(
            count(&lines, "Malformed request"),
            BURST as usize + 1,
            "{lines:#?}"
        );
        assert_eq!(
            count(&lines, &format!("suppressed {} log lines", 10_000 - BURST)),
            1,
            "{lines:#?}"
        );
        assert_eq!(count(&lines, "quarantine: operation denied"), 10);
        assert_eq!(count(&lines, "FUSE request done"), 10);
        assert_eq!(count(&lines, "frontend disconnected"), 1);
        assert_eq!(count(&lines, "bytes to cstr"), 0);
        assert_eq!(count(&lines, "BBBB"), 0);
    }

    /// A site that stops while suppressing still gets its count reported, at the next line
    /// of any site a second later.
    #[test]
    fn hostile_suppressed_count_of_a_quiet_site_is_reported() {
        let reports = Arc::new(Mutex::new(Vec::<String>::new()));
        let now = Arc::new(Mutex::new(Instant::now()));
        let limiter = {
            let (reports, now) = (reports.clone(), now.clone());
            RateLimiter::new(
                move |l: &str| {
                    reports
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(l.to_owned())
                },
                move || *now.lock().unwrap_or_else(PoisonError::into_inner),
            )
        };
        let flood = tracing::Metadata::new(
            "flood",
            "ceph_virtiofsd::vhost_user",
            Level::WARN,
            Some("src/vhost_user.rs"),
            Some(1),
            None,
            tracing::field::FieldSet::new(&[], tracing::callsite::Identifier(&CALLSITE)),
            tracing::metadata::Kind::EVENT,
        );
        let other = tracing::Metadata::new(
            "other",
            "ceph_virtiofsd::daemon",
            Level::INFO,
            Some("src/daemon.rs"),
            Some(2),
            None,
            tracing::field::FieldSet::new(&[], tracing::callsite::Identifier(&CALLSITE)),
            tracing::metadata::Kind::EVENT,
        );
        let admitted = (0..100).filter(|_| limiter.admit(&flood)).count();
        assert_eq!(admitted, BURST as usize);
        assert!(limiter.admit(&other));
        *now.lock().unwrap_or_else(PoisonError::into_inner) += Duration::from_secs(2);
        assert!(limiter.admit(&other));
        let reports = reports.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(reports.len(), 1, "{reports:?}");
        assert!(
            reports[0].starts_with(
                "suppressed 90 log lines from WARN ceph_virtiofsd::vhost_user src/vhost_user.rs:1"
            ),
            "{reports:?}"
        );
    }

    struct TestCallsite;
    static CALLSITE: TestCallsite = TestCallsite;
    impl tracing::callsite::Callsite for TestCallsite {
        fn set_interest(&self, _: tracing::subscriber::Interest) {}
        fn metadata(&self) -> &Metadata<'_> {
            unimplemented!("not registered")
        }
    }
}
