//! Credentials: who a request comes from ([`Caller`]: its guest ids and the CephFS ids
//! `--translate-uid/--translate-gid` make of them), and one libcephfs `UserPerm` per CephFS
//! (uid, gid), made once and shared.
//!
//! The ids a request carries into the filesystem become CephFS ids here and nowhere else: the
//! caller's credentials ([`Caller::map`]) and the owners SETATTR sets ([`setattr_owners`]).
//! (The way back, attributes in replies, is `to_stat`.)
//!
//! FUSE requests carry the caller's uid and gid (not its supplementary groups), and every
//! libcephfs call checks permissions against the `UserPerm` it is given, so each request runs as
//! its guest caller. Allocating a `UserPerm` per request would put malloc/free on the hot path;
//! the cache is sharded and bounded: a guest cycling through many ids cannot grow it past
//! [`MAX_ENTRIES`] (beyond that, a `UserPerm` is made for the request and dropped after it).

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, RwLock};

use ceph_client::UserPerm;
use fuse_backend_rs::abi::fuse_abi::{stat64, SetattrValid};
use fuse_backend_rs::api::filesystem::Context;

use crate::idmap::{GuestGid, GuestUid, HostGid, HostUid, IdMapping};

use super::shards::Shards;

/// The caller of one request, on both sides: the guest's uid and gid from the request header,
/// and the CephFS uid and gid the request runs as. Made once per request by [`Caller::map`]; in
/// the operations it shadows the FUSE `Context` it was made from (under the same name, `ctx`),
/// so the raw header ids are out of reach after the first line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    guest_uid: GuestUid,
    guest_gid: GuestGid,
    uid: HostUid,
    gid: HostGid,
}

impl Caller {
    /// The caller of the request `ctx` describes; EPERM when a `forbid-guest` rule covers its
    /// uid or gid.
    pub fn map(ctx: &Context, ids: &IdMapping) -> io::Result<Caller> {
        let guest_uid = guest_uid(ctx);
        let guest_gid = GuestGid::new(ctx.gid);
        let (uid, gid) = ids.creds(guest_uid, guest_gid)?;
        Ok(Caller {
            guest_uid,
            guest_gid,
            uid,
            gid,
        })
    }

    /// Who the guest says it is (what an audit line names).
    pub fn guest_uid(&self) -> GuestUid {
        self.guest_uid
    }

    pub fn guest_gid(&self) -> GuestGid {
        self.guest_gid
    }

    /// Who CephFS checks the request as.
    pub fn host_uid(&self) -> HostUid {
        self.uid
    }

    pub fn host_gid(&self) -> HostGid {
        self.gid
    }
}

/// The guest uid of a request, for the operations that must not fail on a forbidden id
/// (FLUSH) and so make no [`Caller`].
pub fn guest_uid(ctx: &Context) -> GuestUid {
    GuestUid::new(ctx.uid)
}

/// SETATTR's new owner (chown) in CephFS ids; EPERM for a forbidden guest id.
pub fn setattr_owners(
    mut attr: stat64,
    valid: SetattrValid,
    ids: &IdMapping,
) -> io::Result<stat64> {
    if valid.contains(SetattrValid::UID) {
        attr.st_uid = ids.host_uid(GuestUid::new(attr.st_uid))?.get();
    }
    if valid.contains(SetattrValid::GID) {
        attr.st_gid = ids.host_gid(GuestGid::new(attr.st_gid))?.get();
    }
    Ok(attr)
}

const SHARDS: usize = 16;

/// Upper bound of cached credentials.
pub const MAX_ENTRIES: usize = 4096;

type Shard = RwLock<HashMap<(u32, u32), Arc<UserPerm>>>;

thread_local! {
    /// The credentials this thread used last (see [`PermCache::get`]).
    static LAST: RefCell<Option<Arc<UserPerm>>> = const { RefCell::new(None) };
}

#[derive(Debug)]
pub struct PermCache {
    shards: Shards<Shard, SHARDS>,
    /// CephFS root's credentials, which the daemon's own checks use between a caller's
    /// requests (the privilege kill, read-backs): kept apart, so they do not take the caller's
    /// place in [`LAST`].
    root: Arc<UserPerm>,
}

impl Default for PermCache {
    fn default() -> Self {
        PermCache {
            shards: Shards::new(|| RwLock::new(HashMap::new())),
            root: Arc::new(UserPerm::new(0, 0, &[0])),
        }
    }
}

impl PermCache {
    /// CephFS root's credentials.
    pub fn root(&self) -> Arc<UserPerm> {
        self.root.clone()
    }

    pub fn get(&self, uid: HostUid, gid: HostGid) -> Arc<UserPerm> {
        let (uid, gid) = (uid.get(), gid.get());
        if (uid, gid) == (0, 0) {
            return self.root();
        }
        // Most requests in a row come from one caller: the credentials this thread used last,
        // without hashing or a lock. (A `UserPerm` is the ids alone, tied to no cache or mount.)
        let last = LAST.with(|l| {
            l.borrow()
                .as_ref()
                .filter(|p| p.uid() == uid && p.gid() == gid)
                .cloned()
        });
        if let Some(p) = last {
            return p;
        }
        let perm = self.lookup(uid, gid);
        LAST.with(|l| *l.borrow_mut() = Some(perm.clone()));
        perm
    }

    fn lookup(&self, uid: u32, gid: u32) -> Arc<UserPerm> {
        let shard = self.shards.get(u64::from(uid ^ gid.rotate_left(16)));
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

    fn ctx(uid: u32, gid: u32) -> Context {
        let mut c = Context::new();
        (c.uid, c.gid) = (uid, gid);
        c
    }

    fn ids(uid: &[&str], gid: &[&str]) -> IdMapping {
        let rules = |l: &[&str]| l.iter().map(|r| r.parse().unwrap()).collect::<Vec<_>>();
        IdMapping::new(&rules(uid), &rules(gid)).unwrap()
    }

    #[test]
    fn a_caller_carries_both_sides_and_forbidden_ids_are_eperm() {
        let m = ids(
            &["map:1000:5000:1", "forbid-guest:666:1"],
            &["squash-guest:0:7:10"],
        );
        let c = Caller::map(&ctx(1000, 3), &m).unwrap();
        assert_eq!(
            (c.guest_uid(), c.guest_gid()),
            (GuestUid::new(1000), GuestGid::new(3))
        );
        assert_eq!(
            (c.host_uid(), c.host_gid()),
            (HostUid::new(5000), HostGid::new(7))
        );
        for (u, g) in [(666, 0), (0, 0)] {
            let r = Caller::map(&ctx(u, g), &m).map(|c| c.host_uid().get());
            if u == 666 {
                assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EPERM));
            } else {
                assert_eq!(r.unwrap(), 0);
            }
        }
        let plain = Caller::map(&ctx(1000, 3), &IdMapping::default()).unwrap();
        assert_eq!((plain.host_uid().get(), plain.host_gid().get()), (1000, 3));
    }

    #[test]
    fn setattr_maps_only_the_owners_it_sets() {
        let m = ids(
            &["map:1000:5000:1", "forbid-guest:666:1"],
            &["map:1000:6000:1"],
        );
        // SAFETY: stat64 is a plain C struct of integers; all-zero is a valid value.
        let mut a: stat64 = unsafe { std::mem::zeroed() };
        (a.st_uid, a.st_gid) = (1000, 1000);
        let both = setattr_owners(a, SetattrValid::UID | SetattrValid::GID, &m).unwrap();
        assert_eq!((both.st_uid, both.st_gid), (5000, 6000));
        let gid_only = setattr_owners(a, SetattrValid::GID, &m).unwrap();
        assert_eq!((gid_only.st_uid, gid_only.st_gid), (1000, 6000));
        a.st_uid = 666;
        let e = setattr_owners(a, SetattrValid::UID, &m).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        assert!(
            setattr_owners(a, SetattrValid::MODE, &m).is_ok(),
            "uid not set: not checked"
        );
    }

    #[test]
    fn same_ids_share_one_userperm() {
        let c = PermCache::default();
        let get = |u, g| c.get(HostUid::new(u), HostGid::new(g));
        let a = get(1000, 100);
        let b = get(1000, 100);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.uid(), 1000);
        assert_eq!(a.gid(), 100);
        assert!(!Arc::ptr_eq(&a, &get(1000, 101)));
    }

    #[test]
    fn the_cache_is_bounded() {
        let c = PermCache::default();
        for uid in 0..(MAX_ENTRIES as u32 * 2) {
            let p = c.get(HostUid::new(uid), HostGid::ROOT);
            assert_eq!(p.uid(), uid);
        }
        let total: usize = c.shards.iter().map(|s| s.read().unwrap().len()).sum();
        assert!(total <= MAX_ENTRIES);
    }
}
