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
//! Ids are typed by the side they belong to: [`GuestUid`]/[`GuestGid`] are what the guest sends
//! and sees, [`HostUid`]/[`HostGid`] what CephFS records and checks. They convert into each
//! other only through an [`IdMapping`], so a number cannot pass from one side to the other
//! untranslated. The filesystem crosses at two points: the request's credentials (and the
//! owners SETATTR sets) on the way in, the attributes it replies on the way out.
//!
//! This module is pure logic: it knows nothing of FUSE or libcephfs.

mod rules;

use std::fmt;
use std::io;

use rules::IdMap;
pub use rules::{IdMapError, Rule};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct $name(u32);

        impl $name {
            /// Id 0 of this side.
            pub const ROOT: $name = $name(0);

            /// The id numbered `id` on this side (a field of a request, a reply or a libcephfs
            /// structure of this side).
            pub const fn new(id: u32) -> Self {
                $name(id)
            }

            /// The number, for a structure of this side.
            pub const fn get(self) -> u32 {
                self.0
            }

            pub const fn is_root(self) -> bool {
                self.0 == 0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id_type!(
    /// A uid as the guest knows it: FUSE request headers, SETATTR owners, replied attributes.
    GuestUid
);
id_type!(
    /// A gid as the guest knows it.
    GuestGid
);
id_type!(
    /// A uid as CephFS records it and checks permissions with.
    HostUid
);
id_type!(
    /// A gid as CephFS records it and checks permissions with.
    HostGid
);

/// uid and gid translation together: what the filesystem applies to every request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdMapping {
    uid: IdMap,
    gid: IdMap,
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
    pub fn creds(&self, uid: GuestUid, gid: GuestGid) -> io::Result<(HostUid, HostGid)> {
        Ok((self.host_uid(uid)?, self.host_gid(gid)?))
    }

    /// A uid the guest sent (request credentials, SETATTR/chown) as CephFS sees it; EPERM when
    /// forbidden.
    pub fn host_uid(&self, uid: GuestUid) -> io::Result<HostUid> {
        self.uid.to_host(uid.0).map(HostUid).ok_or_else(eperm)
    }

    /// A gid the guest sent, as CephFS sees it; EPERM when forbidden.
    pub fn host_gid(&self, gid: GuestGid) -> io::Result<HostGid> {
        self.gid.to_host(gid.0).map(HostGid).ok_or_else(eperm)
    }

    /// A CephFS uid (an owner in attributes) as the guest sees it.
    pub fn guest_uid(&self, uid: HostUid) -> GuestUid {
        GuestUid(self.uid.to_guest(uid.0))
    }

    /// A CephFS gid as the guest sees it.
    pub fn guest_gid(&self, gid: HostGid) -> GuestGid {
        GuestGid(self.gid.to_guest(gid.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// The Ceph (uid, gid) of guest (uid, gid) as plain numbers; `None` when forbidden.
    fn creds(m: &IdMapping, uid: u32, gid: u32) -> Option<(u32, u32)> {
        let (u, g) = m.creds(GuestUid::new(uid), GuestGid::new(gid)).ok()?;
        Some((u.get(), g.get()))
    }

    #[test]
    fn identity_without_rules() {
        let m = IdMapping::default();
        assert!(m.is_identity());
        assert_eq!(creds(&m, 0, 0), Some((0, 0)));
        assert_eq!(creds(&m, u32::MAX, 7), Some((u32::MAX, 7)));
        assert_eq!(m.guest_uid(HostUid::new(1234)), GuestUid::new(1234));
        assert_eq!(m.guest_gid(HostGid::new(1234)), GuestGid::new(1234));
    }

    #[test]
    fn forbidden_guest_ids_are_refused_with_eperm() {
        let uid = vec![rule("forbid-guest:0:1"), rule("map:1000:2000:1")];
        let gid = vec![rule("forbid-guest:10:5")];
        let m = IdMapping::new(&uid, &gid).unwrap_or_else(|e| panic!("{e}"));
        assert!(!m.is_identity());
        let e = m.creds(GuestUid::ROOT, GuestGid::new(100)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        assert_eq!(creds(&m, 1000, 9), Some((2000, 9)));
        assert_eq!(creds(&m, 1000, 15), Some((2000, 15)));
        for g in 10..15 {
            let e = m.host_gid(GuestGid::new(g)).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        }
        // chown to a forbidden id: the same check.
        let e = m.host_uid(GuestUid::ROOT).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        assert_eq!(m.host_uid(GuestUid::new(1)).ok(), Some(HostUid::new(1)));
    }

    #[test]
    fn owners_are_shown_in_guest_ids() {
        let m = IdMapping::new(&[rule("map:0:5000:1")], &[rule("squash-host:5000:0:100")])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.guest_uid(HostUid::new(5000)), GuestUid::ROOT);
        assert_eq!(m.guest_gid(HostGid::new(5050)), GuestGid::ROOT);
        assert_eq!(m.guest_uid(HostUid::new(42)), GuestUid::new(42));
        assert_eq!(m.guest_gid(HostGid::new(42)), GuestGid::new(42));
    }
}
