//! What newer guests ask for (issue #33), each in a real guest on Debian forky's kernel (the
//! newest the lab fetches), checked through another CephFS client:
//!
//! - FUSE_STATX: a statx(2) asking for the birth time gets CephFS's, the one another client's
//!   statx reports through libcephfs.
//! - Backward reads: a reverse 4 KiB-stride scan of a file another client wrote (which the
//!   daemon reads behind, src/fs/data.rs) reads its bytes, as a forward scan does.
//! - FUSE_TMPFILE: O_TMPFILE files linked by name (read back by another client), refused a
//!   link with O_EXCL, and gone when closed (nothing left in CephFS).
//! - FUSE_SETXATTR_EXT: negotiated, and xattrs set with the longer request read back by
//!   another client.

mod common;

use std::ffi::CString;

use ceph_client::{UserPerm, CEPH_STATX_BASIC_STATS, CEPH_STATX_BTIME};
use common::{ceph_dir, ceph_lookup, ceph_read_all, run_guest_env, Daemon, Lab};

/// The newest kernel: these features are Linux 6.6+ (STATX) and later.
const KERNEL: [(&str, &str); 1] = [("GUEST_KERNEL_SUITE", "forky")];

/// `STATX <path> mask=0x<hex> btime=<sec>.<nsec> ino=<ino>` lines of tests/guest/statx-btime.c.
fn statx_line<'a>(console: &'a str, path: &str) -> (u32, &'a str) {
    let line = console
        .lines()
        .find(|l| l.starts_with(&format!("STATX {path} ")))
        .unwrap_or_else(|| panic!("no STATX line for {path}:\n{console}"));
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {line}"))
    };
    let mask = u32::from_str_radix(field("mask=0x"), 16).unwrap();
    (mask, field("btime="))
}

#[test]
fn statx_in_the_guest_reports_the_birth_time_cephfs_keeps() {
    let lab = Lab::get();
    let name = format!("feat-statx-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let daemon = Daemon::start(&lab, &work, &export, &[]);
    // A file and a directory made in the guest; a second statx after a write, which moves
    // mtime and ctime but not the birth time.
    let script = "#!/bin/sh\n\
        echo one > /mnt/f && mkdir /mnt/d || exit 1\n\
        /opt/statx-btime /mnt/f /mnt/d || exit 2\n\
        sleep 1; echo two >> /mnt/f\n\
        /opt/statx-btime /mnt/f | sed 's/^STATX /AGAIN /'\n";
    let adds = [(lab.guest_bin.join("statx-btime"), "/opt/statx-btime")];
    let run = run_guest_env(&lab, &work, &daemon, script, &adds, 600, &KERNEL);
    assert_eq!(run.code(), 0, "guest verdict (console above)");
    let m = lab.ceph();
    let dir = ceph_dir(&m, &export);
    for (path, name) in [("/mnt/f", "f"), ("/mnt/d", "d")] {
        let (mask, btime) = statx_line(&run.console, path);
        assert!(
            mask & 0x800 != 0,
            "{path}: the guest's statx has no birth time (mask {mask:#x})"
        );
        let (ino, _) = ceph_lookup(&m, &dir, name).unwrap();
        let st = m
            .getattr(
                &ino,
                CEPH_STATX_BASIC_STATS | CEPH_STATX_BTIME,
                0,
                &UserPerm::root(),
            )
            .unwrap();
        assert!(
            st.stx_mask & CEPH_STATX_BTIME != 0,
            "libcephfs has no btime"
        );
        let want = format!("{}.{:09}", st.stx_btime.tv_sec, st.stx_btime.tv_nsec);
        assert_eq!(
            btime, want,
            "{path}: birth time in the guest vs another client"
        );
        println!("{path}: birth time {btime} in the guest and through libcephfs");
    }
    let again = run
        .console
        .lines()
        .find(|l| l.starts_with("AGAIN /mnt/f "))
        .expect("second statx");
    let (_, first) = statx_line(&run.console, "/mnt/f");
    assert!(
        again.contains(&format!("btime={first} ")),
        "a write moved the birth time: {again}"
    );
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn a_reverse_stride_scan_in_the_guest_reads_what_another_client_wrote() {
    let lab = Lab::get();
    let name = format!("feat-revread-{}", std::process::id());
    let export = lab.export_dir(&name);
    // 16 MiB and a tail that is not a whole block: sixteen read-behind windows.
    let len = (16 << 20) + 777;
    let data: Vec<u8> = (0..len)
        .map(|i: usize| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    {
        let m = lab.ceph();
        let d = ceph_dir(&m, &export);
        let n = CString::new("big").unwrap();
        let (_, _, f) = m
            .create(
                &d,
                &n,
                0o644,
                libc::O_WRONLY | libc::O_CREAT,
                CEPH_STATX_BASIC_STATS,
                0,
                &UserPerm::root(),
            )
            .unwrap();
        let mut off = 0;
        while off < data.len() {
            off += f.write(off as u64, &data[off..]).unwrap();
        }
        f.fsync(false).unwrap();
    }
    let work = lab.scratch(&name);
    let daemon = Daemon::start(&lab, &work, &export, &[]);
    let script = "#!/bin/sh\n/opt/revread /mnt/big\n";
    let adds = [(lab.guest_bin.join("revread"), "/opt/revread")];
    let run = run_guest_env(&lab, &work, &daemon, script, &adds, 900, &KERNEL);
    assert_eq!(run.code(), 0, "guest verdict (console above)");
    let want = format!("fnv={:016x} bytes={len}", fnv(&data));
    for tag in ["REVREAD", "FWDREAD"] {
        let line = run
            .console
            .lines()
            .find(|l| l.starts_with(tag))
            .unwrap_or_else(|| panic!("no {tag} line"));
        assert_eq!(line, format!("{tag} {want}"), "{tag}: the bytes differ");
    }
}

/// Names in `dir` through another CephFS client ("." and ".." left out).
fn ceph_names(m: &ceph_client::Mount, dir: &ceph_client::Inode) -> Vec<String> {
    let mut d = m.opendir(dir, &UserPerm::root()).unwrap();
    let mut names = Vec::new();
    while let Some(e) = d.readdirplus(CEPH_STATX_BASIC_STATS, 0, false).unwrap() {
        let n = String::from_utf8_lossy(&e.name[..]).into_owned();
        if n != "." && n != ".." {
            names.push(n);
        }
    }
    names.sort();
    names
}

/// O_TMPFILE (FUSE_TMPFILE, src/fs/tmpfile.rs), by tests/guest/tmpfile.c in the guest: a
/// tmpfile shows nlink 0, is linked by `linkat(AT_EMPTY_PATH)` and through /proc/self/fd, an
/// O_EXCL one cannot be (ENOENT), one closed without a link is gone, and the daemon's private
/// name never shows in the guest's listing. Another CephFS client then reads the data at the
/// linked names, and finds nothing else in the directory: no private name left behind.
#[test]
fn o_tmpfile_in_the_guest_is_linked_by_name_and_gone_when_closed() {
    let lab = Lab::get();
    let name = format!("feat-tmpfile-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let daemon = Daemon::start(&lab, &work, &export, &[]);
    let script = "#!/bin/sh\nmkdir /mnt/t || exit 1\n/opt/tmpfile /mnt/t\n";
    let adds = [(lab.guest_bin.join("tmpfile"), "/opt/tmpfile")];
    let run = run_guest_env(&lab, &work, &daemon, script, &adds, 600, &KERNEL);
    assert!(
        run.console.contains("TMPFILE PASSED"),
        "guest checks failed (console above)"
    );
    assert_eq!(run.code(), 0, "guest verdict (console above)");
    let m = lab.ceph();
    let dir = ceph_dir(&m, &format!("{export}/t"));
    assert_eq!(
        ceph_names(&m, &dir),
        ["linked", "linked2"],
        "the directory holds the linked names and nothing else"
    );
    assert_eq!(
        ceph_read_all(&m, &dir, "linked"),
        b"linked by AT_EMPTY_PATH\n"
    );
    assert_eq!(ceph_read_all(&m, &dir, "linked2"), b"linked by /proc\n");
}

/// FUSE_SETXATTR_EXT: forky's kernel offers it, the daemon takes it (its log says so), and
/// every SETXATTR then carries the longer `fuse_setxattr_in` the daemon decodes itself
/// (src/server.rs): xattrs set in the guest (tests/guest/setxattr.c, with XATTR_CREATE and
/// XATTR_REPLACE) are what another CephFS client reads.
#[test]
fn setxattr_ext_in_the_guest_sets_what_another_client_reads() {
    let lab = Lab::get();
    let name = format!("feat-setxattr-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let daemon = Daemon::start(&lab, &work, &export, &[]);
    let script = "#!/bin/sh\necho data > /mnt/x || exit 1\n/opt/setxattr /mnt/x\n";
    let adds = [(lab.guest_bin.join("setxattr"), "/opt/setxattr")];
    let run = run_guest_env(&lab, &work, &daemon, script, &adds, 600, &KERNEL);
    assert!(
        run.console.contains("SETXATTR PASSED"),
        "guest checks failed (console above)"
    );
    assert_eq!(run.code(), 0, "guest verdict (console above)");
    assert!(
        daemon.log_text().contains("setxattr_ext=true"),
        "the daemon did not negotiate SETXATTR_EXT with forky's kernel"
    );
    let m = lab.ceph();
    let dir = ceph_dir(&m, &export);
    let (ino, _) = ceph_lookup(&m, &dir, "x").unwrap();
    let get = |n: &str| {
        let mut buf = vec![0u8; 8192];
        let k = m
            .getxattr(&ino, &CString::new(n).unwrap(), &mut buf, &UserPerm::root())
            .unwrap_or_else(|e| panic!("getxattr {n}: {e}"));
        buf.truncate(k);
        buf
    };
    assert_eq!(get("user.a"), b"value two");
    assert_eq!(get("user.big"), vec![b'b'; 4000]);
}
