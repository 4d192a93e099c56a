//! systemd's service notification protocol (sd_notify(3)), without libsystemd: one datagram per
//! message to the unix socket named by `NOTIFY_SOCKET`.
//!
//! - `READY=1` once the vhost-user socket listens and CephFS is mounted (`Type=notify`:
//!   `systemctl start` returns only then, so a guest started right after finds the socket);
//! - `WATCHDOG=1` every quarter of `WATCHDOG_USEC` (`WatchdogSec=`) while the daemon is
//!   healthy: the control thread (signals, slow-request watchdog) is running and the
//!   filesystem's tables answer (their locks are not wedged). A daemon that stops answering
//!   stops pinging, and systemd aborts it (SIGABRT: a core dump shows where it hung) and
//!   restarts it. A slow or unreachable cluster is not a wedge: it is reported by the
//!   slow-request watchdog, and restarting the daemon would not bring the cluster back;
//! - `STOPPING=1` when the daemon begins to stop.
//!
//! Without `NOTIFY_SOCKET` (not started by systemd with `Type=notify`) every call does nothing.
//! [`init_from_env`] reads and removes the variables first thing in `main`, before any thread
//! exists; the socket is opened then, so sending needs no file access after the sandbox is up.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Where and how often to notify.
#[derive(Debug)]
struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
    /// `WATCHDOG_USEC`, when it is meant for this process.
    watchdog: Option<Duration>,
}

static NOTIFIER: OnceLock<Option<Notifier>> = OnceLock::new();

/// Ticks of the control thread ([`heartbeat`]), read by the watchdog thread.
static HEARTBEAT: AtomicU64 = AtomicU64::new(0);

/// [`stopping`] was called: the watchdog thread stops pinging (the control thread is being
/// stopped, and systemd's stop timeout now bounds the daemon).
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Why notification could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("NOTIFY_SOCKET {0:?} is not an absolute path or an abstract socket name (@...)")]
    BadSocket(String),
    #[error("Cannot create the notification socket for NOTIFY_SOCKET {0:?}")]
    Socket(String, #[source] io::Error),
}

/// The address of `NOTIFY_SOCKET`: a path, or an abstract name given as `@name`.
fn parse_addr(value: &str) -> Result<SocketAddr, NotifyError> {
    let bad = || NotifyError::BadSocket(value.to_owned());
    if let Some(name) = value.strip_prefix('@') {
        return SocketAddr::from_abstract_name(name.as_bytes()).map_err(|_| bad());
    }
    if !value.starts_with('/') {
        return Err(bad());
    }
    SocketAddr::from_pathname(value).map_err(|_| bad())
}

/// `WATCHDOG_USEC` when `WATCHDOG_PID` is unset or names this process.
fn parse_watchdog(usec: Option<&str>, pid: Option<&str>) -> Option<Duration> {
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    let usec = usec?.trim().parse::<u64>().ok().filter(|u| *u > 0)?;
    Some(Duration::from_micros(usec))
}

/// Read `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`, remove them from the environment
/// (nothing this process starts may notify in its name) and open the socket. Call once, before
/// any other thread exists (it changes the environment).
pub fn init_from_env() -> Result<(), NotifyError> {
    let socket = std::env::var("NOTIFY_SOCKET").ok();
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    for var in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"] {
        std::env::remove_var(var);
    }
    let notifier = match socket.filter(|s| !s.is_empty()) {
        None => None,
        Some(value) => {
            let addr = parse_addr(&value)?;
            let socket =
                UnixDatagram::unbound().map_err(|e| NotifyError::Socket(value.clone(), e))?;
            Some(Notifier {
                socket,
                addr,
                watchdog: parse_watchdog(usec.as_deref(), pid.as_deref()),
            })
        }
    };
    let _ = NOTIFIER.set(notifier);
    Ok(())
}

fn notifier() -> Option<&'static Notifier> {
    NOTIFIER.get().and_then(Option::as_ref)
}

/// Send one notification (`KEY=VALUE` lines). A failure is logged, never fatal: the daemon
/// serves the guest whether or not systemd hears of it.
fn send(message: &str) {
    let Some(n) = notifier() else {
        return;
    };
    if let Err(e) = n.socket.send_to_addr(message.as_bytes(), &n.addr) {
        tracing::warn!(error = %e, message, "Cannot notify systemd (NOTIFY_SOCKET)");
    }
}

/// `READY=1`: the socket listens and CephFS is mounted. `status` is shown by `systemctl
/// status`.
pub fn ready(status: &str) {
    let status = status.replace('\n', " ");
    send(&format!(
        "READY=1\nSTATUS={status}\nMAINPID={}",
        std::process::id()
    ));
}

/// `STOPPING=1`: the daemon is stopping; no more watchdog pings.
pub fn stopping() {
    STOPPING.store(true, Ordering::Relaxed);
    send("STOPPING=1\nSTATUS=Stopping");
}

/// The watchdog period systemd asked for (`WatchdogSec=`), if any.
pub fn watchdog_period() -> Option<Duration> {
    notifier().and_then(|n| n.watchdog)
}

/// The control thread's part of the watchdog: a tick every eighth of the period, for as long
/// as the thread runs its loop. Never returns (pending forever without a watchdog).
pub async fn heartbeat() {
    let Some(period) = watchdog_period() else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval((period / 8).max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        HEARTBEAT.fetch_add(1, Ordering::Relaxed);
    }
}

/// Start the watchdog thread: every quarter of the period, `WATCHDOG=1` if the control thread
/// ticked since the last look and `probe` (which takes the filesystem's table locks) returned.
/// A ping that is skipped once is no failure: systemd acts only after a whole period without
/// one. Does nothing without a watchdog.
pub fn start_watchdog(probe: impl Fn() + Send + 'static) -> io::Result<()> {
    let Some(period) = watchdog_period() else {
        return Ok(());
    };
    tracing::info!(
        period_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX),
        "systemd watchdog on: pinging while the control thread and the filesystem answer"
    );
    std::thread::Builder::new()
        .name("sd-watchdog".to_owned())
        .spawn(move || {
            let mut last = HEARTBEAT.load(Ordering::Relaxed);
            loop {
                std::thread::sleep((period / 4).max(Duration::from_millis(1)));
                if STOPPING.load(Ordering::Relaxed) {
                    return;
                }
                probe();
                let now = HEARTBEAT.load(Ordering::Relaxed);
                if now != last {
                    send("WATCHDOG=1");
                } else {
                    tracing::warn!(
                        "The control thread did not tick for a quarter of the systemd watchdog \
                         period: no WATCHDOG=1 this time"
                    );
                }
                last = now;
            }
        })
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_watchdog_settings() {
        assert!(parse_addr("/run/systemd/notify").is_ok());
        let abs = parse_addr("@/org/freedesktop/systemd1/notify").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            abs.as_abstract_name(),
            Some(&b"/org/freedesktop/systemd1/notify"[..])
        );
        assert!(matches!(
            parse_addr("relative"),
            Err(NotifyError::BadSocket(_))
        ));
        let me = std::process::id().to_string();
        assert_eq!(
            parse_watchdog(Some("30000000"), None),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_watchdog(Some("30000000"), Some(&me)),
            Some(Duration::from_secs(30))
        );
        assert_eq!(parse_watchdog(Some("30000000"), Some("1")), None);
        assert_eq!(parse_watchdog(Some("0"), None), None);
        assert_eq!(parse_watchdog(Some("x"), None), None);
        assert_eq!(parse_watchdog(None, None), None);
    }
}
