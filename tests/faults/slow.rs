//! A slow OSD and a stalled MDS (issue #17): the request that waits for the slow part of the
//! cluster waits, and nothing else does. The other requests of the same queue are answered
//! while it waits, FORGETs on the hiprio queue keep flowing, the slow-request watchdog logs
//! it with what it waits on and counts it, and once the cluster is quick again it completes
//! with the right answer.
//!
//! Driven at the FUSE wire by `ceph-virtiofsd-bench hostile serve`, so "answered while the
//! other one waits" is exact: the slow request is sent first and comes back `lost` (not
//! answered within the frontend's timeout), then the others are sent on the same queue and
//! must come back within that timeout, then `settle` collects the slow one's reply.
//!
//! - Slow OSD: Ceph's injected dispatch delay (`osd_debug_inject_dispatch_delay_*`, set on
//!   the OSD through its admin socket): every client op sleeps 6 s in the OSD before it is
//!   served. A READ of data the daemon has not cached waits; GETATTR of a cached inode, a
//!   LOOKUP the MDS answers from its cache, and a READ of cached data do not.
//! - Stalled MDS: the MDS process is stopped (SIGSTOP) for 2 to 3 s, until the watchdog has
//!   reported the request, well inside its beacon grace, so no failover starts: the MDS is there and does not answer. (Ceph's
//!   injected messenger delay is random per message, between 0 and a maximum, which cannot
//!   make one request reliably slow.) A LOOKUP of a name the daemon has not seen waits;
//!   GETATTR of a cached inode and a READ of cached data do not.
//!
//! Each test has a cluster of its own: the faults it injects would slow every other test.

use std::ffi::CString;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::hostile::{metric, scrape_metrics, Answer, Hostile, PrivateCluster};
use crate::common::{Daemon, Lab};
use ceph_client::{Mount, UserPerm, CEPH_STATX_BASIC_STATS};

const STUCK: &str = "ceph_virtiofsd_fuse_requests_stuck";
/// How long the frontend waits for an answer: a request not answered within it is "slow";
/// one that must not be held up has to be answered within it.
const PATIENCE_MS: u64 = 1500;
/// The daemon's slow-request bound (`--slow-request-secs`).
const SLOW_SECS: u64 = 1;
const BIG_LEN: usize = 4 << 20;
const READ_LEN: u32 = 128 * 1024;

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect()
}

fn write_file(m: &Mount, export: &str, name: &str, data: &[u8]) {
    let d = common::ceph_dir(m, export);
    let n = CString::new(name).unwrap();
    let (_, _, f) = m
        .create(
            &d,
            &n,
            0o644,
            libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
            CEPH_STATX_BASIC_STATS,
            0,
            &UserPerm::root(),
        )
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    let mut off = 0;
    while off < data.len() {
        off += f.write(off as u64, &data[off..]).unwrap();
    }
    f.fsync(false).unwrap();
}

/// The export: `big` (4 MiB the daemon will read from the OSD), `small` (read once, so its
/// data is cached), `names/n0..n7` (looked up only during the fault).
fn tree(lab: &Lab, name: &str) -> String {
    let export = lab.export_dir(name);
    let m = lab.ceph();
    write_file(&m, &export, "big", &pattern(BIG_LEN));
    write_file(&m, &export, "small", &pattern(8192));
    let d = common::ceph_dir(&m, &export);
    let names = CString::new("names").unwrap();
    m.mkdir(
        &d,
        &names,
        0o755,
        CEPH_STATX_BASIC_STATS,
        0,
        &UserPerm::root(),
    )
    .unwrap();
    for i in 0..8 {
        write_file(&m, &format!("{export}/names"), &format!("n{i}"), b"x");
    }
    export
}

fn lookup(h: &mut Hostile, parent: u64, name: &str) -> u64 {
    let a = h.lookup(parent, name.as_bytes());
    a.entry()
        .unwrap_or_else(|| panic!("LOOKUP {name}: {a:?}"))
        .0
}

fn open(h: &mut Hostile, node: u64) -> u64 {
    let a = h.open(node, libc::O_RDONLY as u32);
    a.fh().unwrap_or_else(|| panic!("OPEN: {a:?}"))
}

/// The data of a READ reply, checked against `want`.
fn check_read(what: &str, reply: &[u8], want: &[u8]) {
    assert!(reply.len() >= 16, "{what}: short reply {reply:?}");
    let err = i32::from_le_bytes(reply[4..8].try_into().unwrap());
    assert_eq!(err, 0, "{what}: error {err}");
    assert!(
        reply[16..] == *want,
        "{what}: the bytes differ from what was written"
    );
}

fn ok(what: &str, a: &Answer) {
    assert!(
        matches!(a, Answer::Done { .. }) && a.error() == Some(0),
        "{what} was held up by the slow request (or failed): {a:?}"
    );
}

/// The watchdog's log line for a request of `opcode` stuck in flight.
fn stuck_line(log: &str, opcode: &str) -> Option<String> {
    log.lines()
        .find(|l| l.contains(&format!("op=\"{opcode}\"")) && l.contains("in flight"))
        .map(str::to_owned)
}

fn wait_for_stuck(daemon: &Daemon, metrics: &Path, opcode: &str) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = daemon.log_text();
        if let Some(line) = stuck_line(&log, opcode) {
            return (line, scrape_metrics(metrics));
        }
        assert!(
            Instant::now() < deadline,
            "no slow-request report for {opcode}\n{log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The watchdog clears `fuse_requests_stuck` on its next look once the request is answered.
fn wait_unstuck(metrics: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape_metrics(metrics);
        if metric(&text, STUCK) == Some(0.0) {
            return;
        }
        assert!(Instant::now() < deadline, "still counted as stuck:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn start(cluster: &PrivateCluster, name: &str) -> (Daemon, String, std::path::PathBuf) {
    let lab = &cluster.lab;
    let export = tree(lab, name);
    // Not `scratch(name)`: that one holds the cluster, and scratch() empties what it returns.
    let work = lab.scratch(&format!("{name}-daemon"));
    let metrics = work.join("metrics.sock");
    let secs = SLOW_SECS.to_string();
    let daemon = Daemon::start(
        lab,
        &work,
        &export,
        &[
            "--slow-request-secs",
            &secs,
            "--metrics-socket",
            metrics.to_str().unwrap(),
        ],
    );
    (daemon, export, metrics)
}

/// Turns the OSD's injected delay off even when the test fails half-way.
struct Undelay<'a>(&'a PrivateCluster);

impl Drop for Undelay<'_> {
    fn drop(&mut self) {
        let asok = self.0.dir.join("run/ceph-osd.0.asok");
        let _ = Command::new("ceph")
            .arg("--admin-daemon")
            .arg(&asok)
            .args([
                "config",
                "set",
                "osd_debug_inject_dispatch_delay_probability",
                "0",
            ])
            .output();
    }
}

/// What both tests hold before the fault: `small` open and its data cached, `names` and
/// `names/n0` looked up (n0 is what the FORGET during the fault drops).
struct Held {
    small: u64,
    small_fh: u64,
    names: u64,
    n0: u64,
}

fn hold(h: &mut Hostile) -> Held {
    h.set_timeout_ms(30_000);
    let small = lookup(h, 1, "small");
    let small_fh = open(h, small);
    let a = h.read(small, small_fh, 0, 8192);
    check_read(
        "READ of small before the fault",
        a_reply(&a),
        &pattern(8192),
    );
    let names = lookup(h, 1, "names");
    let n0 = lookup(h, names, "n0");
    Held {
        small,
        small_fh,
        names,
        n0,
    }
}

/// While the slow request waits: a GETATTR and a READ libcephfs answers from its caches, a
/// LOOKUP of `lookup` (when given), and a FORGET on the hiprio queue are all answered.
fn the_others_are_answered(what: &str, h: &mut Hostile, held: &Held, lookup: Option<&[u8]>) {
    let t = Instant::now();
    ok("GETATTR of a cached inode", &h.getattr(held.small));
    let a = h.read(held.small, held.small_fh, 0, 8192);
    ok("READ of cached data", &a);
    check_read("READ of cached data", a_reply(&a), &pattern(8192));
    if let Some(name) = lookup {
        ok(
            "LOOKUP the MDS answers from its cache",
            &h.lookup(held.names, name),
        );
    }
    let forget = h.forget(&[(held.n0, 1)]);
    assert!(
        matches!(forget, Answer::Done { .. }),
        "FORGET on the hiprio queue was held up: {forget:?}"
    );
    println!(
        "{what}: the other requests were answered in {} ms while the slow one waits",
        t.elapsed().as_millis()
    );
}

/// The watchdog logged the slow `opcode` with `waits_on`, and counts it.
fn reported(what: &str, daemon: &Daemon, metrics: &Path, opcode: &str, waits_on: &str) {
    let (line, text) = wait_for_stuck(daemon, metrics, opcode);
    println!("{what}: {line}");
    assert!(line.contains(&format!("waits_on=\"{waits_on}\"")), "{line}");
    assert!(metric(&text, STUCK).unwrap_or(0.0) >= 1.0, "{text}");
    let slow = format!("ceph_virtiofsd_fuse_slow_requests_total{{op=\"{opcode}\"}}");
    assert!(metric(&text, &slow).unwrap_or(0.0) >= 1.0, "{text}");
}

#[test]
fn a_slow_osd_holds_up_only_the_request_that_waits_for_it() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let name = format!("slow-osd-{}", std::process::id());
    let cluster = PrivateCluster::start(&lab, &name);
    let (daemon, export, metrics) = start(&cluster, &name);
    let mut h = Hostile::connect(&cluster.lab, &daemon, &export, &[]);
    let held = hold(&mut h);
    let big = lookup(&mut h, 1, "big");
    let big_fh = open(&mut h, big);
    let before = scrape_metrics(&metrics);
    assert_eq!(metric(&before, STUCK), Some(0.0), "{before}");

    // Every client op now sleeps 6 s in the OSD before it is served: the READ is still in
    // flight when the watchdog (1 s bound, one look a second) reports it.
    let _undo = Undelay(&cluster);
    cluster.osd_config("osd_debug_inject_dispatch_delay_duration", "6");
    cluster.osd_config("osd_debug_inject_dispatch_delay_probability", "1");
    h.set_timeout_ms(PATIENCE_MS);

    let off = 2 << 20;
    let slow = h.read(big, big_fh, off, READ_LEN);
    assert_eq!(
        slow,
        Answer::Lost,
        "a READ from the OSD was answered within {PATIENCE_MS} ms although the OSD sleeps 6 s per op"
    );
    the_others_are_answered("slow OSD", &mut h, &held, Some(b"n1"));
    reported("slow OSD", &daemon, &metrics, "READ", "osd");

    // The OSD is quick again: the READ completes with the bytes written there.
    cluster.osd_config("osd_debug_inject_dispatch_delay_probability", "0");
    let (out, late) = h.settle(1, 60_000);
    assert_eq!(out, 0, "the slow READ never came back");
    assert_eq!(late.len(), 1, "{} late replies", late.len());
    let want = pattern(BIG_LEN);
    let range = off as usize..off as usize + READ_LEN as usize;
    check_read("the slow READ", &late[0], &want[range]);
    h.set_timeout_ms(30_000);
    assert!(h.alive());
    wait_unstuck(&metrics);
}

#[test]
fn a_stalled_mds_holds_up_only_the_request_that_waits_for_it() {
    let _cluster = common::cluster_shared();
    let lab = Lab::get();
    let name = format!("slow-mds-{}", std::process::id());
    let cluster = PrivateCluster::start(&lab, &name);
    let (daemon, export, metrics) = start(&cluster, &name);
    let mut h = Hostile::connect(&cluster.lab, &daemon, &export, &[]);
    let held = hold(&mut h);

    let resume = cluster.stop_mds("a");
    let stopped = Instant::now();
    h.set_timeout_ms(PATIENCE_MS);

    let slow = h.lookup(held.names, b"n5");
    assert_eq!(
        slow,
        Answer::Lost,
        "a LOOKUP of a name the daemon never saw was answered within {PATIENCE_MS} ms with the MDS stopped"
    );
    the_others_are_answered("stalled MDS", &mut h, &held, None);
    reported("stalled MDS", &daemon, &metrics, "LOOKUP", "mds");

    // Resumed once the watchdog has reported the LOOKUP (2 to 3 s), far inside the MDS's
    // beacon grace (15 s): no failover, the MDS just answers.
    println!(
        "stalled MDS: stopped for {} ms",
        stopped.elapsed().as_millis()
    );
    drop(resume);
    let (out, late) = h.settle(1, 60_000);
    assert_eq!(out, 0, "the LOOKUP never came back");
    assert_eq!(late.len(), 1, "{} late replies", late.len());
    let err = i32::from_le_bytes(late[0][4..8].try_into().unwrap());
    assert_eq!(err, 0, "the LOOKUP failed: {err}");
    h.set_timeout_ms(30_000);
    assert!(h.alive());
    wait_unstuck(&metrics);
}

fn a_reply(a: &Answer) -> &[u8] {
    match a {
        Answer::Done { reply, .. } => reply,
        _ => panic!("no reply: {a:?}"),
    }
}
