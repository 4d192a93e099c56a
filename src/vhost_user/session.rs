//! Requests in flight, and what stops taking them: pauses (a handover, a session recovery),
//! the final stop, the end of a frontend's session (`--keep-serving`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::warn;

use super::VhostUserFsBackend;
use crate::server::Servable;

/// Counts requests in flight so shutdown can wait for them. Entering and leaving are one atomic
/// operation each; the lock is taken, and the condition variable woken, only when the count
/// drops to zero while someone waits: the standard library's `notify_all` is a futex system call
/// even with no waiter, and on the request path that was one system call per request.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    pub(super) count: AtomicUsize,
    /// Threads in `wait_idle`. With `count`, a Dekker pair: a waiter raises it before it reads
    /// the count, a leaving request lowers the count before it reads this (both SeqCst), so at
    /// least one of the two sees the other.
    waiters: AtomicUsize,
    lock: Mutex<()>,
    idle: Condvar,
}

/// Decrements the in-flight count when dropped (also on unwind).
pub(super) struct InFlightGuard(Arc<InFlight>);

impl InFlight {
    pub(super) fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(self.clone())
    }

    /// Whether another request is in flight besides the caller's own.
    #[cfg(libcephfs_nonblocking)]
    pub(super) fn others(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 1
    }

    /// Wait until nothing is in flight, at most `limit`; false if requests are still running.
    pub(super) fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let idle = loop {
            if self.count.load(Ordering::SeqCst) == 0 {
                break true;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break false;
            };
            g = self
                .idle
                .wait_timeout(g, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        idle
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1
            && self.0.waiters.load(Ordering::SeqCst) > 0
        {
            // Taking the lock orders this wake-up after a waiter's check of the count.
            let _g = self.0.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.0.idle.notify_all();
        }
    }
}

/// See [`Inner::gate`].
#[derive(Debug, Default)]
pub(super) struct Gate {
    pub(super) pauses: usize,
    pub(super) stopped: bool,
}

impl<F> VhostUserFsBackend<F>
where
    F: Servable + 'static,
{
    /// Forget the previous frontend's memory before a new connection.
    pub fn reset_connection(&self) {
        *self
            .inner
            .mem
            .write()
            .unwrap_or_else(PoisonError::into_inner) = None;
        for v in &self.inner.vrings {
            *v.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }

    /// End the session of a frontend that went away, before the next one connects: wait, at
    /// most `limit`, until the requests it left in flight are answered, then drop every node
    /// and handle it was given (releasing their libcephfs references), so that the next
    /// frontend cannot use them. The caller makes sure that no queue thread of the old
    /// connection runs any more. False: requests are still running and nothing was dropped.
    pub fn end_session(&self, limit: Duration) -> bool {
        if !self.inner.in_flight.wait_idle(limit) {
            return false;
        }
        self.inner.server.end_session();
        true
    }

    /// Stop dispatching new requests and wait, at most `limit`, until every request in flight
    /// has been answered. True: no FUSE call is running and none will start. False: some call
    /// is still blocked (a SETLKW waiting for another client's lock, a libcephfs call waiting
    /// for an MDS that does not answer), and the filesystem must not be torn down under it.
    /// A pause: every `close_and_drain` is undone by one [`reopen`](Self::reopen), and the
    /// queues take requests again once every pause is undone.
    pub fn close_and_drain(&self, limit: Duration) -> bool {
        self.update_gate(|g| g.pauses += 1);
        self.inner.in_flight.wait_idle(limit)
    }

    /// [`close_and_drain`](Self::close_and_drain) for good: a later `reopen` (a session
    /// recovery or a handover that ends after the stop began) does not take requests again.
    pub fn stop_and_drain(&self, limit: Duration) -> bool {
        self.update_gate(|g| g.stopped = true);
        self.inner.in_flight.wait_idle(limit)
    }

    /// Change who keeps the queues closed, and `closed` with it, under the gate's lock: a
    /// reopen racing the final stop (or another pause) cannot open the queues under it.
    /// Whether the queues are open now.
    pub(super) fn update_gate(&self, change: impl FnOnce(&mut Gate)) -> bool {
        let mut g = self
            .inner
            .gate
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        change(&mut g);
        let closed = g.stopped || g.pauses > 0;
        self.inner.closed.store(closed, Ordering::Release);
        !closed
    }

    /// Undo one `close_and_drain` (a handover the successor did not take, a session recovered):
    /// once the queues are open again every queue is drained now, since the guest may have
    /// kicked while they were closed and will not kick again for the requests it waits on.
    pub fn reopen(&self) {
        if !self.update_gate(|g| g.pauses = g.pauses.saturating_sub(1)) {
            return;
        }
        for (queue, slot) in self.inner.vrings.iter().enumerate() {
            let vring = slot.lock().unwrap_or_else(PoisonError::into_inner).clone();
            if let Some(vring) = vring {
                if let Err(e) = self.process_queue(&vring, queue) {
                    warn!(queue, error = %e, "Cannot process queue after reopening it");
                }
            }
        }
    }
}

impl<F> crate::handover::Pausable for VhostUserFsBackend<F>
where
    F: Servable + 'static,
{
    fn pause(&self, limit: Duration) -> bool {
        self.close_and_drain(limit)
    }
    fn resume(&self) {
        self.reopen();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last request to leave wakes a waiter: a lost wake-up would hold `wait_idle` for its
    /// whole limit (a minute), so the 2,000 races below would take hours instead of well under
    /// the bound asserted. Threads leave before, while and after the waiter checks the count.
    #[test]
    fn the_last_request_to_leave_wakes_a_waiter_without_losing_the_wake_up() {
        let in_flight = Arc::new(InFlight::default());
        let started = Instant::now();
        for round in 0..2_000u32 {
            let guards: Vec<_> = (0..1 + round % 3).map(|_| in_flight.enter()).collect();
            let leaver = std::thread::spawn(move || {
                for (i, g) in guards.into_iter().enumerate() {
                    for _ in 0..(round as usize * 7 + i * 13) % 500 {
                        std::hint::spin_loop();
                    }
                    drop(g);
                }
            });
            assert!(
                in_flight.wait_idle(Duration::from_secs(60)),
                "round {round}"
            );
            leaver.join().unwrap();
            assert_eq!(in_flight.waiters.load(Ordering::SeqCst), 0);
        }
        assert!(
            started.elapsed() < Duration::from_secs(50),
            "a wake-up was lost: {:?} for 2,000 rounds",
            started.elapsed()
        );
    }

    /// Without a waiter, leaving takes no lock: a request that leaves while a thread holds the
    /// lock (as a waiter does between its checks) is not held up by it.
    #[test]
    fn leaving_without_a_waiter_takes_no_lock() {
        let in_flight = Arc::new(InFlight::default());
        let g = in_flight.enter();
        let held = in_flight.lock.lock().unwrap();
        let f = in_flight.clone();
        let leaver = std::thread::spawn(move || drop(g));
        // Joining while the lock is held would deadlock if leaving took it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(leaver.join().is_ok());
        });
        let left = rx.recv_timeout(Duration::from_secs(30));
        drop(held);
        assert_eq!(left, Ok(true), "leaving waited for the lock");
        assert_eq!(f.count.load(Ordering::SeqCst), 0);
    }
}
