//! `--readonly` (virtiofsd's option, `FsConfig::readonly`): the filesystem layer, on the real
//! cluster, answers EROFS to every operation that would change the export, before anything
//! reaches libcephfs, and serves every read as before. Another client then sees the export
//! unchanged. (On main, `--readonly` exits 2: tests/virtiofsd_flags.rs.)

use ceph_client::MountBuilder;
use ceph_virtiofsd::fs::{CephFs, FsConfig};
use fuse_backend_rs::abi::fuse_abi::{stat64, CreateIn, FsOptions, SetattrValid};
use fuse_backend_rs::api::filesystem::FileSystem;

use crate::common::{
    c, ceph_dir, ceph_lookup, ceph_read_all, create_as, ctx, errno, fs_write, Lab, Sink,
};

/// The filesystem layer on `export`, with `readonly`, after FUSE_INIT.
fn layer(lab: &Lab, export: &str, readonly: bool) -> CephFs {
    let mount = MountBuilder::new(Some(&lab.client_id))
        .and_then(|b| b.conf_read_file(Some(&lab.conf)))
        .and_then(|b| b.mount(export))
        .unwrap();
    let fs = CephFs::new(
        mount,
        FsConfig {
            readonly,
            ..FsConfig::default()
        },
    )
    .unwrap();
    fs.init(FsOptions::HANDLE_KILLPRIV_V2 | FsOptions::ASYNC_READ)
        .unwrap();
    fs
}

#[test]
fn readonly_refuses_every_change_with_erofs_and_serves_reads() {
    let lab = Lab::get();
    let name = format!("readonly-{}", std::process::id());
    let export = lab.export_dir(&name);
    let root = ctx(0, 0);

    // The export's content, written through a writable layer.
    {
        let rw = layer(&lab, &export, false);
        let (ino, fh) = create_as(&rw, &root, 1, &c("f"), 0o644);
        assert_eq!(fs_write(&rw, ino, fh, 0, b"hello").unwrap(), 5);
        rw.release(&root, ino, 0, fh, false, false, None).unwrap();
        rw.setxattr(&root, ino, &c("user.x"), b"1", 0).unwrap();
        rw.mkdir(&root, 1, &c("d"), 0o755, 0).unwrap();
    }

    let fs = layer(&lab, &export, true);
    let f = fs.lookup(&root, 1, &c("f")).unwrap().inode;
    let d = fs.lookup(&root, 1, &c("d")).unwrap().inode;

    // Reads work.
    let (fh, _, _) = fs.open(&root, f, libc::O_RDONLY as u32, 0).unwrap();
    let fh = fh.unwrap();
    let mut sink = Sink(Vec::new());
    assert_eq!(fs.read(&root, f, fh, &mut sink, 64, 0, None, 0).unwrap(), 5);
    assert_eq!(sink.0, b"hello");
    assert!(fs.getxattr(&root, f, &c("user.x"), 16).is_ok());
    assert!(fs.listxattr(&root, f, 64).is_ok());
    let (dh, _) = fs.opendir(&root, 1, 0).unwrap();
    fs.readdir(&root, 1, dh.unwrap(), 4096, 0, &mut |_| Ok(1))
        .unwrap();
    assert!(fs.statfs(&root, 1).is_ok());
    assert!(fs.access(&root, f, libc::R_OK as u32).is_ok());

    // Every change: EROFS.
    // SAFETY: stat64 is a plain C struct, for which all-zero bytes are a valid value.
    let mut st: stat64 = unsafe { std::mem::zeroed() };
    st.st_mode = 0o600;
    let changes: Vec<(&str, i32)> = vec![
        (
            "setattr mode",
            errno(fs.setattr(&root, f, st, None, SetattrValid::MODE)),
        ),
        (
            "setattr size",
            errno(fs.setattr(&root, f, st, None, SetattrValid::SIZE)),
        ),
        ("symlink", errno(fs.symlink(&root, &c("f"), 1, &c("l")))),
        (
            "mknod",
            errno(fs.mknod(&root, 1, &c("p"), libc::S_IFIFO | 0o644, 0, 0)),
        ),
        ("mkdir", errno(fs.mkdir(&root, 1, &c("e"), 0o755, 0))),
        ("unlink", errno(fs.unlink(&root, 1, &c("f")))),
        ("rmdir", errno(fs.rmdir(&root, 1, &c("d")))),
        ("rename", errno(fs.rename(&root, 1, &c("f"), d, &c("g"), 0))),
        ("link", errno(fs.link(&root, f, d, &c("h")))),
        (
            "create",
            errno(fs.create(
                &root,
                1,
                &c("new"),
                CreateIn {
                    flags: libc::O_RDWR as u32,
                    mode: 0o644,
                    umask: 0,
                    fuse_flags: 0,
                },
            )),
        ),
        (
            "tmpfile",
            errno(ceph_virtiofsd::server::WireOps::tmpfile(
                &fs,
                &root,
                1,
                CreateIn {
                    flags: libc::O_RDWR as u32,
                    mode: 0o644,
                    umask: 0,
                    fuse_flags: 0,
                },
            )),
        ),
        (
            "open O_WRONLY",
            errno(fs.open(&root, f, libc::O_WRONLY as u32, 0)),
        ),
        (
            "open O_RDWR",
            errno(fs.open(&root, f, libc::O_RDWR as u32, 0)),
        ),
        (
            "open O_TRUNC",
            errno(fs.open(&root, f, (libc::O_RDONLY | libc::O_TRUNC) as u32, 0)),
        ),
        ("write", errno(fs_write(&fs, f, fh, 0, b"HELLO"))),
        ("fallocate", errno(fs.fallocate(&root, f, fh, 0, 0, 4096))),
        (
            "setxattr",
            errno(fs.setxattr(&root, f, &c("user.y"), b"2", 0)),
        ),
        ("removexattr", errno(fs.removexattr(&root, f, &c("user.x")))),
    ];
    for (op, e) in &changes {
        assert_eq!(*e, libc::EROFS, "{op}: errno {e}");
    }
    fs.release(&root, f, 0, fh, false, false, None).unwrap();

    // Nothing changed, as another client sees it.
    let m = lab.ceph();
    let dir = ceph_dir(&m, &export);
    assert_eq!(ceph_read_all(&m, &dir, "f"), b"hello");
    for absent in ["l", "p", "e", "new"] {
        assert!(
            ceph_lookup(&m, &dir, absent).is_none(),
            "{absent} was created"
        );
    }
    let d_dir = ceph_dir(&m, &format!("{export}/d"));
    for absent in ["g", "h"] {
        assert!(
            ceph_lookup(&m, &d_dir, absent).is_none(),
            "d/{absent} exists"
        );
    }
}
