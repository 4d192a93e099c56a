//! READ and WRITE answered later: the server's side of the async path (libcephfs 20's
//! `ceph_ll_nonblocking_readv_writev`, through [`AsyncOps::async_read`](super::AsyncOps::async_read) and its kin).
//!
//! [`FuseServer::start_async`] takes a READ or WRITE only when the blocking path would hand it
//! to the filesystem as it is: every request that `dispatch` or fuse-backend-rs would refuse
//! (a declared length the chain does not hold, a reply that does not fit, an id that does not
//! map) and every one the filesystem does not take (not an O_DIRECT handle, an unknown handle)
//! is left to the blocking path, which answers it as it always has. A request taken gets the
//! filesystem's own checks (range, handle, privilege kill), in the blocking order; an errno
//! they give is answered at once. [`FuseServer::finish_async`] writes the answer and accounts
//! for the request as [`FuseServer::handle_message`] does (metrics, watchdog, lost session).

use std::io::{self, Read};
use std::mem::size_of;
use std::time::Instant;

use fuse_backend_rs::abi::fuse_abi::{InHeader, OutHeader, ReadIn, WriteIn, WriteOut};
use fuse_backend_rs::api::filesystem::ZeroCopyReader;
use fuse_backend_rs::api::server::MAX_BUFFER_SIZE;
use fuse_backend_rs::file_traits::FileReadWriteVolatile;
use fuse_backend_rs::transport::{Reader, Writer};
use vm_memory::bitmap::BitmapSlice;

use super::{
    in_struct_len, inflight, reply, reply_error, request_info, write_reply, FuseServer, ServerError,
};
use super::{AsyncReply, AsyncStart, Servable};
use crate::wire::{ReplyHead, FUSE_READ, FUSE_WRITE};

/// fuse-backend-rs's `BUFFER_HEADER_SIZE` (private there): a request declaring more than
/// `MAX_BUFFER_SIZE` plus this is answered ENOMEM by it.
const BUFFER_HEADER_SIZE: u32 = 0x1000;

/// A READ or WRITE sent to the filesystem and not answered yet.
#[derive(Debug)]
pub struct AsyncRequest {
    header: InHeader,
    start: Instant,
    tracked: Option<inflight::Tracked>,
}

/// What [`FuseServer::start_async`] did with a request.
#[derive(Debug)]
pub enum Started {
    /// Not for the async path: serve it the blocking way.
    NotTaken,
    /// In flight: [`FuseServer::finish_async`] answers it with what
    /// [`AsyncOps::async_next`](super::AsyncOps::async_next) gives under its tag.
    Sent(AsyncRequest),
    /// Answered already (an errno, or nothing to wait for): the bytes written to the guest.
    Answered(Result<usize, ServerError>),
}

/// The guest data of a WRITE, after its in-struct, as the filesystem takes it.
struct Data<'a, S: BitmapSlice>(Reader<'a, S>);

impl<S: BitmapSlice> io::Read for Data<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl<S: BitmapSlice> ZeroCopyReader for Data<'_, S> {
    fn read_to(
        &mut self,
        f: &mut dyn FileReadWriteVolatile,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        self.0.read_to_at(f, count, off)
    }
}

impl<F> FuseServer<F>
where
    F: Servable,
{
    /// Start READ or WRITE `header` (decoded by the caller from the bytes `reader` starts
    /// with, as for [`FuseServer::handle_message`]) without waiting for the storage, under
    /// `tag` (the caller's number, unique among the requests it has in flight). `writer` is the
    /// chain's reply space: written only when the request is answered at once.
    pub fn start_async<S: BitmapSlice>(
        &self,
        header: InHeader,
        reader: Reader<'_, S>,
        writer: Writer<'_, S>,
        queue: usize,
        tag: u64,
    ) -> Started {
        let start = Instant::now();
        let opcode = header.opcode;
        let reply_room = size_of::<OutHeader>()
            + if opcode == FUSE_WRITE {
                size_of::<WriteOut>()
            } else {
                0
            };
        let mut body = reader.clone();
        let available = body.available_bytes();
        let mut skipped = [0u8; size_of::<InHeader>()];
        let declared = usize::try_from(header.len).unwrap_or(usize::MAX);
        // What `dispatch` and fuse-backend-rs check before the filesystem sees the request: a
        // request they refuse is refused by them, on the blocking path.
        if !(opcode == FUSE_READ || opcode == FUSE_WRITE)
            || body.read_exact(&mut skipped).is_err()
            || declared < size_of::<InHeader>() + in_struct_len(opcode)
            || declared > available
            || header.len > MAX_BUFFER_SIZE + BUFFER_HEADER_SIZE
            || writer.available_bytes() < reply_room
        {
            return Started::NotTaken;
        }
        let Ok(ctx) = self.context(&header) else {
            return Started::NotTaken;
        };
        let args = body.clone();
        let (fh, arg) = if opcode == FUSE_READ {
            match body.read_obj::<ReadIn>() {
                Ok(a) => (a.fh, Args::Read(a)),
                Err(_) => return Started::NotTaken,
            }
        } else {
            match body.read_obj::<WriteIn>() {
                Ok(a) => (a.fh, Args::Write(a)),
                Err(_) => return Started::NotTaken,
            }
        };
        // The data goes through a buffer of the request's size: no more than a request the
        // guest kernel sends (fuse-backend-rs's MAX_BUFFER_SIZE; max_pages is below it). A
        // larger one goes the blocking way, which moves it in place.
        let size = match &arg {
            Args::Read(a) => a.size,
            Args::Write(a) => a.size,
        };
        if size > MAX_BUFFER_SIZE || !self.fs.async_takes(opcode, header.nodeid, fh) {
            return Started::NotTaken;
        }
        let request = AsyncRequest {
            header,
            start,
            tracked: inflight::track_detached(start, || request_info(&header, &args, queue)),
        };
        let started = match arg {
            Args::Read(a) => {
                let room = writer.available_bytes() - size_of::<OutHeader>();
                self.fs
                    .async_read(&ctx, header.nodeid, a.fh, a.size, a.offset, room, tag)
            }
            Args::Write(a) => self.fs.async_write(
                &ctx,
                header.nodeid,
                a.fh,
                &mut Data(body),
                a.size,
                a.offset,
                a.fuse_flags,
                tag,
            ),
        };
        match started {
            Ok(AsyncStart::Sent) => Started::Sent(request),
            Ok(AsyncStart::Done(r)) => Started::Answered(self.finish_async(request, Ok(r), writer)),
            Err(e) => Started::Answered(self.finish_async(request, Err(e), writer)),
        }
    }

    /// The next READ or WRITE the filesystem finished (its tag and what to answer), waiting
    /// at most `timeout`.
    pub fn async_next(
        &self,
        timeout: std::time::Duration,
    ) -> Option<(u64, io::Result<AsyncReply>)> {
        self.fs.async_next(timeout)
    }

    /// Answer `request` with `result` into `writer` (the chain's reply space), and account for
    /// it as [`FuseServer::handle_message`] does. The bytes written to the guest.
    pub fn finish_async<S: BitmapSlice>(
        &self,
        request: AsyncRequest,
        result: io::Result<AsyncReply>,
        writer: Writer<'_, S>,
    ) -> Result<usize, ServerError> {
        let AsyncRequest {
            header,
            start,
            tracked,
        } = request;
        let unique = header.unique;
        let (written, errno, write_size) = match result {
            Ok(AsyncReply::Read(data)) => {
                // At most the reply's room, which fits a FUSE reply's u32 length.
                let len = u32::try_from(size_of::<OutHeader>() + data.len()).unwrap_or(u32::MAX);
                let out = OutHeader {
                    len,
                    error: 0,
                    unique,
                };
                (write_reply(writer, out, &data), 0, None)
            }
            Ok(AsyncReply::Written(n)) => match u32::try_from(n) {
                Ok(size) => (
                    reply(unique, writer, Some(WriteOut { size, padding: 0 })),
                    0,
                    Some(size),
                ),
                // More than a WRITE can carry: a filesystem fault.
                Err(_) => {
                    let e = io::Error::from_raw_os_error(libc::EIO);
                    (reply_error(unique, writer, &e), libc::EIO, None)
                }
            },
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                (reply_error(unique, writer, &e), errno, None)
            }
        };
        let elapsed = start.elapsed();
        let op = super::wire::opcode_name(usize::try_from(header.opcode).unwrap_or(0));
        let span = tracing::debug_span!(
            "fuse",
            op,
            unique,
            node = header.nodeid,
            errno = tracing::field::Empty,
            us = tracing::field::Empty,
        );
        let _entered = span.enter();
        let head = match &written {
            Ok(n) => Some(ReplyHead {
                errno,
                write_size,
                payload: n.saturating_sub(size_of::<OutHeader>()),
                negative_entry: false,
            }),
            Err(_) => {
                crate::metrics::global().record_malformed();
                None
            }
        };
        self.answered(&header, tracked, head.as_ref(), elapsed, &span);
        written
    }
}

/// A READ's or WRITE's in-struct, as read from our copy of the request.
enum Args {
    Read(ReadIn),
    Write(WriteIn),
}
