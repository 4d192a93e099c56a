//! The slow-request watchdog under a real guest: a guest request that really hangs is
//! reported, counted, and cleared once it finishes.
//!
//! A second CephFS client (this test) holds a whole-file write lock; the guest asks for the
//! same lock with F_SETLKW, so its SETLKW request waits inside libcephfs (the MDS answers only
//! when the lock is free). With `--slow-request-secs 1` the daemon must log it once at warn,
//! with the op, ids, age and what libcephfs waits for (its admin socket: one MDS request), then
//! once at error after ten times the bound, and show it in `fuse_requests_stuck` and
//! `fuse_slow_requests_total{op="SETLKW"}`. When the lock is released the request completes,
//! the guest goes on, and the gauge returns to 0 while the counter stays.

mod common;

use std::time::{Duration, Instant};

use common::{
    ceph_dir as dir, ceph_exists as exists, hold_write_lock, metric_value as value, run_guest,
    scrape_metrics as scrape, whole_file, Daemon, Lab,
};

const STUCK: &str = "ceph_virtiofsd_fuse_requests_stuck";
const SLOW_SETLKW: &str = "ceph_virtiofsd_fuse_slow_requests_total{op=\"SETLKW\"}";

/// Poll until `done` holds, at most `limit`; panics with `what` and the daemon log.
fn wait_for(daemon: &Daemon, limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} within {limit:?}\ndaemon log:\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Log lines of the daemon that report a stuck SETLKW at `level` ("WARN" or "ERROR").
fn stuck_lines(log: &str, level: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains(level) && l.contains("op=\"SETLKW\"") && l.contains("in flight"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_request_stuck_in_a_lock_wait_is_reported_counted_and_cleared() {
    let lab = Lab::get();
    let name = format!("watchdog-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let metrics_socket = work.join("metrics.sock");

    // Another client holds a write lock on the whole file.
    let held = hold_write_lock(&lab, &export, "lk");
    let m = lab.ceph();
    let d = dir(&m, &export);

    let daemon = Daemon::start(
        &lab,
        &work,
        &export,
        &[
            "--slow-request-secs",
            "1",
            "--metrics-socket",
            metrics_socket.to_str().unwrap(),
        ],
    );
    let before = scrape(&metrics_socket);
    assert_eq!(value(&before, STUCK), Some(0.0), "{before}");
    assert_eq!(value(&before, SLOW_SETLKW), None, "{before}");

    // The guest waits for the lock, then says so in CephFS and stays up a little, so the
    // daemon keeps serving while we look.
    let script = "#!/bin/sh\n\
        /opt/bin/fs-suite --lock-wait /mnt/lk\n\
        echo \"LOCK-WAIT-DONE $?\"\n\
        touch /mnt/lock-done\n\
        sync\n\
        sleep 5\n\
        exit 0\n";
    let guest = {
        let lab = Lab::get();
        let work = work.clone();
        let socket = daemon.socket.clone();
        std::thread::spawn(move || {
            let adds = [(lab.guest_bin.join("fs-suite"), "/opt/bin/fs-suite")];
            // run_guest only needs the daemon's socket.
            let stand_in = Daemon {
                child: None,
                socket,
                log: work.join("daemon.log"),
            };
            run_guest(&lab, &work, &stand_in, script, &adds, 900)
        })
    };

    // The guest boots (under TCG this takes a while), sends SETLKW, and it waits.
    wait_for(
        &daemon,
        Duration::from_secs(600),
        "no warning about a stuck SETLKW",
        || !stuck_lines(&daemon.log_text(), "WARN").is_empty() || guest.is_finished(),
    );
    let log = daemon.log_text();
    let warned = stuck_lines(&log, "WARN");
    println!("---- stuck-request warning ----\n{}", warned.join("\n"));
    assert_eq!(warned.len(), 1, "one warning per request\n{log}");
    let line = &warned[0];
    for field in [
        "unique=",
        "node=",
        "fh=",
        "offset=0",
        "queue=1",
        "age_s=",
        "mds_requests=",
        "osd_ops=",
    ] {
        assert!(line.contains(field), "no {field} in {line}");
    }
    // A blocking lock waits in the MDS; the admin socket says so.
    assert!(line.contains("waits_on=\"mds\""), "{line}");
    assert!(line.contains("--slow-request-secs 1"), "{line}");

    let text = scrape(&metrics_socket);
    assert_eq!(value(&text, STUCK), Some(1.0), "{text}");
    assert_eq!(value(&text, SLOW_SETLKW), Some(1.0), "{text}");

    // At ten times the bound: once more, at error.
    wait_for(
        &daemon,
        Duration::from_secs(30),
        "no error about the SETLKW stuck for 10 s",
        || !stuck_lines(&daemon.log_text(), "ERROR").is_empty(),
    );
    std::thread::sleep(Duration::from_secs(3));
    let log = daemon.log_text();
    assert_eq!(stuck_lines(&log, "WARN").len(), 1, "{log}");
    assert_eq!(stuck_lines(&log, "ERROR").len(), 1, "{log}");
    let text = scrape(&metrics_socket);
    assert_eq!(value(&text, STUCK), Some(1.0), "{text}");
    assert_eq!(value(&text, SLOW_SETLKW), Some(1.0), "counted once\n{text}");

    // Release: the guest gets its lock, the request completes, the gauge returns to 0.
    held.setlk(&whole_file(libc::F_UNLCK), 1, false).unwrap();
    wait_for(
        &daemon,
        Duration::from_secs(300),
        "the guest never got the lock",
        || exists(&m, &d, "lock-done"),
    );
    wait_for(
        &daemon,
        Duration::from_secs(10),
        "fuse_requests_stuck did not return to 0",
        || value(&scrape(&metrics_socket), STUCK) == Some(0.0),
    );
    let text = scrape(&metrics_socket);
    assert_eq!(value(&text, SLOW_SETLKW), Some(1.0), "{text}");
    let log = daemon.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("Stuck FUSE request finished") && l.contains("op=\"SETLKW\"")),
        "no line saying the stuck request finished\n{log}"
    );

    let run = guest.join().expect("guest thread");
    assert!(
        run.console.contains("LOCK-WAIT-DONE 0") && run.code() == 0,
        "guest failed (exit {})\ndaemon log:\n{}",
        run.code(),
        daemon.log_text()
    );
    drop(held);
    let mut daemon = daemon;
    let status = daemon.stop().expect("daemon status");
    assert!(
        status.success(),
        "daemon exit: {status}\n{}",
        daemon.log_text()
    );
}
