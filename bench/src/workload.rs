//! The workloads, written against `Backend` only: they know nothing of FUSE or virtqueues.

use std::time::{Duration, Instant};

use crate::backend::{Backend, Batch, Ctx, Op, OpError, Reply};

const S_IFREG: u32 = 0o100_000;
const TOP: &str = "cvbench";

/// Workload sizes (all configurable on the command line).
#[derive(Debug, Clone)]
pub struct Params {
    pub user: Ctx,
    pub walk_iters: usize,
    pub open_close_iters: usize,
    pub create_unlink_iters: usize,
    pub readdir_iters: usize,
    pub dir_entries: usize,
    pub readdir_size: u32,
    pub randwrite_ops: usize,
    pub randwrite_depth: usize,
    pub randwrite_file_mib: u64,
    pub seq_mib: u64,
    pub seq_depth: usize,
    /// MiB of the seq file `revread4k` and `fwdread4k` read.
    pub stride_mib: u64,
    pub stat_ops: usize,
    pub stat_nodes: usize,
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Walk48,
    Walk5,
    OpenClose,
    CreateUnlink,
    Readdir5000,
    Randwrite4k,
    /// O_DIRECT 4 KiB random reads of the randwrite4k file, at its depth (not in `all`: the
    /// async READ path's measurement, docs/benchmarks.md, "Nonblocking I/O").
    Randread4k,
    Seqwrite1m,
    Seqread1m,
    /// Buffered 4 KiB reads of the first `stride_mib` of the seqwrite1m file, one at a time,
    /// from its end to its start (`tac`, a backward scan), and the same forwards for
    /// comparison (neither in `all`: docs/benchmarks.md, "Backward reads").
    Revread4k,
    Fwdread4k,
    StatStorm(usize),
}

impl Workload {
    pub fn all() -> Vec<Workload> {
        use Workload::*;
        vec![
            Walk48,
            Walk5,
            OpenClose,
            CreateUnlink,
            Readdir5000,
            Randwrite4k,
            Seqwrite1m,
            Seqread1m,
            StatStorm(1),
            StatStorm(4),
            StatStorm(32),
        ]
    }

    pub fn name(&self) -> String {
        match self {
            Workload::Walk48 => "walk48".into(),
            Workload::Walk5 => "walk5".into(),
            Workload::OpenClose => "open-close".into(),
            Workload::CreateUnlink => "create-unlink".into(),
            Workload::Readdir5000 => "readdir5000".into(),
            Workload::Randwrite4k => "randwrite4k".into(),
            Workload::Randread4k => "randread4k".into(),
            Workload::Seqwrite1m => "seqwrite1m".into(),
            Workload::Seqread1m => "seqread1m".into(),
            Workload::Revread4k => "revread4k".into(),
            Workload::Fwdread4k => "fwdread4k".into(),
            Workload::StatStorm(n) => format!("stat-storm-{n}"),
        }
    }

    /// Parses one name; `stat-storm` expands to streams 1, 4 and 32.
    pub fn parse(s: &str) -> Option<Vec<Workload>> {
        if s == "all" {
            return Some(Self::all());
        }
        if s == "stat-storm" {
            return Some(vec![
                Workload::StatStorm(1),
                Workload::StatStorm(4),
                Workload::StatStorm(32),
            ]);
        }
        if let Some(n) = s.strip_prefix("stat-storm-") {
            return n
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .map(|n| vec![Workload::StatStorm(n)]);
        }
        Self::all()
            .into_iter()
            .chain([
                Workload::Randread4k,
                Workload::Revread4k,
                Workload::Fwdread4k,
            ])
            .find(|w| w.name() == s)
            .map(|w| vec![w])
    }

    /// Whether throughput is best given in MiB/s.
    pub fn is_bandwidth(&self) -> bool {
        matches!(
            self,
            Workload::Randwrite4k
                | Workload::Randread4k
                | Workload::Seqwrite1m
                | Workload::Seqread1m
                | Workload::Revread4k
                | Workload::Fwdread4k
        )
    }
}

/// The measurement of one workload in one session.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Operations (the unit the latency is taken over: one walk, one open+release, one request...).
    pub ops: u64,
    /// FUSE requests (or backend calls) those operations took.
    pub requests: u64,
    pub bytes: u64,
    pub wall: Duration,
    pub lat_ns: Vec<u64>,
    pub errors: u64,
    pub first_error: Option<String>,
    pub notes: Vec<String>,
    /// MDS requests the target's libcephfs client made during the measured part (when its
    /// admin socket is known).
    pub mds_requests: Option<u64>,
}

impl Sample {
    fn error(&mut self, e: &OpError) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }

    fn from_batch(b: Batch, requests_per_op: u64) -> Sample {
        let mut s = Sample {
            ops: b.latencies.len() as u64,
            requests: b.latencies.len() as u64 * requests_per_op,
            bytes: b.bytes,
            wall: b.wall,
            lat_ns: b
                .latencies
                .iter()
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                .collect(),
            ..Sample::default()
        };
        for e in &b.errors {
            s.error(e);
        }
        s
    }
}

/// Reads a counter of the target (MDS requests so far); `None` when unknown.
pub type Probe<'a> = &'a dyn Fn() -> Option<u64>;

fn delta(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    Some(after?.saturating_sub(before?))
}

/// A failure that ends the run of a workload (transport breakage or a failing precondition).
#[derive(Debug, thiserror::Error)]
#[error("{step}")]
pub struct WorkloadError {
    pub step: String,
    #[source]
    pub source: OpError,
}

fn step(what: impl Into<String>) -> impl FnOnce(OpError) -> WorkloadError {
    let step = what.into();
    move |source| WorkloadError { step, source }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn node_of(r: &Reply, what: &'static str) -> Result<u64, OpError> {
    match r {
        Reply::Entry { node, .. } => Ok(*node),
        _ => Err(OpError::Malformed {
            op: what,
            why: format!("unexpected reply {r:?}"),
        }),
    }
}

fn fh_of(r: &Reply, what: &'static str) -> Result<u64, OpError> {
    match r {
        Reply::Open { fh } => Ok(*fh),
        _ => Err(OpError::Malformed {
            op: what,
            why: format!("unexpected reply {r:?}"),
        }),
    }
}

pub fn walk48_path() -> Vec<String> {
    let mut v = vec![TOP.to_string(), "walk48".to_string()];
    v.extend((3..=48).map(|i| format!("d{i:02}")));
    v
}

pub fn walk5_path() -> Vec<String> {
    vec![
        TOP.into(),
        "walk5".into(),
        "d3".into(),
        "d4".into(),
        "d5".into(),
    ]
}

/// Looks up each component from the root; every returned node carries one lookup reference.
fn lookup_path(
    b: &mut dyn Backend,
    ctx: Ctx,
    path: &[String],
    held: &mut Vec<u64>,
) -> Result<u64, OpError> {
    let mut parent = b.root();
    for name in path {
        parent = node_of(
            &b.call(
                ctx,
                Op::Lookup {
                    parent,
                    name: name.clone(),
                },
            )?,
            "LOOKUP",
        )?;
        held.push(parent);
    }
    Ok(parent)
}

fn forget_all(b: &mut dyn Backend, held: &mut Vec<u64>) -> Result<(), OpError> {
    let v: Vec<(u64, u64)> = held.drain(..).map(|n| (n, 1)).collect();
    if v.is_empty() {
        return Ok(());
    }
    b.forget(&v)
}

fn ensure(
    b: &mut dyn Backend,
    ctx: Ctx,
    parent: u64,
    name: &str,
    dir: bool,
    held: &mut Vec<u64>,
) -> Result<(u64, bool), OpError> {
    match b.call(
        ctx,
        Op::Lookup {
            parent,
            name: name.into(),
        },
    ) {
        Ok(r) => {
            let n = node_of(&r, "LOOKUP")?;
            held.push(n);
            Ok((n, false))
        }
        Err(e) if e.errno() == Some(libc::ENOENT) => {
            let op = if dir {
                Op::Mkdir {
                    parent,
                    name: name.into(),
                    mode: 0o777,
                }
            } else {
                Op::Mknod {
                    parent,
                    name: name.into(),
                    mode: S_IFREG | 0o644,
                }
            };
            let n = node_of(&b.call(ctx, op)?, "MKDIR/MKNOD")?;
            held.push(n);
            Ok((n, true))
        }
        Err(e) => Err(e),
    }
}

fn ensure_size(b: &mut dyn Backend, ctx: Ctx, node: u64, size: u64) -> Result<(), OpError> {
    match b.call(ctx, Op::Getattr { node })? {
        Reply::Attr { size: s, .. } if s >= size => Ok(()),
        _ => b.call(ctx, Op::Truncate { node, size }).map(|_| ()),
    }
}

/// Creates (or finds) the tree the workloads need; idempotent across sessions.
/// Returns notes for the report. Everything looked up is forgotten again.
pub fn setup(b: &mut dyn Backend, p: &Params) -> Result<Vec<String>, WorkloadError> {
    let u = p.user;
    let mut held = Vec::new();
    let mut notes = Vec::new();
    let root = b.root();
    let (top, _) =
        ensure(b, Ctx::ROOT, root, TOP, true, &mut held).map_err(step(format!("setup: /{TOP}")))?;
    for path in [walk48_path(), walk5_path()] {
        let mut parent = top;
        for name in path.iter().skip(1) {
            parent = ensure(b, u, parent, name, true, &mut held)
                .map_err(step(format!("setup: dir {name}")))?
                .0;
        }
    }
    ensure(b, u, top, "file", false, &mut held).map_err(step("setup: file"))?;
    ensure(b, u, top, "cu", true, &mut held).map_err(step("setup: dir cu"))?;
    let (rw, _) = ensure(b, u, top, "rw", false, &mut held).map_err(step("setup: file rw"))?;
    ensure_size(b, u, rw, p.randwrite_file_mib << 20).map_err(step("setup: size of rw"))?;
    let (seq, _) = ensure(b, u, top, "seq", false, &mut held).map_err(step("setup: file seq"))?;
    ensure_size(b, u, seq, p.seq_mib << 20).map_err(step("setup: size of seq"))?;
    let (dir, _) = ensure(b, u, top, "dir5000", true, &mut held).map_err(step("setup: dir5000"))?;
    let marker = format!("dir5000.{}.done", p.dir_entries);
    let done = match b.call(
        u,
        Op::Lookup {
            parent: top,
            name: marker.clone(),
        },
    ) {
        Ok(r) => {
            held.push(node_of(&r, "LOOKUP").map_err(step("setup: marker"))?);
            true
        }
        Err(e) if e.errno() == Some(libc::ENOENT) => false,
        Err(e) => return Err(step("setup: marker")(e)),
    };
    if !done {
        let t = Instant::now();
        // References to `top` and `dir` stay in `held`; the entries are forgotten in batches.
        let mut entries = Vec::new();
        for i in 0..p.dir_entries {
            ensure(b, u, dir, &format!("f{i:05}"), false, &mut entries)
                .map_err(step(format!("setup: dir5000 entry {i}")))?;
            if entries.len() >= 1000 {
                forget_all(b, &mut entries).map_err(step("setup: forget"))?;
            }
        }
        forget_all(b, &mut entries).map_err(step("setup: forget"))?;
        ensure(b, u, top, &marker, false, &mut held).map_err(step("setup: marker"))?;
        notes.push(format!(
            "setup created {} directory entries in {:.1} s",
            p.dir_entries,
            t.elapsed().as_secs_f64()
        ));
    }
    forget_all(b, &mut held).map_err(step("setup: forget"))?;
    Ok(notes)
}

fn walk(b: &mut dyn Backend, p: &Params, path: &[String]) -> Result<Sample, WorkloadError> {
    let mut s = Sample::default();
    let mut held = Vec::with_capacity(path.len());
    let t0 = Instant::now();
    for _ in 0..p.walk_iters {
        let t = Instant::now();
        let r = lookup_path(b, p.user, path, &mut held)
            .and_then(|leaf| b.call(p.user, Op::Getattr { node: leaf }));
        let d = t.elapsed();
        match r {
            Ok(_) => {
                s.lat_ns.push(ns(d));
                s.ops += 1;
                s.requests += path.len() as u64 + 1;
            }
            Err(e @ OpError::Transport(_)) => return Err(step("walk")(e)),
            Err(e) => s.error(&e),
        }
        forget_all(b, &mut held).map_err(step("walk: forget"))?;
    }
    s.wall = t0.elapsed();
    Ok(s)
}

fn resolve(
    b: &mut dyn Backend,
    p: &Params,
    name: &str,
    held: &mut Vec<u64>,
) -> Result<u64, WorkloadError> {
    lookup_path(b, p.user, &[TOP.into(), name.into()], held)
        .map_err(step(format!("looking up /{TOP}/{name} (run setup first)")))
}

fn open_close(b: &mut dyn Backend, p: &Params) -> Result<Sample, WorkloadError> {
    let mut held = Vec::new();
    let node = resolve(b, p, "file", &mut held)?;
    let mut s = Sample::default();
    let t0 = Instant::now();
    for _ in 0..p.open_close_iters {
        let t = Instant::now();
        let r = b
            .call(
                p.user,
                Op::Open {
                    node,
                    flags: libc::O_RDONLY as u32,
                },
            )
            .and_then(|r| fh_of(&r, "OPEN"))
            .and_then(|fh| b.call(p.user, Op::Release { node, fh }));
        let d = t.elapsed();
        match r {
            Ok(_) => {
                s.lat_ns.push(ns(d));
                s.ops += 1;
                s.requests += 2;
            }
            Err(e @ OpError::Transport(_)) => return Err(step("open-close")(e)),
            Err(e) => s.error(&e),
        }
    }
    s.wall = t0.elapsed();
    forget_all(b, &mut held).map_err(step("open-close: forget"))?;
    Ok(s)
}

fn create_unlink(b: &mut dyn Backend, p: &Params) -> Result<Sample, WorkloadError> {
    let mut held = Vec::new();
    let dir = resolve(b, p, "cu", &mut held)?;
    let mut created_refs = Vec::new();
    let mut s = Sample::default();
    let tag = format!("{}-{}", std::process::id(), p.seed);
    let t0 = Instant::now();
    for i in 0..p.create_unlink_iters {
        let name = format!("c{tag}-{i}");
        let t = Instant::now();
        let mut created = None;
        let r = b
            .call(
                p.user,
                Op::Create {
                    parent: dir,
                    name: name.clone(),
                    mode: S_IFREG | 0o644,
                    flags: (libc::O_CREAT | libc::O_EXCL | libc::O_RDWR) as u32,
                },
            )
            .and_then(|r| match r {
                Reply::Created { node, fh } => Ok((node, fh)),
                r => Err(OpError::Malformed {
                    op: "CREATE",
                    why: format!("unexpected reply {r:?}"),
                }),
            })
            .and_then(|(node, fh)| {
                created = Some(node);
                b.call(p.user, Op::Release { node, fh })
            })
            .and_then(|_| b.call(p.user, Op::Unlink { parent: dir, name }));
        let d = t.elapsed();
        if let Some(n) = created {
            created_refs.push(n);
        }
        match r {
            Ok(_) => {
                s.lat_ns.push(ns(d));
                s.ops += 1;
                s.requests += 3;
            }
            Err(e @ OpError::Transport(_)) => return Err(step("create-unlink")(e)),
            Err(e) => s.error(&e),
        }
        if created_refs.len() >= 256 {
            forget_all(b, &mut created_refs).map_err(step("create-unlink: forget"))?;
        }
    }
    s.wall = t0.elapsed();
    forget_all(b, &mut created_refs).map_err(step("create-unlink: forget"))?;
    forget_all(b, &mut held).map_err(step("create-unlink: forget"))?;
    Ok(s)
}

fn readdir(b: &mut dyn Backend, p: &Params) -> Result<Sample, WorkloadError> {
    let mut held = Vec::new();
    let dir = resolve(b, p, "dir5000", &mut held)?;
    let mut s = Sample::default();
    let mut entries_ref = Vec::new();
    let t0 = Instant::now();
    for _ in 0..p.readdir_iters {
        let t = Instant::now();
        let mut count = 0usize;
        let mut reqs = 2u64;
        let r: Result<(), OpError> = (|| {
            let fh = fh_of(&b.call(p.user, Op::Opendir { node: dir })?, "OPENDIR")?;
            let mut offset = 0;
            loop {
                reqs += 1;
                let Reply::Dir(v) = b.call(
                    p.user,
                    Op::Readdirplus {
                        node: dir,
                        fh,
                        offset,
                        size: p.readdir_size,
                    },
                )?
                else {
                    return Err(OpError::Malformed {
                        op: "READDIRPLUS",
                        why: "not a directory listing".into(),
                    });
                };
                let Some(last) = v.last() else { break };
                offset = last.offset;
                for e in &v {
                    if e.name != "." && e.name != ".." {
                        count += 1;
                        if e.node != 0 {
                            entries_ref.push(e.node);
                        }
                    }
                }
            }
            b.call(p.user, Op::Releasedir { node: dir, fh }).map(|_| ())
        })();
        let d = t.elapsed();
        match r {
            Ok(()) => {
                s.lat_ns.push(ns(d));
                s.ops += 1;
                s.requests += reqs;
                if count != p.dir_entries {
                    s.notes.push(format!(
                        "listing returned {count} entries, expected {}",
                        p.dir_entries
                    ));
                }
            }
            Err(e @ OpError::Transport(_)) => return Err(step("readdir")(e)),
            Err(e) => s.error(&e),
        }
        forget_all(b, &mut entries_ref).map_err(step("readdir: forget"))?;
    }
    s.wall = t0.elapsed();
    s.notes.dedup();
    forget_all(b, &mut held).map_err(step("readdir: forget"))?;
    Ok(s)
}

/// splitmix64: a small deterministic generator for offsets.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn with_open<T>(
    b: &mut dyn Backend,
    p: &Params,
    name: &str,
    flags: i32,
    f: impl FnOnce(&mut dyn Backend, u64, u64) -> Result<T, WorkloadError>,
) -> Result<T, WorkloadError> {
    let mut held = Vec::new();
    let node = resolve(b, p, name, &mut held)?;
    let fh = b
        .call(
            p.user,
            Op::Open {
                node,
                flags: flags as u32,
            },
        )
        .and_then(|r| fh_of(&r, "OPEN"))
        .map_err(step(format!("opening {name}")))?;
    let r = f(b, node, fh);
    b.call(p.user, Op::Release { node, fh })
        .map_err(step(format!("closing {name}")))?;
    forget_all(b, &mut held).map_err(step("forget"))?;
    r
}

/// 4 KiB buffered reads of the seq file's first `stride_mib`, one in flight (as `tac` or a
/// reverse-stride scan issues them), backwards or forwards: what the client's readahead makes
/// of a backward scan, against the forward one. The file is seqwrite1m's; run that first (its
/// last 200 MiB may still be in the target's cache, its first ones are not).
fn stride_read(
    b: &mut dyn Backend,
    p: &Params,
    reverse: bool,
    probe: Probe,
) -> Result<Sample, WorkloadError> {
    let blocks = (p.stride_mib << 20) / 4096;
    let user = p.user;
    let name = if reverse { "revread4k" } else { "fwdread4k" };
    with_open(b, p, "seq", libc::O_RDONLY, |b, node, fh| {
        let make = move |i: usize| {
            let k = (i as u64).min(blocks.saturating_sub(1));
            let block = if reverse { blocks - 1 - k } else { k };
            Op::Read {
                node,
                fh,
                offset: block * 4096,
                len: 4096,
            }
        };
        let before = probe();
        let count = usize::try_from(blocks).unwrap_or(usize::MAX);
        let batch = b.pipeline(user, 1, count, &make).map_err(step(name))?;
        let mut s = Sample::from_batch(batch, 1);
        s.mds_requests = delta(before, probe());
        Ok(s)
    })
}

fn randwrite(b: &mut dyn Backend, p: &Params, probe: Probe) -> Result<Sample, WorkloadError> {
    let blocks = (p.randwrite_file_mib << 20) / 4096;
    let seed = p.seed;
    let (ops, depth, user) = (p.randwrite_ops, p.randwrite_depth, p.user);
    // O_DIRECT, as `fio --direct=1` in a guest: every write goes to the OSDs before it is
    // answered (the guest's open flags reach the daemon, and the floor opens the same way).
    with_open(b, p, "rw", libc::O_RDWR | libc::O_DIRECT, |b, node, fh| {
        let make = move |i: usize| Op::Write {
            node,
            fh,
            offset: (mix(seed ^ i as u64) % blocks.max(1)) * 4096,
            len: 4096,
            kill_suidgid: true,
        };
        let before = probe();
        let mut s = b
            .pipeline(user, depth, ops, &make)
            .map(|x| Sample::from_batch(x, 1))
            .map_err(step("randwrite4k"))?;
        s.mds_requests = delta(before, probe());
        Ok(s)
    })
}

/// randwrite4k's reads: O_DIRECT, so each goes to the OSDs (the file was sized at setup;
/// where randwrite4k has not written it reads zeros, which cost the OSDs the same).
fn randread(b: &mut dyn Backend, p: &Params, probe: Probe) -> Result<Sample, WorkloadError> {
    let blocks = (p.randwrite_file_mib << 20) / 4096;
    let seed = p.seed;
    let (ops, depth, user) = (p.randwrite_ops, p.randwrite_depth, p.user);
    with_open(
        b,
        p,
        "rw",
        libc::O_RDONLY | libc::O_DIRECT,
        |b, node, fh| {
            let make = move |i: usize| Op::Read {
                node,
                fh,
                offset: (mix(seed ^ i as u64) % blocks.max(1)) * 4096,
                len: 4096,
            };
            let before = probe();
            let mut s = b
                .pipeline(user, depth, ops, &make)
                .map(|x| Sample::from_batch(x, 1))
                .map_err(step("randread4k"))?;
            s.mds_requests = delta(before, probe());
            Ok(s)
        },
    )
}

fn seq(
    b: &mut dyn Backend,
    p: &Params,
    write: bool,
    probe: Probe,
) -> Result<Sample, WorkloadError> {
    let mut notes = Vec::new();
    let io = b.max_io().min(1 << 20);
    if io < 1 << 20 {
        notes.push(format!(
            "daemon negotiated max_write/max_pages below 1 MiB: requests are {} KiB",
            io / 1024
        ));
    }
    let io = io.max(4096);
    let count = usize::try_from((p.seq_mib << 20) / u64::from(io)).unwrap_or(usize::MAX);
    let (depth, user) = (p.seq_depth, p.user);
    // Reads are O_DIRECT: from the OSDs, not from whatever of the file the client's cache
    // still holds after the write pass (that made the floor's figure swing between 0.45 and
    // 15 GiB/s from round to round). Writes go through the client's cache, as a guest's do.
    let flags = if write {
        libc::O_RDWR
    } else {
        libc::O_RDONLY | libc::O_DIRECT
    };
    let mut s = with_open(b, p, "seq", flags, |b, node, fh| {
        let make = move |i: usize| {
            let offset = i as u64 * u64::from(io);
            if write {
                Op::Write {
                    node,
                    fh,
                    offset,
                    len: io,
                    kill_suidgid: true,
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
        let before = probe();
        let mut batch = b
            .pipeline(user, depth, count, &make)
            .map_err(step(if write { "seqwrite1m" } else { "seqread1m" }))?;
        if write {
            // The pass ends with an FSYNC, timed with it (fio's end_fsync=1): the throughput
            // is that of data on the OSDs, and no variant leaves its dirty data to be flushed
            // while the next one is measured.
            let t = Instant::now();
            b.call(user, Op::Fsync { node, fh })
                .map_err(step("seqwrite1m: fsync"))?;
            batch.wall += t.elapsed();
        }
        let mut s = Sample::from_batch(batch, 1);
        s.mds_requests = delta(before, probe());
        Ok(s)
    })?;
    s.notes.extend(notes);
    Ok(s)
}

fn stat_storm(
    b: &mut dyn Backend,
    p: &Params,
    streams: usize,
    probe: Probe,
) -> Result<Sample, WorkloadError> {
    // Cached node ids: the walk5 chain and the files, looked up once and held.
    let mut held = Vec::new();
    lookup_path(b, p.user, &walk5_path(), &mut held).map_err(step("stat-storm: lookup"))?;
    for n in ["file", "rw", "seq", "cu", "dir5000"] {
        resolve(b, p, n, &mut held)?;
    }
    let nodes: Vec<u64> = held.iter().copied().take(p.stat_nodes.max(1)).collect();
    let make = |i: usize| Op::Getattr {
        node: nodes.get(i % nodes.len()).copied().unwrap_or(1),
    };
    let before = probe();
    let r = b
        .pipeline(p.user, streams, p.stat_ops, &make)
        .map(|x| Sample::from_batch(x, 1))
        .map(|mut s| {
            s.mds_requests = delta(before, probe());
            s
        })
        .map_err(step("stat-storm"));
    forget_all(b, &mut held).map_err(step("stat-storm: forget"))?;
    r
}

/// Runs one workload. `probe` reads the target's MDS request counter: the pipelined
/// workloads (randwrite4k, seq*, stat-storm-N) count only their timed part; the others count
/// the whole workload (their untimed part is 2 LOOKUPs and FORGETs).
pub fn run(
    b: &mut dyn Backend,
    w: Workload,
    p: &Params,
    probe: Probe,
) -> Result<Sample, WorkloadError> {
    let before = probe();
    let mut s = match w {
        Workload::Walk48 => walk(b, p, &walk48_path()),
        Workload::Walk5 => walk(b, p, &walk5_path()),
        Workload::OpenClose => open_close(b, p),
        Workload::CreateUnlink => create_unlink(b, p),
        Workload::Readdir5000 => readdir(b, p),
        Workload::Randwrite4k => return randwrite(b, p, probe),
        Workload::Randread4k => return randread(b, p, probe),
        Workload::Seqwrite1m => return seq(b, p, true, probe),
        Workload::Seqread1m => return seq(b, p, false, probe),
        Workload::Revread4k => return stride_read(b, p, true, probe),
        Workload::Fwdread4k => return stride_read(b, p, false, probe),
        Workload::StatStorm(n) => return stat_storm(b, p, n, probe),
    }?;
    s.mds_requests = delta(before, probe());
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_paths_have_the_promised_depth() {
        assert_eq!(walk48_path().len(), 48);
        assert_eq!(walk5_path().len(), 5);
    }

    #[test]
    fn workload_names_roundtrip() {
        for w in Workload::all() {
            assert_eq!(Workload::parse(&w.name()), Some(vec![w]));
        }
        assert_eq!(Workload::parse("stat-storm").map(|v| v.len()), Some(3));
        assert_eq!(Workload::parse("nope"), None);
        assert_eq!(Workload::parse("stat-storm-0"), None);
    }
}
