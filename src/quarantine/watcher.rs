//! The watcher thread that keeps a daemon's view of the quarantine state current, on its own
//! libcephfs mount, and the watchdog that denies every domain while it stalls.

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ceph_client::{CephError, Inode, Mount, UserPerm};

use super::*;

/// Keeps a daemon's [`Gate`] current; stops (and unmounts) when dropped.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    watchdog: Option<std::thread::JoinHandle<()>>,
}

/// Fail closed when the watcher stalls: no round finished within the propagation bound (an
/// MDS that does not answer, a hung mount) leaves flags that may be stale, so every domain is
/// denied until a round finishes again (at most twice the bound after the last one). Runs on its
/// own thread, touching no Ceph call, so it cannot hang with the watcher.
pub fn watchdog(
    gate: Arc<Gate>,
    cfg: QuarantineConfig,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let every = cfg.poll_interval();
    // A round normally finishes every `every` plus its own time; one that has not finished
    // within the bound is stalled (so flags are at most twice the bound old), not merely slow
    // on a loaded host.
    let stalled = cfg.propagation.max(every * 4);
    std::thread::Builder::new()
        .name("quarantine-watchdog".into())
        .spawn(move || {
            let mut logged = false;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(every);
                if gate.since_round() > stalled {
                    if !logged {
                        tracing::error!(
                            stalled_ms =
                                u64::try_from(gate.since_round().as_millis()).unwrap_or(u64::MAX),
                            "quarantine: the watcher has not finished a round within the \
                             propagation bound (is the MDS answering?); every quarantine-capable \
                             directory is denied (fail closed) until it does"
                        );
                        logged = true;
                    }
                    gate.fail_closed(&cfg);
                } else if logged {
                    tracing::info!("quarantine: the watcher is reading the state again");
                    logged = false;
                }
            }
        })
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").finish_non_exhaustive()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.watchdog.take() {
            let _ = t.join();
        }
        if let Some(t) = self.thread.take() {
            // The thread sleeps at most one poll interval before it sees the flag.
            let _ = t.join();
        }
    }
}

struct Scanner {
    access: CephAccess,
    cfg: QuarantineConfig,
    gate: Arc<Gate>,
    mount: Option<Mount>,
    perm: UserPerm,
    /// Resolved domain roots by path.
    roots: HashMap<String, Inode>,
    states: BTreeMap<u32, State>,
    /// Directory listings of /volumes and the groups, by inode number.
    listings: HashMap<u64, Listing>,
    mount_error_logged: bool,
    discovery_error_logged: bool,
    /// Discovered directories no domain was left for, and the inode registered for each
    /// (denied as [`UNSURE`], see `scan`).
    overflow: HashMap<String, u64>,
    /// Rounds in a row each retirable domain's path was missing (see `retire_gone`).
    missing: HashMap<u32, u32>,
    /// Root inodes no longer at their domain's path, (inode, domain): removed from the root
    /// table after every domain was read, so that a directory renamed from one domain's path
    /// to another's is registered under the new one before it leaves the old one (never a
    /// moment with no domain).
    unhook: Vec<(u64, u32)>,
    /// A read of this round answered ESHUTDOWN: the watcher's session was evicted, and a new
    /// one is mounted next round (what could not be read stays denied meanwhile).
    session_lost: bool,
    /// The directory the watcher mounts ([`watch_base`]); paths are resolved from it.
    base: String,
}

/// A path outside the watcher's mount (never: its base holds every path it reads).
fn outside_base() -> CephError {
    CephError::new("path outside the quarantine watcher's mount", libc::EACCES)
}

impl Scanner {
    /// Resolve a canonical CephFS path on the watcher's mount of [`Scanner::base`].
    fn resolve(&self, mount: &Mount, path: &str) -> Result<Inode, CephError> {
        resolve(
            mount,
            relative_to(path, &self.base).ok_or_else(outside_base)?,
            &self.perm,
        )
    }

    fn log_state(&self, domain: u32, path: &str, old: Option<State>, new: State) {
        if old == Some(new) {
            return;
        }
        match new {
            State::Quarantined => tracing::info!(path, domain, "quarantine: directory quarantined"),
            State::Released if old.is_some() && old != Some(State::Unknown) => {
                tracing::info!(path, domain, "quarantine: directory released")
            }
            State::Unreadable => tracing::error!(
                path,
                domain,
                "quarantine: cannot read the quarantine state; access denied (fail closed) until \
                 it can be read: check that this client may read xattrs of that directory"
            ),
            _ => {}
        }
    }

    /// Whether domain `d` (path `path`) may be retired when its directory is gone: only a
    /// discovered one, never a configured path or the export's own domain.
    fn retirable(&self, d: u32, path: &str) -> bool {
        d != self.gate.root_domain()
            && !self
                .cfg
                .paths
                .iter()
                .chain(self.cfg.recovery_paths.iter())
                .any(|p| p == path)
    }

    /// One round: (re)mount if needed, discover subvolumes, read every domain's state, retire
    /// the domains whose directory is gone, publish.
    fn scan(&mut self) {
        let Some(mount) = self.mounted() else {
            return;
        };
        let found = self.discover(&mount);
        let settled = self.track_overflow(&mount, found.as_deref());
        self.forget_removed_overflow(&mount, found.as_deref());
        let paths = self.gate.paths_now();
        let states = self.read_domains(&mount, &paths);
        for ino in settled {
            self.gate.unregister_root(ino, UNSURE);
        }
        for (ino, d) in std::mem::take(&mut self.unhook) {
            self.gate.unregister_root(ino, d);
        }
        self.retire_gone(&paths);
        self.gate
            .publish_for(&paths, &effective(&paths, &states, &self.cfg));
        // While anything is denied, a directory another client renamed into or out of a
        // denied domain must not keep the domain it had: nodes derive theirs again (from their
        // real ancestry) once per round.
        if self.gate.any_denied() {
            self.gate.invalidate();
        }
        self.gate.round_done();
        self.drop_evicted_session();
    }

    /// The watcher's mount, mounted first if it is not: none (every domain published
    /// unreadable) when that fails.
    fn mounted(&mut self) -> Option<Mount> {
        if self.mount.is_none() {
            match self.access.mount(&self.base) {
                Ok(m) => {
                    self.mount = Some(m);
                    if self.mount_error_logged {
                        tracing::info!("quarantine: watcher mounted CephFS, reading state");
                    }
                    self.mount_error_logged = false;
                }
                Err(e) => {
                    if !self.mount_error_logged {
                        tracing::error!(
                            error = %e,
                            base = %self.base,
                            id = %self.access.cephx_name(),
                            "quarantine: the watcher cannot mount CephFS, so quarantine state \
                             cannot be read; access to quarantine-capable directories is denied \
                             (fail closed): give the id read access to that directory (`ceph auth \
                             caps <id> mon 'allow r' mds 'allow r path=<base>'`; a watcher id of \
                             its own: --quarantine-client-id), or run with --quarantine off"
                        );
                        self.mount_error_logged = true;
                    }
                    self.publish_all(State::Unreadable);
                    return None;
                }
            }
        }
        self.mount.clone()
    }

    /// Give the discovered directories (`found`) no domain was left for an [`UNSURE`] root
    /// entry, so they are denied. Those that got a domain since are the overflow entries
    /// returned: they go once the domain's root is registered.
    fn track_overflow(&mut self, mount: &Mount, found: Option<&[String]>) -> Vec<u64> {
        // Overflow directories that got a domain: their UNSURE entry goes once the domain's
        // root is registered (after [`Scanner::read_domains`]), so there is no moment at which the directory has none.
        let mut settled = Vec::new();
        for p in found.into_iter().flatten() {
            if self.gate.domain_for_path(p).is_some() {
                if let Some(ino) = self.overflow.remove(p) {
                    tracing::info!(path = %p, "quarantine: a domain id is free again; this directory is tracked now");
                    settled.push(ino);
                }
                continue;
            }
            // No domain left: its state cannot be followed, so it is denied (fail closed).
            // A daemon's own export is registered first, so only directories discovered
            // later, which a tenant's daemon cannot reach, can be left without one.
            let Ok(Ok(v)) = self.resolve(mount, p).map(|i| i.vino()) else {
                continue;
            };
            let old = self.overflow.get(p).copied();
            if old == Some(v.ino) || !self.gate.register_root(v.ino, UNSURE) {
                continue;
            }
            match old {
                // Re-created: the new directory is denied before the old entry goes.
                Some(o) => {
                    self.gate.unregister_root(o, UNSURE);
                }
                None => {
                    tracing::error!(path = %p, "quarantine: more than {MAX_DOMAINS} quarantine-capable directories exist at once; this one is denied to this daemon's guest (fail closed) until one is removed (a removed subvolume's domain is retired {RETIRE_AFTER} rounds later): remove unused subvolumes")
                }
            }
            self.overflow.insert(p.clone(), v.ino);
        }
        settled
    }

    /// The overflow directories no longer discovered and removed meanwhile leave the root
    /// table.
    fn forget_removed_overflow(&mut self, mount: &Mount, found: Option<&[String]>) {
        if let Some(found) = found {
            let found: std::collections::HashSet<&String> = found.iter().collect();
            let gone: Vec<String> = self
                .overflow
                .keys()
                .filter(|p| !found.contains(p))
                .cloned()
                .collect();
            for p in gone {
                if matches!(self.resolve(mount, &p), Err(e) if e.errno() == libc::ENOENT) {
                    if let Some(ino) = self.overflow.remove(&p) {
                        self.gate.unregister_root(ino, UNSURE);
                    }
                }
            }
        }
    }

    /// Read the state of every domain of `paths` (index = domain id - 1), logging changes.
    fn read_domains(&mut self, mount: &Mount, paths: &[Option<String>]) -> Vec<State> {
        let mut states = Vec::with_capacity(paths.len());
        let mut parents = Parents::new();
        for (i, p) in paths.iter().enumerate() {
            let Ok(d) = u32::try_from(i + 1) else { break };
            let Some(p) = p else {
                states.push(State::Unknown);
                continue;
            };
            let s = self.read_domain(mount, d, p, &mut parents);
            let old = self.states.insert(d, s);
            self.log_state(d, p, old, s);
            states.push(s);
        }
        states
    }

    /// After a round whose reads found the session evicted: drop it, so that the next round
    /// mounts a new one.
    fn drop_evicted_session(&mut self) {
        if std::mem::take(&mut self.session_lost) {
            // Evicted (blocklisted): every call of this session fails from now on. Drop it;
            // the next round mounts a new one. Until then the unread domains stay denied.
            tracing::warn!("quarantine: the watcher's CephFS session was evicted; mounting a new one (quarantine-capable directories stay denied until their state is read again)");
            self.roots.clear();
            self.listings.clear();
            if let Some(m) = self.mount.take() {
                if let Err(e) = m.abort_conn(std::time::Duration::from_secs(5)) {
                    tracing::warn!(error = %e, "quarantine: aborting the evicted session");
                }
            }
        }
    }

    /// Retire the domains whose directory has been missing for [`RETIRE_AFTER`] rounds.
    /// `paths` is what this round read (index = domain id - 1).
    fn retire_gone(&mut self, paths: &[Option<String>]) {
        let gone: Vec<u32> = self
            .missing
            .iter()
            .filter(|(_, n)| **n >= RETIRE_AFTER)
            .map(|(d, _)| *d)
            .collect();
        for d in gone {
            self.missing.remove(&d);
            let Some(Some(p)) = usize::try_from(d)
                .ok()
                .and_then(|d| d.checked_sub(1))
                .and_then(|i| paths.get(i))
            else {
                continue;
            };
            if self.retirable(d, p) && self.gate.retire(d) {
                self.states.remove(&d);
                tracing::info!(path = %p, domain = d, "quarantine: directory removed; its domain is retired and its id free for reuse");
            }
        }
    }

    fn publish_all(&mut self, s: State) {
        let paths = self.gate.paths_now();
        let states = vec![s; paths.len()];
        self.gate
            .publish_for(&paths, &effective(&paths, &states, &self.cfg));
    }

    /// Read one domain's state. The path is resolved again every round (each step answered
    /// from the client's cache unless another client changed that directory): a domain is
    /// its path, so a directory created, removed and re-created under it after the daemon
    /// started is registered as the domain's root as soon as it is there (and the directory
    /// that was there before leaves the root table), and nodes already below it derive their
    /// domain again ([`Gate::register_root`]). A discovered domain missing in
    /// [`RETIRE_AFTER`] rounds in a row is retired (see `retire_gone`).
    fn read_domain(&mut self, mount: &Mount, d: u32, path: &str, parents: &mut Parents) -> State {
        let inode = match relative_to(path, &self.base)
            .ok_or_else(outside_base)
            .and_then(|rel| resolve_in_round(mount, rel, &self.perm, parents))
        {
            Ok(i) => i,
            // Nothing there: nothing to protect (until it appears: next round).
            Err(e) if e.errno() == libc::ENOENT => {
                if let Some(Ok(old)) = self.roots.remove(path).map(|i| i.vino()) {
                    self.unhook.push((old.ino, d));
                }
                if self.retirable(d, path) {
                    *self.missing.entry(d).or_insert(0) += 1;
                }
                return State::Released;
            }
            Err(e) => {
                self.missing.remove(&d);
                self.session_lost |= e.errno() == libc::ESHUTDOWN;
                tracing::debug!(path, error = %e, "quarantine: resolve");
                return State::Unreadable;
            }
        };
        self.missing.remove(&d);
        let ino = match inode.vino() {
            Ok(v) => v.ino,
            Err(e) => {
                tracing::debug!(path, error = %e, "quarantine: resolve");
                return State::Unreadable;
            }
        };
        let known = self
            .roots
            .get(path)
            .and_then(|i| i.vino().ok())
            .map(|v| v.ino);
        if known != Some(ino) {
            if !self.gate.register_root(ino, d) {
                tracing::error!(path, domain = d, "quarantine: the table of domain roots is full; this directory is denied (fail closed)");
                return State::Unreadable;
            }
            if let Some(old) = known {
                tracing::info!(path, domain = d, "quarantine: directory re-created");
                self.unhook.push((old, d));
            }
        }
        let state = match read_state(mount, &inode, &self.perm) {
            Ok(true) => State::Quarantined,
            Ok(false) => State::Released,
            Err(e) => {
                self.session_lost |= e.errno() == libc::ESHUTDOWN;
                tracing::debug!(path, error = %e, "quarantine: getxattr");
                State::Unreadable
            }
        };
        self.roots.insert(path.to_owned(), inode);
        state
    }

    /// `/volumes/<group>/<subvolume>` directories that exist now; `None` if they cannot be
    /// listed.
    fn discover(&mut self, mount: &Mount) -> Option<Vec<String>> {
        let r = (|| -> Result<(Vec<String>, Vec<u64>), CephError> {
            let vol = match self.resolve(mount, VOLUMES) {
                Ok(v) => v,
                Err(e) if e.errno() == libc::ENOENT => return Ok((Vec::new(), Vec::new())),
                Err(e) => return Err(e),
            };
            let mut out = Vec::new();
            // The directories listed, whose cached listings are kept.
            let mut listed: Vec<u64> = vol.vino().map(|v| v.ino).into_iter().collect();
            let listings = &mut self.listings;
            for g in subdirs_cached(mount, &vol, &self.perm, listings)? {
                if !is_group_name(&g) {
                    continue;
                }
                let Ok(gname) = CString::new(g.clone()) else {
                    continue;
                };
                let gdir = match mount.lookup(&vol, &gname, 0, 0, &self.perm) {
                    Ok((i, _)) => i,
                    Err(e) if e.errno() == libc::ENOENT => continue,
                    Err(e) => return Err(e),
                };
                listed.extend(gdir.vino().map(|v| v.ino));
                for s in subdirs_cached(mount, &gdir, &self.perm, listings)? {
                    if is_subvolume_name(&s) {
                        out.push(format!(
                            "{VOLUMES}/{}/{}",
                            String::from_utf8_lossy(&g),
                            String::from_utf8_lossy(&s)
                        ));
                    }
                }
            }
            Ok((out, listed))
        })();
        match r {
            Ok((v, listed)) => {
                self.discovery_error_logged = false;
                // Listings of removed groups go.
                self.listings.retain(|ino, _| listed.contains(ino));
                Some(v)
            }
            Err(e) => {
                if !self.discovery_error_logged {
                    tracing::warn!(error = %e, "quarantine: cannot list {VOLUMES}; new subvolumes are not discovered (configured paths are still enforced)");
                    self.discovery_error_logged = true;
                }
                None
            }
        }
    }
}

/// The parent directories resolved in one round, by path (or the errno of their walk).
type Parents = HashMap<String, Result<Inode, i32>>;

/// [`resolve`], with the walk to the parent shared by the round: the subvolumes of one group
/// then cost one lookup each instead of a walk from the root (with 4,000 subvolumes the
/// walks were most of a round's work). Every path is still resolved again each round.
fn resolve_in_round(
    mount: &Mount,
    path: &str,
    perm: &UserPerm,
    parents: &mut Parents,
) -> Result<Inode, CephError> {
    let Some((parent, name)) = path
        .rsplit_once('/')
        .filter(|(p, n)| !p.is_empty() && !n.is_empty())
    else {
        return resolve(mount, path, perm);
    };
    let dir = parents
        .entry(parent.to_owned())
        .or_insert_with(|| resolve(mount, parent, perm).map_err(|e| e.errno()));
    let dir = dir
        .as_ref()
        .map_err(|&errno| CephError::new("lookup of a parent directory", errno))?;
    let name = CString::new(name).map_err(|_| CephError::new("path component", libc::EINVAL))?;
    Ok(mount.lookup(dir, &name, 0, 0, perm)?.0)
}

/// The first round, before the daemon serves. It can wait on the MDS for as long as the MDS
/// session timeout: a killed daemon's watcher that was the only client of /volumes held its
/// exclusive caps, and listing the directory needs them back. The operator is told after a few
/// seconds rather than left looking at a daemon that does not listen.
fn first_scan(s: &mut Scanner) {
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let notice = std::thread::Builder::new()
        .name("quarantine-first-round".into())
        .spawn(move || {
            if wait.recv_timeout(FIRST_ROUND_NOTICE)
                == Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            {
                tracing::warn!(
                    waited_s = FIRST_ROUND_NOTICE.as_secs(),
                    "quarantine: the first read of the quarantine state is waiting on the MDS; \
                     the daemon listens once it is done. A killed daemon's session holding caps \
                     on /volumes is released when the MDS times it out (the file system's \
                     session_timeout) or when it is evicted; start daemons with --instance-id \
                     so a restart ends its predecessor's sessions at once"
                );
            }
        });
    s.scan();
    drop(done);
    if let Ok(t) = notice {
        let _ = t.join();
    }
}

/// How long the first round runs before the operator is told it is waiting.
const FIRST_ROUND_NOTICE: Duration = Duration::from_secs(5);

/// Start quarantine enforcement for a daemon exporting `export_root`: allocate the gate, read
/// the state once (so the daemon starts with it), then keep it current in a thread.
pub fn start(
    access: CephAccess,
    cfg: QuarantineConfig,
    export_root: &str,
) -> std::io::Result<(Arc<Gate>, Watcher)> {
    // `--ceph-root /volumes//_nogroup/sv1/` is the subvolume's inside as much as the
    // canonical spelling: the cover is decided on the canonical path. A path that has none
    // ("..") cannot be placed, so it is refused rather than left in domain 0.
    let export_root = normalize(export_root).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "quarantine: the exported path {export_root:?} is not an absolute CephFS path \
                 without \"..\": give --ceph-root as /dir/sub"
            ),
        )
    })?;
    let export_root = export_root.as_str();
    let gate = Arc::new(Gate::new());
    gate.set_export_root(export_root);
    for p in cfg.paths.iter().chain(cfg.recovery_paths.iter()) {
        gate.domain_for_path(p);
    }
    if let Some(c) = cover_of(export_root, &cfg) {
        if let Some(d) = gate.domain_for_path(&c) {
            gate.root_domain.store(d, Ordering::Relaxed);
        }
    }
    let interval = cfg.poll_interval();
    let base = watch_base(&cfg);
    let mut s = Scanner {
        access,
        cfg,
        gate: gate.clone(),
        mount: None,
        perm: UserPerm::root(),
        roots: HashMap::new(),
        states: BTreeMap::new(),
        listings: HashMap::new(),
        mount_error_logged: false,
        discovery_error_logged: false,
        overflow: HashMap::new(),
        missing: HashMap::new(),
        unhook: Vec::new(),
        session_lost: false,
        base,
    };
    first_scan(&mut s);
    tracing::info!(
        domains = gate.domain_count(),
        denied = gate.denied_count.load(Ordering::Relaxed),
        root_domain = gate.root_domain(),
        "quarantine: enforcing"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let dog = watchdog(gate.clone(), s.cfg.clone(), stop.clone())?;
    let thread = std::thread::Builder::new()
        .name("quarantine".into())
        .spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                std::thread::sleep(interval);
                s.scan();
            }
            // Dropping `s` releases the inode references and then the mount.
            s.roots.clear();
            if let Some(m) = s.mount.take() {
                // Nothing is in flight: this thread is the mount's only user.
                let _ = m.shutdown(std::time::Duration::ZERO);
            }
        })?;
    Ok((
        gate,
        Watcher {
            stop,
            thread: Some(thread),
            watchdog: Some(dog),
        },
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn cfg() -> QuarantineConfig {
        QuarantineConfig::default()
    }

    #[test]
    fn hostile_stalled_watcher_fails_closed() {
        let g = Arc::new(Gate::new());
        let d = g.domain_for_path("/volumes/_nogroup/sv1").unwrap();
        g.publish(&[false]);
        g.round_done();
        assert!(!g.denied(d));
        let cfg = QuarantineConfig {
            propagation: Duration::from_millis(200),
            ..cfg()
        };
        // No watcher finishes a round from now on (a stalled scan).
        let stop = Arc::new(AtomicBool::new(false));
        let dog = watchdog(g.clone(), cfg, stop.clone()).unwrap();
        let t = Instant::now();
        while !g.denied(d) && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(g.denied(d), "a stalled watcher leaves the domain open");
        println!("denied {} ms after the last round", t.elapsed().as_millis());
        // A finished round opens it again (the watcher publishes the real flags).
        g.round_done();
        g.publish(&[false]);
        assert!(!g.denied(d));
        stop.store(true, Ordering::Relaxed);
        dog.join().unwrap();
    }
}
