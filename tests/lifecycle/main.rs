//! The daemon's life around a guest, with the daemon binary on the lab cluster: one test
//! binary, a module each.
//!
//! - [`notify`]: systemd's notification protocol (`READY=1`, `WATCHDOG=1`, `STOPPING=1`);
//! - [`session_metadata`]: the VM's name and the daemon's version in its CephFS sessions;
//! - [`handover`]: an upgrade without the guest noticing (`--handover`);
//! - [`evict`]: evicted by the MDS, the daemon mounts a new session and the guest goes on;
//! - [`restart`]: a daemon killed outright, and a successor that ends its sessions at once.
//!
//! Each test has an export of its own (and [`restart`]'s start without an MDS a cluster of its
//! own), so they run side by side. One module alone: `cargo test --test lifecycle restart::`.
//! [`handover`], [`evict`] and [`restart`] run the bench's binary: build it first (`cargo build
//! -p ceph-virtiofsd-bench`, docs/testing.md).

#[path = "../common/mod.rs"]
mod common;

mod evict;
mod handover;
mod notify;
mod restart;
mod session_metadata;
