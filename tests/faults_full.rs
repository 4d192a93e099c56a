//! A full cluster under a real guest: the OSDs report full while the guest writes. The guest
//! must see ENOSPC itself (not EIO, not a hang), keep what it wrote and synced before, and write
//! again through the same daemon once space is back.
//!
//! A binary of its own because it makes the whole lab cluster full (its OSD full ratio goes to
//! almost zero): cargo runs test binaries one after another, so no other test sees it, and a
//! guard puts the ratios back however this test ends.

mod common;

use std::ffi::CString;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ceph_client::{Inode, Mount, UserPerm, CEPH_STATX_BASIC_STATS};
use common::{run_guest, Daemon, Lab};

/// The cluster's OSD ratios, set with the ceph CLI (in an order the monitor accepts).
fn set_ratios(conf: &Path, nearfull: &str, backfillfull: &str, full: &str) {
    let steps: [(&str, &str); 3] = if full.starts_with("0.0") {
        [
            ("set-nearfull-ratio", nearfull),
            ("set-backfillfull-ratio", backfillfull),
            ("set-full-ratio", full),
        ]
    } else {
        [
            ("set-full-ratio", full),
            ("set-backfillfull-ratio", backfillfull),
            ("set-nearfull-ratio", nearfull),
        ]
    };
    for (cmd, v) in steps {
        let st = Command::new("ceph")
            .arg("-c")
            .arg(conf)
            .args(["osd", cmd, v])
            .output()
            .expect("run the ceph CLI");
        assert!(st.status.success(), "ceph osd {cmd} {v}: {st:?}");
    }
}

/// Puts Ceph's default ratios back when dropped (also when the test panics).
struct Unfill<'a>(&'a Path);

impl Drop for Unfill<'_> {
    fn drop(&mut self) {
        set_ratios(self.0, "0.85", "0.9", "0.95");
    }
}

/// The directory at `path` (from the CephFS root).
fn dir(m: &Mount, path: &str) -> Inode {
    let mut cur = m.lookup_root().unwrap();
    for c in path.split('/').filter(|c| !c.is_empty()) {
        cur = lookup(m, &cur, c).unwrap_or_else(|| panic!("{path}: no {c}"));
    }
    cur
}

fn lookup(m: &Mount, parent: &Inode, name: &str) -> Option<Inode> {
    let n = CString::new(name).unwrap();
    m.lookup(parent, &n, CEPH_STATX_BASIC_STATS, 0, &UserPerm::root())
        .ok()
        .map(|(i, _)| i)
}

fn read_all(m: &Mount, parent: &Inode, name: &str) -> Vec<u8> {
    let perm = UserPerm::root();
    let n = CString::new(name).unwrap();
    let (ino, st) = m
        .lookup(parent, &n, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    let f = m.open(&ino, libc::O_RDONLY, &perm).unwrap();
    let mut buf = vec![0u8; st.stx_size as usize];
    let mut off = 0;
    while off < buf.len() {
        let k = f.read(off as u64, &mut buf[off..]).unwrap();
        if k == 0 {
            break;
        }
        off += k;
    }
    buf.truncate(off);
    buf
}

#[test]
fn a_full_cluster_reaches_the_guest_as_enospc_and_serving_resumes() {
    let lab = Lab::get();
    let name = format!("fault-full-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let daemon = Daemon::start(&lab, &work, &export, &[]);
    // Each file holds its own number, repeated, so a mix-up between files shows. `phase1` tells
    // the host to fill the cluster; its removal (an unlink, which a full cluster allows) tells
    // it the guest was refused.
    let script = "#!/bin/sh\n\
        i=0\n\
        while [ $i -lt 3 ]; do\n\
          yes \"file $i\" | head -c 1048576 | dd of=/mnt/f$i bs=65536 conv=fsync 2>/dev/null || { echo \"not ok f$i\"; exit 1; }\n\
          i=$((i+1))\n\
        done\n\
        touch /mnt/phase1\n\
        err=none\n\
        while [ $i -lt 600 ]; do\n\
          yes \"file $i\" | head -c 1048576 > /tmp/blob\n\
          if ! dd if=/tmp/blob of=/mnt/f$i bs=65536 conv=fsync 2>/tmp/dd.err; then\n\
            err=$(tr '\\n' ' ' < /tmp/dd.err); rm -f /mnt/f$i; break\n\
          fi\n\
          i=$((i+1)); sleep 1\n\
        done\n\
        echo \"FULL-STOP written=$i error=$err\"\n\
        rm -f /mnt/phase1 || echo 'not ok: unlink on a full cluster'\n\
        n=0\n\
        until yes again | head -c 1048576 | dd of=/mnt/after bs=65536 conv=fsync 2>/dev/null; do\n\
          n=$((n+1)); [ $n -gt 300 ] && { echo 'not ok: no write after space came back'; exit 1; }\n\
          rm -f /mnt/after; sleep 1\n\
        done\n\
        echo \"AFTER-FULL ok after $n retries\"\n";
    let lab2 = Lab::get();
    let work2 = work.clone();
    let guest = std::thread::spawn(move || {
        let run = run_guest(&lab2, &work2, &daemon, script, &[], 1500);
        (run, daemon)
    });
    let m = lab.ceph();
    let d = dir(&m, &export);
    let deadline = Instant::now() + Duration::from_secs(1500);
    let wait = |present: bool| {
        while lookup(&m, &d, "phase1").is_some() != present {
            assert!(
                Instant::now() < deadline && !guest.is_finished(),
                "the guest never got to the next phase (phase1 present: {})",
                !present
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait(true);
    {
        let _unfill = Unfill(&lab.conf);
        set_ratios(&lab.conf, "0.000005", "0.000008", "0.00001");
        wait(false);
    }
    let (run, daemon) = guest.join().unwrap();
    assert_eq!(run.code(), 0, "guest verdict\n{}", daemon.log_text());
    let line = run
        .console
        .lines()
        .find(|l| l.contains("FULL-STOP"))
        .unwrap_or_else(|| panic!("no FULL-STOP line:\n{}", run.console));
    assert!(
        line.contains("No space left on device"),
        "the guest did not see ENOSPC: {line}\n{}",
        run.console
    );
    let written: usize = line
        .split("written=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!((3..600).contains(&written), "{line}");
    assert!(run.console.contains("AFTER-FULL ok"), "{}", run.console);
    // Everything synced before the refusal, and the file written after, is intact for another
    // client.
    let m = lab.ceph();
    let d = dir(&m, &export);
    for i in 0..written {
        let want: Vec<u8> = format!("file {i}\n")
            .bytes()
            .cycle()
            .take(1 << 20)
            .collect();
        assert!(
            read_all(&m, &d, &format!("f{i}")) == want,
            "f{i}: content differs"
        );
    }
    assert!(lookup(&m, &d, &format!("f{written}")).is_none());
    let after = read_all(&m, &d, "after");
    assert_eq!(after.len(), 1 << 20);
    assert!(after.chunks(6).all(|c| b"again\n".starts_with(c)));
}
