//! The daemon's READ/WRITE async path (`vhost_user::nonblocking`, `fs::aio`) exists only when
//! libcephfs has `ceph_ll_nonblocking_readv_writev` (ceph-client's build script finds out, and
//! tells its dependents through `links`).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(libcephfs_nonblocking)");
    println!("cargo:rerun-if-env-changed=DEP_CEPHFS_NONBLOCKING");
    if std::env::var("DEP_CEPHFS_NONBLOCKING").as_deref() == Ok("1") {
        println!("cargo:rustc-cfg=libcephfs_nonblocking");
    }
}
