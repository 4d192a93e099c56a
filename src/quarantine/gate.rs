//! The gate the filesystem asks on every request: domains, their effective flags, the
//! inode → domain table of domain roots, and the rate-limited audit of denials.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use super::*;
use crate::idmap::GuestUid;

/// The domain paths: by id (index = id - 1; `None` = free, reused by the next new path) and
/// by path, so that a round's lookups of 4,000 paths are not 4,000 scans of the list.
#[derive(Default)]
pub(super) struct DomainPaths {
    slots: Vec<Option<String>>,
    index: HashMap<String, usize>,
}

/// What the filesystem asks on every request. Written by the watcher only.
pub struct Gate {
    /// Effective deny flag per domain; index = domain id (0 unused, never denied). The flag of
    /// a free id (never allocated, or retired) is always set.
    deny: Box<[AtomicBool]>,
    /// Inode number → domain, open addressing with linear probing; key 0 = empty, key [`TOMB`]
    /// = removed (a probe goes on past it). See [`Gate::domain_of_root`] for why readers need
    /// no lock while the watcher inserts and removes.
    keys: Box<[AtomicU64]>,
    vals: Box<[AtomicU32]>,
    /// Live domains currently denied (rename checks its entries only when this is non-zero).
    /// Free ids are denied too but not counted, so a retired domain does not keep the
    /// once-per-round re-derivation going.
    pub(super) denied_count: AtomicUsize,
    /// Domain paths by id and by path. Cold paths only: registration, retirement,
    /// publication, audit.
    pub(super) paths: RwLock<DomainPaths>,
    /// The export root's domain (0 = none).
    pub(super) root_domain: AtomicU32,
    /// The export root (canonical path).
    pub(super) export_root: RwLock<String>,
    /// Per domain id: its directory lies at or below the export root, so it can be where a
    /// node of the export derives its domain from ([`Gate::anchor`]). Set with the path.
    within: Box<[AtomicBool]>,
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

/// Root-table key of a removed entry: never a real inode number (CephFS allocates inode numbers
/// far below it, and [`Gate::register_root`] refuses it), and unlike an empty key it does not
/// end a probe, so keys inserted past it stay reachable.
const TOMB: u64 = u64::MAX;

fn slot_of(ino: u64) -> usize {
    let mut z = ino.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    // The mask keeps the index below ROOT_SLOTS (a power of two), so it fits a usize.
    let mask = u64::try_from(ROOT_SLOTS - 1).unwrap_or(u64::MAX);
    usize::try_from((z ^ (z >> 31)) & mask).unwrap_or(0)
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

impl Gate {
    pub fn new() -> Gate {
        // Every id but 0 starts free, and a free id is denied.
        let deny = (0..=MAX_DOMAINS).map(|d| AtomicBool::new(d != 0)).collect();
        let keys = (0..ROOT_SLOTS).map(|_| AtomicU64::new(0)).collect();
        let vals = (0..ROOT_SLOTS).map(|_| AtomicU32::new(0)).collect();
        let within = (0..=MAX_DOMAINS).map(|_| AtomicBool::new(false)).collect();
        Gate {
            deny,
            keys,
            vals,
            denied_count: AtomicUsize::new(0),
            paths: RwLock::new(DomainPaths::default()),
            root_domain: AtomicU32::new(0),
            export_root: RwLock::new("/".into()),
            within,
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
            && usize::try_from(domain)
                .ok()
                .and_then(|d| self.deny.get(d))
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
        let paths = self.paths_now();
        let states = vec![State::Unreadable; paths.len()];
        self.publish_for(&paths, &effective(&paths, &states, cfg));
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
    ///
    /// Why no lock is needed while the watcher (the only writer) inserts and removes:
    /// - An insert writes the value, then the key, both with release; a reader loads the key
    ///   with acquire, so when it sees the key it sees that value (or a later one).
    /// - A removal clears the value to 0 and then turns the key into [`TOMB`]. A reader that
    ///   matched the key just before and then loads 0 treats it as "not a root": the entry was
    ///   being removed, and 0 is no domain.
    /// - A later insert can reuse that slot (new value, then new key). A reader that matched
    ///   the old key could then load the new entry's value; so after loading the value (with
    ///   acquire, pairing with the insert's release store of the value, which comes after the
    ///   tombstone store) it loads the key again: if it is no longer `ino`, the entry went away
    ///   while it looked, and the answer is "not a root" — exactly what a probe that started a
    ///   moment later would give.
    /// - Removal turns a tombstone into an empty slot only at the end of a chain (the next slot
    ///   is empty), where no key's probe goes on, so a reader stopping there misses nothing.
    #[inline]
    pub fn domain_of_root(&self, ino: u64) -> Option<u32> {
        if ino == 0 || ino == TOMB {
            return None;
        }
        let mut i = slot_of(ino);
        for _ in 0..ROOT_SLOTS {
            let k = self.keys.get(i)?.load(Ordering::Acquire);
            if k == ino {
                let v = self.vals.get(i)?.load(Ordering::Acquire);
                let again = self.keys.get(i)?.load(Ordering::Relaxed);
                return (v != 0 && again == ino).then_some(v);
            }
            if k == 0 {
                return None;
            }
            i = (i + 1) & (ROOT_SLOTS - 1);
        }
        None
    }

    /// The domain a node of the export derives its domain from when it meets directory inode
    /// `ino` on its way up: [`Gate::domain_of_root`], but only for a domain at or below the
    /// export root (an [`UNSURE`] entry, a directory left without a domain, is returned
    /// wherever it is: it denies). A domain root elsewhere (another tenant's subvolume) is no
    /// anchor: a node whose way up meets it is not in the export, and must not take that
    /// domain's (released) state as its own.
    #[inline]
    pub fn anchor(&self, ino: u64) -> Option<u32> {
        let d = self.domain_of_root(ino)?;
        if d == UNSURE {
            return Some(d);
        }
        let inside = usize::try_from(d)
            .ok()
            .and_then(|i| self.within.get(i))
            .is_some_and(|w| w.load(Ordering::Acquire));
        inside.then_some(d)
    }

    /// Set the export root (a canonical path), before domains are registered; the domains
    /// known already are placed against it again.
    pub fn set_export_root(&self, root: &str) {
        *self.export_root.write().unwrap_or_else(|e| e.into_inner()) = root.to_owned();
        let paths = self.paths.read().unwrap_or_else(|e| e.into_inner());
        for (i, p) in paths.slots.iter().enumerate() {
            if let Some(w) = self.within.get(i + 1) {
                w.store(
                    p.as_deref().is_some_and(|p| is_at_or_below(p, root)),
                    Ordering::Release,
                );
            }
        }
    }

    /// The export root's domain.
    pub fn root_domain(&self) -> u32 {
        self.root_domain.load(Ordering::Relaxed)
    }

    /// Live domains (retired ones are not counted).
    pub fn domain_count(&self) -> usize {
        self.paths
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .index
            .len()
    }

    /// The domain paths now, index = domain id - 1, `None` for a free id.
    pub(super) fn paths_now(&self) -> Vec<Option<String>> {
        self.paths
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .slots
            .clone()
    }

    /// The path of a domain (for logs).
    pub fn path_of(&self, domain: u32) -> String {
        if domain == UNSURE {
            return "<ancestry unknown>".into();
        }
        let paths = self.paths.read().unwrap_or_else(|e| e.into_inner());
        match usize::try_from(domain)
            .ok()
            .and_then(|d| d.checked_sub(1))
            .and_then(|i| paths.slots.get(i))
        {
            Some(Some(p)) => p.clone(),
            Some(None) => format!("<retired domain {domain}>"),
            None => format!("<domain {domain}>"),
        }
    }

    /// The live domain of a canonical path, if it has one (nothing is allocated).
    pub fn domain_of_path(&self, path: &str) -> Option<u32> {
        let paths = self.paths.read().unwrap_or_else(|e| e.into_inner());
        let i = paths.index.get(path)?;
        u32::try_from(i + 1).ok()
    }

    /// The domain of a canonical path, allocated (denied until its state is read) if new: the
    /// lowest free id (one a retired domain left), else a new one. `None` when all
    /// [`MAX_DOMAINS`] are live.
    pub fn domain_for_path(&self, path: &str) -> Option<u32> {
        let mut paths = self.paths.write().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = paths.index.get(path) {
            return u32::try_from(i + 1).ok();
        }
        let i = match paths.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None if paths.slots.len() < MAX_DOMAINS => {
                paths.slots.push(None);
                paths.slots.len() - 1
            }
            None => return None,
        };
        let slot = paths.slots.get_mut(i)?;
        *slot = Some(path.to_owned());
        paths.index.insert(path.to_owned(), i);
        let inside = is_at_or_below(
            path,
            &self.export_root.read().unwrap_or_else(|e| e.into_inner()),
        );
        if let Some(w) = self.within.get(i + 1) {
            w.store(inside, Ordering::Release);
        }
        // Fail closed: a new domain is denied until the watcher has read its state. (A free
        // id's flag is set already; it now counts as a live denied domain.)
        if let Some(flag) = self.deny.get(i + 1) {
            flag.store(true, Ordering::Relaxed);
        }
        self.denied_count.fetch_add(1, Ordering::Relaxed);
        u32::try_from(i + 1).ok()
    }

    /// Retire `domain` (its directory is gone): it is denied from now on (fail closed for a
    /// node that still holds the id), its root inodes leave the root table, its id is free for
    /// the next new path, and every node derives its domain again. The export root's domain
    /// is never retired; which others may be is the watcher's decision (configured paths
    /// never). Writer: the watcher only.
    pub fn retire(&self, domain: u32) -> bool {
        if domain == 0 || domain == self.root_domain() {
            return false;
        }
        let Some(i) = usize::try_from(domain).ok().and_then(|d| d.checked_sub(1)) else {
            return false;
        };
        {
            let mut paths = self.paths.write().unwrap_or_else(|e| e.into_inner());
            match paths.slots.get_mut(i).and_then(Option::take) {
                Some(p) => {
                    paths.index.remove(&p);
                }
                None => return false,
            }
            if let Some(w) = self.within.get(i + 1) {
                w.store(false, Ordering::Release);
            }
            // Denied from now on; counted only while it was live and denied.
            if self
                .deny
                .get(i + 1)
                .is_some_and(|f| f.swap(true, Ordering::Relaxed))
            {
                self.denied_count.fetch_sub(1, Ordering::Relaxed);
            }
            while paths.slots.last().is_some_and(Option::is_none) {
                paths.slots.pop();
            }
        }
        for i in 0..ROOT_SLOTS {
            let (Some(k), Some(v)) = (self.keys.get(i), self.vals.get(i)) else {
                break;
            };
            let key = k.load(Ordering::Relaxed);
            if key != 0 && key != TOMB && v.load(Ordering::Relaxed) == domain {
                self.remove_slot(i);
            }
        }
        self.invalidate();
        crate::metrics::quarantine_domain_retired();
        true
    }

    /// Record that directory inode `ino` is the root of `domain`. Writer: the watcher only
    /// (and setup before serving), so two writers never race for one slot. The whole chain is
    /// searched for `ino` before a tombstone is reused, so a key is never in the table twice.
    pub fn register_root(&self, ino: u64, domain: u32) -> bool {
        if ino == 0 || ino == TOMB || domain == 0 {
            return false;
        }
        let mut i = slot_of(ino);
        let mut free = None;
        for _ in 0..ROOT_SLOTS {
            let (Some(k), Some(v)) = (self.keys.get(i), self.vals.get(i)) else {
                return false;
            };
            match k.load(Ordering::Relaxed) {
                cur if cur == ino => {
                    if v.swap(domain, Ordering::Release) != domain {
                        self.invalidate();
                    }
                    return true;
                }
                TOMB => {
                    free.get_or_insert(i);
                }
                0 => {
                    free.get_or_insert(i);
                    break;
                }
                _ => {}
            }
            i = (i + 1) & (ROOT_SLOTS - 1);
        }
        let Some((k, v)) = free.and_then(|f| Some((self.keys.get(f)?, self.vals.get(f)?))) else {
            return false;
        };
        v.store(domain, Ordering::Release);
        k.store(ino, Ordering::Release);
        // Nodes below this directory may exist already (looked up before the directory was
        // created, discovered or re-created): they derive again.
        self.invalidate();
        true
    }

    /// Remove inode `ino` from the root table if it is the root of `domain` there (a
    /// directory no longer at its domain's path, or a denied overflow directory that got a
    /// domain). Writer: the watcher only.
    pub fn unregister_root(&self, ino: u64, domain: u32) -> bool {
        if ino == 0 || ino == TOMB {
            return false;
        }
        let mut i = slot_of(ino);
        for _ in 0..ROOT_SLOTS {
            let (Some(k), Some(v)) = (self.keys.get(i), self.vals.get(i)) else {
                return false;
            };
            match k.load(Ordering::Relaxed) {
                cur if cur == ino => {
                    if v.load(Ordering::Relaxed) != domain {
                        return false;
                    }
                    self.remove_slot(i);
                    self.invalidate();
                    return true;
                }
                0 => return false,
                _ => i = (i + 1) & (ROOT_SLOTS - 1),
            }
        }
        false
    }

    /// Remove the entry in slot `i` (see [`Gate::domain_of_root`] for the order), then turn the
    /// tombstones at the end of its chain back into empty slots, so that probes stay short
    /// however many entries come and go.
    fn remove_slot(&self, i: usize) {
        let (Some(k), Some(v)) = (self.keys.get(i), self.vals.get(i)) else {
            return;
        };
        v.store(0, Ordering::Release);
        k.store(TOMB, Ordering::Release);
        let mut j = i;
        for _ in 0..ROOT_SLOTS {
            let next = (j + 1) & (ROOT_SLOTS - 1);
            let (Some(kj), Some(kn)) = (self.keys.get(j), self.keys.get(next)) else {
                return;
            };
            if kj.load(Ordering::Relaxed) != TOMB || kn.load(Ordering::Relaxed) != 0 {
                return;
            }
            kj.store(0, Ordering::Release);
            j = j.wrapping_sub(1) & (ROOT_SLOTS - 1);
        }
    }

    /// Publish effective flags for domains 1..=flags.len() of the current paths.
    pub fn publish(&self, flags: &[bool]) {
        let paths = self.paths_now();
        self.publish_for(&paths, flags);
    }

    /// Publish effective flags computed for `seen` (the paths as they were when the states
    /// were read). An id whose path changed since (retired, or retired and reused) or that is
    /// free is denied whatever its flag says (fail closed until the next round reads it), so
    /// a flag never reaches a path it was not computed for.
    pub(super) fn publish_for(&self, seen: &[Option<String>], flags: &[bool]) {
        let mut changed = false;
        let paths = self.paths.read().unwrap_or_else(|e| e.into_inner());
        let mut near = false;
        let export = self
            .export_root
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (i, p) in paths.slots.iter().enumerate() {
            let Some(d) = self.deny.get(i + 1) else { break };
            let Some(p) = p else {
                // Free: denied, never counted (retire and domain_for_path keep it so).
                d.store(true, Ordering::Relaxed);
                continue;
            };
            let f = seen.get(i).and_then(Option::as_ref) != Some(p)
                || flags.get(i).copied().unwrap_or(true);
            let was = d.swap(f, Ordering::Relaxed);
            if was != f {
                changed = true;
                if f {
                    self.denied_count.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.denied_count.fetch_sub(1, Ordering::Relaxed);
                }
            }
            near |= f && (is_at_or_below(p, &export) || is_at_or_below(&export, p));
        }
        drop(paths);
        if self.near_denied.swap(near, Ordering::Relaxed) != near {
            changed = true;
        }
        if changed {
            self.invalidate();
        }
    }

    /// Log one denied operation (rate-limited), naming the caller by its guest uid.
    pub fn audit(&self, domain: u32, op: &'static str, guest_uid: GuestUid) {
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
            guest_uid = guest_uid.get(),
            suppressed_before = suppressed,
            "quarantine: operation denied"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Only a domain at or below the export root anchors a node's derivation; one elsewhere
    /// (another tenant's subvolume) is no anchor, and an UNSURE entry denies wherever it is.
    #[test]
    fn hostile_only_domains_in_the_export_are_anchors() {
        let g = Gate::new();
        g.set_export_root("/volumes/_nogroup/sva");
        let own = g.domain_for_path("/volumes/_nogroup/sva").unwrap();
        let inner = g.domain_for_path("/volumes/_nogroup/sva/u/q").unwrap();
        let other = g.domain_for_path("/volumes/_nogroup/svb").unwrap();
        let prefix = g.domain_for_path("/volumes/_nogroup/sva2").unwrap();
        for (ino, d) in [(10, own), (11, inner), (12, other), (13, prefix)] {
            assert!(g.register_root(ino, d));
        }
        assert!(g.register_root(14, UNSURE));
        assert_eq!(g.anchor(10), Some(own));
        assert_eq!(g.anchor(11), Some(inner));
        assert_eq!(g.anchor(12), None, "another subvolume anchored a node");
        assert_eq!(
            g.anchor(13),
            None,
            "a name sharing a prefix anchored a node"
        );
        assert_eq!(g.anchor(14), Some(UNSURE));
        assert_eq!(g.anchor(15), None);
        // domain_of_root itself still answers for every root (the watcher's table).
        assert_eq!(g.domain_of_root(12), Some(other));
        // A retired id is no anchor, and its reuse is placed anew.
        assert!(g.retire(inner));
        let again = g.domain_for_path("/volumes/_nogroup/svc").unwrap();
        assert_eq!(again, inner);
        assert!(g.register_root(16, again));
        assert_eq!(g.anchor(16), None);
        // Setting the root again places the known domains again.
        g.set_export_root("/");
        assert_eq!(g.anchor(12), Some(other));
    }

    #[test]
    fn domains_are_bounded() {
        let g = Gate::new();
        for i in 0..MAX_DOMAINS {
            assert!(g.domain_for_path(&format!("/p{i}")).is_some());
        }
        assert_eq!(g.domain_for_path("/one-more"), None);
    }

    /// Every live id, in order, with its path.
    fn live(g: &Gate) -> Vec<(u32, String)> {
        g.paths_now()
            .into_iter()
            .enumerate()
            .filter_map(|(i, p)| Some((u32::try_from(i + 1).ok()?, p?)))
            .collect()
    }

    /// A subvolume created and removed over and over (CSI's csi-vol-<uuid>): the table stays
    /// bounded by the live domains, and a full table takes new paths again after a retirement.
    #[test]
    fn hostile_domains_are_bounded_and_come_back_after_retirement() {
        let g = Gate::new();
        let mut ids = Vec::new();
        for i in 0..MAX_DOMAINS {
            let d = g
                .domain_for_path(&format!("/volumes/csi/csi-vol-{i}"))
                .unwrap();
            assert!(g.register_root(0x1_0000 + i as u64, d));
            ids.push(d);
        }
        assert_eq!(g.domain_for_path("/volumes/csi/one-more"), None);
        assert_eq!(g.domain_count(), MAX_DOMAINS);
        // Twice the table's size in creations over the daemon's life, never more than
        // MAX_DOMAINS at once.
        for n in 0..MAX_DOMAINS + 64 {
            let victim = ids[n * 7919 % MAX_DOMAINS];
            assert!(g.retire(victim), "retire {victim}");
            assert_eq!(g.domain_count(), MAX_DOMAINS - 1);
            let path = format!("/volumes/csi/new-{n}");
            let d = g
                .domain_for_path(&path)
                .expect("a retired id is free again");
            assert_eq!(d, victim, "the freed id is reused");
            assert!(g.denied(d), "a reused id is denied until its state is read");
            assert_eq!(g.path_of(d), path);
            assert!(g.register_root(0x10_0000 + n as u64, d));
            if n % 256 == 0 {
                assert_eq!(g.domain_for_path("/volumes/csi/one-more"), None);
            }
        }
        assert_eq!(live(&g).len(), MAX_DOMAINS);
        assert!(live(&g).iter().all(|(d, _)| (*d as usize) <= MAX_DOMAINS));
    }

    #[test]
    fn hostile_retired_domain_is_denied_and_its_id_reused() {
        let g = Gate::new();
        let a = g.domain_for_path("/volumes/_nogroup/a").unwrap();
        let b = g.domain_for_path("/volumes/_nogroup/b").unwrap();
        assert!(g.register_root(0xa1, a));
        assert!(
            g.register_root(0xa2, a),
            "a re-created directory: two roots"
        );
        assert!(g.register_root(0xb1, b));
        g.publish(&[false, false]);
        assert!(!g.denied(a) && !g.any_denied());
        let gen = g.generation();
        assert!(g.retire(a));
        assert!(!g.retire(a), "retired once");
        assert_ne!(g.generation(), gen, "nodes derive their domain again");
        assert!(g.denied(a), "a node still holding the id is refused");
        assert!(
            !g.any_denied(),
            "a free id does not count as a denied domain"
        );
        assert_eq!(g.domain_of_root(0xa1), None);
        assert_eq!(g.domain_of_root(0xa2), None);
        assert_eq!(g.domain_of_root(0xb1), Some(b));
        assert_eq!(g.domain_count(), 1);
        assert_eq!(g.path_of(a), format!("<retired domain {a}>"));
        assert_eq!(g.domain_of_path("/volumes/_nogroup/a"), None);
        // Publishing flags computed before the retirement does not open the free id.
        g.publish(&[false, false]);
        assert!(g.denied(a));
        // The next new path takes the id, denied until its state is read.
        let c = g.domain_for_path("/volumes/_nogroup/c").unwrap();
        assert_eq!(c, a);
        assert!(g.denied(c) && g.any_denied());
        assert_eq!(g.path_of(c), "/volumes/_nogroup/c");
        // Flags read for the old path never reach the new one.
        let seen = vec![
            Some("/volumes/_nogroup/a".to_owned()),
            Some("/volumes/_nogroup/b".into()),
        ];
        g.publish_for(&seen, &[false, false]);
        assert!(
            g.denied(c),
            "flags of the retired path applied to its successor"
        );
        g.publish(&[false, false]);
        assert!(!g.denied(c) && !g.any_denied());
        // The last id retired shrinks the table; the export's domain is never retired.
        assert!(g.retire(b));
        assert_eq!(live(&g), vec![(c, "/volumes/_nogroup/c".to_owned())]);
        g.root_domain.store(c, Ordering::Relaxed);
        assert!(!g.retire(c));
        assert!(!g.retire(0) && !g.retire(UNSURE));
    }

    /// A free id is denied, encloses nothing, and sets no "near the export" flag.
    #[test]
    fn hostile_free_domain_is_denied_and_matches_no_path() {
        let cfg = QuarantineConfig::default();
        let paths = vec![None, Some("/volumes/g/sv".to_owned()), None];
        assert_eq!(
            effective(
                &paths,
                &[State::Quarantined, State::Released, State::Unknown],
                &cfg
            ),
            vec![true, false, true]
        );
        let g = Gate::new();
        *g.export_root.write().unwrap() = "/volumes/g/sv/x".into();
        let a = g.domain_for_path("/volumes/g/gone").unwrap();
        let b = g.domain_for_path("/volumes/g/sv").unwrap();
        g.publish(&[false, false]);
        assert!(g.retire(a));
        g.publish(&[false, false]);
        assert!(g.denied(a) && !g.denied(b));
        assert!(!g.near_denied(), "a free id is near nothing");
        assert!(!g.any_denied());
        assert!(g.denied(MAX_DOMAINS as u32), "never allocated: denied");
        assert!(g.denied(3), "above the live ids: denied");
    }

    /// The root table under inserts, moves and removals (tombstones), checked against a model
    /// after every step; and probes stay short: removals do not fill the table with tombstones.
    #[test]
    fn hostile_root_table_tombstones_model_check() {
        use std::collections::BTreeMap;
        let g = Gate::new();
        let mut model: BTreeMap<u64, u32> = BTreeMap::new();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        // Inode numbers from a small range so that removed ones come back.
        let live_max = MAX_DOMAINS as u64;
        let space = 4 * live_max;
        for i in 1..=MAX_DOMAINS {
            assert_eq!(g.domain_for_path(&format!("/d{i}")), Some(i as u32));
        }
        for step in 0..200_000u32 {
            let ino = 1 + next() % space;
            let d = 1 + (next() % MAX_DOMAINS as u64) as u32;
            match next() % 4 {
                0 | 1 if model.len() < live_max as usize || model.contains_key(&ino) => {
                    assert!(g.register_root(ino, d), "step {step}: insert {ino}");
                    model.insert(ino, d);
                }
                2 => {
                    let want = model.get(&ino).copied();
                    let wrong = want.map_or(d, |w| w % MAX_DOMAINS as u32 + 1);
                    assert!(
                        !g.unregister_root(ino, wrong),
                        "step {step}: removed under another domain"
                    );
                    let removed = want.is_some_and(|w| g.unregister_root(ino, w));
                    assert_eq!(removed, want.is_some(), "step {step}: remove {ino}");
                    model.remove(&ino);
                }
                _ => {
                    let want = model.get(&ino).copied();
                    if let Some(dom) = want.filter(|_| next() % 8 == 0) {
                        // Retire that domain: every inode of it goes. (Then its id is live
                        // again, for the next retirement.)
                        assert!(g.retire(dom));
                        model.retain(|_, v| *v != dom);
                        assert_eq!(g.domain_for_path(&format!("/d{dom}")), Some(dom));
                    }
                }
            }
            assert_eq!(
                g.domain_of_root(ino),
                model.get(&ino).copied(),
                "step {step}: {ino}"
            );
            if step % 20_000 == 0 {
                for i in 1..=space {
                    assert_eq!(
                        g.domain_of_root(i),
                        model.get(&i).copied(),
                        "step {step}: {i}"
                    );
                }
            }
        }
        for i in 1..=space {
            assert_eq!(g.domain_of_root(i), model.get(&i).copied(), "end: {i}");
        }
        assert_eq!(g.domain_of_root(TOMB), None);
        assert!(!g.register_root(TOMB, 1));
        let used = g
            .keys
            .iter()
            .filter(|k| k.load(Ordering::Relaxed) != 0)
            .count();
        let tombs = g
            .keys
            .iter()
            .filter(|k| k.load(Ordering::Relaxed) == TOMB)
            .count();
        println!(
            "{} live, {tombs} tombstones, {} empty of {ROOT_SLOTS}",
            model.len(),
            ROOT_SLOTS - used
        );
        assert!(
            ROOT_SLOTS - used >= ROOT_SLOTS / 4,
            "tombstones fill the table: {used} of {ROOT_SLOTS} slots used"
        );
    }

    /// Lock-free readers while the watcher inserts and removes: an inode that stays a root is
    /// always found with its domain; one that comes and goes is either absent or found with
    /// its own domain, never with another entry's.
    #[test]
    fn hostile_root_table_readers_during_churn() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let g = Arc::new(Gate::new());
        let stable: Vec<u64> = (1..=500u64).map(|i| i * 3).collect();
        for &i in &stable {
            assert!(g.register_root(i, (i % 1000) as u32 + 1));
        }
        // Churned inodes: domain = a function of the inode, so a wrong answer is visible.
        let dom = |i: u64| (i % 4000) as u32 + 1;
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|r| {
                let (g, stop, stable) = (g.clone(), stop.clone(), stable.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for &i in &stable {
                            assert_eq!(g.domain_of_root(i), Some((i % 1000) as u32 + 1));
                        }
                        for i in 1..=6_000u64 {
                            let ino = i * 7 + r;
                            if ino % 3 != 0 {
                                if let Some(d) = g.domain_of_root(ino) {
                                    assert_eq!(d, dom(ino), "{ino}: another entry's value");
                                }
                            }
                        }
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        for round in 0..200u64 {
            for i in 1..=6_000u64 {
                let ino = i * 7 + round % 2;
                if ino % 3 == 0 {
                    continue;
                }
                if (i + round) % 3 == 0 {
                    g.register_root(ino, dom(ino));
                } else {
                    g.unregister_root(ino, dom(ino));
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
    }

    #[test]
    fn audit_is_rate_limited() {
        let g = Gate::new();
        let d = g.domain_for_path("/x").unwrap();
        for _ in 0..100 {
            g.audit(d, "lookup", GuestUid::new(1000));
        }
        let a = g.audit.lock().unwrap();
        assert_eq!(a.lines, AUDIT_PER_SEC);
        assert_eq!(a.suppressed, 100 - u64::from(AUDIT_PER_SEC));
    }
}
