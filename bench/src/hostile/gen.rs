//! The fuzzer's request generator: FUSE requests with a valid structure and hostile values,
//! chains bent every way a guest driver can bend them, and raw garbage. Deterministic for a
//! seed (splitmix64), no RNG crate.

use super::device::{Buf, DescSpec, VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use super::session::REPLY_LEN;
use super::wire::{self, Header};

/// splitmix64.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn u32(&mut self) -> u32 {
        (self.u64() >> 32) as u32
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.u64() % n.max(1)
    }

    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        if v.is_empty() {
            None
        } else {
            v.get(self.below(v.len() as u64) as usize)
        }
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u64() as u8).collect()
    }
}

/// A generated request: the chain and what the checker needs to judge the answer.
#[derive(Debug, Clone)]
pub struct Case {
    pub queue: usize,
    pub descs: Vec<DescSpec>,
    /// The opcode the header carries (for decoding the reply).
    pub opcode: u32,
    /// The unique the header carries, when the header is intact (the reply must echo it).
    pub unique: Option<u64>,
    /// A well-formed request in a well-formed chain with room for any reply: the daemon must
    /// answer it (FORGET and BATCH_FORGET excepted).
    pub proper: bool,
    /// Which kind of mangling made it (for the summary).
    pub kind: &'static str,
}

/// What the generator knows of the daemon's state: node ids and handles it has handed out.
#[derive(Debug, Default)]
pub struct Known {
    pub nodes: Vec<u64>,
    pub handles: Vec<u64>,
}

impl Known {
    pub fn new() -> Self {
        Known {
            nodes: vec![1],
            handles: Vec::new(),
        }
    }
}

struct B(Vec<u8>);

impl B {
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn raw(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
}

fn b() -> B {
    B(Vec::new())
}

/// Offsets a guest may send: ordinary ones and ones past every limit.
fn offset(r: &mut Rng) -> u64 {
    match r.below(8) {
        0 => 0,
        1 => r.below(65536),
        2 => i64::MAX as u64,
        3 => (i64::MAX as u64) + 1,
        4 => u64::MAX,
        5 => 1 << 40,
        6 => r.u64(),
        _ => r.below(1 << 20),
    }
}

fn size(r: &mut Rng) -> u32 {
    match r.below(6) {
        0 => 0,
        1 => u32::MAX,
        2 => r.u32(),
        3 => 1 << 20,
        _ => r.below(8192) as u32,
    }
}

/// Names: ordinary ones from a small pool (so the tree stays small), "." / ".." / ".snap",
/// and names no Linux guest sends: with '/', over 255 bytes, empty, not UTF-8.
fn name(r: &mut Rng) -> Vec<u8> {
    const POOL: [&[u8]; 8] = [b"f0", b"f1", b"f2", b"d0", b"d1", b"l0", b"s0", b"x"];
    match r.below(20) {
        0 => b".".to_vec(),
        1 => b"..".to_vec(),
        2 => b".snap".to_vec(),
        3 => b"d0/../..".to_vec(),
        4 => vec![b'n'; 256 + r.below(4000) as usize],
        5 => Vec::new(),
        6 => vec![0xff, 0xfe, b'/', 0x80],
        7 => b"/".to_vec(),
        _ => r.pick(&POOL).copied().unwrap_or(b"x").to_vec(),
    }
}

/// A name as the body carries it: NUL-terminated, or (rarely) not.
fn cname(r: &mut Rng) -> Vec<u8> {
    let mut n = name(r);
    if !r.chance(50) {
        n.push(0);
    }
    n
}

fn node(r: &mut Rng, k: &Known) -> u64 {
    match r.below(16) {
        0 => 0,
        1 => u64::MAX,
        2 => r.u64(),
        3 => r.below(1 << 16),
        _ => r.pick(&k.nodes).copied().unwrap_or(1),
    }
}

fn fh(r: &mut Rng, k: &Known) -> u64 {
    match r.below(8) {
        0 => 0,
        1 => u64::MAX,
        2 => r.u64(),
        3 => r.below(1 << 12),
        _ => r.pick(&k.handles).copied().unwrap_or(0),
    }
}

const MUTATING_BELOW_50: [u32; 16] = [
    wire::FUSE_SETATTR,
    wire::FUSE_SYMLINK,
    wire::FUSE_MKNOD,
    wire::FUSE_MKDIR,
    wire::FUSE_UNLINK,
    wire::FUSE_RMDIR,
    wire::FUSE_RENAME,
    wire::FUSE_LINK,
    wire::FUSE_WRITE,
    wire::FUSE_SETXATTR,
    wire::FUSE_REMOVEXATTR,
    wire::FUSE_CREATE,
    wire::FUSE_FALLOCATE,
    wire::FUSE_RENAME2,
    wire::FUSE_COPY_FILE_RANGE,
    wire::FUSE_FSYNC,
];

const READING: [u32; 27] = [
    wire::FUSE_LOOKUP,
    wire::FUSE_LOOKUP,
    wire::FUSE_LOOKUP,
    wire::FUSE_LOOKUP,
    wire::FUSE_GETATTR,
    wire::FUSE_GETATTR,
    wire::FUSE_READLINK,
    wire::FUSE_OPEN,
    wire::FUSE_OPEN,
    wire::FUSE_READ,
    wire::FUSE_READ,
    wire::FUSE_STATFS,
    wire::FUSE_RELEASE,
    wire::FUSE_GETXATTR,
    wire::FUSE_LISTXATTR,
    wire::FUSE_FLUSH,
    wire::FUSE_OPENDIR,
    wire::FUSE_OPENDIR,
    wire::FUSE_READDIR,
    wire::FUSE_READDIRPLUS,
    wire::FUSE_READDIRPLUS,
    wire::FUSE_RELEASEDIR,
    wire::FUSE_GETLK,
    wire::FUSE_SETLK,
    wire::FUSE_ACCESS,
    wire::FUSE_LSEEK,
    wire::FUSE_FSYNCDIR,
];

const ODD: [u32; 11] = [
    wire::FUSE_INTERRUPT,
    wire::FUSE_BMAP,
    wire::FUSE_IOCTL,
    wire::FUSE_POLL,
    wire::FUSE_NOTIFY_REPLY,
    wire::FUSE_SETUPMAPPING,
    wire::FUSE_REMOVEMAPPING,
    wire::FUSE_SYNCFS,
    wire::FUSE_INIT,
    wire::FUSE_SETLKW,
    wire::FUSE_FORGET,
];

/// An opcode: `mutating` per mille of them change the tree (those wait for the MDS's journal,
/// so they set the pace of a run), the rest read, are odd, or are unknown.
fn opcode(r: &mut Rng, mutating: u64) -> u32 {
    if r.chance(mutating) {
        return r
            .pick(&MUTATING_BELOW_50)
            .copied()
            .unwrap_or(wire::FUSE_MKDIR);
    }
    match r.below(88) {
        0..=69 => r.pick(&READING).copied().unwrap_or(wire::FUSE_LOOKUP),
        70..=77 => r.pick(&ODD).copied().unwrap_or(wire::FUSE_POLL),
        78..=81 => r.pick(&wire::UNKNOWN_BELOW_50).copied().unwrap_or(0),
        82..=84 => 51 + r.below(200) as u32,
        _ => r.u32().max(51),
    }
}

/// The share of tree-changing requests when not told otherwise (per mille).
pub const MUTATING_PER_MILLE: u64 = 120;

/// File types other than regular for MKNOD and CREATE modes, the invalid ones included.
const ODD_TYPES: [u32; 9] = [
    libc::S_IFDIR,
    libc::S_IFCHR,
    libc::S_IFBLK,
    libc::S_IFIFO,
    libc::S_IFSOCK,
    libc::S_IFLNK,
    0,
    libc::S_IFMT,
    0o110000,
];

/// The body of `op` with hostile values in a valid layout.
fn body(r: &mut Rng, k: &Known, op: u32) -> Vec<u8> {
    // Mostly regular files; one mode in eight has another type bits: a directory, a device,
    // a fifo, a socket, 0 or 0o170000. On Pacific a MKNOD of type S_IFDIR aborts the MDS
    // (C_MDS_mknod_finish: ceph_assert(dir)), and an open of a special file for writing asks
    // for a max_size it asserts only files have (Locker::check_inode_max_size), so each ends
    // the run for every client of the cluster: the daemon must refuse them before libcephfs
    // sees them (tests/hostile/wire.rs has the targeted cases), and the fuzzer sends them.
    let mode = |r: &mut Rng| -> u32 {
        let kind = if r.chance(125) {
            r.pick(&ODD_TYPES).copied().unwrap_or(libc::S_IFDIR)
        } else {
            libc::S_IFREG
        };
        kind | (r.u32() & 0o7777)
    };
    match op {
        wire::FUSE_LOOKUP | wire::FUSE_UNLINK | wire::FUSE_RMDIR | wire::FUSE_REMOVEXATTR => {
            cname(r)
        }
        wire::FUSE_GETATTR => {
            b().u32(if r.chance(300) { 1 } else { r.u32() & 1 })
                .u32(0)
                .u64(fh(r, k))
                .0
        }
        wire::FUSE_SETATTR => {
            // Only a few fields, so the tree stays small: no size over 1 MiB on valid nodes.
            // FATTR_SIZE only with FATTR_FH (a truncate through a handle): a SETATTR size on
            // a directory node reaches the Pacific MDS, which takes it, logs "unmatched rstat"
            // and later died of SIGFPE in Filer::truncate; tests/hostile/wire.rs checks the
            // daemon refuses it, on a private cluster.
            let mut valid = r.u32() & 0x1ff;
            if valid & (1 << 6) == 0 {
                valid &= !(1 << 3);
            }
            let sz = if r.chance(100) {
                offset(r)
            } else {
                r.below(1 << 20)
            };
            b().u32(valid)
                .u32(0)
                .u64(fh(r, k))
                .u64(sz)
                .u64(r.u64())
                .u64(offset(r))
                .u64(offset(r))
                .u64(offset(r))
                .u32(r.u32())
                .u32(r.u32())
                .u32(r.u32())
                .u32(mode(r))
                .u32(0)
                .u32(r.u32())
                .u32(r.u32())
                .u32(0)
                .0
        }
        wire::FUSE_SYMLINK => {
            let mut v = cname(r);
            v.extend(cname(r));
            v
        }
        wire::FUSE_MKNOD => {
            b().u32(mode(r))
                .u32(r.u32())
                .u32(r.u32())
                .u32(0)
                .raw(&cname(r))
                .0
        }
        wire::FUSE_MKDIR => b().u32(mode(r)).u32(r.u32() & 0o777).raw(&cname(r)).0,
        wire::FUSE_RENAME => b().u64(node(r, k)).raw(&cname(r)).raw(&cname(r)).0,
        wire::FUSE_RENAME2 => {
            b().u64(node(r, k))
                .u32(r.u32() & 7)
                .u32(0)
                .raw(&cname(r))
                .raw(&cname(r))
                .0
        }
        wire::FUSE_LINK => b().u64(node(r, k)).raw(&cname(r)).0,
        wire::FUSE_OPEN | wire::FUSE_OPENDIR => {
            let flags = if r.chance(200) {
                r.u32()
            } else {
                // No O_TRUNC|O_CREAT storms: mostly read-only or read-write opens.
                [
                    libc::O_RDONLY,
                    libc::O_RDWR,
                    libc::O_WRONLY,
                    libc::O_DIRECT,
                    libc::O_RDONLY | libc::O_NOATIME,
                ][r.below(5) as usize] as u32
            };
            b().u32(flags).u32(r.u32() & 3).0
        }
        wire::FUSE_READ | wire::FUSE_READDIR | wire::FUSE_READDIRPLUS => {
            let sz = if r.chance(200) {
                size(r)
            } else {
                4096 * (1 + r.below(32) as u32)
            };
            b().u64(fh(r, k))
                .u64(offset(r))
                .u32(sz)
                .u32(r.u32() & 3)
                .u64(r.u64())
                .u32(r.u32())
                .u32(0)
                .0
        }
        wire::FUSE_WRITE => {
            let n = r.below(4096) as usize;
            let data = r.bytes(n);
            let sz = if r.chance(200) {
                size(r)
            } else {
                data.len() as u32
            };
            // Writes stay below 1 MiB on valid handles, so files stay small.
            let off = if r.chance(50) {
                offset(r)
            } else {
                r.below(1 << 20)
            };
            b().u64(fh(r, k))
                .u64(off)
                .u32(sz)
                .u32(r.u32() & 7)
                .u64(r.u64())
                .u32(r.u32())
                .u32(0)
                .raw(&data)
                .0
        }
        wire::FUSE_RELEASE | wire::FUSE_RELEASEDIR => {
            b().u64(fh(r, k))
                .u32(r.u32())
                .u32(r.u32() & 3)
                .u64(r.u64())
                .0
        }
        wire::FUSE_FSYNC | wire::FUSE_FSYNCDIR => b().u64(fh(r, k)).u32(r.u32() & 1).u32(0).0,
        wire::FUSE_SETXATTR => {
            let names: [&[u8]; 5] = [
                b"user.h",
                b"security.capability",
                b"trusted.h",
                b"system.posix_acl_access",
                b"ceph.dir.layout",
            ];
            let n = r.below(64) as usize;
            let value = r.bytes(n);
            let n = r.pick(&names).copied().unwrap_or(b"user.h");
            let sz = if r.chance(200) {
                size(r)
            } else {
                value.len() as u32
            };
            b().u32(sz).u32(r.u32() & 3).raw(n).raw(&[0]).raw(&value).0
        }
        wire::FUSE_GETXATTR => {
            let n: &[u8] = if r.chance(500) {
                b"user.h\0"
            } else {
                b"ceph.dir.rbytes\0"
            };
            b().u32(size(r)).u32(0).raw(n).0
        }
        wire::FUSE_LISTXATTR => b().u32(size(r)).u32(0).0,
        wire::FUSE_FLUSH => b().u64(fh(r, k)).u32(0).u32(0).u64(r.u64()).0,
        wire::FUSE_GETLK | wire::FUSE_SETLK | wire::FUSE_SETLKW => {
            // SETLKW only on handles that are not ours: a wait on a lock we hold would block.
            let h = if op == wire::FUSE_SETLKW {
                r.u64() | 1 << 63
            } else {
                fh(r, k)
            };
            b().u64(h)
                .u64(r.u64())
                .u64(offset(r))
                .u64(offset(r))
                .u32(r.below(4) as u32)
                .u32(r.u32())
                .u32(r.u32() & 1)
                .u32(0)
                .0
        }
        wire::FUSE_ACCESS => b().u32(r.u32() & 7).u32(0).0,
        wire::FUSE_CREATE => {
            let flags = [
                libc::O_RDWR | libc::O_CREAT,
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                r.u32() as i32,
            ][r.below(3) as usize] as u32;
            b().u32(flags)
                .u32(mode(r))
                .u32(r.u32() & 0o777)
                .u32(r.u32() & 1)
                .raw(&cname(r))
                .0
        }
        wire::FUSE_INTERRUPT => b().u64(r.u64()).0,
        wire::FUSE_BMAP => b().u64(r.u64()).u32(r.u32()).u32(0).0,
        wire::FUSE_IOCTL => {
            b().u64(fh(r, k))
                .u32(r.u32())
                .u32(r.u32())
                .u64(r.u64())
                .u32(size(r))
                .u32(size(r))
                .0
        }
        wire::FUSE_POLL => b().u64(fh(r, k)).u64(r.u64()).u32(r.u32()).u32(r.u32()).0,
        wire::FUSE_FORGET => {
            let any = r.u64();
            b().u64(r.pick(&[1, any, 0]).copied().unwrap_or(1)).0
        }
        wire::FUSE_FALLOCATE => {
            b().u64(fh(r, k))
                .u64(offset(r))
                .u64(if r.chance(100) {
                    offset(r)
                } else {
                    r.below(1 << 20)
                })
                .u32(r.u32() & 0x7f)
                .u32(0)
                .0
        }
        wire::FUSE_LSEEK => {
            b().u64(fh(r, k))
                .u64(offset(r))
                .u32(r.below(6) as u32)
                .u32(0)
                .0
        }
        wire::FUSE_COPY_FILE_RANGE => {
            // Lengths past 1 MiB only between handles that are not ours: a 4 GiB copy out of
            // a sparse file would fill the lab cluster.
            let (a, c, len) = if r.chance(300) {
                (r.u64() | 1 << 63, r.u64() | 1 << 63, r.u64())
            } else {
                (fh(r, k), fh(r, k), r.below(1 << 20))
            };
            b().u64(a)
                .u64(offset(r))
                .u64(node(r, k))
                .u64(c)
                .u64(offset(r))
                .u64(len)
                .u64(r.u64() & 1)
                .0
        }
        wire::FUSE_INIT => {
            b().u32(if r.chance(500) { 7 } else { r.u32() })
                .u32(r.u32() & 63)
                .u32(r.u32())
                .u32(r.u32())
                .raw(&{
                    let n = if r.chance(500) { 48 } else { 0 };
                    r.bytes(n)
                })
                .0
        }
        wire::FUSE_SYNCFS => b().u64(0).0,
        _ => {
            let n = r.below(128) as usize;
            r.bytes(n)
        }
    }
}

/// BATCH_FORGET: counts that may not match the entries, node ids we hold or not.
fn batch_forget(r: &mut Rng, k: &Known) -> Vec<u8> {
    let n = r.below(8) as u32;
    let count = if r.chance(200) { r.u32() } else { n };
    let mut v = b().u32(count).u32(0);
    for _ in 0..n {
        v = v
            .u64(node(r, k))
            .u64(if r.chance(100) { u64::MAX } else { r.below(3) });
    }
    v.0
}

fn read(v: Vec<u8>) -> DescSpec {
    DescSpec::new(Buf::Read(v))
}

fn write(n: u32) -> DescSpec {
    DescSpec::new(Buf::Write(n))
}

/// Bend the chain of a request `req`: `mem` is the guest memory size (for addresses outside).
fn mangle(r: &mut Rng, req: Vec<u8>, mem: u64) -> (Vec<DescSpec>, &'static str, bool) {
    let oob = |r: &mut Rng| -> u64 {
        match r.below(4) {
            0 => mem,
            1 => mem + r.below(1 << 30),
            2 => u64::MAX - r.below(4096),
            _ => mem - 1 - r.below(8),
        }
    };
    match r.below(15) {
        0 => (vec![read(req)], "no-writable", false),
        1 => (
            vec![read(req), write(r.below(80) as u32)],
            "short-writable",
            false,
        ),
        2 => {
            // Split the readable bytes into pieces (a valid chain).
            let mut v = Vec::new();
            let mut rest = &req[..];
            let pieces = 2 + r.below(10) as usize;
            for _ in 0..pieces - 1 {
                let cut = r.below(rest.len() as u64 + 1) as usize;
                v.push(read(rest[..cut].to_vec()));
                rest = &rest[cut..];
            }
            v.push(read(rest.to_vec()));
            v.push(write(REPLY_LEN));
            (v, "split-readable", true)
        }
        3 => (vec![write(REPLY_LEN), read(req)], "writable-first", false),
        4 => {
            let cut = r.below(req.len() as u64 + 1) as usize;
            let mut v = vec![read(req[..cut].to_vec())];
            v.push(DescSpec::new(Buf::Raw {
                addr: oob(r),
                len: (req.len() - cut) as u32 + r.below(64) as u32,
            }));
            v.push(write(REPLY_LEN));
            (v, "readable-outside-memory", false)
        }
        5 => {
            let mut w = DescSpec::new(Buf::Raw {
                addr: oob(r),
                len: 1 + r.below(REPLY_LEN as u64) as u32,
            });
            w.flags = Some(VIRTQ_DESC_F_WRITE);
            (vec![read(req), w], "writable-outside-memory", false)
        }
        6 => {
            let mut w = write(REPLY_LEN);
            w.next = Some(r.below(2) as u16);
            (vec![read(req), w], "loop", false)
        }
        7 => (
            vec![DescSpec::new(Buf::Indirect(vec![
                read(req),
                write(REPLY_LEN),
            ]))],
            "indirect",
            true,
        ),
        8 => {
            // An indirect descriptor over garbage, or with a length no table has, or nested.
            let mut d = match r.below(3) {
                0 => DescSpec::new(Buf::Raw {
                    addr: r.below(mem),
                    len: r.u32() % 4096,
                }),
                1 => DescSpec::new(Buf::Raw {
                    addr: oob(r),
                    len: 16 * (1 + r.below(4) as u32),
                }),
                _ => DescSpec::new(Buf::Indirect(vec![DescSpec::new(Buf::Indirect(vec![
                    read(req.clone()),
                ]))])),
            };
            d.flags =
                Some(VIRTQ_DESC_F_INDIRECT | if r.chance(300) { VIRTQ_DESC_F_NEXT } else { 0 });
            let mut v = vec![d];
            if r.chance(500) {
                v.insert(0, read(req));
            }
            (v, "bad-indirect", false)
        }
        9 => {
            let mut v = vec![read(Vec::new()), read(req), read(Vec::new()), write(0)];
            v.push(write(REPLY_LEN));
            (v, "zero-length", true)
        }
        10 => {
            let mut v = Vec::new();
            let mut rest = &req[..];
            while rest.len() > 1 && v.len() < 14 {
                v.push(read(rest[..1].to_vec()));
                rest = &rest[1..];
            }
            v.push(read(rest.to_vec()));
            v.push(write(REPLY_LEN));
            (v, "many-pieces", true)
        }
        11 => {
            // Trailing bytes after the request the header does not count.
            let mut req = req;
            let n = 1 + r.below(512) as usize;
            let extra = r.bytes(n);
            req.extend(extra);
            (vec![read(req), write(REPLY_LEN)], "trailing-bytes", false)
        }
        12 => {
            let len = 1 + r.below(8192) as u32;
            let mut d = DescSpec::new(Buf::Raw {
                addr: mem.saturating_sub(u64::from(len) / 2),
                len,
            });
            if r.chance(500) {
                d.flags = Some(VIRTQ_DESC_F_WRITE);
                (vec![read(req), d], "writable-straddles-end", false)
            } else {
                (
                    vec![read(req), d, write(REPLY_LEN)],
                    "readable-straddles-end",
                    false,
                )
            }
        }
        13 => {
            let mut d = read(req);
            d.next = Some(2000 + r.below(60000) as u16);
            (vec![d, write(REPLY_LEN)], "next-outside-table", false)
        }
        _ => {
            // Writable split in small pieces (valid).
            let mut v = vec![read(req)];
            for _ in 0..8 {
                v.push(write(1 + r.below(64) as u32));
            }
            v.push(write(REPLY_LEN - 8 * 64));
            (v, "split-writable", true)
        }
    }
}

/// The first readable descriptor that holds a whole in-header (inside an indirect table too).
fn first_header(descs: &mut [DescSpec]) -> Option<&mut Vec<u8>> {
    for d in descs {
        match &mut d.buf {
            Buf::Read(b) if b.len() >= wire::IN_HDR => return Some(b),
            Buf::Indirect(inner) => {
                if let Some(b) = first_header(inner) {
                    return Some(b);
                }
            }
            _ => {}
        }
    }
    None
}

/// Generate the next case. `corpus`: earlier cases that found a new (opcode, errno).
pub fn next(r: &mut Rng, k: &Known, unique: u64, mem: u64, corpus: &[Case], mutating: u64) -> Case {
    let roll = r.below(100);
    if roll < 6 {
        // Raw garbage: random bytes, sometimes behind a plausible length and opcode.
        let n = r.below(200) as usize;
        let mut v = r.bytes(n);
        if v.len() >= 8 && r.chance(500) {
            let len = v.len() as u32;
            v[0..4].copy_from_slice(&len.to_le_bytes());
            let op = opcode(r, mutating);
            v[4..8].copy_from_slice(&op.to_le_bytes());
        }
        let opcode = wire::in_header(&v).map_or(u32::MAX, |h| h.1);
        return Case {
            queue: 1,
            descs: vec![read(v), write(REPLY_LEN)],
            opcode,
            unique: None,
            proper: false,
            kind: "garbage",
        };
    }
    if roll < 14 {
        if let Some(c) = r.pick(corpus) {
            // A case that reached something new, with a few bytes changed.
            let mut c = c.clone();
            if let Some(bytes) = first_header(&mut c.descs) {
                bytes[8..16].copy_from_slice(&unique.to_le_bytes());
                for _ in 0..1 + r.below(3) {
                    if bytes.len() > wire::IN_HDR {
                        let at =
                            wire::IN_HDR + r.below((bytes.len() - wire::IN_HDR) as u64) as usize;
                        bytes[at] = r.u64() as u8;
                    }
                }
                if r.chance(200) {
                    let n = node(r, k);
                    bytes[16..24].copy_from_slice(&n.to_le_bytes());
                }
            }
            c.unique = c.unique.map(|_| unique);
            c.kind = "corpus-mutant";
            c.proper = false;
            return c;
        }
    }
    if roll < 18 {
        let op = if r.chance(800) {
            wire::FUSE_BATCH_FORGET
        } else {
            wire::FUSE_FORGET
        };
        let h = Header {
            opcode: op,
            unique,
            nodeid: node(r, k),
            ..Header::default()
        };
        let body = if op == wire::FUSE_FORGET {
            b().u64(if r.chance(100) { u64::MAX } else { r.below(3) }).0
        } else {
            batch_forget(r, k)
        };
        return Case {
            queue: if r.chance(900) { 0 } else { 1 },
            descs: vec![read(wire::request(&h, &[&body]))],
            opcode: op,
            unique: Some(unique),
            proper: false,
            kind: "forget",
        };
    }
    let op = opcode(r, mutating);
    let body = body(r, k, op);
    let len = match r.below(20) {
        0 => Some(r.u32()),
        1 => Some(r.below(wire::IN_HDR as u64) as u32),
        2 => Some((wire::IN_HDR + body.len()) as u32 + 1 + r.below(64) as u32),
        3 => Some((wire::IN_HDR + body.len()).saturating_sub(1 + r.below(8) as usize) as u32),
        _ => None,
    };
    let h = Header {
        len,
        opcode: op,
        unique,
        nodeid: node(r, k),
        uid: if r.chance(900) { 1000 } else { r.u32() },
        gid: if r.chance(900) { 1000 } else { r.u32() },
        pid: r.u32() & 0xffff,
    };
    let req = wire::request(&h, &[&body]);
    let (descs, kind, chain_ok) = if r.chance(150) {
        mangle(r, req, mem)
    } else {
        (vec![read(req), write(REPLY_LEN)], "request", true)
    };
    // FORGET, BATCH_FORGET and INTERRUPT have no reply in the protocol.
    let proper = chain_ok
        && len.is_none()
        && !matches!(
            op,
            wire::FUSE_FORGET | wire::FUSE_BATCH_FORGET | wire::FUSE_INTERRUPT
        );
    Case {
        queue: 1,
        descs,
        opcode: op,
        unique: Some(unique),
        proper,
        kind,
    }
}

/// The chain as `hostile serve` tokens (the replay of a finding).
pub fn tokens(descs: &[DescSpec]) -> String {
    fn one(d: &DescSpec) -> String {
        let mut s = match &d.buf {
            Buf::Read(b) => format!("r:{}", wire::hex(b)),
            Buf::Write(n) => format!("w:{n}"),
            Buf::Raw { addr, len } => format!("x:{addr:#x}:{len}"),
            Buf::Indirect(v) => {
                let inner: Vec<String> = v.iter().map(one).collect();
                format!("[ {} ]", inner.join(" "))
            }
        };
        if let Some(n) = d.next {
            s.push_str(&format!("/n={n}"));
        }
        if let Some(f) = d.flags {
            s.push_str(&format!("/f={f}"));
        }
        s
    }
    descs.iter().map(one).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_deterministic_for_a_seed() {
        let k = Known::new();
        let a: Vec<String> = (0..200)
            .scan(Rng::new(7), |r, i| {
                Some(tokens(
                    &next(r, &k, i, 1 << 24, &[], MUTATING_PER_MILLE).descs,
                ))
            })
            .collect();
        let b: Vec<String> = (0..200)
            .scan(Rng::new(7), |r, i| {
                Some(tokens(
                    &next(r, &k, i, 1 << 24, &[], MUTATING_PER_MILLE).descs,
                ))
            })
            .collect();
        assert_eq!(a, b);
        let c: Vec<String> = (0..200)
            .scan(Rng::new(8), |r, i| {
                Some(tokens(
                    &next(r, &k, i, 1 << 24, &[], MUTATING_PER_MILLE).descs,
                ))
            })
            .collect();
        assert_ne!(a, c);
    }

    /// The requests that abort a Pacific MDS if they reach it are generated (the daemon must
    /// refuse them): MKNOD of a directory and of special types, CREATE with type bits, a
    /// SETATTR of the size without a handle.
    #[test]
    fn generated_requests_include_the_shapes_that_abort_the_pacific_mds() {
        let k = Known::new();
        let mut r = Rng::new(5);
        let mut corpus = Vec::new();
        let (mut mknod_dir, mut mknod_special, mut create_typed, mut pathless_size) = (0, 0, 0, 0);
        for i in 0..200_000 {
            let c = next(&mut r, &k, i, 1 << 24, &corpus, 300);
            for d in &c.descs {
                if let Buf::Read(b) = &d.buf {
                    if let Some((_, op, _, _)) = wire::in_header(b) {
                        let u = |at: usize| {
                            b.get(at..at + 4)
                                .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                        };
                        let kind = |at: usize| u(at).map(|m| m & libc::S_IFMT);
                        match op {
                            wire::FUSE_MKNOD if kind(40) == Some(libc::S_IFDIR) => mknod_dir += 1,
                            wire::FUSE_MKNOD
                                if kind(40)
                                    .is_some_and(|t| t != libc::S_IFREG && t != libc::S_IFDIR) =>
                            {
                                mknod_special += 1
                            }
                            wire::FUSE_CREATE if kind(44).is_some_and(|t| t != libc::S_IFREG) => {
                                create_typed += 1
                            }
                            wire::FUSE_SETATTR
                                if u(40)
                                    .is_some_and(|v| v & (1 << 3) != 0 && v & (1 << 6) == 0) =>
                            {
                                pathless_size += 1
                            }
                            _ => {}
                        }
                    }
                }
            }
            if corpus.len() < 64 {
                corpus.push(c);
            }
        }
        let counts = (mknod_dir, mknod_special, create_typed, pathless_size);
        assert!(
            mknod_dir > 0 && mknod_special > 0 && create_typed > 0 && pathless_size > 0,
            "(MKNOD dir, MKNOD special, CREATE typed, SETATTR size without fh) = {counts:?}"
        );
    }

    #[test]
    fn replay_tokens_parse_back() {
        let k = Known::new();
        let mut r = Rng::new(3);
        for i in 0..2000 {
            let c = next(&mut r, &k, i, 1 << 24, &[], MUTATING_PER_MILLE);
            let t = tokens(&c.descs);
            let toks: Vec<&str> = t.split_whitespace().collect();
            // Nested indirect tables have no token form; every other chain round-trips.
            if let Ok(back) = super::super::serve::parse_chain(&toks, 1 << 24) {
                assert_eq!(back.len(), c.descs.len(), "{t}");
            }
        }
    }
}
