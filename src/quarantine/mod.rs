//! Subvolume quarantine, enforced by the daemon on behalf of its guests (issue 5).
//!
//! Pacific's MDS knows nothing of quarantine, so every daemon enforces it itself. This module
//! holds the state mechanism and the path logic; `gate.rs` the O(1) gate the filesystem asks on
//! every request, `watcher.rs` the watcher that keeps each daemon's view current, `command.rs`
//! the operator command. Its settings are [`QuarantineConfig`]; the daemon's `main` wires it.
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
//! Each such directory is a *domain*, numbered 1..=[`MAX_DOMAINS`] (0 = none). Domains nest by
//! path: a domain inside a denied domain is denied too, unless exempt.
//!
//! # Retirement
//! A discovered domain (a subvolume) whose path is gone (ENOENT) in [`RETIRE_AFTER`] rounds in a
//! row is retired ([`Gate::retire`]): its id is denied, its root inodes leave the inode table,
//! every node derives its domain again, and the id is reused by the next new directory. CSI
//! creates and deletes uniquely named subvolumes, so without this a long-running daemon would
//! run out of ids. Configured paths (`--quarantine-path`, `--quarantine-recovery-path`) and the
//! export's own domain are never retired. A directory discovered while all ids are live is
//! denied (fail closed) until one is retired.
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
//! A watcher thread per daemon, on its own libcephfs mount ([`watch_base`]: `/` as the export's
//! cephx id, or `/volumes` as an id of its own, `--quarantine-client-id`, which needs metadata
//! read access there only), re-reads the xattr of every
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
//! Each denied operation logs one warn line (domain path, op, `guest_uid`: the uid in the guest), at most
//! [`AUDIT_PER_SEC`] per second; the rest are counted and reported in the next line.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::time::Duration;

use ceph_client::{CephError, Inode, Mount, UserPerm};

mod command;
mod gate;
mod watcher;

pub use command::{command, Action, CommandError};
pub use gate::Gate;
pub use watcher::{start, watchdog, Watcher};

/// The reserved xattr holding a directory's quarantine state.
pub const STATE_XATTR: &CStr = c"trusted.ceph-virtiofsd.quarantine";
/// Value meaning "quarantined".
pub const QUARANTINED: &[u8] = b"1";
/// Where mgr/volumes keeps subvolumes.
pub const VOLUMES: &str = "/volumes";
/// Most domains one daemon tracks.
pub const MAX_DOMAINS: usize = 4096;
/// Rounds in a row a discovered domain's path must be missing before the domain is retired.
/// More than one, so a directory renamed away and back (or a lookup racing a rename) keeps its
/// id and state; few, so ids come back within about one propagation bound (3 rounds of
/// `propagation / 4`). Retiring too early is safe anyway: the id is denied, and a directory
/// that comes back is discovered again and denied until its state is read.
pub const RETIRE_AFTER: u32 = 3;
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
    /// The watcher's own cephx id (without "client."); `None`: the export's (see
    /// [`watcher_access`]).
    pub client_id: Option<String>,
    /// The keyring holding the watcher's key; `None`: the export's keyring (a keyring file may
    /// hold several entities), or ceph.conf's.
    pub keyring: Option<std::path::PathBuf>,
}

impl Default for QuarantineConfig {
    fn default() -> Self {
        QuarantineConfig {
            enabled: true,
            paths: Vec::new(),
            recovery_global: false,
            recovery_paths: Vec::new(),
            propagation: DEFAULT_PROPAGATION,
            client_id: None,
            keyring: None,
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
/// daemon is a recovery client for it. `paths[i]`/`states[i]` describe domain `i + 1`; a free
/// id (`None`, a retired domain) is denied and encloses nothing.
pub fn effective(paths: &[Option<String>], states: &[State], cfg: &QuarantineConfig) -> Vec<bool> {
    // The denying domains by path: each path then looks up itself and its ancestors, instead
    // of comparing itself with every domain (4,000 subvolumes made that most of a round).
    let denying: std::collections::HashSet<&str> = paths
        .iter()
        .zip(states)
        .filter(|(_, s)| s.denies())
        .filter_map(|(q, _)| q.as_deref())
        .collect();
    paths
        .iter()
        .map(|p| {
            let Some(p) = p else { return true };
            if cfg.recovery_global || cfg.recovery_paths.iter().any(|r| is_at_or_below(p, r)) {
                return false;
            }
            at_or_below_any(p, &denying)
        })
        .collect()
}

/// Whether `path` [`is_at_or_below`] one of `ancestors`: `path` itself, each of its ancestors
/// up to "/" looked up.
fn at_or_below_any(path: &str, ancestors: &std::collections::HashSet<&str>) -> bool {
    if ancestors.is_empty() {
        return false;
    }
    let mut cur = path;
    loop {
        if ancestors.contains(cur) {
            return true;
        }
        match cur.rfind('/') {
            Some(0) | None => return ancestors.contains("/"),
            Some(i) => cur = cur.get(..i).unwrap_or("/"),
        }
    }
}

// ---- Ceph access shared by the watcher and the operator command ------------------------------

pub use crate::ceph::CephAccess;

/// How the watcher reaches the cluster: the export's access (its conf, options and session
/// uuid), as the watcher's own cephx id and keyring when one is configured.
pub fn watcher_access(export: &CephAccess, cfg: &QuarantineConfig) -> CephAccess {
    let mut access = export.clone();
    if let Some(id) = &cfg.client_id {
        access.client_id = Some(id.clone());
        if let Some(k) = &cfg.keyring {
            access.keyring = Some(k.clone());
        }
    }
    access
}

/// The directory the watcher mounts. With the export's own id, "/" (as it always did). With
/// an id of its own, the deepest directory holding [`VOLUMES`] and every configured path —
/// `/volumes` unless `--quarantine-path` or a recovery path lies elsewhere — so that its key
/// needs caps on that directory only (`mds 'allow r path=/volumes'`).
pub fn watch_base(cfg: &QuarantineConfig) -> String {
    if cfg.client_id.is_none() {
        return "/".into();
    }
    let mut base: Vec<&str> = VOLUMES.split('/').filter(|c| !c.is_empty()).collect();
    for p in cfg.paths.iter().chain(cfg.recovery_paths.iter()) {
        let parts: Vec<&str> = p.split('/').filter(|c| !c.is_empty()).collect();
        let common = base
            .iter()
            .zip(parts.iter())
            .take_while(|(a, b)| a == b)
            .count();
        base.truncate(common);
    }
    format!("/{}", base.join("/"))
}

/// A canonical `path` as a path from `base` (the directory a mount was made of): `None` if it
/// does not lie at or below it.
pub fn relative_to<'a>(path: &'a str, base: &str) -> Option<&'a str> {
    if base == "/" {
        return Some(path);
    }
    if path == base {
        return Some("");
    }
    path.strip_prefix(base).filter(|rest| rest.starts_with('/'))
}

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
        let paths: Vec<Option<String>> = vec![
            Some("/volumes/_nogroup/sv1".into()),
            Some("/volumes/_nogroup/sv2".into()),
            Some("/volumes/_nogroup/sv1/u/r".into()),
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

    /// The indexed `effective` answers what the pairwise definition does (every path against
    /// every domain with `is_at_or_below`), on seeded random trees with "/" and names that
    /// are prefixes of one another ("/a" and "/ab").
    #[test]
    fn effective_matches_the_pairwise_definition() {
        use State::*;
        let pairwise = |paths: &[Option<String>], states: &[State]| -> Vec<bool> {
            paths
                .iter()
                .map(|p| {
                    let Some(p) = p else { return true };
                    paths.iter().zip(states).any(|(q, s)| {
                        q.as_deref().is_some_and(|q| is_at_or_below(p, q)) && s.denies()
                    })
                })
                .collect()
        };
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let names = ["a", "ab", "b", "volumes", "_nogroup", "sv1", "sv10"];
        let c = cfg();
        for round in 0..2000 {
            let n = 1 + next(12) as usize;
            let mut paths = Vec::new();
            let mut states = Vec::new();
            for _ in 0..n {
                let depth = next(5);
                let p = if depth == 0 {
                    "/".to_string()
                } else {
                    (0..depth)
                        .map(|_| names[next(names.len() as u64) as usize])
                        .fold(String::new(), |acc, c| acc + "/" + c)
                };
                paths.push(if next(10) == 0 { None } else { Some(p) });
                states.push([Quarantined, Released, Unknown, Unreadable][next(4) as usize]);
            }
            assert_eq!(
                effective(&paths, &states, &c),
                pairwise(&paths, &states),
                "round {round}: {paths:?} {states:?}"
            );
        }
    }

    #[test]
    fn the_watcher_mounts_volumes_with_an_id_of_its_own() {
        let mut c = cfg();
        assert_eq!(watch_base(&c), "/", "the export's id: as before");
        c.client_id = Some("cvfs-watch".into());
        assert_eq!(watch_base(&c), "/volumes");
        c.recovery_paths = vec!["/volumes/_nogroup/sv1/u".into()];
        assert_eq!(watch_base(&c), "/volumes");
        c.paths = vec!["/volumesx/a".into()];
        assert_eq!(
            watch_base(&c),
            "/",
            "a name sharing a prefix is no common directory"
        );
        c.paths = vec!["/data/p".into()];
        assert_eq!(watch_base(&c), "/");
        assert_eq!(relative_to("/volumes/g/s", "/volumes"), Some("/g/s"));
        assert_eq!(relative_to("/volumes", "/volumes"), Some(""));
        assert_eq!(relative_to("/volumesx/g", "/volumes"), None);
        assert_eq!(relative_to("/data", "/volumes"), None);
        assert_eq!(relative_to("/data", "/"), Some("/data"));
        let export = CephAccess {
            client_id: Some("vm1".into()),
            keyring: Some("/etc/ceph/vm1.keyring".into()),
            ..CephAccess::default()
        };
        let mut c = cfg();
        assert_eq!(watcher_access(&export, &c), export);
        c.client_id = Some("cvfs-watch".into());
        let w = watcher_access(&export, &c);
        assert_eq!(w.client_id.as_deref(), Some("cvfs-watch"));
        assert_eq!(
            w.keyring, export.keyring,
            "the export's keyring file may hold it too"
        );
        c.keyring = Some("/etc/ceph/watch.keyring".into());
        let w = watcher_access(&export, &c);
        assert_eq!(
            w.keyring.as_deref(),
            Some(std::path::Path::new("/etc/ceph/watch.keyring"))
        );
    }

    #[test]
    fn poll_and_ttl_stay_within_the_bound() {
        let c = cfg();
        assert!(c.poll_interval() + c.ttl_bound() < c.propagation);
    }
}
