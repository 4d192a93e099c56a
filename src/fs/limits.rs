//! Per-guest resource limits: how many nodes (inodes the guest holds by lookup count) and open
//! handles one guest may pin, what a refusal looks like, and what the MDS's cache-pressure
//! recall can and cannot change.
//!
//! Every node pins a libcephfs inode and the MDS capabilities that come with it; every handle
//! an open libcephfs file. A guest that sends LOOKUP without FORGET, or OPEN without RELEASE,
//! would otherwise grow both without bound, on the host and in the MDS's cache, at the expense
//! of every other tenant. Beyond the limit a request that would add an entry fails with ENFILE:
//! the table is per guest, so from the guest's side it is the system-wide file table that is
//! full (EMFILE would tell one process that *its* descriptor limit is reached, and ENOMEM that
//! the guest is out of memory; neither is true, and both send the guest looking in the wrong
//! place). READDIRPLUS does not fail at the node limit: its entries then carry no node (the
//! guest looks them up when it needs them), so listings keep working.
//!
//! The MDS's recall (`ino_release_cb`): under cache pressure it asks the client to drop inode
//! references, and libcephfs passes the request on for the inodes the application holds. The
//! node of a recalled inode gives its reference up (unless it is pinned: the export root, a
//! snapshot inode) and finds the inode again by number when the guest next uses it; the guest
//! keeps its node id and notices nothing but the round trip. The same happens to the nodes
//! used least lately whenever the table holds more than `--held-inodes` references, so what a
//! guest's dentry cache holds costs the daemon a node (about 200 bytes), not a libcephfs inode
//! (about 1.9 KiB with its dentry and caps), and libcephfs can trim to its `--inode-cache`.
//! Every recall is also counted and logged (rate-limited), so an operator sees which guest the
//! MDS is pressing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Default `--max-nodes`: above what a guest's dentry cache holds in ordinary use, below the
/// MDS's default `mds_max_caps_per_client` (1M), past which the MDS recalls caps from the
/// client and reports it as failing to respond to cache pressure.
pub const DEFAULT_MAX_NODES: usize = 500_000;
/// Default `--max-handles`: far above what guest processes keep open in ordinary use.
pub const DEFAULT_MAX_HANDLES: usize = 100_000;
/// Default `--held-inodes`: about 8 MiB of libcephfs inodes. With `--inode-cache` 8192 it keeps
/// a daemon whose guest walked 100,000 inodes near 115 MiB (docs/benchmarks.md, "Density"); the hot part
/// of a guest's working set stays referenced, the rest costs a node and a lookup by number.
pub const DEFAULT_HELD_INODES: usize = 4096;

/// Lines per second a [`Throttle`] lets through.
const LINES_PER_SEC: u32 = 5;

/// Which table refused an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    Nodes,
    Handles,
}

/// A rate limit for log lines a guest can trigger: at most [`LINES_PER_SEC`] a second, and the
/// next line that gets through says how many were suppressed before it.
#[derive(Debug)]
pub struct Throttle {
    state: Mutex<(Instant, u32, u64)>,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle {
            state: Mutex::new((Instant::now(), 0, 0)),
        }
    }
}

impl Throttle {
    /// `Some(suppressed_before)` when a line may be written now.
    pub fn admit(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (window, lines, suppressed) = &mut *s;
        if now.saturating_duration_since(*window) >= Duration::from_secs(1) {
            *window = now;
            *lines = 0;
        }
        if *lines >= LINES_PER_SEC {
            *suppressed += 1;
            return None;
        }
        *lines += 1;
        Some(std::mem::take(suppressed))
    }
}

/// Counters of one filesystem's limits (exported as metrics).
#[derive(Debug, Default)]
pub struct LimitStats {
    node_refusals: AtomicU64,
    handle_refusals: AtomicU64,
    log: Throttle,
}

impl LimitStats {
    /// Count a refusal by `table` (limit `max`) and log it, rate-limited.
    pub fn refused(&self, table: Table, max: usize, op: &'static str) {
        let (counter, what, option) = match table {
            Table::Nodes => (&self.node_refusals, "node", "--max-nodes"),
            Table::Handles => (&self.handle_refusals, "handle", "--max-handles"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(suppressed) = self.log.admit(Instant::now()) {
            tracing::warn!(
                table = what,
                limit = max,
                op,
                suppressed_before = suppressed,
                "guest reached its {what} limit: request refused with ENFILE (raise {option} if \
                 this guest needs more)"
            );
        }
    }

    /// Refusals so far: (nodes, handles).
    pub fn refusals(&self) -> (u64, u64) {
        (
            self.node_refusals.load(Ordering::Relaxed),
            self.handle_refusals.load(Ordering::Relaxed),
        )
    }
}

/// Inode releases the MDS asked for are counted in the process-wide metrics (libcephfs calls
/// back without a handle to our filesystem, and one daemon serves one guest).
static RECALL_LOG: Mutex<Option<Throttle>> = Mutex::new(None);

/// Releases the MDS asked for so far.
pub fn recalls() -> u64 {
    crate::metrics::global().mds_recalls()
}

/// Where the MDS's recalls go: the filesystem, once it is built (the mount, and its callbacks,
/// come first). Shared by the handlers of the first mount and of every remount.
pub type RecallTarget = Arc<OnceLock<Weak<super::CephFs>>>;

/// The libcephfs callback handler of the export's mount: it takes the MDS's cache-pressure
/// recalls (see the module documentation) and nothing else.
#[derive(Debug, Default)]
pub struct RecallHandler {
    target: RecallTarget,
}

impl RecallHandler {
    /// A handler passing recalls to what `target` is set to.
    pub fn new(target: &RecallTarget) -> Self {
        RecallHandler {
            target: target.clone(),
        }
    }
}

impl ceph_client::CallbackHandler for RecallHandler {
    fn wants_invalidations(&self) -> bool {
        false
    }

    /// Called on libcephfs's releasor thread, without its client lock: the reference can be
    /// put from here.
    fn release_inode(&self, vino: ceph_client::Vino) {
        crate::metrics::mds_inode_recalled();
        let mut released = false;
        if let Some(fs) = self.target.get().and_then(Weak::upgrade) {
            released = fs.release_recalled(super::Vino {
                ino: vino.ino,
                snapid: vino.snapid,
            });
            // The daemon let the filesystem go meanwhile (it is exiting): the last reference
            // must not be dropped here, where it would release the mount from one of
            // libcephfs's own threads. Left to the process's exit.
            if let Some(last) = Arc::into_inner(fs) {
                std::mem::forget(last);
            }
        }
        let mut log = RECALL_LOG.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(suppressed) = log
            .get_or_insert_with(Throttle::default)
            .admit(Instant::now())
        {
            tracing::info!(
                ino = vino.ino,
                released,
                suppressed_before = suppressed,
                "MDS recalls an inode the guest holds: its reference is released (found again \
                 by number when the guest uses it) unless it is the export root or a snapshot"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_refusal_logging_is_rate_limited() {
        let t = Throttle::default();
        let start = Instant::now();
        let admitted = (0..1000).filter(|_| t.admit(start).is_some()).count();
        assert_eq!(admitted, LINES_PER_SEC as usize);
        // The next window's first line reports what was suppressed.
        assert_eq!(
            t.admit(start + Duration::from_secs(1)),
            Some(1000 - u64::from(LINES_PER_SEC))
        );
        assert_eq!(t.admit(start + Duration::from_secs(1)), Some(0));
    }

    #[test]
    fn hostile_refusals_are_counted_per_table() {
        let s = LimitStats::default();
        for _ in 0..3 {
            s.refused(Table::Nodes, 10, "lookup");
        }
        s.refused(Table::Handles, 10, "open");
        assert_eq!(s.refusals(), (3, 1));
    }

    #[test]
    fn hostile_mds_recalls_are_counted_and_only_recalls_are_taken() {
        use ceph_client::CallbackHandler;
        let h = RecallHandler::default();
        assert!(!h.wants_invalidations());
        let before = recalls();
        let vino = ceph_client::Vino {
            ino: 0x1000,
            snapid: u64::MAX - 1,
        };
        for _ in 0..20 {
            h.release_inode(vino);
        }
        assert!(recalls() >= before + 20);
    }
}
