//! MDS failover churn under a real guest: a private cluster with a standby MDS (plain, and
//! standby-replay) fails its active MDS over and over while the guest appends fixed-size records, each fsync'd (a size change:
//! the daemon's libcephfs must flush its caps to the MDS, so every record needs the MDS). The
//! guest must never hang (after each failover the next record is acknowledged within
//! [`ANSWER_BOUND`] of the failover command returning, which is after the new MDS is active),
//! and every acknowledged record must be on the cluster afterwards, for another client.
//!
//! `FAULT_CHURN_FAILOVERS` sets the number of failovers (default 5, as CI runs it; the long run
//! is 100). The test prints, per failover, the writer's longest wait (the largest gap between
//! acknowledgements around the failover) and how soon after the new MDS was active a record was
//! acknowledged, with medians and p99: figures for the record, not pass/fail.
//!
//! Each test starts a cluster of its own (with a standby MDS), so no other test sees the
//! failovers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::hostile::PrivateCluster;
use crate::common::{ceph_dir, ceph_read_all, run_guest, Daemon, Lab};

/// How long after a failover has finished the guest's writer may take to be answered: far
/// beyond a failover on this machine (seconds), far below "forever".
const ANSWER_BOUND: Duration = Duration::from_secs(120);

/// One record: "rec NNNNNNNN " and filler up to 63 bytes, then a newline.
const REC: usize = 64;

fn record(i: usize) -> Vec<u8> {
    let mut r = format!("rec {i:08} ").into_bytes();
    r.resize(REC - 1, b'x');
    r.push(b'\n');
    r
}

/// Acknowledged record numbers on the guest's console so far.
fn acks(console: &std::path::Path) -> Vec<usize> {
    std::fs::read_to_string(console)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("ACK "))
        .filter_map(|n| n.trim().parse().ok())
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[test]
fn mds_failover_churn_loses_no_acknowledged_write_and_never_hangs_the_guest() {
    let _cluster = common::cluster_shared();
    churn("standby", "--standby-mds");
}

/// The same with the standby following the active MDS's journal (standby-replay), which takes
/// over without reading the journal first.
#[test]
fn mds_failover_churn_with_standby_replay_loses_no_acknowledged_write() {
    let _cluster = common::cluster_shared();
    churn("standby-replay", "--standby-replay");
}

fn churn(kind: &str, cluster_opt: &str) {
    let failovers: usize = std::env::var("FAULT_CHURN_FAILOVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let shared = Lab::get();
    let private = PrivateCluster::start_with(
        &shared,
        &format!("fault-churn-{kind}-cluster"),
        &[cluster_opt],
    );
    let lab = &private.lab;
    let name = format!("fault-churn-{kind}-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let daemon = Daemon::start(lab, &work, &export, &[]);
    // The writer appends record i at offset 64*i and fsyncs it, until the host creates `stop`.
    let script = "#!/bin/sh\n\
        i=0\n\
        while [ ! -e /mnt/stop ] && [ $i -lt 1000000 ]; do\n\
          printf 'rec %08d ' $i > /tmp/rec\n\
          head -c 50 /dev/zero | tr '\\0' x >> /tmp/rec\n\
          echo >> /tmp/rec\n\
          dd if=/tmp/rec of=/mnt/data bs=64 seek=$i count=1 conv=notrunc,fsync 2>/tmp/dd.err || { echo \"not ok: record $i: $(cat /tmp/dd.err)\"; exit 1; }\n\
          echo \"ACK $i\"\n\
          i=$((i+1))\n\
        done\n\
        echo \"WRITER-DONE $i\"\n";
    let console = work.join("console.log");
    let lab2 = private.lab.clone();
    let work2 = work.clone();
    let guest = std::thread::spawn(move || {
        let run = run_guest(&lab2, &work2, &daemon, script, &[], 7200);
        (run, daemon)
    });
    // When each acknowledgement reached the host: the console file is followed every 10 ms.
    let arrivals: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let following = Arc::new(AtomicBool::new(true));
    let follower = {
        let (arrivals, following, console) = (arrivals.clone(), following.clone(), console.clone());
        std::thread::spawn(move || {
            while following.load(Ordering::Relaxed) {
                let n = acks(&console).len();
                let mut a = arrivals.lock().unwrap();
                while a.len() < n {
                    a.push(Instant::now());
                }
                drop(a);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let first_after = |t: Instant, deadline: Instant| -> Option<Instant> {
        loop {
            if let Some(&at) = arrivals.lock().unwrap().iter().find(|&&at| at > t) {
                return Some(at);
            }
            if Instant::now() > deadline || guest.is_finished() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let start = Instant::now();
    assert!(
        first_after(start, start + Duration::from_secs(900)).is_some(),
        "the guest's writer never got going"
    );
    std::thread::sleep(Duration::from_secs(2));
    let mut stalls = Vec::new();
    let mut answers = Vec::new();
    for k in 0..failovers {
        let t0 = Instant::now();
        private.fail_mds();
        let active = Instant::now();
        let resumed = first_after(active, active + ANSWER_BOUND).unwrap_or_else(|| {
            panic!(
                "failover {k}: no record acknowledged within {ANSWER_BOUND:?} after the new MDS \
                 was active (guest finished: {})",
                guest.is_finished()
            )
        });
        // The writer's longest wait around the failover: the largest gap between consecutive
        // acknowledgements from the last one before the command to the first one after it.
        let times: Vec<Instant> = {
            let a = arrivals.lock().unwrap();
            let before = a.iter().rposition(|&at| at <= t0).unwrap_or(0);
            a[before..]
                .iter()
                .copied()
                .filter(|&at| at <= resumed)
                .collect()
        };
        let stall = times
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        eprintln!(
            "{kind} failover {k}: took {:?}; longest wait of the writer {stall:?}; first record after \
             the new MDS was active: +{:?}",
            active - t0,
            resumed - active
        );
        stalls.push(stall);
        answers.push(resumed - active);
        // Let the writer run between failovers.
        let _ = first_after(
            resumed + Duration::from_millis(500),
            Instant::now() + ANSWER_BOUND,
        );
    }
    common::ceph_touch(lab, &export, "stop");
    let (run, daemon) = guest.join().unwrap();
    following.store(false, Ordering::Relaxed);
    follower.join().unwrap();
    assert_eq!(run.code(), 0, "guest verdict\n{}", daemon.log_text());
    assert!(run.console.contains("WRITER-DONE"), "{}", run.console);
    let acked = acks(&console);
    // Every acknowledged record is there, in its place, for another client.
    let m = lab.ceph();
    let data = ceph_read_all(&m, &ceph_dir(&m, &export), "data");
    for &i in &acked {
        assert_eq!(
            data.get(i * REC..(i + 1) * REC),
            Some(&record(i)[..]),
            "acknowledged record {i} is missing or wrong"
        );
    }
    stalls.sort();
    answers.sort();
    eprintln!(
        "{kind}: {failovers} failovers, {} records acknowledged; longest writer wait per failover: p50 \
         {:?} p99 {:?} max {:?}; first answer after the new MDS was active: p50 {:?} p99 {:?}",
        acked.len(),
        percentile(&stalls, 0.5),
        percentile(&stalls, 0.99),
        stalls.last().unwrap(),
        percentile(&answers, 0.5),
        percentile(&answers, 0.99),
    );
}
