//! `struct ceph_statx` and the flag constants of the ll API.

/// A timestamp as libcephfs stores it in `struct ceph_statx` (`struct timespec` on
/// x86_64/aarch64 Linux: two 64-bit fields).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Timespec {
    /// Seconds since the epoch.
    pub tv_sec: libc::time_t,
    /// Nanoseconds, 0..1_000_000_000.
    pub tv_nsec: libc::c_long,
}

impl Timespec {
    /// The wall clock as a CephFS timestamp.
    pub fn now() -> Timespec {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timespec {
            tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(d.subsec_nanos()),
        }
    }
}

/// Mirror of `struct ceph_statx` (ceph_ll_client.h): 136 bytes on 64-bit Linux, `stx_mode` is
/// a `u16` at offset 20. Checked against the C header by `tests/layout.rs`.
///
/// Only the fields whose `CEPH_STATX_*` bit is set in `stx_mask` are valid.
///
/// `stx_dev` does NOT hold a device number: libcephfs (`Client::fill_statx`) stores the
/// inode's **snapid** there: `CEPH_NOSNAP` for a live inode, the snapshot id for an inode
/// seen through `.snap/<name>`, and `CEPH_SNAPDIR` for the `.snap` directory itself. Together
/// with `stx_ino` it is the inode's vino (see `tests/integration.rs`, `snapshot_stx_dev`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Statx {
    pub stx_mask: u32,
    pub stx_blksize: u32,
    pub stx_nlink: u32,
    pub stx_uid: u32,
    pub stx_gid: u32,
    pub stx_mode: u16,
    pub stx_ino: u64,
    pub stx_size: u64,
    pub stx_blocks: u64,
    pub stx_dev: libc::dev_t,
    pub stx_rdev: libc::dev_t,
    pub stx_atime: Timespec,
    pub stx_ctime: Timespec,
    pub stx_mtime: Timespec,
    pub stx_btime: Timespec,
    pub stx_version: u64,
}

impl Statx {
    /// The snapid of the inode these attributes belong to (`stx_dev`, see the type docs).
    pub fn snapid(&self) -> u64 {
        self.stx_dev
    }
}

// --- statx want/got mask (ceph_ll_client.h) ---
pub const CEPH_STATX_MODE: u32 = 0x0000_0001;
pub const CEPH_STATX_NLINK: u32 = 0x0000_0002;
pub const CEPH_STATX_UID: u32 = 0x0000_0004;
pub const CEPH_STATX_GID: u32 = 0x0000_0008;
pub const CEPH_STATX_RDEV: u32 = 0x0000_0010;
pub const CEPH_STATX_ATIME: u32 = 0x0000_0020;
pub const CEPH_STATX_MTIME: u32 = 0x0000_0040;
pub const CEPH_STATX_CTIME: u32 = 0x0000_0080;
pub const CEPH_STATX_INO: u32 = 0x0000_0100;
pub const CEPH_STATX_SIZE: u32 = 0x0000_0200;
pub const CEPH_STATX_BLOCKS: u32 = 0x0000_0400;
/// Everything in a classic `struct stat`.
pub const CEPH_STATX_BASIC_STATS: u32 = 0x0000_07ff;
pub const CEPH_STATX_BTIME: u32 = 0x0000_0800;
pub const CEPH_STATX_VERSION: u32 = 0x0000_1000;
pub const CEPH_STATX_ALL_STATS: u32 = 0x0000_1fff;

// --- flags for the `flags` argument of ll calls taking a statx ---
/// Do not fetch attributes from the MDS; use what the client has cached (may be stale).
pub const AT_STATX_DONT_SYNC: u32 = 0x4000;
/// Deprecated alias of `AT_STATX_DONT_SYNC` kept by the header.
pub const AT_NO_ATTR_SYNC: u32 = AT_STATX_DONT_SYNC;
/// Fetch attributes from the MDS even if cached.
pub const AT_STATX_FORCE_SYNC: u32 = 0x2000;
/// Do not follow a trailing symlink (`ceph_ll_walk`).
pub const AT_SYMLINK_NOFOLLOW: u32 = 0x100;
/// `CEPH_REQ_FLAG_MASK`: the only flags the statx-style calls accept.
pub const CEPH_REQ_FLAG_MASK: u32 = AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC;

// --- setattr mask bits (libcephfs.h) ---
pub const CEPH_SETATTR_MODE: u32 = 1 << 0;
pub const CEPH_SETATTR_UID: u32 = 1 << 1;
pub const CEPH_SETATTR_GID: u32 = 1 << 2;
pub const CEPH_SETATTR_MTIME: u32 = 1 << 3;
pub const CEPH_SETATTR_ATIME: u32 = 1 << 4;
pub const CEPH_SETATTR_SIZE: u32 = 1 << 5;
pub const CEPH_SETATTR_CTIME: u32 = 1 << 6;
pub const CEPH_SETATTR_MTIME_NOW: u32 = 1 << 7;
pub const CEPH_SETATTR_ATIME_NOW: u32 = 1 << 8;
pub const CEPH_SETATTR_BTIME: u32 = 1 << 9;
/// Clear setuid and setgid (Pacific understands this one).
pub const CEPH_SETATTR_KILL_SGUID: u32 = 1 << 10;
/// fscrypt bits of newer releases; declared by the 16.2.15 header, not used by Pacific's client.
pub const CEPH_SETATTR_FSCRYPT_AUTH: u32 = 1 << 11;
pub const CEPH_SETATTR_FSCRYPT_FILE: u32 = 1 << 12;
/// Clear setuid only. Declared by the 16.2.15 header but **not understood by Pacific's
/// client** (added for newer releases): use `CEPH_SETATTR_KILL_SGUID` or an explicit
/// `CEPH_SETATTR_MODE` on Pacific.
pub const CEPH_SETATTR_KILL_SUID: u32 = 1 << 13;
/// Clear setgid only. Same caveat as `CEPH_SETATTR_KILL_SUID`: not understood by Pacific.
pub const CEPH_SETATTR_KILL_SGID: u32 = 1 << 14;

// --- snapshots ---
/// The snapid of the live (non-snapshot) filesystem: `(uint64_t)-2`.
pub const CEPH_NOSNAP: u64 = u64::MAX - 1;
/// The snapid of a `.snap` directory: `(uint64_t)-1` (ceph_fs.h; not in the libcephfs header).
pub const CEPH_SNAPDIR: u64 = u64::MAX;
/// The root inode number.
pub const CEPH_INO_ROOT: u64 = 1;

// --- fallocate modes (same values as Linux) ---
pub const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
pub const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;

/// `ceph_start_reclaim` flag: reset the old client's state instead of reclaiming it.
pub const CEPH_RECLAIM_RESET: u32 = 1;
