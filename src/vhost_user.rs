//! vhost-user glue for virtio-fs: queues, features, config space, `handle_event`.
//!
//! Queue 0 is the hiprio queue (FORGET, INTERRUPT), queues 1..=N carry requests. Each queue has
//! its own vhost-user epoll thread (`queues_per_thread`). Request chains are popped there, and
//! each one's FUSE in-header is read once: every decision about the request is made from that
//! copy, and the server gets it too (fuse-backend-rs reads it from a private copy, `bounce`).
//! Requests that wait for the OSDs or the MDS are handed to an elastic worker pool
//! (`--thread-pool-size` = most workers; 0 = serve everything inline but lock waits, which
//! never run on a queue thread), except the last of a
//! batch; the queue thread serves that one, and the requests libcephfs has lately been
//! answering from its caches (`cost`), itself. So a burst of waiting requests spreads over the
//! workers, and a lone request or a cached one pays no hand-off. Should one served inline turn
//! out slow (the MDS stalled), the rescuer thread hands the requests queued behind it to the
//! workers after a few milliseconds (`rescue`). A worker builds the
//! FUSE `Reader`/`Writer` from the chain, calls the server, then returns the chain
//! (`add_used`) and notifies the guest when EVENT_IDX says so. After a drain the queue thread
//! polls the ring before it sleeps, with guest notifications off, for an adaptive window of
//! at most `--poll-us` (`crate::poll`). In builds against libcephfs 20, READ and WRITE of
//! O_DIRECT handles with other requests in flight are sent from the queue thread without a
//! thread waiting for them and answered by a completion thread (`nonblocking`,
//! `--nonblocking-io`).
//!
//! This layer knows nothing of Ceph: it is generic over the filesystem.

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, RwLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fuse_backend_rs::api::filesystem::FileSystem;
use tracing::{debug, error, warn};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::QueueT;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard,
    GuestMemoryMmap,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::metrics;
use crate::migration::{DeviceState, MigrationError, MAX_STATE_LEN};
use crate::poll::{spin_until, AdaptivePoll, Look, LOOKS_PER_YIELD};

mod chain;
mod cost;
#[cfg(libcephfs_nonblocking)]
mod nonblocking;
mod pool;
mod rescue;
mod ring;
use crate::server::{
    mark_queue_thread, ExtraOps, FuseServer, FUSE_COPY_FILE_RANGE, FUSE_SETLKW, FUSE_SYNCFS,
};
pub use chain::ChainError;
use chain::Request;
use cost::ServeCost;
use pool::{PoolLimits, WorkerPool};
use rescue::InlineWatch;

/// Longest mount tag the virtio-fs config space can carry (`struct virtio_fs_config.tag`).
pub const MAX_TAG_LEN: usize = 36;
/// Most request queues we offer (one vhost-user worker thread per queue, 64-bit queue masks).
pub const MAX_REQUEST_QUEUES: u16 = 63;

/// The dirty-page bitmap of guest memory: every write into it is logged while the frontend
/// migrates the guest (VHOST_USER_SET_LOG_BASE), and a no-op otherwise.
pub type GuestBitmap = vhost_user_backend::bitmap::BitmapMmapRegion;
/// Guest memory as vhost-user-backend hands it to us.
pub type GuestMem = GuestMemoryAtomic<GuestMemoryMmap<GuestBitmap>>;
/// One virtqueue's state, shared between the queue thread and workers (`ring`: it knows when
/// the frontend stops it).
pub type Vring = ring::FsVring;
type MemGuard = GuestMemoryLoadGuard<GuestMemoryMmap<GuestBitmap>>;

/// Index of the hiprio queue.
pub const HIPRIO_QUEUE: usize = 0;
/// Largest queue size we accept (what virtiofsd offers).
pub const QUEUE_SIZE: usize = 1024;
/// With `--thread-pool-size 0`, the most threads serving lock waits (SETLKW) at once.
const WAITS_POOL_MAX: usize = 16;
/// Size of `struct virtio_fs_config`: tag[36] + le32 num_request_queues.
pub const VIRTIO_FS_CONFIG_LEN: usize = MAX_TAG_LEN + 4;

/// Settings of the vhost-user device, taken from `Config`.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// Mount tag for the config space; `None` = no CONFIG protocol feature.
    pub tag: Option<String>,
    /// Request queues (1..=63); the hiprio queue comes on top.
    pub request_queues: u16,
    /// Most FUSE worker threads (started on demand); 0 = serve in the queue thread.
    pub thread_pool_size: usize,
    /// The most a request queue thread polls the avail ring after serving, before it
    /// re-enables guest notifications and sleeps; the window adapts below it (`crate::poll`).
    /// Zero = sleep at once.
    pub poll: Duration,
    /// Serve READ and WRITE of O_DIRECT handles without a thread waiting for each
    /// (`--nonblocking-io`); only builds against libcephfs 20 and later have that path, the
    /// others serve everything the blocking way whatever this says.
    pub nonblocking: bool,
}

/// Why the backend could not be created.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("--queues {0} is out of range (1 to 63)")]
    BadQueues(u16),
    #[error("Cannot start the thread that answers async READ and WRITE requests")]
    CompletionThread(#[source] io::Error),
}

/// Counts requests in flight so shutdown can wait for them. Entering and leaving are one atomic
/// operation each; the lock is taken only when the count drops to zero while someone waits.
#[derive(Debug, Default)]
struct InFlight {
    count: AtomicUsize,
    lock: Mutex<()>,
    idle: Condvar,
}

/// Decrements the in-flight count when dropped (also on unwind).
struct InFlightGuard(Arc<InFlight>);

impl InFlight {
    fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(self.clone())
    }

    /// Whether another request is in flight besides the caller's own.
    #[cfg(libcephfs_nonblocking)]
    fn others(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 1
    }

    /// Wait until nothing is in flight, at most `limit`; false if requests are still running.
    fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        while self.count.load(Ordering::Acquire) > 0 {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            g = self
                .idle
                .wait_timeout(g, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Taking the lock orders this wake-up after a waiter's check of the count.
            let _g = self.0.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.0.idle.notify_all();
        }
    }
}

struct Inner<F: FileSystem + Send + Sync> {
    server: Arc<FuseServer<F>>,
    mem: RwLock<Option<GuestMem>>,
    event_idx: AtomicBool,
    /// No request is taken off the queues: the daemon stops, or someone paused them. Derived
    /// from `gate` under its lock; read alone on the hot path.
    closed: AtomicBool,
    /// Who keeps the queues closed: pauses not yet reopened (a handover, a session recovery:
    /// each reopens only its own) and the final stop, which nothing reopens.
    gate: Mutex<Gate>,
    in_flight: Arc<InFlight>,
    pool: Option<WorkerPool>,
    /// Threads for requests that may wait for another request (SETLKW) when there is no
    /// worker pool: those never run on a queue thread.
    waits_pool: Option<WorkerPool>,
    /// What each opcode has been costing: where the next request of a batch runs.
    cost: Arc<ServeCost>,
    /// Which queue threads serve a request themselves, and since when (see `rescue`).
    watch: InlineWatch,
    config_space: Option<[u8; VIRTIO_FS_CONFIG_LEN]>,
    request_queues: u16,
    /// Each queue's polling window and when its thread last went to sleep.
    polls: Vec<Mutex<QueuePoll>>,
    /// Migration: who saves and loads the device state (None: DEVICE_STATE not offered).
    device_state: OnceLock<Arc<dyn DeviceState>>,
    /// The state transfer under way (SET_DEVICE_STATE_FD), joined by CHECK_DEVICE_STATE.
    transfer: Mutex<Option<JoinHandle<Result<(), MigrationError>>>>,
    /// The frontend logs dirty pages (it acked VHOST_F_LOG_ALL): a migration is under way,
    /// and requests are served with their vring locked (see `drain_queue_locked`).
    logging: AtomicBool,
    /// Each queue's vring as its first kick of this connection brought it: what `resume`
    /// drains after a pause (requests that came meanwhile may have had their kick already).
    vrings: Vec<Mutex<Option<Vring>>>,
    /// The async READ/WRITE path (`nonblocking`), when on.
    #[cfg(libcephfs_nonblocking)]
    aio: Option<nonblocking::Async>,
}

/// See [`Inner::gate`].
#[derive(Debug, Default)]
struct Gate {
    pauses: usize,
    stopped: bool,
}

/// Polling state of one queue (only its own thread takes the lock).
#[derive(Debug)]
struct QueuePoll {
    window: AdaptivePoll,
    /// When the last spin that ended in a sleep started.
    slept_at: Option<Instant>,
}

/// The virtio-fs vhost-user backend. Cheap to clone (shared state).
pub struct VhostUserFsBackend<F: FileSystem + Send + Sync> {
    inner: Arc<Inner<F>>,
}

impl<F: FileSystem + Send + Sync> Clone for VhostUserFsBackend<F> {
    fn clone(&self) -> Self {
        VhostUserFsBackend {
            inner: self.inner.clone(),
        }
    }
}

impl<F: FileSystem + Send + Sync> std::fmt::Debug for VhostUserFsBackend<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostUserFsBackend")
            .field("request_queues", &self.inner.request_queues)
            .finish_non_exhaustive()
    }
}

/// How long a save waits for requests of the stopped device that are still being answered.
const SAVE_DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// Source side: write the state to `file` and close it (the frontend reads until EOF).
fn save_device_state(
    state: &dyn DeviceState,
    in_flight: &InFlight,
    mut file: File,
) -> Result<(), MigrationError> {
    let started = Instant::now();
    if !in_flight.wait_idle(SAVE_DRAIN_LIMIT) {
        return Err(MigrationError::Busy);
    }
    let bytes = state.save_state()?;
    file.write_all(&bytes)?;
    drop(file);
    tracing::info!(
        bytes = bytes.len(),
        ms = started.elapsed().as_millis(),
        "migration: device state sent"
    );
    Ok(())
}

/// Destination side: read the state until EOF, then resolve it.
fn load_device_state(state: &dyn DeviceState, file: File) -> Result<(), MigrationError> {
    let started = Instant::now();
    let mut bytes = Vec::new();
    file.take(MAX_STATE_LEN + 1).read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > MAX_STATE_LEN {
        return Err(crate::migration::FormatError::Corrupt(
            "longer than the most a state may take",
        )
        .into());
    }
    let report = state.load_state(&bytes)?;
    tracing::info!(
        bytes = bytes.len(),
        ms = started.elapsed().as_millis(),
        %report,
        "migration: device state loaded"
    );
    Ok(())
}

/// Build `struct virtio_fs_config` for a tag.
fn config_space(tag: &str, request_queues: u16) -> [u8; VIRTIO_FS_CONFIG_LEN] {
    let mut space = [0u8; VIRTIO_FS_CONFIG_LEN];
    let bytes = tag.as_bytes();
    let n = bytes.len().min(MAX_TAG_LEN);
    if let (Some(dst), Some(src)) = (space.get_mut(..n), bytes.get(..n)) {
        dst.copy_from_slice(src);
    }
    if let Some(dst) = space.get_mut(MAX_TAG_LEN..) {
        dst.copy_from_slice(&u32::from(request_queues).to_le_bytes());
    }
    space
}

impl<F> VhostUserFsBackend<F>
where
    F: FileSystem<Inode = u64, Handle = u64> + ExtraOps + Send + Sync + 'static,
{
    pub fn new(fs: Arc<F>, options: &BackendOptions) -> Result<Self, BackendError> {
        let q = options.request_queues;
        if q == 0 || q > MAX_REQUEST_QUEUES {
            return Err(BackendError::BadQueues(q));
        }
        let pool = match options.thread_pool_size {
            0 => None,
            n => Some(WorkerPool::new(PoolLimits::for_max(n))),
        };
        let waits_pool = pool
            .is_none()
            .then(|| WorkerPool::new(PoolLimits::for_max(WAITS_POOL_MAX)));
        let backend = VhostUserFsBackend {
            inner: Arc::new(Inner {
                server: Arc::new(FuseServer::new(fs)),
                mem: RwLock::new(None),
                event_idx: AtomicBool::new(false),
                closed: AtomicBool::new(false),
                gate: Mutex::new(Gate::default()),
                in_flight: Arc::new(InFlight::default()),
                pool,
                waits_pool,
                cost: Arc::default(),
                watch: InlineWatch::new(usize::from(q) + 1),
                config_space: options.tag.as_deref().map(|t| config_space(t, q)),
                request_queues: q,
                polls: (0..=usize::from(q))
                    .map(|i| {
                        let max = if i == HIPRIO_QUEUE {
                            Duration::ZERO
                        } else {
                            options.poll
                        };
                        Mutex::new(QueuePoll {
                            window: AdaptivePoll::new(max),
                            slept_at: None,
                        })
                    })
                    .collect(),
                device_state: OnceLock::new(),
                transfer: Mutex::new(None),
                logging: AtomicBool::new(false),
                vrings: (0..=usize::from(q)).map(|_| Mutex::new(None)).collect(),
                #[cfg(libcephfs_nonblocking)]
                aio: options.nonblocking.then(nonblocking::Async::default),
            }),
        };
        // Without it nothing would answer an async request.
        #[cfg(libcephfs_nonblocking)]
        if backend.inner.aio.is_some() {
            let weak = Arc::downgrade(&backend.inner);
            std::thread::Builder::new()
                .name("fuse-complete".to_owned())
                .spawn(move || nonblocking::completion_loop(&weak))
                .map_err(BackendError::CompletionThread)?;
        }
        // Without a pool there is nobody to hand the requests behind a slow one to: every
        // request but SETLKW is served inline and in order, as the operator asked.
        if backend.inner.pool.is_some() {
            let weak = Arc::downgrade(&backend.inner);
            match std::thread::Builder::new()
                .name("fuse-rescue".to_owned())
                .spawn(move || rescue_loop(&weak))
            {
                Ok(t) => backend.inner.watch.set_rescuer(t.thread().clone()),
                Err(e) => warn!(
                    error = %e,
                    "Cannot start the thread that takes requests off a queue whose thread is \
                     held by a slow request: such a request holds up the requests behind it"
                ),
            }
        }
        Ok(backend)
    }

    /// Offer live migration (VHOST_USER_PROTOCOL_F_DEVICE_STATE): `state` saves and loads the
    /// guest's session. Call before the first frontend connects.
    pub fn enable_migration(&self, state: Arc<dyn DeviceState>) {
        if self.inner.device_state.set(state).is_err() {
            warn!("migration was already enabled on this backend");
        }
    }

    /// SET_DEVICE_STATE_FD: move the state through `file` on a thread of its own (the
    /// vhost-user request must not wait for the transfer); CHECK_DEVICE_STATE joins it.
    fn start_transfer(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<()> {
        let Some(state) = self.inner.device_state.get().cloned() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "migration is not enabled",
            ));
        };
        if phase != VhostTransferStatePhase::STOPPED {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "device state can only be moved while the device is stopped",
            ));
        }
        let mut slot = self
            .inner
            .transfer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A transfer nobody checked: its result no longer matters.
        if let Some(old) = slot.take() {
            let _ = old.join();
        }
        let in_flight = self.inner.in_flight.clone();
        let job = std::thread::Builder::new().name("device-state".to_owned());
        let handle = match direction {
            VhostTransferStateDirection::SAVE => {
                job.spawn(move || save_device_state(&*state, &in_flight, file))?
            }
            VhostTransferStateDirection::LOAD => {
                job.spawn(move || load_device_state(&*state, file))?
            }
        };
        *slot = Some(handle);
        Ok(())
    }

    /// CHECK_DEVICE_STATE: the result of the last transfer.
    fn finish_transfer(&self) -> io::Result<()> {
        let job = self
            .inner
            .transfer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(job) = job else {
            return Err(io::Error::other("no device state transfer was started"));
        };
        let result = job
            .join()
            .map_err(|_| io::Error::other("the device state transfer thread panicked"))?;
        result.map_err(|e| {
            error!(error = %crate::report(&e), "migration: device state transfer failed; the frontend fails the migration");
            io::Error::other(e)
        })
    }

    /// Forget the previous frontend's memory before a new connection.
    pub fn reset_connection(&self) {
        *self
            .inner
            .mem
            .write()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.inner.event_idx.store(false, Ordering::Release);
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
    fn update_gate(&self, change: impl FnOnce(&mut Gate)) -> bool {
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

    /// Pop every available chain of `vring` and dispatch it.
    ///
    /// With a worker pool, requests that move data or wait for the OSDs (READ, WRITE, FSYNC,
    /// …) always go to the pool: served here, one of them would keep the queue unread for a
    /// whole OSD round trip. SETLKW may wait for another request of the same queue to
    /// unlock, so it gets a worker of its own, on every queue and also without a pool. Of the others, those whose kind has been
    /// answering from libcephfs's caches are served right here, in order (see `cost`): on a
    /// worker they would only add a hand-off before taking libcephfs's client lock. The rest
    /// go to the pool, except the last of the batch, served right here too: a lone request (a
    /// path walk, a create) then costs no hand-off and no wake-up, while a burst of requests
    /// that wait for the MDS still spreads over the workers.
    fn drain_queue(&self, vring: &Vring, mem: &GuestMem, queue: usize) {
        if self.inner.logging.load(Ordering::Acquire) {
            return self.drain_queue_locked(vring, mem, queue);
        }
        let mut last: Option<Pending> = None;
        loop {
            if self.inner.closed.load(Ordering::Acquire) {
                break;
            }
            // The memory map as it is now, for each request: a frontend adding memory while
            // the guest runs changes it between two requests.
            let Some(pending) = self.pop(vring, mem.memory(), queue) else {
                break;
            };
            // Sending may wait (caps from the MDS, a privilege kill, the size under the caps):
            // watched as a request served inline, so the rescuer hands what queues behind it
            // to the workers. A request alone (none other in flight, none behind it in the
            // ring) goes the blocking way (see `nonblocking`: at depth 1 the async path does
            // not pay).
            #[cfg(libcephfs_nonblocking)]
            let Some(pending) = (match &self.inner.aio {
                Some(aio) if self.inner.in_flight.others() || more_avail(vring, mem) => {
                    let _inline = self.inner.watch.enter(queue);
                    nonblocking::try_start(aio, &self.inner.server, pending, vring, queue)
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
                    Dispatch::Waits | Dispatch::Blocks => {
                        self.submit(pool, vring, pending, queue, false)
                    }
                    Dispatch::Quick if self.inner.cost.cheap(pending.opcode()) => {
                        // What waited for the batch's end goes first: it will take longer.
                        if let Some(prev) = last.take() {
                            self.submit(pool, vring, prev, queue, false);
                        }
                        self.serve(pending, vring, queue);
                    }
                    Dispatch::Quick => {
                        if let Some(prev) = last.replace(pending) {
                            self.submit(pool, vring, prev, queue, false);
                        }
                    }
                },
                // No choice to make, so nothing to time.
                _ => pending.serve(&self.inner.server, vring, queue, None),
            }
        }
        if let Some(p) = last {
            self.serve(p, vring, queue);
        }
    }

    /// [`Self::drain_queue`] during a migration: each request is served from pop to used with
    /// the vring locked, on this thread. QEMU stops the rings (GET_VRING_BASE, which takes the
    /// same lock) before it sends the last dirty pages and then the device state: a request
    /// answered after that would reach neither the guest's memory on the destination nor its
    /// used index, and the guest would wait for it forever. Holding the lock makes the stop wait
    /// for the request in hand (the guest is paused by then, so no more come). SETLKW, which may
    /// wait for the guest's own unlock, still goes to a worker.
    fn drain_queue_locked(&self, vring: &Vring, mem: &GuestMem, queue: usize) {
        let guard = mem.memory();
        loop {
            if self.inner.closed.load(Ordering::Acquire) {
                break;
            }
            let mut state = vring.get_mut();
            let Some((request, generation)) = pop_request(vring, &mut state, &guard) else {
                break;
            };
            let pending = Pending {
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
                    pending.serve(&self.inner.server, vring, queue, None);
                }
                continue;
            }
            chain::warm();
            let head = pending.request.head;
            let served = chain::serve(
                &self.inner.server,
                &pending.guard,
                &pending.request,
                chain::Live::Locked,
                queue,
                Instant::now(),
            );
            let used = chain::used_len(served.used, queue, head);
            if let Err(e) = state.add_used(head, used) {
                warn!(queue, head, error = %e, "Cannot return a descriptor chain to the guest");
                continue;
            }
            if !matches!(state.needs_notification(), Ok(false)) {
                if let Err(e) = state.signal_used_queue() {
                    warn!(queue, error = %e, "Cannot notify the guest");
                }
            }
        }
    }

    /// Pop the next available chain and read its descriptors and in-header (`chain::walk`).
    fn pop(&self, vring: &Vring, guard: MemGuard, queue: usize) -> Option<Pending> {
        let (request, generation) = {
            let mut state = vring.get_mut();
            let (head, generation, table, size) = {
                let generation = vring.running()?;
                let q = state.get_queue_mut();
                let head = q.pop_descriptor_chain(&*guard)?.head_index();
                (head, generation, GuestAddress(q.desc_table()), q.size())
            };
            drop(state);
            (chain::walk(&guard, table, size, head), generation)
        };
        Some(Pending {
            in_flight: self.inner.in_flight.enter(),
            depth: metrics::global().queue_enter(queue),
            generation,
            request,
            guard,
        })
    }

    /// Serve a `Dispatch::Quick` request here, timing it for `cost`; should it be slow, the
    /// rescuer hands the requests behind it to workers.
    fn serve(&self, p: Pending, vring: &Vring, queue: usize) {
        let _inline = self.inner.watch.enter(queue);
        p.serve(&self.inner.server, vring, queue, Some(&self.inner.cost));
    }

    /// The queue thread of `queue` is held by a slow request: hand what waits in its ring to
    /// the workers (see `rescue`). Nothing during a migration's logging, when requests are
    /// served with their vring held, nor while the queues are closed.
    fn rescue(&self, queue: usize) {
        let Some(pool) = &self.inner.pool else {
            return;
        };
        if self.inner.logging.load(Ordering::Acquire) {
            return;
        }
        let vring = self
            .inner
            .vrings
            .get(queue)
            .and_then(|v| v.lock().unwrap_or_else(PoisonError::into_inner).clone());
        let mem = self
            .inner
            .mem
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let (Some(vring), Some(mem)) = (vring, mem) else {
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

    fn submit(&self, pool: &WorkerPool, vring: &Vring, p: Pending, queue: usize, waits: bool) {
        let server = self.inner.server.clone();
        // Only Quick kinds consult their cost; the others go to a worker whatever it is.
        let cost = (Dispatch::of(p.opcode()) == Dispatch::Quick).then(|| self.inner.cost.clone());
        let vring = vring.clone();
        pool.submit(
            Box::new(move || p.serve(&server, &vring, queue, cost.as_deref())),
            waits,
        );
    }

    fn process_queue(&self, vring: &Vring, queue: usize) -> io::Result<()> {
        let mem = self
            .inner
            .mem
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(mem) = mem else {
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
        loop {
            vring.disable_notification().map_err(queue_error)?;
            self.drain_queue(vring, &mem, queue);
            if self.inner.closed.load(Ordering::Acquire) {
                // Closed (a stop, or a handover under way): what is left stays in the ring
                // with notifications off; `reopen` drains it if serving goes on.
                return Ok(());
            }
            let spin_start = Instant::now();
            let window = state.window.window();
            if !window.is_zero() && self.poll_avail(vring, &mem, window) {
                continue;
            }
            if !vring.enable_notification().map_err(queue_error)? {
                state.slept_at = Some(spin_start);
                return Ok(());
            }
            // A request came just after the spin gave up: a slightly longer one would have
            // caught it.
            state.window.slept(spin_start.elapsed());
        }
    }

    /// The current polling window of `queue`.
    #[cfg(test)]
    fn poll_window(&self, queue: usize) -> Duration {
        self.inner.polls.get(queue).map_or(Duration::ZERO, |p| {
            p.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .window
                .window()
        })
    }

    /// Start `queue`'s polling window at `window`, as after a run of short waits.
    #[cfg(test)]
    fn set_poll_window(&self, queue: usize, window: Duration) {
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
    fn poll_avail(&self, vring: &Vring, mem: &GuestMem, window: Duration) -> bool {
        let (ring, next) = {
            let state = vring.get_ref();
            let q = state.get_queue();
            (q.avail_ring(), q.next_avail())
        };
        let Some(idx_at) = GuestAddress(ring).checked_add(2) else {
            return false;
        };
        let guard = mem.memory();
        spin_until(window, LOOKS_PER_YIELD, || {
            if self.inner.closed.load(Ordering::Relaxed) {
                return Look::GiveUp;
            }
            match guard.load::<u16>(idx_at, Ordering::Acquire) {
                Ok(idx) if u16::from_le(idx) != next => Look::Ready,
                Ok(_) => Look::NotYet,
                Err(_) => Look::GiveUp,
            }
        })
    }
}

/// Whether the guest has made requests that are not popped yet (read lock-free, as
/// `poll_avail` does).
#[cfg(libcephfs_nonblocking)]
fn more_avail(vring: &Vring, mem: &GuestMem) -> bool {
    let (ring, next) = {
        let state = vring.get_ref();
        let q = state.get_queue();
        (q.avail_ring(), q.next_avail())
    };
    let Some(idx_at) = GuestAddress(ring).checked_add(2) else {
        return false;
    };
    mem.memory()
        .load::<u16>(idx_at, Ordering::Acquire)
        .is_ok_and(|idx| u16::from_le(idx) != next)
}

/// The rescuer thread (see `rescue`): while requests are served inline, look every
/// `rescue::TICK` for a queue whose inline request has run past `rescue::LIMIT`; sleep while
/// none is. Ends once its backend is gone.
fn rescue_loop<F>(weak: &Weak<Inner<F>>)
where
    F: FileSystem<Inode = u64, Handle = u64> + ExtraOps + Send + Sync + 'static,
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
        for queue in backend.inner.watch.overdue(rescue::LIMIT) {
            backend.rescue(queue);
        }
        drop(backend);
        std::thread::sleep(rescue::TICK);
    }
}

/// Where a request is served when there is a worker pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dispatch {
    /// Often answered from libcephfs's caches: served inline when its kind has been cheap
    /// lately, or when it is the last of a batch.
    Quick,
    /// Moves data or waits for the OSDs: always a worker.
    Blocks,
    /// May wait for another request (a lock held by the same guest): a worker of its own.
    Waits,
}

impl Dispatch {
    fn of(opcode: Option<u32>) -> Self {
        use crate::server::wire::{
            FUSE_FALLOCATE, FUSE_FSYNC, FUSE_FSYNCDIR, FUSE_READ, FUSE_WRITE,
        };
        match opcode {
            Some(FUSE_SETLKW) => Dispatch::Waits,
            Some(
                FUSE_READ | FUSE_WRITE | FUSE_FSYNC | FUSE_FSYNCDIR | FUSE_FALLOCATE
                | FUSE_COPY_FILE_RANGE | FUSE_SYNCFS,
            ) => Dispatch::Blocks,
            _ => Dispatch::Quick,
        }
    }
}

/// A popped chain and what accounts for it until it is answered.
struct Pending {
    in_flight: InFlightGuard,
    depth: metrics::QueueDepthGuard,
    /// The generation of its ring it was taken in (`ring`): it touches guest memory and is
    /// answered only while that generation runs.
    generation: u64,
    /// The chain's descriptors and in-header, read once when it was popped: where the request
    /// runs and what the server does with it are both decided from this copy.
    request: Request,
    guard: MemGuard,
}

impl Pending {
    fn opcode(&self) -> Option<u32> {
        self.request.opcode()
    }

    /// Serve the request and give it back; with `cost`, account how long that took.
    fn serve<F>(self, server: &FuseServer<F>, vring: &Vring, queue: usize, cost: Option<&ServeCost>)
    where
        F: FileSystem<Inode = u64, Handle = u64> + ExtraOps + Send + Sync,
    {
        chain::warm();
        let start = Instant::now();
        let took = chain::complete(
            server,
            vring,
            &self.guard,
            &self.request,
            self.generation,
            queue,
            start,
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
fn pop_request(
    vring: &Vring,
    state: &mut vhost_user_backend::VringState<GuestMem>,
    mem: &MemGuard,
) -> Option<(Request, u64)> {
    let mem: &GuestMemoryMmap<GuestBitmap> = mem;
    // Stable while the ring's lock is held (`ring`): a stopping ring gives nothing more.
    let generation = vring.running()?;
    let queue = state.get_queue_mut();
    let head = queue.pop_descriptor_chain(mem)?.head_index();
    let (table, size) = (GuestAddress(queue.desc_table()), queue.size());
    Some((chain::walk(mem, table, size, head), generation))
}

fn queue_error(e: virtio_queue::Error) -> io::Error {
    io::Error::other(format!("virtqueue access failed: {e}"))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

impl<F> VhostUserBackend for VhostUserFsBackend<F>
where
    F: FileSystem<Inode = u64, Handle = u64> + ExtraOps + Send + Sync + 'static,
{
    type Bitmap = GuestBitmap;
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        1 + usize::from(self.inner.request_queues)
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | if self.inner.device_state.get().is_some() {
                // Migration: the guest memory we write is logged (see `GuestBitmap`).
                VhostUserVirtioFeatures::LOG_ALL.bits()
            } else {
                0
            }
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let mut f = VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK;
        if self.inner.config_space.is_some() {
            f |= VhostUserProtocolFeatures::CONFIG;
        }
        if self.inner.device_state.get().is_some() {
            f |= VhostUserProtocolFeatures::DEVICE_STATE | VhostUserProtocolFeatures::LOG_SHMFD;
        }
        f
    }

    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<Option<File>> {
        self.start_transfer(direction, phase, file)?;
        Ok(None)
    }

    fn check_device_state(&self) -> io::Result<()> {
        self.finish_transfer()
    }

    fn acked_features(&self, features: u64) {
        let logging = features & VhostUserVirtioFeatures::LOG_ALL.bits() != 0;
        if self.inner.logging.swap(logging, Ordering::AcqRel) != logging {
            debug!(logging, "dirty page logging changed");
        }
    }

    fn set_event_idx(&self, enabled: bool) {
        self.inner.event_idx.store(enabled, Ordering::Release);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let Some(space) = &self.inner.config_space else {
            return Vec::new();
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = start.saturating_add(usize::try_from(size).unwrap_or(usize::MAX));
        match space.get(start..end) {
            Some(bytes) => bytes.to_vec(),
            None => {
                warn!(
                    offset,
                    size, "Frontend read outside the virtio-fs config space"
                );
                Vec::new()
            }
        }
    }

    fn update_memory(&self, mem: GuestMem) -> io::Result<()> {
        *self
            .inner
            .mem
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(mem);
        Ok(())
    }

    /// One vhost-user epoll thread per queue: thread i serves queue i.
    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.num_queues()).map(|i| 1u64 << i).collect()
    }

    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK) {
            Ok(pair) => Some(pair),
            Err(e) => {
                error!(thread_index, error = %e, "Cannot create a queue thread exit event");
                None
            }
        }
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            warn!(
                device_event,
                ?evset,
                "Unexpected event set on a queue; ignoring"
            );
            return Ok(());
        }
        // With one queue per thread, `device_event` indexes this thread's single vring and the
        // thread index is the queue index.
        let Some(vring) = vrings.get(usize::from(device_event)) else {
            warn!(device_event, "Event for an unknown queue; ignoring");
            return Ok(());
        };
        mark_queue_thread();
        debug!(queue = thread_id, "Queue kicked");
        if let Some(slot) = self.inner.vrings.get(thread_id) {
            let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.is_none() {
                *slot = Some(vring.clone());
            }
        }
        // An error here means the guest's ring addresses are unusable. Returning it would end
        // this queue's thread for good; log it and retry on the next kick instead.
        if let Err(e) = self.process_queue(vring, thread_id) {
            warn!(queue = thread_id, error = %e, "Cannot process queue");
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests;

impl<F> crate::handover::Pausable for VhostUserFsBackend<F>
where
    F: FileSystem<Inode = u64, Handle = u64> + ExtraOps + Send + Sync + 'static,
{
    fn pause(&self, limit: Duration) -> bool {
        self.close_and_drain(limit)
    }
    fn resume(&self) {
        self.reopen();
    }
}
