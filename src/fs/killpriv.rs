//! SB_NOSEC-safe semantics (FUSE_HANDLE_KILLPRIV_V2): what the server must clear, decided from
//! cached state so that a write to a plain file costs nothing.
//!
//! With HANDLE_KILLPRIV_V2 negotiated the guest sets SB_NOSEC and stops asking
//! GETXATTR(security.capability) before each write; in exchange the server clears privileges:
//! - setuid always, and setgid when group-exec is set (a setgid file without group-exec is a
//!   mandatory-locking marker, not a privilege), when the guest flags the request:
//!   WRITE with `FUSE_WRITE_KILL_SUIDGID`, SETATTR with `FATTR_KILL_SUIDGID` (truncate by a caller
//!   without CAP_FSETID, and every chown/chgrp of a non-directory), OPEN/CREATE with
//!   `FUSE_OPEN_KILL_SUIDGID` and O_TRUNC;
//! - `security.capability` on every write, truncate and chown, whoever the caller is (as the
//!   host kernel's `file_remove_privs` does: it does not depend on CAP_FSETID).

/// The xattr that carries file capabilities.
pub const SECURITY_CAPABILITY: &str = "security.capability";

/// Why privileges may have to go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// A data write.
    Write,
    /// A size change (truncate, O_TRUNC).
    Truncate,
    /// An owner or group change.
    Chown,
}

/// The work one request must do, decided before touching the MDS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Kill {
    /// New mode bits (permission + special bits) to set, if the setuid/setgid bits must go.
    pub new_mode: Option<u32>,
    /// Whether `security.capability` must be removed.
    pub remove_caps: bool,
}

impl Kill {
    pub fn is_empty(&self) -> bool {
        self.new_mode.is_none() && !self.remove_caps
    }
}

/// The mode without setuid, and without setgid where group-exec makes setgid a privilege.
/// `None` when nothing changes.
pub fn kill_suidgid(mode: u32) -> Option<u32> {
    let mut new = mode & !libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 {
        new &= !libc::S_ISGID;
    }
    (new != mode).then_some(new)
}

/// The mode the MDS leaves after `CEPH_SETATTR_KILL_SGUID`: both bits go when any execute bit
/// is set, none otherwise. Where that is [`kill_suidgid`]'s answer the kill can be left to the
/// MDS (atomic with any chmod racing it); elsewhere (setgid without group-exec but another
/// execute bit, or setuid without any) the mode is written explicitly.
pub fn mds_kill_sguid(mode: u32) -> u32 {
    if mode & 0o111 != 0 {
        mode & !(libc::S_ISUID | libc::S_ISGID)
    } else {
        mode
    }
}

/// Decide what a request has to clear.
///
/// - `mode`: the inode's current mode (from libcephfs's cache, kept coherent by MDS caps);
/// - `is_dir`: directories keep their setgid bit (it is inheritance, not privilege);
/// - `kill_flag`: the guest flagged the request (WRITE_KILL_SUIDGID, FATTR_KILL_SUIDGID,
///   OPEN_KILL_SUIDGID with O_TRUNC);
/// - `has_caps`: the inode carries `security.capability`.
pub fn decide(trigger: Trigger, mode: u32, is_dir: bool, kill_flag: bool, has_caps: bool) -> Kill {
    if is_dir {
        return Kill::default();
    }
    let new_mode = if kill_flag { kill_suidgid(mode) } else { None };
    let remove_caps =
        has_caps && matches!(trigger, Trigger::Write | Trigger::Truncate | Trigger::Chown);
    Kill {
        new_mode,
        remove_caps,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn mds_kill_matches_linux_only_where_setgid_is_a_privilege() {
        // Linux keeps setgid without group-exec; the MDS's kill takes it with any x bit.
        assert_eq!(kill_suidgid(0o2700), None);
        assert_eq!(mds_kill_sguid(0o2700), 0o0700);
        assert_eq!(kill_suidgid(0o6755), Some(0o0755));
        assert_eq!(mds_kill_sguid(0o6755), 0o0755);
        // setuid without any x: Linux clears it, the MDS does not.
        assert_eq!(kill_suidgid(0o4644), Some(0o0644));
        assert_eq!(mds_kill_sguid(0o4644), 0o4644);
    }

    use super::*;

    const SUID: u32 = libc::S_ISUID;
    const SGID: u32 = libc::S_ISGID;

    #[test]
    fn setuid_goes_and_setgid_only_with_group_exec() {
        assert_eq!(kill_suidgid(SUID | SGID | 0o755), Some(0o755));
        assert_eq!(kill_suidgid(SUID | SGID | 0o745), Some(SGID | 0o745));
        assert_eq!(kill_suidgid(SGID | 0o710), Some(0o710));
        assert_eq!(kill_suidgid(0o777), None);
        assert_eq!(
            kill_suidgid(SGID | 0o644),
            None,
            "mandatory-lock marker stays"
        );
        // The sticky bit is not a privilege.
        assert_eq!(
            kill_suidgid(libc::S_ISVTX | SUID | 0o755),
            Some(libc::S_ISVTX | 0o755)
        );
    }

    #[test]
    fn plain_file_write_has_nothing_to_do() {
        let k = decide(Trigger::Write, 0o644, false, true, false);
        assert!(k.is_empty());
    }

    #[test]
    fn unflagged_write_keeps_bits_but_drops_caps() {
        // Root writes (CAP_FSETID) arrive without the flag: the bits stay, the capability goes.
        let k = decide(Trigger::Write, SUID | 0o755, false, false, true);
        assert_eq!(k.new_mode, None);
        assert!(k.remove_caps);
    }

    #[test]
    fn flagged_requests_clear_bits() {
        for t in [Trigger::Write, Trigger::Truncate, Trigger::Chown] {
            let k = decide(t, SUID | SGID | 0o755, false, true, false);
            assert_eq!(k.new_mode, Some(0o755), "{t:?}");
            assert!(!k.remove_caps);
        }
    }

    #[test]
    fn directories_are_left_alone() {
        assert!(decide(Trigger::Chown, SGID | 0o775, true, true, true).is_empty());
    }
}
