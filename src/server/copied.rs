//! The requests the server decodes itself, from a private copy of their bytes, and answers into
//! a private reply buffer: the cached metadata requests a guest repeats all the time (GETATTR,
//! LOOKUP, OPEN and RELEASE, FLUSH, the directory handles, READDIRPLUS, ACCESS, STATFS, FORGET).
//!
//! fuse-backend-rs reads a request only through a `Reader` and writes a reply only through a
//! `Writer`, both built over a descriptor chain in guest memory: for a GETATTR that is two walks
//! of a chain and two heap allocations before the filesystem is called, and most of the
//! request's cost (docs/benchmarks.md, "Cost per request"). These opcodes carry a
//! fixed in-struct (and LOOKUP a name), so the transport copies the request out of guest memory
//! once (`vhost_user::chain`) and they are decoded here from that copy, the filesystem called
//! through the same `FileSystem` trait, and the reply encoded with fuse-backend-rs's own types
//! and conversions (`EntryOut::from(Entry)`, `Attr::from(stat64)`, `Kstatfs::from`) into the
//! reply buffer. Each opcode follows fuse-backend-rs 0.14's handler byte for byte (its errno on
//! each decode failure, its negative-entry rule, its READDIRPLUS packing); the unit tests below
//! hold the two to the same bytes for seeded random requests.
//!
//! Every other opcode goes to fuse-backend-rs as before.

use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::sync::atomic::Ordering;

use fuse_backend_rs::abi::fuse_abi::{
    AccessIn, AttrOut, BatchForgetIn, Dirent, EntryOut, FlushIn, ForgetIn, ForgetOne, GetattrIn,
    InHeader, Kstatfs, OpenIn, OpenOut, OutHeader, ReadIn, ReleaseIn, GETATTR_FH,
    RELEASE_FLOCK_UNLOCK, RELEASE_FLUSH,
};
use fuse_backend_rs::api::filesystem::{Context, DirEntry, Entry, FileSystem};
use fuse_backend_rs::api::server::MAX_BUFFER_SIZE;
use vm_memory::ByteValued;

use super::Servable;
use super::{FuseServer, ServerError};
use crate::wire::{
    Btime, FUSE_ACCESS, FUSE_BATCH_FORGET, FUSE_FLUSH, FUSE_FORGET, FUSE_GETATTR, FUSE_LOOKUP,
    FUSE_OPEN, FUSE_OPENDIR, FUSE_READDIRPLUS, FUSE_RELEASE, FUSE_RELEASEDIR, FUSE_STATFS,
    FUSE_STATX, STATX_IN_LEN,
};

/// fuse-backend-rs's `BUFFER_HEADER_SIZE` (private there): a request declaring more than
/// `MAX_BUFFER_SIZE` plus this is refused by it.
const BUFFER_HEADER_SIZE: u32 = 0x1000;
/// Below this protocol minor a LOOKUP answer with node id 0 is not a negative entry (fuse-backend
/// -rs's `KERNEL_MINOR_VERSION_LOOKUP_NEGATIVE_ENTRY_ZERO`).
const NEGATIVE_ENTRY_MINOR: u32 = 4;

/// Whether [`FuseServer::serve_copied`] decodes `opcode` itself.
pub fn serves(opcode: u32) -> bool {
    matches!(
        opcode,
        FUSE_STATX
            | FUSE_LOOKUP
            | FUSE_FORGET
            | FUSE_GETATTR
            | FUSE_OPEN
            | FUSE_STATFS
            | FUSE_RELEASE
            | FUSE_FLUSH
            | FUSE_OPENDIR
            | FUSE_RELEASEDIR
            | FUSE_ACCESS
            | FUSE_BATCH_FORGET
            | FUSE_READDIRPLUS
    )
}

/// Size of `struct fuse_statx_out`: attr_valid, attr_valid_nsec, flags, spare[2], then the
/// 256-byte `struct fuse_statx`.
const STATX_OUT_LEN: usize = 32 + 256;
/// statx(2)'s STATX_BASIC_STATS and STATX_BTIME (`include/uapi/linux/stat.h`).
const STATX_BASIC_STATS: u32 = 0x7ff;
const STATX_BTIME: u32 = 0x800;

/// `struct fuse_statx_out` for `st` (Linux `include/uapi/linux/fuse.h`), birth time included
/// when known: every field little endian at its offset, the spares zero.
fn statx_out(st: &libc::stat64, btime: Btime, ttl: std::time::Duration) -> [u8; STATX_OUT_LEN] {
    fn put(b: &mut [u8; STATX_OUT_LEN], at: usize, v: &[u8]) {
        if let Some(d) = b.get_mut(at..at + v.len()) {
            d.copy_from_slice(v);
        }
    }
    fn time(b: &mut [u8; STATX_OUT_LEN], at: usize, sec: i64, nsec: i64) {
        put(b, at, &sec.to_le_bytes());
        put(b, at + 8, &u32::try_from(nsec).unwrap_or(0).to_le_bytes());
    }
    let mut b = [0u8; STATX_OUT_LEN];
    put(&mut b, 0, &ttl.as_secs().to_le_bytes());
    put(&mut b, 8, &ttl.subsec_nanos().to_le_bytes());
    // struct fuse_statx at 32.
    let x = 32;
    let mask = STATX_BASIC_STATS | if btime.is_some() { STATX_BTIME } else { 0 };
    put(&mut b, x, &mask.to_le_bytes());
    put(
        &mut b,
        x + 4,
        &u32::try_from(st.st_blksize).unwrap_or(0).to_le_bytes(),
    );
    put(
        &mut b,
        x + 16,
        &u32::try_from(st.st_nlink).unwrap_or(u32::MAX).to_le_bytes(),
    );
    put(&mut b, x + 20, &st.st_uid.to_le_bytes());
    put(&mut b, x + 24, &st.st_gid.to_le_bytes());
    put(
        &mut b,
        x + 28,
        &u16::try_from(st.st_mode & 0xffff)
            .unwrap_or(0)
            .to_le_bytes(),
    );
    put(&mut b, x + 32, &st.st_ino.to_le_bytes());
    put(
        &mut b,
        x + 40,
        &u64::try_from(st.st_size).unwrap_or(0).to_le_bytes(),
    );
    put(
        &mut b,
        x + 48,
        &u64::try_from(st.st_blocks).unwrap_or(0).to_le_bytes(),
    );
    time(&mut b, x + 64, st.st_atime, st.st_atime_nsec);
    if let Some((sec, nsec)) = btime {
        time(&mut b, x + 80, sec, i64::from(nsec));
    }
    time(&mut b, x + 96, st.st_ctime, st.st_ctime_nsec);
    time(&mut b, x + 112, st.st_mtime, st.st_mtime_nsec);
    put(&mut b, x + 128, &libc::major(st.st_rdev).to_le_bytes());
    put(&mut b, x + 132, &libc::minor(st.st_rdev).to_le_bytes());
    b
}

/// A reply being written into the private buffer.
pub(super) struct Out<'a> {
    buf: &'a mut [u8],
    unique: u64,
}

impl<'a> Out<'a> {
    pub(super) fn new(buf: &'a mut [u8], unique: u64) -> Self {
        Out { buf, unique }
    }

    /// An out-header and `body`: the bytes written, or EINVAL-free failure when the guest gave
    /// too little room (the transport returns such a chain unanswered).
    fn ok(&mut self, body: &[u8]) -> Result<usize, ServerError> {
        let len = size_of::<OutHeader>() + body.len();
        let header = OutHeader {
            len: u32::try_from(len).unwrap_or(u32::MAX),
            error: 0,
            unique: self.unique,
        };
        self.put(0, header.as_slice())?;
        self.put(size_of::<OutHeader>(), body)?;
        Ok(len)
    }

    fn ok_obj<T: ByteValued>(&mut self, body: T) -> Result<usize, ServerError> {
        self.ok(body.as_slice())
    }

    /// A reply carrying `err`'s errno (EIO for an error without one, as fuse-backend-rs maps
    /// the rare ones that have none).
    pub(super) fn error(&mut self, err: &io::Error) -> Result<usize, ServerError> {
        let errno = err
            .raw_os_error()
            .unwrap_or_else(|| fuse_backend_rs::encode_io_error_kind(err.kind()));
        let header = crate::wire::error_header(self.unique, errno);
        self.put(0, header.as_slice())?;
        Ok(size_of::<OutHeader>())
    }

    fn errno(&mut self, errno: i32) -> Result<usize, ServerError> {
        self.error(&io::Error::from_raw_os_error(errno))
    }

    fn put(&mut self, at: usize, bytes: &[u8]) -> Result<(), ServerError> {
        let dst = at
            .checked_add(bytes.len())
            .and_then(|end| self.buf.get_mut(at..end))
            .ok_or_else(|| ServerError::WriteReply(io::Error::from_raw_os_error(libc::ENOSPC)))?;
        dst.copy_from_slice(bytes);
        Ok(())
    }
}

/// The in-struct `T` at the start of `body`, as fuse-backend-rs's `read_obj` takes it; `None`
/// when the body is shorter.
fn read_obj<T: ByteValued>(body: &[u8]) -> Option<T> {
    T::from_slice(body.get(..size_of::<T>())?).copied()
}

impl<F> FuseServer<F>
where
    F: Servable,
{
    /// Decode and serve a request [`serves`] names: `body` is the request past its in-header
    /// (all the guest gave: fuse-backend-rs reads in-structs from there, and only a name is
    /// bounded by the declared length), `out` the reply buffer. `Ok(0)` for FORGET (no reply).
    /// What fuse-backend-rs answers without a reply (a body too short to decode) is an error
    /// here too, for the transport to handle the same way.
    pub(super) fn dispatch_copied(
        &self,
        header: &InHeader,
        ctx: &Context,
        body: &[u8],
        out: &mut Out<'_>,
    ) -> Result<usize, ServerError> {
        if header.len > MAX_BUFFER_SIZE + BUFFER_HEADER_SIZE {
            if header.opcode == FUSE_FORGET || header.opcode == FUSE_BATCH_FORGET {
                return Err(ServerError::Fuse(fuse_backend_rs::Error::InvalidMessage(
                    io::Error::from_raw_os_error(libc::EOVERFLOW),
                )));
            }
            return out.errno(libc::ENOMEM);
        }
        match header.opcode {
            FUSE_LOOKUP => self.lookup_copied(header, ctx, body, out),
            FUSE_FORGET | FUSE_BATCH_FORGET => self.forget_copied(header, ctx, body, out),
            FUSE_STATX | FUSE_GETATTR | FUSE_STATFS | FUSE_ACCESS => {
                self.attr_copied(header, ctx, body, out)
            }
            FUSE_OPEN | FUSE_OPENDIR | FUSE_RELEASE | FUSE_RELEASEDIR | FUSE_FLUSH => {
                self.handle_copied(header, ctx, body, out)
            }
            FUSE_READDIRPLUS => self.readdirplus_copied(header, ctx, body, out),
            _ => out.errno(libc::ENOSYS),
        }
    }

    /// LOOKUP: the name is the declared body, up to its first NUL.
    fn lookup_copied(
        &self,
        header: &InHeader,
        ctx: &Context,
        body: &[u8],
        out: &mut Out<'_>,
    ) -> Result<usize, ServerError> {
        let fs = &*self.fs;
        let node = header.nodeid;
        match header.opcode {
            FUSE_LOOKUP => {
                // The declared body is the name (the dispatch checked it lies within the
                // request); fuse-backend-rs takes it up to its first NUL and refuses one
                // without a NUL.
                let declared = usize::try_from(header.len)
                    .unwrap_or(usize::MAX)
                    .saturating_sub(size_of::<InHeader>());
                let body = body.get(..declared).unwrap_or(body);
                let name = match body.iter().position(|b| *b == 0) {
                    Some(end) => body
                        .get(..=end)
                        .and_then(|b| CStr::from_bytes_with_nul(b).ok()),
                    None => None,
                };
                let Some(name) = name else {
                    return out.errno(libc::EINVAL);
                };
                match fs.lookup(ctx, node, name) {
                    Ok(entry)
                        if entry.inode == 0
                            && self.minor.load(Ordering::Relaxed) < NEGATIVE_ENTRY_MINOR =>
                    {
                        out.errno(libc::ENOENT)
                    }
                    Ok(entry) => out.ok_obj(EntryOut::from(entry)),
                    Err(e) => out.error(&e),
                }
            }
            _ => out.errno(libc::ENOSYS),
        }
    }

    /// FORGET and BATCH_FORGET: never answered (`Ok(0)`); a body too short is an error for the transport, as fuse-backend-rs refuses it.
    fn forget_copied(
        &self,
        header: &InHeader,
        ctx: &Context,
        body: &[u8],
        out: &mut Out<'_>,
    ) -> Result<usize, ServerError> {
        let fs = &*self.fs;
        let node = header.nodeid;
        // A body too short for its in-struct (the dispatch refused those already): FORGETs are
        // never answered, the others get EINVAL, as fuse-backend-rs's refusal is answered.
        let forget_decode = || {
            ServerError::Fuse(fuse_backend_rs::Error::DecodeMessage(
                io::Error::from_raw_os_error(libc::EINVAL),
            ))
        };
        match header.opcode {
            FUSE_FORGET => {
                let ForgetIn { nlookup } = read_obj(body).ok_or_else(forget_decode)?;
                fs.forget(ctx, node, nlookup);
                Ok(0)
            }
            FUSE_BATCH_FORGET => {
                let BatchForgetIn { count, .. } = read_obj(body).ok_or_else(forget_decode)?;
                let limit = usize::try_from(
                    MAX_BUFFER_SIZE + BUFFER_HEADER_SIZE
                        - u32::try_from(size_of::<BatchForgetIn>() + size_of::<InHeader>())
                            .unwrap_or(u32::MAX),
                )
                .unwrap_or(usize::MAX);
                let size = usize::try_from(count)
                    .ok()
                    .and_then(|c| c.checked_mul(size_of::<ForgetOne>()))
                    .filter(|s| *s <= limit)
                    .ok_or_else(|| {
                        ServerError::Fuse(fuse_backend_rs::Error::InvalidMessage(
                            io::Error::from_raw_os_error(libc::EOVERFLOW),
                        ))
                    })?;
                let list = body
                    .get(size_of::<BatchForgetIn>()..)
                    .and_then(|l| l.get(..size))
                    .ok_or_else(forget_decode)?;
                let forgets = list
                    .chunks_exact(size_of::<ForgetOne>())
                    .filter_map(read_obj::<ForgetOne>)
                    .map(|f| (f.nodeid, f.nlookup))
                    .collect();
                fs.batch_forget(ctx, forgets);
                Ok(0)
            }
            _ => out.errno(libc::ENOSYS),
        }
    }

    /// The attribute requests: STATX, GETATTR, STATFS, ACCESS.
    fn attr_copied(
        &self,
        header: &InHeader,
        ctx: &Context,
        body: &[u8],
        out: &mut Out<'_>,
    ) -> Result<usize, ServerError> {
        let fs = &*self.fs;
        let node = header.nodeid;
        match header.opcode {
            FUSE_STATX => {
                // fuse_statx_in's flags and handle change nothing here: attributes come from
                // the node, as for GETATTR.
                if body.len() < STATX_IN_LEN {
                    return out.errno(libc::EINVAL);
                }
                match fs.statx(ctx, node) {
                    Ok((st, btime, ttl)) => out.ok(&statx_out(&st, btime, ttl)),
                    Err(e) => out.error(&e),
                }
            }
            FUSE_GETATTR => {
                let Some(GetattrIn { flags, fh, .. }) = read_obj(body) else {
                    return out.errno(libc::EINVAL);
                };
                let handle = (flags & GETATTR_FH != 0).then_some(fh);
                match fs.getattr(ctx, node, handle) {
                    Ok((st, timeout)) => out.ok_obj(AttrOut {
                        attr_valid: timeout.as_secs(),
                        attr_valid_nsec: timeout.subsec_nanos(),
                        dummy: 0,
                        attr: st.into(),
                    }),
                    Err(e) => out.error(&e),
                }
            }
            FUSE_STATFS => match fs.statfs(ctx, node) {
                Ok(st) => out.ok_obj(Kstatfs::from(st)),
                Err(e) => out.error(&e),
            },
            FUSE_ACCESS => {
                let Some(AccessIn { mask, .. }) = read_obj(body) else {
                    return out.errno(libc::EINVAL);
                };
                match fs.access(ctx, node, mask) {
                    Ok(()) => out.ok(&[]),
                    Err(e) => out.error(&e),
                }
            }
            _ => out.errno(libc::ENOSYS),
        }
    }

    /// The handle requests: OPEN, OPENDIR, RELEASE, RELEASEDIR, FLUSH.
    fn handle_copied(
        &self,
        header: &InHeader,
        ctx: &Context,
        body: &[u8],
        out: &mut Out<'_>,
    ) -> Result<usize, ServerError> {
        let fs = &*self.fs;
        let node = header.nodeid;
        match header.opcode {
            FUSE_OPEN => {
                let Some(OpenIn { flags, fuse_flags }) = read_obj(body) else {
                    return out.errno(libc::EINVAL);
                };
                match fs.open(ctx, node, flags, fuse_flags) {
                    Ok((handle, opts, passthrough)) => out.ok_obj(OpenOut {
                        fh: handle.unwrap_or(0),
                        open_flags: opts.bits(),
                        passthrough: passthrough.unwrap_or_default(),
                    }),
                    Err(e) => out.error(&e),
                }
            }
            FUSE_OPENDIR => {
                let Some(OpenIn { flags, .. }) = read_obj(body) else {
                    return out.errno(libc::EINVAL);
                };
                match fs.opendir(ctx, node, flags) {
                    Ok((handle, opts)) => out.ok_obj(OpenOut {
                        fh: handle.unwrap_or(0),
                        open_flags: opts.bits(),
                        ..Default::default()
                    }),
                    Err(e) => out.error(&e),
                }
            }
            FUSE_RELEASE => {
                let Some(ReleaseIn {
                    fh,
                    flags,
                    release_flags,
                    lock_owner,
                }) = read_obj(body)
                else {
                    return out.errno(libc::EINVAL);
                };
                let flush = release_flags & RELEASE_FLUSH != 0;
                let flock_release = release_flags & RELEASE_FLOCK_UNLOCK != 0;
                let lock_owner = (flush || flock_release).then_some(lock_owner);
                match fs.release(ctx, node, flags, fh, flush, flock_release, lock_owner) {
                    Ok(()) => out.ok(&[]),
                    Err(e) => out.error(&e),
                }
            }
            FUSE_RELEASEDIR => {
                let Some(ReleaseIn { fh, flags, .. }) = read_obj(body) else {
                    return out.errno(libc::EINVAL);
                };
                match fs.releasedir(ctx, node, flags, fh) {
                    Ok(()) => out.ok(&[]),
                    Err(e) => out.error(&e),
                }
            }
            FUSE_FLUSH => {
                let Some(FlushIn { fh, lock_owner, .. }) = read_obj(body) else {
                    return out.errno(libc::EINVAL);
                };
                match fs.flush(ctx, node, fh, lock_owner) {
                    Ok(()) => out.ok(&[]),
                    Err(e) => out.error(&e),
                }
            }
            _ => out.errno(libc::ENOSYS),
        }
    }

    /// READDIRPLUS, packed as fuse-backend-rs's `do_readdir` packs it.
    fn readdirplus_copied(
        &self,
        header: &InHeader,
        ctx: &Context,
        body: &[u8],
        out: &mut Out<'_>,
    ) -> Result<usize, ServerError> {
        let Some(ReadIn {
            fh, offset, size, ..
        }) = read_obj(body)
        else {
            return out.errno(libc::EINVAL);
        };
        let Ok(max) = usize::try_from(size) else {
            return out.errno(libc::ENOMEM);
        };
        if out.buf.len() < max {
            return out.errno(libc::ENOMEM);
        }
        let start = size_of::<OutHeader>();
        if out.buf.len() < start {
            return Err(ServerError::Fuse(
                fuse_backend_rs::Error::InvalidHeaderLength,
            ));
        }
        let mut written = 0usize;
        let res = {
            let dirents = out.buf.get_mut(start..).unwrap_or(&mut []);
            self.fs
                .readdirplus(ctx, header.nodeid, fh, size, offset, &mut |d, e| {
                    add_direntplus(dirents, &mut written, max, &d, e)
                })
        };
        match res {
            Err(e) => out.error(&e),
            Ok(()) => {
                let len = start + written;
                let h = OutHeader {
                    len: u32::try_from(len).unwrap_or(u32::MAX),
                    error: 0,
                    unique: header.unique,
                };
                out.put(0, h.as_slice())?;
                Ok(len)
            }
        }
    }
}

/// fuse-backend-rs's `add_dirent` with an entry: append one `fuse_direntplus` (entry, dirent,
/// name padded to 8 bytes) if it fits within `max` bytes of dirents; the bytes added, 0 when it
/// does not fit (the filesystem then stops and keeps the entry's lookup count).
fn add_direntplus(
    buf: &mut [u8],
    written: &mut usize,
    max: usize,
    d: &DirEntry<'_>,
    entry: Entry,
) -> io::Result<usize> {
    let overflow = || io::Error::from_raw_os_error(libc::EOVERFLOW);
    let namelen = u32::try_from(d.name.len()).map_err(|_| overflow())?;
    let dirent_len = size_of::<Dirent>()
        .checked_add(d.name.len())
        .ok_or_else(overflow)?;
    let padded = dirent_len
        .checked_add(7)
        .map(|l| l & !7)
        .ok_or_else(overflow)?;
    let total = padded
        .checked_add(size_of::<EntryOut>())
        .ok_or_else(overflow)?;
    if max.saturating_sub(*written) < total {
        return Ok(0);
    }
    let at = *written;
    let dst = buf
        .get_mut(at..at + total)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOSPC))?;
    let (e, rest) = dst.split_at_mut(size_of::<EntryOut>());
    e.copy_from_slice(EntryOut::from(entry).as_slice());
    let dirent = Dirent {
        ino: d.ino,
        off: d.offset,
        namelen,
        type_: d.type_,
    };
    let (de, name) = rest.split_at_mut(size_of::<Dirent>());
    de.copy_from_slice(dirent.as_slice());
    let (n, pad) = name.split_at_mut(d.name.len());
    n.copy_from_slice(d.name);
    pad.fill(0);
    *written += total;
    Ok(total)
}

/// The requests served from a copy against the same requests through fuse-backend-rs: seeded
/// random requests (valid, short, long, names without a NUL, odd flags, a filesystem that
/// answers anything) must give the same reply bytes, the same refusals and the same calls into
/// the filesystem. A failure prints the seed and the request.
#[cfg(test)]
mod tests {
    use std::ffi::CStr;
    use std::io;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use fuse_backend_rs::abi::fuse_abi::{
        stat64, statvfs64, InHeader, InitIn, OpenOptions, OutHeader,
    };
    use fuse_backend_rs::api::filesystem::{Context, DirEntry, Entry, FileSystem};
    use fuse_backend_rs::transport::{Reader, VirtioFsWriter, Writer};
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::{Queue, QueueOwnedT};
    use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryMmap};

    use super::super::{refused_errno, FuseServer, ServerError};
    use crate::server::{AsyncOps, SessionOps, WireOps};
    use crate::wire::*;

    /// splitmix64: the test's only source of randomness, from a seed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    /// A pure function of its arguments, so that two instances answer alike.
    fn mix(parts: &[u64]) -> Rng {
        let mut r = Rng(0x5eed);
        for p in parts {
            r.0 ^= *p;
            r.next();
        }
        r
    }

    fn errno_of(r: &mut Rng) -> Option<io::Error> {
        const ERRNOS: [i32; 6] = [
            libc::ENOENT,
            libc::EACCES,
            libc::ESTALE,
            libc::EIO,
            libc::EBADF,
            libc::ENFILE,
        ];
        (r.below(4) == 0).then(|| io::Error::from_raw_os_error(ERRNOS[r.below(6) as usize]))
    }

    fn stat_of(r: &mut Rng) -> stat64 {
        // SAFETY: stat64 is a C struct of integers; all-zero is a valid value.
        let mut st: stat64 = unsafe { std::mem::zeroed() };
        st.st_ino = r.next();
        st.st_mode = r.next() as u32;
        st.st_nlink = r.next();
        st.st_uid = r.next() as u32;
        st.st_gid = r.next() as u32;
        st.st_size = r.next() as i64;
        st.st_blocks = r.next() as i64;
        st.st_blksize = r.next() as i64;
        st.st_atime = r.next() as i64;
        st.st_mtime_nsec = r.next() as i64;
        st.st_rdev = r.next();
        st
    }

    fn timeout_of(r: &mut Rng) -> Duration {
        Duration::new(r.below(1 << 40), (r.next() % 1_000_000_000) as u32)
    }

    fn entry_of(r: &mut Rng) -> Entry {
        Entry {
            inode: if r.below(5) == 0 { 0 } else { r.next() },
            generation: r.next(),
            attr: stat_of(r),
            attr_flags: r.next() as u32,
            attr_timeout: timeout_of(r),
            entry_timeout: timeout_of(r),
        }
    }

    /// A filesystem that answers anything, the same for the same arguments, and logs each call.
    #[derive(Default)]
    struct RandFs {
        calls: Mutex<Vec<String>>,
        /// What `WireOps::init_flags` answers.
        init_flags: u64,
    }

    impl RandFs {
        fn log(&self, s: String) {
            self.calls.lock().unwrap().push(s);
        }
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.calls.lock().unwrap())
        }
    }

    fn ctx_key(ctx: &Context) -> u64 {
        u64::from(ctx.uid) << 32 | u64::from(ctx.gid)
    }

    impl FileSystem for RandFs {
        type Inode = u64;
        type Handle = u64;

        fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
            self.log(format!("lookup {} {parent} {name:?}", ctx_key(ctx)));
            let mut r = mix(&[
                1,
                parent,
                name.to_bytes().len() as u64,
                name.to_bytes().first().copied().unwrap_or(0).into(),
            ]);
            match errno_of(&mut r) {
                Some(e) => Err(e),
                None => Ok(entry_of(&mut r)),
            }
        }

        fn forget(&self, _ctx: &Context, inode: u64, count: u64) {
            self.log(format!("forget {inode} {count}"));
        }

        fn batch_forget(&self, _ctx: &Context, requests: Vec<(u64, u64)>) {
            self.log(format!("batch_forget {requests:?}"));
        }

        fn getattr(
            &self,
            ctx: &Context,
            inode: u64,
            handle: Option<u64>,
        ) -> io::Result<(stat64, Duration)> {
            self.log(format!("getattr {} {inode} {handle:?}", ctx_key(ctx)));
            let mut r = mix(&[3, inode, handle.unwrap_or(7)]);
            match errno_of(&mut r) {
                Some(e) => Err(e),
                None => Ok((stat_of(&mut r), timeout_of(&mut r))),
            }
        }

        fn open(
            &self,
            _ctx: &Context,
            inode: u64,
            flags: u32,
            fuse_flags: u32,
        ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
            self.log(format!("open {inode} {flags} {fuse_flags}"));
            let mut r = mix(&[14, inode, flags.into(), fuse_flags.into()]);
            match errno_of(&mut r) {
                Some(e) => Err(e),
                None => Ok((
                    (r.below(3) != 0).then(|| r.next()),
                    OpenOptions::from_bits_truncate(r.next() as u32),
                    (r.below(2) == 0).then(|| r.next() as u32),
                )),
            }
        }

        fn opendir(
            &self,
            _ctx: &Context,
            inode: u64,
            flags: u32,
        ) -> io::Result<(Option<u64>, OpenOptions)> {
            self.log(format!("opendir {inode} {flags}"));
            let mut r = mix(&[27, inode, flags.into()]);
            match errno_of(&mut r) {
                Some(e) => Err(e),
                None => Ok((
                    (r.below(3) != 0).then(|| r.next()),
                    OpenOptions::from_bits_truncate(r.next() as u32),
                )),
            }
        }

        fn release(
            &self,
            _ctx: &Context,
            inode: u64,
            flags: u32,
            handle: u64,
            flush: bool,
            flock_release: bool,
            lock_owner: Option<u64>,
        ) -> io::Result<()> {
            self.log(format!(
                "release {inode} {flags} {handle} {flush} {flock_release} {lock_owner:?}"
            ));
            errno_of(&mut mix(&[18, inode, handle])).map_or(Ok(()), Err)
        }

        fn releasedir(
            &self,
            _ctx: &Context,
            inode: u64,
            flags: u32,
            handle: u64,
        ) -> io::Result<()> {
            self.log(format!("releasedir {inode} {flags} {handle}"));
            errno_of(&mut mix(&[29, inode, handle])).map_or(Ok(()), Err)
        }

        fn flush(
            &self,
            _ctx: &Context,
            inode: u64,
            handle: u64,
            lock_owner: u64,
        ) -> io::Result<()> {
            self.log(format!("flush {inode} {handle} {lock_owner}"));
            errno_of(&mut mix(&[25, inode, handle])).map_or(Ok(()), Err)
        }

        fn access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
            self.log(format!("access {} {inode} {mask}", ctx_key(ctx)));
            errno_of(&mut mix(&[34, inode, mask.into()])).map_or(Ok(()), Err)
        }

        fn statfs(&self, _ctx: &Context, inode: u64) -> io::Result<statvfs64> {
            self.log(format!("statfs {inode}"));
            let mut r = mix(&[17, inode]);
            if let Some(e) = errno_of(&mut r) {
                return Err(e);
            }
            // SAFETY: statvfs64 is a C struct of integers; all-zero is a valid value.
            let mut st: statvfs64 = unsafe { std::mem::zeroed() };
            st.f_blocks = r.next();
            st.f_bfree = r.next();
            st.f_bavail = r.next();
            st.f_files = r.next();
            st.f_ffree = r.next();
            st.f_bsize = r.next();
            st.f_namemax = r.next();
            st.f_frsize = r.next();
            Ok(st)
        }

        fn readdirplus(
            &self,
            _ctx: &Context,
            inode: u64,
            handle: u64,
            size: u32,
            offset: u64,
            add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
        ) -> io::Result<()> {
            let mut r = mix(&[44, inode, handle, offset]);
            if let Some(e) = errno_of(&mut r) {
                self.log(format!("readdirplus {inode} {handle} {size} {offset} err"));
                return Err(e);
            }
            let mut taken = 0;
            for i in 0..r.below(40) {
                let n = 1 + r.below(300) as usize;
                let name = r.bytes(n);
                let d = DirEntry {
                    ino: r.next(),
                    offset: offset + i + 1,
                    type_: r.next() as u32,
                    name: &name,
                };
                match add_entry(d, entry_of(&mut r)) {
                    Ok(0) => break,
                    Ok(n) => taken += n,
                    Err(e) => return Err(e),
                }
            }
            self.log(format!(
                "readdirplus {inode} {handle} {size} {offset} took {taken}"
            ));
            Ok(())
        }
    }

    impl WireOps for RandFs {
        fn copy_file_range(
            &self,
            _: &Context,
            _: u64,
            _: u64,
            _: u64,
            _: u64,
            _: u64,
            _: u64,
            _: u64,
            _: u64,
        ) -> io::Result<usize> {
            Err(io::Error::from_raw_os_error(libc::ENOSYS))
        }

        fn syncfs(&self, _: &Context, _: u64) -> io::Result<()> {
            Ok(())
        }

        fn init_flags(&self) -> u64 {
            self.init_flags
        }
    }

    impl SessionOps for RandFs {}

    impl AsyncOps for RandFs {}

    const OPS: [u32; 12] = [
        FUSE_LOOKUP,
        FUSE_FORGET,
        FUSE_GETATTR,
        FUSE_OPEN,
        FUSE_STATFS,
        FUSE_RELEASE,
        FUSE_FLUSH,
        FUSE_OPENDIR,
        FUSE_RELEASEDIR,
        FUSE_ACCESS,
        FUSE_BATCH_FORGET,
        FUSE_READDIRPLUS,
    ];

    fn header_bytes(h: &InHeader) -> Vec<u8> {
        h.as_slice().to_vec()
    }

    /// One random request of a served kind: (header, whole request bytes, reply room).
    fn random_request(r: &mut Rng, unique: u64) -> (InHeader, Vec<u8>, usize) {
        let opcode = OPS[r.below(OPS.len() as u64) as usize];
        let mut body = match opcode {
            FUSE_LOOKUP => {
                let n = r.below(300) as usize;
                let mut name = r.bytes(n);
                match r.below(4) {
                    0 => {}
                    1 => name.push(0),
                    2 => {
                        name.push(0);
                        name.extend(r.bytes(5));
                    }
                    _ => {
                        for b in &mut name {
                            *b |= 1;
                        }
                        name.push(0);
                    }
                }
                name
            }
            FUSE_BATCH_FORGET => {
                let n = r.below(6);
                let count = if r.below(8) == 0 {
                    r.next() as u32
                } else {
                    n as u32
                };
                let mut b = count.to_ne_bytes().to_vec();
                b.extend([0u8; 4]);
                b.extend(r.bytes(16 * n as usize));
                b
            }
            FUSE_STATFS => Vec::new(),
            _ => r.bytes(48),
        };
        // Flags that mean something get set often.
        if opcode == FUSE_GETATTR && r.below(2) == 0 {
            body[0] |= 1;
        }
        if opcode == FUSE_RELEASE && body.len() >= 16 {
            body[12] = r.below(4) as u8;
        }
        if opcode == FUSE_READDIRPLUS && body.len() >= 20 {
            body[16..20].copy_from_slice(&((r.below(5000) as u32).to_ne_bytes()));
        }
        if r.below(10) == 0 {
            body.truncate(r.below(body.len() as u64 + 1) as usize);
        }
        let real = 40 + body.len();
        let len = match r.below(12) {
            0 => real.saturating_sub(r.below(20) as usize),
            1 => real + r.below(20) as usize,
            _ => real,
        };
        let h = InHeader {
            len: len as u32,
            opcode,
            unique,
            nodeid: r.below(5),
            uid: r.below(3) as u32,
            gid: r.below(3) as u32,
            pid: 7,
            padding: 0,
        };
        let mut bytes = header_bytes(&h);
        bytes.extend(body);
        let room = match r.below(8) {
            0 => r.below(200) as usize,
            _ => 8192,
        };
        (h, bytes, room)
    }

    /// `bytes` through fuse-backend-rs (`handle_message`) in a guest memory of its own, as the
    /// transport gives it: (result, the reply bytes written).
    fn via_reader(
        server: &FuseServer<RandFs>,
        h: InHeader,
        bytes: &[u8],
        room: usize,
    ) -> (Result<usize, ServerError>, Vec<u8>) {
        let mem_len = 0x10000 + bytes.len() + room;
        let gm = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), mem_len)]).unwrap();
        let mq = MockSplitQueue::create(&gm, GuestAddress(0), 16);
        let req = 0x8000u64;
        let reply = req + bytes.len() as u64;
        gm.write_slice(bytes, GuestAddress(req)).unwrap();
        let mut descs = vec![RawDescriptor::from(SplitDescriptor::new(
            req,
            bytes.len() as u32,
            VRING_DESC_F_NEXT as u16,
            1,
        ))];
        descs.push(RawDescriptor::from(SplitDescriptor::new(
            reply,
            room as u32,
            VRING_DESC_F_WRITE as u16,
            0,
        )));
        mq.add_desc_chains(&descs, 0).unwrap();
        let mut q: Queue = mq.create_queue().unwrap();
        let chain = q.iter(&gm).unwrap().next().unwrap();
        let reader = Reader::from_descriptor_chain(&gm, chain.clone()).unwrap();
        let writer = Writer::from(VirtioFsWriter::new(&gm, chain).unwrap());
        let result = server.handle_message(h, reader, writer, 1, std::time::Instant::now(), |n| {
            let mut head = [0u8; REPLY_HEAD_LEN];
            let k = n.min(head.len());
            gm.read_slice(&mut head[..k], GuestAddress(reply)).unwrap();
            (head, k)
        });
        let mut out = vec![0u8; room];
        gm.read_slice(&mut out, GuestAddress(reply)).unwrap();
        // What the transport does with a refusal: the errno on a fresh writer.
        let result = match result.written {
            Err(e) => match refused_errno(&e) {
                Some(errno)
                    if !matches!(h.opcode, FUSE_FORGET | FUSE_BATCH_FORGET) && room >= 16 =>
                {
                    let hdr = error_header(h.unique, errno);
                    out[..16].copy_from_slice(hdr.as_slice());
                    Ok(16)
                }
                _ => Err(e),
            },
            ok => ok,
        };
        (result, out)
    }

    fn init(server: &FuseServer<RandFs>, minor: u32) {
        let init = InitIn {
            major: 7,
            minor,
            max_readahead: 0,
            flags: 0,
        };
        let h = InHeader {
            len: 56,
            opcode: FUSE_INIT,
            unique: 1,
            ..Default::default()
        };
        let mut bytes = header_bytes(&h);
        bytes.extend_from_slice(init.as_slice());
        let _ = via_reader(server, h, &bytes, 256);
    }

    #[test]
    fn copied_requests_are_answered_as_fuse_backend_rs_answers_them() {
        let seeds = std::env::var("COPIED_SEEDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(40u64);
        for seed in 0..seeds {
            let mut r = Rng(seed);
            let (fa, fb) = (Arc::new(RandFs::default()), Arc::new(RandFs::default()));
            let (copied, reference) = (FuseServer::new(fa.clone()), FuseServer::new(fb.clone()));
            for unique in 0..500u64 {
                if r.below(100) == 0 {
                    let minor = r.below(40) as u32;
                    init(&copied, minor);
                    init(&reference, minor);
                    fa.take();
                    fb.take();
                }
                let (h, bytes, room) = random_request(&mut r, unique);
                let mut out = vec![0u8; room];
                let got = copied
                    .serve_copied(h, &bytes, &mut out, 1, std::time::Instant::now())
                    .written;
                let (want, want_out) = via_reader(&reference, h, &bytes, room);
                let replay = format!(
                    "seed {seed} request {unique}: {h:?} body {:?} room {room}",
                    &bytes[40..]
                );
                match (&got, &want) {
                    (Ok(n), Ok(m)) => {
                        assert_eq!(n, m, "{replay}: reply lengths differ");
                        assert_eq!(out[..*n], want_out[..*m], "{replay}: reply bytes differ");
                        if *n >= 16 {
                            let oh = OutHeader::from_slice(&out[..16]).unwrap();
                            assert_eq!(oh.unique, h.unique, "{replay}");
                        }
                    }
                    (Err(_), Err(e)) => {
                        assert_eq!(
                            refused_errno(&got.unwrap_err()),
                            refused_errno(e),
                            "{replay}"
                        );
                    }
                    _ => panic!("{replay}: copied {got:?}, fuse-backend-rs {want:?}"),
                }
                assert_eq!(
                    fa.take(),
                    fb.take(),
                    "{replay}: the filesystem was called differently"
                );
            }
        }
    }

    /// The reply to an INIT of `minor` offering `flags` (`flags2` in the high half).
    fn init_reply(server: &FuseServer<RandFs>, minor: u32, flags: u64) -> Vec<u8> {
        let init = InitIn {
            major: 7,
            minor,
            max_readahead: 0,
            flags: flags as u32,
        };
        let mut body = init.as_slice().to_vec();
        body.extend_from_slice(&((flags >> 32) as u32).to_ne_bytes());
        body.extend_from_slice(&[0u8; 44]);
        let h = InHeader {
            len: (40 + body.len()) as u32,
            opcode: FUSE_INIT,
            unique: 9,
            ..Default::default()
        };
        let mut bytes = header_bytes(&h);
        bytes.extend_from_slice(&body);
        let (result, out) = via_reader(server, h, &bytes, 256);
        let n = result.unwrap();
        out[..n].to_vec()
    }

    #[test]
    fn init_flags_fuse_backend_rs_cannot_name_reach_the_reply() {
        const INIT_EXT: u64 = 1 << 30;
        let u32_at = |b: &[u8], at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
        let (flags_at, flags2_at) = (16 + 12, 16 + 32);
        let fs = Arc::new(RandFs {
            init_flags: INIT_EXT | FUSE_DIRECT_IO_ALLOW_MMAP,
            ..RandFs::default()
        });
        let server = FuseServer::new(fs);
        // Offered: answered in flags2, with INIT_EXT in flags for the kernel to read it.
        let offered = INIT_EXT | FUSE_DIRECT_IO_ALLOW_MMAP | 1;
        let r = init_reply(&server, 40, offered);
        assert_eq!(r.len(), 16 + 64);
        assert_eq!(u64::from(u32_at(&r, flags_at)), INIT_EXT);
        assert_eq!(
            u64::from(u32_at(&r, flags2_at)) << 32,
            FUSE_DIRECT_IO_ALLOW_MMAP
        );
        // The rest is fuse-backend-rs's: the same bytes as for a filesystem wanting nothing
        // beyond its names, but for the two flag words.
        let plain = FuseServer::new(Arc::new(RandFs::default()));
        let mut want = init_reply(&plain, 40, offered);
        want[flags_at..flags_at + 4].copy_from_slice(&(INIT_EXT as u32).to_ne_bytes());
        want[flags2_at..flags2_at + 4]
            .copy_from_slice(&((FUSE_DIRECT_IO_ALLOW_MMAP >> 32) as u32).to_ne_bytes());
        assert_eq!(r, want);
        // Not offered (a 6.1 guest): nothing added.
        let r = init_reply(&server, 40, INIT_EXT);
        assert_eq!(u32_at(&r, flags2_at), 0);
        assert_eq!(r, init_reply(&plain, 40, INIT_EXT));
        // Without INIT_EXT the kernel has no flags2 to offer (the bit above is not read).
        let r = init_reply(&server, 40, FUSE_DIRECT_IO_ALLOW_MMAP);
        assert_eq!(r, init_reply(&plain, 40, FUSE_DIRECT_IO_ALLOW_MMAP));
        // An old minor's short reply is left as it is.
        let r = init_reply(&server, 22, offered);
        assert_eq!(r, init_reply(&plain, 22, offered));
    }
}
