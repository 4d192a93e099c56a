//! Upgrade without the guest noticing (`--handover`): a successor daemon started while the old
//! one serves takes the guest's FUSE session over, and a frontend that reconnects to a
//! restarted back-end (as cloud-hypervisor does; here the bench's frontend,
//! `ceph-virtiofsd-bench upgrade-stream`) goes on with its node ids and open handles.
//!
//! The stream keeps four files open (the last one unlinked while open) and writes, reads back
//! and stats a 4 KiB record per file per round; every answer is checked. Across the upgrade it
//! must see no error at all, and the bytes must be in CephFS as written (read through a test's
//! own client). A successor that cannot take the session (another export) must leave the guest
//! on the old daemon, which goes on serving.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{bench_binary, ceph_dir, ceph_lookup, ceph_read_all, Daemon, Lab};

const RECORD: usize = 4096;

/// A daemon started on an existing socket path (its predecessor's), logging to `log`.
fn successor(lab: &Lab, socket: &Path, export: &str, handover: &Path, log: &Path) -> Child {
    let logf = std::fs::File::create(log).unwrap();
    Command::new(common::daemon_binary())
        .arg("--socket-path")
        .arg(socket)
        .args(["--ceph-conf", lab.conf.to_str().unwrap()])
        .args(["--client-id", &lab.client_id, "--ceph-root", export])
        .args(["--log-level", "info", "--quarantine", "off", "--handover"])
        .arg(handover)
        .stdin(Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .spawn()
        .expect("start the successor ceph-virtiofsd")
}

fn wait_exit(child: &mut Child, secs: u64, what: &str, log: &Path) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "{what} did not exit within {secs} s:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_log(log: &Path, needle: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} never logged {needle:?} within {secs} s:\n{text}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The stream's figures: `key=value` pairs of its summary line.
struct Summary(String);

impl Summary {
    fn get(&self, key: &str) -> u64 {
        self.0
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key}= in {:?}", self.0))
    }
}

struct Stream {
    child: Child,
    stop: PathBuf,
}

impl Stream {
    fn start(socket: &Path, work: &Path, dir: &str) -> Stream {
        let stop = work.join(format!("stop-{dir}"));
        let child = Command::new(bench_binary())
            .args(["upgrade-stream", "--socket"])
            .arg(socket)
            .args(["--files", "4", "--seconds", "600", "--dir", dir])
            .arg("--stop-file")
            .arg(&stop)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ceph-virtiofsd-bench upgrade-stream");
        Stream { child, stop }
    }

    fn finish(mut self) -> Summary {
        std::fs::write(&self.stop, b"").unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the stream did not stop within 120 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut out = String::new();
        let mut err = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        println!("{out}{err}");
        assert!(
            status.success(),
            "the stream failed ({status}):\n{out}\n{err}"
        );
        let line = out
            .lines()
            .find(|l| l.starts_with("upgrade-stream:"))
            .unwrap_or_else(|| panic!("no summary line:\n{out}"));
        Summary(line.to_string())
    }
}

/// Every file the stream left (the unlinked one is gone) holds `rounds` records of the bench's
/// WRITE pattern, read through a separate CephFS client.
fn check_bytes(lab: &Lab, export: &str, dir: &str, rounds: u64) {
    let m = lab.ceph();
    let d = ceph_dir(&m, &format!("{export}/{dir}"));
    let record: Vec<u8> = (0..RECORD).map(|i| (i % 251) as u8).collect();
    for f in ["f0", "f1", "f2"] {
        let bytes = ceph_read_all(&m, &d, f);
        assert_eq!(
            bytes.len() as u64,
            rounds * RECORD as u64,
            "{dir}/{f}: size after {rounds} rounds"
        );
        for (k, chunk) in bytes.chunks(RECORD).enumerate() {
            assert!(chunk == &record[..], "{dir}/{f}: record {k} differs");
        }
    }
    assert!(
        ceph_lookup(&m, &d, "f3").is_none(),
        "{dir}/f3 was unlinked while open"
    );
}

#[test]
fn a_guest_stream_goes_on_across_a_daemon_upgrade() {
    let lab = Lab::get();
    let name = format!("handover-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let handover = work.join("handover.sock");
    let h = handover.to_str().unwrap();
    let mut old = Daemon::start(
        &lab,
        &work,
        &export,
        &["--quarantine", "off", "--handover", h],
    );
    let socket = old.socket.clone();
    let stream = Stream::start(&socket, &work, "stream");
    // Let it run on the old daemon for a while.
    std::thread::sleep(Duration::from_secs(3));

    // 1. A successor that cannot take the session (it exports another directory): it exits
    //    with an error and the old daemon serves on.
    let other = lab.export_dir(&format!("{name}-other"));
    let bad_log = work.join("refused.log");
    let mut bad = successor(&lab, &socket, &other, &handover, &bad_log);
    let status = wait_exit(&mut bad, 120, "the refused successor", &bad_log);
    let bad_text = std::fs::read_to_string(&bad_log).unwrap();
    assert!(
        !status.success(),
        "a successor of another export must fail:\n{bad_text}"
    );
    assert!(
        bad_text.contains("exports another directory"),
        "the refused successor says why:\n{bad_text}"
    );
    assert!(
        old.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the old daemon must serve on:\n{}",
        old.log_text()
    );
    wait_log(&old.log, "did not take the session; serving on", 30);
    std::thread::sleep(Duration::from_secs(2));

    // 2. The upgrade: a successor with the same options takes the session; the old daemon
    //    exits cleanly and the stream reconnects.
    let new_log = work.join("successor.log");
    let mut new = successor(&lab, &socket, &export, &handover, &new_log);
    let status = wait_exit(old.child.as_mut().unwrap(), 120, "the old daemon", &old.log);
    old.child = None;
    let old_text = std::fs::read_to_string(&old.log).unwrap();
    assert!(
        status.success(),
        "the old daemon's exit ({status}):\n{old_text}"
    );
    assert!(
        old_text.contains("the successor took the session"),
        "{old_text}"
    );
    assert!(old_text.contains("CephFS unmounted"), "{old_text}");
    wait_log(&new_log, "took over the running daemon's session", 60);
    wait_log(&new_log, "vhost-user frontend connected", 60);
    let new_text = std::fs::read_to_string(&new_log).unwrap();
    assert!(
        new_text.contains("0 nodes and 0 handles lost"),
        "every node and handle, the unlinked file's too, is found again:\n{new_text}"
    );
    // Let it run on the successor for a while.
    std::thread::sleep(Duration::from_secs(3));
    let summary = stream.finish();
    assert_eq!(summary.get("errors"), 0);
    assert_eq!(summary.get("reconnects"), 1, "one upgrade, one reconnect");
    assert!(
        summary.get("rounds_after_reconnect") > 0,
        "the stream went on on the successor"
    );
    let rounds = summary.get("rounds");
    check_bytes(&lab, &export, "stream", rounds);

    // The successor stops cleanly too (SIGTERM) and leaves no handover socket behind.
    let _ = Command::new("kill")
        .args(["-TERM", &new.id().to_string()])
        .status();
    let status = wait_exit(&mut new, 30, "the successor", &new_log);
    assert!(
        status.success(),
        "the successor's exit ({status}):\n{}",
        std::fs::read_to_string(&new_log).unwrap_or_default()
    );
    assert!(!handover.exists(), "the handover socket is removed at exit");
}
