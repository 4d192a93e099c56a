//! Reads and writes that do not wait for the OSDs: `ceph_ll_nonblocking_readv_writev`
//! (libcephfs 20 and later; build.rs finds out whether the header has it).
//!
//! A submission returns once libcephfs has sent the I/O (it may still wait for caps from the
//! MDS first, as a blocking call does); the result arrives later on an [`IoQueue`], which the
//! submitter or any other thread takes it from. The completion callback runs on a libcephfs
//! thread that may hold the client lock: it only moves the finished operation into the queue.
//! Nothing that could enter libcephfs (closing the file, dropping the last reference to the
//! mount) happens there; the operation's file and mount are dropped by whoever takes it.
//!
//! What libcephfs 20.2 does, read in its source (`Client::ll_preadv_pwritev`, `_read`,
//! `_write`): with a completion, it returns 0 and calls the completion exactly once, maybe
//! before it returns (an error found before any I/O is sent completes it at once); it
//! returns the byte count without calling the completion only for a file with inline data,
//! whose read or write it did synchronously. A negative return is handled as "no completion"
//! too, though 20.2 never gives one.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use crate::error::{CephError, Result};
use crate::file::File;
use crate::mount::OwnedCall;
use crate::sys;

const OP: &str = "ceph_ll_nonblocking_readv_writev";

/// What a write asks of the OSDs before it completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteSync {
    /// Complete once libcephfs has the data (its object cache, or the OSDs without one).
    None,
    /// Complete once the data is on the OSDs (fdatasync).
    Data,
    /// Complete once data and metadata are stable (fsync).
    All,
}

/// A finished read or write.
#[derive(Debug)]
pub struct Completion {
    /// The tag given at submission.
    pub tag: u64,
    /// Bytes read or written, or the error.
    pub result: Result<usize>,
    /// The buffer given at submission; for a read, shortened to the bytes read.
    pub buf: Vec<u8>,
    /// The file, kept open until the operation finished; dropped by the taker.
    pub file: Arc<File>,
}

#[derive(Default)]
struct Shared {
    done: Mutex<VecDeque<Completion>>,
    ready: Condvar,
}

/// Where completions arrive. Clones share one queue.
#[derive(Clone, Default)]
pub struct IoQueue {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for IoQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoQueue").finish_non_exhaustive()
    }
}

impl IoQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&self, c: Completion) {
        let mut q = self
            .shared
            .done
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        q.push_back(c);
        self.shared.ready.notify_one();
    }

    /// The next completion, waiting at most `timeout` for one.
    pub fn wait(&self, timeout: Duration) -> Option<Completion> {
        let q = self
            .shared
            .done
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (mut q, _) = self
            .shared
            .ready
            .wait_timeout_while(q, timeout, |q| q.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        q.pop_front()
    }

    /// Every completion already there, without waiting.
    pub fn drain(&self) -> Vec<Completion> {
        let mut q = self
            .shared
            .done
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        q.drain(..).collect()
    }
}

/// One operation in flight. Boxed, so that `info` (which libcephfs holds a pointer to) and
/// `iov` (which `info` points to) stay where they are until the completion.
struct Op {
    info: sys::ceph_ll_io_info,
    iov: libc::iovec,
    buf: Vec<u8>,
    file: Arc<File>,
    call: OwnedCall,
    queue: IoQueue,
    tag: u64,
}

impl Op {
    /// The operation is over with `ret` (bytes or -errno): hand everything to the queue.
    fn finish(self, ret: i64) {
        let Op {
            mut buf,
            file,
            call,
            queue,
            tag,
            info,
            ..
        } = self;
        // Ended while `file` still holds the mount: once the completion is in the queue, its
        // taker may drop the file at any moment, and this may run on libcephfs's thread.
        drop(call);
        let result = if ret < 0 {
            Err(CephError::new(
                OP,
                i32::try_from(ret.unsigned_abs()).unwrap_or(libc::EIO),
            ))
        } else {
            let n = usize::try_from(ret).unwrap_or(0).min(buf.len());
            if !info.write {
                buf.truncate(n);
            }
            Ok(n)
        };
        queue.push(Completion {
            tag,
            result,
            buf,
            file,
        });
    }
}

/// The completion libcephfs calls (`ceph_ll_io_info.callback`).
unsafe extern "C" fn completed(info: *mut sys::ceph_ll_io_info) {
    // SAFETY: `info` is the `info` field of the boxed `Op` whose pointer `submit` put in
    // `priv_`; libcephfs calls this once per submission that returned 0, and `submit` gave
    // the box up for exactly that case, so it is reclaimed here once.
    let op = unsafe { Box::from_raw((*info).priv_.cast::<Op>()) };
    let ret = op.info.result;
    (*op).finish(ret);
}

impl File {
    /// Read `buf.len()` bytes at `off` without waiting for the OSDs; the [`Completion`] (with
    /// `buf` shortened to the bytes read) arrives on `queue`. An error found before
    /// submitting (ENOTCONN once the mount shuts down, an offset or length out of range) is
    /// returned here and nothing arrives.
    pub fn read_nonblocking(
        self: &Arc<Self>,
        queue: &IoQueue,
        tag: u64,
        off: u64,
        buf: Vec<u8>,
    ) -> Result<()> {
        self.submit(queue, tag, off, buf, false, WriteSync::None)
    }

    /// Write `buf` at `off` without waiting for the OSDs; the [`Completion`] arrives on
    /// `queue` once the write is as stable as `sync` asks.
    pub fn write_nonblocking(
        self: &Arc<Self>,
        queue: &IoQueue,
        tag: u64,
        off: u64,
        buf: Vec<u8>,
        sync: WriteSync,
    ) -> Result<()> {
        self.submit(queue, tag, off, buf, true, sync)
    }

    fn submit(
        self: &Arc<Self>,
        queue: &IoQueue,
        tag: u64,
        off: u64,
        buf: Vec<u8>,
        write: bool,
        sync: WriteSync,
    ) -> Result<()> {
        let off = i64::try_from(off).map_err(|_| CephError::new(OP, libc::EINVAL))?;
        if buf.len() > crate::file::MAX_IO {
            return Err(CephError::new(OP, libc::EINVAL));
        }
        let call = self.mount_ref().enter_owned(OP)?;
        let raw = Box::into_raw(Box::new(Op {
            info: sys::ceph_ll_io_info {
                callback: Some(completed),
                priv_: std::ptr::null_mut(),
                fh: self.as_ptr(),
                iov: std::ptr::null(),
                iovcnt: 1,
                off,
                result: 0,
                write,
                fsync: sync != WriteSync::None,
                syncdataonly: sync == WriteSync::Data,
            },
            iov: libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: buf.len(),
            },
            buf,
            file: Arc::clone(self),
            call,
            queue: queue.clone(),
            tag,
        }));
        // SAFETY: `raw` points to the live boxed `Op` just made, which nothing else refers to
        // yet: its pointers (to itself, its iovec and its buffer's heap block, which stay put
        // while the box lives) are filled in before libcephfs sees it.
        let info = unsafe {
            (*raw).iov.iov_base = (*raw).buf.as_mut_ptr().cast();
            (*raw).info.iov = std::ptr::addr_of!((*raw).iov);
            (*raw).info.priv_ = raw.cast();
            std::ptr::addr_of_mut!((*raw).info)
        };
        // SAFETY: the mount is live and the Fh open on it for as long as the operation holds
        // its `OwnedCall` and its `Arc<File>`; `info` and the iovec and buffer it points to
        // stay in the box, untouched here, until `completed` reclaims it.
        let ret = unsafe { sys::ceph_ll_nonblocking_readv_writev(self.mount_ref().raw(), info) };
        if ret != 0 {
            // Done synchronously (inline data) or refused: libcephfs will not call back.
            // SAFETY: the box was not taken by libcephfs (no completion for a non-zero
            // return), so it is still ours, reclaimed once.
            let op = unsafe { Box::from_raw(raw) };
            (*op).finish(ret);
        }
        Ok(())
    }
}
