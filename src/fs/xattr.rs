//! Extended attributes: SETXATTR, GETXATTR, LISTXATTR and REMOVEXATTR, with the namespaces the
//! guest may not see or change ([`names::xattr_access`]) and the privileged ones only CephFS
//! root may set.

use std::ffi::CStr;
use std::io;

use fuse_backend_rs::api::filesystem::{GetxattrReply, ListxattrReply};

use crate::idmap::HostUid;

use super::names::XattrAccess;
use super::perms::Caller;
use super::{errno, names, to_len, CephFs, Node};

/// The largest xattr value Linux lets through (XATTR_SIZE_MAX).
const XATTR_SIZE_MAX: usize = 65536;

impl CephFs {
    /// Privileged xattrs: `trusted.*` (CAP_SYS_ADMIN on Linux) may be set or removed, and
    /// `security.capability` (CAP_SETFCAP) set, by CephFS root only. A guest's root whose uid
    /// --translate-uid maps or squashes to another CephFS uid has neither capability here;
    /// libcephfs itself lets any owner write them, and other clients honour file capabilities.
    /// Removing `security.capability` stays open to whoever may write the file: it takes a
    /// privilege away, and it is what the guest kernel's own kill on write sends, with the
    /// writer's credentials.
    fn privileged_xattr(&self, name: &CStr, uid: HostUid, removing: bool) -> io::Result<()> {
        let n = name.to_bytes();
        let caps = n == b"security.capability" && !removing;
        if !uid.is_root() && (n.starts_with(b"trusted.") || caps) {
            return Err(errno(libc::EPERM));
        }
        Ok(())
    }

    /// Read the whole (filtered) xattr name list.
    fn xattr_list(&self, node: &Node, perm: &ceph_client::UserPerm) -> io::Result<Vec<u8>> {
        loop {
            let size = self.mount().listxattr(&*self.inode(node)?, &mut [], perm)?;
            let mut buf = vec![0u8; size];
            match self.mount().listxattr(&*self.inode(node)?, &mut buf, perm) {
                Ok(n) => {
                    buf.truncate(n);
                    names::filter_xattr_list(&mut buf);
                    return Ok(buf);
                }
                // The list grew between the two calls: ask again.
                Err(e) if e.errno() == libc::ERANGE => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// FUSE_SETXATTR_ACL_KILL_SGID after a POSIX access ACL was set: clear the setgid bit,
    /// as Linux's `posix_acl_update_mode` does for a caller neither in the file's group nor
    /// holding CAP_FSETID (the guest kernel decided that). libcephfs folds the ACL into the
    /// mode but keeps the bit. Done as root: the caller just changed the ACL, which needs
    /// ownership, and libcephfs would check group membership by the primary gid only.
    pub(super) fn do_acl_kill_sgid(&self, ctx: &Caller, inode: u64) -> io::Result<()> {
        let node = self.node_op(inode, "setxattr", ctx)?;
        let ino_ref = self.inode(&node)?;
        let root = self.perms.root();
        let st = self
            .mount()
            .getattr(&ino_ref, ceph_client::CEPH_STATX_MODE, 0, &root)?;
        let mode = u32::from(st.stx_mode);
        if mode & libc::S_ISGID == 0 {
            return Ok(());
        }
        let set = ceph_client::Statx {
            stx_mode: u16::try_from(mode & 0o7777 & !libc::S_ISGID).unwrap_or(0),
            ..Default::default()
        };
        Ok(self
            .mount()
            .setattr(&ino_ref, &set, ceph_client::CEPH_SETATTR_MODE, &root)?)
    }

    pub(super) fn do_setxattr(
        &self,
        ctx: &Caller,
        inode: u64,
        name: &CStr,
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        if !self.cfg.xattr {
            return Err(errno(libc::ENOSYS));
        }
        match names::xattr_access(name.to_bytes(), self.cfg.allow_ceph_xattr_set) {
            XattrAccess::Full => {}
            XattrAccess::ReadOnly | XattrAccess::Hidden => return Err(errno(libc::EPERM)),
        }
        self.privileged_xattr(name, ctx.host_uid(), false)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(errno(libc::E2BIG));
        }
        let flags = i32::try_from(flags).map_err(|_| errno(libc::EINVAL))?;
        let node = self.node_op(inode, "setxattr", ctx)?;
        Ok(self
            .mount()
            .setxattr(&*self.inode(&node)?, name, value, flags, &self.perm(ctx))?)
    }

    pub(super) fn do_getxattr(
        &self,
        ctx: &Caller,
        inode: u64,
        name: &CStr,
        size: u32,
    ) -> io::Result<GetxattrReply> {
        if !self.cfg.xattr {
            return Err(errno(libc::ENOSYS));
        }
        if names::xattr_access(name.to_bytes(), true) == XattrAccess::Hidden {
            return Err(errno(libc::ENODATA));
        }
        let node = self.node_op(inode, "getxattr", ctx)?;
        let perm = self.perm(ctx);
        if size == 0 {
            let n = self
                .mount()
                .getxattr(&*self.inode(&node)?, name, &mut [], &perm)?;
            return Ok(GetxattrReply::Count(
                u32::try_from(n).map_err(|_| errno(libc::E2BIG))?,
            ));
        }
        let mut buf = vec![0u8; to_len(size)?.min(XATTR_SIZE_MAX)];
        let n = self
            .mount()
            .getxattr(&*self.inode(&node)?, name, &mut buf, &perm)?;
        buf.truncate(n);
        Ok(GetxattrReply::Value(buf))
    }

    pub(super) fn do_listxattr(
        &self,
        ctx: &Caller,
        inode: u64,
        size: u32,
    ) -> io::Result<ListxattrReply> {
        if !self.cfg.xattr {
            return Err(errno(libc::ENOSYS));
        }
        let node = self.node_op(inode, "listxattr", ctx)?;
        let list = self.xattr_list(&node, &self.perm(ctx))?;
        let len = u32::try_from(list.len()).map_err(|_| errno(libc::E2BIG))?;
        if size == 0 {
            Ok(ListxattrReply::Count(len))
        } else if len > size {
            Err(errno(libc::ERANGE))
        } else {
            Ok(ListxattrReply::Names(list))
        }
    }

    pub(super) fn do_removexattr(&self, ctx: &Caller, inode: u64, name: &CStr) -> io::Result<()> {
        if !self.cfg.xattr {
            return Err(errno(libc::ENOSYS));
        }
        match names::xattr_access(name.to_bytes(), self.cfg.allow_ceph_xattr_set) {
            XattrAccess::Full => {}
            XattrAccess::ReadOnly => return Err(errno(libc::EPERM)),
            XattrAccess::Hidden => return Err(errno(libc::ENODATA)),
        }
        self.privileged_xattr(name, ctx.host_uid(), true)?;
        let node = self.node_op(inode, "removexattr", ctx)?;
        match self
            .mount()
            .removexattr(&*self.inode(&node)?, name, &self.perm(ctx))
        {
            // libcephfs says ENOENT for a name the inode does not carry (when it carries
            // others); Linux says ENODATA. The inode itself exists: we hold it.
            Err(e) if e.errno() == libc::ENOENT => Err(errno(libc::ENODATA)),
            r => Ok(r?),
        }
    }
}
