//! Linux file semantics the guest is promised, where libcephfs on its own does not give them
//! (docs/semantics.md). Each test is a sequence a guest user runs, sent to the
//! filesystem layer the way fuse-backend-rs's server sends it, against the real cluster; the
//! expected result is what a local Linux filesystem and the kernel CephFS client answer.

use std::time::{SystemTime, UNIX_EPOCH};

use ceph_virtiofsd::fs::CephFs;
use fuse_backend_rs::abi::fuse_abi::{stat64, CreateIn, SetattrValid};
use fuse_backend_rs::api::filesystem::FileSystem;

use crate::common;
use crate::common::{c, create_as, ctx, errno, Lab, Payload, Sink};

fn fs_for(lab: &Lab, name: &str) -> CephFs {
    common::fs_layer(lab, &format!("{name}-{}", std::process::id()))
}

fn open(fs: &CephFs, ino: u64, flags: i32) -> u64 {
    fs.open(&ctx(0, 0), ino, flags as u32, 0)
        .unwrap()
        .0
        .unwrap()
}

fn release(fs: &CephFs, ino: u64, fh: u64) {
    fs.release(&ctx(0, 0), ino, 0, fh, false, false, None)
        .unwrap();
}

fn write(fs: &CephFs, ino: u64, fh: u64, off: u64, data: &[u8]) {
    let n = common::fs_write(fs, ino, fh, off, data).unwrap();
    assert_eq!(n, data.len(), "short write at {off}");
}

fn read(fs: &CephFs, ino: u64, fh: u64, off: u64, len: usize) -> Vec<u8> {
    let mut out = Sink(Vec::new());
    let mut done = 0;
    while done < len {
        let n = fs
            .read(
                &ctx(0, 0),
                ino,
                fh,
                &mut out,
                (len - done) as u32,
                off + done as u64,
                None,
                0,
            )
            .unwrap();
        if n == 0 {
            break;
        }
        done += n;
    }
    out.0
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(u32::from(seed)) as u8)
        .collect()
}

/// Byte comparison that names the first differing offset instead of printing megabytes.
#[track_caller]
fn same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: {} bytes read, {} expected, first difference at {at:?}",
            got.len(),
            want.len()
        );
    }
}

fn stat(fs: &CephFs, ino: u64) -> stat64 {
    fs.getattr(&ctx(0, 0), ino, None).unwrap().0
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// An O_DIRECT write is seen by every later read of its range, buffered or direct, through any
/// descriptor: Linux's rule (a direct write invalidates the cached pages of its range before it
/// completes). libcephfs writes O_DIRECT data straight to the OSDs and leaves what its object
/// cache holds of the range in place, so without the daemon's care a buffered reader gets the
/// old bytes for as long as the daemon lives.
#[test]
fn direct_writes_are_seen_by_buffered_reads() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-odirect");
    let root = ctx(0, 0);
    let (ino, created) = create_as(&fs, &root, 1, &c("f"), 0o644);
    let old = bytes(1, 512 << 10);
    write(&fs, ino, created, 0, &old);
    release(&fs, ino, created);
    let buffered = open(&fs, ino, libc::O_RDWR);
    same(&read(&fs, ino, buffered, 0, old.len()), &old, "read back");
    let direct = open(&fs, ino, libc::O_RDWR | libc::O_DIRECT);
    let new = bytes(2, 8 << 10);
    write(&fs, ino, direct, 0, &new);
    same(
        &read(&fs, ino, buffered, 0, new.len()),
        &new,
        "buffered read after an O_DIRECT write of the same range",
    );
    same(&read(&fs, ino, direct, 0, new.len()), &new, "direct read");
    release(&fs, ino, direct);
    release(&fs, ino, buffered);
    let again = open(&fs, ino, libc::O_RDONLY);
    same(&read(&fs, ino, again, 0, new.len()), &new, "after reopen");
    same(
        &read(&fs, ino, again, new.len() as u64, 4096),
        &old[new.len()..new.len() + 4096],
        "bytes past the direct write",
    );
    release(&fs, ino, again);

    // The other direction: a direct read sees what a buffered descriptor wrote a moment ago
    // and libcephfs still holds dirty.
    let buffered = open(&fs, ino, libc::O_RDWR);
    let direct = open(&fs, ino, libc::O_RDWR | libc::O_DIRECT);
    let dirty = bytes(3, 4096);
    write(&fs, ino, buffered, 4096, &dirty);
    same(
        &read(&fs, ino, direct, 4096, 4096),
        &dirty,
        "direct read of dirty data",
    );
    // And a direct write into the middle of a dirty range, then a buffered read of it all.
    let mid = bytes(4, 4096);
    write(&fs, ino, buffered, 65536, &bytes(5, 3 * 4096));
    write(&fs, ino, direct, 65536 + 4096, &mid);
    let got = read(&fs, ino, buffered, 65536, 3 * 4096);
    let around = bytes(5, 3 * 4096);
    same(&got[..4096], &around[..4096], "before the direct write");
    same(&got[4096..8192], &mid, "direct write inside dirty data");
    same(&got[8192..], &around[8192..], "after the direct write");
    release(&fs, ino, direct);
    release(&fs, ino, buffered);

    // A second CephFS client (another host) reads what the guest was told is written.
    let m = lab.ceph();
    let other = m
        .lookup_root()
        .and_then(|r| {
            let export = format!("sem-odirect-{}", std::process::id());
            m.lookup(&r, &c(&export), 0, 0, &ceph_client::UserPerm::root())
        })
        .and_then(|(d, _)| m.lookup(&d, &c("f"), 0, 0, &ceph_client::UserPerm::root()))
        .unwrap()
        .0;
    let f = m
        .open(&other, libc::O_RDONLY, &ceph_client::UserPerm::root())
        .unwrap();
    let mut buf = vec![0u8; 4096];
    f.read(65536 + 4096, &mut buf).unwrap();
    same(&buf, &mid, "another client reads the direct write");
}

/// WRITE data whose reading runs something else first: a guest's request on another queue,
/// served between the moment the WRITE chose its path and the moment it wrote.
struct Interleaved<'a> {
    data: Payload,
    meanwhile: Option<Box<dyn FnOnce() + 'a>>,
}

impl std::io::Read for Interleaved<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.data.read(buf)
    }
}

impl fuse_backend_rs::api::filesystem::ZeroCopyReader for Interleaved<'_> {
    fn read_to(
        &mut self,
        f: &mut dyn fuse_backend_rs::file_traits::FileReadWriteVolatile,
        count: usize,
        off: u64,
    ) -> std::io::Result<usize> {
        if let Some(run) = self.meanwhile.take() {
            run();
        }
        self.data.read_to(f, count, off)
    }
}

/// The first buffered READ of a file racing an O_DIRECT WRITE through a write-only descriptor
/// (review of f9264a9, finding 4): the WRITE chose libcephfs's direct path (no buffered I/O of
/// the inode yet), the READ, on another queue, marked the inode and cached the old bytes, and
/// the WRITE, having reached the OSDs, then read its range back to put it in the cache,
/// through the guest's write-only handle: EBADF for data already written, and the reader's
/// cache left stale. The READ is run at the point of the race (after the WRITE's routing,
/// before its data moves), so the interleaving is the same every run.
#[test]
fn a_direct_write_through_a_write_only_handle_racing_a_first_buffered_read() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-odirect-race");
    let root = ctx(0, 0);
    let (ino, created) = create_as(&fs, &root, 1, &c("f"), 0o666);
    release(&fs, ino, created);
    let direct = open(&fs, ino, libc::O_WRONLY | libc::O_DIRECT);
    let old = bytes(1, 64 << 10);
    write(&fs, ino, direct, 0, &old);
    let buffered = open(&fs, ino, libc::O_RDONLY);
    let new = bytes(2, 8 << 10);
    let seen = std::cell::RefCell::new(Vec::new());
    let mut data = Interleaved {
        data: Payload(new.clone()),
        meanwhile: Some(Box::new(|| {
            *seen.borrow_mut() = read(&fs, ino, buffered, 0, old.len());
        })),
    };
    let r = fs.write(
        &root,
        ino,
        direct,
        &mut data,
        new.len() as u32,
        0,
        None,
        false,
        0,
        0,
    );
    same(&seen.borrow(), &old, "the racing buffered read");
    let mut failed = Vec::new();
    match r {
        Ok(n) if n == new.len() => {}
        r => failed.push(format!(
            "the O_DIRECT WRITE through a write-only handle: {r:?}"
        )),
    }
    let stale = |got: &[u8]| got.get(..new.len()) != Some(&new[..]);
    if stale(&read(&fs, ino, buffered, 0, new.len())) {
        failed.push("the buffered reader reads the old bytes".into());
    }
    let m = lab.ceph();
    let dir = common::ceph_dir(&m, &format!("sem-odirect-race-{}", std::process::id()));
    if stale(&common::ceph_read_all(&m, &dir, "f")) {
        failed.push("another client reads the old bytes".into());
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    release(&fs, ino, direct);
    release(&fs, ino, buffered);
}

/// The daemon sends O_DIRECT writes through libcephfs's cache only for inodes whose data the
/// cache may hold (those with buffered I/O); the others take libcephfs's direct path. Both
/// must stay right when the guest's node of the file is forgotten in between (drop_caches),
/// and when only direct descriptors were ever used.
#[test]
fn direct_writes_stay_visible_across_forgotten_nodes() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-odirect-forget");
    let root = ctx(0, 0);
    // Only direct descriptors: write, read back, overwrite, then a buffered reader.
    let (ino, created) = create_as(&fs, &root, 1, &c("direct-only"), 0o644);
    release(&fs, ino, created);
    let direct = open(&fs, ino, libc::O_RDWR | libc::O_DIRECT);
    write(&fs, ino, direct, 0, &bytes(1, 65536));
    same(
        &read(&fs, ino, direct, 0, 65536),
        &bytes(1, 65536),
        "direct",
    );
    write(&fs, ino, direct, 4096, &bytes(2, 4096));
    release(&fs, ino, direct);
    let buffered = open(&fs, ino, libc::O_RDONLY);
    same(
        &read(&fs, ino, buffered, 4096, 4096),
        &bytes(2, 4096),
        "buffered read of a file only ever written and read direct",
    );
    release(&fs, ino, buffered);

    // Buffered I/O, then the guest forgets the node; a new lookup, then a direct write.
    let (ino, created) = create_as(&fs, &root, 1, &c("forgotten"), 0o644);
    write(&fs, ino, created, 0, &bytes(3, 256 << 10));
    same(&read(&fs, ino, created, 0, 4096), &bytes(3, 4096), "cached");
    release(&fs, ino, created);
    fs.forget(&root, ino, 1);
    assert_eq!(
        errno(fs.getattr(&root, ino, None)),
        libc::ESTALE,
        "forgotten"
    );
    let again = fs.lookup(&root, 1, &c("forgotten")).unwrap().inode;
    let direct = open(&fs, again, libc::O_WRONLY | libc::O_DIRECT);
    write(&fs, again, direct, 0, &bytes(4, 8192));
    release(&fs, again, direct);
    let buffered = open(&fs, again, libc::O_RDONLY);
    same(
        &read(&fs, again, buffered, 0, 8192),
        &bytes(4, 8192),
        "buffered read after a direct write to a file the guest had forgotten",
    );
    release(&fs, again, buffered);
}

/// truncate(1) grows a file with ftruncate: FUSE sends SETATTR with only the size (the kernel
/// leaves the times to the server). Linux then sets mtime and ctime to now; libcephfs, when it
/// grows the file locally under its exclusive cap, takes the mtime from the (zero) request.
#[test]
fn truncate_sets_current_times() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-truncate");
    let root = ctx(0, 0);
    let (ino, fh) = create_as(&fs, &root, 1, &c("f"), 0o644);
    write(&fs, ino, fh, 0, &bytes(1, 39));
    release(&fs, ino, fh);
    let before = now_secs();
    for (size, through) in [(4123, true), (100, true), (9000, false), (10, false)] {
        let fh = open(&fs, ino, libc::O_WRONLY);
        let mut attr = stat(&fs, ino);
        attr.st_size = size;
        let (valid, handle) = if through {
            // ftruncate(fd): FATTR_SIZE | FATTR_FH.
            (SetattrValid::SIZE, Some(fh))
        } else {
            // truncate(path): FATTR_SIZE | FATTR_MTIME | FATTR_MTIME_NOW.
            (
                SetattrValid::SIZE | SetattrValid::MTIME | SetattrValid::MTIME_NOW,
                None,
            )
        };
        let (st, _) = fs.setattr(&root, ino, attr, handle, valid).unwrap();
        release(&fs, ino, fh);
        for (what, st) in [("reply", st), ("getattr", stat(&fs, ino))] {
            assert_eq!(st.st_size, size, "{what}: size");
            assert!(
                st.st_mtime >= before - 1 && st.st_mtime <= now_secs() + 1,
                "{what} after truncate to {size}: mtime {} is not now ({before})",
                st.st_mtime
            );
            assert!(st.st_ctime >= before - 1, "{what}: ctime {}", st.st_ctime);
        }
    }
}

/// ftruncate(2) needs a descriptor open for writing, not write permission on the file now: a
/// file created with mode 0 can be truncated through the descriptor that created it (pjdfstest
/// ftruncate::affected_create_flags_only), with its times set to now as above.
#[test]
fn ftruncate_through_the_creating_descriptor_of_a_mode_0_file() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-ftruncate0");
    let user = ctx(65534, 65534);
    let (ino, fh) = create_as(&fs, &user, 1, &c("f"), 0);
    let mut attr = fs.getattr(&user, ino, None).unwrap().0;
    attr.st_size = 1234;
    let (st, _) = fs
        .setattr(&user, ino, attr, Some(fh), SetattrValid::SIZE)
        .unwrap();
    assert_eq!(st.st_size, 1234);
    // Without the descriptor, the mode decides.
    attr.st_size = 0;
    assert_eq!(
        errno(fs.setattr(&user, ino, attr, None, SetattrValid::SIZE)),
        libc::EACCES
    );
    fs.release(&user, ino, 0, fh, false, false, None).unwrap();
}

/// A directory's mtime and ctime move when an entry is added, removed or renamed in or out,
/// also after the directory was given an explicit old time (`touch -d`).
#[test]
fn directory_times_move_with_its_entries() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-dirtimes");
    let root = ctx(0, 0);
    let old = 978_307_200; // 2001-01-01
    let dir = |name: &str| fs.mkdir(&root, 1, &c(name), 0o755, 0).unwrap().inode;
    let (d, e) = (dir("d"), dir("e"));
    let set_old = |ino: u64| {
        let mut attr = stat(&fs, ino);
        attr.st_mtime = old;
        attr.st_mtime_nsec = 0;
        attr.st_atime = old;
        attr.st_atime_nsec = 0;
        fs.setattr(
            &root,
            ino,
            attr,
            None,
            SetattrValid::MTIME | SetattrValid::ATIME,
        )
        .unwrap();
        assert_eq!(stat(&fs, ino).st_mtime, old, "explicit mtime set");
    };
    let check = |ino: u64, what: &str| {
        let st = stat(&fs, ino);
        assert!(
            st.st_mtime > old + 1_000_000 && st.st_ctime > old + 1_000_000,
            "{what}: the directory's mtime {} / ctime {} did not move",
            st.st_mtime,
            st.st_ctime
        );
    };
    set_old(d);
    let (f, fh) = create_as(&fs, &root, d, &c("f"), 0o644);
    release(&fs, f, fh);
    check(d, "create");
    set_old(d);
    fs.mkdir(&root, d, &c("sub"), 0o755, 0).unwrap();
    check(d, "mkdir");
    set_old(d);
    set_old(e);
    fs.rename(&root, d, &c("f"), e, &c("f"), 0).unwrap();
    check(d, "rename out of");
    check(e, "rename into");
    set_old(e);
    fs.rename(&root, e, &c("f"), e, &c("f2"), 0).unwrap();
    check(e, "rename within");
    fs.rename(&root, e, &c("f2"), e, &c("f"), 0).unwrap();
    set_old(e);
    fs.link(&root, f, e, &c("g")).unwrap();
    check(e, "link");
    set_old(e);
    fs.symlink(&root, &c("target"), e, &c("s")).unwrap();
    check(e, "symlink");
    set_old(e);
    fs.unlink(&root, e, &c("g")).unwrap();
    check(e, "unlink");
    set_old(d);
    fs.rmdir(&root, d, &c("sub")).unwrap();
    check(d, "rmdir");
}

/// `mkdir P Q P/d; mv P/d Q/d`: P loses a subdirectory (nlink 3 -> 2), Q gains one (2 -> 3),
/// as upstream pjdfstest rename/24.t checks.
#[test]
fn directory_link_counts_follow_renames() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-nlink");
    let root = ctx(0, 0);
    let p = fs.mkdir(&root, 1, &c("P"), 0o755, 0).unwrap().inode;
    let q = fs.mkdir(&root, 1, &c("Q"), 0o755, 0).unwrap().inode;
    fs.mkdir(&root, p, &c("d"), 0o755, 0).unwrap();
    assert_eq!(stat(&fs, p).st_nlink, 3);
    assert_eq!(stat(&fs, q).st_nlink, 2);
    fs.rename(&root, p, &c("d"), q, &c("d"), 0).unwrap();
    // A guest may see them through LOOKUP first (cache=never revalidates every dentry).
    let looked = |name: &str| fs.lookup(&root, 1, &c(name)).unwrap().attr.st_nlink;
    assert_eq!(
        looked("P"),
        2,
        "LOOKUP of the source directory after mv P/d Q/d"
    );
    assert_eq!(looked("Q"), 3, "LOOKUP of the target directory");
    assert_eq!(
        stat(&fs, p).st_nlink,
        2,
        "source directory after mv P/d Q/d"
    );
    assert_eq!(stat(&fs, q).st_nlink, 3, "target directory");
    // Replacing an empty directory keeps the target's count.
    fs.mkdir(&root, p, &c("x"), 0o755, 0).unwrap();
    fs.rename(&root, p, &c("x"), q, &c("d"), 0).unwrap();
    assert_eq!(
        stat(&fs, p).st_nlink,
        2,
        "source after replacing a directory"
    );
    assert_eq!(stat(&fs, q).st_nlink, 3, "target after the replacement");
    fs.rmdir(&root, q, &c("d")).unwrap();
    assert_eq!(stat(&fs, q).st_nlink, 2, "after rmdir");
}

/// An owner may give its file to any group it is a member of (pjdfstest chown/00.t 107-120).
/// FUSE carries only the primary gid; the guest kernel checked the membership.
#[test]
fn owners_chgrp_to_a_supplementary_group() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-chgrp");
    let root = ctx(0, 0);
    let (ino, fh) = create_as(&fs, &root, 1, &c("f"), 0o644);
    release(&fs, ino, fh);
    let mut attr = stat(&fs, ino);
    attr.st_uid = 65534;
    attr.st_gid = 65532;
    fs.setattr(
        &root,
        ino,
        attr,
        None,
        SetattrValid::UID | SetattrValid::GID,
    )
    .unwrap();
    let owner = ctx(65534, 65532);
    // chown 65534:65531 (the uid unchanged, as chown(1) sends it) and chgrp 65531.
    attr.st_gid = 65531;
    let (st, _) = fs
        .setattr(
            &owner,
            ino,
            attr,
            None,
            SetattrValid::UID | SetattrValid::GID,
        )
        .unwrap();
    assert_eq!((st.st_uid, st.st_gid), (65534, 65531));
    attr.st_gid = 65532;
    let (st, _) = fs
        .setattr(&owner, ino, attr, None, SetattrValid::GID)
        .unwrap();
    assert_eq!(st.st_gid, 65532);
    // Giving the file away to another user stays root's privilege.
    attr.st_uid = 65533;
    assert_eq!(
        errno(fs.setattr(
            &owner,
            ino,
            attr,
            None,
            SetattrValid::UID | SetattrValid::GID
        )),
        libc::EPERM
    );
    // And a non-owner cannot change the group.
    attr.st_uid = 65534;
    attr.st_gid = 65531;
    assert_eq!(
        errno(fs.setattr(&ctx(65533, 65531), ino, attr, None, SetattrValid::GID)),
        libc::EPERM
    );
    assert_eq!(stat(&fs, ino).st_gid, 65532);
}

/// utimensat(fd, NULL) / UTIME_NOW for both times needs only write permission; explicit
/// times need ownership (utimensat/06.t).
#[test]
fn non_owner_writers_touch_with_now() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-utimens");
    let root = ctx(0, 0);
    let (ino, fh) = create_as(&fs, &root, 1, &c("f"), 0o666);
    release(&fs, ino, fh);
    let mut attr = stat(&fs, ino);
    attr.st_mtime = 1_000_000_000;
    fs.setattr(&root, ino, attr, None, SetattrValid::MTIME)
        .unwrap();
    let writer = ctx(65534, 65534);
    let before = now_secs();
    let now = SetattrValid::ATIME
        | SetattrValid::ATIME_NOW
        | SetattrValid::MTIME
        | SetattrValid::MTIME_NOW;
    let (st, _) = fs.setattr(&writer, ino, attr, None, now).unwrap();
    assert!(
        st.st_mtime >= before - 1,
        "mtime {} is not now",
        st.st_mtime
    );
    // Explicit times stay the owner's.
    attr.st_mtime = 1_000_000_000;
    assert_eq!(
        errno(fs.setattr(
            &writer,
            ino,
            attr,
            None,
            SetattrValid::MTIME | SetattrValid::ATIME
        )),
        libc::EPERM
    );
    // Without write permission, not even "now".
    let mut ro = stat(&fs, ino);
    ro.st_mode = 0o644;
    fs.setattr(&root, ino, ro, None, SetattrValid::MODE)
        .unwrap();
    assert_eq!(
        errno(fs.setattr(&writer, ino, attr, None, now)),
        libc::EACCES
    );
}

/// chown keeps setgid on a file without group-execute: that bit is no privilege there. Linux
/// clears setuid, and setgid only together with group-execute.
#[test]
fn chown_clears_only_privilege_bits() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-chown-sgid");
    let root = ctx(0, 0);
    for (mode, after) in [
        (0o2625, 0o2625),
        (0o2675, 0o0675),
        (0o4755, 0o0755),
        (0o6775, 0o0775),
        (0o6765, 0o2765),
        (0o0644, 0o0644),
    ] {
        let name = format!("f{mode:o}");
        let (ino, fh) = create_as(&fs, &root, 1, &c(&name), 0o644);
        release(&fs, ino, fh);
        let mut attr = stat(&fs, ino);
        attr.st_mode = libc::S_IFREG | mode;
        fs.setattr(&root, ino, attr, None, SetattrValid::MODE)
            .unwrap();
        assert_eq!(stat(&fs, ino).st_mode & 0o7777, mode);
        attr.st_uid = 65534;
        attr.st_gid = 0;
        // What a 6.1 guest with HANDLE_KILLPRIV_V2 sends for chown of a non-directory.
        let valid = SetattrValid::UID | SetattrValid::GID | SetattrValid::KILL_SUIDGID;
        let (st, _) = fs.setattr(&root, ino, attr, None, valid).unwrap();
        assert_eq!(
            st.st_mode & 0o7777,
            after,
            "chown of a {mode:o} file: mode {:o}",
            st.st_mode & 0o7777
        );
        assert_eq!(stat(&fs, ino).st_mode & 0o7777, after);
    }
    // Directories keep both bits.
    let d = fs.mkdir(&root, 1, &c("dir"), 0o755, 0).unwrap().inode;
    let mut attr = stat(&fs, d);
    attr.st_mode = libc::S_IFDIR | 0o6775;
    fs.setattr(&root, d, attr, None, SetattrValid::MODE)
        .unwrap();
    attr.st_uid = 65534;
    fs.setattr(&root, d, attr, None, SetattrValid::UID).unwrap();
    assert_eq!(stat(&fs, d).st_mode & 0o7777, 0o6775);
}

/// Every attribute change sets ctime to now, also one that changes nothing, and explicit
/// times leave ctime at now, not at the mtime given.
#[test]
fn attribute_changes_set_ctime_to_now() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-ctime");
    let root = ctx(0, 0);
    let (ino, fh) = create_as(&fs, &root, 1, &c("f"), 0o644);
    release(&fs, ino, fh);
    let mut attr = stat(&fs, ino);
    attr.st_mtime = 1_000_000_000;
    attr.st_atime = 1_000_000_000;
    let before = now_secs();
    let (st, _) = fs
        .setattr(
            &root,
            ino,
            attr,
            None,
            SetattrValid::MTIME | SetattrValid::ATIME,
        )
        .unwrap();
    assert_eq!(st.st_mtime, 1_000_000_000);
    assert!(
        st.st_ctime >= before - 1,
        "ctime {} after utimensat",
        st.st_ctime
    );
    // Make ctime old enough to see it move, then chown to the current owner and group.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let old_ctime = stat(&fs, ino).st_ctime;
    let cur = stat(&fs, ino);
    let (st, _) = fs
        .setattr(&root, ino, cur, None, SetattrValid::UID | SetattrValid::GID)
        .unwrap();
    assert!(
        st.st_ctime > old_ctime,
        "chown to the same owner: ctime {} stayed",
        st.st_ctime
    );
}

/// A caller who may write a setuid/setgid file but does not own it truncates it (Linux: done,
/// setuid and setgid-with-group-exec killed for a caller without CAP_FSETID).
#[test]
fn non_owners_truncate_privileged_files() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-trunc-suid");
    let root = ctx(0, 0);
    for (mode, after) in [(0o6777, 0o0777), (0o4766, 0o0766), (0o2766, 0o2766)] {
        let name = format!("f{mode:o}");
        let (ino, fh) = create_as(&fs, &root, 1, &c(&name), 0o644);
        write(&fs, ino, fh, 0, &bytes(1, 100));
        release(&fs, ino, fh);
        let mut attr = stat(&fs, ino);
        attr.st_mode = libc::S_IFREG | mode;
        fs.setattr(&root, ino, attr, None, SetattrValid::MODE)
            .unwrap();
        let writer = ctx(65534, 65534);
        attr.st_size = 10;
        let valid = SetattrValid::SIZE
            | SetattrValid::MTIME
            | SetattrValid::MTIME_NOW
            | SetattrValid::KILL_SUIDGID;
        let (st, _) = fs.setattr(&writer, ino, attr, None, valid).unwrap();
        assert_eq!(st.st_size, 10);
        assert_eq!(
            st.st_mode & 0o7777,
            after,
            "truncate of a {mode:o} file by a non-owner: {:o}",
            st.st_mode & 0o7777
        );
    }
}

/// chmod g+s by the owner of a file whose group is one of the owner's supplementary groups:
/// the bit stays (the guest kernel clears it for a caller who is not a member).
#[test]
fn owners_set_setgid_for_a_supplementary_group() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-chmod-sgid");
    let root = ctx(0, 0);
    let (ino, fh) = create_as(&fs, &root, 1, &c("f"), 0o644);
    release(&fs, ino, fh);
    let d = fs.mkdir(&root, 1, &c("d"), 0o755, 0).unwrap().inode;
    for node in [ino, d] {
        let mut attr = stat(&fs, node);
        attr.st_uid = 1000;
        attr.st_gid = 2000;
        fs.setattr(
            &root,
            node,
            attr,
            None,
            SetattrValid::UID | SetattrValid::GID,
        )
        .unwrap();
        let owner = ctx(1000, 1000);
        attr.st_mode = (attr.st_mode & libc::S_IFMT) | 0o2755;
        let (st, _) = fs
            .setattr(&owner, node, attr, None, SetattrValid::MODE)
            .unwrap();
        assert_eq!(st.st_mode & 0o7777, 0o2755, "chmod g+s by the owner");
        // A non-owner still cannot chmod.
        assert_eq!(
            errno(fs.setattr(&ctx(1001, 2000), node, attr, None, SetattrValid::MODE)),
            libc::EPERM
        );
    }
}

/// rename(2) between two links of one file does nothing and succeeds (POSIX; Linux checks it
/// in the VFS, but a guest whose dentries are stale, or that is not Linux, sends it).
#[test]
fn rename_between_links_of_one_file_does_nothing() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-rename-links");
    let root = ctx(0, 0);
    let (ino, fh) = create_as(&fs, &root, 1, &c("j"), 0o644);
    release(&fs, ino, fh);
    let d = fs.mkdir(&root, 1, &c("d"), 0o755, 0).unwrap().inode;
    fs.link(&root, ino, 1, &c("c")).unwrap();
    fs.link(&root, ino, d, &c("x")).unwrap();
    fs.rename(&root, 1, &c("j"), 1, &c("c"), 0).unwrap();
    fs.rename(&root, d, &c("x"), 1, &c("c"), 0).unwrap();
    for (dir, name) in [(1, "j"), (1, "c"), (d, "x")] {
        let e = fs
            .lookup(&root, dir, &c(name))
            .unwrap_or_else(|e| panic!("{name} after renames between links: {e}"));
        assert_eq!(e.inode, ino, "{name}");
        assert_eq!(e.attr.st_nlink, 3, "{name}: nlink");
    }
    // RENAME_NOREPLACE onto another link of the same file: EEXIST, as for any existing name.
    assert_eq!(
        errno(fs.rename(&root, 1, &c("j"), 1, &c("c"), libc::RENAME_NOREPLACE)),
        libc::EEXIST
    );
}

/// Removing an extended attribute the file does not have is ENODATA, whatever others it has.
#[test]
fn removing_a_missing_xattr_is_enodata() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-xattr");
    let root = ctx(0, 0);
    let (ino, fh) = create_as(&fs, &root, 1, &c("f"), 0o644);
    release(&fs, ino, fh);
    assert_eq!(
        errno(fs.removexattr(&root, ino, &c("user.a"))),
        libc::ENODATA
    );
    fs.setxattr(&root, ino, &c("user.a"), b"1", 0).unwrap();
    assert_eq!(
        errno(fs.removexattr(&root, ino, &c("user.a.longer.name"))),
        libc::ENODATA
    );
    fs.removexattr(&root, ino, &c("user.a")).unwrap();
    assert_eq!(
        errno(fs.removexattr(&root, ino, &c("user.a"))),
        libc::ENODATA
    );
}

/// An owner whose file's group is one of its supplementary groups truncates and chgrps it:
/// setgid without group-execute stays (Linux kills only setuid and setgid with group-exec),
/// and ftruncate through a descriptor open for writing works after the file became
/// read-only.
#[test]
fn owners_keep_setgid_without_group_exec() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-owner-sgid");
    let root = ctx(0, 0);
    let owner = ctx(1000, 1000);
    let (ino, fh) = create_as(&fs, &root, 1, &c("f"), 0o644);
    write(&fs, ino, fh, 0, &bytes(1, 100));
    release(&fs, ino, fh);
    let mut attr = stat(&fs, ino);
    attr.st_uid = 1000;
    attr.st_gid = 2000;
    fs.setattr(
        &root,
        ino,
        attr,
        None,
        SetattrValid::UID | SetattrValid::GID,
    )
    .unwrap();
    attr.st_mode = libc::S_IFREG | 0o2666;
    fs.setattr(&root, ino, attr, None, SetattrValid::MODE)
        .unwrap();
    let fh = fs
        .open(&owner, ino, libc::O_RDWR as u32, 0)
        .unwrap()
        .0
        .unwrap();
    attr.st_mode = libc::S_IFREG | 0o2444;
    fs.setattr(&owner, ino, attr, None, SetattrValid::MODE)
        .unwrap();
    attr.st_size = 10;
    let (st, _) = fs
        .setattr(
            &owner,
            ino,
            attr,
            Some(fh),
            SetattrValid::SIZE | SetattrValid::KILL_SUIDGID,
        )
        .unwrap();
    assert_eq!(st.st_size, 10);
    assert_eq!(st.st_mode & 0o7777, 0o2444, "ftruncate by the owner");
    attr.st_gid = 1000;
    let valid = SetattrValid::UID | SetattrValid::GID | SetattrValid::KILL_SUIDGID;
    let (st, _) = fs.setattr(&owner, ino, attr, None, valid).unwrap();
    assert_eq!(
        (st.st_gid, st.st_mode & 0o7777),
        (1000, 0o2444),
        "chgrp by the owner"
    );
    fs.release(&owner, ino, 0, fh, false, false, None).unwrap();
}

/// The names in `dir`, as READDIR lists them (without "." and ".."), sorted.
fn names(fs: &CephFs, dir: u64) -> Vec<String> {
    let root = ctx(0, 0);
    let dh = fs.opendir(&root, dir, 0).unwrap().0.unwrap();
    let mut out = Vec::new();
    fs.readdir(&root, dir, dh, 65536, 0, &mut |de| {
        out.push(String::from_utf8_lossy(de.name).into_owned());
        Ok(1)
    })
    .unwrap();
    fs.releasedir(&root, dir, 0, dh).unwrap();
    out.retain(|n| n != "." && n != "..");
    out.sort();
    out
}

/// A rename over one name of a file with other hard links leaves the other names alone: they
/// are still listed and found, with the file's new link count (libcephfs turned every cached
/// name of the replaced file into a "no such entry" of a directory it still believed it knew
/// completely; see src/fs/side.rs). Over a remote link and over the primary one (the name
/// the file was created with), with the directories listed before, as a guest's `ls` does.
#[test]
fn renames_over_one_link_keep_the_other_names() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-rename-over-link");
    let root = ctx(0, 0);
    let a = fs.mkdir(&root, 1, &c("a"), 0o755, 0).unwrap().inode;
    let b = fs.mkdir(&root, 1, &c("b"), 0o755, 0).unwrap().inode;
    let listing = |dir: u64, want: &[&str], what: &str| {
        let got = names(&fs, dir);
        assert_eq!(got, want, "listing {what}");
    };
    for round in 0..4 {
        // f has three names: a/f (primary), b/g, a/h; the rename replaces one of them.
        let (f, fh) = create_as(&fs, &root, a, &c("f"), 0o644);
        write(&fs, f, fh, 0, &bytes(round, 3000));
        release(&fs, f, fh);
        fs.link(&root, f, b, &c("g")).unwrap();
        fs.link(&root, f, a, &c("h")).unwrap();
        let (n, fh) = create_as(&fs, &root, 1, &c("new"), 0o600);
        release(&fs, n, fh);
        listing(a, &["f", "h"], "a before");
        listing(b, &["g"], "b before");
        let (dir, name, left) = match round % 3 {
            0 => (a, "h", [(a, "f"), (b, "g")]),
            1 => (b, "g", [(a, "f"), (a, "h")]),
            _ => (a, "f", [(b, "g"), (a, "h")]),
        };
        fs.rename(&root, 1, &c("new"), dir, &c(name), 0).unwrap();
        // What the guest does next on the file: open, write, close.
        let fh = open(&fs, f, libc::O_RDWR);
        write(&fs, f, fh, 100, &bytes(9, 10));
        release(&fs, f, fh);
        for (d, other) in left {
            let e = fs
                .lookup(&root, d, &c(other))
                .unwrap_or_else(|e| panic!("round {round}: {other} after mv new {name}: {e}"));
            assert_eq!(e.inode, f, "round {round}: {other}");
            assert_eq!(e.attr.st_nlink, 2, "round {round}: nlink of {other}");
        }
        assert_eq!(fs.lookup(&root, dir, &c(name)).unwrap().inode, n);
        // The rename replaced a name: both listings are what they were.
        listing(a, &["f", "h"], &format!("a after round {round}"));
        listing(b, &["g"], &format!("b after round {round}"));
        for (d, x) in [(a, "f"), (a, "h"), (b, "g")] {
            fs.unlink(&root, d, &c(x)).unwrap();
        }
    }
}

/// A write by a caller without CAP_FSETID (the guest flags it WRITE_KILL_SUIDGID) kills
/// setuid, and setgid only with group-execute, as Linux's file_remove_privs does: 6700 becomes
/// 2700 (found by fscheck, never mode, `--seed 3542279154376839434 --ops 2164 --as-user
/// 1000:1000:2000`: the MDS's kill took setgid too whenever any execute bit was set).
#[test]
fn writes_kill_only_the_privilege_bits() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-write-kill");
    let root = ctx(0, 0);
    let owner = ctx(1000, 1000);
    for (i, (mode, after)) in [
        (0o2700, 0o2700),
        (0o6700, 0o2700),
        (0o2710, 0o0710),
        (0o4700, 0o0700),
        (0o6750, 0o0750),
        (0o4644, 0o0644),
        (0o2644, 0o2644),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("f{i}");
        let (ino, fh) = create_as(&fs, &owner, 1, &c(&name), 0o600);
        release(&fs, ino, fh);
        let mut attr = stat(&fs, ino);
        attr.st_mode = libc::S_IFREG | mode;
        fs.setattr(&root, ino, attr, None, SetattrValid::MODE)
            .unwrap();
        let fh = fs
            .open(&owner, ino, libc::O_RDWR as u32, 0)
            .unwrap()
            .0
            .unwrap();
        let data = bytes(3, 4000);
        let n = fs
            .write(
                &owner,
                ino,
                fh,
                &mut Payload(data.clone()),
                data.len() as u32,
                0,
                None,
                false,
                0,
                fuse_backend_rs::abi::fuse_abi::WRITE_KILL_PRIV,
            )
            .unwrap();
        assert_eq!(n, data.len());
        release(&fs, ino, fh);
        assert_eq!(
            stat(&fs, ino).st_mode & 0o7777,
            after,
            "write to a {mode:o} file by its owner"
        );
    }
}

/// A WRITE by a caller other than root clears setuid (and setgid with group-exec) whether or
/// not the guest flagged it (review of f9264a9, finding 10). The flag is the guest kernel's
/// report that the writer lacks CAP_FSETID; a hostile guest leaves it off, and with root
/// squashed or mapped it is never the caller's to waive: FALLOCATE and COPY_FILE_RANGE already
/// take every non-root caller as flagged. Root (CAP_FSETID, as the guest's kernel would have
/// flagged it otherwise) keeps the bits. libcephfs 16 clears the bits itself on a write by
/// anyone but the owner (so another id's setuid file was never kept: not a hole there), but
/// not on the owner's: before, the owner's unflagged writes kept them.
#[test]
fn hostile_unflagged_writes_by_non_root_callers_kill_setuid() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-write-unflagged");
    let root = ctx(0, 0);
    let owner = ctx(2000, 2000);
    let writer = ctx(1000, 1000);
    let mut failed = Vec::new();
    for (i, (who, name, mode, after)) in [
        (&writer, "a non-root writer", 0o4777, 0o0777),
        (&writer, "a non-root writer", 0o6777, 0o0777),
        (&writer, "a non-root writer", 0o2777, 0o0777),
        (&writer, "a non-root writer", 0o4666, 0o0666),
        (&owner, "the owner", 0o4700, 0o0700),
        (&owner, "the owner", 0o6750, 0o0750),
        (&owner, "the owner", 0o4600, 0o0600),
        (&root, "root", 0o4777, 0o4777),
    ]
    .into_iter()
    .enumerate()
    {
        let file = format!("f{i}");
        let (ino, fh) = create_as(&fs, &owner, 1, &c(&file), 0o666);
        release(&fs, ino, fh);
        let mut attr = stat(&fs, ino);
        attr.st_mode = libc::S_IFREG | mode;
        fs.setattr(&root, ino, attr, None, SetattrValid::MODE)
            .unwrap();
        let fh = fs
            .open(who, ino, libc::O_RDWR as u32, 0)
            .unwrap()
            .0
            .unwrap();
        let data = bytes(4, 100);
        let n = fs
            .write(
                who,
                ino,
                fh,
                &mut Payload(data.clone()),
                data.len() as u32,
                0,
                None,
                false,
                0,
                0,
            )
            .unwrap();
        assert_eq!(n, data.len());
        release(&fs, ino, fh);
        let got = stat(&fs, ino).st_mode & 0o7777;
        if got != after {
            failed.push(format!(
                "unflagged write by {name} to a {mode:o} file: {got:o}, not {after:o}"
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// No entry takes the snapshot directory's name. The MDS makes a real `.snap` entry when asked
/// (MKDIR, RENAME onto it), and from then on every client's lookup of the name answers with the
/// virtual snapshot directory: the entry and everything under it are hidden from all clients,
/// and its directory can never be emptied (found by the hostile fuzzer). The guest gets what a
/// Linux client of CephFS gets: the name is an existing directory that cannot be replaced,
/// removed or moved.
#[test]
fn hostile_no_entry_takes_the_snapshot_directory_name() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-snapdir-name");
    let root = ctx(0, 0);
    let d = fs.mkdir(&root, 1, &c("d"), 0o755, 0).unwrap().inode;
    let (f, fh) = create_as(&fs, &root, d, &c("f"), 0o644);
    release(&fs, f, fh);
    fs.mkdir(&root, d, &c("sub"), 0o755, 0).unwrap();
    let snap = c(".snap");
    let create = CreateIn {
        flags: (libc::O_RDWR | libc::O_CREAT) as u32,
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        fuse_flags: 0,
    };
    let refused = [
        (
            "mkdir",
            errno(fs.mkdir(&root, d, &snap, 0o755, 0)),
            libc::EEXIST,
        ),
        (
            "mknod",
            errno(fs.mknod(&root, d, &snap, libc::S_IFIFO | 0o644, 0, 0)),
            libc::EEXIST,
        ),
        (
            "symlink",
            errno(fs.symlink(&root, &c("f"), d, &snap)),
            libc::EEXIST,
        ),
        ("link", errno(fs.link(&root, f, d, &snap)), libc::EEXIST),
        (
            "create",
            errno(fs.create(&root, d, &snap, create)),
            libc::EEXIST,
        ),
        (
            "rename onto",
            errno(fs.rename(&root, d, &c("sub"), d, &snap, 0)),
            libc::EBUSY,
        ),
        (
            "rename of",
            errno(fs.rename(&root, d, &snap, d, &c("x"), 0)),
            libc::EBUSY,
        ),
        ("rmdir", errno(fs.rmdir(&root, d, &snap)), libc::EBUSY),
        ("unlink", errno(fs.unlink(&root, d, &snap)), libc::EISDIR),
    ];
    for (op, got, want) in refused {
        assert_eq!(got, want, "{op} .snap: errno {got}, expected {want}");
    }
    // Nothing of that name was made: the directory lists what it held, the name still finds
    // the virtual directory, and the directory can be emptied and removed.
    assert_eq!(names(&fs, d), ["f", "sub"]);
    let e = fs.lookup(&root, d, &snap).unwrap();
    assert_eq!(e.attr.st_mode & libc::S_IFMT, libc::S_IFDIR);
    fs.forget(&root, e.inode, 1);
    fs.unlink(&root, d, &c("f")).unwrap();
    fs.rmdir(&root, d, &c("sub")).unwrap();
    fs.rmdir(&root, 1, &c("d")).unwrap();
}

/// A read never returns bytes past the end of the file, even when the file's RADOS object
/// holds more. libcephfs reads O_DIRECT descriptors (and any without the cache cap)
/// synchronously, returning whatever the object holds: its cached path stops at the file's
/// size, this one does not. The soak met such objects after truncates and hole punches
/// (reads of 4096, 12288 and 61440 bytes from files whose size, asked of the daemon, was 1703
/// bytes into the page, 4888 and 0); here the object is made longer with `rados` directly.
/// Linux (and the kernel CephFS client) stop at the size. A server-side copy reads the same way,
/// so it must not copy the surplus either.
#[test]
fn reads_stop_at_the_end_of_the_file_when_its_object_is_longer() {
    let lab = Lab::get();
    let fs = fs_for(&lab, "sem-longobject");
    let (ino, fh) = create_as(&fs, &ctx(0, 0), 1, &c("f"), 0o644);
    let data = bytes(7, 4888);
    write(&fs, ino, fh, 0, &data);
    fs.fsync(&ctx(0, 0), ino, false, fh).unwrap();
    release(&fs, ino, fh);
    // The object now holds 12288 bytes: the file's 4888, then 7400 that are not the file's.
    let mut object = data.clone();
    object.extend(std::iter::repeat(0xee).take(7400));
    let path = lab
        .scratch(&format!("sem-longobject-{}", std::process::id()))
        .join("obj");
    std::fs::write(&path, &object).unwrap();
    let name = format!("{ino:x}.00000000");
    let st = std::process::Command::new("rados")
        .arg("-c")
        .arg(&lab.conf)
        .args(["--id", &lab.client_id, "-p", "cephfs_data", "put", &name])
        .arg(&path)
        .status()
        .expect("run rados");
    assert!(st.success(), "rados put {name}");

    let direct = open(&fs, ino, libc::O_RDONLY | libc::O_DIRECT);
    let got = read(&fs, ino, direct, 0, 12288);
    assert_eq!(got.len(), data.len(), "O_DIRECT read from 0");
    assert!(got == data, "O_DIRECT read from 0: other bytes");
    let got = read(&fs, ino, direct, 4096, 8192);
    assert_eq!(
        got.len(),
        data.len() - 4096,
        "O_DIRECT read of the last page"
    );
    assert!(
        got == data[4096..],
        "O_DIRECT read of the last page: other bytes"
    );
    assert_eq!(read(&fs, ino, direct, 8192, 4096).len(), 0, "past the end");

    let (dst, dfh) = create_as(&fs, &ctx(0, 0), 1, &c("copy"), 0o644);
    let n = fs
        .copy_range(&ctx(0, 0), ino, direct, 0, dst, dfh, 0, 12288)
        .unwrap();
    assert_eq!(n, data.len(), "copy_file_range copied past the end");
    let (attr, _) = fs.getattr(&ctx(0, 0), dst, None).unwrap();
    assert_eq!(attr.st_size, data.len() as i64);
    release(&fs, ino, direct);
    release(&fs, dst, dfh);
}
