//! FUSE request encoding and reply decoding (pure functions over byte slices, so malformed
//! replies can be tested without a daemon). Nothing here knows about virtqueues.

use fuse_backend_rs::abi::fuse_abi::{
    Attr, AttrOut, BatchForgetIn, CreateIn, Dirent, EntryOut, ForgetOne, FsyncIn, GetattrIn,
    InHeader, InitIn, InitIn2, InitOut, MkdirIn, MknodIn, OpenIn, OpenOut, OutHeader, ReadIn,
    ReleaseIn, SetattrIn, WriteIn, WriteOut,
};
use vm_memory::ByteValued;

use crate::backend::{Ctx, DirEntry, Op, OpError, Reply};

/// Opcode numbers: the daemon's table (`wire`).
pub use ceph_virtiofsd::wire::opcode::*;

/// `FUSE_WRITE_KILL_SUIDGID` (write_flags; the kernel sets it for callers without CAP_FSETID).
pub const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;

/// FUSE_INIT flag bits (Linux include/uapi/linux/fuse.h; bits 32.. travel in flags2).
pub const INIT_FLAGS: &[(&str, u64)] = &[
    ("ASYNC_READ", 1 << 0),
    ("POSIX_LOCKS", 1 << 1),
    ("FILE_OPS", 1 << 2),
    ("ATOMIC_O_TRUNC", 1 << 3),
    ("EXPORT_SUPPORT", 1 << 4),
    ("BIG_WRITES", 1 << 5),
    ("DONT_MASK", 1 << 6),
    ("SPLICE_WRITE", 1 << 7),
    ("SPLICE_MOVE", 1 << 8),
    ("SPLICE_READ", 1 << 9),
    ("FLOCK_LOCKS", 1 << 10),
    ("HAS_IOCTL_DIR", 1 << 11),
    ("AUTO_INVAL_DATA", 1 << 12),
    ("DO_READDIRPLUS", 1 << 13),
    ("READDIRPLUS_AUTO", 1 << 14),
    ("ASYNC_DIO", 1 << 15),
    ("WRITEBACK_CACHE", 1 << 16),
    ("NO_OPEN_SUPPORT", 1 << 17),
    ("PARALLEL_DIROPS", 1 << 18),
    ("HANDLE_KILLPRIV", 1 << 19),
    ("POSIX_ACL", 1 << 20),
    ("ABORT_ERROR", 1 << 21),
    ("MAX_PAGES", 1 << 22),
    ("CACHE_SYMLINKS", 1 << 23),
    ("NO_OPENDIR_SUPPORT", 1 << 24),
    ("EXPLICIT_INVAL_DATA", 1 << 25),
    ("MAP_ALIGNMENT", 1 << 26),
    ("SUBMOUNTS", 1 << 27),
    ("HANDLE_KILLPRIV_V2", 1 << 28),
    ("SETXATTR_EXT", 1 << 29),
    ("INIT_EXT", 1 << 30),
    ("INIT_RESERVED", 1 << 31),
    ("SECURITY_CTX", 1 << 32),
    ("HAS_INODE_DAX", 1 << 33),
    ("CREATE_SUPP_GROUP", 1 << 34),
    ("HAS_EXPIRE_ONLY", 1 << 35),
];

fn flag(name: &str) -> u64 {
    INIT_FLAGS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, b)| *b)
}

/// What a Linux 6.1 guest asks for in FUSE_INIT, minus what this frontend cannot honour:
/// WRITEBACK_CACHE (no page cache here), SECURITY_CTX (we send no contexts), SETXATTR_EXT,
/// SUBMOUNTS and the DAX bits (no DAX window).
pub fn guest_init_flags() -> u64 {
    [
        "ASYNC_READ",
        "POSIX_LOCKS",
        "ATOMIC_O_TRUNC",
        "EXPORT_SUPPORT",
        "BIG_WRITES",
        "DONT_MASK",
        "FLOCK_LOCKS",
        "AUTO_INVAL_DATA",
        "DO_READDIRPLUS",
        "READDIRPLUS_AUTO",
        "ASYNC_DIO",
        "PARALLEL_DIROPS",
        "HANDLE_KILLPRIV",
        "POSIX_ACL",
        "MAX_PAGES",
        "CACHE_SYMLINKS",
        "HANDLE_KILLPRIV_V2",
        "INIT_EXT",
    ]
    .iter()
    .map(|n| flag(n))
    .fold(0, |a, b| a | b)
}

pub fn flag_names(flags: u64) -> String {
    let mut v: Vec<String> = INIT_FLAGS
        .iter()
        .filter(|(_, b)| flags & b != 0)
        .map(|(n, _)| (*n).to_string())
        .collect();
    let known = INIT_FLAGS.iter().fold(0u64, |a, (_, b)| a | b);
    if flags & !known != 0 {
        v.push(format!("unknown:{:#x}", flags & !known));
    }
    v.join(" ")
}

/// What the daemon answered to FUSE_INIT.
#[derive(Debug, Clone, Default)]
pub struct InitInfo {
    pub major: u32,
    pub minor: u32,
    pub flags: u64,
    pub max_readahead: u32,
    pub max_write: u32,
    pub max_pages: u16,
    pub max_background: u16,
    pub time_gran: u32,
}

pub const IN_HDR: usize = std::mem::size_of::<InHeader>();
pub const OUT_HDR: usize = std::mem::size_of::<OutHeader>();

/// An encoded request: the readable bytes (header + arguments; WRITE data is appended by the
/// transport from memory it keeps filled), and the writable reply size to offer.
#[derive(Debug)]
pub struct Encoded {
    pub bytes: Vec<u8>,
    pub data_len: u32,
    pub reply_len: u32,
    pub opcode: u32,
    pub name: &'static str,
}

fn name_bytes(name: &str) -> Vec<u8> {
    let mut v = name.as_bytes().to_vec();
    v.push(0);
    v
}

fn header(opcode: u32, unique: u64, node: u64, ctx: Ctx, len: usize) -> InHeader {
    InHeader {
        len: u32::try_from(len).unwrap_or(u32::MAX),
        opcode,
        unique,
        nodeid: node,
        uid: ctx.uid,
        gid: ctx.gid,
        pid: 4242,
        padding: 0,
    }
}

fn assemble(
    opcode: u32,
    unique: u64,
    node: u64,
    ctx: Ctx,
    parts: &[&[u8]],
    data_len: u32,
) -> Vec<u8> {
    let args: usize = parts.iter().map(|p| p.len()).sum();
    let total = IN_HDR + args + data_len as usize;
    let mut v = Vec::with_capacity(IN_HDR + args);
    v.extend_from_slice(header(opcode, unique, node, ctx, total).as_slice());
    for p in parts {
        v.extend_from_slice(p);
    }
    v
}

const ENTRY: u32 = (OUT_HDR + std::mem::size_of::<EntryOut>()) as u32;
const ATTR: u32 = (OUT_HDR + std::mem::size_of::<AttrOut>()) as u32;
const OPEN: u32 = (OUT_HDR + std::mem::size_of::<OpenOut>()) as u32;
const BARE: u32 = OUT_HDR as u32;

pub fn encode(op: &Op, unique: u64, ctx: Ctx) -> Encoded {
    let (opcode, name, node, parts, data_len, reply_len): (
        u32,
        &'static str,
        u64,
        Vec<Vec<u8>>,
        u32,
        u32,
    ) = match op {
        Op::Lookup { parent, name } => (
            FUSE_LOOKUP,
            "LOOKUP",
            *parent,
            vec![name_bytes(name)],
            0,
            ENTRY,
        ),
        Op::Getattr { node } => {
            let a = GetattrIn {
                flags: 0,
                dummy: 0,
                fh: 0,
            };
            (
                FUSE_GETATTR,
                "GETATTR",
                *node,
                vec![a.as_slice().to_vec()],
                0,
                ATTR,
            )
        }
        Op::Mkdir { parent, name, mode } => {
            let a = MkdirIn {
                mode: *mode,
                umask: 0,
            };
            (
                FUSE_MKDIR,
                "MKDIR",
                *parent,
                vec![a.as_slice().to_vec(), name_bytes(name)],
                0,
                ENTRY,
            )
        }
        Op::Mknod { parent, name, mode } => {
            let a = MknodIn {
                mode: *mode,
                rdev: 0,
                umask: 0,
                padding: 0,
            };
            (
                FUSE_MKNOD,
                "MKNOD",
                *parent,
                vec![a.as_slice().to_vec(), name_bytes(name)],
                0,
                ENTRY,
            )
        }
        Op::Create {
            parent,
            name,
            mode,
            flags,
        } => {
            let a = CreateIn {
                flags: *flags,
                mode: *mode,
                umask: 0,
                fuse_flags: 0,
            };
            (
                FUSE_CREATE,
                "CREATE",
                *parent,
                vec![a.as_slice().to_vec(), name_bytes(name)],
                0,
                ENTRY + OPEN - BARE,
            )
        }
        Op::Unlink { parent, name } => (
            FUSE_UNLINK,
            "UNLINK",
            *parent,
            vec![name_bytes(name)],
            0,
            BARE,
        ),
        Op::Open { node, flags } => {
            let a = OpenIn {
                flags: *flags,
                fuse_flags: 0,
            };
            (
                FUSE_OPEN,
                "OPEN",
                *node,
                vec![a.as_slice().to_vec()],
                0,
                OPEN,
            )
        }
        Op::Opendir { node } => {
            let a = OpenIn {
                flags: libc::O_RDONLY as u32 | libc::O_DIRECTORY as u32,
                fuse_flags: 0,
            };
            (
                FUSE_OPENDIR,
                "OPENDIR",
                *node,
                vec![a.as_slice().to_vec()],
                0,
                OPEN,
            )
        }
        Op::Release { node, fh } | Op::Releasedir { node, fh } => {
            let a = ReleaseIn {
                fh: *fh,
                flags: 0,
                release_flags: 0,
                lock_owner: 0,
            };
            let (code, n) = if matches!(op, Op::Release { .. }) {
                (FUSE_RELEASE, "RELEASE")
            } else {
                (FUSE_RELEASEDIR, "RELEASEDIR")
            };
            (code, n, *node, vec![a.as_slice().to_vec()], 0, BARE)
        }
        Op::Readdirplus {
            node,
            fh,
            offset,
            size,
        } => {
            let a = ReadIn {
                fh: *fh,
                offset: *offset,
                size: *size,
                read_flags: 0,
                lock_owner: 0,
                flags: 0,
                padding: 0,
            };
            (
                FUSE_READDIRPLUS,
                "READDIRPLUS",
                *node,
                vec![a.as_slice().to_vec()],
                0,
                BARE + size,
            )
        }
        Op::Write {
            node,
            fh,
            offset,
            len,
            kill_suidgid,
        } => {
            let fuse_flags = if *kill_suidgid {
                FUSE_WRITE_KILL_SUIDGID
            } else {
                0
            };
            let a = WriteIn {
                fh: *fh,
                offset: *offset,
                size: *len,
                fuse_flags,
                lock_owner: 0,
                flags: libc::O_RDWR as u32,
                padding: 0,
            };
            (
                FUSE_WRITE,
                "WRITE",
                *node,
                vec![a.as_slice().to_vec()],
                *len,
                BARE + std::mem::size_of::<WriteOut>() as u32,
            )
        }
        Op::Read {
            node,
            fh,
            offset,
            len,
        } => {
            let a = ReadIn {
                fh: *fh,
                offset: *offset,
                size: *len,
                read_flags: 0,
                lock_owner: 0,
                flags: libc::O_RDWR as u32,
                padding: 0,
            };
            (
                FUSE_READ,
                "READ",
                *node,
                vec![a.as_slice().to_vec()],
                0,
                BARE + len,
            )
        }
        Op::Fsync { node, fh } => {
            let a = FsyncIn {
                fh: *fh,
                fsync_flags: 0,
                padding: 0,
            };
            (
                FUSE_FSYNC,
                "FSYNC",
                *node,
                vec![a.as_slice().to_vec()],
                0,
                BARE,
            )
        }
        Op::Truncate { node, size } => {
            let a = SetattrIn {
                valid: FATTR_SIZE,
                size: *size,
                ..Default::default()
            };
            (
                FUSE_SETATTR,
                "SETATTR",
                *node,
                vec![a.as_slice().to_vec()],
                0,
                ATTR,
            )
        }
    };
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    Encoded {
        bytes: assemble(opcode, unique, node, ctx, &refs, data_len),
        data_len,
        reply_len,
        opcode,
        name,
    }
}

/// FUSE_INIT as a Linux 6.1 guest sends it (protocol 7.38, INIT_EXT with flags2).
pub fn encode_init(unique: u64, flags: u64, max_readahead: u32) -> Vec<u8> {
    let a = InitIn {
        major: 7,
        minor: 38,
        max_readahead,
        flags: (flags & 0xffff_ffff) as u32,
    };
    let b = InitIn2 {
        flags2: (flags >> 32) as u32,
        unused: [0; 11],
    };
    assemble(
        FUSE_INIT,
        unique,
        0,
        Ctx::ROOT,
        &[a.as_slice(), b.as_slice()],
        0,
    )
}

pub const INIT_REPLY_LEN: u32 = (OUT_HDR + std::mem::size_of::<InitOut>()) as u32;

/// BATCH_FORGET for `nodes` (no reply).
pub fn encode_batch_forget(unique: u64, nodes: &[(u64, u64)]) -> Vec<u8> {
    let a = BatchForgetIn {
        count: u32::try_from(nodes.len()).unwrap_or(u32::MAX),
        dummy: 0,
    };
    let ones: Vec<u8> = nodes
        .iter()
        .flat_map(|&(nodeid, nlookup)| ForgetOne { nodeid, nlookup }.as_slice().to_vec())
        .collect();
    assemble(
        FUSE_BATCH_FORGET,
        unique,
        0,
        Ctx::ROOT,
        &[a.as_slice(), &ones],
        0,
    )
}

fn malformed(op: &'static str, why: impl Into<String>) -> OpError {
    OpError::Malformed {
        op,
        why: why.into(),
    }
}

fn read_obj<T: ByteValued + Default>(op: &'static str, b: &[u8], what: &str) -> Result<T, OpError> {
    let n = std::mem::size_of::<T>();
    let s = b
        .get(..n)
        .ok_or_else(|| malformed(op, format!("{what}: {} bytes, need {n}", b.len())))?;
    let mut t = T::default();
    t.as_mut_slice().copy_from_slice(s);
    Ok(t)
}

/// Checks a reply header against what the device reported writing and the request's unique;
/// returns the payload length, or the errno the daemon answered.
pub fn check_header(
    op: &'static str,
    unique: u64,
    written: u32,
    hdr: &[u8],
) -> Result<usize, OpError> {
    let h: OutHeader = read_obj(op, hdr, "reply header")?;
    if h.unique != unique {
        return Err(malformed(
            op,
            format!("unique {} in reply, {} in request", h.unique, unique),
        ));
    }
    if h.len != written {
        return Err(malformed(
            op,
            format!("header says {} bytes, device wrote {}", h.len, written),
        ));
    }
    if h.error > 0 || h.error < -4095 {
        return Err(malformed(
            op,
            format!("error field {} is not a negative errno", h.error),
        ));
    }
    let payload = usize::try_from(h.len)
        .unwrap_or(usize::MAX)
        .saturating_sub(OUT_HDR);
    if h.error < 0 {
        if payload != 0 {
            return Err(malformed(
                op,
                format!("error reply carries {payload} payload bytes"),
            ));
        }
        return Err(OpError::Errno {
            op,
            errno: -h.error,
        });
    }
    Ok(payload)
}

/// `check_header`, then the payload itself out of the whole reply buffer.
pub fn check_reply<'a>(
    op: &'static str,
    unique: u64,
    written: u32,
    buf: &'a [u8],
) -> Result<&'a [u8], OpError> {
    let n = check_header(op, unique, written, buf)?;
    buf.get(OUT_HDR..OUT_HDR.saturating_add(n)).ok_or_else(|| {
        malformed(
            op,
            format!(
                "reply length {} exceeds the {} bytes offered",
                OUT_HDR + n,
                buf.len()
            ),
        )
    })
}

fn entry(op: &'static str, e: &EntryOut) -> Result<Reply, OpError> {
    if e.nodeid == 0 {
        // A negative entry: the name does not exist.
        return Err(OpError::Errno {
            op,
            errno: libc::ENOENT,
        });
    }
    Ok(Reply::Entry {
        node: e.nodeid,
        mode: e.attr.mode,
        size: e.attr.size,
        uid: e.attr.uid,
    })
}

fn attr(a: &Attr) -> Reply {
    Reply::Attr {
        mode: a.mode,
        size: a.size,
        uid: a.uid,
    }
}

/// Decodes a successful reply payload for `opcode`. READ/WRITE payloads are only measured.
pub fn decode(opcode: u32, op: &'static str, payload: &[u8]) -> Result<Reply, OpError> {
    match opcode {
        FUSE_LOOKUP | FUSE_MKDIR | FUSE_MKNOD => {
            entry(op, &read_obj::<EntryOut>(op, payload, "entry")?)
        }
        FUSE_CREATE => {
            let e: EntryOut = read_obj(op, payload, "entry")?;
            let o: OpenOut = read_obj(
                op,
                payload
                    .get(std::mem::size_of::<EntryOut>()..)
                    .unwrap_or(&[]),
                "open",
            )?;
            match entry(op, &e)? {
                Reply::Entry { node, .. } => Ok(Reply::Created { node, fh: o.fh }),
                r => Ok(r),
            }
        }
        FUSE_GETATTR | FUSE_SETATTR => Ok(attr(&read_obj::<AttrOut>(op, payload, "attr")?.attr)),
        FUSE_OPEN | FUSE_OPENDIR => Ok(Reply::Open {
            fh: read_obj::<OpenOut>(op, payload, "open")?.fh,
        }),
        FUSE_WRITE => {
            let w: WriteOut = read_obj(op, payload, "write")?;
            Ok(Reply::Written(w.size))
        }
        FUSE_READ => Ok(Reply::Data(
            u32::try_from(payload.len()).unwrap_or(u32::MAX),
        )),
        FUSE_READDIRPLUS => parse_direntplus(op, payload).map(Reply::Dir),
        _ => Ok(Reply::Empty),
    }
}

/// Parses a READDIRPLUS buffer: entries of (EntryOut, Dirent, name padded to 8 bytes).
pub fn parse_direntplus(op: &'static str, mut b: &[u8]) -> Result<Vec<DirEntry>, OpError> {
    let fixed = std::mem::size_of::<EntryOut>() + std::mem::size_of::<Dirent>();
    let mut out = Vec::new();
    while !b.is_empty() {
        let e: EntryOut = read_obj(op, b, "direntplus entry")?;
        let d: Dirent = read_obj(
            op,
            b.get(std::mem::size_of::<EntryOut>()..).unwrap_or(&[]),
            "direntplus dirent",
        )?;
        let namelen = usize::try_from(d.namelen).unwrap_or(usize::MAX);
        if namelen == 0 || namelen > 1024 {
            return Err(malformed(op, format!("dirent name length {}", d.namelen)));
        }
        let name = b
            .get(fixed..fixed.saturating_add(namelen))
            .ok_or_else(|| malformed(op, "dirent name runs past the reply"))?;
        let name = String::from_utf8_lossy(name).into_owned();
        let rec = (fixed + namelen).div_ceil(8) * 8;
        out.push(DirEntry {
            name,
            node: e.nodeid,
            offset: d.off,
            kind: d.type_,
        });
        b = b.get(rec..).unwrap_or(&[]);
    }
    Ok(out)
}

pub fn decode_init(payload: &[u8]) -> Result<InitInfo, OpError> {
    let op = "INIT";
    if payload.len() < 8 {
        return Err(malformed(op, format!("{} payload bytes", payload.len())));
    }
    // Older daemons answer shorter structures: zero-fill what is missing.
    let mut o = InitOut::default();
    let n = payload.len().min(std::mem::size_of::<InitOut>());
    o.as_mut_slice()[..n].copy_from_slice(&payload[..n]);
    let flags2 = if o.flags & (1 << 30) != 0 {
        u64::from(o.flags2) << 32
    } else {
        0
    };
    Ok(InitInfo {
        major: o.major,
        minor: o.minor,
        flags: u64::from(o.flags) | flags2,
        max_readahead: o.max_readahead,
        max_write: o.max_write,
        max_pages: o.max_pages,
        max_background: o.max_background,
        time_gran: o.time_gran,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(unique: u64, error: i32, payload: &[u8]) -> Vec<u8> {
        let h = OutHeader {
            len: (OUT_HDR + payload.len()) as u32,
            error,
            unique,
        };
        let mut v = h.as_slice().to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn lookup_request_layout() {
        let e = encode(
            &Op::Lookup {
                parent: 1,
                name: "ab".into(),
            },
            7,
            Ctx {
                uid: 1000,
                gid: 100,
            },
        );
        assert_eq!(e.bytes.len(), IN_HDR + 3);
        let h: InHeader = read_obj("t", &e.bytes, "h").expect("header");
        assert_eq!(
            (h.len, h.opcode, h.unique, h.nodeid, h.uid, h.gid),
            (43, FUSE_LOOKUP, 7, 1, 1000, 100)
        );
        assert_eq!(&e.bytes[IN_HDR..], b"ab\0");
    }

    #[test]
    fn write_counts_data_and_sets_kill_flag() {
        let e = encode(
            &Op::Write {
                node: 5,
                fh: 9,
                offset: 4096,
                len: 4096,
                kill_suidgid: true,
            },
            1,
            Ctx {
                uid: 1000,
                gid: 1000,
            },
        );
        let h: InHeader = read_obj("t", &e.bytes, "h").expect("header");
        assert_eq!(
            h.len as usize,
            IN_HDR + std::mem::size_of::<WriteIn>() + 4096
        );
        let w: WriteIn = read_obj("t", &e.bytes[IN_HDR..], "w").expect("writein");
        assert_eq!(
            w.fuse_flags & FUSE_WRITE_KILL_SUIDGID,
            FUSE_WRITE_KILL_SUIDGID
        );
        assert_eq!(e.data_len, 4096);
    }

    #[test]
    fn fsync_names_the_handle_and_expects_a_bare_reply() {
        let e = encode(&Op::Fsync { node: 5, fh: 9 }, 3, Ctx::ROOT);
        let h: InHeader = read_obj("t", &e.bytes, "h").expect("header");
        assert_eq!(
            (h.len as usize, h.opcode, h.nodeid),
            (IN_HDR + std::mem::size_of::<FsyncIn>(), FUSE_FSYNC, 5)
        );
        let f: FsyncIn = read_obj("t", &e.bytes[IN_HDR..], "f").expect("fsyncin");
        assert_eq!((f.fh, f.fsync_flags), (9, 0));
        assert_eq!((e.data_len, e.reply_len), (0, BARE));
        assert_eq!(decode(FUSE_FSYNC, "FSYNC", &[]).ok(), Some(Reply::Empty));
    }

    #[test]
    fn init_carries_flags2() {
        let b = encode_init(1, guest_init_flags() | (1 << 33), 131072);
        let a: InitIn = read_obj("t", &b[IN_HDR..], "i").expect("init");
        assert_eq!((a.major, a.minor), (7, 38));
        let f2: InitIn2 = read_obj("t", &b[IN_HDR + 16..], "i2").expect("init2");
        assert_eq!(f2.flags2, 2);
        assert!(flag_names(guest_init_flags()).contains("HANDLE_KILLPRIV_V2"));
    }

    #[test]
    fn errno_reply_is_errno() {
        let r = reply(3, -libc::ENOENT, &[]);
        let e = check_reply("LOOKUP", 3, r.len() as u32, &r).expect_err("errno");
        assert_eq!(e.errno(), Some(libc::ENOENT));
    }

    #[test]
    fn malformed_replies_are_reported() {
        let r = reply(3, 0, &[0; 8]);
        // wrong unique
        assert!(matches!(
            check_reply("X", 4, r.len() as u32, &r),
            Err(OpError::Malformed { .. })
        ));
        // header length disagrees with what the device wrote
        assert!(matches!(
            check_reply("X", 3, 10, &r),
            Err(OpError::Malformed { .. })
        ));
        // positive error
        let r2 = reply(3, 5, &[]);
        assert!(matches!(
            check_reply("X", 3, r2.len() as u32, &r2),
            Err(OpError::Malformed { .. })
        ));
        // too short to hold a header
        assert!(matches!(
            check_reply("X", 3, 4, &r[..4]),
            Err(OpError::Malformed { .. })
        ));
        // truncated entry
        assert!(matches!(
            decode(FUSE_LOOKUP, "LOOKUP", &[0; 20]),
            Err(OpError::Malformed { .. })
        ));
        // dirent name past the end
        let mut d = vec![0u8; std::mem::size_of::<EntryOut>()];
        d.extend_from_slice(
            Dirent {
                ino: 1,
                off: 1,
                namelen: 200,
                type_: 0,
            }
            .as_slice(),
        );
        d.extend_from_slice(b"abc\0\0\0\0\0");
        assert!(matches!(
            parse_direntplus("R", &d),
            Err(OpError::Malformed { .. })
        ));
    }

    #[test]
    fn direntplus_parses_padded_names() {
        let mut b = Vec::new();
        for (i, n) in ["a", "abcdefghi"].iter().enumerate() {
            let e = EntryOut {
                nodeid: 10 + i as u64,
                ..Default::default()
            };
            b.extend_from_slice(e.as_slice());
            b.extend_from_slice(
                Dirent {
                    ino: 1,
                    off: i as u64 + 1,
                    namelen: n.len() as u32,
                    type_: 8,
                }
                .as_slice(),
            );
            b.extend_from_slice(n.as_bytes());
            while b.len() % 8 != 0 {
                b.push(0);
            }
        }
        let v = parse_direntplus("R", &b).expect("parse");
        assert_eq!(v.len(), 2);
        assert_eq!(
            v[1],
            DirEntry {
                name: "abcdefghi".into(),
                node: 11,
                offset: 2,
                kind: 8
            }
        );
    }

    #[test]
    fn negative_entry_is_enoent() {
        let p = EntryOut::default();
        assert_eq!(
            decode(FUSE_LOOKUP, "LOOKUP", p.as_slice())
                .expect_err("neg")
                .errno(),
            Some(libc::ENOENT)
        );
    }
}
