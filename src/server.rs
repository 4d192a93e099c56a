//! A thin pre-dispatch in front of fuse-backend-rs's FUSE [`Server`].
//!
//! fuse-backend-rs 0.14 answers COPY_FILE_RANGE and SYNCFS with ENOSYS, and hands SETLKW to
//! the non-blocking `setlk`. The caller decodes the FUSE in-header once, decides where the
//! request runs from that copy and hands it to us with the request; we handle those three opcodes ourselves
//! (the first two through [`WireOps`]), and hand every other request to
//! `Server::handle_message` unchanged.
//!
//! What fuse-backend-rs must never see, we answer here from the decoded header: an opcode the
//! daemon does not serve gets ENOSYS (fuse-backend-rs turns any opcode below 50 into its
//! `Opcode` enum with a `transmute` in a trace line, undefined behaviour for the gaps 0, 7 and
//! 19; and it would hand IOCTL, POLL, BMAP and the DAX mapping requests on), and a declared
//! length the chain does not hold gets EINVAL (fuse-backend-rs would size an uninitialised
//! buffer by it and log the body of a malformed name at error level).
//!
//! Nothing here knows about virtqueues: the caller builds the [`Reader`]/[`Writer`].

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::mem::size_of;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use fuse_backend_rs::abi::fuse_abi::{
    CopyFileRangeIn, CreateIn, EntryOut, InHeader, LkIn, OpenOut, OutHeader, WriteOut,
};
use fuse_backend_rs::api::filesystem::{Context, FileLock, FileSystem};
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{Reader, VirtioFsWriter, Writer};
use vm_memory::bitmap::BitmapSlice;
use vm_memory::ByteValued;

use crate::metrics;
use crate::metrics::inflight::{self, RequestInfo};

mod copied;
mod late;
#[cfg(libcephfs_nonblocking)]
pub mod nonblocking;
mod ops;

pub use ops::{AsyncOps, Servable, SessionOps, WireOps};
#[cfg(libcephfs_nonblocking)]
pub use ops::{AsyncReply, AsyncStart};

use crate::wire::{
    self, ReplyHead, FUSE_COPY_FILE_RANGE, FUSE_SETLKW, FUSE_SYNCFS, FUSE_TMPFILE, OUT_HEADER_LEN,
    REPLY_HEAD_LEN,
};

/// The opcodes the daemon serves; everything else is answered ENOSYS before fuse-backend-rs
/// sees it. Linux `include/uapi/linux/fuse.h`: 7 (the old FUSE_BMAP slot) and 19 were never
/// assigned; BMAP (37, block devices), IOCTL (39), POLL (40), NOTIFY_REPLY (41, we send no
/// notifications) and SETUPMAPPING/REMOVEMAPPING (48, 49, DAX, not offered) are not served;
/// SYNCFS (50), TMPFILE (51) and later ones are unknown to fuse-backend-rs 0.14: the first two
/// are decoded here, STATX (52) by
/// `copied` (the transport sends it there whenever its reply fits the private buffer, as
/// Linux's 288-byte one does; with a larger room fuse-backend-rs answers ENOSYS).
pub fn is_served(opcode: u32) -> bool {
    matches!(
        opcode,
        1..=6 | 8..=18 | 20..=36 | 38 | 42..=47 | FUSE_SYNCFS | FUSE_TMPFILE | wire::FUSE_STATX
    )
}

/// The most bytes of data a READ or WRITE may carry, as offered to the guest in FUSE_INIT's
/// reply (`max_write`, `max_pages`); 0: what fuse-backend-rs offers (1 MiB). Set once at start
/// ([`limit_io`]).
static IO_LIMIT: AtomicU32 = AtomicU32::new(0);

/// Offer guests READs and WRITEs of at most `bytes` (whole pages; at least one) from the next
/// FUSE_INIT on: `--request-deadline` bounds only requests that fit the transport's private
/// buffers (`vhost_user::deadline`). `None`: fuse-backend-rs's own limit.
pub fn limit_io(bytes: Option<u32>) {
    let pages = bytes.map_or(0, |b| (b / PAGE).max(1) * PAGE);
    IO_LIMIT.store(pages, Ordering::Release);
}

/// The page size FUSE's `max_pages` counts in (Linux's; the guests this daemon serves use 4 KiB
/// pages).
const PAGE: u32 = 4096;

thread_local! {
    /// Set on the virtqueue threads: what runs there must never wait for another request.
    static QUEUE_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Mark the calling thread as a virtqueue thread (see [`FuseServer::handle_message`]).
pub fn mark_queue_thread() {
    QUEUE_THREAD.with(|q| q.set(true));
}

fn on_queue_thread() -> bool {
    QUEUE_THREAD.with(Cell::get)
}

/// `struct fuse_syncfs_in`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct SyncfsIn {
    padding: u64,
}
// SAFETY: plain-old-data struct of one integer: every bit pattern is valid, no padding.
unsafe impl ByteValued for SyncfsIn {}

/// `struct fuse_setxattr_in` when FUSE_SETXATTR_EXT is negotiated (fuse-backend-rs 0.14 knows
/// only the first two fields).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct SetxattrInExt {
    size: u32,
    flags: u32,
    setxattr_flags: u32,
    padding: u32,
}
// SAFETY: plain-old-data struct of four u32: every bit pattern is valid, no padding.
unsafe impl ByteValued for SetxattrInExt {}

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

/// What serving a request gave: the bytes written to the guest (or why nothing could be), and
/// how long it took from the `start` the caller gave.
#[derive(Debug)]
pub struct Served {
    pub written: Result<usize, ServerError>,
    pub took: std::time::Duration,
}

/// The FUSE request dispatcher used by every queue.
pub struct FuseServer<F: FileSystem + Send + Sync> {
    server: Server<Arc<F>>,
    fs: Arc<F>,
    /// The protocol minor the guest's FUSE_INIT asked for (as fuse-backend-rs keeps it; the
    /// newest it speaks until an INIT comes), for the requests served from a copy (`copied`).
    minor: AtomicU32,
    /// The INIT flags (`flags | flags2 << 32`) the guest offered; 0 until a protocol-7 INIT.
    offered: AtomicU64,
    /// FUSE_SETXATTR_EXT was negotiated: SETXATTR carries the longer `fuse_setxattr_in`, which
    /// fuse-backend-rs 0.14 cannot decode ([`Self::setxattr_ext`] does).
    setxattr_ext: AtomicBool,
}

impl<F: FileSystem + Send + Sync> std::fmt::Debug for FuseServer<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FuseServer").finish_non_exhaustive()
    }
}

impl<F> FuseServer<F>
where
    F: Servable,
{
    pub fn new(fs: Arc<F>) -> Self {
        FuseServer {
            server: Server::new(fs.clone()),
            fs,
            minor: AtomicU32::new(fuse_backend_rs::abi::fuse_abi::KERNEL_MINOR_VERSION),
            offered: AtomicU64::new(0),
            setxattr_ext: AtomicBool::new(false),
        }
    }

    /// A reply the guest was not given (`--request-deadline` answered first): give back the
    /// node references and handles it holds (`late`).
    pub fn drop_late_reply(&self, header: &InHeader, reply: &[u8]) {
        late::drop_reply(&*self.fs, header, reply);
    }

    /// Whether [`Self::serve_copied`] serves `opcode`: the transport then hands it the request
    /// copied out of guest memory instead of a `Reader` and `Writer`.
    pub fn serves_copied(opcode: u32) -> bool {
        copied::serves(opcode)
    }

    /// Serve one request of a kind [`Self::serves_copied`] names, copied whole out of guest
    /// memory: `request` holds its bytes (in-header included, as the transport decoded it into
    /// `header`), `reply` the room the guest gave for the answer. The bytes of `reply` written;
    /// accounted as [`Self::handle_message`] accounts.
    pub fn serve_copied(
        &self,
        header: InHeader,
        request: &[u8],
        reply: &mut [u8],
        queue: usize,
        start: Instant,
    ) -> Served {
        let body = request.get(size_of::<InHeader>()..).unwrap_or(&[]);
        let tracked = inflight::track(start, || request_info_bytes(&header, body, queue));
        let span = request_span(&header);
        let _entered = span.enter();
        let room = reply.len();
        let result = match refusal(&header, request.len(), room) {
            Some(errno) => {
                copied::Out::new(reply, header.unique).error(&io::Error::from_raw_os_error(errno))
            }
            None => match self.context(&header) {
                Ok(ctx) => {
                    let mut out = copied::Out::new(reply, header.unique);
                    self.dispatch_copied(&header, &ctx, body, &mut out)
                }
                Err(e) => copied::Out::new(reply, header.unique).error(&e),
            },
        };
        let elapsed = start.elapsed();
        let head = match &result {
            Ok(n) if *n >= OUT_HEADER_LEN => {
                let filled = (*n).min(REPLY_HEAD_LEN);
                ReplyHead::parse(header.opcode, reply.get(..filled).unwrap_or(&[]), *n)
            }
            Ok(_) => None,
            Err(_) => {
                metrics::global().record_malformed();
                None
            }
        };
        self.answered(&header, tracked, head.as_ref(), elapsed, &span);
        Served {
            written: result,
            took: elapsed,
        }
    }

    /// Serve one request of virtqueue `queue`; return the number of bytes written to the guest.
    ///
    /// `header` is the request's in-header as the caller decoded it from the bytes `reader`
    /// starts with: the server acts on this copy and never reads the header
    /// from guest memory again, so a guest rewriting its buffer meanwhile cannot make it serve
    /// another request than the one the caller placed. A SETLKW reaching a thread marked by
    /// [`mark_queue_thread`] is refused with ENOLCK instead of waiting there.
    ///
    /// `reply_head(n)` reads back the first bytes (up to [`REPLY_HEAD_LEN`]) of the
    /// `n`-byte reply just written, for the metrics: the errno and WRITE's size are in there.
    /// Every request is counted in [`metrics::global`], logged in a debug-level span, and noted
    /// in this thread's in-flight slot for the slow-request watchdog while it is served. `start`
    /// is when the caller began serving it; the time it took comes back with the result.
    pub fn handle_message<S: BitmapSlice>(
        &self,
        header: InHeader,
        reader: Reader<'_, S>,
        writer: Writer<'_, S>,
        queue: usize,
        start: Instant,
        reply_head: impl FnOnce(usize) -> ([u8; REPLY_HEAD_LEN], usize),
    ) -> Served {
        let mut peek = reader.clone();
        let available = peek.available_bytes();
        // Step over the header: its bytes in guest memory are not looked at again.
        let mut skipped = [0u8; size_of::<InHeader>()];
        if peek.read_exact(&mut skipped).is_err() {
            metrics::global().record_malformed();
            return Served {
                written: Err(ServerError::ShortHeader(available)),
                took: start.elapsed(),
            };
        }
        let tracked = inflight::track(start, || request_info(&header, &peek, queue));
        let span = request_span(&header);
        let _entered = span.enter();
        // INIT: what the guest offered, and a second writer over the same reply buffers (the
        // virtiofs one is Clone) to add the flags fuse-backend-rs cannot negotiate.
        let init_reply = if header.opcode == wire::FUSE_INIT {
            self.note_init(&peek)
        } else {
            None
        };
        let init_reply = init_reply.and_then(|()| match &writer {
            Writer::VirtioFs(w) => Some(w.clone()),
            _ => None,
        });
        let result = self.dispatch(&header, reader, peek, writer);
        if let (Ok(n), Some(reply)) = (&result, init_reply) {
            self.extend_init(*n, &reply);
        }
        let elapsed = start.elapsed();
        let reply = match &result {
            Ok(n) if *n >= OUT_HEADER_LEN => {
                let (head, filled) = reply_head(*n);
                ReplyHead::parse(header.opcode, head.get(..filled).unwrap_or(&[]), *n)
            }
            Ok(_) => None,
            Err(_) => {
                metrics::global().record_malformed();
                None
            }
        };
        self.answered(&header, tracked, reply.as_ref(), elapsed, &span);
        Served {
            written: result,
            took: elapsed,
        }
    }

    /// A request was answered after `elapsed` with `reply` (`None`: no out-header): clear its
    /// watchdog slot, count it, note a lost session, log it in `span`. Every request ends
    /// here, on the blocking path and on the async one (`nonblocking`).
    fn answered(
        &self,
        header: &InHeader,
        tracked: Option<inflight::Tracked>,
        reply: Option<&ReplyHead>,
        elapsed: std::time::Duration,
        span: &tracing::Span,
    ) {
        if let Some(t) = tracked {
            t.finish(elapsed);
        }
        metrics::global().record_request(header.opcode, reply, elapsed);
        if reply.is_some_and(|r| r.errno == libc::ESHUTDOWN) {
            // libcephfs's answer once this client is evicted: recover the session.
            self.fs.session_lost();
        }
        if tracing::enabled!(tracing::Level::DEBUG) {
            let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
            span.record("us", us);
            if let Some(r) = reply {
                span.record("errno", r.errno);
            }
            tracing::debug!("FUSE request done");
        }
    }

    /// The guest's FUSE_INIT: the protocol minor it speaks, when its major is 7 (what
    /// fuse-backend-rs records; a newer major is answered with 7 and no minor recorded), and
    /// the flags it offered. `Some` when it was recorded (a protocol-7 INIT).
    #[cold]
    #[inline(never)]
    fn note_init<S: BitmapSlice>(&self, body: &Reader<'_, S>) -> Option<()> {
        use fuse_backend_rs::abi::fuse_abi::InitIn;
        self.offered.store(0, Ordering::Relaxed);
        self.setxattr_ext.store(false, Ordering::Relaxed);
        // fuse_init_in, and its flags2 after it when INIT_EXT is set.
        let mut head = [0u8; size_of::<InitIn>() + 4];
        let got = peek(&mut body.clone(), &mut head);
        let init = head
            .get(..size_of::<InitIn>())
            .and_then(InitIn::from_slice)?;
        if got < size_of::<InitIn>() || init.major != fuse_backend_rs::abi::fuse_abi::KERNEL_VERSION
        {
            return None;
        }
        self.minor.store(init.minor, Ordering::Relaxed);
        let mut offered = u64::from(init.flags);
        if offered & wire::FUSE_INIT_EXT != 0 && got == head.len() {
            let flags2 = head
                .get(size_of::<InitIn>()..)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u32::from_le_bytes);
            offered |= u64::from(flags2) << 32;
        }
        self.offered.store(offered, Ordering::Relaxed);
        Some(())
    }

    /// After fuse-backend-rs answered INIT with `n` bytes through a clone of `reply`: the
    /// flags it cannot negotiate (unknown to its `FsOptions`, which drops them from what the
    /// guest offered) that the guest offered and the filesystem wants
    /// ([`WireOps::init_flags`]: SETXATTR_EXT, DIRECT_IO_ALLOW_MMAP) are added to the answer's
    /// `flags` and `flags2`, in place. fuse-backend-rs's own flags there are `offered & wanted`
    /// over the bits it knows, so the words are written whole. SETXATTR_EXT, once on, is noted
    /// for [`Self::dispatch`]. With [`limit_io`] on, `max_write` and `max_pages` are lowered
    /// to it. Only a whole `fuse_init_out` is changed; an error reply is left as it is.
    #[cold]
    #[inline(never)]
    fn extend_init<S: BitmapSlice>(&self, n: usize, reply: &VirtioFsWriter<'_, S>) {
        use fuse_backend_rs::abi::fuse_abi::{FsOptions, InitOut};
        use std::mem::offset_of;
        let offered = self.offered.load(Ordering::Relaxed);
        let want = self.fs.init_flags();
        let extra = offered & want & !FsOptions::all().bits();
        let limit = IO_LIMIT.load(Ordering::Acquire);
        if (extra == 0 && limit == 0) || n != OUT_HEADER_LEN + size_of::<InitOut>() {
            return;
        }
        let write = |at: usize, bytes: &[u8]| {
            let written = reply
                .clone()
                .split_at(OUT_HEADER_LEN + at)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
                .and_then(|mut w| w.write_all(bytes));
            if let Err(e) = &written {
                tracing::warn!(%e, "Cannot write the daemon's own values into the INIT reply");
            }
            written.is_ok()
        };
        if extra != 0 {
            let flags = (FsOptions::from_bits_truncate(offered).bits() & want) | extra;
            let low = u32::try_from(flags & 0xffff_ffff).unwrap_or(0);
            let high = u32::try_from(flags >> 32).unwrap_or(0);
            if !(write(offset_of!(InitOut, flags), &low.to_le_bytes())
                && write(offset_of!(InitOut, flags2), &high.to_le_bytes()))
            {
                return;
            }
            let ext = extra & wire::FUSE_SETXATTR_EXT != 0;
            self.setxattr_ext.store(ext, Ordering::Relaxed);
            tracing::info!(
                flags = format_args!("{extra:#x}"),
                setxattr_ext = ext,
                "INIT: flags fuse-backend-rs does not know, negotiated by the daemon"
            );
        }
        if limit != 0 {
            let pages = u16::try_from(limit / PAGE).unwrap_or(u16::MAX);
            if write(offset_of!(InitOut, max_write), &limit.to_le_bytes())
                && write(offset_of!(InitOut, max_pages), &pages.to_le_bytes())
            {
                tracing::info!(
                    max_write = limit,
                    max_pages = pages,
                    "FUSE INIT: READ and WRITE limited to what --request-deadline can bound"
                );
            }
        }
    }

    fn dispatch<S: BitmapSlice>(
        &self,
        header: &InHeader,
        reader: Reader<'_, S>,
        peek: Reader<'_, S>,
        writer: Writer<'_, S>,
    ) -> Result<usize, ServerError> {
        let header = *header;
        if let Some(errno) = refusal(&header, reader.available_bytes(), writer.available_bytes()) {
            return reply_error(header.unique, writer, &io::Error::from_raw_os_error(errno));
        }
        match header.opcode {
            FUSE_COPY_FILE_RANGE => self.copy_file_range(&header, peek, writer),
            FUSE_SYNCFS => self.syncfs(&header, peek, writer),
            FUSE_TMPFILE => self.tmpfile(&header, peek, writer),
            wire::FUSE_SETXATTR if self.setxattr_ext.load(Ordering::Relaxed) => {
                self.setxattr_ext(&header, peek, writer)
            }
            FUSE_SETLKW if on_queue_thread() => {
                // The dispatch sends SETLKW to a thread of its own; this is the fallback when
                // none could be started. Waiting here would stall the queue that carries the
                // unlock it waits for.
                tracing::debug!(unique = header.unique, "SETLKW on a queue thread refused");
                reply_error(
                    header.unique,
                    writer,
                    &io::Error::from_raw_os_error(libc::ENOLCK),
                )
            }
            FUSE_SETLKW => self.setlkw(&header, peek, writer),
            _ => self
                .server
                .handle_message(reader, writer, None, None)
                .map_err(ServerError::Fuse),
        }
    }

    /// End a FUSE session without a DESTROY (the frontend went away): drop every node and
    /// handle the guest was given, so that the next frontend cannot use them. No request may
    /// be running.
    pub fn end_session(&self) {
        self.fs.destroy();
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

    /// FUSE_TMPFILE: `struct fuse_create_in` and the name of the kernel's tmpfile dentry
    /// ("/", or empty), within the declared length; answered as CREATE is, with an entry and
    /// an open handle.
    #[inline(never)]
    fn tmpfile<S: BitmapSlice>(
        &self,
        header: &InHeader,
        mut reader: Reader<'_, S>,
        writer: Writer<'_, S>,
    ) -> Result<usize, ServerError> {
        let result = Self::read_in::<CreateIn, S>(header, &mut reader).and_then(|arg| {
            // The dispatch checked that the declared length lies within the chain.
            let declared = usize::try_from(header.len).unwrap_or(usize::MAX);
            let name_len = declared - size_of::<InHeader>() - size_of::<CreateIn>();
            let mut name = [0u8; 2];
            let name = name
                .get_mut(..name_len)
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
            reader
                .read_exact(name)
                .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
            if !matches!(&*name, b"\0" | b"/\0") {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            let ctx = self.context(header)?;
            self.fs.tmpfile(&ctx, header.nodeid, arg)
        });
        match result {
            Ok((entry, fh, opts)) => {
                let open = OpenOut {
                    fh,
                    open_flags: opts.bits(),
                    ..Default::default()
                };
                let mut body = [0u8; size_of::<EntryOut>() + size_of::<OpenOut>()];
                let (e, o) = body.split_at_mut(size_of::<EntryOut>());
                e.copy_from_slice(EntryOut::from(entry).as_slice());
                o.copy_from_slice(open.as_slice());
                let header = OutHeader {
                    len: u32::try_from(size_of::<OutHeader>() + body.len()).unwrap_or(u32::MAX),
                    error: 0,
                    unique: header.unique,
                };
                write_reply(writer, header, &body)
            }
            Err(e) => reply_error(header.unique, writer, &e),
        }
    }

    /// SETXATTR with SETXATTR_EXT negotiated: `struct fuse_setxattr_in` of 16 bytes (size,
    /// flags, setxattr_flags, padding), then the name and its NUL, then `size` bytes of value,
    /// all within the declared length; refused as fuse-backend-rs refuses the short form (a
    /// name without its NUL, a value of another size: EINVAL). With
    /// FUSE_SETXATTR_ACL_KILL_SGID on a POSIX access ACL, the file's setgid bit is cleared
    /// after the ACL is set ([`WireOps::acl_kill_sgid`]): the guest kernel found the caller
    /// neither in the file's group nor holding CAP_FSETID (`posix_acl_update_mode`).
    #[inline(never)]
    fn setxattr_ext<S: BitmapSlice>(
        &self,
        header: &InHeader,
        mut reader: Reader<'_, S>,
        writer: Writer<'_, S>,
    ) -> Result<usize, ServerError> {
        let result = Self::read_in::<SetxattrInExt, S>(header, &mut reader).and_then(|arg| {
            let einval = || io::Error::from_raw_os_error(libc::EINVAL);
            // The dispatch checked that the declared length lies within the chain.
            let declared = usize::try_from(header.len).unwrap_or(usize::MAX);
            let len = declared - size_of::<InHeader>() - size_of::<SetxattrInExt>();
            // A name (at most 255 bytes) and a value of at most XATTR_SIZE_MAX.
            if len > 256 + 65536 {
                return Err(io::Error::from_raw_os_error(libc::E2BIG));
            }
            let mut buf = vec![0u8; len];
            reader.read_exact(&mut buf).map_err(|_| einval())?;
            let nul = buf.iter().position(|b| *b == 0).ok_or_else(einval)?;
            let (name, value) = buf.split_at(nul + 1);
            if usize::try_from(arg.size).ok() != Some(value.len()) {
                return Err(einval());
            }
            let name = std::ffi::CStr::from_bytes_with_nul(name).map_err(|_| einval())?;
            let ctx = self.context(header)?;
            self.fs
                .setxattr(&ctx, header.nodeid, name, value, arg.flags)?;
            if arg.setxattr_flags & wire::FUSE_SETXATTR_ACL_KILL_SGID != 0
                && name.to_bytes() == b"system.posix_acl_access"
            {
                self.fs.acl_kill_sgid(&ctx, header.nodeid)?;
            }
            Ok(())
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

/// What the server answers a request without serving it, from its header alone (`Some(errno)`):
/// an opcode the daemon does not serve (ENOSYS); a declared length that does not cover the
/// header and the opcode's in-struct (fuse-backend-rs would fail to decode it and the guest get
/// no reply) or that the chain's `readable` bytes do not hold (fuse-backend-rs sizes name and
/// xattr buffers by it) (EINVAL); a request that hands the guest a node or a handle without
/// `writable` room for its whole reply (EINVAL: fuse-backend-rs writes it after the filesystem
/// made the node or handle, and a reply the chain cannot hold is lost with a lookup count or
/// handle nobody will give back; the hostile suite's 15-byte OPEN replies left one handle each).
fn refusal(header: &InHeader, readable: usize, writable: usize) -> Option<i32> {
    if !is_served(header.opcode) {
        return Some(libc::ENOSYS);
    }
    let declared = usize::try_from(header.len).unwrap_or(usize::MAX);
    let needed = size_of::<InHeader>() + in_struct_len(header.opcode);
    if declared < needed || declared > readable || writable < reply_len(header.opcode) {
        return Some(libc::EINVAL);
    }
    None
}

/// The debug-level span a request is logged in.
fn request_span(header: &InHeader) -> tracing::Span {
    tracing::debug_span!(
        "fuse",
        op = wire::opcode_name(usize::try_from(header.opcode).unwrap_or(0)),
        unique = header.unique,
        node = header.nodeid,
        errno = tracing::field::Empty,
        us = tracing::field::Empty,
    )
}

/// Size of the fixed in-struct fuse-backend-rs 0.14 (or our own handler) reads first for
/// `opcode`; 0 for requests that carry only names or nothing.
fn in_struct_len(opcode: u32) -> usize {
    use fuse_backend_rs::abi::fuse_abi::{
        AccessIn, BatchForgetIn, CreateIn, FallocateIn, FlushIn, ForgetIn, FsyncIn, GetattrIn,
        GetxattrIn, InitIn, LinkIn, LseekIn, MkdirIn, MknodIn, OpenIn, ReadIn, ReleaseIn,
        Rename2In, RenameIn, SetattrIn, SetxattrIn, WriteIn,
    };
    match opcode {
        2 => size_of::<ForgetIn>(),
        3 => size_of::<GetattrIn>(),
        4 => size_of::<SetattrIn>(),
        8 => size_of::<MknodIn>(),
        9 => size_of::<MkdirIn>(),
        12 => size_of::<RenameIn>(),
        13 => size_of::<LinkIn>(),
        14 | 27 => size_of::<OpenIn>(),
        15 | 28 | 44 => size_of::<ReadIn>(),
        16 => size_of::<WriteIn>(),
        18 | 29 => size_of::<ReleaseIn>(),
        20 | 30 => size_of::<FsyncIn>(),
        21 => size_of::<SetxattrIn>(),
        22 | 23 => size_of::<GetxattrIn>(),
        25 => size_of::<FlushIn>(),
        26 => size_of::<InitIn>(),
        31..=33 => size_of::<LkIn>(),
        34 => size_of::<AccessIn>(),
        35 => size_of::<CreateIn>(),
        42 => size_of::<BatchForgetIn>(),
        43 => size_of::<FallocateIn>(),
        45 => size_of::<Rename2In>(),
        46 => size_of::<LseekIn>(),
        FUSE_COPY_FILE_RANGE => size_of::<CopyFileRangeIn>(),
        FUSE_SYNCFS => size_of::<SyncfsIn>(),
        FUSE_TMPFILE => size_of::<CreateIn>(),
        wire::FUSE_STATX => wire::STATX_IN_LEN,
        _ => 0,
    }
}

/// The whole reply of a request that makes a node or a handle for the guest (an entry, an
/// open handle, or both); 0 for the others, whose replies carry no state.
fn reply_len(opcode: u32) -> usize {
    let out = size_of::<OutHeader>();
    match opcode {
        // LOOKUP, SYMLINK, MKNOD, MKDIR, LINK
        1 | 6 | 8 | 9 | 13 => out + size_of::<EntryOut>(),
        // OPEN, OPENDIR
        14 | 27 => out + size_of::<OpenOut>(),
        // CREATE, TMPFILE
        35 | FUSE_TMPFILE => out + size_of::<EntryOut>() + size_of::<OpenOut>(),
        _ => 0,
    }
}

/// What the watchdog shows of a request: the header's ids, and for requests on an open file
/// the handle, offset and size from the in-struct (read only for those opcodes, whose serve
/// costs far more than this read; what a short in-struct does not hold is left out).
fn request_info<S: BitmapSlice>(
    header: &InHeader,
    body: &Reader<'_, S>,
    queue: usize,
) -> RequestInfo {
    let layout = ArgsLayout::of(header.opcode);
    if layout == ArgsLayout::None {
        return request_info_bytes(header, &[], queue);
    }
    let mut head = [0u8; ArgsLayout::PEEK];
    let n = peek(&mut body.clone(), &mut head);
    request_info_bytes(header, head.get(..n).unwrap_or(&[]), queue)
}

/// [`request_info`] of a request whose body (past the in-header) is `body`.
fn request_info_bytes(header: &InHeader, body: &[u8], queue: usize) -> RequestInfo {
    let mut info = RequestInfo {
        opcode: header.opcode,
        unique: header.unique,
        node: header.nodeid,
        queue: u16::try_from(queue).unwrap_or(u16::MAX),
        ..RequestInfo::default()
    };
    let layout = ArgsLayout::of(header.opcode);
    if layout != ArgsLayout::None {
        let b = body.get(..ArgsLayout::PEEK.min(body.len())).unwrap_or(&[]);
        (info.fh, info.offset, info.size) = layout.parse(b);
    }
    info
}

/// Fill `buf` from `r` as far as it goes; the number of bytes read.
fn peek<S: BitmapSlice>(r: &mut Reader<'_, S>, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while let Some(rest) = buf.get_mut(n..).filter(|b| !b.is_empty()) {
        match r.read(rest) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    n
}

/// A lock's end at or past this means "to end of file": Linux sends OFFSET_MAX (i64::MAX).
const TO_END_OF_FILE: u64 = i64::MAX.unsigned_abs();

/// Where a request's in-struct keeps the handle, offset and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArgsLayout {
    None,
    /// fuse_fsync_in, fuse_flush_in, fuse_release_in, fuse_lseek_in: fh first.
    Fh,
    /// fuse_read_in, fuse_write_in: fh, offset, u32 size.
    FhOffsetSize32,
    /// fuse_fallocate_in: fh, offset, u64 length.
    FhOffsetSize64,
    /// fuse_lk_in: fh, owner, then the range [start, end] (end [`TO_END_OF_FILE`] or more:
    /// to end of file, no size).
    Lock,
    /// fuse_copy_file_range_in: fh_in, off_in, nodeid_out, fh_out, off_out, len.
    CopyRange,
}

impl ArgsLayout {
    /// Bytes of the in-struct that hold everything we show.
    const PEEK: usize = 48;

    fn of(opcode: u32) -> Self {
        use crate::wire::{
            FUSE_FALLOCATE, FUSE_FLUSH, FUSE_FSYNC, FUSE_FSYNCDIR, FUSE_GETLK, FUSE_LSEEK,
            FUSE_READ, FUSE_READDIR, FUSE_READDIRPLUS, FUSE_RELEASE, FUSE_RELEASEDIR, FUSE_SETLK,
            FUSE_WRITE,
        };
        match opcode {
            FUSE_READ | FUSE_WRITE | FUSE_READDIR | FUSE_READDIRPLUS => ArgsLayout::FhOffsetSize32,
            FUSE_FALLOCATE => ArgsLayout::FhOffsetSize64,
            FUSE_LSEEK | FUSE_FSYNC | FUSE_FSYNCDIR | FUSE_FLUSH | FUSE_RELEASE
            | FUSE_RELEASEDIR => ArgsLayout::Fh,
            FUSE_GETLK | FUSE_SETLK | FUSE_SETLKW => ArgsLayout::Lock,
            FUSE_COPY_FILE_RANGE => ArgsLayout::CopyRange,
            _ => ArgsLayout::None,
        }
    }

    /// (fh, offset, size) from the first bytes of the in-struct.
    fn parse(self, b: &[u8]) -> (Option<u64>, Option<u64>, Option<u64>) {
        let u64_at = |at: usize| {
            b.get(at..at + 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_ne_bytes)
        };
        let u32_at = |at: usize| {
            b.get(at..at + 4)
                .and_then(|s| s.try_into().ok())
                .map(|s| u64::from(u32::from_ne_bytes(s)))
        };
        match self {
            ArgsLayout::None => (None, None, None),
            ArgsLayout::Fh => (u64_at(0), None, None),
            ArgsLayout::FhOffsetSize32 => (u64_at(0), u64_at(8), u32_at(16)),
            ArgsLayout::FhOffsetSize64 => (u64_at(0), u64_at(8), u64_at(16)),
            ArgsLayout::Lock => {
                let (start, end) = (u64_at(16), u64_at(24));
                let size = start
                    .zip(end)
                    .filter(|(_, e)| *e < TO_END_OF_FILE)
                    .map(|(s, e)| e.saturating_sub(s).saturating_add(1));
                (u64_at(0), start, size)
            }
            ArgsLayout::CopyRange => (u64_at(0), u64_at(8), u64_at(40)),
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
/// The errno for a request fuse-backend-rs refused to decode (a name without its NUL, a
/// parameter missing, a body its in-struct does not fit): fuse-backend-rs returns those
/// without answering, and the guest gets this errno in a reply instead of a chain returned
/// empty. `None` for the errors after which nothing can be answered (a reply that did not
/// fit the chain, a failed write).
pub fn refused_errno(e: &ServerError) -> Option<i32> {
    use fuse_backend_rs::Error as E;
    let ServerError::Fuse(e) = e else {
        return None;
    };
    match e {
        E::DecodeMessage(io) | E::InvalidMessage(io) => {
            Some(io.raw_os_error().unwrap_or(libc::EINVAL))
        }
        E::MissingParameter
        | E::InvalidHeaderLength
        | E::InvalidCString(_)
        | E::InvalidXattrSize(_) => Some(libc::EINVAL),
        _ => None,
    }
}

/// Answer request `unique` with `errno` (see [`refused_errno`]).
pub fn reply_errno<S: BitmapSlice>(
    unique: u64,
    writer: Writer<'_, S>,
    errno: i32,
) -> Result<usize, ServerError> {
    reply_error(unique, writer, &io::Error::from_raw_os_error(errno))
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use fuse_backend_rs::abi::fuse_abi::{FallocateIn, FileLock as AbiLock, ReadIn, WriteIn};

    #[test]
    fn handle_offset_and_size_come_from_the_in_struct() {
        let write = WriteIn {
            fh: 3,
            offset: 8192,
            size: 4096,
            fuse_flags: 1,
            lock_owner: 0,
            flags: 0,
            padding: 0,
        };
        let layout = ArgsLayout::of(16);
        assert_eq!(
            layout.parse(write.as_slice()),
            (Some(3), Some(8192), Some(4096))
        );
        let read = ReadIn {
            fh: 4,
            offset: 1,
            size: 131_072,
            read_flags: 0xffff_ffff,
            ..Default::default()
        };
        assert_eq!(
            ArgsLayout::of(15).parse(read.as_slice()),
            (Some(4), Some(1), Some(131_072))
        );
        let falloc = FallocateIn {
            fh: 5,
            offset: 10,
            length: 1 << 40,
            mode: 0,
            padding: 0,
        };
        assert_eq!(
            ArgsLayout::of(43).parse(falloc.as_slice()),
            (Some(5), Some(10), Some(1 << 40))
        );
        let lk = |start, end| LkIn {
            fh: 7,
            owner: 9,
            lk: AbiLock {
                start,
                end,
                type_: 1,
                pid: 1,
            },
            lk_flags: 0,
            padding: 0,
        };
        for to_end in [i64::MAX as u64, u64::MAX] {
            assert_eq!(
                ArgsLayout::of(FUSE_SETLKW).parse(lk(0, to_end).as_slice()),
                (Some(7), Some(0), None),
                "a lock to the end of file has no size"
            );
        }
        assert_eq!(
            ArgsLayout::of(FUSE_SETLKW).parse(lk(100, 199).as_slice()),
            (Some(7), Some(100), Some(100))
        );
        let copy = CopyFileRangeIn {
            fh_in: 1,
            offset_in: 2,
            nodeid_out: 3,
            fh_out: 4,
            offset_out: 5,
            len: 6,
            flags: 0,
        };
        assert_eq!(
            ArgsLayout::of(FUSE_COPY_FILE_RANGE).parse(copy.as_slice()),
            (Some(1), Some(2), Some(6))
        );
        assert_eq!(
            ArgsLayout::of(20).parse(&9u64.to_ne_bytes()),
            (Some(9), None, None)
        );
        // GETATTR and the like read nothing; a short in-struct gives what it holds.
        assert_eq!(ArgsLayout::of(3), ArgsLayout::None);
        assert_eq!(
            ArgsLayout::of(16).parse(write.as_slice().get(..12).unwrap_or(&[])),
            (Some(3), None, None)
        );
        assert_eq!(ArgsLayout::of(16).parse(&[]), (None, None, None));
    }
}
