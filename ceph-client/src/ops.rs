//! The ll operations on a [`Mount`].
//!
//! An `Inode*` means something only to the client that handed it out, and only until that
//! client is shut down: every call first enters the mount ([`Mount::enter`]: ENOTCONN once a
//! [`Mount::shutdown`] began, and no shutdown frees anything while the call lasts), and gets
//! the pointer of an [`Inode`] through [`Inode::raw_on`] for that call, which fails with EXDEV
//! for an inode of another mount (the daemon holds more than one), instead of handing
//! libcephfs a pointer it does not own. The checks are one atomic add and a pointer compare.

use std::ffi::CStr;

use crate::dir::Dir;
use crate::error::{check, CephError, Result};
use crate::file::File;
use crate::inode::Inode;
use crate::mount::{Mount, Vino};
use crate::perm::UserPerm;
use crate::statx::{
    Statx, Timespec, AT_STATX_DONT_SYNC, CEPH_NOSNAP, CEPH_SETATTR_MTIME, CEPH_SETATTR_MTIME_NOW,
    CEPH_SETATTR_SIZE, CEPH_STATX_ALL_STATS, CEPH_STATX_SIZE,
};
use crate::sys;

/// Longest symlink target returned by `readlink` (1 MiB); CephFS itself caps targets far lower.
const MAX_READLINK: usize = 1 << 20;

impl Mount {
    /// `ceph_ll_lookup_root`: a reference on the mount's root inode.
    pub fn lookup_root(&self) -> Result<Inode> {
        let _call = self.enter("ceph_ll_lookup_root")?;
        let mut out = std::ptr::null_mut();
        // SAFETY: the mount is live and not shut down while `_call` lives; `out` is a valid
        // out pointer.
        let ret = unsafe { sys::ceph_ll_lookup_root(self.raw(), &mut out) };
        check("ceph_ll_lookup_root", ret)?;
        // SAFETY: on success libcephfs handed us one reference.
        unsafe { Inode::from_raw(self, "ceph_ll_lookup_root", out) }
    }

    /// `ceph_ll_lookup` of `name` in `parent` (`.` and `..` work; `..` of the mount root is
    /// the root itself).
    pub fn lookup(
        &self,
        parent: &Inode,
        name: &CStr,
        want: u32,
        flags: u32,
        perms: &UserPerm,
    ) -> Result<(Inode, Statx)> {
        let call = self.enter("ceph_ll_lookup")?;
        let parent_p = parent.raw_on(&call, "ceph_ll_lookup")?;
        let mut out = std::ptr::null_mut();
        let mut stx = Statx::default();
        // SAFETY: mount live, `parent_p` a live inode of it (`raw_on`); `name` NUL-terminated; out
        // buffers valid; `perms` outlives the call.
        let ret = unsafe {
            sys::ceph_ll_lookup(
                self.raw(),
                parent_p,
                name.as_ptr(),
                &mut out,
                &mut stx,
                want,
                flags,
                perms.as_ptr(),
            )
        };
        check("ceph_ll_lookup", ret)?;
        // SAFETY: on success libcephfs handed us one reference.
        let inode = unsafe { Inode::from_raw(self, "ceph_ll_lookup", out) }?;
        Ok((inode, stx))
    }

    /// `ceph_ll_lookup_inode`: find a live inode by number, asking the MDS if it is not
    /// cached. A vanished inode gives ESTALE.
    pub fn lookup_inode(&self, ino: u64) -> Result<Inode> {
        let _call = self.enter("ceph_ll_lookup_inode")?;
        let mut out = std::ptr::null_mut();
        // SAFETY: the mount is live and not shut down while `_call` lives; `out` is a valid
        // out pointer.
        let ret =
            unsafe { sys::ceph_ll_lookup_inode(self.raw(), sys::inodeno_t { val: ino }, &mut out) };
        check("ceph_ll_lookup_inode", ret)?;
        // SAFETY: on success libcephfs handed us one reference.
        unsafe { Inode::from_raw(self, "ceph_ll_lookup_inode", out) }
    }

    /// `ceph_ll_get_inode` of a head inode: the inode if the client has it in its cache, with
    /// no MDS request (`None` when it does not: then it holds no data or caps of it either).
    pub fn cached_inode(&self, ino: u64) -> Option<Inode> {
        let vino = Vino {
            ino,
            snapid: CEPH_NOSNAP,
        };
        let _call = self.enter("ceph_ll_get_inode").ok()?;
        // SAFETY: the mount is live and not shut down while `_call` lives; libcephfs returns
        // null or a referenced inode.
        let ptr = unsafe { sys::ceph_ll_get_inode(self.raw(), vino.into()) };
        // SAFETY: null or an inode of this mount carrying one reference, which the returned
        // value takes over (from_raw refuses null).
        unsafe { Inode::from_raw(self, "ceph_ll_get_inode", ptr) }.ok()
    }

    /// `ceph_ll_lookup_vino`: find an inode by (ino, snapid). With `CEPH_NOSNAP` this is
    /// `lookup_inode`. Pacific can only find snapshot inodes that are already in the
    /// client's cache (otherwise ESTALE).
    pub fn lookup_vino(&self, ino: u64, snapid: u64) -> Result<Inode> {
        if snapid == CEPH_NOSNAP {
            return self.lookup_inode(ino);
        }
        let _call = self.enter("ceph_ll_lookup_vino")?;
        let mut out = std::ptr::null_mut();
        let vino = Vino { ino, snapid };
        // SAFETY: the mount is live and not shut down while `_call` lives; `out` is a valid
        // out pointer.
        let ret = unsafe { sys::ceph_ll_lookup_vino(self.raw(), vino.into(), &mut out) };
        check("ceph_ll_lookup_vino", ret)?;
        // SAFETY: on success libcephfs handed us one reference.
        unsafe { Inode::from_raw(self, "ceph_ll_lookup_vino", out) }
    }

    /// `ceph_ll_getattr`.
    pub fn getattr(&self, inode: &Inode, want: u32, flags: u32, perms: &UserPerm) -> Result<Statx> {
        let call = self.enter("ceph_ll_getattr")?;
        let inode_p = inode.raw_on(&call, "ceph_ll_getattr")?;
        let mut stx = Statx::default();
        // SAFETY: mount live, `inode_p` a live inode of it (`raw_on`); `stx` a valid out buffer;
        // perms outlives the call.
        let ret = unsafe {
            sys::ceph_ll_getattr(self.raw(), inode_p, &mut stx, want, flags, perms.as_ptr())
        };
        check("ceph_ll_getattr", ret)?;
        Ok(stx)
    }

    /// `ceph_ll_setattr`: set the fields of `stx` named by `mask` (`CEPH_SETATTR_*`).
    ///
    /// A size below the one this client has cached first waits for this client's writes of
    /// the inode, those still in its cache and those on their way to the OSDs
    /// (`ceph_ll_sync_inode`, data only). The MDS truncates the RADOS objects itself, once the
    /// change is journaled, with no ordering against this client's writes; one that lands
    /// after it (libcephfs starts writing a file's buffers back at close and returns, so a
    /// close followed by an `O_TRUNC` open is enough) is trimmed by the OSD, but leaves the
    /// object grown to where it began. Nothing shows that tail until an MDS failover makes
    /// the MDS probe the objects of a file a client could write: then it becomes the file's
    /// size (tests/fs_layer/stale_tail.rs). A size at or above the cached one truncates no object.
    pub fn setattr(&self, inode: &Inode, stx: &Statx, mask: u32, perms: &UserPerm) -> Result<()> {
        if mask & CEPH_SETATTR_SIZE != 0 {
            let cached = self
                .getattr(inode, CEPH_STATX_SIZE, AT_STATX_DONT_SYNC, perms)?
                .stx_size;
            // An error (the data could not be written: EDQUOT, ENOSPC, a lost session) leaves
            // no write on its way, and must not refuse the truncation that frees the space.
            if stx.stx_size < cached {
                let _ = self.sync_inode(inode, true);
            }
        }
        let call = self.enter("ceph_ll_setattr")?;
        let inode_p = inode.raw_on(&call, "ceph_ll_setattr")?;
        let mut copy = *stx;
        let mask =
            i32::try_from(mask).map_err(|_| CephError::new("ceph_ll_setattr", libc::EINVAL))?;
        // SAFETY: mount live, `inode_p` a live inode of it (`raw_on`); `copy` is a valid statx
        // owned by this frame.
        let ret =
            unsafe { sys::ceph_ll_setattr(self.raw(), inode_p, &mut copy, mask, perms.as_ptr()) };
        check("ceph_ll_setattr", ret).map(drop)
    }

    /// `ceph_ll_readlink`: the symlink's target bytes.
    pub fn readlink(&self, inode: &Inode, perms: &UserPerm) -> Result<Vec<u8>> {
        let call = self.enter("ceph_ll_readlink")?;
        let inode_p = inode.raw_on(&call, "ceph_ll_readlink")?;
        let mut size = usize::try_from(libc::PATH_MAX).unwrap_or(4096);
        loop {
            let mut buf = vec![0u8; size];
            // SAFETY: mount live, `inode_p` a live inode of it (`raw_on`); `buf` writable for
            // `buf.len()` bytes.
            let ret = unsafe {
                sys::ceph_ll_readlink(
                    self.raw(),
                    inode_p,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    perms.as_ptr(),
                )
            };
            let n = usize::try_from(check("ceph_ll_readlink", ret)?).unwrap_or(0);
            if n < buf.len() || size >= MAX_READLINK {
                buf.truncate(n);
                return Ok(buf);
            }
            size *= 4;
        }
    }

    /// `ceph_ll_mknod` (regular files, FIFOs, sockets, devices).
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        parent: &Inode,
        name: &CStr,
        mode: u32,
        rdev: u64,
        want: u32,
        flags: u32,
        perms: &UserPerm,
    ) -> Result<(Inode, Statx)> {
        let call = self.enter("ceph_ll_mknod")?;
        let parent_p = parent.raw_on(&call, "ceph_ll_mknod")?;
        let mut out = std::ptr::null_mut();
        let mut stx = Statx::default();
        // SAFETY: mount live, `parent_p` a live inode of it (`raw_on`); `name` NUL-terminated; out
        // buffers valid.
        let ret = unsafe {
            sys::ceph_ll_mknod(
                self.raw(),
                parent_p,
                name.as_ptr(),
                mode,
                rdev,
                &mut out,
                &mut stx,
                want,
                flags,
                perms.as_ptr(),
            )
        };
        check("ceph_ll_mknod", ret)?;
        // SAFETY: on success libcephfs handed us one reference.
        let inode = unsafe { Inode::from_raw(self, "ceph_ll_mknod", out) }?;
        Ok((inode, stx))
    }

    /// `ceph_ll_mkdir`. `mkdir(dir/.snap, NAME)` creates a snapshot.
    pub fn mkdir(
        &self,
        parent: &Inode,
        name: &CStr,
        mode: u32,
        want: u32,
        flags: u32,
        perms: &UserPerm,
    ) -> Result<(Inode, Statx)> {
        let call = self.enter("ceph_ll_mkdir")?;
        let parent_p = parent.raw_on(&call, "ceph_ll_mkdir")?;
        let mut out = std::ptr::null_mut();
        let mut stx = Statx::default();
        // SAFETY: mount live, `parent_p` a live inode of it (`raw_on`); `name` NUL-terminated; out
        // buffers valid.
        let ret = unsafe {
            sys::ceph_ll_mkdir(
                self.raw(),
                parent_p,
                name.as_ptr(),
                mode,
                &mut out,
                &mut stx,
                want,
                flags,
                perms.as_ptr(),
            )
        };
        check("ceph_ll_mkdir", ret)?;
        // SAFETY: on success libcephfs handed us one reference.
        let inode = unsafe { Inode::from_raw(self, "ceph_ll_mkdir", out) }?;
        Ok((inode, stx))
    }

    /// `ceph_ll_symlink`: create `name` in `parent` pointing at `target`.
    pub fn symlink(
        &self,
        parent: &Inode,
        name: &CStr,
        target: &CStr,
        want: u32,
        flags: u32,
        perms: &UserPerm,
    ) -> Result<(Inode, Statx)> {
        let call = self.enter("ceph_ll_symlink")?;
        let parent_p = parent.raw_on(&call, "ceph_ll_symlink")?;
        let mut out = std::ptr::null_mut();
        let mut stx = Statx::default();
        // SAFETY: mount live, `parent_p` a live inode of it (`raw_on`); both strings
        // NUL-terminated; out buffers valid.
        let ret = unsafe {
            sys::ceph_ll_symlink(
                self.raw(),
                parent_p,
                name.as_ptr(),
                target.as_ptr(),
                &mut out,
                &mut stx,
                want,
                flags,
                perms.as_ptr(),
            )
        };
        check("ceph_ll_symlink", ret)?;
        // SAFETY: on success libcephfs handed us one reference.
        let inode = unsafe { Inode::from_raw(self, "ceph_ll_symlink", out) }?;
        Ok((inode, stx))
    }

    /// `ceph_ll_unlink`.
    pub fn unlink(&self, parent: &Inode, name: &CStr, perms: &UserPerm) -> Result<()> {
        let call = self.enter("ceph_ll_unlink")?;
        let parent_p = parent.raw_on(&call, "ceph_ll_unlink")?;
        // SAFETY: mount live, `parent_p` a live inode of it (`raw_on`); `name` NUL-terminated.
        let ret =
            unsafe { sys::ceph_ll_unlink(self.raw(), parent_p, name.as_ptr(), perms.as_ptr()) };
        check("ceph_ll_unlink", ret).map(drop)
    }

    /// `ceph_ll_rmdir`. `rmdir(dir/.snap, NAME)` removes a snapshot.
    pub fn rmdir(&self, parent: &Inode, name: &CStr, perms: &UserPerm) -> Result<()> {
        let call = self.enter("ceph_ll_rmdir")?;
        let parent_p = parent.raw_on(&call, "ceph_ll_rmdir")?;
        // SAFETY: mount live, `parent_p` a live inode of it (`raw_on`); `name` NUL-terminated.
        let ret =
            unsafe { sys::ceph_ll_rmdir(self.raw(), parent_p, name.as_ptr(), perms.as_ptr()) };
        check("ceph_ll_rmdir", ret).map(drop)
    }

    /// `ceph_ll_rename` (replaces an existing target like rename(2)).
    pub fn rename(
        &self,
        parent: &Inode,
        name: &CStr,
        newparent: &Inode,
        newname: &CStr,
        perms: &UserPerm,
    ) -> Result<()> {
        let call = self.enter("ceph_ll_rename")?;
        let parent_p = parent.raw_on(&call, "ceph_ll_rename")?;
        let newparent_p = newparent.raw_on(&call, "ceph_ll_rename")?;
        // SAFETY: mount live, both parents live inodes of it (`raw_on`); names NUL-terminated.
        let ret = unsafe {
            sys::ceph_ll_rename(
                self.raw(),
                parent_p,
                name.as_ptr(),
                newparent_p,
                newname.as_ptr(),
                perms.as_ptr(),
            )
        };
        check("ceph_ll_rename", ret).map(drop)
    }

    /// `ceph_ll_link` of `inode` as `newparent/name`, then its attributes (all stats,
    /// synced: nlink changed).
    pub fn link(
        &self,
        inode: &Inode,
        newparent: &Inode,
        name: &CStr,
        perms: &UserPerm,
    ) -> Result<Statx> {
        let call = self.enter("ceph_ll_link")?;
        let inode_p = inode.raw_on(&call, "ceph_ll_link")?;
        let newparent_p = newparent.raw_on(&call, "ceph_ll_link")?;
        // SAFETY: mount live, `inode_p` and `newparent_p` live inodes of it (`raw_on`); `name`
        // NUL-terminated.
        let ret = unsafe {
            sys::ceph_ll_link(
                self.raw(),
                inode_p,
                newparent_p,
                name.as_ptr(),
                perms.as_ptr(),
            )
        };
        check("ceph_ll_link", ret)?;
        self.getattr(inode, CEPH_STATX_ALL_STATS, 0, perms)
    }

    /// `ceph_ll_open` with `O_*` flags (`O_CREAT` is not allowed here: use `create`).
    ///
    /// `O_TRUNC` never reaches libcephfs: the file is opened without it and then truncated
    /// with [`Mount::truncate_to_zero`], because an OPEN that truncates can leave later writes
    /// of this client waiting forever for a `max_size` grant (see `truncate_to_zero`). The
    /// errors are those of the O_TRUNC open (EACCES without write permission); on an error
    /// after the open, the new handle is closed again.
    pub fn open(&self, inode: &Inode, oflags: i32, perms: &UserPerm) -> Result<File> {
        if oflags & libc::O_TRUNC == 0 {
            return self.open_mds_truncate(inode, oflags, perms);
        }
        let file = self.open_mds_truncate(inode, oflags & !libc::O_TRUNC, perms)?;
        self.truncate_to_zero(inode, perms)?;
        Ok(file)
    }

    /// Truncate to size 0 the way an `O_TRUNC` open must be done on libcephfs 16 (the client
    /// code below is unchanged in Ceph's main branch): with a SETATTR, never with an OPEN that
    /// carries `O_TRUNC`. Also sets mtime (and so ctime) to now, as POSIX wants of O_TRUNC on
    /// an existing file, with the `_NOW` bit so that a non-owner with write permission may.
    ///
    /// Why. `Client::get_caps` sets `wanted_max_size = endoff` for any write that ends past
    /// twice the file size, even when it ends below the current `max_size` (the first write
    /// into an empty file, retried after the MDS granted the larger max_size, does exactly
    /// that). The next cap message the client sends while it wants Fw (the ack of a cap
    /// revoke, a flush) copies it into `requested_max_size`; the MDS ignores the request (its
    /// writable range is already larger), so no grant ever resets the pair. An OPEN with
    /// `O_TRUNC` then makes the MDS reset this client's writable range to one layout
    /// increment (`Server::do_open_truncate`: 0-4 MiB); the reply installs `max_size` = 4 MiB
    /// (`add_update_inode`) and the cap grant does not reset the pair either (only a
    /// max_size *above* `wanted_max_size` does). A write ending between 4 MiB and the stale
    /// `wanted_max_size` now waits for max_size in `get_caps` and never asks the MDS for it
    /// (`wanted_max_size` is not below `requested_max_size`): it blocks forever. A SETATTR
    /// truncation leaves the writable range as it is (`Locker::calc_new_client_ranges` only
    /// grows it), so max_size stays above any stale `wanted_max_size` and nothing waits.
    /// Costs one SETATTR request; the open itself then needs no MDS request when the caps
    /// are already held. Writes are unaffected (still no MDS request each). Like any SETATTR
    /// of the size by a non-root `perms`, it also clears setuid/setgid (libcephfs adds
    /// CEPH_SETATTR_KILL_SGUID), as Linux does for a truncating caller without CAP_FSETID.
    pub fn truncate_to_zero(&self, inode: &Inode, perms: &UserPerm) -> Result<()> {
        let st = Statx {
            stx_size: 0,
            stx_mtime: Timespec::now(),
            ..Default::default()
        };
        self.setattr(
            inode,
            &st,
            CEPH_SETATTR_SIZE | CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW,
            perms,
        )
    }

    /// `ceph_ll_open` exactly as asked, `O_TRUNC` included: the libcephfs path that can leave
    /// later writes blocked forever (see [`Mount::truncate_to_zero`]). For tests that show
    /// the libcephfs bug; use [`Mount::open`].
    #[doc(hidden)]
    pub fn open_mds_truncate(&self, inode: &Inode, oflags: i32, perms: &UserPerm) -> Result<File> {
        let call = self.enter("ceph_ll_open")?;
        let inode_p = inode.raw_on(&call, "ceph_ll_open")?;
        let mut fh = std::ptr::null_mut();
        // SAFETY: mount live, `inode_p` a live inode of it (`raw_on`); `fh` a valid out pointer.
        let ret =
            unsafe { sys::ceph_ll_open(self.raw(), inode_p, oflags, &mut fh, perms.as_ptr()) };
        check("ceph_ll_open", ret)?;
        // SAFETY: on success we own the new Fh.
        unsafe { File::from_raw(self, "ceph_ll_open", fh) }
    }

    /// `ceph_ll_create`: create (or, without `O_EXCL`, open) `name` in `parent` and open it.
    ///
    /// As in [`Mount::open`], `O_TRUNC` is not passed to libcephfs: an existing file that is
    /// not empty is truncated with [`Mount::truncate_to_zero`] and its attributes read again
    /// (from the caps just obtained). A new file needs nothing, so creating costs no extra
    /// request. (An existing *empty* file keeps its mtime: it cannot be told apart from a new
    /// one here, and truncating it would change no data.)
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        parent: &Inode,
        name: &CStr,
        mode: u32,
        oflags: i32,
        want: u32,
        flags: u32,
        perms: &UserPerm,
    ) -> Result<(Inode, Statx, File)> {
        if oflags & libc::O_TRUNC == 0 {
            return self.create_unsplit(parent, name, mode, oflags, want, flags, perms);
        }
        let (inode, stx, file) = self.create_unsplit(
            parent,
            name,
            mode,
            oflags & !libc::O_TRUNC,
            want | CEPH_STATX_SIZE,
            flags,
            perms,
        )?;
        if stx.stx_mask & CEPH_STATX_SIZE != 0 && stx.stx_size == 0 {
            return Ok((inode, stx, file));
        }
        self.truncate_to_zero(&inode, perms)?;
        let stx = self.getattr(&inode, want | CEPH_STATX_SIZE, flags, perms)?;
        Ok((inode, stx, file))
    }

    #[allow(clippy::too_many_arguments)]
    fn create_unsplit(
        &self,
        parent: &Inode,
        name: &CStr,
        mode: u32,
        oflags: i32,
        want: u32,
        flags: u32,
        perms: &UserPerm,
    ) -> Result<(Inode, Statx, File)> {
        let call = self.enter("ceph_ll_create")?;
        let parent_p = parent.raw_on(&call, "ceph_ll_create")?;
        let mut out = std::ptr::null_mut();
        let mut fh = std::ptr::null_mut();
        let mut stx = Statx::default();
        // SAFETY: mount live, `parent_p` a live inode of it (`raw_on`); `name` NUL-terminated; out
        // buffers valid.
        let ret = unsafe {
            sys::ceph_ll_create(
                self.raw(),
                parent_p,
                name.as_ptr(),
                mode,
                oflags,
                &mut out,
                &mut fh,
                &mut stx,
                want,
                flags,
                perms.as_ptr(),
            )
        };
        check("ceph_ll_create", ret)?;
        // SAFETY: on success we own the new Fh (taken first, so it is closed if the inode
        // pointer were somehow null).
        let file = unsafe { File::from_raw(self, "ceph_ll_create", fh) };
        // SAFETY: on success libcephfs handed us one reference on `out`.
        let inode = unsafe { Inode::from_raw(self, "ceph_ll_create", out) };
        Ok((inode?, stx, file?))
    }

    /// `ceph_ll_opendir`.
    pub fn opendir(&self, inode: &Inode, perms: &UserPerm) -> Result<Dir> {
        let call = self.enter("ceph_ll_opendir")?;
        let inode_p = inode.raw_on(&call, "ceph_ll_opendir")?;
        let mut dirp = std::ptr::null_mut();
        // SAFETY: mount live, `inode_p` a live inode of it (`raw_on`); `dirp` a valid out pointer.
        let ret = unsafe { sys::ceph_ll_opendir(self.raw(), inode_p, &mut dirp, perms.as_ptr()) };
        check("ceph_ll_opendir", ret)?;
        // SAFETY: on success we own the new stream.
        unsafe { Dir::from_raw(self, "ceph_ll_opendir", dirp) }
    }

    /// `ceph_ll_statfs`. Without a running mgr the block counts are 0 on Pacific.
    pub fn statfs(&self, inode: &Inode) -> Result<libc::statvfs> {
        let call = self.enter("ceph_ll_statfs")?;
        let inode_p = inode.raw_on(&call, "ceph_ll_statfs")?;
        // SAFETY: statvfs is plain old data; all-zero is a valid value.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: mount live, `inode_p` a live inode of it (`raw_on`); `st` a valid out buffer
        // (64-bit layout, see layout test).
        let ret = unsafe { sys::ceph_ll_statfs(self.raw(), inode_p, &mut st) };
        check("ceph_ll_statfs", ret)?;
        Ok(st)
    }

    /// `ceph_ll_getxattr` into `buf`; returns the value's length. With an empty `buf`, only
    /// the length is returned (size query); a too small `buf` gives ERANGE; no such
    /// attribute gives ENODATA.
    pub fn getxattr(
        &self,
        inode: &Inode,
        name: &CStr,
        buf: &mut [u8],
        perms: &UserPerm,
    ) -> Result<usize> {
        let call = self.enter("ceph_ll_getxattr")?;
        let inode_p = inode.raw_on(&call, "ceph_ll_getxattr")?;
        let ptr = if buf.is_empty() {
            std::ptr::null_mut()
        } else {
            buf.as_mut_ptr()
        };
        // SAFETY: mount live, `inode_p` a live inode of it (`raw_on`); `name` NUL-terminated; `ptr`
        // null (size 0) or writable for `buf.len()` bytes.
        let ret = unsafe {
            sys::ceph_ll_getxattr(
                self.raw(),
                inode_p,
                name.as_ptr(),
                ptr.cast(),
                buf.len(),
                perms.as_ptr(),
            )
        };
        let n = check("ceph_ll_getxattr", ret)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// `ceph_ll_setxattr` (`flags`: 0, `XATTR_CREATE` or `XATTR_REPLACE`).
    pub fn setxattr(
        &self,
        inode: &Inode,
        name: &CStr,
        value: &[u8],
        flags: i32,
        perms: &UserPerm,
    ) -> Result<()> {
        let call = self.enter("ceph_ll_setxattr")?;
        let inode_p = inode.raw_on(&call, "ceph_ll_setxattr")?;
        // SAFETY: mount live, `inode_p` a live inode of it (`raw_on`); `name` NUL-terminated;
        // `value` readable for its length.
        let ret = unsafe {
            sys::ceph_ll_setxattr(
                self.raw(),
                inode_p,
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
                perms.as_ptr(),
            )
        };
        check("ceph_ll_setxattr", ret).map(drop)
    }

    /// `ceph_ll_listxattr`: NUL-separated names into `buf`; returns the list's length. With
    /// an empty `buf`, only the length (size query); too small: ERANGE.
    pub fn listxattr(&self, inode: &Inode, buf: &mut [u8], perms: &UserPerm) -> Result<usize> {
        let call = self.enter("ceph_ll_listxattr")?;
        let inode_p = inode.raw_on(&call, "ceph_ll_listxattr")?;
        let ptr = if buf.is_empty() {
            std::ptr::null_mut()
        } else {
            buf.as_mut_ptr()
        };
        let mut size: libc::size_t = 0;
        // SAFETY: mount live, `inode_p` a live inode of it (`raw_on`); `ptr` null (size 0) or
        // writable for `buf.len()` bytes; `size` a valid out pointer.
        let ret = unsafe {
            sys::ceph_ll_listxattr(
                self.raw(),
                inode_p,
                ptr.cast(),
                buf.len(),
                &mut size,
                perms.as_ptr(),
            )
        };
        check("ceph_ll_listxattr", ret)?;
        Ok(size)
    }

    /// `ceph_ll_removexattr`.
    pub fn removexattr(&self, inode: &Inode, name: &CStr, perms: &UserPerm) -> Result<()> {
        let call = self.enter("ceph_ll_removexattr")?;
        let inode_p = inode.raw_on(&call, "ceph_ll_removexattr")?;
        // SAFETY: mount live, `inode_p` a live inode of it (`raw_on`); `name` NUL-terminated.
        let ret =
            unsafe { sys::ceph_ll_removexattr(self.raw(), inode_p, name.as_ptr(), perms.as_ptr()) };
        check("ceph_ll_removexattr", ret).map(drop)
    }

    /// `ceph_ll_sync_inode`: flush one inode's dirty data (and metadata unless `datasync`).
    pub fn sync_inode(&self, inode: &Inode, datasync: bool) -> Result<()> {
        let call = self.enter("ceph_ll_sync_inode")?;
        let inode_p = inode.raw_on(&call, "ceph_ll_sync_inode")?;
        // SAFETY: mount live, `inode_p` a live inode of it (`raw_on`).
        let ret = unsafe { sys::ceph_ll_sync_inode(self.raw(), inode_p, i32::from(datasync)) };
        check("ceph_ll_sync_inode", ret).map(drop)
    }

    /// `ceph_ll_snap_seq`: the snapshot sequence number of the inode's snap realm.
    pub fn snap_seq(&self, inode: &Inode) -> Result<u64> {
        let call = self.enter("ceph_ll_snap_seq")?;
        let inode_p = inode.raw_on(&call, "ceph_ll_snap_seq")?;
        // SAFETY: mount live, `inode_p` a live inode of it (`raw_on`).
        Ok(unsafe { sys::ceph_ll_snap_seq(self.raw(), inode_p) })
    }
}
