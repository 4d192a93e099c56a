//! `Inode`: one counted libcephfs inode reference.

use std::ptr::NonNull;

use crate::error::{check, CephError, Result};
use crate::mount::{Call, Mount, Vino};
use crate::statx::{Statx, AT_STATX_DONT_SYNC, CEPH_STATX_INO};
use crate::sys;

/// Owns one reference on a libcephfs `Inode*` (released with `ceph_ll_put` in Drop, exactly
/// once) and keeps its mount alive.
pub struct Inode {
    ptr: NonNull<sys::Inode>,
    mount: Mount,
}

// SAFETY: the reference count and every use of the Inode inside libcephfs are protected by
// its `client_lock` (ceph_ll_put, ceph_ll_getattr… all take it); the pointer is only passed
// to libcephfs, never dereferenced here. See the crate docs for the mount-level argument.
unsafe impl Send for Inode {}
// SAFETY: see Send; `&Inode` only allows passing the pointer to thread-safe ll calls.
unsafe impl Sync for Inode {}

impl Inode {
    /// Takes ownership of one reference that libcephfs just handed out on `mount`.
    ///
    /// # Safety
    /// `ptr` must be null or an `Inode*` obtained from `mount` carrying one reference that the
    /// caller transfers to the returned value (nobody else will put it).
    pub(crate) unsafe fn from_raw(
        mount: &Mount,
        op: &'static str,
        ptr: *mut sys::Inode,
    ) -> Result<Inode> {
        let ptr = NonNull::new(ptr).ok_or(CephError::new(op, libc::EIO))?;
        Ok(Inode {
            ptr,
            mount: mount.clone(),
        })
    }

    /// The raw pointer: for identity comparisons and for passing to libcephfs.
    pub fn as_ptr(&self) -> *mut sys::Inode {
        self.ptr.as_ptr()
    }

    /// The pointer to pass to libcephfs in `call`: EXDEV if this inode belongs to another mount
    /// (libcephfs would take it for one of its own). A call exists only while its mount is not
    /// shut down ([`Mount::enter`]: ENOTCONN after), and no shutdown frees the inode while it
    /// lives. A pointer compare.
    pub(crate) fn raw_on(&self, call: &Call<'_>, op: &'static str) -> Result<*mut sys::Inode> {
        if !self.mount.same_mount(call.mount()) {
            return Err(CephError::new(op, libc::EXDEV));
        }
        Ok(self.ptr.as_ptr())
    }

    /// The mount this inode belongs to.
    pub fn mount(&self) -> &Mount {
        &self.mount
    }

    /// The inode's vino from the client's cached attributes (no MDS round trip):
    /// `stx_ino` and `stx_dev` (which libcephfs fills with the snapid).
    pub fn vino(&self) -> Result<Vino> {
        let call = self.mount.enter("ceph_ll_getattr")?;
        let ptr = self.raw_on(&call, "ceph_ll_getattr")?;
        let mut stx = Statx::default();
        // SAFETY: the mount is live (held by self); `ptr` is a referenced inode of it, not
        // freed by a shutdown while `call` lives; `stx` is a valid out buffer; the mount's own
        // perms pointer is owned by the mount.
        let ret = unsafe {
            let perms = sys::ceph_mount_perms(self.mount.raw());
            sys::ceph_ll_getattr(
                self.mount.raw(),
                ptr,
                &mut stx,
                CEPH_STATX_INO,
                AT_STATX_DONT_SYNC,
                perms,
            )
        };
        check("ceph_ll_getattr", ret)?;
        Ok(Vino {
            ino: stx.stx_ino,
            snapid: stx.stx_dev,
        })
    }

    /// A second, independently owned reference to the same inode.
    ///
    /// Pacific exports no `ceph_ll_get`: this reads the vino from the cached attributes and
    /// calls `ceph_ll_get_inode(vino)`, which looks the inode up in the client's inode map
    /// (no MDS round trip; it is there since `self` holds a reference) and takes a reference.
    /// The result is the same `Inode*` (`as_ptr` equal).
    pub fn try_clone(&self) -> Result<Inode> {
        let vino = self.vino()?;
        let _call = self.mount.enter("ceph_ll_get_inode")?;
        // SAFETY: the mount is live and not shut down while `_call` lives; ceph_ll_get_inode
        // returns null or a referenced Inode* whose reference we take over.
        let raw = unsafe { sys::ceph_ll_get_inode(self.mount.raw(), vino.into()) };
        if raw.is_null() {
            return Err(CephError::new("ceph_ll_get_inode", libc::ESTALE));
        }
        // SAFETY: `raw` carries one fresh reference from this mount.
        unsafe { Inode::from_raw(&self.mount, "ceph_ll_get_inode", raw) }
    }
}

impl Drop for Inode {
    fn drop(&mut self) {
        // After a shutdown began there is nothing to release: the unmount frees every inode.
        if let Ok(_call) = self.mount.enter("ceph_ll_put") {
            // SAFETY: we own exactly one reference on `ptr`, released only here; the mount is
            // still live because `self.mount` is dropped after this, and no shutdown frees the
            // inode while `_call` lives.
            unsafe { sys::ceph_ll_put(self.mount.raw(), self.ptr.as_ptr()) };
        }
    }
}

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Inode").field(&self.ptr).finish()
    }
}
