//! What libcephfs 16 answers differently from a local Linux filesystem and the daemon cannot
//! correct, each shown against libcephfs directly. If one of these tests starts to fail, a
//! newer libcephfs behaves: drop the matching note in README ("What the guest sees") and the
//! matching tolerance in tests/guest/fscheck.
//!
//! Needs a cluster like tests/integration.rs: `CEPH_CONF=DIR/ceph.conf`.

use std::ffi::CString;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use ceph_client::*;

fn conf() -> PathBuf {
    match std::env::var_os("CEPH_CONF") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "CEPH_CONF is not set: these tests need a Ceph cluster (tests/run starts one; or \
             `tests/lab/ceph-dev-cluster start DIR` and CEPH_CONF=DIR/ceph.conf)"
        ),
    }
}

fn mount() -> Mount {
    let id = std::env::var("CEPH_CLIENT_ID").unwrap_or_else(|_| "admin".to_owned());
    MountBuilder::new(Some(&id))
        .and_then(|b| b.conf_read_file(Some(&conf())))
        .and_then(|b| b.mount("/"))
        .expect("mount CephFS")
}

/// libcephfs reports a file's ctime as the later of its ctime and its mtime, so an mtime set
/// in the future (`touch -d 2050-01-01 f`) also shows as the ctime, on this client and on a
/// fresh one. Linux reports the time of the change. No libcephfs call returns the real ctime.
#[test]
fn ctime_reads_as_the_later_of_ctime_and_mtime() {
    let m = mount();
    let perm = UserPerm::root();
    let root = m.lookup_root().unwrap();
    let name = CString::new(format!("quirk-ctime-{}", std::process::id())).unwrap();
    let (f, _, file) = m
        .create(
            &root,
            &name,
            0o644,
            libc::O_RDWR | libc::O_CREAT,
            CEPH_STATX_BASIC_STATS,
            0,
            &perm,
        )
        .unwrap();
    drop(file);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let future = 3_000_000_000; // 2065
    let st = Statx {
        stx_mtime: Timespec {
            tv_sec: future,
            tv_nsec: 0,
        },
        ..Default::default()
    };
    m.setattr(&f, &st, CEPH_SETATTR_MTIME, &perm).unwrap();
    let here = m.getattr(&f, CEPH_STATX_BASIC_STATS, 0, &perm).unwrap();
    assert_eq!(here.stx_mtime.tv_sec, future);
    assert_eq!(
        here.stx_ctime.tv_sec, future,
        "ctime reads as the future mtime (Linux: {now})"
    );
    m.sync_inode(&f, false).unwrap();
    let other = mount();
    let (_, there) = other
        .lookup(
            &other.lookup_root().unwrap(),
            &name,
            CEPH_STATX_BASIC_STATS,
            0,
            &perm,
        )
        .unwrap();
    assert_eq!(
        there.stx_ctime.tv_sec, future,
        "a fresh client reads the same"
    );
    // With an mtime in the past, ctime is the time of the change.
    let st = Statx {
        stx_mtime: Timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 0,
        },
        ..Default::default()
    };
    m.setattr(&f, &st, CEPH_SETATTR_MTIME, &perm).unwrap();
    let back = m.getattr(&f, CEPH_STATX_BASIC_STATS, 0, &perm).unwrap();
    assert!(back.stx_ctime.tv_sec >= now - 1 && back.stx_ctime.tv_sec < future);
    m.unlink(&root, &name, &perm).unwrap();
}
