//! The handle table: FUSE file handles → open CephFS files and directory streams.
//!
//! Handles are ours (a counter, never a pointer), counted from a random base drawn anew for
//! every session (a new table, or [`HandleTable::clear`]): a guest cannot tell the handle
//! numbers of an earlier session, nor use one, since the table was emptied in between. Every handle the guest sends is looked up and
//! checked against the node id it came with: an unknown handle, or one that belongs to another
//! node, is EBADF — never a dereference. Sharded like the node table, so that opens and releases
//! on different handles do not serialise on one lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use super::shards::{IdMap, Shards};

const SHARDS: usize = 64;

#[derive(Debug)]
pub struct HandleTable<H> {
    shards: Shards<RwLock<IdMap<Arc<Entry<H>>>>, SHARDS>,
    next: AtomicU64,
    /// Handles in the table.
    count: AtomicUsize,
    /// Most handles the table holds; an insert beyond it fails with ENFILE. `usize::MAX`: no
    /// limit.
    max: AtomicUsize,
    /// Handles a migration or a session recovery could not open again, with their node and
    /// the errno every use gets until released (ESTALE, EIO).
    stale: RwLock<HashMap<u64, (u64, i32)>>,
}

/// One open handle and the node it was opened on.
#[derive(Debug)]
pub struct Entry<H> {
    pub node: u64,
    pub handle: H,
}

impl<H> Default for HandleTable<H> {
    fn default() -> Self {
        HandleTable {
            shards: Shards::new(|| RwLock::new(IdMap::default())),
            next: AtomicU64::new(session_base()),
            count: AtomicUsize::new(0),
            max: AtomicUsize::new(usize::MAX),
            stale: RwLock::default(),
        }
    }
}

/// Where a session's handle numbers start: random, in [1, 2^62) so that the counter never
/// wraps to 0 (never handed out: some guests treat it as "no handle").
fn session_base() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into the buffer, which is valid
    // and writable for that length during the call.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    let random = if usize::try_from(n).is_ok_and(|n| n == bytes.len()) {
        u64::from_ne_bytes(bytes)
    } else {
        // No entropy (a seccomp filter without getrandom): still not the last session's base.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        t.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(std::process::id())
    };
    (random & ((1 << 62) - 1)).max(1)
}

impl<H> HandleTable<H> {
    fn shard(&self, fh: u64) -> &RwLock<IdMap<Arc<Entry<H>>>> {
        // Handles are sequential: the low bits spread them over the shards.
        self.shards.get(fh)
    }

    /// Limit the table to `max` handles.
    pub fn set_limit(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// Whether one more handle fits under the limit now (a hint for callers that would
    /// otherwise do irreversible work first; [`Self::insert`] enforces the limit).
    pub fn has_room(&self) -> bool {
        self.count.load(Ordering::Relaxed) < self.max.load(Ordering::Relaxed)
    }

    /// Enter a new handle; ENFILE (and `handle` dropped) when the table is full.
    pub fn insert(&self, node: u64, handle: H) -> Result<u64, i32> {
        if self.count.fetch_add(1, Ordering::Relaxed) >= self.max.load(Ordering::Relaxed) {
            self.count.fetch_sub(1, Ordering::Relaxed);
            return Err(libc::ENFILE);
        }
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.shard(fh)
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, Arc::new(Entry { node, handle }));
        Ok(fh)
    }

    /// The handle `fh`, if it exists and was opened on `node`; EBADF otherwise.
    pub fn get(&self, node: u64, fh: u64) -> Result<Arc<Entry<H>>, i32> {
        match self
            .shard(fh)
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fh)
        {
            Some(e) if e.node == node => Ok(e.clone()),
            _ => Err(self.missing(node, fh, false)),
        }
    }

    /// The errno for a handle not in the table: the one recorded for a handle a migration or
    /// a recovery lost (taken out of the stale set on `release`), EBADF otherwise.
    #[cold]
    fn missing(&self, node: u64, fh: u64, release: bool) -> i32 {
        let stale =
            |s: &HashMap<u64, (u64, i32)>| s.get(&fh).filter(|(n, _)| *n == node).map(|&(_, e)| e);
        let Some(errno) = stale(&self.stale.read().unwrap_or_else(|e| e.into_inner())) else {
            return libc::EBADF;
        };
        if release {
            self.stale
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&fh);
        }
        errno
    }

    /// Enter a handle under the number a previous daemon gave the guest (migration). EEXIST
    /// for a number in use; the limit is not applied (the guest holds it already).
    pub fn restore(&self, fh: u64, node: u64, handle: H) -> Result<(), i32> {
        let mut shard = self.shard(fh).write().unwrap_or_else(|e| e.into_inner());
        if fh == 0 || shard.contains_key(&fh) {
            return Err(libc::EEXIST);
        }
        shard.insert(fh, Arc::new(Entry { node, handle }));
        self.count.fetch_add(1, Ordering::Relaxed);
        drop(shard);
        self.next.fetch_max(fh.saturating_add(1), Ordering::Relaxed);
        Ok(())
    }

    /// Mark handle `fh` of `node` as lost (a migration: ESTALE; a recovery: EIO): every use
    /// gets `errno` until released.
    pub fn restore_stale(&self, fh: u64, node: u64, errno: i32) {
        self.stale
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, (node, errno));
        self.next.fetch_max(fh.saturating_add(1), Ordering::Relaxed);
    }

    /// Every handle with its number (migration: the device is stopped).
    pub fn snapshot(&self) -> Vec<(u64, Arc<Entry<H>>)> {
        let mut out = Vec::new();
        for s in &self.shards {
            let s = s.read().unwrap_or_else(|e| e.into_inner());
            out.extend(s.iter().map(|(&fh, e)| (fh, e.clone())));
        }
        out
    }

    /// Handles a migration lost and the guest has not released.
    pub fn stale_count(&self) -> usize {
        self.stale.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Remove the handle; the caller drops the last reference outside the table's lock.
    pub fn remove(&self, node: u64, fh: u64) -> Result<Arc<Entry<H>>, i32> {
        let mut shard = self.shard(fh).write().unwrap_or_else(|e| e.into_inner());
        match shard.get(&fh) {
            Some(e) if e.node == node => {
                let e = shard.remove(&fh).ok_or(libc::EBADF)?;
                self.count.fetch_sub(1, Ordering::Relaxed);
                Ok(e)
            }
            _ => {
                drop(shard);
                Err(self.missing(node, fh, true))
            }
        }
    }

    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop every handle (DESTROY, or the end of a frontend's session), and draw a new base
    /// for the next session's handle numbers.
    pub fn clear(&self) {
        self.next.store(session_base(), Ordering::Relaxed);
        let mut dropped = Vec::new();
        for s in &self.shards {
            dropped.extend(
                s.write()
                    .unwrap_or_else(|e| e.into_inner())
                    .drain()
                    .map(|(_, e)| e),
            );
        }
        self.count.store(0, Ordering::Relaxed);
        self.stale
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        drop(dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_checked_against_their_node() {
        let t = HandleTable::default();
        let fh = t.insert(7, "file").unwrap();
        assert_ne!(fh, 0);
        assert_eq!(t.get(7, fh).unwrap().handle, "file");
        assert_eq!(t.get(8, fh).unwrap_err(), libc::EBADF);
        assert_eq!(t.get(7, fh + 1000).unwrap_err(), libc::EBADF);
        assert_eq!(t.remove(8, fh).unwrap_err(), libc::EBADF);
        assert!(t.remove(7, fh).is_ok());
        assert_eq!(t.remove(7, fh).unwrap_err(), libc::EBADF);
        assert!(t.is_empty());
    }

    /// Handle numbers of a new session (a new table, or one cleared at the end of the last
    /// session) are not where the previous session's left off, nor a fixed start.
    #[test]
    fn hostile_handle_numbers_are_not_predictable_across_sessions() {
        let t = HandleTable::default();
        let first = t.insert(1, ()).unwrap();
        let last = t.insert(1, ()).unwrap();
        t.clear();
        let next_session = t.insert(1, ()).unwrap();
        assert_ne!(next_session, last + 1);
        assert_ne!(next_session, first);
        assert_eq!(t.get(1, last).unwrap_err(), libc::EBADF);
        let other = HandleTable::default().insert(1, ()).unwrap();
        assert_ne!(other, first);
        assert_ne!(other, 1);
        for fh in [first, last, next_session, other] {
            assert!(fh != 0 && fh < 1 << 62, "{fh}");
        }
    }

    #[test]
    fn restored_handles_keep_their_numbers_and_lost_ones_are_stale() {
        let t = HandleTable::default();
        t.restore(1000, 7, "file").unwrap();
        assert_eq!(t.restore(1000, 7, "again").unwrap_err(), libc::EEXIST);
        assert_eq!(t.get(7, 1000).unwrap().handle, "file");
        t.restore_stale(2000, 8, libc::ESTALE);
        assert_eq!(t.get(8, 2000).unwrap_err(), libc::ESTALE);
        // Another node's view of the lost number is a plain bad handle.
        assert_eq!(t.get(9, 2000).unwrap_err(), libc::EBADF);
        // New handles never take a restored or lost number.
        assert!(t.insert(7, "new").unwrap() > 2000);
        assert_eq!(t.snapshot().len(), 2);
        // Release of the lost handle says so once, then it is gone.
        assert_eq!(t.remove(8, 2000).unwrap_err(), libc::ESTALE);
        assert_eq!(t.get(8, 2000).unwrap_err(), libc::EBADF);
        assert_eq!(t.stale_count(), 0);
    }

    #[test]
    fn handles_are_unique() {
        let t = HandleTable::default();
        let a = t.insert(1, ()).unwrap();
        let b = t.insert(1, ()).unwrap();
        assert_ne!(a, b);
        assert_eq!(t.len(), 2);
        t.clear();
        assert!(t.is_empty());
    }

    #[test]
    fn hostile_handle_limit_is_enforced_and_released() {
        let t = HandleTable::default();
        t.set_limit(2);
        let a = t.insert(1, ()).unwrap();
        t.insert(1, ()).unwrap();
        assert!(!t.has_room());
        assert_eq!(t.insert(1, ()).unwrap_err(), libc::ENFILE);
        assert_eq!(t.len(), 2);
        // A wrong node or a second release frees nothing.
        assert!(t.remove(2, a).is_err());
        assert!(t.insert(1, ()).is_err());
        t.remove(1, a).unwrap();
        assert!(t.remove(1, a).is_err());
        t.insert(1, ()).unwrap();
        assert!(t.insert(1, ()).is_err());
        t.clear();
        assert!(t.has_room());
    }
}
