//! Live migration of a guest's FUSE session between two daemons, host side: the filesystem
//! layer of daemon A saves its session (the bytes SET_DEVICE_STATE_FD carries), daemon B — a
//! second libcephfs client with another cephx id (`client.migdst`) — loads it, and the guest's
//! node ids and handles go on working there. The vhost-user half (the fd, the transfer thread,
//! CHECK_DEVICE_STATE) is covered by the unit tests of `vhost_user`.
//!
//! Run alone: `cargo test --test migration` (needs the lab cluster, see tests/run).

mod common;

use std::ffi::CString;
use std::io;
use std::path::Path;
use std::time::Instant;

use ceph_client::{MountBuilder, UserPerm, CEPH_STATX_BASIC_STATS};
use ceph_virtiofsd::fs::CephFs;
use ceph_virtiofsd::migration::{DeviceState, MigrationError, OnError};
use fuse_backend_rs::abi::fuse_abi::{FsOptions, LK_FLOCK};
use fuse_backend_rs::api::filesystem::{FileLock, FileSystem};

use common::{c, ctx, errno, Lab, Sink};

/// The destination's cephx id: another client than the source's.
const DEST_ID: &str = "migdst";

/// A keyring for `client.migdst` (created once per cluster; `get-or-create` is idempotent).
/// Each call writes its own file: tests run in parallel, and `Lab::scratch` empties the
/// directory it is given, so a shared one lost another test's keyring before it was read.
fn dest_keyring(lab: &Lab) -> std::path::PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = lab
        .scratch(&format!("migdst-{}-{n}", std::process::id()))
        .join("keyring");
    let st = std::process::Command::new("ceph")
        .arg("-c")
        .arg(&lab.conf)
        .args(["auth", "get-or-create", &format!("client.{DEST_ID}")])
        .args(["mon", "allow r", "mds", "allow rw", "osd", "allow rw"])
        .arg("-o")
        .arg(&path)
        .status()
        .expect("run the ceph CLI");
    assert!(
        st.success(),
        "ceph auth get-or-create client.{DEST_ID}: {st}"
    );
    path
}

/// Daemon B: the filesystem layer on the same export, as `client.migdst`, with no FUSE
/// session (no INIT: the guest does not send one after a migration).
fn destination(lab: &Lab, export: &str, on_error: OnError) -> CephFs {
    let keyring = dest_keyring(lab);
    let mount = MountBuilder::new(Some(DEST_ID))
        .and_then(|b| b.conf_read_file(Some(&lab.conf)))
        .and_then(|b| b.conf_set("keyring", keyring.to_str().unwrap()))
        .and_then(|b| b.mount(export))
        .expect("mount the export as client.migdst");
    let fs = CephFs::new(mount, Default::default()).unwrap();
    fs.set_migration_on_error(on_error);
    fs
}

fn write(fs: &CephFs, ino: u64, fh: u64, off: u64, data: &[u8]) -> io::Result<usize> {
    common::fs_write(fs, ino, fh, off, data)
}

fn read(fs: &CephFs, ino: u64, fh: u64, off: u64, len: u32) -> io::Result<Vec<u8>> {
    let mut sink = Sink(Vec::new());
    fs.read(&ctx(0, 0), ino, fh, &mut sink, len, off, None, 0)?;
    Ok(sink.0)
}

fn open(fs: &CephFs, ino: u64, flags: i32) -> u64 {
    fs.open(&ctx(0, 0), ino, flags as u32, 0)
        .unwrap()
        .0
        .unwrap()
}

/// One READDIRPLUS reply of at most `size` bytes from `off`: the names and the offset to go on
/// from (what the guest sends next).
fn readdir_page(fs: &CephFs, dir: u64, fh: u64, off: u64, size: u32) -> (Vec<String>, u64) {
    let (mut names, mut next) = (Vec::new(), off);
    fs.readdirplus(&ctx(0, 0), dir, fh, size, off, &mut |d, _| {
        next = d.offset;
        let n = String::from_utf8_lossy(d.name).into_owned();
        if n != "." && n != ".." {
            names.push(n);
        }
        Ok(1)
    })
    .unwrap();
    (names, next)
}

/// The contents of `/export/name`, read by a separate CephFS client.
fn read_via_other_client(lab: &Lab, export: &str, name: &str) -> Vec<u8> {
    let m = lab.ceph();
    let perm = UserPerm::root();
    let mut dir = m.lookup_root().unwrap();
    for part in Path::new(export).join(name).iter().skip(1) {
        let part = CString::new(part.to_str().unwrap()).unwrap();
        dir = m
            .lookup(&dir, &part, CEPH_STATX_BASIC_STATS, 0, &perm)
            .unwrap()
            .0;
    }
    let f = m.open(&dir, libc::O_RDONLY, &perm).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let n = f.read(0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// Remove `/export/name` through a separate client, and wait (bounded) until no client finds
/// its inode by number any more: the MDS purges it once nobody holds it.
fn delete_and_purge(lab: &Lab, export: &str, name: &str, ino: u64) {
    let m = lab.ceph();
    let perm = UserPerm::root();
    let dir = m.lookup_root().unwrap();
    let (dir, _) = m
        .lookup(&dir, &c(&export[1..]), CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    m.unlink(&dir, &c(name), &perm).unwrap();
    drop(dir);
    drop(m);
    for _ in 0..300 {
        let probe = lab.ceph();
        if probe.lookup_vino(ino, u64::MAX - 1).is_err() {
            return;
        }
        drop(probe);
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("inode {ino:#x} of the deleted file is still found by number after 30 s");
}

#[test]
fn a_session_moves_to_another_client_id_and_deleted_files_are_stale() {
    let lab = Lab::get();
    let name = format!("migrate-{}", std::process::id());
    let export = format!("/{name}");
    let a = common::fs_layer(&lab, &name);
    let root = ctx(0, 0);

    // The guest's session on A: a directory (looked up twice), files in it, an append-only
    // log with data, a directory stream listed half-way, a file that will be deleted.
    let d = a.mkdir(&root, 1, &c("d"), 0o755, 0).unwrap().inode;
    assert_eq!(a.lookup(&root, 1, &c("d")).unwrap().inode, d);
    for i in 0..12 {
        let (ino, fh) = common::create_as(&a, &root, d, &c(&format!("f{i:02}")), 0o644);
        a.release(&root, ino, 0, fh, false, false, None).unwrap();
    }
    let (log, created) = common::create_as(&a, &root, 1, &c("log"), 0o644);
    a.release(&root, log, 0, created, false, false, None)
        .unwrap();
    let log_fh = open(&a, log, libc::O_WRONLY | libc::O_APPEND);
    assert_eq!(write(&a, log, log_fh, 0, b"before ").unwrap(), 7);
    a.fsync(&root, log, false, log_fh).unwrap();
    let dir_fh = a.opendir(&root, d, 0).unwrap().0.unwrap();
    // Room for a few entries only: the guest has seen a part of the directory.
    let (first, pos) = readdir_page(&a, d, dir_fh, 0, 1000);
    assert!(!first.is_empty() && first.len() < 12, "{first:?}");
    let (gone, gone_created) = common::create_as(&a, &root, 1, &c("gone"), 0o644);
    assert_eq!(write(&a, gone, gone_created, 0, b"doomed").unwrap(), 6);
    let nodes_before = a.node_count();

    // Source: the state, as SET_DEVICE_STATE_FD (save) writes it.
    let bytes = a.save_state().unwrap();
    println!("state: {} bytes for {nodes_before} nodes", bytes.len());
    // The source ends its session (here before the deletion, so that nothing holds the
    // deleted file and the MDS purges it); another client deletes the file meanwhile.
    a.shutdown().unwrap();
    delete_and_purge(&lab, &export, "gone", gone);

    // Destination: another process, another cephx id.
    let b = destination(&lab, &export, OnError::GuestError);
    let report = b.load_state(&bytes).unwrap();
    println!("load: {report}");
    assert_eq!((report.lost_nodes, report.lost_handles), (1, 1), "{report}");
    assert_eq!(b.node_count(), nodes_before - 1);

    // Node ids go on: getattr, lookups in the restored directory, and the exact lookup count
    // (two lookups of "d": FORGET of 2 drops it, no more, no less).
    assert_eq!(b.getattr(&root, d, None).unwrap().0.st_ino, d);
    assert!(b.lookup(&root, d, &c("f03")).unwrap().inode != 0);
    // The write-only handle writes where the guest says (its kernel puts an O_APPEND write
    // at the size it knows), and is still write-only: its open flags came along.
    assert_eq!(write(&b, log, log_fh, 7, b"after").unwrap(), 5);
    assert_eq!(errno(read(&b, log, log_fh, 0, 4)), libc::EBADF);
    b.fsync(&root, log, false, log_fh).unwrap();
    b.release(&root, log, 0, log_fh, true, false, None).unwrap();
    assert_eq!(read_via_other_client(&lab, &export, "log"), b"before after");
    // The directory stream goes on where the guest stopped: every name once.
    let (mut rest, mut off) = (Vec::new(), pos);
    loop {
        let (page, next) = readdir_page(&b, d, dir_fh, off, 4096);
        if page.is_empty() {
            break;
        }
        rest.extend(page);
        off = next;
    }
    let mut all: Vec<String> = first.iter().chain(rest.iter()).cloned().collect();
    all.sort();
    let want: Vec<String> = (0..12).map(|i| format!("f{i:02}")).collect();
    assert_eq!(all, want, "first page {first:?}, rest {rest:?}");
    b.releasedir(&root, d, 0, dir_fh).unwrap();
    // The deleted file: its node and its handle are stale, and the handle's release says so
    // once.
    assert_eq!(errno(b.getattr(&root, gone, None)), libc::ESTALE);
    assert_eq!(errno(read(&b, gone, gone_created, 0, 6)), libc::ESTALE);
    assert_eq!(errno(write(&b, gone, gone_created, 0, b"x")), libc::ESTALE);
    assert_eq!(b.stale_handle_count(), 1);
    assert_eq!(
        errno(b.release(&root, gone, 0, gone_created, false, false, None)),
        libc::ESTALE
    );
    assert_eq!(b.stale_handle_count(), 0);
    // New handles never take a number the guest holds.
    let again = open(&b, log, libc::O_RDONLY);
    assert!(![log_fh, dir_fh, gone_created].contains(&again));
    assert_eq!(read(&b, log, again, 0, 64).unwrap(), b"before after");
    b.release(&root, log, 0, again, false, false, None).unwrap();
    // Lookups: the guest got "d" from MKDIR and from LOOKUP, so 2 were restored: the first
    // FORGET leaves it, the second drops it.
    b.forget(&root, d, 1);
    assert!(b.getattr(&root, d, None).is_ok());
    b.forget(&root, d, 1);
    assert_eq!(errno(b.getattr(&root, d, None)), libc::ESTALE);
    b.shutdown().unwrap();
}

#[test]
fn migration_on_error_abort_fails_the_load_and_leaves_no_session() {
    let lab = Lab::get();
    let name = format!("migrate-abort-{}", std::process::id());
    let export = format!("/{name}");
    let a = common::fs_layer(&lab, &name);
    let root = ctx(0, 0);
    let (kept, kept_fh) = common::create_as(&a, &root, 1, &c("kept"), 0o644);
    let (gone, gone_fh) = common::create_as(&a, &root, 1, &c("gone"), 0o644);
    let bytes = a.save_state().unwrap();
    a.release(&root, kept, 0, kept_fh, false, false, None)
        .unwrap();
    a.release(&root, gone, 0, gone_fh, false, false, None)
        .unwrap();
    a.shutdown().unwrap();
    delete_and_purge(&lab, &export, "gone", gone);

    let b = destination(&lab, &export, OnError::Abort);
    match b.load_state(&bytes) {
        Err(MigrationError::Unresolved { lost, first }) => {
            assert_eq!(lost, 2, "{first}");
            assert!(first.contains(&format!("{gone:#x}")), "{first}");
        }
        other => panic!("abort expected, got {other:?}"),
    }
    // Nothing of the session stays: not the node that was found, nor its handle.
    assert_eq!((b.node_count(), b.handle_count()), (1, 0));
    assert_eq!(errno(b.getattr(&root, kept, None)), libc::ESTALE);
    // A state of another export, or damaged bytes, are refused before anything is resolved.
    let other = destination(&lab, "/", OnError::GuestError);
    assert!(matches!(
        other.load_state(&bytes),
        Err(MigrationError::OtherExport { .. })
    ));
    assert!(matches!(
        b.load_state(&bytes[..bytes.len() - 3]),
        Err(MigrationError::Format(_))
    ));
    other.shutdown().unwrap();
    b.shutdown().unwrap();
}

#[test]
fn held_locks_refuse_the_migration_until_released() {
    let lab = Lab::get();
    let name = format!("migrate-locks-{}", std::process::id());
    let a = common::fs_layer(&lab, &name);
    let root = ctx(0, 0);
    let (ino, fh) = common::create_as(&a, &root, 1, &c("locked"), 0o644);
    let lock = |kind: i32| FileLock {
        start: 0,
        end: 99,
        lock_type: kind as u32,
        pid: 42,
    };
    // A POSIX lock.
    a.setlk(&root, ino, fh, 7, lock(libc::F_WRLCK), 0).unwrap();
    assert!(matches!(a.save_state(), Err(MigrationError::LocksHeld(1))));
    a.setlk(&root, ino, fh, 7, lock(libc::F_UNLCK), 0).unwrap();
    a.save_state().unwrap();
    // A BSD lock.
    a.setlk(&root, ino, fh, 7, lock(libc::F_RDLCK), LK_FLOCK)
        .unwrap();
    assert!(matches!(a.save_state(), Err(MigrationError::LocksHeld(1))));
    a.setlk(&root, ino, fh, 7, lock(libc::F_UNLCK), LK_FLOCK)
        .unwrap();
    a.save_state().unwrap();
    // The probe took nothing: the guest can lock again.
    a.setlk(&root, ino, fh, 8, lock(libc::F_WRLCK), LK_FLOCK)
        .unwrap();
    a.shutdown().unwrap();
}

/// State size and time to resolve it, for `MIGRATION_NODES` nodes (default 1,000): figures
/// for tests/bench/results/HISTORY.md, printed (`--nocapture`), not asserted.
#[test]
fn state_size_and_load_time_for_many_nodes() {
    let lab = Lab::get();
    let count: usize = std::env::var("MIGRATION_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let name = format!("migrate-many-{}", std::process::id());
    let export = format!("/{name}");
    // Files made by another client, then listed by the guest (READDIRPLUS: one node each).
    {
        let m = lab.ceph();
        let perm = UserPerm::root();
        let top = m.lookup_root().unwrap();
        let (dir, _) = m
            .mkdir(&top, &c(&name), 0o777, CEPH_STATX_BASIC_STATS, 0, &perm)
            .unwrap();
        let (sub, _) = m
            .mkdir(&dir, &c("many"), 0o777, CEPH_STATX_BASIC_STATS, 0, &perm)
            .unwrap();
        for i in 0..count {
            m.mknod(
                &sub,
                &c(&format!("n{i:06}")),
                libc::S_IFREG | 0o644,
                0,
                CEPH_STATX_BASIC_STATS,
                0,
                &perm,
            )
            .unwrap();
        }
    }
    let mount = MountBuilder::new(Some(&lab.client_id))
        .and_then(|b| b.conf_read_file(Some(&lab.conf)))
        .and_then(|b| b.mount(&export))
        .unwrap();
    let a = CephFs::new(mount, Default::default()).unwrap();
    a.init(FsOptions::ASYNC_READ).unwrap();
    let root = ctx(0, 0);
    let many = a.lookup(&root, 1, &c("many")).unwrap().inode;
    let fh = a.opendir(&root, many, 0).unwrap().0.unwrap();
    let mut off = 0;
    loop {
        let mut got = 0;
        a.readdirplus(&root, many, fh, 65536, off, &mut |d, _| {
            off = d.offset;
            got += 1;
            Ok(1)
        })
        .unwrap();
        if got == 0 {
            break;
        }
    }
    assert_eq!(a.node_count(), count + 2, "root, many and its files");
    let t = Instant::now();
    let bytes = a.save_state().unwrap();
    let save = t.elapsed();
    a.shutdown().unwrap();
    // What the proof that every node lies below the export costs: the same state loaded as
    // a handover predecessor's (not proven) on another destination, first or second in turn
    // (`MIGRATION_PEER_FIRST=1`), so that the MDS's cache favours neither.
    let peer_first = std::env::var("MIGRATION_PEER_FIRST").is_ok_and(|v| v == "1");
    let timed = |peer: bool| {
        let b = destination(&lab, &export, OnError::Abort);
        let t = Instant::now();
        let report = if peer {
            b.load_peer_state(&bytes)
        } else {
            b.load_state(&bytes)
        }
        .unwrap();
        let load = t.elapsed();
        assert_eq!(report.nodes, count + 1);
        assert_eq!(b.node_count(), count + 2);
        b.shutdown().unwrap();
        (load, report)
    };
    let (peer, proven) = if peer_first {
        let p = timed(true);
        (p, timed(false))
    } else {
        let f = timed(false);
        (timed(true), f)
    };
    println!(
        "MIGRATION FIGURES nodes={} state_bytes={} save_ms={} load_ms={} unproven_load_ms={} \
         peer_first={peer_first} ({})",
        count + 1,
        bytes.len(),
        save.as_millis(),
        proven.0.as_millis(),
        peer.0.as_millis(),
        proven.1
    );
}

/// A file another client deletes while the source still holds it open: the MDS keeps it (in
/// its stray directory) while a client holds it, and a destination could find it by number.
/// But nothing proves any more that it lies in the export (its name is gone, and a stray
/// inode's number is all a forged state would need to name another tenant's deleted file), so
/// a state from the frontend leaves it out: the guest gets ESTALE for it. A handover
/// predecessor (the daemon's own user) is believed: there the guest's open file goes on.
#[test]
fn a_file_deleted_while_the_source_holds_it_is_stale_but_handed_over() {
    let lab = Lab::get();
    let name = format!("migrate-held-{}", std::process::id());
    let export = format!("/{name}");
    let a = common::fs_layer(&lab, &name);
    let root = ctx(0, 0);
    let (ino, fh) = common::create_as(&a, &root, 1, &c("unlinked"), 0o644);
    assert_eq!(write(&a, ino, fh, 0, b"still here").unwrap(), 10);
    a.fsync(&root, ino, false, fh).unwrap();
    let bytes = a.save_state().unwrap();
    // Deleted by another client; the source (alive, as during a migration) holds it.
    {
        let m = lab.ceph();
        let perm = UserPerm::root();
        let top = m.lookup_root().unwrap();
        let (dir, _) = m
            .lookup(&top, &c(&name), CEPH_STATX_BASIC_STATS, 0, &perm)
            .unwrap();
        m.unlink(&dir, &c("unlinked"), &perm).unwrap();
    }
    // From the frontend: not proven, so stale (and with `abort`, the migration fails).
    let b = destination(&lab, &export, OnError::GuestError);
    let report = b.load_state(&bytes).unwrap();
    assert_eq!((report.lost_nodes, report.lost_handles), (1, 1), "{report}");
    assert_eq!(errno(read(&b, ino, fh, 0, 64)), libc::ESTALE);
    assert_eq!(errno(b.getattr(&root, ino, None)), libc::ESTALE);
    b.shutdown().unwrap();
    let b = destination(&lab, &export, OnError::Abort);
    assert!(matches!(
        b.load_state(&bytes),
        Err(MigrationError::Unresolved { .. })
    ));
    b.shutdown().unwrap();
    // From a handover predecessor: the open file goes on.
    let b = destination(&lab, &export, OnError::Abort);
    let report = b.load_peer_state(&bytes).unwrap();
    assert_eq!((report.lost_nodes, report.lost_handles), (0, 0), "{report}");
    a.shutdown().unwrap();
    assert_eq!(read(&b, ino, fh, 0, 64).unwrap(), b"still here");
    assert_eq!(b.getattr(&root, ino, None).unwrap().0.st_nlink, 0);
    b.release(&root, ino, 0, fh, false, false, None).unwrap();
    b.shutdown().unwrap();
}

// ---- a real guest under QEMU 10 -------------------------------------------------------------

/// One QEMU with a QMP socket; killed (by pid) when dropped.
struct Qemu {
    child: std::process::Child,
    qmp: std::path::PathBuf,
    console: std::path::PathBuf,
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Qemu {
    fn start(
        qemu: &Path,
        work: &Path,
        name: &str,
        daemon: &common::Daemon,
        kernel: &Path,
        initrd: &Path,
        incoming: Option<&Path>,
    ) -> Qemu {
        let qmp = work.join(format!("{name}.qmp"));
        let console = work.join(format!("{name}.console"));
        let _ = std::fs::remove_file(&qmp);
        let mut cmd = std::process::Command::new(qemu);
        cmd.args([
            "-accel",
            "tcg",
            "-M",
            "pc,memory-backend=mem",
            "-smp",
            "1",
            "-m",
            "512M",
        ])
        .args(["-object", "memory-backend-memfd,id=mem,size=512M,share=on"])
        .arg("-chardev")
        .arg(format!("socket,id=char0,path={}", daemon.socket.display()))
        .args(["-device", "vhost-user-fs-pci,chardev=char0,tag=cephfs"])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyS0 quiet panic=-1 vfs_tag=cephfs"])
        .args(["-nodefaults", "-display", "none", "-no-reboot"])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", qmp.display()));
        if let Some(sock) = incoming {
            let _ = std::fs::remove_file(sock);
            cmd.arg("-incoming").arg(format!("unix:{}", sock.display()));
        }
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(work.join(format!("{name}.out"))).unwrap())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("start QEMU 10");
        let q = Qemu {
            child,
            qmp,
            console,
        };
        q.wait_for(|| q.qmp.exists(), 60, "QMP socket");
        if let Some(sock) = incoming {
            q.wait_for(|| sock.exists(), 60, "incoming migration socket");
        }
        q
    }

    fn console(&self) -> String {
        std::fs::read_to_string(&self.console).unwrap_or_default()
    }

    /// Wait (bounded: a precondition, not a measurement) until `ready`; panic with the console.
    fn wait_for(&self, ready: impl Fn() -> bool, secs: u64, what: &str) {
        let deadline = Instant::now() + std::time::Duration::from_secs(secs);
        while !ready() {
            assert!(
                !self.console().contains("GUEST-RESULT") || what == "GUEST-RESULT",
                "the guest ended before {what}; console:\n{}",
                self.console()
            );
            assert!(
                Instant::now() < deadline,
                "{what} not seen within {secs} s; console:\n{}",
                self.console()
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// Send QMP commands; their answers.
    fn qmp(&self, cmds: &[serde_json::Value]) -> Vec<serde_json::Value> {
        self.try_qmp(cmds)
            .unwrap_or_else(|e| panic!("QMP {}: {e}", self.qmp.display()))
    }

    fn try_qmp(&self, cmds: &[serde_json::Value]) -> std::io::Result<Vec<serde_json::Value>> {
        use std::io::{BufRead, BufReader, Write};
        let s = std::os::unix::net::UnixStream::connect(&self.qmp)?;
        let mut r = BufReader::new(s.try_clone()?);
        let mut w = s;
        let mut line = String::new();
        r.read_line(&mut line)?; // greeting
        let mut out = Vec::new();
        let all = std::iter::once(serde_json::json!({"execute": "qmp_capabilities"}))
            .chain(cmds.iter().cloned());
        for c in all {
            writeln!(w, "{c}")?;
            loop {
                line.clear();
                if r.read_line(&mut line)? == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                let v: serde_json::Value = serde_json::from_str(&line)?;
                if v.get("return").is_some() || v.get("error").is_some() {
                    out.push(v);
                    break;
                }
            }
        }
        out.remove(0);
        Ok(out)
    }

    /// End a source QEMU whose guest has moved on: `quit`, then wait for it. What becomes of
    /// it is QEMU's business, not the daemon's, so a QEMU that was already going away (a
    /// refused QMP connection; seen once in CI, under load) is reported, not failed.
    fn quit(mut self) {
        if let Err(e) = self.try_qmp(&[serde_json::json!({"execute": "quit"})]) {
            eprintln!("migration test: QMP quit of the source QEMU failed: {e}");
        }
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => {
                    eprintln!("migration test: the source QEMU ended: {st}");
                    return;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                // Drop kills it.
                _ => return,
            }
        }
    }

    /// Migrate to `sock` and wait for the end: the final `query-migrate` answer.
    fn migrate(&self, sock: &Path) -> serde_json::Value {
        let r = self.qmp(&[serde_json::json!({"execute": "migrate",
            "arguments": {"uri": format!("unix:{}", sock.display())}})]);
        assert!(r[0].get("return").is_some(), "migrate: {}", r[0]);
        loop {
            let q = self.qmp(&[serde_json::json!({"execute": "query-migrate"})]);
            let st = q[0]["return"]["status"].as_str().unwrap_or("").to_owned();
            if ![
                "setup",
                "active",
                "device",
                "pre-switchover",
                "wait-unplug",
                "",
            ]
            .contains(&st.as_str())
            {
                return q[0]["return"].clone();
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

/// A file in the export, created by a separate client (the host's signals to the guest).
fn touch_via_other_client(lab: &Lab, export: &str, name: &str) {
    let m = lab.ceph();
    let perm = UserPerm::root();
    let top = m.lookup_root().unwrap();
    let (dir, _) = m
        .lookup(&top, &c(&export[1..]), CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    m.mknod(
        &dir,
        &c(name),
        libc::S_IFREG | 0o644,
        0,
        CEPH_STATX_BASIC_STATS,
        0,
        &perm,
    )
    .unwrap();
}

/// Entries of the directory the guest lists half-way across the migration: more than one
/// READDIRPLUS page (about 25 entries of 4 KiB), so the rest comes from the destination.
const DIR_ENTRIES: usize = 60;

/// A static guest program: takes a BSD lock on `lockfile` and holds it until `release`
/// exists, reads a few entries of `dir` before the migration and the rest after `stop` exists,
/// and checks it saw each of the `count` entries once.
const HOLDER_C: &str = r#"
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc != 6) return 2;
    int fd = open(argv[1], O_RDWR | O_CREAT, 0644);
    if (fd < 0 || flock(fd, LOCK_EX)) { perror("lock"); return 3; }
    puts("LOCK-HELD"); fflush(stdout);
    DIR *d = opendir(argv[3]);
    if (!d) { perror("opendir"); return 4; }
    int seen = 0; struct dirent *e;
    while (seen < 3 && (e = readdir(d))) if (e->d_name[0] != '.') seen++;
    printf("DIR-HALF seen=%d\n", seen); fflush(stdout);
    while (access(argv[2], F_OK)) usleep(200000);
    if (flock(fd, LOCK_UN)) { perror("unlock"); return 6; }
    close(fd);
    puts("LOCK-RELEASED"); fflush(stdout);
    while (access(argv[4], F_OK)) usleep(200000);
    while ((e = readdir(d))) if (e->d_name[0] != '.') seen++;
    printf("DIR-DONE seen=%d\n", seen); fflush(stdout);
    closedir(d);
    return seen == atoi(argv[5]) ? 0 : 5;
}
"#;

/// Remove `export/path` through a separate client.
fn unlink_via_other_client(lab: &Lab, export: &str, path: &str) {
    let m = lab.ceph();
    let perm = UserPerm::root();
    let mut dir = m.lookup_root().unwrap();
    let full = Path::new(export).join(path);
    let parts: Vec<_> = full.iter().skip(1).collect();
    let (last, parents) = parts.split_last().unwrap();
    for part in parents {
        dir = m
            .lookup(
                &dir,
                &c(part.to_str().unwrap()),
                CEPH_STATX_BASIC_STATS,
                0,
                &perm,
            )
            .unwrap()
            .0;
    }
    m.unlink(&dir, &c(last.to_str().unwrap()), &perm).unwrap();
}

/// The guest's workload: its cwd in the share, the holder above in the background, a file
/// held open for reading (another client deletes it before the migration: nothing proves it
/// lies in the export any more, so the destination leaves it out and the guest's read of it
/// fails), an appending writer that fsyncs each line until the host says stop, and a reader
/// that checks every line at the end.
const GUEST_WORKLOAD: &str = r#"
mkdir -p work/dir && cd work || exit 10
i=0
while [ $i -lt 60 ]; do : > dir/entry-$i; i=$((i+1)); done
/bin/holdlock lockfile /mnt/release dir /mnt/stop 60 &
holder=$!
echo precious > victim
exec 4<victim
exec 3>>log
echo WORKLOAD-STARTED
i=0
while [ ! -e /mnt/stop ]; do
  echo "line $i" >&3 || exit 13
  sync -d log || exit 11
  i=$((i+1))
done
echo "WRITER-DONE $i"
exec 3>&-
echo WRITER-CLOSED
[ ! -e victim ] || { echo "VICTIM-STILL-LINKED"; exit 17; }
if read -r v <&4; then echo "VICTIM-STILL-OPEN $v"; exit 16; fi
echo VICTIM-STALE
wait $holder || { echo "HOLDER-FAILED $?"; exit 15; }
n=$(wc -l < log)
echo "WORKLOAD-DONE lines=$n written=$i"
[ "$n" = "$i" ] || exit 12
j=0
while read -r l; do
  [ "$l" = "line $j" ] || { echo "BAD-LINE $j: $l"; exit 14; }
  j=$((j+1))
done < log
exit 0
"#;

/// The issue's test: a guest under QEMU 10 (TCG) with a workload migrates from QEMU A +
/// daemon A (client.admin) to QEMU B + daemon B (client.migdst) on this host. While the guest
/// holds a lock the migration fails and the guest keeps running on A; once it is released the
/// migration completes, the workload finishes on B, every byte is checked through a separate
/// client, and daemon A ends its MDS session cleanly. Downtime and state size are printed.
#[test]
fn guest_migrates_between_daemons_under_qemu10() {
    let lab = Lab::get();
    let name = format!("migrate-guest-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let out = std::process::Command::new(lab.top.join("tests/lab/qemu10"))
        .arg(lab.dir.join("qemu10"))
        .output()
        .expect("run tests/lab/qemu10");
    assert!(
        out.status.success(),
        "tests/lab/qemu10: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let qemu = std::path::PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let kernel = if lab.kernel_cache.join(".complete").exists() {
        lab.kernel_cache.join("vmlinux")
    } else {
        lab.kernel_cache.join("bookworm/vmlinux")
    };
    let script = work.join("test.sh");
    std::fs::write(&script, GUEST_WORKLOAD).unwrap();
    let holder = work.join("holdlock");
    std::fs::write(work.join("holdlock.c"), HOLDER_C).unwrap();
    let st = std::process::Command::new("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(&holder)
        .arg(work.join("holdlock.c"))
        .status()
        .expect("run gcc (static guest program)");
    assert!(st.success(), "gcc: {st}");
    let initrd = work.join("initramfs.cpio.gz");
    let st = std::process::Command::new(lab.top.join("tests/lab/guest/build-initramfs"))
        .arg("--kernel-cache")
        .arg(&lab.kernel_cache)
        .arg("--out")
        .arg(&initrd)
        .arg("--script")
        .arg(&script)
        .arg("--add")
        .arg(format!("{}:/bin/holdlock", holder.display()))
        .status()
        .unwrap();
    assert!(st.success(), "build-initramfs: {st}");

    let (wa, wb) = (work.join("a"), work.join("b"));
    std::fs::create_dir_all(&wa).unwrap();
    std::fs::create_dir_all(&wb).unwrap();
    // Quarantine off: a file deleted meanwhile has no ancestry to derive a quarantine domain
    // from, and is refused on the destination with quarantine on (docs/upgrade-and-migration.md).
    let mut daemon_a = common::Daemon::start(
        &lab,
        &wa,
        &export,
        &["--seccomp", "none", "--quarantine", "off"],
    );
    let keyring = dest_keyring(&lab);
    let lab_b = Lab {
        conf: lab.conf.clone(),
        client_id: DEST_ID.into(),
        kernel_cache: lab.kernel_cache.clone(),
        guest_bin: lab.guest_bin.clone(),
        dir: lab.dir.clone(),
        top: lab.top.clone(),
    };
    // --keep-serving: the first, failed, migration ends the first destination QEMU.
    let daemon_b = common::Daemon::start(
        &lab_b,
        &wb,
        &export,
        &[
            "--seccomp",
            "none",
            "--quarantine",
            "off",
            "--keep-serving",
            "--keyring",
            keyring.to_str().unwrap(),
        ],
    );
    let mig = work.join("migration.sock");
    let qa = Qemu::start(&qemu, &work, "qemu-a", &daemon_a, &kernel, &initrd, None);
    qa.wait_for(
        || qa.console().contains("DIR-HALF") && qa.console().contains("WORKLOAD-STARTED"),
        300,
        "DIR-HALF and WORKLOAD-STARTED",
    );

    // 1. The guest holds a lock: the source refuses to save, QEMU fails the migration, and
    //    the guest goes on running on A.
    let qb = Qemu::start(
        &qemu,
        &work,
        "qemu-b1",
        &daemon_b,
        &kernel,
        &initrd,
        Some(&mig),
    );
    let failed = qa.migrate(&mig);
    assert_eq!(failed["status"], "failed", "{failed}");
    let status = qa.qmp(&[serde_json::json!({"execute": "query-status"})]);
    assert_eq!(status[0]["return"]["status"], "running", "{}", status[0]);
    drop(qb);
    assert!(
        daemon_a.log_text().contains("file lock"),
        "{}",
        daemon_a.log_text()
    );

    // 2. The lock is released, and another client deletes a file the guest holds open; the
    //    migration completes.
    touch_via_other_client(&lab, &export, "release");
    unlink_via_other_client(&lab, &export, "work/victim");
    qa.wait_for(
        || qa.console().contains("LOCK-RELEASED"),
        120,
        "LOCK-RELEASED",
    );
    let qb = Qemu::start(
        &qemu,
        &work,
        "qemu-b2",
        &daemon_b,
        &kernel,
        &initrd,
        Some(&mig),
    );
    let done = qa.migrate(&mig);
    assert_eq!(done["status"], "completed", "{done}");
    qa.quit();

    // 3. The workload goes on on B, then stops; every line is checked in the guest and here.
    std::thread::sleep(std::time::Duration::from_secs(2));
    touch_via_other_client(&lab, &export, "stop");
    qb.wait_for(
        || qb.console().contains("GUEST-RESULT"),
        300,
        "GUEST-RESULT",
    );
    let console = qb.console();
    assert!(console.contains("GUEST-RESULT: rc=0"), "{console}");
    assert!(console.contains("VICTIM-STALE"), "{console}");
    assert!(
        console.contains(&format!("DIR-DONE seen={DIR_ENTRIES}")),
        "{console}"
    );
    let n: usize = console
        .split("WORKLOAD-DONE lines=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("line count");
    let data = read_via_other_client(&lab, &export, "work/log");
    let want: String = (0..n).map(|i| format!("line {i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&data), want);

    // 4. Daemon A's frontend is gone: it unmounted (its MDS session ended) and exited 0.
    let st = daemon_a.stop().expect("daemon A status");
    assert!(st.success(), "{st}: {}", daemon_a.log_text());
    let log_a = daemon_a.log_text();
    assert!(log_a.contains("CephFS unmounted"), "{log_a}");
    let saved = log_a
        .lines()
        .find(|l| l.contains("session saved"))
        .unwrap_or_default()
        .to_owned();
    let loaded = daemon_b
        .log_text()
        .lines()
        .find(|l| l.contains("device state loaded"))
        .unwrap_or_default()
        .to_owned();
    println!(
        "MIGRATION GUEST downtime_ms={} total_ms={} lines={n}\n  {saved}\n  {loaded}",
        done["downtime"], done["total-time"]
    );
    drop(daemon_b);
}

/// What a destination makes of a state naming an inode outside its export (a frontend that
/// lies): confined to the subtree by its cephx caps, the MDS's path check refuses it; with caps
/// on the whole filesystem, the daemon's own proof does (it was resolved before).
#[test]
fn a_state_naming_an_inode_outside_the_callers_path_caps() {
    use ceph_virtiofsd::migration::{NodeState, State};
    let lab = Lab::get();
    let name = format!("migrate-caps-{}", std::process::id());
    let m = lab.ceph();
    let perm = UserPerm::root();
    let top = m.lookup_root().unwrap();
    let (base, _) = m
        .mkdir(&top, &c(&name), 0o777, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    let (inside, inside_st) = m
        .mkdir(&base, &c("inside"), 0o777, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    let (_outside, outside_st) = m
        .mknod(
            &base,
            &c("outside"),
            libc::S_IFREG | 0o644,
            0,
            CEPH_STATX_BASIC_STATS,
            0,
            &perm,
        )
        .unwrap();
    drop(inside);
    let id = format!("migpath{}", std::process::id());
    let keyring = lab.scratch(&id).join("keyring");
    let st = std::process::Command::new("ceph")
        .arg("-c")
        .arg(&lab.conf)
        .args(["auth", "get-or-create", &format!("client.{id}")])
        .args(["mon", "allow r", "osd", "allow rw"])
        .args(["mds", &format!("allow rw path=/{name}/inside")])
        .arg("-o")
        .arg(&keyring)
        .status()
        .unwrap();
    assert!(st.success());
    let mount = MountBuilder::new(Some(&id))
        .and_then(|b| b.conf_read_file(Some(&lab.conf)))
        .and_then(|b| b.conf_set("keyring", keyring.to_str().unwrap()))
        .and_then(|b| b.mount(&format!("/{name}/inside")))
        .expect("mount the confined subtree");
    // What the README's "which key reaches what" rests on: the MDS refuses the confined id
    // inodes of another tree by number, and a deleted file of another tree that another client
    // still holds open (a stray: the MDS checks the path it had) too.
    let (held, held_st) = {
        let (i, st, f) = m
            .create(
                &base,
                &c("held"),
                0o644,
                libc::O_RDWR | libc::O_CREAT,
                CEPH_STATX_BASIC_STATS,
                0,
                &perm,
            )
            .unwrap();
        m.unlink(&base, &c("held"), &perm).unwrap();
        ((i, f), st)
    };
    for (what, ino) in [
        ("a file", outside_st.stx_ino),
        ("a deleted file", held_st.stx_ino),
    ] {
        assert_eq!(
            mount
                .lookup_vino(ino, u64::MAX - 1)
                .map(drop)
                .map_err(|e| e.errno()),
            Err(libc::EACCES),
            "the MDS gave a confined id {what} of another tree by number"
        );
    }
    drop(held);
    let b = CephFs::new(mount, Default::default()).unwrap();
    let state = State {
        idmap_fingerprint: ceph_virtiofsd::migration::fingerprint(
            format!("{:?}", ceph_virtiofsd::idmap::IdMapping::default()).as_bytes(),
        ),
        root: (inside_st.stx_ino, u64::MAX - 1),
        nodes: vec![NodeState {
            id: outside_st.stx_ino,
            ino: outside_st.stx_ino,
            snapid: u64::MAX - 1,
            kind: libc::S_IFREG,
            lookups: 1,
            parent: 0,
            name: Vec::new(),
        }],
        ..Default::default()
    };
    let report = b.load_state(&state.encode()).unwrap();
    println!("PATH CAPS: {report}");
    assert_eq!(
        report.lost_nodes, 1,
        "the MDS let a confined client resolve {report}"
    );
    assert_eq!(
        errno(b.getattr(&ctx(0, 0), outside_st.stx_ino, None)),
        libc::ESTALE
    );
    b.shutdown().unwrap();
    // A client without the path restriction, mounted at the same subtree, resolves it, but
    // cannot prove it lies below the export: left out all the same.
    let mount = MountBuilder::new(Some(&lab.client_id))
        .and_then(|b| b.conf_read_file(Some(&lab.conf)))
        .and_then(|b| b.mount(&format!("/{name}/inside")))
        .unwrap();
    let open = CephFs::new(mount, Default::default()).unwrap();
    let report = open.load_state(&state.encode()).unwrap();
    println!("NO PATH CAPS: {report}");
    assert_eq!(report.lost_nodes, 1, "{report}");
    assert_eq!(
        errno(open.getattr(&ctx(0, 0), outside_st.stx_ino, None)),
        libc::ESTALE
    );
    open.shutdown().unwrap();
}

// ---- device states are untrusted: a frontend that forges one --------------------------------

/// CephFS "no snapshot": the live tree.
const NOSNAP: u64 = u64::MAX - 1;
/// Node ids the table allocates carry the top bit (`fs::nodes`).
const ALLOCATED: u64 = 1 << 63;

/// A forged state for a destination exporting the directory of inode `root`: it passes every
/// check a state passed before (format, export root, id mapping).
fn forged(
    root: u64,
    nodes: Vec<ceph_virtiofsd::migration::NodeState>,
    handles: Vec<ceph_virtiofsd::migration::HandleState>,
) -> ceph_virtiofsd::migration::State {
    ceph_virtiofsd::migration::State {
        fuse_capable: FsOptions::ASYNC_READ.bits(),
        idmap_fingerprint: ceph_virtiofsd::migration::fingerprint(
            format!("{:?}", ceph_virtiofsd::idmap::IdMapping::default()).as_bytes(),
        ),
        root: (root, NOSNAP),
        nodes,
        handles,
        ..Default::default()
    }
}

/// A head directory node of inode `ino`, found in `parent` as `name` (0 and "": no link).
fn dir_node(ino: u64, parent: u64, name: &str) -> ceph_virtiofsd::migration::NodeState {
    ceph_virtiofsd::migration::NodeState {
        id: ino,
        ino,
        snapid: NOSNAP,
        kind: libc::S_IFDIR,
        lookups: 1,
        parent,
        name: name.as_bytes().to_vec(),
    }
}

/// What a guest gets when it lists node `id`: the names, or the errno of OPENDIR or
/// READDIRPLUS.
fn list(fs: &CephFs, id: u64) -> Result<Vec<String>, i32> {
    let who = ctx(0, 0);
    let fh = fs
        .opendir(&who, id, 0)
        .map_err(|e| e.raw_os_error().unwrap_or(0))?
        .0
        .unwrap_or(0);
    let mut names = Vec::new();
    let r = fs.readdirplus(&who, id, fh, 65536, 0, &mut |d, _| {
        let n = String::from_utf8_lossy(d.name).into_owned();
        if n != "." && n != ".." {
            names.push(n);
        }
        Ok(1)
    });
    let _ = fs.releasedir(&who, id, 0, fh);
    r.map_err(|e| e.raw_os_error().unwrap_or(0))?;
    Ok(names)
}

/// `/<name>/a` (the export) and `/<name>/b` (another tenant's tree, with `secret` in it),
/// made by another client; the statx of `/<name>`, a and b.
fn two_trees(
    lab: &Lab,
    name: &str,
) -> (ceph_client::Statx, ceph_client::Statx, ceph_client::Statx) {
    let m = lab.ceph();
    let perm = UserPerm::root();
    let top = m.lookup_root().unwrap();
    let (base, base_st) = m
        .mkdir(&top, &c(name), 0o777, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    let (_, a_st) = m
        .mkdir(&base, &c("a"), 0o777, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    let (b, b_st) = m
        .mkdir(&base, &c("b"), 0o777, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    m.mknod(
        &b,
        &c("secret"),
        libc::S_IFREG | 0o644,
        0,
        CEPH_STATX_BASIC_STATS,
        0,
        &perm,
    )
    .unwrap();
    (base_st, a_st, b_st)
}

/// The filesystem layer exporting `export` as `client.admin` (a key that reaches the whole
/// filesystem, as the default configuration needs), with no FUSE session yet.
fn admin_destination(lab: &Lab, export: &str, cfg: ceph_virtiofsd::fs::FsConfig) -> CephFs {
    let mount = MountBuilder::new(Some(&lab.client_id))
        .and_then(|b| b.conf_read_file(Some(&lab.conf)))
        .and_then(|b| b.mount(export))
        .expect("mount the export");
    CephFs::new(mount, cfg).unwrap()
}

/// Finding 1 of the security review: a state naming inodes outside the export (another
/// tenant's tree, the filesystem root, the export's parent by a ".." link, a link that does
/// not hold) is loaded by a destination whose key reaches them; the guest must get ESTALE for
/// each of them, never a listing.
#[test]
fn hostile_a_state_naming_inodes_outside_the_export_is_stale() {
    let lab = Lab::get();
    let name = format!("migrate-outside-{}", std::process::id());
    let (base_st, a_st, b_st) = two_trees(&lab, &name);
    let (base, a, b) = (base_st.stx_ino, a_st.stx_ino, b_st.stx_ino);
    let fs = admin_destination(&lab, &format!("/{name}/a"), Default::default());
    let slash = ALLOCATED | 2;
    let state = forged(
        a,
        vec![
            // Another tenant's tree, found by number (no link: "a directory found by ..").
            dir_node(b, 0, ""),
            // The export's parent, claimed to be ".." of the export root (libcephfs would
            // confirm that name).
            dir_node(base, 1, ".."),
            // The filesystem root.
            ceph_virtiofsd::migration::NodeState {
                id: slash,
                ino: 1,
                ..dir_node(1, 0, "")
            },
        ],
        Vec::new(),
    );
    let report = fs.load_state(&state.encode());
    println!("OUTSIDE: {report:?}");
    let served: Vec<String> = [
        ("another tree", b),
        ("the export's parent", base),
        ("/", slash),
    ]
    .into_iter()
    .map(|(what, id)| (what, list(&fs, id)))
    .filter(|(_, got)| *got != Err(libc::ESTALE))
    .map(|(what, got)| format!("{what}: {got:?}"))
    .collect();
    assert!(
        served.is_empty(),
        "forged nodes outside the export are served: {served:#?}"
    );
    fs.shutdown().unwrap();
}

/// The same with quarantine on, as the daemon runs by default: another tenant's subvolume root
/// is a quarantine domain of its own (released), which the derivation took as the anchor of a
/// forged node, and "/" is outside every domain.
#[test]
fn hostile_a_state_naming_another_subvolume_with_quarantine_on_is_stale() {
    use ceph_virtiofsd::quarantine::{self, CephAccess};
    let lab = Lab::get();
    let group = format!("migq{}", std::process::id());
    let (sva, svb) = (
        format!("/volumes/{group}/sva"),
        format!("/volumes/{group}/svb"),
    );
    let m = lab.ceph();
    common::quarantine::mkdirs(&m, &format!("{sva}/data"));
    common::quarantine::mkdirs(&m, &format!("{svb}/data"));
    let perm = UserPerm::root();
    let ino = |p: &str| {
        quarantine::resolve(&m, p, &perm)
            .unwrap()
            .vino()
            .unwrap()
            .ino
    };
    let (a, b, b_data) = (ino(&sva), ino(&svb), ino(&format!("{svb}/data")));
    let access = CephAccess {
        conf: Some(lab.conf.clone()),
        client_id: Some(lab.client_id.clone()),
        mount_timeout: std::time::Duration::from_secs(30),
        ..Default::default()
    };
    let q = common::quarantine::qcfg();
    let (gate, _watcher) = quarantine::start(access, q.clone(), &sva).unwrap();
    let fs = admin_destination(
        &lab,
        &sva,
        ceph_virtiofsd::fs::FsConfig {
            quarantine: Some(gate),
            revocable_ttl: q.ttl_bound(),
            ..Default::default()
        },
    );
    // The control: the export's own tree is served (then forgotten: the tables are empty
    // again, as a destination's are).
    let data = fs.lookup(&ctx(0, 0), 1, &c("data")).unwrap().inode;
    assert_eq!(list(&fs, data), Ok(Vec::new()));
    fs.forget(&ctx(0, 0), data, 1);
    assert_eq!(fs.node_count(), 1);
    let slash = ALLOCATED | 2;
    let state = forged(
        a,
        vec![
            dir_node(b, 0, ""),
            dir_node(b_data, b, "data"),
            ceph_virtiofsd::migration::NodeState {
                id: slash,
                ino: 1,
                ..dir_node(1, 0, "")
            },
        ],
        Vec::new(),
    );
    let report = fs.load_state(&state.encode());
    println!("OUTSIDE, QUARANTINE ON: {report:?}");
    let served: Vec<String> = [
        ("another subvolume's root", b),
        ("a directory in it", b_data),
        ("/", slash),
    ]
    .into_iter()
    .map(|(what, id)| (what, list(&fs, id)))
    .filter(|(_, got)| *got != Err(libc::ESTALE))
    .map(|(what, got)| format!("{what}: {got:?}"))
    .collect();
    assert!(
        served.is_empty(),
        "forged nodes outside the export are served: {served:#?}"
    );
    fs.shutdown().unwrap();
}

/// A forged handle: a file of the export that only root may write, "opened" O_RDWR by the
/// guest. The destination must not open it as CephFS root with the state's write flags: only
/// as the caller the state says opened it, through the id mapping (a state without openers,
/// format version 1, opens no handle at all). The owner of a file gets its handle back even
/// where the mode denies it now (it could change the mode itself).
#[test]
fn hostile_a_forged_write_handle_is_not_reopened_as_root() {
    use ceph_virtiofsd::migration::{HandleKind, HandleState, NodeState, Opener};
    let lab = Lab::get();
    let name = format!("migrate-handle-{}", std::process::id());
    let export = lab.export_dir(&name);
    let m = lab.ceph();
    let perm = UserPerm::root();
    let dir = common::ceph_dir(&m, &export);
    let file = |name: &str, mode: u32, owner: u32| {
        let (inode, st) = m
            .mknod(
                &dir,
                &c(name),
                libc::S_IFREG | mode,
                0,
                CEPH_STATX_BASIC_STATS,
                0,
                &perm,
            )
            .unwrap();
        let own = ceph_client::Statx {
            stx_uid: owner,
            stx_gid: owner,
            ..Default::default()
        };
        m.setattr(
            &inode,
            &own,
            ceph_client::CEPH_SETATTR_UID | ceph_client::CEPH_SETATTR_GID,
            &perm,
        )
        .unwrap();
        st.stx_ino
    };
    let rootonly = file("rootonly", 0o644, 0);
    let readonly = file("readonly", 0o444, 1000);
    let root_ino = m
        .getattr(&dir, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap()
        .stx_ino;
    let fh = 0x1000;
    // One state per load (a destination loads once): the file `name` (inode `ino`) open
    // O_RDWR by `opener`.
    let load = |ino: u64, name: &str, opener: Option<(u32, u32)>| {
        let mut state = forged(
            root_ino,
            vec![NodeState {
                id: ino,
                ino,
                snapid: NOSNAP,
                kind: libc::S_IFREG,
                lookups: 1,
                parent: 1,
                name: name.as_bytes().to_vec(),
            }],
            vec![HandleState {
                fh,
                node: ino,
                kind: HandleKind::File {
                    oflags: libc::O_RDWR,
                },
            }],
        );
        if let Some((uid, gid)) = opener {
            state.openers.insert(fh, Opener { uid, gid });
        }
        let fs = admin_destination(&lab, &export, Default::default());
        let report = fs.load_state(&state.encode());
        println!("FORGED HANDLE {name} {opener:?}: {report:?}");
        let wrote = write(&fs, ino, fh, 0, b"owned");
        fs.shutdown().unwrap();
        wrote.map_err(|e| e.raw_os_error().unwrap_or(0))
    };
    // No opener (what a version 1 state, or one that leaves it out, says): not opened.
    assert_eq!(load(rootonly, "rootonly", None), Err(libc::ESTALE));
    // Opened by uid 1000: it may not write the file, so neither may the handle.
    assert_eq!(
        load(rootonly, "rootonly", Some((1000, 1000))),
        Err(libc::ESTALE)
    );
    assert_eq!(read_via_other_client(&lab, &export, "rootonly"), b"");
    // The owner of a read-only file that it had open for writing gets its handle back.
    assert_eq!(load(readonly, "readonly", Some((1000, 1000))), Ok(5));
    assert_eq!(read_via_other_client(&lab, &export, "readonly"), b"owned");
    // Root opened it: root may write.
    assert_eq!(load(rootonly, "rootonly", Some((0, 0))), Ok(5));
    assert_eq!(read_via_other_client(&lab, &export, "rootonly"), b"owned");
}

/// `--max-nodes` and `--max-handles` bound what a state may bring, and a state longer than
/// those limits allow is refused before it is decoded.
#[test]
fn hostile_a_state_over_the_limits_is_refused() {
    use ceph_virtiofsd::migration::{HandleKind, HandleState, NodeState};
    let lab = Lab::get();
    let name = format!("migrate-limits-{}", std::process::id());
    let export = lab.export_dir(&name);
    let m = lab.ceph();
    let root_ino = m
        .getattr(
            &common::ceph_dir(&m, &export),
            CEPH_STATX_BASIC_STATS,
            0,
            &UserPerm::root(),
        )
        .unwrap()
        .stx_ino;
    let cfg = || ceph_virtiofsd::fs::FsConfig {
        max_nodes: 10,
        max_handles: 5,
        ..Default::default()
    };
    let node = |i: u64, name_len: usize| NodeState {
        id: 0x7000_0000 + i,
        ino: 0x7000_0000 + i,
        snapid: NOSNAP,
        kind: libc::S_IFREG,
        lookups: 1,
        parent: 1,
        name: vec![b'n'; name_len],
    };
    // More nodes than --max-nodes (the root counts).
    let fs = admin_destination(&lab, &export, cfg());
    let many = forged(root_ino, (0..10).map(|i| node(i, 8)).collect(), Vec::new());
    let r = fs.load_state(&many.encode());
    println!("NODES OVER THE LIMIT: {r:?}");
    assert!(
        r.is_err(),
        "10 nodes and the root loaded under --max-nodes 10"
    );
    assert_eq!(fs.node_count(), 1);
    // More handles than --max-handles.
    let handles = (0..6)
        .map(|i| HandleState {
            fh: 100 + i,
            node: 1,
            kind: HandleKind::Dir { pos: 0 },
        })
        .collect();
    let r = fs.load_state(&forged(root_ino, Vec::new(), handles).encode());
    println!("HANDLES OVER THE LIMIT: {r:?}");
    assert!(r.is_err(), "6 handles loaded under --max-handles 5");
    assert_eq!(fs.handle_count(), 0);
    // Few nodes, but more bytes than 10 nodes can take (a version 1 state could carry names
    // of 4,096 bytes): refused before it is read, and the frontend is told to read no more.
    let max = fs.max_state_len();
    assert!(max < 4096, "{max} bytes for 10 nodes and 5 handles");
    let mut body = Vec::new();
    for v in [0u64, many.idmap_fingerprint, root_ino, NOSNAP] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    body.extend_from_slice(&5u32.to_le_bytes());
    for i in 0..5u64 {
        for v in [0x7000_0000 + i, 0x7000_0000 + i, NOSNAP] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.extend_from_slice(&libc::S_IFREG.to_le_bytes());
        body.extend_from_slice(&1u64.to_le_bytes());
        body.extend_from_slice(&1u64.to_le_bytes());
        body.extend_from_slice(&4000u16.to_le_bytes());
        body.extend_from_slice(&[b'n'; 4000]);
    }
    body.extend_from_slice(&0u32.to_le_bytes());
    let mut long = b"CVFSSTAT".to_vec();
    long.extend_from_slice(&1u32.to_le_bytes());
    long.extend_from_slice(&(body.len() as u64).to_le_bytes());
    long.extend_from_slice(&ceph_virtiofsd::migration::fingerprint(&body).to_le_bytes());
    long.extend_from_slice(&body);
    let r = fs.load_state(&long);
    println!("LONGER THAN THE LIMITS ALLOW ({} bytes): {r:?}", long.len());
    assert!(r.is_err(), "a 20 KB state loaded under --max-nodes 10");
    fs.shutdown().unwrap();
}

/// LOAD on a filesystem that already serves a FUSE session (the guest sent INIT, and forgot
/// everything since) is refused: a frontend cannot swap the guest's session for a forged one.
#[test]
fn hostile_a_load_after_fuse_init_is_refused() {
    let lab = Lab::get();
    let name = format!("migrate-afterinit-{}", std::process::id());
    let fs = common::fs_layer(&lab, &name);
    let root_ino = fs.getattr(&ctx(0, 0), 1, None).unwrap().0.st_ino;
    let state = forged(root_ino, Vec::new(), Vec::new());
    let r = fs.load_state(&state.encode());
    println!("LOAD AFTER INIT: {r:?}");
    assert!(r.is_err(), "a LOAD after FUSE INIT was accepted");
    fs.shutdown().unwrap();
}

/// Found by the device-state fuzzer: a node naming a real directory with snapshot id 0 made
/// libcephfs 16 abort the destination (`Client::_lookup_vino`:
/// `ceph_assert(p != inode_map.end())`: the MDS answered the lookup by number with another
/// version of the inode). A snapshot node is now found only through its links; this one is
/// lost, and the daemon goes on.
#[test]
fn hostile_a_forged_snapshot_id_does_not_abort_the_destination() {
    use ceph_virtiofsd::migration::NodeState;
    let lab = Lab::get();
    let name = format!("migrate-snapid-{}", std::process::id());
    let export = lab.export_dir(&name);
    let m = lab.ceph();
    let perm = UserPerm::root();
    let dir = common::ceph_dir(&m, &export);
    let (_, d) = m
        .mkdir(&dir, &c("d"), 0o755, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    let root_ino = m
        .getattr(&dir, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap()
        .stx_ino;
    let fs = admin_destination(&lab, &export, Default::default());
    let forged_snap = |snapid: u64, parent: u64| NodeState {
        id: ALLOCATED | (2 + 2 * snapid + parent),
        ino: d.stx_ino,
        snapid,
        kind: libc::S_IFDIR,
        lookups: 1,
        parent,
        name: if parent == 0 {
            Vec::new()
        } else {
            b"d".to_vec()
        },
    };
    // Snapshot id 0 (the MDS reads it as "none" and answers with the head inode), and one
    // that does not exist, each with and without a link.
    let state = forged(
        root_ino,
        vec![
            forged_snap(0, 0),
            forged_snap(0, 1),
            forged_snap(5, 0),
            forged_snap(6, 1),
        ],
        Vec::new(),
    );
    let report = fs.load_state(&state.encode()).unwrap();
    println!("FORGED SNAPID: {report}");
    assert_eq!(report.lost_nodes, 4, "{report}");
    // Still serving.
    assert_eq!(fs.lookup(&ctx(0, 0), 1, &c("d")).unwrap().inode, d.stx_ino);
    fs.shutdown().unwrap();
}
