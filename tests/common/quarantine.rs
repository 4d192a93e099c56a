//! Helpers of the quarantine tests (`tests/quarantine/`).

use std::io;
use std::process::Command;
use std::time::{Duration, Instant};

use ceph_client::{Mount, UserPerm, CEPH_STATX_BASIC_STATS};
use ceph_virtiofsd::fs::CephFs;
use ceph_virtiofsd::quarantine::QuarantineConfig;
use fuse_backend_rs::api::filesystem::FileSystem;

use super::{c, ctx, Lab};

/// The propagation bound the tests' daemons run with.
pub const BOUND: Duration = Duration::from_millis(1000);

pub fn qcfg() -> QuarantineConfig {
    QuarantineConfig {
        propagation: BOUND,
        ..QuarantineConfig::default()
    }
}

/// LOOKUP every component of `path` from the export root, as root.
pub fn walk(fs: &CephFs, path: &str) -> io::Result<u64> {
    let mut id = 1;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        id = fs.lookup(&ctx(0, 0), id, &c(part))?.inode;
    }
    Ok(id)
}

/// `ceph-virtiofsd quarantine ACTION PATH` against the lab cluster; its stdout.
pub fn run_cmd(lab: &Lab, action: &str, path: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ceph-virtiofsd"))
        .args(["quarantine", action, path, "--ceph-conf"])
        .arg(&lab.conf)
        .args(["--client-id", &lab.client_id])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "quarantine {action} {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Wait until `f` holds (at most 20 s; the figure is printed, never asserted).
pub fn wait_for(what: &str, f: impl FnMut() -> bool) -> Duration {
    wait_up_to(Duration::from_secs(20), what, f)
}

/// Wait until `f` holds, at most `limit`.
pub fn wait_up_to(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what}: never");
        std::thread::sleep(Duration::from_millis(10));
    }
    let d = t.elapsed();
    println!("{what}: after {} ms", d.as_millis());
    d
}

/// mkdir -p with libcephfs, mode 0777.
pub fn mkdirs(m: &Mount, path: &str) {
    let perm = UserPerm::root();
    let mut cur = m.lookup_root().unwrap();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        let name = c(part);
        cur = match m.lookup(&cur, &name, 0, 0, &perm) {
            Ok((i, _)) => i,
            Err(_) => match m.mkdir(&cur, &name, 0o777, CEPH_STATX_BASIC_STATS, 0, &perm) {
                Ok((i, _)) => i,
                // Tests run in parallel: another one may have made it since the lookup.
                Err(e) if e.errno() == libc::EEXIST => {
                    m.lookup(&cur, &name, 0, 0, &perm).unwrap().0
                }
                Err(e) => panic!("mkdir {part} of {path}: {e}"),
            },
        };
    }
}
