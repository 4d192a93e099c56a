//! Locks: POSIX byte-range locks (GETLK, SETLK, SETLKW), BSD flock (SETLK/SETLKW with
//! LK_FLOCK), the release of a closing owner's locks at FLUSH, and the conversions between
//! FUSE's lock ranges and `struct flock`.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fuse_backend_rs::abi::fuse_abi::LK_FLOCK;
use fuse_backend_rs::api::filesystem::FileLock;

use crate::idmap::GuestUid;

use super::open::OpenFile;
use super::perms::Caller;
use super::{errno, CephFs, Handle};

impl CephFs {
    pub(super) fn do_flush(
        &self,
        uid: GuestUid,
        inode: u64,
        handle: u64,
        lock_owner: u64,
    ) -> io::Result<()> {
        let f = self.file(inode, handle, "flush", uid)?;
        // close() releases the POSIX locks of the closing owner, as the local kernel would.
        if f.locked.load(Ordering::Relaxed) {
            let unlock = whole_file_lock(F_UNLCK);
            f.file.setlk(&unlock, lock_owner, false)?;
        }
        Ok(())
    }

    pub(super) fn do_getlk(
        &self,
        ctx: &Caller,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        _flags: u32,
    ) -> io::Result<FileLock> {
        let f = self.file(inode, handle, "getlk", ctx.guest_uid())?;
        let mut fl = to_flock(&lock)?;
        f.file.getlk(&mut fl, owner)?;
        Ok(from_flock(&fl))
    }

    pub(super) fn do_setlk(
        &self,
        ctx: &Caller,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        flags: u32,
    ) -> io::Result<()> {
        self.set_lock(inode, handle, owner, lock, flags, false, ctx.guest_uid())
    }

    pub(super) fn do_setlkw(
        &self,
        ctx: &Caller,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        flags: u32,
    ) -> io::Result<()> {
        self.set_lock(inode, handle, owner, lock, flags, true, ctx.guest_uid())
    }

    #[allow(clippy::too_many_arguments)]
    fn set_lock(
        &self,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        flags: u32,
        sleep: bool,
        uid: GuestUid,
    ) -> io::Result<()> {
        let f = self.file(inode, handle, "lock", uid)?;
        if flags & LK_FLOCK != 0 {
            let mut op = match i32::try_from(lock.lock_type).unwrap_or(-1) {
                libc::F_RDLCK => libc::LOCK_SH,
                libc::F_WRLCK => libc::LOCK_EX,
                libc::F_UNLCK => libc::LOCK_UN,
                _ => return Err(errno(libc::EINVAL)),
            };
            if !sleep {
                op |= libc::LOCK_NB;
            }
            if op & libc::LOCK_UN == 0 {
                f.flocked.store(true, Ordering::Relaxed);
            }
            f.file.flock(op, owner)?;
            if sleep && op != libc::LOCK_UN {
                self.after_lock_wait(&f, inode, handle, uid, || {
                    f.file.flock(libc::LOCK_UN, owner)
                })?;
            }
            return Ok(());
        }
        let fl = to_flock(&lock)?;
        f.locked.store(true, Ordering::Relaxed);
        f.file.setlk(&fl, owner, sleep)?;
        if sleep && i32::from(fl.l_type) != libc::F_UNLCK {
            let unlock = libc::flock {
                l_type: F_UNLCK,
                ..fl
            };
            self.after_lock_wait(&f, inode, handle, uid, || {
                f.file.setlk(&unlock, owner, false)
            })?;
        }
        Ok(())
    }

    /// A lock granted after waiting (SETLKW, a blocking flock) may have waited across a
    /// quarantine, or across the end of the guest's session (a reboot: its next FUSE_INIT
    /// closed the handle the wait was made on, and nobody will unlock for the dead boot): the
    /// gate is asked again and the handle looked up again, and a lock the guest may no longer
    /// have is given back (EACCES, EBADF).
    fn after_lock_wait(
        &self,
        f: &Arc<OpenFile>,
        inode: u64,
        handle: u64,
        uid: GuestUid,
        unlock: impl FnOnce() -> Result<(), ceph_client::CephError>,
    ) -> io::Result<()> {
        let still_open = self
            .handles
            .get(inode, handle)
            .is_ok_and(|h| matches!(&h.handle, Handle::File(g) if Arc::ptr_eq(g, f)));
        let allowed = if still_open {
            self.gate(self.domain_of(&f.node), "lock", uid)
        } else {
            Err(errno(libc::EBADF))
        };
        match allowed {
            Ok(()) => Ok(()),
            Err(e) => {
                if let Err(u) = unlock() {
                    tracing::warn!(%u, "giving back a lock granted after a quarantine or after its session ended");
                }
                Err(e)
            }
        }
    }
}

/// libc's lock constants are c_int, struct flock holds them as c_short.
#[allow(clippy::as_conversions, clippy::cast_possible_truncation)] // checked: consts only
const fn short(v: i32) -> i16 {
    let s = v as i16;
    assert!(s as i32 == v, "a lock constant does not fit struct flock");
    s
}
// Evaluated at compile time: a constant that did not fit would fail the build.
const F_UNLCK: i16 = short(libc::F_UNLCK);
const SEEK_SET: i16 = short(libc::SEEK_SET);
/// A lock end at or past this means "to end of file" (Linux sends OFFSET_MAX).
const TO_EOF: u64 = i64::MAX.unsigned_abs();

fn whole_file_lock(kind: i16) -> libc::flock {
    libc::flock {
        l_type: kind,
        l_whence: SEEK_SET,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    }
}

/// FUSE lock range [start, end] (end = OFFSET_MAX for "to EOF") as a struct flock.
fn to_flock(lock: &FileLock) -> io::Result<libc::flock> {
    let start = i64::try_from(lock.start).map_err(|_| errno(libc::EINVAL))?;
    let len = if lock.end >= TO_EOF {
        0
    } else if lock.end < lock.start {
        return Err(errno(libc::EINVAL));
    } else {
        i64::try_from(lock.end - lock.start + 1).map_err(|_| errno(libc::EINVAL))?
    };
    let l_type = i16::try_from(lock.lock_type).map_err(|_| errno(libc::EINVAL))?;
    if ![libc::F_RDLCK, libc::F_WRLCK, libc::F_UNLCK].contains(&i32::from(l_type)) {
        return Err(errno(libc::EINVAL));
    }
    Ok(libc::flock {
        l_type,
        l_whence: SEEK_SET,
        l_start: start,
        l_len: len,
        l_pid: i32::try_from(lock.pid).unwrap_or(0),
    })
}

fn from_flock(fl: &libc::flock) -> FileLock {
    let start = u64::try_from(fl.l_start).unwrap_or(0);
    let end = if fl.l_len <= 0 {
        TO_EOF
    } else {
        start.saturating_add(fl.l_len.unsigned_abs() - 1)
    };
    FileLock {
        start,
        end,
        lock_type: u32::try_from(fl.l_type).unwrap_or(libc::F_UNLCK.unsigned_abs()),
        pid: u32::try_from(fl.l_pid).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_ranges_convert_both_ways() {
        let l = FileLock {
            start: 10,
            end: 19,
            lock_type: libc::F_WRLCK as u32,
            pid: 42,
        };
        let fl = to_flock(&l).unwrap();
        assert_eq!((fl.l_start, fl.l_len), (10, 10));
        let back = from_flock(&fl);
        assert_eq!((back.start, back.end, back.pid), (10, 19, 42));
        let eof = FileLock {
            start: 5,
            end: u64::MAX,
            lock_type: libc::F_RDLCK as u32,
            pid: 1,
        };
        assert_eq!(to_flock(&eof).unwrap().l_len, 0);
        assert_eq!(from_flock(&to_flock(&eof).unwrap()).end, i64::MAX as u64);
        let bad = FileLock {
            start: 20,
            end: 10,
            ..l
        };
        assert_eq!(
            to_flock(&bad).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        let past = FileLock {
            start: u64::MAX - 1,
            ..l
        };
        assert_eq!(
            to_flock(&past).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        let kind = FileLock { lock_type: 99, ..l };
        assert!(to_flock(&kind).is_err());
    }
}
