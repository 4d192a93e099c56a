//! FUSE request timeouts of Linux 6.14+ guests (`fs.fuse.default_request_timeout`, issue #33)
//! through a stalled MDS, an MDS failover and a stalled OSD.
//!
//! A guest whose kernel has a request timeout aborts its whole FUSE connection when one
//! request stays unanswered past it (fs/fuse: `fuse_check_timeout` looks at the head of every
//! device's processing list, which holds the requests the virtio-fs driver has in flight, and
//! calls `fuse_abort_conn`); the effective timeout is at least 15 s, checked every 15 s. These
//! tests boot Debian forky's kernel (Linux 7.x) with the sysctl at 10 s on its command line
//! (`GUEST_APPEND`: the timeout is taken at FUSE_INIT, before the test runs) and run `mkdir`
//! (or, for the OSD, a 4 KiB write and fsync) in a loop, printing each one's result and time,
//! while the host stops the MDS (SIGSTOP) for longer than the timeout, stops it until the
//! monitor fails it over to a standby, or stops the OSD. They print what the guest saw (`OP` lines,
//! `AFTER` lines once the cluster is back) and assert that the mount survived: every later
//! operation works, no `ENOTCONN`/`ECONNABORTED`.
//!
//! Each runs on a cluster of its own for about two minutes: ignored by default, run with
//! `cargo test --test request_timeout -- --ignored --test-threads=1` (docs/testing.md);
//! `REQUEST_TIMEOUT_DAEMON_ARGS` adds daemon options (`--request-deadline 8` is the daemon's
//! side of the bound; without it the guests lose their mount).
//!
//! The daemon's bound itself is checked at the FUSE wire, in CI, in seconds:
//! `a_request_past_the_deadline_is_answered_etimedout_and_its_late_result_dropped` (the MDS),
//! `reads_and_writes_past_the_deadline_with_the_osd_stopped_are_answered_etimedout` (the OSD).

mod common;

use std::ffi::CString;
use std::time::{Duration, Instant};

use ceph_client::{UserPerm, CEPH_STATX_BASIC_STATS};
use common::hostile::{metric, request, scrape_metrics, Answer, Body, Hostile, PrivateCluster};
use common::{ceph_dir, ceph_lookup, run_guest_env, Daemon, Lab};

/// How long the MDS stays stopped in the stall case: past the guest's effective timeout (15 s)
/// plus one period of its check (15 s).
const STALL: Duration = Duration::from_secs(40);

/// What the guest does in its loop: a `mkdir` (the MDS), or a 4 KiB file written and
/// fsync'ed (the MDS, then the OSD).
const MKDIR: &str = "mkdir /mnt/w/d$i";
const WRITE_FSYNC: &str = "dd if=/dev/zero of=/mnt/w/f$i bs=4096 count=1 conv=fsync";

/// The guest: timeout 10 s (checked), `op` in a loop for `secs` seconds of its uptime, then
/// (the cluster being back by then) a few more operations and a remount.
fn script(secs: u32, op: &str) -> String {
    format!(
        r#"#!/bin/sh
up() {{ cut -d' ' -f1 /proc/uptime; }}
[ -r /proc/sys/fs/fuse/default_request_timeout ] || {{ echo "NO-REQUEST-TIMEOUT $(uname -r)"; exit 3; }}
echo "TIMEOUT default=$(cat /proc/sys/fs/fuse/default_request_timeout) max=$(cat /proc/sys/fs/fuse/max_request_timeout)"
[ "$(cat /proc/sys/fs/fuse/default_request_timeout)" = 10 ] || exit 4
mkdir /mnt/w && echo ready > /mnt/ready || exit 7
start=$(up); end=${{start%.*}}; end=$((end + {secs}))
echo "GUEST-READY $start"
i=0
while [ "$(up | cut -d. -f1)" -lt $end ]; do
  t0=$(up)
  err=$({op} 2>&1); rc=$?
  echo "OP $i rc=$rc t0=$t0 t1=$(up) $err"
  i=$((i+1))
done
bad=0
for k in 1 2 3; do
  err=$(mkdir /mnt/w/after$k 2>&1) || {{ echo "AFTER mkdir $k failed: $err"; bad=1; }}
done
err=$(ls /mnt/w 2>&1 | wc -l) || bad=1
echo "AFTER ls entries=$err"
cat /proc/self/mountinfo | grep virtiofs
if [ $bad = 1 ]; then
  umount -l /mnt; echo "AFTER umount -l rc=$?"
  mount -t virtiofs "$VFS_TAG" /mnt; echo "AFTER remount rc=$?"
  ls /mnt/w >/dev/null; echo "AFTER remount-ls rc=$?"
fi
echo "VERDICT bad=$bad"
exit $bad
"#
    )
}

fn daemon_args() -> Vec<String> {
    std::env::var("REQUEST_TIMEOUT_DAEMON_ARGS")
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Boot the guest on `cluster`, wait until it is ready, run `fault`, and hand back the console
/// and the daemon's log.
fn run(
    cluster: &PrivateCluster,
    name: &str,
    op: &str,
    fault: impl FnOnce(),
) -> (common::GuestRun, String) {
    let lab = &cluster.lab;
    let export = lab.export_dir(name);
    let work = lab.scratch(&format!("{name}-daemon"));
    let mut args = vec!["--slow-request-secs".to_owned(), "5".to_owned()];
    args.extend(daemon_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start(lab, &work, &export, &args);
    let lab2 = cluster.lab.clone();
    let work2 = work.clone();
    let op = op.to_owned();
    let guest = std::thread::spawn(move || {
        let mut d = daemon;
        let env = [
            ("GUEST_KERNEL_SUITE", "forky"),
            ("GUEST_APPEND", "sysctl.fs.fuse.default_request_timeout=10"),
        ];
        let run = run_guest_env(&lab2, &work2, &d, &script(150, &op), &[], 900, &env);
        d.stop();
        (run, d.log_text())
    });
    let m = lab.ceph();
    let dir = ceph_dir(&m, &export);
    let deadline = Instant::now() + Duration::from_secs(600);
    while ceph_lookup(&m, &dir, "ready").is_none() {
        assert!(
            !guest.is_finished() && Instant::now() < deadline,
            "the guest never got ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(m);
    // A few operations before the fault.
    std::thread::sleep(Duration::from_secs(5));
    let t = Instant::now();
    fault();
    println!("FAULT took {:.1} s", t.elapsed().as_secs_f64());
    let (run, log) = guest.join().unwrap();
    (run, log)
}

fn report(run: &common::GuestRun, log: &str) {
    let slowest = run
        .console
        .lines()
        .filter(|l| l.starts_with("OP "))
        .filter_map(|l| {
            let t0: f64 = l
                .split("t0=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            let t1: f64 = l
                .split("t1=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some(((t1 - t0) * 10.0).round() / 10.0)
        })
        .fold(0.0f64, f64::max);
    let failed: Vec<&str> = run
        .console
        .lines()
        .filter(|l| l.starts_with("OP ") && !l.contains("rc=0"))
        .collect();
    println!(
        "SUMMARY slowest operation {slowest} s; failed operations: {}",
        failed.len()
    );
    for l in failed.iter().take(5) {
        println!("SUMMARY failed: {l}");
    }
    for l in log
        .lines()
        .filter(|l| l.contains("deadline") || l.contains("slow"))
    {
        println!("DAEMON {l}");
    }
}

/// [`run`], then what the guest saw, and that its mount survived.
fn survives(cluster: &PrivateCluster, name: &str, op: &str, fault: impl FnOnce()) {
    let (run, log) = run(cluster, name, op, fault);
    report(&run, &log);
    assert_eq!(
        run.code(),
        0,
        "the guest's mount did not survive (console above)"
    );
}

/// The MDS stopped for 40 s, no standby: the daemon's requests to it wait until it resumes.
#[test]
#[ignore = "two minutes of a guest on a cluster of its own: see docs/testing.md"]
fn a_guest_with_a_request_timeout_through_a_stalled_mds() {
    let lab = Lab::get();
    let cluster = PrivateCluster::start(&lab, "rt-stall");
    survives(&cluster, "rt-stall", MKDIR, || {
        let _stopped = cluster.stop_mds("a");
        std::thread::sleep(STALL);
    });
}

/// The OSD stopped for 40 s: each write's data and fsync wait for it until it resumes.
#[test]
#[ignore = "two minutes of a guest on a cluster of its own: see docs/testing.md"]
fn a_guest_with_a_request_timeout_through_a_stopped_osd() {
    let lab = Lab::get();
    let cluster = PrivateCluster::start(&lab, "rt-osd");
    survives(&cluster, "rt-osd", WRITE_FSYNC, || {
        let _stopped = cluster.stop_osd("0");
        std::thread::sleep(STALL);
    });
}

/// The active MDS stopped until the monitor fails it over to the standby (beacon grace,
/// replay, reconnect): the failover a hung MDS host gives.
#[test]
#[ignore = "two minutes of a guest on a cluster of its own: see docs/testing.md"]
fn a_guest_with_a_request_timeout_through_an_mds_failover() {
    let lab = Lab::get();
    let cluster = PrivateCluster::start_with(&lab, "rt-failover", &["--standby-mds"]);
    survives(&cluster, "rt-failover", MKDIR, || {
        let _stopped = cluster.stop_mds("a");
        // Until the standby is active.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let out = cluster
                .lab
                .ceph_cli()
                .args(["mds", "stat"])
                .output()
                .expect("ceph mds stat");
            let s = String::from_utf8_lossy(&out.stdout);
            if s.contains("b=up:active") || s.contains("{0=b=up:active}") {
                println!("FAILOVER {}", s.trim());
                break;
            }
            assert!(Instant::now() < deadline, "no failover: {s}");
        }
    });
}

const FUSE_LOOKUP: u32 = 1;
const FUSE_WRITE: u32 = 16;
const FUSE_MKDIR: u32 = 9;
/// The reply room Linux gives an entry reply: out-header and `fuse_entry_out`.
const ENTRY_REPLY: u32 = 16 + 128;

/// A request on the request queue with the room of an entry reply.
fn small(h: &mut Hostile, opcode: u32, node: u64, body: &[u8]) -> Answer {
    let u = h.next_unique();
    h.raw(1, &request(opcode, u, node, None, body), ENTRY_REPLY)
}
const INODES: &str = "ceph_virtiofsd_inodes";

/// Wait (at most a minute) until `daemon` has logged its `n` late results as dropped (no more);
/// those lines.
fn late_results_dropped(daemon: &Daemon, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log = daemon.log_text();
        let dropped: Vec<String> = log
            .lines()
            .filter(|l| l.contains("its result is dropped"))
            .map(str::to_owned)
            .collect();
        if dropped.len() >= n {
            assert_eq!(
                dropped.len(),
                n,
                "more late results than early answers:\n{log}"
            );
            return dropped;
        }
        assert!(
            Instant::now() < deadline,
            "the late results were not dropped:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `--request-deadline 2` at the FUSE wire, with the MDS stopped: a GETATTR of a cached inode
/// is answered as usual, a LOOKUP of a name the daemon never saw and a MKDIR are answered
/// ETIMEDOUT while the MDS is still stopped; once the MDS is back, both calls complete, the daemon
/// logs that their results were dropped and gives back the node references they took (its
/// node count is what it was), the late mkdir stays done (another client sees it, as with
/// Linux's CephFS client), and the name is found by a new LOOKUP.
#[test]
fn a_request_past_the_deadline_is_answered_etimedout_and_its_late_result_dropped() {
    let lab = Lab::get();
    let name = format!("rt-wire-{}", std::process::id());
    let cluster = PrivateCluster::start(&lab, &name);
    let lab = &cluster.lab;
    let export = lab.export_dir(&name);
    {
        let m = lab.ceph();
        let d = ceph_dir(&m, &export);
        let names = CString::new("names").unwrap();
        let (names, _) = m
            .mkdir(
                &d,
                &names,
                0o777,
                CEPH_STATX_BASIC_STATS,
                0,
                &UserPerm::root(),
            )
            .unwrap();
        for i in 0..4 {
            let n = CString::new(format!("n{i}")).unwrap();
            m.mkdir(
                &names,
                &n,
                0o755,
                CEPH_STATX_BASIC_STATS,
                0,
                &UserPerm::root(),
            )
            .unwrap();
        }
    }
    let work = lab.scratch(&format!("{name}-daemon"));
    let metrics = work.join("metrics.sock");
    let daemon = Daemon::start(
        lab,
        &work,
        &export,
        &[
            "--request-deadline",
            "2",
            "--metrics-socket",
            metrics.to_str().unwrap(),
        ],
    );
    let mut h = Hostile::connect_without_oracle(&daemon);
    h.set_timeout_ms(30_000);
    let a = h.lookup(1, b"names");
    let (names, _) = a.entry().unwrap_or_else(|| panic!("LOOKUP names: {a:?}"));
    let before = metric(&scrape_metrics(&metrics), INODES).expect("node count");

    let resume = cluster.stop_mds("a");
    // Patience well past the deadline: the answer must come while the MDS is stopped.
    h.set_timeout_ms(20_000);
    let getattr = h.getattr(names);
    assert!(
        matches!(getattr, Answer::Done { .. }) && getattr.error() == Some(0),
        "GETATTR of a cached inode: {getattr:?}"
    );
    // With the reply room Linux gives (an entry: 144 bytes): a reply the daemon writes into
    // its own buffer first, so that the timer can answer in its place.
    let lookup = small(&mut h, FUSE_LOOKUP, names, &Body::new().name(b"n1").0);
    assert_eq!(
        lookup.error(),
        Some(-libc::ETIMEDOUT),
        "LOOKUP with the MDS stopped: {lookup:?}"
    );
    let mkdir = small(
        &mut h,
        FUSE_MKDIR,
        names,
        &Body::new().u32(0o755).u32(0).name(b"late").0,
    );
    assert_eq!(
        mkdir.error(),
        Some(-libc::ETIMEDOUT),
        "MKDIR with the MDS stopped: {mkdir:?}"
    );
    let log = daemon.log_text();
    let answered = log
        .lines()
        .filter(|l| l.contains("answered ETIMEDOUT") && l.contains("Request unanswered"))
        .count();
    assert_eq!(
        answered, 2,
        "the daemon logs each request it answered early:\n{log}"
    );
    drop(resume);

    // Both calls complete once the MDS is back; their results are dropped, their references
    // given back.
    for l in &late_results_dropped(&daemon, 2) {
        println!("{l}");
        assert!(l.contains("nodes_released=1"), "{l}");
    }
    let after = metric(&scrape_metrics(&metrics), INODES).expect("node count");
    assert_eq!(after, before, "a late reply's node reference was kept");
    // The late mkdir stays done; a new LOOKUP finds both names.
    let m = lab.ceph();
    let d = ceph_dir(&m, &format!("{export}/names"));
    assert!(
        ceph_lookup(&m, &d, "late").is_some(),
        "the late MKDIR did not happen"
    );
    h.set_timeout_ms(30_000);
    for n in [&b"n1"[..], b"late"] {
        let a = h.lookup(names, n);
        assert!(a.entry().is_some(), "LOOKUP after the stall: {a:?}");
    }
    assert!(h.alive());
}

/// `--request-deadline 2` at the FUSE wire, with the OSD stopped: READ and WRITE are bounded
/// too. An O_DIRECT READ and an O_DIRECT WRITE (each an OSD round trip) are answered ETIMEDOUT
/// while the OSD is still stopped, so the write was not acknowledged; once the OSD is back,
/// both calls complete and their results are dropped, and the file reads as a client reads it
/// (the late write, like a late mkdir, may have landed: the guest was told it failed). With
/// the bound on, the daemon offers guests READs and WRITEs of at most 124 KiB, which its
/// private buffers hold (`vhost_user::deadline`).
#[test]
fn reads_and_writes_past_the_deadline_with_the_osd_stopped_are_answered_etimedout() {
    let lab = Lab::get();
    let name = format!("rt-osd-{}", std::process::id());
    let cluster = PrivateCluster::start(&lab, &name);
    let lab = &cluster.lab;
    let export = lab.export_dir(&name);
    let old = vec![0x5au8; 8192];
    {
        let m = lab.ceph();
        let d = ceph_dir(&m, &export);
        let (_, _, f) = m
            .create(
                &d,
                &CString::new("data").unwrap(),
                0o666,
                libc::O_RDWR | libc::O_CREAT,
                CEPH_STATX_BASIC_STATS,
                0,
                &UserPerm::root(),
            )
            .unwrap();
        assert_eq!(f.write(0, &old).unwrap(), old.len());
        f.fsync(false).unwrap();
    }
    let work = lab.scratch(&format!("{name}-daemon"));
    let daemon = Daemon::start(lab, &work, &export, &["--request-deadline", "2"]);
    let mut h = Hostile::connect_without_oracle(&daemon);
    h.set_timeout_ms(30_000);
    assert!(
        daemon
            .log_text()
            .contains("READ and WRITE limited to what --request-deadline can bound"),
        "the INIT reply's limits:\n{}",
        daemon.log_text()
    );
    let a = h.lookup(1, b"data");
    let (node, _) = a.entry().unwrap_or_else(|| panic!("LOOKUP data: {a:?}"));
    let a = h.open(node, (libc::O_RDWR | libc::O_DIRECT) as u32);
    let fh = a.fh().unwrap_or_else(|| panic!("OPEN O_DIRECT: {a:?}"));

    let resume = cluster.stop_osd("0");
    h.set_timeout_ms(20_000);
    let started = Instant::now();
    let read = h.read_into(node, fh, 0, 4096, 16 + 4096);
    assert_eq!(
        read.error(),
        Some(-libc::ETIMEDOUT),
        "READ with the OSD stopped: {read:?}"
    );
    let new = vec![0xa5u8; 4096];
    let mut write_in = Body::new()
        .u64(fh)
        .u64(4096)
        .u32(4096)
        .u32(0)
        .u64(0)
        .u32(0)
        .u32(0)
        .0;
    write_in.extend_from_slice(&new);
    let u = h.next_unique();
    let write = h.raw(1, &request(FUSE_WRITE, u, node, None, &write_in), 16 + 8);
    assert_eq!(
        write.error(),
        Some(-libc::ETIMEDOUT),
        "WRITE with the OSD stopped: {write:?}"
    );
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "both answers came {took:?} after the OSD stopped"
    );
    let log = daemon.log_text();
    let answered = log
        .lines()
        .filter(|l| l.contains("answered ETIMEDOUT") && l.contains("Request unanswered"))
        .count();
    assert_eq!(answered, 2, "each request answered early is logged:\n{log}");
    drop(resume);

    late_results_dropped(&daemon, 2);
    // The file holds the old bytes, or the late write's where it landed: never anything else.
    let again = h.read_into(node, fh, 0, 8192, 16 + 8192);
    assert_eq!(
        again.error(),
        Some(0),
        "READ after the OSD is back: {again:?}"
    );
    let data = again.payload();
    assert_eq!(&data[..4096], &old[..4096]);
    assert!(
        data[4096..] == old[4096..] || data[4096..] == new[..],
        "the second block is neither the old bytes nor the late write's"
    );
    assert!(h.alive());
}
