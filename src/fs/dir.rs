//! Directory streams: OPENDIR, READDIR and READDIRPLUS (one reply page at a time, resuming
//! where the last one stopped), FSYNCDIR and RELEASEDIR.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ceph_client::Dir;
use fuse_backend_rs::abi::fuse_abi::OpenOptions;
use fuse_backend_rs::api::filesystem::{Context, DirEntry, Entry};

use crate::idmap::GuestUid;

use super::attr::to_stat;
use super::perms::Caller;
use super::state;
use super::{errno, names, to_len, to_off, CephFs, Handle, Node, WANT};

#[derive(Debug)]
pub struct DirStream {
    dir: Dir,
    /// Offset of the next entry (what telldir returns), 0 at the start.
    pos: u64,
    /// An entry read from libcephfs that did not fit in the last reply: it is handed out first
    /// by the next READDIR at `pos`. Seeking libcephfs back instead would make it drop its
    /// directory buffer and go back to the MDS for every reply page.
    pending: Option<Box<ceph_client::DirEntryPlus>>,
    /// The guest caller that opened it (a migration opens the stream again as that caller).
    opener: crate::migration::Opener,
}

impl DirStream {
    /// Offset of the next entry the guest will ask for (migration).
    pub(super) fn position(&self) -> u64 {
        self.pos
    }

    /// Who opened it (migration).
    pub(super) fn opener(&self) -> crate::migration::Opener {
        self.opener
    }

    /// A stream `opener` opened, opened again by a migration destination, at the source's
    /// position.
    pub(super) fn restored(
        mut dir: Dir,
        pos: u64,
        opener: crate::migration::Opener,
    ) -> io::Result<Self> {
        if pos != 0 {
            dir.seekdir(to_off(pos)?);
        }
        Ok(DirStream {
            dir,
            pos,
            pending: None,
            opener,
        })
    }
}

/// One READDIR or READDIRPLUS request.
struct DirRead {
    inode: u64,
    handle: u64,
    offset: u64,
    size: u32,
    plus: bool,
}

/// Bytes one entry takes in a READDIR(PLUS) reply (fuse_dirent padded to 8, plus a
/// fuse_entry_out for READDIRPLUS), as fuse-backend-rs lays it out.
fn dirent_size(name_len: usize, plus: bool) -> usize {
    const DIRENT: usize = 24;
    const ENTRY_OUT: usize = 128;
    ((DIRENT + name_len + 7) & !7) + if plus { ENTRY_OUT } else { 0 }
}

impl CephFs {
    pub(super) fn do_opendir(
        &self,
        ctx: &Caller,
        inode: u64,
        _flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions)> {
        let node = self.node_op(inode, "opendir", ctx)?;
        if !node.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        self.handle_room("opendir")?;
        let dir = self
            .mount()
            .opendir(&*self.inode(&node)?, &self.perm(ctx))?;
        let fh = self.new_handle(
            inode,
            Handle::Dir(Mutex::new(DirStream {
                dir,
                pos: 0,
                pending: None,
                opener: state::opener_of(ctx),
            })),
            "opendir",
        )?;
        Ok((Some(fh), OpenOptions::empty()))
    }

    pub(super) fn do_readdir(
        &self,
        ctx: &Caller,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        let req = DirRead {
            inode,
            handle,
            offset,
            size,
            plus: false,
        };
        self.read_dir(req, ctx.guest_uid(), &mut |d, _| add_entry(d))
    }

    pub(super) fn do_readdirplus(
        &self,
        ctx: &Caller,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        let req = DirRead {
            inode,
            handle,
            offset,
            size,
            plus: true,
        };
        self.read_dir(req, ctx.guest_uid(), &mut |d, e| match e {
            Some(e) => add_entry(d, e),
            None => Err(errno(libc::EIO)),
        })
    }

    pub(super) fn do_fsyncdir(
        &self,
        ctx: &Caller,
        inode: u64,
        _datasync: bool,
        handle: u64,
    ) -> io::Result<()> {
        let node = self.node_op(inode, "fsyncdir", ctx)?;
        self.handles.get(inode, handle).map_err(errno)?;
        Ok(self.mount().sync_inode(&*self.inode(&node)?, false)?)
    }

    pub(super) fn do_releasedir(
        &self,
        _ctx: &Context,
        inode: u64,
        _flags: u32,
        handle: u64,
    ) -> io::Result<()> {
        self.handles.remove(inode, handle).map_err(errno)?;
        Ok(())
    }

    fn read_dir(
        &self,
        req: DirRead,
        uid: GuestUid,
        add: &mut dyn FnMut(DirEntry, Option<Entry>) -> io::Result<usize>,
    ) -> io::Result<()> {
        let DirRead {
            inode,
            handle,
            offset,
            size,
            plus,
        } = req;
        let node = self.node(inode)?;
        self.gate(self.domain_of(&node), "readdir", uid)?;
        let h = self.handles.get(inode, handle).map_err(errno)?;
        let Handle::Dir(stream) = &h.handle else {
            return Err(errno(libc::ENOTDIR));
        };
        let mut s = stream.lock().unwrap_or_else(|e| e.into_inner());
        if offset != s.pos {
            if offset == 0 {
                s.dir.rewinddir();
            } else {
                s.dir.seekdir(to_off(offset)?);
            }
            s.pos = offset;
            s.pending = None;
        }
        // Nodes handed out in this reply: if the reply fails, the guest never sees them, so
        // their lookups are given back (the kernel would never FORGET them).
        let mut taken: Vec<u64> = Vec::new();
        let r = self.fill_dir(&node, &mut s, size, plus, add, &mut taken);
        match r {
            Ok(()) => Ok(()),
            // libcephfs failed after some entries were added: they go out, and the error comes
            // again with the next READDIR at the position after them, as on a local filesystem.
            Err((e, false)) if !taken.is_empty() || s.pos != offset => {
                tracing::debug!(%e, "readdir stopped early");
                Ok(())
            }
            Err((e, _)) => {
                for id in taken {
                    self.nodes.forget(id, 1);
                }
                // Back to where this reply started: nothing of it reached the guest.
                if offset == 0 {
                    s.dir.rewinddir();
                } else {
                    s.dir
                        .seekdir(to_off(offset).map_err(|_| errno(libc::EINVAL))?);
                }
                s.pos = offset;
                s.pending = None;
                Err(e)
            }
        }
    }

    /// READDIRPLUS's entry for `name` (with `statx`, and libcephfs's `inode` when it gave
    /// one), listed in directory `node`, and the node it took (whose lookup count the guest
    /// now holds), if any.
    fn plus_entry(
        &self,
        node: &Arc<Node>,
        name: &[u8],
        statx: &ceph_client::Statx,
        inode: Option<ceph_client::Inode>,
        dot: bool,
    ) -> (Option<Entry>, Option<u64>) {
        // A denied domain root is listed, but gets no node (its lookup will be refused).
        let denied = !dot
            && self
                .cfg
                .quarantine
                .as_ref()
                .is_some_and(|g| g.denied(self.child_domain(node, statx).0));
        let bare = Entry {
            inode: 0,
            generation: 0,
            attr: to_stat(statx, &self.cfg.idmap),
            attr_flags: 0,
            attr_timeout: Duration::ZERO,
            entry_timeout: Duration::ZERO,
        };
        match (dot || denied, inode) {
            // "." and ".." carry no node: the kernel does not instantiate them, and ".." of
            // the export root lies outside the export.
            (true, _) | (false, None) => (Some(bare), None),
            (false, Some(inode)) => {
                match self.child_entry(node, name, inode, statx, "readdirplus", None) {
                    Ok(e) => {
                        let id = e.inode;
                        (Some(e), Some(id))
                    }
                    // Not a child of this directory, or at the node limit: listed without a
                    // node (the guest looks the name up when it needs it).
                    Err(_) => (Some(bare), None),
                }
            }
        }
    }

    /// The entries of one READDIR(PLUS) reply. An error says whether it came from `add` (the
    /// reply itself failed: `true`) or from libcephfs.
    fn fill_dir(
        &self,
        node: &Arc<Node>,
        s: &mut DirStream,
        size: u32,
        plus: bool,
        add: &mut dyn FnMut(DirEntry, Option<Entry>) -> io::Result<usize>,
        taken: &mut Vec<u64>,
    ) -> Result<(), (io::Error, bool)> {
        let mut room = to_len(size).map_err(|e| (e, false))?;
        loop {
            let de = match s.pending.take() {
                Some(de) => de,
                None => match s.dir.readdirplus(WANT, 0, plus) {
                    Ok(Some(de)) => Box::new(de),
                    Ok(None) => break,
                    Err(e) => return Err((e.into(), false)),
                },
            };
            // The daemon's own names (open O_TMPFILE files) are not there for the guest.
            if names::is_private(&de.name[..]) {
                s.pos = u64::try_from(de.offset).unwrap_or(0);
                continue;
            }
            // Stop before an entry that does not fit, without taking a node for it.
            let need = dirent_size(de.name.len(), plus);
            if need > room {
                s.pending = Some(de);
                break;
            }
            room -= need;
            let next = u64::try_from(de.offset).unwrap_or(0);
            let dot = names::is_dot_or_dotdot(&de.name[..]);
            let dirent = DirEntry {
                ino: de.statx.stx_ino,
                offset: next,
                type_: u32::from(de.d_type),
                name: &de.name[..],
            };
            let (entry, took) = if plus {
                self.plus_entry(node, &de.name[..], &de.statx, de.inode, dot)
            } else {
                (None, None)
            };
            match add(dirent, entry) {
                Ok(0) => {
                    // Cannot happen while dirent_size matches the server's layout; should it,
                    // the kernel did not take this entry, so neither its lookup count nor its
                    // position.
                    if let Some(id) = took {
                        self.nodes.forget(id, 1);
                    }
                    let back = to_off(s.pos).map_err(|e| (e, false))?;
                    s.dir.seekdir(back);
                    break;
                }
                Ok(_) => taken.extend(took),
                Err(e) => {
                    if let Some(id) = took {
                        self.nodes.forget(id, 1);
                    }
                    return Err((e, true));
                }
            }
            s.pos = next;
        }
        Ok(())
    }
}
