//! Subvolume churn against one long-running daemon's quarantine (issue 13): CSI creates and
//! deletes uniquely named subvolumes, over a daemon's life more than it has domain ids.
//!
//! It holds the lab cluster alone (`common::cluster_alone`): thousands of subvolumes under
//! `/volumes` make every watcher on the cluster slower for a while, which the timing-bound tests
//! of `tests/quarantine/main.rs` must not share.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ceph_client::{Mount, MountBuilder, UserPerm, CEPH_STATX_BASIC_STATS};
use ceph_virtiofsd::fs::{CephFs, FsConfig};
use ceph_virtiofsd::quarantine::{self, CephAccess, Gate, QuarantineConfig, Watcher};
use fuse_backend_rs::abi::fuse_abi::FsOptions;
use fuse_backend_rs::api::filesystem::FileSystem;

use crate::common;
use crate::common::quarantine::{mkdirs, qcfg, run_cmd, wait_for, wait_up_to, walk};
use crate::common::{c, errno, Lab};

/// A daemon exporting "/" with its watcher (dropped together) and its gate.
struct Daemon {
    fs: CephFs,
    gate: Arc<Gate>,
    _watcher: Watcher,
}

fn daemon(lab: &Lab, q: QuarantineConfig) -> Daemon {
    let access = CephAccess {
        conf: Some(lab.conf.clone()),
        client_id: Some(lab.client_id.clone()),
        mount_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let (gate, watcher) = quarantine::start(access, q.clone(), "/").unwrap();
    let mount = MountBuilder::new(Some(&lab.client_id))
        .and_then(|b| b.conf_read_file(Some(&lab.conf)))
        .and_then(|b| b.mount("/"))
        .unwrap();
    let cfg = FsConfig {
        quarantine: Some(gate.clone()),
        revocable_ttl: q.ttl_bound(),
        ..FsConfig::default()
    };
    let fs = CephFs::new(mount, cfg).unwrap();
    fs.init(FsOptions::ASYNC_READ).unwrap();
    Daemon {
        fs,
        gate,
        _watcher: watcher,
    }
}

/// The subdirectory names of a directory.
fn subdirs(m: &Mount, dir: &ceph_client::Inode) -> Vec<Vec<u8>> {
    let perm = UserPerm::root();
    let mut d = m.opendir(dir, &perm).unwrap();
    let mut out = Vec::new();
    while let Some(e) = d.readdirplus(0, 0, false).unwrap() {
        if e.d_type == libc::DT_DIR && e.name != b"." && e.name != b".." {
            out.push(e.name);
        }
    }
    out
}

/// Remove a tree of directories (what an earlier, failed run of this test left).
fn rmdirs(m: &Mount, parent: &ceph_client::Inode, name: &[u8]) {
    let perm = UserPerm::root();
    let Ok(cname) = std::ffi::CString::new(name) else {
        return;
    };
    let Ok((dir, _)) = m.lookup(parent, &cname, 0, 0, &perm) else {
        return;
    };
    for s in subdirs(m, &dir) {
        rmdirs(m, &dir, &s);
    }
    let _ = m.rmdir(parent, &cname, &perm);
}

/// Whether a call failed with EACCES.
fn denied<T>(r: io::Result<T>) -> bool {
    r.err().and_then(|e| e.raw_os_error()) == Some(libc::EACCES)
}

/// The subvolumes (`/volumes/<group>/<name>`) that exist now.
fn subvolume_count(m: &Mount) -> usize {
    let perm = UserPerm::root();
    let names = |dir: &ceph_client::Inode| subdirs(m, dir);
    let Ok(vol) = quarantine::resolve(m, quarantine::VOLUMES, &perm) else {
        return 0;
    };
    let mut n = 0;
    for g in names(&vol)
        .into_iter()
        .filter(|g| quarantine::is_group_name(g))
    {
        let Ok(name) = std::ffi::CString::new(g) else {
            continue;
        };
        if let Ok((gdir, _)) = m.lookup(&vol, &name, 0, 0, &perm) {
            n += names(&gdir)
                .iter()
                .filter(|s| quarantine::is_subvolume_name(s))
                .count();
        }
    }
    n
}

/// CSI creates and deletes uniquely named subvolumes for as long as a daemon runs: over its
/// life more than it has domains. A removed subvolume's domain is retired and its id reused;
/// one discovered while every id is taken is denied until an id is free, then tracked; and a
/// subvolume created after all of that is still enforced (quarantine denies, release allows).
///
/// The daemon's table is filled with configured paths (which are never retired) up to a few
/// hundred free ids, so that each batch both reuses ids and overflows.
#[test]
fn hostile_quarantine_subvolume_churn_beyond_the_domain_table() {
    let _alone = common::cluster_alone();
    use std::collections::BTreeSet;
    let lab = Lab::get();
    let m = lab.ceph();
    let perm = UserPerm::root();
    let tag = format!("hqchurn{}", std::process::id());
    let group = format!("/volumes/{tag}");
    // Batches an earlier failed run left would take ids (and slow every watcher) for good.
    if let Ok(vol) = quarantine::resolve(&m, quarantine::VOLUMES, &perm) {
        for g in subdirs(&m, &vol) {
            if g.starts_with(b"hqchurn") {
                rmdirs(&m, &vol, &g);
            }
        }
    }
    mkdirs(&m, &group);
    const SPARE: usize = 600;
    const BATCH: usize = 640;
    // Subvolumes other tests left take ids too (a few more may come while this runs).
    let existing = subvolume_count(&m);
    // The configured paths lie in a directory that exists (missing names in it are answered
    // from the watcher's cache, keeping its rounds short).
    mkdirs(&m, &format!("/{tag}-cfg"));
    let configured = quarantine::MAX_DOMAINS.saturating_sub(existing + SPARE);
    let a = daemon(
        &lab,
        QuarantineConfig {
            paths: (0..configured)
                .map(|i| format!("/{tag}-cfg/p{i}"))
                .collect(),
            ..qcfg()
        },
    );
    let gate = a.gate.clone();
    let gdir = quarantine::resolve(&m, &group, &perm).unwrap();
    let batches = quarantine::MAX_DOMAINS / BATCH + 1;
    let t = Instant::now();
    let mut seen_ids = BTreeSet::new();
    let (mut reused, mut overflowed) = (0, 0);
    for b in 0..batches {
        let names: Vec<String> = (0..BATCH).map(|i| format!("csi-vol-{b}-{i}")).collect();
        for n in &names {
            m.mkdir(&gdir, &c(n), 0o755, CEPH_STATX_BASIC_STATS, 0, &perm)
                .unwrap();
        }
        let paths: Vec<String> = names.iter().map(|n| format!("{group}/{n}")).collect();
        // Each is tracked (has a domain) or, with no id free, denied without one.
        let tracked = |p: &String| gate.domain_of_path(p).is_some();
        wait_up_to(
            Duration::from_secs(600),
            &format!("batch {b} discovered"),
            || paths.iter().all(|p| tracked(p) || denied(walk(&a.fs, p))),
        );
        let (kept, over): (Vec<&String>, Vec<&String>) = paths.iter().partition(|p| tracked(p));
        for p in &kept {
            let d = gate.domain_of_path(p).unwrap();
            assert!(d as usize <= quarantine::MAX_DOMAINS);
            reused += usize::from(!seen_ids.insert(d));
        }
        overflowed += over.len();
        // Removing the tracked ones frees ids: the denied ones get them and are allowed.
        for p in &kept {
            m.rmdir(&gdir, &c(p.rsplit('/').next().unwrap()), &perm)
                .unwrap();
        }
        wait_up_to(
            Duration::from_secs(600),
            &format!("batch {b}: {} denied ones tracked", over.len()),
            || over.iter().all(|p| tracked(p) && walk(&a.fs, p).is_ok()),
        );
        for p in &over {
            m.rmdir(&gdir, &c(p.rsplit('/').next().unwrap()), &perm)
                .unwrap();
        }
        wait_up_to(
            Duration::from_secs(600),
            &format!("batch {b} retired"),
            || paths.iter().all(|p| !tracked(p)),
        );
    }
    println!(
        "{} subvolumes created and removed in {} ms with {} ids free at the start: {overflowed} \
         waited for an id, {reused} ids reused; {} domains live",
        batches * BATCH,
        t.elapsed().as_millis(),
        quarantine::MAX_DOMAINS - configured,
        gate.domain_count(),
    );
    assert!(overflowed > 0, "no batch overflowed the table");
    assert!(reused > 0, "no id was reused");
    // A subvolume created after all of that is still enforced.
    let sv = format!("{group}/last");
    mkdirs(&m, &format!("{sv}/data"));
    wait_for("the last subvolume tracked and allowed", || {
        gate.domain_of_path(&sv).is_some() && walk(&a.fs, &format!("{sv}/data")).is_ok()
    });
    run_cmd(&lab, "enable", &sv);
    wait_for("the last subvolume denied", || walk(&a.fs, &sv).is_err());
    assert_eq!(errno(walk(&a.fs, &format!("{sv}/data"))), libc::EACCES);
    run_cmd(&lab, "disable", &sv);
    wait_for("the last subvolume released", || {
        walk(&a.fs, &format!("{sv}/data")).is_ok()
    });
}
