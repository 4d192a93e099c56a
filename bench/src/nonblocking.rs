//! `ceph-virtiofsd-bench nonblocking`: does `ceph_ll_nonblocking_readv_writev` (libcephfs 20)
//! pay against the blocking calls the daemon makes today?
//!
//! The daemon serves a queue's requests on worker threads, each blocked in `ceph_ll_readv` or
//! `ceph_ll_writev` until the OSDs answer: N requests in flight cost N threads. The
//! nonblocking call lets one thread keep N in flight. Both are measured here on one file,
//! through libcephfs in this process (no daemon, no FUSE), at each depth:
//!   blocking    - DEPTH threads, each one call at a time (the daemon's model);
//!   nonblocking - one thread keeping DEPTH operations in flight, submitting a new one as
//!                 each completes.
//! Random aligned offsets, `--bs` bytes, `--secs` seconds per case, reads then writes, in
//! ABBA order per depth (blocking, nonblocking, nonblocking, blocking; each figure is the
//! mean of its two). Printed per case: operations per second, MiB/s, p50 and p99 latency
//! (submission to completion), and the process's CPU time per operation (user + system,
//! libcephfs's own threads included: what serving an operation costs the host).
//!
//! `--direct` opens the file O_DIRECT: every read goes to the OSDs (libcephfs's cache is
//! bypassed), as the guest's O_DIRECT and uncached I/O does. Without it, reads of a file the
//! bench just wrote are served from libcephfs's object cache.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "ceph-virtiofsd-bench nonblocking",
    about = "Blocking calls on N threads against ceph_ll_nonblocking_readv_writev with N in flight from one thread"
)]
struct Cli {
    /// ceph.conf of the cluster.
    #[arg(long)]
    conf: PathBuf,
    /// cephx id.
    #[arg(long, default_value = "admin")]
    ceph_id: String,
    /// Bytes per operation.
    #[arg(long, default_value_t = 4096)]
    bs: usize,
    /// Operations in flight (threads for the blocking calls), comma-separated.
    #[arg(long, default_value = "1,4,16,64", value_delimiter = ',')]
    depths: Vec<usize>,
    /// Seconds per case.
    #[arg(long, default_value_t = 5)]
    secs: u64,
    /// Size of the file, MiB (written in full first).
    #[arg(long, default_value_t = 64)]
    file_mib: u64,
    /// Open the file O_DIRECT (reads bypass libcephfs's object cache).
    #[arg(long)]
    direct: bool,
    /// Name of the file made in the root of the filesystem.
    #[arg(long, default_value = "nonblocking-bench")]
    name: String,
}

pub fn main(args: impl Iterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = Cli::parse_from(args);
    match imp::run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nonblocking: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(libcephfs_nonblocking))]
mod imp {
    pub(super) fn run(_cli: &super::Cli) -> Result<(), String> {
        let (v, _) = ceph_client::version();
        Err(format!(
            "this build's libcephfs ({v}) has no ceph_ll_nonblocking_readv_writev: it needs \
             libcephfs 20 (build in its root filesystem: tests/lab/rootfs --run 20 \"cargo build \
             -p ceph-virtiofsd-bench\")"
        ))
    }
}

#[cfg(libcephfs_nonblocking)]
mod imp {
    use super::Cli;
    use ceph_client::aio::{IoQueue, WriteSync};
    use ceph_client::{File, MountBuilder, UserPerm, CEPH_STATX_BASIC_STATS};
    use std::ffi::CString;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Process CPU time (user + system) so far.
    fn cpu_time() -> Duration {
        // SAFETY: getrusage writes one struct rusage into the zeroed value we own.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a valid out pointer for the call.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        let tv = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec.try_into().unwrap_or(0))
                + Duration::from_micros(t.tv_usec.try_into().unwrap_or(0))
        };
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }

    /// One case's figures.
    #[derive(Clone, Copy, Debug, Default)]
    struct Figures {
        ops: u64,
        secs: f64,
        p50_us: u64,
        p99_us: u64,
        cpu_us_per_op: f64,
        errors: u64,
    }

    impl Figures {
        fn from(mut lat_us: Vec<u64>, errors: u64, wall: Duration, cpu: Duration) -> Self {
            lat_us.sort_unstable();
            let ops = lat_us.len() as u64;
            Figures {
                ops,
                secs: wall.as_secs_f64(),
                p50_us: crate::stats::percentile(&lat_us, 0.5),
                p99_us: crate::stats::percentile(&lat_us, 0.99),
                cpu_us_per_op: cpu.as_secs_f64() * 1e6 / ops.max(1) as f64,
                errors,
            }
        }

        fn iops(&self) -> f64 {
            self.ops as f64 / self.secs.max(1e-9)
        }

        /// The mean of two runs of the same case.
        fn mean(a: Figures, b: Figures) -> Figures {
            Figures {
                ops: a.ops + b.ops,
                secs: a.secs + b.secs,
                p50_us: (a.p50_us + b.p50_us) / 2,
                p99_us: (a.p99_us + b.p99_us) / 2,
                cpu_us_per_op: (a.cpu_us_per_op + b.cpu_us_per_op) / 2.0,
                errors: a.errors + b.errors,
            }
        }
    }

    /// A small xorshift for offsets, seeded: a run's offsets repeat from run to run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Rw {
        Read,
        Write,
    }

    #[derive(Clone)]
    struct Setup {
        file: Arc<File>,
        bs: usize,
        blocks: u64,
        secs: Duration,
    }

    fn offset(rng: &mut Rng, s: &Setup) -> u64 {
        (rng.next() % s.blocks) * s.bs as u64
    }

    fn blocking(s: &Setup, rw: Rw, depth: usize) -> Figures {
        let stop = Arc::new(AtomicBool::new(false));
        let cpu0 = cpu_time();
        let t0 = Instant::now();
        let threads: Vec<_> = (0..depth)
            .map(|i| {
                let s = s.clone();
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1));
                    let mut buf = vec![0x5a; s.bs];
                    let (mut lat, mut errors) = (Vec::new(), 0);
                    while !stop.load(Ordering::Relaxed) {
                        let off = offset(&mut rng, &s);
                        let t = Instant::now();
                        let r = match rw {
                            Rw::Read => s.file.read(off, &mut buf),
                            Rw::Write => s.file.write(off, &buf),
                        };
                        match r {
                            Ok(_) => lat.push(t.elapsed().as_micros() as u64),
                            Err(_) => errors += 1,
                        }
                    }
                    (lat, errors)
                })
            })
            .collect();
        std::thread::sleep(s.secs);
        stop.store(true, Ordering::Relaxed);
        let (mut lat, mut errors) = (Vec::new(), 0);
        for t in threads {
            let (l, e) = t.join().expect("a blocking worker panicked");
            lat.extend(l);
            errors += e;
        }
        Figures::from(lat, errors, t0.elapsed(), cpu_time() - cpu0)
    }

    fn nonblocking(s: &Setup, rw: Rw, depth: usize) -> Figures {
        let q = IoQueue::new();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut started: Vec<Instant> = vec![Instant::now(); depth];
        let (mut lat, mut errors) = (Vec::new(), 0);
        let mut bufs: Vec<Vec<u8>> = (0..depth).map(|_| vec![0x5a; s.bs]).collect();
        let cpu0 = cpu_time();
        let t0 = Instant::now();
        let submit = |slot: usize, buf: Vec<u8>, rng: &mut Rng| {
            let off = offset(rng, s);
            match rw {
                Rw::Read => s.file.read_nonblocking(&q, slot as u64, off, buf),
                Rw::Write => s
                    .file
                    .write_nonblocking(&q, slot as u64, off, buf, WriteSync::None),
            }
        };
        let mut in_flight = 0;
        for (slot, buf) in bufs.drain(..).enumerate() {
            started[slot] = Instant::now();
            if submit(slot, buf, &mut rng).is_ok() {
                in_flight += 1;
            } else {
                errors += 1;
            }
        }
        let deadline = t0 + s.secs;
        while in_flight > 0 {
            let Some(c) = q.wait(Duration::from_secs(60)) else {
                errors += in_flight;
                break;
            };
            in_flight -= 1;
            let slot = usize::try_from(c.tag).unwrap_or(0);
            match c.result {
                Ok(_) => lat.push(started[slot].elapsed().as_micros() as u64),
                Err(_) => errors += 1,
            }
            if Instant::now() < deadline {
                let mut buf = c.buf;
                buf.resize(s.bs, 0x5a);
                started[slot] = Instant::now();
                if submit(slot, buf, &mut rng).is_ok() {
                    in_flight += 1;
                } else {
                    errors += 1;
                }
            }
        }
        Figures::from(lat, errors, t0.elapsed(), cpu_time() - cpu0)
    }

    pub(super) fn run(cli: &Cli) -> Result<(), String> {
        if cli.bs == 0 || cli.depths.contains(&0) {
            return Err("--bs and every --depths value must be at least 1".into());
        }
        let m = MountBuilder::new(Some(&cli.ceph_id))
            .and_then(|b| b.conf_read_file(Some(&cli.conf)))
            .and_then(|b| b.mount("/"))
            .map_err(|e| format!("mounting CephFS with {}: {e}", cli.conf.display()))?;
        let root = UserPerm::root();
        let top = m.lookup_root().map_err(|e| e.to_string())?;
        let name = CString::new(cli.name.clone()).map_err(|e| e.to_string())?;
        let flags = libc::O_RDWR | libc::O_CREAT | if cli.direct { libc::O_DIRECT } else { 0 };
        let (_ino, _, f) = m
            .create(&top, &name, 0o644, flags, CEPH_STATX_BASIC_STATS, 0, &root)
            .map_err(|e| format!("creating /{}: {e}", cli.name))?;
        let file = Arc::new(f);
        let size = cli.file_mib << 20;
        let chunk = vec![0xa5u8; 4 << 20];
        let mut off = 0;
        while off < size {
            file.write(off, &chunk)
                .map_err(|e| format!("filling: {e}"))?;
            off += chunk.len() as u64;
        }
        file.fsync(false).map_err(|e| format!("fsync: {e}"))?;
        let s = Setup {
            file,
            bs: cli.bs,
            blocks: (size / cli.bs as u64).max(1),
            secs: Duration::from_secs(cli.secs),
        };
        let (v, _) = ceph_client::version();
        println!(
            "nonblocking: libcephfs {v}, {} KiB operations, random, {} MiB file{}, {} s per case, ABBA",
            cli.bs / 1024,
            cli.file_mib,
            if cli.direct { ", O_DIRECT" } else { "" },
            cli.secs
        );
        println!(
            "{:<6} {:>5} {:<11} {:>9} {:>8} {:>8} {:>8} {:>9} {:>6} {:>8}",
            "op",
            "depth",
            "mode",
            "ops/s",
            "MiB/s",
            "p50 us",
            "p99 us",
            "CPU us/op",
            "errors",
            "threads"
        );
        for rw in [Rw::Read, Rw::Write] {
            for &d in &cli.depths {
                let b1 = blocking(&s, rw, d);
                let n1 = nonblocking(&s, rw, d);
                let n2 = nonblocking(&s, rw, d);
                let b2 = blocking(&s, rw, d);
                let b = Figures::mean(b1, b2);
                let n = Figures::mean(n1, n2);
                for (mode, f, threads) in [("blocking", b, d), ("nonblocking", n, 1)] {
                    println!(
                        "{:<6} {:>5} {:<11} {:>9.0} {:>8.1} {:>8} {:>8} {:>9.1} {:>6} {:>8}",
                        format!("{rw:?}").to_lowercase(),
                        d,
                        mode,
                        f.iops(),
                        f.iops() * cli.bs as f64 / f64::from(1 << 20),
                        f.p50_us,
                        f.p99_us,
                        f.cpu_us_per_op,
                        f.errors,
                        threads
                    );
                }
                println!(
                    "{:<6} {:>5} nonblocking/blocking: ops/s {:.2}x, CPU per op {:.2}x",
                    "",
                    d,
                    n.iops() / b.iops().max(1e-9),
                    n.cpu_us_per_op / b.cpu_us_per_op.max(1e-9)
                );
            }
        }
        let _ = m.unlink(&top, &name, &root);
        Ok(())
    }
}
