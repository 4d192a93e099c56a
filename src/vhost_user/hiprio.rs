//! The hiprio queue (FORGET, BATCH_FORGET, INTERRUPT), also served by the request-queue threads
//! while they poll.
//!
//! The hiprio queue has a thread of its own, asleep in epoll: it does not poll, since on a small
//! host a third spinning thread would take a core from the guest or from a request queue. But a
//! guest walking paths sends a FORGET every few requests (its inode cache evicts), and each one
//! cost the guest's kick and a wake-up of that thread, taken from cores the guest and the
//! request queue's thread were spinning on: on a walk of five components that was more than the
//! five LOOKUPs. So a request-queue thread that polls its own ring looks at the hiprio ring too
//! and serves what it finds there, and while one does, the hiprio queue's notifications stay
//! off: the guest puts its FORGETs in the ring without a kick.
//!
//! Notifications of a ring are off from the moment requests are popped past its last
//! `enable_notification` (EVENT_IDX: the `avail_event` the guest reads lags behind) or the
//! last `disable_notification` (no EVENT_IDX), until someone enables them again. The rule that
//! keeps a request from waiting in a ring nobody watches: whoever pops hiprio requests or stops
//! watching turns them back on, unless a watcher remains; the last watcher to leave turns them on.
//! The watcher count is read and written SeqCst, a Dekker pair with the pops (made under the
//! ring's lock): either the hiprio thread, after its pops, sees a watcher, which then leaves
//! after that read and enables under the ring's lock, after the pops; or it sees none and
//! enables itself.
//!
//! A watcher stays one from its first spin until it goes to sleep, not only while it spins:
//! otherwise a busy queue would turn the hiprio notifications on after every request. While it
//! serves a request of its own, the hiprio ring waits; should that request be slow (an MDS that
//! does not answer), the rescuer serves the hiprio ring (`rescue`), as it hands the requests
//! queued behind the slow one to workers. So only a daemon with workers, which has a rescuer,
//! lets its request-queue threads watch (with `--thread-pool-size 0` every request waits for
//! the one before it on its queue anyway, and the hiprio queue stays its own thread's).

use std::sync::atomic::{AtomicUsize, Ordering};

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::GuestAddress;

use super::{split, GuestBitmap, Vring};

type Mem = vm_memory::GuestMemoryMmap<GuestBitmap>;

/// How many request-queue threads are watching the hiprio ring.
#[derive(Debug, Default)]
pub(super) struct Watchers {
    count: AtomicUsize,
}

impl Watchers {
    pub(super) fn enter(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    /// Stop watching; true when the caller was the last watcher and must turn the hiprio
    /// queue's notifications back on.
    pub(super) fn leave(&self) -> bool {
        self.count.fetch_sub(1, Ordering::SeqCst) == 1
    }

    /// Whether a request-queue thread watches the ring (it will turn the notifications on when
    /// it leaves).
    pub(super) fn any(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }
}

/// Where a watcher looks in the hiprio ring: its avail ring and the next entry not popped as
/// of the last look under the ring's lock.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mark {
    avail_ring: GuestAddress,
    next: u16,
}

impl Mark {
    /// The hiprio ring as it is now (its lock is taken for a moment).
    pub(super) fn of(vring: &Vring) -> Self {
        let state = vring.get_ref();
        let q = state.get_queue();
        Mark {
            avail_ring: GuestAddress(q.avail_ring()),
            next: q.next_avail(),
        }
    }

    /// A lock-free look at the ring's avail index through `mem`; `None` when the index is not
    /// in guest memory.
    pub(super) fn watch<'m>(&self, mem: &'m Mem) -> Option<split::AvailWatch<'m>> {
        split::AvailWatch::at(self.avail_ring, self.next, mem)
    }
}
