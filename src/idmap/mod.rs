//! uid/gid translation between the guest and CephFS, in the forms virtiofsd users know
//! (`--translate-uid` / `--translate-gid`):
//!
//! | rule                               | guest → Ceph (credentials, chown)      | Ceph → guest (attributes)        |
//! |------------------------------------|----------------------------------------|----------------------------------|
//! | `map:GUEST:HOST:COUNT`             | GUEST+i → HOST+i                       | HOST+i → GUEST+i                 |
//! | `guest:FROM_GUEST:TO_HOST:COUNT`   | FROM_GUEST+i → TO_HOST+i               | —                                |
//! | `host:FROM_HOST:TO_GUEST:COUNT`    | —                                      | FROM_HOST+i → TO_GUEST+i         |
//! | `squash-guest:FROM_GUEST:TO_HOST:COUNT` | every FROM_GUEST+i → TO_HOST       | —                                |
//! | `squash-host:FROM_HOST:TO_GUEST:COUNT`  | —                                  | every FROM_HOST+i → TO_GUEST     |
//! | `forbid-guest:FROM_GUEST:COUNT`    | refused: the request fails with EPERM  | —                                |
//!
//! An id no rule covers passes unchanged (in both directions). Within one direction the ranges
//! of all rules must be disjoint: an overlap is refused when the configuration is read, so every
//! id has exactly one meaning. With no rule at all, translation is the identity and costs one
//! branch per id.
//!
//! This module is pure logic: it knows nothing of FUSE or libcephfs, except the stat64 layout of
//! the attributes it rewrites.

mod rules;

use std::io;

pub use rules::{IdMap, IdMapError, Rule};

/// uid and gid translation together: what the filesystem applies to every request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdMapping {
    pub uid: IdMap,
    pub gid: IdMap,
}

fn eperm() -> io::Error {
    io::Error::from_raw_os_error(libc::EPERM)
}

impl IdMapping {
    pub fn new(uid_rules: &[Rule], gid_rules: &[Rule]) -> Result<Self, IdMapError> {
        Ok(IdMapping {
            uid: IdMap::new(uid_rules)?,
            gid: IdMap::new(gid_rules)?,
        })
    }

    /// True when neither uids nor gids are translated.
    pub fn is_identity(&self) -> bool {
        self.uid.is_identity() && self.gid.is_identity()
    }

    /// The Ceph credentials a request from guest (uid, gid) runs with. A forbidden guest id
    /// fails the request with EPERM.
    pub fn creds(&self, uid: u32, gid: u32) -> io::Result<(u32, u32)> {
        Ok((self.host_uid(uid)?, self.host_gid(gid)?))
    }

    /// A uid the guest sent (request credentials, SETATTR/chown) as CephFS sees it; EPERM when
    /// forbidden.
    pub fn host_uid(&self, uid: u32) -> io::Result<u32> {
        self.uid.to_host(uid).ok_or_else(eperm)
    }

    /// A gid the guest sent, as CephFS sees it; EPERM when forbidden.
    pub fn host_gid(&self, gid: u32) -> io::Result<u32> {
        self.gid.to_host(gid).ok_or_else(eperm)
    }

    /// Rewrite the owner of attributes CephFS returned into the guest's ids.
    pub fn attr_to_guest(&self, st: &mut libc::stat64) {
        st.st_uid = self.uid.to_guest(st.st_uid);
        st.st_gid = self.gid.to_guest(st.st_gid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn identity_without_rules() {
        let m = IdMapping::default();
        assert!(m.is_identity());
        assert_eq!(m.creds(0, 0).ok(), Some((0, 0)));
        assert_eq!(m.creds(u32::MAX, 7).ok(), Some((u32::MAX, 7)));
        assert_eq!(m.uid.to_guest(1234), 1234);
    }

    #[test]
    fn forbidden_guest_ids_are_refused_with_eperm() {
        let uid = vec![rule("forbid-guest:0:1"), rule("map:1000:2000:1")];
        let gid = vec![rule("forbid-guest:10:5")];
        let m = IdMapping::new(&uid, &gid).unwrap_or_else(|e| panic!("{e}"));
        assert!(!m.is_identity());
        let e = m.creds(0, 100).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        assert_eq!(m.creds(1000, 9).ok(), Some((2000, 9)));
        assert_eq!(m.creds(1000, 15).ok(), Some((2000, 15)));
        for g in 10..15 {
            assert_eq!(m.host_gid(g).unwrap_err().raw_os_error(), Some(libc::EPERM));
        }
        // chown to a forbidden id: the same check.
        assert_eq!(m.host_uid(0).unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(m.host_uid(1).ok(), Some(1));
    }

    #[test]
    fn attributes_are_rewritten_for_the_guest() {
        let m = IdMapping::new(&[rule("map:0:5000:1")], &[rule("squash-host:5000:0:100")])
            .unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: stat64 is a plain C struct of integers; all-zero is a valid value.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        st.st_uid = 5000;
        st.st_gid = 5050;
        m.attr_to_guest(&mut st);
        assert_eq!((st.st_uid, st.st_gid), (0, 0));
        st.st_uid = 42;
        st.st_gid = 42;
        m.attr_to_guest(&mut st);
        assert_eq!((st.st_uid, st.st_gid), (42, 42));
    }
}
