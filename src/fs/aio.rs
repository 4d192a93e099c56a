//! READ and WRITE on O_DIRECT handles without waiting for the OSDs
//! (`ceph_ll_nonblocking_readv_writev`, libcephfs 20): the filesystem's side of
//! [`AsyncOps::async_read`](crate::server::AsyncOps::async_read) and its kin.
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
//!
//! Those buffers are the async path's memory, and the guest decides how many there are: every
//! chain it posts could hold up to 1 MiB, 1,024 chains a queue, with descriptors that alias one
//! page of its own (review of f9264a9, finding 6). The daemon's async requests share a budget
//! of [`BUDGET`] bytes: while it has no room for one more request of the largest size, READs
//! and WRITEs are left to the blocking path, which moves the data in place and whose requests
//! in flight its worker threads bound. A queue thread starts one request at a time, so the
//! buffers never pass the budget by more than one largest request per queue.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuse_backend_rs::api::filesystem::{Context, ZeroCopyReader};
use fuse_backend_rs::file_buf::FileVolatileSlice;
use fuse_backend_rs::file_traits::FileReadWriteVolatile;

use super::open::OpenFile;
use super::{errno, to_len, CephFs, Handle};
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;

use crate::server::{AsyncReply, AsyncStart};
use crate::wire::{FUSE_READ, FUSE_WRITE};
use ceph_client::aio::{IoQueue, WriteSync};

/// Most bytes of buffers the daemon's async requests hold at once (see the module doc): 64
/// requests of the largest size, or 16,384 of 4 KiB, more than the depths where the async path
/// pays (16 to 64 in flight).
pub(super) const BUDGET: usize = 64 << 20;

/// Bytes of async buffers in flight, against [`BUDGET`].
#[derive(Debug)]
struct Budget {
    used: AtomicUsize,
    limit: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(BUDGET)
    }
}

impl Budget {
    fn new(limit: usize) -> Self {
        Budget {
            used: AtomicUsize::new(0),
            limit,
        }
    }

    /// Whether `len` more bytes fit now (a request is let in only then; see the module doc).
    fn room_for(&self, len: usize) -> bool {
        self.used().saturating_add(len) <= self.limit
    }

    /// `len` bytes taken, until given back with [`Self::give_back`].
    fn take(&self, len: usize) {
        self.used.fetch_add(len, Ordering::AcqRel);
    }

    fn give_back(&self, len: usize) {
        self.used.fetch_sub(len, Ordering::AcqRel);
    }

    fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// What a request in flight holds until it completes: its share of the budget, and for a
/// write its handle and offset, for [`CephFs::after_direct_write`].
#[derive(Debug)]
struct Pending {
    bytes: usize,
    write: Option<(Arc<OpenFile>, u64)>,
}

/// The operations in flight: where libcephfs puts their completions, and what each holds.
#[derive(Debug, Default)]
pub(super) struct Aio {
    queue: IoQueue,
    budget: Budget,
    /// Requests in flight by tag.
    pending: Mutex<HashMap<u64, Pending>>,
}

impl Aio {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// File a request under `tag`, holding `bytes` of the budget until [`Self::done`].
    fn file(&self, tag: u64, bytes: usize, write: Option<(Arc<OpenFile>, u64)>) {
        self.budget.take(bytes);
        if let Some(old) = self.pending().insert(tag, Pending { bytes, write }) {
            // A tag in flight twice is the caller's fault; its bytes are not counted twice.
            self.budget.give_back(old.bytes);
        }
    }

    /// The request `tag` completed (or was never sent): what it held, its bytes given back.
    fn done(&self, tag: u64) -> Option<(Arc<OpenFile>, u64)> {
        let p = self.pending().remove(&tag)?;
        self.budget.give_back(p.bytes);
        p.write
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
    /// See [`AsyncOps::async_takes`](crate::server::AsyncOps::async_takes): READs of an
    /// O_DIRECT handle, and WRITEs of one open for writing whose inode's data the object cache
    /// does not hold, while the budget has room for a request of the largest size. A handle
    /// not in the table goes the blocking way (EBADF there).
    pub(super) fn aio_takes(&self, opcode: u32, node: u64, fh: u64) -> bool {
        let max =
            usize::try_from(fuse_backend_rs::api::server::MAX_BUFFER_SIZE).unwrap_or(usize::MAX);
        if !self.aio.budget.room_for(max) {
            return false;
        }
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
        self.aio.file(tag, len, None);
        if let Err(e) = f
            .file
            .read_nonblocking(&self.aio.queue, tag, offset, vec![0u8; len])
        {
            self.aio.done(tag);
            return Err(e.into());
        }
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
        self.aio.file(tag, buf.len(), Some((f.clone(), offset)));
        if let Err(e) = f
            .file
            .write_nonblocking(&self.aio.queue, tag, offset, buf, WriteSync::None)
        {
            self.aio.done(tag);
            return Err(e.into());
        }
        Ok(AsyncStart::Sent)
    }

    /// The next finished operation; a write that bypassed the cache gets the blocking path's
    /// [`CephFs::after_direct_write`] here, before it is answered.
    pub(super) fn aio_next(&self, timeout: Duration) -> Option<(u64, io::Result<AsyncReply>)> {
        let c = self.aio.queue.wait(timeout)?;
        let write = self.aio.done(c.tag);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(aio: &Aio, tag: u64, bytes: usize) {
        aio.file(tag, bytes, None);
    }

    #[test]
    fn hostile_async_bytes_in_flight_stay_within_the_budget() {
        let aio = Aio {
            budget: Budget::new(4 << 20),
            ..Aio::default()
        };
        let max = 1 << 20;
        // Requests are let in while one more of the largest size fits.
        let mut tag = 0;
        while aio.budget.room_for(max) {
            tag += 1;
            tagged(&aio, tag, max);
        }
        assert_eq!(tag, 4, "four requests of 1 MiB in a budget of 4 MiB");
        assert_eq!(aio.budget.used(), 4 << 20);
        assert!(!aio.budget.room_for(1));
        // A completion gives its bytes back, once.
        assert!(aio.done(2).is_none(), "a read holds no handle");
        assert!(aio.done(2).is_none());
        assert_eq!(aio.budget.used(), 3 << 20);
        assert!(aio.budget.room_for(max));
        // A tag filed twice (a caller's fault) is counted once.
        tagged(&aio, 1, 4096);
        assert_eq!(aio.budget.used(), (2 << 20) + 4096);
        // Unknown tags change nothing.
        assert!(aio.done(99).is_none());
        for t in [1, 3, 4] {
            aio.done(t);
        }
        assert_eq!(aio.budget.used(), 0);
    }

    #[test]
    fn the_default_budget_holds_64_requests_of_the_largest_size() {
        let max = usize::try_from(fuse_backend_rs::api::server::MAX_BUFFER_SIZE).unwrap();
        assert_eq!(BUDGET / max, 64);
        assert!(Budget::default().room_for(BUDGET));
        assert!(!Budget::default().room_for(BUDGET + 1));
    }
}
