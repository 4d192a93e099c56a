//! What each kind of request has been costing to serve, to decide where the next one runs.
//!
//! libcephfs runs its calls under one client lock and lets go of it only while a call waits
//! for the MDS or the OSDs. A request it answers from its caches (a GETATTR under caps, a
//! LOOKUP of a cached dentry) gains nothing from a worker thread: it would take that same lock
//! there, after a hand-off that costs more than the request itself (a cross-CPU wake-up, or a
//! spinning worker holding a CPU the guest wants). Only requests that wait gain, because the
//! batch behind them goes on meanwhile. Which ones wait is learnt, per opcode, from how long
//! they have recently taken: an exponentially weighted mean of the serve time, updated by
//! whichever thread served the request (lock-free; a racing update may be lost, which only
//! delays the mean by one sample). Only the kinds this choice is made for are timed: not the
//! requests that go to a worker whatever their cost (WRITE, FSYNC, FALLOCATE, copies) and
//! SETLKW, and nothing without a worker pool or on the hiprio queue.
//!
//! The rules, where a request of a batch runs (see `drain_queue`):
//! - WRITE, FSYNC, FALLOCATE, copies, SYNCFS and SETLKW go to a worker, whatever their cost
//!   (`Dispatch`);
//! - others whose opcode's mean is within [`INLINE_BUDGET`] are served at once by the queue
//!   thread, in guest order (READ too: a 4 KiB READ from libcephfs's object cache costs a few
//!   microseconds, the hand-off to a worker about ten);
//! - the rest go to a worker, except the last of the batch, which the queue thread serves
//!   after handing the others out (nothing waits behind it); not a READ, which may wait for
//!   the OSDs.
//!
//! A kind never seen costs nothing yet: its first request is served inline, and a slow one
//! moves the mean past the budget at once (one 1 ms MDS round trip counts for 125 µs).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Requests whose opcode's mean serve time is at most this are served inline even with
/// others behind them: about what handing one to a worker costs.
pub(super) const INLINE_BUDGET: Duration = Duration::from_micros(20);

/// Weight of a new sample in the mean: 1/2^SHIFT.
const SHIFT: u32 = 3;

/// Opcodes below this have a mean of their own; the others (CUSE_INIT, unknown, unreadable)
/// share one.
const SLOTS: usize = 64;

/// Mean serve time per opcode, in nanoseconds.
pub(super) struct ServeCost {
    by_opcode: [AtomicU32; SLOTS],
    other: AtomicU32,
    /// Tests of the placement (not of the learning) set the means and keep them.
    #[cfg(test)]
    frozen: std::sync::atomic::AtomicBool,
}

impl Default for ServeCost {
    fn default() -> Self {
        ServeCost {
            by_opcode: std::array::from_fn(|_| AtomicU32::new(0)),
            other: AtomicU32::new(0),
            #[cfg(test)]
            frozen: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl ServeCost {
    fn slot(&self, opcode: Option<u32>) -> &AtomicU32 {
        opcode
            .and_then(|op| usize::try_from(op).ok())
            .and_then(|i| self.by_opcode.get(i))
            .unwrap_or(&self.other)
    }

    /// Account one request of `opcode` that took `took` to serve.
    pub fn record(&self, opcode: Option<u32>, took: Duration) {
        #[cfg(test)]
        if self.frozen.load(Ordering::Relaxed) {
            return;
        }
        let slot = self.slot(opcode);
        let sample = i64::from(u32::try_from(took.as_nanos()).unwrap_or(u32::MAX));
        let old = i64::from(slot.load(Ordering::Relaxed));
        let new = old + ((sample - old) >> SHIFT);
        slot.store(u32::try_from(new).unwrap_or(u32::MAX), Ordering::Relaxed);
    }

    /// The mean serve time of `opcode` so far.
    pub fn mean(&self, opcode: Option<u32>) -> Duration {
        Duration::from_nanos(u64::from(self.slot(opcode).load(Ordering::Relaxed)))
    }

    /// Set the means of some kinds and stop learning: placement tests then do not depend on
    /// how long a request happened to take on a loaded machine.
    #[cfg(test)]
    pub fn freeze_with(&self, means: &[(u32, Duration)]) {
        self.frozen.store(true, Ordering::Relaxed);
        for (op, mean) in means {
            let ns = u32::try_from(mean.as_nanos()).unwrap_or(u32::MAX);
            self.slot(Some(*op)).store(ns, Ordering::Relaxed);
        }
    }

    /// Whether a request of `opcode` is cheap enough to serve inline with others behind it.
    pub fn cheap(&self, opcode: Option<u32>) -> bool {
        self.mean(opcode) <= INLINE_BUDGET
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_slow_request_makes_its_kind_expensive_at_once() {
        let c = ServeCost::default();
        assert!(c.cheap(Some(1)), "an unseen kind is served inline");
        c.record(Some(1), us(1000));
        assert_eq!(c.mean(Some(1)), us(125));
        assert!(!c.cheap(Some(1)));
        // Other kinds keep their own mean.
        assert!(c.cheap(Some(3)));
    }

    #[test]
    fn cheap_requests_bring_it_back_after_a_few_samples() {
        let c = ServeCost::default();
        c.record(Some(1), us(1000));
        let mut n = 0;
        while !c.cheap(Some(1)) {
            c.record(Some(1), us(2));
            n += 1;
            assert!(n < 100, "never came back under the budget");
        }
        // The 123 µs above 2 µs decay by 7/8 per sample: under 18 µs after 15.
        assert_eq!(n, 15);
        // A steady cost converges to itself.
        for _ in 0..200 {
            c.record(Some(1), us(2));
        }
        assert!(
            c.mean(Some(1)).abs_diff(us(2)) < us(1),
            "{:?}",
            c.mean(Some(1))
        );
    }

    #[test]
    fn odd_opcodes_share_one_slot_and_huge_times_saturate() {
        let c = ServeCost::default();
        c.record(None, us(800));
        assert_eq!(c.mean(Some(4096)), us(100));
        assert_eq!(c.mean(Some(u32::MAX)), us(100));
        assert_eq!(c.mean(Some(64)), us(100));
        assert_eq!(c.mean(Some(0)), Duration::ZERO);
        c.record(Some(2), Duration::from_secs(3600));
        assert!(c.mean(Some(2)) >= Duration::from_millis(500));
        assert!(!c.cheap(Some(2)));
    }
}
