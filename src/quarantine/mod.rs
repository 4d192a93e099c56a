//! Subvolume quarantine, enforced by the daemon on behalf of its guests (issue 5).
//!
//! Pacific's MDS knows nothing of quarantine, so every daemon enforces it itself. This module
//! holds the state mechanism, the watcher that keeps each daemon's view current, the O(1) gate
//! the filesystem asks on every request, and the operator command.
//!
//! # Where the state lives, and why
//! A reserved xattr [`STATE_XATTR`] (`trusted.ceph-virtiofsd.quarantine`) on the quarantined
//! directory itself: value `1` = quarantined; absent = released. It lives in the cluster (the
//! MDS journals it with the inode), so every daemon on every host reads the same state, it
//! survives daemon and cluster restarts, and a new daemon starts with it. Guests can neither see
//! nor change it: `fs::names` hides the whole `trusted.ceph-virtiofsd.` prefix from
//! get/set/list/removexattr. A RADOS object with watch/notify was not chosen: it needs librados
//! and pool caps on top of the CephFS caps every daemon already has, and a second source of truth
//! that can disagree with the tree (a renamed subvolume keeps its xattr; an object keyed by path
//! would not follow it).
//!
//! # Quarantine-capable directories (domains)
//! - mgr subvolumes: Pacific's `ceph.dir.subvolume` is set by mgr/volumes but cannot be read
//!   back (getxattr gives ENODATA on 16.2.15, measured), so subvolumes are found by mgr's
//!   layout: every directory `/volumes/<group>/<name>` where `<group>` is `_nogroup` or a group
//!   name (mgr's internal `_deleting`, `_index`, `_legacy` and `*.meta` entries are skipped).
//! - explicitly configured paths (`--quarantine-path PATH`), and the recovery paths.
//!
//! Each such directory is a *domain*, numbered 1.. for the life of the daemon (0 = none).
//! Domains nest by path: a domain inside a denied domain is denied too, unless exempt.
//!
//! # Hot path
//! A node's domain is derived when it is entered: the parent's domain, or a new one when the
//! looked-up directory is a domain root ([`Gate::domain_of_root`]: an open-addressed table of
//! atomics keyed by inode number, no lock), stamped with the gate's [`Gate::generation`]. Every
//! request compares the node's stamp with the generation (one atomic load each) and asks
//! [`Gate::denied`]: one relaxed atomic load of the domain's effective flag, skipped altogether
//! for domain 0. No MDS request, no lock, O(1). Open handles ask their node, so READ/WRITE on a
//! handle opened before the quarantine are denied as well.
//!
//! # Domains follow the tree, not the first lookup
//! The generation changes when a domain root is registered or re-registered (a directory
//! created or re-created at a domain's path after nodes below it were entered), when a flag
//! flips, and after every watcher round while any domain is denied (another client may have
//! renamed a directory into or out of it). A node whose stamp is older derives its domain again
//! at its next request, up the chain of directories it was found through, each link confirmed by
//! a lookup of its name (`fs`). A chain that does not hold, or a file with more links while a
//! domain near the export is denied, gives [`UNSURE`], which is always denied (fail closed).
//!
//! # Propagation
//! A watcher thread per daemon, on its own libcephfs mount of `/`, re-reads the xattr of every
//! known domain root every `propagation / 4` and republishes the flags; a getxattr is answered
//! from libcephfs's cache while it holds the inode's Xs cap, and the MDS revokes that cap when
//! another client changes an xattr, so an unchanged state costs no MDS request. Subvolume
//! discovery re-reads `/volumes` and the group directories each round (answered from the
//! client's complete-directory cache while it holds Fs). Entry/attr TTLs of nodes in any domain
//! are capped at `propagation / 2` (`fs::policy`), so a guest's cached dentries and attributes
//! expire within `propagation / 4 + propagation / 2 + one scan`.
//!
//! # Failing closed
//! Every domain starts denied until its state was read. A state that cannot be read (the
//! watcher cannot mount, getxattr fails with anything but ENODATA) keeps or makes the domain
//! denied and logs why. A watcher that does not finish a round within the bound (a hung MDS
//! request) has every domain denied by [`watchdog`] until it does. Releasing takes effect on
//! the next round, without remount.
//!
//! # Recovery roles
//! `--quarantine-recovery global` exempts every domain; `--quarantine-recovery-path PATH`
//! exempts the domains at or below PATH (and PATH itself is a domain, so a recovery daemon
//! exporting it keeps access while its enclosing subvolume is quarantined).
//!
//! # Audit
//! Each denied operation logs one warn line (domain path, op, uid), at most
//! [`AUDIT_PER_SEC`] per second; the rest are counted and reported in the next line.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ceph_client::{CephError, Inode, Mount, UserPerm};

/// The reserved xattr holding a directory's quarantine state.
pub const STATE_XATTR: &CStr = c"trusted.ceph-virtiofsd.quarantine";
/// Value meaning "quarantined".
pub const QUARANTINED: &[u8] = b"1";
/// Where mgr/volumes keeps subvolumes.
pub const VOLUMES: &str = "/volumes";
/// Most domains one daemon tracks.
pub const MAX_DOMAINS: usize = 4096;
/// Slots of the inode → domain table (power of two, at most half full).
const ROOT_SLOTS: usize = 2 * MAX_DOMAINS * 2;
/// Audit lines per second; further denials are counted.
pub const AUDIT_PER_SEC: u32 = 20;
/// Default propagation bound.
pub const DEFAULT_PROPAGATION: Duration = Duration::from_secs(1);
/// The domain of a node whose ancestry could not be established (walk failed, too deep, or
/// it lies outside the export): always denied (fail closed).
pub const UNSURE: u32 = u32::MAX;

/// Quarantine settings of one daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantineConfig {
    /// Enforce quarantine at all (default: on).
    pub enabled: bool,
    /// Extra quarantine-capable directories (absolute CephFS paths).
    pub paths: Vec<String>,
    /// This daemon keeps access to every quarantined directory.
    pub recovery_global: bool,
    /// This daemon keeps access to quarantined directories at or below these paths.
    pub recovery_paths: Vec<String>,
    /// A quarantine reaches every guest of this daemon within this time.
    pub propagation: Duration,
}

impl Default for QuarantineConfig {
    fn default() -> Self {
        QuarantineConfig {
            enabled: true,
            paths: Vec::new(),
            recovery_global: false,
            recovery_paths: Vec::new(),
            propagation: DEFAULT_PROPAGATION,
        }
    }
}

impl QuarantineConfig {
    /// How often the watcher re-reads the state.
    pub fn poll_interval(&self) -> Duration {
        (self.propagation / 4).max(Duration::from_millis(10))
    }
    /// Upper bound of entry/attr TTLs of nodes in a domain.
    pub fn ttl_bound(&self) -> Duration {
        self.propagation / 2
    }
}

// ---- pure path logic ------------------------------------------------------------------------

/// A CephFS path in canonical form ("/a/b", no trailing slash, no empty, "." or ".." parts), or
/// `None` if it is not absolute or contains "..".
pub fn normalize(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut out = String::new();
    for c in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            return None;
        }
        out.push('/');
        out.push_str(c);
    }
    if out.is_empty() {
        out.push('/');
    }
    Some(out)
}

/// `path` is `ancestor` or below it (both canonical).
pub fn is_at_or_below(path: &str, ancestor: &str) -> bool {
    ancestor == "/"
        || path == ancestor
        || (path.starts_with(ancestor) && path.as_bytes().get(ancestor.len()) == Some(&b'/'))
}

/// Whether a `/volumes` entry is a subvolume group (or `_nogroup`), not mgr's bookkeeping.
pub fn is_group_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name != b"."
        && name != b".."
        && !name.ends_with(b".meta")
        && (name == b"_nogroup" || !name.starts_with(b"_"))
}

/// Whether an entry of a group directory is a subvolume.
pub fn is_subvolume_name(name: &[u8]) -> bool {
    !name.is_empty() && !name.starts_with(b".") && !name.starts_with(b"_")
}

/// The subvolume root (`/volumes/<group>/<name>`) a canonical path lies in, if any.
pub fn subvolume_of(path: &str) -> Option<String> {
    let mut parts = path.split('/').skip(1);
    let (v, g, s) = (parts.next()?, parts.next()?, parts.next()?);
    (v == &VOLUMES[1..] && is_group_name(g.as_bytes()) && is_subvolume_name(s.as_bytes()))
        .then(|| format!("{VOLUMES}/{g}/{s}"))
}

/// The deepest quarantine-capable directory at or above `export_root`: the domain of the
/// export's root node.
pub fn cover_of(export_root: &str, cfg: &QuarantineConfig) -> Option<String> {
    cfg.paths
        .iter()
        .chain(cfg.recovery_paths.iter())
        .filter(|p| is_at_or_below(export_root, p))
        .cloned()
        .chain(subvolume_of(export_root))
        .max_by_key(|p| p.len())
}

/// What the watcher last learnt about one domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Not read yet: denied (fail closed).
    Unknown,
    /// Read: not quarantined (or the directory does not exist).
    Released,
    /// Read: quarantined.
    Quarantined,
    /// Could not be read: denied (fail closed).
    Unreadable,
}

impl State {
    fn denies(self) -> bool {
        !matches!(self, State::Released)
    }
}

/// Effective deny flags: a domain is denied when it or an enclosing domain denies, unless this
/// daemon is a recovery client for it. `paths[i]`/`states[i]` describe domain `i + 1`.
pub fn effective(paths: &[String], states: &[State], cfg: &QuarantineConfig) -> Vec<bool> {
    paths
        .iter()
        .map(|p| {
            if cfg.recovery_global || cfg.recovery_paths.iter().any(|r| is_at_or_below(p, r)) {
                return false;
            }
            paths
                .iter()
                .zip(states)
                .any(|(q, s)| is_at_or_below(p, q) && s.denies())
        })
        .collect()
}

// ---- the gate ------------------------------------------------------------------------------

/// What the filesystem asks on every request. Written by the watcher only.
pub struct Gate {
    /// Effective deny flag per domain; index = domain id (0 unused, never denied).
    deny: Box<[AtomicBool]>,
    /// Inode number → domain, open addressing; key 0 = empty. A value is written before its key
    /// (release), so a reader that sees the key (acquire) sees the value.
    keys: Box<[AtomicU64]>,
    vals: Box<[AtomicU32]>,
    /// Domains currently denied (rename checks its entries only when this is non-zero).
    denied_count: AtomicUsize,
    /// Domain paths, index = domain id - 1 (cold paths only: registration, audit).
    paths: RwLock<Vec<String>>,
    /// The export root's domain (0 = none).
    root_domain: AtomicU32,
    /// The export root (canonical path).
    export_root: RwLock<String>,
    /// Some domain at, above or below the export root is denied: the only ones a file of the
    /// export can have another link in.
    near_denied: AtomicBool,
    /// Changes whenever what decides a node's domain may have changed: a domain root
    /// registered or moved, a deny flag flipped, and every watcher round while any domain is
    /// denied (another client may have renamed a directory into or out of it). Nodes remember
    /// the generation their domain was derived at and derive it again when it differs.
    generation: AtomicU32,
    /// When the watcher last finished a round, in ms since `epoch` (see [`watchdog`]).
    last_round: AtomicU64,
    epoch: Instant,
    audit: Mutex<Audit>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("domains", &self.domain_count())
            .field("denied", &self.denied_count.load(Ordering::Relaxed))
            .finish()
    }
}

#[derive(Debug)]
struct Audit {
    window: Instant,
    lines: u32,
    suppressed: u64,
}

fn slot_of(ino: u64) -> usize {
    let mut z = ino.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    // The mask keeps the index below ROOT_SLOTS (a power of two).
    ((z ^ (z >> 31)) as usize) & (ROOT_SLOTS - 1)
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

impl Gate {
    pub fn new() -> Gate {
        let deny = (0..=MAX_DOMAINS).map(|_| AtomicBool::new(false)).collect();
        let keys = (0..ROOT_SLOTS).map(|_| AtomicU64::new(0)).collect();
        let vals = (0..ROOT_SLOTS).map(|_| AtomicU32::new(0)).collect();
        Gate {
            deny,
            keys,
            vals,
            denied_count: AtomicUsize::new(0),
            paths: RwLock::new(Vec::new()),
            root_domain: AtomicU32::new(0),
            export_root: RwLock::new("/".into()),
            near_denied: AtomicBool::new(false),
            generation: AtomicU32::new(1),
            last_round: AtomicU64::new(0),
            epoch: Instant::now(),
            audit: Mutex::new(Audit {
                window: Instant::now(),
                lines: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether requests on nodes of `domain` are refused. The hot path: one relaxed load.
    #[inline]
    pub fn denied(&self, domain: u32) -> bool {
        domain != 0
            && self
                .deny
                .get(domain as usize)
                .map_or(true, |d| d.load(Ordering::Relaxed))
    }

    /// See the field: the hot path compares it with the generation a node's domain was
    /// derived at (one relaxed load).
    #[inline]
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    /// The watcher finished a round: the flags are current.
    pub fn round_done(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_round.store(ms, Ordering::Release);
    }

    /// Time since the watcher last finished a round.
    pub fn since_round(&self) -> Duration {
        let last = Duration::from_millis(self.last_round.load(Ordering::Acquire));
        self.epoch.elapsed().saturating_sub(last)
    }

    /// Deny every domain this daemon is no recovery client for (the watcher is stalled).
    pub fn fail_closed(&self, cfg: &QuarantineConfig) {
        let paths: Vec<String> = self.paths.read().unwrap_or_else(|e| e.into_inner()).clone();
        let states = vec![State::Unreadable; paths.len()];
        self.publish(&effective(&paths, &states, cfg));
    }

    /// Make every node derive its domain again before its next request.
    pub fn invalidate(&self) {
        // Never 0: a fresh node stamped 0 by a filesystem without a gate must not match.
        let g = self
            .generation
            .fetch_add(1, Ordering::AcqRel)
            .wrapping_add(1);
        if g == 0 {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Whether a domain that a file of the export can have another link in is denied.
    #[inline]
    pub fn near_denied(&self) -> bool {
        self.near_denied.load(Ordering::Relaxed)
    }

    /// Whether any domain is denied now.
    #[inline]
    pub fn any_denied(&self) -> bool {
        self.denied_count.load(Ordering::Relaxed) != 0
    }

    /// The domain whose root directory is inode `ino`, if it is one (lock-free probe).
    #[inline]
    pub fn domain_of_root(&self, ino: u64) -> Option<u32> {
        if ino == 0 {
            return None;
        }
        let mut i = slot_of(ino);
        for _ in 0..ROOT_SLOTS {
            let k = self.keys.get(i)?.load(Ordering::Acquire);
            if k == ino {
                return self.vals.get(i).map(|v| v.load(Ordering::Relaxed));
            }
            if k == 0 {
                return None;
            }
            i = (i + 1) & (ROOT_SLOTS - 1);
        }
        None
    }

    /// The export root's domain.
    pub fn root_domain(&self) -> u32 {
        self.root_domain.load(Ordering::Relaxed)
    }

    pub fn domain_count(&self) -> usize {
        self.paths.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The path of a domain (for logs).
    pub fn path_of(&self, domain: u32) -> String {
        if domain == UNSURE {
            return "<ancestry unknown>".into();
        }
        let paths = self.paths.read().unwrap_or_else(|e| e.into_inner());
        (domain as usize)
            .checked_sub(1)
            .and_then(|i| paths.get(i))
            .cloned()
            .unwrap_or_else(|| format!("<domain {domain}>"))
    }

    /// The domain of a canonical path, allocated (denied until its state is read) if new.
    /// `None` when the table is full.
    pub fn domain_for_path(&self, path: &str) -> Option<u32> {
        let mut paths = self.paths.write().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = paths.iter().position(|p| p == path) {
            return u32::try_from(i + 1).ok();
        }
        if paths.len() >= MAX_DOMAINS {
            return None;
        }
        paths.push(path.to_owned());
        let d = paths.len();
        // Fail closed: a new domain is denied until the watcher has read its state.
        if let Some(flag) = self.deny.get(d) {
            if !flag.swap(true, Ordering::Relaxed) {
                self.denied_count.fetch_add(1, Ordering::Relaxed);
            }
        }
        u32::try_from(d).ok()
    }

    /// Record that directory inode `ino` is the root of `domain`. Writer: the watcher only
    /// (and setup before serving), so two writers never race for one slot.
    pub fn register_root(&self, ino: u64, domain: u32) -> bool {
        if ino == 0 {
            return false;
        }
        let mut i = slot_of(ino);
        for _ in 0..ROOT_SLOTS / 2 {
            let (Some(k), Some(v)) = (self.keys.get(i), self.vals.get(i)) else {
                return false;
            };
            match k.load(Ordering::Acquire) {
                cur if cur == ino => {
                    if v.swap(domain, Ordering::Relaxed) != domain {
                        self.invalidate();
                    }
                    return true;
                }
                0 => {
                    v.store(domain, Ordering::Relaxed);
                    k.store(ino, Ordering::Release);
                    // Nodes below this directory may exist already (looked up before the
                    // directory was created, discovered or re-created): they derive again.
                    self.invalidate();
                    return true;
                }
                _ => i = (i + 1) & (ROOT_SLOTS - 1),
            }
        }
        false
    }

    /// Publish effective flags for domains 1..=flags.len().
    pub fn publish(&self, flags: &[bool]) {
        let mut changed = false;
        for (i, &f) in flags.iter().enumerate() {
            if let Some(d) = self.deny.get(i + 1) {
                let was = d.swap(f, Ordering::Relaxed);
                if was != f {
                    changed = true;
                    if f {
                        self.denied_count.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.denied_count.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
        }
        let near = {
            let export = self.export_root.read().unwrap_or_else(|e| e.into_inner());
            let paths = self.paths.read().unwrap_or_else(|e| e.into_inner());
            paths
                .iter()
                .zip(flags)
                .any(|(p, &f)| f && (is_at_or_below(p, &export) || is_at_or_below(&export, p)))
        };
        if self.near_denied.swap(near, Ordering::Relaxed) != near {
            changed = true;
        }
        if changed {
            self.invalidate();
        }
    }

    /// Log one denied operation (rate-limited).
    pub fn audit(&self, domain: u32, op: &'static str, uid: u32) {
        crate::metrics::quarantine_denied();
        let suppressed = {
            let mut a = self.audit.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if now.duration_since(a.window) >= Duration::from_secs(1) {
                a.window = now;
                a.lines = 0;
            }
            if a.lines >= AUDIT_PER_SEC {
                a.suppressed += 1;
                return;
            }
            a.lines += 1;
            std::mem::take(&mut a.suppressed)
        };
        tracing::warn!(
            domain = %self.path_of(domain),
            op,
            uid,
            suppressed_before = suppressed,
            "quarantine: operation denied"
        );
    }
}

// ---- Ceph access shared by the watcher and the operator command ------------------------------

pub use crate::ceph::CephAccess;

/// Walk a canonical path from the root of `mount`.
pub fn resolve(mount: &Mount, path: &str, perm: &UserPerm) -> Result<Inode, CephError> {
    let mut cur = mount.lookup_root()?;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        let name = CString::new(c).map_err(|_| CephError::new("path component", libc::EINVAL))?;
        cur = mount.lookup(&cur, &name, 0, 0, perm)?.0;
    }
    Ok(cur)
}

/// Read the quarantine state of one directory inode.
pub fn read_state(mount: &Mount, dir: &Inode, perm: &UserPerm) -> Result<bool, CephError> {
    let mut buf = [0u8; 16];
    match mount.getxattr(dir, STATE_XATTR, &mut buf, perm) {
        Ok(n) => Ok(buf.get(..n) == Some(QUARANTINED)),
        Err(e) if e.errno() == libc::ENODATA => Ok(false),
        // A value longer than ours: not written by us; treat as quarantined (fail closed).
        Err(e) if e.errno() == libc::ERANGE => Ok(true),
        Err(e) => Err(e),
    }
}

/// A directory listing and the mtime it was read at.
type Listing = ((i64, i64), Vec<Vec<u8>>);

/// The subdirectory names of a directory, re-read only when its mtime changed: the getattr is
/// answered from the client's cache while it holds the directory's caps (an entry added by
/// another client revokes them), so an unchanged directory costs no MDS request.
fn subdirs_cached(
    mount: &Mount,
    dir: &Inode,
    perm: &UserPerm,
    cache: &mut HashMap<u64, Listing>,
) -> Result<Vec<Vec<u8>>, CephError> {
    let st = mount.getattr(
        dir,
        ceph_client::CEPH_STATX_MTIME | ceph_client::CEPH_STATX_INO,
        0,
        perm,
    )?;
    let mtime = (st.stx_mtime.tv_sec, st.stx_mtime.tv_nsec);
    if let Some((m, list)) = cache.get(&st.stx_ino) {
        if *m == mtime {
            return Ok(list.clone());
        }
    }
    let list = subdirs(mount, dir, perm)?;
    cache.insert(st.stx_ino, (mtime, list.clone()));
    Ok(list)
}

/// List the subdirectory names of a directory.
fn subdirs(mount: &Mount, dir: &Inode, perm: &UserPerm) -> Result<Vec<Vec<u8>>, CephError> {
    let mut d = mount.opendir(dir, perm)?;
    let mut out = Vec::new();
    while let Some(e) = d.readdirplus(0, 0, false)? {
        if e.d_type == libc::DT_DIR {
            out.push(e.name);
        }
    }
    Ok(out)
}

// ---- the watcher ---------------------------------------------------------------------------

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
    /// Discovered directories no domain was left for (denied, see `scan`).
    overflow: std::collections::HashSet<String>,
}

impl Scanner {
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

    /// One round: (re)mount if needed, discover subvolumes, read every domain's state, publish.
    fn scan(&mut self) {
        if self.mount.is_none() {
            match self.access.mount_root() {
                Ok(m) => {
                    self.mount = Some(m);
                    if self.mount_error_logged {
                        tracing::info!("quarantine: watcher mounted CephFS, reading state");
                    }
                    self.mount_error_logged = false;
                }
                Err(e) => {
                    if !self.mount_error_logged {
                        tracing::error!(error = %e, "quarantine: the watcher cannot mount CephFS '/', so quarantine state cannot be read; access to quarantine-capable directories is denied (fail closed): give this client read access to / (and /volumes) or run with --quarantine off");
                        self.mount_error_logged = true;
                    }
                    self.publish_all(State::Unreadable);
                    return;
                }
            }
        }
        let Some(mount) = self.mount.clone() else {
            return;
        };
        for p in self.discover(&mount) {
            if self.gate.domain_for_path(&p).is_some() || self.overflow.contains(&p) {
                continue;
            }
            // No domain left: its state cannot be followed, so it is denied (fail closed).
            // A daemon's own export is registered first, so only directories discovered
            // later, which a tenant's daemon cannot reach, can be left without one.
            match resolve(&mount, &p, &self.perm).map(|i| i.vino()) {
                Ok(Ok(v)) if self.gate.register_root(v.ino, UNSURE) => {
                    tracing::error!(path = %p, "quarantine: more than {MAX_DOMAINS} quarantine-capable directories; this one is denied to this daemon's guest (fail closed) until the daemon is restarted");
                    self.overflow.insert(p);
                }
                _ => {}
            }
        }
        let paths: Vec<String> = self
            .gate
            .paths
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut states = Vec::with_capacity(paths.len());
        for (i, p) in paths.iter().enumerate() {
            let Ok(d) = u32::try_from(i + 1) else { break };
            let s = self.read_domain(&mount, d, p);
            let old = self.states.insert(d, s);
            self.log_state(d, p, old, s);
            states.push(s);
        }
        self.gate.publish(&effective(&paths, &states, &self.cfg));
        // While anything is denied, a directory another client renamed into or out of a
        // denied domain must not keep the domain it had: nodes derive theirs again (from their
        // real ancestry) once per round.
        if self.gate.any_denied() {
            self.gate.invalidate();
        }
        self.gate.round_done();
    }

    fn publish_all(&mut self, s: State) {
        let paths: Vec<String> = self
            .gate
            .paths
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let states = vec![s; paths.len()];
        self.gate.publish(&effective(&paths, &states, &self.cfg));
    }

    /// Read one domain's state. The path is resolved again every round (each step answered
    /// from the client's cache unless another client changed that directory): a domain is
    /// its path, so a directory created, removed and re-created under it after the daemon
    /// started is registered as the domain's root as soon as it is there, and nodes already
    /// below it derive their domain again ([`Gate::register_root`]).
    fn read_domain(&mut self, mount: &Mount, d: u32, path: &str) -> State {
        let inode = match resolve(mount, path, &self.perm) {
            Ok(i) => i,
            // Nothing there: nothing to protect (until it appears: next round).
            Err(e) if e.errno() == libc::ENOENT => {
                self.roots.remove(path);
                return State::Released;
            }
            Err(e) => {
                tracing::debug!(path, error = %e, "quarantine: resolve");
                return State::Unreadable;
            }
        };
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
            if known.is_some() {
                tracing::info!(path, domain = d, "quarantine: directory re-created");
            }
            self.gate.register_root(ino, d);
        }
        let state = match read_state(mount, &inode, &self.perm) {
            Ok(true) => State::Quarantined,
            Ok(false) => State::Released,
            Err(e) => {
                tracing::debug!(path, error = %e, "quarantine: getxattr");
                State::Unreadable
            }
        };
        self.roots.insert(path.to_owned(), inode);
        state
    }

    /// `/volumes/<group>/<subvolume>` directories that exist now.
    fn discover(&mut self, mount: &Mount) -> Vec<String> {
        let r = (|| -> Result<Vec<String>, CephError> {
            let vol = match resolve(mount, VOLUMES, &self.perm) {
                Ok(v) => v,
                Err(e) if e.errno() == libc::ENOENT => return Ok(Vec::new()),
                Err(e) => return Err(e),
            };
            let mut out = Vec::new();
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
            Ok(out)
        })();
        match r {
            Ok(v) => {
                self.discovery_error_logged = false;
                v
            }
            Err(e) => {
                if !self.discovery_error_logged {
                    tracing::warn!(error = %e, "quarantine: cannot list {VOLUMES}; new subvolumes are not discovered (configured paths are still enforced)");
                    self.discovery_error_logged = true;
                }
                Vec::new()
            }
        }
    }
}

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
    *gate.export_root.write().unwrap_or_else(|e| e.into_inner()) = export_root.to_owned();
    for p in cfg.paths.iter().chain(cfg.recovery_paths.iter()) {
        gate.domain_for_path(p);
    }
    if let Some(c) = cover_of(export_root, &cfg) {
        if let Some(d) = gate.domain_for_path(&c) {
            gate.root_domain.store(d, Ordering::Relaxed);
        }
    }
    let interval = cfg.poll_interval();
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
        overflow: std::collections::HashSet::new(),
    };
    s.scan();
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
                let _ = m.shutdown();
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

// ---- the operator command --------------------------------------------------------------------

/// What the operator asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Enable,
    Disable,
    Status,
}

/// Why the operator command failed. Each message names the step and what to do.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{0:?} is not an absolute CephFS path such as /volumes/_nogroup/sv1")]
    BadPath(String),
    #[error("Cannot connect to the Ceph cluster or mount CephFS: check --ceph-conf, --client-id and --keyring")]
    Mount(#[source] CephError),
    #[error("Cannot find {path} in CephFS: check the path (ceph fs subvolume getpath gives a subvolume's path; quarantine its parent /volumes/<group>/<name>)")]
    Resolve {
        path: String,
        #[source]
        source: CephError,
    },
    #[error(
        "Cannot {step} the quarantine state of {path}: this client needs rw and 'p' caps on it"
    )]
    State {
        step: &'static str,
        path: String,
        #[source]
        source: CephError,
    },
}

/// Run `quarantine enable|disable|status PATH`; returns the line to print.
pub fn command(access: &CephAccess, action: Action, path: &str) -> Result<String, CommandError> {
    let path = normalize(path).ok_or_else(|| CommandError::BadPath(path.to_owned()))?;
    let mount = access.mount_root().map_err(CommandError::Mount)?;
    let perm = UserPerm::root();
    let dir = resolve(&mount, &path, &perm).map_err(|source| CommandError::Resolve {
        path: path.clone(),
        source,
    })?;
    let state = |step: &'static str| {
        let path = path.clone();
        move |source| CommandError::State { step, path, source }
    };
    let kind = match subvolume_of(&path) {
        Some(s) if s == path => "subvolume",
        _ => "directory (enforced by daemons that list it with --quarantine-path)",
    };
    let out = match action {
        Action::Enable => {
            mount
                .setxattr(&dir, STATE_XATTR, QUARANTINED, 0, &perm)
                .map_err(state("set"))?;
            format!("{path}: quarantined ({kind})")
        }
        Action::Disable => {
            match mount.removexattr(&dir, STATE_XATTR, &perm) {
                Ok(()) => {}
                Err(e) if e.errno() == libc::ENODATA => {}
                Err(e) => return Err(state("clear")(e)),
            }
            format!("{path}: released ({kind})")
        }
        Action::Status => {
            let q = read_state(&mount, &dir, &perm).map_err(state("read"))?;
            format!(
                "{path}: {} ({kind})",
                if q { "quarantined" } else { "released" }
            )
        }
    };
    drop(dir);
    let _ = mount.shutdown();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> QuarantineConfig {
        QuarantineConfig::default()
    }

    #[test]
    fn paths_normalize() {
        assert_eq!(normalize("/a//b/./c/").as_deref(), Some("/a/b/c"));
        assert_eq!(normalize("/").as_deref(), Some("/"));
        assert_eq!(normalize("a/b"), None);
        assert_eq!(normalize("/a/../b"), None);
        assert!(is_at_or_below("/a/b", "/a"));
        assert!(is_at_or_below("/a", "/a"));
        assert!(!is_at_or_below("/ab", "/a"));
        assert!(is_at_or_below("/x", "/"));
    }

    #[test]
    fn subvolumes_are_found_by_layout() {
        assert_eq!(
            subvolume_of("/volumes/_nogroup/sv1/uuid/d").as_deref(),
            Some("/volumes/_nogroup/sv1")
        );
        assert_eq!(
            subvolume_of("/volumes/g1/sv2").as_deref(),
            Some("/volumes/g1/sv2")
        );
        assert_eq!(subvolume_of("/volumes/_deleting/x"), None);
        assert_eq!(subvolume_of("/volumes/g1"), None);
        assert_eq!(subvolume_of("/data/g1/sv"), None);
        assert!(!is_group_name(b"_g1:sv2.meta"));
        assert!(!is_group_name(b"_index"));
        assert!(is_group_name(b"_nogroup"));
        assert!(!is_subvolume_name(b".meta"));
    }

    #[test]
    fn export_root_cover_is_the_deepest_domain() {
        let mut c = cfg();
        assert_eq!(cover_of("/", &c), None);
        assert_eq!(
            cover_of("/volumes/_nogroup/sv1/u", &c).as_deref(),
            Some("/volumes/_nogroup/sv1")
        );
        c.recovery_paths = vec!["/volumes/_nogroup/sv1/u".into()];
        assert_eq!(
            cover_of("/volumes/_nogroup/sv1/u/x", &c).as_deref(),
            Some("/volumes/_nogroup/sv1/u")
        );
        c.paths = vec!["/data".into()];
        assert_eq!(cover_of("/data/p", &c).as_deref(), Some("/data"));
    }

    #[test]
    fn effective_flags_nest_and_respect_recovery() {
        use State::*;
        let paths: Vec<String> = vec![
            "/volumes/_nogroup/sv1".into(),
            "/volumes/_nogroup/sv2".into(),
            "/volumes/_nogroup/sv1/u/r".into(),
        ];
        let c = cfg();
        assert_eq!(
            effective(&paths, &[Quarantined, Released, Released], &c),
            vec![true, false, true],
            "inner domain follows its quarantined parent; sibling untouched"
        );
        assert_eq!(
            effective(&paths, &[Released, Released, Released], &c),
            vec![false, false, false]
        );
        assert_eq!(
            effective(&paths, &[Unknown, Unreadable, Released], &c),
            vec![true, true, true],
            "fail closed"
        );
        let mut r = cfg();
        r.recovery_paths = vec!["/volumes/_nogroup/sv1/u/r".into()];
        assert_eq!(
            effective(&paths, &[Quarantined, Quarantined, Released], &r),
            vec![true, true, false],
            "path-scoped recovery keeps its own subtree only"
        );
        let mut g = cfg();
        g.recovery_global = true;
        assert_eq!(
            effective(&paths, &[Quarantined, Quarantined, Quarantined], &g),
            vec![false, false, false]
        );
    }

    #[test]
    fn gate_starts_closed_and_publishes() {
        let g = Gate::new();
        assert!(!g.denied(0), "domain 0 is never denied");
        let d = g.domain_for_path("/volumes/_nogroup/sv1").unwrap();
        assert_eq!(g.domain_for_path("/volumes/_nogroup/sv1"), Some(d));
        assert!(g.denied(d), "unknown state denies");
        assert!(g.any_denied());
        g.publish(&[false]);
        assert!(!g.denied(d));
        assert!(!g.any_denied());
        g.publish(&[true]);
        assert!(g.denied(d));
        assert!(g.denied(u32::MAX), "an id out of range denies");
    }

    #[test]
    fn root_table_maps_inodes() {
        let g = Gate::new();
        assert_eq!(g.domain_of_root(0x1000), None);
        for i in 1..=2000u64 {
            assert!(g.register_root(0x1000_0000 + i, (i % 7) as u32 + 1));
        }
        for i in 1..=2000u64 {
            assert_eq!(g.domain_of_root(0x1000_0000 + i), Some((i % 7) as u32 + 1));
        }
        assert_eq!(g.domain_of_root(0x2000_0000), None);
        assert_eq!(g.domain_of_root(0), None);
        // Re-registering an inode moves it.
        g.register_root(0x1000_0001, 9);
        assert_eq!(g.domain_of_root(0x1000_0001), Some(9));
    }

    #[test]
    fn domains_are_bounded() {
        let g = Gate::new();
        for i in 0..MAX_DOMAINS {
            assert!(g.domain_for_path(&format!("/p{i}")).is_some());
        }
        assert_eq!(g.domain_for_path("/one-more"), None);
    }

    #[test]
    fn audit_is_rate_limited() {
        let g = Gate::new();
        let d = g.domain_for_path("/x").unwrap();
        for _ in 0..100 {
            g.audit(d, "lookup", 1000);
        }
        let a = g.audit.lock().unwrap();
        assert_eq!(a.lines, AUDIT_PER_SEC);
        assert_eq!(a.suppressed, 100 - u64::from(AUDIT_PER_SEC));
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

    #[test]
    fn poll_and_ttl_stay_within_the_bound() {
        let c = cfg();
        assert!(c.poll_interval() + c.ttl_bound() < c.propagation);
    }
}
