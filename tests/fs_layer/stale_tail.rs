//! A truncation must not race the daemon's own writes still on their way to the OSDs
//! (issue #17, found by the soak with MDS failovers).
//!
//! A guest closes a file and at once truncates it (`>` in a shell: RELEASE, then OPEN with
//! O_TRUNC; or an ftruncate through another descriptor). libcephfs starts writing the file's
//! buffers back at the close and returns. The truncation is the MDS's: once journaled, it
//! truncates the RADOS objects itself, with no ordering against this client's writes. A
//! write that reaches an object after that is older than the truncation: the OSD trims it,
//! but the object keeps growing to where the write began (or keeps the stale bytes). The
//! file's size, kept by the MDS, does not show this tail; after an MDS failover, when the
//! MDS probes the objects of a file a client could write (its writable range was journaled,
//! the release of the client's cap was not), the tail becomes the file's size. The soak saw
//! a file truncated to 0 and rewritten to 3,100,999 bytes come back as 4,436,344: 4 MiB plus
//! the offset, within the second object, of a 102-byte write made before the truncation.
//!
//! `Mount::setattr` therefore waits for this client's writes of the inode before a SETATTR
//! that shrinks the file. Here the OSD delays every message from a RADOS client by up to
//! 0.3 s (`ms_inject_delay_*`, not the MDS's): a write-back started by a close is then still
//! on its way when the MDS truncates. Each round writes into the second and third objects of
//! a file, releases it, truncates it (O_TRUNC open, or a size SETATTR through a new handle),
//! makes the MDS journal at once, and the objects past the first must end empty; the file,
//! grown again past them, must read zeros there. Without the wait nearly every round left
//! bytes in the objects.
//!
//! A cluster of its own (the delay would slow every other test).

use std::ffi::CString;
use std::process::Command;
use std::time::{Duration, Instant};

use ceph_virtiofsd::fs::CephFs;
use fuse_backend_rs::abi::fuse_abi::SetattrValid;
use fuse_backend_rs::api::filesystem::FileSystem;

use crate::common;
use crate::common::hostile::PrivateCluster;
use crate::common::{c, ctx, Lab, Sink};

const ROUNDS: usize = 12;
/// CephFS's default layout: 4 MiB objects.
const OBJECT: u64 = 4 << 20;
/// How long the MDS may take to truncate the objects once the change is journaled.
const TRUNCATED_WITHIN: Duration = Duration::from_secs(10);

/// The size of RADOS object `name` of the file system's data pool, `None` if it does not exist.
fn object_size(lab: &Lab, name: &str) -> Option<u64> {
    let out = Command::new("rados")
        .arg("-c")
        .arg(&lab.conf)
        .args(["-p", "cephfs_data", "stat", name])
        .output()
        .expect("run the rados command (ceph-common)");
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("No such file"), "rados stat {name}: {err}");
        return None;
    }
    // "POOL/NAME mtime ..., size N"
    let text = String::from_utf8_lossy(&out.stdout);
    let size = text
        .rsplit("size ")
        .next()
        .and_then(|s| s.trim().parse().ok());
    Some(size.unwrap_or_else(|| panic!("no size in {text:?}")))
}

fn write(fs: &CephFs, ino: u64, fh: u64, off: u64, data: &[u8]) {
    let n = common::fs_write(fs, ino, fh, off, data).unwrap();
    assert_eq!(n, data.len());
}

fn release(fs: &CephFs, ino: u64, fh: u64) {
    fs.release(&ctx(0, 0), ino, 0, fh, false, false, None)
        .unwrap();
}

/// Fill `ino` through `fh`: a little across the first object's end, a little inside the
/// second object, 1 MiB at the start of the third.
fn fill(fs: &CephFs, ino: u64, fh: u64) {
    write(fs, ino, fh, OBJECT - 4096, &[b'a'; 8192]);
    write(fs, ino, fh, OBJECT + 242_040, &[b'b'; 102]);
    write(fs, ino, fh, 2 * OBJECT, &vec![b'c'; 1 << 20]);
}

#[test]
fn a_truncation_right_after_release_leaves_no_bytes_past_the_end() {
    let shared = Lab::get();
    let name = format!("stale-tail-{}", std::process::id());
    let cluster = PrivateCluster::start(&shared, &name);
    let lab = &cluster.lab;
    cluster.osd_config("ms_inject_delay_type", "client");
    cluster.osd_config("ms_inject_delay_max", "0.3");
    cluster.osd_config("ms_inject_delay_probability", "1");
    // Mounted after the delay is set: it applies to connections made from now on.
    let fs = common::fs_layer(lab, &name);
    let root = ctx(0, 0);

    // The objects are where this test looks: a file written and synced has them.
    let (ino, fh) = common::create_as(&fs, &root, 1, &c("control"), 0o644);
    fill(&fs, ino, fh);
    fs.fsync(&root, ino, true, fh).unwrap();
    release(&fs, ino, fh);
    let st_ino = fs.getattr(&root, ino, None).unwrap().0.st_ino;
    assert_eq!(
        object_size(lab, &format!("{st_ino:x}.00000001")),
        Some(242_142),
        "the control file's second object"
    );

    // A synchronous metadata change of this file makes the MDS journal at once, while the
    // writes of a round may still be on their way.
    let (side, side_fh) = common::create_as(&fs, &root, 1, &c("side"), 0o644);
    let mut tails = Vec::new();
    for round in 0..ROUNDS {
        let fname = CString::new(format!("f{round}")).unwrap();
        let (ino, fh) = common::create_as(&fs, &root, 1, &fname, 0o644);
        fill(&fs, ino, fh);
        release(&fs, ino, fh);
        let how = if round % 2 == 0 {
            // A shell's `>`: OPEN with O_TRUNC.
            let (fh, _, _) = fs
                .open(&root, ino, (libc::O_WRONLY | libc::O_TRUNC) as u32, 0)
                .unwrap();
            release(&fs, ino, fh.unwrap());
            "O_TRUNC open"
        } else {
            // ftruncate(fd, 0) through another descriptor.
            let (fh, _, _) = fs.open(&root, ino, libc::O_WRONLY as u32, 0).unwrap();
            let fh = fh.unwrap();
            let (mut attr, _) = fs.getattr(&root, ino, None).unwrap();
            attr.st_size = 0;
            fs.setattr(&root, ino, attr, Some(fh), SetattrValid::SIZE)
                .unwrap();
            release(&fs, ino, fh);
            "ftruncate"
        };
        let (mut mode, _) = fs.getattr(&root, side, None).unwrap();
        mode.st_mode = if round % 2 == 0 { 0o600 } else { 0o644 };
        fs.setattr(&root, side, mode, None, SetattrValid::MODE)
            .unwrap();
        fs.fsync(&root, side, false, side_fh).unwrap();
        let st_ino = fs.getattr(&root, ino, None).unwrap().0.st_ino;
        let deadline = Instant::now() + TRUNCATED_WITHIN;
        for k in 1..=2u32 {
            let object = format!("{st_ino:x}.{k:08x}");
            let left = loop {
                match object_size(lab, &object) {
                    None | Some(0) => break None,
                    Some(n) if Instant::now() > deadline => break Some(n),
                    Some(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            if let Some(n) = left {
                tails.push(format!("round {round} ({how}): {object} holds {n} bytes"));
            }
        }
        // What the guest sees of it: the file grown again past the old data reads zeros there.
        let (fh, _, _) = fs.open(&root, ino, libc::O_RDWR as u32, 0).unwrap();
        let fh = fh.unwrap();
        write(&fs, ino, fh, 3 * OBJECT, b"z");
        for (off, len) in [(OBJECT + 242_040, 102u32), (2 * OBJECT, 4096)] {
            let mut sink = Sink(Vec::new());
            let n = fs
                .read(&root, ino, fh, &mut sink, len, off, None, 0)
                .unwrap();
            let stale = sink.0[..n].iter().filter(|&&b| b != 0).count();
            if n != len as usize || stale > 0 {
                tails.push(format!(
                    "round {round} ({how}): read {n} of {len} bytes at {off} after regrowing \
                     the file, {stale} of them old data"
                ));
            }
        }
        release(&fs, ino, fh);
    }
    assert!(
        tails.is_empty(),
        "files truncated to 0 right after a release kept bytes in objects past their end \
         (an MDS probe after a failover would make them the file's size):\n{}",
        tails.join("\n")
    );
}
