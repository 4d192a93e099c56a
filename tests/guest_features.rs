//! What newer guests ask for (issue #33), each in a real guest on Debian forky's kernel (the
//! newest the lab fetches), checked through another CephFS client:
//!
//! - FUSE_STATX: a statx(2) asking for the birth time gets CephFS's, the one another client's
//!   statx reports through libcephfs.
//! - Backward reads: a reverse 4 KiB-stride scan of a file another client wrote (which the
//!   daemon reads behind, src/fs/data.rs) reads its bytes, as a forward scan does.
//! - FUSE_DIRECT_IO_ALLOW_MMAP: with `--cache never` a `MAP_SHARED` mapping written in the
//!   guest reaches CephFS (another client reads the bytes); a kernel that does not offer the
//!   flag (Debian bookworm's 6.1) still mounts and serves, its shared mmap failing ENODEV.
//! - POSIX ACLs (`--posix-acl`): an ACL set in the guest denies the user it names there and
//!   through another CephFS client (libcephfs with `client_acl_type=posix_acl`), a default ACL
//!   is inherited, and chmod moves the mask.
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

/// tests/guest/features.c, the guest's tool for these tests.
fn features(lab: &Lab) -> [(std::path::PathBuf, &'static str); 1] {
    [(lab.guest_bin.join("features"), "/opt/features")]
}

#[test]
fn a_shared_mmap_on_cache_never_is_written_back_and_read_by_another_client() {
    let lab = Lab::get();
    let text = format!("written through a shared mapping {}", std::process::id());
    for (suite, offered) in [("forky", true), ("bookworm", false)] {
        let name = format!("feat-mmap-{suite}-{}", std::process::id());
        let export = lab.export_dir(&name);
        let work = lab.scratch(&name);
        let daemon = Daemon::start(&lab, &work, &export, &["--cache", "never"]);
        let script = format!(
            "#!/bin/sh\n\
             /opt/features mmap-write /mnt/m '{text}'\n\
             echo plain > /mnt/p && cat /mnt/p | sed 's/^/READ /'\n"
        );
        let env = [("GUEST_KERNEL_SUITE", suite)];
        let run = run_guest_env(&lab, &work, &daemon, &script, &features(&lab), 600, &env);
        assert_eq!(run.code(), 0, "{suite}: guest verdict (console above)");
        assert!(
            run.console.contains("READ plain"),
            "{suite}: plain I/O on cache=never"
        );
        let m = lab.ceph();
        let dir = ceph_dir(&m, &export);
        if offered {
            assert!(
                run.console.contains("MMAP ok"),
                "{suite}: shared mmap on cache=never"
            );
            let got = common::ceph_read_all(&m, &dir, "m");
            assert_eq!(
                String::from_utf8_lossy(&got),
                text,
                "{suite}: what another client reads"
            );
            assert!(
                daemon
                    .log_text()
                    .contains("flags fuse-backend-rs does not know, negotiated by the daemon"),
                "{suite}: the INIT reply was not extended:\n{}",
                daemon.log_text()
            );
        } else {
            assert!(
                run.console.contains(&format!("MMAP err={}", libc::ENODEV)),
                "{suite}: a kernel without DIRECT_IO_ALLOW_MMAP refuses shared mmap"
            );
        }
    }
}

/// The ACL of tests/guest/features.c's SPEC as the `system.posix_acl_*` xattr value.
fn acl_xattr(spec: &str) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for e in spec.split(',') {
        let mut f = e.split(':');
        let (kind, id, perm) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        let tag: u16 = match (kind, id.is_empty()) {
            ("u", true) => 1,
            ("u", false) => 2,
            ("g", true) => 4,
            ("g", false) => 8,
            ("m", _) => 0x10,
            _ => 0x20,
        };
        let bits = perm
            .chars()
            .zip([4u16, 2, 1])
            .filter(|(c, _)| *c != '-')
            .map(|(_, b)| b)
            .sum::<u16>();
        let id = if id.is_empty() {
            u32::MAX
        } else {
            id.parse().unwrap()
        };
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&bits.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

#[test]
fn a_posix_acl_set_in_the_guest_denies_its_user_there_and_through_another_client() {
    let lab = Lab::get();
    let name = format!("feat-acl-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let daemon = Daemon::start(&lab, &work, &export, &["--posix-acl"]);
    let deny = "u::rw-,u:1234:---,g::r--,m::r--,o::r--";
    let inherit = "u::rwx,u:1234:---,g::r-x,m::r-x,o::r-x";
    let script = format!(
        "#!/bin/sh\n\
         F=/opt/features\n\
         echo secret > /mnt/f && chmod 644 /mnt/f && cp /mnt/f /mnt/g || exit 1\n\
         $F setacl /mnt/f access {deny}\n\
         $F getacl /mnt/f access\n\
         $F as 1234 1234 open /mnt/f r\n\
         $F as 1235 1235 open /mnt/f r\n\
         mkdir /mnt/d && chmod 755 /mnt/d\n\
         $F setacl /mnt/d default {inherit}\n\
         $F as 1235 1235 create /mnt/d/new\n\
         chmod 777 /mnt/d; $F as 1235 1235 create /mnt/d/new\n\
         $F getacl /mnt/d/new access\n\
         $F as 1234 1234 open /mnt/d/new r\n\
         $F setacl /mnt/g access {deny}\n\
         chmod 640 /mnt/g && $F stat /mnt/g && $F getacl /mnt/g access\n\
         $F as 1235 1235 open /mnt/g r\n\
         exit 0\n"
    );
    let run = run_guest_env(&lab, &work, &daemon, &script, &features(&lab), 600, &KERNEL);
    assert_eq!(run.code(), 0, "guest verdict (console above)");
    let has = |line: &str| {
        assert!(
            run.console.lines().any(|l| l.trim_end() == line),
            "no line {line:?} in the guest's output (console above)"
        );
    };
    has("SETACL ok");
    has(&format!("GETACL /mnt/f {deny}"));
    has(&format!("OPEN 1234 /mnt/f err={}", libc::EACCES));
    has("OPEN 1235 /mnt/f ok");
    // The directory is 755: its default ACL gives 1235 nothing more; made 777, it creates.
    has(&format!("CREATE 1235 /mnt/d/new err={}", libc::EACCES));
    has("CREATE 1235 /mnt/d/new ok");
    // Inherited from the default ACL; the creation mode (0644) masks the owner, the mask and
    // other, not the group entry.
    has("GETACL /mnt/d/new u::rw-,u:1234:---,g::r-x,m::r--,o::r--");
    has(&format!("OPEN 1234 /mnt/d/new err={}", libc::EACCES));
    // chmod 640 sets the mask to the group bits (r--) and other to nothing.
    has("STAT /mnt/g mode=640 uid=0 gid=0");
    has("GETACL /mnt/g u::rw-,u:1234:---,g::r--,m::r--,o::---");
    has(&format!("OPEN 1235 /mnt/g err={}", libc::EACCES));

    // Another CephFS client that enforces ACLs sees the same ACL and is denied too.
    let m = ceph_client::MountBuilder::new(Some(&lab.client_id))
        .and_then(|b| b.conf_read_file(Some(&lab.conf)))
        .and_then(|b| b.conf_set("client_acl_type", "posix_acl"))
        .and_then(|b| b.mount("/"))
        .expect("mount CephFS with ACLs");
    let dir = ceph_dir(&m, &export);
    let (f, _) = ceph_lookup(&m, &dir, "f").unwrap();
    let acl = CString::new("system.posix_acl_access").unwrap();
    let mut buf = vec![0u8; 256];
    let n = m.getxattr(&f, &acl, &mut buf, &UserPerm::root()).unwrap();
    assert_eq!(
        &buf[..n],
        &acl_xattr(deny)[..],
        "the ACL another client reads"
    );
    let as_user = |uid| UserPerm::new(uid, uid, &[]);
    let denied = m.open(&f, libc::O_RDONLY, &as_user(1234));
    assert_eq!(
        denied.err().map(|e| e.errno()),
        Some(libc::EACCES),
        "uid 1234 through another client"
    );
    assert!(
        m.open(&f, libc::O_RDONLY, &as_user(1235)).is_ok(),
        "uid 1235 through another client"
    );
}

/// ALLOW_IDMAP is not offered (docs/semantics.md says why): an idmapped bind mount of the share
/// is refused by the guest kernel, and the share serves on.
#[test]
fn an_idmapped_mount_of_the_share_is_refused_in_the_guest() {
    let lab = Lab::get();
    let name = format!("feat-idmap-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let daemon = Daemon::start(&lab, &work, &export, &[]);
    let script = "#!/bin/sh\n\
        mkdir -p /idm && /opt/features idmap-mount /mnt /idm 0 1234 1\n\
        echo still > /mnt/s && cat /mnt/s | sed 's/^/READ /'\n\
        exit 0\n";
    let run = run_guest_env(&lab, &work, &daemon, script, &features(&lab), 600, &KERNEL);
    assert_eq!(run.code(), 0, "guest verdict (console above)");
    assert!(
        run.console
            .contains(&format!("IDMAP err={} mount_setattr", libc::EINVAL)),
        "an idmapped mount of a share without ALLOW_IDMAP"
    );
    assert!(run.console.contains("READ still"), "the share serves on");
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
