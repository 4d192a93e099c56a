//! The async READ/WRITE path (`--nonblocking-io`, libcephfs 20's
//! `ceph_ll_nonblocking_readv_writev`) against the real cluster.
//!
//! In-process (builds against libcephfs 20 only): the filesystem's async calls, as the server
//! makes them, with many operations in flight: data byte for byte, reads past the end of the
//! file, the suid/sgid kill, and the errnos of bad handles and offsets (the blocking path's).
//! In a guest (any build of the tests; needs a daemon built against libcephfs 20, e.g.
//! `CEPH_VIRTIOFSD_DAEMON` pointing at one, and is skipped with a note otherwise): O_DIRECT
//! I/O from many processes at once, checked byte for byte, and a stop of the daemon while
//! it runs.

mod common;

use common::Lab;

#[cfg(libcephfs_nonblocking)]
mod in_process {
    use std::collections::HashMap;
    use std::time::Duration;

    use ceph_virtiofsd::fs::CephFs;
    use ceph_virtiofsd::server::{AsyncOps, AsyncReply, AsyncStart};
    use ceph_virtiofsd::wire::{FUSE_READ, FUSE_WRITE};
    use fuse_backend_rs::abi::fuse_abi::WRITE_KILL_PRIV;
    use fuse_backend_rs::api::filesystem::FileSystem;

    use super::common::{c, ctx, errno, Lab, Payload, Sink};

    const BLOCK: usize = 4096;

    fn block(i: u64, gen: u8) -> Vec<u8> {
        (0..BLOCK as u64)
            .map(|b| u8::try_from((i * 131 + b * 7 + u64::from(gen)) % 251).unwrap_or(0))
            .collect()
    }

    /// Open `ino` with `flags` as `who`.
    fn open(fs: &CephFs, who: (u32, u32), ino: u64, flags: i32) -> u64 {
        let (fh, _, _) = fs
            .open(&ctx(who.0, who.1), ino, u32::try_from(flags).unwrap(), 0)
            .unwrap();
        fh.unwrap()
    }

    /// Reap `n` completions (at most 30 s for all).
    fn reap(fs: &CephFs, n: usize) -> HashMap<u64, std::io::Result<AsyncReply>> {
        let mut got = HashMap::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while got.len() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "{} of {n} completions",
                got.len()
            );
            if let Some((tag, r)) = fs.async_next(Duration::from_millis(100)) {
                assert!(got.insert(tag, r).is_none(), "tag {tag} completed twice");
            }
        }
        assert!(
            fs.async_next(Duration::from_millis(50)).is_none(),
            "a completion too many"
        );
        got
    }

    fn sent(r: std::io::Result<AsyncStart>) {
        match r {
            Ok(AsyncStart::Sent) => {}
            other => panic!("not sent: {other:?}"),
        }
    }

    /// 64 writes, then 64 reads of the same blocks, all in flight at once on one O_DIRECT
    /// handle; the data checked byte for byte through the daemon's reads and through another
    /// client. Reads across and past the end of the file are short and empty.
    #[test]
    fn many_async_writes_and_reads_round_trip() {
        let lab = Lab::get();
        let name = format!("nonblocking-rt-{}", std::process::id());
        let fs = common_fs(&lab, &name);
        let (ino, plain) = super::common::create_as(&fs, &ctx(0, 0), 1, &c("f"), 0o644);
        let fh = open(&fs, (0, 0), ino, libc::O_RDWR | libc::O_DIRECT);
        assert!(fs.async_takes(FUSE_WRITE, ino, fh) && fs.async_takes(FUSE_READ, ino, fh));
        assert!(
            !fs.async_takes(FUSE_READ, ino, plain) && !fs.async_takes(FUSE_WRITE, ino, plain),
            "a buffered handle stays blocking"
        );
        let ro = open(&fs, (0, 0), ino, libc::O_RDONLY | libc::O_DIRECT);
        assert!(fs.async_takes(FUSE_READ, ino, ro) && !fs.async_takes(FUSE_WRITE, ino, ro));
        let n = 64u64;
        // Blocks in a scattered order, so writes land out of order.
        let order: Vec<u64> = (0..n).map(|i| (i * 37) % n).collect();
        for (tag, &b) in order.iter().enumerate() {
            sent(fs.async_write(
                &ctx(0, 0),
                ino,
                fh,
                &mut Payload(block(b, 1)),
                BLOCK as u32,
                b * BLOCK as u64,
                0,
                tag as u64,
            ));
        }
        for (tag, r) in reap(&fs, order.len()) {
            match r {
                Ok(AsyncReply::Written(w)) => assert_eq!(w, BLOCK, "write {tag}"),
                other => panic!("write {tag}: {other:?}"),
            }
        }
        for (i, &b) in order.iter().enumerate() {
            sent(fs.async_read(
                &ctx(0, 0),
                ino,
                fh,
                BLOCK as u32,
                b * BLOCK as u64,
                BLOCK,
                1000 + i as u64,
            ));
        }
        for (tag, r) in reap(&fs, order.len()) {
            let b = order[usize::try_from(tag - 1000).unwrap()];
            match r {
                Ok(AsyncReply::Read(data)) => assert!(data == block(b, 1), "block {b} differs"),
                other => panic!("read {tag}: {other:?}"),
            }
        }
        // The blocking path reads the same.
        for b in 0..n {
            let mut sink = Sink(Vec::new());
            fs.read(&ctx(0, 0), ino, fh, &mut sink, 4096, b * 4096, None, 0)
                .unwrap();
            assert!(
                sink.0 == block(b, 1),
                "block {b} as the blocking path reads it"
            );
        }
        // Another client sees what was written.
        let other = lab.ceph();
        let dir = super::common::ceph_dir(&other, &format!("/{name}"));
        let all = super::common::ceph_read_all(&other, &dir, "f");
        assert_eq!(all.len(), n as usize * BLOCK);
        for b in 0..n {
            let at = b as usize * BLOCK;
            assert!(
                all[at..at + BLOCK] == block(b, 1),
                "block {b} as another client reads it"
            );
        }
        // Across the end of the file: short; past it: nothing (answered at once).
        let size = n * BLOCK as u64;
        sent(fs.async_read(&ctx(0, 0), ino, ro, 4096, size - 100, 4096, 7000));
        match reap(&fs, 1).remove(&7000) {
            Some(Ok(AsyncReply::Read(data))) => {
                assert_eq!(data.len(), 100);
                assert!(data[..] == block(n - 1, 1)[BLOCK - 100..]);
            }
            other => panic!("{other:?}"),
        }
        match fs.async_read(&ctx(0, 0), ino, ro, 4096, size + 4096, 4096, 7001) {
            Ok(AsyncStart::Done(AsyncReply::Read(d))) => assert!(d.is_empty()),
            other => panic!("{other:?}"),
        }
        // Room in the reply for less than asked: no more is read.
        sent(fs.async_read(&ctx(0, 0), ino, ro, 4096, 0, 1000, 7002));
        match reap(&fs, 1).remove(&7002) {
            Some(Ok(AsyncReply::Read(data))) => assert!(data[..] == block(0, 1)[..1000]),
            other => panic!("{other:?}"),
        }
        for h in [fh, ro, plain] {
            fs.release(&ctx(0, 0), ino, 0, h, false, false, None)
                .unwrap();
        }
    }

    /// Async reads of an O_DIRECT handle leave nothing in libcephfs's object cache that a
    /// later direct write (which bypasses it) would leave stale: blocking direct writes, async
    /// reads, blocking direct rewrites, async reads again see the new data.
    #[test]
    fn async_reads_see_later_direct_writes() {
        let lab = Lab::get();
        let fs = common_fs(&lab, &format!("nonblocking-coh-{}", std::process::id()));
        let (ino, plain) = super::common::create_as(&fs, &ctx(0, 0), 1, &c("f"), 0o644);
        fs.release(&ctx(0, 0), ino, 0, plain, false, false, None)
            .unwrap();
        let fh = open(&fs, (0, 0), ino, libc::O_RDWR | libc::O_DIRECT);
        for gen in 1..=3u8 {
            for b in 0..16u64 {
                super::common::fs_write(&fs, ino, fh, b * BLOCK as u64, &block(b, gen)).unwrap();
            }
            for b in 0..16u64 {
                sent(fs.async_read(
                    &ctx(0, 0),
                    ino,
                    fh,
                    BLOCK as u32,
                    b * BLOCK as u64,
                    BLOCK,
                    b,
                ));
            }
            for (tag, r) in reap(&fs, 16) {
                match r {
                    Ok(AsyncReply::Read(data)) => {
                        assert!(
                            data == block(tag, gen),
                            "generation {gen}: block {tag} stale"
                        )
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    fn common_fs(lab: &Lab, name: &str) -> CephFs {
        super::common::fs_layer(lab, name)
    }

    /// The errno of the blocking READ of the same arguments.
    fn blocking_read(fs: &CephFs, ino: u64, fh: u64, size: u32, off: u64) -> i32 {
        errno(fs.read(
            &ctx(0, 0),
            ino,
            fh,
            &mut Sink(Vec::new()),
            size,
            off,
            None,
            0,
        ))
    }

    /// The async path's buffers are bounded (review of f9264a9, finding 6): requests of the
    /// largest size are taken while the daemon's budget (64 MiB) has room for one more, then
    /// left to the blocking path until completions give bytes back. Before, every chain the
    /// guest posted was taken, up to 1 MiB each, 1,024 chains a queue.
    #[test]
    fn hostile_async_bytes_in_flight_stop_at_the_budget() {
        let lab = Lab::get();
        let name = format!("nonblocking-budget-{}", std::process::id());
        let fs = common_fs(&lab, &name);
        let (ino, plain) = super::common::create_as(&fs, &ctx(0, 0), 1, &c("f"), 0o644);
        fs.release(&ctx(0, 0), ino, 0, plain, false, false, None)
            .unwrap();
        let fh = open(&fs, (0, 0), ino, libc::O_WRONLY | libc::O_DIRECT);
        const MIB: usize = 1 << 20;
        let mut taken = 0u64;
        // Completions are not reaped meanwhile: their bytes stay counted until they are.
        while fs.async_takes(FUSE_WRITE, ino, fh) && taken < 200 {
            sent(fs.async_write(
                &ctx(0, 0),
                ino,
                fh,
                &mut Payload(vec![7u8; MIB]),
                MIB as u32,
                taken * MIB as u64,
                0,
                taken,
            ));
            taken += 1;
        }
        assert_eq!(taken, 64, "1 MiB writes taken by the async path at once");
        assert!(!fs.async_takes(FUSE_READ, ino, fh), "reads are bounded too");
        for (tag, r) in reap(&fs, usize::try_from(taken).unwrap()) {
            match r {
                Ok(AsyncReply::Written(w)) => assert_eq!(w, MIB, "write {tag}"),
                other => panic!("write {tag}: {other:?}"),
            }
        }
        assert!(
            fs.async_takes(FUSE_WRITE, ino, fh),
            "taken again once the completions gave their bytes back"
        );
    }

    /// Bad handles, handles of another node, offsets past i64: the async calls answer at once
    /// with the blocking path's errno, and the handle serves on.
    #[test]
    fn async_errors_are_the_blocking_errnos() {
        let lab = Lab::get();
        let fs = common_fs(&lab, &format!("nonblocking-err-{}", std::process::id()));
        let (ino, _) = super::common::create_as(&fs, &ctx(0, 0), 1, &c("f"), 0o644);
        let fh = open(&fs, (0, 0), ino, libc::O_RDWR | libc::O_DIRECT);
        let cases: [(u64, u64, u64); 5] = [
            (ino, fh + 999, 0),
            (1, fh, 0),
            (ino, fh, u64::MAX - 10),
            (ino, fh, i64::MAX as u64),
            (ino, fh + 999, u64::MAX),
        ];
        for (node, h, off) in cases {
            let want = blocking_read(&fs, node, h, 4096, off);
            assert_ne!(want, 0);
            let got = errno(fs.async_read(&ctx(0, 0), node, h, 4096, off, 4096, 1));
            assert_eq!(got, want, "READ node {node} fh {h} off {off}");
            let got = errno(fs.async_write(
                &ctx(0, 0),
                node,
                h,
                &mut Payload(vec![1; 10]),
                10,
                off,
                0,
                2,
            ));
            let want = errno(super::common::fs_write(&fs, node, h, off, &[1; 10]));
            assert_eq!(got, want, "WRITE node {node} fh {h} off {off}");
        }
        assert_eq!(
            errno(fs.async_read(&ctx(0, 0), ino, fh + 999, 1, 0, 1, 3)),
            libc::EBADF
        );
        assert_eq!(
            errno(fs.async_read(&ctx(0, 0), ino, fh, 4096, u64::MAX - 10, 4096, 3)),
            libc::EFBIG
        );
        assert!(
            fs.async_next(Duration::from_millis(50)).is_none(),
            "nothing was sent"
        );
        // The handle still serves.
        sent(fs.async_write(
            &ctx(0, 0),
            ino,
            fh,
            &mut Payload(vec![9; 512]),
            512,
            0,
            0,
            4,
        ));
        assert!(matches!(
            reap(&fs, 1).remove(&4),
            Some(Ok(AsyncReply::Written(512)))
        ));
    }

    /// An O_DIRECT write by a non-root guest user flagged WRITE_KILL_PRIV (what the guest sends
    /// under SB_NOSEC) clears suid/sgid on the async path as on the blocking one; root's
    /// unflagged write keeps them.
    #[test]
    fn async_write_by_non_root_kills_suid_and_sgid() {
        let lab = Lab::get();
        let fs = common_fs(&lab, &format!("nonblocking-kill-{}", std::process::id()));
        let root = ctx(0, 0);
        let (ino, _) = super::common::create_as(&fs, &root, 1, &c("suid"), 0o6777);
        let mode = |fs: &CephFs| fs.getattr(&root, ino, None).unwrap().0.st_mode & 0o7777;
        assert_eq!(mode(&fs), 0o6777);
        let rfh = open(&fs, (0, 0), ino, libc::O_RDWR | libc::O_DIRECT);
        sent(fs.async_write(&root, ino, rfh, &mut Payload(vec![1; 4096]), 4096, 0, 0, 1));
        assert!(matches!(
            reap(&fs, 1).remove(&1),
            Some(Ok(AsyncReply::Written(4096)))
        ));
        assert_eq!(mode(&fs), 0o6777, "root's unflagged write keeps the bits");
        let ufh = open(&fs, (1000, 1000), ino, libc::O_RDWR | libc::O_DIRECT);
        assert!(fs.async_takes(FUSE_WRITE, ino, ufh));
        sent(fs.async_write(
            &ctx(1000, 1000),
            ino,
            ufh,
            &mut Payload(vec![2; 4096]),
            4096,
            4096,
            WRITE_KILL_PRIV,
            2,
        ));
        assert!(matches!(
            reap(&fs, 1).remove(&2),
            Some(Ok(AsyncReply::Written(4096)))
        ));
        assert_eq!(mode(&fs), 0o777, "suid and sgid killed before the write");
    }
}

/// O_DIRECT I/O from 16 guest processes at once through a daemon with `--nonblocking-io on`:
/// each writes its own 4 KiB blocks in a scattered order and reads them back while the others
/// run, then the whole file is checked byte for byte; a read across the end of the file is
/// short and one past it is empty; a non-root user's O_DIRECT write kills suid/sgid. Then the
/// same load runs again and the daemon is stopped (SIGTERM) in the middle of it: it exits
/// cleanly, in bounded time.
#[test]
fn guest_direct_io_through_the_async_path() {
    use std::time::{Duration, Instant};
    let lab = Lab::get();
    let name = format!("nonblocking-guest-{}", std::process::id());
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let mut daemon = common::Daemon::start(
        &lab,
        &work,
        &export,
        &["--nonblocking-io", "auto", "--log-level", "debug"],
    );
    if daemon.log_text().contains("nonblocking_io=false") {
        println!("skipped: the daemon under test was built without the async path");
        return;
    }
    assert!(
        daemon.log_text().contains("nonblocking_io=true"),
        "{}",
        daemon.log_text()
    );
    let script = r#"
set -u
fails=0
/opt/bin/fs-suite --direct-load /mnt/load 20240611 16 64 || fails=$((fails+1))
/opt/bin/fs-suite --only o_direct /mnt || fails=$((fails+1))
/opt/bin/fs-suite --only user_direct_kill_suid /mnt || fails=$((fails+1))
echo "GUEST-DONE fails=$fails"
# The stop: a load that runs until the daemon goes away under it.
/opt/bin/fs-suite --direct-load /mnt/load2 7 16 100000 >/dev/null 2>&1 &
sleep 3
echo "STOP-NOW"
sleep 10
echo "GUEST-END"
"#;
    let bin = lab.guest_bin.join("fs-suite");
    // The guest stays up after the stop until its timeout: the stop is checked from the host.
    let guest = {
        let lab = lab.clone();
        let work = work.clone();
        let socket = daemon.socket.clone();
        let log = daemon.log.clone();
        let stub = common::Daemon {
            child: None,
            socket,
            log,
        };
        std::thread::spawn(move || {
            common::run_guest(
                &lab,
                &work,
                &stub,
                script,
                &[(bin, "/opt/bin/fs-suite")],
                300,
            )
        })
    };
    // Stop the daemon once the guest said so.
    let console = work.join("console.log");
    let deadline = Instant::now() + Duration::from_secs(280);
    loop {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        if text.contains("STOP-NOW") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the guest never got to the stop:\n{text}\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let stop = Instant::now();
    let status = daemon.stop().expect("the daemon was running");
    let took = stop.elapsed();
    let log = daemon.log_text();
    let run = guest.join().expect("the guest thread");
    let failures = run.not_ok();
    assert!(
        run.console.contains("GUEST-DONE fails=0") && failures.is_empty(),
        "in-guest checks failed: {failures:?}"
    );
    assert!(
        log.contains("async request answered"),
        "no request went through the async path:\n{log}"
    );
    assert!(
        status.success(),
        "the daemon stopped with I/O in flight exited {status}:\n{log}"
    );
    assert!(
        took < Duration::from_secs(15),
        "the stop took {took:?}:\n{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}
