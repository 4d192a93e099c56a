//! systemd's notification protocol, as the daemon speaks it to `NOTIFY_SOCKET` (the unit is
//! `Type=notify` with `WatchdogSec=`): `READY=1` only once the vhost-user socket listens and
//! CephFS is mounted (a QEMU started when `systemctl start` returns finds the socket),
//! `WATCHDOG=1` pings while it serves, `STOPPING=1` on SIGTERM. The datagrams are received
//! here, on the lab cluster, from the daemon binary. (On main the daemon sends nothing.) The
//! unit under real systemd: tests/package_install.rs.

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::Lab;

/// The next notification, or None after `secs` without one.
fn next(sock: &UnixDatagram, secs: u64) -> Option<String> {
    sock.set_read_timeout(Some(Duration::from_secs(secs)))
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[test]
fn ready_once_listening_and_mounted_then_watchdog_pings_then_stopping() {
    let lab = Lab::get();
    let name = format!("notify-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let notify = work.join("notify.sock");
    let sock = UnixDatagram::bind(&notify).unwrap();
    let socket = work.join("vhost-fs.sock");
    let log = work.join("daemon.log");
    let logf = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(common::daemon_binary())
        .arg("--socket-path")
        .arg(&socket)
        .arg("--ceph-conf")
        .arg(&lab.conf)
        .args(["--client-id", &lab.client_id, "--ceph-root", &export])
        // As the unit runs it: a frontend that hangs up does not end the daemon.
        .args(["--log-level", "info", "--keep-serving"])
        .env("NOTIFY_SOCKET", &notify)
        // A short period, so that pings come while the test waits (a ping a quarter period).
        .env("WATCHDOG_USEC", "400000")
        .stdin(Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .spawn()
        .expect("start ceph-virtiofsd");
    let pid = child.id();
    let daemon_log = || std::fs::read_to_string(&log).unwrap_or_default();
    // SIGTERM if an assertion fails before the test stops the daemon itself.
    struct Stop(Option<u32>);
    impl Drop for Stop {
        fn drop(&mut self) {
            if let Some(pid) = self.0 {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
        }
    }
    let mut stop = Stop(Some(pid));

    // The first notification is READY=1, and by then the socket listens and CephFS is mounted.
    let first = next(&sock, 60).unwrap_or_else(|| panic!("no notification:\n{}", daemon_log()));
    assert!(
        first.lines().any(|l| l == "READY=1"),
        "first notification {first:?}\n{}",
        daemon_log()
    );
    assert!(
        first.lines().any(|l| l == format!("MAINPID={pid}")),
        "{first:?}"
    );
    assert!(socket.exists(), "READY=1 before the socket exists");
    let text = daemon_log();
    assert!(
        text.contains("CephFS mounted"),
        "READY=1 before the mount:\n{text}"
    );
    std::os::unix::net::UnixStream::connect(&socket)
        .unwrap_or_else(|e| panic!("the socket does not accept after READY=1: {e}"));

    // Pings while serving (bounded wait, nothing timed).
    let mut pings = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while pings < 3 {
        let m = next(&sock, 10).unwrap_or_else(|| panic!("no ping:\n{}", daemon_log()));
        if m == "WATCHDOG=1" {
            pings += 1;
        }
        assert!(
            Instant::now() < deadline,
            "only {pings} pings:\n{}",
            daemon_log()
        );
    }

    // SIGTERM: STOPPING=1 (pings that were already on their way may come first).
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    loop {
        let m = next(&sock, 30).unwrap_or_else(|| panic!("no STOPPING=1:\n{}", daemon_log()));
        if m.lines().any(|l| l == "STOPPING=1") {
            break;
        }
        assert_eq!(m, "WATCHDOG=1", "unexpected notification");
    }
    let status = child.wait().unwrap();
    stop.0 = None;
    assert!(status.success(), "exit {status}:\n{}", daemon_log());
}

#[test]
fn without_notify_socket_nothing_is_sent_and_the_daemon_serves() {
    // The daemon of every other test: no NOTIFY_SOCKET (not started by systemd), no watchdog.
    let lab = Lab::get();
    let name = format!("notify-none-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let daemon = common::Daemon::start(&lab, &work, &export, &[]);
    assert!(!daemon.log_text().contains("systemd watchdog on"));
}
