//! READ and WRITE on O_DIRECT handles without waiting for the OSDs
//! (`ceph_ll_nonblocking_readv_writev`, libcephfs 20): the filesystem's side of
//! [`ExtraOps::async_read`](crate::server::wire::ExtraOps::async_read) and its kin.
//!
//! Only O_DIRECT handles: there libcephfs sends the I/O to the OSDs and the caller would sit
//! out the round trip, which the async call spares (the bench's `nonblocking` subcommand:
//! 1.2x the reads and up to 1.7x the writes at depth 4 and more, at half the CPU per
//! operation). Cached I/O answered from libcephfs's object cache loses by the hand-off to the
//! completion thread (0.5-0.8x), so buffered handles keep the blocking path.
//!
//! Each request runs the blocking path's own steps ([`CephFs::read_start`],
//! [`CephFs::write_start`], [`CephFs::write_target`], [`CephFs::after_direct_write`]) in the
//! same order; only the data moves through an owned buffer instead of guest memory (one copy
//! of at most the request's size, which the reply or the guest's data had anyway). A write
//! whose inode's data the object cache may hold goes through the O_DSYNC twin, the blocking
//! way, exactly as on the blocking path.

use std::collections::HashMap;

use super::*;
use crate::server::wire::{AsyncReply, AsyncStart, FUSE_READ, FUSE_WRITE};
use ceph_client::aio::{IoQueue, WriteSync};

/// The operations in flight: where libcephfs puts their completions, and what a write needs
/// once it completes.
#[derive(Debug, Default)]
pub(super) struct Aio {
    queue: IoQueue,
    /// Writes in flight by tag: their handle and offset, for [`CephFs::after_direct_write`].
    writes: Mutex<HashMap<u64, (Arc<OpenFile>, u64)>>,
}

impl Aio {
    fn writes(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (Arc<OpenFile>, u64)>> {
        self.writes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Guest data of a WRITE copied into an owned buffer (the async call keeps it until it
/// completes, past the life of the request's guest memory mapping).
struct Collect<'a>(&'a mut Vec<u8>);

impl FileReadWriteVolatile for Collect<'_> {
    fn read_volatile(&mut self, _slice: FileVolatileSlice) -> io::Result<usize> {
        Err(errno(libc::ESPIPE))
    }
    fn write_volatile(&mut self, _slice: FileVolatileSlice) -> io::Result<usize> {
        Err(errno(libc::ESPIPE))
    }
    fn read_at_volatile(&mut self, _slice: FileVolatileSlice, _off: u64) -> io::Result<usize> {
        Err(errno(libc::ESPIPE))
    }
    fn write_at_volatile(&mut self, slice: FileVolatileSlice, off: u64) -> io::Result<usize> {
        self.write_vectored_at_volatile(&[slice], off)
    }
    fn write_vectored_at_volatile(
        &mut self,
        bufs: &[FileVolatileSlice],
        _off: u64,
    ) -> io::Result<usize> {
        let mut n = 0;
        for b in bufs {
            let at = self.0.len();
            self.0.resize(at + b.len(), 0);
            let dst = self.0.get_mut(at..).unwrap_or_default();
            // Not `Bytes::read_slice` of `FileVolatileSlice`: fuse-backend-rs 0.14 implements it
            // with `write_slice` (it would zero the guest's data and copy nothing).
            // `VolatileSlice::copy_to` is vm-memory's volatile copy out of the slice.
            if b.as_volatile_slice().copy_to(dst) != b.len() {
                return Err(errno(libc::EFAULT));
            }
            n += b.len();
        }
        Ok(n)
    }
}

impl CephFs {
    /// See [`ExtraOps::async_takes`](crate::server::wire::ExtraOps::async_takes): READs of an
    /// O_DIRECT handle, and WRITEs of one open for writing whose inode's data the object cache
    /// does not hold. A handle not in the table goes the blocking way (EBADF there).
    pub(super) fn aio_takes(&self, opcode: u32, node: u64, fh: u64) -> bool {
        let Ok(h) = self.handles.get(node, fh) else {
            return false;
        };
        match &h.handle {
            Handle::File(f) if f.direct => match opcode {
                FUSE_READ => true,
                FUSE_WRITE => f.writer.is_some() && !self.cached.contains(f.ino),
                _ => false,
            },
            _ => false,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn aio_read(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        room: usize,
        tag: u64,
    ) -> io::Result<AsyncStart> {
        let ctx = &self.caller(ctx)?;
        let (f, len) = self.read_start(ctx, inode, handle, size, offset)?;
        // The blocking path's writer takes at most what the reply has room for.
        let len = len.min(room);
        if len == 0 {
            return Ok(AsyncStart::Done(AsyncReply::Read(Vec::new())));
        }
        f.file
            .read_nonblocking(&self.aio.queue, tag, offset, vec![0u8; len])?;
        Ok(AsyncStart::Sent)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn aio_write(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        data: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        fuse_flags: u32,
        tag: u64,
    ) -> io::Result<AsyncStart> {
        let ctx = &self.caller(ctx)?;
        let f = self.write_start(ctx, inode, handle, size, offset, fuse_flags)?;
        let (target, bypassed) = self.write_target(&f);
        if !bypassed {
            // Buffered I/O of the inode began since the request was routed here: through the
            // cache, as the blocking path writes it.
            let n = self.write_through(&f, target, bypassed, data, size, offset)?;
            return Ok(AsyncStart::Done(AsyncReply::Written(n)));
        }
        // Grown by what the chain holds, not by the size the guest claims.
        let mut buf = Vec::new();
        let n = data.read_to(&mut Collect(&mut buf), to_len(size)?, offset)?;
        buf.truncate(n);
        if buf.is_empty() {
            return Ok(AsyncStart::Done(AsyncReply::Written(0)));
        }
        self.aio.writes().insert(tag, (f.clone(), offset));
        if let Err(e) = f
            .file
            .write_nonblocking(&self.aio.queue, tag, offset, buf, WriteSync::None)
        {
            self.aio.writes().remove(&tag);
            return Err(e.into());
        }
        Ok(AsyncStart::Sent)
    }

    /// The next finished operation; a write that bypassed the cache gets the blocking path's
    /// [`CephFs::after_direct_write`] here, before it is answered.
    pub(super) fn aio_next(&self, timeout: Duration) -> Option<(u64, io::Result<AsyncReply>)> {
        let c = self.aio.queue.wait(timeout)?;
        let write = self.aio.writes().remove(&c.tag);
        let reply = match (c.result, write) {
            (Err(e), _) => Err(e.into()),
            (Ok(_), None) => Ok(AsyncReply::Read(c.buf)),
            (Ok(n), Some((f, off))) => self
                .after_direct_write(&f, off, n)
                .map(|()| AsyncReply::Written(n)),
        };
        // The file is dropped here, on this thread, never on libcephfs's.
        drop(c.file);
        Some((c.tag, reply))
    }
}
