//! `UserPerm`: the credentials libcephfs checks permissions against.

use std::ptr::NonNull;

use crate::sys;

/// Largest supplementary group list passed to libcephfs (Linux `NGROUPS_MAX`); longer lists
/// are truncated.
pub const MAX_GROUPS: usize = 65536;

/// Owned `UserPerm*` (uid, gid, supplementary groups).
///
/// `ceph_userperm_new` does NOT copy the gid list, it keeps the pointer: this type owns the
/// list in a heap allocation that never moves and outlives the C object (it is freed after
/// `ceph_userperm_destroy`, which runs exactly once, in `Drop`).
pub struct UserPerm {
    ptr: NonNull<sys::UserPerm>,
    uid: u32,
    gid: u32,
    // Read by libcephfs through `ptr`; dropped after `ptr` is destroyed (see `Drop`).
    gids: Box<[libc::gid_t]>,
}

// SAFETY: a UserPerm is immutable after creation: libcephfs only reads it through the
// `const UserPerm*` its calls take, and the gid list it points to is never written after
// construction. Destruction happens once, in Drop, which needs exclusive ownership.
unsafe impl Send for UserPerm {}
// SAFETY: see Send: every shared use is a read of immutable data.
unsafe impl Sync for UserPerm {}

impl UserPerm {
    /// Credentials of `uid`/`gid` with the supplementary groups `groups` (truncated to
    /// `MAX_GROUPS`).
    pub fn new(uid: u32, gid: u32, groups: &[u32]) -> UserPerm {
        let groups = groups.get(..MAX_GROUPS).unwrap_or(groups);
        let mut gids: Box<[libc::gid_t]> = groups.into();
        let ngids = libc::c_int::try_from(gids.len()).unwrap_or(0);
        let list = if gids.is_empty() {
            std::ptr::null_mut()
        } else {
            gids.as_mut_ptr()
        };
        // SAFETY: `list` is null with ngids 0, or points to `ngids` gids in a boxed slice
        // owned by the returned value, which keeps it alive (and unmoved: moving the Box moves
        // only its pointer) until after ceph_userperm_destroy in Drop.
        let raw = unsafe { sys::ceph_userperm_new(uid, gid, ngids, list) };
        let Some(ptr) = NonNull::new(raw) else {
            // ceph_userperm_new only fails when `new` fails: out of memory.
            std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u64; 8]>());
        };
        UserPerm {
            ptr,
            uid,
            gid,
            gids,
        }
    }

    /// uid 0, gid 0, no supplementary groups.
    pub fn root() -> UserPerm {
        UserPerm::new(0, 0, &[])
    }

    /// The uid.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The primary gid.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// The supplementary groups.
    pub fn groups(&self) -> &[u32] {
        &self.gids
    }

    /// The raw pointer, for the `const UserPerm*` argument of ll calls.
    pub fn as_ptr(&self) -> *const sys::UserPerm {
        self.ptr.as_ptr()
    }
}

impl Drop for UserPerm {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from ceph_userperm_new and is destroyed only here, once; no
        // call using it can be running because we have `&mut self`. The gid list is freed
        // after this (fields drop after Drop::drop).
        unsafe { sys::ceph_userperm_destroy(self.ptr.as_ptr()) };
    }
}

impl std::fmt::Debug for UserPerm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserPerm")
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("groups", &self.gids)
            .finish()
    }
}
