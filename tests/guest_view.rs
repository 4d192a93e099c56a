//! What a guest sees of the filesystem as a whole: `stat -f` and `df` in a real guest report the
//! FUSE type and the quota of the exported directory as its capacity.

mod common;

use std::ffi::CString;

use ceph_client::{UserPerm, CEPH_STATX_BASIC_STATS};
use common::{run_guest, Daemon, Lab};

/// FUSE_SUPER_MAGIC: what every virtiofs mount reports as its type.
const FUSE_MAGIC_HEX: &str = "65735546";
const QUOTA: u64 = 1 << 30;

#[test]
fn statfs_shows_fuse_type_and_the_export_quota() {
    let lab = Lab::get();
    let name = format!("guest-view-{}", std::process::id());
    let export = lab.export_dir(&name);
    let m = lab.ceph();
    let root = m.lookup_root().unwrap();
    let perm = UserPerm::root();
    let cname = CString::new(name.as_str()).unwrap();
    let (dir, _) = m
        .lookup(&root, &cname, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    let key = CString::new("ceph.quota.max_bytes").unwrap();
    m.setxattr(&dir, &key, QUOTA.to_string().as_bytes(), 0, &perm)
        .unwrap();

    let work = lab.scratch(&name);
    let daemon = Daemon::start(&lab, &work, &export, &[]);
    let script = "#!/bin/sh\n\
        echo \"STATFS $(stat -f -c '%t %S %b %f %a' /mnt)\"\n\
        df -k /mnt\n";
    let run = run_guest(&lab, &work, &daemon, script, &[], 600);
    assert_eq!(run.code(), 0);
    let line = run
        .console
        .lines()
        .find_map(|l| l.strip_prefix("STATFS "))
        .expect("STATFS line");
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.len(), 5, "{line}");
    assert_eq!(f[0], FUSE_MAGIC_HEX, "filesystem type");
    let bsize: u64 = f[1].parse().unwrap();
    let blocks: u64 = f[2].parse().unwrap();
    let free: u64 = f[3].parse().unwrap();
    let avail: u64 = f[4].parse().unwrap();
    assert_eq!(bsize * blocks, QUOTA, "capacity is the export's quota");
    assert!(free <= blocks && avail <= blocks);
    assert!(free > 0, "an empty export has free space");
}
