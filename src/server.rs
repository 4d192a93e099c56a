//! A thin pre-dispatch in front of fuse-backend-rs's FUSE [`Server`].
//!
//! fuse-backend-rs 0.14 answers COPY_FILE_RANGE and SYNCFS with ENOSYS, and hands SETLKW to
//! the non-blocking `setlk`. We peek at the FUSE in-header, handle those three opcodes
//! ourselves (the first two through [`ExtraOps`]), and hand every other request to
//! `Server::handle_message` unchanged.
//!
//! Nothing here knows about virtqueues: the caller builds the [`Reader`]/[`Writer`].

use std::io::{self, Write};
use std::mem::size_of;
use std::sync::Arc;
use std::time::Instant;

use fuse_backend_rs::abi::fuse_abi::{CopyFileRangeIn, InHeader, LkIn, OutHeader, WriteOut};
use fuse_backend_rs::api::filesystem::{Context, FileLock, FileSystem};
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{Reader, Writer};
use vm_memory::bitmap::BitmapSlice;
use vm_memory::ByteValued;

use crate::metrics::{self, ReplyHead};

/// FUSE_COPY_FILE_RANGE (Linux `include/uapi/linux/fuse.h`).
pub const FUSE_COPY_FILE_RANGE: u32 = 47;
/// FUSE_SYNCFS (protocol 7.34).
pub const FUSE_SYNCFS: u32 = 50;
/// FUSE_SETLKW: fuse-backend-rs 0.14 dispatches it to `FileSystem::setlk`, so a blocking lock
/// request would fail with EAGAIN instead of waiting; we dispatch it to `setlkw` ourselves.
pub const FUSE_SETLKW: u32 = 33;

/// `struct fuse_syncfs_in`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct SyncfsIn {
    padding: u64,
}
// SAFETY: plain-old-data struct of one integer: every bit pattern is valid, no padding.
unsafe impl ByteValued for SyncfsIn {}

/// Operations fuse-backend-rs 0.14 does not dispatch; the filesystem implements them.
///
/// Errors must be `io::Error::from_raw_os_error(errno)`: the errno goes to the guest unchanged.
pub trait ExtraOps {
    /// Copy `len` bytes from (`ino_in`, `fh_in`, `off_in`) to (`ino_out`, `fh_out`, `off_out`)
    /// inside the filesystem; return the number of bytes copied (may be short).
    #[allow(clippy::too_many_arguments)]
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
    ) -> io::Result<usize>;

    /// Flush everything the filesystem containing `ino` has buffered (`syncfs(2)`).
    fn syncfs(&self, ctx: &Context, ino: u64) -> io::Result<()>;
}

/// Transport-level failures: the request could not be answered at all. Filesystem errors are
/// not here; they become replies carrying an errno.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("Request of {0} bytes is shorter than a FUSE in-header")]
    ShortHeader(usize),
    #[error("Cannot write the reply to the guest's buffers")]
    WriteReply(#[source] io::Error),
    #[error("FUSE server could not handle the request")]
    Fuse(#[source] fuse_backend_rs::Error),
}

/// The FUSE request dispatcher used by every queue.
pub struct FuseServer<F: FileSystem + Send + Sync> {
    server: Server<Arc<F>>,
    fs: Arc<F>,
}

impl<F: FileSystem + Send + Sync> std::fmt::Debug for FuseServer<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FuseServer").finish_non_exhaustive()
    }
}

impl<F> FuseServer<F>
where
    F: FileSystem<Inode = u64, Handle = u64> + ExtraOps + Send + Sync,
{
    pub fn new(fs: Arc<F>) -> Self {
        FuseServer {
            server: Server::new(fs.clone()),
            fs,
        }
    }

    /// Serve one request; return the number of bytes written to the guest.
    ///
    /// `reply_head(n)` reads back the first bytes (up to [`metrics::REPLY_HEAD_LEN`]) of the
    /// `n`-byte reply just written, for the metrics: the errno and WRITE's size are in there.
    /// Every request is counted in [`metrics::global`] and logged in a debug-level span.
    pub fn handle_message<S: BitmapSlice>(
        &self,
        reader: Reader<'_, S>,
        writer: Writer<'_, S>,
        reply_head: impl FnOnce(usize) -> ([u8; metrics::REPLY_HEAD_LEN], usize),
    ) -> Result<usize, ServerError> {
        let start = Instant::now();
        let mut peek = reader.clone();
        let available = peek.available_bytes();
        let Ok(header) = peek.read_obj::<InHeader>() else {
            metrics::global().record_malformed();
            return Err(ServerError::ShortHeader(available));
        };
        let op = metrics::opcode_name(usize::try_from(header.opcode).unwrap_or(0));
        let span = tracing::debug_span!(
            "fuse",
            op,
            unique = header.unique,
            node = header.nodeid,
            errno = tracing::field::Empty,
            us = tracing::field::Empty,
        );
        let _entered = span.enter();
        let result = self.dispatch(&header, reader, peek, writer);
        let elapsed = start.elapsed();
        let reply = match &result {
            Ok(n) if *n >= metrics::OUT_HEADER_LEN => {
                let (head, filled) = reply_head(*n);
                ReplyHead::parse(header.opcode, head.get(..filled).unwrap_or(&[]), *n)
            }
            Ok(_) => None,
            Err(_) => {
                metrics::global().record_malformed();
                None
            }
        };
        metrics::global().record_request(header.opcode, reply.as_ref(), elapsed);
        if tracing::enabled!(tracing::Level::DEBUG) {
            let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
            span.record("us", us);
            if let Some(r) = &reply {
                span.record("errno", r.errno);
            }
            tracing::debug!("FUSE request done");
        }
        result
    }

    fn dispatch<S: BitmapSlice>(
        &self,
        header: &InHeader,
        reader: Reader<'_, S>,
        peek: Reader<'_, S>,
        writer: Writer<'_, S>,
    ) -> Result<usize, ServerError> {
        let header = *header;
        match header.opcode {
            FUSE_COPY_FILE_RANGE => self.copy_file_range(&header, peek, writer),
            FUSE_SYNCFS => self.syncfs(&header, peek, writer),
            FUSE_SETLKW => self.setlkw(&header, peek, writer),
            _ => self
                .server
                .handle_message(reader, writer, None, None)
                .map_err(ServerError::Fuse),
        }
    }

    fn context(&self, header: &InHeader) -> io::Result<Context> {
        let mut ctx = Context::from(header);
        self.fs.id_remap(&mut ctx)?;
        Ok(ctx)
    }

    /// Read the request's in-struct, checking the header's length against it.
    fn read_in<T: ByteValued, S: BitmapSlice>(
        header: &InHeader,
        reader: &mut Reader<'_, S>,
    ) -> io::Result<T> {
        let needed = size_of::<InHeader>() + size_of::<T>();
        let declared = usize::try_from(header.len).unwrap_or(usize::MAX);
        if declared < needed {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        reader
            .read_obj()
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn copy_file_range<S: BitmapSlice>(
        &self,
        header: &InHeader,
        mut reader: Reader<'_, S>,
        writer: Writer<'_, S>,
    ) -> Result<usize, ServerError> {
        let result = Self::read_in::<CopyFileRangeIn, S>(header, &mut reader).and_then(|arg| {
            let ctx = self.context(header)?;
            let copied = self.fs.copy_file_range(
                &ctx,
                header.nodeid,
                arg.fh_in,
                arg.offset_in,
                arg.nodeid_out,
                arg.fh_out,
                arg.offset_out,
                arg.len,
                arg.flags,
            )?;
            // The kernel caps a request below 4 GiB; a larger answer is a filesystem bug.
            u32::try_from(copied).map_err(|_| io::Error::from_raw_os_error(libc::EIO))
        });
        match result {
            Ok(size) => reply(header.unique, writer, Some(WriteOut { size, padding: 0 })),
            Err(e) => reply_error(header.unique, writer, &e),
        }
    }

    fn syncfs<S: BitmapSlice>(
        &self,
        header: &InHeader,
        mut reader: Reader<'_, S>,
        writer: Writer<'_, S>,
    ) -> Result<usize, ServerError> {
        let result = Self::read_in::<SyncfsIn, S>(header, &mut reader).and_then(|_| {
            let ctx = self.context(header)?;
            self.fs.syncfs(&ctx, header.nodeid)
        });
        match result {
            Ok(()) => reply::<WriteOut, S>(header.unique, writer, None),
            Err(e) => reply_error(header.unique, writer, &e),
        }
    }

    fn setlkw<S: BitmapSlice>(
        &self,
        header: &InHeader,
        mut reader: Reader<'_, S>,
        writer: Writer<'_, S>,
    ) -> Result<usize, ServerError> {
        let result = Self::read_in::<LkIn, S>(header, &mut reader).and_then(|arg| {
            let ctx = self.context(header)?;
            let lock = FileLock {
                start: arg.lk.start,
                end: arg.lk.end,
                lock_type: arg.lk.type_,
                pid: arg.lk.pid,
            };
            self.fs
                .setlkw(&ctx, header.nodeid, arg.fh, arg.owner, lock, arg.lk_flags)
        });
        match result {
            Ok(()) => reply::<WriteOut, S>(header.unique, writer, None),
            Err(e) => reply_error(header.unique, writer, &e),
        }
    }
}

fn write_reply<S: BitmapSlice>(
    mut writer: Writer<'_, S>,
    header: OutHeader,
    body: &[u8],
) -> Result<usize, ServerError> {
    writer
        .write_all(header.as_slice())
        .and_then(|()| writer.write_all(body))
        .map_err(ServerError::WriteReply)?;
    writer.commit(None).map_err(ServerError::WriteReply)?;
    Ok(writer.bytes_written())
}

/// Reply with an out-header and an optional body.
fn reply<T: ByteValued, S: BitmapSlice>(
    unique: u64,
    writer: Writer<'_, S>,
    body: Option<T>,
) -> Result<usize, ServerError> {
    let body_len = if body.is_some() { size_of::<T>() } else { 0 };
    // Out-header plus one small fixed-size struct: always fits in u32.
    let len = u32::try_from(size_of::<OutHeader>() + body_len).unwrap_or(u32::MAX);
    let header = OutHeader {
        len,
        error: 0,
        unique,
    };
    match &body {
        Some(b) => write_reply(writer, header, b.as_slice()),
        None => write_reply(writer, header, &[]),
    }
}

/// Reply with `-errno`. Errors without an OS errno become EIO.
fn reply_error<S: BitmapSlice>(
    unique: u64,
    writer: Writer<'_, S>,
    err: &io::Error,
) -> Result<usize, ServerError> {
    let errno = err.raw_os_error().unwrap_or(libc::EIO);
    tracing::debug!(unique, errno, "FUSE request failed");
    let header = OutHeader {
        len: u32::try_from(size_of::<OutHeader>()).unwrap_or(u32::MAX),
        error: errno.saturating_neg(),
        unique,
    };
    write_reply(writer, header, &[])
}
