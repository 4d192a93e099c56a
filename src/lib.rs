//! ceph-virtiofsd: a vhost-user virtio-fs daemon whose storage is CephFS through libcephfs.
//!
//! Layers, top to bottom (each may not know about the ones above it; docs/architecture.md
//! has the table of what each may import, `tests/layers.rs` checks it):
//! - `daemon`: process lifecycle (socket, pid lock, signals, reconnects).
//! - `args` / `config`: command line and TOML file, validated into [`config::Config`] of plain
//!   types.
//! - `vhost_user`: virtqueues, features, worker pool; generic over the filesystem.
//! - `server`: FUSE pre-dispatch in front of fuse-backend-rs's server.
//! - `fs`: the filesystem (CephFS) implements fuse-backend-rs's `FileSystem` plus
//!   [`server::wire::ExtraOps`].
//! - `quarantine`: the gate `fs` asks, its watcher and the operator command.
//! - `metrics`: counters the layers above record into, with plain values.
//! - leaves: `server::wire` (the FUSE wire format), `ceph` (reaching the cluster), `poll` (the
//!   adaptive polling window of queue threads and of the bench's guest side), `logging`,
//!   `sandbox`, `notify` (systemd's readiness and watchdog notifications).

// Nothing a guest sends may panic the daemon or be silently truncated: no unwrap/expect, no
// indexing or slicing that can panic, no lossy or silent `as`. Use `get`, `try_from` with a
// real errno, and `unwrap_or_else(|e| e.into_inner())` on a poisoned lock; allow a lint only on
// the item that needs it, with a one-line reason. Unit tests are exempt.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        clippy::cast_sign_loss,
        clippy::as_conversions
    )
)]

pub mod args;
pub mod ceph;
pub mod config;
pub mod daemon;
pub mod fs;
pub mod handover;
pub mod idmap;
pub mod logging;
pub mod metrics;
pub mod migration;
pub mod notify;
pub mod poll;
pub mod quarantine;
pub mod sandbox;
pub mod server;
pub mod vhost_user;

use std::process::ExitCode;

/// Documented process exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Clean shutdown (frontend disconnected, or SIGTERM/SIGINT).
    Ok = 0,
    /// Runtime failure while serving (socket, vhost-user protocol, threads).
    Runtime = 1,
    /// Usage or configuration error: nothing was started.
    Usage = 2,
    /// Could not connect to the Ceph cluster or mount CephFS.
    Ceph = 3,
}

impl From<Exit> for ExitCode {
    #[allow(clippy::as_conversions)] // the discriminant of a #[repr(u8)] enum: exact
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

/// Format an error with its whole source chain, once: "msg\n  0: cause\n  1: cause".
pub fn report(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    let mut i = 0;
    while let Some(cause) = source {
        out.push_str(&format!("\n  {i}: {cause}"));
        i += 1;
        source = cause.source();
    }
    out
}

/// The vhost-user capabilities JSON libvirt reads (`--print-capabilities`): `migrate-precopy`
/// lets libvirt migrate a domain with this file system (device state and dirty-page logging,
/// docs/upgrade-and-migration.md).
pub const CAPABILITIES_JSON: &str = "{\n  \"type\": \"fs\",\n  \"features\": [\n    \"migrate-precopy\",\n    \"separate-options\"\n  ]\n}\n";
