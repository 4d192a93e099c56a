//! The slow-request watchdog: no guest request waits forever without anyone knowing.
//!
//! A libcephfs call can block for good (a write waiting for a max_size grant the MDS never
//! sends, an MDS or OSD that does not answer), and the guest then hangs in that request with
//! nothing on the host saying so. Once a second, on the control plane, the watchdog reads every
//! serving thread's current request ([`super::inflight`]). A request in flight for longer than
//! `--slow-request-secs` is logged once at warn, and once more at error when it reaches ten
//! times the bound, with its opcode, ids, handle/offset/size, queue and age, and with what
//! libcephfs is waiting for as far as its admin socket tells: metadata requests sent to an MDS
//! (`mds_requests`), operations sent to OSDs (`objecter_requests`), or neither, in which case
//! the call waits inside the client (for caps or a max_size grant). It is counted in
//! `fuse_slow_requests_total{op}`, and `fuse_requests_stuck` says how many are stuck now.
//! A slow request that finishes between two scans is counted (and logged) by the thread that
//! served it, so the counter misses none and counts none twice.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::ceph::ClientWaits;
use super::inflight::{self, RequestInfo, Slot, Snapshot};
use super::Metrics;
use crate::wire::opcode_name;

/// How often the watchdog looks.
pub const SCAN_PERIOD: Duration = Duration::from_secs(1);
/// A request this many times older than the bound is logged again, at error.
pub const ESCALATE_FACTOR: u32 = 10;

/// How loudly a slow request has been reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Past the bound: warn.
    Slow,
    /// Past ten times the bound: error.
    VerySlow,
}

/// A request to log in this scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub level: Level,
    pub request: Snapshot,
    pub age: Duration,
}

/// What one scan found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scan {
    /// Requests in flight for longer than the bound.
    pub stuck: u64,
    /// Those to log now: newly past the bound, or newly past ten times it.
    pub reports: Vec<Report>,
}

/// The detection logic, apart from clocks, threads and logging (so it can be tested with
/// requests started in the past).
#[derive(Debug)]
pub struct Watch {
    bound: Duration,
    /// The stuck requests of the last scan (slot, seq) and how they were reported.
    reported: HashMap<(u64, u64), Level>,
}

impl Watch {
    pub fn new(bound: Duration) -> Self {
        Watch {
            bound,
            reported: HashMap::new(),
        }
    }

    fn level(&self, age: Duration) -> Option<Level> {
        if age >= self.bound.saturating_mul(ESCALATE_FACTOR) {
            Some(Level::VerySlow)
        } else if age >= self.bound {
            Some(Level::Slow)
        } else {
            None
        }
    }

    /// Look at every slot at `now_ns` ([`inflight::clock_ns`] time): count the stuck requests,
    /// count each new one in `metrics`, and say which to log.
    pub fn scan(&mut self, slots: &[&Slot], now_ns: u64, metrics: &Metrics) -> Scan {
        let mut scan = Scan::default();
        let mut still = HashMap::new();
        for slot in slots {
            let Some(request) = slot.read() else { continue };
            let age = Duration::from_nanos(now_ns.saturating_sub(request.started_ns));
            let Some(level) = self.level(age) else {
                continue;
            };
            let key = (request.slot, request.seq);
            let before = self.reported.get(&key).copied();
            if before.is_none() {
                // First sight: count it, unless its thread just finished it and counted it.
                if !slot.claim(request.seq) {
                    continue;
                }
                metrics.record_slow_request(request.info.opcode);
            }
            scan.stuck += 1;
            if !matches!(before, Some(b) if b >= level) {
                scan.reports.push(Report {
                    level,
                    request,
                    age,
                });
            }
            still.insert(key, before.map_or(level, |b| b.max(level)));
        }
        self.reported = still;
        metrics.set_requests_stuck(scan.stuck);
        scan
    }
}

/// Where the watchdog runs and what it asks.
#[derive(Debug, Clone)]
pub struct Watchdog {
    pub bound: Duration,
    /// libcephfs's admin socket, to tell what it waits for; `None`: not configured.
    pub admin_socket: Option<PathBuf>,
}

impl Watchdog {
    /// Scan every [`SCAN_PERIOD`] for ever (run it on the control plane's runtime). Requests
    /// are only tracked once [`inflight::set_slow_bound`] was called with the same bound.
    pub async fn run(self) {
        let metrics = super::global();
        let mut watch = Watch::new(self.bound);
        let mut tick = tokio::time::interval(SCAN_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let slots = inflight::registry().slots();
            let scan = watch.scan(&slots, inflight::clock_ns(Instant::now()), metrics);
            if scan.reports.is_empty() {
                continue;
            }
            let waits = match &self.admin_socket {
                Some(path) => Some(ClientWaits::query(path).await),
                None => None,
            };
            let waits = Waits::from(waits);
            for report in &scan.reports {
                log_report(report, self.bound, &waits);
            }
        }
    }
}

/// What libcephfs was waiting for when a scan found slow requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waits {
    /// No admin socket is configured.
    NoSocket,
    /// The admin socket took the command but did not answer in time.
    TimedOut,
    /// The admin socket could not be asked (missing, refused, not allowed).
    Unreachable(String),
    Known(ClientWaits),
}

impl From<Option<std::io::Result<ClientWaits>>> for Waits {
    fn from(answer: Option<std::io::Result<ClientWaits>>) -> Self {
        match answer {
            None => Waits::NoSocket,
            Some(Err(e)) if e.kind() == std::io::ErrorKind::TimedOut => Waits::TimedOut,
            Some(Err(e)) => Waits::Unreachable(e.to_string()),
            Some(Ok(w)) => Waits::Known(w),
        }
    }
}

impl Waits {
    /// A short label for the log's `waits_on` field.
    pub fn label(&self) -> &'static str {
        match self {
            Waits::NoSocket | Waits::TimedOut | Waits::Unreachable(_) => "unknown",
            Waits::Known(w) => match (w.mds_requests > 0, w.osd_ops > 0) {
                (true, true) => "mds+osd",
                (true, false) => "mds",
                (false, true) => "osd",
                (false, false) => "client",
            },
        }
    }

    /// What the operator should look at.
    pub fn hint(&self) -> String {
        match self {
            Waits::NoSocket => "what libcephfs waits for is unknown without its admin socket: \
                turn metrics on (--metrics-socket) or set --ceph-opt admin_socket=PATH"
                .to_owned(),
            Waits::TimedOut => "the libcephfs admin socket did not answer in time, so \
                libcephfs itself may be wedged: check `ceph health detail`, and evict this client \
                (client_id in the start-up log) if it does not recover"
                .to_owned(),
            Waits::Unreachable(e) => format!(
                "what libcephfs waits for is unknown: its admin socket cannot be asked ({e}); \
                 check that it exists and that this daemon's user may connect to it"
            ),
            Waits::Known(w) => match (w.mds_requests, w.osd_ops) {
                (0, 0) => "libcephfs has no MDS request and no OSD op in flight, so the call \
                    waits inside the client, most likely for a capability or a max_size grant \
                    from the MDS: check this client's session and caps on the MDS (`ceph tell \
                    mds.<name> session ls`, client_id in the start-up log) and the MDS log"
                    .to_owned(),
                (m, 0) => format!(
                    "libcephfs waits for the MDS ({m} metadata requests unanswered): check \
                     `ceph health detail` and the MDS's slow requests (`ceph tell mds.<name> \
                     dump_ops_in_flight`)"
                ),
                (0, o) => format!(
                    "libcephfs waits for the OSDs ({o} ops unanswered): check `ceph health \
                     detail` and the OSDs' slow ops (`ceph tell osd.<id> dump_ops_in_flight`)"
                ),
                (m, o) => format!(
                    "libcephfs waits for the MDS ({m} metadata requests) and the OSDs ({o} ops): \
                     check `ceph health detail` and their slow requests"
                ),
            },
        }
    }
}

/// A note for requests that may wait for good by design.
fn op_note(opcode: u32) -> &'static str {
    if opcode == crate::wire::FUSE_SETLKW {
        "a blocking lock request (SETLKW) waits as long as another process or client holds the \
         lock; if none should, "
    } else {
        ""
    }
}

fn log_report(report: &Report, bound: Duration, waits: &Waits) {
    let r = &report.request.info;
    let (mds_requests, osd_ops) = match waits {
        Waits::Known(w) => (Some(w.mds_requests), Some(w.osd_ops)),
        _ => (None, None),
    };
    let age_s = report.age.as_secs();
    let bound_s = bound.as_secs();
    let hint = format!("{}{}", op_note(r.opcode), waits.hint());
    macro_rules! emit {
        ($level:ident, $($msg:tt)+) => {
            $level!(
                op = opcode_name(usize::try_from(r.opcode).unwrap_or(0)),
                unique = r.unique,
                node = r.node,
                fh = r.fh,
                offset = r.offset,
                size = r.size,
                queue = r.queue,
                age_s,
                mds_requests,
                osd_ops,
                waits_on = waits.label(),
                $($msg)+
            )
        };
    }
    match report.level {
        Level::Slow => emit!(
            warn,
            "FUSE request in flight for {age_s} s, longer than --slow-request-secs {bound_s}: {hint}"
        ),
        Level::VerySlow => emit!(
            error,
            "FUSE request still in flight after {age_s} s, {ESCALATE_FACTOR} times \
             --slow-request-secs {bound_s}: {hint}"
        ),
    }
}

/// A request was answered after `elapsed`, at least the bound. `first`: the watchdog never saw
/// it stuck (it finished between two scans), so count and log it here; otherwise say it ended.
pub fn finished(r: &RequestInfo, elapsed: Duration, bound: Duration, first: bool) {
    let op = opcode_name(usize::try_from(r.opcode).unwrap_or(0));
    let age_s = elapsed.as_secs_f64();
    if first {
        super::global().record_slow_request(r.opcode);
        warn!(
            op,
            unique = r.unique,
            node = r.node,
            fh = r.fh,
            offset = r.offset,
            size = r.size,
            queue = r.queue,
            age_s,
            "FUSE request took {age_s:.1} s, longer than --slow-request-secs {}",
            bound.as_secs()
        );
    } else {
        info!(
            op,
            unique = r.unique,
            node = r.node,
            queue = r.queue,
            age_s,
            "Stuck FUSE request finished after {age_s:.1} s"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn setlkw(unique: u64) -> RequestInfo {
        RequestInfo {
            opcode: crate::wire::FUSE_SETLKW,
            unique,
            node: 5,
            queue: 1,
            fh: Some(3),
            offset: Some(0),
            size: None,
        }
    }

    fn slot(id: u64) -> &'static Slot {
        Box::leak(Box::new(Slot::new(id)))
    }

    #[test]
    fn young_requests_are_left_alone() {
        static M: Metrics = Metrics::new();
        let a = slot(1);
        a.begin(&setlkw(1), 100 * SEC);
        let mut w = Watch::new(Duration::from_secs(30));
        let scan = w.scan(&[a], 129 * SEC, &M);
        assert_eq!(scan, Scan::default());
        assert_eq!(M.requests_stuck(), 0);
        assert_eq!(M.slow_requests(crate::wire::FUSE_SETLKW), 0);
    }

    #[test]
    fn a_stuck_request_is_reported_once_then_escalated_once() {
        static M: Metrics = Metrics::new();
        let a = slot(1);
        let idle = slot(2);
        let seq = a.begin(&setlkw(7), 0);
        let mut w = Watch::new(Duration::from_secs(30));

        let scan = w.scan(&[a, idle], 30 * SEC, &M);
        assert_eq!(scan.stuck, 1);
        assert_eq!(scan.reports.len(), 1);
        let r = scan
            .reports
            .first()
            .copied()
            .unwrap_or_else(|| panic!("no report"));
        assert_eq!(r.level, Level::Slow);
        assert_eq!(r.age, Duration::from_secs(30));
        assert_eq!(r.request.info, setlkw(7));
        assert_eq!(M.slow_requests(crate::wire::FUSE_SETLKW), 1);
        assert_eq!(M.requests_stuck(), 1);

        // Still stuck: counted in the gauge, not logged nor counted again.
        for t in 31..300 {
            let scan = w.scan(&[a, idle], t * SEC, &M);
            assert_eq!(scan.stuck, 1);
            assert!(scan.reports.is_empty(), "reported again at {t} s");
        }
        // Ten times the bound: one error.
        let scan = w.scan(&[a, idle], 300 * SEC, &M);
        assert_eq!(
            scan.reports.iter().map(|r| r.level).collect::<Vec<_>>(),
            [Level::VerySlow]
        );
        let scan = w.scan(&[a, idle], 3000 * SEC, &M);
        assert!(scan.reports.is_empty());
        assert_eq!(M.slow_requests(crate::wire::FUSE_SETLKW), 1);

        // Answered: the gauge drops; the thread's own claim fails (the watchdog counted it).
        a.end(seq);
        let scan = w.scan(&[a, idle], 3001 * SEC, &M);
        assert_eq!(scan.stuck, 0);
        assert_eq!(M.requests_stuck(), 0);
        assert!(!a.claim(seq));
    }

    #[test]
    fn the_next_request_in_a_slot_is_a_new_one() {
        static M: Metrics = Metrics::new();
        let a = slot(1);
        let mut w = Watch::new(Duration::from_secs(1));
        let first = a.begin(&setlkw(1), 0);
        assert_eq!(w.scan(&[a], 2 * SEC, &M).reports.len(), 1);
        a.end(first);
        // Same unique from a reconnected guest, same slot: still reported, and counted.
        a.begin(&setlkw(1), 2 * SEC);
        assert_eq!(w.scan(&[a], 4 * SEC, &M).reports.len(), 1);
        assert_eq!(M.slow_requests(crate::wire::FUSE_SETLKW), 2);
    }

    #[test]
    fn a_request_first_seen_very_late_is_reported_at_error_and_counted_once() {
        static M: Metrics = Metrics::new();
        let a = slot(1);
        a.begin(&setlkw(1), 0);
        let mut w = Watch::new(Duration::from_secs(1));
        let scan = w.scan(&[a], 60 * SEC, &M);
        assert_eq!(
            scan.reports.iter().map(|r| r.level).collect::<Vec<_>>(),
            [Level::VerySlow]
        );
        assert!(w.scan(&[a], 61 * SEC, &M).reports.is_empty());
        assert_eq!(M.slow_requests(crate::wire::FUSE_SETLKW), 1);
    }

    #[test]
    fn a_request_its_thread_already_counted_is_not_counted_again() {
        static M: Metrics = Metrics::new();
        let a = slot(1);
        let seq = a.begin(&setlkw(1), 0);
        // The thread finished it past the bound and claimed it just before the scan read it.
        assert!(a.claim(seq));
        let mut w = Watch::new(Duration::from_secs(1));
        let scan = w.scan(&[a], 5 * SEC, &M);
        assert_eq!(scan, Scan::default());
        assert_eq!(M.slow_requests(crate::wire::FUSE_SETLKW), 0);
    }

    #[test]
    fn what_libcephfs_waits_for() {
        let known = |mds_requests, osd_ops| {
            Waits::Known(ClientWaits {
                mds_requests,
                osd_ops,
            })
        };
        assert_eq!(known(1, 0).label(), "mds");
        assert!(known(1, 0).hint().contains("waits for the MDS (1 metadata"));
        assert_eq!(known(0, 3).label(), "osd");
        assert!(known(0, 3).hint().contains("waits for the OSDs (3 ops"));
        assert_eq!(known(2, 3).label(), "mds+osd");
        assert_eq!(known(0, 0).label(), "client");
        assert!(known(0, 0).hint().contains("max_size"));
        assert_eq!(Waits::from(None).label(), "unknown");
        assert!(Waits::from(None).hint().contains("--ceph-opt admin_socket"));
        let wedged = Waits::from(Some(Err(std::io::Error::from(
            std::io::ErrorKind::TimedOut,
        ))));
        assert_eq!(wedged, Waits::TimedOut);
        assert_eq!(wedged.label(), "unknown");
        assert!(wedged.hint().contains("did not answer in time"));
        let refused = Waits::from(Some(Err(std::io::Error::from_raw_os_error(libc::EACCES))));
        assert_eq!(refused.label(), "unknown");
        assert!(
            refused.hint().contains("Permission denied"),
            "{}",
            refused.hint()
        );
        assert!(op_note(crate::wire::FUSE_SETLKW).contains("lock"));
        assert_eq!(op_note(16), "");
    }
}
