//! Privilege removal (SB_NOSEC): applying what [`killpriv`] decides around writes, truncates and
//! owner changes — the setuid/setgid bits through `CEPH_SETATTR_KILL_SGUID` or an explicit mode
//! where the MDS's rule differs from Linux's, and `security.capability`.

use std::io;
use std::sync::atomic::Ordering;

use ceph_client::{
    Statx, CEPH_SETATTR_ATIME, CEPH_SETATTR_GID, CEPH_SETATTR_KILL_SGUID, CEPH_SETATTR_MODE,
    CEPH_SETATTR_MTIME, CEPH_SETATTR_SIZE, CEPH_SETATTR_UID, CEPH_STATX_MODE,
};
use fuse_backend_rs::abi::fuse_abi::SetattrValid;

use super::killpriv::{Kill, Trigger};
use super::{killpriv, perm_bits, CephFs, Node};

/// What a SETATTR must clear or restore around the setattr (`CephFs::setattr_kill`).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct SetattrKill {
    /// Added to the setattr's mask (`CEPH_SETATTR_KILL_SGUID`).
    pub(super) mask: u32,
    /// Special bits to put right afterwards: (mode read before, mode wanted).
    pub(super) special_after: Option<(u32, u32)>,
    /// Drop security.capability afterwards.
    pub(super) remove_caps: bool,
}

impl CephFs {
    pub(super) fn killpriv_on(&self) -> bool {
        self.killpriv.load(Ordering::Relaxed)
    }

    /// Whether the inode carries `security.capability`. libcephfs answers from its xattr cache
    /// while it holds the Xs cap, so this is normally no MDS request. Asked as root: the
    /// answer must not depend on whether the caller may read the file's xattrs.
    fn has_caps(&self, node: &Node, _perm: &ceph_client::UserPerm) -> bool {
        let name = c"security.capability";
        // An inode that cannot be found again: assume it has them (the safe answer).
        let Ok(inode) = self.inode(node) else {
            return true;
        };
        match self
            .mount()
            .getxattr(&inode, name, &mut [], &self.perms.root())
        {
            Ok(_) => true,
            Err(e) => e.errno() != libc::ENODATA,
        }
    }

    /// Clear what `kill` says, as the root of the filesystem would (the guest already decided the
    /// caller may do the operation that triggers it).
    ///
    /// The setuid/setgid bits go with CEPH_SETATTR_KILL_SGUID, not by writing back a mode: the
    /// MDS (or libcephfs under the exclusive auth cap) clears them from the mode the inode has
    /// when the change is applied, so a chmod by anyone between our read and this call stands.
    /// It clears both bits of a file with any execute bit, a little more than Linux (which
    /// keeps setgid without group-execute: a mandatory-locking marker, not a privilege).
    fn apply_kill(&self, node: &Node, kill: Kill) -> io::Result<()> {
        let root = self.perms.root();
        if kill.new_mode.is_some() {
            // Read again here, not at the decision: the fallback below then has the shortest
            // window it can have (libcephfs answers under the As cap, no MDS request).
            let cur = u32::from(
                self.mount()
                    .getattr(&*self.inode(node)?, CEPH_STATX_MODE, 0, &root)?
                    .stx_mode,
            );
            match killpriv::kill_suidgid(cur) {
                None => {}
                Some(m) if killpriv::mds_kill_sguid(cur) == m => {
                    self.mount().setattr(
                        &*self.inode(node)?,
                        &Statx::default(),
                        CEPH_SETATTR_KILL_SGUID,
                        &root,
                    )?;
                }
                // The MDS's rule differs from Linux's here: without any execute bit it leaves
                // setuid alone (a later chmod +x must not make a setuid program of what
                // another user wrote), and with one it also takes setgid without group-exec
                // (a mandatory-locking marker Linux keeps). The mode is written instead.
                Some(m) => {
                    let st = Statx {
                        stx_mode: perm_bits(m),
                        ..Default::default()
                    };
                    self.mount()
                        .setattr(&*self.inode(node)?, &st, CEPH_SETATTR_MODE, &root)?;
                }
            }
        }
        if kill.remove_caps {
            match self
                .mount()
                .removexattr(&*self.inode(node)?, c"security.capability", &root)
            {
                Ok(()) => {}
                // Gone already (libcephfs says ENOENT when the inode carries other xattrs).
                Err(e) if e.errno() == libc::ENODATA || e.errno() == libc::ENOENT => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Decide and apply privilege removal for a write-like operation. Costs one cached getattr
    /// (flagged requests only: the mode matters only when the guest asks for the suid/sgid
    /// kill) and one cached getxattr when there is nothing to kill; both are answered by
    /// libcephfs under the caps it holds (As, Xs), which the MDS revokes before another client
    /// changes the mode or the xattr, so they are never stale and cost no MDS request.
    pub(super) fn kill_privs(
        &self,
        node: &Node,
        trigger: Trigger,
        flagged: bool,
        perm: &ceph_client::UserPerm,
    ) -> io::Result<()> {
        if !self.killpriv_on() || node.is_dir() {
            return Ok(());
        }
        let mode = if flagged {
            u32::from(
                self.mount()
                    .getattr(&*self.inode(node)?, CEPH_STATX_MODE, 0, perm)?
                    .stx_mode,
            )
        } else {
            // Unflagged (a CAP_FSETID caller): the bits stay whatever they are.
            0
        };
        let kill = killpriv::decide(trigger, mode, false, flagged, self.has_caps(node, perm));
        if kill.is_empty() {
            return Ok(());
        }
        self.apply_kill(node, kill)
    }

    /// After a size or owner change: give the setuid/setgid bits the state Linux leaves
    /// (`want`, decided on the mode `before` read ahead of the change), where the MDS's rule
    /// left them otherwise. Only while the other mode bits are still those of `before`: a chmod
    /// by anyone since then stands as it is (with the special bits as the MDS left them).
    /// Re-read just before the change, as root (libcephfs answers under the As cap).
    fn put_special_bits(&self, node: &Node, before: u32, want: u32) -> io::Result<()> {
        let root = self.perms.root();
        let now = u32::from(
            self.mount()
                .getattr(&*self.inode(node)?, CEPH_STATX_MODE, 0, &root)?
                .stx_mode,
        );
        let Some(mode) = special_bits_after(before, now, want) else {
            return Ok(());
        };
        let st = Statx {
            stx_mode: perm_bits(mode),
            ..Default::default()
        };
        Ok(self
            .mount()
            .setattr(&*self.inode(node)?, &st, CEPH_SETATTR_MODE, &root)?)
    }

    /// Mode bits a chown or truncate must clear, or keep. SB_NOSEC contract: clear
    /// setuid/setgid in the same setattr when the guest flagged it (and did not set the mode
    /// explicitly), and drop security.capability on size or owner changes. And whatever the
    /// guest negotiated: the MDS clears setgid on every chown, also without group-execute,
    /// where Linux keeps it (it marks mandatory locking there, no privilege), so a chown of
    /// a file with special bits names the mode it must end with.
    /// The bits go with CEPH_SETATTR_KILL_SGUID in the same setattr: the MDS clears them
    /// from the mode the inode has then, so a concurrent chmod is never undone by a mode we
    /// read before. Where the MDS's rule and Linux's differ (it keeps setuid without any
    /// execute bit, clears setgid without group-execute, and libcephfs clears both on every
    /// size or owner change by anyone but root), the special bits are put right afterwards
    /// (`special_after`), only if the permission bits are still those read before.
    pub(super) fn setattr_kill(
        &self,
        node: &Node,
        mask: u32,
        valid: SetattrValid,
        perm: &ceph_client::UserPerm,
    ) -> io::Result<SetattrKill> {
        let mut out = SetattrKill::default();
        let owner_change = mask & (CEPH_SETATTR_UID | CEPH_SETATTR_GID) != 0;
        let size_change = mask & CEPH_SETATTR_SIZE != 0;
        let size_or_owner = owner_change || size_change;
        let flagged = valid.contains(SetattrValid::KILL_SUIDGID);
        let killpriv = self.killpriv_on() && (size_or_owner || flagged);
        if !node.is_dir() && mask & CEPH_SETATTR_MODE == 0 && (killpriv || size_or_owner) {
            let cur = u32::from(
                self.mount()
                    .getattr(&*self.inode(node)?, CEPH_STATX_MODE, 0, perm)?
                    .stx_mode,
            );
            let trigger = if mask & CEPH_SETATTR_SIZE != 0 {
                Trigger::Truncate
            } else {
                Trigger::Chown
            };
            let kill = if killpriv {
                let has_caps = size_or_owner && self.has_caps(node, perm);
                killpriv::decide(trigger, cur, false, flagged, has_caps)
            } else {
                Kill::default()
            };
            if kill.new_mode.is_some() {
                out.mask |= CEPH_SETATTR_KILL_SGUID;
            }
            if cur & (libc::S_ISUID | libc::S_ISGID) != 0 {
                out.special_after = Some((cur, kill.new_mode.unwrap_or(cur)));
            }
            out.remove_caps = kill.remove_caps;
        }
        Ok(out)
    }

    /// What a SETATTR does after the setattr itself.
    pub(super) fn after_setattr(
        &self,
        node: &Node,
        mask: u32,
        kill: SetattrKill,
    ) -> io::Result<()> {
        // libcephfs keeps explicit times of a directory as dirty caps and sends them to the
        // MDS later, over the times the MDS gave the directory for the entries created or
        // removed in it meanwhile (`touch -d 2001-01-01 D; mkdir D/x` left D at 2001): flush
        // them now. One MDS round trip, for explicit directory times only.
        if node.is_dir() && mask & (CEPH_SETATTR_MTIME | CEPH_SETATTR_ATIME) != 0 {
            self.mount().sync_inode(&*self.inode(node)?, false)?;
        }
        if let Some((before, want)) = kill.special_after {
            self.put_special_bits(node, before, want)?;
        }
        if kill.remove_caps {
            self.apply_kill(
                node,
                Kill {
                    new_mode: None,
                    remove_caps: kill.remove_caps,
                },
            )?;
        }
        Ok(())
    }
}

/// The mode to set after a size or owner change so that the setuid/setgid bits are those of
/// `want` (see `CephFs::put_special_bits`): `None` when they already are, or when the other bits
/// of `now` are no longer those of `before` (someone changed the mode meanwhile: theirs stands).
fn special_bits_after(before: u32, now: u32, want: u32) -> Option<u32> {
    const SPECIAL: u32 = libc::S_ISUID | libc::S_ISGID;
    let (before, now) = (before & 0o7777, now & 0o7777);
    if now & !SPECIAL != before & !SPECIAL || now & SPECIAL == want & SPECIAL {
        return None;
    }
    Some((now & !SPECIAL) | (want & SPECIAL))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_special_bits_never_undo_a_concurrent_chmod() {
        const SGID: u32 = libc::S_ISGID;
        // chown of 02644 (setgid without group-exec, kept by Linux) cleared by the MDS: put back.
        assert_eq!(
            special_bits_after(SGID | 0o644, 0o100644, SGID | 0o644),
            Some(SGID | 0o644)
        );
        // Already as wanted: nothing to do.
        assert_eq!(
            special_bits_after(SGID | 0o644, SGID | 0o644, SGID | 0o644),
            None
        );
        // Someone ran chmod 600 in between: their mode stands, no bit comes back.
        assert_eq!(special_bits_after(SGID | 0o644, 0o600, SGID | 0o644), None);
        // A kill the MDS did not do (setuid without any execute bit): cleared, bits kept.
        assert_eq!(
            special_bits_after(libc::S_ISUID | 0o644, libc::S_ISUID | 0o644, 0o644),
            Some(0o644)
        );
    }
}
