//! vhost-user glue for virtio-fs, generic over the filesystem (it knows nothing of Ceph). One
//! concern a file:
//!
//! - this file: the backend's types, options and state, and its construction;
//! - `device`: the vhost-user device (features, protocol features, config space, guest memory,
//!   the queue threads' events);
//! - `queues`: each queue's thread: popping, where a request runs (inline, a worker, the async
//!   path), polling the ring before sleeping, the rescuer of a queue held by a slow request;
//! - `chain`: one request's trip from its descriptor chain to the used ring, the only code that
//!   reads a chain or a request's bytes in guest memory;
//! - `ring`: the virtqueue type that knows when the frontend stops a ring;
//! - `session`: requests in flight, pauses, the stop, the end of a frontend's session;
//! - `transfer`: the migration device state (SET_DEVICE_STATE_FD, CHECK_DEVICE_STATE);
//! - `pool`, `cost`, `rescue`, `nonblocking`: the worker pool, what each opcode has been
//!   costing, the watch on requests served inline, the async READ/WRITE path;
//! - `hiprio`: who turns the hiprio queue's notifications back on while request-queue threads
//!   serve it.
//!
//! Queue 0 is the hiprio queue (FORGET, INTERRUPT), queues 1..=N carry requests. Each queue has
//! its own vhost-user epoll thread (`queues_per_thread`). Request chains are popped there and
//! walked once (`chain::walk`): every decision about a request is made from that copy.
//! Requests that wait for the OSDs or the MDS are handed to an elastic worker pool
//! (`--thread-pool-size` = most workers; 0 = serve everything inline but lock waits, which
//! never run on a queue thread), except the last of a batch; the queue thread serves that one,
//! and the requests libcephfs has lately been answering from its caches (`cost`), itself. So a
//! burst of waiting requests spreads over the workers, and a lone request or a cached one pays
//! no hand-off. Should one served inline turn out slow (the MDS stalled), the rescuer thread
//! hands the requests queued behind it to the workers after a few milliseconds (`rescue`).
//! After a drain the queue thread polls the ring before it sleeps, with guest notifications
//! off, for an adaptive window of at most `--poll-us` (`crate::poll`), and serves the hiprio
//! ring's FORGETs meanwhile, which then need no kick (`hiprio`). In builds against
//! libcephfs 20, READ and WRITE of O_DIRECT handles with other requests in flight are sent from
//! the queue thread without a thread waiting for them and answered by a completion thread
//! (`nonblocking`, `--nonblocking-io`).

use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use fuse_backend_rs::api::filesystem::FileSystem;
use tracing::warn;
use vm_memory::{GuestMemoryAtomic, GuestMemoryLoadGuard, GuestMemoryMmap};
use vmm_sys_util::event::{EventConsumer, EventNotifier};

use crate::migration::{DeviceState, MigrationError};
use crate::poll::AdaptivePoll;
use crate::server::{FuseServer, Servable};

mod chain;
mod cost;
mod deadline;
mod device;
mod hiprio;
#[cfg(libcephfs_nonblocking)]
mod nonblocking;
mod pool;
mod queues;
mod rescue;
mod ring;
mod session;
mod split;
mod transfer;

pub use chain::ChainError;
use cost::ServeCost;
pub use deadline::set_request_deadline;
use pool::{PoolLimits, WorkerPool};
use queues::QueuePoll;
use rescue::InlineWatch;
use session::{Gate, InFlight};

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

struct Inner<F: FileSystem + Send + Sync> {
    server: Arc<FuseServer<F>>,
    mem: RwLock<Option<GuestMem>>,
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
    /// The request-queue threads that also watch the hiprio ring (see `hiprio`).
    hiprio: hiprio::Watchers,
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
    /// Each queue thread's exit event, made once per thread index and given to the handler of
    /// every connection (see `exit_event`).
    exit_events: Mutex<Vec<Option<(EventConsumer, EventNotifier)>>>,
    /// The async READ/WRITE path (`nonblocking`), when on.
    #[cfg(libcephfs_nonblocking)]
    aio: Option<nonblocking::Async>,
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

impl<F> VhostUserFsBackend<F>
where
    F: Servable + 'static,
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
                closed: AtomicBool::new(false),
                gate: Mutex::new(Gate::default()),
                in_flight: Arc::new(InFlight::default()),
                pool,
                waits_pool,
                cost: Arc::default(),
                watch: InlineWatch::new(usize::from(q) + 1),
                hiprio: hiprio::Watchers::default(),
                config_space: options.tag.as_deref().map(|t| device::config_space(t, q)),
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
                exit_events: Mutex::new(Vec::new()),
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
                .spawn(move || queues::rescue_loop(&weak))
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

#[cfg(test)]
pub(crate) mod tests;
