//! Subvolume quarantine against the real cluster: several daemons (in-process `CephFs`
//! instances, each with its own libcephfs mount and its own quarantine watcher, exactly as
//! `main` wires them) and the operator command run as the real binary.
//!
//! Subvolumes are made as mgr lays them out (`/volumes/<group>/<name>`), with plain mkdir, so
//! the cluster needs no mgr; discovery is by that layout.
//!
//! One test binary with [`churn`], the subvolume churn of one long-running daemon. That one holds
//! the lab cluster alone (`common::cluster_alone`): its thousands of subvolumes under `/volumes`
//! make every watcher on the cluster slower for a while, which the timing-bound tests here must
//! not share; they hold it shared (`common::cluster_shared`) and run side by side.

#[path = "../common/mod.rs"]
mod common;

mod churn;

use std::io;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ceph_client::{MountBuilder, UserPerm};
use ceph_virtiofsd::fs::{CephFs, FsConfig};
use ceph_virtiofsd::quarantine::{self, CephAccess, QuarantineConfig, Watcher};
use fuse_backend_rs::abi::fuse_abi::{CreateIn, FsOptions};
use fuse_backend_rs::api::filesystem::{Context, FileSystem, ListxattrReply};

use common::quarantine::{mkdirs, qcfg, run_cmd, wait_for, walk, BOUND};
use common::{c, errno, Lab};

fn ctx(uid: u32) -> Context {
    common::ctx(uid, uid)
}

fn access(lab: &Lab, options: Vec<(String, String)>) -> CephAccess {
    CephAccess {
        conf: Some(lab.conf.clone()),
        client_id: Some(lab.client_id.clone()),
        options,
        mount_timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

/// One daemon: its filesystem and its watcher (dropped together).
struct Daemon {
    fs: CephFs,
    _watcher: Option<Watcher>,
}

fn daemon(lab: &Lab, root: &str, q: Option<QuarantineConfig>, asok: Option<&Path>) -> Daemon {
    let mut b = MountBuilder::new(Some(&lab.client_id))
        .and_then(|b| b.conf_read_file(Some(&lab.conf)))
        .unwrap();
    if let Some(a) = asok {
        b = b.conf_set("admin_socket", &a.to_string_lossy()).unwrap();
    }
    let mount = b.mount(root).unwrap();
    // The tests make snapshots through the filesystem layer (read-only by default).
    let mut cfg = FsConfig {
        snapshots: ceph_virtiofsd::fs::SnapshotPolicy::ReadWrite,
        ..FsConfig::default()
    };
    let mut watcher = None;
    if let Some(q) = q {
        let (gate, w) = quarantine::start(access(lab, Vec::new()), q.clone(), root).unwrap();
        cfg.quarantine = Some(gate);
        cfg.revocable_ttl = q.ttl_bound();
        watcher = Some(w);
    }
    let fs = CephFs::new(mount, cfg).unwrap();
    fs.init(FsOptions::ASYNC_READ).unwrap();
    Daemon {
        fs,
        _watcher: watcher,
    }
}

fn open(fs: &CephFs, id: u64) -> u64 {
    fs.open(&ctx(0), id, libc::O_RDWR as u32, 0)
        .unwrap()
        .0
        .unwrap()
}

/// An operation on an open handle. READ needs a guest-memory writer; LSEEK takes the same
/// handle path (handle lookup + the gate on the handle's domain), which is what is tested.
fn read(fs: &CephFs, id: u64, fh: u64) -> io::Result<u64> {
    fs.lseek(&ctx(0), id, fh, 0, libc::SEEK_END as u32)
}

fn write_file(fs: &CephFs, dir: u64, name: &str) -> u64 {
    let (e, fh, _, _) = fs
        .create(
            &ctx(0),
            dir,
            &c(name),
            CreateIn {
                flags: libc::O_RDWR as u32,
                mode: 0o666,
                umask: 0,
                fuse_flags: 0,
            },
        )
        .unwrap();
    let fh = fh.unwrap();
    fs.release(&ctx(0), e.inode, 0, fh, false, false, None)
        .unwrap();
    e.inode
}

fn has_reserved(fs: &CephFs, id: u64) -> bool {
    match fs.listxattr(&ctx(0), id, 65536).unwrap() {
        ListxattrReply::Names(l) => l
            .windows(b"trusted.ceph-virtiofsd".len())
            .any(|w| w == b"trusted.ceph-virtiofsd"),
        ListxattrReply::Count(_) => unreachable!(),
    }
}

#[test]
fn quarantine_end_to_end() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let group = format!("qt{}", std::process::id());
    let sva = format!("/volumes/{group}/sva");
    let svb = format!("/volumes/{group}/svb");
    mkdirs(&lab.ceph(), &format!("{sva}/data"));
    mkdirs(&lab.ceph(), &format!("{svb}/data"));

    // Daemon A exports the whole filesystem; daemon B exports the inside of subvolume sva.
    let a = daemon(&lab, "/", Some(qcfg()), None);
    let b = daemon(&lab, &format!("{sva}/data"), Some(qcfg()), None);
    // Recovery daemons: global at /, and path-scoped to sva.
    let g = daemon(
        &lab,
        "/",
        Some(QuarantineConfig {
            recovery_global: true,
            ..qcfg()
        }),
        None,
    );
    let r = daemon(
        &lab,
        &format!("{sva}/data"),
        Some(QuarantineConfig {
            recovery_paths: vec![sva.clone()],
            ..qcfg()
        }),
        None,
    );

    // Wait until A's watcher knows both subvolumes (it reads them at start; they existed).
    let a_sva = walk(&a.fs, &sva).unwrap();
    let a_data = walk(&a.fs, &format!("{sva}/data")).unwrap();
    let a_svb_data = walk(&a.fs, &format!("{svb}/data")).unwrap();
    let a_grp = walk(&a.fs, &format!("/volumes/{group}")).unwrap();
    let f = write_file(&a.fs, a_data, "f");
    let g_file = write_file(&a.fs, a_svb_data, "g");
    let fh = open(&a.fs, f);
    let dh = a.fs.opendir(&ctx(0), a_data, 0).unwrap().0.unwrap();
    let b_f = a.fs.lookup(&ctx(0), a_data, &c("f")).unwrap().inode;
    assert_eq!(b_f, f);
    let bf = b.fs.lookup(&ctx(0), 1, &c("f")).unwrap().inode;
    let bfh = open(&b.fs, bf);
    assert!(read(&a.fs, f, fh).is_ok());

    // Quarantine sva with the operator command (the time counts from its exit).
    let out = run_cmd(&lab, "enable", &sva);
    let t0 = Instant::now();
    assert!(out.contains("quarantined"), "{out}");
    wait_for("daemon A denies", || {
        a.fs.getattr(&ctx(0), a_sva, None).is_err()
    });
    let t_a = t0.elapsed();
    wait_for("daemon B denies", || {
        b.fs.getattr(&ctx(0), 1, None).is_err()
    });
    let t_b = t0.elapsed();
    assert!(run_cmd(&lab, "status", &sva).contains("quarantined"));
    println!(
        "propagation bound {} ms; measured A {} ms, B {} ms",
        BOUND.as_millis(),
        t_a.as_millis(),
        t_b.as_millis()
    );

    let root = ctx(0);
    let user = ctx(1000);
    // Everything under sva, for root and non-root callers alike.
    let denials_before = ceph_virtiofsd::metrics::global().quarantine_denials();
    assert_eq!(errno(a.fs.getattr(&root, a_sva, None)), libc::EACCES);
    assert!(
        ceph_virtiofsd::metrics::global().quarantine_denials() > denials_before,
        "a denial is counted in the metrics"
    );
    assert_eq!(errno(a.fs.getattr(&user, a_data, None)), libc::EACCES);
    assert_eq!(errno(a.fs.lookup(&root, a_grp, &c("sva"))), libc::EACCES);
    assert_eq!(errno(a.fs.lookup(&root, a_data, &c("f"))), libc::EACCES);
    assert_eq!(errno(a.fs.lookup(&root, a_sva, &c(".snap"))), libc::EACCES);
    assert_eq!(errno(read(&a.fs, f, fh)), libc::EACCES, "open handle");
    assert_eq!(errno(a.fs.fsync(&root, f, false, fh)), libc::EACCES);
    assert_eq!(
        errno(a.fs.readdir(&root, a_data, dh, 4096, 0, &mut |_| Ok(1))),
        libc::EACCES,
        "open directory handle"
    );
    assert_eq!(errno(a.fs.open(&root, f, 0, 0)), libc::EACCES);
    assert_eq!(errno(a.fs.opendir(&root, a_data, 0)), libc::EACCES);
    assert_eq!(
        errno(a.fs.mkdir(&root, a_data, &c("d"), 0o755, 0)),
        libc::EACCES
    );
    assert_eq!(
        errno(a.fs.mkdir(&root, a_sva, &c("d"), 0o755, 0)),
        libc::EACCES,
        "snapshots are mkdir in .snap, under the same gate"
    );
    assert_eq!(errno(a.fs.unlink(&root, a_data, &c("f"))), libc::EACCES);
    assert_eq!(
        errno(a.fs.symlink(&root, &c("x"), a_data, &c("l"))),
        libc::EACCES
    );
    assert_eq!(
        errno(a.fs.rename(&root, a_data, &c("f"), a_svb_data, &c("f"), 0)),
        libc::EACCES,
        "rename out"
    );
    assert_eq!(
        errno(a.fs.rename(&root, a_svb_data, &c("g"), a_data, &c("g"), 0)),
        libc::EACCES,
        "rename in"
    );
    assert_eq!(
        errno(a.fs.rename(&root, a_grp, &c("sva"), a_grp, &c("svz"), 0)),
        libc::EACCES,
        "rename of the quarantined directory itself"
    );
    assert_eq!(
        errno(a.fs.link(&root, g_file, a_data, &c("hl"))),
        libc::EACCES
    );
    assert_eq!(
        errno(a.fs.getxattr(&root, f, &c("user.x"), 0)),
        libc::EACCES
    );
    assert_eq!(errno(a.fs.listxattr(&root, a_sva, 0)), libc::EACCES);
    assert_eq!(
        errno(a.fs.setxattr(&root, a_data, &c("user.x"), b"1", 0)),
        libc::EACCES
    );
    // Daemon B exports the inside of sva: its root is refused, and its open handle too.
    assert_eq!(errno(b.fs.lookup(&root, 1, &c("f"))), libc::EACCES);
    assert_eq!(errno(read(&b.fs, bf, bfh)), libc::EACCES);

    // The sibling subvolume and the group are untouched.
    a.fs.getattr(&root, a_svb_data, None).unwrap();
    a.fs.lookup(&root, a_svb_data, &c("g")).unwrap();
    a.fs.getattr(&root, a_grp, None).unwrap();
    let gdh = a.fs.opendir(&root, a_grp, 0).unwrap().0.unwrap();
    let mut names = Vec::new();
    a.fs.readdirplus(&root, a_grp, gdh, 4096, 0, &mut |d, e| {
        names.push((d.name.to_vec(), e.inode));
        Ok(1)
    })
    .unwrap();
    assert!(
        names.iter().any(|(n, ino)| n == b"sva" && *ino == 0),
        "a quarantined directory is listed without a node: {names:?}"
    );

    // Recovery daemons keep access.
    let g_f = walk(&g.fs, &format!("{sva}/data/f")).unwrap();
    g.fs.getattr(&root, g_f, None).unwrap();
    r.fs.lookup(&root, 1, &c("f")).unwrap();
    // ...and, being guests too, can neither see nor change the quarantine state.
    let g_sva = walk(&g.fs, &sva).unwrap();
    assert_eq!(
        errno(g.fs.getxattr(&root, g_sva, quarantine::STATE_XATTR, 64)),
        libc::ENODATA
    );
    assert!(!has_reserved(&g.fs, g_sva));
    assert_eq!(
        errno(g.fs.setxattr(&root, g_sva, quarantine::STATE_XATTR, b"0", 0)),
        libc::EPERM
    );
    assert_eq!(
        errno(g.fs.removexattr(&root, g_sva, quarantine::STATE_XATTR)),
        libc::ENODATA
    );
    assert!(run_cmd(&lab, "status", &sva).contains("quarantined"));

    // A daemon started now (a restart) starts with the state, before its first request.
    let fresh = daemon(&lab, &format!("{sva}/data"), Some(qcfg()), None);
    assert_eq!(errno(fresh.fs.getattr(&root, 1, None)), libc::EACCES);
    let fresh_root = daemon(&lab, "/", Some(qcfg()), None);
    assert_eq!(errno(walk(&fresh_root.fs, &sva)), libc::EACCES);
    walk(&fresh_root.fs, &svb).unwrap();
    // A daemon without quarantine support is not affected (the feature is the daemon's).
    let off = daemon(&lab, "/", None, None);
    walk(&off.fs, &format!("{sva}/data/f")).unwrap();

    // Release: access comes back without remount, open handles included.
    assert!(run_cmd(&lab, "disable", &sva).contains("released"));
    wait_for("daemon A allows again", || {
        a.fs.getattr(&ctx(0), a_sva, None).is_ok()
    });
    wait_for("daemon B allows again", || {
        b.fs.getattr(&ctx(0), 1, None).is_ok()
    });
    read(&a.fs, f, fh).unwrap();
    read(&b.fs, bf, bfh).unwrap();
    a.fs.lookup(&root, a_data, &c("f")).unwrap();
    a.fs.readdir(&root, a_data, dh, 4096, 0, &mut |_| Ok(0))
        .unwrap();
    wait_for("fresh daemon allows", || {
        fresh.fs.getattr(&ctx(0), 1, None).is_ok()
    });
}

#[test]
fn new_subvolumes_are_discovered_and_plain_dirs_are_not_domains() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let group = format!("qn{}", std::process::id());
    mkdirs(&lab.ceph(), &format!("/volumes/{group}"));
    mkdirs(&lab.ceph(), &format!("/plain-{group}/d"));
    let a = daemon(&lab, "/", Some(qcfg()), None);
    // Created after the daemon started, then quarantined at once.
    let sv = format!("/volumes/{group}/late");
    mkdirs(&lab.ceph(), &format!("{sv}/data"));
    run_cmd(&lab, "enable", &sv);
    wait_for("new subvolume denied", || walk(&a.fs, &sv).is_err());
    assert_eq!(errno(walk(&a.fs, &sv)), libc::EACCES);
    // An ordinary directory is no domain: quarantining it does nothing unless configured.
    let plain = format!("/plain-{group}");
    run_cmd(&lab, "enable", &plain);
    std::thread::sleep(BOUND * 2);
    walk(&a.fs, &format!("{plain}/d")).unwrap();
    // ...but a daemon configured with --quarantine-path enforces it.
    let p = daemon(
        &lab,
        "/",
        Some(QuarantineConfig {
            paths: vec![plain.clone()],
            ..qcfg()
        }),
        None,
    );
    assert_eq!(errno(walk(&p.fs, &format!("{plain}/d"))), libc::EACCES);
    run_cmd(&lab, "disable", &plain);
    run_cmd(&lab, "disable", &sv);
    wait_for("released", || walk(&a.fs, &sv).is_ok());
}

fn mds_requests(asok: &Path) -> u64 {
    let out = Command::new("ceph")
        .arg("--admin-daemon")
        .arg(asok)
        .args(["perf", "dump"])
        .output()
        .unwrap();
    assert!(out.status.success(), "perf dump via {}", asok.display());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["client"]["reply"]["avgcount"].as_u64().unwrap()
}

/// The four traps of the kernel patch set, as MDS request counts: a daemon with quarantine
/// support (nothing quarantined) must send exactly as many MDS requests as one without, for
/// owner and non-owner path walks, snapshot reads/stats outside a subvolume, and creates inside
/// a subvolume. (Lock counts need no test: the gate takes no lock, see quarantine.rs.)
#[test]
fn no_extra_mds_requests_with_quarantine_on() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let tag = format!("qc{}", std::process::id());
    let sv = format!("/volumes/{tag}/sv");
    let deep: String = (1..=24).map(|i| format!("/d{i}")).collect();
    mkdirs(&lab.ceph(), &format!("/{tag}-plain{deep}"));
    mkdirs(&lab.ceph(), &format!("{sv}{deep}"));
    let work = lab.scratch(&tag);
    let on_sock = work.join("on.asok");
    let off_sock = work.join("off.asok");
    let on = daemon(&lab, "/", Some(qcfg()), Some(&on_sock));
    let off = daemon(&lab, "/", None, Some(&off_sock));
    // A snapshot of a plain directory with a file in it.
    let plain_id = walk(&on.fs, &format!("/{tag}-plain")).unwrap();
    let snapf = write_file(&on.fs, plain_id, "snapfile");
    let _ = snapf;
    let snapdir = walk(&on.fs, &format!("/{tag}-plain/.snap")).unwrap();
    on.fs.mkdir(&ctx(0), snapdir, &c("s1"), 0o755, 0).unwrap();

    let run = |d: &Daemon, sock: &Path, label: &str| -> Vec<u64> {
        let mut counts = Vec::new();
        // Warm the caches once, then measure the second pass.
        for pass in 0..2 {
            let before = mds_requests(sock);
            for uid in [0, 1000] {
                for base in [format!("/{tag}-plain"), sv.clone()] {
                    let id = {
                        let mut id = 1;
                        for p in format!("{base}{deep}").split('/').filter(|p| !p.is_empty()) {
                            id = d.fs.lookup(&ctx(uid), id, &c(p)).unwrap().inode;
                            d.fs.getattr(&ctx(uid), id, None).unwrap();
                        }
                        id
                    };
                    let _ = id;
                }
            }
            let walks = mds_requests(sock) - before;
            // Snapshot stats outside a subvolume.
            let b2 = mds_requests(sock);
            let sf = walk(&d.fs, &format!("/{tag}-plain/.snap/s1/snapfile")).unwrap();
            for _ in 0..50 {
                d.fs.getattr(&ctx(0), sf, None).unwrap();
            }
            let snaps = mds_requests(sock) - b2;
            // Creates inside a (non-quarantined) subvolume.
            let b3 = mds_requests(sock);
            let dir = walk(&d.fs, &sv).unwrap();
            for i in 0..20 {
                write_file(&d.fs, dir, &format!("{label}-{pass}-{i}"));
            }
            let creates = mds_requests(sock) - b3;
            if pass == 1 {
                counts = vec![walks, snaps, creates];
            }
        }
        println!("{label}: MDS requests [walks, snapshot stats, 20 creates] = {counts:?}");
        counts
    };
    // Other tests running in parallel touch shared directories (/volumes) and so revoke caps at
    // random moments: compare up to 3 interleaved attempts and require one equal pair.
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for attempt in 0..3 {
        with = run(&on, &on_sock, &format!("quarantine on #{attempt}"));
        without = run(&off, &off_sock, &format!("quarantine off #{attempt}"));
        if with == without {
            break;
        }
    }
    assert_eq!(with, without, "quarantine support adds no MDS request");

    // The watcher itself: an unchanged state costs no MDS request per round (getxattr and
    // the directory getattrs are answered from the caps the client holds, listings are re-read
    // only when a directory's mtime changed).
    let wsock = work.join("watcher.asok");
    let (gate, w) = quarantine::start(
        access(
            &lab,
            vec![("admin_socket".into(), wsock.to_string_lossy().into_owned())],
        ),
        qcfg(),
        "/",
    )
    .unwrap();
    std::thread::sleep(BOUND);
    let window = BOUND * 2;
    let rounds = window.as_millis() / qcfg().poll_interval().as_millis();
    // Other tests of this binary create subvolumes under /volumes meanwhile, and each such
    // change costs the watcher a few requests: of up to 3 windows, one must cost none.
    let mut idle = Vec::new();
    for _ in 0..3 {
        let b = mds_requests(&wsock);
        std::thread::sleep(window);
        idle.push(mds_requests(&wsock) - b);
        // No request proves nothing unless the watcher went round during the window.
        assert!(
            gate.since_round() < window,
            "the watcher finished no round in {} ms",
            window.as_millis()
        );
        if idle.last() == Some(&0) {
            break;
        }
    }
    println!(
        "watcher: MDS requests per {} ms of unchanged state ({rounds} rounds): {idle:?}",
        window.as_millis()
    );
    assert!(
        idle.contains(&0),
        "the watcher sends MDS requests while nothing changes: {idle:?} in windows of \
         {rounds} rounds"
    );
    drop(w);
}

/// A real guest holding an open file and cached dentries in a subvolume when it is
/// quarantined: after the bound, writes through the open fd, stat of the cached path and
/// listing fail with EACCES; the sibling works; the guest cannot read or set the state xattr.
#[test]
fn guest_open_handle_and_cached_dentry() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let group = format!("qg{}", std::process::id());
    let sv = format!("/volumes/{group}/sv");
    let sib = format!("/volumes/{group}/sib");
    mkdirs(&lab.ceph(), &format!("{sv}/d"));
    mkdirs(&lab.ceph(), &format!("{sib}/d"));
    let work = lab.scratch(&group);
    let d = common::Daemon::start(&lab, &work, &format!("/volumes/{group}"), &[]);
    // The guest signals through the share itself: it creates `ready` in the sibling, the host
    // quarantines `sv` and creates `go`.
    let script = r#"#!/bin/sh
r() { if "$@" >/dev/null 2>&1; then echo "QT $1 ok"; else echo "QT $1 fail"; fi; }
echo hello > /mnt/sv/d/f
exec 3>>/mnt/sv/d/f
stat /mnt/sv/d/f >/dev/null && ls /mnt/sv/d >/dev/null
getfattr -n trusted.ceph-virtiofsd.quarantine /mnt/sv >/dev/null 2>&1 && echo "QT seen"
setfattr -n trusted.ceph-virtiofsd.quarantine -v 0 /mnt/sib 2>/dev/null && echo "QT set"
touch /mnt/sib/ready
i=0; while [ ! -e /mnt/sib/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
sleep 1.5
if echo more >&3 2>/dev/null; then echo "QT fdwrite ok"; else echo "QT fdwrite fail"; fi
r stat /mnt/sv/d/f
r ls /mnt/sv/d
r cat /mnt/sv/d/f
r touch /mnt/sv/new
r stat /mnt/sib/d
echo "QT done"
"#;
    let lab2 = Lab::get();
    let sv2 = sv.clone();
    let sib2 = sib.clone();
    let host = std::thread::spawn(move || {
        let m = lab2.ceph();
        let perm = UserPerm::root();
        let t = Instant::now();
        loop {
            let ready = quarantine::resolve(&m, &format!("{sib2}/ready"), &perm).is_ok();
            if ready || t.elapsed() > Duration::from_secs(120) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        run_cmd(&lab2, "enable", &sv2);
        mkdirs(&lab2.ceph(), &format!("{sib2}/go"));
    });
    let run = common::run_guest(&lab, &work, &d, script, &[], 240);
    host.join().unwrap();
    run_cmd(&lab, "disable", &sv);
    let con = &run.console;
    for want in [
        "QT fdwrite fail",
        "QT stat fail",
        "QT ls fail",
        "QT cat fail",
        "QT touch fail",
        "QT stat ok",
        "QT done",
    ] {
        assert!(con.contains(want), "missing {want:?}:\n{con}");
    }
    assert!(!con.contains("QT seen") && !con.contains("QT set"), "{con}");
    // The audit names the caller by its guest uid (the guest's root here).
    let log = d.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("quarantine: operation denied") && l.contains("guest_uid=0")),
        "audit line: {log}"
    );
}

/// logrotate in a real guest, and another tenant's routine quarantine (issue 28, item 1): the
/// guest holds descriptors on `a/f` and `h`, renames `a` to `b` and `h` to `b/h2`, and works in
/// `b/sub`; then the operator quarantines a subvolume the guest has nothing to do with. The
/// descriptors and the cwd must go on working. Before, RENAME left each moved node's link at
/// its old name, and the first derivation after the gate changed (every watcher round while
/// anything is denied) failed closed on it: EACCES on the guest's own descriptors and cwd,
/// while the same files by their new paths worked.
#[test]
fn guest_renames_survive_another_tenants_quarantine() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let group = format!("qr{}", std::process::id());
    let sv = format!("/volumes/{group}/sv");
    let other = format!("/volumes/{group}/other");
    mkdirs(&lab.ceph(), &sv);
    mkdirs(&lab.ceph(), &format!("{other}/d"));
    let work = lab.scratch(&group);
    let d = common::Daemon::start(&lab, &work, &sv, &[]);
    // The guest signals through the share itself: it creates `ready`; the host quarantines
    // `other` and, once the daemon's watcher has seen it, creates `go`.
    let script = r#"#!/bin/sh
r() { if "$@" >/dev/null 2>&1; then echo "QT $1 $2 ok"; else echo "QT $1 $2 fail"; fi; }
cd /mnt
mkdir -p a/sub
echo one > a/f
echo two > h
exec 3>>a/f
exec 4>>h
exec 5<a/f
mv a b
mv h b/h2
cd b/sub
touch /mnt/ready
i=0; while [ ! -e /mnt/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
[ -e /mnt/go ] && echo "QT go"
sleep 1.5
if echo more >&3 2>/dev/null; then echo "QT fd3 write ok"; else echo "QT fd3 write fail"; fi
if echo more >&4 2>/dev/null; then echo "QT fd4 write ok"; else echo "QT fd4 write fail"; fi
if cat <&5 >/dev/null 2>&1; then echo "QT fd5 read ok"; else echo "QT fd5 read fail"; fi
r touch x
r ls .
r stat ..
r cat /mnt/b/f
r cat /mnt/b/h2
echo "QT done"
"#;
    let lab2 = Lab::get();
    let (sv2, other2) = (sv.clone(), other.clone());
    let host = std::thread::spawn(move || {
        let m = lab2.ceph();
        let perm = UserPerm::root();
        let t = Instant::now();
        while quarantine::resolve(&m, &format!("{sv2}/ready"), &perm).is_err()
            && t.elapsed() < Duration::from_secs(180)
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        run_cmd(&lab2, "enable", &other2);
        // Past the bound, the daemon's watcher has seen it (and changes its gate every round).
        std::thread::sleep(BOUND * 2);
        mkdirs(&lab2.ceph(), &format!("{sv2}/go"));
    });
    let run = common::run_guest(&lab, &work, &d, script, &[], 300);
    host.join().unwrap();
    run_cmd(&lab, "disable", &other);
    let con = &run.console;
    let mut missing = Vec::new();
    for want in [
        "QT go",
        "QT fd3 write ok",
        "QT fd4 write ok",
        "QT fd5 read ok",
        "QT touch x ok",
        "QT ls . ok",
        "QT stat .. ok",
        "QT cat /mnt/b/f ok",
        "QT cat /mnt/b/h2 ok",
        "QT done",
    ] {
        if !con.contains(want) {
            missing.push(want);
        }
    }
    assert!(missing.is_empty(), "missing {missing:?}:\n{con}");
    let log = d.log_text();
    assert!(
        !log.contains("quarantine: operation denied"),
        "the guest was denied:\n{log}"
    );
    // The bytes written through the descriptors are where the new names lead.
    let m = lab.ceph();
    let b = common::ceph_dir(&m, &format!("{sv}/b"));
    assert_eq!(common::ceph_read_all(&m, &b, "f"), b"one\nmore\n");
    assert_eq!(common::ceph_read_all(&m, &b, "h2"), b"two\nmore\n");
}

// ---- a hostile guest against the quarantine (issue 13) ---------------------------------------

/// `--quarantine-path` daemon exporting "/" (its watcher reads the state before it serves).
fn path_daemon(lab: &Lab, paths: &[&str]) -> Daemon {
    daemon(
        lab,
        "/",
        Some(QuarantineConfig {
            paths: paths.iter().map(|p| p.to_string()).collect(),
            ..qcfg()
        }),
        None,
    )
}

/// The measured hole: p1 does not exist when the daemon starts; the guest creates it, "cd"s
/// into it (holds its node) and opens a file there; then both paths are quarantined. Paths
/// from the root, the cwd-relative lookup and the open descriptor must all be denied.
#[test]
fn hostile_quarantine_late_directory_cwd_and_open_fd() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let top = format!("/hostile-qlate-{}", std::process::id());
    mkdirs(&lab.ceph(), &format!("{top}/p0"));
    let (p0, p1) = (format!("{top}/p0"), format!("{top}/p1"));
    let a = path_daemon(&lab, &[&p0, &p1]);
    let root = ctx(0);
    let topn = walk(&a.fs, &top).unwrap();
    let cwd1 = a.fs.mkdir(&root, topn, &c("p1"), 0o777, 0).unwrap().inode;
    let f1 = write_file(&a.fs, cwd1, "f");
    let fh1 = open(&a.fs, f1);
    let cwd0 = walk(&a.fs, &p0).unwrap();
    let f0 = write_file(&a.fs, cwd0, "f");
    let fh0 = open(&a.fs, f0);
    // Let the watcher see p1 exist (released) before the quarantine, as in the report.
    std::thread::sleep(BOUND);
    run_cmd(&lab, "enable", &p0);
    run_cmd(&lab, "enable", &p1);
    wait_for("paths from the root denied", || {
        walk(&a.fs, &format!("{p0}/f")).is_err() && walk(&a.fs, &format!("{p1}/f")).is_err()
    });
    assert_eq!(errno(read(&a.fs, f0, fh0)), libc::EACCES);
    assert_eq!(errno(a.fs.lookup(&root, cwd0, &c("f"))), libc::EACCES);
    assert_eq!(
        errno(a.fs.lookup(&root, cwd1, &c("f"))),
        libc::EACCES,
        "cat f relative to a cwd in the late directory"
    );
    assert_eq!(
        errno(read(&a.fs, f1, fh1)),
        libc::EACCES,
        "the open descriptor in the late directory"
    );
    assert_eq!(errno(a.fs.getattr(&root, cwd1, None)), libc::EACCES);
    run_cmd(&lab, "disable", &p0);
    run_cmd(&lab, "disable", &p1);
    wait_for("released", || read(&a.fs, f1, fh1).is_ok());
}

/// Another client moves a directory the guest holds (with a file open in it) into a
/// quarantined directory: the guest's node follows it there.
#[test]
fn hostile_quarantine_directory_renamed_in_by_another_client() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let top = format!("/hostile-qren-{}", std::process::id());
    let q = format!("{top}/q");
    mkdirs(&lab.ceph(), &q);
    mkdirs(&lab.ceph(), &format!("{top}/out/x"));
    let a = path_daemon(&lab, &[&q]);
    let root = ctx(0);
    let x = walk(&a.fs, &format!("{top}/out/x")).unwrap();
    let f = write_file(&a.fs, x, "f");
    let fh = open(&a.fs, f);
    run_cmd(&lab, "enable", &q);
    wait_for("quarantined", || walk(&a.fs, &q).is_err());
    // Still outside: allowed.
    a.fs.getattr(&root, x, None).unwrap();
    let m = lab.ceph();
    let perm = UserPerm::root();
    let out = quarantine::resolve(&m, &format!("{top}/out"), &perm).unwrap();
    let qd = quarantine::resolve(&m, &q, &perm).unwrap();
    m.rename(&out, &c("x"), &qd, &c("x"), &perm).unwrap();
    wait_for("the moved directory is denied", || {
        a.fs.getattr(&root, x, None).is_err()
    });
    assert_eq!(errno(a.fs.lookup(&root, x, &c("f"))), libc::EACCES);
    assert_eq!(errno(read(&a.fs, f, fh)), libc::EACCES, "open file in it");
    run_cmd(&lab, "disable", &q);
}

/// A hard link the guest made out of a directory before its quarantine: neither the node it
/// holds nor a fresh lookup of the outside name reaches the file afterwards.
#[test]
fn hostile_quarantine_hard_link_made_before() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let top = format!("/hostile-qlink-{}", std::process::id());
    let q = format!("{top}/q");
    mkdirs(&lab.ceph(), &q);
    mkdirs(&lab.ceph(), &format!("{top}/out"));
    // The tenant's export holds both directories (a daemon exporting "/" would also deny
    // multiply-linked files while other tests quarantine their subvolumes).
    let a = daemon(
        &lab,
        &top,
        Some(QuarantineConfig {
            paths: vec![q.clone()],
            ..qcfg()
        }),
        None,
    );
    let root = ctx(0);
    let qn = walk(&a.fs, "q").unwrap();
    let out = walk(&a.fs, "out").unwrap();
    let f = write_file(&a.fs, qn, "f");
    a.fs.link(&root, f, out, &c("hl")).unwrap();
    let fh = open(&a.fs, f);
    run_cmd(&lab, "enable", &q);
    wait_for("quarantined", || walk(&a.fs, "q/f").is_err());
    assert_eq!(errno(a.fs.lookup(&root, out, &c("hl"))), libc::EACCES);
    assert_eq!(errno(a.fs.getattr(&root, f, None)), libc::EACCES);
    assert_eq!(errno(read(&a.fs, f, fh)), libc::EACCES);
    run_cmd(&lab, "disable", &q);
    wait_for("released", || a.fs.lookup(&root, out, &c("hl")).is_ok());
}

/// A subvolume removed and re-created under the same name after the daemon started is still
/// the domain of that name.
#[test]
fn hostile_quarantine_recreated_subvolume() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let group = format!("hqr{}", std::process::id());
    let sv = format!("/volumes/{group}/sv");
    mkdirs(&lab.ceph(), &format!("{sv}/old"));
    let a = daemon(&lab, "/", Some(qcfg()), None);
    walk(&a.fs, &format!("{sv}/old")).unwrap();
    let m = lab.ceph();
    let perm = UserPerm::root();
    let g = quarantine::resolve(&m, &format!("/volumes/{group}"), &perm).unwrap();
    let old = quarantine::resolve(&m, &sv, &perm).unwrap();
    m.rmdir(&old, &c("old"), &perm).unwrap();
    m.rmdir(&g, &c("sv"), &perm).unwrap();
    mkdirs(&lab.ceph(), &format!("{sv}/new"));
    std::thread::sleep(BOUND);
    let new = walk(&a.fs, &format!("{sv}/new")).unwrap();
    run_cmd(&lab, "enable", &sv);
    wait_for("re-created subvolume denied", || {
        a.fs.getattr(&ctx(0), new, None).is_err()
    });
    assert_eq!(errno(walk(&a.fs, &format!("{sv}/new"))), libc::EACCES);
    run_cmd(&lab, "disable", &sv);
}

/// `--ceph-root` spelled with a double slash (and a trailing one) inside a subvolume: the
/// export is in the subvolume's domain all the same.
#[test]
fn hostile_quarantine_unnormalised_ceph_root() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let group = format!("hqn{}", std::process::id());
    mkdirs(&lab.ceph(), &format!("/volumes/{group}/sv/data"));
    for spelling in [
        format!("/volumes//{group}/sv/data/"),
        format!("/volumes/./{group}//sv"),
    ] {
        let (gate, w) = quarantine::start(access(&lab, Vec::new()), qcfg(), &spelling).unwrap();
        assert_ne!(gate.root_domain(), 0, "{spelling} is in no domain");
        assert_eq!(
            gate.path_of(gate.root_domain()),
            format!("/volumes/{group}/sv"),
            "{spelling}"
        );
        drop(w);
    }
}

/// A filesystem whose quarantine gate the test flips itself (no watcher): domain `d` is the
/// directory `/<name>/q`.
fn gated_fs(lab: &Lab, name: &str) -> (CephFs, std::sync::Arc<quarantine::Gate>, u32) {
    let export = lab.export_dir(name);
    mkdirs(&lab.ceph(), &format!("{export}/q"));
    let m = lab.ceph();
    let q = quarantine::resolve(&m, &format!("{export}/q"), &UserPerm::root()).unwrap();
    let gate = std::sync::Arc::new(quarantine::Gate::new());
    let d = gate.domain_for_path(&format!("{export}/q")).unwrap();
    gate.register_root(q.vino().unwrap().ino, d);
    gate.publish(&[false]);
    let connect = |export: String| {
        let (id, conf) = (lab.client_id.clone(), lab.conf.clone());
        move || {
            MountBuilder::new(Some(&id))
                .and_then(|b| b.conf_read_file(Some(&conf)))
                .and_then(|b| b.mount(&export))
        }
    };
    let mount = connect(export.clone())().unwrap();
    let cfg = FsConfig {
        quarantine: Some(gate.clone()),
        // As the daemon has it: renames over a name with other links go through it.
        second_session: Some(ceph_virtiofsd::fs::side::Connector(std::sync::Arc::new(
            connect(export),
        ))),
        ..FsConfig::default()
    };
    let fs = CephFs::new(mount, cfg).unwrap();
    fs.init(FsOptions::ASYNC_READ).unwrap();
    (fs, gate, d)
}

/// CREATE of `name` in `dir`, kept open for writing: (node, handle).
fn create_open(fs: &CephFs, dir: u64, name: &str) -> (u64, u64) {
    let (e, fh, _, _) = fs
        .create(
            &ctx(0),
            dir,
            &c(name),
            CreateIn {
                flags: libc::O_WRONLY as u32,
                mode: 0o666,
                umask: 0,
                fuse_flags: 0,
            },
        )
        .unwrap();
    (e.inode, fh.unwrap())
}

/// What the guest holds stays usable when the gate changes for a reason of someone else's (a
/// subvolume created, another tenant's quarantine): files it keeps open and directories it
/// keeps as cwd, after it renamed them (within a directory, across, over another file, with
/// RENAME_NOREPLACE, over a name with other links), after a rename replaced them, after it
/// unlinked them, and after it moved them by link and unlink (issue 28, item 1). Before, a
/// RENAME left the node's link at the old name, and every derivation after the gate's next
/// change failed closed on it: EACCES for the guest's own open descriptor.
#[test]
fn hostile_quarantine_the_guests_own_renames_keep_what_it_holds() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let name = format!("hostile-qmine-{}", std::process::id());
    let (fs, gate, _d) = gated_fs(&lab, &name);
    let root = ctx(0);
    let mkdir = |p: u64, n: &str| fs.mkdir(&root, p, &c(n), 0o777, 0).unwrap().inode;
    let (a, b) = (mkdir(1, "a"), mkdir(1, "b"));
    let mut held: Vec<(&str, u64, u64)> = Vec::new();
    // Across directories, and within one.
    let (f, fh) = create_open(&fs, a, "f");
    fs.rename(&root, a, &c("f"), b, &c("g"), 0).unwrap();
    held.push(("renamed across directories", f, fh));
    let (f, fh) = create_open(&fs, 1, "h");
    fs.rename(&root, 1, &c("h"), 1, &c("h2"), 0).unwrap();
    held.push(("renamed within its directory", f, fh));
    // Over another file the guest holds open too: that one has no name left.
    let (f, fh) = create_open(&fs, 1, "o");
    let (t, tfh) = create_open(&fs, b, "t");
    fs.rename(&root, 1, &c("o"), b, &c("t"), 0).unwrap();
    held.push(("renamed over another file", f, fh));
    held.push(("replaced by a rename", t, tfh));
    let (f, fh) = create_open(&fs, 1, "n");
    fs.rename(&root, 1, &c("n"), a, &c("n2"), libc::RENAME_NOREPLACE)
        .unwrap();
    held.push(("renamed with RENAME_NOREPLACE", f, fh));
    // Over a name with another link (the second session's rename).
    let (f, fh) = create_open(&fs, 1, "l");
    let (t2, t2fh) = create_open(&fs, a, "t2");
    fs.link(&root, t2, b, &c("t3")).unwrap();
    fs.rename(&root, 1, &c("l"), a, &c("t2"), 0).unwrap();
    held.push(("renamed over a name with other links", f, fh));
    held.push(("one of its links replaced by a rename", t2, t2fh));
    // Unlinked while open.
    let (f, fh) = create_open(&fs, a, "u");
    fs.unlink(&root, a, &c("u")).unwrap();
    held.push(("unlinked while open", f, fh));
    // Moved by link and unlink, and a second link made and removed.
    let (f, fh) = create_open(&fs, a, "k");
    fs.link(&root, f, b, &c("k2")).unwrap();
    fs.unlink(&root, a, &c("k")).unwrap();
    held.push(("moved by link and unlink", f, fh));
    let (f, fh) = create_open(&fs, a, "j");
    fs.link(&root, f, b, &c("j2")).unwrap();
    fs.unlink(&root, b, &c("j2")).unwrap();
    held.push(("its second link removed", f, fh));
    // A directory renamed, with a file open in it.
    let d = mkdir(1, "d");
    let (f, fh) = create_open(&fs, d, "in");
    fs.rename(&root, 1, &c("d"), a, &c("e"), 0).unwrap();
    held.push(("open in a renamed directory", f, fh));

    let qf = write_file(&fs, walk(&fs, "q").unwrap(), "f");
    // A gate change alone (a subvolume created anywhere), then another domain of the same
    // export quarantined (every file with several links is denied then: none is left).
    for (round, change) in ["a gate change", "a quarantine next door"]
        .iter()
        .enumerate()
    {
        if round == 0 {
            gate.invalidate();
        } else {
            gate.publish(&[true]);
            assert_eq!(errno(fs.getattr(&root, qf, None)), libc::EACCES);
        }
        let mut failed = Vec::new();
        for (what, f, fh) in &held {
            if let Err(e) = common::fs_write(&fs, *f, *fh, 0, b"still mine") {
                failed.push(format!("write to a file {what}: {e}"));
            }
        }
        let x = format!("x{round}");
        if let Err(e) = fs.mkdir(&root, d, &c(&x), 0o777, 0) {
            failed.push(format!("mkdir in a renamed directory: {e}"));
        }
        if let Err(e) = fs.getattr(&root, a, None) {
            failed.push(format!("getattr of a directory renamed into: {e}"));
        }
        assert!(failed.is_empty(), "after {change}:\n{}", failed.join("\n"));
    }
    // The new names reach the same files.
    assert_eq!(walk(&fs, "b/g").unwrap(), held[0].1);
    walk(&fs, "a/e/x1").unwrap();
}

/// A SETLKW waiting for another client's lock when the quarantine comes is not granted
/// afterwards, and leaves no lock behind.
#[test]
fn hostile_quarantine_setlkw_granted_after_the_quarantine() {
    let _cluster = common::cluster_shared();
    use fuse_backend_rs::api::filesystem::FileLock;
    let lab = Lab::get();
    let name = format!("hostile-qlock-{}", std::process::id());
    let (fs, gate, d) = gated_fs(&lab, &name);
    let q = walk(&fs, "q").unwrap();
    let f = write_file(&fs, q, "f");
    let fh = open(&fs, f);
    // The other client holds a write lock on the whole file.
    let m = lab.ceph();
    let perm = UserPerm::root();
    let other = quarantine::resolve(&m, &format!("/{name}/q/f"), &perm).unwrap();
    let of = m.open(&other, libc::O_RDWR, &perm).unwrap();
    let whole = |t: i32| libc::flock {
        l_type: t as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    of.setlk(&whole(libc::F_WRLCK), 1, false).unwrap();
    let lock = FileLock {
        start: 0,
        end: i64::MAX as u64,
        lock_type: libc::F_WRLCK as u32,
        pid: 7,
    };
    let r = std::thread::scope(|s| {
        let waiter = s.spawn(|| fs.setlkw(&ctx(0), f, fh, 42, lock, 0));
        // Setup only (the outcome does not depend on it): let the request wait first.
        std::thread::sleep(Duration::from_millis(500));
        gate.publish(&[true]);
        assert!(gate.denied(d));
        of.setlk(&whole(libc::F_UNLCK), 1, false).unwrap();
        waiter.join().unwrap()
    });
    assert_eq!(
        errno(r),
        libc::EACCES,
        "SETLKW granted after the quarantine"
    );
    // The daemon holds no lock: the other client can take it again at once.
    of.setlk(&whole(libc::F_WRLCK), 2, false)
        .expect("the lock granted after the quarantine was given back");
}

/// A copy_file_range out of a quarantined file stops at the next chunk, not after 4 GiB.
#[test]
fn hostile_quarantine_copy_file_range_stops_at_the_next_chunk() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let name = format!("hostile-qcopy-{}", std::process::id());
    let (fs, gate, _d) = gated_fs(&lab, &name);
    let q = walk(&fs, "q").unwrap();
    let src = write_file(&fs, q, "src");
    let dst = write_file(&fs, 1, "dst");
    const LEN: u64 = 48 << 20;
    // A sparse source of LEN bytes (reads as zeros).
    let mut attr = fs.getattr(&ctx(0), src, None).unwrap().0;
    attr.st_size = LEN as i64;
    fs.setattr(
        &ctx(0),
        src,
        attr,
        None,
        fuse_backend_rs::abi::fuse_abi::SetattrValid::SIZE,
    )
    .unwrap();
    let sfh = open(&fs, src);
    let dfh = open(&fs, dst);
    let r = std::thread::scope(|s| {
        let copier = s.spawn(|| fs.copy_range(&ctx(0), src, sfh, 0, dst, dfh, 0, LEN));
        // Quarantine once the copy has written its first chunk.
        let t = Instant::now();
        while fs.getattr(&ctx(0), dst, None).unwrap().0.st_size == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the copy never starts"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        gate.publish(&[true]);
        copier.join().unwrap()
    });
    let copied = r.unwrap_or(0) as u64;
    println!("copied {copied} of {LEN} bytes");
    assert!(
        copied < LEN / 2,
        "the copy went on after the quarantine: {copied} of {LEN} bytes"
    );
}

/// What a gate change costs: every node derives its domain again at its next request, up its
/// chain of links, each confirmed by a lookup. For a guest's tree of directories this must be
/// answered from libcephfs's cache (no MDS request), with each directory walked once.
#[test]
fn hostile_quarantine_rederivation_costs_no_mds_request() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let name = format!("hostile-qcost-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let sock = work.join("fs.asok");
    let gate = std::sync::Arc::new(quarantine::Gate::new());
    // A domain elsewhere, denied: the state in which every watcher round invalidates.
    let far = gate.domain_for_path("/elsewhere").unwrap();
    gate.publish(&[true]);
    assert!(gate.denied(far));
    let mount = MountBuilder::new(Some(&lab.client_id))
        .and_then(|b| b.conf_read_file(Some(&lab.conf)))
        .and_then(|b| b.conf_set("admin_socket", &sock.to_string_lossy()))
        .and_then(|b| b.mount(&export))
        .unwrap();
    let fs = CephFs::new(
        mount,
        FsConfig {
            quarantine: Some(gate.clone()),
            ..FsConfig::default()
        },
    )
    .unwrap();
    fs.init(FsOptions::ASYNC_READ).unwrap();
    let root = ctx(0);
    let mut dir = 1;
    let mut nodes = Vec::new();
    for depth in 0..16 {
        dir = fs
            .mkdir(&root, dir, &c(&format!("d{depth}")), 0o755, 0)
            .unwrap()
            .inode;
        nodes.push(dir);
        for i in 0..8 {
            nodes.push(write_file(&fs, dir, &format!("f{i}")));
        }
    }
    let pass = || {
        for &n in &nodes {
            fs.getattr(&root, n, None).unwrap();
        }
    };
    pass();
    let mut last = (0, 0);
    for attempt in 0..3 {
        let b = mds_requests(&sock);
        let t = Instant::now();
        pass();
        let steady_us = t.elapsed().as_micros();
        let steady = mds_requests(&sock) - b;
        let b = mds_requests(&sock);
        let t = Instant::now();
        gate.invalidate();
        pass();
        let change_us = t.elapsed().as_micros();
        let after_change = mds_requests(&sock) - b;
        println!(
            "attempt {attempt}: {} GETATTRs over nodes 16 deep: MDS requests {steady} without \
             and {after_change} with a gate change; {steady_us} us without, {change_us} us with",
            nodes.len(),
        );
        last = (steady, after_change);
        if steady == after_change {
            break;
        }
    }
    assert_eq!(last.0, last.1, "re-deriving domains asks the MDS");
}

/// More quarantine-capable directories than a daemon has domains for: one discovered after
/// the table is full is denied (fail closed), not left untracked.
#[test]
fn hostile_quarantine_domain_table_full_fails_closed() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let tag = format!("hqo{}", std::process::id());
    mkdirs(&lab.ceph(), &format!("/{tag}"));
    // Fill the table with configured paths (they need not exist).
    let paths: Vec<String> = (0..quarantine::MAX_DOMAINS)
        .map(|i| format!("/{tag}/p{i}"))
        .collect();
    let a = daemon(&lab, "/", Some(QuarantineConfig { paths, ..qcfg() }), None);
    let sv = format!("/volumes/{tag}/sv");
    mkdirs(&lab.ceph(), &format!("{sv}/d"));
    wait_for("the untracked subvolume is denied", || {
        walk(&a.fs, &format!("{sv}/d")).is_err()
    });
    assert_eq!(errno(walk(&a.fs, &sv)), libc::EACCES);
    // Elsewhere is untouched.
    walk(&a.fs, &format!("/{tag}")).unwrap();
}

// ---- the watcher's own identity (issue 28) ---------------------------------------------------

/// Run the lab's `ceph` CLI (as client.admin); its stdout. Panics on failure.
fn ceph(lab: &Lab, args: &[&str]) -> String {
    let out = lab.ceph_cli().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ceph {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A tenant's key confined to its subvolume's data directory, as Ceph's own tools hand it out
/// (`ceph fs subvolume authorize` asks the monitor for `ceph fs authorize <fs> <id> <path>
/// rw`: `mds 'allow rw path=/volumes/_nogroup/<sv>/<uuid>'`), exports its subvolume with
/// quarantine on. With one id for both (the default), the watcher cannot mount "/" with it,
/// and the guest's own subvolume is denied (fail closed). With `--quarantine-client-id` (a
/// metadata-only key on /volumes, no OSD caps) it is served, and quarantining the subvolume
/// still denies it. The subvolume is made as the mgr's volumes module lays it out
/// (`/volumes/_nogroup/<sv>/<uuid>`), so the test needs no mgr: CI's cluster runs none.
#[test]
fn quarantine_watcher_with_its_own_id_serves_a_path_confined_tenant() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let pid = std::process::id();
    let name = format!("qwatch{pid}");
    let tenant = format!("qtenant{pid}");
    let watch = format!("qwatcher{pid}");
    let subvolume = format!("/volumes/_nogroup/{name}");
    let path = format!("{subvolume}/{pid:08x}-7e57-4e57-8e57-0000c0ffee00");
    mkdirs(&lab.ceph(), &path);
    ceph(
        &lab,
        &[
            "fs",
            "authorize",
            "cephfs",
            &format!("client.{tenant}"),
            &path,
            "rw",
        ],
    );
    let work = lab.scratch(&name);
    let tenant_keyring = work.join("tenant.keyring");
    let watch_keyring = work.join("watch.keyring");
    let tk = tenant_keyring.to_str().unwrap();
    let wk = watch_keyring.to_str().unwrap();
    ceph(
        &lab,
        &["auth", "get", &format!("client.{tenant}"), "-o", tk],
    );
    // The README's line: metadata read access on /volumes, no OSD caps.
    ceph(
        &lab,
        &[
            "auth",
            "get-or-create",
            &format!("client.{watch}"),
            "mon",
            "allow r",
            "mds",
            "allow r path=/volumes",
            "-o",
            wk,
        ],
    );
    println!(
        "tenant caps: {}",
        ceph(&lab, &["auth", "get", &format!("client.{tenant}")])
    );
    let script = r#"#!/bin/sh
if echo hello > /mnt/f && [ "$(cat /mnt/f)" = hello ] && ls /mnt >/dev/null; then
  echo "QW served"
else
  echo "QW refused"
fi
touch /mnt/ready
i=0; while ls /mnt >/dev/null 2>&1 && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
if ls /mnt >/dev/null 2>&1; then echo "QW still served"; else echo "QW denied"; fi
if cat /mnt/f >/dev/null 2>&1; then echo "QW read ok"; else echo "QW read denied"; fi
"#;

    // One id for both: the watcher mounts "/" as the tenant, which may not.
    let same = lab.scratch(&format!("{name}-same"));
    let d = common::Daemon::start_as(&lab, &same, &path, &tenant, &["--keyring", tk]);
    let run = common::run_guest(&lab, &same, &d, script, &[], 120);
    assert!(!run.console.contains("QW served"), "{}", run.console);
    let log = d.log_text();
    assert!(
        log.contains("the watcher cannot mount CephFS"),
        "the watcher mounted as the tenant: {log}"
    );
    drop(d);

    // The watcher's own id: served; a quarantine of the subvolume still denies it.
    let own = lab.scratch(&format!("{name}-own"));
    let d = common::Daemon::start_as(
        &lab,
        &own,
        &path,
        &tenant,
        &[
            "--keyring",
            tk,
            "--quarantine-client-id",
            &watch,
            "--quarantine-keyring",
            wk,
            // The watcher's session carries the device's uuid too (reclaimed at a restart).
            "--instance-id",
            &name,
        ],
    );
    let lab2 = Lab::get();
    let (ready, sv) = (format!("{path}/ready"), subvolume.clone());
    let host = std::thread::spawn(move || {
        let m = lab2.ceph();
        let t = Instant::now();
        while quarantine::resolve(&m, &ready, &UserPerm::root()).is_err()
            && t.elapsed() < Duration::from_secs(120)
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        run_cmd(&lab2, "enable", &sv);
    });
    let run = common::run_guest(&lab, &own, &d, script, &[], 240);
    host.join().unwrap();
    run_cmd(&lab, "disable", &subvolume);
    let con = &run.console;
    for want in ["QW served", "QW denied", "QW read denied"] {
        assert!(
            con.contains(want),
            "missing {want:?}:\n{con}\n{}",
            d.log_text()
        );
    }
    let log = d.log_text();
    assert!(
        log.contains(&format!("id=client.{watch}")) && log.contains("mount=/volumes"),
        "{log}"
    );
    assert!(!log.contains("the watcher cannot mount CephFS"), "{log}");
}

/// Every test here and in [`churn`] takes the cluster gate: [`churn`] needs the cluster alone.
#[test]
fn every_test_takes_the_cluster_gate() {
    common::every_test_takes_the_cluster_gate("quarantine", &["every_test_takes_the_cluster_gate"]);
}
