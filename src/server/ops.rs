//! What the server asks of a filesystem beyond fuse-backend-rs's [`FileSystem`], one trait per
//! concern, each named by the code that calls it:
//! - [`WireOps`]: the opcodes fuse-backend-rs 0.14 does not dispatch and the pre-dispatch serves
//!   (COPY_FILE_RANGE, SYNCFS, TMPFILE, STATX);
//! - [`SessionOps`]: the storage session behind the filesystem, lost and recovered (the server
//!   reports a lost one, the daemon waits for it and replaces it);
//! - [`AsyncOps`]: READ and WRITE served without a thread waiting on the storage (the server's
//!   and the transport's nonblocking paths; empty unless built with `libcephfs_nonblocking`).
//!
//! [`Servable`] bundles them with `FileSystem` for the generic code above: the filesystem
//! implements the traits, the server and the transport only call them.
//!
//! Errors must be `io::Error::from_raw_os_error(errno)`: the errno goes to the guest unchanged.

use std::io;

use fuse_backend_rs::api::filesystem::{Context, FileSystem};

/// A filesystem the server can serve: node ids and handles are `u64`, every trait of this
/// module is implemented, and it is shared between the queue threads and the workers.
pub trait Servable:
    FileSystem<Inode = u64, Handle = u64> + WireOps + SessionOps + AsyncOps + Send + Sync
{
}

impl<F> Servable for F where
    F: FileSystem<Inode = u64, Handle = u64> + WireOps + SessionOps + AsyncOps + Send + Sync
{
}

/// The opcodes fuse-backend-rs 0.14 answers with ENOSYS; the pre-dispatch calls these.
pub trait WireOps {
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

    /// FUSE_TMPFILE (Linux 6.1+, protocol 7.37; `open(dir, O_TMPFILE)`): CREATE's answer,
    /// the entry and open handle of a new regular file in directory `parent` that has no
    /// name. ENOSYS (the guest then answers EOPNOTSUPP and asks no more) unless served.
    fn tmpfile(
        &self,
        _ctx: &Context,
        _parent: u64,
        _args: fuse_backend_rs::abi::fuse_abi::CreateIn,
    ) -> io::Result<(
        fuse_backend_rs::api::filesystem::Entry,
        u64,
        fuse_backend_rs::abi::fuse_abi::OpenOptions,
    )> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }

    /// The INIT flags (`flags | flags2 << 32`) the filesystem wants: those its `FileSystem::init`
    /// answers, plus those fuse-backend-rs 0.14 cannot negotiate (unknown to its `FsOptions`:
    /// SETXATTR_EXT, DIRECT_IO_ALLOW_MMAP), which the server adds to the INIT reply when the
    /// guest offered them. Asked after each INIT. 0: none.
    fn init_flags(&self) -> u64 {
        0
    }

    /// FUSE_SETXATTR_ACL_KILL_SGID: after a POSIX access ACL was set on `ino`, clear its
    /// setgid bit (the guest kernel found the caller neither in the file's group nor holding
    /// CAP_FSETID).
    fn acl_kill_sgid(&self, _ctx: &Context, _ino: u64) -> io::Result<()> {
        Ok(())
    }

    /// FUSE_STATX (Linux 6.6+ sends it when a statx(2) asks for the birth time): GETATTR's
    /// attributes and TTL, and the birth time. ENOSYS (the guest then asks GETATTR) unless
    /// the filesystem keeps birth times.
    fn statx(
        &self,
        _ctx: &Context,
        _ino: u64,
    ) -> io::Result<(libc::stat64, crate::wire::Btime, std::time::Duration)> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }
}

/// The storage session behind the filesystem. The defaults are those of a filesystem that
/// cannot lose its session, or cannot recover one.
pub trait SessionOps {
    /// A reply carried ESHUTDOWN: the storage session behind the filesystem is gone (CephFS:
    /// this client was evicted and blocklisted).
    fn session_lost(&self) {}

    /// Block until the session is lost; false at once for a filesystem that cannot recover
    /// (the caller stops waiting).
    fn wait_for_lost_session(&self) -> bool {
        false
    }

    /// Replace the lost session; no request may be running. A line on what was brought back.
    fn recover_session(&self) -> io::Result<String> {
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }
}

/// READ and WRITE started without waiting for the storage. Without `libcephfs_nonblocking`
/// the trait is empty and every READ and WRITE takes the blocking `FileSystem` path.
pub trait AsyncOps {
    /// Whether a READ or WRITE (`opcode`) on handle `fh` of `node` is for
    /// [`Self::async_read`] / [`Self::async_write`]: only a cheap look at the handle, with no
    /// side effect; a request it turns down takes the blocking path whole.
    #[cfg(libcephfs_nonblocking)]
    fn async_takes(&self, _opcode: u32, _node: u64, _fh: u64) -> bool {
        false
    }

    /// Start a READ of `size` bytes at `offset` on handle `fh` of `node` without waiting for
    /// the storage; at most `room` bytes fit in the reply. `tag` names the operation (the
    /// caller's number, unique among those in flight: not the guest's `unique`). Every check and
    /// side effect of the blocking `FileSystem::read` happens here, in its order, before the
    /// read is sent. `Err`: the errno to answer now, and nothing arrives on
    /// [`Self::async_next`].
    #[cfg(libcephfs_nonblocking)]
    #[allow(clippy::too_many_arguments)]
    fn async_read(
        &self,
        _ctx: &Context,
        _node: u64,
        _fh: u64,
        _size: u32,
        _offset: u64,
        _room: usize,
        _tag: u64,
    ) -> io::Result<AsyncStart> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }

    /// [`Self::async_read`] for a WRITE: the data is taken from `data` where the blocking
    /// `FileSystem::write` takes it (after the handle lookup and the privilege kill).
    #[cfg(libcephfs_nonblocking)]
    #[allow(clippy::too_many_arguments)]
    fn async_write(
        &self,
        _ctx: &Context,
        _node: u64,
        _fh: u64,
        _data: &mut dyn fuse_backend_rs::api::filesystem::ZeroCopyReader,
        _size: u32,
        _offset: u64,
        _fuse_flags: u32,
        _tag: u64,
    ) -> io::Result<AsyncStart> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }

    /// The next finished operation started by [`Self::async_read`] or [`Self::async_write`]
    /// (its `tag`, and what to answer), waiting at most `timeout`. Called on a thread that
    /// may wait: whatever the filesystem still does after the storage answered runs here.
    #[cfg(libcephfs_nonblocking)]
    fn async_next(&self, _timeout: std::time::Duration) -> Option<(u64, io::Result<AsyncReply>)> {
        None
    }
}

/// What [`AsyncOps::async_read`] / [`AsyncOps::async_write`] did with a request.
#[cfg(libcephfs_nonblocking)]
#[derive(Debug)]
pub enum AsyncStart {
    /// Sent: its answer comes from [`AsyncOps::async_next`] under its `tag`.
    Sent,
    /// Done at once (nothing to read, or a write that had to go the blocking way): answer this.
    Done(AsyncReply),
}

/// The answer to a READ or WRITE served by [`AsyncOps::async_read`] / [`AsyncOps::async_write`].
#[cfg(libcephfs_nonblocking)]
#[derive(Debug)]
pub enum AsyncReply {
    /// The bytes read (short at the end of the file).
    Read(Vec<u8>),
    /// The bytes written.
    Written(usize),
}
