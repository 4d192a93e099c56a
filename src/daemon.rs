//! Process lifecycle: listen on the vhost-user socket (or an inherited fd), hold a pid lock next
//! to the socket, run the vhost-user daemon, end on frontend disconnect (or wait for a new
//! frontend with `--keep-serving`, after ending the old one's FUSE session: the next frontend
//! starts without its nodes and handles), and stop on SIGTERM/SIGINT so `main` can unmount Ceph.
//!
//! Control plane: a small tokio current-thread runtime in its own thread, for signals and the
//! slow-request watchdog (`crate::metrics::watchdog`).
//! Data path: plain threads (vhost-user connection thread, one epoll thread per queue, workers).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use tracing::{error, info, warn};
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::{Error as DaemonLibError, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::config::{Config, Listen};
use crate::handover::HandoverListener;
use crate::metrics::endpoint::{MetricsServer, Scrape};
use crate::metrics::watchdog::Watchdog;
use crate::metrics::FsStats;
use crate::migration::DeviceState;
use crate::server::Servable;
use crate::vhost_user::{BackendError, BackendOptions, VhostUserFsBackend};

/// Why serving stopped with an error. Each message names the failing step.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("Cannot set up the virtio-fs device")]
    Backend(#[source] BackendError),
    #[error(
        "Cannot create or lock pid file {path} (check the socket directory exists and is writable)"
    )]
    PidFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("Another ceph-virtiofsd (pid {pid}) is serving {socket}: stop it or choose another --socket-path")]
    AlreadyRunning { socket: PathBuf, pid: String },
    #[error("Cannot listen on vhost-user socket {path}")]
    Listen {
        path: PathBuf,
        #[source]
        source: VhostUserError,
    },
    #[error(
        "--fd {fd} is not an open socket: pass the number of an inherited listening unix socket"
    )]
    BadFd {
        fd: RawFd,
        #[source]
        source: io::Error,
    },
    #[error("--fd {0} was already taken by an earlier serve() in this process")]
    FdTaken(RawFd),
    #[error("Requests were still blocked in the filesystem {0} s after the stop (a lock wait, or an MDS that does not answer): exiting without unmounting; the MDS ends the session after its timeout, or evict the client")]
    RequestsStuck(u64),
    #[error("Cannot start the metrics endpoint")]
    Metrics(#[source] crate::metrics::endpoint::MetricsError),
    #[error("Cannot drop privileges")]
    Sandbox(#[source] crate::sandbox::SandboxError),
    #[error("Cannot install the SIGTERM/SIGINT handlers")]
    Signals(#[source] io::Error),
    #[error("Cannot start the {0} thread (raise the task limit)")]
    Thread(&'static str, #[source] io::Error),
    #[error("Cannot set up vhost-user state for a new frontend: {0}")]
    CreateDaemon(String),
    #[error("Cannot accept the vhost-user frontend connection: {0}")]
    Accept(String),
    #[error("vhost-user connection with the frontend failed: {0}")]
    Connection(String),
    #[error("The vhost-user connection thread panicked")]
    ConnectionPanicked,
    #[error("Cannot listen on the handover socket {path} (--handover): remove a leftover file there, or stop the daemon that listens there")]
    Handover {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("Cannot give the socket {path} to group {gid} (--socket-group): the daemon must own the socket and be a member of that group (or start as root)")]
    SocketGroup {
        path: PathBuf,
        gid: u32,
        #[source]
        source: io::Error,
    },
    #[error("Cannot start the systemd watchdog thread")]
    Watchdog(#[source] io::Error),
}

enum Event {
    Signal(&'static str),
    Finished(Result<(), DaemonError>),
    /// A successor took the guest's session (`--handover`).
    HandedOver,
}

/// What [`serve`] needs of the filesystem: what the server serves ([`Servable`]), statistics
/// for the metrics, and its session state for migration and handover.
pub trait Exported: Servable + FsStats + DeviceState + 'static {}

impl<F> Exported for F where F: Servable + FsStats + DeviceState + 'static {}

/// Serve `fs` to one frontend (or, with `keep_serving`, to successive frontends).
///
/// Returns `Ok(())` when the frontend disconnected or SIGTERM/SIGINT arrived. On return no FUSE
/// request is running and none will be dispatched; other clones of `fs` may still exist (held by
/// idle vhost-user threads), so tear the filesystem down through `&self`, then exit.
/// With `Listen::Fd`, this takes ownership of that descriptor: call it at most once per process.
pub fn serve<F: Exported>(config: &Config, fs: Arc<F>) -> Result<(), DaemonError> {
    serve_session(config, fs, false)
}

/// [`serve`], for a daemon that may have taken its guest's session over from a predecessor
/// (`took_over`, `--handover`): that predecessor still holds the socket's pid lock until it
/// exits, which it does at once, so the lock is waited for.
pub fn serve_session<F: Exported>(
    config: &Config,
    fs: Arc<F>,
    took_over: bool,
) -> Result<(), DaemonError> {
    let stats: Arc<dyn FsStats> = fs.clone();
    let recovering = fs.clone();
    let state: Arc<dyn DeviceState> = fs.clone();
    let handover_state = state.clone();
    let backend = VhostUserFsBackend::new(
        fs,
        &BackendOptions {
            tag: config.tag.clone(),
            request_queues: config.queues,
            thread_pool_size: config.thread_pool_size,
            poll: std::time::Duration::from_micros(config.poll_us),
            nonblocking: config.nonblocking_io,
        },
    )
    .map_err(DaemonError::Backend)?;
    backend.enable_migration(state);

    // Signal handlers first: once the socket exists, SIGTERM is already ours.
    let (events, receiver) = mpsc::channel();
    let signals = SignalThread::start(events.clone(), watchdog(config), stats.clone())?;
    let Endpoints {
        signals,
        listener,
        pid_lock,
        handover,
        metrics,
    } = open_endpoints(config, took_over, signals, &stats)?;
    // systemd (Type=notify): the socket listens and CephFS is mounted.
    notify_ready(config, stats.clone())?;

    let conn_backend = backend.clone();
    let keep_serving = config.keep_serving;
    let handover_events = events.clone();
    let conn_state = handover_state.clone();
    let conn = std::thread::Builder::new()
        .name("vhost-user".to_owned())
        .spawn(move || {
            let result = connection_loop(listener, &conn_backend, keep_serving, &*conn_state);
            let _ = events.send(Event::Finished(result));
        })
        .map_err(|e| DaemonError::Thread("vhost-user connection", e))?;
    let rec_backend = backend.clone();
    std::thread::Builder::new()
        .name("recovery".to_owned())
        .spawn(move || recovery_loop(&*recovering, &rec_backend))
        .map_err(|e| DaemonError::Thread("session recovery", e))?;
    if let Some(listener) = handover {
        spawn_handover(
            listener,
            handover_state.clone(),
            backend.clone(),
            handover_events,
        )?;
    }

    let result = wait_for_stop(&receiver);
    let drained = backend.stop_and_drain(DRAIN_LIMIT);
    if let Some(m) = metrics {
        m.stop();
    }
    signals.stop();
    if conn.is_finished() && conn.join().is_err() {
        error!("The vhost-user connection thread panicked");
    }
    remove_sockets(config);
    drop(pid_lock);
    if !drained {
        return Err(DaemonError::RequestsStuck(DRAIN_LIMIT.as_secs()));
    }
    result
}

/// What serving listens on and holds once it may start: the signal thread, the vhost-user
/// socket and its pid lock, the handover socket and the metrics endpoint.
struct Endpoints {
    signals: SignalThread,
    listener: Listener,
    pid_lock: Option<PidLock>,
    handover: Option<HandoverListener>,
    metrics: Option<MetricsServer>,
}

/// Open what the daemon listens on while privileges allow, then enter the sandbox. On an
/// error, `signals` is stopped before what was opened is closed.
fn open_endpoints(
    config: &Config,
    took_over: bool,
    signals: SignalThread,
    stats: &Arc<dyn FsStats>,
) -> Result<Endpoints, DaemonError> {
    let lock_wait = if took_over {
        PREDECESSOR_EXIT_WAIT
    } else {
        std::time::Duration::ZERO
    };
    let (listener, pid_lock) = match open_listener(&config.listen, lock_wait) {
        Ok(opened) => opened,
        Err(e) => {
            signals.stop();
            return Err(e);
        }
    };
    if let Err(e) = give_socket_to_group(config) {
        signals.stop();
        return Err(e);
    }
    // Bound while privileges allow; served on a thread of its own once the frontend can come.
    let handover = match config.handover.as_deref().map(HandoverListener::bind) {
        None => None,
        Some(Ok(l)) => Some(l),
        Some(Err(source)) => {
            signals.stop();
            return Err(DaemonError::Handover {
                path: config.handover.clone().unwrap_or_default(),
                source,
            });
        }
    };
    // The metrics endpoint binds before privileges are dropped (it may need a low port).
    let metrics = match start_metrics(config, stats.clone()) {
        Ok(m) => m,
        Err(e) => {
            signals.stop();
            return Err(e);
        }
    };
    hand_admin_socket_to_user(config);
    // Least privilege: CephFS is mounted and the socket is open; nothing else needs privilege.
    if let Err(e) = crate::sandbox::enter(&config.sandbox) {
        signals.stop();
        return Err(DaemonError::Sandbox(e));
    }
    Ok(Endpoints {
        signals,
        listener,
        pid_lock,
        handover,
        metrics,
    })
}

/// Serve handover requests on a thread of its own; the events hear when a successor took the
/// guest's session.
fn spawn_handover<F: Exported>(
    listener: HandoverListener,
    state: Arc<dyn DeviceState>,
    queues: VhostUserFsBackend<F>,
    events: mpsc::Sender<Event>,
) -> Result<(), DaemonError> {
    std::thread::Builder::new()
        .name("handover".to_owned())
        .spawn(move || {
            listener.run(&*state, &queues);
            let _ = events.send(Event::HandedOver);
        })
        .map_err(|e| DaemonError::Thread("handover", e))?;
    Ok(())
}

/// Wait for the first reason to stop, and tell systemd we are stopping: the result serving
/// ends with, unless draining fails.
fn wait_for_stop(receiver: &mpsc::Receiver<Event>) -> Result<(), DaemonError> {
    let received = receiver.recv();
    crate::notify::stopping();
    match received {
        Ok(Event::Signal(name)) => {
            info!("Received {name}: stopping");
            Ok(())
        }
        Ok(Event::HandedOver) => {
            info!("The guest's session is handed over to the successor: stopping");
            Ok(())
        }
        Ok(Event::Finished(result)) => result,
        Err(mpsc::RecvError) => Err(DaemonError::ConnectionPanicked),
    }
}

/// Remove the sockets' files once serving stopped.
fn remove_sockets(config: &Config) {
    // If we stop on a signal the connection thread still owns the listener: remove the socket
    // file ourselves so the next start does not find a stale one.
    if let Listen::SocketPath(path) = &config.listen {
        let _ = std::fs::remove_file(path);
    }
    // Ours while we hold the pid lock: a successor binds it only after taking that lock.
    if let Some(path) = &config.handover {
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Recover the CephFS session whenever the filesystem says it is lost (an eviction): the
/// guest's queues are paused while no request runs, the filesystem mounts a new session and
/// brings the guest's nodes and handles over, then the queues go on. A failed attempt is tried
/// again, at most every 30 s. Returns at once for a filesystem that does not recover.
fn recovery_loop<F>(fs: &F, backend: &VhostUserFsBackend<F>)
where
    F: Servable + 'static,
{
    const FIRST_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
    let mut backoff = FIRST_RETRY;
    while fs.wait_for_lost_session() {
        warn!(
            "The CephFS session is gone (the MDS evicted this client; libcephfs answers ESHUTDOWN): pausing the guest's requests to mount a new session"
        );
        let drained = backend.close_and_drain(DRAIN_LIMIT);
        let recovered = match drained.then(|| fs.recover_session()) {
            Some(Ok(line)) => {
                warn!("CephFS session recovered after the eviction: {line}");
                true
            }
            Some(Err(e)) => {
                error!(error = %e, retry_s = backoff.as_secs(),
                    "Cannot mount a new CephFS session after the eviction; the guest's requests fail with ESHUTDOWN until it works");
                false
            }
            None => {
                warn!("Requests are still running in the lost session; trying again");
                false
            }
        };
        backend.reopen();
        if recovered {
            backoff = FIRST_RETRY;
        } else {
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(std::time::Duration::from_secs(30));
        }
    }
}

/// The slow-request watchdog of `config`, with request tracking turned on for it; `None` (and
/// tracking off) with `--slow-request-secs 0`.
fn watchdog(config: &Config) -> Option<Watchdog> {
    let bound = config.log.slow_request;
    crate::metrics::inflight::set_slow_bound(bound);
    if bound.is_zero() {
        return None;
    }
    let admin_socket = config.ceph_admin_socket();
    info!(
        bound_s = bound.as_secs(),
        admin_socket = admin_socket.as_ref().map(|p| p.display().to_string()),
        "Slow-request watchdog on: requests in flight longer than --slow-request-secs are logged"
    );
    Some(Watchdog {
        bound,
        admin_socket,
    })
}

/// libcephfs created its admin socket as the starting user (root, with `--user`): once the
/// daemon runs as `--user`, it could no longer connect to it, and the metrics' Ceph health and
/// the watchdog's "waits on" would go blind. Give the socket to that user first. A failure only
/// costs those figures: it is logged, not fatal.
fn hand_admin_socket_to_user(config: &Config) {
    let (Some(acct), Some(path)) = (&config.sandbox.user, config.ceph_admin_socket()) else {
        return;
    };
    // Only a socket: `admin_socket` may name any path, and we chown nothing else.
    let is_socket = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket());
    if !is_socket {
        return;
    }
    if let Err(e) = std::os::unix::fs::lchown(&path, Some(acct.uid), Some(acct.gid)) {
        warn!(socket = %path.display(), user = %acct.name, error = %e,
            "Cannot give the libcephfs admin socket to --user: Ceph health metrics and the \
             slow-request watchdog will not know what libcephfs waits for");
    }
}

/// `--socket-group`: give the socket the daemon created to that group (its mode, 0777 less the
/// umask, decides what the group may do).
fn give_socket_to_group(config: &Config) -> Result<(), DaemonError> {
    let (Listen::SocketPath(path), Some(gid)) = (&config.listen, config.socket_group) else {
        return Ok(());
    };
    std::os::unix::fs::lchown(path, None, Some(gid)).map_err(|source| DaemonError::SocketGroup {
        path: path.clone(),
        gid,
        source,
    })
}

/// Tell systemd the daemon is ready (`Type=notify`), and start its watchdog pings, which the
/// filesystem's tables must answer (see [`crate::notify`]). Nothing without `NOTIFY_SOCKET`.
fn notify_ready(config: &Config, stats: Arc<dyn FsStats>) -> Result<(), DaemonError> {
    let at = match &config.listen {
        Listen::SocketPath(p) => p.display().to_string(),
        Listen::Fd(fd) => format!("fd {fd}"),
    };
    crate::notify::ready(&format!("Serving CephFS on {at}"));
    crate::notify::start_watchdog(move || {
        let _ = (stats.node_count(), stats.handle_count());
    })
    .map_err(DaemonError::Watchdog)
}

/// How long a daemon that took the session over waits for its predecessor to exit and
/// release the socket's pid lock (it exits at once; unmounting comes after the release).
const PREDECESSOR_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a stop waits for requests in flight before giving up on them.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

fn start_metrics(
    config: &Config,
    fs: Arc<dyn FsStats>,
) -> Result<Option<MetricsServer>, DaemonError> {
    let Some(m) = &config.metrics else {
        return Ok(None);
    };
    let scrape = Scrape {
        metrics: crate::metrics::global(),
        queues: 1 + usize::from(config.queues),
        fs: Some(fs),
        admin_socket: m.ceph_admin_socket.clone(),
    };
    MetricsServer::start(&m.endpoint, scrape)
        .map(Some)
        .map_err(DaemonError::Metrics)
}

fn connection_loop<F>(
    mut listener: Listener,
    backend: &VhostUserFsBackend<F>,
    keep_serving: bool,
    state: &dyn DeviceState,
) -> Result<(), DaemonError>
where
    F: Servable + 'static,
{
    loop {
        backend.reset_connection();
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::<crate::vhost_user::GuestBitmap>::new());
        let mut daemon = VhostUserDaemon::new("ceph-virtiofsd".to_owned(), backend.clone(), mem)
            .map_err(|e| DaemonError::CreateDaemon(e.to_string()))?;
        daemon
            .start(&mut listener)
            .map_err(|e| DaemonError::Accept(e.to_string()))?;
        info!("vhost-user frontend connected");
        let result = daemon.wait();
        for handler in daemon.get_epoll_handlers() {
            handler.send_exit_event();
        }
        // The last reference to the connection's handler: dropping it joins its queue
        // threads, so nothing pops a request of this frontend any more.
        drop(daemon);
        match result {
            Ok(())
            | Err(DaemonLibError::HandleRequest(
                VhostUserError::Disconnected | VhostUserError::PartialMessage,
            )) => info!("vhost-user frontend disconnected"),
            Err(e) if keep_serving => warn!(error = %e, "vhost-user connection failed"),
            Err(e) => return Err(DaemonError::Connection(e.to_string())),
        }
        if !keep_serving {
            return Ok(());
        }
        // The next frontend must not inherit this one's node ids and handles.
        while !backend.end_session(DRAIN_LIMIT) {
            warn!(
                "Requests of the disconnected frontend are still running (a lock wait, or an MDS \
                 that does not answer): the next frontend is accepted once they end"
            );
        }
        info!("The disconnected frontend's FUSE session ended: its nodes and handles are dropped");
        // A device state is loaded only before the guest's first FUSE INIT (or a loaded state)
        // of a connection (issue 28): the session that latched it has just ended, so the next
        // frontend may load one. The first connection keeps what the start left (a session
        // taken over with --handover is being served: no LOAD).
        state.connection_started();
        info!("--keep-serving: waiting for the frontend to reconnect");
    }
}

static FD_TAKEN: AtomicBool = AtomicBool::new(false);

fn open_listener(
    listen: &Listen,
    lock_wait: std::time::Duration,
) -> Result<(Listener, Option<PidLock>), DaemonError> {
    match listen {
        Listen::SocketPath(path) => {
            let deadline = std::time::Instant::now() + lock_wait;
            let lock = loop {
                match PidLock::acquire(path) {
                    Err(DaemonError::AlreadyRunning { .. })
                        if std::time::Instant::now() < deadline =>
                    {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    other => break other?,
                }
            };
            // We hold the lock, so an existing socket file is stale: Listener::new unlinks it.
            let listener = Listener::new(path, true).map_err(|source| DaemonError::Listen {
                path: path.clone(),
                source,
            })?;
            info!(socket = %path.display(), "Listening for the vhost-user frontend");
            Ok((listener, Some(lock)))
        }
        Listen::Fd(fd) => {
            let fd = *fd;
            check_socket_fd(fd)?;
            if FD_TAKEN.swap(true, Ordering::AcqRel) {
                return Err(DaemonError::FdTaken(fd));
            }
            // SAFETY: from_raw_fd requires an open descriptor that nothing else owns. It is open
            // and a socket (checked by fstat just above); it was handed to this process by the
            // parent for exactly this use, and FD_TAKEN guarantees we wrap it only once.
            let listener = unsafe { Listener::from_raw_fd(fd) };
            info!(
                fd,
                "Listening for the vhost-user frontend on an inherited socket"
            );
            Ok((listener, None))
        }
    }
}

fn check_socket_fd(fd: RawFd) -> Result<(), DaemonError> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes at most one `struct stat` into the pointer, which points to a
    // properly sized and aligned MaybeUninit<stat> that lives across the call. An invalid fd
    // only makes fstat fail with EBADF.
    let rc = unsafe { libc::fstat(fd, stat.as_mut_ptr()) };
    if rc != 0 {
        return Err(DaemonError::BadFd {
            fd,
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: fstat returned 0, so it initialised the whole struct.
    let stat = unsafe { stat.assume_init() };
    if stat.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(DaemonError::BadFd {
            fd,
            source: io::Error::from_raw_os_error(libc::ENOTSOCK),
        });
    }
    Ok(())
}

/// `SOCKET.pid`, locked with flock for as long as we serve; removed on drop.
#[derive(Debug)]
struct PidLock {
    path: PathBuf,
    _file: File,
}

fn pid_path(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_owned();
    s.push(".pid");
    PathBuf::from(s)
}

impl PidLock {
    fn acquire(socket: &Path) -> Result<Self, DaemonError> {
        let path = pid_path(socket);
        let pid_err = |source| DaemonError::PidFile {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&path)
            .map_err(pid_err)?;
        // SAFETY: flock only needs an open descriptor; `file` is open and outlives the call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(DaemonError::AlreadyRunning {
                    socket: socket.to_owned(),
                    pid: if pid.is_empty() {
                        "unknown".to_owned()
                    } else {
                        pid.to_owned()
                    },
                });
            }
            return Err(pid_err(err));
        }
        file.set_len(0).map_err(pid_err)?;
        file.rewind().map_err(pid_err)?;
        writeln!(file, "{}", std::process::id()).map_err(pid_err)?;
        // A socket path that exists but is not a socket is an operator mistake, not staleness.
        if let Ok(meta) = std::fs::symlink_metadata(socket) {
            if !meta.file_type().is_socket() {
                let _ = std::fs::remove_file(&path);
                return Err(DaemonError::Listen {
                    path: socket.to_owned(),
                    source: VhostUserError::SocketError(io::Error::from_raw_os_error(libc::EEXIST)),
                });
            }
        }
        Ok(PidLock { path, _file: file })
    }
}

impl Drop for PidLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// How often [`give_back_memory`] looks, how much data moved in one period counts as a
/// stream, and for how many looks after the last release or stream it still gives memory back
/// (libcephfs frees released inodes at its own tick, up to a second later, and flushes written
/// data behind the guest).
const GIVE_BACK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
const GIVE_BACK_STREAM_BYTES: u64 = 64 << 20;
const GIVE_BACK_LOOKS_AFTER: u32 = 2;

/// Give memory libcephfs freed back to the system. After a guest walked a large tree, the node
/// table released most inode references (`--held-inodes`) and libcephfs freed the inodes at
/// its next trim; after a guest streamed a large file, libcephfs freed the buffers of its
/// object cache. But glibc keeps freed memory in its heaps: the daemon's RSS stays at the
/// peak (212 MiB after a 100,000-inode walk, 114-134 once given back). Every
/// [`GIVE_BACK_EVERY`] while references are being released or data streams, and
/// [`GIVE_BACK_LOOKS_AFTER`] times more after, `malloc_trim` hands free heap pages back. It
/// walks glibc's heaps under their locks: milliseconds, at most once per period; an idle
/// daemon never calls it.
async fn give_back_memory(stats: Arc<dyn FsStats>) {
    let mut tick = tokio::time::interval(GIVE_BACK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let moved = || crate::metrics::global().bytes_moved();
    let (mut last, mut last_moved) = (stats.inode_refs().1, moved());
    let mut looks_left = 0;
    loop {
        tick.tick().await;
        let (released, now_moved) = (stats.inode_refs().1, moved());
        if released != last || now_moved.wrapping_sub(last_moved) >= GIVE_BACK_STREAM_BYTES {
            looks_left = GIVE_BACK_LOOKS_AFTER + 1;
        }
        (last, last_moved) = (released, now_moved);
        if looks_left > 0 {
            looks_left -= 1;
            trim_heap();
        }
    }
}

#[cfg(target_env = "gnu")]
fn trim_heap() {
    // SAFETY: malloc_trim takes no pointer; it only walks glibc's own heaps under their locks
    // and may be called from any thread at any time.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(not(target_env = "gnu"))]
fn trim_heap() {}

/// The control-plane thread: a tokio current-thread runtime waiting for SIGTERM/SIGINT, and
/// running the slow-request watchdog and [`give_back_memory`] meanwhile.
struct SignalThread {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl SignalThread {
    fn start(
        events: mpsc::Sender<Event>,
        watchdog: Option<Watchdog>,
        stats: Arc<dyn FsStats>,
    ) -> Result<Self, DaemonError> {
        use tokio::signal::unix::{signal, SignalKind};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(DaemonError::Signals)?;
        // Register the handlers now, so a signal arriving right after start is not lost.
        let (mut term, mut int) = runtime
            .block_on(async {
                Ok::<_, io::Error>((
                    signal(SignalKind::terminate())?,
                    signal(SignalKind::interrupt())?,
                ))
            })
            .map_err(DaemonError::Signals)?;
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("control".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    let watch = async move {
                        match watchdog {
                            Some(w) => w.run().await,
                            None => std::future::pending().await,
                        }
                    };
                    let name = tokio::select! {
                        _ = term.recv() => "SIGTERM",
                        _ = int.recv() => "SIGINT",
                        _ = &mut stopped => return,
                        () = watch => return,
                        _ = give_back_memory(stats) => return,
                        () = crate::notify::heartbeat() => return,
                    };
                    let _ = events.send(Event::Signal(name));
                });
            })
            .map_err(|e| DaemonError::Thread("control", e))?;
        Ok(SignalThread {
            stop: Some(stop),
            handle: Some(handle),
        })
    }

    fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.handle.take() {
            if handle.join().is_err() {
                error!("The control thread panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_lock_excludes_a_second_daemon() {
        let dir = std::env::temp_dir().join(format!("cvfs-pidlock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let socket = dir.join("vm.sock");
        let first = PidLock::acquire(&socket).unwrap_or_else(|e| panic!("{e}"));
        let pid_file = pid_path(&socket);
        let content = std::fs::read_to_string(&pid_file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(content.trim(), std::process::id().to_string());
        match PidLock::acquire(&socket) {
            Err(DaemonError::AlreadyRunning { pid, .. }) => {
                assert_eq!(pid, std::process::id().to_string())
            }
            other => panic!("expected AlreadyRunning, got {other:?}"),
        }
        drop(first);
        assert!(!pid_file.exists());
        let again = PidLock::acquire(&socket);
        assert!(again.is_ok());
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn test_config(socket: &Path, keep_serving: bool) -> Config {
        let args = crate::args::Args {
            socket_path: Some(socket.to_owned()),
            thread_pool_size: Some(1),
            keep_serving,
            // serve() would install the filter on every thread of the test harness.
            seccomp: Some(crate::args::SeccompMode::None),
            cluster: crate::args::ClusterArgs {
                client_id: Some("t".to_owned()),
                ..Default::default()
            },
            ceph_root: Some("/t".to_owned()),
            ..Default::default()
        };
        let mut config = Config::try_from(args).unwrap_or_else(|e| panic!("{e}"));
        // serve() would switch the whole test harness to the package's user, if it exists.
        config.sandbox.user = None;
        config
    }

    fn wait_for_socket(path: &Path) {
        for _ in 0..1000 {
            if path.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("daemon never created {}", path.display());
    }

    /// Talk vhost-user to the daemon like QEMU does at startup, then hang up.
    fn handshake(socket: &Path) {
        use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures};
        use vhost::VhostBackend;
        let mut frontend = Frontend::connect(socket, 2).unwrap_or_else(|e| panic!("{e}"));
        frontend.set_owner().unwrap_or_else(|e| panic!("{e}"));
        let features = frontend.get_features().unwrap_or_else(|e| panic!("{e}"));
        frontend
            .set_features(features)
            .unwrap_or_else(|e| panic!("{e}"));
        let protocol = frontend
            .get_protocol_features()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(protocol.contains(VhostUserProtocolFeatures::MQ));
        frontend
            .set_protocol_features(protocol)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            frontend.get_queue_num().unwrap_or_else(|e| panic!("{e}")),
            2
        );
    }

    /// One test, because SIGTERM reaches every serve() running in this process.
    #[test]
    fn serves_frontends_and_stops_on_disconnect_or_sigterm() {
        use crate::vhost_user::tests::TestFs;
        let dir = std::env::temp_dir().join(format!("cvfs-serve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));

        // 1. Without --keep-serving, a frontend hanging up ends serve() with Ok.
        let socket = dir.join("once.sock");
        let config = test_config(&socket, false);
        let server = std::thread::spawn(move || serve(&config, Arc::new(TestFs::default())));
        wait_for_socket(&socket);
        handshake(&socket);
        let result = server.join().unwrap_or_else(|_| panic!("serve panicked"));
        assert!(result.is_ok(), "{result:?}");
        assert!(!socket.exists(), "socket file left behind");
        assert!(!pid_path(&socket).exists(), "pid file left behind");

        // 2. With --keep-serving, a second frontend can connect; SIGTERM then ends serve().
        let socket = dir.join("keep.sock");
        let config = test_config(&socket, true);
        let server = std::thread::spawn(move || serve(&config, Arc::new(TestFs::default())));
        wait_for_socket(&socket);
        handshake(&socket);
        handshake(&socket);
        // SAFETY: kill has no memory preconditions; we signal our own pid, whose SIGTERM is
        // handled by serve()'s control thread (installed before the socket appeared).
        let rc = unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
        assert_eq!(rc, 0);
        let result = server.join().unwrap_or_else(|_| panic!("serve panicked"));
        assert!(result.is_ok(), "{result:?}");
        assert!(!socket.exists(), "socket file left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Counts `connection_started` calls (the LOAD latch's re-arming).
    #[derive(Default)]
    struct Connections(std::sync::atomic::AtomicUsize);

    impl DeviceState for Connections {
        fn save_state(&self) -> Result<Vec<u8>, crate::migration::MigrationError> {
            Err(crate::migration::MigrationError::Busy)
        }
        fn load_state(
            &self,
            _: &[u8],
        ) -> Result<crate::migration::LoadReport, crate::migration::MigrationError> {
            Err(crate::migration::MigrationError::Busy)
        }
        fn connection_started(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A `--keep-serving` connection loop over `fs` on a socket of its own, until the test
    /// process ends: its directory, its socket, and how many connections it started.
    fn keep_serving(
        name: &str,
        fs: Arc<crate::vhost_user::tests::TestFs>,
    ) -> (PathBuf, PathBuf, Arc<Connections>) {
        let dir = std::env::temp_dir().join(format!("cvfs-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let socket = dir.join("vm.sock");
        let listener = Listener::new(&socket, true).unwrap_or_else(|e| panic!("{e}"));
        let options = BackendOptions {
            tag: None,
            request_queues: 1,
            thread_pool_size: 1,
            poll: std::time::Duration::ZERO,
            nonblocking: false,
        };
        let backend = VhostUserFsBackend::new(fs, &options).unwrap_or_else(|e| panic!("{e}"));
        let state = Arc::new(Connections::default());
        let seen = state.clone();
        std::thread::spawn(move || connection_loop(listener, &backend, true, &*state));
        (dir, socket, seen)
    }

    /// A frontend that owns the device and has had an answer.
    fn frontend(socket: &Path) -> vhost::vhost_user::Frontend {
        use vhost::VhostBackend;
        let frontend =
            vhost::vhost_user::Frontend::connect(socket, 2).unwrap_or_else(|e| panic!("{e}"));
        frontend.set_owner().unwrap_or_else(|e| panic!("{e}"));
        frontend.get_features().unwrap_or_else(|e| panic!("{e}"));
        frontend
    }

    /// With --keep-serving, a frontend that hangs up ends its FUSE session (nodes and handles
    /// dropped) before the next frontend is accepted.
    #[test]
    fn hostile_keep_serving_reconnect_ends_the_previous_session() {
        use crate::vhost_user::tests::TestFs;
        let fs = Arc::new(TestFs::default());
        let (dir, socket, seen) = keep_serving("reconnect", fs.clone());
        // A frontend that has had an answer, and stays connected.
        let connect = || {
            use vhost::vhost_user::VhostUserFrontend;
            let mut frontend = frontend(&socket);
            let _ = frontend.get_protocol_features();
            frontend
        };
        let first = connect();
        assert_eq!(fs.destroyed.load(Ordering::SeqCst), 0);
        // The first connection keeps the start's LOAD latch (nothing ended before it).
        assert_eq!(seen.0.load(Ordering::SeqCst), 0);
        drop(first);
        // Accepted only after the first frontend's session ended, and a device state may be
        // loaded again on it.
        let _second = connect();
        assert_eq!(fs.destroyed.load(Ordering::SeqCst), 1);
        assert_eq!(seen.0.load(Ordering::SeqCst), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The queue threads' exit events of one connection stay with the daemon: vhost-user-backend
    /// never closes what it is given, and a new pair per connection leaked two descriptors per
    /// reconnect until the daemon could not accept a frontend. Each frontend here is served
    /// (a new connection's threads start and the previous ones exit: `connect` would hang
    /// otherwise), and 200 reconnects add no eventfd.
    #[test]
    fn hostile_keep_serving_reconnects_leave_no_descriptors() {
        use crate::vhost_user::tests::TestFs;
        let (dir, socket, seen) = keep_serving("fds", Arc::new(TestFs::default()));
        let connect = || frontend(&socket);
        // Other tests of this process open eventfds too: count ours by the growth over many
        // reconnects (the leak was 400 here), with room for what runs beside.
        let eventfds = || {
            std::fs::read_dir("/proc/self/fd")
                .map(|d| {
                    d.filter_map(Result::ok)
                        .filter(|e| {
                            std::fs::read_link(e.path())
                                .is_ok_and(|l| l.to_string_lossy().contains("eventfd"))
                        })
                        .count()
                })
                .unwrap_or(0)
        };
        drop(connect());
        let before = eventfds();
        for _ in 0..200 {
            drop(connect());
        }
        // The last hang-up has ended its session once the next frontend is accepted.
        let last = connect();
        let after = eventfds();
        assert!(seen.0.load(Ordering::SeqCst) >= 201);
        assert!(
            after <= before + 40,
            "200 reconnects left {} more eventfds open ({before} before, {after} after)",
            after.saturating_sub(before)
        );
        drop(last);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn fd_must_be_a_socket() {
        let file = File::open("/dev/null").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            check_socket_fd(file.as_raw_fd()),
            Err(DaemonError::BadFd { .. })
        ));
        let sock = std::os::unix::net::UnixDatagram::unbound().unwrap_or_else(|e| panic!("{e}"));
        assert!(check_socket_fd(sock.as_raw_fd()).is_ok());
        assert!(matches!(
            check_socket_fd(987_654),
            Err(DaemonError::BadFd { .. })
        ));
    }
}
