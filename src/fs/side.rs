//! A short second CephFS client session for the one operation whose effect on the main
//! session's cache libcephfs gets wrong: a rename that replaces one name of a file with other
//! hard links.
//!
//! When such a rename completes, libcephfs (16.2; the Reef ceph-fuse shows it too) "trims" the
//! replaced inode (`Client::put_request` → `_try_to_trim_inode`): it turns every cached dentry of
//! that inode into a null dentry, also those of the names that still exist, and leaves their
//! directories marked complete. From then on the session answers ENOENT for those names and
//! leaves them out of readdir, until the MDS happens to revoke its caps on the directory
//! (`ln a i; mv h i; ls` lost `a`). Done through another session instead, the rename leaves the
//! main session's dentries alone, and the MDS revokes the main session's caps on the directories
//! the rename changes before it commits, so the main session reads them afresh.
//!
//! The session lives for that one rename and is unmounted before the guest is answered. Kept
//! open, it held caps on every directory it had renamed in, and the MDS then revoked and
//! re-granted the main session's shared xattr cap on each of those directories' next xattr
//! change; the re-grant, sent before the change was journaled, carried the old ctime, and
//! libcephfs took it: the directory's ctime went back (fscheck found it within a few thousand
//! operations). Cost: a session setup and teardown per such rename, 0.1-1 s on a loopback
//! cluster (the teardown waits for the MDS to journal the session's end, which is when it drops
//! the session's caps). Renames over a name with other links are rare (a package manager
//! replacing hard-linked files); one such session runs at a time.

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ceph_client::{CephError, Mount, UserPerm};

/// How to open another session to the export (same client id, same root, same options).
#[derive(Clone)]
pub struct Connector(pub Arc<dyn Fn() -> Result<Mount, CephError> + Send + Sync>);

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Connector")
    }
}

/// Opens the short sessions; warns once if that fails (the caller then renames itself).
#[derive(Debug, Default)]
pub struct SideClient {
    connect: Option<Connector>,
    warned: AtomicBool,
    /// One such session at a time: a guest renaming over hard links in a loop costs the
    /// cluster one extra session, not one per request in flight.
    one: Mutex<()>,
}

impl SideClient {
    pub fn new(connect: Option<Connector>) -> Self {
        SideClient {
            connect,
            warned: AtomicBool::new(false),
            one: Mutex::new(()),
        }
    }

    /// Run `f` on a session of its own, unmounted before this returns (which returns the
    /// session's caps before the guest hears of the change; nothing is in flight then: this
    /// thread is the session's only user). `None`: no session could be opened.
    fn with_session(
        &self,
        f: impl FnOnce(&Mount) -> Result<(), CephError>,
    ) -> Option<io::Result<()>> {
        let connect = self.connect.as_ref()?;
        let _one = self.one.lock().unwrap_or_else(|e| e.into_inner());
        let m = match (connect.0)() {
            Ok(m) => m,
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        error = %e,
                        "opening a second CephFS session failed: a rename over a hard link \
                         then goes through the main session, which may hide the file's other \
                         names until the MDS revokes its caps, and a source name libcephfs \
                         still lists after a rename stays listed until then (logged once)"
                    );
                }
                return None;
            }
        };
        let r = f(&m);
        if let Err(e) = m.shutdown(std::time::Duration::ZERO) {
            tracing::warn!(error = %e, "unmounting the second CephFS session failed");
        }
        Some(r.map_err(io::Error::from))
    }

    /// `rename(olddir/oldname, newdir/newname)` by inode numbers of head directories, through
    /// a session of its own. `None`: no session could be opened (the caller renames itself).
    pub fn rename(
        &self,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        perm: &UserPerm,
    ) -> Option<io::Result<()>> {
        self.with_session(|m| {
            let old = m.lookup_inode(olddir)?;
            if newdir == olddir {
                return m.rename(&old, oldname, &old, newname, perm);
            }
            let new = m.lookup_inode(newdir)?;
            m.rename(&old, oldname, &new, newname, perm)
        })
    }

    /// Set the mtime of directory `dir` (a head inode number) through a session of its own,
    /// one nanosecond on and back to what it was: each is a SETATTR the MDS serves by taking
    /// the file lock exclusively, so it takes the main session's shared cap on the directory,
    /// and with it the main session's cached listing (see `CephFs::forget_stale_source`).
    /// Twice, because libcephfs sends no request for an mtime equal to the one it has cached
    /// while it holds the shared cap itself, which this session gets as soon as it looks the
    /// directory up while the main session holds the directory exclusively (fscheck seed
    /// 4558096565492855208, operation 157: the one setattr was never sent and the stale name
    /// stayed). The mtime ends as it was, the ctime becomes now, as after the rename that
    /// prompted it. `None`: no session.
    pub fn refresh_dir(&self, dir: u64, perm: &UserPerm) -> Option<io::Result<()>> {
        self.with_session(|m| {
            let d = m.lookup_inode(dir)?;
            let st = m.getattr(&d, ceph_client::CEPH_STATX_MTIME, 0, perm)?;
            let was = st.stx_mtime;
            let on = ceph_client::Timespec {
                tv_nsec: if was.tv_nsec < 999_999_999 {
                    was.tv_nsec + 1
                } else {
                    was.tv_nsec - 1
                },
                ..was
            };
            for t in [on, was] {
                let set = ceph_client::Statx {
                    stx_mtime: t,
                    ..ceph_client::Statx::default()
                };
                m.setattr(&d, &set, ceph_client::CEPH_SETATTR_MTIME, perm)?;
            }
            Ok(())
        })
    }
}
