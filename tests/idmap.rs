//! uid/gid translation against the real cluster, called in-process through the `FileSystem`
//! trait the way the FUSE server calls it: a non-root guest user works on files owned by the
//! Ceph ids its guest ids map to, sees them as its own, creates files that Ceph records under
//! the mapped ids, and forbidden guest ids get EPERM. Ceph's own view (an untranslated
//! filesystem on a session of its own) is checked side by side.

mod common;

use ceph_virtiofsd::fs::{CephFs, FsConfig};
use ceph_virtiofsd::idmap::{IdMapping, Rule};
use fuse_backend_rs::abi::fuse_abi::{stat64, CreateIn, FsOptions, SetattrValid};
use fuse_backend_rs::api::filesystem::FileSystem;

use common::{c, ctx, errno, Lab};

/// Guest 1000 is Ceph 5000 (both ways); guest root is squashed to Ceph 6000 (shown back as 0);
/// guest 666 may not be used.
const UID_RULES: &[&str] = &[
    "map:1000:5000:1",
    "squash-guest:0:6000:1",
    "host:6000:0:1",
    "forbid-guest:666:1",
];
const GID_RULES: &[&str] = &["map:1000:5000:1", "forbid-guest:666:1"];

fn rules(list: &[&str]) -> Vec<Rule> {
    list.iter()
        .map(|r| r.parse().unwrap_or_else(|e| panic!("{r}: {e}")))
        .collect()
}

fn owner(st: &stat64) -> (u32, u32) {
    (st.st_uid, st.st_gid)
}

fn chown(fs: &CephFs, ino: u64, uid: u32, gid: u32, mode: u32) {
    // SAFETY: stat64 is a plain C struct of integers; all-zero is a valid value.
    let mut attr: stat64 = unsafe { std::mem::zeroed() };
    attr.st_uid = uid;
    attr.st_gid = gid;
    attr.st_mode = mode;
    fs.setattr(
        &ctx(0, 0),
        ino,
        attr,
        None,
        SetattrValid::UID | SetattrValid::GID | SetattrValid::MODE,
    )
    .unwrap_or_else(|e| panic!("chown on the Ceph side: {e}"));
}

/// The owner of `name` in directory `dir` as Ceph records it (through the untranslated view).
fn ceph_owner(ceph: &CephFs, dir: u64, name: &str) -> (u32, u32) {
    owner(&ceph.lookup(&ctx(0, 0), dir, &c(name)).unwrap().attr)
}

#[test]
fn a_non_root_guest_user_works_on_files_owned_by_its_mapped_ids() {
    let lab = Lab::get();
    let export = lab.export_dir(&format!("idmap-{}", std::process::id()));
    let mount = || {
        ceph_client::MountBuilder::new(Some(&lab.client_id))
            .and_then(|b| b.conf_read_file(Some(&lab.conf)))
            .and_then(|b| b.mount(&export))
            .unwrap()
    };
    let ceph = CephFs::new(mount(), FsConfig::default()).unwrap();
    let map = IdMapping::new(&rules(UID_RULES), &rules(GID_RULES)).unwrap();
    let cfg = FsConfig {
        idmap: map,
        ..FsConfig::default()
    };
    let fs = CephFs::new(mount(), cfg).unwrap();
    for f in [&ceph, &fs] {
        f.init(FsOptions::HANDLE_KILLPRIV_V2 | FsOptions::ASYNC_READ)
            .unwrap();
    }

    // The Ceph side (unmapped view, as root): a private directory and file owned by 5000:5000.
    let ceph_root = ctx(0, 0);
    let dir = ceph.mkdir(&ceph_root, 1, &c("private"), 0o700, 0).unwrap();
    chown(&ceph, dir.inode, 5000, 5000, 0o700);
    let (file, fh, _, _) = ceph
        .create(
            &ceph_root,
            dir.inode,
            &c("data"),
            CreateIn {
                flags: libc::O_RDWR as u32,
                mode: 0o600,
                umask: 0,
                fuse_flags: 0,
            },
        )
        .unwrap();
    if let Some(fh) = fh {
        ceph.release(&ceph_root, file.inode, 0, fh, false, false, None)
            .unwrap();
    }
    chown(&ceph, file.inode, 5000, 5000, 0o600);

    // Guest user 1000 sees its own files...
    let user = ctx(1000, 1000);
    let d = fs.lookup(&user, 1, &c("private")).unwrap();
    assert_eq!(
        owner(&d.attr),
        (1000, 1000),
        "directory owner as the guest sees it"
    );
    let f = fs.lookup(&user, d.inode, &c("data")).unwrap();
    assert_eq!(owner(&f.attr), (1000, 1000));
    let (st, _) = fs.getattr(&user, f.inode, None).unwrap();
    assert_eq!(owner(&st), (1000, 1000));
    // ...and Ceph checks its requests as 5000: it may open the 0600 file in the 0700 directory.
    let (h, _, _) = fs.open(&user, f.inode, libc::O_RDWR as u32, 0).unwrap();
    let h = h.expect("a handle");
    fs.release(&user, f.inode, 0, h, false, false, None)
        .unwrap();
    fs.access(&user, d.inode, libc::W_OK as u32 | libc::X_OK as u32)
        .unwrap();

    // A file the guest user creates is recorded under 5000 on Ceph, shown as 1000 to the guest.
    let (e, h, _, _) = fs
        .create(
            &user,
            d.inode,
            &c("by-guest"),
            CreateIn {
                flags: libc::O_RDWR as u32,
                mode: 0o640,
                umask: 0,
                fuse_flags: 0,
            },
        )
        .unwrap();
    assert_eq!(owner(&e.attr), (1000, 1000));
    if let Some(h) = h {
        fs.release(&user, e.inode, 0, h, false, false, None)
            .unwrap();
    }
    assert_eq!(
        ceph_owner(&ceph, dir.inode, "by-guest"),
        (5000, 5000),
        "Ceph records the mapped ids"
    );
    let sub = fs.mkdir(&user, d.inode, &c("subdir"), 0o755, 0).unwrap();
    assert_eq!(owner(&sub.attr), (1000, 1000));
    assert_eq!(ceph_owner(&ceph, dir.inode, "subdir"), (5000, 5000));

    // Another, unmapped guest user is just that user on Ceph: no access to the 0700 directory.
    let stranger = ctx(2000, 2000);
    assert_eq!(
        errno(fs.lookup(&stranger, d.inode, &c("data"))),
        libc::EACCES
    );

    // Guest root is squashed to Ceph 6000, which Ceph shows back to the guest as root: a file it
    // creates at the top is owned by 6000 on Ceph and by 0 in the guest. Guest root is not Ceph
    // root, so it cannot enter the 0700 directory of 5000.
    let root = ctx(0, 0);
    let (e, h, _, _) = fs
        .create(
            &root,
            1,
            &c("by-root"),
            CreateIn {
                flags: libc::O_RDWR as u32,
                mode: 0o644,
                umask: 0,
                fuse_flags: 0,
            },
        )
        .unwrap();
    if let Some(h) = h {
        fs.release(&root, e.inode, 0, h, false, false, None)
            .unwrap();
    }
    assert_eq!(e.attr.st_uid, 0);
    assert_eq!(ceph_owner(&ceph, 1, "by-root").0, 6000);
    assert_eq!(errno(fs.lookup(&root, d.inode, &c("data"))), libc::EACCES);

    // chown by the owner (SETATTR): guest ids are translated before Ceph sees them. 6000 owns
    // by-root; giving its group to guest gid 1000 means Ceph gid 5000.
    // SAFETY: stat64 is a plain C struct of integers; all-zero is a valid value.
    let mut attr: stat64 = unsafe { std::mem::zeroed() };
    attr.st_gid = 1000;
    let (shown, _) = fs
        .setattr(&ctx(0, 1000), e.inode, attr, None, SetattrValid::GID)
        .unwrap();
    assert_eq!(shown.st_gid, 1000);
    assert_eq!(ceph_owner(&ceph, 1, "by-root").1, 5000);
    // chown to a forbidden id is refused before reaching Ceph.
    attr.st_uid = 666;
    assert_eq!(
        errno(fs.setattr(&root, e.inode, attr, None, SetattrValid::UID)),
        libc::EPERM
    );

    // Forbidden guest ids cannot do anything, not even look.
    assert_eq!(
        errno(fs.lookup(&ctx(666, 1000), 1, &c("private"))),
        libc::EPERM
    );
    assert_eq!(errno(fs.getattr(&ctx(1000, 666), 1, None)), libc::EPERM);
    assert_eq!(
        errno(fs.mkdir(&ctx(666, 666), 1, &c("nope"), 0o755, 0)),
        libc::EPERM
    );

    // readdirplus entries carry translated owners too.
    let (dh, _) = fs.opendir(&user, d.inode, 0).unwrap();
    let dh = dh.expect("a directory handle");
    let mut seen = Vec::new();
    fs.readdirplus(&user, d.inode, dh, 4096, 0, &mut |de, entry| {
        let name = String::from_utf8_lossy(de.name).into_owned();
        if name != "." && name != ".." {
            seen.push((name, owner(&entry.attr)));
        }
        Ok(1)
    })
    .unwrap();
    fs.releasedir(&user, d.inode, 0, dh).unwrap();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("by-guest".to_owned(), (1000, 1000)),
            ("data".to_owned(), (1000, 1000)),
            ("subdir".to_owned(), (1000, 1000)),
        ]
    );
    fs.shutdown().unwrap();
    ceph.shutdown().unwrap();
}

/// The example configuration's [sandbox] section parses into the documented translation.
#[test]
fn example_config_translation_and_sandbox() {
    use ceph_virtiofsd::args::Args;
    use ceph_virtiofsd::idmap::{GuestGid, GuestUid, HostGid, HostUid};
    use ceph_virtiofsd::sandbox::SeccompMode;
    use clap::Parser;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/ceph-virtiofsd.toml");
    let args = Args::try_parse_from([
        "ceph-virtiofsd".as_ref(),
        "--config".as_ref(),
        path.as_os_str(),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let config = ceph_virtiofsd::config::Config::try_from(args)
        .unwrap_or_else(|e| panic!("{}", ceph_virtiofsd::report(&e)));
    assert_eq!(config.sandbox.seccomp, SeccompMode::Kill);
    // No [sandbox] user: the package's user when started as root and it exists, else none.
    assert_eq!(
        config.sandbox.user,
        ceph_virtiofsd::sandbox::package_account().unwrap_or_else(|e| panic!("{e}"))
    );
    let ids = &config.idmap;
    let host_uid = |g| ids.host_uid(GuestUid::new(g)).ok().map(HostUid::get);
    assert_eq!(host_uid(1000), Some(101_000));
    let host_gid = ids.host_gid(GuestGid::new(1999)).ok().map(HostGid::get);
    assert_eq!(host_gid, Some(101_999));
    assert_eq!(ids.guest_uid(HostUid::new(101_500)), GuestUid::new(1500));
    assert_eq!(host_uid(0), Some(0));
}

/// Walk `path` from the root of `m` (as Ceph root).
fn walk(m: &ceph_client::Mount, path: &str) -> ceph_client::Inode {
    let perm = ceph_client::UserPerm::root();
    let mut cur = m.lookup_root().unwrap();
    for comp in path.split('/').filter(|s| !s.is_empty()) {
        cur = m
            .lookup(
                &cur,
                &c(comp),
                ceph_client::CEPH_STATX_BASIC_STATS,
                0,
                &perm,
            )
            .unwrap_or_else(|e| panic!("lookup {comp} of {path}: {e}"))
            .0;
    }
    cur
}

fn ceph_chown(m: &ceph_client::Mount, ino: &ceph_client::Inode, uid: u32, gid: u32, mode: u16) {
    let st = ceph_client::Statx {
        stx_uid: uid,
        stx_gid: gid,
        stx_mode: mode,
        ..Default::default()
    };
    let mask = ceph_client::CEPH_SETATTR_UID
        | ceph_client::CEPH_SETATTR_GID
        | ceph_client::CEPH_SETATTR_MODE;
    m.setattr(ino, &st, mask, &ceph_client::UserPerm::root())
        .unwrap_or_else(|e| panic!("chown on Ceph: {e}"));
}

/// A real guest: its unprivileged user `tester` (1000) is Ceph 101000 through the daemon's
/// `--translate-uid/--translate-gid map:1000:101000:1000`; the daemon runs as nobody under the
/// seccomp filter in kill mode.
#[test]
fn guest_user_sees_and_uses_files_owned_by_its_mapped_ids() {
    let lab = Lab::get();
    let name = format!("idmap-guest-{}", std::process::id());
    let export = lab.export_dir(&name);
    let m = lab.ceph();
    let perm = ceph_client::UserPerm::root();
    let top = walk(&m, &export);
    let (dir, _) = m
        .mkdir(
            &top,
            &c("owned"),
            0o700,
            ceph_client::CEPH_STATX_BASIC_STATS,
            0,
            &perm,
        )
        .unwrap();
    ceph_chown(&m, &dir, 101_000, 101_000, 0o700);
    let (file, _, f) = m
        .create(
            &dir,
            &c("f"),
            0o600,
            libc::O_WRONLY | libc::O_CREAT,
            ceph_client::CEPH_STATX_BASIC_STATS,
            0,
            &perm,
        )
        .unwrap();
    f.write(0, b"mapped-content\n").unwrap();
    f.fsync(false).unwrap();
    drop(f);
    ceph_chown(&m, &file, 101_000, 101_000, 0o600);

    let work = lab.scratch(&name);
    let mut daemon = common::Daemon::start(
        &lab,
        &work,
        &export,
        &[
            "--translate-uid",
            "map:1000:101000:1000",
            "--translate-gid",
            "map:1000:101000:1000",
            "--user",
            "nobody",
            "--seccomp",
            "kill",
        ],
    );
    let script = "#!/bin/sh\n\
        echo 'stranger:x:2000:2000::/:/bin/sh' >> /etc/passwd\n\
        echo \"OWNER $(stat -c %u:%g /mnt/owned/f)\"\n\
        echo \"DIR-OWNER $(stat -c %u:%g /mnt/owned)\"\n\
        echo \"READ $(su tester -s /bin/sh -c 'cat /mnt/owned/f')\"\n\
        su tester -s /bin/sh -c 'echo new > /mnt/owned/by-tester && mkdir /mnt/owned/d' && echo WRITE-OK\n\
        echo \"NEW-OWNER $(stat -c %u:%g /mnt/owned/by-tester)\"\n\
        su stranger -s /bin/sh -c 'cat /mnt/owned/f' || echo STRANGER-DENIED\n\
        exit 0\n";
    let run = common::run_guest(&lab, &work, &daemon, script, &[], 600);
    let has = |s: &str| run.console.lines().any(|l| l.trim() == s);
    assert!(has("OWNER 1000:1000"), "owner not translated");
    assert!(has("DIR-OWNER 1000:1000"));
    assert!(has("READ mapped-content"), "tester could not read its file");
    assert!(has("WRITE-OK"), "tester could not write in its directory");
    assert!(has("NEW-OWNER 1000:1000"));
    assert!(has("STRANGER-DENIED"), "an unmapped user read a 0600 file");
    assert_eq!(run.code(), 0);

    // On the Ceph side, what tester created belongs to the mapped ids.
    for created in ["by-tester", "d"] {
        let ino = walk(&m, &format!("{export}/owned/{created}"));
        let st = m
            .getattr(&ino, ceph_client::CEPH_STATX_BASIC_STATS, 0, &perm)
            .unwrap();
        assert_eq!((st.stx_uid, st.stx_gid), (101_000, 101_000), "{created}");
    }
    let status = daemon.stop().expect("daemon status");
    assert!(
        status.success(),
        "daemon exit: {status}\n{}",
        daemon.log_text()
    );
}
