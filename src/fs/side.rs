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
//!
//! Each session is a monitor authentication and an MDS session opened and closed, both
//! journaled, on the monitors and MDS every tenant shares; a guest looping `ln t t2; touch f;
//! mv f t` would make one per iteration (review of f9264a9, finding 7), as fast as the cluster
//! sets them up and down. So they are paced: a burst of [`BURST`], then one every [`EVERY`]; a
//! rename past that waits its turn. Kept warm
//! instead, a session holds caps on the directories it renamed in, which is what broke the
//! ctime above: with libcephfs 16 there is no call that gives them back, and
//! `client_cache_size = 0` still left the caps of both directories of each rename with the
//! MDS (`session ls`, 1.5 s after each of three renames).

use std::collections::VecDeque;
use std::ffi::{CStr, CString};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ceph_client::{CephError, Mount, UserPerm};

/// How to open another session to the export (same client id, same root, same options).
#[derive(Clone)]
pub struct Connector(pub Arc<dyn Fn() -> Result<Mount, CephError> + Send + Sync>);

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Connector")
    }
}

/// Sessions that may be opened at once after a quiet spell.
pub const BURST: u32 = 16;
/// After a burst, one session per this long: about what one costs on the lab's loopback
/// cluster (40 renames over a linked name took 40.8 s with 40 sessions opened), so a benign
/// guest there never waits; a faster cluster is not asked for more.
pub const EVERY: Duration = Duration::from_secs(1);

/// When the next session may start: a token bucket over session starts (the generic cell rate
/// algorithm: `due` is when the bucket would be empty at the sustained rate).
#[derive(Debug)]
struct Pace {
    due: Option<Instant>,
    burst: u32,
    every: Duration,
}

impl Pace {
    fn new(burst: u32, every: Duration) -> Self {
        Pace {
            due: None,
            burst: burst.max(1),
            every,
        }
    }

    /// A session starts at `now` or later: how long it must wait first.
    fn admit(&mut self, now: Instant) -> Duration {
        let due = self.due.map_or(now, |d| d.max(now));
        let slack = self.every.saturating_mul(self.burst - 1);
        let start = due
            .checked_sub(slack)
            .map_or(now, |earliest| earliest.max(now));
        self.due = Some(due.max(start) + self.every);
        start - now
    }
}

/// Names a rename through a second session took from a file: how many are remembered.
pub const VACATED: usize = 1024;

/// Opens the short sessions; warns once if that fails (the caller then renames itself).
#[derive(Debug)]
pub struct SideClient {
    connect: Option<Connector>,
    /// The source names of the renames done here, `(directory, name, file)`, newest last (see
    /// [`SideClient::vacated`]).
    vacated: Mutex<VecDeque<(u64, CString, u64)>>,
    warned: AtomicBool,
    /// One such session at a time: a guest renaming over hard links in a loop costs the
    /// cluster one extra session, not one per request in flight. Holds the pace.
    one: Mutex<Pace>,
    /// Sessions opened, and how many of them waited for the pace.
    opened: AtomicU64,
    paced: AtomicU64,
}

impl Default for SideClient {
    fn default() -> Self {
        SideClient::new(None)
    }
}

impl SideClient {
    pub fn new(connect: Option<Connector>) -> Self {
        SideClient {
            connect,
            vacated: Mutex::new(VecDeque::new()),
            warned: AtomicBool::new(false),
            one: Mutex::new(Pace::new(BURST, EVERY)),
            opened: AtomicU64::new(0),
            paced: AtomicU64::new(0),
        }
    }

    /// Sessions opened so far, and how many of them waited for the pace.
    pub fn sessions(&self) -> (u64, u64) {
        (
            self.opened.load(Ordering::Relaxed),
            self.paced.load(Ordering::Relaxed),
        )
    }

    /// Run `f` on a session of its own, unmounted before this returns (which returns the
    /// session's caps before the guest hears of the change; nothing is in flight then: this
    /// thread is the session's only user). `None`: no session could be opened.
    fn with_session(
        &self,
        f: impl FnOnce(&Mount) -> Result<(), CephError>,
    ) -> Option<io::Result<()>> {
        let connect = self.connect.as_ref()?;
        let mut pace = self.one.lock().unwrap_or_else(|e| e.into_inner());
        let wait = pace.admit(Instant::now());
        if !wait.is_zero() {
            self.paced.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(?wait, "a second CephFS session waits for its pace");
            std::thread::sleep(wait);
        }
        self.opened.fetch_add(1, Ordering::Relaxed);
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

    /// `rename(olddir/oldname, newdir/newname)` of the file `moved` by inode numbers of head
    /// directories, through a session of its own. `None`: no session could be opened (the
    /// caller renames itself).
    pub fn rename(
        &self,
        (olddir, oldname): (u64, &CStr),
        (newdir, newname): (u64, &CStr),
        moved: u64,
        perm: &UserPerm,
    ) -> Option<io::Result<()>> {
        let r = self.with_session(|m| {
            let old = m.lookup_inode(olddir)?;
            if newdir == olddir {
                return m.rename(&old, oldname, &old, newname, perm);
            }
            let new = m.lookup_inode(newdir)?;
            m.rename(&old, oldname, &new, newname, perm)
        });
        if matches!(r, Some(Ok(()))) {
            let mut v = self.vacated.lock().unwrap_or_else(|e| e.into_inner());
            if v.len() == VACATED {
                v.pop_front();
            }
            v.push_back((olddir, oldname.to_owned(), moved));
        }
        r
    }

    /// Whether the main session may hold a stale name `dir/name` for the file `ino`, because
    /// a rename here took that name from it; forgotten once asked. The main session keeps its
    /// dentry of the old name, pointing at the file it still holds. When it later puts that
    /// file back at that very name (a rename or a link), libcephfs finds the dentry "with
    /// correct vino" and neither lists it in the directory's cached listing nor marks that
    /// listing out of date: while the main session holds the directory as complete, its
    /// listings miss the name (fscheck, cache auto, seed 1990698627124805773: a symlink
    /// renamed over a hard-linked file, then back, was missing from `ls` of its directory).
    /// The caller then refreshes the directory ([`SideClient::refresh_dir`]).
    pub fn vacated(&self, dir: u64, name: &CStr, ino: u64) -> bool {
        let mut v = self.vacated.lock().unwrap_or_else(|e| e.into_inner());
        match v
            .iter()
            .position(|(d, n, i)| *d == dir && *i == ino && n.as_c_str() == name)
        {
            Some(at) => {
                v.remove(at);
                true
            }
            None => false,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_side_sessions_are_paced_after_a_burst() {
        let every = Duration::from_millis(250);
        let mut p = Pace::new(4, every);
        let t0 = Instant::now();
        // A burst at once.
        for _ in 0..4 {
            assert_eq!(p.admit(t0), Duration::ZERO);
        }
        // Then one per interval, whoever asks when.
        assert_eq!(p.admit(t0), every);
        assert_eq!(p.admit(t0), every * 2);
        assert_eq!(p.admit(t0 + every * 2), every);
        // A quiet spell fills the bucket again, never beyond the burst.
        let later = t0 + every * 100;
        for _ in 0..4 {
            assert_eq!(p.admit(later), Duration::ZERO);
        }
        assert_eq!(p.admit(later), every);
        // A loop at the sustained rate never waits.
        let mut q = Pace::new(4, every);
        for i in 0..100 {
            assert_eq!(q.admit(t0 + every * i), Duration::ZERO, "at {i}");
        }
        // Without a connector nothing is opened or paced.
        let s = SideClient::default();
        assert!(s
            .rename((1, c"a"), (1, c"b"), 7, &UserPerm::root())
            .is_none());
        assert_eq!(s.sessions(), (0, 0));
        // Nor is a name remembered as vacated by a rename that did not happen.
        assert!(!s.vacated(1, c"a", 7));
    }
}
