//! Each queue's thread: popping chains, deciding where each request runs (inline, a worker, the
//! async path), serving those it keeps, polling the ring before it sleeps, and the rescuer that
//! hands what waits behind a slow inline request to the workers.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::{Duration, Instant};

use tracing::{debug, warn};
use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestAddressSpace, GuestMemoryMmap};

use super::chain::{self, Request};
use super::cost::ServeCost;
use super::deadline::Claim;
use super::pool::WorkerPool;
use super::session::InFlightGuard;
use super::split;
use super::{
    hiprio, rescue, GuestBitmap, GuestMem, Inner, MemGuard, VhostUserFsBackend, Vring, HIPRIO_QUEUE,
};
use crate::metrics;
use crate::poll::{spin_until, AdaptivePoll, Look, LOOKS_PER_CLOCK_READ};
use crate::server::{FuseServer, Servable};
use crate::wire::{FUSE_COPY_FILE_RANGE, FUSE_SETLKW, FUSE_SYNCFS};

/// Polling state of one queue (only its own thread takes the lock).
#[derive(Debug)]
pub(super) struct QueuePoll {
    pub(super) window: AdaptivePoll,
    /// When the last spin that ended in a sleep started.
    pub(super) slept_at: Option<Instant>,
}

impl<F> VhostUserFsBackend<F>
where
    F: Servable + 'static,
{
    /// Pop every available chain of `vring` and dispatch it.
    ///
    /// With a worker pool, requests that wait for the OSDs (FSYNC, FALLOCATE, …) always go to
    /// the pool: served here, one of them would keep the queue unread for a whole OSD round
    /// trip, and so do WRITEs. READs go there too unless their kind has been answering from
    /// libcephfs's object cache lately (a 4 KiB cached READ costs a few microseconds, the
    /// hand-off to a worker about ten). SETLKW may wait for another request of the same queue to
    /// unlock, so it gets a worker of its own, on every queue and also without a pool. Of the others, those whose kind has been
    /// answering from libcephfs's caches are served right here, in order (see `cost`): on a
    /// worker they would only add a hand-off before taking libcephfs's client lock. The rest
    /// go to the pool, except the last of the batch, served right here too: a lone request (a
    /// path walk, a create) then costs no hand-off and no wake-up, while a burst of requests
    /// that wait for the MDS still spreads over the workers. Returns how many were popped.
    pub(super) fn drain_queue(&self, vring: &Vring, mem: &GuestMem, queue: usize) -> usize {
        if self.inner.logging.load(Ordering::Acquire) {
            return self.drain_queue_locked(vring, mem, queue);
        }
        let mut last: Option<Pending> = None;
        let mut popped = 0;
        loop {
            if self.inner.closed.load(Ordering::Acquire) {
                break;
            }
            // The memory map as it is now, for each request: a frontend adding memory while
            // the guest runs changes it between two requests.
            let Some(pending) = self.pop(vring, mem.memory(), queue) else {
                break;
            };
            popped += 1;
            // Sending may wait (caps from the MDS, a privilege kill, the size under the caps):
            // watched as a request served inline, so the rescuer hands what queues behind it
            // to the workers. A request alone (none other in flight, none behind it in the
            // ring) goes the blocking way (see `nonblocking`: at depth 1 the async path does
            // not pay).
            #[cfg(libcephfs_nonblocking)]
            let Some(pending) = (match &self.inner.aio {
                Some(aio) if self.inner.in_flight.others() || more_avail(vring, mem) => {
                    let _inline = self.inner.watch.enter_at(queue, Instant::now());
                    super::nonblocking::try_start(aio, &self.inner.server, pending, vring, queue)
                }
                _ => Some(pending),
            }) else {
                continue;
            };
            let dispatch = Dispatch::of(pending.opcode());
            if dispatch == Dispatch::Waits {
                // Whatever the queue and the pool size: a lock wait on this thread would stall
                // the queue that carries the unlock.
                if let Some(pool) = self.inner.pool.as_ref().or(self.inner.waits_pool.as_ref()) {
                    self.submit(pool, vring, pending, queue, true);
                    continue;
                }
            }
            match &self.inner.pool {
                Some(pool) if queue != HIPRIO_QUEUE => match dispatch {
                    Dispatch::Quick | Dispatch::Cached
                        if self.inner.cost.cheap(pending.opcode()) =>
                    {
                        // What waited for the batch's end goes first: it will take longer.
                        if let Some(prev) = last.take() {
                            self.submit(pool, vring, prev, queue, false);
                        }
                        self.serve(pending, vring, queue);
                    }
                    Dispatch::Waits | Dispatch::Blocks | Dispatch::Cached => {
                        self.submit(pool, vring, pending, queue, false)
                    }
                    Dispatch::Quick => {
                        if let Some(prev) = last.replace(pending) {
                            self.submit(pool, vring, prev, queue, false);
                        }
                    }
                },
                // No choice to make, so nothing to time.
                _ => pending.serve(Instant::now(), &self.inner.server, vring, queue, None),
            }
        }
        if let Some(p) = last {
            self.serve(p, vring, queue);
        }
        popped
    }

    /// [`Self::drain_queue`] during a migration: each request is served from pop to used with
    /// the vring locked, on this thread. QEMU stops the rings (GET_VRING_BASE, which takes the
    /// same lock) before it sends the last dirty pages and then the device state: a request
    /// answered after that would reach neither the guest's memory on the destination nor its
    /// used index, and the guest would wait for it forever. Holding the lock makes the stop wait
    /// for the request in hand (the guest is paused by then, so no more come). SETLKW, which may
    /// wait for the guest's own unlock, still goes to a worker.
    pub(super) fn drain_queue_locked(&self, vring: &Vring, mem: &GuestMem, queue: usize) -> usize {
        let guard = mem.memory();
        let mut popped = 0;
        loop {
            if self.inner.closed.load(Ordering::Acquire) {
                break;
            }
            let mut state = vring.get_mut();
            let Some((request, generation)) = pop_request(vring, &mut state, &guard) else {
                break;
            };
            popped += 1;
            let pending = Pending {
                // Served under the ring's lock: never answered early.
                claim: None,
                in_flight: self.inner.in_flight.enter(),
                depth: metrics::global().queue_enter(queue),
                generation,
                request,
                guard: guard.clone(),
            };
            if pending.opcode() == Some(FUSE_SETLKW) {
                drop(state);
                if let Some(pool) = self.inner.pool.as_ref().or(self.inner.waits_pool.as_ref()) {
                    self.submit(pool, vring, pending, queue, true);
                } else {
                    pending.serve(Instant::now(), &self.inner.server, vring, queue, None);
                }
                continue;
            }
            chain::warm();
            chain::complete_locked(
                &self.inner.server,
                &mut state,
                &pending.guard,
                &pending.request,
                queue,
            );
        }
        popped
    }

    /// Pop the next available chain and read its descriptors and in-header (`chain::walk`).
    // Inlined: a `Pending` is a few hundred bytes, and each call that takes or returns one
    // by value copies it (measured: five copies per request before).
    #[inline(always)]
    pub(super) fn pop(&self, vring: &Vring, guard: MemGuard, queue: usize) -> Option<Pending> {
        let (request, generation) = {
            let mut state = vring.get_mut();
            let (head, generation, table, size) = {
                let generation = vring.running()?;
                let q = state.get_queue_mut();
                let head = split::pop_head(q, &guard)?;
                (head, generation, GuestAddress(q.desc_table()), q.size())
            };
            drop(state);
            (chain::walk(&guard, table, size, head), generation)
        };
        // From here on the request counts against --request-deadline, waiting for a thread
        // included.
        let claim = chain::claim(&request, generation, queue, vring, &guard);
        Some(Pending {
            claim,
            in_flight: self.inner.in_flight.enter(),
            depth: metrics::global().queue_enter(queue),
            generation,
            request,
            guard,
        })
    }

    /// Serve a `Dispatch::Quick` request here, timing it for `cost`; should it be slow, the
    /// rescuer hands the requests behind it to workers.
    // Inlined: a `Pending` is a few hundred bytes, and each call that takes or returns one
    // by value copies it (measured: five copies per request before).
    #[inline(always)]
    pub(super) fn serve(&self, p: Pending, vring: &Vring, queue: usize) {
        let start = Instant::now();
        let _inline = self.inner.watch.enter_at(queue, start);
        p.serve(
            start,
            &self.inner.server,
            vring,
            queue,
            Some(&self.inner.cost),
        );
    }

    /// The queue thread of `queue` is held by a slow request: hand what waits in its ring to
    /// the workers (see `rescue`). Nothing during a migration's logging, when requests are
    /// served with their vring held, nor while the queues are closed.
    pub(super) fn rescue(&self, queue: usize) {
        let Some(pool) = &self.inner.pool else {
            return;
        };
        if self.inner.logging.load(Ordering::Acquire) {
            return;
        }
        let (Some(vring), Some(mem)) = (self.kicked_vring(queue), self.guest_mem()) else {
            return;
        };
        let mut n = 0u32;
        while !self.inner.closed.load(Ordering::Acquire) {
            let Some(p) = self.pop(&vring, mem.memory(), queue) else {
                break;
            };
            let waits = Dispatch::of(p.opcode()) == Dispatch::Waits;
            self.submit(pool, &vring, p, queue, waits);
            n += 1;
        }
        if n > 0 {
            debug!(
                queue,
                requests = n,
                "The queue thread is held by a slow request: the requests behind it went to workers"
            );
        }
    }

    pub(super) fn submit(
        &self,
        pool: &WorkerPool,
        vring: &Vring,
        p: Pending,
        queue: usize,
        waits: bool,
    ) {
        let server = self.inner.server.clone();
        // Only Quick and Cached kinds consult their cost; the others go to a worker whatever
        // it is.
        let cost = matches!(Dispatch::of(p.opcode()), Dispatch::Quick | Dispatch::Cached)
            .then(|| self.inner.cost.clone());
        let vring = vring.clone();
        pool.submit(
            Box::new(move || p.serve(Instant::now(), &server, &vring, queue, cost.as_deref())),
            waits,
        );
    }

    /// `queue`'s vring as its first kick of this connection brought it.
    fn kicked_vring(&self, queue: usize) -> Option<Vring> {
        self.inner
            .vrings
            .get(queue)?
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The frontend's guest memory, once it has sent a memory table.
    fn guest_mem(&self) -> Option<GuestMem> {
        self.inner
            .mem
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn process_queue(&self, vring: &Vring, queue: usize) -> io::Result<()> {
        let Some(mem) = self.guest_mem() else {
            warn!(
                queue,
                "Queue kicked before the frontend sent a memory table; ignoring"
            );
            return Ok(());
        };
        // Guest notifications stay off while we drain (NO_NOTIFY, or a stale avail_event
        // under EVENT_IDX) and while we poll; re-enabling them re-checks the ring, so a request
        // made just before is never left without a kick.
        let Some(state) = self.inner.polls.get(queue) else {
            return Ok(());
        };
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        // The wait that just ended: it tells whether spinning would have caught this kick.
        if let Some(at) = state.slept_at.take() {
            state.window.slept(at.elapsed());
        }
        // A request queue's thread watches the hiprio ring too from its first spin until it
        // sleeps (`hiprio`).
        let mut hiprio: Option<HiprioWatch<'_, F>> = None;
        // Only with a rescuer: it serves the hiprio ring should a watcher be held by a slow
        // request.
        let watches = queue != HIPRIO_QUEUE && self.inner.watch.has_rescuer();
        let mut hiprio_tried = !watches;
        // The ring said it holds requests we have not taken (the spin, or the re-check when
        // turning notifications on).
        let mut said_more = false;
        loop {
            // Through the queue with one load of the memory map: `VringT`'s methods load it
            // anew for each call.
            vring
                .get_mut()
                .get_queue_mut()
                .disable_notification(&*mem.memory())
                .map_err(queue_error)?;
            let popped = self.drain_queue(vring, &mem, queue);
            if self.inner.closed.load(Ordering::Acquire) {
                // Closed (a stop, or a handover under way): what is left stays in the ring
                // with notifications off; `reopen` drains it if serving goes on.
                return Ok(());
            }
            if popped == 0 && said_more && stuck(vring, &mem) {
                // Requests no pop can take: a ring the frontend stopped (its restart starts
                // afresh), or an avail index further ahead than the ring holds (a broken or
                // hostile driver, refused by `split`). Asked again, the ring would say the
                // same for ever: sleep until the next kick.
                debug!(
                    queue,
                    "The ring shows requests that cannot be taken; sleeping"
                );
                return Ok(());
            }
            if queue == HIPRIO_QUEUE && self.inner.hiprio.any() {
                // A request queue's thread watches this ring and turns its notifications on
                // when it stops (`hiprio`): left off, the guest's FORGETs need no kick.
                return Ok(());
            }
            let spin_start = Instant::now();
            let window = state.window.window();
            if !window.is_zero() {
                if !hiprio_tried {
                    hiprio_tried = true;
                    hiprio = self.watch_hiprio(&mem);
                }
                if self.poll_avail(vring, &mem, window, hiprio.as_mut()) {
                    said_more = true;
                    continue;
                }
            }
            // To sleep: the hiprio ring is its own thread's again.
            drop(hiprio.take());
            hiprio_tried = !watches;
            let more = vring
                .get_mut()
                .get_queue_mut()
                .enable_notification(&*mem.memory())
                .map_err(queue_error)?;
            if !more {
                state.slept_at = Some(spin_start);
                return Ok(());
            }
            // A request came just after the spin gave up: a slightly longer one would have
            // caught it.
            state.window.slept(spin_start.elapsed());
            said_more = true;
        }
    }

    /// The current polling window of `queue`.
    #[cfg(test)]
    pub(super) fn poll_window(&self, queue: usize) -> Duration {
        self.inner.polls.get(queue).map_or(Duration::ZERO, |p| {
            p.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .window
                .window()
        })
    }

    /// Start `queue`'s polling window at `window`, as after a run of short waits.
    #[cfg(test)]
    pub(super) fn set_poll_window(&self, queue: usize, window: Duration) {
        if let Some(p) = self.inner.polls.get(queue) {
            let mut p = p.lock().unwrap_or_else(PoisonError::into_inner);
            p.window = p.window.with_window(window);
        }
    }

    /// Spin for at most `window`, watching the avail ring for a request we have not popped.
    ///
    /// A guest that sends its next request within the window is served without a kick and
    /// without waking this thread from epoll: on a busy queue that saves two cross-CPU wake-ups
    /// per request (the guest's kick and our wake-up). Reads the avail index lock-free, so
    /// workers returning chains are not held up, and yields the CPU between rounds of reads.
    ///
    /// With `hiprio`, the hiprio ring is watched too, and what comes there is served here
    /// (`hiprio`) before the spin goes on.
    pub(super) fn poll_avail(
        &self,
        vring: &Vring,
        mem: &GuestMem,
        window: Duration,
        mut hiprio: Option<&mut HiprioWatch<'_, F>>,
    ) -> bool {
        loop {
            let guard = mem.memory();
            // Translated once for the whole spin; the ring's lock is held only to begin.
            let Some(watch) = split::AvailWatch::new(vring.get_ref().get_queue(), &guard) else {
                return false;
            };
            let other = hiprio
                .as_ref()
                .filter(|h| !h.stuck)
                .and_then(|h| h.mark.watch(&guard));
            let mut to_hiprio = false;
            let ready = spin_until(window, LOOKS_PER_CLOCK_READ, || {
                if self.inner.closed.load(Ordering::Relaxed) {
                    return Look::GiveUp;
                }
                match watch.moved() {
                    Some(true) => return Look::Ready,
                    Some(false) => {}
                    None => return Look::GiveUp,
                }
                if other.as_ref().and_then(|w| w.moved()) == Some(true) {
                    to_hiprio = true;
                    return Look::Ready;
                }
                Look::NotYet
            });
            match hiprio.as_deref_mut() {
                Some(h) if ready && to_hiprio => {
                    drop(guard);
                    if self.drain_queue(&h.vring, mem, HIPRIO_QUEUE) == 0 {
                        // Nothing taken: another thread was first, or nothing can be taken
                        // (see `stuck`); then the ring is not watched until this spin ends.
                        h.stuck = stuck(&h.vring, mem);
                    }
                    h.mark = hiprio::Mark::of(&h.vring);
                }
                _ => return ready,
            }
        }
    }

    /// Start watching the hiprio ring (`hiprio`); `None` before its first kick of this
    /// connection brought its vring.
    fn watch_hiprio(&self, mem: &GuestMem) -> Option<HiprioWatch<'_, F>> {
        let vring = self.kicked_vring(HIPRIO_QUEUE)?;
        self.inner.hiprio.enter();
        // After the count: a request the hiprio thread leaves behind from now on is seen
        // here or served at the end of the watch.
        let mark = hiprio::Mark::of(&vring);
        Some(HiprioWatch {
            backend: self,
            vring,
            mem: mem.clone(),
            mark,
            stuck: false,
        })
    }

    /// Turn the hiprio queue's notifications back on after the last watcher left, and serve
    /// what came before they were on (unless a new watcher will). Nothing while the queues
    /// are closed: `reopen` drains every ring and turns them on.
    fn rearm_hiprio(&self, vring: &Vring, mem: &GuestMem) {
        loop {
            if self.inner.closed.load(Ordering::Acquire) {
                return;
            }
            let more = {
                let mut state = vring.get_mut();
                // A stopped ring is not written to; its next start begins with them on.
                if vring.running().is_none() {
                    return;
                }
                state.get_queue_mut().enable_notification(&*mem.memory())
            };
            match more {
                Ok(false) => return,
                Ok(true) => {}
                Err(e) => {
                    warn!(error = %e, "Cannot turn the hiprio queue's notifications back on");
                    return;
                }
            }
            if self.inner.hiprio.any() {
                return;
            }
            // Nothing taken: another thread took them (and follows the rule itself), or nothing
            // can be taken (see `stuck`).
            if self.drain_queue(vring, mem, HIPRIO_QUEUE) == 0 {
                return;
            }
        }
    }

    /// Serve the hiprio ring when a request queue's thread watches it but is held by a slow
    /// request (the rescuer, see `hiprio`).
    pub(super) fn rescue_hiprio(&self) {
        if !self.inner.hiprio.any() || self.inner.logging.load(Ordering::Acquire) {
            return;
        }
        if let (Some(vring), Some(mem)) = (self.kicked_vring(HIPRIO_QUEUE), self.guest_mem()) {
            self.drain_queue(&vring, &mem, HIPRIO_QUEUE);
            // The rule of every hiprio popper: the watcher may have left meanwhile.
            if !self.inner.hiprio.any() {
                self.rearm_hiprio(&vring, &mem);
            }
        }
    }
}

/// A request queue's thread watching the hiprio ring (`hiprio`): the last to drop its watch
/// turns the hiprio queue's notifications back on.
pub(super) struct HiprioWatch<'b, F>
where
    F: Servable + 'static,
{
    backend: &'b VhostUserFsBackend<F>,
    vring: Vring,
    mem: GuestMem,
    /// Where the ring stood at the last look under its lock.
    mark: hiprio::Mark,
    /// The ring shows requests no pop can take (see `stuck`): not watched until the spin ends.
    stuck: bool,
}

impl<F> Drop for HiprioWatch<'_, F>
where
    F: Servable + 'static,
{
    fn drop(&mut self) {
        if self.backend.inner.hiprio.leave() && !std::thread::panicking() {
            self.backend.rearm_hiprio(&self.vring, &self.mem);
        }
    }
}

/// Whether `vring` shows requests no pop can take: the frontend stopped it, or its avail index
/// is further ahead of the requests taken than the ring holds (a broken or hostile driver;
/// `split` and virtio-queue refuse such a ring), or the index cannot be read.
fn stuck(vring: &Vring, mem: &GuestMem) -> bool {
    let state = vring.get_ref();
    if vring.running().is_none() {
        return true;
    }
    let q = state.get_queue();
    match q.avail_idx(&*mem.memory(), Ordering::Acquire) {
        Ok(idx) => idx.0.wrapping_sub(q.next_avail()) > q.size(),
        Err(_) => true,
    }
}

/// Whether the guest has made requests that are not popped yet (read lock-free, as
/// `poll_avail` does).
#[cfg(libcephfs_nonblocking)]
pub(super) fn more_avail(vring: &Vring, mem: &GuestMem) -> bool {
    let guard = mem.memory();
    split::AvailWatch::new(vring.get_ref().get_queue(), &guard)
        .and_then(|w| w.moved())
        .unwrap_or(false)
}

/// The rescuer thread (see `rescue`): while requests are served inline, look every
/// `rescue::TICK` for a queue whose inline request has run past `rescue::LIMIT`; sleep while
/// none is. Ends once its backend is gone.
pub(super) fn rescue_loop<F>(weak: &Weak<Inner<F>>)
where
    F: Servable + 'static,
{
    let mut seen = 0;
    loop {
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let backend = VhostUserFsBackend { inner };
        let begun = backend.inner.watch.begun();
        if begun == seen && backend.inner.watch.go_idle(begun) {
            drop(backend);
            std::thread::park_timeout(rescue::IDLE_CHECK);
            continue;
        }
        seen = begun;
        let overdue = backend.inner.watch.overdue(rescue::LIMIT);
        for &queue in &overdue {
            backend.rescue(queue);
        }
        if !overdue.is_empty() {
            backend.rescue_hiprio();
        }
        drop(backend);
        std::thread::sleep(rescue::TICK);
    }
}

/// Where a request is served when there is a worker pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dispatch {
    /// Often answered from libcephfs's caches: served inline when its kind has been cheap
    /// lately, or when it is the last of a batch.
    Quick,
    /// Moves data out of libcephfs's object cache when it can (READ): served inline when its
    /// kind has been cheap lately, else a worker, also as the last of a batch: one that waits
    /// for the OSDs would keep the queue unread for a round trip.
    Cached,
    /// Moves data into the cache or waits for the OSDs or the MDS (WRITE, FSYNC, FALLOCATE,
    /// copies, SYNCFS): always a worker. A WRITE may wait for the cache's dirty data to drain.
    Blocks,
    /// May wait for another request (a lock held by the same guest): a worker of its own.
    Waits,
}

impl Dispatch {
    pub(super) fn of(opcode: Option<u32>) -> Self {
        use crate::wire::{FUSE_FALLOCATE, FUSE_FSYNC, FUSE_FSYNCDIR, FUSE_READ, FUSE_WRITE};
        match opcode {
            Some(FUSE_SETLKW) => Dispatch::Waits,
            Some(FUSE_READ) => Dispatch::Cached,
            Some(
                FUSE_WRITE | FUSE_FSYNC | FUSE_FSYNCDIR | FUSE_FALLOCATE | FUSE_COPY_FILE_RANGE
                | FUSE_SYNCFS,
            ) => Dispatch::Blocks,
            _ => Dispatch::Quick,
        }
    }
}

/// A popped chain and what accounts for it until it is answered.
pub(super) struct Pending {
    in_flight: InFlightGuard,
    depth: metrics::QueueDepthGuard,
    /// The generation of its ring it was taken in (`ring`): it touches guest memory and is
    /// answered only while that generation runs.
    pub(super) generation: u64,
    /// The chain's descriptors and in-header, read once when it was popped: where the request
    /// runs and what the server does with it are both decided from this copy.
    pub(super) request: Request,
    pub(super) guard: MemGuard,
    /// `--request-deadline`: who answers it, this request's thread or the timer.
    pub(super) claim: Option<Arc<Claim>>,
}

impl Pending {
    pub(super) fn opcode(&self) -> Option<u32> {
        self.request.opcode()
    }

    /// Serve the request, begun at `start`, and give it back; with `cost`, account how long
    /// that took.
    // Inlined: a `Pending` is a few hundred bytes, and each call that takes or returns one
    // by value copies it (measured: five copies per request before).
    #[inline(always)]
    pub(super) fn serve<F>(
        self,
        start: Instant,
        server: &FuseServer<F>,
        vring: &Vring,
        queue: usize,
        cost: Option<&ServeCost>,
    ) where
        F: Servable,
    {
        chain::warm();
        let took = chain::complete(
            server,
            vring,
            &self.guard,
            &self.request,
            self.generation,
            queue,
            start,
            self.claim.as_deref(),
        );
        if let Some(cost) = cost {
            cost.record(self.opcode(), took.unwrap_or_else(|| start.elapsed()));
        }
        drop(self.depth);
        drop(self.in_flight);
    }
}

/// Pop the next available chain of `vring` (whose state `state` the caller holds locked) and
/// walk it (`chain::walk`): the request and the generation of the ring it came from.
pub(super) fn pop_request(
    vring: &Vring,
    state: &mut vhost_user_backend::VringState<GuestMem>,
    mem: &MemGuard,
) -> Option<(Request, u64)> {
    let mem: &GuestMemoryMmap<GuestBitmap> = mem;
    // Stable while the ring's lock is held (`ring`): a stopping ring gives nothing more.
    let generation = vring.running()?;
    let queue = state.get_queue_mut();
    let head = split::pop_head(queue, mem)?;
    let (table, size) = (GuestAddress(queue.desc_table()), queue.size());
    Some((chain::walk(mem, table, size, head), generation))
}

pub(super) fn queue_error(e: virtio_queue::Error) -> io::Error {
    io::Error::other(format!("virtqueue access failed: {e}"))
}
