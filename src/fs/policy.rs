//! Attribute and entry cache policy: how long the guest may trust what we tell it.
//!
//! Upstream Linux virtiofs has no notification queue, so the daemon cannot invalidate the guest's
//! caches: the TTLs returned here are the whole coherence contract with other CephFS clients.
//! A change made by another client becomes visible to the guest at the latest when the TTL of the
//! cached attribute or dentry runs out.
//!
//! Rules, in order (the first that applies wins):
//! 1. Inodes inside a snapshot (snapid is a real snapshot id) never change: they get
//!    [`IMMUTABLE_TTL`] for entry and attributes, in every cache mode (capped by rule 2 when the
//!    snapshot lies in a quarantine-capable directory). The `.snap` directory itself
//!    is not immutable (snapshots come and go) and follows the ordinary rules.
//! 2. Inodes whose access can be revoked at any moment (quarantine-capable subvolumes) are capped
//!    at the quarantine propagation bound, so a quarantine reaches cached dentries in time.
//! 3. Otherwise the cache mode decides: `never` 0, `auto` the configured timeout (default 1 s),
//!    `metadata` and `always` a long timeout (the guest owns the share).

use std::fmt;
use std::time::Duration;

/// TTL for inodes that cannot change (snapshot contents).
pub const IMMUTABLE_TTL: Duration = Duration::from_secs(24 * 3600);

/// Default TTL of the `auto` mode.
pub const AUTO_TTL: Duration = Duration::from_secs(1);

/// TTL of the `metadata` and `always` modes.
pub const LONG_TTL: Duration = Duration::from_secs(24 * 3600);

/// The cache modes users know from virtiofsd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// Nothing cached in the guest: metadata TTL 0, data through direct I/O.
    Never,
    /// Short metadata TTL, page cache invalidated when mtime/size change.
    #[default]
    Auto,
    /// Long metadata TTL, data not cached (direct I/O).
    Metadata,
    /// Long metadata TTL, page cache kept across opens.
    Always,
}

impl fmt::Display for CacheMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheMode::Never => "never",
            CacheMode::Auto => "auto",
            CacheMode::Metadata => "metadata",
            CacheMode::Always => "always",
        })
    }
}

/// What a guest may do with CephFS snapshots (`--snapshots`).
///
/// A client id with the MDS `s` cap may create a snapshot with mkdir in a `.snap` directory and
/// delete one with rmdir there. Letting a tenant do that lets it keep data alive past its quota
/// (snapshotted data is not counted against the quota that limited the writes) and delete the
/// operator's snapshots. Refused namespace changes in `.snap` fail with EROFS: `.snap` is a
/// read-only view, as the snapshots in it are, and EROFS is what every write inside a snapshot
/// already returns (EPERM would read as a missing privilege the guest could acquire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SnapshotPolicy {
    /// `.snap` can be listed and read; mkdir, rmdir, rename and every other change in it: EROFS.
    #[default]
    ReadOnly,
    /// The guest may create, rename and delete snapshots (as far as the client id's caps allow).
    ReadWrite,
    /// `.snap` does not exist for the guest: its lookup is ENOENT (it is never listed).
    Hidden,
}

impl SnapshotPolicy {
    /// Whether the guest may change the namespace of a `.snap` directory.
    pub fn writable(self) -> bool {
        self == SnapshotPolicy::ReadWrite
    }

    /// Whether the guest may see `.snap` directories at all.
    pub fn visible(self) -> bool {
        self != SnapshotPolicy::Hidden
    }
}

impl fmt::Display for SnapshotPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SnapshotPolicy::ReadOnly => "read-only",
            SnapshotPolicy::ReadWrite => "read-write",
            SnapshotPolicy::Hidden => "hidden",
        })
    }
}

/// What the policy needs to know of one inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeClass {
    /// The inode lives in a snapshot (its contents can never change).
    pub in_snapshot: bool,
    /// Access to the inode can be revoked (quarantine-capable subvolume).
    pub revocable: bool,
}

/// The per-inode TTL policy.
#[derive(Clone, Copy, Debug)]
pub struct CachePolicy {
    mode: CacheMode,
    /// TTL of the `auto` mode (configurable).
    auto_ttl: Duration,
    /// Upper bound for revocable inodes.
    revocable_bound: Duration,
}

/// Entry and attribute timeouts for one reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ttl {
    pub entry: Duration,
    pub attr: Duration,
}

impl CachePolicy {
    pub fn new(mode: CacheMode, auto_ttl: Duration, revocable_bound: Duration) -> Self {
        CachePolicy {
            mode,
            auto_ttl,
            revocable_bound,
        }
    }

    pub fn mode(&self) -> CacheMode {
        self.mode
    }

    /// The timeouts for one inode.
    pub fn ttl(&self, class: NodeClass) -> Ttl {
        // A snapshot of a quarantine-capable directory is immutable but still revocable: the
        // cap below applies to it too (snapshots outside every domain keep the long TTL).
        let base = if class.in_snapshot {
            IMMUTABLE_TTL
        } else {
            match self.mode {
                CacheMode::Never => Duration::ZERO,
                CacheMode::Auto => self.auto_ttl,
                CacheMode::Metadata | CacheMode::Always => LONG_TTL,
            }
        };
        let t = if class.revocable {
            base.min(self.revocable_bound)
        } else {
            base
        };
        Ttl { entry: t, attr: t }
    }

    /// Whether file data bypasses the guest page cache (FOPEN_DIRECT_IO).
    pub fn direct_io(&self, class: NodeClass) -> bool {
        !class.in_snapshot && matches!(self.mode, CacheMode::Never | CacheMode::Metadata)
    }

    /// Whether the guest may keep its page cache across opens (FOPEN_KEEP_CACHE).
    pub fn keep_cache(&self, class: NodeClass) -> bool {
        !class.revocable && (class.in_snapshot || self.mode == CacheMode::Always)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: NodeClass = NodeClass {
        in_snapshot: false,
        revocable: false,
    };
    const SNAP: NodeClass = NodeClass {
        in_snapshot: true,
        revocable: false,
    };
    const REVOCABLE: NodeClass = NodeClass {
        in_snapshot: false,
        revocable: true,
    };

    fn policy(mode: CacheMode) -> CachePolicy {
        CachePolicy::new(mode, Duration::from_secs(2), Duration::from_millis(500))
    }

    #[test]
    fn plain_inodes_follow_the_mode() {
        assert_eq!(policy(CacheMode::Never).ttl(PLAIN).attr, Duration::ZERO);
        assert_eq!(
            policy(CacheMode::Auto).ttl(PLAIN).attr,
            Duration::from_secs(2)
        );
        assert_eq!(
            policy(CacheMode::Auto).ttl(PLAIN).entry,
            Duration::from_secs(2)
        );
        assert_eq!(policy(CacheMode::Metadata).ttl(PLAIN).attr, LONG_TTL);
        assert_eq!(policy(CacheMode::Always).ttl(PLAIN).entry, LONG_TTL);
    }

    #[test]
    fn snapshots_are_immutable_in_every_mode() {
        for m in [
            CacheMode::Never,
            CacheMode::Auto,
            CacheMode::Metadata,
            CacheMode::Always,
        ] {
            let p = policy(m);
            assert_eq!(p.ttl(SNAP).attr, IMMUTABLE_TTL, "{m}");
            assert_eq!(p.ttl(SNAP).entry, IMMUTABLE_TTL, "{m}");
            assert!(!p.direct_io(SNAP));
            assert!(p.keep_cache(SNAP));
        }
    }

    #[test]
    fn revocable_inodes_are_capped_at_the_bound() {
        assert_eq!(
            policy(CacheMode::Always).ttl(REVOCABLE).attr,
            Duration::from_millis(500)
        );
        assert_eq!(
            policy(CacheMode::Auto).ttl(REVOCABLE).entry,
            Duration::from_millis(500)
        );
        // A shorter mode TTL is kept as it is.
        assert_eq!(policy(CacheMode::Never).ttl(REVOCABLE).attr, Duration::ZERO);
        assert!(!policy(CacheMode::Always).keep_cache(REVOCABLE));
        // Snapshots inside a quarantine-capable directory are capped as well.
        let revocable_snap = NodeClass {
            in_snapshot: true,
            revocable: true,
        };
        assert_eq!(
            policy(CacheMode::Auto).ttl(revocable_snap).attr,
            Duration::from_millis(500)
        );
        assert!(!policy(CacheMode::Auto).keep_cache(revocable_snap));
    }

    #[test]
    fn data_cache_follows_the_mode() {
        assert!(policy(CacheMode::Never).direct_io(PLAIN));
        assert!(policy(CacheMode::Metadata).direct_io(PLAIN));
        assert!(!policy(CacheMode::Auto).direct_io(PLAIN));
        assert!(!policy(CacheMode::Auto).keep_cache(PLAIN));
        assert!(policy(CacheMode::Always).keep_cache(PLAIN));
    }

    #[test]
    fn hostile_snapshot_policies_decide() {
        assert_eq!(SnapshotPolicy::default(), SnapshotPolicy::ReadOnly);
        assert!(!SnapshotPolicy::ReadOnly.writable() && SnapshotPolicy::ReadOnly.visible());
        assert!(SnapshotPolicy::ReadWrite.writable() && SnapshotPolicy::ReadWrite.visible());
        assert!(!SnapshotPolicy::Hidden.writable() && !SnapshotPolicy::Hidden.visible());
    }
}
