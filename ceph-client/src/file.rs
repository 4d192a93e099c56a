//! `File`: an open libcephfs file handle (`Fh*`).

use std::io::{IoSlice, IoSliceMut};
use std::ptr::NonNull;

use crate::error::{check, CephError, Result};
use crate::mount::{Call, Mount};
use crate::sys;

/// Largest single transfer passed to libcephfs (its read/write calls return `int`).
#[allow(clippy::as_conversions)] // i32::MAX widens to usize; `From` is not const
pub(crate) const MAX_IO: usize = i32::MAX as usize;

fn to_i64(op: &'static str, v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| CephError::new(op, libc::EINVAL))
}

/// Owns one open `Fh*` (closed with `ceph_ll_close` exactly once: in [`File::close`] or in
/// Drop) and keeps the mount alive.
///
/// All I/O is positional; the handle's own file position is only used by `lseek(SEEK_CUR)`.
pub struct File {
    fh: Option<NonNull<sys::Fh>>,
    mount: Mount,
}

// SAFETY: libcephfs serialises every Fh operation under `client_lock` (ll_read/ll_write drop
// it while waiting for OSDs but keep the Fh referenced), and positional I/O does not touch
// the Fh's shared position. The pointer is never dereferenced here.
unsafe impl Send for File {}
// SAFETY: see Send.
unsafe impl Sync for File {}

impl File {
    /// # Safety
    /// `fh` must be a non-null `Fh*` just opened on `mount`, whose ownership (the duty to
    /// close it) the caller transfers to the returned value.
    pub(crate) unsafe fn from_raw(
        mount: &Mount,
        op: &'static str,
        fh: *mut sys::Fh,
    ) -> Result<File> {
        let fh = NonNull::new(fh).ok_or(CephError::new(op, libc::EIO))?;
        Ok(File {
            fh: Some(fh),
            mount: mount.clone(),
        })
    }

    /// The `Fh*` to pass to a call, with the [`Call`] that keeps it open: ENOTCONN once a
    /// shutdown of the mount began (`ceph_unmount` closes and frees it), and no shutdown frees
    /// it while the `Call` lives. One atomic add.
    fn live(&self, op: &'static str) -> Result<(Call<'_>, *mut sys::Fh)> {
        let call = self.mount.enter(op)?;
        // `fh` is only None inside close()/drop(), after which self is gone.
        Ok((call, self.as_ptr()))
    }

    /// The mount the handle is open on.
    #[cfg_attr(not(libcephfs_nonblocking), allow(dead_code))]
    pub(crate) fn mount_ref(&self) -> &Mount {
        &self.mount
    }

    /// The raw `Fh*` (for identity comparisons).
    pub fn as_ptr(&self) -> *mut sys::Fh {
        self.fh.map_or(std::ptr::null_mut(), NonNull::as_ptr)
    }

    /// `ceph_ll_close`, reporting its error (the handle is gone either way). After
    /// [`Mount::shutdown`] there is nothing left to close: Ok.
    pub fn close(mut self) -> Result<()> {
        let Some(fh) = self.fh.take() else {
            return Ok(());
        };
        let Ok(_call) = self.mount.enter("ceph_ll_close") else {
            // A shutdown began: the unmount closes the handle.
            return Ok(());
        };
        // SAFETY: we own the Fh and close it exactly once (the field is now None, so Drop
        // will not close it again); the mount is live, and no shutdown frees the Fh while
        // `_call` lives.
        check("ceph_ll_close", unsafe {
            sys::ceph_ll_close(self.mount.raw(), fh.as_ptr())
        })
        .map(drop)
    }

    /// `ceph_ll_read` at `off` into `buf` (at most `i32::MAX` bytes); returns the bytes read
    /// (0 at or past end of file).
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<usize> {
        let (_call, fh) = self.live("ceph_ll_read")?;
        let off = to_i64("ceph_ll_read", off)?;
        let len = buf.len().min(MAX_IO);
        let len64 = u64::try_from(len).map_err(|_| CephError::new("ceph_ll_read", libc::EINVAL))?;
        // SAFETY: `buf` is writable for `len` bytes; the mount is live and `fh` open on it
        // (`live`).
        let ret =
            unsafe { sys::ceph_ll_read(self.mount.raw(), fh, off, len64, buf.as_mut_ptr().cast()) };
        let n = check("ceph_ll_read", ret)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// `ceph_ll_write` of `buf` (at most `i32::MAX` bytes) at `off`; returns the bytes written.
    pub fn write(&self, off: u64, buf: &[u8]) -> Result<usize> {
        let (_call, fh) = self.live("ceph_ll_write")?;
        let off = to_i64("ceph_ll_write", off)?;
        let len = buf.len().min(MAX_IO);
        let len64 =
            u64::try_from(len).map_err(|_| CephError::new("ceph_ll_write", libc::EINVAL))?;
        // SAFETY: `buf` is readable for `len` bytes; the mount is live and `fh` open on it
        // (`live`).
        let ret =
            unsafe { sys::ceph_ll_write(self.mount.raw(), fh, off, len64, buf.as_ptr().cast()) };
        let n = check("ceph_ll_write", ret)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// `ceph_ll_readv`: scatter-read at `off` into `cnt` buffers described by `iov`.
    ///
    /// # Safety
    /// `iov` must point to `cnt` valid `iovec`s, each describing memory that is valid for
    /// writes of `iov_len` bytes for the whole call and not accessed through any Rust
    /// reference meanwhile (guest memory may be written concurrently by the guest itself:
    /// that only makes the data racy for the guest, not unsound for us, as long as the
    /// mapping stays in place for the call).
    pub unsafe fn readv_raw(&self, iov: *const libc::iovec, cnt: usize, off: i64) -> Result<usize> {
        let (_call, fh) = self.live("ceph_ll_readv")?;
        let cnt = libc::c_int::try_from(cnt)
            .map_err(|_| CephError::new("ceph_ll_readv", libc::EINVAL))?;
        if off < 0 {
            return Err(CephError::new("ceph_ll_readv", libc::EINVAL));
        }
        // SAFETY: the caller guarantees the iovec array and the memory it describes; the Fh
        // and mount are live (`live`).
        let ret = unsafe { sys::ceph_ll_readv(self.mount.raw(), fh, iov, cnt, off) };
        let n = check("ceph_ll_readv", ret)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// `ceph_ll_writev`: gather-write the `cnt` buffers described by `iov` at `off`.
    ///
    /// # Safety
    /// `iov` must point to `cnt` valid `iovec`s, each describing memory valid for reads of
    /// `iov_len` bytes for the whole call (see `readv_raw` on guest memory).
    pub unsafe fn writev_raw(
        &self,
        iov: *const libc::iovec,
        cnt: usize,
        off: i64,
    ) -> Result<usize> {
        let (_call, fh) = self.live("ceph_ll_writev")?;
        let cnt = libc::c_int::try_from(cnt)
            .map_err(|_| CephError::new("ceph_ll_writev", libc::EINVAL))?;
        if off < 0 {
            return Err(CephError::new("ceph_ll_writev", libc::EINVAL));
        }
        // SAFETY: the caller guarantees the iovec array and the memory it describes; the Fh
        // and mount are live (`live`).
        let ret = unsafe { sys::ceph_ll_writev(self.mount.raw(), fh, iov, cnt, off) };
        let n = check("ceph_ll_writev", ret)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Safe scatter read at `off` (`ceph_ll_readv`).
    pub fn read_vectored(&self, bufs: &mut [IoSliceMut<'_>], off: u64) -> Result<usize> {
        let off = to_i64("ceph_ll_readv", off)?;
        // SAFETY: `IoSliceMut` is guaranteed ABI-compatible with `struct iovec` on Unix; each
        // describes a live `&mut [u8]` borrowed for this call.
        unsafe { self.readv_raw(bufs.as_mut_ptr().cast::<libc::iovec>(), bufs.len(), off) }
    }

    /// Safe gather write at `off` (`ceph_ll_writev`).
    pub fn write_vectored(&self, bufs: &[IoSlice<'_>], off: u64) -> Result<usize> {
        let off = to_i64("ceph_ll_writev", off)?;
        // SAFETY: `IoSlice` is guaranteed ABI-compatible with `struct iovec` on Unix; each
        // describes a live `&[u8]` borrowed for this call; libcephfs only reads them.
        unsafe { self.writev_raw(bufs.as_ptr().cast::<libc::iovec>(), bufs.len(), off) }
    }

    /// `ceph_ll_fsync` (`datasync`: data only, like fdatasync).
    pub fn fsync(&self, datasync: bool) -> Result<()> {
        let (_call, fh) = self.live("ceph_ll_fsync")?;
        // SAFETY: the mount is live and `fh` open on it (`live`).
        let ret = unsafe { sys::ceph_ll_fsync(self.mount.raw(), fh, i32::from(datasync)) };
        check("ceph_ll_fsync", ret).map(drop)
    }

    /// `ceph_ll_fallocate`. Pacific supports `FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE`
    /// (punching a hole) and plain allocation within the file size; other modes: EOPNOTSUPP.
    pub fn fallocate(&self, mode: i32, off: u64, len: u64) -> Result<()> {
        let (_call, fh) = self.live("ceph_ll_fallocate")?;
        let off = to_i64("ceph_ll_fallocate", off)?;
        let len = to_i64("ceph_ll_fallocate", len)?;
        // SAFETY: the mount is live and `fh` open on it (`live`).
        let ret = unsafe { sys::ceph_ll_fallocate(self.mount.raw(), fh, mode, off, len) };
        check("ceph_ll_fallocate", ret).map(drop)
    }

    /// `ceph_ll_lseek`: returns the new position. Supports SEEK_SET/CUR/END and, as CephFS's
    /// `Client::lseek` implements them (it tracks no holes: the whole file is data),
    /// SEEK_DATA (`off` if `off < size`, else ENXIO) and SEEK_HOLE (`size` if `off < size`,
    /// else ENXIO). The size is fetched from the MDS for END/DATA/HOLE.
    pub fn lseek(&self, off: i64, whence: i32) -> Result<u64> {
        let (_call, fh) = self.live("ceph_ll_lseek")?;
        // SAFETY: the mount is live and `fh` open on it (`live`).
        let ret = unsafe { sys::ceph_ll_lseek(self.mount.raw(), fh, off, whence) };
        let pos = check("ceph_ll_lseek", ret)?;
        Ok(pos.unsigned_abs())
    }

    /// `ceph_ll_getlk`: test for a conflicting POSIX lock; on return `fl` describes the
    /// conflicting lock, or has `l_type = F_UNLCK`.
    pub fn getlk(&self, fl: &mut libc::flock, owner: u64) -> Result<()> {
        let (_call, fh) = self.live("ceph_ll_getlk")?;
        // SAFETY: `fl` is a valid, exclusive flock; the mount is live and `fh` open on it (`live`).
        let ret = unsafe { sys::ceph_ll_getlk(self.mount.raw(), fh, fl, owner) };
        check("ceph_ll_getlk", ret).map(drop)
    }

    /// `ceph_ll_setlk`: acquire/release a POSIX (fcntl) byte-range lock for `owner`.
    /// `sleep`: wait for a conflicting lock (F_SETLKW); otherwise EAGAIN on conflict.
    pub fn setlk(&self, fl: &libc::flock, owner: u64, sleep: bool) -> Result<()> {
        let (_call, fh) = self.live("ceph_ll_setlk")?;
        let mut copy = *fl;
        // SAFETY: `copy` is a valid flock owned by this frame; the mount is live and `fh` open on
        // it (`live`).
        let ret =
            unsafe { sys::ceph_ll_setlk(self.mount.raw(), fh, &mut copy, owner, i32::from(sleep)) };
        check("ceph_ll_setlk", ret).map(drop)
    }

    /// BSD `flock(2)` semantics (`LOCK_SH`/`LOCK_EX`/`LOCK_UN`, `| LOCK_NB`) for `owner`.
    ///
    /// Pacific's C API has no `ceph_ll_flock` (only `ceph_flock` on path-API fds). This
    /// emulates flock with a whole-file POSIX lock through `ceph_ll_setlk`, exactly as the
    /// Linux NFS client does: cluster-coherent between clients, but flock and fcntl locks of
    /// the same file then conflict with each other. Released by `LOCK_UN` or when the file
    /// handle is closed. Contended non-blocking requests fail with EWOULDBLOCK (EAGAIN).
    pub fn flock(&self, op: i32, owner: u64) -> Result<()> {
        let l_type = match op & !libc::LOCK_NB {
            libc::LOCK_SH => libc::F_RDLCK,
            libc::LOCK_EX => libc::F_WRLCK,
            libc::LOCK_UN => libc::F_UNLCK,
            _ => return Err(CephError::new("ceph_ll_setlk", libc::EINVAL)),
        };
        let short = |v: i32| {
            libc::c_short::try_from(v).map_err(|_| CephError::new("ceph_ll_setlk", libc::EINVAL))
        };
        // SAFETY: flock is plain old data; all-zero is a valid value.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = short(l_type)?;
        fl.l_whence = short(libc::SEEK_SET)?;
        fl.l_start = 0;
        fl.l_len = 0;
        self.setlk(&fl, owner, op & libc::LOCK_NB == 0)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if let Some(fh) = self.fh.take() {
            // After a shutdown began there is nothing to close: the unmount closes the Fh.
            if let Ok(_call) = self.mount.enter("ceph_ll_close") {
                // SAFETY: we own the Fh, closed only here or in close() (which took it out);
                // the mount is live because `self.mount` drops after this, and no shutdown
                // frees the Fh while `_call` lives.
                unsafe { sys::ceph_ll_close(self.mount.raw(), fh.as_ptr()) };
            }
        }
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("File").field(&self.fh).finish()
    }
}
