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

use std::fmt;
use std::io;
use std::str::FromStr;

/// One translation rule, as written on the command line or in the config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// `map:GUEST:HOST:COUNT`: both directions.
    Map { guest: u32, host: u32, count: u32 },
    /// `guest:FROM_GUEST:TO_HOST:COUNT`: guest → Ceph only.
    Guest {
        from_guest: u32,
        to_host: u32,
        count: u32,
    },
    /// `host:FROM_HOST:TO_GUEST:COUNT`: Ceph → guest only.
    Host {
        from_host: u32,
        to_guest: u32,
        count: u32,
    },
    /// `squash-guest:FROM_GUEST:TO_HOST:COUNT`: a guest range onto one Ceph id.
    SquashGuest {
        from_guest: u32,
        to_host: u32,
        count: u32,
    },
    /// `squash-host:FROM_HOST:TO_GUEST:COUNT`: a Ceph range onto one guest id.
    SquashHost {
        from_host: u32,
        to_guest: u32,
        count: u32,
    },
    /// `forbid-guest:FROM_GUEST:COUNT`: guest ids that may not be used at all.
    ForbidGuest { from_guest: u32, count: u32 },
}

/// Why a rule or a rule set was refused. Messages say what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdMapError {
    #[error("Id mapping {0:?} has an unknown kind: use map:, guest:, host:, squash-guest:, squash-host: or forbid-guest:")]
    UnknownKind(String),
    #[error("Id mapping {rule:?} needs {expected} numbers after the kind, separated by ':'")]
    FieldCount { rule: String, expected: usize },
    #[error("Id mapping {0:?} holds something that is not a number from 0 to 4294967295")]
    BadNumber(String),
    #[error("Id mapping {0}: the count must be at least 1")]
    ZeroCount(Rule),
    #[error("Id mapping {0}: a range runs past 4294967295")]
    Overflow(Rule),
    #[error("Id mappings {0} and {1} overlap on the {2} side: each id may have only one meaning")]
    Overlap(Rule, Rule, &'static str),
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Rule::Map { guest, host, count } => write!(f, "map:{guest}:{host}:{count}"),
            Rule::Guest {
                from_guest,
                to_host,
                count,
            } => write!(f, "guest:{from_guest}:{to_host}:{count}"),
            Rule::Host {
                from_host,
                to_guest,
                count,
            } => write!(f, "host:{from_host}:{to_guest}:{count}"),
            Rule::SquashGuest {
                from_guest,
                to_host,
                count,
            } => write!(f, "squash-guest:{from_guest}:{to_host}:{count}"),
            Rule::SquashHost {
                from_host,
                to_guest,
                count,
            } => write!(f, "squash-host:{from_host}:{to_guest}:{count}"),
            Rule::ForbidGuest { from_guest, count } => {
                write!(f, "forbid-guest:{from_guest}:{count}")
            }
        }
    }
}

impl FromStr for Rule {
    type Err = IdMapError;

    fn from_str(s: &str) -> Result<Self, IdMapError> {
        let mut parts = s.trim().split(':');
        let kind = parts.next().unwrap_or_default().to_ascii_lowercase();
        let nums = parts
            .map(|p| p.trim().parse::<u32>())
            .collect::<Result<Vec<u32>, _>>()
            .map_err(|_| IdMapError::BadNumber(s.to_owned()))?;
        let expected = match kind.as_str() {
            "forbid-guest" => 2,
            "map" | "guest" | "host" | "squash-guest" | "squash-host" => 3,
            _ => return Err(IdMapError::UnknownKind(s.to_owned())),
        };
        let field_count = || IdMapError::FieldCount {
            rule: s.to_owned(),
            expected,
        };
        let rule = match (kind.as_str(), nums.as_slice()) {
            ("map", &[guest, host, count]) => Rule::Map { guest, host, count },
            ("guest", &[from_guest, to_host, count]) => Rule::Guest {
                from_guest,
                to_host,
                count,
            },
            ("host", &[from_host, to_guest, count]) => Rule::Host {
                from_host,
                to_guest,
                count,
            },
            ("squash-guest", &[from_guest, to_host, count]) => Rule::SquashGuest {
                from_guest,
                to_host,
                count,
            },
            ("squash-host", &[from_host, to_guest, count]) => Rule::SquashHost {
                from_host,
                to_guest,
                count,
            },
            ("forbid-guest", &[from_guest, count]) => Rule::ForbidGuest { from_guest, count },
            _ => return Err(field_count()),
        };
        rule.check()?;
        Ok(rule)
    }
}

/// Last id of a range starting at `start` with `count` ids, if it fits in u32.
fn last(start: u32, count: u32) -> Option<u32> {
    start.checked_add(count.checked_sub(1)?)
}

impl Rule {
    fn count(&self) -> u32 {
        match *self {
            Rule::Map { count, .. }
            | Rule::Guest { count, .. }
            | Rule::Host { count, .. }
            | Rule::SquashGuest { count, .. }
            | Rule::SquashHost { count, .. }
            | Rule::ForbidGuest { count, .. } => count,
        }
    }

    /// Count at least 1, and every range (source and, for 1:1 maps, target) within u32.
    fn check(&self) -> Result<(), IdMapError> {
        let count = self.count();
        if count == 0 {
            return Err(IdMapError::ZeroCount(*self));
        }
        let starts: &[u32] = match self {
            Rule::Map { guest, host, .. } => &[*guest, *host],
            Rule::Guest {
                from_guest,
                to_host,
                ..
            } => &[*from_guest, *to_host],
            Rule::Host {
                from_host,
                to_guest,
                ..
            } => &[*from_host, *to_guest],
            Rule::SquashGuest { from_guest, .. } | Rule::ForbidGuest { from_guest, .. } => {
                &[*from_guest]
            }
            Rule::SquashHost { from_host, .. } => &[*from_host],
        };
        if starts.iter().any(|&s| last(s, count).is_none()) {
            return Err(IdMapError::Overflow(*self));
        }
        Ok(())
    }

    /// The guest-side range this rule translates (guest → Ceph), and what it becomes.
    fn host_range(&self) -> Option<Range> {
        let (first, count, target) = match *self {
            Rule::Map { guest, host, count } => (guest, count, Target::Shift(host)),
            Rule::Guest {
                from_guest,
                to_host,
                count,
            } => (from_guest, count, Target::Shift(to_host)),
            Rule::SquashGuest {
                from_guest,
                to_host,
                count,
            } => (from_guest, count, Target::Squash(to_host)),
            Rule::ForbidGuest { from_guest, count } => (from_guest, count, Target::Forbid),
            Rule::Host { .. } | Rule::SquashHost { .. } => return None,
        };
        Some(Range {
            first,
            last: last(first, count)?,
            target,
            rule: *self,
        })
    }

    /// The Ceph-side range this rule translates (Ceph → guest), and what it becomes.
    fn guest_range(&self) -> Option<Range> {
        let (first, count, target) = match *self {
            Rule::Map { guest, host, count } => (host, count, Target::Shift(guest)),
            Rule::Host {
                from_host,
                to_guest,
                count,
            } => (from_host, count, Target::Shift(to_guest)),
            Rule::SquashHost {
                from_host,
                to_guest,
                count,
            } => (from_host, count, Target::Squash(to_guest)),
            Rule::Guest { .. } | Rule::SquashGuest { .. } | Rule::ForbidGuest { .. } => {
                return None
            }
        };
        Some(Range {
            first,
            last: last(first, count)?,
            target,
            rule: *self,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// `first + i` becomes `base + i`.
    Shift(u32),
    /// Every id of the range becomes this one.
    Squash(u32),
    /// The id may not be used.
    Forbid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    first: u32,
    last: u32,
    target: Target,
    rule: Rule,
}

/// Sorted, disjoint ranges of one direction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Direction {
    ranges: Vec<Range>,
}

impl Direction {
    fn build(
        rules: &[Rule],
        pick: fn(&Rule) -> Option<Range>,
        side: &'static str,
    ) -> Result<Self, IdMapError> {
        let mut ranges: Vec<Range> = rules.iter().filter_map(pick).collect();
        ranges.sort_by_key(|r| r.first);
        for pair in ranges.windows(2) {
            if let [a, b] = pair {
                if b.first <= a.last {
                    return Err(IdMapError::Overlap(a.rule, b.rule, side));
                }
            }
        }
        Ok(Direction { ranges })
    }

    /// `None` when the id is forbidden.
    fn translate(&self, id: u32) -> Option<u32> {
        if self.ranges.is_empty() {
            return Some(id);
        }
        // The last range starting at or before `id` is the only one that can hold it.
        let idx = self.ranges.partition_point(|r| r.first <= id);
        let Some(r) = idx.checked_sub(1).and_then(|i| self.ranges.get(i)) else {
            return Some(id);
        };
        if id > r.last {
            return Some(id);
        }
        match r.target {
            // In range by construction: id - first < count, and base + count - 1 fits (checked).
            Target::Shift(base) => base.checked_add(id - r.first),
            Target::Squash(to) => Some(to),
            Target::Forbid => None,
        }
    }
}

/// The translation of one kind of id (uids, or gids) in both directions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdMap {
    rules: Vec<Rule>,
    to_host: Direction,
    to_guest: Direction,
}

impl IdMap {
    /// Validate a rule set: each rule in range, and no two rules covering the same id in the
    /// same direction.
    pub fn new(rules: &[Rule]) -> Result<Self, IdMapError> {
        for r in rules {
            r.check()?;
        }
        Ok(IdMap {
            rules: rules.to_vec(),
            to_host: Direction::build(rules, Rule::host_range, "guest")?,
            to_guest: Direction::build(rules, Rule::guest_range, "Ceph")?,
        })
    }

    /// The rules this map was built from, in the order given.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// True when no rule changes any id.
    pub fn is_identity(&self) -> bool {
        self.to_host.ranges.is_empty() && self.to_guest.ranges.is_empty()
    }

    /// A guest id as CephFS sees it; `None` when a `forbid-guest` rule covers it.
    pub fn to_host(&self, guest: u32) -> Option<u32> {
        self.to_host.translate(guest)
    }

    /// A CephFS id as the guest sees it.
    pub fn to_guest(&self, host: u32) -> u32 {
        // No Ceph→guest rule forbids; the fallback only guards a checked_add that cannot fail.
        self.to_guest.translate(host).unwrap_or(host)
    }
}

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

    fn map(rules: &[&str]) -> Result<IdMap, IdMapError> {
        IdMap::new(&rules.iter().map(|s| rule(s)).collect::<Vec<_>>())
    }

    #[test]
    fn parses_every_kind_and_prints_it_back() {
        for s in [
            "map:1000:100000:65536",
            "guest:0:1000:1",
            "host:1000:0:1",
            "squash-guest:0:107:4294967295",
            "squash-host:1:65534:4294967295",
            "forbid-guest:500:10",
        ] {
            assert_eq!(rule(s).to_string(), s);
        }
        assert_eq!(
            rule("MAP:1:2:3"),
            Rule::Map {
                guest: 1,
                host: 2,
                count: 3
            }
        );
    }

    #[test]
    fn rejects_malformed_rules() {
        let err = |s: &str| s.parse::<Rule>().unwrap_err();
        assert!(matches!(err("swap:1:2:3"), IdMapError::UnknownKind(_)));
        assert!(matches!(
            err("map:1:2"),
            IdMapError::FieldCount { expected: 3, .. }
        ));
        assert!(matches!(
            err("forbid-guest:1:2:3"),
            IdMapError::FieldCount { expected: 2, .. }
        ));
        assert!(matches!(err("map:1:x:3"), IdMapError::BadNumber(_)));
        assert!(matches!(err("map:-1:2:3"), IdMapError::BadNumber(_)));
        assert!(matches!(
            err("map:1:2:4294967296"),
            IdMapError::BadNumber(_)
        ));
        assert!(matches!(err("map:1:2:0"), IdMapError::ZeroCount(_)));
        // Source range past u32::MAX, and target range past it.
        assert!(matches!(
            err("guest:4294967295:0:2"),
            IdMapError::Overflow(_)
        ));
        assert!(matches!(err("map:0:4294967295:2"), IdMapError::Overflow(_)));
        // A squash target is a single id: only the source range must fit.
        assert!(rule("squash-guest:1:4294967295:4294967295").count() == u32::MAX);
        assert!(matches!(err(""), IdMapError::UnknownKind(_)));
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
    fn bidirectional_map_shifts_both_ways_and_leaves_the_rest() {
        let m = map(&["map:1000:100000:10"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.to_host(1000), Some(100_000));
        assert_eq!(m.to_host(1009), Some(100_009));
        assert_eq!(m.to_host(999), Some(999));
        assert_eq!(m.to_host(1010), Some(1010));
        assert_eq!(m.to_guest(100_000), 1000);
        assert_eq!(m.to_guest(100_009), 1009);
        assert_eq!(m.to_guest(100_010), 100_010);
        assert_eq!(m.to_guest(1000), 1000, "unmapped Ceph ids pass unchanged");
        for g in 1000..1010 {
            let h = m.to_host(g).unwrap_or_else(|| panic!("{g} forbidden"));
            assert_eq!(m.to_guest(h), g, "round trip of {g}");
        }
    }

    #[test]
    fn one_way_rules_only_act_in_their_direction() {
        let m = map(&["guest:0:1000:1", "host:1000:0:1"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.to_host(0), Some(1000));
        assert_eq!(m.to_guest(1000), 0);
        let only_guest = map(&["guest:0:1000:1"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(only_guest.to_guest(1000), 1000);
        let only_host = map(&["host:1000:0:1"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(only_host.to_host(0), Some(0));
    }

    #[test]
    fn squash_folds_a_whole_range() {
        // The common "every guest id becomes the service user" setup, with root shown back.
        let m = map(&["squash-guest:0:107:4294967295", "squash-host:107:0:1"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.to_host(0), Some(107));
        assert_eq!(m.to_host(65534), Some(107));
        assert_eq!(m.to_host(u32::MAX - 1), Some(107));
        assert_eq!(
            m.to_host(u32::MAX),
            Some(u32::MAX),
            "outside 0..=u32::MAX-1"
        );
        assert_eq!(m.to_guest(107), 0);
        assert_eq!(m.to_guest(108), 108);
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
    fn overlaps_are_refused_per_direction() {
        let overlap = |rules: &[&str]| matches!(map(rules), Err(IdMapError::Overlap(..)));
        assert!(overlap(&["map:0:100:10", "guest:9:500:1"]));
        assert!(overlap(&["map:0:100:10", "host:109:0:1"]));
        assert!(overlap(&["squash-guest:0:1:100", "forbid-guest:50:1"]));
        assert!(overlap(&["map:0:100:10", "map:5:200:10"]));
        assert!(overlap(&[
            "squash-host:0:1:4294967295",
            "host:4294967294:5:1"
        ]));
        // Same numbers on different sides do not overlap.
        assert!(!overlap(&["guest:0:100:10", "host:0:100:10"]));
        // Adjacent ranges are fine.
        assert!(!overlap(&["map:0:100:10", "map:10:110:10"]));
        // Two guest ranges may target the same Ceph ids (that is what squash does).
        assert!(!overlap(&["guest:0:100:1", "guest:1:100:1"]));
        // The error names both rules and the side.
        let e = map(&["map:0:100:10", "map:5:200:10"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("map:0:100:10") && e.contains("map:5:200:10") && e.contains("guest"));
    }

    #[test]
    fn many_ranges_are_looked_up_correctly() {
        let rules: Vec<Rule> = (0..50u32)
            .map(|i| Rule::Map {
                guest: i * 100,
                host: 1_000_000 + i * 1000,
                count: 10,
            })
            .collect();
        let m = IdMap::new(&rules).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..50u32 {
            for k in 0..10 {
                assert_eq!(m.to_host(i * 100 + k), Some(1_000_000 + i * 1000 + k));
                assert_eq!(m.to_guest(1_000_000 + i * 1000 + k), i * 100 + k);
            }
            assert_eq!(m.to_host(i * 100 + 10), Some(i * 100 + 10));
            assert_eq!(m.to_host(i * 100 + 99), Some(i * 100 + 99));
        }
        assert_eq!(m.rules().len(), 50);
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

pub use wrapper::IdMapFs;

/// The translation applied at the `FileSystem` boundary: every request reaches the wrapped
/// filesystem with Ceph ids (credentials and SETATTR owners), and every attribute it returns is
/// rewritten into guest ids. The wrapped filesystem thus lives in one id space (Ceph's), so its
/// own permission and ownership checks compare like with like.
///
/// Every `FileSystem` method is delegated explicitly: a method missing here would silently answer
/// with the trait's default (mostly ENOSYS). When the trait grows, extend this list.
mod wrapper {
    use std::ffi::CStr;
    use std::io;
    use std::sync::Arc;
    use std::time::Duration;

    use fuse_backend_rs::abi::fuse_abi::{
        stat64, statvfs64, CreateIn, FsOptions, OpenOptions, SetattrValid,
    };
    use fuse_backend_rs::abi::virtio_fs::RemovemappingOne;
    use fuse_backend_rs::api::filesystem::{
        Context, DirEntry, Entry, FileLock, FileSystem, GetxattrReply, IoctlData, ListxattrReply,
        ZeroCopyReader, ZeroCopyWriter,
    };
    use fuse_backend_rs::transport::FsCacheReqHandler;

    use super::IdMapping;
    use crate::server::wire::ExtraOps;

    /// A filesystem seen through a uid/gid translation (see the module documentation).
    #[derive(Debug)]
    pub struct IdMapFs<F> {
        inner: Arc<F>,
        map: IdMapping,
    }

    impl<F> IdMapFs<F> {
        pub fn new(inner: Arc<F>, map: IdMapping) -> Self {
            IdMapFs { inner, map }
        }

        /// The wrapped filesystem.
        pub fn inner(&self) -> &Arc<F> {
            &self.inner
        }

        /// Request credentials in Ceph ids; EPERM for a forbidden guest id.
        fn ctx(&self, ctx: &Context) -> io::Result<Context> {
            let (uid, gid) = self.map.creds(ctx.uid, ctx.gid)?;
            Ok(Context { uid, gid, ..*ctx })
        }

        /// For requests that must never fail (forget, release): translated when possible.
        fn ctx_lenient(&self, ctx: &Context) -> Context {
            self.ctx(ctx).unwrap_or(*ctx)
        }

        fn entry(&self, mut e: Entry) -> Entry {
            self.map.attr_to_guest(&mut e.attr);
            e
        }

        fn attr(&self, (mut st, ttl): (stat64, Duration)) -> (stat64, Duration) {
            self.map.attr_to_guest(&mut st);
            (st, ttl)
        }
    }

    impl<F: FileSystem<Inode = u64, Handle = u64>> FileSystem for IdMapFs<F> {
        type Inode = u64;
        type Handle = u64;

        fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
            self.inner.init(capable)
        }

        fn destroy(&self) {
            self.inner.destroy()
        }

        fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
            let e = self.inner.lookup(&self.ctx(ctx)?, parent, name)?;
            Ok(self.entry(e))
        }

        fn forget(&self, ctx: &Context, inode: u64, count: u64) {
            self.inner.forget(&self.ctx_lenient(ctx), inode, count)
        }

        fn batch_forget(&self, ctx: &Context, requests: Vec<(u64, u64)>) {
            self.inner.batch_forget(&self.ctx_lenient(ctx), requests)
        }

        fn getattr(
            &self,
            ctx: &Context,
            inode: u64,
            handle: Option<u64>,
        ) -> io::Result<(stat64, Duration)> {
            let a = self.inner.getattr(&self.ctx(ctx)?, inode, handle)?;
            Ok(self.attr(a))
        }

        fn setattr(
            &self,
            ctx: &Context,
            inode: u64,
            mut attr: stat64,
            handle: Option<u64>,
            valid: SetattrValid,
        ) -> io::Result<(stat64, Duration)> {
            let ctx = self.ctx(ctx)?;
            if valid.contains(SetattrValid::UID) {
                attr.st_uid = self.map.host_uid(attr.st_uid)?;
            }
            if valid.contains(SetattrValid::GID) {
                attr.st_gid = self.map.host_gid(attr.st_gid)?;
            }
            let a = self.inner.setattr(&ctx, inode, attr, handle, valid)?;
            Ok(self.attr(a))
        }

        fn readlink(&self, ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
            self.inner.readlink(&self.ctx(ctx)?, inode)
        }

        fn symlink(
            &self,
            ctx: &Context,
            linkname: &CStr,
            parent: u64,
            name: &CStr,
        ) -> io::Result<Entry> {
            let e = self
                .inner
                .symlink(&self.ctx(ctx)?, linkname, parent, name)?;
            Ok(self.entry(e))
        }

        fn mknod(
            &self,
            ctx: &Context,
            inode: u64,
            name: &CStr,
            mode: u32,
            rdev: u32,
            umask: u32,
        ) -> io::Result<Entry> {
            let e = self
                .inner
                .mknod(&self.ctx(ctx)?, inode, name, mode, rdev, umask)?;
            Ok(self.entry(e))
        }

        fn mkdir(
            &self,
            ctx: &Context,
            parent: u64,
            name: &CStr,
            mode: u32,
            umask: u32,
        ) -> io::Result<Entry> {
            let e = self
                .inner
                .mkdir(&self.ctx(ctx)?, parent, name, mode, umask)?;
            Ok(self.entry(e))
        }

        fn unlink(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
            self.inner.unlink(&self.ctx(ctx)?, parent, name)
        }

        fn rmdir(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
            self.inner.rmdir(&self.ctx(ctx)?, parent, name)
        }

        fn rename(
            &self,
            ctx: &Context,
            olddir: u64,
            oldname: &CStr,
            newdir: u64,
            newname: &CStr,
            flags: u32,
        ) -> io::Result<()> {
            self.inner
                .rename(&self.ctx(ctx)?, olddir, oldname, newdir, newname, flags)
        }

        fn link(
            &self,
            ctx: &Context,
            inode: u64,
            newparent: u64,
            newname: &CStr,
        ) -> io::Result<Entry> {
            let e = self
                .inner
                .link(&self.ctx(ctx)?, inode, newparent, newname)?;
            Ok(self.entry(e))
        }

        fn open(
            &self,
            ctx: &Context,
            inode: u64,
            flags: u32,
            fuse_flags: u32,
        ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
            self.inner.open(&self.ctx(ctx)?, inode, flags, fuse_flags)
        }

        fn create(
            &self,
            ctx: &Context,
            parent: u64,
            name: &CStr,
            args: CreateIn,
        ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
            let (e, h, o, p) = self.inner.create(&self.ctx(ctx)?, parent, name, args)?;
            Ok((self.entry(e), h, o, p))
        }

        fn read(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            w: &mut dyn ZeroCopyWriter,
            size: u32,
            offset: u64,
            lock_owner: Option<u64>,
            flags: u32,
        ) -> io::Result<usize> {
            self.inner.read(
                &self.ctx(ctx)?,
                inode,
                handle,
                w,
                size,
                offset,
                lock_owner,
                flags,
            )
        }

        fn write(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            r: &mut dyn ZeroCopyReader,
            size: u32,
            offset: u64,
            lock_owner: Option<u64>,
            delayed_write: bool,
            flags: u32,
            fuse_flags: u32,
        ) -> io::Result<usize> {
            self.inner.write(
                &self.ctx(ctx)?,
                inode,
                handle,
                r,
                size,
                offset,
                lock_owner,
                delayed_write,
                flags,
                fuse_flags,
            )
        }

        fn flush(&self, ctx: &Context, inode: u64, handle: u64, lock_owner: u64) -> io::Result<()> {
            self.inner
                .flush(&self.ctx_lenient(ctx), inode, handle, lock_owner)
        }

        fn fsync(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
            self.inner.fsync(&self.ctx(ctx)?, inode, datasync, handle)
        }

        fn fallocate(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            mode: u32,
            offset: u64,
            length: u64,
        ) -> io::Result<()> {
            self.inner
                .fallocate(&self.ctx(ctx)?, inode, handle, mode, offset, length)
        }

        fn release(
            &self,
            ctx: &Context,
            inode: u64,
            flags: u32,
            handle: u64,
            flush: bool,
            flock_release: bool,
            lock_owner: Option<u64>,
        ) -> io::Result<()> {
            self.inner.release(
                &self.ctx_lenient(ctx),
                inode,
                flags,
                handle,
                flush,
                flock_release,
                lock_owner,
            )
        }

        fn statfs(&self, ctx: &Context, inode: u64) -> io::Result<statvfs64> {
            self.inner.statfs(&self.ctx(ctx)?, inode)
        }

        fn setxattr(
            &self,
            ctx: &Context,
            inode: u64,
            name: &CStr,
            value: &[u8],
            flags: u32,
        ) -> io::Result<()> {
            self.inner
                .setxattr(&self.ctx(ctx)?, inode, name, value, flags)
        }

        fn getxattr(
            &self,
            ctx: &Context,
            inode: u64,
            name: &CStr,
            size: u32,
        ) -> io::Result<GetxattrReply> {
            self.inner.getxattr(&self.ctx(ctx)?, inode, name, size)
        }

        fn listxattr(&self, ctx: &Context, inode: u64, size: u32) -> io::Result<ListxattrReply> {
            self.inner.listxattr(&self.ctx(ctx)?, inode, size)
        }

        fn removexattr(&self, ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> {
            self.inner.removexattr(&self.ctx(ctx)?, inode, name)
        }

        fn opendir(
            &self,
            ctx: &Context,
            inode: u64,
            flags: u32,
        ) -> io::Result<(Option<u64>, OpenOptions)> {
            self.inner.opendir(&self.ctx(ctx)?, inode, flags)
        }

        fn readdir(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            size: u32,
            offset: u64,
            add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
        ) -> io::Result<()> {
            self.inner
                .readdir(&self.ctx(ctx)?, inode, handle, size, offset, add_entry)
        }

        fn readdirplus(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            size: u32,
            offset: u64,
            add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
        ) -> io::Result<()> {
            let mut translated = |d: DirEntry, e: Entry| add_entry(d, self.entry(e));
            self.inner.readdirplus(
                &self.ctx(ctx)?,
                inode,
                handle,
                size,
                offset,
                &mut translated,
            )
        }

        fn fsyncdir(
            &self,
            ctx: &Context,
            inode: u64,
            datasync: bool,
            handle: u64,
        ) -> io::Result<()> {
            self.inner
                .fsyncdir(&self.ctx(ctx)?, inode, datasync, handle)
        }

        fn releasedir(&self, ctx: &Context, inode: u64, flags: u32, handle: u64) -> io::Result<()> {
            self.inner
                .releasedir(&self.ctx_lenient(ctx), inode, flags, handle)
        }

        fn setupmapping(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            foffset: u64,
            len: u64,
            flags: u64,
            moffset: u64,
            vu_req: &mut dyn FsCacheReqHandler,
        ) -> io::Result<()> {
            self.inner.setupmapping(
                &self.ctx(ctx)?,
                inode,
                handle,
                foffset,
                len,
                flags,
                moffset,
                vu_req,
            )
        }

        fn removemapping(
            &self,
            ctx: &Context,
            inode: u64,
            requests: Vec<RemovemappingOne>,
            vu_req: &mut dyn FsCacheReqHandler,
        ) -> io::Result<()> {
            self.inner
                .removemapping(&self.ctx_lenient(ctx), inode, requests, vu_req)
        }

        fn access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
            self.inner.access(&self.ctx(ctx)?, inode, mask)
        }

        fn lseek(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            offset: u64,
            whence: u32,
        ) -> io::Result<u64> {
            self.inner
                .lseek(&self.ctx(ctx)?, inode, handle, offset, whence)
        }

        fn getlk(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            owner: u64,
            lock: FileLock,
            flags: u32,
        ) -> io::Result<FileLock> {
            self.inner
                .getlk(&self.ctx(ctx)?, inode, handle, owner, lock, flags)
        }

        fn setlk(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            owner: u64,
            lock: FileLock,
            flags: u32,
        ) -> io::Result<()> {
            self.inner
                .setlk(&self.ctx(ctx)?, inode, handle, owner, lock, flags)
        }

        fn setlkw(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            owner: u64,
            lock: FileLock,
            flags: u32,
        ) -> io::Result<()> {
            self.inner
                .setlkw(&self.ctx(ctx)?, inode, handle, owner, lock, flags)
        }

        fn ioctl(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            flags: u32,
            cmd: u32,
            data: IoctlData,
            out_size: u32,
        ) -> io::Result<IoctlData<'_>> {
            self.inner
                .ioctl(&self.ctx(ctx)?, inode, handle, flags, cmd, data, out_size)
        }

        fn bmap(&self, ctx: &Context, inode: u64, block: u64, blocksize: u32) -> io::Result<u64> {
            self.inner.bmap(&self.ctx(ctx)?, inode, block, blocksize)
        }

        fn poll(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            khandle: u64,
            flags: u32,
            events: u32,
        ) -> io::Result<u32> {
            self.inner
                .poll(&self.ctx(ctx)?, inode, handle, khandle, flags, events)
        }

        fn notify_reply(&self) -> io::Result<()> {
            self.inner.notify_reply()
        }

        fn id_remap(&self, ctx: &mut Context) -> io::Result<()> {
            self.inner.id_remap(ctx)
        }
    }

    impl<F: crate::metrics::FsStats> crate::metrics::FsStats for IdMapFs<F> {
        fn node_count(&self) -> usize {
            self.inner.node_count()
        }
        fn handle_count(&self) -> usize {
            self.inner.handle_count()
        }
    }

    impl<F: ExtraOps> ExtraOps for IdMapFs<F> {
        fn copy_file_range(
            &self,
            ctx: &Context,
            ino_in: u64,
            fh_in: u64,
            off_in: u64,
            ino_out: u64,
            fh_out: u64,
            off_out: u64,
            len: u64,
            flags: u64,
        ) -> io::Result<usize> {
            self.inner.copy_file_range(
                &self.ctx(ctx)?,
                ino_in,
                fh_in,
                off_in,
                ino_out,
                fh_out,
                off_out,
                len,
                flags,
            )
        }

        fn syncfs(&self, ctx: &Context, ino: u64) -> io::Result<()> {
            self.inner.syncfs(&self.ctx(ctx)?, ino)
        }
    }
}
