//! Faults under a real guest: the MDS restarted mid-workload, the OSD restarted mid-workload (on
//! BlueStore), and the daemon killed mid-workload (here), MDS failover churn ([`churn`]), a full
//! cluster ([`full`]), a slow OSD and a stalled MDS ([`slow`]). Data the guest had acknowledged
//! (fsync returned) must survive intact; the guest must see an error it can act on rather than
//! hang forever.
//!
//! One test binary. The tests that do to the lab cluster what no other test may see (restart
//! its MDS, fill it) hold it alone (`common::cluster_alone`), every other test holds it shared
//! (`common::cluster_shared`), so they never run beside each other; those of a cluster of their
//! own run side by side. One module alone: `cargo test --test faults churn::`.

#[path = "../common/mod.rs"]
mod common;

mod churn;
mod full;
mod slow;

use std::ffi::CString;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use ceph_client::{Inode, Mount, UserPerm, CEPH_STATX_BASIC_STATS};
use common::{
    ceph_dir as dir, ceph_exists as exists, ceph_read_all as read_all, hold_write_lock, run_guest,
    whole_file, Daemon, Lab,
};

fn cluster_dir() -> PathBuf {
    std::env::var("CEPH_DEV_CLUSTER_DIR")
        .expect("CEPH_DEV_CLUSTER_DIR is not set: run the tests through tests/run")
        .into()
}

fn wait_exists(m: &Mount, parent: &Inode, name: &str, guest: &std::thread::JoinHandle<impl Send>) {
    let deadline = Instant::now() + Duration::from_secs(900);
    while !exists(m, parent, name) {
        assert!(
            Instant::now() < deadline && !guest.is_finished(),
            "the guest never created {name}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn mds_restart_mid_workload_loses_nothing() {
    let _alone = common::cluster_alone();
    let lab = Lab::get();
    let name = format!("fault-mds-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let daemon = Daemon::start(&lab, &work, &export, &[]);
    let script = "#!/bin/sh\n\
        i=0\n\
        while [ $i -lt 150 ]; do\n\
          echo \"line $i\" > f$i || { echo \"not ok create f$i\"; exit 1; }\n\
          [ $i = 20 ] && touch phase1\n\
          i=$((i+1))\n\
        done\n\
        sync\n\
        echo WORKLOAD-DONE\n";
    let lab2 = Lab::get();
    let work2 = work.clone();
    let guest = std::thread::spawn(move || {
        let run = run_guest(&lab2, &work2, &daemon, script, &[], 900);
        (run, daemon)
    });
    let m = lab.ceph();
    let d = dir(&m, &export);
    wait_exists(&m, &d, "phase1", &guest);
    let st = Command::new(lab.top.join("tests/lab/ceph-dev-cluster"))
        .arg("restart-mds")
        .arg(cluster_dir())
        .status()
        .unwrap();
    assert!(st.success(), "restart-mds failed");
    let (run, daemon) = guest.join().unwrap();
    assert_eq!(run.code(), 0, "guest verdict\n{}", daemon.log_text());
    assert!(run.console.contains("WORKLOAD-DONE"));
    // Every file the guest wrote is there, with its content, for another client.
    let m = lab.ceph();
    let d = dir(&m, &export);
    for i in 0..150 {
        assert_eq!(
            read_all(&m, &d, &format!("f{i}")),
            format!("line {i}\n").as_bytes(),
            "f{i}"
        );
    }
}

#[test]
fn daemon_killed_mid_workload_keeps_acknowledged_data() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let name = format!("fault-kill-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    // 64 KiB chunks of a pattern the host can check: chunk i is byte (i % 251) repeated.
    let chunks = work.join("chunks");
    std::fs::create_dir_all(&chunks).unwrap();
    for i in 0..400u32 {
        std::fs::write(chunks.join(i.to_string()), vec![(i % 251) as u8; 65536]).unwrap();
    }
    let daemon = Daemon::start(&lab, &work, &export, &[]);
    let pid = daemon.pid();
    let client_id = {
        // The daemon logs its Ceph client id once mounted.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = daemon.log_text();
            if let Some(id) = log
                .lines()
                .find_map(|l| l.split("client_id=").nth(1))
                .and_then(|r| r.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
            {
                break id;
            }
            assert!(Instant::now() < deadline, "no client id in the log:\n{log}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Each chunk is written and fsynced; ACK lines name the chunks whose fsync returned. Once the
    // daemon is gone, a request already handed to the virtqueue waits uninterruptibly in the
    // guest kernel (Linux 6.1 FUSE has no request timeout, QEMU 7.2 no vhost-user-fs reconnect):
    // the writer runs in the background so the guest can report that and carry on.
    let script = "#!/bin/sh\n\
        ( i=0\n\
          while [ $i -lt 400 ]; do\n\
            dd if=/opt/chunks/$i of=/mnt/data bs=65536 seek=$i count=1 conv=notrunc,fsync 2>/dev/null || { echo \"ERROR at $i\"; break; }\n\
            echo \"ACK $i\"\n\
            [ $i = 8 ] && touch /mnt/phase1\n\
            i=$((i+1))\n\
          done\n\
          echo WRITER-DONE ) &\n\
        writer=$!\n\
        n=0\n\
        while kill -0 $writer 2>/dev/null && [ $n -lt 40 ]; do sleep 0.5; n=$((n+1)); done\n\
        kill -0 $writer 2>/dev/null && echo WRITER-STUCK\n\
        echo GUEST-ALIVE\n\
        exit 0\n";
    let lab2 = Lab::get();
    let work2 = work.clone();
    let adds = vec![(chunks.clone(), "/opt/chunks")];
    let guest = std::thread::spawn(move || {
        let run = run_guest(&lab2, &work2, &daemon, script, &adds, 900);
        (run, daemon)
    });
    let m = lab.ceph();
    let d = dir(&m, &export);
    wait_exists(&m, &d, "phase1", &guest);
    Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    let (run, _daemon) = guest.join().unwrap();
    assert!(
        run.console.contains("GUEST-ALIVE"),
        "the guest as a whole hung after the daemon died"
    );
    assert!(
        run.console.contains("WRITER-STUCK") || run.console.contains("ERROR at"),
        "the writer neither failed nor waited after the daemon died"
    );
    let acked: Vec<u32> = run
        .console
        .lines()
        .filter_map(|l| l.strip_prefix("ACK "))
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    assert!(acked.len() >= 9, "acknowledged chunks: {acked:?}");

    // The dead client still holds its MDS session and caps: evict it as an operator would, then
    // read what was acknowledged through another client.
    let st = Command::new("ceph")
        .arg("-c")
        .arg(&lab.conf)
        .args([
            "tell",
            "mds.*",
            "client",
            "evict",
            &format!("id={client_id}"),
        ])
        .status()
        .unwrap();
    assert!(st.success(), "client evict");
    let m = lab.ceph();
    let d = dir(&m, &export);
    let data = read_all(&m, &d, "data");
    for &i in &acked {
        let start = i as usize * 65536;
        let chunk = data
            .get(start..start + 65536)
            .unwrap_or_else(|| panic!("acknowledged chunk {i} is missing"));
        assert!(
            chunk.iter().all(|&b| b == (i % 251) as u8),
            "acknowledged chunk {i} is corrupt"
        );
    }
}

/// A guest request that cannot finish (a lock wait on a lock another client holds) must not
/// keep the daemon from stopping: after a bounded drain it exits with the runtime error code,
/// without unmounting under the blocked call.
#[test]
fn stop_with_a_request_blocked_in_a_lock_wait_does_not_hang() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let name = format!("fault-lockwait-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    // Another client holds a write lock on the whole file.
    let held = hold_write_lock(&lab, &export, "lk");
    let m = lab.ceph();
    let d = dir(&m, &export);

    let daemon = Daemon::start(&lab, &work, &export, &[]);
    let pid = daemon.pid();
    let script = "#!/bin/sh\n\
        /opt/bin/fs-suite --lock-wait /mnt/lk &\n\
        sleep 1\n\
        touch /mnt/waiting\n\
        sleep 30\n";
    let lab2 = Lab::get();
    let work2 = work.clone();
    let guest = std::thread::spawn(move || {
        let mut d = daemon;
        let adds = [(lab2.guest_bin.join("fs-suite"), "/opt/bin/fs-suite")];
        let run = run_guest(&lab2, &work2, &d, script, &adds, 300);
        let status = d.stop();
        (run, status, d.log_text())
    });
    wait_exists(&m, &d, "waiting", &guest);
    std::thread::sleep(Duration::from_secs(1));
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let (_run, status, log) = guest.join().unwrap();
    let status = status.expect("daemon status");
    // Exit code 1 (runtime failure): it stopped by itself, after the bounded drain, and did
    // not unmount under the blocked call.
    assert_eq!(status.code(), Some(1), "daemon exit: {status}\n{log}");
    assert!(log.contains("still blocked"), "{log}");
    assert!(!log.contains("CephFS unmounted"), "{log}");
    held.setlk(&whole_file(libc::F_UNLCK), 1, false).unwrap();
}

/// A directory quota (`ceph.quota.max_bytes`) that a guest's writes run into: the guest sees
/// EDQUOT itself (not EIO, not a hang), what it wrote and synced before is intact for another
/// client, and once it deletes files the same daemon takes writes again. libcephfs enforces
/// quotas in the writing client from the quota root's recursive byte count, which the MDS
/// updates with a delay: like the kernel client, it stops a writer some way past the limit,
/// so the guest writes 1 MiB files until refused, and at most 64 of them.
#[test]
fn quota_exceeded_reaches_the_guest_as_edquot_and_serving_resumes() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let name = format!("fault-quota-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    {
        let m = lab.ceph();
        let d = dir(&m, &export);
        let perm = UserPerm::root();
        let q = CString::new("q").unwrap();
        let (qd, _) = m
            .mkdir(&d, &q, 0o777, CEPH_STATX_BASIC_STATS, 0, &perm)
            .unwrap();
        let attr = CString::new("ceph.quota.max_bytes").unwrap();
        m.setxattr(&qd, &attr, b"4194304", 0, &perm).unwrap();
    }
    let daemon = Daemon::start(&lab, &work, &export, &[]);
    // Each file holds its own number, repeated, so a mix-up between files shows.
    let script = "#!/bin/sh\n\
        i=0; err=none\n\
        while [ $i -lt 64 ]; do\n\
          yes \"file $i\" | head -c 1048576 > /tmp/blob\n\
          if ! dd if=/tmp/blob of=/mnt/q/f$i bs=65536 conv=fsync 2>/tmp/dd.err; then\n\
            err=$(tr '\\n' ' ' < /tmp/dd.err); rm -f /mnt/q/f$i; break\n\
          fi\n\
          i=$((i+1))\n\
        done\n\
        echo \"QUOTA-STOP written=$i error=$err\"\n\
        touch /mnt/stopped\n\
        # The host checks the files, then the guest frees the space and writes again: the\n\
        # daemon must still serve the directory.\n\
        n=0; until [ -e /mnt/checked ]; do n=$((n+1)); [ $n -gt 600 ] && exit 1; sleep 1; done\n\
        rm -f /mnt/q/f*\n\
        n=0\n\
        until yes again | head -c 1048576 | dd of=/mnt/q/after bs=65536 conv=fsync 2>/dev/null; do\n\
          n=$((n+1)); [ $n -gt 120 ] && { echo 'not ok: no write after freeing'; exit 1; }\n\
          rm -f /mnt/q/after; sleep 1\n\
        done\n\
        echo \"AFTER-FREE ok after $n retries\"\n\
        ls -l /mnt/q\n";
    let lab2 = Lab::get();
    let work2 = work.clone();
    let guest = std::thread::spawn(move || {
        let run = run_guest(&lab2, &work2, &daemon, script, &[], 1200);
        (run, daemon)
    });
    // What the guest wrote and synced before the refusal is intact for another client.
    let m = lab.ceph();
    let d = dir(&m, &export);
    wait_exists(&m, &d, "stopped", &guest);
    let q = dir(&m, &format!("{export}/q"));
    let mut kept = 0;
    for i in 0..64 {
        let f = format!("f{i}");
        if !exists(&m, &q, &f) {
            break;
        }
        let want: Vec<u8> = format!("file {i}\n")
            .bytes()
            .cycle()
            .take(1 << 20)
            .collect();
        assert!(read_all(&m, &q, &f) == want, "{f}: content differs");
        kept += 1;
    }
    let perm = UserPerm::root();
    let checked = CString::new("checked").unwrap();
    m.create(
        &d,
        &checked,
        0o644,
        libc::O_CREAT | libc::O_WRONLY,
        CEPH_STATX_BASIC_STATS,
        0,
        &perm,
    )
    .unwrap();
    let (run, daemon) = guest.join().unwrap();
    assert_eq!(run.code(), 0, "guest verdict\n{}", daemon.log_text());
    let (line, written) = common::stop_line(&run.console, "QUOTA-STOP");
    assert!(
        line.contains("Disk quota exceeded"),
        "the guest did not see EDQUOT: {line}\n{}",
        run.console
    );
    assert!((1..64).contains(&written), "{line}");
    assert_eq!(kept, written, "files the host found intact vs {line}");
    assert!(run.console.contains("AFTER-FREE ok"), "{}", run.console);
    // The file written after freeing space is whole, seen by another client.
    let after = read_all(&m, &q, "after");
    assert_eq!(after.len(), 1 << 20);
    assert!(after.chunks(6).all(|c| b"again\n".starts_with(c)));
}

/// The OSD killed (SIGKILL) and restarted mid-workload, on BlueStore (a persistent store on a
/// sparse file; the lab's memstore forgets its data on a restart): every file the guest wrote and
/// synced before, during and after the restart is there with its bytes, read by another client.
/// A cluster of the test's own, so the shared one's OSD is not restarted under other tests.
#[test]
fn osd_restart_mid_workload_on_bluestore_loses_nothing() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let name = format!("fault-osd-{}", std::process::id());
    let cluster = common::hostile::PrivateCluster::start_with(&lab, &name, &["--bluestore"]);
    let plab = cluster.lab.clone();
    let export = plab.export_dir(&name);
    let work = lab.scratch(&format!("{name}-daemon"));
    let daemon = Daemon::start(&plab, &work, &export, &[]);
    // 64 KiB files of a known line, each synced before the next one starts.
    let script = "#!/bin/sh\n\
        i=0\n\
        while [ $i -lt 100 ]; do\n\
          yes \"line $i\" | head -c 65536 > f$i || { echo \"not ok write f$i\"; exit 1; }\n\
          sync || { echo \"not ok sync f$i\"; exit 1; }\n\
          [ $i = 15 ] && touch phase1\n\
          i=$((i+1))\n\
        done\n\
        echo WORKLOAD-DONE\n";
    let plab2 = plab.clone();
    let work2 = work.clone();
    let guest = std::thread::spawn(move || {
        let run = run_guest(&plab2, &work2, &daemon, script, &[], 900);
        (run, daemon)
    });
    let m = plab.ceph();
    let d = dir(&m, &export);
    wait_exists(&m, &d, "phase1", &guest);
    let out = Command::new(lab.top.join("tests/lab/ceph-dev-cluster"))
        .arg("restart-osd")
        .arg(&cluster.dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "restart-osd failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (run, daemon) = guest.join().unwrap();
    assert_eq!(run.code(), 0, "guest verdict\n{}", daemon.log_text());
    assert!(run.console.contains("WORKLOAD-DONE"));
    let m = plab.ceph();
    let d = dir(&m, &export);
    for i in 0..100 {
        let line = format!("line {i}\n");
        let want: Vec<u8> = line.bytes().cycle().take(65536).collect();
        assert!(
            read_all(&m, &d, &format!("f{i}")) == want,
            "f{i} differs after the OSD restart"
        );
    }
}

/// The MDS under cache pressure (`ceph tell mds.* cache drop`) recalls the inodes a client
/// holds; libcephfs passes the recall on for those the daemon holds. The daemon gives the
/// recalled references up (`ceph_virtiofsd_inode_releases_total`, `inodes_held`) while the
/// guest keeps every node id, and each node still answers, its inode found again by number.
/// Before, the recall could only be counted: 300 held directories stayed held.
#[test]
fn mds_cache_pressure_recalls_release_the_inodes_the_guest_holds() {
    let _cluster = common::cluster_shared();
    use common::hostile::{hostile_daemon, metric, scrape_metrics, Hostile};
    let lab = Lab::get();
    let name = format!("fault-recall-{}", std::process::id());
    let cluster = common::hostile::PrivateCluster::start(&lab, &name);
    let plab = cluster.lab.clone();
    // Not `name`: the daemon's scratch directory would be made afresh over the cluster's.
    // The default --held-inodes (4096): the 300 directories are all held until recalled.
    let (daemon, export, metrics) = hostile_daemon(&plab, &format!("{name}-daemon"), &[]);
    const DIRS: usize = 300;
    {
        let m = plab.ceph();
        let d = common::ceph_dir(&m, &format!("{export}/d"));
        for i in 0..DIRS {
            let n = CString::new(format!("x{i}")).unwrap();
            m.mkdir(&d, &n, 0o755, CEPH_STATX_BASIC_STATS, 0, &UserPerm::root())
                .unwrap();
        }
    }
    let mut h = Hostile::connect(&plab, &daemon, &export, &[]);
    let d = h.lookup(1, b"d").entry().expect("lookup d").0;
    let nodes: Vec<u64> = (0..DIRS)
        .map(|i| {
            h.lookup(d, format!("x{i}").as_bytes())
                .entry()
                .unwrap_or_else(|| panic!("lookup x{i}"))
                .0
        })
        .collect();
    let sample = |series: &str| metric(&scrape_metrics(&metrics), series).unwrap_or(-1.0);
    let held_before = sample("ceph_virtiofsd_inodes_held");
    assert!(
        held_before >= DIRS as f64,
        "{held_before} references held for {DIRS} directories"
    );
    let st = Command::new("ceph")
        .arg("-c")
        .arg(&plab.conf)
        .args(["tell", "mds.*", "cache", "drop", "10"])
        .output()
        .expect("run ceph tell mds.* cache drop");
    println!(
        "cache drop: {}{}",
        String::from_utf8_lossy(&st.stdout),
        String::from_utf8_lossy(&st.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut held, mut released) = (held_before, 0.0);
    while Instant::now() < deadline {
        held = sample("ceph_virtiofsd_inodes_held");
        released = sample("ceph_virtiofsd_inode_releases_total");
        if released >= (DIRS / 2) as f64 && held < held_before / 2.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let recalls = sample("ceph_virtiofsd_mds_inode_recalls_total");
    assert!(
        released >= (DIRS / 2) as f64 && held < held_before / 2.0,
        "after the MDS's recall: {recalls} recalls, {released} references released, {held} \
         held (of {held_before})\n{}",
        daemon.log_text()
    );
    assert_eq!(
        sample("ceph_virtiofsd_inodes"),
        (DIRS + 2) as f64,
        "the guest keeps every node"
    );
    for (i, &n) in nodes.iter().enumerate() {
        let a = h.getattr(n);
        assert_eq!(a.error(), Some(0), "GETATTR of x{i} (node {n:#x})");
        // fuse_attr_out: attr_valid (8), attr_valid_nsec, dummy (4 + 4), then fuse_attr's ino.
        let ino = u64::from_le_bytes(a.payload()[16..24].try_into().unwrap());
        assert_eq!(ino, n, "x{i} is still its own inode");
    }
    assert!(sample("ceph_virtiofsd_inode_refinds_total") >= (DIRS / 2) as f64);
    println!("recall: {recalls} recalls, {released} released, {held} held of {held_before}");
}

/// Every test above and in the modules takes the cluster gate: the binary has tests that need
/// the lab cluster alone.
#[test]
fn every_test_takes_the_cluster_gate() {
    common::every_test_takes_the_cluster_gate("faults", &["every_test_takes_the_cluster_gate"]);
}
