//! Restart and upgrade without the guest noticing (`--handover PATH`): a daemon hands its
//! guest's FUSE session to a successor started with the same options, for frontends that
//! reconnect to a restarted back-end (cloud-hypervisor does, and the bench frontend does like
//! it).
//!
//! The session moves in the device-state format of live migration ([`crate::migration`]),
//! over a unix socket at PATH, while the predecessor still holds its CephFS session:
//!
//! 1. The successor mounts CephFS, then connects to PATH (nobody there: a fresh start).
//! 2. The predecessor stops taking requests off the queues (they stay in the rings), waits for
//!    those in flight, saves the session and sends it.
//! 3. The successor resolves every node and handle against the cluster (by inode number, as a
//!    migration destination does) and says whether it took the session.
//! 4. Taken: the predecessor removes PATH, releases its socket's pid lock and exits
//!    (unmounting); the successor, which waited for that lock, listens on the vhost-user socket
//!    and on PATH for the next upgrade, and the reconnecting frontend's guest goes on with its
//!    node ids and handles. Refused (or the successor went away): the predecessor takes
//!    requests again and serves on, and the successor exits with an error.
//!
//! The predecessor's session is alive while the successor resolves, so a file the guest holds
//! open after another client deleted it is still found. Only the daemon's own user may connect
//! (the socket is 0600 and the peer's uid is checked). The successor believes the state it is
//! given about where nodes lie ([`DeviceState::load_peer_state`]), so it checks whom it talks
//! to as well: PATH's directory must be writable by this user (and root) only, so that nobody
//! else can put a socket there, and the process listening at PATH must run as this user.
//!
//! Wire format, all integers little-endian:
//! ```text
//! successor   -> "CVFSTAKE" u32 version (1)
//! predecessor -> "CVFSGIVE" u8 status: 0 = the state follows: u64 length, state bytes
//!                                      1 = refused:          u32 length, UTF-8 reason
//! successor   -> u8: 1 = taken (the predecessor exits), 0 = not taken (it serves on)
//! ```

use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::migration::{DeviceState, LoadReport, MigrationError};

const HELLO: &[u8; 8] = b"CVFSTAKE";
const GIVE: &[u8; 8] = b"CVFSGIVE";
const VERSION: u32 = 1;
const STATUS_STATE: u8 = 0;
const STATUS_REFUSED: u8 = 1;
const TAKEN: u8 = 1;
const NOT_TAKEN: u8 = 0;
/// How long either side waits for the other's next message. The successor's answer comes
/// after it resolved the whole session: about 10 s for 100,000 nodes on the lab cluster.
const PEER_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest refusal reason read.
const MAX_REASON: u32 = 4096;

/// Why a takeover failed. The successor exits with it; the predecessor serves on.
#[derive(Debug, thiserror::Error)]
pub enum TakeOverError {
    #[error("Cannot connect to the running daemon's handover socket {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("The handover with the running daemon at {path} failed on the way")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a ceph-virtiofsd handover socket (or one of another version): start this daemon without --handover, or with another path")]
    Protocol { path: PathBuf },
    #[error("The running daemon refused to hand its session over: {0}")]
    Refused(String),
    #[error("The handover socket's directory {dir} {why}: another user could put a socket there and hand this daemon a forged session. Give --handover a path in a directory only this daemon's user (and root) can write, such as /run/ceph-virtiofsd (mode 0750)")]
    UnsafeDirectory { dir: PathBuf, why: String },
    #[error("The process listening at {path} runs as uid {uid}, not as this daemon's uid {euid}: refused (it is not a ceph-virtiofsd of this device). Remove the socket, and start the daemon again")]
    OtherUser { path: PathBuf, uid: u32, euid: u32 },
    #[error("Cannot take over the running daemon's session; it keeps serving the guest")]
    Load(#[source] MigrationError),
}

/// What a start with `--handover` found at PATH.
#[derive(Debug)]
pub enum TakeOver {
    /// No daemon listens there: a fresh session.
    Nobody,
    /// The predecessor's session is loaded; it exits now.
    Taken(LoadReport),
}

/// Whether only this user (and root) can put a socket at `path`: its directory belongs to
/// `euid` or root and is writable by neither its group nor others (a sticky world-writable
/// directory such as /tmp lets anyone create a name that does not exist yet). The reason if not.
fn directory_is_private(path: &Path, euid: u32) -> Result<(), TakeOverError> {
    use std::os::unix::fs::MetadataExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let unsafe_dir = |why: String| TakeOverError::UnsafeDirectory {
        dir: dir.clone(),
        why,
    };
    let meta =
        std::fs::metadata(&dir).map_err(|e| unsafe_dir(format!("cannot be examined ({e})")))?;
    let mode = meta.mode() & 0o7777;
    if meta.uid() != euid && meta.uid() != 0 {
        return Err(unsafe_dir(format!(
            "belongs to uid {} (neither this daemon's uid {euid} nor root)",
            meta.uid()
        )));
    }
    if mode & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "is writable by its group or by others (mode {mode:04o})"
        )));
    }
    Ok(())
}

/// Successor side: take the session of the daemon listening at `path`, if there is one, into
/// `state` (a filesystem that serves no session yet). Refused before anything is read when
/// PATH's directory lets another user put a socket there, or when the listener runs as
/// another user than this process's effective uid.
pub fn take_over(path: &Path, state: &dyn DeviceState) -> Result<TakeOver, TakeOverError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    directory_is_private(path, euid)?;
    let mut s = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(TakeOver::Nobody)
        }
        Err(source) => {
            return Err(TakeOverError::Connect {
                path: path.to_owned(),
                source,
            })
        }
    };
    let io_err = |source| TakeOverError::Io {
        path: path.to_owned(),
        source,
    };
    // SO_PEERCRED of a connected socket: who called listen() on the other end.
    let uid = peer_uid(&s).map_err(io_err)?;
    if uid != euid {
        return Err(TakeOverError::OtherUser {
            path: path.to_owned(),
            uid,
            euid,
        });
    }
    let started = Instant::now();
    s.set_read_timeout(Some(PEER_TIMEOUT)).map_err(io_err)?;
    s.set_write_timeout(Some(PEER_TIMEOUT)).map_err(io_err)?;
    let mut hello = HELLO.to_vec();
    hello.extend_from_slice(&VERSION.to_le_bytes());
    s.write_all(&hello).map_err(io_err)?;
    let mut give = [0u8; 9];
    s.read_exact(&mut give).map_err(io_err)?;
    if give[..8] != GIVE[..] {
        return Err(TakeOverError::Protocol {
            path: path.to_owned(),
        });
    }
    match give[8] {
        STATUS_STATE => {}
        STATUS_REFUSED => {
            let mut len = [0u8; 4];
            s.read_exact(&mut len).map_err(io_err)?;
            let len = u32::from_le_bytes(len).min(MAX_REASON);
            let mut reason = Vec::new();
            (&mut s)
                .take(u64::from(len))
                .read_to_end(&mut reason)
                .map_err(io_err)?;
            return Err(TakeOverError::Refused(
                String::from_utf8_lossy(&reason).into_owned(),
            ));
        }
        _ => {
            return Err(TakeOverError::Protocol {
                path: path.to_owned(),
            })
        }
    }
    let mut len = [0u8; 8];
    s.read_exact(&mut len).map_err(io_err)?;
    let len = u64::from_le_bytes(len);
    if len > state.max_state_len() {
        let _ = s.write_all(&[NOT_TAKEN]);
        return Err(TakeOverError::Load(
            crate::migration::FormatError::Corrupt("longer than the most a state may take").into(),
        ));
    }
    let mut bytes = Vec::new();
    (&mut s).take(len).read_to_end(&mut bytes).map_err(io_err)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) != len {
        let _ = s.write_all(&[NOT_TAKEN]);
        return Err(io_err(io::ErrorKind::UnexpectedEof.into()));
    }
    let report = match state.load_peer_state(&bytes) {
        Ok(r) => r,
        Err(e) => {
            let _ = s.write_all(&[NOT_TAKEN]);
            return Err(TakeOverError::Load(e));
        }
    };
    s.write_all(&[TAKEN]).map_err(io_err)?;
    info!(
        bytes = bytes.len(),
        ms = started.elapsed().as_millis(),
        %report,
        "handover: took over the running daemon's session"
    );
    Ok(TakeOver::Taken(report))
}

/// Predecessor side: the listening socket, bound before privileges are dropped.
#[derive(Debug)]
pub struct HandoverListener {
    listener: UnixListener,
    path: PathBuf,
}

/// How the serving daemon pauses and resumes its queues around a handover.
pub trait Pausable: Send + Sync {
    /// Stop taking requests off the queues and wait, at most `limit`, for those in flight.
    /// False: some are still running (taking stays stopped until `resume`).
    fn pause(&self, limit: Duration) -> bool;
    /// Take requests again, including those that arrived during the pause.
    fn resume(&self);
}

impl HandoverListener {
    /// Listen at `path` (0600). A stale socket file there (its daemon is gone) is replaced; a
    /// live one means another daemon hands over there: an error.
    pub fn bind(path: &Path) -> io::Result<Self> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "the path exists and is not a socket",
                ));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "another daemon listens there",
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        info!(path = %path.display(), "Listening for a successor to hand the session over to (--handover)");
        Ok(HandoverListener {
            listener,
            path: path.to_owned(),
        })
    }

    /// Serve successors until one takes the session; then remove the socket and return.
    /// Runs on a thread of its own.
    pub fn run(self, state: &dyn DeviceState, queues: &dyn Pausable) {
        for conn in self.listener.incoming() {
            let conn = match conn {
                Ok(c) => c,
                Err(e) => {
                    warn!(error = %e, "handover: accept failed");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            match peer_uid(&conn) {
                // SAFETY: geteuid has no preconditions and cannot fail.
                Ok(uid) if uid == unsafe { libc::geteuid() } || uid == 0 => {}
                Ok(uid) => {
                    warn!(uid, "handover: refused a connection of another user");
                    continue;
                }
                Err(e) => {
                    warn!(error = %e, "handover: cannot tell who connected; refused");
                    continue;
                }
            }
            match give(conn, state, queues) {
                Ok(true) => {
                    let _ = std::fs::remove_file(&self.path);
                    return;
                }
                Ok(false) => info!("handover: the successor did not take the session; serving on"),
                Err(e) => warn!(error = %e, "handover failed on the way; serving on"),
            }
        }
    }
}

/// One successor: pause, send, and learn whether it took the session (then stay paused).
fn give(mut s: UnixStream, state: &dyn DeviceState, queues: &dyn Pausable) -> io::Result<bool> {
    s.set_read_timeout(Some(PEER_TIMEOUT))?;
    s.set_write_timeout(Some(PEER_TIMEOUT))?;
    let mut hello = [0u8; 12];
    s.read_exact(&mut hello)?;
    if hello[..8] != HELLO[..] || hello[8..] != VERSION.to_le_bytes() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a ceph-virtiofsd successor of this handover version",
        ));
    }
    let started = Instant::now();
    let refuse = |s: &mut UnixStream, why: String| -> io::Result<bool> {
        warn!(reason = %why, "handover: refused");
        let mut msg = GIVE.to_vec();
        msg.push(STATUS_REFUSED);
        let mut why = why.into_bytes();
        why.truncate(usize::try_from(MAX_REASON).unwrap_or(usize::MAX));
        let len = u32::try_from(why.len()).unwrap_or(MAX_REASON);
        msg.extend_from_slice(&len.to_le_bytes());
        msg.extend_from_slice(&why);
        s.write_all(&msg)?;
        Ok(false)
    };
    if !queues.pause(PAUSE_DRAIN_LIMIT) {
        queues.resume();
        return refuse(&mut s, MigrationError::Busy.to_string());
    }
    let bytes = match state.save_state() {
        Ok(b) => b,
        Err(e) => {
            queues.resume();
            return refuse(&mut s, e.to_string());
        }
    };
    let mut msg = GIVE.to_vec();
    msg.push(STATUS_STATE);
    msg.extend_from_slice(&u64::try_from(bytes.len()).unwrap_or(u64::MAX).to_le_bytes());
    let sent = s.write_all(&msg).and_then(|()| s.write_all(&bytes));
    let mut answer = [0u8; 1];
    let answer = sent
        .and_then(|()| s.read_exact(&mut answer))
        .map(|()| answer[0]);
    match answer {
        Ok(TAKEN) => {
            info!(
                bytes = bytes.len(),
                ms = started.elapsed().as_millis(),
                "handover: the successor took the session; stopping"
            );
            Ok(true)
        }
        Ok(_) => {
            queues.resume();
            Ok(false)
        }
        Err(e) => {
            queues.resume();
            Err(e)
        }
    }
}

/// How long a handover waits for the requests in flight before refusing.
const PAUSE_DRAIN_LIMIT: Duration = Duration::from_secs(10);

fn peer_uid(s: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: SO_PEERCRED writes at most `len` bytes (the size of `struct ucred`) into `cred`,
    // which is a properly aligned, initialised ucred living across the call; `s` is an open
    // unix socket.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// A filesystem whose session is a byte string.
    #[derive(Default)]
    struct Fake {
        saved: Vec<u8>,
        loaded: Mutex<Option<Vec<u8>>>,
        refuse_save: bool,
        refuse_load: bool,
    }

    impl DeviceState for Fake {
        fn save_state(&self) -> Result<Vec<u8>, MigrationError> {
            if self.refuse_save {
                return Err(MigrationError::LocksHeld(1));
            }
            Ok(self.saved.clone())
        }
        fn load_state(&self, bytes: &[u8]) -> Result<LoadReport, MigrationError> {
            if self.refuse_load {
                return Err(MigrationError::IdMapping);
            }
            *self.loaded.lock().unwrap() = Some(bytes.to_vec());
            Ok(LoadReport::default())
        }
    }

    #[derive(Default)]
    struct Queues {
        paused: AtomicBool,
        resumes: AtomicUsize,
    }

    impl Pausable for Queues {
        fn pause(&self, _: Duration) -> bool {
            self.paused.store(true, Ordering::SeqCst);
            true
        }
        fn resume(&self) {
            self.paused.store(false, Ordering::SeqCst);
            self.resumes.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cvfs-handover-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A predecessor with session `old` listening at `path`, and its queues.
    fn predecessor(path: &Path, old: Fake) -> (std::thread::JoinHandle<()>, Arc<Queues>) {
        let l = HandoverListener::bind(path).unwrap();
        let q = Arc::new(Queues::default());
        let queues = q.clone();
        (std::thread::spawn(move || l.run(&old, &*queues)), q)
    }

    /// Until the predecessor resumed its queues once (bounded: a precondition).
    fn wait_resumed(q: &Queues) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while q.resumes.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn nobody_listening_is_a_fresh_start() {
        let d = dir("nobody");
        let new = Fake::default();
        assert!(matches!(
            take_over(&d.join("h"), &new).unwrap(),
            TakeOver::Nobody
        ));
        // A stale socket file of a dead daemon: the same.
        drop(UnixListener::bind(d.join("stale")).unwrap());
        assert!(matches!(
            take_over(&d.join("stale"), &new).unwrap(),
            TakeOver::Nobody
        ));
        // And a new daemon may listen there.
        drop(HandoverListener::bind(&d.join("stale")).unwrap());
    }

    #[test]
    fn the_session_moves_and_the_predecessor_stays_paused() {
        let d = dir("moves");
        let path = d.join("h");
        let (t, q) = predecessor(
            &path,
            Fake {
                saved: b"the session".to_vec(),
                ..Fake::default()
            },
        );
        let new = Fake::default();
        assert!(matches!(
            take_over(&path, &new).unwrap(),
            TakeOver::Taken(_)
        ));
        t.join().unwrap();
        assert_eq!(
            new.loaded.lock().unwrap().as_deref(),
            Some(&b"the session"[..])
        );
        assert!(q.paused.load(Ordering::SeqCst));
        assert_eq!(q.resumes.load(Ordering::SeqCst), 0);
        assert_eq!(
            std::fs::metadata(&path).err().map(|e| e.kind()),
            Some(io::ErrorKind::NotFound),
            "the predecessor removes its socket"
        );
    }

    #[test]
    fn a_successor_that_cannot_load_leaves_the_predecessor_serving() {
        let d = dir("noload");
        let path = d.join("h");
        let (_t, q) = predecessor(
            &path,
            Fake {
                saved: b"s".to_vec(),
                ..Fake::default()
            },
        );
        let bad = Fake {
            refuse_load: true,
            ..Fake::default()
        };
        assert!(matches!(
            take_over(&path, &bad),
            Err(TakeOverError::Load(MigrationError::IdMapping))
        ));
        // The predecessor resumed and still listens: a good successor takes it next.
        wait_resumed(&q);
        assert_eq!(q.resumes.load(Ordering::SeqCst), 1);
        assert!(!q.paused.load(Ordering::SeqCst));
        let good = Fake::default();
        assert!(matches!(
            take_over(&path, &good).unwrap(),
            TakeOver::Taken(_)
        ));
    }

    #[test]
    fn a_refused_save_is_reported_to_the_successor() {
        let d = dir("refused");
        let path = d.join("h");
        let (_t, q) = predecessor(
            &path,
            Fake {
                refuse_save: true,
                ..Fake::default()
            },
        );
        let new = Fake::default();
        match take_over(&path, &new) {
            Err(TakeOverError::Refused(why)) => assert!(why.contains("lock"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(new.loaded.lock().unwrap().is_none());
        assert!(!q.paused.load(Ordering::SeqCst));
    }

    #[test]
    fn hostile_garbage_on_the_socket_changes_nothing() {
        let d = dir("garbage");
        let path = d.join("h");
        let (_t, q) = predecessor(
            &path,
            Fake {
                saved: b"s".to_vec(),
                ..Fake::default()
            },
        );
        for junk in [
            &b""[..],
            b"CVFSTAKE",
            b"CVFSTAKE\x02\0\0\0",
            b"GET / HTTP/1.0\r\n\r\n",
        ] {
            let mut s = UnixStream::connect(&path).unwrap();
            s.write_all(junk).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            assert!(rest.is_empty(), "{junk:?} got {rest:?}");
        }
        assert!(!q.paused.load(Ordering::SeqCst));
        // A successor that takes the state and then vanishes without answering.
        let mut s = UnixStream::connect(&path).unwrap();
        let mut hello = HELLO.to_vec();
        hello.extend_from_slice(&VERSION.to_le_bytes());
        s.write_all(&hello).unwrap();
        let mut head = [0u8; 17];
        s.read_exact(&mut head).unwrap();
        drop(s);
        wait_resumed(&q);
        assert!(
            !q.paused.load(Ordering::SeqCst),
            "resumed after the successor vanished"
        );
        let good = Fake::default();
        assert!(matches!(
            take_over(&path, &good).unwrap(),
            TakeOver::Taken(_)
        ));
    }

    /// A planted "predecessor": accepts one successor on `listener`, and if it says hello,
    /// hands it the state b"forged" and reads its answer. What it received.
    fn planted(listener: UnixListener) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let Ok((mut s, _)) = listener.accept() else {
                return Vec::new();
            };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut hello = [0u8; 12];
            if s.read_exact(&mut hello).is_err() {
                return Vec::new();
            }
            let mut msg = GIVE.to_vec();
            msg.push(STATUS_STATE);
            msg.extend_from_slice(&6u64.to_le_bytes());
            msg.extend_from_slice(b"forged");
            let _ = s.write_all(&msg);
            let mut answer = [0u8; 1];
            let _ = s.read_exact(&mut answer);
            hello.to_vec()
        })
    }

    /// Finding 9 of the security review: a socket planted at PATH in a directory another user
    /// can write (a stale path in /tmp) feeds the successor a state. The successor refuses to
    /// talk to it: the directory must be writable by this user (and root) only.
    #[test]
    fn hostile_a_socket_in_a_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        for mode in [0o777, 0o1777, 0o775] {
            let d = dir(&format!("open{mode:o}"));
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
            let path = d.join("h");
            let fake = planted(UnixListener::bind(&path).unwrap());
            let new = Fake::default();
            let r = take_over(&path, &new);
            println!("mode {mode:o}: {r:?}");
            assert!(
                !matches!(r, Ok(TakeOver::Taken(_))),
                "mode {mode:o}: a session was taken from a planted socket"
            );
            assert!(new.loaded.lock().unwrap().is_none());
            // Nothing was said to it (it gives up once the successor hangs up).
            drop(UnixStream::connect(&path));
            let said = fake.join().unwrap();
            assert!(
                said.is_empty(),
                "mode {mode:o}: the successor spoke: {said:?}"
            );
            assert!(
                matches!(r, Err(TakeOverError::UnsafeDirectory { .. })),
                "{r:?}"
            );
            let shown = r.unwrap_err().to_string();
            assert!(
                shown.contains("writable") && shown.contains("--handover"),
                "{shown}"
            );
        }
        // A private directory (this user's, 0755) is fine: nobody there is a fresh start.
        let d = dir("private");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(
            take_over(&d.join("h"), &Fake::default()),
            Ok(TakeOver::Nobody)
        ));
        // A directory of another user (only root can make one here).
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            let d = dir("theirs");
            std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
            let r = take_over(&d.join("h"), &Fake::default());
            assert!(
                matches!(&r, Err(TakeOverError::UnsafeDirectory { why, .. }) if why.contains("65534")),
                "{r:?}"
            );
        } else {
            println!("not root: the other user's directory is not tried");
        }
    }

    /// The process listening at PATH must run as this user: a listener of another user
    /// (here uid 65534, which bound its socket elsewhere; root moved it into a private
    /// directory) is refused before a byte is sent. Needs root (to run as another user) and
    /// /usr/bin/python3 (the other user's listener).
    #[test]
    fn hostile_a_listener_of_another_user_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 || !Path::new("/usr/bin/python3").exists() {
            println!("needs root and /usr/bin/python3: not tried");
            return;
        }
        let theirs = dir("listener-theirs");
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).unwrap();
        let planted = theirs.join("sock");
        // Listens, says READY, then hands whoever connects a forged state, and prints how
        // many bytes it received.
        let script = format!(
            "import socket,struct,sys\n\
             s=socket.socket(socket.AF_UNIX);s.bind({planted:?});s.listen(1)\n\
             print('READY',flush=True)\n\
             c,_=s.accept();c.settimeout(5)\n\
             got=b''\n\
             try:\n\
             \x20got=c.recv(12)\n\
             \x20if got: c.sendall(b'CVFSGIVE\\x00'+struct.pack('<Q',6)+b'forged');c.recv(1)\n\
             except Exception: pass\n\
             print('RECEIVED',len(got),flush=True)\n"
        );
        let mut child = std::process::Command::new("/usr/bin/python3")
            .args(["-c", &script])
            .uid(65534)
            .gid(65534)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut ready = [0u8; 6];
        out.read_exact(&mut ready).unwrap();
        assert_eq!(&ready, b"READY\n");
        let ours = dir("listener-ours");
        std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = ours.join("h");
        std::fs::rename(&planted, &path).unwrap();
        let new = Fake::default();
        let r = take_over(&path, &new);
        println!("{r:?}");
        assert!(
            !matches!(r, Ok(TakeOver::Taken(_))),
            "a session was taken from another user's listener"
        );
        assert!(new.loaded.lock().unwrap().is_none());
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        let _ = child.wait();
        assert_eq!(rest.trim(), "RECEIVED 0", "the successor spoke to it");
        assert!(
            matches!(
                r,
                Err(TakeOverError::OtherUser {
                    uid: 65534,
                    euid: 0,
                    ..
                })
            ),
            "{r:?}"
        );
    }
}
