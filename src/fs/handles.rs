//! The handle table: FUSE file handles → open CephFS files and directory streams.
//!
//! Handles are ours (a counter, never a pointer). Every handle the guest sends is looked up and
//! checked against the node id it came with: an unknown handle, or one that belongs to another
//! node, is EBADF — never a dereference. Sharded like the node table, so that opens and releases
//! on different handles do not serialise on one lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

const SHARDS: u64 = 64;

#[derive(Debug)]
pub struct HandleTable<H> {
    shards: Vec<RwLock<HashMap<u64, Arc<Entry<H>>>>>,
    next: AtomicU64,
}

/// One open handle and the node it was opened on.
#[derive(Debug)]
pub struct Entry<H> {
    pub node: u64,
    pub handle: H,
}

impl<H> Default for HandleTable<H> {
    fn default() -> Self {
        let mut shards = Vec::new();
        shards.resize_with(SHARDS as usize, || RwLock::new(HashMap::new()));
        HandleTable {
            shards,
            // 0 is never handed out: some guests treat it as "no handle".
            next: AtomicU64::new(1),
        }
    }
}

impl<H> HandleTable<H> {
    fn shard(&self, fh: u64) -> &RwLock<HashMap<u64, Arc<Entry<H>>>> {
        // Handles are sequential: the low bits spread them over the shards. The modulo keeps the
        // index in range.
        &self.shards[(fh % SHARDS) as usize]
    }

    pub fn insert(&self, node: u64, handle: H) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.shard(fh)
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, Arc::new(Entry { node, handle }));
        fh
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
            _ => Err(libc::EBADF),
        }
    }

    /// Remove the handle; the caller drops the last reference outside the table's lock.
    pub fn remove(&self, node: u64, fh: u64) -> Result<Arc<Entry<H>>, i32> {
        let mut shard = self.shard(fh).write().unwrap_or_else(|e| e.into_inner());
        match shard.get(&fh) {
            Some(e) if e.node == node => Ok(shard.remove(&fh).ok_or(libc::EBADF)?),
            _ => Err(libc::EBADF),
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

    /// Drop every handle (DESTROY).
    pub fn clear(&self) {
        let mut dropped = Vec::new();
        for s in &self.shards {
            dropped.extend(
                s.write()
                    .unwrap_or_else(|e| e.into_inner())
                    .drain()
                    .map(|(_, e)| e),
            );
        }
        drop(dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_checked_against_their_node() {
        let t = HandleTable::default();
        let fh = t.insert(7, "file");
        assert_ne!(fh, 0);
        assert_eq!(t.get(7, fh).unwrap().handle, "file");
        assert_eq!(t.get(8, fh).unwrap_err(), libc::EBADF);
        assert_eq!(t.get(7, fh + 1000).unwrap_err(), libc::EBADF);
        assert_eq!(t.remove(8, fh).unwrap_err(), libc::EBADF);
        assert!(t.remove(7, fh).is_ok());
        assert_eq!(t.remove(7, fh).unwrap_err(), libc::EBADF);
        assert!(t.is_empty());
    }

    #[test]
    fn handles_are_unique() {
        let t = HandleTable::default();
        let a = t.insert(1, ());
        let b = t.insert(1, ());
        assert_ne!(a, b);
        assert_eq!(t.len(), 2);
        t.clear();
        assert!(t.is_empty());
    }
}
