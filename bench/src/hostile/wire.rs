//! FUSE bytes as a hostile guest writes them: any header field, any body; and what the oracle
//! needs from a reply (the node ids and inode numbers it hands out).

use std::mem::size_of;

use fuse_backend_rs::abi::fuse_abi::{AttrOut, Dirent, EntryOut, InHeader, OpenOut, OutHeader};

pub const IN_HDR: usize = size_of::<InHeader>();
pub const OUT_HDR: usize = size_of::<OutHeader>();
const ENTRY_OUT: usize = size_of::<EntryOut>();
const DIRENT: usize = size_of::<Dirent>();
/// Offset of `attr.ino` in `fuse_entry_out` and `fuse_attr_out`.
const ENTRY_INO: usize = 40;
const ATTR_INO: usize = 16;

/// The opcode numbers: the daemon's table, one for the daemon, its tests and this frontend.
pub use ceph_virtiofsd::wire::opcode::*;

/// Opcodes below 50 that fuse-backend-rs 0.14's `Opcode` enum has no variant for.
pub const UNKNOWN_BELOW_50: [u32; 3] = [0, 7, 19];

/// The FUSE in-header fields, all of them settable.
#[derive(Debug, Clone, Copy, Default)]
pub struct Header {
    /// `None`: the real length of header and body.
    pub len: Option<u32>,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// The request bytes: header then the body pieces.
pub fn request(h: &Header, body: &[&[u8]]) -> Vec<u8> {
    let blen: usize = body.iter().map(|b| b.len()).sum();
    let len = h
        .len
        .unwrap_or_else(|| u32::try_from(IN_HDR + blen).unwrap_or(u32::MAX));
    let mut v = Vec::with_capacity(IN_HDR + blen);
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&h.opcode.to_le_bytes());
    v.extend_from_slice(&h.unique.to_le_bytes());
    v.extend_from_slice(&h.nodeid.to_le_bytes());
    v.extend_from_slice(&h.uid.to_le_bytes());
    v.extend_from_slice(&h.gid.to_le_bytes());
    v.extend_from_slice(&h.pid.to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes()); // total_extlen
    v.extend_from_slice(&0u16.to_le_bytes()); // padding
    for b in body {
        v.extend_from_slice(b);
    }
    v
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The reply header: (len, error, unique).
pub fn out_header(reply: &[u8]) -> Option<(u32, i32, u64)> {
    Some((
        u32_at(reply, 0)?,
        u32_at(reply, 4)? as i32,
        u64_at(reply, 8)?,
    ))
}

/// The request header: (len, opcode, unique, nodeid).
pub fn in_header(req: &[u8]) -> Option<(u32, u32, u64, u64)> {
    Some((
        u32_at(req, 0)?,
        u32_at(req, 4)?,
        u64_at(req, 8)?,
        u64_at(req, 16)?,
    ))
}

/// What a successful reply to `opcode` hands the guest: (node id, inode number) pairs (node
/// id 0 when the reply carries only attributes: GETATTR, SETATTR, and the node-less "." and
/// ".." entries of READDIRPLUS, which are left out).
pub fn handed_out(opcode: u32, reply: &[u8]) -> Vec<(u64, u64)> {
    let Some((_, error, _)) = out_header(reply) else {
        return Vec::new();
    };
    if error != 0 {
        return Vec::new();
    }
    let p = reply.get(OUT_HDR..).unwrap_or(&[]);
    let mut out = Vec::new();
    match opcode {
        FUSE_LOOKUP | FUSE_SYMLINK | FUSE_MKNOD | FUSE_MKDIR | FUSE_LINK | FUSE_CREATE => {
            if let (Some(node), Some(ino)) = (u64_at(p, 0), u64_at(p, ENTRY_INO)) {
                if node != 0 {
                    out.push((node, ino));
                }
            }
        }
        FUSE_GETATTR | FUSE_SETATTR if p.len() >= size_of::<AttrOut>() => {
            if let Some(ino) = u64_at(p, ATTR_INO) {
                out.push((0, ino));
            }
        }
        FUSE_READDIRPLUS => {
            let mut b = p;
            while b.len() >= ENTRY_OUT + DIRENT {
                let node = u64_at(b, 0).unwrap_or(0);
                let ino = u64_at(b, ENTRY_INO).unwrap_or(0);
                let namelen = u32_at(b, ENTRY_OUT + 16).unwrap_or(0) as usize;
                if node != 0 {
                    out.push((node, ino));
                }
                let step = (ENTRY_OUT + DIRENT + namelen).div_ceil(8) * 8;
                b = b.get(step..).unwrap_or(&[]);
            }
        }
        _ => {}
    }
    out
}

/// The file handle of a successful OPEN / OPENDIR / CREATE reply.
pub fn handle_of(opcode: u32, reply: &[u8]) -> Option<u64> {
    let (_, error, _) = out_header(reply)?;
    if error != 0 {
        return None;
    }
    let p = reply.get(OUT_HDR..)?;
    match opcode {
        FUSE_OPEN | FUSE_OPENDIR => u64_at(p, 0),
        FUSE_CREATE if p.len() >= ENTRY_OUT + size_of::<OpenOut>() => u64_at(p, ENTRY_OUT),
        _ => None,
    }
}

/// Lowercase hex.
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(2 * b.len());
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_layout_matches_the_abi() {
        let h = Header {
            opcode: FUSE_LOOKUP,
            unique: 7,
            nodeid: 1,
            ..Header::default()
        };
        let r = request(&h, &[b"a\0"]);
        assert_eq!(r.len(), IN_HDR + 2);
        assert_eq!(in_header(&r), Some((42, FUSE_LOOKUP, 7, 1)));
        assert_eq!(unhex(&hex(&r)).as_deref(), Some(&r[..]));
    }

    #[test]
    fn entry_and_attr_inos_are_found() {
        let mut reply = vec![0u8; OUT_HDR + ENTRY_OUT];
        reply[OUT_HDR..OUT_HDR + 8].copy_from_slice(&5u64.to_le_bytes());
        reply[OUT_HDR + ENTRY_INO..OUT_HDR + ENTRY_INO + 8]
            .copy_from_slice(&0x1234u64.to_le_bytes());
        assert_eq!(handed_out(FUSE_LOOKUP, &reply), vec![(5, 0x1234)]);
        let mut a = vec![0u8; OUT_HDR + size_of::<AttrOut>()];
        a[OUT_HDR + ATTR_INO..OUT_HDR + ATTR_INO + 8].copy_from_slice(&9u64.to_le_bytes());
        assert_eq!(handed_out(FUSE_GETATTR, &a), vec![(0, 9)]);
        // An error reply hands out nothing.
        a[4..8].copy_from_slice(&(-2i32).to_le_bytes());
        assert!(handed_out(FUSE_GETATTR, &a).is_empty());
    }
}
