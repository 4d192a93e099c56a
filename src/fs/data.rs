//! Data: READ and WRITE (zero-copy between guest memory and libcephfs through [`CephIo`]),
//! FSYNC, FALLOCATE, LSEEK, COPY_FILE_RANGE and SYNCFS, and the coherence of libcephfs's object
//! cache with a guest's O_DIRECT writers.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ceph_client::{File, Inode};
use fuse_backend_rs::abi::fuse_abi::WRITE_KILL_PRIV;
use fuse_backend_rs::api::filesystem::{Context, Entry, ZeroCopyReader, ZeroCopyWriter};
use fuse_backend_rs::file_buf::FileVolatileSlice;
use fuse_backend_rs::file_traits::FileReadWriteVolatile;

use super::killpriv::Trigger;
use super::open::OpenFile;
use super::perms::Caller;
use super::{errno, len64, range, to_len, to_off, CephFs};
use crate::server::{AsyncOps, SessionOps, WireOps};
#[cfg(libcephfs_nonblocking)]
use crate::server::{AsyncReply, AsyncStart};

/// [`CephFs::read_behind`]: READs in a row that must each end at most `STRIDE` below the one
/// before, and how much is then read at once below the last one.
const DESCENTS: u64 = 2;
const STRIDE: u64 = 64 << 10;
const BEHIND: u64 = 1 << 20;

/// Chunk of a server-side copy.
const COPY_CHUNK: usize = 1 << 20;

impl CephFs {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_read(
        &self,
        ctx: &Caller,
        inode: u64,
        handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _flags: u32,
    ) -> io::Result<usize> {
        let (f, len) = self.read_start(ctx, inode, handle, size, offset)?;
        if len == 0 {
            return Ok(0);
        }
        if !f.direct {
            self.read_behind(&f, offset, len);
        }
        w.write_from(&mut CephIo(&f.file), len, offset)
    }

    /// Backward scans (`tac`, a reverse-stride read): libcephfs reads ahead only forwards, and a
    /// guest's kernel reads ahead only forwards too, so each small READ below the one before
    /// would be an OSD round trip (about 10 MiB/s for 4 KiB READs on the lab's loopback
    /// cluster, docs/benchmarks.md). Once [`DESCENTS`] buffered READs of a handle in a row have
    /// each ended at most [`STRIDE`] below where the one before began, the [`BEHIND`] bytes
    /// below the end of this READ are read first, in one request, into libcephfs's object
    /// cache, which then serves the READs that follow; again when a READ goes below them. A
    /// forward or random reader never triggers it.
    fn read_behind(&self, f: &OpenFile, off: u64, len: usize) {
        let end = off.saturating_add(len64(len));
        let prev = f.last_read.swap(off, Ordering::Relaxed);
        let descending = prev != u64::MAX && end <= prev && prev - end <= STRIDE;
        if !descending {
            f.descents.store(0, Ordering::Relaxed);
            f.behind_low.store(u64::MAX, Ordering::Relaxed);
            return;
        }
        let n = f.descents.fetch_add(1, Ordering::Relaxed) + 1;
        if n < DESCENTS || off >= f.behind_low.load(Ordering::Relaxed) {
            return;
        }
        let low = end.saturating_sub(BEHIND);
        let Ok(want) = usize::try_from(end - low) else {
            return;
        };
        let mut scratch = vec![0u8; want];
        // Only the cache's filling matters: an error here is the READ's own to meet.
        if f.file.read(low, &mut scratch).is_ok() {
            f.behind_low.store(low, Ordering::Relaxed);
        }
    }

    /// What a READ does before it reads, on either path (blocking here, `fs::aio`): the
    /// range, the handle, the note of buffered I/O, and how much may be read (`read_len`).
    pub(super) fn read_start(
        &self,
        ctx: &Caller,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
    ) -> io::Result<(Arc<OpenFile>, usize)> {
        range(offset, u64::from(size))?;
        let f = self.file(inode, handle, "read", ctx.guest_uid())?;
        self.note_buffered(&f);
        let len = self.read_len(&f, offset, to_len(size)?)?;
        Ok((f, len))
    }

    /// How much of a read of `len` bytes at `off` through `f` may be asked of libcephfs: never
    /// past the end of the file. libcephfs reads synchronously (O_DIRECT descriptors, and any
    /// without the cache cap) by returning what the file's RADOS object holds, and an object
    /// can be longer than the file (the soak met objects left longer by truncates and hole
    /// punches); its cached reads stop at the size. The cached size is asked first, with no
    /// request; only a read that would cross it asks the size under the caps, which is a
    /// request only when this client lacks them (another client writing the file), so a size
    /// that grew elsewhere is not cut short.
    fn read_len(&self, f: &OpenFile, off: u64, len: usize) -> io::Result<usize> {
        let end = off.saturating_add(len64(len));
        let root = self.perms.root();
        let size = |flags| -> io::Result<u64> {
            Ok(self
                .mount()
                .getattr(&f.inode, ceph_client::CEPH_STATX_SIZE, flags, &root)?
                .stx_size)
        };
        if end <= size(ceph_client::AT_STATX_DONT_SYNC)? {
            return Ok(len);
        }
        let left = size(0)?.saturating_sub(off);
        Ok(usize::try_from(left).map_or(len, |left| left.min(len)))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_write(
        &self,
        ctx: &Caller,
        inode: u64,
        handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _delayed_write: bool,
        _flags: u32,
        fuse_flags: u32,
    ) -> io::Result<usize> {
        let f = self.write_start(ctx, inode, handle, size, offset, fuse_flags)?;
        let (target, bypassed) = self.write_target(&f);
        self.write_through(&f, target, bypassed, r, size, offset)
    }

    /// What a WRITE does before it writes, on either path (blocking here, `fs::aio`): the
    /// range, the handle, and the kill of suid/sgid (KILLPRIV_V2). The guest's kill flag says
    /// its kernel found the writer without CAP_FSETID; a caller other than root is taken to
    /// lack it whatever the flag says (a hostile guest leaves it off), as for FALLOCATE.
    pub(super) fn write_start(
        &self,
        ctx: &Caller,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        fuse_flags: u32,
    ) -> io::Result<Arc<OpenFile>> {
        range(offset, u64::from(size))?;
        let f = self.file(inode, handle, "write", ctx.guest_uid())?;
        if self.killpriv_on() {
            let node = self.node(inode)?;
            self.kill_privs(
                &node,
                Trigger::Write,
                fuse_flags & WRITE_KILL_PRIV != 0 || !ctx.host_uid().is_root(),
                &self.perm(ctx),
            )?;
        }
        Ok(f)
    }

    /// The blocking write of a WRITE through `f` to `target` (from [`Self::write_target`]),
    /// straight from guest memory.
    pub(super) fn write_through(
        &self,
        f: &OpenFile,
        target: &File,
        bypassed: bool,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        let n = r.read_to(&mut CephIo(target), to_len(size)?, offset)?;
        if bypassed {
            self.after_direct_write(f, offset, n)?;
        }
        Ok(n)
    }

    pub(super) fn do_fsync(
        &self,
        ctx: &Caller,
        inode: u64,
        datasync: bool,
        handle: u64,
    ) -> io::Result<()> {
        let f = self.file(inode, handle, "fsync", ctx.guest_uid())?;
        Ok(f.file.fsync(datasync)?)
    }

    pub(super) fn do_fallocate(
        &self,
        ctx: &Caller,
        inode: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        range(offset, length)?;
        let f = self.file(inode, handle, "fallocate", ctx.guest_uid())?;
        let mode = i32::try_from(mode).map_err(|_| errno(libc::EOPNOTSUPP))?;
        // fallocate(2) modifies the file as a write does (Linux's file_modified): SB_NOSEC
        // leaves the kill to us. FALLOCATE carries no kill flag: a caller other than root is
        // taken to lack CAP_FSETID, as for copy_file_range.
        if self.killpriv_on() {
            let node = self.node(inode)?;
            self.kill_privs(
                &node,
                Trigger::Write,
                !ctx.host_uid().is_root(),
                &self.perm(ctx),
            )?;
        }
        match f.file.fallocate(mode, offset, length) {
            // libcephfs 20 refuses mode 0 (allocate, extending the size), as the kernel
            // client does; 16 and 18 extend the size. A guest kernel that gets EOPNOTSUPP
            // once sends no FALLOCATE for the mount again (hole punching included), so the
            // daemon extends the size itself: CephFS allocates nothing ahead anyway.
            Err(e) if e.errno() == libc::EOPNOTSUPP && mode == 0 => {
                self.extend_for_fallocate(&f, offset, length)
            }
            r => Ok(r?),
        }
    }

    /// fallocate(mode 0) as libcephfs 16 and 18 do it: the size becomes `off + len` if that
    /// is larger, with a new mtime; nothing is written. As root, like an ftruncate, since
    /// the guest's descriptor is open for writing (EBADF otherwise, as libcephfs answers).
    /// Another client extending the file between the size check and the SETATTR would be
    /// cut back to `off + len`: the guest's own writes are serialised with it by its kernel.
    fn extend_for_fallocate(&self, f: &OpenFile, off: u64, len: u64) -> io::Result<()> {
        if !f.writable {
            return Err(errno(libc::EBADF));
        }
        let end = off.checked_add(len).ok_or_else(|| errno(libc::EFBIG))?;
        let root = self.perms.root();
        let size = self
            .mount()
            .getattr(&f.inode, ceph_client::CEPH_STATX_SIZE, 0, &root)?
            .stx_size;
        if end <= size {
            return Ok(());
        }
        let st = ceph_client::Statx {
            stx_size: end,
            stx_mtime: ceph_client::Timespec::now(),
            ..ceph_client::Statx::default()
        };
        let mask = ceph_client::CEPH_SETATTR_SIZE | ceph_client::CEPH_SETATTR_MTIME;
        Ok(self.mount().setattr(&f.inode, &st, mask, &root)?)
    }

    pub(super) fn do_lseek(
        &self,
        ctx: &Caller,
        inode: u64,
        handle: u64,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        let off = to_off(offset)?;
        let f = self.file(inode, handle, "lseek", ctx.guest_uid())?;
        let whence = i32::try_from(whence).map_err(|_| errno(libc::EINVAL))?;
        Ok(f.file.lseek(off, whence)?)
    }

    /// The O_DSYNC twin of an O_DIRECT handle open for writing (see [`OpenFile::writer`]).
    /// Opened with root credentials: the caller's open was already allowed, and a file
    /// created with mode 0 stays writable through the descriptor that created it. libcephfs
    /// opens it locally under the caps the first open got: no MDS request.
    pub(super) fn direct_writer(&self, inode: &Inode, oflags: i32) -> io::Result<Option<File>> {
        if oflags & libc::O_DIRECT == 0 || oflags & libc::O_ACCMODE == libc::O_RDONLY {
            return Ok(None);
        }
        let keep = libc::O_ACCMODE | libc::O_APPEND;
        let flags = (oflags & keep) | libc::O_DSYNC;
        Ok(Some(self.mount().open(inode, flags, &self.perms.root())?))
    }

    /// Buffered I/O is about to go through `f`: from now on its inode's data may be in
    /// libcephfs's object cache. One relaxed load per request once noted.
    fn note_buffered(&self, f: &OpenFile) {
        if f.direct || f.noted.load(Ordering::Relaxed) {
            return;
        }
        f.noted.store(true, Ordering::Relaxed);
        if self.cached.mark(f.ino) {
            self.cached
                .prune(f.ino, |ino| self.mount().cached_inode(ino).is_some());
        }
    }

    /// The libcephfs handle a write through `f` goes to, and whether it bypasses the cache
    /// (then [`Self::after_direct_write`] must follow). An O_DIRECT write of an inode whose
    /// data the cache may hold goes through the cache (see [`OpenFile::writer`]).
    pub(super) fn write_target<'a>(&self, f: &'a OpenFile) -> (&'a File, bool) {
        match &f.writer {
            Some(twin) if self.cached.contains(f.ino) => (twin, false),
            Some(_) => (&*f.file, true),
            None => {
                self.note_buffered(f);
                (&*f.file, false)
            }
        }
    }

    /// After a write that bypassed libcephfs's cache: if buffered I/O of the inode began while
    /// it ran, the cache may have read the old bytes of the range meanwhile. Write the range
    /// again through the cache, as read back from the OSDs (rare: a buffered reader racing a
    /// direct writer of the same file). The read-back bypasses the cache too (O_DIRECT): the
    /// guest's handle if it can read, else one opened for it as root (the guest's may be
    /// write-only, and libcephfs answers a read through it EBADF: the WRITE, already on the
    /// OSDs, was answered EBADF and the cache kept the old bytes). The caller's open already
    /// allowed writing these bytes; reading back what it wrote gives the guest nothing.
    pub(super) fn after_direct_write(&self, f: &OpenFile, off: u64, len: usize) -> io::Result<()> {
        let Some(twin) = &f.writer else {
            return Ok(());
        };
        if len == 0 || !self.cached.contains(f.ino) {
            return Ok(());
        }
        let mut buf = vec![0u8; len];
        let n = if f.oflags & libc::O_ACCMODE == libc::O_RDWR {
            f.file.read(off, &mut buf)?
        } else {
            let reader = self.mount().open(
                &f.inode,
                libc::O_RDONLY | libc::O_DIRECT,
                &self.perms.root(),
            )?;
            reader.read(off, &mut buf)?
        };
        write_all(twin, off, read_part(&buf, n)?)
    }

    /// Server-side copy: the data moves inside the daemon, never through the guest.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_range(
        &self,
        ctx: &Context,
        ino_in: u64,
        fh_in: u64,
        off_in: u64,
        ino_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> io::Result<usize> {
        let ctx = &self.caller(ctx)?;
        self.copy_as(ctx, ino_in, fh_in, off_in, ino_out, fh_out, off_out, len)
    }

    #[allow(clippy::too_many_arguments)]
    fn copy_as(
        &self,
        ctx: &Caller,
        ino_in: u64,
        fh_in: u64,
        off_in: u64,
        ino_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> io::Result<usize> {
        range(off_in, len)?;
        range(off_out, len)?;
        let fi = self.file(ino_in, fh_in, "copy_file_range", ctx.guest_uid())?;
        let fo = self.file(ino_out, fh_out, "copy_file_range", ctx.guest_uid())?;
        self.note_buffered(&fi);
        let (target, bypassed) = self.write_target(&fo);
        if self.killpriv_on() {
            let node = self.node(ino_out)?;
            self.kill_privs(
                &node,
                Trigger::Write,
                !ctx.host_uid().is_root(),
                &self.perm(ctx),
            )?;
        }
        // The kernel caps one request at a size_t-sized count; we move at most u32::MAX bytes
        // per request (the reply field is 32 bits) in 1 MiB steps.
        let total =
            usize::try_from(len.min(u64::from(u32::MAX))).map_err(|_| errno(libc::EINVAL))?;
        let mut buf = vec![0u8; COPY_CHUNK.min(total.max(1))];
        let mut done = 0usize;
        while done < total {
            // A copy of up to 4 GiB outlives the propagation bound: the gate is asked for
            // every chunk, and a quarantine ends it there (short count, or EACCES at once).
            if done > 0 {
                let gates = self
                    .gate(self.domain_of(&fi.node), "copy_file_range", ctx.guest_uid())
                    .and_then(|()| {
                        self.gate(self.domain_of(&fo.node), "copy_file_range", ctx.guest_uid())
                    });
                if gates.is_err() {
                    break;
                }
            }
            let want = self.read_len(&fi, off_in + len64(done), (total - done).min(buf.len()))?;
            if want == 0 {
                break;
            }
            let n = fi.file.read(
                off_in + len64(done),
                buf.get_mut(..want).unwrap_or_default(),
            )?;
            if n == 0 {
                break;
            }
            write_all(target, off_out + len64(done), read_part(&buf, n)?)?;
            if bypassed {
                self.after_direct_write(&fo, off_out + len64(done), n)?;
            }
            done += n;
        }
        Ok(done)
    }

    /// SYNCFS: flush everything this client has dirty.
    pub fn sync_all(&self) -> io::Result<()> {
        Ok(self.mount().sync_fs()?)
    }
}

/// Write all of `buf` at `off` (libcephfs may write less than asked).
fn write_all(f: &File, off: u64, buf: &[u8]) -> io::Result<()> {
    let mut rest = buf;
    let mut at = off;
    while !rest.is_empty() {
        let m = f.write(at, rest)?;
        // Nothing written, or more than asked (a libcephfs fault): never loop or panic on it.
        rest = match rest.get(m..) {
            Some(r) if m > 0 => r,
            _ => return Err(errno(libc::EIO)),
        };
        at += len64(m);
    }
    Ok(())
}

/// The first `n` bytes of `buf` that a read filled: more than the buffer is a libcephfs fault
/// (EIO), never a panic.
fn read_part(buf: &[u8], n: usize) -> io::Result<&[u8]> {
    buf.get(..n).ok_or_else(|| errno(libc::EIO))
}

/// A libcephfs file seen as a fuse-backend-rs zero-copy source/sink: READ and WRITE move data
/// between guest memory and libcephfs with one readv/writev and no bounce buffer.
struct CephIo<'a>(&'a File);

impl CephIo<'_> {
    fn iovecs(bufs: &[FileVolatileSlice]) -> Vec<libc::iovec> {
        bufs.iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr().cast(),
                iov_len: b.len(),
            })
            .collect()
    }
}

impl FileReadWriteVolatile for CephIo<'_> {
    fn read_volatile(&mut self, _slice: FileVolatileSlice) -> io::Result<usize> {
        Err(errno(libc::ESPIPE))
    }
    fn write_volatile(&mut self, _slice: FileVolatileSlice) -> io::Result<usize> {
        Err(errno(libc::ESPIPE))
    }
    fn read_at_volatile(&mut self, slice: FileVolatileSlice, off: u64) -> io::Result<usize> {
        self.read_vectored_at_volatile(&[slice], off)
    }
    fn write_at_volatile(&mut self, slice: FileVolatileSlice, off: u64) -> io::Result<usize> {
        self.write_vectored_at_volatile(&[slice], off)
    }
    fn read_vectored_at_volatile(
        &mut self,
        bufs: &[FileVolatileSlice],
        off: u64,
    ) -> io::Result<usize> {
        let iov = Self::iovecs(bufs);
        // SAFETY: each iovec describes a FileVolatileSlice of guest memory that fuse-backend-rs
        // validated against the descriptor chain and keeps mapped for the duration of this call;
        // libcephfs writes at most iov_len bytes into each and keeps no pointer after returning.
        let n = unsafe { self.0.readv_raw(iov.as_ptr(), iov.len(), to_off(off)?) }?;
        Ok(n)
    }
    fn write_vectored_at_volatile(
        &mut self,
        bufs: &[FileVolatileSlice],
        off: u64,
    ) -> io::Result<usize> {
        let iov = Self::iovecs(bufs);
        // SAFETY: as above; libcephfs only reads the described guest memory during the call.
        let n = unsafe { self.0.writev_raw(iov.as_ptr(), iov.len(), to_off(off)?) }?;
        Ok(n)
    }
}

impl WireOps for CephFs {
    /// What `init` wants, and SETXATTR_EXT: the longer SETXATTR is decoded by the server,
    /// which hands its ACL_KILL_SGID to [`Self::acl_kill_sgid`].
    fn init_flags(&self) -> u64 {
        self.init_want() | crate::wire::FUSE_SETXATTR_EXT
    }

    fn acl_kill_sgid(&self, ctx: &Context, ino: u64) -> io::Result<()> {
        let ctx = &self.caller(ctx)?;
        self.do_acl_kill_sgid(ctx, ino)
    }

    fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        args: fuse_backend_rs::abi::fuse_abi::CreateIn,
    ) -> io::Result<(Entry, u64, fuse_backend_rs::abi::fuse_abi::OpenOptions)> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_tmpfile(ctx, parent, args)
    }

    fn statx(
        &self,
        ctx: &Context,
        ino: u64,
    ) -> io::Result<(libc::stat64, crate::wire::Btime, Duration)> {
        let ctx = &self.caller(ctx)?;
        self.do_statx(ctx, ino)
    }

    fn copy_file_range(
        &self,
        ctx: &Context,
        ino_in: u64,
        fh_in: u64,
        off_in: u64,
        ino_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> io::Result<usize> {
        let ctx = &self.caller(ctx)?;
        // copy_file_range(2) defines no flags yet.
        if flags != 0 {
            return Err(errno(libc::EINVAL));
        }
        self.copy_as(ctx, ino_in, fh_in, off_in, ino_out, fh_out, off_out, len)
    }

    fn syncfs(&self, ctx: &Context, ino: u64) -> io::Result<()> {
        // A forbidden guest id may not sync either.
        self.caller(ctx)?;
        self.node(ino)?;
        self.sync_all()
    }
}

impl SessionOps for CephFs {
    fn session_lost(&self) {
        self.note_session_lost();
    }

    fn wait_for_lost_session(&self) -> bool {
        CephFs::wait_for_lost_session(self)
    }

    fn recover_session(&self) -> io::Result<String> {
        let r = self.recover_lost_session();
        crate::metrics::session_recovery(r.is_ok());
        r
    }
}

impl AsyncOps for CephFs {
    #[cfg(libcephfs_nonblocking)]
    fn async_takes(&self, opcode: u32, node: u64, fh: u64) -> bool {
        self.aio_takes(opcode, node, fh)
    }

    #[cfg(libcephfs_nonblocking)]
    fn async_read(
        &self,
        ctx: &Context,
        node: u64,
        fh: u64,
        size: u32,
        offset: u64,
        room: usize,
        tag: u64,
    ) -> io::Result<AsyncStart> {
        self.aio_read(ctx, node, fh, size, offset, room, tag)
    }

    #[cfg(libcephfs_nonblocking)]
    fn async_write(
        &self,
        ctx: &Context,
        node: u64,
        fh: u64,
        data: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        fuse_flags: u32,
        tag: u64,
    ) -> io::Result<AsyncStart> {
        self.aio_write(ctx, node, fh, data, size, offset, fuse_flags, tag)
    }

    #[cfg(libcephfs_nonblocking)]
    fn async_next(&self, timeout: Duration) -> Option<(u64, io::Result<AsyncReply>)> {
        self.aio_next(timeout)
    }
}
