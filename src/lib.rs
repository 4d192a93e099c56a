//! ceph-virtiofsd: a vhost-user virtio-fs daemon whose storage is CephFS through libcephfs.
//!
//! The modules, what each is for and what each may import: docs/architecture.md ("What each
//! layer may not know", "The import layers"); `tests/layers.rs` holds that table and checks
//! every `crate::` path against it. The list below is only the modules, in no order.

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
pub mod wire;

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
