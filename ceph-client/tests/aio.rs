//! `ceph_ll_nonblocking_readv_writev` through [`ceph_client::aio`], against the cluster
//! (`CEPH_CONF`): only where the libcephfs header has it (libcephfs 20 and later, found by
//! build.rs); with an older libcephfs this file has no tests.
//!
//! Many operations in flight at once from one thread, every byte checked; errors found
//! inside libcephfs arriving as completions; a file whose handles are all dropped while its
//! I/O is in flight staying open until the I/O ends; ENOTCONN after shutdown.
#![cfg(libcephfs_nonblocking)]

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ceph_client::aio::{Completion, IoQueue, WriteSync};
use ceph_client::*;

const WAIT: Duration = Duration::from_secs(60);

fn mount() -> Mount {
    let conf = PathBuf::from(std::env::var_os("CEPH_CONF").expect(
        "CEPH_CONF is not set: these tests need a Ceph cluster (tests/lab/ceph-dev-cluster start DIR)",
    ));
    let id = std::env::var("CEPH_CLIENT_ID").unwrap_or_else(|_| "admin".to_owned());
    MountBuilder::new(Some(&id))
        .and_then(|b| b.conf_read_file(Some(&conf)))
        .and_then(|b| b.mount("/"))
        .expect("mount CephFS")
}

/// A new file named after the test, opened with `oflags`.
fn create(m: &Mount, test: &str, oflags: i32) -> (Inode, Arc<File>) {
    let root = m.lookup_root().unwrap();
    let name = CString::new(format!("aio-{test}-{}", std::process::id())).unwrap();
    let (ino, _, f) = m
        .create(
            &root,
            &name,
            0o644,
            oflags | libc::O_CREAT,
            CEPH_STATX_BASIC_STATS,
            0,
            &UserPerm::root(),
        )
        .unwrap();
    (ino, Arc::new(f))
}

/// `n` completions, in whatever order they come.
fn collect(q: &IoQueue, n: usize) -> Vec<Completion> {
    (0..n)
        .map(|i| {
            q.wait(WAIT)
                .unwrap_or_else(|| panic!("completion {i} of {n} not there after {WAIT:?}"))
        })
        .collect()
}

fn block(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (i.wrapping_mul(131) as usize + j * 7) as u8)
        .collect()
}

fn round_trip(test: &str, oflags: i32, bs: usize, blocks: u64, sync: WriteSync) {
    let m = mount();
    let (_ino, f) = create(&m, test, oflags | libc::O_RDWR);
    let q = IoQueue::new();
    // Every block written at once, in reverse order, then every block read at once.
    for i in (0..blocks).rev() {
        f.write_nonblocking(&q, i, i * bs as u64, block(i, bs), sync)
            .unwrap();
    }
    for c in collect(&q, blocks as usize) {
        assert_eq!(c.result.unwrap(), bs, "write {}", c.tag);
    }
    for i in 0..blocks {
        f.read_nonblocking(&q, i, i * bs as u64, vec![0; bs])
            .unwrap();
    }
    let mut seen = vec![false; blocks as usize];
    for c in collect(&q, blocks as usize) {
        assert_eq!(c.result.as_ref().copied().unwrap(), bs, "read {}", c.tag);
        assert!(
            c.buf == block(c.tag, bs),
            "block {} read back differs",
            c.tag
        );
        seen[c.tag as usize] = true;
    }
    assert!(seen.iter().all(|s| *s));
    // The blocking read agrees.
    let mut buf = vec![0; bs];
    assert_eq!(f.read((blocks - 1) * bs as u64, &mut buf).unwrap(), bs);
    assert!(buf == block(blocks - 1, bs));
    assert!(q.drain().is_empty());
}

#[test]
fn many_writes_then_reads_in_flight_at_once_round_trip() {
    round_trip("buffered", 0, 4096, 64, WriteSync::None);
}

#[test]
fn direct_and_synced_writes_round_trip() {
    round_trip("direct", libc::O_DIRECT, 65536, 32, WriteSync::Data);
    round_trip("fsync", 0, 1 << 20, 8, WriteSync::All);
}

#[test]
fn a_read_past_the_end_is_short_and_errors_come_as_completions() {
    let m = mount();
    let (_ino, f) = create(&m, "short", libc::O_RDWR);
    let q = IoQueue::new();
    f.write_nonblocking(&q, 1, 0, b"abc".to_vec(), WriteSync::Data)
        .unwrap();
    assert_eq!(collect(&q, 1)[0].result.as_ref().copied().unwrap(), 3);
    f.read_nonblocking(&q, 2, 1, vec![0; 100]).unwrap();
    f.read_nonblocking(&q, 3, 1 << 30, vec![0; 100]).unwrap();
    for c in collect(&q, 2) {
        match c.tag {
            2 => assert_eq!((c.result.unwrap(), &c.buf[..]), (2, &b"bc"[..])),
            _ => assert_eq!((c.result.unwrap(), c.buf.len()), (0, 0)),
        }
    }
    // libcephfs finds these inside the call: they arrive as completions.
    let (_ino, wo) = create(&m, "wronly", libc::O_WRONLY);
    wo.read_nonblocking(&q, 4, 0, vec![0; 10]).unwrap();
    let (_ino, ro) = {
        let (ino, f) = create(&m, "rdonly", libc::O_RDWR);
        drop(f);
        let ro = m.open(&ino, libc::O_RDONLY, &UserPerm::root()).unwrap();
        (ino, Arc::new(ro))
    };
    ro.write_nonblocking(&q, 5, 0, b"x".to_vec(), WriteSync::None)
        .unwrap();
    for c in collect(&q, 2) {
        assert_eq!(
            c.result.map_err(|e| e.errno),
            Err(libc::EBADF),
            "op {}",
            c.tag
        );
    }
    // These are refused before libcephfs is asked.
    let e = f.read_nonblocking(&q, 6, u64::MAX, vec![0; 1]).unwrap_err();
    assert_eq!(e.errno, libc::EINVAL);
    assert!(q.drain().is_empty());
}

#[test]
fn the_file_stays_open_until_its_io_ends_and_shutdown_refuses_new_io() {
    let m = mount();
    let (ino, f) = create(&m, "dropped", libc::O_RDWR);
    let q = IoQueue::new();
    for i in 0..16u64 {
        f.write_nonblocking(&q, i, i << 16, block(i, 1 << 16), WriteSync::Data)
            .unwrap();
    }
    // The caller's handle goes; the operations hold the file until they are taken.
    let weak = Arc::downgrade(&f);
    drop(f);
    let done = collect(&q, 16);
    assert!(weak.upgrade().is_some(), "the completions hold the file");
    assert!(done
        .iter()
        .all(|c| c.result.as_ref().copied().ok() == Some(1 << 16)));
    drop(done);
    assert!(weak.upgrade().is_none());
    let size = m
        .getattr(&ino, CEPH_STATX_SIZE, 0, &UserPerm::root())
        .unwrap()
        .stx_size;
    assert_eq!(size, 16 << 16);

    let f = Arc::new(m.open(&ino, libc::O_RDWR, &UserPerm::root()).unwrap());
    m.shutdown(Duration::from_secs(10)).unwrap();
    let e = f.read_nonblocking(&q, 1, 0, vec![0; 1]).unwrap_err();
    assert_eq!(e.errno, libc::ENOTCONN);
    assert!(q.drain().is_empty());
}
