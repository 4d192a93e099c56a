//! Compares the Rust mirrors of libcephfs's C structs (and the libc structs the ll calls take
//! by pointer) with the C compiler's view of the real header, through `src/layout_shim.c`.
//! Needs no cluster.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::mem::{offset_of, size_of};

use ceph_client::sys;

fn c_layout() -> BTreeMap<String, u64> {
    let mut map = BTreeMap::new();
    // SAFETY: the shim's count function has no preconditions.
    let n = unsafe { sys::ceph_client_layout_count() };
    for i in 0..n {
        // SAFETY: `i` < count, so the shim returns a pointer into its static table.
        let e = unsafe { &*sys::ceph_client_layout_get(i) };
        // SAFETY: names are static NUL-terminated string literals.
        let name = unsafe { CStr::from_ptr(e.name) }
            .to_string_lossy()
            .into_owned();
        map.insert(name, e.value as u64);
    }
    map
}

macro_rules! rows {
    ($($name:expr => $value:expr,)*) => {
        vec![$(($name, $value as u64),)*]
    };
}

#[test]
fn rust_mirrors_match_the_c_header() {
    use sys::{ceph_client_callback_args as Cb, ceph_statx as Stx, vinodeno_t as Vino};
    let rust: Vec<(&str, u64)> = rows![
        "sizeof ceph_statx" => size_of::<Stx>(),
        "ceph_statx.stx_mask" => offset_of!(Stx, stx_mask),
        "ceph_statx.stx_blksize" => offset_of!(Stx, stx_blksize),
        "ceph_statx.stx_nlink" => offset_of!(Stx, stx_nlink),
        "ceph_statx.stx_uid" => offset_of!(Stx, stx_uid),
        "ceph_statx.stx_gid" => offset_of!(Stx, stx_gid),
        "ceph_statx.stx_mode" => offset_of!(Stx, stx_mode),
        "ceph_statx.stx_ino" => offset_of!(Stx, stx_ino),
        "ceph_statx.stx_size" => offset_of!(Stx, stx_size),
        "ceph_statx.stx_blocks" => offset_of!(Stx, stx_blocks),
        "ceph_statx.stx_dev" => offset_of!(Stx, stx_dev),
        "ceph_statx.stx_rdev" => offset_of!(Stx, stx_rdev),
        "ceph_statx.stx_atime" => offset_of!(Stx, stx_atime),
        "ceph_statx.stx_ctime" => offset_of!(Stx, stx_ctime),
        "ceph_statx.stx_mtime" => offset_of!(Stx, stx_mtime),
        "ceph_statx.stx_btime" => offset_of!(Stx, stx_btime),
        "ceph_statx.stx_version" => offset_of!(Stx, stx_version),
        "sizeof timespec" => size_of::<sys::Timespec>(),
        "timespec.tv_sec" => offset_of!(sys::Timespec, tv_sec),
        "timespec.tv_nsec" => offset_of!(sys::Timespec, tv_nsec),
        "sizeof vinodeno_t" => size_of::<Vino>(),
        "vinodeno_t.ino" => offset_of!(Vino, ino),
        "vinodeno_t.snapid" => offset_of!(Vino, snapid),
        "sizeof inodeno_t" => size_of::<sys::inodeno_t>(),
        "sizeof _snapid_t" => size_of::<sys::snapid_t>(),
        "sizeof ceph_client_callback_args" => size_of::<Cb>(),
        "ceph_client_callback_args.handle" => offset_of!(Cb, handle),
        "ceph_client_callback_args.ino_cb" => offset_of!(Cb, ino_cb),
        "ceph_client_callback_args.dentry_cb" => offset_of!(Cb, dentry_cb),
        "ceph_client_callback_args.switch_intr_cb" => offset_of!(Cb, switch_intr_cb),
        "ceph_client_callback_args.remount_cb" => offset_of!(Cb, remount_cb),
        "ceph_client_callback_args.umask_cb" => offset_of!(Cb, umask_cb),
        "ceph_client_callback_args.ino_release_cb" => offset_of!(Cb, ino_release_cb),
        "sizeof statvfs" => size_of::<libc::statvfs>(),
        "statvfs.f_bsize" => offset_of!(libc::statvfs, f_bsize),
        "statvfs.f_frsize" => offset_of!(libc::statvfs, f_frsize),
        "statvfs.f_blocks" => offset_of!(libc::statvfs, f_blocks),
        "statvfs.f_bfree" => offset_of!(libc::statvfs, f_bfree),
        "statvfs.f_bavail" => offset_of!(libc::statvfs, f_bavail),
        "statvfs.f_files" => offset_of!(libc::statvfs, f_files),
        "statvfs.f_ffree" => offset_of!(libc::statvfs, f_ffree),
        "statvfs.f_favail" => offset_of!(libc::statvfs, f_favail),
        "statvfs.f_fsid" => offset_of!(libc::statvfs, f_fsid),
        "statvfs.f_flag" => offset_of!(libc::statvfs, f_flag),
        "statvfs.f_namemax" => offset_of!(libc::statvfs, f_namemax),
        "sizeof flock" => size_of::<libc::flock>(),
        "flock.l_type" => offset_of!(libc::flock, l_type),
        "flock.l_whence" => offset_of!(libc::flock, l_whence),
        "flock.l_start" => offset_of!(libc::flock, l_start),
        "flock.l_len" => offset_of!(libc::flock, l_len),
        "flock.l_pid" => offset_of!(libc::flock, l_pid),
        "sizeof dirent" => size_of::<libc::dirent>(),
        "dirent.d_ino" => offset_of!(libc::dirent, d_ino),
        "dirent.d_off" => offset_of!(libc::dirent, d_off),
        "dirent.d_reclen" => offset_of!(libc::dirent, d_reclen),
        "dirent.d_type" => offset_of!(libc::dirent, d_type),
        "dirent.d_name" => offset_of!(libc::dirent, d_name),
        "CEPH_NOSNAP" => ceph_client::CEPH_NOSNAP,
        "CEPH_STATX_ALL_STATS" => ceph_client::CEPH_STATX_ALL_STATS,
        "CEPH_SETATTR_KILL_SGUID" => ceph_client::CEPH_SETATTR_KILL_SGUID,
        "CEPH_SETATTR_KILL_SUID" => ceph_client::CEPH_SETATTR_KILL_SUID,
        "CEPH_SETATTR_KILL_SGID" => ceph_client::CEPH_SETATTR_KILL_SGID,
        "AT_STATX_DONT_SYNC" => ceph_client::AT_STATX_DONT_SYNC,
        "AT_NO_ATTR_SYNC" => ceph_client::AT_NO_ATTR_SYNC,
        "AT_SYMLINK_NOFOLLOW" => ceph_client::AT_SYMLINK_NOFOLLOW,
    ];
    #[cfg(libcephfs_nonblocking)]
    let rust = {
        use sys::ceph_ll_io_info as Io;
        let mut rust = rust;
        rust.extend(rows![
            "sizeof ceph_ll_io_info" => size_of::<Io>(),
            "ceph_ll_io_info.callback" => offset_of!(Io, callback),
            "ceph_ll_io_info.priv" => offset_of!(Io, priv_),
            "ceph_ll_io_info.fh" => offset_of!(Io, fh),
            "ceph_ll_io_info.iov" => offset_of!(Io, iov),
            "ceph_ll_io_info.iovcnt" => offset_of!(Io, iovcnt),
            "ceph_ll_io_info.off" => offset_of!(Io, off),
            "ceph_ll_io_info.result" => offset_of!(Io, result),
            "ceph_ll_io_info.write" => offset_of!(Io, write),
            "ceph_ll_io_info.fsync" => offset_of!(Io, fsync),
            "ceph_ll_io_info.syncdataonly" => offset_of!(Io, syncdataonly),
        ]);
        rust
    };
    let c = c_layout();
    let mut mismatches = Vec::new();
    for (name, value) in &rust {
        match c.get(*name) {
            Some(cv) if cv == value => {}
            Some(cv) => mismatches.push(format!("{name}: Rust {value}, C {cv}")),
            None => mismatches.push(format!("{name}: missing from the C shim")),
        }
    }
    for name in c.keys() {
        if !rust.iter().any(|(n, _)| n == name) {
            mismatches.push(format!("{name}: in the C shim but not checked in Rust"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "layout mismatches:\n{}",
        mismatches.join("\n")
    );
    // The facts the rest of the project relies on, spelled out.
    assert_eq!(size_of::<ceph_client::Statx>(), 136);
    assert_eq!(offset_of!(ceph_client::Statx, stx_mode), 20);
}

#[test]
fn ceph_error_keeps_the_errno() {
    let e = ceph_client::check("ceph_ll_lookup", -libc::ENOENT).unwrap_err();
    assert_eq!(e.op, "ceph_ll_lookup");
    assert_eq!(e.errno(), libc::ENOENT);
    assert!(e.to_string().starts_with("ceph_ll_lookup failed"), "{e}");
    let io: std::io::Error = e.into();
    assert_eq!(io.raw_os_error(), Some(libc::ENOENT));
    assert_eq!(ceph_client::check("ceph_ll_read", 5i64), Ok(5));
}

#[test]
fn userperm_owns_its_groups() {
    let p = ceph_client::UserPerm::new(1000, 100, &[4, 5, 6]);
    assert_eq!(
        (p.uid(), p.gid(), p.groups()),
        (1000, 100, &[4u32, 5, 6][..])
    );
    let r = ceph_client::UserPerm::root();
    assert_eq!((r.uid(), r.gid(), r.groups().len()), (0, 0, 0));
}
