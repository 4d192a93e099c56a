//! Names and xattr names that come from the guest: validated before anything reaches libcephfs.

use std::ffi::CStr;

/// Longest name CephFS (and Linux) accept for one path component.
pub const NAME_MAX: usize = 255;

/// xattr prefix the daemon keeps for itself: invisible and untouchable from the guest.
pub const RESERVED_XATTR_PREFIX: &[u8] = b"trusted.ceph-virtiofsd.";

/// Names the daemon keeps for itself in every directory: the open O_TMPFILE files
/// ([`crate::fs`]'s `tmpfile`). The guest never sees them (LOOKUP: ENOENT; READDIR skips them)
/// and cannot make, remove or rename one (EPERM, see [`check_changed`]).
pub const PRIVATE_NAME_PREFIX: &[u8] = b".ceph-virtiofsd-tmpfile.";

/// Whether `name` is one the daemon keeps for itself ([`PRIVATE_NAME_PREFIX`]).
#[inline]
pub fn is_private(name: &[u8]) -> bool {
    name.starts_with(PRIVATE_NAME_PREFIX)
}

/// Ceph's virtual xattrs (layouts, quotas, recursive stats): readable, not settable by guests.
pub const CEPH_XATTR_PREFIX: &[u8] = b"ceph.";

/// How a name is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Looked up: "." and ".." are resolved by the caller.
    Lookup,
    /// Created, removed or renamed: "." and ".." are never valid targets.
    Change,
}

/// Check one path component. Errors are errno values for the guest.
pub fn check_name(name: &CStr, usage: Use) -> Result<(), i32> {
    let b = name.to_bytes();
    if b.is_empty() {
        return Err(libc::ENOENT);
    }
    if b.len() > NAME_MAX {
        return Err(libc::ENAMETOOLONG);
    }
    if b.contains(&b'/') {
        return Err(libc::EINVAL);
    }
    if usage == Use::Change && is_dot_or_dotdot(b) {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// What a request does with a name it creates, removes or renames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Makes a new entry: CREATE, MKNOD, MKDIR, SYMLINK, LINK.
    New,
    /// UNLINK.
    Unlink,
    /// RMDIR.
    Rmdir,
    /// Either name of a RENAME.
    Rename,
}

/// Check a name a request creates, removes or renames (see [`check_name`]), and keep it off the
/// snapshot directory's name. The MDS takes a real entry of that name (`mkdir .snap`, or a
/// rename onto it, succeeds), and then no client reaches it: every lookup of the name answers
/// with the virtual snapshot directory, so the entry and what is under it are hidden from every
/// client, and a directory holding it can never be removed. A Linux client of CephFS sees the
/// name as an existing directory: creating it is EEXIST, unlinking it EISDIR; removing or
/// renaming the virtual directory is refused as for a mount point (EBUSY). With snapshots
/// hidden, the name is reserved (EPERM), so a guest learns nothing of it. The daemon's own
/// names ([`is_private`]) are reserved the same way, whatever the change.
pub fn check_changed(
    name: &CStr,
    snapdir: &[u8],
    snapdir_visible: bool,
    change: Change,
) -> Result<(), i32> {
    check_name(name, Use::Change)?;
    if is_private(name.to_bytes()) {
        return Err(libc::EPERM);
    }
    if name.to_bytes() != snapdir {
        return Ok(());
    }
    Err(if !snapdir_visible {
        libc::EPERM
    } else {
        match change {
            Change::New => libc::EEXIST,
            Change::Unlink => libc::EISDIR,
            Change::Rmdir | Change::Rename => libc::EBUSY,
        }
    })
}

pub fn is_dot_or_dotdot(b: &[u8]) -> bool {
    b == b"." || b == b".."
}

/// What the guest may do with an xattr name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrAccess {
    /// Read and write.
    Full,
    /// Read only (Ceph virtual xattrs).
    ReadOnly,
    /// Does not exist as far as the guest can tell.
    Hidden,
}

pub fn xattr_access(name: &[u8], allow_ceph_set: bool) -> XattrAccess {
    if name.starts_with(RESERVED_XATTR_PREFIX) {
        XattrAccess::Hidden
    } else if name.starts_with(CEPH_XATTR_PREFIX) && !allow_ceph_set {
        XattrAccess::ReadOnly
    } else {
        XattrAccess::Full
    }
}

/// Remove hidden names from a listxattr buffer (NUL-separated names), in place.
pub fn filter_xattr_list(buf: &mut Vec<u8>) {
    if !buf
        .windows(RESERVED_XATTR_PREFIX.len())
        .any(|w| w == RESERVED_XATTR_PREFIX)
    {
        return;
    }
    let mut out = Vec::with_capacity(buf.len());
    for name in buf.split(|&c| c == 0).filter(|n| !n.is_empty()) {
        if xattr_access(name, false) != XattrAccess::Hidden {
            out.extend_from_slice(name);
            out.push(0);
        }
    }
    *buf = out;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    fn c(s: &[u8]) -> CString {
        CString::new(s).unwrap()
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(check_name(&c(b"a"), Use::Change), Ok(()));
        assert_eq!(check_name(&c(b""), Use::Lookup), Err(libc::ENOENT));
        assert_eq!(check_name(&c(b"a/b"), Use::Lookup), Err(libc::EINVAL));
        assert_eq!(check_name(&c(&[b'x'; 255]), Use::Change), Ok(()));
        assert_eq!(
            check_name(&c(&[b'x'; 256]), Use::Change),
            Err(libc::ENAMETOOLONG)
        );
        assert_eq!(check_name(&c(b".."), Use::Change), Err(libc::EINVAL));
        assert_eq!(check_name(&c(b"."), Use::Change), Err(libc::EINVAL));
        assert_eq!(check_name(&c(b".."), Use::Lookup), Ok(()));
    }

    #[test]
    fn hostile_the_snapshot_directory_name_is_never_an_entry() {
        let snap = b".snap";
        for (change, want) in [
            (Change::New, libc::EEXIST),
            (Change::Unlink, libc::EISDIR),
            (Change::Rmdir, libc::EBUSY),
            (Change::Rename, libc::EBUSY),
        ] {
            assert_eq!(check_changed(&c(b".snap"), snap, true, change), Err(want));
            assert_eq!(
                check_changed(&c(b".snap"), snap, false, change),
                Err(libc::EPERM)
            );
            assert_eq!(check_changed(&c(b".snapx"), snap, true, change), Ok(()));
            assert_eq!(
                check_changed(&c(b".."), snap, true, change),
                Err(libc::EINVAL)
            );
        }
        // client_snapdir set to another name: that one is refused, ".snap" is a plain name.
        assert_eq!(
            check_changed(&c(b".snap"), b"_snap", true, Change::New),
            Ok(())
        );
        assert_eq!(
            check_changed(&c(b"_snap"), b"_snap", true, Change::New),
            Err(libc::EEXIST)
        );
    }

    #[test]
    fn hostile_the_daemons_private_names_are_reserved() {
        for change in [Change::New, Change::Unlink, Change::Rmdir, Change::Rename] {
            assert_eq!(
                check_changed(&c(b".ceph-virtiofsd-tmpfile.1.2"), b".snap", true, change),
                Err(libc::EPERM)
            );
            assert_eq!(
                check_changed(&c(b".ceph-virtiofsd-tmpfile"), b".snap", true, change),
                Ok(())
            );
        }
        assert!(is_private(b".ceph-virtiofsd-tmpfile."));
        assert!(!is_private(b"x.ceph-virtiofsd-tmpfile.1"));
    }

    #[test]
    fn xattr_policy() {
        assert_eq!(xattr_access(b"user.x", false), XattrAccess::Full);
        assert_eq!(
            xattr_access(b"ceph.dir.rbytes", false),
            XattrAccess::ReadOnly
        );
        assert_eq!(xattr_access(b"ceph.dir.layout", true), XattrAccess::Full);
        assert_eq!(
            xattr_access(b"trusted.ceph-virtiofsd.quarantine", true),
            XattrAccess::Hidden
        );
    }

    #[test]
    fn reserved_names_are_filtered_from_lists() {
        let mut l = b"user.a\0trusted.ceph-virtiofsd.q\0user.b\0".to_vec();
        filter_xattr_list(&mut l);
        assert_eq!(l, b"user.a\0user.b\0");
        let mut plain = b"user.a\0".to_vec();
        filter_xattr_list(&mut plain);
        assert_eq!(plain, b"user.a\0");
    }
}
