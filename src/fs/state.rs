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

use fuse_backend_rs::api::filesystem::FileSystem;
use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ceph_client::{Inode, CEPH_STATX_MODE};
use fuse_backend_rs::abi::fuse_abi::FsOptions;

use crate::idmap::IdMapping;

use super::dir::DirStream;
use super::nodes::{NewNode, Vino, ROOT_ID};
use super::open::OpenFile;
use super::{errno, kind_of, CephFs, Handle, Link, Node};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use crate::migration::{
    HandleKind, HandleState, LoadReport, MigrationError, NodeState, OnError, State,
};

/// Migration settings and what a session needs to be moved.
#[derive(Debug, Default)]
pub struct Migration {
    /// FUSE INIT flags the guest offered, as `init` got them.
    capable: AtomicU64,
    /// `--migration-on-error abort` (stored as a flag: set once at startup).
    abort_on_error: AtomicBool,
}

impl Migration {
    /// Record the guest's INIT flags (`FileSystem::init`).
    pub(super) fn note_init(&self, capable: FsOptions) {
        self.capable.store(capable.bits(), Ordering::Relaxed);
    }
}

/// How [`CephFs::restore_tables`] treats what it cannot bring back.
#[derive(Debug)]
pub(super) enum Restore {
    /// Another daemon's session: lost handles answer ESTALE.
    Migration,
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
        let root = self.nodes.root_vino();
        State {
            fuse_capable: self.migration.capable.load(Ordering::Relaxed),
            idmap_fingerprint: idmap_fingerprint(&self.cfg.idmap),
            root: (root.ino, root.snapid),
            nodes,
            handles,
        }
    }

    /// Take over a session saved by another daemon: every node is looked up by inode number,
    /// every handle opened again, before this returns. This daemon must not serve a session.
    pub fn load_session(&self, state: &State) -> Result<LoadReport, MigrationError> {
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
        let (report, first_lost) = self.restore_tables(state, &Restore::Migration);
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
    /// current session: what cannot be found is left out (a node) or answers an errno (a
    /// handle: ESTALE after a migration, EIO after a recovery). The report and the first loss.
    pub(super) fn restore_tables(
        &self,
        state: &State,
        how: &Restore,
    ) -> (LoadReport, Option<String>) {
        let (what, lost_errno) = match how {
            Restore::Migration => ("migration", libc::ESTALE),
            Restore::Recovery { .. } => ("session recovery", libc::EIO),
        };
        let mut report = LoadReport::default();
        let mut first_lost: Option<String> = None;
        let mut lost = |item: String, report_count: &mut usize| {
            *report_count += 1;
            tracing::warn!(
                "{what}: {item}: the guest gets {} for it",
                std::io::Error::from_raw_os_error(lost_errno)
            );
            first_lost.get_or_insert(item);
        };
        let perm = self.perms.root();
        // Quarantine: every restored node derives its domain again on first use (UNSURE, which
        // is denied, until then; the generation cannot match the gate's current one).
        let domain = self.cfg.quarantine.as_ref().map_or((0, 0), |g| {
            (crate::quarantine::UNSURE, g.generation().wrapping_sub(1))
        });
        let mut restored: HashMap<u64, Arc<Node>> = HashMap::with_capacity(state.nodes.len());
        let found = self.resolve_all(&state.nodes, &perm);
        for (n, found) in state.nodes.iter().zip(found) {
            let vino = Vino {
                ino: n.ino,
                snapid: n.snapid,
            };
            let inode = match found {
                Ok(inode) => inode,
                Err(e) => {
                    lost(
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
                Err(e) => lost(
                    format!("node {:#x}: {}", n.id, errno(e)),
                    &mut report.lost_nodes,
                ),
            }
        }
        report.nodes = restored.len();
        // Links, now that every parent is in: a parent that is not (lost, or only held by a
        // link on the source) leaves the node without one, as a directory found by "..".
        for n in &state.nodes {
            let Some(node) = restored.get(&n.id) else {
                continue;
            };
            let parent = if n.parent == ROOT_ID {
                self.nodes.get(ROOT_ID)
            } else {
                restored.get(&n.parent).cloned()
            };
            if let (Some(parent), Ok(name)) = (parent, CString::new(n.name.clone())) {
                node.set_link(Some(Link { parent, name }));
            }
        }
        for h in &state.handles {
            let node = if h.node == ROOT_ID {
                self.nodes.get(ROOT_ID)
            } else {
                restored.get(&h.node).cloned()
            };
            let dropped = match how {
                Restore::Recovery { dropped } => dropped.contains(&h.fh),
                Restore::Migration => false,
            };
            let opened = match node {
                None => Err(errno(libc::ESTALE)),
                Some(_) if dropped => Err(errno(libc::EIO)),
                Some(node) => self.reopen(&node, h.kind, &perm),
            };
            let result =
                opened.and_then(|handle| self.handles.restore(h.fh, h.node, handle).map_err(errno));
            match result {
                Ok(()) => report.handles += 1,
                Err(e) => {
                    self.handles.restore_stale(h.fh, h.node, lost_errno);
                    lost(
                        format!("handle {:#x} of node {:#x}: {e}", h.fh, h.node),
                        &mut report.lost_handles,
                    );
                }
            }
        }
        (report, first_lost)
    }

    /// Find every node's inode by number, on a few threads: each lookup an inode libcephfs
    /// does not hold yet is an MDS round trip, and libcephfs lets other calls run while one
    /// waits for its reply. The results come in the order of `nodes`.
    fn resolve_all(
        &self,
        nodes: &[NodeState],
        perm: &ceph_client::UserPerm,
    ) -> Vec<io::Result<Inode>> {
        let chunk = nodes.len().div_ceil(RESOLVERS).max(1);
        std::thread::scope(|s| {
            let jobs: Vec<_> = nodes
                .chunks(chunk)
                .map(|part| {
                    let job = s.spawn(move || {
                        part.iter()
                            .map(|n| self.resolve(n, perm))
                            .collect::<Vec<_>>()
                    });
                    (part.len(), job)
                })
                .collect();
            jobs.into_iter()
                .flat_map(|(len, job)| {
                    job.join()
                        .unwrap_or_else(|_| (0..len).map(|_| Err(errno(libc::EIO))).collect())
                })
                .collect()
        })
    }

    /// The inode of a saved node, if it is still the same type of file.
    fn resolve(&self, n: &NodeState, perm: &ceph_client::UserPerm) -> io::Result<Inode> {
        let inode = self.mount().lookup_vino(n.ino, n.snapid)?;
        let st = self.mount().getattr(&inode, CEPH_STATX_MODE, 0, perm)?;
        if kind_of(&st) != n.kind {
            return Err(errno(libc::ESTALE));
        }
        Ok(inode)
    }

    /// Open a handle again as it was on the source: a file with its flags (but those that
    /// acted at the first open: O_CREAT, O_EXCL, O_TRUNC), a directory at its position.
    /// As root: the guest's permission was checked when it opened the handle.
    fn reopen(
        &self,
        node: &Arc<Node>,
        kind: HandleKind,
        perm: &ceph_client::UserPerm,
    ) -> io::Result<Handle> {
        match kind {
            HandleKind::File { oflags } => {
                if node.kind != libc::S_IFREG {
                    return Err(errno(libc::ESTALE));
                }
                let oflags = oflags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
                let ino_ref = self.inode(node)?;
                let file = self.mount().open(&ino_ref, oflags, perm)?;
                let writer = self.direct_writer(&ino_ref, oflags)?;
                Ok(Handle::File(OpenFile::new(
                    file, writer, oflags, node, ino_ref,
                )))
            }
            HandleKind::Dir { pos } => {
                if !node.is_dir() {
                    return Err(errno(libc::ESTALE));
                }
                let dir = self.mount().opendir(&*self.inode(node)?, perm)?;
                Ok(Handle::Dir(Mutex::new(DirStream::restored(dir, pos)?)))
            }
        }
    }
}

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
        let state = State::decode(bytes)?;
        self.load_session(&state)
    }
}
