//! Recovery from an eviction: the MDS evicted this client (an operator's `client evict`, or a
//! stall past the session timeout) and blocklisted it, and every libcephfs call of the old
//! session fails with ESHUTDOWN for good. The daemon notices (a reply carrying ESHUTDOWN), and,
//! with the guest's queues paused and no request running, mounts a new session and brings the
//! guest's session over to it as a migration destination would: every node looked up again by
//! inode number, every read-only handle opened again, directory streams at their position.
//!
//! What the old session took with it, as the kernel client's `recover_session=clean` does:
//! data written but not yet flushed, and file locks (the MDS dropped them with the session). So
//! every handle open for writing, and every handle locks were taken through, answers EIO until
//! the guest releases it; a new open works. Requests that ran when the eviction hit answered
//! ESHUTDOWN (the errno libcephfs gave). Nodes whose inode is gone answer ESTALE.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ceph_client::Mount;

use super::{errno, vino_of, CephFs, Handle, WANT};
use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Condvar, OnceLock};
use std::time::Instant;

use super::state::Restore;

/// Mounts a new CephFS session like the one the daemon started with.
pub type Remount = Box<dyn Fn() -> io::Result<Mount> + Send + Sync>;

/// How long the old session's calls in flight are waited for when it is aborted.
const ABORT_WAIT: Duration = Duration::from_secs(5);

/// The recovery state of a [`CephFs`].
#[derive(Default)]
pub struct Recovery {
    remount: OnceLock<Remount>,
    /// A reply said the session is gone, and no recovery has run since.
    lost: Mutex<bool>,
    wake: Condvar,
    recovered: AtomicU64,
    failed: AtomicU64,
}

impl std::fmt::Debug for Recovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recovery")
            .field("enabled", &self.remount.get().is_some())
            .field("recovered", &self.recovered)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl CephFs {
    /// Turn recovery on: `remount` makes the new session.
    pub fn set_remount(&self, remount: Remount) {
        if self.recovery.remount.set(remount).is_err() {
            tracing::warn!("session recovery was already set up");
        }
    }

    /// Sessions recovered and recoveries that failed so far.
    pub fn recoveries(&self) -> (u64, u64) {
        (
            self.recovery.recovered.load(Ordering::Relaxed),
            self.recovery.failed.load(Ordering::Relaxed),
        )
    }

    pub(super) fn note_session_lost(&self) {
        if self.recovery.remount.get().is_none() {
            return;
        }
        let mut lost = self.recovery.lost.lock().unwrap_or_else(|e| e.into_inner());
        if !*lost {
            *lost = true;
            self.recovery.wake.notify_all();
        }
    }

    /// Block until a reply says the session is gone; false (at once) without recovery.
    pub(super) fn wait_for_lost_session(&self) -> bool {
        if self.recovery.remount.get().is_none() {
            return false;
        }
        let mut lost = self.recovery.lost.lock().unwrap_or_else(|e| e.into_inner());
        while !*lost {
            lost = self
                .recovery
                .wake
                .wait(lost)
                .unwrap_or_else(|e| e.into_inner());
        }
        true
    }

    /// Replace the lost session by a new one and bring the guest's nodes and handles over (see
    /// the module doc). No request may be running. On an error (the cluster cannot be reached)
    /// nothing changed and the session stays marked lost, for the caller to try again.
    pub(super) fn recover_lost_session(&self) -> io::Result<String> {
        let remount = self
            .recovery
            .remount
            .get()
            .ok_or_else(|| errno(libc::EOPNOTSUPP))?;
        let started = Instant::now();
        let new = remount().inspect_err(|_| {
            self.recovery.failed.fetch_add(1, Ordering::Relaxed);
        })?;
        let client_id = new.instance_id();
        let root = new.lookup_root()?;
        let st = new.getattr(&root, WANT, 0, &self.perms.root())?;
        if vino_of(&st) != self.nodes.root_vino() {
            self.recovery.failed.fetch_add(1, Ordering::Relaxed);
            return Err(errno(libc::ESTALE));
        }
        // What the guest holds, and the handles whose data or locks went with the session.
        let state = self.snapshot_session();
        let dropped: HashSet<u64> = self
            .handles
            .snapshot()
            .iter()
            .filter_map(|(fh, e)| match &e.handle {
                Handle::File(f)
                    if f.oflags & libc::O_ACCMODE != libc::O_RDONLY
                        || f.locked.load(Ordering::Relaxed)
                        || f.flocked.load(Ordering::Relaxed) =>
                {
                    Some(*fh)
                }
                _ => None,
            })
            .collect();
        // The old session is dead: abort it, so that releasing its inodes and files does not
        // wait on it, then drop them.
        let old = self.mount.swap(Arc::new(new));
        if let Err(e) = old.abort_conn(ABORT_WAIT) {
            tracing::warn!(error = %e, "session recovery: aborting the evicted session");
        }
        self.handles.clear();
        self.nodes.clear();
        self.nodes.replace_root(root);
        drop(old);
        let (report, _) = self.restore_tables(
            &state,
            &Restore::Recovery {
                dropped: dropped.clone(),
            },
        );
        *self.recovery.lost.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.recovery.recovered.fetch_add(1, Ordering::Relaxed);
        Ok(format!(
            "new session client_id={client_id}; {report}; {} handles open for writing or \
             locking answer EIO; in {} ms",
            dropped.len(),
            started.elapsed().as_millis()
        ))
    }
}
