//! SB_NOSEC-safe semantics and attribute-cache coherence, seen by a real Linux guest and checked
//! from a second CephFS client.
//!
//! The guest kernel negotiates FUSE_HANDLE_KILLPRIV_V2, sets SB_NOSEC, and from then on relies on
//! the daemon to clear setuid/setgid and security.capability. Everything the guest does here is
//! verified on the Ceph side, through another libcephfs client, as another host would see it.

mod common;

use std::ffi::CString;
use std::time::{Duration, Instant};

use ceph_client::{Inode, Mount, Statx, UserPerm, CEPH_SETATTR_GID, CEPH_SETATTR_MODE};
use ceph_client::{CEPH_SETATTR_UID, CEPH_STATX_BASIC_STATS};
use common::{run_guest, Daemon, Lab};

const CAP_XATTR: &str = "security.capability";
/// A version-2 vfs_cap_data granting nothing: the content is irrelevant, its presence is not.
const CAP_VALUE: [u8; 20] = [0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

struct Side {
    m: Mount,
    dir: Inode,
    perm: UserPerm,
}

impl Side {
    fn new(lab: &Lab, export: &str) -> Side {
        let m = lab.ceph();
        let perm = UserPerm::root();
        let mut dir = m.lookup_root().unwrap();
        for c in export.split('/').filter(|c| !c.is_empty()) {
            let name = CString::new(c).unwrap();
            dir = m
                .lookup(&dir, &name, CEPH_STATX_BASIC_STATS, 0, &perm)
                .unwrap()
                .0;
        }
        Side { m, dir, perm }
    }

    fn file(&self, name: &str, mode: u32, uid: u32, caps: bool) {
        let c = CString::new(name).unwrap();
        let (ino, _, f) = self
            .m
            .create(
                &self.dir,
                &c,
                0o644,
                libc::O_RDWR | libc::O_CREAT,
                CEPH_STATX_BASIC_STATS,
                0,
                &self.perm,
            )
            .unwrap();
        f.write(0, b"initial\n").unwrap();
        let st = Statx {
            stx_mode: mode as u16,
            stx_uid: uid,
            stx_gid: uid,
            ..Default::default()
        };
        self.m
            .setattr(
                &ino,
                &st,
                CEPH_SETATTR_MODE | CEPH_SETATTR_UID | CEPH_SETATTR_GID,
                &self.perm,
            )
            .unwrap();
        if caps {
            let x = CString::new(CAP_XATTR).unwrap();
            self.m
                .setxattr(&ino, &x, &CAP_VALUE, 0, &self.perm)
                .unwrap();
        }
    }

    fn lookup(&self, name: &str) -> Option<Inode> {
        let c = CString::new(name).unwrap();
        self.m
            .lookup(&self.dir, &c, CEPH_STATX_BASIC_STATS, 0, &self.perm)
            .ok()
            .map(|(i, _)| i)
    }

    fn mode(&self, name: &str) -> u32 {
        let ino = self.lookup(name).unwrap();
        let st = self
            .m
            .getattr(&ino, CEPH_STATX_BASIC_STATS, 0, &self.perm)
            .unwrap();
        u32::from(st.stx_mode) & 0o7777
    }

    fn has_caps(&self, name: &str) -> bool {
        let ino = self.lookup(name).unwrap();
        let x = CString::new(CAP_XATTR).unwrap();
        self.m.getxattr(&ino, &x, &mut [], &self.perm).is_ok()
    }

    fn chmod(&self, name: &str, mode: u32) {
        let ino = self.lookup(name).unwrap();
        let st = Statx {
            stx_mode: mode as u16,
            ..Default::default()
        };
        self.m
            .setattr(&ino, &st, CEPH_SETATTR_MODE, &self.perm)
            .unwrap();
    }

    fn append(&self, name: &str, data: &[u8]) {
        let ino = self.lookup(name).unwrap();
        let size = self
            .m
            .getattr(&ino, CEPH_STATX_BASIC_STATS, 0, &self.perm)
            .unwrap()
            .stx_size;
        let f = self.m.open(&ino, libc::O_WRONLY, &self.perm).unwrap();
        f.write(size, data).unwrap();
        f.fsync(false).unwrap();
    }
}

const SCRIPT: &str = r#"#!/bin/sh
cd /mnt
as_tester() { su tester -s /bin/sh -c "$1" || echo "not ok tester: $1"; }
# Writes, truncates and O_TRUNC opens by an unprivileged user (the guest flags them KILL_SUIDGID).
as_tester 'echo more >> w_suid'
as_tester 'echo more >> w_caps'
as_tester 'truncate -s 0 t_suid'
as_tester ': > o_suid'
as_tester 'echo more >> plain'
# root has CAP_FSETID: its write keeps the bits (but not a capability xattr).
echo more >> r_suid
echo more >> r_caps
# chown of a non-directory clears the bits whoever does it, and drops the capability.
chown 1001 c_suid c_caps
# Cache what will change behind the guest's back, and look up a name that does not exist yet.
echo "COH-BEFORE $(stat -c '%a %s' coh)"
ls newfile 2>/dev/null && echo "not ok newfile exists too early"
as_tester 'echo first >> late'
stat late > /dev/null
touch ready1
i=0
while [ ! -e go1 ]; do sleep 0.2; i=$((i+1)); [ $i -gt 3000 ] && { echo "not ok no go1"; exit 1; }; done
# Another client set setuid on `late` after the guest cached it: the guest's next write must
# still lose it.
as_tester 'echo second >> late'
# Past the 1 s TTL of cache=auto the other client's changes are visible.
sleep 2
echo "COH-AFTER $(stat -c '%a %s' coh)"
echo "NEWFILE=$(cat newfile 2>&1)"
touch done1
sync
exit 0
"#;

#[test]
fn killpriv_v2_and_ttl_coherence_seen_from_another_client() {
    let lab = Lab::get();
    let name = format!("sb-nosec-{}", std::process::id());
    let export = lab.export_dir(&name);
    let host = Side::new(&lab, &export);
    host.file("w_suid", 0o6755, 1000, false);
    host.file("w_caps", 0o755, 1000, true);
    host.file("t_suid", 0o6755, 1000, false);
    host.file("o_suid", 0o6755, 1000, false);
    host.file("plain", 0o644, 1000, false);
    host.file("r_suid", 0o6755, 1000, false);
    host.file("r_caps", 0o755, 1000, true);
    host.file("c_suid", 0o6755, 1000, false);
    host.file("c_caps", 0o755, 1000, true);
    host.file("late", 0o755, 1000, false);
    host.file("coh", 0o644, 1000, false);

    let work = lab.scratch(&name);
    let daemon = Daemon::start(&lab, &work, &export, &["--cache", "auto"]);

    // The guest runs in its own thread; this one plays the other CephFS client.
    let lab2 = Lab::get();
    let work2 = work.clone();
    let guest = std::thread::spawn(move || {
        let d = daemon;
        let run = run_guest(&lab2, &work2, &d, SCRIPT, &[], 900);
        (run, d)
    });
    let deadline = Instant::now() + Duration::from_secs(900);
    while host.lookup("ready1").is_none() {
        assert!(
            Instant::now() < deadline && !guest.is_finished(),
            "the guest never reached ready1"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    host.chmod("late", 0o4755);
    host.chmod("coh", 0o600);
    host.append("coh", &[b'x'; 100]);
    let c = CString::new("newfile").unwrap();
    let (_, _, f) = host
        .m
        .create(
            &host.dir,
            &c,
            0o644,
            libc::O_WRONLY | libc::O_CREAT,
            CEPH_STATX_BASIC_STATS,
            0,
            &host.perm,
        )
        .unwrap();
    f.write(0, b"hello").unwrap();
    f.fsync(false).unwrap();
    drop(f);
    let go = CString::new("go1").unwrap();
    host.m
        .create(
            &host.dir,
            &go,
            0o644,
            libc::O_WRONLY | libc::O_CREAT,
            CEPH_STATX_BASIC_STATS,
            0,
            &host.perm,
        )
        .unwrap();
    let (run, daemon) = guest.join().unwrap();
    assert!(
        host.lookup("done1").is_some(),
        "the guest finished its script"
    );

    let not_ok = run.not_ok();
    assert!(
        not_ok.is_empty(),
        "guest-side failures: {not_ok:?}\n{}",
        daemon.log_text()
    );
    assert_eq!(run.code(), 0);

    // Unprivileged write, truncate and O_TRUNC: setuid and (group-exec) setgid are gone.
    assert_eq!(host.mode("w_suid"), 0o755, "write by uid 1000");
    assert_eq!(host.mode("t_suid"), 0o755, "truncate by uid 1000");
    assert_eq!(host.mode("o_suid"), 0o755, "open(O_TRUNC) by uid 1000");
    // The capability goes with any write.
    assert!(
        !host.has_caps("w_caps"),
        "security.capability after a write"
    );
    assert!(
        !host.has_caps("r_caps"),
        "security.capability after root's write"
    );
    // Root keeps the bits (CAP_FSETID).
    assert_eq!(
        host.mode("r_suid"),
        0o6755,
        "root's write keeps setuid/setgid"
    );
    // chown clears the bits and the capability.
    assert_eq!(host.mode("c_suid"), 0o755, "chown");
    assert!(!host.has_caps("c_caps"), "security.capability after chown");
    // A plain file is left as it was.
    assert_eq!(host.mode("plain"), 0o644);
    // setuid set by another client after the guest had cached the inode is still cleared.
    assert_eq!(
        host.mode("late"),
        0o755,
        "setuid set behind the guest's back"
    );

    // Coherence: the other client's changes are visible in the guest once the TTL has run out.
    let after = run
        .console
        .lines()
        .find_map(|l| l.strip_prefix("COH-AFTER "))
        .expect("COH-AFTER line");
    assert_eq!(
        after.trim(),
        "600 108",
        "mode and size as the other client left them"
    );
    assert!(
        run.console.contains("NEWFILE=hello"),
        "a file created by the other client is visible after the negative-entry TTL"
    );
}
