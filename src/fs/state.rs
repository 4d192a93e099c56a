//! Migration of a guest's FUSE session: the node and handle tables as a [`crate::migration`]
//! state on the source, and their resolution against the cluster on the destination.
//!
//! Node ids are CephFS inode numbers (plus a snapshot id), which any client of the cluster
//! finds again with `ceph_ll_lookup_vino`: the destination, another process with possibly
//! another cephx id, looks every node up by number (immune to renames, no path walk), opens
//! every file handle again with its open flags and every directory stream at its position,
//! before the guest resumes. What it cannot find (deleted meanwhile, access lost) answers
//! ESTALE in the guest, or fails the migration with `--migration-on-error abort`.
//!
//! Locks are not moved: a guest holding a POSIX or BSD lock refuses the migration on the
//! source (libcephfs cannot list a client's locks, and re-taking them on the destination
//! would race with other clients for a moment the guest believes it holds them).
//!
//! # The state is untrusted
//! It comes from the vhost-user frontend, which a guest may have escaped into, while this
//! daemon's key may reach far more than the export (other tenants' trees). So a destination
//! takes nothing on the state's word:
//! - it is bounded by `--max-nodes` and `--max-handles` (and the byte length they allow)
//!   before it is decoded, and refused once the connection served a FUSE session
//!   ([`Migration::note_init`], [`crate::migration::DeviceState::connection_started`]);
//! - every node is proven to lie below the export before it enters the table
//!   ([`CephFs::resolve_below_export`]): a chain of links from the export root, each confirmed
//!   by a lookup of its name, or for a head directory the walk up its ".." to the export root
//!   that LOOKUP of ".." does. A node that cannot be proven is left out (ESTALE in the guest),
//!   as one that cannot be found; a snapshot node is found only down its links, never by
//!   number;
//! - every handle is opened again as the guest caller that opened it, through the id mapping
//!   (the state records it), never as CephFS root on the state's word.
//!
//! A handover predecessor ([`crate::handover`]) is a process of the daemon's own user, which
//! could read its key anyway: its state is bounded, found the same way and its handles are
//! opened as their openers too, but a head node found by number is kept without a proof (a file
//! the guest holds open after another client deleted it has no name left to prove it by, and
//! the predecessor still holds it). This daemon's own session after an eviction likewise.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ceph_client::{Inode, CEPH_STATX_INO, CEPH_STATX_MODE, CEPH_STATX_UID};
use fuse_backend_rs::abi::fuse_abi::FsOptions;
use fuse_backend_rs::api::filesystem::FileSystem;

use crate::idmap::{GuestGid, GuestUid, IdMapping};
use crate::migration::{
    Bounds, HandleKind, HandleState, LoadReport, MigrationError, NodeState, OnError, Opener, State,
};

use super::dir::DirStream;
use super::domain::Up;
use super::names;
use super::nodes::{NewNode, Vino, NOSNAP, ROOT_ID};
use super::open::OpenFile;
use super::perms::Caller;
use super::{errno, kind_of, vino_of, CephFs, Handle, Link, Node};

/// Migration settings and what a session needs to be moved.
#[derive(Debug, Default)]
pub struct Migration {
    /// FUSE INIT flags the guest offered, as `init` got them.
    capable: AtomicU64,
    /// `--migration-on-error abort` (stored as a flag: set once at startup).
    abort_on_error: AtomicBool,
    /// A FUSE session was served on this connection (INIT, or a state loaded): a LOAD is
    /// refused until the next connection starts.
    served: AtomicBool,
}

impl Migration {
    /// Record the guest's INIT flags (`FileSystem::init`, and a state's on load); from now on
    /// this connection serves a session.
    pub(super) fn note_init(&self, capable: FsOptions) {
        self.capable.store(capable.bits(), Ordering::Relaxed);
        self.served.store(true, Ordering::Release);
    }
}

/// The guest caller that opens a handle, as a state records it.
pub(super) fn opener_of(ctx: &Caller) -> Opener {
    Opener {
        uid: ctx.guest_uid().get(),
        gid: ctx.guest_gid().get(),
    }
}

/// Where a state comes from, which decides what is taken on its word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// The vhost-user frontend: untrusted; every node is proven to lie below the export.
    Frontend,
    /// A handover predecessor (a process of the daemon's own user), or this daemon's own
    /// session (recovery): nodes are taken as they were.
    Trusted,
}

/// How [`CephFs::restore_tables`] treats what it cannot bring back.
#[derive(Debug)]
pub(super) enum Restore {
    /// Another daemon's session: lost handles answer ESTALE.
    Migration(Source),
    /// This daemon's own session after an eviction: the handles in `dropped` (writers, lock
    /// holders: their unflushed data and their locks went with the old session) are not
    /// opened again, and they and any other lost handle answer EIO.
    Recovery {
        dropped: std::collections::HashSet<u64>,
    },
}

/// Threads that look the nodes up on the destination.
const RESOLVERS: usize = 8;

/// The lock owner a lock probe asks as: nobody's (a guest's owners are kernel pointers).
const PROBE_OWNER: u64 = u64::MAX;

/// The id mapping's fingerprint: equal rules, equal fingerprints.
fn idmap_fingerprint(ids: &IdMapping) -> u64 {
    crate::migration::fingerprint(format!("{ids:?}").as_bytes())
}

/// Allocated node ids (`nodes`: the top bit, then a counter) a state may name: the counter
/// below 2^62, so that ids allocated after a restored one can never wrap around to 0 or to the
/// export root's id 1, whatever the state says.
fn restorable_id(id: u64) -> bool {
    const ALLOCATED: u64 = 1 << 63;
    id != 0 && (id & ALLOCATED == 0 || id & !ALLOCATED < 1 << 62)
}

/// Handle numbers a state may name: 1..2^63 (a session's own start below 2^62, see
/// `handles`), so that numbers given after a restored one never wrap around to 0 or to a
/// restored one.
fn restorable_fh(fh: u64) -> bool {
    fh != 0 && fh < 1 << 63
}

/// How a node's link (its parent in the state) was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parent {
    /// The export root.
    Root,
    /// The state's node at this index (a directory that was resolved).
    Node(usize),
    /// None, or not one that can hold the node.
    Unusable,
}

/// Whether each node is proven, from what holds of each alone (`base`: walked up to the
/// export root) and of its link (`link_ok`: its name confirmed in `parents`): a node is proven
/// if its base holds, or its link holds and its parent is the export root or proven. Each chain
/// is followed up once, without recursion; a chain that loops proves nothing.
fn propagate(parents: &[Parent], link_ok: &[bool], base: &[bool]) -> Vec<bool> {
    let n = parents.len();
    let mut done: Vec<Option<bool>> = vec![None; n];
    let mut on_path = vec![false; n];
    let mut path = Vec::new();
    for start in 0..n {
        let mut cur = start;
        let result = loop {
            if let Some(v) = done.get(cur).copied().flatten() {
                break v;
            }
            if on_path.get(cur).copied().unwrap_or(true) {
                break false;
            }
            if base.get(cur).copied().unwrap_or(false) {
                break true;
            }
            if !link_ok.get(cur).copied().unwrap_or(false) {
                break false;
            }
            match parents.get(cur) {
                Some(Parent::Root) => break true,
                Some(Parent::Node(j)) => {
                    if let Some(o) = on_path.get_mut(cur) {
                        *o = true;
                    }
                    path.push(cur);
                    cur = *j;
                }
                Some(Parent::Unusable) | None => break false,
            }
        };
        // `cur` ended the walk by itself (base, link, root) unless it was reached again.
        if done.get(cur).copied().flatten().is_none() && !on_path.get(cur).copied().unwrap_or(true)
        {
            if let Some(d) = done.get_mut(cur) {
                *d = Some(result);
            }
        }
        for p in path.drain(..) {
            if let Some(d) = done.get_mut(p) {
                *d = Some(result);
            }
            if let Some(o) = on_path.get_mut(p) {
                *o = false;
            }
        }
    }
    done.into_iter().map(|d| d == Some(true)).collect()
}

/// Where each node's link points: the export root, a directory node of the state (the first
/// of that id), or nothing usable. Taken from the state alone (whether the parent is found is
/// asked when its link is tried).
fn parents_of(nodes: &[NodeState]) -> Vec<Parent> {
    let mut index: HashMap<u64, usize> = HashMap::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        index.entry(n.id).or_insert(i);
    }
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| match n.parent {
            0 => Parent::Unusable,
            ROOT_ID => Parent::Root,
            p => match index.get(&p) {
                Some(&j) if j != i && nodes.get(j).is_some_and(|d| d.kind == libc::S_IFDIR) => {
                    Parent::Node(j)
                }
                _ => Parent::Unusable,
            },
        })
        .collect()
}

/// Entries lost while restoring a state: each counted, the first few logged, the first kept
/// for the report.
struct Losses {
    /// What restores ("migration", "session recovery"), for the log.
    what: &'static str,
    /// What the guest gets for a lost handle.
    errno: i32,
    /// A forged state may lose every one of its entries: the first few are logged.
    logged: u32,
    first: Option<String>,
}

impl Losses {
    fn lost(&mut self, item: String, report_count: &mut usize) {
        let what = self.what;
        *report_count += 1;
        if self.logged < LOST_LOGGED {
            self.logged += 1;
            tracing::warn!(
                "{what}: {item}: the guest gets {} for it",
                std::io::Error::from_raw_os_error(self.errno)
            );
        } else {
            tracing::debug!("{what}: {item}");
        }
        self.first.get_or_insert(item);
    }
}

/// The nodes of a state entered in the table (by id), and what their links need.
struct RestoredNodes {
    restored: HashMap<u64, Arc<Node>>,
    parents: Vec<Parent>,
    link_ok: Vec<bool>,
}

/// What finding a state's nodes works from.
struct Resolving<'a> {
    nodes: &'a [NodeState],
    parents: &'a [Parent],
    perm: &'a ceph_client::UserPerm,
    /// The export root's inode, if it could be had.
    root: Option<&'a Inode>,
}

/// Where following the chains down from the export root left each node.
struct Chains {
    /// Its inode, if a chain reached it.
    found: Vec<Option<io::Result<Inode>>>,
    /// Whether its link was confirmed.
    link_ok: Vec<bool>,
    /// Whether its link was tried.
    tried: Vec<bool>,
}

/// Each of `len` nodes' children by `parents`, and the nodes that hang from the export root.
fn children_of(parents: &[Parent], len: usize) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); len];
    let mut level = Vec::new();
    for (i, p) in parents.iter().enumerate() {
        match p {
            Parent::Root => level.push(i),
            Parent::Node(j) => {
                if let Some(c) = children.get_mut(*j) {
                    c.push(i);
                }
            }
            Parent::Unusable => {}
        }
    }
    (children, level)
}

impl CephFs {
    /// `--migration-on-error`: what a destination does with entries it cannot resolve.
    pub fn set_migration_on_error(&self, on_error: OnError) {
        self.migration
            .abort_on_error
            .store(on_error == OnError::Abort, Ordering::Relaxed);
    }

    /// Handles a migration lost and the guest still holds (ESTALE on every use).
    pub fn stale_handle_count(&self) -> usize {
        self.handles.stale_count()
    }

    /// Whether a lock may be held through `f`: asked of the cluster for handles locks were
    /// taken through (a lock of another client on the same file counts too: refusing is safe).
    fn may_hold_locks(&self, f: &OpenFile) -> bool {
        if f.locked.load(Ordering::Relaxed) {
            let mut fl = libc::flock {
                l_type: i16::try_from(libc::F_WRLCK).unwrap_or(0),
                l_whence: i16::try_from(libc::SEEK_SET).unwrap_or(0),
                l_start: 0,
                l_len: 0,
                l_pid: 0,
            };
            match f.file.getlk(&mut fl, PROBE_OWNER) {
                Ok(()) if i32::from(fl.l_type) == libc::F_UNLCK => {}
                _ => return true,
            }
        }
        if f.flocked.load(Ordering::Relaxed) {
            // No getlk for flock: try to take it exclusively as nobody, and give it back.
            match f.file.flock(libc::LOCK_EX | libc::LOCK_NB, PROBE_OWNER) {
                Ok(()) => {
                    if let Err(e) = f.file.flock(libc::LOCK_UN, PROBE_OWNER) {
                        tracing::warn!(%e, "giving back a flock probe");
                    }
                }
                Err(_) => return true,
            }
        }
        false
    }

    /// The guest's session as a state (see [`crate::migration`]). No request may be running.
    pub fn save_session(&self) -> Result<State, MigrationError> {
        let locked = self
            .handles
            .snapshot()
            .iter()
            .filter(|(_, e)| matches!(&e.handle, Handle::File(f) if self.may_hold_locks(f)))
            .count();
        if locked > 0 {
            return Err(MigrationError::LocksHeld(locked));
        }
        Ok(self.snapshot_session())
    }

    /// The node and handle tables as a state, whatever locks are held.
    pub(super) fn snapshot_session(&self) -> State {
        let handles = self.handles.snapshot();
        let nodes = self
            .nodes
            .snapshot()
            .into_iter()
            .map(|n| {
                let (parent, name) = n
                    .link()
                    .map_or((0, Vec::new()), |l| (l.parent.id, l.name.into_bytes()));
                NodeState {
                    id: n.id,
                    ino: n.vino.ino,
                    snapid: n.vino.snapid,
                    kind: n.kind,
                    lookups: n.lookups(),
                    parent,
                    name,
                }
            })
            .filter(|n| n.lookups > 0)
            .collect();
        let handles = handles
            .into_iter()
            .map(|(fh, e)| HandleState {
                fh,
                node: e.node,
                kind: match &e.handle {
                    Handle::File(f) => HandleKind::File { oflags: f.oflags },
                    Handle::Dir(d) => HandleKind::Dir {
                        pos: d.lock().unwrap_or_else(|e| e.into_inner()).position(),
                    },
                },
            })
            .collect();
        let openers = self
            .handles
            .snapshot()
            .into_iter()
            .map(|(fh, e)| {
                let opener = match &e.handle {
                    Handle::File(f) => f.opener,
                    Handle::Dir(d) => d.lock().unwrap_or_else(|e| e.into_inner()).opener(),
                };
                (fh, opener)
            })
            .collect();
        let root = self.nodes.root_vino();
        State {
            fuse_capable: self.migration.capable.load(Ordering::Relaxed),
            idmap_fingerprint: idmap_fingerprint(&self.cfg.idmap),
            root: (root.ino, root.snapid),
            nodes,
            handles,
            openers,
        }
    }

    /// What this daemon accepts of a state: its node and handle limits.
    fn state_bounds(&self) -> Bounds {
        Bounds {
            max_nodes: self.cfg.max_nodes,
            max_handles: self.cfg.max_handles,
        }
    }

    /// A new frontend connection: a LOAD is accepted again until its first FUSE INIT.
    pub fn connection_started(&self) {
        self.migration.served.store(false, Ordering::Release);
    }

    /// Take over a session saved by another daemon and sent by the frontend (untrusted):
    /// every node is looked up by inode number and proven to lie below the export, every
    /// handle opened again as its opener, before this returns. This daemon must not serve a
    /// session, nor have served one on this connection.
    pub fn load_session(&self, state: &State) -> Result<LoadReport, MigrationError> {
        self.load_from(state, Source::Frontend)
    }

    fn load_from(&self, state: &State, source: Source) -> Result<LoadReport, MigrationError> {
        if self.migration.served.load(Ordering::Acquire) {
            return Err(MigrationError::SessionServed);
        }
        let bounds = self.state_bounds();
        let max_nodes = bounds.max_nodes.saturating_sub(1);
        if state.nodes.len() > max_nodes || state.handles.len() > bounds.max_handles {
            let (what, count, max) = if state.nodes.len() > max_nodes {
                ("nodes besides the root", state.nodes.len(), max_nodes)
            } else {
                ("handles", state.handles.len(), bounds.max_handles)
            };
            return Err(crate::migration::FormatError::OverLimit { what, count, max }.into());
        }
        let root = self.nodes.root_vino();
        if state.root != (root.ino, root.snapid) {
            return Err(MigrationError::OtherExport {
                expected: state.root.0,
                found: root.ino,
            });
        }
        if state.idmap_fingerprint != idmap_fingerprint(&self.cfg.idmap) {
            return Err(MigrationError::IdMapping);
        }
        let (n, h) = (self.nodes.len(), self.handles.len());
        if n > 1 || h > 0 {
            return Err(MigrationError::SessionActive(n, h));
        }
        let abort = self.migration.abort_on_error.load(Ordering::Relaxed);
        // The guest's FUSE session as negotiated with the source (no INIT comes again).
        self.init(FsOptions::from_bits_truncate(state.fuse_capable))?;
        let (report, first_lost) = self.restore_tables(state, &Restore::Migration(source));
        let lost_total = report.lost_nodes + report.lost_handles;
        if abort && lost_total > 0 {
            // Back to an empty session: the destination will not serve this guest.
            self.handles.clear();
            self.nodes.clear();
            return Err(MigrationError::Unresolved {
                lost: lost_total,
                first: first_lost.unwrap_or_default(),
            });
        }
        tracing::info!("migration: session loaded: {report}");
        Ok(report)
    }

    /// Enter `state`'s nodes and handles in the (empty) tables, each resolved against the
    /// current session: what cannot be found (or, from the frontend, proven to lie below the
    /// export) is left out (a node) or answers an errno (a handle: ESTALE after a migration,
    /// EIO after a recovery). The report and the first loss.
    pub(super) fn restore_tables(
        &self,
        state: &State,
        how: &Restore,
    ) -> (LoadReport, Option<String>) {
        let (what, lost_errno, source) = match how {
            Restore::Migration(source) => ("migration", libc::ESTALE, *source),
            Restore::Recovery { .. } => ("session recovery", libc::EIO, Source::Trusted),
        };
        let mut report = LoadReport::default();
        let mut losses = Losses {
            what,
            errno: lost_errno,
            logged: 0,
            first: None,
        };
        let nodes = self.restore_nodes(state, source, &mut losses, &mut report);
        self.restore_links(state, &nodes);
        self.restore_handles(state, how, &nodes.restored, &mut losses, &mut report);
        (report, losses.first)
    }

    /// Enter the nodes of `state` that are found (and, from the frontend, proven to lie below
    /// the export), without their links yet.
    fn restore_nodes(
        &self,
        state: &State,
        source: Source,
        losses: &mut Losses,
        report: &mut LoadReport,
    ) -> RestoredNodes {
        let perm = self.perms.root();
        // Quarantine: every restored node derives its domain again on first use (UNSURE, which
        // is denied, until then; the generation cannot match the gate's current one).
        let domain = self.cfg.quarantine.as_ref().map_or((0, 0), |g| {
            (crate::quarantine::UNSURE, g.generation().wrapping_sub(1))
        });
        let mut restored: HashMap<u64, Arc<Node>> = HashMap::with_capacity(state.nodes.len());
        let parents = parents_of(&state.nodes);
        let (found, proven, link_ok) =
            self.resolve_below_export(&state.nodes, &parents, &perm, source);
        for (i, (n, found)) in state.nodes.iter().zip(found).enumerate() {
            let vino = Vino {
                ino: n.ino,
                snapid: n.snapid,
            };
            let inode = match found {
                Ok(_) if !restorable_id(n.id) => {
                    losses.lost(
                        format!("node {:#x}: not an id this daemon gives", n.id),
                        &mut report.lost_nodes,
                    );
                    continue;
                }
                Ok(_) if !proven.get(i).copied().unwrap_or(false) => {
                    losses.lost(
                        format!(
                            "node {:#x} (inode {:#x}): not proven to lie below the export \
                             (no link that holds from the export root, nor a \"..\" chain to it)",
                            n.id, n.ino
                        ),
                        &mut report.lost_nodes,
                    );
                    continue;
                }
                Ok(inode) => inode,
                Err(e) => {
                    losses.lost(
                        format!("node {:#x} (inode {:#x}): {e}", n.id, n.ino),
                        &mut report.lost_nodes,
                    );
                    continue;
                }
            };
            let new = NewNode {
                vino,
                kind: n.kind,
                domain,
                link: None,
                inode,
            };
            match self.nodes.restore(n.id, new, n.lookups) {
                Ok(node) => {
                    restored.insert(n.id, node);
                }
                Err(e) => losses.lost(
                    format!("node {:#x}: {}", n.id, errno(e)),
                    &mut report.lost_nodes,
                ),
            }
        }
        report.nodes = restored.len();
        RestoredNodes {
            restored,
            parents,
            link_ok,
        }
    }

    /// Links, now that every parent is in: a parent that is not (lost, or only held by a
    /// link on the source), or a link that was not confirmed (a directory proven by its
    /// "..") leaves the node without one, as a directory found by "..".
    fn restore_links(&self, state: &State, nodes: &RestoredNodes) {
        for (i, n) in state.nodes.iter().enumerate() {
            let Some(node) = nodes.restored.get(&n.id) else {
                continue;
            };
            if !nodes.link_ok.get(i).copied().unwrap_or(false) {
                continue;
            }
            let parent = match nodes.parents.get(i) {
                Some(Parent::Root) => self.nodes.get(ROOT_ID),
                Some(Parent::Node(_)) => nodes.restored.get(&n.parent).cloned(),
                _ => None,
            };
            if let (Some(parent), Ok(name)) = (parent, CString::new(n.name.clone())) {
                node.set_link(Some(Link { parent, name }));
            }
        }
    }

    /// Open `state`'s handles again on the restored nodes; one that cannot be (or, after a
    /// recovery, was dropped) is entered stale, to answer the losses' errno.
    fn restore_handles(
        &self,
        state: &State,
        how: &Restore,
        restored: &HashMap<u64, Arc<Node>>,
        losses: &mut Losses,
        report: &mut LoadReport,
    ) {
        for h in &state.handles {
            let node = if h.node == ROOT_ID {
                self.nodes.get(ROOT_ID)
            } else {
                restored.get(&h.node).cloned()
            };
            let dropped = match how {
                Restore::Recovery { dropped } => dropped.contains(&h.fh),
                Restore::Migration(_) => false,
            };
            let opened = match node {
                _ if !restorable_fh(h.fh) => Err(errno(libc::EBADF)),
                None => Err(errno(libc::ESTALE)),
                Some(_) if dropped => Err(errno(libc::EIO)),
                Some(node) => self.reopen(&node, h.kind, state.openers.get(&h.fh).copied()),
            };
            let result =
                opened.and_then(|handle| self.handles.restore(h.fh, h.node, handle).map_err(errno));
            match result {
                Ok(()) => report.handles += 1,
                Err(e) => {
                    if restorable_fh(h.fh) {
                        self.handles.restore_stale(h.fh, h.node, losses.errno);
                    }
                    losses.lost(
                        format!("handle {:#x} of node {:#x}: {e}", h.fh, h.node),
                        &mut report.lost_handles,
                    );
                }
            }
        }
    }

    /// Find every node of a state and, from the frontend, prove it lies below the export: the
    /// inodes (in the order of `nodes`), which are proven (from a trusted source: every one
    /// found), and whose link was confirmed.
    ///
    /// A node is proven by a chain of links from the export root, each confirmed by a lookup of
    /// its name in its parent (a name a request could look up: not "." or "..", nor the
    /// snapshot directory's while snapshots are hidden) that gives that very inode, of the
    /// state's type; a head directory also by the walk up its ".." that LOOKUP of ".." does
    /// ([`CephFs::walk_up`]). Snapshot nodes while snapshots are hidden are never proven.
    ///
    /// The chains are followed down from the export root, level by level, each level's
    /// lookups on [`RESOLVERS`] threads: the lookup that confirms a link also finds the inode,
    /// so a node on a chain that holds costs one MDS request, as one found by number did. What
    /// no chain reaches is then found by number (to walk a directory up, or to report it
    /// lost), and its link tried once its parent is found. A snapshot node is found only
    /// through its links: libcephfs 16 aborts the process (`Client::_lookup_vino`:
    /// `ceph_assert(p != inode_map.end())`) when the MDS answers a lookup by number of a
    /// snapshot id with another version of the inode, which a forged snapid makes it do.
    fn resolve_below_export(
        &self,
        nodes: &[NodeState],
        parents: &[Parent],
        perm: &ceph_client::UserPerm,
        source: Source,
    ) -> (Vec<io::Result<Inode>>, Vec<bool>, Vec<bool>) {
        let root = self.nodes.get(ROOT_ID).and_then(|r| self.inode(&r).ok());
        let r = Resolving {
            nodes,
            parents,
            perm,
            root: root.as_deref(),
        };
        let Chains {
            found,
            mut link_ok,
            tried,
        } = self.follow_chains(&r);
        let (pending, found) = self.find_unreached(&r, found);
        self.retry_links(&r, &pending, &tried, &found, &mut link_ok);
        if source == Source::Trusted {
            let proven = found.iter().map(|f| f.is_ok()).collect();
            return (found, proven, link_ok);
        }
        let proven = self.prove_below_export(&r, &found, &link_ok);
        (found, proven, link_ok)
    }

    /// Down the chains that hold, from the export root: each level's links confirmed (and
    /// their inodes found) on the resolvers.
    fn follow_chains(&self, r: &Resolving) -> Chains {
        let len = r.nodes.len();
        let (children, mut level) = children_of(r.parents, len);
        let mut chains = Chains {
            found: (0..len).map(|_| None).collect(),
            link_ok: vec![false; len],
            tried: vec![false; len],
        };
        // Each node is reached at most once (a loop never is: nothing in it hangs below the
        // root).
        while !level.is_empty() {
            let found = &chains.found;
            let parent_of = |i: usize| -> Option<&Inode> {
                match r.parents.get(i)? {
                    Parent::Root => r.root,
                    Parent::Node(j) => found.get(*j)?.as_ref()?.as_ref().ok(),
                    Parent::Unusable => None,
                }
            };
            let results = self.on_resolvers(level.len(), |k| {
                let i = *level.get(k)?;
                self.confirm_link(r.nodes.get(i)?, parent_of(i)?, r.perm)
            });
            let mut next = Vec::new();
            for (&i, res) in level.iter().zip(results) {
                if let Some(t) = chains.tried.get_mut(i) {
                    *t = true;
                }
                if let (Some(inode), Some(f), Some(l)) = (
                    res.flatten(),
                    chains.found.get_mut(i),
                    chains.link_ok.get_mut(i),
                ) {
                    *f = Some(Ok(inode));
                    *l = true;
                    next.extend(children.get(i).into_iter().flatten().copied());
                }
            }
            level = next;
        }
        chains
    }

    /// What no chain reached, by number: those nodes' indexes, and every node's inode (or
    /// why it was not found).
    fn find_unreached(
        &self,
        r: &Resolving,
        mut found: Vec<Option<io::Result<Inode>>>,
    ) -> (Vec<usize>, Vec<io::Result<Inode>>) {
        let pending: Vec<usize> = (0..r.nodes.len())
            .filter(|&i| found.get(i).is_some_and(Option::is_none))
            .collect();
        let resolved = self.on_resolvers(pending.len(), |k| {
            let n = pending.get(k).and_then(|&i| r.nodes.get(i))?;
            Some(self.resolve(n, r.perm))
        });
        for (&i, res) in pending.iter().zip(resolved) {
            if let Some(f) = found.get_mut(i) {
                *f = Some(res.flatten().unwrap_or_else(|| Err(errno(libc::EIO))));
            }
        }
        let found = found
            .into_iter()
            .map(|f| f.unwrap_or_else(|| Err(errno(libc::EIO))))
            .collect();
        (pending, found)
    }

    /// The links of the nodes found by number (`pending`), where the parent is found now and
    /// the link was not tried yet.
    fn retry_links(
        &self,
        r: &Resolving,
        pending: &[usize],
        tried: &[bool],
        found: &[io::Result<Inode>],
        link_ok: &mut [bool],
    ) {
        let retry: Vec<usize> = pending
            .iter()
            .copied()
            .filter(|&i| !tried.get(i).copied().unwrap_or(true))
            .filter(|&i| found.get(i).is_some_and(|f| f.is_ok()))
            .collect();
        let confirmed = self.on_resolvers(retry.len(), |k| {
            let i = *retry.get(k)?;
            let parent = match r.parents.get(i)? {
                Parent::Root => r.root?,
                Parent::Node(j) => found.get(*j)?.as_ref().ok()?,
                Parent::Unusable => return None,
            };
            self.confirm_link(r.nodes.get(i)?, parent, r.perm).map(drop)
        });
        for (&i, c) in retry.iter().zip(confirmed) {
            if let (Some(()), Some(l)) = (c.flatten(), link_ok.get_mut(i)) {
                *l = true;
            }
        }
    }

    /// Which nodes of the frontend's state are proven to lie below the export: down links
    /// that hold, or up a head directory's "..", and never a snapshot the guest may not see.
    fn prove_below_export(
        &self,
        r: &Resolving,
        found: &[io::Result<Inode>],
        link_ok: &[bool],
    ) -> Vec<bool> {
        let len = r.nodes.len();
        let none = vec![false; len];
        let linked = propagate(r.parents, link_ok, &none);
        // Head directories no confirmed chain reaches: where ".." leads (a directory the
        // source found by "..", or whose name another client changed).
        let walked = self.on_resolvers(len, |i| {
            let (Some(n), Some(Ok(inode)), Some(false)) =
                (r.nodes.get(i), found.get(i), linked.get(i).copied())
            else {
                return Some(false);
            };
            Some(
                n.kind == libc::S_IFDIR
                    && n.snapid == NOSNAP
                    && self.walk_up(inode, n.ino, None) == Up::Root,
            )
        });
        let walked: Vec<bool> = walked.into_iter().map(|w| w == Some(Some(true))).collect();
        let proven = if walked.iter().any(|w| *w) {
            propagate(r.parents, link_ok, &walked)
        } else {
            linked
        };
        // Snapshots the guest may not see are never restored, however they were found.
        if self.cfg.snapshots.visible() {
            proven
        } else {
            proven
                .into_iter()
                .zip(r.nodes)
                .map(|(p, n)| p && n.snapid == NOSNAP)
                .collect()
        }
    }

    /// The inode `n`'s link names in `parent`, if the name is one a request could look up
    /// and gives `n`'s very inode, of `n`'s type.
    fn confirm_link(
        &self,
        n: &NodeState,
        parent: &Inode,
        perm: &ceph_client::UserPerm,
    ) -> Option<Inode> {
        let visible = self.cfg.snapshots.visible();
        if !visible && n.snapid != NOSNAP {
            return None;
        }
        let name = CString::new(n.name.clone()).ok()?;
        if names::check_name(&name, names::Use::Change).is_err()
            || (!visible && name.as_bytes() == &*self.snapdir)
        {
            return None;
        }
        let (inode, st) = self
            .mount()
            .lookup(parent, &name, CEPH_STATX_INO | CEPH_STATX_MODE, 0, perm)
            .ok()?;
        let vino = Vino {
            ino: n.ino,
            snapid: n.snapid,
        };
        (vino_of(&st) == vino && kind_of(&st) == n.kind).then_some(inode)
    }

    /// `f(i)` for every `i` below `len`, on up to [`RESOLVERS`] threads; in order (`None`
    /// where a thread failed).
    fn on_resolvers<T: Send>(&self, len: usize, f: impl Fn(usize) -> T + Sync) -> Vec<Option<T>> {
        let chunk = len.div_ceil(RESOLVERS).max(1);
        let f = &f;
        std::thread::scope(|s| {
            let jobs: Vec<_> = (0..len)
                .step_by(chunk)
                .map(|start| {
                    let end = start.saturating_add(chunk).min(len);
                    let job = s.spawn(move || (start..end).map(f).collect::<Vec<_>>());
                    (end - start, job)
                })
                .collect();
            jobs.into_iter()
                .flat_map(|(n, job)| match job.join() {
                    Ok(v) => v.into_iter().map(Some).collect::<Vec<_>>(),
                    Err(_) => (0..n).map(|_| None).collect(),
                })
                .collect()
        })
    }

    /// The inode of a saved head node, found by number, if it is still the same type of file.
    /// Never a snapshot's (see [`CephFs::resolve_below_export`]): ESTALE.
    fn resolve(&self, n: &NodeState, perm: &ceph_client::UserPerm) -> io::Result<Inode> {
        if n.snapid != NOSNAP {
            return Err(errno(libc::ESTALE));
        }
        let inode = self.mount().lookup_vino(n.ino, n.snapid)?;
        let st = self.mount().getattr(&inode, CEPH_STATX_MODE, 0, perm)?;
        if kind_of(&st) != n.kind {
            return Err(errno(libc::ESTALE));
        }
        Ok(inode)
    }

    /// Open a handle again as it was on the source: a file with its flags (but those that
    /// acted at the first open: O_CREAT, O_EXCL, O_TRUNC; and only those an OPEN passes on),
    /// a directory at its position; as the guest caller that opened it, through the id
    /// mapping, so that the state cannot open what a request could not. Its owner gets it
    /// again even where its mode now denies it (a file created read-only and open for
    /// writing, or chmod'ed since): the owner could change the mode itself, as knfsd's owner
    /// override lets it. Without a known opener (a version 1 state) nothing is opened.
    fn reopen(
        &self,
        node: &Arc<Node>,
        kind: HandleKind,
        opener: Option<Opener>,
    ) -> io::Result<Handle> {
        // EACCES: which caller opened it is not known.
        let opener = opener.ok_or_else(|| errno(libc::EACCES))?;
        let (uid, gid) = self
            .cfg
            .idmap
            .creds(GuestUid::new(opener.uid), GuestGid::new(opener.gid))?;
        let perm = self.perms.get(uid, gid);
        let as_owner = |inode: &Inode, e: ceph_client::CephError| -> io::Result<()> {
            if e.errno() != libc::EACCES {
                return Err(e.into());
            }
            let st = self
                .mount()
                .getattr(inode, CEPH_STATX_UID, 0, &self.perms.root())?;
            if st.stx_uid == uid.get() {
                Ok(())
            } else {
                Err(e.into())
            }
        };
        match kind {
            HandleKind::File { oflags } => {
                if node.kind != libc::S_IFREG {
                    return Err(errno(libc::ESTALE));
                }
                let keep = libc::O_ACCMODE
                    | libc::O_APPEND
                    | libc::O_SYNC
                    | libc::O_DSYNC
                    | libc::O_DIRECT
                    | libc::O_NOFOLLOW;
                let oflags = oflags & keep;
                if oflags & libc::O_ACCMODE == libc::O_ACCMODE {
                    return Err(errno(libc::EINVAL));
                }
                let ino_ref = self.inode(node)?;
                let file = match self.mount().open(&ino_ref, oflags, &perm) {
                    Ok(f) => f,
                    Err(e) => {
                        as_owner(&ino_ref, e)?;
                        self.mount().open(&ino_ref, oflags, &self.perms.root())?
                    }
                };
                let writer = self.direct_writer(&ino_ref, oflags)?;
                Ok(Handle::File(OpenFile::new(
                    file, writer, oflags, node, ino_ref, opener,
                )))
            }
            HandleKind::Dir { pos } => {
                if !node.is_dir() {
                    return Err(errno(libc::ESTALE));
                }
                let ino_ref = self.inode(node)?;
                let dir = match self.mount().opendir(&ino_ref, &perm) {
                    Ok(d) => d,
                    Err(e) => {
                        as_owner(&ino_ref, e)?;
                        self.mount().opendir(&ino_ref, &self.perms.root())?
                    }
                };
                Ok(Handle::Dir(Mutex::new(DirStream::restored(
                    dir, pos, opener,
                )?)))
            }
        }
    }
}

/// Lost entries of one load logged at warn (the rest at debug; the count is in the report).
const LOST_LOGGED: u32 = 10;

impl crate::migration::DeviceState for CephFs {
    fn save_state(&self) -> Result<Vec<u8>, MigrationError> {
        let state = self.save_session()?;
        let bytes = state.encode();
        tracing::info!(
            nodes = state.nodes.len(),
            handles = state.handles.len(),
            bytes = bytes.len(),
            "migration: session saved"
        );
        Ok(bytes)
    }

    fn load_state(&self, bytes: &[u8]) -> Result<LoadReport, MigrationError> {
        let state = State::decode_within(bytes, &self.state_bounds())?;
        self.load_from(&state, Source::Frontend)
    }

    fn load_peer_state(&self, bytes: &[u8]) -> Result<LoadReport, MigrationError> {
        let state = State::decode_within(bytes, &self.state_bounds())?;
        self.load_from(&state, Source::Trusted)
    }

    fn max_state_len(&self) -> u64 {
        self.state_bounds().max_len()
    }

    fn connection_started(&self) {
        CephFs::connection_started(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(parents: &[Parent], link_ok: &[bool], base: &[bool]) -> Vec<bool> {
        propagate(parents, link_ok, base)
    }

    #[test]
    fn a_node_is_proven_by_confirmed_links_up_to_the_root() {
        use Parent::*;
        // 0 ← root, 1 ← 0, 2 ← 1 (its link does not hold), 3 ← 2, 4 unlinked.
        let parents = [Root, Node(0), Node(1), Node(2), Unusable];
        let link_ok = [true, true, false, true, false];
        let none = [false; 5];
        assert_eq!(
            chain(&parents, &link_ok, &none),
            [true, true, false, false, false]
        );
        // 2 is proven by itself (its ".." leads to the root): 3 follows, 4 does not.
        let base = [false, false, true, false, false];
        assert_eq!(
            chain(&parents, &link_ok, &base),
            [true, true, true, true, false]
        );
    }

    #[test]
    fn hostile_loops_and_self_links_prove_nothing() {
        use Parent::*;
        // 0 → 1 → 2 → 0 (a loop), 3 → 3, 4 → 0.
        let parents = [Node(1), Node(2), Node(0), Node(3), Node(0)];
        let link_ok = [true; 5];
        assert_eq!(chain(&parents, &link_ok, &[false; 5]), [false; 5]);
        // A node of the loop proven by itself breaks it: the others hang below it.
        let base = [false, false, true, false, false];
        assert_eq!(
            chain(&parents, &link_ok, &base),
            [true, true, true, false, true]
        );
        // A long chain (deeper than any recursion could go) is followed.
        let n = 200_000;
        let mut parents: Vec<Parent> = (0..n).map(|i| Node(i + 1)).collect();
        parents[n - 1] = Root;
        let proven = chain(&parents, &vec![true; n], &vec![false; n]);
        assert!(proven.iter().all(|p| *p));
    }

    #[test]
    fn hostile_ids_that_would_wrap_the_counters_are_refused() {
        assert!(restorable_id(0x1000));
        assert!(restorable_id((1 << 63) | 2));
        assert!(!restorable_id(0));
        assert!(!restorable_id(u64::MAX));
        assert!(!restorable_id((1 << 63) | (1 << 62)));
        assert!(restorable_fh(1) && restorable_fh((1 << 62) + 5));
        assert!(!restorable_fh(0) && !restorable_fh(u64::MAX) && !restorable_fh(1 << 63));
    }
}
