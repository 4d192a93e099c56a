//! The filesystem layer (`ceph_virtiofsd::fs::CephFs`) against the real cluster, called
//! in-process the way fuse-backend-rs's server calls it: one test binary, a module each.
//!
//! - [`semantics`]: the Linux rules of docs/semantics.md, one sequence each;
//! - [`direct`]: lookup counts, handle validation and the bad input a guest can send;
//! - [`readonly`]: `--readonly` answers EROFS before anything reaches libcephfs;
//! - [`stale_tail`]: a truncation right after a close leaves no bytes past the end (on a
//!   cluster of its own, whose OSD delays what RADOS clients send).
//!
//! Each test has an export of its own, so they run side by side. One module alone: `cargo test
//! --test fs_layer semantics::`.

#[path = "../common/mod.rs"]
mod common;

mod direct;
mod readonly;
mod semantics;
mod stale_tail;
