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

mod common;

use std::process::Command;

use common::hostile::{hostile_daemon, Hostile};
use common::{seed_from_env, Lab};

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
