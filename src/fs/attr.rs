//! Attributes: GETATTR, SETATTR, ACCESS and STATFS, and the conversions between libcephfs's
//! statx and the guest's stat (the one place attributes leave the filesystem, with the owner
//! mapped to the guest's ids). A SETATTR is a pure request ([`setattr_request`]) plus the call;
//! the privileges it must clear are [`super::kill`]'s.

use std::io;
use std::time::Duration;

use ceph_client::{
    Statx, CEPH_SETATTR_ATIME, CEPH_SETATTR_ATIME_NOW, CEPH_SETATTR_CTIME, CEPH_SETATTR_GID,
    CEPH_SETATTR_KILL_SGUID, CEPH_SETATTR_MODE, CEPH_SETATTR_MTIME, CEPH_SETATTR_MTIME_NOW,
    CEPH_SETATTR_SIZE, CEPH_SETATTR_UID, CEPH_STATX_UID,
};
use fuse_backend_rs::abi::fuse_abi::{stat64, statvfs64, SetattrValid};

use crate::idmap::{HostGid, HostUid, IdMapping};

use super::perms::Caller;
use super::{errno, perm_bits, perms, CephFs, Handle, Node, WANT};

fn timespec_to(t: &ceph_client::Timespec) -> (i64, i64) {
    (t.tv_sec, t.tv_nsec)
}

/// A libcephfs statx as the stat64 the guest gets: the one place attributes leave the
/// filesystem, where the owner becomes the guest's ids.
pub(super) fn to_stat(st: &Statx, ids: &IdMapping) -> stat64 {
    // SAFETY: stat64 is a plain C struct of integers (with private padding fields, which is why
    // it cannot be built field by field); the all-zero bit pattern is a valid value for it.
    let mut s: stat64 = unsafe { std::mem::zeroed() };
    s.st_ino = st.stx_ino;
    s.st_nlink = u64::from(st.stx_nlink);
    s.st_mode = u32::from(st.stx_mode);
    s.st_uid = ids.guest_uid(HostUid::new(st.stx_uid)).get();
    s.st_gid = ids.guest_gid(HostGid::new(st.stx_gid)).get();
    s.st_rdev = st.stx_rdev;
    s.st_size = i64::try_from(st.stx_size).unwrap_or(i64::MAX);
    s.st_blksize = i64::from(st.stx_blksize);
    s.st_blocks = i64::try_from(st.stx_blocks).unwrap_or(i64::MAX);
    (s.st_atime, s.st_atime_nsec) = timespec_to(&st.stx_atime);
    (s.st_mtime, s.st_mtime_nsec) = timespec_to(&st.stx_mtime);
    (s.st_ctime, s.st_ctime_nsec) = timespec_to(&st.stx_ctime);
    s
}

/// The libcephfs setattr for a FUSE SETATTR: the attributes and the mask, with `now` for
/// whatever the request leaves to the server to time:
/// - `*_NOW` bits: libcephfs 16 ignores them in ll_setattr, so "now" is taken here;
/// - a size change without a time (ftruncate(2), and O_TRUNC opens the kernel turns into
///   SETATTR): Linux sets mtime and ctime to now. libcephfs does not, and when it grows a file
///   locally under its exclusive cap it takes the mtime from the request as it stands (0);
/// - ctime, on every change (see below).
fn setattr_request(
    attr: &stat64,
    valid: SetattrValid,
    now: ceph_client::Timespec,
) -> io::Result<(Statx, u32)> {
    let mut st = Statx::default();
    let mut mask = 0;
    if valid.contains(SetattrValid::MODE) {
        mask |= CEPH_SETATTR_MODE;
        st.stx_mode = perm_bits(attr.st_mode);
    }
    if valid.contains(SetattrValid::UID) {
        mask |= CEPH_SETATTR_UID;
        st.stx_uid = attr.st_uid;
    }
    if valid.contains(SetattrValid::GID) {
        mask |= CEPH_SETATTR_GID;
        st.stx_gid = attr.st_gid;
    }
    if valid.contains(SetattrValid::SIZE) {
        mask |= CEPH_SETATTR_SIZE;
        st.stx_size = u64::try_from(attr.st_size).map_err(|_| errno(libc::EINVAL))?;
    }
    // A "now" keeps its *_NOW bit next to the time: libcephfs lets a non-owner with write
    // permission set the times to now (utimensat's UTIME_NOW, truncate), only the owner set
    // explicit ones.
    let time = |now_bit, set_bit, tv_sec, tv_nsec| {
        if valid.contains(now_bit) {
            Some((now, true))
        } else if valid.contains(set_bit) {
            Some((ceph_client::Timespec { tv_sec, tv_nsec }, false))
        } else {
            None
        }
    };
    if let Some((t, is_now)) = time(
        SetattrValid::ATIME_NOW,
        SetattrValid::ATIME,
        attr.st_atime,
        attr.st_atime_nsec,
    ) {
        mask |= CEPH_SETATTR_ATIME | if is_now { CEPH_SETATTR_ATIME_NOW } else { 0 };
        st.stx_atime = t;
    }
    if let Some((t, is_now)) = time(
        SetattrValid::MTIME_NOW,
        SetattrValid::MTIME,
        attr.st_mtime,
        attr.st_mtime_nsec,
    ) {
        mask |= CEPH_SETATTR_MTIME | if is_now { CEPH_SETATTR_MTIME_NOW } else { 0 };
        st.stx_mtime = t;
    }
    // CTIME has no "now" form.
    if valid.contains(SetattrValid::CTIME) {
        mask |= CEPH_SETATTR_CTIME;
        st.stx_ctime = ceph_client::Timespec {
            tv_sec: attr.st_ctime,
            tv_nsec: attr.st_ctime_nsec,
        };
    }
    if mask & CEPH_SETATTR_SIZE != 0 && mask & CEPH_SETATTR_MTIME == 0 {
        mask |= CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW;
        st.stx_mtime = now;
    }
    // Every attribute change sets ctime to now on Linux, also one that changes nothing
    // (`chown u:g` to the current owner), which libcephfs skips. Only for the changes that
    // need the owner anyway: libcephfs lets nobody else set ctime.
    if mask & (CEPH_SETATTR_MODE | CEPH_SETATTR_UID | CEPH_SETATTR_GID) != 0
        && mask & CEPH_SETATTR_CTIME == 0
    {
        mask |= CEPH_SETATTR_CTIME;
        st.stx_ctime = now;
    }
    Ok((st, mask))
}

/// Whether a SETATTR is a chmod setting setgid, alone (but for ctime), by someone other than
/// root: if the caller owns the file, it is done as root (see `CephFs::do_setattr`).
fn chmod_sets_sgid(st: &Statx, mask: u32, uid: u32) -> bool {
    mask & CEPH_SETATTR_MODE != 0
        && u32::from(st.stx_mode) & libc::S_ISGID != 0
        && uid != 0
        && mask & !(CEPH_SETATTR_MODE | CEPH_SETATTR_CTIME) == 0
}

/// ftruncate(2) needs only a descriptor open for writing, not write permission on the
/// file now (think of a file created with mode 0): libcephfs checks the mode, so a size
/// change through a writable handle of ours runs with root credentials. Root could set
/// any time: the times are what ftruncate(2) sets, now (explicit times need the owner,
/// and a guest could otherwise date files it does not own as it likes). `None`: the request
/// is more than a size change (and its times), and runs with the caller's credentials.
fn ftruncate_request(st: &Statx, mask: u32, now: ceph_client::Timespec) -> Option<(Statx, u32)> {
    let size_and_times = CEPH_SETATTR_SIZE
        | CEPH_SETATTR_MTIME
        | CEPH_SETATTR_MTIME_NOW
        | CEPH_SETATTR_CTIME
        | CEPH_SETATTR_KILL_SGUID;
    if mask & CEPH_SETATTR_SIZE == 0 || mask & !size_and_times != 0 {
        return None;
    }
    let (mut st, mut mask) = (*st, mask);
    if mask & CEPH_SETATTR_MTIME != 0 {
        mask |= CEPH_SETATTR_MTIME_NOW;
        st.stx_mtime = now;
    }
    mask &= !CEPH_SETATTR_CTIME;
    Some((st, mask))
}

impl CephFs {
    /// Whether a setattr libcephfs refused with EPERM is one Linux allows, to be redone with
    /// root credentials (`Ok(false)`: the EPERM stands), decided on the inode's current
    /// attributes. The one case:
    /// an owner's change of its file's group to one of its groups (POSIX). FUSE does not carry
    /// supplementary groups, so libcephfs, which knows only the primary gid, refuses what the
    /// guest kernel (virtiofs always mounts with `default_permissions`) has already checked
    /// against the full group list. A uid in the request equal to the owner's (as chown(1)
    /// sends it) changes nothing; a mode in it is the one chown must leave.
    fn allowed_by_guest(
        &self,
        node: &Node,
        st: &Statx,
        mask: u32,
        ctx: &Caller,
        perm: &ceph_client::UserPerm,
    ) -> io::Result<bool> {
        let cur = self.mount().getattr(&*self.inode(node)?, WANT, 0, perm)?;
        let chown = CEPH_SETATTR_UID
            | CEPH_SETATTR_GID
            | CEPH_SETATTR_MODE
            | CEPH_SETATTR_CTIME
            | CEPH_SETATTR_KILL_SGUID;
        Ok(HostUid::new(cur.stx_uid) == ctx.host_uid()
            && mask & CEPH_SETATTR_GID != 0
            && mask & !chown == 0
            && (mask & CEPH_SETATTR_UID == 0 || st.stx_uid == cur.stx_uid))
    }

    pub(super) fn do_getattr(&self, ctx: &Caller, inode: u64) -> io::Result<(stat64, Duration)> {
        let node = self.node_op(inode, "getattr", ctx)?;
        let mut st = self
            .mount()
            .getattr(&*self.inode(&node)?, WANT, 0, &self.perm(ctx))?;
        self.tmpfile_nlink(node.id, &mut st.stx_nlink);
        Ok((
            to_stat(&st, &self.cfg.idmap),
            self.policy.ttl(self.class(&node)).attr,
        ))
    }

    /// [`Self::do_getattr`] with the birth time CephFS keeps (`CEPH_STATX_BTIME`), for STATX.
    pub(super) fn do_statx(
        &self,
        ctx: &Caller,
        inode: u64,
    ) -> io::Result<(stat64, crate::wire::Btime, Duration)> {
        let node = self.node_op(inode, "statx", ctx)?;
        let st = self.mount().getattr(
            &*self.inode(&node)?,
            WANT | ceph_client::CEPH_STATX_BTIME,
            0,
            &self.perm(ctx),
        )?;
        let btime = (st.stx_mask & ceph_client::CEPH_STATX_BTIME != 0)
            .then(|| {
                let t = &st.stx_btime;
                Some((t.tv_sec, u32::try_from(t.tv_nsec).ok()?))
            })
            .flatten();
        let mut st = st;
        self.tmpfile_nlink(node.id, &mut st.stx_nlink);
        Ok((
            to_stat(&st, &self.cfg.idmap),
            btime,
            self.policy.ttl(self.class(&node)).attr,
        ))
    }

    pub(super) fn do_setattr(
        &self,
        ctx: &Caller,
        inode: u64,
        attr: stat64,
        handle: Option<u64>,
        valid: SetattrValid,
    ) -> io::Result<(stat64, Duration)> {
        let attr = perms::setattr_owners(attr, valid, &self.cfg.idmap)?;
        let node = self.node_op(inode, "setattr", ctx)?;
        // Only a regular file has a size to set (Linux's do_truncate: EISDIR, else EINVAL).
        // Pacific's MDS dies of the others: a directory's size set and then lowered is a
        // SIGFPE in Filer::truncate, a special file's trips an assert (hostile suite).
        if valid.contains(SetattrValid::SIZE) && node.kind != libc::S_IFREG {
            return Err(errno(if node.is_dir() {
                libc::EISDIR
            } else {
                libc::EINVAL
            }));
        }
        // A handle, when given, must be one of ours for this node.
        let through_writable_handle = match handle {
            Some(fh) => match &self.handles.get(inode, fh).map_err(errno)?.handle {
                Handle::File(f) => f.writable,
                Handle::Dir(_) => false,
            },
            None => false,
        };
        let mut perm = self.perm(ctx);
        let now = ceph_client::Timespec::now();
        let (mut st, mut mask) = setattr_request(&attr, valid, now)?;
        let kill = self.setattr_kill(&node, mask, valid, &perm)?;
        mask |= kill.mask;
        // chmod g+s by an owner who belongs to the file's group only through a supplementary
        // group: libcephfs, which knows the primary gid only, drops the bit silently. The
        // guest kernel already cleared it where the caller is no member of the group
        // (`default_permissions`), so the owner's mode is set as root.
        if chmod_sets_sgid(&st, mask, ctx.host_uid().get())
            && self
                .mount()
                .getattr(&*self.inode(&node)?, CEPH_STATX_UID, 0, &perm)?
                .stx_uid
                == ctx.host_uid().get()
        {
            perm = self.perms.root();
        }
        // ftruncate(2) needs only a descriptor open for writing (`ftruncate_request`).
        if through_writable_handle {
            if let Some((s, m)) = ftruncate_request(&st, mask, now) {
                perm = self.perms.root();
                (st, mask) = (s, m);
            }
        }
        if mask != 0 {
            match self.mount().setattr(&*self.inode(&node)?, &st, mask, &perm) {
                Ok(()) => {}
                // libcephfs checks with the primary gid only and turns "now" into explicit
                // times; some changes Linux allows it refuses. See `allowed_by_guest`.
                Err(e) if e.errno() == libc::EPERM && !ctx.host_uid().is_root() => {
                    if !self.allowed_by_guest(&node, &st, mask, ctx, &perm)? {
                        return Err(e.into());
                    }
                    self.mount()
                        .setattr(&*self.inode(&node)?, &st, mask, &self.perms.root())?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.after_setattr(&node, mask, kill)?;
        let mut out = self.mount().getattr(&*self.inode(&node)?, WANT, 0, &perm)?;
        self.tmpfile_nlink(node.id, &mut out.stx_nlink);
        Ok((
            to_stat(&out, &self.cfg.idmap),
            self.policy.ttl(self.class(&node)).attr,
        ))
    }

    pub(super) fn do_statfs(&self, ctx: &Caller, inode: u64) -> io::Result<statvfs64> {
        let node = self.node_op(inode, "statfs", ctx)?;
        let s = self.mount().statfs(&*self.inode(&node)?)?;
        // SAFETY: statvfs64 is a plain C struct of integers (with private padding); all-zero is
        // a valid value for it.
        let mut out: statvfs64 = unsafe { std::mem::zeroed() };
        out.f_bsize = s.f_bsize;
        out.f_frsize = s.f_frsize;
        out.f_blocks = s.f_blocks;
        out.f_bfree = s.f_bfree;
        out.f_bavail = s.f_bavail;
        out.f_files = s.f_files;
        out.f_ffree = s.f_ffree;
        out.f_favail = s.f_favail;
        out.f_fsid = s.f_fsid;
        out.f_flag = s.f_flag;
        out.f_namemax = s.f_namemax;
        Ok(out)
    }

    pub(super) fn do_access(&self, ctx: &Caller, inode: u64, mask: u32) -> io::Result<()> {
        let node = self.node_op(inode, "access", ctx)?;
        let st = self
            .mount()
            .getattr(&*self.inode(&node)?, WANT, 0, &self.perm(ctx))?;
        access_allowed(&st, ctx.host_uid().get(), ctx.host_gid().get(), mask)
            .then_some(())
            .ok_or_else(|| errno(libc::EACCES))
    }
}

/// access(2) against the attributes, for the caller's uid and primary gid (FUSE does not carry
/// supplementary groups). root may read/write anything and execute what has any x bit.
pub fn access_allowed(st: &Statx, uid: u32, gid: u32, mask: u32) -> bool {
    let mode = u32::from(st.stx_mode);
    let mask = mask & 0o7;
    if mask == 0 {
        return true;
    }
    if uid == 0 {
        let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
        return mask & 1 == 0 || is_dir || mode & 0o111 != 0;
    }
    let bits = if st.stx_uid == uid {
        (mode >> 6) & 7
    } else if st.stx_gid == gid {
        (mode >> 3) & 7
    } else {
        mode & 7
    };
    bits & mask == mask
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(mode: u32, uid: u32, gid: u32) -> Statx {
        Statx {
            stx_mode: mode as u16,
            stx_uid: uid,
            stx_gid: gid,
            ..Default::default()
        }
    }

    #[test]
    fn access_follows_owner_group_other() {
        let f = st(libc::S_IFREG | 0o640, 1000, 100);
        assert!(access_allowed(&f, 1000, 1, 6));
        assert!(!access_allowed(&f, 1000, 1, 1));
        assert!(access_allowed(&f, 2000, 100, 4));
        assert!(!access_allowed(&f, 2000, 100, 2));
        assert!(!access_allowed(&f, 2000, 200, 4));
        assert!(access_allowed(&f, 0, 0, 6));
        assert!(
            !access_allowed(&f, 0, 0, 1),
            "root needs some x bit to execute"
        );
        assert!(access_allowed(&st(libc::S_IFDIR | 0o700, 5, 5), 0, 0, 1));
        assert!(access_allowed(&f, 2000, 200, 0), "F_OK");
    }

    fn attr() -> stat64 {
        let mut a = to_stat(&Statx::default(), &IdMapping::default());
        a.st_size = 4123;
        a.st_mtime = 978_307_200;
        a.st_mtime_nsec = 5;
        a
    }

    const NOW: ceph_client::Timespec = ceph_client::Timespec {
        tv_sec: 1_800_000_000,
        tv_nsec: 7,
    };

    #[test]
    fn a_size_change_alone_sets_mtime_to_now() {
        // ftruncate(2): the kernel sends the size only.
        let (st, mask) = setattr_request(&attr(), SetattrValid::SIZE, NOW).unwrap();
        assert_eq!(
            mask,
            CEPH_SETATTR_SIZE | CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW
        );
        assert_eq!((st.stx_size, st.stx_mtime), (4123, NOW));
        // truncate(2): size and "mtime now".
        let v = SetattrValid::SIZE | SetattrValid::MTIME | SetattrValid::MTIME_NOW;
        let (st, mask) = setattr_request(&attr(), v, NOW).unwrap();
        assert_eq!(
            mask,
            CEPH_SETATTR_SIZE | CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW
        );
        assert_eq!(st.stx_mtime, NOW);
        // An explicit time given with the size stays as given.
        let v = SetattrValid::SIZE | SetattrValid::MTIME;
        let (st, mask) = setattr_request(&attr(), v, NOW).unwrap();
        assert_eq!(mask, CEPH_SETATTR_SIZE | CEPH_SETATTR_MTIME);
        assert_eq!(
            (st.stx_mtime.tv_sec, st.stx_mtime.tv_nsec),
            (978_307_200, 5)
        );
    }

    #[test]
    fn now_times_keep_their_now_bits() {
        let v = SetattrValid::ATIME
            | SetattrValid::ATIME_NOW
            | SetattrValid::MTIME
            | SetattrValid::MTIME_NOW;
        let (st, mask) = setattr_request(&attr(), v, NOW).unwrap();
        assert_eq!(
            mask,
            CEPH_SETATTR_ATIME
                | CEPH_SETATTR_ATIME_NOW
                | CEPH_SETATTR_MTIME
                | CEPH_SETATTR_MTIME_NOW
        );
        assert_eq!((st.stx_atime, st.stx_mtime), (NOW, NOW));
        // Explicit times carry no NOW bit (libcephfs then requires the owner).
        let v = SetattrValid::ATIME | SetattrValid::MTIME;
        let (_, mask) = setattr_request(&attr(), v, NOW).unwrap();
        assert_eq!(mask, CEPH_SETATTR_ATIME | CEPH_SETATTR_MTIME);
        // A mode or owner change sets ctime to now, even when it changes nothing.
        let v = SetattrValid::MODE | SetattrValid::UID;
        let (st, mask) = setattr_request(&attr(), v, NOW).unwrap();
        assert_eq!(
            mask,
            CEPH_SETATTR_MODE | CEPH_SETATTR_UID | CEPH_SETATTR_CTIME
        );
        assert_eq!(st.stx_ctime, NOW);
    }

    /// Each SETATTR valid bit alone: the field it sets and the mask it asks for.
    #[test]
    fn each_setattr_bit_sets_its_field() {
        let mut a = attr();
        a.st_mode = libc::S_IFREG | 0o4755;
        a.st_uid = 1001;
        a.st_gid = 1002;
        a.st_atime = 111;
        a.st_atime_nsec = 1;
        a.st_ctime = 333;
        a.st_ctime_nsec = 3;
        let req = |v| setattr_request(&a, v, NOW).unwrap();
        let ts = |tv_sec, tv_nsec| ceph_client::Timespec { tv_sec, tv_nsec };

        // MODE: permission and special bits only (never the type); ctime now.
        let (st, mask) = req(SetattrValid::MODE);
        assert_eq!(mask, CEPH_SETATTR_MODE | CEPH_SETATTR_CTIME);
        assert_eq!((st.stx_mode, st.stx_ctime), (0o4755, NOW));
        // UID, GID: the owner; ctime now.
        let (st, mask) = req(SetattrValid::UID);
        assert_eq!(mask, CEPH_SETATTR_UID | CEPH_SETATTR_CTIME);
        assert_eq!((st.stx_uid, st.stx_ctime), (1001, NOW));
        let (st, mask) = req(SetattrValid::GID);
        assert_eq!(mask, CEPH_SETATTR_GID | CEPH_SETATTR_CTIME);
        assert_eq!((st.stx_gid, st.stx_ctime), (1002, NOW));
        // SIZE: the size, and mtime now (see a_size_change_alone_sets_mtime_to_now).
        let (st, mask) = req(SetattrValid::SIZE);
        assert_eq!(
            mask,
            CEPH_SETATTR_SIZE | CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW
        );
        assert_eq!((st.stx_size, st.stx_mtime), (4123, NOW));
        // ATIME, MTIME: explicit times, no NOW bit, no ctime (libcephfs sets it).
        let (st, mask) = req(SetattrValid::ATIME);
        assert_eq!((mask, st.stx_atime), (CEPH_SETATTR_ATIME, ts(111, 1)));
        let (st, mask) = req(SetattrValid::MTIME);
        assert_eq!(
            (mask, st.stx_mtime),
            (CEPH_SETATTR_MTIME, ts(978_307_200, 5))
        );
        // ATIME_NOW, MTIME_NOW: now, with the NOW bit (also without ATIME/MTIME).
        let (st, mask) = req(SetattrValid::ATIME_NOW);
        assert_eq!(
            (mask, st.stx_atime),
            (CEPH_SETATTR_ATIME | CEPH_SETATTR_ATIME_NOW, NOW)
        );
        let (st, mask) = req(SetattrValid::MTIME_NOW);
        assert_eq!(
            (mask, st.stx_mtime),
            (CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW, NOW)
        );
        // CTIME: the explicit ctime, kept (no now).
        let (st, mask) = req(SetattrValid::CTIME);
        assert_eq!((mask, st.stx_ctime), (CEPH_SETATTR_CTIME, ts(333, 3)));
        // An explicit ctime wins over the "ctime now" of a mode change.
        let (st, mask) = req(SetattrValid::MODE | SetattrValid::CTIME);
        assert_eq!(mask, CEPH_SETATTR_MODE | CEPH_SETATTR_CTIME);
        assert_eq!(st.stx_ctime, ts(333, 3));
        // KILL_SUIDGID sets no field of its own: the setuid/setgid clearing it asks for is
        // decided against the inode's mode (`CephFs::setattr_kill`).
        assert_eq!(req(SetattrValid::KILL_SUIDGID).1, 0);
        assert_eq!(req(SetattrValid::empty()).1, 0);
    }

    #[test]
    fn ftruncate_through_a_handle_sets_size_and_times_to_now_only() {
        let (st, mask) = setattr_request(&attr(), SetattrValid::SIZE, NOW).unwrap();
        // ftruncate(2): size, mtime now; ctime is libcephfs's to set (root may not choose it).
        let (ft, fmask) = ftruncate_request(&st, mask | CEPH_SETATTR_CTIME, NOW).unwrap();
        assert_eq!(
            fmask,
            CEPH_SETATTR_SIZE | CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW
        );
        assert_eq!((ft.stx_size, ft.stx_mtime), (4123, NOW));
        // An explicit mtime with the size becomes now: root could set any.
        let v = SetattrValid::SIZE | SetattrValid::MTIME;
        let (st, mask) = setattr_request(&attr(), v, NOW).unwrap();
        let (ft, fmask) = ftruncate_request(&st, mask, NOW).unwrap();
        assert_eq!(
            (fmask, ft.stx_mtime),
            (
                CEPH_SETATTR_SIZE | CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW,
                NOW
            )
        );
        // The kill bit stays.
        let (_, fmask) = ftruncate_request(&st, mask | CEPH_SETATTR_KILL_SGUID, NOW).unwrap();
        assert_ne!(fmask & CEPH_SETATTR_KILL_SGUID, 0);
        // Anything more than a size change (and its times), or no size: the caller's rights.
        for v in [
            SetattrValid::SIZE | SetattrValid::MODE,
            SetattrValid::SIZE | SetattrValid::UID,
            SetattrValid::SIZE | SetattrValid::ATIME,
            SetattrValid::MTIME,
        ] {
            let (st, mask) = setattr_request(&attr(), v, NOW).unwrap();
            assert!(ftruncate_request(&st, mask, NOW).is_none(), "{v:?}");
        }
    }

    #[test]
    fn only_a_plain_chmod_g_plus_s_by_a_non_root_caller_goes_as_root() {
        let mut a = attr();
        a.st_mode = libc::S_IFREG | 0o2755;
        let (st, mask) = setattr_request(&a, SetattrValid::MODE, NOW).unwrap();
        assert!(chmod_sets_sgid(&st, mask, 1000));
        assert!(!chmod_sets_sgid(&st, mask, 0), "root needs no help");
        let (st2, mask2) =
            setattr_request(&a, SetattrValid::MODE | SetattrValid::UID, NOW).unwrap();
        assert!(!chmod_sets_sgid(&st2, mask2, 1000), "not a plain chmod");
        a.st_mode = libc::S_IFREG | 0o4755;
        let (st, mask) = setattr_request(&a, SetattrValid::MODE, NOW).unwrap();
        assert!(!chmod_sets_sgid(&st, mask, 1000), "no setgid");
    }

    #[test]
    fn a_negative_size_is_refused() {
        let mut a = attr();
        a.st_size = -1;
        let e = setattr_request(&a, SetattrValid::SIZE, NOW).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn statx_becomes_stat() {
        let mut x = st(libc::S_IFREG | 0o644, 7, 8);
        x.stx_ino = 0x100_0000_0001;
        x.stx_size = u64::MAX;
        x.stx_nlink = 2;
        let s = to_stat(&x, &IdMapping::default());
        assert_eq!(s.st_ino, 0x100_0000_0001);
        assert_eq!(s.st_mode, libc::S_IFREG | 0o644);
        assert_eq!(s.st_size, i64::MAX, "sizes past i64 saturate");
        assert_eq!((s.st_uid, s.st_gid, s.st_nlink), (7, 8, 2));
    }

    #[test]
    fn replied_owners_are_the_guests_ids() {
        let rule = |r: &str| r.parse::<crate::idmap::Rule>().unwrap();
        let ids =
            IdMapping::new(&[rule("map:0:5000:1")], &[rule("squash-host:5000:0:100")]).unwrap();
        let s = to_stat(&st(libc::S_IFREG | 0o644, 5000, 5050), &ids);
        assert_eq!((s.st_uid, s.st_gid), (0, 0));
        let s = to_stat(&st(libc::S_IFREG | 0o644, 42, 42), &ids);
        assert_eq!((s.st_uid, s.st_gid), (42, 42));
    }
}
