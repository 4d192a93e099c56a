//! A full cluster under a real guest: the OSDs report full while the guest writes. The guest
//! must see ENOSPC itself (not EIO, not a hang), keep what it wrote and synced before, and write
//! again through the same daemon once space is back.
//!
//! It makes the whole lab cluster full (its OSD full ratio goes to almost zero), so it holds the
//! cluster alone (`common::cluster_alone`): no other test sees it, and a guard puts the ratios
//! back however this test ends.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{ceph_dir, ceph_lookup, ceph_read_all, run_guest, Daemon, Lab};

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

#[test]
fn a_full_cluster_reaches_the_guest_as_enospc_and_serving_resumes() {
    let _alone = common::cluster_alone();
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
    let d = ceph_dir(&m, &export);
    let deadline = Instant::now() + Duration::from_secs(1500);
    let wait = |present: bool| {
        while ceph_lookup(&m, &d, "phase1").is_some() != present {
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
    let (line, written) = common::stop_line(&run.console, "FULL-STOP");
    assert!(
        line.contains("No space left on device"),
        "the guest did not see ENOSPC: {line}\n{}",
        run.console
    );
    assert!((3..600).contains(&written), "{line}");
    assert!(run.console.contains("AFTER-FULL ok"), "{}", run.console);
    // Everything synced before the refusal, and the file written after, is intact for another
    // client.
    let m = lab.ceph();
    let d = ceph_dir(&m, &export);
    for i in 0..written {
        let want: Vec<u8> = format!("file {i}\n")
            .bytes()
            .cycle()
            .take(1 << 20)
            .collect();
        assert!(
            ceph_read_all(&m, &d, &format!("f{i}")) == want,
            "f{i}: content differs"
        );
    }
    assert!(ceph_lookup(&m, &d, &format!("f{written}")).is_none());
    let after = ceph_read_all(&m, &d, "after");
    assert_eq!(after.len(), 1 << 20);
    assert!(after.chunks(6).all(|c| b"again\n".starts_with(c)));
}
