//! ceph-virtiofsd under a real Linux guest: the guest kernel's virtiofs driver mounts the daemon's
//! socket with `-t virtiofs` under QEMU, against the real test cluster, and runs the in-guest
//! suites (tests/guest/). Data the guest writes is checked through a second CephFS client, and
//! the other way round.

mod common;

use std::ffi::CString;
use std::path::PathBuf;

use ceph_client::{Mount, UserPerm, CEPH_STATX_BASIC_STATS};
use common::{run_guest, run_guest_env, Daemon, Lab};

/// The in-guest suites' data pattern (tests/guest/fs-suite.c, pattern_word): byte i is byte
/// i % 8 (little endian) of splitmix64 output i / 8 for the seed.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let k = (i / 8) as u64;
            let mut z = seed.wrapping_add((k + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z >> ((i % 8) * 8)) as u8
        })
        .collect()
}

fn walk(m: &Mount, path: &str) -> ceph_client::Inode {
    let perm = UserPerm::root();
    let mut cur = m.lookup_root().unwrap();
    for c in path.split('/').filter(|c| !c.is_empty()) {
        let name = CString::new(c).unwrap();
        cur = m
            .lookup(&cur, &name, CEPH_STATX_BASIC_STATS, 0, &perm)
            .unwrap_or_else(|e| panic!("lookup {c} of {path}: {e}"))
            .0;
    }
    cur
}

fn write_file(m: &Mount, dir: &str, name: &str, data: &[u8]) {
    let parent = walk(m, dir);
    let cname = CString::new(name).unwrap();
    let (_, _, f) = m
        .create(
            &parent,
            &cname,
            0o644,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            CEPH_STATX_BASIC_STATS,
            0,
            &UserPerm::root(),
        )
        .unwrap();
    let mut off = 0;
    while off < data.len() {
        off += f.write(off as u64, &data[off..]).unwrap();
    }
    f.fsync(false).unwrap();
}

fn read_file(m: &Mount, path: &str) -> Vec<u8> {
    let ino = walk(m, path);
    let perm = UserPerm::root();
    let st = m.getattr(&ino, CEPH_STATX_BASIC_STATS, 0, &perm).unwrap();
    let f = m.open(&ino, libc::O_RDONLY, &perm).unwrap();
    let mut buf = vec![0u8; st.stx_size as usize];
    let mut off = 0;
    while off < buf.len() {
        let n = f.read(off as u64, &mut buf[off..]).unwrap();
        assert!(n > 0, "short file {path}");
        off += n;
    }
    buf
}

#[test]
fn guest_suite_and_data_seen_by_another_client() {
    let lab = Lab::get();
    let name = format!("guest-suite-{}", std::process::id());
    let export = lab.export_dir(&name);
    let ceph = lab.ceph();
    // Written by another CephFS client before the guest boots; the guest verifies it.
    write_file(&ceph, &export, "from-host.bin", &pattern(7, 2 << 20));

    let work = lab.scratch(&name);
    // The suite checks device nodes too, which the operator must allow.
    let mut daemon = Daemon::start(&lab, &work, &export, &["--allow-device-nodes"]);
    let script = "#!/bin/sh\n\
        rc=0\n\
        /opt/bin/fs-suite /mnt || rc=1\n\
        echo SUITE-DONE\n\
        /opt/bin/fs-suite --check-pattern /mnt/from-host.bin 7 2M || rc=1\n\
        /opt/bin/fs-suite --write-pattern /mnt/from-guest.bin 42 3M || rc=1\n\
        exit $rc\n";
    let adds = [(lab.guest_bin.join("fs-suite"), "/opt/bin/fs-suite")];
    let run = run_guest(&lab, &work, &daemon, script, &adds, 1500);

    let counts = run.counts("");
    let failed = run.not_ok();
    assert!(
        failed.is_empty(),
        "in-guest checks failed: {failed:#?}\ndaemon log:\n{}",
        daemon.log_text()
    );
    let (passed, nfailed) = counts.expect("the suite printed its closing line");
    assert_eq!(nfailed, 0);
    assert!(passed >= 40, "only {passed} checks ran");
    assert_eq!(run.code(), 0, "guest verdict");

    // What the guest wrote is what another CephFS client reads, byte for byte.
    let got = read_file(&ceph, &format!("{export}/from-guest.bin"));
    assert_eq!(got.len(), 3 << 20);
    assert!(
        got == pattern(42, 3 << 20),
        "guest data differs on the Ceph side"
    );

    // The daemon shuts down cleanly once the guest is gone (frontend disconnected).
    let status = daemon.stop().expect("daemon status");
    assert!(
        status.success(),
        "daemon exit: {status}\n{}",
        daemon.log_text()
    );
}

#[test]
fn guest_pjdfstest() {
    let lab = Lab::get();
    let pjd: PathBuf = lab.guest_bin.join("pjdfstest");
    assert!(
        pjd.exists(),
        "{} missing: tests/guest/build builds it",
        pjd.display()
    );
    let name = format!("guest-pjdfstest-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    // pjdfstest makes device nodes of every kind, which the operator must allow.
    let _daemon = Daemon::start(&lab, &work, &export, &["--allow-device-nodes"]);
    let script = std::fs::read_to_string(lab.guest_bin.join("pjdfstest.sh")).unwrap();
    let adds = [
        (pjd, "/opt/bin/pjdfstest"),
        (lab.guest_bin.join("pjdfstest.toml"), "/opt/pjdfstest.toml"),
        // pjdfstest runs `sleep` under another name (ETXTBSY cases); busybox's cannot.
        (
            lab.guest_bin.join("pjd-bin/sleep"),
            "/opt/bin/pjd-bin/sleep",
        ),
    ];
    let run = run_guest(&lab, &work, &_daemon, &script, &adds, 2400);
    let (passed, failed) = run
        .counts("")
        .expect("pjdfstest runner printed its closing line");
    println!("pjdfstest: {passed} passed, {failed} failed");
    assert!(passed > 0);
    assert_eq!(
        run.code(),
        0,
        "pjdfstest runner verdict (see console above)"
    );
}

/// Linux 6.11+ guests spread requests over several request queues (one per vCPU here): a
/// Debian trixie 6.12 guest with two vCPUs and two queues must get answers on both.
#[test]
fn guest_multiqueue_on_linux_6_12() {
    let lab = Lab::get();
    let name = format!("guest-mq-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let mut daemon = Daemon::start(
        &lab,
        &work,
        &export,
        &["--queues", "2", "--log-level", "debug"],
    );
    let script = "#!/bin/sh\n\
        for c in 0 1; do\n\
          taskset -c $c sh -c \"i=0; while [ \\$i -lt 50 ]; do echo \\$i > /mnt/f$c-\\$i || exit 1; i=\\$((i+1)); done\" &\n\
        done\n\
        wait\n\
        echo \"FILES $(ls /mnt | wc -l)\"\n";
    let env = [
        ("GUEST_KERNEL_SUITE", "trixie"),
        ("GUEST_SMP", "2"),
        ("GUEST_FS_QUEUES", "2"),
    ];
    let run = run_guest_env(&lab, &work, &daemon, script, &[], 900, &env);
    assert_eq!(run.code(), 0, "guest verdict");
    assert!(run.console.contains("FILES 100"), "all files written");
    let status = daemon.stop().expect("daemon status");
    assert!(status.success());
    let log = daemon.log_text();
    for q in [1, 2] {
        let kicks = log
            .lines()
            .filter(|l| l.contains("Queue kicked") && l.ends_with(&format!("queue={q}")))
            .count();
        assert!(kicks > 0, "request queue {q} was never used:\n{log}");
    }
}

/// SIGTERM while a guest is connected and holds open files: the daemon answers what is in
/// flight, unmounts CephFS (its MDS session ends cleanly) and exits 0.
#[test]
fn sigterm_unmounts_cleanly_under_a_live_guest() {
    let lab = Lab::get();
    let name = format!("guest-sigterm-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let daemon = Daemon::start(&lab, &work, &export, &[]);
    let pid = daemon.pid();
    // The guest keeps a file open and waits; the host stops the daemon meanwhile.
    // (The holder runs in the background: once the daemon is gone, closing its file would wait
    // for ever, see tests/faults/main.rs.)
    let script = "#!/bin/sh\n\
        ( exec 3>/mnt/held; echo data >&3; touch /mnt/ready; sleep 3600 ) &\n\
        sleep 30\n";
    let lab2 = Lab::get();
    let work2 = work.clone();
    let guest = std::thread::spawn(move || {
        let mut d = daemon;
        let run = run_guest(&lab2, &work2, &d, script, &[], 300);
        let status = d.stop();
        (run, status, d.log_text())
    });
    let m = lab.ceph();
    let perm = UserPerm::root();
    let dir = walk(&m, &export);
    let ready = CString::new("ready").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    while m
        .lookup(&dir, &ready, CEPH_STATX_BASIC_STATS, 0, &perm)
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the guest never got ready"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let (_run, status, log) = guest.join().unwrap();
    let status = status.expect("daemon status");
    assert!(
        status.success(),
        "exit status after SIGTERM: {status}\n{log}"
    );
    assert!(log.contains("CephFS unmounted"), "no clean unmount:\n{log}");
}

/// A guest that reboots sends no DESTROY: its next boot's FUSE_INIT must end the previous boot's
/// session, and a request of the previous boot still waiting must not act for it afterwards.
/// Boot 1 holds a POSIX lock of its own (`mine`) and waits in F_SETLKW for one a host client
/// holds (`held`), then reboots (`reboot -f`: no close, no unmount). Boot 2 must get `mine` at
/// once (the daemon released the dead boot's handles and the locks taken through them), and
/// `held` once the host client lets go (the dead boot's wait is granted to nobody: the daemon
/// gives the lock back instead of keeping it for a process that no longer exists).
#[test]
fn a_rebooted_guest_gets_back_the_locks_of_its_previous_boot() {
    let lab = Lab::get();
    let name = format!("guest-reboot-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let m = lab.ceph();
    let perm = UserPerm::root();
    let dir = walk(&m, &export);
    let mut files = Vec::new();
    for f in ["held", "mine"] {
        let c = CString::new(f).unwrap();
        let (_, _, file) = m
            .create(
                &dir,
                &c,
                0o666,
                libc::O_RDWR | libc::O_CREAT,
                CEPH_STATX_BASIC_STATS,
                0,
                &perm,
            )
            .unwrap();
        files.push(file);
    }
    let whole = |t: i32| libc::flock {
        l_type: t as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    files[0].setlk(&whole(libc::F_WRLCK), 1, false).unwrap();
    let daemon = Daemon::start(&lab, &work, &export, &[]);
    let script = "#!/bin/sh\n\
        S=/opt/bin/fs-suite\n\
        if [ ! -e /mnt/boot1 ]; then\n\
          touch /mnt/boot1\n\
          $S --lock-hold /mnt/mine &\n\
          $S --lock-wait /mnt/held &\n\
          sleep 3\n\
          echo BOOT1: rebooting with a lock held and a lock wait in flight\n\
          reboot -f\n\
          sleep 60\n\
        fi\n\
        echo BOOT2\n\
        rc=0\n\
        $S --lock-try /mnt/mine || { echo \"not ok mine: the previous boot's lock is still held\"; rc=1; }\n\
        touch /mnt/boot2\n\
        i=0\n\
        until $S --lock-try /mnt/held; do\n\
          i=$((i + 1))\n\
          if [ $i -ge 120 ]; then echo \"not ok held: the previous boot's lock wait kept the lock\"; rc=1; break; fi\n\
          sleep 0.5\n\
        done\n\
        exit $rc\n";
    let lab2 = Lab::get();
    let work2 = work.clone();
    let guest = std::thread::spawn(move || {
        let mut d = daemon;
        let adds = [(lab2.guest_bin.join("fs-suite"), "/opt/bin/fs-suite")];
        let run = run_guest_env(
            &lab2,
            &work2,
            &d,
            script,
            &adds,
            900,
            &[("GUEST_REBOOT", "1")],
        );
        d.stop();
        (run, d.log_text())
    });
    let boot2 = CString::new("boot2").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(900);
    while m
        .lookup(&dir, &boot2, CEPH_STATX_BASIC_STATS, 0, &perm)
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline && !guest.is_finished(),
            "the guest never came back from its reboot"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    files[0].setlk(&whole(libc::F_UNLCK), 1, false).unwrap();
    let (run, log) = guest.join().unwrap();
    assert_eq!(
        run.console.matches("GUEST-BOOT").count(),
        2,
        "{}",
        run.console
    );
    assert!(run.not_ok().is_empty(), "{:?}\n{log}", run.not_ok());
    assert_eq!(run.code(), 0, "{log}");
    assert!(
        log.contains("A new FUSE session begins before the last one ended"),
        "{log}"
    );
}
