//! A second CephFS client session, opened on first need, for the one operation whose effect on
//! the main session's cache libcephfs gets wrong: a rename that replaces one name of a file with
//! other hard links.
//!
//! When such a rename completes, libcephfs (16.2; the Reef ceph-fuse shows it too) "trims" the
//! replaced inode (`Client::put_request` → `_try_to_trim_inode`): it turns every cached dentry of
//! that inode into a null dentry, also those of the names that still exist, and leaves their
//! directories marked complete. From then on the session answers ENOENT for those names and
//! leaves them out of readdir, until the MDS happens to revoke its caps on the directory
//! (`ln a i; mv h i; ls` lost `a`). Done through a second session instead, the rename leaves the
//! main session's dentries alone, and the MDS revokes the main session's caps on the directories
//! the rename changes before it commits, so the main session reads them afresh. The second
//! session's own cache may be wrong afterwards; it never lists or looks up anything.
//!
//! Cost: one more MDS session, opened at the first such rename only (most daemons never open
//! it), and the MDS round trips of a rename from a client without caps.

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::sync::{Arc, OnceLock};

use ceph_client::{CephError, Mount, UserPerm};

/// How to open another session to the export (same client id, same root, same options).
#[derive(Clone)]
pub struct Connector(pub Arc<dyn Fn() -> Result<Mount, CephError> + Send + Sync>);

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Connector")
    }
}

/// The second session: `None` inside once opening it failed (logged once; callers fall back).
#[derive(Debug, Default)]
pub struct SideClient {
    connect: Option<Connector>,
    mount: OnceLock<Option<Mount>>,
}

impl SideClient {
    pub fn new(connect: Option<Connector>) -> Self {
        SideClient {
            connect,
            mount: OnceLock::new(),
        }
    }

    fn get(&self) -> Option<&Mount> {
        self.mount
            .get_or_init(|| {
                let connect = self.connect.as_ref()?;
                match (connect.0)() {
                    Ok(m) => {
                        tracing::info!(
                            client_id = m.instance_id(),
                            "opened a second CephFS session for renames over hard links"
                        );
                        Some(m)
                    }
                    Err(e) => {
                        tracing::warn!(
                            error = %e,
                            "opening a second CephFS session failed: renames over hard links \
                             go through the main session, which may then hide the file's \
                             other names until the MDS revokes its caps"
                        );
                        None
                    }
                }
            })
            .as_ref()
    }

    /// `rename(olddir/oldname, newdir/newname)` by inode numbers of head directories, through
    /// the second session. `None`: there is no second session (the caller renames itself).
    pub fn rename(
        &self,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        perm: &UserPerm,
    ) -> Option<io::Result<()>> {
        let m = self.get()?;
        let run = || -> Result<(), CephError> {
            let old = m.lookup_inode(olddir)?;
            if newdir == olddir {
                return m.rename(&old, oldname, &old, newname, perm);
            }
            let new = m.lookup_inode(newdir)?;
            m.rename(&old, oldname, &new, newname, perm)
        };
        Some(run().map_err(io::Error::from))
    }

    /// End of service: unmount the second session if it was opened.
    pub fn shutdown(&self) -> io::Result<()> {
        match self.mount.get() {
            Some(Some(m)) => Ok(m.shutdown()?),
            _ => Ok(()),
        }
    }
}
