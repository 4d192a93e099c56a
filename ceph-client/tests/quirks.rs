//! What libcephfs 16 answers differently from a local Linux filesystem and the daemon cannot
//! correct, each shown against libcephfs directly. If one of these tests starts to fail, a
//! newer libcephfs behaves: drop the matching note in docs/semantics.md and the
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

/// libcephfs answers ".." of a directory from the first dentry it has cached for it, whether
/// or not its lease still holds. A client that listed a directory before another client
/// renamed it away walks up to the old parent. Only a client with no dentry cached for it
/// asks the MDS (LOOKUPPARENT). Linux (and the kernel CephFS client) revalidates.
///
/// The daemon trusts a libcephfs ".." only after checking the name it remembers still leads
/// back (src/fs `lookup_parent`), and the escape oracle of `ceph-virtiofsd-bench hostile`
/// confirms a suspected escape with a fresh client.
#[test]
fn dotdot_follows_a_dentry_another_client_renamed_away() {
    let perm = UserPerm::root();
    let mkdir = |m: &Mount, parent: &Inode, name: &str| -> (Inode, u64) {
        let name = CString::new(name).unwrap();
        let (i, st) = m
            .mkdir(parent, &name, 0o755, CEPH_STATX_BASIC_STATS, 0, &perm)
            .unwrap();
        (i, st.stx_ino)
    };
    let dotdot = |m: &Mount, ino: u64| -> u64 {
        let d = m.lookup_inode(ino).unwrap();
        m.lookup(&d, c"..", CEPH_STATX_BASIC_STATS, 0, &perm)
            .unwrap()
            .1
            .stx_ino
    };
    let writer = mount();
    let root = writer.lookup_root().unwrap();
    let base_name = format!("quirk-dotdot-{}", std::process::id());
    let (base, _) = mkdir(&writer, &root, &base_name);
    let (p1, p1_ino) = mkdir(&writer, &base, "p1");
    let (p2, p2_ino) = mkdir(&writer, &base, "p2");
    let (_, d_ino) = mkdir(&writer, &p1, "d");

    // The reader lists p1: its cache now holds the dentry p1/d.
    let reader = mount();
    let p1_there = reader.lookup_inode(p1_ino).unwrap();
    let mut listing = reader.opendir(&p1_there, &perm).unwrap();
    while let Some(e) = listing
        .readdirplus(CEPH_STATX_BASIC_STATS, 0, false)
        .unwrap()
    {
        let _ = e;
    }
    drop(listing);
    assert_eq!(dotdot(&reader, d_ino), p1_ino);

    writer.rename(&p1, c"d", &p2, c"d", &perm).unwrap();
    assert_eq!(dotdot(&writer, d_ino), p2_ino, "the renaming client knows");
    assert_eq!(
        dotdot(&mount(), d_ino),
        p2_ino,
        "a fresh client asks the MDS"
    );
    assert_eq!(
        dotdot(&reader, d_ino),
        p1_ino,
        "the reader walks its stale dentry up to the old parent"
    );

    writer.rmdir(&p2, c"d", &perm).unwrap();
    writer.rmdir(&base, c"p1", &perm).unwrap();
    writer.rmdir(&base, c"p2", &perm).unwrap();
    writer
        .rmdir(&root, &CString::new(base_name).unwrap(), &perm)
        .unwrap();
}

/// A rename of a name onto itself (or onto another link of the same file) succeeds on the MDS
/// without changing anything, as on Linux, but the renaming libcephfs client drops the source
/// dentry from its cache: its next lookup of the name answers ENOENT while the file is still
/// there (a fresh client finds it). And a rename whose source does not exist, sent after that
/// in the same directory, can leave the name's dentry marked "renaming" for good, so that every
/// later lookup of the name waits forever ("rename is on the way, will wait for dn" at debug
/// level 1); found by the hostile fuzzer, where it stalled the daemon's workers one by one.
/// libcephfs 20 answers that lookup (ENOENT); 16 and 18 wait.
///
/// The daemon never sends libcephfs a rename whose source it has not just found, nor one onto
/// the same file (src/fs `do_rename`: Linux's answers, without the call).
#[test]
fn a_rename_onto_the_same_file_hides_it_from_the_renaming_client() {
    let perm = UserPerm::root();
    let m = mount();
    let root = m.lookup_root().unwrap();
    let base_name = CString::new(format!("quirk-rename-self-{}", std::process::id())).unwrap();
    let (base, _) = m
        .mkdir(&root, &base_name, 0o755, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    let (file, _, f) = m
        .create(
            &base,
            c"a",
            0o644,
            libc::O_RDWR | libc::O_CREAT,
            CEPH_STATX_BASIC_STATS,
            0,
            &perm,
        )
        .unwrap();
    drop(f);
    m.link(&file, &base, c"h", &perm).unwrap();
    let found = |m: &Mount, dir: &Inode, name: &std::ffi::CStr| -> Result<u64> {
        m.lookup(dir, name, CEPH_STATX_INO, 0, &perm)
            .map(|(_, st)| st.stx_ino)
    };
    let ino = found(&m, &base, c"a").unwrap();

    m.rename(&base, c"a", &base, c"a", &perm).unwrap();
    assert_eq!(
        found(&m, &base, c"a").map_err(|e| e.errno),
        Err(libc::ENOENT),
        "the renaming client lost a"
    );
    let fresh = mount();
    let base_ino = m.getattr(&base, CEPH_STATX_INO, 0, &perm).unwrap().stx_ino;
    let fresh_base = fresh.lookup_inode(base_ino).unwrap();
    assert_eq!(
        found(&fresh, &fresh_base, c"a").ok(),
        Some(ino),
        "the MDS kept a"
    );
    assert_eq!(
        found(&fresh, &fresh_base, c"h").ok(),
        Some(ino),
        "the MDS kept h"
    );
    let m = std::sync::Arc::new(m);
    let e = m.rename(&base, c"nx", &base, c"nx", &perm).unwrap_err();
    assert_eq!(e.errno, libc::ENOENT);
    let (tx, rx) = std::sync::mpsc::channel();
    let m2 = m.clone();
    std::thread::spawn(move || {
        let base = m2.lookup_inode(base_ino).unwrap();
        let _ = tx.send(
            m2.lookup(&base, c"nx", CEPH_STATX_INO, 0, &UserPerm::root())
                .map(|_| ())
                .map_err(|e| e.errno),
        );
    });
    // Waiting for good, not slowly: the MDS answers a lookup here in milliseconds. libcephfs
    // 20 (Tentacle) no longer waits: its lookup answers ENOENT. The first half (the renaming
    // client losing `a`) is the same in 16, 18 and 20.
    let (_, (major, _, _)) = version();
    let got = rx.recv_timeout(std::time::Duration::from_secs(10));
    if major >= 20 {
        assert_eq!(
            got,
            Ok(Err(libc::ENOENT)),
            "libcephfs {major}: lookup of nx"
        );
    } else {
        assert_eq!(
            got,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout),
            "the lookup of nx after the rename nx -> nx came back"
        );
    }
}
