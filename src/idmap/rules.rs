//! The rule language of `--translate-uid` / `--translate-gid`: parsing, validation and the
//! per-direction lookup tables. Pure logic on id numbers; which side a number belongs to is the
//! parent module's business.

use std::fmt;
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
    #[cfg(test)]
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
}
