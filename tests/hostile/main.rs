//! The hostile guest (docs/threat-model.md), against the real cluster: one test binary, one
//! module per way in.
//!
//! - [`escape`]: every route out of the export, at the filesystem layer;
//! - [`limits`]: the filesystem layer's resource and privilege limits;
//! - [`server`]: the end of a frontend's FUSE session;
//! - [`wire`]: scripted attacks on the real daemon through the bench's hand-written frontend;
//! - [`fuzz`]: the fuzzer of that frontend, with its escape oracle.
//!
//! Each test has an export of its own, and the attacks that may take an MDS down start a
//! cluster of their own, so the tests run side by side. One module alone: `cargo test --test
//! hostile wire::`. [`wire`] and [`fuzz`] run the bench's binary: build it first (`cargo build
//! -p ceph-virtiofsd-bench`, docs/testing.md).

#[path = "../common/mod.rs"]
mod common;

mod escape;
mod fuzz;
mod limits;
mod server;
mod wire;
