//! A reply that came after the guest was answered ETIMEDOUT (`--request-deadline`): what it
//! took on the guest's behalf is given back, since the guest never heard of it.
//!
//! A node reference (LOOKUP, MKNOD, MKDIR, SYMLINK, LINK, CREATE, TMPFILE, each READDIRPLUS entry) is
//! one lookup the guest will never FORGET; a handle (OPEN, OPENDIR, CREATE, TMPFILE) is one it will
//! never RELEASE. Other replies took nothing: a late mutation (mkdir, unlink, setattr) stays
//! done, as it does for Linux's CephFS client whose request timed out.

use std::mem::size_of;

use fuse_backend_rs::abi::fuse_abi::{Dirent, EntryOut, InHeader};
use fuse_backend_rs::api::filesystem::{Context, FileSystem};
use tracing::info;

use super::wire::{
    FUSE_CREATE, FUSE_LINK, FUSE_LOOKUP, FUSE_MKDIR, FUSE_MKNOD, FUSE_OPEN, FUSE_OPENDIR,
    FUSE_READDIRPLUS, FUSE_SYMLINK, FUSE_TMPFILE, OUT_HEADER_LEN,
};

/// What a late reply held that is given back.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Held {
    /// Node ids, one lookup each.
    pub nodes: Vec<u64>,
    /// (node, handle, is a directory's).
    pub handles: Vec<(u64, u64, bool)>,
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let end = at.checked_add(8)?;
    Some(u64::from_le_bytes(b.get(at..end)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let end = at.checked_add(4)?;
    Some(u32::from_le_bytes(b.get(at..end)?.try_into().ok()?))
}

/// The references in the reply `reply` (out-header included) to `header`'s request. Our own
/// bytes, but read defensively: a short reply holds what it holds.
pub(crate) fn held(header: &InHeader, reply: &[u8]) -> Held {
    let mut h = Held::default();
    // An error reply took nothing.
    if reply.len() < OUT_HEADER_LEN || u32_at(reply, 4) != Some(0) {
        return h;
    }
    let body = OUT_HEADER_LEN;
    let entry = size_of::<EntryOut>();
    match header.opcode {
        FUSE_LOOKUP | FUSE_MKNOD | FUSE_MKDIR | FUSE_SYMLINK | FUSE_LINK | FUSE_CREATE
        | FUSE_TMPFILE => {
            if let Some(node) = u64_at(reply, body).filter(|&n| n != 0) {
                h.nodes.push(node);
                if header.opcode == FUSE_CREATE || header.opcode == FUSE_TMPFILE {
                    if let Some(fh) = u64_at(reply, body + entry) {
                        h.handles.push((node, fh, false));
                    }
                }
            }
        }
        FUSE_OPEN | FUSE_OPENDIR => {
            if let Some(fh) = u64_at(reply, body) {
                h.handles
                    .push((header.nodeid, fh, header.opcode == FUSE_OPENDIR));
            }
        }
        FUSE_READDIRPLUS => {
            let mut at = body;
            let dirent = size_of::<Dirent>();
            while let (Some(node), Some(namelen)) = (
                u64_at(reply, at),
                u32_at(reply, at + entry + 16).and_then(|n| usize::try_from(n).ok()),
            ) {
                if node != 0 {
                    h.nodes.push(node);
                }
                // Each entry is padded to 8 bytes.
                let len = (entry + dirent + namelen + 7) & !7;
                match at.checked_add(len) {
                    Some(next) if next <= reply.len() => at = next,
                    _ => break,
                }
            }
        }
        _ => {}
    }
    h
}

/// Give back what the late reply `reply` to `header`'s request holds.
pub(crate) fn drop_reply<F>(fs: &F, header: &InHeader, reply: &[u8])
where
    F: FileSystem<Inode = u64, Handle = u64>,
{
    let h = held(header, reply);
    let ctx = Context::default();
    for &(node, fh, dir) in &h.handles {
        // Nothing of the guest's waits on these: their errors only go to the log.
        let r = if dir {
            fs.releasedir(&ctx, node, 0, fh)
        } else {
            fs.release(&ctx, node, 0, fh, false, false, None)
        };
        if let Err(e) = r {
            info!(node, handle = fh, error = %e, "Cannot release the handle of a late reply");
        }
    }
    for &node in &h.nodes {
        fs.forget(&ctx, node, 1);
    }
    let op = super::wire::opcode_name(usize::try_from(header.opcode).unwrap_or(usize::MAX));
    info!(
        op,
        unique = header.unique,
        errno = reply
            .get(4..8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, |b| i32::from_le_bytes(b).saturating_neg()),
        nodes_released = h.nodes.len(),
        handles_released = h.handles.len(),
        "A request answered ETIMEDOUT at --request-deadline completed now; its result is dropped"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuse_backend_rs::abi::fuse_abi::{OpenOut, OutHeader};
    use vm_memory::ByteValued;

    fn hdr(opcode: u32, nodeid: u64) -> InHeader {
        InHeader {
            opcode,
            nodeid,
            unique: 7,
            ..Default::default()
        }
    }

    fn ok_head(len: usize) -> Vec<u8> {
        let out = OutHeader {
            len: u32::try_from(len).unwrap(),
            error: 0,
            unique: 7,
        };
        out.as_slice().to_vec()
    }

    #[test]
    fn an_entry_reply_holds_its_node_and_create_its_handle() {
        let e = EntryOut {
            nodeid: 42,
            ..Default::default()
        };
        let mut r = ok_head(16 + size_of::<EntryOut>());
        r.extend_from_slice(e.as_slice());
        assert_eq!(held(&hdr(FUSE_MKDIR, 1), &r).nodes, vec![42]);
        let o = OpenOut {
            fh: 9,
            ..Default::default()
        };
        r.extend_from_slice(o.as_slice());
        let h = held(&hdr(FUSE_CREATE, 1), &r);
        assert_eq!((h.nodes, h.handles), (vec![42], vec![(42, 9, false)]));
    }

    #[test]
    fn open_and_opendir_hold_a_handle_of_the_request_node() {
        let mut r = ok_head(32);
        r.extend_from_slice(
            OpenOut {
                fh: 5,
                ..Default::default()
            }
            .as_slice(),
        );
        assert_eq!(held(&hdr(FUSE_OPEN, 3), &r).handles, vec![(3, 5, false)]);
        assert_eq!(held(&hdr(FUSE_OPENDIR, 3), &r).handles, vec![(3, 5, true)]);
    }

    #[test]
    fn errors_negative_entries_and_short_replies_hold_nothing() {
        let mut err = OutHeader {
            len: 16,
            error: -libc::ENOENT,
            unique: 7,
        }
        .as_slice()
        .to_vec();
        err.extend_from_slice(&[1; 200]);
        assert_eq!(held(&hdr(FUSE_LOOKUP, 1), &err), Held::default());
        let mut neg = ok_head(16 + size_of::<EntryOut>());
        neg.extend_from_slice(EntryOut::default().as_slice());
        assert_eq!(held(&hdr(FUSE_LOOKUP, 1), &neg), Held::default());
        assert_eq!(held(&hdr(FUSE_CREATE, 1), &[0u8; 20]), Held::default());
        assert_eq!(held(&hdr(FUSE_OPEN, 1), &ok_head(16)), Held::default());
    }

    #[test]
    fn readdirplus_holds_every_entry_but_the_dots() {
        let mut r = ok_head(0);
        for (node, name) in [
            (0u64, &b"."[..]),
            (0, b".."),
            (11, b"a"),
            (12, b"longer-name"),
        ] {
            r.extend_from_slice(
                EntryOut {
                    nodeid: node,
                    ..Default::default()
                }
                .as_slice(),
            );
            r.extend_from_slice(
                Dirent {
                    ino: 1,
                    off: 1,
                    namelen: u32::try_from(name.len()).unwrap(),
                    type_: 0,
                }
                .as_slice(),
            );
            r.extend_from_slice(name);
            while r.len() % 8 != 0 {
                r.push(0);
            }
        }
        assert_eq!(held(&hdr(FUSE_READDIRPLUS, 1), &r).nodes, vec![11, 12]);
        // Cut in the name of the last entry: its entry_out is whole, so it still counts.
        let cut = r.len() - 3;
        assert_eq!(
            held(&hdr(FUSE_READDIRPLUS, 1), &r[..cut]).nodes,
            vec![11, 12]
        );
    }
}
