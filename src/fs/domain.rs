//! Quarantine domains: which domain a node lies in ([`crate::quarantine`]), stamped on the node
//! with the gate generation it holds for and derived again from the node's real ancestry after
//! the gate changed, and the gate every request passes (`node_op`, `dir_op`, `gate`).

use std::ffi::CStr;
use std::io;
use std::sync::Arc;

use ceph_client::{Inode, Statx, CEPH_STATX_INO, CEPH_STATX_NLINK};

use crate::idmap::GuestUid;

use super::nodes::{Vino, NOSNAP, ROOT_ID};
use super::perms::Caller;
use super::{errno, kind_of, vino_of, CephFs, Link, Node, CEPH_INO_ROOT, PATH_MAX, WANT};

/// Where a walk up a directory's ancestry ended ([`CephFs::walk_up`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Up {
    /// At the export root.
    Root,
    /// At the root of this quarantine domain, below the export root.
    Domain(u32),
    /// Anywhere else: outside the export, or not established.
    Outside,
}

impl CephFs {
    /// Quarantine: the domain of `node` now, and the gate generation it holds for. The hot
    /// path is one atomic load and a comparison with the gate's generation; only after the
    /// gate changed (a domain root registered, a flag flipped, a watcher round while anything
    /// is denied) is the domain derived again, from the node's real ancestry.
    #[inline]
    pub(super) fn domain_stamp(&self, node: &Node) -> (u32, u32) {
        let Some(g) = &self.cfg.quarantine else {
            return (0, 0);
        };
        let generation = g.generation();
        let (d, at) = node.domain_at();
        if at == generation {
            return (d, generation);
        }
        let d = self.derive_domain(node, g, generation);
        node.set_domain(d, generation);
        (d, generation)
    }

    #[inline]
    pub(super) fn domain_of(&self, node: &Node) -> u32 {
        self.domain_stamp(node).0
    }

    /// Quarantine: the domain of a child found in `parent` (looked up, listed, created) — the
    /// parent's, unless the child is the root directory of a domain (a lock-free table probe,
    /// directories only) — and the generation it holds for.
    #[inline]
    pub(super) fn child_domain(&self, parent: &Node, st: &Statx) -> (u32, u32) {
        let (d, generation) = self.domain_stamp(parent);
        match &self.cfg.quarantine {
            Some(g) if kind_of(st) == libc::S_IFDIR => {
                (g.anchor(st.stx_ino).unwrap_or(d), generation)
            }
            // A file with other links may have one in a denied domain (fail closed).
            Some(g) if st.stx_nlink > 1 && g.near_denied() => {
                (crate::quarantine::UNSURE, generation)
            }
            _ => (d, generation),
        }
    }

    /// Derive the domain of `node` from where it is: up the chain of nodes it was found in
    /// (see [`nodes::Node::link`]), to the first domain root at or below the export root
    /// ([`crate::quarantine::Gate::anchor`]: another tenant's subvolume root is no anchor) or
    /// the export root. Each link of
    /// a head inode is confirmed by looking its name up in its parent (answered from
    /// libcephfs's cache while the MDS has not told it otherwise, i.e. unless another client
    /// renamed or removed it); the guest's own renames move the link with the node, and a
    /// file goes on through any of the names it keeps that holds. A link that no longer
    /// holds (of a file: none of its names, while it still has a link somewhere), a chain
    /// that ends elsewhere, or a file with more links while a domain near the export is
    /// denied (its other names may lie in it) gives [`crate::quarantine::UNSURE`], which is
    /// always denied. A file with no link left (unlinked, or replaced by a rename, while the
    /// guest keeps it open) can no longer move: it stays in the directory it was last in.
    ///
    /// The directories passed on the way up are stamped too, and the walk stops at the first
    /// one already derived in this generation: after a gate change each directory costs one
    /// lookup, and each file one more.
    fn derive_domain(&self, node: &Node, g: &crate::quarantine::Gate, generation: u32) -> u32 {
        use crate::quarantine::UNSURE;
        let perm = self.perms.root();
        // The ancestors passed, nearest first; all of them lie between `node` and where the
        // walk ended, so they get the same domain (none of them is a domain root).
        let mut chain: Vec<Arc<Node>> = Vec::new();
        let mut domain = UNSURE;
        for _ in 0..PATH_MAX {
            let n: &Node = chain.last().map_or(node, |p| &**p);
            if !chain.is_empty() {
                let (d, at) = n.domain_at();
                if at == generation {
                    domain = d;
                    break;
                }
            }
            if n.id == ROOT_ID {
                domain = g.root_domain();
                break;
            }
            if n.is_dir() {
                if let Some(d) = g.anchor(n.vino.ino) {
                    domain = d;
                    break;
                }
            }
            let head = n.vino.snapid == NOSNAP;
            let Some(link) = n.link() else {
                // A directory found by "..": its ancestry as libcephfs knows it.
                if n.is_dir() && head {
                    domain = match self.inode(n).map(|i| self.walk_up(&i, n.vino.ino, Some(g))) {
                        Ok(Up::Root) => g.root_domain(),
                        Ok(Up::Domain(d)) => d,
                        Ok(Up::Outside) | Err(_) => UNSURE,
                    };
                }
                break;
            };
            let nlink = || {
                self.inode(n)
                    .and_then(|i| Ok(self.mount().getattr(&i, CEPH_STATX_NLINK, 0, &perm)?))
                    .map(|st| st.stx_nlink)
                    .ok()
            };
            let up = if !head || self.link_holds(&link, n.vino, &perm) {
                link
            } else if n.is_dir() {
                break;
            } else {
                let names = n.links();
                match names
                    .iter()
                    .skip(1)
                    .find(|l| self.link_holds(l, n.vino, &perm))
                {
                    Some(l) => l.clone(),
                    None if nlink() == Some(0) => link,
                    None => break,
                }
            };
            if head && !n.is_dir() && g.near_denied() && !matches!(nlink(), Some(0 | 1)) {
                break;
            }
            chain.push(up.parent);
        }
        for p in &chain {
            p.set_domain(domain, generation);
        }
        domain
    }

    /// Whether `link.name` in `link.parent` is still inode `vino`.
    pub(super) fn link_holds(&self, link: &Link, vino: Vino, perm: &ceph_client::UserPerm) -> bool {
        let Ok(parent) = self.inode(&link.parent) else {
            return false;
        };
        match self
            .mount()
            .lookup(&parent, &link.name, CEPH_STATX_INO, 0, perm)
        {
            Ok((_, st)) => vino_of(&st) == vino,
            Err(_) => false,
        }
    }

    /// Walk the ancestry of head directory `start` (inode `ino`) with libcephfs's ".." (for a
    /// head directory its one parent dentry as libcephfs last learnt it, or the MDS's
    /// LOOKUPPARENT; after another client's rename it can still be the old parent), until the
    /// export root, or, with a gate, the first domain root at or below the export root. Anything else (the filesystem
    /// root, a loop, an error, too deep) is `Outside`. Cold path: ".." of a directory whose
    /// own link no longer holds, and domain derivation of a directory found that way.
    pub(super) fn walk_up(
        &self,
        start: &Inode,
        ino: u64,
        g: Option<&crate::quarantine::Gate>,
    ) -> Up {
        /// Deeper than any path CephFS serves (PATH_MAX / 2 components).
        const MAX_DEPTH: usize = PATH_MAX / 2;
        let root = self.nodes.root_vino();
        if ino == root.ino {
            return Up::Root;
        }
        let perm = self.perms.root();
        let mut cur: Option<Inode> = None;
        let mut cur_ino = ino;
        for _ in 0..MAX_DEPTH {
            let at = cur.as_ref().unwrap_or(start);
            let (p, st) = match self.mount().lookup(at, c"..", CEPH_STATX_INO, 0, &perm) {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(%e, ino = cur_ino, "walking up a directory's ancestry");
                    return Up::Outside;
                }
            };
            let v = vino_of(&st);
            if v == root {
                return Up::Root;
            }
            if v.snapid != NOSNAP || v.ino == cur_ino || v.ino == CEPH_INO_ROOT {
                return Up::Outside;
            }
            if let Some(d) = g.and_then(|g| g.anchor(v.ino)) {
                return Up::Domain(d);
            }
            cur_ino = v.ino;
            cur = Some(p);
        }
        Up::Outside
    }

    /// Quarantine gate: EACCES (and a rate-limited audit line) when `domain` is denied. For
    /// domain 0 (outside every quarantine-capable directory) this is one comparison.
    #[inline]
    pub(super) fn gate(&self, domain: u32, op: &'static str, uid: GuestUid) -> io::Result<()> {
        if domain == 0 {
            return Ok(());
        }
        match &self.cfg.quarantine {
            Some(g) if g.denied(domain) => {
                g.audit(domain, op, uid);
                Err(errno(libc::EACCES))
            }
            _ => Ok(()),
        }
    }

    /// The node `id`, if the caller may touch it now (stale id: ESTALE; quarantined: EACCES).
    pub(super) fn node_op(&self, id: u64, op: &'static str, ctx: &Caller) -> io::Result<Arc<Node>> {
        let node = self.node(id)?;
        self.gate(self.domain_of(&node), op, ctx.guest_uid())?;
        Ok(node)
    }

    /// [`Self::node_op`] for a node a request names as a directory (the parent of a name): a
    /// non-directory is ENOTDIR before libcephfs sees it. libcephfs opens a directory
    /// structure on whatever inode it is handed as a parent, and aborts the daemon
    /// (`Inode::open_dir`: `ceph_assert(dentries.size() < 2)`) when that inode is a file with
    /// two cached names; the guest kernel never sends such a request, a hostile guest can.
    pub(super) fn dir_op(&self, id: u64, op: &'static str, ctx: &Caller) -> io::Result<Arc<Node>> {
        let node = self.node_op(id, op, ctx)?;
        if !node.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        Ok(node)
    }

    /// Whether `name` in `dir` is the root of a denied domain (rename must not move a
    /// quarantined directory away). Only asked while some domain is denied.
    pub(super) fn names_denied_root(
        &self,
        dir: &Node,
        name: &CStr,
        perm: &ceph_client::UserPerm,
    ) -> bool {
        let Some(g) = &self.cfg.quarantine else {
            return false;
        };
        if !g.any_denied() {
            return false;
        }
        let Ok(inode) = self.inode(dir) else {
            return false;
        };
        match self.mount().lookup(&inode, name, WANT, 0, perm) {
            Ok((_, st)) => g.denied(self.child_domain(dir, &st).0),
            Err(_) => false,
        }
    }
}
