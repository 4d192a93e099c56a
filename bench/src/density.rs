//! `ceph-virtiofsd-bench density`: the guests of the density measurement (`tests/bench/density`).
//!
//! `density populate` makes one tree of `--dirs` directories with `--files` empty files each
//! through libcephfs (the floor backend, as client.admin, `--jobs` clients in parallel), once:
//! a marker file names the shape, and a second run with the same shape does nothing.
//!
//! `density guests --socket S ...` connects one frontend to each socket (FUSE_INIT, then idle,
//! as a booted guest that has mounted the filesystem) and then takes commands on standard
//! input, one a line, answering each with one line on standard output (`ok ...` or
//! `err ...`), so that a script can measure the daemons between steps:
//!
//! ```text
//! walk I PATH          READDIRPLUS the tree at PATH (relative to the export's root) on guest I,
//!                      recursively, as `find` or `ls -lR` in a Linux guest whose dentry cache
//!                      keeps everything: every entry's lookup is kept, nothing is FORGOTTEN
//! stream I MIB NAME    CREATE NAME in the root on guest I, WRITE MIB MiB in 1 MiB requests
//!                      (4 in flight), FSYNC, READ it back (buffered, 4 in flight), RELEASE,
//!                      UNLINK, FORGET
//! quit
//! ```
//!
//! Guests are numbered from 0 in the order of their `--socket`s. The first line printed is
//! `ready N` once every session is up.

use std::collections::VecDeque;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

use crate::backend::{Backend, Ctx, Op, OpError, Reply};
use crate::floor::{FloorBackend, FloorSpec};
use crate::session::{FuseSession, SessionOpts};

const S_IFREG: u32 = 0o100_000;
const DT_DIR: u32 = 4;

#[derive(Debug, Parser)]
#[command(
    name = "ceph-virtiofsd-bench density",
    about = "Guests for the density measurement: idle sessions a script drives step by step"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Make the walk's tree through libcephfs (once: a marker names its shape).
    Populate {
        #[arg(long)]
        ceph_conf: PathBuf,
        /// cephx id (with rw on PATH).
        #[arg(long, default_value = "admin")]
        ceph_id: String,
        /// Where the tree goes (made if missing).
        #[arg(long, default_value = "/tree")]
        path: String,
        #[arg(long, default_value_t = 100)]
        dirs: usize,
        /// Files per directory.
        #[arg(long, default_value_t = 999)]
        files: usize,
        /// libcephfs clients creating in parallel, each its share of the directories.
        #[arg(long, default_value_t = 4)]
        jobs: usize,
    },
    /// Connect one idle guest to each socket and take commands on standard input.
    Guests {
        /// A daemon's vhost-user socket (repeat: guest 0, 1, ...).
        #[arg(long = "socket", required = true)]
        sockets: Vec<PathBuf>,
        /// READDIRPLUS buffer size (a Linux guest asks for one page).
        #[arg(long, default_value_t = 4096)]
        readdir_size: u32,
        /// Seconds to wait for any reply.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
}

pub fn main(args: impl Iterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = Cli::parse_from(args);
    match cli.cmd {
        Cmd::Populate {
            ceph_conf,
            ceph_id,
            path,
            dirs,
            files,
            jobs,
        } => match populate(&ceph_conf, &ceph_id, &path, dirs, files, jobs) {
            Ok(msg) => {
                println!("{msg}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("density populate: {e}");
                ExitCode::from(1)
            }
        },
        Cmd::Guests {
            sockets,
            readdir_size,
            timeout,
        } => guests(&sockets, readdir_size, timeout),
    }
}

fn node_of(r: Reply, op: &'static str) -> Result<u64, OpError> {
    match r {
        Reply::Entry { node, .. } => Ok(node),
        other => Err(OpError::Malformed {
            op,
            why: format!("unexpected reply {other:?}"),
        }),
    }
}

/// LOOKUP `name` in `parent`, or make it (a directory, or an empty regular file).
fn ensure(b: &mut dyn Backend, parent: u64, name: &str, dir: bool) -> Result<u64, OpError> {
    let lookup = Op::Lookup {
        parent,
        name: name.into(),
    };
    match b.call(Ctx::ROOT, lookup.clone()) {
        Ok(r) => return node_of(r, "LOOKUP"),
        Err(e) if e.errno() == Some(libc::ENOENT) => {}
        Err(e) => return Err(e),
    }
    let make = if dir {
        Op::Mkdir {
            parent,
            name: name.into(),
            mode: 0o755,
        }
    } else {
        Op::Mknod {
            parent,
            name: name.into(),
            mode: S_IFREG | 0o644,
        }
    };
    match b.call(Ctx::ROOT, make) {
        Ok(r) => node_of(r, "MKDIR/MKNOD"),
        // Another job made it meanwhile.
        Err(e) if e.errno() == Some(libc::EEXIST) => node_of(b.call(Ctx::ROOT, lookup)?, "LOOKUP"),
        Err(e) => Err(e),
    }
}

fn floor(conf: &std::path::Path, id: &str) -> Result<FloorBackend, String> {
    let spec = FloorSpec {
        conf: conf.to_path_buf(),
        root: "/".into(),
        client_id: id.into(),
        admin_socket: None,
    };
    FloorBackend::connect(&spec, 1 << 20).map_err(|e| {
        let mut s = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(x) = src {
            s.push_str(&format!(": {x}"));
            src = x.source();
        }
        s
    })
}

/// The tree's directory node in a fresh client.
fn tree_dir(b: &mut dyn Backend, path: &str) -> Result<u64, String> {
    let mut node = b.root();
    for c in path.split('/').filter(|c| !c.is_empty()) {
        node = ensure(b, node, c, true).map_err(|e| format!("making {path}: {e}"))?;
    }
    Ok(node)
}

fn populate(
    conf: &std::path::Path,
    id: &str,
    path: &str,
    dirs: usize,
    files: usize,
    jobs: usize,
) -> Result<String, String> {
    let marker = format!(".populated-{dirs}x{files}");
    let mut b = floor(conf, id).map_err(|e| format!("connecting to CephFS: {e}"))?;
    let top = tree_dir(&mut b, path)?;
    if b.call(
        Ctx::ROOT,
        Op::Lookup {
            parent: top,
            name: marker.clone(),
        },
    )
    .is_ok()
    {
        return Ok(format!(
            "density populate: {path} already has {dirs} directories of {files} files"
        ));
    }
    let t = Instant::now();
    let jobs = jobs.clamp(1, 16);
    let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..jobs)
            .map(|j| {
                sc.spawn(move || -> Result<(), String> {
                    let mut b = floor(conf, id).map_err(|e| format!("job {j}: {e}"))?;
                    let top = tree_dir(&mut b, path)?;
                    for d in (j..dirs).step_by(jobs) {
                        let dn = format!("d{d:04}");
                        let dir = ensure(&mut b, top, &dn, true)
                            .map_err(|e| format!("making {path}/{dn}: {e}"))?;
                        for f in 0..files {
                            let fname = format!("f{f:05}");
                            let n = ensure(&mut b, dir, &fname, false)
                                .map_err(|e| format!("making {path}/{dn}/{fname}: {e}"))?;
                            b.forget(&[(n, 1)]).map_err(|e| e.to_string())?;
                        }
                        b.forget(&[(dir, 1)]).map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(Err("a job panicked".into())))
            .collect()
    });
    for r in results {
        r?;
    }
    ensure(&mut b, top, &marker, false).map_err(|e| format!("making the marker: {e}"))?;
    Ok(format!(
        "density populate: made {path}: {dirs} directories of {files} files ({} inodes) in {:.0} s",
        dirs * (files + 1),
        t.elapsed().as_secs_f64()
    ))
}

fn guests(sockets: &[PathBuf], readdir_size: u32, timeout: u64) -> ExitCode {
    let opts = SessionOpts {
        request_queues: 1,
        queue_size: 128,
        slots_per_queue: 4,
        max_io: 1 << 20,
        timeout: Duration::from_secs(timeout.max(1)),
        event_idx: true,
        halt_poll: Duration::ZERO,
        reconnect: None,
    };
    let mut sessions = Vec::new();
    for (i, s) in sockets.iter().enumerate() {
        if let Some(spec) = FloorSpec::parse(&s.to_string_lossy(), "admin") {
            match FloorBackend::connect(&spec, opts.max_io) {
                Ok(f) => sessions.push(Guest::Floor(f)),
                Err(e) => {
                    eprintln!("density guests: guest {i}: connecting to CephFS");
                    crate::print_chain(&e);
                    return ExitCode::from(2);
                }
            }
            continue;
        }
        match FuseSession::connect(s, &opts) {
            Ok(x) => sessions.push(Guest::Fuse(x)),
            Err(e) => {
                eprintln!("density guests: guest {i}: connecting to {}", s.display());
                crate::print_chain(&e);
                return ExitCode::from(2);
            }
        }
    }
    println!("ready {}", sessions.len());
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            [] => continue,
            ["quit"] => break,
            ["walk", i, path] => with_guest(&mut sessions, i, |b| walk(b, path, readdir_size)),
            ["stream", i, mib, name] => match mib.parse::<u64>() {
                Ok(mib) => with_guest(&mut sessions, i, |b| stream(b, mib, name)),
                Err(_) => Err(format!("stream: {mib:?} is not a number of MiB")),
            },
            _ => Err(format!("unknown command {line:?}")),
        };
        match answer {
            Ok(s) => println!("ok {s}"),
            Err(e) => println!("err {e}"),
        }
    }
    for s in sessions {
        if let Guest::Fuse(s) = s {
            s.close();
        }
    }
    ExitCode::SUCCESS
}

/// A guest: a frontend of a daemon, or (`ceph:CONF[:ROOT]`, as the bench's floor) the same
/// requests made through libcephfs in this process, to tell libcephfs's share of the memory.
enum Guest {
    Fuse(FuseSession),
    Floor(FloorBackend),
}

fn with_guest(
    sessions: &mut [Guest],
    i: &str,
    f: impl FnOnce(&mut dyn Backend) -> Result<String, String>,
) -> Result<String, String> {
    let idx: usize = i.parse().map_err(|_| format!("{i:?} is no guest number"))?;
    let s = sessions
        .get_mut(idx)
        .ok_or_else(|| format!("no guest {idx}"))?;
    match s {
        Guest::Fuse(s) => f(s),
        Guest::Floor(s) => f(s),
    }
}

/// The recursive READDIRPLUS walk; every entry's lookup is kept.
fn walk(b: &mut dyn Backend, path: &str, size: u32) -> Result<String, String> {
    let t = Instant::now();
    let mut requests = 0u64;
    let mut start = b.root();
    for c in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        requests += 1;
        start = b
            .call(
                Ctx::ROOT,
                Op::Lookup {
                    parent: start,
                    name: c.into(),
                },
            )
            .and_then(|r| node_of(r, "LOOKUP"))
            .map_err(|e| format!("walk: LOOKUP {c}: {e}"))?;
    }
    let (mut entries, mut dirs) = (0u64, 0u64);
    let mut queue = VecDeque::from([start]);
    while let Some(dir) = queue.pop_front() {
        dirs += 1;
        requests += 2;
        let fh = match b.call(Ctx::ROOT, Op::Opendir { node: dir }) {
            Ok(Reply::Open { fh }) => fh,
            Ok(r) => return Err(format!("walk: OPENDIR: unexpected reply {r:?}")),
            Err(e) => return Err(format!("walk: OPENDIR of node {dir}: {e}")),
        };
        let mut offset = 0;
        loop {
            requests += 1;
            let v = match b.call(
                Ctx::ROOT,
                Op::Readdirplus {
                    node: dir,
                    fh,
                    offset,
                    size,
                },
            ) {
                Ok(Reply::Dir(v)) => v,
                Ok(r) => return Err(format!("walk: READDIRPLUS: unexpected reply {r:?}")),
                Err(e) => return Err(format!("walk: READDIRPLUS of node {dir}: {e}")),
            };
            let Some(last) = v.last() else { break };
            offset = last.offset;
            for e in v {
                if e.name == "." || e.name == ".." || e.node == 0 {
                    continue;
                }
                entries += 1;
                if e.kind == DT_DIR {
                    queue.push_back(e.node);
                }
            }
        }
        b.call(Ctx::ROOT, Op::Releasedir { node: dir, fh })
            .map_err(|e| format!("walk: RELEASEDIR: {e}"))?;
    }
    Ok(format!(
        "walk entries={entries} dirs={dirs} requests={requests} secs={:.1}",
        t.elapsed().as_secs_f64()
    ))
}

fn stream(b: &mut dyn Backend, mib: u64, name: &str) -> Result<String, String> {
    let io = b.max_io().clamp(4096, 1 << 20);
    let count = usize::try_from((mib << 20) / u64::from(io)).unwrap_or(usize::MAX);
    let user = Ctx::ROOT;
    let root = b.root();
    let (node, fh) = match b.call(
        user,
        Op::Create {
            parent: root,
            name: name.into(),
            mode: S_IFREG | 0o644,
            flags: (libc::O_CREAT | libc::O_TRUNC | libc::O_RDWR) as u32,
        },
    ) {
        Ok(Reply::Created { node, fh }) => (node, fh),
        Ok(r) => return Err(format!("stream: CREATE: unexpected reply {r:?}")),
        Err(e) => return Err(format!("stream: CREATE {name}: {e}")),
    };
    let pass = |b: &mut dyn Backend, fh: u64, write: bool| -> Result<f64, String> {
        let make = move |i: usize| {
            let offset = i as u64 * u64::from(io);
            if write {
                Op::Write {
                    node,
                    fh,
                    offset,
                    len: io,
                    kill_suidgid: false,
                }
            } else {
                Op::Read {
                    node,
                    fh,
                    offset,
                    len: io,
                }
            }
        };
        let what = if write { "WRITE" } else { "READ" };
        let t = Instant::now();
        let batch = b
            .pipeline(user, 4, count, &make)
            .map_err(|e| format!("stream: {what}: {e}"))?;
        if write {
            b.call(user, Op::Fsync { node, fh })
                .map_err(|e| format!("stream: FSYNC: {e}"))?;
        }
        if let Some(e) = batch.errors.first() {
            return Err(format!(
                "stream: {} {what}s failed, first: {e}",
                batch.errors.len()
            ));
        }
        Ok(batch.bytes as f64 / 1_048_576.0 / t.elapsed().as_secs_f64().max(1e-9))
    };
    let w = pass(b, fh, true)?;
    b.call(user, Op::Release { node, fh })
        .map_err(|e| format!("stream: RELEASE: {e}"))?;
    let rfh = match b.call(
        user,
        Op::Open {
            node,
            flags: libc::O_RDONLY as u32,
        },
    ) {
        Ok(Reply::Open { fh }) => fh,
        Ok(r) => return Err(format!("stream: OPEN: unexpected reply {r:?}")),
        Err(e) => return Err(format!("stream: OPEN: {e}")),
    };
    let r = pass(b, rfh, false)?;
    b.call(user, Op::Release { node, fh: rfh })
        .map_err(|e| format!("stream: RELEASE: {e}"))?;
    b.call(
        user,
        Op::Unlink {
            parent: root,
            name: name.into(),
        },
    )
    .map_err(|e| format!("stream: UNLINK: {e}"))?;
    b.forget(&[(node, 1)])
        .map_err(|e| format!("stream: FORGET: {e}"))?;
    Ok(format!(
        "stream mib={mib} write_mib_s={w:.0} read_mib_s={r:.0}"
    ))
}
