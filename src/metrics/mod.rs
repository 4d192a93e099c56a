//! Observability: request counters, latency histograms and gauges, served in the Prometheus text
//! format by a small tokio endpoint ([`endpoint`]) when `--metrics-addr`/`--metrics-socket` is
//! given.
//!
//! Hot-path cost: the data path only does relaxed atomic adds on fixed arrays of one
//! process-wide [`Metrics`] (no lock, no allocation, no map lookup). Label sets are bounded:
//! opcodes outside 1..=63 share the "UNKNOWN" slot, errnos outside 1..=133 the "other" slot, so a
//! guest cannot grow the output. Everything else (table sizes, libcephfs health) is read at scrape
//! time on the control plane.
//!
//! Hooks for other parts of the daemon: [`global`] then [`Metrics::record_request`] (server),
//! [`Metrics::queue_enter`] (vhost-user), [`quarantine_denied`] (quarantine gate),
//! [`inflight::track`] (server: the request each thread serves, for the [`watchdog`]).

pub mod ceph;
pub mod endpoint;
pub mod inflight;
pub mod text;
pub mod watchdog;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use text::{Kind, TextWriter};

use crate::wire::{errno_name, opcode_name, ReplyHead, FUSE_LOOKUP, FUSE_READ, FUSE_WRITE};

/// Opcode slots: FUSE opcodes 1..=63 have their own; slot 0 collects everything else.
pub const OPCODE_SLOTS: usize = 64;
/// Errno slots: 1..=133 (Linux's largest errno is EHWPOISON = 133); slot 0 is "other".
pub const ERRNO_SLOTS: usize = 134;
/// Queues whose depth is tracked (hiprio + 63 request queues).
pub const QUEUE_SLOTS: usize = 64;
/// Upper bounds of the latency buckets, in microseconds (plus an implicit +Inf bucket).
pub const LATENCY_BOUNDS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
    5_000_000,
];
const BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;

// A `const` item (not a static) is what array repeat expressions need: each use is a new atomic.
#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

/// Every counter of the process. One instance ([`global`]); tests make their own.
#[derive(Debug)]
pub struct Metrics {
    requests: [AtomicU64; OPCODE_SLOTS],
    errors: [[AtomicU64; ERRNO_SLOTS]; OPCODE_SLOTS],
    latency: [[AtomicU64; BUCKETS]; OPCODE_SLOTS],
    latency_sum_ns: [AtomicU64; OPCODE_SLOTS],
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    malformed: AtomicU64,
    /// Answers not given because their ring stopped first (a guest reboot, a reset).
    dropped_answers: AtomicU64,
    negative_lookups: AtomicU64,
    queue_depth: [AtomicI64; QUEUE_SLOTS],
    quarantine_denials: AtomicU64,
    /// Quarantine domains retired because their directory was removed.
    quarantine_retired: AtomicU64,
    /// Inode releases the MDS asked for (process-wide: one daemon serves one guest).
    mds_recalls: AtomicU64,
    /// CephFS sessions lost to an eviction and replaced (`fs::recover`), and recoveries that
    /// failed (and were tried again).
    session_recoveries: AtomicU64,
    session_recovery_failures: AtomicU64,
    /// Requests that were in flight longer than `--slow-request-secs`, by opcode.
    slow_requests: [AtomicU64; OPCODE_SLOTS],
    /// Requests in flight longer than the bound at the watchdog's last scan.
    requests_stuck: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

static GLOBAL: Metrics = Metrics::new();

/// The process-wide metrics the daemon records into and the endpoint serves.
pub fn global() -> &'static Metrics {
    &GLOBAL
}

/// Count one request the quarantine gate refused (EACCES under a quarantined subvolume);
/// called by the gate's audit, once per denied operation.
pub fn quarantine_denied() {
    GLOBAL.record_quarantine_denial();
}

/// Count one quarantine domain retired because its directory was removed; called by the gate.
pub fn quarantine_domain_retired() {
    GLOBAL.quarantine_retired.fetch_add(1, Ordering::Relaxed);
}

/// Count one inode release the MDS asked for under cache pressure; called by the filesystem's
/// libcephfs callback handler.
pub fn mds_inode_recalled() {
    GLOBAL.mds_recalls.fetch_add(1, Ordering::Relaxed);
}

/// Count one CephFS session recovered after an eviction (`ok`), or one attempt that failed.
pub fn session_recovery(ok: bool) {
    let c = if ok {
        &GLOBAL.session_recoveries
    } else {
        &GLOBAL.session_recovery_failures
    };
    c.fetch_add(1, Ordering::Relaxed);
}

/// Keeps a queue's in-flight count raised until dropped.
#[derive(Debug)]
pub struct QueueDepthGuard {
    slot: &'static AtomicI64,
}

impl Drop for QueueDepthGuard {
    fn drop(&mut self) {
        self.slot.fetch_sub(1, Ordering::Relaxed);
    }
}

fn opcode_slot(opcode: u32) -> usize {
    usize::try_from(opcode)
        .ok()
        .filter(|o| *o < OPCODE_SLOTS)
        .unwrap_or(0)
}

fn errno_slot(errno: i32) -> usize {
    usize::try_from(errno)
        .ok()
        .filter(|e| *e < ERRNO_SLOTS)
        .unwrap_or(0)
}

fn latency_bucket(elapsed: Duration) -> usize {
    let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    LATENCY_BOUNDS_US
        .iter()
        .position(|b| us <= *b)
        .unwrap_or(LATENCY_BOUNDS_US.len())
}

/// Gauges the filesystem reports at scrape time.
pub trait FsStats: Send + Sync {
    /// Nodes in the inode table (node ids the guest holds).
    fn node_count(&self) -> usize;
    /// Open file and directory handles.
    fn handle_count(&self) -> usize;
    /// Requests refused at the guest's limits: (nodes, handles).
    fn limit_refusals(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Libcephfs inode references: (held now, released so far, found again so far).
    fn inode_refs(&self) -> (usize, u64, u64) {
        (0, 0, 0)
    }
}

impl Metrics {
    pub const fn new() -> Self {
        Metrics {
            requests: [ZERO; OPCODE_SLOTS],
            errors: [const { [ZERO; ERRNO_SLOTS] }; OPCODE_SLOTS],
            latency: [const { [ZERO; BUCKETS] }; OPCODE_SLOTS],
            latency_sum_ns: [ZERO; OPCODE_SLOTS],
            bytes_read: ZERO,
            bytes_written: ZERO,
            malformed: ZERO,
            dropped_answers: ZERO,
            negative_lookups: ZERO,
            queue_depth: [const { AtomicI64::new(0) }; QUEUE_SLOTS],
            quarantine_denials: ZERO,
            quarantine_retired: ZERO,
            mds_recalls: ZERO,
            session_recoveries: ZERO,
            session_recovery_failures: ZERO,
            slow_requests: [ZERO; OPCODE_SLOTS],
            requests_stuck: ZERO,
        }
    }

    /// Record one answered (or unanswerable) request. `reply` is `None` when no reply was
    /// written (FORGET, BATCH_FORGET, or a malformed request).
    pub fn record_request(&self, opcode: u32, reply: Option<&ReplyHead>, elapsed: Duration) {
        let op = opcode_slot(opcode);
        if let Some(c) = self.requests.get(op) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(c) = self
            .latency
            .get(op)
            .and_then(|b| b.get(latency_bucket(elapsed)))
        {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(c) = self.latency_sum_ns.get(op) {
            let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
            c.fetch_add(ns, Ordering::Relaxed);
        }
        let Some(reply) = reply else { return };
        if reply.errno != 0 {
            if let Some(c) = self
                .errors
                .get(op)
                .and_then(|e| e.get(errno_slot(reply.errno)))
            {
                c.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        match opcode {
            FUSE_READ => {
                let n = u64::try_from(reply.payload).unwrap_or(u64::MAX);
                self.bytes_read.fetch_add(n, Ordering::Relaxed);
            }
            FUSE_LOOKUP if reply.negative_entry => {
                self.negative_lookups.fetch_add(1, Ordering::Relaxed);
            }
            FUSE_WRITE => {
                if let Some(n) = reply.write_size {
                    self.bytes_written
                        .fetch_add(u64::from(n), Ordering::Relaxed);
                }
            }
            _ => {}
        }
    }

    /// Count a request that could not be parsed or answered at all.
    pub fn record_malformed(&self) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
    }

    /// An answer was not given: its ring stopped (and maybe started again) while the request
    /// was served.
    pub fn record_dropped_answer(&self) {
        self.dropped_answers.fetch_add(1, Ordering::Relaxed);
    }

    /// Answers dropped so far (see [`Self::record_dropped_answer`]).
    pub fn dropped_answers(&self) -> u64 {
        self.dropped_answers.load(Ordering::Relaxed)
    }

    /// Count a request of `queue` as in flight until the guard is dropped.
    pub fn queue_enter(&'static self, queue: usize) -> QueueDepthGuard {
        let [.., last] = &self.queue_depth;
        let slot = self.queue_depth.get(queue).unwrap_or(last);
        slot.fetch_add(1, Ordering::Relaxed);
        QueueDepthGuard { slot }
    }

    /// Count a quarantine denial (see [`quarantine_denied`]).
    pub fn record_quarantine_denial(&self) {
        self.quarantine_denials.fetch_add(1, Ordering::Relaxed);
    }

    /// Inode releases the MDS asked for so far (see [`mds_inode_recalled`]).
    /// Bytes the guest read and wrote so far.
    pub fn bytes_moved(&self) -> u64 {
        self.bytes_read
            .load(Ordering::Relaxed)
            .wrapping_add(self.bytes_written.load(Ordering::Relaxed))
    }

    pub fn mds_recalls(&self) -> u64 {
        self.mds_recalls.load(Ordering::Relaxed)
    }

    /// Quarantine denials counted so far.
    pub fn quarantine_denials(&self) -> u64 {
        self.quarantine_denials.load(Ordering::Relaxed)
    }

    /// Count a request that was in flight longer than `--slow-request-secs` (once per request;
    /// see [`watchdog`]).
    pub fn record_slow_request(&self, opcode: u32) {
        if let Some(c) = self.slow_requests.get(opcode_slot(opcode)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Slow requests of `opcode` counted so far.
    pub fn slow_requests(&self, opcode: u32) -> u64 {
        self.slow_requests
            .get(opcode_slot(opcode))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// How many requests the watchdog's last scan found in flight past the bound.
    pub fn set_requests_stuck(&self, n: u64) {
        self.requests_stuck.store(n, Ordering::Relaxed);
    }

    /// The value set by [`Metrics::set_requests_stuck`].
    pub fn requests_stuck(&self) -> u64 {
        self.requests_stuck.load(Ordering::Relaxed)
    }

    /// Write every metric family of this process: request counters, then `fs` gauges and the
    /// libcephfs health when given.
    pub fn render(
        &self,
        queues: usize,
        fs: Option<&dyn FsStats>,
        ceph: Option<&ceph::CephHealth>,
    ) -> String {
        let mut w = TextWriter::new();
        self.render_requests(&mut w);
        self.render_traffic(&mut w);
        self.render_queues(&mut w, queues);
        self.render_quarantine(&mut w);
        if let Some(fs) = fs {
            render_fs(&mut w, fs);
        }
        self.render_sessions(&mut w);
        if let Some(h) = ceph {
            h.render(&mut w);
        }
        w.finish()
    }

    /// Bytes moved, and requests that got no ordinary answer.
    fn render_traffic(&self, w: &mut TextWriter) {
        single(
            w,
            "ceph_virtiofsd_read_bytes_total",
            Kind::Counter,
            "Bytes returned to the guest by FUSE READ.",
            self.bytes_read.load(Ordering::Relaxed),
        );
        single(
            w,
            "ceph_virtiofsd_write_bytes_total",
            Kind::Counter,
            "Bytes written for the guest by FUSE WRITE.",
            self.bytes_written.load(Ordering::Relaxed),
        );
        single(
            w,
            "ceph_virtiofsd_fuse_malformed_requests_total",
            Kind::Counter,
            "Requests returned to the guest unanswered (malformed descriptor chain or header).",
            self.malformed.load(Ordering::Relaxed),
        );
        single(
            w,
            "ceph_virtiofsd_fuse_dropped_answers_total",
            Kind::Counter,
            "Requests served after their ring stopped (guest reboot or driver reset): answer not given.",
            self.dropped_answers.load(Ordering::Relaxed),
        );
        single(
            w,
            "ceph_virtiofsd_fuse_negative_lookups_total",
            Kind::Counter,
            "LOOKUPs of a missing name answered with a cacheable negative entry instead of \
             ENOENT (every cache mode but never).",
            self.negative_lookups.load(Ordering::Relaxed),
        );
    }

    /// In-flight depth of the first `queues` virtqueues.
    fn render_queues(&self, w: &mut TextWriter, queues: usize) {
        w.family(
            "ceph_virtiofsd_queue_in_flight",
            Kind::Gauge,
            "Requests popped from a virtqueue and not yet answered (queue 0 is hiprio).",
        );
        for (q, depth) in self
            .queue_depth
            .iter()
            .take(queues.min(QUEUE_SLOTS))
            .enumerate()
        {
            let q = q.to_string();
            w.sample(
                "ceph_virtiofsd_queue_in_flight",
                &[("queue", &q)],
                depth.load(Ordering::Relaxed).max(0),
            );
        }
    }

    fn render_quarantine(&self, w: &mut TextWriter) {
        single(
            w,
            "ceph_virtiofsd_quarantine_denials_total",
            Kind::Counter,
            "Requests refused with EACCES because their subvolume is quarantined.",
            self.quarantine_denials.load(Ordering::Relaxed),
        );
        single(
            w,
            "ceph_virtiofsd_quarantine_domains_retired_total",
            Kind::Counter,
            "Quarantine domains retired (their id freed) because their directory was removed.",
            self.quarantine_retired.load(Ordering::Relaxed),
        );
    }

    /// The MDS's recalls and the CephFS session's replacements.
    fn render_sessions(&self, w: &mut TextWriter) {
        single(
            w,
            "ceph_virtiofsd_mds_inode_recalls_total",
            Kind::Counter,
            "Inode releases the MDS asked for under cache pressure (inodes the guest holds).",
            self.mds_recalls.load(Ordering::Relaxed),
        );
        single(
            w,
            "ceph_virtiofsd_session_recoveries_total",
            Kind::Counter,
            "CephFS sessions lost to an eviction (blocklisted) and replaced by a new one.",
            self.session_recoveries.load(Ordering::Relaxed),
        );
        single(
            w,
            "ceph_virtiofsd_session_recovery_failures_total",
            Kind::Counter,
            "Attempts to replace a lost CephFS session that failed (tried again).",
            self.session_recovery_failures.load(Ordering::Relaxed),
        );
    }

    fn render_requests(&self, w: &mut TextWriter) {
        w.family(
            "ceph_virtiofsd_fuse_requests_total",
            Kind::Counter,
            "FUSE requests served, by opcode.",
        );
        for (op, c) in self.requests.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            if n > 0 {
                w.sample(
                    "ceph_virtiofsd_fuse_requests_total",
                    &[("op", opcode_name(op))],
                    n,
                );
            }
        }
        w.family(
            "ceph_virtiofsd_fuse_errors_total",
            Kind::Counter,
            "FUSE requests answered with an error, by opcode and errno.",
        );
        for (op, per_errno) in self.errors.iter().enumerate() {
            for (errno, c) in per_errno.iter().enumerate() {
                let n = c.load(Ordering::Relaxed);
                if n > 0 {
                    let name = errno_name(errno);
                    w.sample(
                        "ceph_virtiofsd_fuse_errors_total",
                        &[("op", opcode_name(op)), ("errno", &name)],
                        n,
                    );
                }
            }
        }
        w.family(
            "ceph_virtiofsd_fuse_request_duration_seconds",
            Kind::Histogram,
            "Time from reading a FUSE request to writing its reply, by opcode.",
        );
        let bounds: Vec<f64> = LATENCY_BOUNDS_US
            .iter()
            .map(|us| Duration::from_micros(*us).as_secs_f64())
            .collect();
        for (op, buckets) in self.latency.iter().enumerate() {
            let counts: Vec<u64> = buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
            if counts.iter().all(|c| *c == 0) {
                continue;
            }
            let sum_ns = self
                .latency_sum_ns
                .get(op)
                .map_or(0, |s| s.load(Ordering::Relaxed));
            w.histogram(
                "ceph_virtiofsd_fuse_request_duration_seconds",
                &[("op", opcode_name(op))],
                &bounds,
                &counts,
                Duration::from_nanos(sum_ns).as_secs_f64(),
            );
        }
        self.render_slow(w);
    }

    fn render_slow(&self, w: &mut TextWriter) {
        w.family(
            "ceph_virtiofsd_fuse_requests_stuck",
            Kind::Gauge,
            "FUSE requests in flight for longer than --slow-request-secs, at the watchdog's last \
             scan (every second; 0 when the watchdog is off).",
        );
        w.sample(
            "ceph_virtiofsd_fuse_requests_stuck",
            &[],
            self.requests_stuck.load(Ordering::Relaxed),
        );
        w.family(
            "ceph_virtiofsd_fuse_slow_requests_total",
            Kind::Counter,
            "FUSE requests that were in flight for longer than --slow-request-secs, by opcode \
             (each counted once, when first seen past the bound or when it finished).",
        );
        for (op, c) in self.slow_requests.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            if n > 0 {
                w.sample(
                    "ceph_virtiofsd_fuse_slow_requests_total",
                    &[("op", opcode_name(op))],
                    n,
                );
            }
        }
    }
}

/// One metric family with one sample and no labels.
fn single(w: &mut TextWriter, name: &str, kind: Kind, help: &str, value: impl std::fmt::Display) {
    w.family(name, kind, help);
    w.sample(name, &[], value);
}

/// The file system's table sizes, refusals at their limits and held inode references.
fn render_fs(w: &mut TextWriter, fs: &dyn FsStats) {
    single(
        w,
        "ceph_virtiofsd_inodes",
        Kind::Gauge,
        "Entries of the inode (node id) table.",
        fs.node_count(),
    );
    single(
        w,
        "ceph_virtiofsd_handles",
        Kind::Gauge,
        "Open file and directory handles.",
        fs.handle_count(),
    );
    let (nodes, handles) = fs.limit_refusals();
    w.family(
        "ceph_virtiofsd_limit_refusals_total",
        Kind::Counter,
        "Requests refused with ENFILE at the guest's --max-nodes or --max-handles.",
    );
    w.sample(
        "ceph_virtiofsd_limit_refusals_total",
        &[("table", "nodes")],
        nodes,
    );
    w.sample(
        "ceph_virtiofsd_limit_refusals_total",
        &[("table", "handles")],
        handles,
    );
    let (held, released, refound) = fs.inode_refs();
    single(
        w,
        "ceph_virtiofsd_inodes_held",
        Kind::Gauge,
        "Libcephfs inode references the inode table holds (at most --held-inodes, \
         beside the export root and snapshots).",
        held,
    );
    single(
        w,
        "ceph_virtiofsd_inode_releases_total",
        Kind::Counter,
        "Inode references given back to libcephfs while the guest still holds the \
         inode (over --held-inodes, or recalled by the MDS).",
        released,
    );
    single(
        w,
        "ceph_virtiofsd_inode_refinds_total",
        Kind::Counter,
        "Inodes found again by number after their reference was given back.",
        refound,
    );
}

/// Where the metrics endpoint listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsEndpoint {
    /// HTTP over TCP.
    Tcp(SocketAddr),
    /// HTTP over a unix stream socket at this path.
    Unix(PathBuf),
}

/// Parse `--metrics-addr`: "PORT" (bound to 127.0.0.1), "IP:PORT" or "[IPv6]:PORT".
pub fn parse_metrics_addr(s: &str) -> Option<SocketAddr> {
    let s = s.trim();
    if let Ok(port) = s.parse::<u16>() {
        return Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_requests_errors_bytes_and_latency() {
        static M: Metrics = Metrics::new();
        let ok = ReplyHead::default();
        M.record_request(35, Some(&ok), Duration::from_micros(30));
        M.record_request(35, Some(&ok), Duration::from_millis(2));
        let enoent = ReplyHead {
            errno: libc::ENOENT,
            ..Default::default()
        };
        M.record_request(1, Some(&enoent), Duration::from_micros(70));
        M.record_request(
            FUSE_WRITE,
            Some(&ReplyHead {
                write_size: Some(4096),
                ..Default::default()
            }),
            Duration::from_micros(10),
        );
        M.record_request(
            FUSE_READ,
            Some(&ReplyHead {
                payload: 100,
                ..Default::default()
            }),
            Duration::from_secs(10),
        );
        // Guest-chosen garbage stays in bounded slots.
        M.record_request(
            u32::MAX,
            Some(&ReplyHead {
                errno: 100_000,
                ..Default::default()
            }),
            Duration::ZERO,
        );
        M.record_request(2, None, Duration::ZERO);
        let negative = ReplyHead {
            negative_entry: true,
            ..Default::default()
        };
        M.record_request(FUSE_LOOKUP, Some(&negative), Duration::ZERO);
        let depth = M.queue_enter(1);
        let _deep = M.queue_enter(1000);
        M.record_quarantine_denial();
        M.quarantine_retired.fetch_add(3, Ordering::Relaxed);
        M.record_slow_request(FUSE_WRITE);
        M.record_slow_request(u32::MAX);
        M.set_requests_stuck(2);

        struct Fs;
        impl FsStats for Fs {
            fn node_count(&self) -> usize {
                5
            }
            fn handle_count(&self) -> usize {
                2
            }
            fn limit_refusals(&self) -> (u64, u64) {
                (3, 4)
            }
            fn inode_refs(&self) -> (usize, u64, u64) {
                (6, 7, 8)
            }
        }
        let text = M.render(2, Some(&Fs), None);
        for line in [
            "ceph_virtiofsd_fuse_requests_total{op=\"CREATE\"} 2",
            "ceph_virtiofsd_fuse_requests_total{op=\"LOOKUP\"} 2",
            "ceph_virtiofsd_fuse_negative_lookups_total 1",
            "ceph_virtiofsd_fuse_requests_total{op=\"FORGET\"} 1",
            "ceph_virtiofsd_fuse_requests_total{op=\"UNKNOWN\"} 1",
            "ceph_virtiofsd_fuse_errors_total{op=\"LOOKUP\",errno=\"ENOENT\"} 1",
            "ceph_virtiofsd_fuse_errors_total{op=\"UNKNOWN\",errno=\"other\"} 1",
            "ceph_virtiofsd_write_bytes_total 4096",
            "ceph_virtiofsd_read_bytes_total 100",
            "ceph_virtiofsd_fuse_request_duration_seconds_bucket{op=\"CREATE\",le=\"0.00005\"} 1",
            "ceph_virtiofsd_fuse_request_duration_seconds_bucket{op=\"CREATE\",le=\"0.0025\"} 2",
            "ceph_virtiofsd_fuse_request_duration_seconds_bucket{op=\"READ\",le=\"5\"} 0",
            "ceph_virtiofsd_fuse_request_duration_seconds_bucket{op=\"READ\",le=\"+Inf\"} 1",
            "ceph_virtiofsd_fuse_request_duration_seconds_count{op=\"CREATE\"} 2",
            "ceph_virtiofsd_fuse_request_duration_seconds_sum{op=\"CREATE\"} 0.00203",
            "ceph_virtiofsd_queue_in_flight{queue=\"0\"} 0",
            "ceph_virtiofsd_queue_in_flight{queue=\"1\"} 1",
            "ceph_virtiofsd_quarantine_denials_total 1",
            "ceph_virtiofsd_quarantine_domains_retired_total 3",
            "ceph_virtiofsd_inodes 5",
            "ceph_virtiofsd_handles 2",
            "ceph_virtiofsd_limit_refusals_total{table=\"nodes\"} 3",
            "ceph_virtiofsd_limit_refusals_total{table=\"handles\"} 4",
            "ceph_virtiofsd_inodes_held 6",
            "ceph_virtiofsd_inode_releases_total 7",
            "ceph_virtiofsd_inode_refinds_total 8",
            "ceph_virtiofsd_fuse_requests_stuck 2",
            "ceph_virtiofsd_fuse_slow_requests_total{op=\"WRITE\"} 1",
            "ceph_virtiofsd_fuse_slow_requests_total{op=\"UNKNOWN\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!text.contains("op=\"GETATTR\""), "idle opcodes are omitted");
        drop(depth);
        let text = M.render(2, None, None);
        assert!(text.contains("ceph_virtiofsd_queue_in_flight{queue=\"1\"} 0\n"));
        assert!(!text.contains("ceph_virtiofsd_inodes"));
    }

    #[test]
    fn metrics_addr() {
        assert_eq!(
            parse_metrics_addr("9100"),
            Some("127.0.0.1:9100".parse().unwrap_or_else(|e| panic!("{e}")))
        );
        assert_eq!(
            parse_metrics_addr("[::1]:9100"),
            Some("[::1]:9100".parse().unwrap_or_else(|e| panic!("{e}")))
        );
        assert_eq!(parse_metrics_addr("localhost:x"), None);
    }
}
