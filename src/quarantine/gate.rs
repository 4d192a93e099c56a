//! The gate the filesystem asks on every request: domains, their effective flags, the
//! inode → domain table of domain roots, and the rate-limited audit of denials.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use super::*;
use crate::idmap::GuestUid;

/// What the filesystem asks on every request. Written by the watcher only.
pub struct Gate {
    /// Effective deny flag per domain; index = domain id (0 unused, never denied).
    deny: Box<[AtomicBool]>,
    /// Inode number → domain, open addressing; key 0 = empty. A value is written before its key
    /// (release), so a reader that sees the key (acquire) sees the value.
    keys: Box<[AtomicU64]>,
    vals: Box<[AtomicU32]>,
    /// Domains currently denied (rename checks its entries only when this is non-zero).
    pub(super) denied_count: AtomicUsize,
    /// Domain paths, index = domain id - 1 (cold paths only: registration, audit).
    pub(super) paths: RwLock<Vec<String>>,
    /// The export root's domain (0 = none).
    pub(super) root_domain: AtomicU32,
    /// The export root (canonical path).
    pub(super) export_root: RwLock<String>,
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
        usize::try_from(domain)
            .ok()
            .and_then(|d| d.checked_sub(1))
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
            g.audit(d, "lookup", GuestUid::new(1000));
        }
        let a = g.audit.lock().unwrap();
        assert_eq!(a.lines, AUDIT_PER_SEC);
        assert_eq!(a.suppressed, 100 - u64::from(AUDIT_PER_SEC));
    }
}
