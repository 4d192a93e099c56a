//! The daemon evicted by the MDS (an operator's `ceph tell mds.* client evict`, which also
//! blocklists the client): the daemon notices the first ESHUTDOWN libcephfs answers, mounts a
//! new session and brings the guest's session over, so the guest goes on without a restart
//! (`src/fs/recover.rs`).
//!
//! The guest, played by the hostile frontend (exact requests, exact errnos), holds: a file open
//! read-only, a file open for writing with written data, a directory stream, and node ids. After
//! the eviction: node ids still work, the read-only handle reads, the writer's handle answers
//! EIO (its unflushed data went with the session, as with the kernel client's
//! `recover_session=clean`) until released, a new open writes, the directory stream lists, and
//! the recovery is counted in the metrics. A second eviction is recovered too.

use std::ffi::CString;
use std::time::{Duration, Instant};

use crate::common::hostile::{metric, op, scrape_metrics, Answer, Body, Hostile};
use crate::common::{ceph_dir, ceph_read_all, Daemon, Lab};
use ceph_client::{UserPerm, CEPH_STATX_BASIC_STATS};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn write(h: &mut Hostile, node: u64, fh: u64, off: u64, data: &[u8]) -> Answer {
    h.req(
        op::FUSE_WRITE,
        node,
        &Body::new()
            .u64(fh)
            .u64(off)
            .u32(data.len() as u32)
            .u32(0)
            .u64(0)
            .u32(0)
            .u32(0)
            .bytes(data)
            .0,
    )
}

/// The client id the daemon's export session has (its log says it once mounted).
fn client_ids(daemon: &Daemon) -> Vec<String> {
    daemon
        .log_text()
        .lines()
        .filter_map(|l| l.split("client_id=").nth(1))
        .map(|s| s.chars().take_while(char::is_ascii_digit).collect())
        .collect()
}

fn evict(lab: &Lab, id: &str) {
    let out = lab
        .ceph_cli()
        .args(["tell", "mds.*", "client", "evict", &format!("id={id}")])
        .output()
        .expect("run ceph tell mds.* client evict");
    assert!(
        out.status.success(),
        "client evict id={id}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Until the daemon logged `n` recoveries (a precondition, bounded).
fn wait_recovered(daemon: &Daemon, h: &mut Hostile, node: u64, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Requests make the daemon notice: the first one after the eviction gets ESHUTDOWN.
        let a = h.getattr(node);
        let done = daemon
            .log_text()
            .matches("CephFS session recovered after the eviction")
            .count();
        if done >= n && a.error() == Some(0) {
            return;
        }
        assert!(
            a.error() == Some(0) || a.error() == Some(-libc::ESHUTDOWN),
            "GETATTR while recovering: {a:?}"
        );
        assert!(
            Instant::now() < deadline,
            "no recovery within 60 s:\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_evicted_daemon_mounts_a_new_session_and_the_guest_goes_on() {
    let lab = Lab::get();
    let name = format!("evict-{}", std::process::id());
    let export = lab.export_dir(&name);
    let ro_bytes = pattern(8192, 7);
    {
        let m = lab.ceph();
        let dir = ceph_dir(&m, &export);
        let perm = UserPerm::root();
        let (_, _, f) = m
            .create(
                &dir,
                &CString::new("ro").unwrap(),
                0o644,
                libc::O_WRONLY | libc::O_CREAT,
                CEPH_STATX_BASIC_STATS,
                0,
                &perm,
            )
            .unwrap();
        f.write(0, &ro_bytes).unwrap();
        f.close().unwrap();
        for n in ["rw", "later"] {
            let (_, _, f) = m
                .create(
                    &dir,
                    &CString::new(n).unwrap(),
                    0o666,
                    libc::O_WRONLY | libc::O_CREAT,
                    CEPH_STATX_BASIC_STATS,
                    0,
                    &perm,
                )
                .unwrap();
            f.close().unwrap();
        }
        let (sub, _) = m
            .mkdir(
                &dir,
                &CString::new("d").unwrap(),
                0o755,
                CEPH_STATX_BASIC_STATS,
                0,
                &perm,
            )
            .unwrap();
        for i in 0..5 {
            let (_, _, f) = m
                .create(
                    &sub,
                    &CString::new(format!("e{i}")).unwrap(),
                    0o644,
                    libc::O_WRONLY | libc::O_CREAT,
                    CEPH_STATX_BASIC_STATS,
                    0,
                    &perm,
                )
                .unwrap();
            f.close().unwrap();
        }
    }
    let work = lab.scratch(&name);
    let metrics = work.join("metrics.sock");
    let m = metrics.to_str().unwrap();
    let mut daemon = Daemon::start(
        &lab,
        &work,
        &export,
        &["--quarantine", "off", "--metrics-socket", m],
    );
    let mut h = Hostile::connect_without_oracle(&daemon);

    let look = |h: &mut Hostile, name: &[u8]| h.lookup(1, name).entry().expect("LOOKUP").0;
    let ro = look(&mut h, b"ro");
    let ro_fh = h.open(ro, libc::O_RDONLY as u32).fh().expect("OPEN ro");
    assert_eq!(h.read(ro, ro_fh, 0, 8192).payload(), &ro_bytes[..]);
    let rw = look(&mut h, b"rw");
    let rw_fh = h.open(rw, libc::O_RDWR as u32).fh().expect("OPEN rw");
    let first = pattern(4096, 1);
    assert_eq!(write(&mut h, rw, rw_fh, 0, &first).error(), Some(0));
    let d = look(&mut h, b"d");
    let d_fh = h.opendir(d).fh().expect("OPENDIR d");

    let ids = client_ids(&daemon);
    assert_eq!(ids.len(), 1, "one session mounted:\n{}", daemon.log_text());
    evict(&lab, &ids[0]);
    wait_recovered(&daemon, &mut h, ro, 1);

    // Node ids still work; so does the read-only handle, opened again.
    assert_eq!(h.getattr(rw).error(), Some(0));
    let a = h.read(ro, ro_fh, 0, 8192);
    assert_eq!(
        a.error(),
        Some(0),
        "READ through the read-only handle: {a:?}"
    );
    assert_eq!(a.payload(), &ro_bytes[..]);
    // The writer's handle lost its session's unflushed data: EIO until released.
    let a = write(&mut h, rw, rw_fh, 4096, &first);
    assert_eq!(
        a.error(),
        Some(-libc::EIO),
        "WRITE through the lost handle: {a:?}"
    );
    assert_eq!(h.read(rw, rw_fh, 0, 10).error(), Some(-libc::EIO));
    h.release(rw, rw_fh, false);
    // A new open writes, and another client reads it.
    let fh2 = h.open(rw, libc::O_RDWR as u32).fh().expect("OPEN rw again");
    let second = pattern(4096, 2);
    assert_eq!(write(&mut h, rw, fh2, 0, &second).error(), Some(0));
    h.req(op::FUSE_FSYNC, rw, &Body::new().u64(fh2).u32(0).u32(0).0);
    // The directory stream lists its entries.
    let a = h.readdirplus(d, d_fh);
    assert_eq!(a.error(), Some(0), "READDIRPLUS after the recovery: {a:?}");
    let listing = String::from_utf8_lossy(a.payload()).into_owned();
    for i in 0..5 {
        assert!(
            listing.contains(&format!("e{i}")),
            "e{i} listed: {listing:?}"
        );
    }
    // New lookups work.
    let later = look(&mut h, b"later");
    assert_eq!(h.getattr(later).error(), Some(0));
    {
        let m = lab.ceph();
        let dir = ceph_dir(&m, &export);
        assert_eq!(
            ceph_read_all(&m, &dir, "rw"),
            second,
            "the write after the recovery"
        );
    }
    let text = scrape_metrics(&metrics);
    assert_eq!(
        metric(&text, "ceph_virtiofsd_session_recoveries_total"),
        Some(1.0)
    );

    // A second eviction, of the new session (its client id is in the recovery's log line),
    // is recovered too.
    let ids = client_ids(&daemon);
    assert_eq!(
        ids.len(),
        2,
        "the recovery names its session:\n{}",
        daemon.log_text()
    );
    evict(&lab, &ids[1]);
    wait_recovered(&daemon, &mut h, ro, 2);
    let a = h.read(ro, ro_fh, 0, 8192);
    assert_eq!(
        a.payload(),
        &ro_bytes[..],
        "READ after the second recovery: {a:?}"
    );
    let text = scrape_metrics(&metrics);
    assert_eq!(
        metric(&text, "ceph_virtiofsd_session_recoveries_total"),
        Some(2.0)
    );

    drop(h);
    let status = daemon.stop().expect("the daemon ran");
    assert!(
        status.success(),
        "exit after recoveries: {status}\n{}",
        daemon.log_text()
    );
}
