//! The filesystem layer against the real cluster, called in-process the way fuse-backend-rs's
//! server calls it: lookup counts, handle validation, and the bad input a guest can send.

use std::ffi::CStr;

use ceph_virtiofsd::fs::CephFs;
use fuse_backend_rs::abi::fuse_abi::SetattrValid;
use fuse_backend_rs::api::filesystem::FileSystem;

use crate::common;
use crate::common::{c, ctx, errno, Lab, Payload, Sink};

fn fs_for(lab: &Lab, name: &str) -> CephFs {
    common::fs_layer(lab, name)
}

fn create(fs: &CephFs, parent: u64, name: &CStr, mode: u32) -> (u64, u64) {
    common::create_as(fs, &ctx(0, 0), parent, name, mode)
}

#[test]
fn bad_names_get_clean_errnos() {
    let lab = Lab::get();
    let fs = fs_for(&lab, &format!("direct-names-{}", std::process::id()));
    let root = ctx(0, 0);
    assert_eq!(errno(fs.lookup(&root, 1, &c("a/b"))), libc::EINVAL);
    assert_eq!(errno(fs.mkdir(&root, 1, &c("x/y"), 0o755, 0)), libc::EINVAL);
    let long = "n".repeat(256);
    assert_eq!(errno(fs.lookup(&root, 1, &c(&long))), libc::ENAMETOOLONG);
    assert_eq!(
        errno(fs.mkdir(&root, 1, &c(&long), 0o755, 0)),
        libc::ENAMETOOLONG
    );
    let ok = "n".repeat(255);
    fs.mkdir(&root, 1, &c(&ok), 0o755, 0).unwrap();
    assert_eq!(errno(fs.mkdir(&root, 1, &c(".."), 0o755, 0)), libc::EINVAL);
    assert_eq!(errno(fs.unlink(&root, 1, &c("."))), libc::EINVAL);
    assert_eq!(
        errno(fs.rename(&root, 1, &c(&ok), 1, &c(".."), 0)),
        libc::EINVAL
    );
    // ".." of the export root is the export root: the guest cannot walk out of its export.
    let up = fs.lookup(&root, 1, &c("..")).unwrap();
    assert_eq!(up.inode, 1);
    // The guest's view of the root's parent is still the root (same inode number).
    let (st, _) = fs.getattr(&root, 1, None).unwrap();
    assert_eq!(up.attr.st_ino, st.st_ino);
}

#[test]
fn unknown_nodes_and_handles_are_refused() {
    let lab = Lab::get();
    let fs = fs_for(&lab, &format!("direct-ids-{}", std::process::id()));
    let root = ctx(0, 0);
    for bogus in [0u64, 2, 0xdead_beef, u64::MAX, 1 << 63] {
        assert_eq!(errno(fs.getattr(&root, bogus, None)), libc::ESTALE);
        assert_eq!(errno(fs.lookup(&root, bogus, &c("x"))), libc::ESTALE);
        assert_eq!(errno(fs.opendir(&root, bogus, 0)), libc::ESTALE);
        // FORGET of an unknown id has no reply and must not disturb anything.
        fs.forget(&root, bogus, u64::MAX);
    }
    let (ino, fh) = create(&fs, 1, &c("f"), 0o644);
    // A handle is only good with the node it was opened on.
    assert_eq!(errno(fs.fsync(&root, 1, false, fh)), libc::EBADF);
    assert_eq!(errno(fs.fsync(&root, ino, false, fh + 999)), libc::EBADF);
    assert_eq!(
        errno(fs.release(&root, 1, 0, fh, false, false, None)),
        libc::EBADF
    );
    fs.fsync(&root, ino, false, fh).unwrap();
    fs.release(&root, ino, 0, fh, false, false, None).unwrap();
    assert_eq!(
        errno(fs.release(&root, ino, 0, fh, false, false, None)),
        libc::EBADF,
        "double release"
    );
    // Opening a directory handle and using it as a file handle.
    let (dh, _) = fs.opendir(&root, 1, 0).unwrap();
    let dh = dh.unwrap();
    assert_eq!(errno(fs.fsync(&root, 1, false, dh)), libc::EISDIR);
    fs.releasedir(&root, 1, 0, dh).unwrap();
}

#[test]
fn offsets_past_i64_are_refused() {
    let lab = Lab::get();
    let fs = fs_for(&lab, &format!("direct-off-{}", std::process::id()));
    let root = ctx(0, 0);
    let (ino, fh) = create(&fs, 1, &c("f"), 0o644);
    assert_eq!(
        errno(fs.fallocate(&root, ino, fh, 0, i64::MAX as u64, 2)),
        libc::EFBIG
    );
    assert_eq!(
        errno(fs.fallocate(&root, ino, fh, 0, u64::MAX, 1)),
        libc::EFBIG
    );
    assert_eq!(errno(fs.lseek(&root, ino, fh, u64::MAX, 3)), libc::EINVAL);
    let mut st = fs.getattr(&root, ino, None).unwrap().0;
    st.st_size = -1;
    assert_eq!(
        errno(fs.setattr(&root, ino, st, None, SetattrValid::SIZE)),
        libc::EINVAL
    );
}

/// fallocate(2) mode 0 extends the size and keeps the bytes, with every libcephfs: 20
/// refuses the mode (EOPNOTSUPP, which would make the guest kernel stop sending FALLOCATE for
/// the mount), and the daemon then extends the size itself. KEEP_SIZE leaves the size alone;
/// a read-only handle gets EBADF.
#[test]
fn fallocate_extends_the_size_with_every_libcephfs() {
    let lab = Lab::get();
    let fs = fs_for(&lab, &format!("direct-falloc-{}", std::process::id()));
    let root = ctx(0, 0);
    let (ino, fh) = create(&fs, 1, &c("f"), 0o644);
    let size = |fs: &CephFs| fs.getattr(&root, ino, None).unwrap().0.st_size;
    fs.write(
        &root,
        ino,
        fh,
        &mut Payload(b"abc".to_vec()),
        3,
        0,
        None,
        false,
        0,
        0,
    )
    .unwrap();
    fs.fallocate(&root, ino, fh, 0, 1000, 24).unwrap();
    assert_eq!(size(&fs), 1024);
    // Inside the file: nothing changes.
    fs.fallocate(&root, ino, fh, 0, 0, 10).unwrap();
    assert_eq!(size(&fs), 1024);
    fs.fallocate(&root, ino, fh, libc::FALLOC_FL_KEEP_SIZE as u32, 4096, 4096)
        .unwrap();
    assert_eq!(size(&fs), 1024);
    let mut sink = Sink(Vec::new());
    assert_eq!(
        fs.read(&root, ino, fh, &mut sink, 16, 0, None, 0).unwrap(),
        16
    );
    assert_eq!(&sink.0[..4], b"abc\0");
    fs.release(&root, ino, 0, fh, false, false, None).unwrap();
    let (ro, _, _) = fs.open(&root, ino, libc::O_RDONLY as u32, 0).unwrap();
    let ro = ro.unwrap();
    let r = fs.fallocate(&root, ino, ro, 0, 0, 1 << 20);
    assert_eq!(errno(r), libc::EBADF);
    assert_eq!(size(&fs), 1024);
}

#[test]
fn lookup_counts_release_nodes() {
    let lab = Lab::get();
    let fs = fs_for(&lab, &format!("direct-forget-{}", std::process::id()));
    let root = ctx(0, 0);
    fs.mkdir(&root, 1, &c("d"), 0o755, 0).unwrap();
    let before = fs.node_count();
    let a = fs.lookup(&root, 1, &c("d")).unwrap();
    let b = fs.lookup(&root, 1, &c("d")).unwrap();
    assert_eq!(a.inode, b.inode, "one node id per inode");
    assert!(fs.node_count() >= before);
    // mkdir's entry + two lookups = three counts.
    fs.forget(&root, a.inode, 2);
    assert!(fs.getattr(&root, a.inode, None).is_ok());
    fs.forget(&root, a.inode, 1);
    assert_eq!(errno(fs.getattr(&root, a.inode, None)), libc::ESTALE);
    // Unknown lookups are negative entries, not errors (cache mode auto).
    let neg = fs.lookup(&root, 1, &c("nothing-here")).unwrap();
    assert_eq!(neg.inode, 0);
    assert!(!neg.entry_timeout.is_zero());
}

#[test]
fn killpriv_clears_setuid_on_flagged_write_and_keeps_plain_files_alone() {
    let lab = Lab::get();
    let fs = fs_for(&lab, &format!("direct-killpriv-{}", std::process::id()));
    let root = ctx(0, 0);
    let (ino, fh) = create(&fs, 1, &c("suid"), 0o6755);
    let (st, _) = fs.getattr(&root, ino, None).unwrap();
    assert_eq!(st.st_mode & 0o7777, 0o6755);
    let cap = [1u8, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    fs.setxattr(&root, ino, &c("security.capability"), &cap, 0)
        .unwrap();
    // The write path through the FileSystem trait needs a ZeroCopyReader over guest memory;
    // the SB_NOSEC decision itself is exercised through SETATTR here and through real guest
    // writes in tests/guest.rs. Truncate flagged as a non-root guest sends it:
    let mut attr = st;
    attr.st_size = 0;
    fs.setattr(
        &root,
        ino,
        attr,
        Some(fh),
        SetattrValid::SIZE | SetattrValid::KILL_SUIDGID,
    )
    .unwrap();
    let (after, _) = fs.getattr(&root, ino, None).unwrap();
    assert_eq!(after.st_mode & 0o7777, 0o755, "setuid and setgid cleared");
    assert_eq!(
        errno(fs.getxattr(&root, ino, &c("security.capability"), 0)),
        libc::ENODATA,
        "security.capability removed on truncate"
    );
    // A plain file keeps its mode through a flagged truncate.
    let (plain, pfh) = create(&fs, 1, &c("plain"), 0o644);
    let (pst, _) = fs.getattr(&root, plain, None).unwrap();
    fs.setattr(
        &root,
        plain,
        pst,
        Some(pfh),
        SetattrValid::SIZE | SetattrValid::KILL_SUIDGID,
    )
    .unwrap();
    assert_eq!(
        fs.getattr(&root, plain, None).unwrap().0.st_mode & 0o7777,
        0o644
    );
}

#[test]
fn reserved_and_ceph_xattrs_follow_the_policy() {
    let lab = Lab::get();
    let fs = fs_for(&lab, &format!("direct-xattr-{}", std::process::id()));
    let root = ctx(0, 0);
    let (ino, _) = create(&fs, 1, &c("f"), 0o644);
    assert_eq!(
        errno(fs.setxattr(&root, ino, &c("trusted.ceph-virtiofsd.x"), b"1", 0)),
        libc::EPERM
    );
    assert_eq!(
        errno(fs.getxattr(&root, ino, &c("trusted.ceph-virtiofsd.x"), 64)),
        libc::ENODATA
    );
    assert_eq!(
        errno(fs.setxattr(&root, 1, &c("ceph.dir.layout.pool"), b"x", 0)),
        libc::EPERM
    );
    // ceph.dir.rbytes is readable.
    assert!(fs.getxattr(&root, 1, &c("ceph.dir.rbytes"), 0).is_ok());
    fs.setxattr(&root, ino, &c("user.k"), b"v", 0).unwrap();
    assert_eq!(
        errno(fs.setxattr(&root, ino, &c("user.big"), &vec![0u8; 65537], 0)),
        libc::E2BIG
    );
}

#[test]
fn non_root_callers_are_checked_by_ceph() {
    let lab = Lab::get();
    let fs = fs_for(&lab, &format!("direct-perm-{}", std::process::id()));
    let root = ctx(0, 0);
    let d = fs.mkdir(&root, 1, &c("private"), 0o700, 0).unwrap();
    let user = ctx(1000, 1000);
    assert_eq!(
        errno(fs.mkdir(&user, d.inode, &c("x"), 0o755, 0)),
        libc::EACCES
    );
    assert_eq!(errno(fs.opendir(&user, d.inode, 0)), libc::EACCES);
    // Files a user creates belong to that user.
    let pubdir = fs.mkdir(&root, 1, &c("pub"), 0o777, 0).unwrap();
    let e = fs.mkdir(&user, pubdir.inode, &c("mine"), 0o755, 0).unwrap();
    assert_eq!((e.attr.st_uid, e.attr.st_gid), (1000, 1000));
}

/// A guest's O_DIRECT write is on the OSDs when WRITE is answered: the RADOS object holds the
/// data while the file is still open and nothing was flushed (a buffered write would sit in
/// libcephfs's cache for up to client_oc_max_dirty_age, 5 s).
#[test]
fn o_direct_writes_reach_the_osds_before_the_reply() {
    let lab = Lab::get();
    let fs = fs_for(&lab, &format!("direct-odirect-{}", std::process::id()));
    let root = ctx(0, 0);
    let (ino, created) = create(&fs, 1, &c("direct"), 0o644);
    fs.release(&root, ino, 0, created, false, false, None)
        .unwrap();
    let (fh, _, _) = fs
        .open(&root, ino, (libc::O_RDWR | libc::O_DIRECT) as u32, 0)
        .unwrap();
    let fh = fh.unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 253) as u8).collect();
    let n = fs
        .write(
            &root,
            ino,
            fh,
            &mut Payload(data.clone()),
            4096,
            0,
            None,
            false,
            0,
            0,
        )
        .unwrap();
    assert_eq!(n, 4096);
    let out = lab
        .scratch(&format!("odirect-{}", std::process::id()))
        .join("obj");
    let object = format!("{ino:x}.00000000");
    let st = std::process::Command::new("rados")
        .arg("-c")
        .arg(&lab.conf)
        .args(["--id", &lab.client_id, "-p", "cephfs_data", "get", &object])
        .arg(&out)
        .status()
        .expect("run rados");
    assert!(
        st.success(),
        "object {object} missing: the write was buffered"
    );
    assert_eq!(std::fs::read(&out).unwrap(), data);
    fs.release(&root, ino, 0, fh, false, false, None).unwrap();
}

/// With `--held-inodes 2`, nodes the guest still holds give their libcephfs references back,
/// and every request on them finds the inode again by number: data, attributes, xattrs, links, renames and listings are what they
/// were, under the same node ids.
#[test]
fn nodes_over_held_inodes_release_their_inodes_and_find_them_again() {
    let lab = Lab::get();
    let name = format!("direct-held-{}", std::process::id());
    let fs = common::fs_layer_with(&lab, &name, |cfg| cfg.held_inodes = 2);
    let root = ctx(0, 0);
    let d = fs.mkdir(&root, 1, &c("d"), 0o755, 0).unwrap().inode;
    let mut files = Vec::new();
    for i in 0..24u32 {
        let fname = c(&format!("f{i}"));
        let (ino, fh) = create(&fs, d, &fname, 0o644);
        let body = format!("file {i}").into_bytes();
        let len = body.len() as u32;
        fs.write(
            &root,
            ino,
            fh,
            &mut Payload(body),
            len,
            0,
            None,
            false,
            0,
            0,
        )
        .unwrap();
        fs.release(&root, ino, 0, fh, true, false, None).unwrap();
        files.push((ino, fname));
    }
    let target = c("f0");
    let link = fs.symlink(&root, &target, d, &c("sym")).unwrap().inode;
    let (held, released, _) = fs.inode_refs();
    assert!(
        held <= 3,
        "{held} references held over a limit of 2 (and the root)"
    );
    assert!(released >= 20, "only {released} released");
    assert_eq!(
        fs.node_count(),
        1 + 1 + 24 + 1,
        "the guest still holds every node"
    );

    for (i, (ino, fname)) in files.iter().enumerate() {
        let (st, _) = fs.getattr(&root, *ino, None).unwrap();
        assert_eq!(st.st_ino, *ino);
        let want = format!("file {i}").into_bytes();
        assert_eq!(st.st_size as usize, want.len());
        let (fh, _, _) = fs.open(&root, *ino, libc::O_RDONLY as u32, 0).unwrap();
        let mut sink = Sink(Vec::new());
        fs.read(&root, *ino, fh.unwrap(), &mut sink, 64, 0, None, 0)
            .unwrap();
        assert_eq!(sink.0, want, "{fname:?}");
        fs.release(&root, *ino, 0, fh.unwrap(), false, false, None)
            .unwrap();
        // A lookup by name finds the same node.
        assert_eq!(fs.lookup(&root, d, fname).unwrap().inode, *ino);
        fs.forget(&root, *ino, 1);
    }
    assert_eq!(fs.readlink(&root, link).unwrap(), b"f0");
    // Attribute and xattr changes on released nodes land on the right inode.
    let (ino, _) = files[3].clone();
    let mut st = fs.getattr(&root, ino, None).unwrap().0;
    st.st_mode = libc::S_IFREG | 0o600;
    fs.setattr(&root, ino, st, None, SetattrValid::MODE)
        .unwrap();
    fs.setxattr(&root, ino, &c("user.k"), b"v", 0).unwrap();
    for (other, _) in &files[4..] {
        fs.getattr(&root, *other, None).unwrap();
    }
    assert_eq!(
        fs.getattr(&root, ino, None).unwrap().0.st_mode & 0o7777,
        0o600
    );
    match fs.getxattr(&root, ino, &c("user.k"), 16).unwrap() {
        fuse_backend_rs::api::filesystem::GetxattrReply::Value(v) => assert_eq!(v, b"v"),
        _ => panic!("getxattr of user.k: a size, not the value"),
    }
    // Links and renames through released directories and files.
    let (f1, _) = files[1].clone();
    let e = fs.link(&root, f1, 1, &c("hard")).unwrap();
    assert_eq!((e.inode, e.attr.st_nlink), (f1, 2));
    fs.rename(&root, d, &c("f2"), 1, &c("moved"), 0).unwrap();
    assert_eq!(fs.lookup(&root, 1, &c("moved")).unwrap().inode, files[2].0);
    fs.unlink(&root, d, &c("f5")).unwrap();
    assert_eq!(
        fs.lookup(&root, d, &c("f5")).unwrap().inode,
        0,
        "a negative entry"
    );
    // A listing of a released directory.
    let (dh, _) = fs.opendir(&root, d, 0).unwrap();
    let mut names = Vec::new();
    fs.readdir(&root, d, dh.unwrap(), 4096, 0, &mut |e| {
        names.push(String::from_utf8_lossy(e.name).into_owned());
        Ok(1)
    })
    .unwrap();
    fs.releasedir(&root, d, 0, dh.unwrap()).unwrap();
    assert!(names.contains(&"f0".to_string()) && !names.contains(&"f2".to_string()));
    assert!(!names.contains(&"f5".to_string()));
    let (held, _, refound) = fs.inode_refs();
    assert!(held <= 3, "{held} held after the requests");
    assert!(refound >= 24, "only {refound} inodes found again");
}

/// A backward scan (`tac`, a reverse 4 KiB stride), which the daemon reads ahead below
/// (`read_behind`): every 4 KiB comes back as another client wrote it, in two backward scans
/// one after the other, a forward one, and a backward one with a gap, over 3 MiB (three
/// read-behind windows) and a tail that is not a whole block.
#[test]
fn backward_scans_read_what_another_client_wrote() {
    let lab = Lab::get();
    let name = format!("fs-backward-{}", std::process::id());
    let fs = fs_for(&lab, &name);
    let len = (3 << 20) + 1000;
    let data: Vec<u8> = (0..len)
        .map(|i: usize| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    {
        let m = lab.ceph();
        let d = common::ceph_dir(&m, &format!("/{name}"));
        let (_, _, f) = m
            .create(
                &d,
                &c("back"),
                0o644,
                libc::O_WRONLY | libc::O_CREAT,
                ceph_client::CEPH_STATX_BASIC_STATS,
                0,
                &ceph_client::UserPerm::root(),
            )
            .unwrap();
        let mut off = 0;
        while off < data.len() {
            off += f.write(off as u64, &data[off..]).unwrap();
        }
        f.fsync(false).unwrap();
    }
    let root = ctx(0, 0);
    let ino = fs.lookup(&root, 1, &c("back")).unwrap().inode;
    let (fh, _, _) = fs.open(&root, ino, libc::O_RDONLY as u32, 0).unwrap();
    let fh = fh.unwrap();
    let blocks = len.div_ceil(4096);
    let read = |b: usize| {
        let mut sink = Sink(Vec::new());
        fs.read(&root, ino, fh, &mut sink, 4096, (b * 4096) as u64, None, 0)
            .unwrap();
        let want = &data[b * 4096..((b + 1) * 4096).min(len)];
        assert!(sink.0 == want, "block {b}: the bytes differ");
    };
    for _ in 0..2 {
        (0..blocks).rev().for_each(read);
    }
    (0..blocks).for_each(read);
    (0..blocks).rev().step_by(3).for_each(read);
    fs.release(&root, ino, 0, fh, false, false, None).unwrap();
}
