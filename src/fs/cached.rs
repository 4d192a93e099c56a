//! Which inodes libcephfs's object cache may hold data of.
//!
//! libcephfs writes O_DIRECT data straight to the OSDs and leaves what its object cache holds
//! of the range in place: a later buffered read would return the old bytes. Writing O_DIRECT
//! data through the cache instead (an O_DSYNC handle: into the cache, then that range flushed)
//! keeps the cache right, but costs a 4 KiB write about half again as much CPU in libcephfs.
//! So the cached path is taken only for inodes whose data may be in the cache, and the cache
//! only gets data of an inode through buffered I/O of this daemon (reads, writes, readahead on a
//! handle without O_DIRECT): the first buffered READ or WRITE through a handle marks its inode
//! here, before it reaches libcephfs.
//!
//! A mark outlives the handle and the guest's node: libcephfs keeps cached data of a closed
//! file for as long as it keeps the inode. Marks are dropped only for inodes libcephfs no
//! longer has in its cache (then it has none of their data either), found by asking it when a
//! shard has grown past its bound. The table is sharded like the node table: marking and
//! asking take one shard lock for a map operation, never while calling into libcephfs.

use std::collections::HashMap;
use std::sync::Mutex;

use super::shards::Shards;

const SHARDS: usize = 64;

/// A shard with more marks than this asks libcephfs which of its inodes are still cached.
/// libcephfs keeps about `client_cache_size` (`--inode-cache`, 8192) unreferenced inodes.
const SHARD_BOUND: usize = 512;

/// Inode numbers whose data libcephfs's object cache may hold.
#[derive(Debug)]
pub struct CachedInodes {
    /// ino → how many times it was marked: a mark renewed while its inode was being checked
    /// is not dropped.
    shards: Shards<Mutex<HashMap<u64, u64>>, SHARDS>,
}

impl Default for CachedInodes {
    fn default() -> Self {
        CachedInodes {
            shards: Shards::new(|| Mutex::new(HashMap::new())),
        }
    }
}

impl CachedInodes {
    fn shard(&self, ino: u64) -> &Mutex<HashMap<u64, u64>> {
        // Inode numbers are sequential: the low bits spread them.
        self.shards.get(ino)
    }

    /// Note that the cache may get data of `ino`. True when the shard has grown past its bound
    /// and the caller should [`prune`](Self::prune) it.
    pub fn mark(&self, ino: u64) -> bool {
        let mut s = self.shard(ino).lock().unwrap_or_else(|e| e.into_inner());
        *s.entry(ino).or_insert(0) += 1;
        s.len() > SHARD_BOUND
    }

    /// Whether the cache may hold data of `ino`.
    pub fn contains(&self, ino: u64) -> bool {
        self.shard(ino)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&ino)
    }

    /// Drop the marks of `ino`'s shard whose inodes `still_cached` says libcephfs no longer
    /// has. The question is asked without the shard lock; a mark renewed meanwhile stays.
    pub fn prune(&self, ino: u64, still_cached: impl Fn(u64) -> bool) {
        let shard = self.shard(ino);
        let seen: Vec<(u64, u64)> = shard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(&i, &n)| (i, n))
            .collect();
        let gone: Vec<(u64, u64)> = seen
            .into_iter()
            .filter(|&(i, _)| !still_cached(i))
            .collect();
        let mut s = shard.lock().unwrap_or_else(|e| e.into_inner());
        for (i, n) in gone {
            if s.get(&i) == Some(&n) {
                s.remove(&i);
            }
        }
    }

    /// Marks held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_kept_until_libcephfs_forgets_the_inode() {
        let c = CachedInodes::default();
        assert!(!c.contains(7));
        assert!(!c.mark(7));
        assert!(c.contains(7));
        assert!(!c.contains(7 + SHARDS as u64));
        c.prune(7, |_| true);
        assert!(c.contains(7), "still cached: kept");
        c.prune(7, |_| false);
        assert!(!c.contains(7), "gone from libcephfs: dropped");
    }

    #[test]
    fn a_mark_renewed_during_the_check_stays() {
        let c = CachedInodes::default();
        c.mark(3);
        c.prune(3, |i| {
            // Buffered I/O starts on the inode while libcephfs is being asked about it.
            c.mark(i);
            false
        });
        assert!(c.contains(3));
    }

    #[test]
    fn a_full_shard_asks_to_be_pruned() {
        let c = CachedInodes::default();
        let asks: Vec<bool> = (0..=SHARD_BOUND as u64)
            .map(|k| c.mark(k * SHARDS as u64))
            .collect();
        assert_eq!(
            asks.iter().filter(|&&a| a).count(),
            1,
            "only past the bound"
        );
        assert!(asks[SHARD_BOUND]);
        assert_eq!(c.len(), SHARD_BOUND + 1);
        c.prune(0, |i| i < 10 * SHARDS as u64);
        assert_eq!(c.len(), 10);
        assert!(!c.mark(SHARDS as u64), "below the bound again");
    }
}
