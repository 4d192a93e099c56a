//! The FUSE worker pool: elastic, and handing each job to the worker that went idle last.
//!
//! Up to `core` workers are started as soon as a job finds no idle worker. Past that, up to
//! `max`, a worker is added only when jobs are stuck behind busy workers: a job was taken after
//! waiting longer than `stall`, or a new job arrives while nothing has been taken for that
//! long. So requests that block on the OSDs or the MDS (O_DIRECT writes, fsync) get as many
//! threads as the guest has them in flight, while requests libcephfs serves from its cache
//! stay on a few threads instead of a crowd contending for its client lock. A request that may
//! wait for another request (SETLKW) always gets a worker of its own.
//!
//! Idle workers form a stack: a job goes to the worker that finished last (its stack and the
//! libcephfs data it touched are still warm, and it may not even be asleep yet), so after a
//! burst grew the pool the surplus workers stay asleep and leave after `idle_timeout`, as in
//! QEMU's thread pool, instead of being woken in turn by a round-robin channel. An idle worker
//! spins briefly before it parks, in a window that adapts as the queue threads' does
//! (`crate::poll`): handing a job to a spinning worker costs no wake-up.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use tracing::{error, warn};

use crate::poll::{spin_until, AdaptivePoll, Look, LOOKS_PER_CLOCK_READ};

/// One unit of work: serving one request.
pub(super) type Job = Box<dyn FnOnce() + Send + 'static>;

/// How long an idle worker waits for a job before it leaves.
pub(super) const WORKER_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// A job that waited this long for a worker means the workers are blocked, not busy.
pub(super) const WORKER_STALL: Duration = Duration::from_millis(1);

/// Sizes and timings of a [`WorkerPool`].
#[derive(Debug, Clone, Copy)]
pub(super) struct PoolLimits {
    pub core: usize,
    pub max: usize,
    pub stall: Duration,
    pub idle_timeout: Duration,
}

impl PoolLimits {
    /// `--thread-pool-size N`: at most N workers, of which twice the CPU count (at least 4)
    /// start without waiting.
    pub fn for_max(max: usize) -> Self {
        let cpus = std::thread::available_parallelism().map_or(2, usize::from);
        PoolLimits {
            core: (2 * cpus).max(4).min(max),
            max,
            stall: WORKER_STALL,
            idle_timeout: WORKER_IDLE_TIMEOUT,
        }
    }
}

/// What a worker is handed while it sleeps.
enum Handed {
    Run(Job),
    Stop,
}

/// Where an idle worker waits until it is handed something.
struct Slot {
    handed: Mutex<Option<Handed>>,
    /// Set with `handed`: what a spinning worker watches without taking the lock.
    ready: AtomicBool,
    thread: Thread,
}

struct State {
    /// Jobs no idle worker was there to take, oldest first.
    queue: VecDeque<(Job, Instant)>,
    /// Idle workers, the one that went idle last on top.
    idle: Vec<Arc<Slot>>,
    /// Workers started and not yet gone.
    live: usize,
    /// When a worker last took a queued job (or the queue last became non-empty).
    last_take: Instant,
    stopped: bool,
    threads: Vec<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    limits: PoolLimits,
}

/// A pool of FUSE worker threads (see the module documentation).
pub(super) struct WorkerPool {
    shared: Arc<Shared>,
}

impl WorkerPool {
    pub fn new(limits: PoolLimits) -> Self {
        WorkerPool {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    idle: Vec::new(),
                    live: 0,
                    last_take: Instant::now(),
                    stopped: false,
                    threads: Vec::new(),
                }),
                limits,
            }),
        }
    }

    /// Queue a job; `waits_for_others` marks one that may block until another request runs
    /// (SETLKW). If the pool is shut down, or no worker exists and none can be started, the
    /// job runs here instead (never lose a chain).
    pub fn submit(&self, job: Job, waits_for_others: bool) {
        let now = Instant::now();
        let mut st = self.shared.lock();
        if st.stopped {
            drop(st);
            job();
            return;
        }
        if let Some(slot) = st.idle.pop() {
            drop(st);
            slot.hand(Handed::Run(job));
            return;
        }
        if st.queue.is_empty() {
            st.last_take = now;
        }
        st.queue.push_back((job, now));
        let limits = &self.shared.limits;
        let stalled = now.saturating_duration_since(st.last_take) > limits.stall;
        let limit = if waits_for_others || stalled {
            limits.max
        } else {
            limits.core
        };
        if st.live < limit {
            Shared::start_worker(&self.shared, &mut st);
        }
        if st.live == 0 {
            // No worker could be started and none runs: serve the queue right here.
            run_queued(st);
        }
    }

    fn shutdown(&self) {
        let (threads, idle) = {
            let mut st = self.shared.lock();
            st.stopped = true;
            (
                std::mem::take(&mut st.threads),
                std::mem::take(&mut st.idle),
            )
        };
        for slot in idle {
            slot.hand(Handed::Stop);
        }
        for t in threads {
            if t.join().is_err() {
                error!("A FUSE worker thread panicked");
            }
        }
        // Jobs still queued answer their guest requests all the same.
        run_queued(self.shared.lock());
    }

    #[cfg(test)]
    pub fn live(&self) -> usize {
        self.shared.lock().live
    }

    #[cfg(test)]
    pub fn idle(&self) -> usize {
        self.shared.lock().idle.len()
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Slot {
    fn hand(&self, what: Handed) {
        *self.handed.lock().unwrap_or_else(PoisonError::into_inner) = Some(what);
        self.ready.store(true, Ordering::Release);
        // No system call when the worker is still spinning rather than parked.
        self.thread.unpark();
    }

    fn take(&self) -> Option<Handed> {
        if !self.ready.swap(false, Ordering::Acquire) {
            return None;
        }
        self.handed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Spin for at most `window` until something is handed over; true if it was.
    fn spin(&self, window: Duration) -> bool {
        spin_until(window, LOOKS_PER_CLOCK_READ, || {
            if self.ready.load(Ordering::Acquire) {
                Look::Ready
            } else {
                Look::NotYet
            }
        })
    }
}

/// The most an idle worker spins before it parks; the window adapts below it.
const WORKER_SPIN: Duration = Duration::from_micros(50);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Start one worker; it takes the queue's oldest job first. A failure is logged and leaves
    /// the job to the running workers.
    fn start_worker(this: &Arc<Self>, st: &mut State) {
        let shared = this.clone();
        let spawned = std::thread::Builder::new()
            .name("fuse-worker".into())
            .spawn(move || worker_loop(&shared));
        match spawned {
            Ok(handle) => {
                st.live += 1;
                st.threads.retain(|t| !t.is_finished());
                st.threads.push(handle);
            }
            Err(e) => {
                warn!(error = %e, "Cannot start a FUSE worker thread; the request waits for a running one");
            }
        }
    }

    /// The next job for a worker that has just finished one (or started): the queue's oldest,
    /// or, with none, a wait on the idle stack until one is handed over (a short adaptive spin,
    /// then a park). `None`: leave.
    fn next_job(this: &Arc<Self>, slot: &Arc<Slot>, spin: &mut AdaptivePoll) -> Option<Job> {
        {
            let mut st = this.lock();
            if let Some((job, queued_at)) = st.queue.pop_front() {
                let now = Instant::now();
                st.last_take = now;
                // This job waited behind blocked workers, and others still wait: add one.
                if now.saturating_duration_since(queued_at) > this.limits.stall
                    && !st.queue.is_empty()
                    && st.live < this.limits.max
                    && !st.stopped
                {
                    Shared::start_worker(this, &mut st);
                }
                return Some(job);
            }
            if st.stopped {
                st.live -= 1;
                return None;
            }
            st.idle.push(slot.clone());
        }
        let idle_since = Instant::now();
        let window = spin.window();
        let spun = !window.is_zero() && slot.spin(window);
        loop {
            match slot.take() {
                Some(Handed::Run(job)) => {
                    if !spun {
                        spin.slept(idle_since.elapsed());
                    }
                    return Some(job);
                }
                Some(Handed::Stop) => {
                    this.lock().live -= 1;
                    return None;
                }
                None => {}
            }
            let idle = idle_since.elapsed();
            if idle >= this.limits.idle_timeout {
                // Leave, unless a submitter already took us off the stack: then a job is on
                // its way into our slot.
                let mut st = this.lock();
                if let Some(i) = st.idle.iter().position(|s| Arc::ptr_eq(s, slot)) {
                    st.idle.remove(i);
                    st.live -= 1;
                    return None;
                }
                drop(st);
                std::thread::park();
            } else {
                std::thread::park_timeout(this.limits.idle_timeout - idle);
            }
        }
    }
}

/// Run every queued job on the calling thread, after letting go of the pool's lock.
fn run_queued(mut st: MutexGuard<'_, State>) {
    let jobs: Vec<Job> = st.queue.drain(..).map(|(job, _)| job).collect();
    drop(st);
    for job in jobs {
        job();
    }
}

/// Serve one job on a worker. A function of its own, never inlined: the per-request cost
/// benchmark (`ceph-virtiofsd-bench cost`) counts what runs inside it (jobs run by a queue
/// thread are inside its `handle_event`, counted there).
#[inline(never)]
fn run_job(job: Job) {
    job();
}

fn worker_loop(shared: &Arc<Shared>) {
    let slot = Arc::new(Slot {
        handed: Mutex::new(None),
        ready: AtomicBool::new(false),
        thread: std::thread::current(),
    });
    let mut spin = AdaptivePoll::new(WORKER_SPIN);
    while let Some(job) = Shared::next_job(shared, &slot, &mut spin) {
        if catch_unwind(AssertUnwindSafe(|| run_job(job))).is_err() {
            error!("A FUSE request handler panicked; the request is lost, serving the others");
        }
    }
}
