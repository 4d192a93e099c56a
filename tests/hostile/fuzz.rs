//! The hostile-guest fuzzer against the real daemon on the real cluster: generated FUSE requests
//! (valid layouts with hostile values), bent descriptor chains and raw garbage, judged by
//! `ceph-virtiofsd-bench hostile fuzz`: no death, no lost chain, no malformed reply, no inode
//! outside the export (the oracle, judging on a thread of its own: every inode number it was
//! given judged), node and handle tables and RSS bounded.
//!
//! HOSTILE_FUZZ_REQUESTS sets the count (default 100,000), HOSTILE_FUZZ_SEED the seed (default:
//! a new one each run, printed; set it to replay a run), HOSTILE_FUZZ_ARGS more options for the
//! fuzzer (the long run: `--depth 64 --mutating-per-mille 20`, with `cargo test --release`),
//! HOSTILE_FUZZ_DAEMON_ARGS the daemon's options (default `--log-level error`; a hunt for a slow
//! request wants `--log-level warn --slow-request-secs 5`). The daemon's log is
//! `<lab>/scratch/hostile-fuzz/daemon.log`.

use std::process::Command;

use crate::common;
use crate::common::hostile::{hostile_daemon, Hostile};
use crate::common::{seed_from_env, Lab};

#[test]
fn hostile_fuzz_keeps_the_daemon_alive_inside_its_export_and_bounded() {
    let lab = Lab::get();
    let requests: u64 = std::env::var("HOSTILE_FUZZ_REQUESTS")
        .map(|v| v.parse().expect("HOSTILE_FUZZ_REQUESTS must be a number"))
        .unwrap_or(100_000);
    let seed = seed_from_env("HOSTILE_FUZZ_SEED");
    println!("hostile fuzz: seed {seed} (HOSTILE_FUZZ_SEED={seed} replays this run), {requests} requests");
    let daemon_args =
        std::env::var("HOSTILE_FUZZ_DAEMON_ARGS").unwrap_or_else(|_| "--log-level error".into());
    let daemon_args: Vec<&str> = daemon_args.split_whitespace().collect();
    let (daemon, export, metrics) = hostile_daemon(&lab, "hostile-fuzz", &daemon_args);
    let out = Command::new(common::bench_binary())
        .args(["hostile", "fuzz", "--socket"])
        .arg(&daemon.socket)
        .arg("--ceph-conf")
        .arg(&lab.conf)
        .args(["--client-id", &lab.client_id, "--export", &export])
        .args([
            "--requests",
            &requests.to_string(),
            "--seed",
            &seed.to_string(),
        ])
        .args(["--pid", &daemon.pid().to_string()])
        .args(
            std::env::var("HOSTILE_FUZZ_ARGS")
                .unwrap_or_default()
                .split_whitespace(),
        )
        .arg("--metrics-socket")
        .arg(&metrics)
        .output()
        .expect("run ceph-virtiofsd-bench hostile fuzz");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    let log = daemon.log_text();
    assert!(!log.contains("panicked"), "the daemon panicked:\n{log}");
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("hostile fuzz: seed="))
        .unwrap_or_else(|| panic!("no summary line from the fuzzer (exit {:?})", out.status));
    let field = |k: &str| -> u64 {
        summary
            .split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {summary}"))
    };
    assert_eq!(field("requests"), requests, "{summary}");
    assert_eq!(field("escapes"), 0, "{summary}");
    assert_eq!(
        field("oracle_unjudged"),
        0,
        "inode numbers the oracle never judged: {summary}"
    );
    assert!(
        out.status.success(),
        "the fuzzer found something (seed {seed}; each FINDING above has a replay):\n{summary}"
    );
}

/// The oracle the fuzzer relies on can tell "outside": the export's parent, the directory next
/// to the export and the file in it are outside; the export's root and what is in it, inside.
#[test]
fn hostile_fuzz_oracle_tells_inodes_outside_the_export() {
    use ceph_client::{UserPerm, CEPH_STATX_BASIC_STATS};
    let lab = Lab::get();
    let (daemon, export, _metrics) = hostile_daemon(&lab, "hostile-fuzz-oracle", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let m = lab.ceph();
    let perm = UserPerm::root();
    let ino = |path: &str| -> u64 {
        let mut cur = m.lookup_root().unwrap();
        let mut ino = 1;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            let name = std::ffi::CString::new(part).unwrap();
            let (next, st) = m
                .lookup(&cur, &name, CEPH_STATX_BASIC_STATS, 0, &perm)
                .unwrap_or_else(|e| panic!("lookup {path}: {e}"));
            cur = next;
            ino = st.stx_ino;
        }
        ino
    };
    let top = export
        .strip_suffix("/data")
        .expect("the export is TOP/data");
    let cases = [
        (export.clone(), "inside"),
        (format!("{export}/d"), "inside"),
        (format!("{export}/f"), "inside"),
        (top.to_owned(), "outside"),
        (format!("{top}/other"), "outside"),
        (format!("{top}/other/secret"), "outside"),
    ];
    for (path, want) in cases {
        let i = ino(&path);
        let verdict = h.oracle(i);
        assert!(
            verdict == want || verdict.starts_with(&format!("{want} ")),
            "the oracle on {path} (inode {i:#x}): {verdict:?}, want {want}"
        );
    }
}

/// Files of other owners and modes, and snapshots, in the hostile tree of `export` (TOP/data):
/// what forged handles and snapshot nodes name in the device-state fuzzer.
fn states_tree(lab: &Lab, export: &str) {
    use ceph_client::{
        Statx, UserPerm, CEPH_SETATTR_GID, CEPH_SETATTR_UID, CEPH_STATX_BASIC_STATS,
    };
    let m = lab.ceph();
    let perm = UserPerm::root();
    let top = export
        .strip_suffix("/data")
        .expect("the export is TOP/data");
    let dir = |p: &str| common::ceph_dir(&m, p);
    let data = dir(export);
    for (name, mode, owner) in [
        ("rootonly", 0o600, 0),
        ("owned", 0o444, 1000),
        ("shared", 0o640, 1001),
    ] {
        let (i, _, f) = m
            .create(
                &data,
                &std::ffi::CString::new(name).unwrap(),
                mode,
                libc::O_RDWR | libc::O_CREAT,
                CEPH_STATX_BASIC_STATS,
                0,
                &perm,
            )
            .unwrap();
        f.write(0, b"contents\n").unwrap();
        let st = Statx {
            stx_uid: owner,
            stx_gid: owner,
            ..Default::default()
        };
        m.setattr(&i, &st, CEPH_SETATTR_UID | CEPH_SETATTR_GID, &perm)
            .unwrap();
    }
    // Snapshots inside the export and in the tree next to it (if the file system allows them).
    for (path, snap) in [
        (format!("{export}/d"), "s1"),
        (format!("{top}/other"), "s2"),
    ] {
        let d = dir(&path);
        let made = m
            .lookup(&d, c".snap", CEPH_STATX_BASIC_STATS, 0, &perm)
            .and_then(|(s, _)| {
                m.mkdir(
                    &s,
                    &std::ffi::CString::new(snap).unwrap(),
                    0o755,
                    CEPH_STATX_BASIC_STATS,
                    0,
                    &perm,
                )
            });
        if let Err(e) = made {
            println!("no snapshot {path}/.snap/{snap}: {e}");
        }
    }
}

/// The daemon options of the device-state fuzzer: a frontend per taken state, small limits;
/// then HOSTILE_STATES_DAEMON_ARGS (default `--log-level error`).
fn states_daemon_args() -> Vec<String> {
    let mut v: Vec<String> = [
        "--keep-serving",
        "--max-nodes",
        "256",
        "--max-handles",
        "64",
    ]
    .map(String::from)
    .to_vec();
    let extra =
        std::env::var("HOSTILE_STATES_DAEMON_ARGS").unwrap_or_else(|_| "--log-level error".into());
    v.extend(extra.split_whitespace().map(String::from));
    v
}

/// The fields of a `hostile states: seed=...` summary line.
fn summary_fields(line: &str) -> std::collections::BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The device-state fuzzer (`ceph-virtiofsd-bench hostile states`): a hostile frontend sends
/// generated device states (LOAD, valid framing, hostile contents: other trees' and "/"'s
/// inode numbers, snapshots, links, handles with any flags and openers, counts over the
/// limits, truncations) and everything the daemon serves from them is judged: nothing outside
/// the export reachable, no handle used with rights its opener lacks, every state it must
/// refuse refused, every request answered, the daemon alive and taking the next frontend.
/// HOSTILE_STATES sets the count (default 1,000), HOSTILE_STATES_SEED the seed (default: a
/// new one each run, printed), HOSTILE_STATES_DAEMON_ARGS the daemon's options (default
/// `--log-level error`), HOSTILE_STATES_FIRST the number of the first state (default 0:
/// a long run split over several processes), HOSTILE_STATES_ARGS more options for the fuzzer,
/// and HOSTILE_STATES_CHUNK the states per daemon (default: all; the long run of bench/README.md
/// starts a new daemon every 5,000, which each report their VmRSS and open descriptors). The
/// descriptor count after each chunk is asserted: this fuzzer found that every frontend
/// connection left two eventfds open in the daemon, which then stopped accepting frontends
/// after about 10,000 (fixed in `vhost_user::device`, `exit_event`).
#[test]
fn hostile_device_states_keep_the_daemon_inside_its_export() {
    let lab = Lab::get();
    let env_u64 = |k: &str, default: u64| -> u64 {
        std::env::var(k).map_or(default, |v| {
            v.parse().unwrap_or_else(|_| panic!("{k} must be a number"))
        })
    };
    let states = env_u64("HOSTILE_STATES", 1_000);
    let chunk = env_u64("HOSTILE_STATES_CHUNK", states).max(1);
    let start = env_u64("HOSTILE_STATES_FIRST", 0);
    let seed = seed_from_env("HOSTILE_STATES_SEED");
    println!("hostile states: seed {seed} (HOSTILE_STATES_SEED={seed} replays this run), states {start}..{}, {chunk} per daemon", start + states);
    let name = if start == 0 {
        "hostile-states".to_owned()
    } else {
        format!("hostile-states-{start}")
    };
    let export = common::hostile::hostile_tree(&lab, &name);
    states_tree(&lab, &export);
    let work = lab.scratch(&name);
    let mut totals: std::collections::BTreeMap<String, u64> = Default::default();
    let end = start + states;
    let mut first = start;
    while first < end {
        let n = chunk.min(end - first);
        let args = states_daemon_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let daemon = common::Daemon::start(&lab, &work, &export, &args);
        let out = Command::new(common::bench_binary())
            .args(["hostile", "states", "--socket"])
            .arg(&daemon.socket)
            .arg("--ceph-conf")
            .arg(&lab.conf)
            .args(["--client-id", &lab.client_id, "--export", &export])
            .args(["--states", &n.to_string(), "--first", &first.to_string()])
            .args(["--seed", &seed.to_string()])
            .args(["--max-nodes", "256", "--max-handles", "64"])
            .args(["--pid", &daemon.pid().to_string()])
            .args(
                std::env::var("HOSTILE_STATES_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .output()
            .expect("run ceph-virtiofsd-bench hostile states");
        let stdout = String::from_utf8_lossy(&out.stdout);
        // The whole output of a short run; of a chunked one, what is not a figure line.
        for l in stdout.lines() {
            if chunk >= states || !l.starts_with('#') {
                println!("{l}");
            }
        }
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        let log = daemon.log_text();
        assert!(!log.contains("panicked"), "the daemon panicked:\n{log}");
        // Bounded: every session's tables end with it (the daemon's RSS after the run).
        let rss_kib: u64 = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
            })
            .expect("the daemon's VmRSS (is it still running?)");
        let fds =
            std::fs::read_dir(format!("/proc/{}/fd", daemon.pid())).map_or(0, Iterator::count);
        println!(
            "hostile states: states {first}..{}: daemon VmRSS {} MiB, {fds} open descriptors after them",
            first + n,
            rss_kib / 1024
        );
        assert!(
            rss_kib < 1024 * 1024,
            "the daemon's RSS grew to {rss_kib} KiB"
        );
        // About 30 when idle; two more per reconnect leaked before (thousands per chunk).
        assert!(
            fds < 1024,
            "the daemon holds {fds} descriptors after {n} states: a reconnect leaks"
        );
        let summary = stdout
            .lines()
            .find(|l| l.starts_with("hostile states: seed="))
            .unwrap_or_else(|| panic!("no summary line from the fuzzer (exit {:?})", out.status));
        let f = summary_fields(summary);
        assert_eq!(
            f.get("dead").map(String::as_str),
            Some("false"),
            "{summary}"
        );
        for (k, v) in &f {
            if let Ok(v) = v.parse::<u64>() {
                *totals.entry(k.clone()).or_default() += v;
            }
        }
        assert!(
            out.status.success(),
            "the fuzzer found something (seed {seed}; each FINDING above has a replay):\n{summary}"
        );
        first += n;
    }
    let t = |k: &str| totals.get(k).copied().unwrap_or(0);
    println!(
        "hostile states total: seed={seed} {}",
        totals
            .iter()
            .filter(|(k, _)| k.as_str() != "seed" && k.as_str() != "rate")
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert_eq!(t("states"), states);
    for k in ["escapes", "privilege", "wrongly_taken", "lost", "malformed"] {
        assert_eq!(t(k), 0, "{k}");
    }
    // The fuzzer reached what it attacks: states taken, nodes and handles served, replies
    // judged (a fuzzer whose every state was refused would prove nothing).
    for k in [
        "taken",
        "refused",
        "served_nodes",
        "handles_used",
        "judged",
        "listed",
    ] {
        assert!(t(k) > 0, "{k} = 0");
    }
}

/// The same frontend after the guest mounted: every connection sends FUSE_INIT first, and then
/// every state must be refused (security review finding 1: a frontend swapping a live guest's
/// session, which the daemon accepted once the guest had forgotten everything). The states of
/// the fuzzer above, 300 of them (HOSTILE_STATES_AFTER_INIT).
#[test]
fn hostile_device_states_after_fuse_init_are_refused() {
    let lab = Lab::get();
    let states: u64 = std::env::var("HOSTILE_STATES_AFTER_INIT")
        .map(|v| {
            v.parse()
                .expect("HOSTILE_STATES_AFTER_INIT must be a number")
        })
        .unwrap_or(300);
    let seed = seed_from_env("HOSTILE_STATES_SEED");
    println!("hostile states after INIT: seed {seed}, {states} states");
    let export = common::hostile::hostile_tree(&lab, "hostile-states-init");
    states_tree(&lab, &export);
    let work = lab.scratch("hostile-states-init");
    let args = states_daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = common::Daemon::start(&lab, &work, &export, &args);
    let out = Command::new(common::bench_binary())
        .args(["hostile", "states", "--init-first", "--socket"])
        .arg(&daemon.socket)
        .arg("--ceph-conf")
        .arg(&lab.conf)
        .args(["--client-id", &lab.client_id, "--export", &export])
        .args(["--states", &states.to_string(), "--seed", &seed.to_string()])
        .args(["--max-nodes", "256", "--max-handles", "64"])
        .args(["--pid", &daemon.pid().to_string()])
        .output()
        .expect("run ceph-virtiofsd-bench hostile states");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("hostile states: seed="))
        .unwrap_or_else(|| panic!("no summary line from the fuzzer (exit {:?})", out.status));
    let f = summary_fields(summary);
    let n = |k: &str| -> u64 { f.get(k).and_then(|v| v.parse().ok()).unwrap_or(u64::MAX) };
    assert_eq!(n("states"), states, "{summary}");
    assert_eq!(n("taken"), 0, "states taken after FUSE_INIT: {summary}");
    assert_eq!(n("refused"), states, "{summary}");
    assert_eq!(
        f.get("dead").map(String::as_str),
        Some("false"),
        "{summary}"
    );
    assert!(out.status.success(), "{summary}");
    assert!(!daemon.log_text().contains("panicked"));
}
