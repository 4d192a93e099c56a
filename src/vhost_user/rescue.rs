//! Requests stuck behind one that is served inline and turned out slow.
//!
//! A queue thread serves some requests itself (the last of a batch, and kinds that have been
//! answering from libcephfs's caches): a hand-off to a worker would cost more than they do.
//! Whether one of them waits for the cluster is only known once it has: a LOOKUP the MDS must
//! answer while the MDS is stalled keeps its queue thread for as long as the MDS does, and
//! every request the guest puts on that queue meanwhile (a GETATTR libcephfs could answer at
//! once) would wait too. The queue thread cannot look at its ring while it is inside
//! libcephfs, so another thread does: the queue thread marks when it starts an inline request
//! and unmarks when it ends, and the rescuer, a thread that looks every [`TICK`] while the
//! queues are busy, drains the ring of a queue whose inline request has run longer than
//! [`LIMIT`] onto the workers. A request then waits for a slow one ahead of it at most about
//! `LIMIT + TICK`, not for as long as the cluster takes.
//!
//! The rescuer sleeps while no request is served inline (an idle daemon, or one whose
//! requests all go to workers) and the next inline request wakes it, so an idle daemon pays
//! nothing for it but one wake-up a second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long an inline request may run before the requests behind it go to workers. An MDS
/// round trip of a healthy cluster is far shorter.
pub(super) const LIMIT: Duration = Duration::from_millis(10);
/// How often the rescuer looks while requests are being served inline.
pub(super) const TICK: Duration = Duration::from_millis(5);
/// How long the rescuer sleeps when idle before it looks whether its backend is gone.
pub(super) const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Which queue threads serve a request inline, and since when.
#[derive(Debug)]
pub(super) struct InlineWatch {
    /// Per queue: when its inline request started (nanoseconds since `base`, plus 1), or 0.
    started: Vec<AtomicU64>,
    /// Inline requests begun so far: the rescuer goes idle once this stops moving.
    begun: AtomicU64,
    /// The rescuer sleeps until the next inline request.
    idle: AtomicBool,
    /// The rescuer thread, to wake it.
    rescuer: OnceLock<Thread>,
    base: Instant,
}

/// Unmarks its queue's inline request when dropped.
pub(super) struct InlineGuard<'a> {
    slot: Option<&'a AtomicU64>,
}

impl Drop for InlineGuard<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.slot {
            s.store(0, Ordering::Release);
        }
    }
}

impl InlineWatch {
    pub(super) fn new(queues: usize) -> Self {
        InlineWatch {
            started: (0..queues).map(|_| AtomicU64::new(0)).collect(),
            begun: AtomicU64::new(0),
            idle: AtomicBool::new(false),
            rescuer: OnceLock::new(),
            base: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        self.stamp(Instant::now())
    }

    fn stamp(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// The thread [`Self::enter`] wakes when the rescuer is idle.
    pub(super) fn set_rescuer(&self, t: Thread) {
        let _ = self.rescuer.set(t);
    }

    /// `queue`'s thread starts serving a request itself at `at`, until the guard is dropped
    /// (`at` is the caller's clock read, so that a request reads the clock once to begin).
    pub(super) fn enter_at(&self, queue: usize, at: Instant) -> InlineGuard<'_> {
        let slot = self.started.get(queue);
        if let Some(s) = slot {
            s.store(self.stamp(at) + 1, Ordering::Release);
        }
        // SeqCst, with `go_idle`: either the rescuer sees this request begun, or this sees it
        // idle and wakes it.
        self.begun.fetch_add(1, Ordering::SeqCst);
        if self.idle.load(Ordering::SeqCst) && self.idle.swap(false, Ordering::SeqCst) {
            if let Some(t) = self.rescuer.get() {
                t.unpark();
            }
        }
        InlineGuard { slot }
    }

    /// Whether a rescuer thread runs.
    pub(super) fn has_rescuer(&self) -> bool {
        self.rescuer.get().is_some()
    }

    /// Inline requests begun so far.
    pub(super) fn begun(&self) -> u64 {
        self.begun.load(Ordering::SeqCst)
    }

    /// Whether any queue thread is serving a request inline now.
    pub(super) fn any_running(&self) -> bool {
        self.started.iter().any(|s| s.load(Ordering::Acquire) != 0)
    }

    /// Mark the rescuer idle unless an inline request began after `seen` was read: true when
    /// it may sleep (the next [`Self::enter`] wakes it).
    pub(super) fn go_idle(&self, seen: u64) -> bool {
        self.idle.store(true, Ordering::SeqCst);
        if self.begun.load(Ordering::SeqCst) != seen || self.any_running() {
            self.idle.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The queues whose inline request has been running for longer than `limit`.
    pub(super) fn overdue(&self, limit: Duration) -> Vec<usize> {
        let now = self.now();
        let limit = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX);
        self.started
            .iter()
            .enumerate()
            .filter_map(|(q, s)| {
                let at = s.load(Ordering::Acquire);
                (at != 0 && now.saturating_sub(at - 1) > limit).then_some(q)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_request_running_past_the_limit_is_overdue() {
        let w = InlineWatch::new(3);
        assert!(w.overdue(Duration::ZERO).is_empty());
        let g1 = w.enter_at(1, Instant::now());
        let g2 = w.enter_at(2, Instant::now());
        assert!(w.any_running());
        std::thread::sleep(Duration::from_millis(5));
        assert!(w.overdue(Duration::from_secs(60)).is_empty());
        assert_eq!(w.overdue(Duration::from_millis(1)), vec![1, 2]);
        drop(g1);
        assert_eq!(w.overdue(Duration::from_millis(1)), vec![2]);
        drop(g2);
        assert!(!w.any_running());
        assert!(w.overdue(Duration::ZERO).is_empty());
        assert_eq!(w.begun(), 2);
    }

    #[test]
    fn the_rescuer_goes_idle_only_when_nothing_began_and_nothing_runs() {
        let w = InlineWatch::new(2);
        let seen = w.begun();
        let g = w.enter_at(1, Instant::now());
        assert!(!w.go_idle(seen), "a request began since");
        assert!(!w.go_idle(w.begun()), "a request runs");
        drop(g);
        assert!(w.go_idle(w.begun()));
        // The next inline request wakes it: the flag is taken back.
        let _g = w.enter_at(1, Instant::now());
        assert!(!w.idle.load(Ordering::SeqCst));
    }

    #[test]
    fn an_idle_rescuer_is_woken_by_the_next_inline_request() {
        let w = std::sync::Arc::new(InlineWatch::new(2));
        let (tx, rx) = std::sync::mpsc::channel();
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            assert!(w2.go_idle(w2.begun()));
            tx.send(()).unwrap();
            // Long enough that only an unpark ends it within the test's patience.
            std::thread::park_timeout(Duration::from_secs(60));
        });
        w.set_rescuer(t.thread().clone());
        rx.recv().unwrap();
        let started = Instant::now();
        drop(w.enter_at(1, Instant::now()));
        t.join().unwrap();
        assert!(started.elapsed() < Duration::from_secs(30));
    }
}
