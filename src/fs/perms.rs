//! Credentials: one libcephfs `UserPerm` per (uid, gid) the guest uses, made once and shared.
//!
//! FUSE requests carry the caller's uid and gid (not its supplementary groups), and every
//! libcephfs call checks permissions against the `UserPerm` it is given, so each request runs as
//! its guest caller. Allocating a `UserPerm` per request would put malloc/free on the hot path;
//! the cache is sharded and bounded: a guest cycling through many ids cannot grow it past
//! [`MAX_ENTRIES`] (beyond that, a `UserPerm` is made for the request and dropped after it).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use ceph_client::UserPerm;

const SHARDS: usize = 16;

/// Upper bound of cached credentials.
pub const MAX_ENTRIES: usize = 4096;

type Shard = RwLock<HashMap<(u32, u32), Arc<UserPerm>>>;

#[derive(Debug)]
pub struct PermCache {
    shards: Vec<Shard>,
}

impl Default for PermCache {
    fn default() -> Self {
        let mut shards = Vec::new();
        shards.resize_with(SHARDS, || RwLock::new(HashMap::new()));
        PermCache { shards }
    }
}

impl PermCache {
    pub fn get(&self, uid: u32, gid: u32) -> Arc<UserPerm> {
        let shard = super::shard(&self.shards, u64::from(uid ^ gid.rotate_left(16)));
        if let Some(p) = shard
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(uid, gid))
        {
            return p.clone();
        }
        let perm = Arc::new(UserPerm::new(uid, gid, &[gid]));
        let mut w = shard.write().unwrap_or_else(|e| e.into_inner());
        if w.len() < MAX_ENTRIES / SHARDS {
            w.entry((uid, gid)).or_insert_with(|| perm.clone()).clone()
        } else {
            perm
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_ids_share_one_userperm() {
        let c = PermCache::default();
        let a = c.get(1000, 100);
        let b = c.get(1000, 100);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.uid(), 1000);
        assert_eq!(a.gid(), 100);
        assert!(!Arc::ptr_eq(&a, &c.get(1000, 101)));
    }

    #[test]
    fn the_cache_is_bounded() {
        let c = PermCache::default();
        for uid in 0..(MAX_ENTRIES as u32 * 2) {
            let p = c.get(uid, 0);
            assert_eq!(p.uid(), uid);
        }
        let total: usize = c.shards.iter().map(|s| s.read().unwrap().len()).sum();
        assert!(total <= MAX_ENTRIES);
    }
}
