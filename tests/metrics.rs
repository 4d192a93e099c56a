//! The metrics endpoint under a real guest: the guest does a known workload (N creates, M bytes
//! written with fsync, a deliberate ENOENT, a read after dropping its page cache), then we scrape
//! the daemon's endpoint and check the counts cover what the guest did, that libcephfs health
//! comes from its admin socket, and that no Ceph key appears in the scrape or the log.

mod common;

use std::path::Path;

use common::{metric_value as value, run_guest, scrape_metrics as scrape, Daemon, Lab};

const FILES: u32 = 20;
const BLOCKS: u64 = 256; // of 4 KiB: 1 MiB
const WRITTEN: u64 = BLOCKS * 4096;

fn must(text: &str, series: &str) -> f64 {
    value(text, series).unwrap_or_else(|| panic!("no sample {series} in scrape:\n{text}"))
}

/// Every `key = ...` secret of the keyrings in the lab's cluster directory.
fn lab_keys(conf: &Path) -> Vec<String> {
    let dir = conf.parent().expect("ceph.conf has a directory");
    let mut keys = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let is_keyring = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains("keyring"));
        if !is_keyring || !path.is_file() {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
            if let Some((k, v)) = line.split_once('=') {
                if k.trim() == "key" && v.trim().len() >= 16 {
                    keys.push(v.trim().to_owned());
                }
            }
        }
    }
    keys
}

#[test]
fn guest_workload_is_counted() {
    let lab = Lab::get();
    let name = format!("metrics-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let metrics_socket = work.join("metrics.sock");
    let metrics_arg = metrics_socket.to_str().unwrap().to_owned();
    // The per-request spans are at debug level; RUST_LOG (inherited by the daemon) overrides
    // the harness's --log-level info. This binary runs one test: no other thread reads the env.
    std::env::set_var("RUST_LOG", "info,ceph_virtiofsd=debug");
    // --keep-serving: the daemon outlives the guest, so we can scrape after it is gone.
    let mut daemon = Daemon::start(
        &lab,
        &work,
        &export,
        &[
            "--metrics-socket",
            &metrics_arg,
            "--keep-serving",
            // A missing name is then a LOOKUP answered ENOENT, not a cached negative entry.
            "--cache",
            "never",
        ],
    );
    let before = scrape(&metrics_socket);
    assert_eq!(
        value(&before, "ceph_virtiofsd_fuse_requests_total{op=\"CREATE\"}"),
        None,
        "no CREATE before the guest ran"
    );

    let script = format!(
        "#!/bin/sh\n\
         set -e\n\
         i=0\n\
         while [ $i -lt {FILES} ]; do echo -n x > /mnt/f$i; i=$((i+1)); done\n\
         dd if=/dev/zero of=/mnt/big bs=4096 count={BLOCKS} conv=fsync 2>/dev/null\n\
         if stat /mnt/does-not-exist >/dev/null 2>&1; then echo 'not ok - stat of a missing file worked'; exit 1; fi\n\
         mkdir /mnt/d && touch /mnt/d/x\n\
         if rmdir /mnt/d 2>/dev/null; then echo 'not ok - rmdir of a full directory worked'; exit 1; fi\n\
         sync\n\
         echo 3 > /proc/sys/vm/drop_caches\n\
         cat /mnt/big > /dev/null\n\
         echo WORKLOAD-DONE\n\
         exit 0\n"
    );
    let run = run_guest(&lab, &work, &daemon, &script, &[], 600);
    assert!(
        run.console.contains("WORKLOAD-DONE") && run.code() == 0,
        "guest workload failed (exit {})\ndaemon log:\n{}",
        run.code(),
        daemon.log_text()
    );

    let text = scrape(&metrics_socket);
    println!("---- scrape ----\n{text}---- end ----");

    let creates = must(&text, "ceph_virtiofsd_fuse_requests_total{op=\"CREATE\"}");
    assert!(creates >= f64::from(FILES) + 1.0, "CREATE count {creates}");
    let writes = must(&text, "ceph_virtiofsd_fuse_requests_total{op=\"WRITE\"}");
    assert!(writes >= 1.0, "WRITE count {writes}");
    let written = must(&text, "ceph_virtiofsd_write_bytes_total");
    assert!(
        written >= (WRITTEN + u64::from(FILES)) as f64,
        "bytes written {written}, guest wrote {}",
        WRITTEN + u64::from(FILES)
    );
    let read = must(&text, "ceph_virtiofsd_read_bytes_total");
    assert!(
        read >= WRITTEN as f64,
        "bytes read {read} after drop_caches"
    );
    let enoent = must(
        &text,
        "ceph_virtiofsd_fuse_errors_total{op=\"LOOKUP\",errno=\"ENOENT\"}",
    );
    assert!(enoent >= 1.0);
    let notempty = must(
        &text,
        "ceph_virtiofsd_fuse_errors_total{op=\"RMDIR\",errno=\"ENOTEMPTY\"}",
    );
    assert_eq!(notempty, 1.0);
    assert_eq!(
        must(&text, "ceph_virtiofsd_fuse_negative_lookups_total"),
        0.0
    );
    // Every request went through the histogram.
    let hist = must(
        &text,
        "ceph_virtiofsd_fuse_request_duration_seconds_count{op=\"CREATE\"}",
    );
    assert_eq!(hist, creates);
    let inf = must(
        &text,
        "ceph_virtiofsd_fuse_request_duration_seconds_bucket{op=\"CREATE\",le=\"+Inf\"}",
    );
    assert_eq!(inf, creates);
    // The guest is gone: nothing in flight; the tables still hold what the guest looked up
    // (the root at least).
    assert_eq!(
        must(&text, "ceph_virtiofsd_queue_in_flight{queue=\"1\"}"),
        0.0
    );
    assert!(must(&text, "ceph_virtiofsd_inodes") >= 1.0);
    assert!(value(&text, "ceph_virtiofsd_handles").is_some());
    assert_eq!(must(&text, "ceph_virtiofsd_quarantine_denials_total"), 0.0);
    // The slow-request watchdog is on by default (30 s): nothing here came near it.
    assert_eq!(must(&text, "ceph_virtiofsd_fuse_requests_stuck"), 0.0);
    assert!(
        !text.contains("ceph_virtiofsd_fuse_slow_requests_total{"),
        "no request of this workload is slow"
    );
    // libcephfs health from its admin socket: one open MDS session.
    assert_eq!(must(&text, "ceph_virtiofsd_ceph_admin_socket_up"), 1.0);
    assert!(must(&text, "ceph_virtiofsd_ceph_mds_sessions{state=\"open\"}") >= 1.0);
    assert!(value(&text, "ceph_virtiofsd_ceph_mds_requests_in_flight").is_some());

    // Per-request debug spans carry the op, ids, errno and duration.
    let log = daemon.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("op=\"LOOKUP\"") && l.contains("errno=2") && l.contains("us=")),
        "no debug span for the failed LOOKUP in the log"
    );

    // Keys never appear in the metrics or the log.
    let keys = lab_keys(&lab.conf);
    assert!(!keys.is_empty(), "the lab has keyrings with keys");
    for key in &keys {
        assert!(!text.contains(key.as_str()), "a Ceph key is in the scrape");
        assert!(
            !log.contains(key.as_str()),
            "a Ceph key is in the daemon log"
        );
    }

    let status = daemon.stop().expect("daemon status");
    assert!(
        status.success(),
        "daemon exit: {status}\n{}",
        daemon.log_text()
    );
    assert!(!metrics_socket.exists(), "metrics socket left behind");
}
