//! Entries: names in directories. LOOKUP (also of "." and ".."), the nodes a name leads to
//! (entered only if they can be a child of the directory asked, so the export boundary holds),
//! the snapshot policy on `.snap` names, and the namespace changes: SYMLINK, MKNOD, MKDIR,
//! UNLINK, RMDIR, RENAME, LINK (and READLINK).

use super::limits::Table;
use super::nodes::ROOT_ID;
use std::ffi::CStr;
use std::ffi::CString;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use ceph_client::{Inode, Statx, CEPH_SNAPDIR, CEPH_STATX_INO, CEPH_STATX_MODE, CEPH_STATX_NLINK};
use fuse_backend_rs::api::filesystem::Entry;

use crate::idmap::GuestUid;

use super::attr::to_stat;
use super::domain::Up;
use super::names::Use;
use super::nodes::{NewNode, Vino, NOSNAP};
use super::perms::Caller;
use super::policy::CacheMode;
use super::{
    errno, kind_of, names, nodes, vino_of, CephFs, Link, Node, CEPH_INO_ROOT, PATH_MAX, WANT,
};

/// What a rename would replace.
enum RenameTarget {
    /// Nothing: the new name is free.
    None,
    /// Another link of the file being renamed (POSIX: the rename does nothing).
    Same,
    /// A non-directory that keeps other names after the rename (see [`side`]).
    LinkedFile,
    /// Anything else.
    Other,
}

/// Whether inode `child` is what libcephfs can return for a name (other than "." and "..")
/// in directory `parent`: in a head directory a head inode other than itself (and never the
/// filesystem's root) or its own `.snap`; in a `.snap` directory a snapshot of the same
/// directory; in a snapshot another inode of the same snapshot. Names only ever lead down,
/// so with ".." kept from libcephfs this keeps every node inside the export; the check makes
/// it hold whatever libcephfs answers, at the cost of a few comparisons.
fn is_child(parent: Vino, child: Vino) -> bool {
    match parent.snapid {
        NOSNAP => {
            (child.snapid == NOSNAP && child.ino != parent.ino && child.ino != CEPH_INO_ROOT)
                || (child.snapid == CEPH_SNAPDIR && child.ino == parent.ino)
        }
        CEPH_SNAPDIR => {
            child.ino == parent.ino && child.snapid != NOSNAP && child.snapid != CEPH_SNAPDIR
        }
        snap => child.snapid == snap && child.ino != parent.ino && child.ino != CEPH_INO_ROOT,
    }
}

impl CephFs {
    /// Enter an inode libcephfs found in `parent` (lookup of a name, a READDIRPLUS entry, or
    /// one just created there) and build the reply entry (one lookup count for the kernel).
    /// The inode must be what a child of `parent` can be ([`is_child`]), so a node handed to
    /// the guest never names an inode above the one it came from. With `gate`, a child in a
    /// denied domain is refused (its reference released, nothing enters the table).
    /// `op` names the request for the node limit's accounting ([`Self::insert_node`]).
    pub(super) fn child_entry(
        &self,
        parent: &Arc<Node>,
        name: &[u8],
        inode: Inode,
        st: &Statx,
        op: &'static str,
        gate: Option<(&'static str, GuestUid)>,
    ) -> io::Result<Entry> {
        let vino = vino_of(st);
        // Snapshot policy `hidden`: a `.snap` directory does not exist, and never enters the
        // table, not even for a moment (its node id would lead into the snapshots).
        if vino.snapid == CEPH_SNAPDIR && !self.cfg.snapshots.visible() {
            return Err(errno(libc::ENOENT));
        }
        if !is_child(parent.vino, vino) {
            tracing::warn!(
                parent = ?parent.vino,
                child = ?vino,
                "libcephfs returned an inode that cannot be a child of the directory asked; \
                 refused (the export boundary holds)"
            );
            return Err(errno(libc::EIO));
        }
        let domain = self.child_domain(parent, st);
        if let Some((op, uid)) = gate {
            self.gate(domain.0, op, uid)?;
        }
        let node = self.insert_node(
            NewNode {
                vino,
                kind: kind_of(st),
                domain,
                link: Some(Link {
                    parent: parent.clone(),
                    name: CString::new(name).map_err(|_| errno(libc::EINVAL))?,
                }),
                inode,
            },
            op,
        )?;
        Ok(self.entry_for(&node, st))
    }

    /// One more lookup of a node the guest may hold already (".", "..", LINK): the same node
    /// if it is still in the table, else the same inode entered again with its parent.
    fn same_entry(&self, node: &Arc<Node>, st: &Statx) -> io::Result<Entry> {
        let n = self.insert_node(
            NewNode {
                vino: node.vino,
                kind: node.kind,
                domain: self.domain_stamp(node),
                link: node.link(),
                inode: self.inode(node)?.try_clone()?,
            },
            "lookup",
        )?;
        Ok(self.entry_for(&n, st))
    }

    /// Enter a node; ENFILE, counted, when the guest holds `--max-nodes` nodes and this
    /// would be a new one.
    fn insert_node(&self, new: NewNode<Inode>, op: &'static str) -> io::Result<Arc<Node>> {
        let node = self.nodes.insert(new).map_err(|e| {
            self.limits.refused(Table::Nodes, self.cfg.max_nodes, op);
            errno(e)
        })?;
        self.bound_held_inodes();
        Ok(node)
    }

    /// Snapshot policy: EROFS for a namespace change in a `.snap` directory unless the guest
    /// may manage snapshots.
    pub(super) fn snapdir_change(&self, dir: &Node) -> io::Result<()> {
        if dir.vino.snapid == CEPH_SNAPDIR && !self.cfg.snapshots.writable() {
            return Err(errno(libc::EROFS));
        }
        Ok(())
    }

    pub(super) fn entry_for(&self, node: &Node, st: &Statx) -> Entry {
        let ttl = self.policy.ttl(self.class(node));
        let mut attr = to_stat(st, &self.cfg.idmap);
        self.tmpfile_nlink(node.id, &mut attr.st_nlink);
        Entry {
            inode: node.id,
            generation: 0,
            attr,
            attr_flags: 0,
            attr_timeout: ttl.attr,
            entry_timeout: ttl.entry,
        }
    }

    /// What a rename of `oldname` in `old` to `newname` in `new` would replace. Both names
    /// were just looked up by the guest, so libcephfs answers from its cache (the link count
    /// from the MDS if it lacks the caps that keep it current).
    fn rename_target(
        &self,
        old: &Node,
        from: &ceph_client::Statx,
        new: &Node,
        newname: &CStr,
        perm: &ceph_client::UserPerm,
    ) -> io::Result<RenameTarget> {
        let want = CEPH_STATX_INO | CEPH_STATX_NLINK | CEPH_STATX_MODE;
        match self
            .mount()
            .lookup(&*self.inode(new)?, newname, want, 0, perm)
        {
            Ok(_) if old.vino.snapid != nodes::NOSNAP || new.vino.snapid != nodes::NOSNAP => {
                Ok(RenameTarget::Other)
            }
            Ok((_, to)) if vino_of(from) == vino_of(&to) => Ok(RenameTarget::Same),
            Ok((_, to)) if kind_of(&to) != libc::S_IFDIR && to.stx_nlink > 1 => {
                Ok(RenameTarget::LinkedFile)
            }
            Ok(_) => Ok(RenameTarget::Other),
            Err(e) if e.errno() == libc::ENOENT => Ok(RenameTarget::None),
            Err(e) => Err(e.into()),
        }
    }

    /// After a rename between two directories: libcephfs 16 keeps the attributes of the
    /// directory an entry left as they were (the MDS's reply describes the target side only),
    /// its mtime and ctime, and
    /// for a directory moved out, its link count (`mkdir P Q P/d; mv P/d Q/d` left P at 3;
    /// the MDS has 2). Reading a directory-statistics vxattr makes libcephfs fetch the inode
    /// from the MDS whatever caps it holds (ll_getattr has no "force sync" in 16:
    /// AT_STATX_FORCE_SYNC is EINVAL), and the reply refreshes its cache. Done at once: the
    /// guest may next see the directory through LOOKUP or READDIRPLUS as well as GETATTR.
    /// One MDS request per rename between directories; a rename within one is described
    /// fully by the reply.
    fn after_rename(&self, old: &Node, new: &Node) {
        if old.id == new.id {
            return;
        }
        let root = self.perms.root();
        let mut buf = [0u8; 32];
        let got = self.inode(old).and_then(|i| {
            Ok(self
                .mount()
                .getxattr(&i, c"ceph.dir.subdirs", &mut buf, &root)?)
        });
        if let Err(e) = got {
            tracing::debug!(%e, ino = old.vino.ino, "refreshing a directory after a rename");
        }
    }

    fn lookup_name(&self, parent: &Arc<Node>, name: &CStr, ctx: &Caller) -> io::Result<Entry> {
        let perm = self.perm(ctx);
        let bytes = name.to_bytes();
        if bytes == b"." {
            let st = self
                .mount()
                .getattr(&*self.inode(parent)?, WANT, 0, &perm)?;
            return self.same_entry(parent, &st);
        }
        // ".." never reaches libcephfs from the guest: see `lookup_parent`.
        if bytes == b".." {
            return self.lookup_parent(parent, ctx);
        }
        // Snapshot policy `hidden`: the snapshot directory's name is not there; libcephfs is
        // not asked (see `child_entry`).
        if bytes == &*self.snapdir && !self.cfg.snapshots.visible() {
            return Err(errno(libc::ENOENT));
        }
        // The daemon's own names (open O_TMPFILE files) are not there for the guest.
        if names::is_private(bytes) {
            return Err(errno(libc::ENOENT));
        }
        let (inode, st) = self
            .mount()
            .lookup(&*self.inode(parent)?, name, WANT, 0, &perm)?;
        self.child_entry(
            parent,
            bytes,
            inode,
            &st,
            "lookup",
            Some(("lookup", ctx.guest_uid())),
        )
    }

    /// LOOKUP "..": the export root's is the export root; a `.snap` directory's is the
    /// directory it belongs to; a snapshot root's is its `.snap`; any other node on the
    /// snapshot side's is the node it was found in (a snapshot does not change); a head
    /// directory's is the node it was found in while its name there still leads to it.
    /// Only otherwise (another client renamed it) is libcephfs asked for a head directory's
    /// ".." (its one parent dentry), and the answer must lie below the export root
    /// ([`Self::walk_up`]): a directory moved out of the export has no parent the guest may
    /// see (EACCES). libcephfs's own ".." of the export root's `.snap` is the export's
    /// parent (issue 13), hence never asked there.
    fn lookup_parent(&self, node: &Arc<Node>, ctx: &Caller) -> io::Result<Entry> {
        let perm = self.perm(ctx);
        let link = node.link();
        let up = if node.id == ROOT_ID {
            node.clone()
        } else if !node.is_dir() {
            // Non-directories have no ".." (libcephfs: ENOTDIR); the kernel never asks.
            return Err(errno(libc::ENOTDIR));
        } else if node.vino.snapid != NOSNAP {
            link.ok_or_else(|| errno(libc::ESTALE))?.parent
        } else if let Some(l) = link.filter(|l| self.link_holds(l, node.vino, &perm)) {
            l.parent
        } else {
            let (inode, st) = self
                .mount()
                .lookup(&*self.inode(node)?, c"..", WANT, 0, &perm)?;
            let vino = vino_of(&st);
            if vino == self.nodes.root_vino() {
                self.nodes.get(ROOT_ID).ok_or_else(|| errno(libc::ESTALE))?
            } else {
                if vino.snapid != NOSNAP
                    || kind_of(&st) != libc::S_IFDIR
                    || self.walk_up(&inode, vino.ino, None) != Up::Root
                {
                    tracing::debug!(?vino, "\"..\" of a directory lies outside the export");
                    return Err(errno(libc::EACCES));
                }
                let domain = match &self.cfg.quarantine {
                    Some(g) => {
                        let generation = g.generation();
                        let d = match g.domain_of_root(vino.ino) {
                            Some(d) => d,
                            None => match self.walk_up(&inode, vino.ino, Some(g)) {
                                Up::Root => g.root_domain(),
                                Up::Domain(d) => d,
                                Up::Outside => crate::quarantine::UNSURE,
                            },
                        };
                        (d, generation)
                    }
                    None => (0, 0),
                };
                self.gate(domain.0, "lookup", ctx.guest_uid())?;
                let n = self.insert_node(
                    NewNode {
                        vino,
                        kind: kind_of(&st),
                        domain,
                        link: None,
                        inode,
                    },
                    "lookup",
                )?;
                return Ok(self.entry_for(&n, &st));
            }
        };
        self.gate(self.domain_of(&up), "lookup", ctx.guest_uid())?;
        let st = self.mount().getattr(&*self.inode(&up)?, WANT, 0, &perm)?;
        self.same_entry(&up, &st)
    }

    pub(super) fn do_lookup(&self, ctx: &Caller, parent: u64, name: &CStr) -> io::Result<Entry> {
        names::check_name(name, Use::Lookup).map_err(errno)?;
        let parent = self.dir_op(parent, "lookup", ctx)?;
        match self.lookup_name(&parent, name, ctx) {
            // A negative entry lets the guest cache "not there" for as long as a positive one.
            Err(e)
                if e.raw_os_error() == Some(libc::ENOENT) && self.cfg.cache != CacheMode::Never =>
            {
                Ok(Entry {
                    inode: 0,
                    generation: 0,
                    attr: to_stat(&Statx::default(), &self.cfg.idmap),
                    attr_flags: 0,
                    attr_timeout: Duration::ZERO,
                    entry_timeout: self.policy.ttl(self.class(&parent)).entry,
                })
            }
            r => r,
        }
    }

    pub(super) fn do_readlink(&self, ctx: &Caller, inode: u64) -> io::Result<Vec<u8>> {
        let node = self.node_op(inode, "readlink", ctx)?;
        Ok(self
            .mount()
            .readlink(&*self.inode(&node)?, &self.perm(ctx))?)
    }

    pub(super) fn do_symlink(
        &self,
        ctx: &Caller,
        linkname: &CStr,
        parent: u64,
        name: &CStr,
    ) -> io::Result<Entry> {
        self.changed_name(name, names::Change::New)?;
        if linkname.to_bytes().len() >= PATH_MAX {
            return Err(errno(libc::ENAMETOOLONG));
        }
        let parent = self.dir_op(parent, "symlink", ctx)?;
        self.snapdir_change(&parent)?;
        self.node_room("symlink")?;
        let (inode, st) = self.mount().symlink(
            &*self.inode(&parent)?,
            name,
            linkname,
            WANT,
            0,
            &self.perm(ctx),
        )?;
        self.child_entry(&parent, name.to_bytes(), inode, &st, "symlink", None)
    }

    pub(super) fn do_mknod(
        &self,
        ctx: &Caller,
        parent: u64,
        name: &CStr,
        mode: u32,
        rdev: u32,
    ) -> io::Result<Entry> {
        self.changed_name(name, names::Change::New)?;
        mknod_allowed(mode, self.cfg.allow_device_nodes)?;
        let parent = self.dir_op(parent, "mknod", ctx)?;
        self.snapdir_change(&parent)?;
        self.node_room("mknod")?;
        let (inode, st) = self.mount().mknod(
            &*self.inode(&parent)?,
            name,
            mode,
            u64::from(rdev),
            WANT,
            0,
            &self.perm(ctx),
        )?;
        self.child_entry(&parent, name.to_bytes(), inode, &st, "mknod", None)
    }

    pub(super) fn do_mkdir(
        &self,
        ctx: &Caller,
        parent: u64,
        name: &CStr,
        mode: u32,
    ) -> io::Result<Entry> {
        self.changed_name(name, names::Change::New)?;
        let parent = self.dir_op(parent, "mkdir", ctx)?;
        self.snapdir_change(&parent)?;
        self.node_room("mkdir")?;
        let (inode, st) = self.mount().mkdir(
            &*self.inode(&parent)?,
            name,
            mode & 0o7777,
            WANT,
            0,
            &self.perm(ctx),
        )?;
        self.child_entry(&parent, name.to_bytes(), inode, &st, "mkdir", None)
    }

    pub(super) fn do_unlink(&self, ctx: &Caller, parent: u64, name: &CStr) -> io::Result<()> {
        self.changed_name(name, names::Change::Unlink)?;
        let parent = self.dir_op(parent, "unlink", ctx)?;
        self.snapdir_change(&parent)?;
        self.mount()
            .unlink(&*self.inode(&parent)?, name, &self.perm(ctx))?;
        Ok(())
    }

    pub(super) fn do_rmdir(&self, ctx: &Caller, parent: u64, name: &CStr) -> io::Result<()> {
        self.changed_name(name, names::Change::Rmdir)?;
        let parent = self.dir_op(parent, "rmdir", ctx)?;
        self.snapdir_change(&parent)?;
        let perm = self.perm(ctx);
        if self.names_denied_root(&parent, name, &perm) {
            return Err(errno(libc::EACCES));
        }
        self.mount().rmdir(&*self.inode(&parent)?, name, &perm)?;
        Ok(())
    }

    pub(super) fn do_rename(
        &self,
        ctx: &Caller,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.changed_name(oldname, names::Change::Rename)?;
        self.changed_name(newname, names::Change::Rename)?;
        let old = self.dir_op(olddir, "rename", ctx)?;
        let new = self.dir_op(newdir, "rename", ctx)?;
        self.snapdir_change(&old)?;
        self.snapdir_change(&new)?;
        let perm = self.perm(ctx);
        // Moving a quarantined directory itself (or replacing one) is refused as well.
        if self.names_denied_root(&old, oldname, &perm)
            || self.names_denied_root(&new, newname, &perm)
        {
            return Err(errno(libc::EACCES));
        }
        // Linux's order: a missing source is ENOENT before anything else. The source is
        // looked up first for libcephfs too: a rename of a name that does not exist can leave
        // its dentry marked as being renamed, and every later lookup of the name then waits
        // forever (ceph-client/tests/quirks.rs).
        let want = CEPH_STATX_INO | CEPH_STATX_MODE | CEPH_STATX_NLINK;
        let (_, from) = self
            .mount()
            .lookup(&*self.inode(&old)?, oldname, want, 0, &perm)?;
        match flags {
            // POSIX: a rename between two links of one file (or of a name onto itself) does
            // nothing. Linux's VFS checks it before asking the filesystem, but a guest whose
            // dentries are stale (another client linked the names) sends it, and libcephfs
            // then dropped the source name from its cache though the MDS kept it.
            0 => match self.rename_target(&old, &from, &new, newname, &perm)? {
                RenameTarget::Same => return Ok(()),
                // See `side`: through the main session, libcephfs would hide the other names.
                RenameTarget::LinkedFile => {
                    if let Some(r) = self.side.rename(
                        (old.vino.ino, oldname),
                        (new.vino.ino, newname),
                        from.stx_ino,
                        &perm,
                    ) {
                        r?;
                        self.renamed(&old, oldname, &new, newname, &from);
                        self.after_rename(&old, &new);
                        return Ok(());
                    }
                }
                RenameTarget::None | RenameTarget::Other => {}
            },
            // libcephfs has no atomic "rename unless the target exists": check, then rename.
            // Another client creating the target between the two steps is not caught; within
            // one guest the kernel's directory locks serialise the two.
            f if f == libc::RENAME_NOREPLACE => {
                match self
                    .mount()
                    .lookup(&*self.inode(&new)?, newname, 0, 0, &perm)
                {
                    Ok(_) => return Err(errno(libc::EEXIST)),
                    Err(e) if e.errno() == libc::ENOENT => {}
                    Err(e) => return Err(e.into()),
                }
            }
            // RENAME_EXCHANGE cannot be done atomically through libcephfs; WHITEOUT is overlayfs'.
            _ => return Err(errno(libc::EINVAL)),
        }
        self.mount().rename(
            &*self.inode(&old)?,
            oldname,
            &*self.inode(&new)?,
            newname,
            &perm,
        )?;
        self.renamed(&old, oldname, &new, newname, &from);
        self.after_rename(&old, &new);
        self.forget_stale_source(&old, oldname, from.stx_ino, &perm);
        self.unhide_returned(&new, newname, from.stx_ino);
        Ok(())
    }

    /// After the main session put the file `ino` at `dir/name` (RENAME, LINK): if a rename
    /// through the second session took that very name from that file, the main session's
    /// cached listing of `dir` misses it ([`super::side::SideClient::vacated`]); a refresh of the
    /// directory through the second session makes the MDS take back the main session's
    /// shared cap on it, and the next listing asks the MDS.
    fn unhide_returned(&self, dir: &Node, name: &CStr, ino: u64) {
        if !self.side.vacated(dir.vino.ino, name, ino) {
            return;
        }
        let refreshed = self.side.refresh_dir(dir.vino.ino, &self.perms.root());
        tracing::debug!(
            dir = dir.vino.ino,
            ino,
            refreshed = ?refreshed.as_ref().map(|r| r.as_ref().map_err(|e| e.to_string())),
            "a file came back to a name a second-session rename took from it: directory \
             refreshed"
        );
    }

    /// After the guest renamed `oldname` in `old` (the inode `from`) to `newname` in `new`:
    /// the moved node, if the guest holds it, is found at its new name from now on, in the
    /// domain of its new place. The guest's kernel moves its dentry and sends no LOOKUP, and
    /// its open descriptors and cwd never walk the new name: left at the old one, the link
    /// would fail at the gate's next change (someone else's quarantine, a subvolume created)
    /// and deny the guest its own files. A node the rename replaced keeps its names; the one
    /// it lost no longer holds, and the derivation goes on through its others or, with no
    /// link left, stays where it was (see `derive_domain`).
    fn renamed(&self, old: &Node, oldname: &CStr, new: &Arc<Node>, newname: &CStr, from: &Statx) {
        let Some(node) = self.nodes.find(vino_of(from)) else {
            return;
        };
        node.renamed(
            old.id,
            oldname,
            Link {
                parent: new.clone(),
                name: newname.to_owned(),
            },
        );
        let (d, generation) = self.child_domain(new, from);
        node.set_domain(d, generation);
    }

    /// After a rename through the main session: libcephfs 16 has been seen to keep the source
    /// name in its cache of the source directory, pointing at the moved file, while it holds
    /// the directory as completely known (Fsx caps, COMPLETE): listings and lookups of the
    /// guest then showed a name that is gone, for as long as the caps stayed (fscheck, cache
    /// metadata, seed 2189807567708067814, operation 28682 of the replay; debug_client 10
    /// showed the listing served from the cache with the moved inode). If the cached answer
    /// for the old name is still the moved inode, a setattr of the directory's mtime through
    /// a short second session makes the MDS take back the main session's shared cap, and
    /// with it the complete listing; the next lookup asks the MDS. The check costs no MDS
    /// request while the directory is complete (the usual case after a rename), one lookup
    /// otherwise.
    fn forget_stale_source(
        &self,
        old: &Node,
        oldname: &CStr,
        moved: u64,
        perm: &ceph_client::UserPerm,
    ) {
        let still_listed = || {
            matches!(
                self.inode(old).and_then(|i| {
                    Ok(self.mount().lookup(&i, oldname, CEPH_STATX_INO, 0, perm)?)
                }),
                Ok((_, st)) if st.stx_ino == moved
            )
        };
        if !still_listed() {
            return;
        }
        let root = self.perms.root();
        let fixed = self.side.refresh_dir(old.vino.ino, &root);
        if !still_listed() {
            tracing::debug!(
                dir = old.vino.ino,
                "the source of a rename was still cached in its directory: refreshed"
            );
            return;
        }
        // The guest may now see the old name (lookups, listings) until libcephfs loses the
        // directory's shared cap some other way.
        tracing::warn!(
            dir = old.vino.ino,
            refreshed = ?fixed.as_ref().map(|r| r.as_ref().map_err(|e| e.to_string())),
            "the source of a rename is still cached in its directory after a refresh through \
             the second session: the guest may see the old name until the MDS takes the \
             directory's shared cap"
        );
    }

    pub(super) fn do_link(
        &self,
        ctx: &Caller,
        inode: u64,
        newparent: u64,
        newname: &CStr,
    ) -> io::Result<Entry> {
        self.changed_name(newname, names::Change::New)?;
        let node = self.node_op(inode, "link", ctx)?;
        let parent = self.dir_op(newparent, "link", ctx)?;
        if node.is_dir() {
            // link(2) of a directory; libcephfs would hand it to the MDS.
            return Err(errno(libc::EPERM));
        }
        self.snapdir_change(&parent)?;
        let perm = self.perm(ctx);
        let inode = self.inode(&node)?;
        let dir = self.inode(&parent)?;
        // An O_TMPFILE's private name goes once it has this one (`tmpfile`).
        self.link_node(node.id, || {
            self.mount().link(&inode, &dir, newname, &perm)?;
            Ok(())
        })?;
        let st = self.mount().getattr(&inode, WANT, 0, &perm)?;
        self.unhide_returned(&parent, newname, st.stx_ino);
        // The new name is one more the node keeps (it may outlive the one it was found by).
        self.child_entry(
            &parent,
            newname.to_bytes(),
            inode.try_clone()?,
            &st,
            "link",
            None,
        )
    }
}

/// MKNOD's file types: regular files, FIFOs and sockets, and device nodes only when the operator
/// allows them (other clients that mount CephFS without nodev would open the guest's devices).
/// A directory is EPERM and an unknown type EINVAL, as Linux's mknod(2) answers (`may_mknod`);
/// a device node refused by policy is EPERM, as for a caller without CAP_MKNOD.
fn mknod_allowed(mode: u32, devices: bool) -> io::Result<()> {
    match mode & libc::S_IFMT {
        // Type 0 is a regular file for mknod(2).
        0 | libc::S_IFREG | libc::S_IFIFO | libc::S_IFSOCK => Ok(()),
        libc::S_IFCHR | libc::S_IFBLK if devices => Ok(()),
        libc::S_IFCHR | libc::S_IFBLK | libc::S_IFDIR => Err(errno(libc::EPERM)),
        _ => Err(errno(libc::EINVAL)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_mknod_types_are_filtered() {
        let e = |r: io::Result<()>| r.unwrap_err().raw_os_error();
        for t in [0, libc::S_IFREG, libc::S_IFIFO, libc::S_IFSOCK] {
            assert!(mknod_allowed(t | 0o644, false).is_ok(), "{t:o}");
        }
        for t in [libc::S_IFCHR, libc::S_IFBLK] {
            assert_eq!(e(mknod_allowed(t | 0o600, false)), Some(libc::EPERM));
            assert!(mknod_allowed(t | 0o600, true).is_ok());
        }
        assert_eq!(
            e(mknod_allowed(libc::S_IFDIR | 0o755, true)),
            Some(libc::EPERM)
        );
        for t in [libc::S_IFLNK, 0o110000, 0o070000] {
            assert_eq!(
                e(mknod_allowed(t | 0o755, true)),
                Some(libc::EINVAL),
                "{t:o}"
            );
        }
    }
}
