//! The FUSE wire format the server, the filesystem, the transport and the metrics share (Linux
//! `include/uapi/linux/fuse.h`): opcode numbers and names, errno names, the out-header, and
//! what a reply's first bytes say ([`ReplyHead`]). A leaf: it knows nothing of the rest of the
//! daemon, and holds no operation of any layer (those are the server's traits,
//! `server::WireOps`, `server::SessionOps` and `server::AsyncOps`).

pub use opcode::*;

/// Opcode numbers (Linux `include/uapi/linux/fuse.h`, `enum fuse_opcode`): the one table the
/// daemon, its tests and the bench (`ceph-virtiofsd-bench`, which writes requests by hand) share.
/// The unit tests hold them to fuse-backend-rs's `Opcode` (whose discriminants only `as` could
/// reach in a const) and to [`opcode_name`].
pub mod opcode {
    pub const FUSE_LOOKUP: u32 = 1;
    pub const FUSE_FORGET: u32 = 2;
    pub const FUSE_GETATTR: u32 = 3;
    pub const FUSE_SETATTR: u32 = 4;
    pub const FUSE_READLINK: u32 = 5;
    pub const FUSE_SYMLINK: u32 = 6;
    pub const FUSE_MKNOD: u32 = 8;
    pub const FUSE_MKDIR: u32 = 9;
    pub const FUSE_UNLINK: u32 = 10;
    pub const FUSE_RMDIR: u32 = 11;
    pub const FUSE_RENAME: u32 = 12;
    pub const FUSE_LINK: u32 = 13;
    pub const FUSE_OPEN: u32 = 14;
    pub const FUSE_READ: u32 = 15;
    pub const FUSE_WRITE: u32 = 16;
    pub const FUSE_STATFS: u32 = 17;
    pub const FUSE_RELEASE: u32 = 18;
    pub const FUSE_FSYNC: u32 = 20;
    pub const FUSE_SETXATTR: u32 = 21;
    pub const FUSE_GETXATTR: u32 = 22;
    pub const FUSE_LISTXATTR: u32 = 23;
    pub const FUSE_REMOVEXATTR: u32 = 24;
    pub const FUSE_FLUSH: u32 = 25;
    pub const FUSE_INIT: u32 = 26;
    pub const FUSE_OPENDIR: u32 = 27;
    pub const FUSE_READDIR: u32 = 28;
    pub const FUSE_RELEASEDIR: u32 = 29;
    pub const FUSE_FSYNCDIR: u32 = 30;
    pub const FUSE_GETLK: u32 = 31;
    pub const FUSE_SETLK: u32 = 32;
    /// FUSE_SETLKW: fuse-backend-rs 0.14 dispatches it to `FileSystem::setlk`, so a blocking
    /// lock request would fail with EAGAIN instead of waiting; we dispatch it to `setlkw`
    /// ourselves.
    pub const FUSE_SETLKW: u32 = 33;
    pub const FUSE_ACCESS: u32 = 34;
    pub const FUSE_CREATE: u32 = 35;
    pub const FUSE_INTERRUPT: u32 = 36;
    pub const FUSE_BMAP: u32 = 37;
    pub const FUSE_DESTROY: u32 = 38;
    pub const FUSE_IOCTL: u32 = 39;
    pub const FUSE_POLL: u32 = 40;
    pub const FUSE_NOTIFY_REPLY: u32 = 41;
    pub const FUSE_BATCH_FORGET: u32 = 42;
    pub const FUSE_FALLOCATE: u32 = 43;
    pub const FUSE_READDIRPLUS: u32 = 44;
    pub const FUSE_RENAME2: u32 = 45;
    pub const FUSE_LSEEK: u32 = 46;
    pub const FUSE_COPY_FILE_RANGE: u32 = 47;
    pub const FUSE_SETUPMAPPING: u32 = 48;
    pub const FUSE_REMOVEMAPPING: u32 = 49;
    /// Protocol 7.34; fuse-backend-rs 0.14 has no `Opcode` for it (nor for the ones below).
    pub const FUSE_SYNCFS: u32 = 50;
    pub const FUSE_TMPFILE: u32 = 51;
    pub const FUSE_STATX: u32 = 52;
}

/// FUSE_INIT flags fuse-backend-rs 0.14's `FsOptions` has no name for (as `flags | flags2 << 32`,
/// Linux `include/uapi/linux/fuse.h`): shared mmap of FOPEN_DIRECT_IO files (7.39).
pub const FUSE_DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
/// `FUSE_INIT_EXT` (protocol 7.36): `fuse_init_in` carries `flags2`, the upper 32 flags.
pub const FUSE_INIT_EXT: u64 = 1 << 30;
/// `FUSE_SETXATTR_EXT` (protocol 7.33): SETXATTR carries the longer `fuse_setxattr_in`.
pub const FUSE_SETXATTR_EXT: u64 = 1 << 29;
/// `fuse_setxattr_in.setxattr_flags`: clear the setgid bit along with a POSIX access ACL.
pub const FUSE_SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;

/// Size of `struct fuse_out_header`.
pub const OUT_HEADER_LEN: usize = 16;
/// Out-header plus `struct fuse_write_out` or `fuse_entry_out.nodeid`: what
/// [`ReplyHead::parse`] needs to see.
pub const REPLY_HEAD_LEN: usize = OUT_HEADER_LEN + 8;

/// The out-header of a reply carrying only `errno` to request `unique`.
pub fn error_header(unique: u64, errno: i32) -> fuse_backend_rs::abi::fuse_abi::OutHeader {
    fuse_backend_rs::abi::fuse_abi::OutHeader {
        // 16: a constant that fits.
        len: u32::try_from(OUT_HEADER_LEN).unwrap_or(u32::MAX),
        error: errno.saturating_neg(),
        unique,
    }
}

/// Size of `struct fuse_statx_in` (getattr_flags, reserved, fh, sx_flags, sx_mask).
pub const STATX_IN_LEN: usize = 24;

/// What FUSE_STATX answers besides the stat: the birth time (seconds, nanoseconds) when the
/// filesystem keeps one.
pub type Btime = Option<(i64, u32)>;

/// What the reply written to the guest says, read back after the server answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplyHead {
    /// Positive errno, 0 on success.
    pub errno: i32,
    /// `fuse_write_out.size` when the reply carries one (successful WRITE).
    pub write_size: Option<u32>,
    /// Bytes of payload after the out-header (e.g. the data of a READ).
    pub payload: usize,
    /// A successful LOOKUP answered with node id 0: "no such name, cache that".
    pub negative_entry: bool,
}

impl ReplyHead {
    /// Parse the first bytes of a reply of `total` bytes (`head` holds up to
    /// [`REPLY_HEAD_LEN`] of them) to a request with `opcode`. `None` if there is no out-header.
    pub fn parse(opcode: u32, head: &[u8], total: usize) -> Option<ReplyHead> {
        let error = i32::from_ne_bytes(head.get(4..8)?.try_into().ok()?);
        let errno = error.checked_neg().filter(|e| *e >= 0).unwrap_or(0);
        let write_size = if opcode == FUSE_WRITE && errno == 0 {
            head.get(16..20)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_ne_bytes)
        } else {
            None
        };
        let negative_entry = opcode == FUSE_LOOKUP
            && errno == 0
            && head
                .get(16..24)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_ne_bytes)
                == Some(0);
        Some(ReplyHead {
            errno,
            write_size,
            payload: total.saturating_sub(OUT_HEADER_LEN),
            negative_entry,
        })
    }
}

/// Name of a FUSE opcode (Linux `enum fuse_opcode`), "UNKNOWN" for anything else.
pub fn opcode_name(opcode: usize) -> &'static str {
    const NAMES: [&str; 53] = [
        "UNKNOWN",
        "LOOKUP",
        "FORGET",
        "GETATTR",
        "SETATTR",
        "READLINK",
        "SYMLINK",
        "UNKNOWN",
        "MKNOD",
        "MKDIR",
        "UNLINK",
        "RMDIR",
        "RENAME",
        "LINK",
        "OPEN",
        "READ",
        "WRITE",
        "STATFS",
        "RELEASE",
        "UNKNOWN",
        "FSYNC",
        "SETXATTR",
        "GETXATTR",
        "LISTXATTR",
        "REMOVEXATTR",
        "FLUSH",
        "INIT",
        "OPENDIR",
        "READDIR",
        "RELEASEDIR",
        "FSYNCDIR",
        "GETLK",
        "SETLK",
        "SETLKW",
        "ACCESS",
        "CREATE",
        "INTERRUPT",
        "BMAP",
        "DESTROY",
        "IOCTL",
        "POLL",
        "NOTIFY_REPLY",
        "BATCH_FORGET",
        "FALLOCATE",
        "READDIRPLUS",
        "RENAME2",
        "LSEEK",
        "COPY_FILE_RANGE",
        "SETUPMAPPING",
        "REMOVEMAPPING",
        "SYNCFS",
        "TMPFILE",
        "STATX",
    ];
    NAMES.get(opcode).copied().unwrap_or("UNKNOWN")
}

/// Symbolic name of an errno ("ENOENT"), or "E<n>" for the rarer ones, "other" for slot 0.
pub fn errno_name(errno: usize) -> String {
    const NAMES: [(i32, &str); 44] = [
        (libc::EPERM, "EPERM"),
        (libc::ENOENT, "ENOENT"),
        (libc::ESRCH, "ESRCH"),
        (libc::EINTR, "EINTR"),
        (libc::EIO, "EIO"),
        (libc::ENXIO, "ENXIO"),
        (libc::E2BIG, "E2BIG"),
        (libc::EBADF, "EBADF"),
        (libc::EAGAIN, "EAGAIN"),
        (libc::ENOMEM, "ENOMEM"),
        (libc::EACCES, "EACCES"),
        (libc::EFAULT, "EFAULT"),
        (libc::EBUSY, "EBUSY"),
        (libc::EEXIST, "EEXIST"),
        (libc::EXDEV, "EXDEV"),
        (libc::ENODEV, "ENODEV"),
        (libc::ENOTDIR, "ENOTDIR"),
        (libc::EISDIR, "EISDIR"),
        (libc::EINVAL, "EINVAL"),
        (libc::ENFILE, "ENFILE"),
        (libc::EMFILE, "EMFILE"),
        (libc::ENOTTY, "ENOTTY"),
        (libc::ETXTBSY, "ETXTBSY"),
        (libc::EFBIG, "EFBIG"),
        (libc::ENOSPC, "ENOSPC"),
        (libc::ESPIPE, "ESPIPE"),
        (libc::EROFS, "EROFS"),
        (libc::EMLINK, "EMLINK"),
        (libc::EPIPE, "EPIPE"),
        (libc::ERANGE, "ERANGE"),
        (libc::EDEADLK, "EDEADLK"),
        (libc::ENAMETOOLONG, "ENAMETOOLONG"),
        (libc::ENOLCK, "ENOLCK"),
        (libc::ENOSYS, "ENOSYS"),
        (libc::ENOTEMPTY, "ENOTEMPTY"),
        (libc::ELOOP, "ELOOP"),
        (libc::ENODATA, "ENODATA"),
        (libc::EOVERFLOW, "EOVERFLOW"),
        (libc::EOPNOTSUPP, "EOPNOTSUPP"),
        (libc::ESHUTDOWN, "ESHUTDOWN"),
        (libc::ETIMEDOUT, "ETIMEDOUT"),
        (libc::ESTALE, "ESTALE"),
        (libc::EDQUOT, "EDQUOT"),
        (libc::ECANCELED, "ECANCELED"),
    ];
    if errno == 0 {
        return "other".to_owned();
    }
    let found = i32::try_from(errno)
        .ok()
        .and_then(|e| NAMES.iter().find(|(n, _)| *n == e));
    match found {
        Some((_, name)) => (*name).to_owned(),
        None => format!("E{errno}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(errno: i32, total: usize, extra: &[u8]) -> Vec<u8> {
        let mut head = Vec::new();
        head.extend_from_slice(&u32::try_from(total).unwrap_or(0).to_ne_bytes());
        head.extend_from_slice(&errno.saturating_neg().to_ne_bytes());
        head.extend_from_slice(&7u64.to_ne_bytes());
        head.extend_from_slice(extra);
        head
    }

    /// Every opcode constant: its name without `FUSE_`, and fuse-backend-rs's `Opcode` when it
    /// has one.
    fn all_opcodes() -> Vec<(u32, &'static str, Option<u32>)> {
        use fuse_backend_rs::abi::fuse_abi::Opcode;
        vec![
            (FUSE_LOOKUP, "LOOKUP", Some(Opcode::Lookup as u32)),
            (FUSE_FORGET, "FORGET", Some(Opcode::Forget as u32)),
            (FUSE_GETATTR, "GETATTR", Some(Opcode::Getattr as u32)),
            (FUSE_SETATTR, "SETATTR", Some(Opcode::Setattr as u32)),
            (FUSE_READLINK, "READLINK", Some(Opcode::Readlink as u32)),
            (FUSE_SYMLINK, "SYMLINK", Some(Opcode::Symlink as u32)),
            (FUSE_MKNOD, "MKNOD", Some(Opcode::Mknod as u32)),
            (FUSE_MKDIR, "MKDIR", Some(Opcode::Mkdir as u32)),
            (FUSE_UNLINK, "UNLINK", Some(Opcode::Unlink as u32)),
            (FUSE_RMDIR, "RMDIR", Some(Opcode::Rmdir as u32)),
            (FUSE_RENAME, "RENAME", Some(Opcode::Rename as u32)),
            (FUSE_LINK, "LINK", Some(Opcode::Link as u32)),
            (FUSE_OPEN, "OPEN", Some(Opcode::Open as u32)),
            (FUSE_READ, "READ", Some(Opcode::Read as u32)),
            (FUSE_WRITE, "WRITE", Some(Opcode::Write as u32)),
            (FUSE_STATFS, "STATFS", Some(Opcode::Statfs as u32)),
            (FUSE_RELEASE, "RELEASE", Some(Opcode::Release as u32)),
            (FUSE_FSYNC, "FSYNC", Some(Opcode::Fsync as u32)),
            (FUSE_SETXATTR, "SETXATTR", Some(Opcode::Setxattr as u32)),
            (FUSE_GETXATTR, "GETXATTR", Some(Opcode::Getxattr as u32)),
            (FUSE_LISTXATTR, "LISTXATTR", Some(Opcode::Listxattr as u32)),
            (
                FUSE_REMOVEXATTR,
                "REMOVEXATTR",
                Some(Opcode::Removexattr as u32),
            ),
            (FUSE_FLUSH, "FLUSH", Some(Opcode::Flush as u32)),
            (FUSE_INIT, "INIT", Some(Opcode::Init as u32)),
            (FUSE_OPENDIR, "OPENDIR", Some(Opcode::Opendir as u32)),
            (FUSE_READDIR, "READDIR", Some(Opcode::Readdir as u32)),
            (
                FUSE_RELEASEDIR,
                "RELEASEDIR",
                Some(Opcode::Releasedir as u32),
            ),
            (FUSE_FSYNCDIR, "FSYNCDIR", Some(Opcode::Fsyncdir as u32)),
            (FUSE_GETLK, "GETLK", Some(Opcode::Getlk as u32)),
            (FUSE_SETLK, "SETLK", Some(Opcode::Setlk as u32)),
            (FUSE_SETLKW, "SETLKW", Some(Opcode::Setlkw as u32)),
            (FUSE_ACCESS, "ACCESS", Some(Opcode::Access as u32)),
            (FUSE_CREATE, "CREATE", Some(Opcode::Create as u32)),
            (FUSE_INTERRUPT, "INTERRUPT", Some(Opcode::Interrupt as u32)),
            (FUSE_BMAP, "BMAP", Some(Opcode::Bmap as u32)),
            (FUSE_DESTROY, "DESTROY", Some(Opcode::Destroy as u32)),
            (FUSE_IOCTL, "IOCTL", Some(Opcode::Ioctl as u32)),
            (FUSE_POLL, "POLL", Some(Opcode::Poll as u32)),
            (
                FUSE_NOTIFY_REPLY,
                "NOTIFY_REPLY",
                Some(Opcode::NotifyReply as u32),
            ),
            (
                FUSE_BATCH_FORGET,
                "BATCH_FORGET",
                Some(Opcode::BatchForget as u32),
            ),
            (FUSE_FALLOCATE, "FALLOCATE", Some(Opcode::Fallocate as u32)),
            (
                FUSE_READDIRPLUS,
                "READDIRPLUS",
                Some(Opcode::Readdirplus as u32),
            ),
            (FUSE_RENAME2, "RENAME2", Some(Opcode::Rename2 as u32)),
            (FUSE_LSEEK, "LSEEK", Some(Opcode::Lseek as u32)),
            (
                FUSE_COPY_FILE_RANGE,
                "COPY_FILE_RANGE",
                Some(Opcode::CopyFileRange as u32),
            ),
            (
                FUSE_SETUPMAPPING,
                "SETUPMAPPING",
                Some(Opcode::SetupMapping as u32),
            ),
            (
                FUSE_REMOVEMAPPING,
                "REMOVEMAPPING",
                Some(Opcode::RemoveMapping as u32),
            ),
            (FUSE_SYNCFS, "SYNCFS", None),
            (FUSE_TMPFILE, "TMPFILE", None),
            (FUSE_STATX, "STATX", None),
        ]
    }

    #[test]
    fn opcode_numbers_are_fuse_backend_rs_opcodes() {
        for (wire, name, library) in all_opcodes() {
            if let Some(library) = library {
                assert_eq!(wire, library, "FUSE_{name}");
            }
        }
    }

    #[test]
    fn every_opcode_has_its_name() {
        let all = all_opcodes();
        for (wire, name, _) in &all {
            assert_eq!(opcode_name(*wire as usize), *name, "opcode {wire}");
        }
        // And every named opcode has its constant: 1..=52 but the two unused numbers.
        let numbers: Vec<u32> = all.iter().map(|(n, _, _)| *n).collect();
        let named: Vec<u32> = (0..=60u32)
            .filter(|n| opcode_name(*n as usize) != "UNKNOWN")
            .collect();
        assert_eq!(numbers, named);
    }

    #[test]
    fn reply_head_parsing() {
        let ok_write = reply(0, 24, &[0x00, 0x10, 0, 0, 0, 0, 0, 0]);
        let h = ReplyHead::parse(FUSE_WRITE, &ok_write, 24).unwrap_or_default();
        assert_eq!(h.errno, 0);
        assert_eq!(h.write_size, Some(4096));

        let enoent = reply(libc::ENOENT, 16, &[]);
        let h = ReplyHead::parse(1, &enoent, 16).unwrap_or_default();
        assert_eq!(h.errno, libc::ENOENT);
        assert_eq!(h.write_size, None);

        let read = reply(0, 16 + 100, &[]);
        let h = ReplyHead::parse(FUSE_READ, &read, 116).unwrap_or_default();
        assert_eq!(h.payload, 100);

        let mut negative = reply(0, 144, &0u64.to_ne_bytes());
        assert!(ReplyHead::parse(FUSE_LOOKUP, &negative, 144).is_some_and(|h| h.negative_entry));
        negative.truncate(20);
        assert!(!ReplyHead::parse(FUSE_LOOKUP, &negative, 144).is_some_and(|h| h.negative_entry));
        let positive = reply(0, 144, &5u64.to_ne_bytes());
        assert!(!ReplyHead::parse(FUSE_LOOKUP, &positive, 144).is_some_and(|h| h.negative_entry));

        // Too short for an out-header: nothing to say.
        assert_eq!(ReplyHead::parse(1, &[0u8; 6], 6), None);
        // A positive "error" (never valid) is not an errno.
        let odd = reply(-5, 16, &[]);
        assert_eq!(ReplyHead::parse(1, &odd, 16).map(|h| h.errno), Some(0));
    }

    #[test]
    fn names() {
        assert_eq!(opcode_name(35), "CREATE");
        assert_eq!(opcode_name(16), "WRITE");
        assert_eq!(opcode_name(52), "STATX");
        assert_eq!(opcode_name(7), "UNKNOWN");
        assert_eq!(opcode_name(4096), "UNKNOWN");
        assert_eq!(errno_name(2), "ENOENT");
        assert_eq!(errno_name(95), "EOPNOTSUPP");
        assert_eq!(errno_name(133), "E133");
        assert_eq!(errno_name(0), "other");
    }
}
