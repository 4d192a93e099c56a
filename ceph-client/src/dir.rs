//! `Dir`: an open directory stream (`ceph_dir_result*`).

use std::ptr::NonNull;

use crate::error::{check, CephError, Result};
use crate::inode::Inode;
use crate::mount::Mount;
use crate::statx::Statx;
use crate::sys;

/// One entry returned by [`Dir::readdirplus`].
#[derive(Debug)]
pub struct DirEntryPlus {
    /// Entry name, without NUL (`.` and `..` included).
    pub name: Vec<u8>,
    /// Inode number (`d_ino`).
    pub ino: u64,
    /// `DT_*` type.
    pub d_type: u8,
    /// Stream position just after this entry (`ceph_telldir`): `seekdir(offset)` resumes with
    /// the next entry. Opaque 64-bit hash position, not an index.
    pub offset: i64,
    /// Attributes of the entry's inode (fields named by `statx.stx_mask`).
    pub statx: Statx,
    /// A reference on the entry's inode, if asked for.
    pub inode: Option<Inode>,
}

/// Owns one open directory stream (released with `ceph_ll_releasedir` exactly once, in
/// Drop) and keeps the mount alive. Reading and seeking take `&mut self`: a stream has one
/// position, so concurrent users must serialise (e.g. a `Mutex<Dir>`).
pub struct Dir {
    dirp: NonNull<sys::ceph_dir_result>,
    mount: Mount,
}

// SAFETY: libcephfs protects the stream's state with `client_lock`; all position-changing
// methods take `&mut self`, so two threads can never interleave on one stream through this
// API. The pointer is never dereferenced here.
unsafe impl Send for Dir {}
// SAFETY: shared (`&Dir`) access only reads the position (`telldir`), under `client_lock`.
unsafe impl Sync for Dir {}

impl Dir {
    /// # Safety
    /// `dirp` must be a stream just opened on `mount` whose ownership the caller transfers.
    pub(crate) unsafe fn from_raw(
        mount: &Mount,
        op: &'static str,
        dirp: *mut sys::ceph_dir_result,
    ) -> Result<Dir> {
        let dirp = NonNull::new(dirp).ok_or(CephError::new(op, libc::EIO))?;
        Ok(Dir {
            dirp,
            mount: mount.clone(),
        })
    }

    /// `ceph_readdirplus_r`: the next entry with its attributes (`want`/`flags` as for
    /// getattr), or `None` at the end of the directory. With `with_inode`, the entry carries
    /// a reference on its inode (costs a reference count, not an MDS round trip).
    pub fn readdirplus(
        &mut self,
        want: u32,
        flags: u32,
        with_inode: bool,
    ) -> Result<Option<DirEntryPlus>> {
        // ENOTCONN after a shutdown began: ceph_unmount releases the stream.
        let _call = self.mount.enter("ceph_readdirplus_r")?;
        // SAFETY: dirent is plain old data; all-zero is a valid value.
        let mut de: libc::dirent = unsafe { std::mem::zeroed() };
        let mut stx = Statx::default();
        let mut out: *mut sys::Inode = std::ptr::null_mut();
        let outp: *mut *mut sys::Inode = if with_inode {
            &mut out
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: the mount is live and not shut down while `_call` lives, so the stream is
        // open; `de`, `stx` and `outp` (null or pointing to
        // `out`) are valid out buffers for the call; `&mut self` excludes concurrent use.
        let ret = unsafe {
            sys::ceph_readdirplus_r(
                self.mount.raw(),
                self.dirp.as_ptr(),
                &mut de,
                &mut stx,
                want,
                flags,
                outp,
            )
        };
        if check("ceph_readdirplus_r", ret)? == 0 {
            return Ok(None);
        }
        let inode = if with_inode {
            // SAFETY: on success libcephfs took one reference on `out` for us.
            Some(unsafe { Inode::from_raw(&self.mount, "ceph_readdirplus_r", out) }?)
        } else {
            None
        };
        let name: Vec<u8> = de
            .d_name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| u8::from_ne_bytes(c.to_ne_bytes()))
            .collect();
        Ok(Some(DirEntryPlus {
            name,
            ino: de.d_ino,
            d_type: de.d_type,
            offset: self.telldir(),
            statx: stx,
            inode,
        }))
    }

    /// `ceph_telldir`: the current stream position (0 after [`Mount::shutdown`]).
    pub fn telldir(&self) -> i64 {
        let Ok(_call) = self.mount.enter("ceph_telldir") else {
            return 0;
        };
        // SAFETY: the mount is live and not shut down while `_call` lives, so the stream is
        // open.
        unsafe { sys::ceph_telldir(self.mount.raw(), self.dirp.as_ptr()) }
    }

    /// `ceph_seekdir`: continue from a position previously returned by `telldir` (or an
    /// entry's `offset`). 0 is the start. Does nothing after [`Mount::shutdown`] (the next
    /// read fails with ENOTCONN).
    pub fn seekdir(&mut self, offset: i64) {
        let Ok(_call) = self.mount.enter("ceph_seekdir") else {
            return;
        };
        // SAFETY: the mount is live and not shut down while `_call` lives, so the stream is
        // open; exclusive access via `&mut self`.
        unsafe { sys::ceph_seekdir(self.mount.raw(), self.dirp.as_ptr(), offset) }
    }

    /// `ceph_rewinddir`: back to the start (nothing after [`Mount::shutdown`], as `seekdir`).
    pub fn rewinddir(&mut self) {
        let Ok(_call) = self.mount.enter("ceph_rewinddir") else {
            return;
        };
        // SAFETY: the mount is live and not shut down while `_call` lives, so the stream is
        // open; exclusive access via `&mut self`.
        unsafe { sys::ceph_rewinddir(self.mount.raw(), self.dirp.as_ptr()) }
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // After a shutdown began there is nothing to release: the unmount frees the stream.
        if let Ok(_call) = self.mount.enter("ceph_ll_releasedir") {
            // SAFETY: we own the stream and release it only here; the mount is live because
            // `self.mount` drops after this, and no shutdown frees the stream while `_call`
            // lives.
            unsafe { sys::ceph_ll_releasedir(self.mount.raw(), self.dirp.as_ptr()) };
        }
    }
}

impl std::fmt::Debug for Dir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Dir").field(&self.dirp).finish()
    }
}
