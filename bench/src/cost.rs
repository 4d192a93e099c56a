//! `ceph-virtiofsd-bench cost`: what the daemon spends on its own code per cached request,
//! counted in instructions under callgrind, so that the figure repeats from run to run on a
//! shared machine (a timing never does) and a change to the request path shows up at once.
//!
//! The daemon runs under `valgrind --tool=callgrind` with collection switched on only inside
//! the functions that serve a request: the queue thread's `handle_event` (pop, header read,
//! dispatch, requests served inline, the used ring and the guest's notification) and a pool
//! worker's `run_job` (a request handed to a worker: WRITE). Its polling is off
//! (`--poll-us 0`): a spin's length depends on the clock. This process plays the guest, one
//! request at a time, and for each kind of request: sets up what it needs, sends `--warmup`
//! requests, zeroes the counters (`callgrind_control -z`), sends `--requests` more, and dumps
//! the counters (`callgrind_control --dump`). Each dump is then read: the instructions of the
//! whole request path, and of them those spent inside libcephfs (every call from the daemon
//! into a `ceph_*` function of the C API, with everything below it). The daemon's own cost is
//! the difference: vhost-user, FUSE decoding, the filesystem layer, allocations, logging.
//!
//! `--baseline FILE` compares each kind's own cost with the committed figure and fails (exit 1)
//! when one grew by more than `--tolerance` percent; `--write-baseline FILE` records this run's
//! figures as the new baseline (a commit of its own, that says why).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;

use crate::backend::{Backend, Ctx, Op, OpError, Reply};
use crate::floor::{FloorBackend, FloorError, FloorSpec};
use crate::session::{FuseSession, SessionOpts, SetupError};

const O_RDONLY: u32 = 0;
const O_RDWR: u32 = 2;
const S_IFREG: u32 = 0o100_000;

#[derive(Debug, Parser)]
#[command(
    name = "ceph-virtiofsd-bench cost",
    about = "Instructions the daemon spends per cached request, counted under callgrind"
)]
struct Cli {
    /// The daemon binary to measure.
    #[arg(long)]
    daemon: PathBuf,
    /// ceph.conf of the cluster.
    #[arg(long)]
    ceph_conf: PathBuf,
    /// cephx id the daemon connects as.
    #[arg(long, default_value = "admin")]
    client_id: String,
    /// CephFS directory under which the run makes a fresh directory (through libcephfs, as
    /// `--client-id`) for the daemon to export.
    #[arg(long, default_value = "/")]
    ceph_root: String,
    /// Requests counted per kind.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Requests of each kind sent before counting starts (caches, allocator, worker threads).
    #[arg(long, default_value_t = 300)]
    warmup: usize,
    /// Microseconds to wait after each answer before the next request. The daemon then has
    /// gone back to sleep on its kick: every request takes the same path (a kick, a wake-up,
    /// one request, notifications on again), whatever the daemon's speed under valgrind.
    /// Without the gap, how many requests one wake-up drains depends on timing, and so do the
    /// counts (by 10 % seen).
    #[arg(long, default_value_t = 1000)]
    gap_us: u64,
    /// Where the callgrind output, the socket and the daemon's log go (made if missing).
    #[arg(long)]
    work_dir: PathBuf,
    /// Compare with this baseline and fail when a kind's own cost grew past the tolerance.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Most growth over the baseline, in percent, before the run fails.
    #[arg(long, default_value_t = 10.0)]
    tolerance: f64,
    /// Write this run's figures as a baseline file.
    #[arg(long)]
    write_baseline: Option<PathBuf>,
    /// Kinds to measure, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    kinds: Vec<String>,
    /// Another argument for the daemon (repeatable), e.g. `--daemon-arg=--quarantine=off`.
    #[arg(long = "daemon-arg", allow_hyphen_values = true)]
    daemon_args: Vec<String>,
    /// valgrind binary.
    #[arg(long, default_value = "valgrind")]
    valgrind: PathBuf,
}

/// The kinds of request measured, each a cached operation a guest repeats all the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Getattr,
    Lookup,
    OpenRelease,
    Write4k,
    Readdirplus,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::Getattr,
        Kind::Lookup,
        Kind::OpenRelease,
        Kind::Write4k,
        Kind::Readdirplus,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Getattr => "getattr",
            Kind::Lookup => "lookup",
            Kind::OpenRelease => "open-release",
            Kind::Write4k => "write4k",
            Kind::Readdirplus => "readdirplus",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Kind::Getattr => "GETATTR of a cached file",
            Kind::Lookup => "LOOKUP of a cached name",
            Kind::OpenRelease => "OPEN O_RDONLY + RELEASE (one pair)",
            Kind::Write4k => "buffered 4 KiB WRITE at offset 0",
            Kind::Readdirplus => "READDIRPLUS of one 4 KiB page (a cached directory)",
        }
    }

    fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// Instructions counted in one dump.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counted {
    total: u64,
    libcephfs: u64,
}

#[derive(Debug, thiserror::Error)]
enum CostError {
    #[error("Unknown kind {0:?} (known: getattr, lookup, open-release, write4k, readdirplus)")]
    UnknownKind(String),
    #[error("Making the run's directory under {0} through libcephfs failed")]
    Floor(String, #[source] FloorError),
    #[error("Making the run's directory {0} failed")]
    Mkdir(String, #[source] OpError),
    #[error("Starting the daemon under valgrind ({0}) failed: is valgrind installed?")]
    Launch(String, #[source] std::io::Error),
    #[error("The daemon did not create its socket {0} within 120 s; its log: {1}")]
    NoSocket(String, String),
    #[error("Bringing up the device failed")]
    Setup(#[source] SetupError),
    #[error("{0} failed")]
    Op(&'static str, #[source] OpError),
    #[error("{0} answered something unexpected: {1:?}")]
    Reply(&'static str, Reply),
    #[error("callgrind_control {0} failed: {1}")]
    Control(String, String),
    #[error("Reading callgrind output {0} failed")]
    Read(String, #[source] std::io::Error),
    #[error("No callgrind dump for {0} in {1}")]
    NoDump(&'static str, String),
    #[error("The baseline {0} cannot be read: {1}")]
    Baseline(String, String),
    #[error("Writing {0} failed")]
    Write(String, #[source] std::io::Error),
}

pub fn main(args: impl Iterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = Cli::parse_from(args);
    match run(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            crate::print_chain(&e);
            ExitCode::from(2)
        }
    }
}

/// The daemon under callgrind; killed if still running when dropped.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// A new directory (mode 0777) under `--ceph-root` for this run; its CephFS path.
fn fresh_root(cli: &Cli) -> Result<String, CostError> {
    let spec = FloorSpec {
        conf: cli.ceph_conf.clone(),
        root: cli.ceph_root.clone(),
        client_id: cli.client_id.clone(),
        admin_socket: None,
    };
    let mut floor = FloorBackend::connect(&spec, 4096)
        .map_err(|e| CostError::Floor(cli.ceph_root.clone(), e))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!("cost-{}-{stamp}", std::process::id());
    let root = floor.root();
    floor
        .call(
            Ctx::ROOT,
            Op::Mkdir {
                parent: root,
                name: name.clone(),
                mode: 0o777,
            },
        )
        .map_err(|e| CostError::Mkdir(name.clone(), e))?;
    Ok(format!("{}/{name}", cli.ceph_root.trim_end_matches('/')))
}

impl Daemon {
    fn start(cli: &Cli, root: &str, socket: &Path, out: &Path) -> Result<Daemon, CostError> {
        let log = cli.work_dir.join("daemon.log");
        let log_file = std::fs::File::create(&log)
            .map_err(|e| CostError::Launch(log.display().to_string(), e))?;
        let mut cmd = Command::new(&cli.valgrind);
        cmd.arg("--tool=callgrind")
            .arg("--collect-atstart=no")
            // The request path, and nothing the clock decides (polls, idle waits, ticks).
            // Both spellings of the trait method: `<VhostUserFsBackend<F> as VhostUserBackend>::`
            // and `<impl VhostUserBackend for VhostUserFsBackend<F>>::` (an impl in a module
            // of its own). A rename that matches neither counts nothing: `run` refuses that.
            .arg("--toggle-collect=*VhostUserFsBackend*::handle_event")
            .arg("--toggle-collect=ceph_virtiofsd::vhost_user::pool::run_job")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(&cli.daemon)
            .arg("--socket-path")
            .arg(socket)
            .arg("--ceph-conf")
            .arg(&cli.ceph_conf)
            .arg("--client-id")
            .arg(&cli.client_id)
            .arg("--ceph-root")
            .arg(root)
            .args(["--poll-us", "0", "--seccomp", "none", "--log-level", "warn"])
            .args(&cli.daemon_args)
            .stdin(Stdio::null())
            .stdout(
                log_file
                    .try_clone()
                    .map_err(|e| CostError::Launch("log".into(), e))?,
            )
            .stderr(log_file);
        let child = cmd
            .spawn()
            .map_err(|e| CostError::Launch(cli.valgrind.display().to_string(), e))?;
        let mut d = Daemon { child, log };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !socket.exists() {
            if Instant::now() > deadline || matches!(d.child.try_wait(), Ok(Some(_))) {
                return Err(CostError::NoSocket(
                    socket.display().to_string(),
                    d.log.display().to_string(),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(d)
    }

    fn control(&self, what: &str) -> Result<(), CostError> {
        let out = Command::new("callgrind_control")
            .arg(what)
            .arg(self.child.id().to_string())
            .output()
            .map_err(|e| CostError::Control(what.to_owned(), e.to_string()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !text.contains("OK") {
            return Err(CostError::Control(
                what.to_owned(),
                format!("{}{}", text, String::from_utf8_lossy(&out.stderr)),
            ));
        }
        Ok(())
    }

    /// Wait for the daemon to exit by itself (it does when its frontend goes away).
    fn wait_exit(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn call(b: &mut dyn Backend, ctx: Ctx, what: &'static str, op: Op) -> Result<Reply, CostError> {
    b.call(ctx, op).map_err(|e| CostError::Op(what, e))
}

/// What the requests of the run use: a file, a directory of files, handles on them.
struct Fixture {
    file: u64,
    dir: u64,
    write_fh: u64,
    dir_fh: u64,
}

fn fixture(b: &mut dyn Backend, ctx: Ctx) -> Result<Fixture, CostError> {
    let root = b.root();
    let (file, write_fh) = match call(
        b,
        ctx,
        "CREATE f",
        Op::Create {
            parent: root,
            name: "f".into(),
            mode: S_IFREG | 0o644,
            flags: O_RDWR,
        },
    )? {
        Reply::Created { node, fh } => (node, fh),
        r => return Err(CostError::Reply("CREATE f", r)),
    };
    let dir = match call(
        b,
        ctx,
        "MKDIR d",
        Op::Mkdir {
            parent: root,
            name: "d".into(),
            mode: 0o755,
        },
    )? {
        Reply::Entry { node, .. } => node,
        r => return Err(CostError::Reply("MKDIR d", r)),
    };
    // More entries than one 4 KiB page of READDIRPLUS holds (about 25).
    for i in 0..64 {
        let name = format!("entry-{i:03}");
        match call(
            b,
            ctx,
            "MKNOD d/entry",
            Op::Mknod {
                parent: dir,
                name,
                mode: S_IFREG | 0o644,
            },
        )? {
            Reply::Entry { node, .. } => b
                .forget(&[(node, 1)])
                .map_err(|e| CostError::Op("FORGET", e))?,
            r => return Err(CostError::Reply("MKNOD d/entry", r)),
        }
    }
    let dir_fh = match call(b, ctx, "OPENDIR d", Op::Opendir { node: dir })? {
        Reply::Open { fh } => fh,
        r => return Err(CostError::Reply("OPENDIR d", r)),
    };
    Ok(Fixture {
        file,
        dir,
        write_fh,
        dir_fh,
    })
}

/// One request (or pair) of `kind`; the lookup references READDIRPLUS and LOOKUP hand out are
/// kept (the guest's dentry cache would keep them too).
fn one(b: &mut dyn Backend, ctx: Ctx, f: &Fixture, kind: Kind) -> Result<(), CostError> {
    let root = b.root();
    match kind {
        Kind::Getattr => {
            call(b, ctx, "GETATTR", Op::Getattr { node: f.file })?;
        }
        Kind::Lookup => {
            call(
                b,
                ctx,
                "LOOKUP",
                Op::Lookup {
                    parent: root,
                    name: "f".into(),
                },
            )?;
        }
        Kind::OpenRelease => {
            let fh = match call(
                b,
                ctx,
                "OPEN",
                Op::Open {
                    node: f.file,
                    flags: O_RDONLY,
                },
            )? {
                Reply::Open { fh } => fh,
                r => return Err(CostError::Reply("OPEN", r)),
            };
            call(b, ctx, "RELEASE", Op::Release { node: f.file, fh })?;
        }
        Kind::Write4k => {
            call(
                b,
                ctx,
                "WRITE",
                Op::Write {
                    node: f.file,
                    fh: f.write_fh,
                    offset: 0,
                    len: 4096,
                    kill_suidgid: false,
                },
            )?;
        }
        Kind::Readdirplus => match call(
            b,
            ctx,
            "READDIRPLUS",
            Op::Readdirplus {
                node: f.dir,
                fh: f.dir_fh,
                offset: 0,
                size: 4096,
            },
        )? {
            Reply::Dir(e) if !e.is_empty() => {}
            r => return Err(CostError::Reply("READDIRPLUS", r)),
        },
    }
    Ok(())
}

fn run(cli: &Cli) -> Result<bool, CostError> {
    let kinds: Vec<Kind> = if cli.kinds.is_empty() {
        Kind::ALL.to_vec()
    } else {
        cli.kinds
            .iter()
            .map(|k| Kind::parse(k).ok_or_else(|| CostError::UnknownKind(k.clone())))
            .collect::<Result<_, _>>()?
    };
    std::fs::create_dir_all(&cli.work_dir)
        .map_err(|e| CostError::Write(cli.work_dir.display().to_string(), e))?;
    let socket = cli.work_dir.join("cost.sock");
    let out = cli.work_dir.join("callgrind.out");
    let _ = std::fs::remove_file(&socket);
    clear_dumps(&cli.work_dir);
    let root = fresh_root(cli)?;
    let mut daemon = Daemon::start(cli, &root, &socket, &out)?;
    let opts = SessionOpts {
        request_queues: 1,
        queue_size: 128,
        slots_per_queue: 4,
        max_io: 1 << 20,
        timeout: Duration::from_secs(300),
        event_idx: true,
        halt_poll: Duration::ZERO,
        reconnect: None,
    };
    let mut session = FuseSession::connect(&socket, &opts).map_err(CostError::Setup)?;
    // An unprivileged guest user, as most guest requests come from.
    let ctx = Ctx {
        uid: 1000,
        gid: 1000,
    };
    let fix = fixture(&mut session, ctx)?;
    for (i, kind) in kinds.iter().enumerate() {
        let gap = Duration::from_micros(cli.gap_us);
        for _ in 0..cli.warmup {
            one(&mut session, ctx, &fix, *kind)?;
            std::thread::sleep(gap);
        }
        // The last reply may reach us before the daemon has left handle_event.
        std::thread::sleep(Duration::from_millis(200));
        daemon.control("-z")?;
        for _ in 0..cli.requests {
            one(&mut session, ctx, &fix, *kind)?;
            std::thread::sleep(gap);
        }
        std::thread::sleep(Duration::from_millis(200));
        daemon.control(&format!("--dump={}", kind.name()))?;
        eprintln!("cost: {} ({}/{}) counted", kind.name(), i + 1, kinds.len());
    }
    session.close();
    daemon.wait_exit(Duration::from_secs(60));
    drop(daemon);

    let mut figures = BTreeMap::new();
    let requests = u64::try_from(cli.requests.max(1)).unwrap_or(1);
    for kind in &kinds {
        let path = find_dump(&cli.work_dir, kind.name())?;
        let c = read_dump(&path)?;
        figures.insert(*kind, (c.total / requests, c.libcephfs / requests));
    }
    let baseline = match &cli.baseline {
        Some(p) => Some(read_baseline(p)?),
        None => None,
    };
    let mut ok = true;
    let mut table = String::new();
    let _ = writeln!(
        table,
        "| request | instructions | in libcephfs | daemon's own | baseline own | change |"
    );
    let _ = writeln!(table, "|---|---:|---:|---:|---:|---:|");
    let mut blind = Vec::new();
    for (kind, (total, ceph)) in &figures {
        let own = total.saturating_sub(*ceph);
        if own < NOTHING_COUNTED {
            ok = false;
            blind.push(kind.name());
        }
        let (base, change) = match baseline.as_ref().and_then(|b| b.get(kind.name())) {
            Some(&b) => {
                let pct = (own as f64 - b as f64) * 100.0 / (b.max(1) as f64);
                // A fall by half is as suspect as a rise: a collect toggle that stopped
                // matching, or a gain the baseline must record in a commit of its own.
                if pct > cli.tolerance || pct < -50.0 {
                    ok = false;
                }
                (b.to_string(), format!("{pct:+.1} %"))
            }
            None => ("–".to_owned(), "–".to_owned()),
        };
        let _ = writeln!(
            table,
            "| {} | {total} | {ceph} | {own} | {base} | {change} |",
            kind.what()
        );
    }
    println!("{table}");
    println!(
        "# instructions per request, {} counted after {} warm-up requests; daemon {}",
        cli.requests,
        cli.warmup,
        cli.daemon.display()
    );
    if let Some(path) = &cli.write_baseline {
        let mut text = String::from(
            "# Instructions the daemon's own code spends per cached request (ceph-virtiofsd-bench cost).\n\
             # Raising a figure is a commit of its own that says why.\n",
        );
        for (kind, (total, ceph)) in &figures {
            let _ = writeln!(text, "{} = {}", kind.name(), total.saturating_sub(*ceph));
        }
        std::fs::write(path, text).map_err(|e| CostError::Write(path.display().to_string(), e))?;
    }
    if !blind.is_empty() {
        println!(
            "FAIL: almost nothing was counted for {}: the --toggle-collect patterns in \
             bench/src/cost.rs no longer match the daemon's request functions (renamed or \
             moved?); check the names with `nm -C` on the daemon",
            blind.join(", ")
        );
    }
    if let (Some(b), false) = (&cli.baseline, ok) {
        println!(
            "FAIL: the daemon's own cost moved by more than +{} % or -50 % against {} on a \
             kind above (a fall by half is a toggle that stopped matching, or a gain to \
             record in the baseline with a commit that says why)",
            cli.tolerance,
            b.display()
        );
    }
    Ok(ok)
}

/// Fewer instructions than any request can cost: the collect toggles matched nothing.
const NOTHING_COUNTED: u64 = 1_000;

fn clear_dumps(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("callgrind.out") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// The dump whose trigger names `hint` (`callgrind_control --dump=hint`).
fn find_dump(dir: &Path, hint: &'static str) -> Result<PathBuf, CostError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| CostError::Read(dir.display().to_string(), e))?;
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with("callgrind.out") {
            continue;
        }
        let f = std::fs::File::open(e.path())
            .map_err(|err| CostError::Read(e.path().display().to_string(), err))?;
        for line in std::io::BufReader::new(f)
            .lines()
            .take(30)
            .map_while(Result::ok)
        {
            if line.starts_with("desc: Trigger:") && line.ends_with(&format!("'{hint}'")) {
                return Ok(e.path());
            }
            if line.starts_with("desc: Trigger:") && line.contains(hint) {
                return Ok(e.path());
            }
        }
    }
    Err(CostError::NoDump(hint, dir.display().to_string()))
}

fn read_dump(path: &Path) -> Result<Counted, CostError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CostError::Read(path.display().to_string(), e))?;
    Ok(parse_dump(&text))
}

/// A function of libcephfs's C API, called from the daemon: a plain C name (`ceph_ll_getattr`),
/// not a Rust path (`ceph_client::…`).
fn is_ceph_api(name: &str) -> bool {
    name.starts_with("ceph_") && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// `fn=(id) name` names a function (or `ob=` an object) the first time, `fn=(id)` later
/// (callgrind's name compression; `cfn` shares `fn`'s ids, `cob` shares `ob`'s).
fn resolve(names: &mut HashMap<String, String>, spec: &str) -> String {
    let spec = spec.trim();
    if let Some(rest) = spec.strip_prefix('(') {
        if let Some((id, name)) = rest.split_once(')') {
            let name = name.trim();
            if name.is_empty() {
                return names.get(id).cloned().unwrap_or_default();
            }
            names.insert(id.to_owned(), name.to_owned());
            return name.to_owned();
        }
    }
    spec.to_owned()
}

/// An object of the Ceph client libraries (libcephfs and what it links of Ceph's).
fn is_ceph_object(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.starts_with("libceph") || file.starts_with("librados")
}

/// Totals of a callgrind dump (event Ir): everything, and what the daemon's calls into
/// libcephfs's C API cost inclusively (callgrind's format: a `calls=` line is followed by the
/// call's position and inclusive cost). Calls made inside the Ceph libraries are part of those.
fn parse_dump(text: &str) -> Counted {
    let mut fns: HashMap<String, String> = HashMap::new();
    let mut objs: HashMap<String, String> = HashMap::new();
    let mut counted = Counted::default();
    let mut callee_is_ceph = false;
    let mut caller_in_ceph = false;
    let mut object = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some(v) = line
            .strip_prefix("summary:")
            .or_else(|| line.strip_prefix("totals:"))
        {
            if let Some(n) = v.split_whitespace().next().and_then(|n| n.parse().ok()) {
                counted.total = counted.total.max(n);
            }
        } else if let Some(spec) = line.strip_prefix("ob=") {
            object = resolve(&mut objs, spec);
        } else if let Some(spec) = line.strip_prefix("cob=") {
            resolve(&mut objs, spec);
        } else if let Some(spec) = line.strip_prefix("fn=") {
            let name = resolve(&mut fns, spec);
            caller_in_ceph = is_ceph_object(&object) || is_ceph_api(&name);
        } else if let Some(spec) = line.strip_prefix("cfn=") {
            callee_is_ceph = is_ceph_api(&resolve(&mut fns, spec));
        } else if line.starts_with("calls=") {
            // The next line: position and inclusive cost of the call.
            let cost = lines
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|c| c.parse::<u64>().ok())
                .unwrap_or(0);
            if callee_is_ceph && !caller_in_ceph {
                counted.libcephfs += cost;
            }
        }
    }
    counted
}

/// `kind = instructions` lines; `#` starts a comment.
fn read_baseline(path: &Path) -> Result<BTreeMap<String, u64>, CostError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CostError::Baseline(path.display().to_string(), e.to_string()))?;
    parse_baseline(&text).map_err(|e| CostError::Baseline(path.display().to_string(), e))
}

fn parse_baseline(text: &str) -> Result<BTreeMap<String, u64>, String> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("line {}: expected `kind = instructions`", i + 1))?;
        let k = k.trim();
        if Kind::parse(k).is_none() {
            return Err(format!("line {}: unknown kind {k:?}", i + 1));
        }
        let v = v
            .trim()
            .parse()
            .map_err(|_| format!("line {}: {:?} is not a count", i + 1, v.trim()))?;
        out.insert(k.to_owned(), v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_into_the_c_api_count_as_libcephfs_once() {
        let dump = "\
events: Ir
ob=(1) /usr/libexec/ceph-virtiofsd
fl=(1) src/fs/attr.rs
fn=(1) ceph_client::ops::getattr
10 100
cob=(2) /usr/lib/libcephfs.so.2
cfi=(2) ???
cfn=(2) ceph_ll_getattr
calls=1 0x1234
12 5000
ob=(2)
fn=(2)
0x1234 4000
cfn=(4) ceph_ll_lookup
calls=1 0x5
0 1000
ob=(1)
fn=(1)
13 7
cfn=(2)
calls=2 0x1234
14 9000
summary: 19107
";
        let c = parse_dump(dump);
        assert_eq!(c.total, 19107);
        // Two calls from the daemon (5000 + 9000); the callee's own call below it is inside.
        assert_eq!(c.libcephfs, 14000);
    }

    #[test]
    fn c_api_names_are_told_from_rust_paths() {
        assert!(is_ceph_api("ceph_ll_getattr"));
        assert!(!is_ceph_api("ceph_client::ops::<impl Mount>::getattr"));
        assert!(!is_ceph_api("ceph_virtiofsd::fs::CephFs::inode"));
    }

    #[test]
    fn baseline_lines_parse_and_bad_ones_are_named() {
        let b = parse_baseline("# comment\ngetattr = 12000\n\nlookup=9 # why\n").unwrap();
        assert_eq!(b.get("getattr"), Some(&12000));
        assert_eq!(b.get("lookup"), Some(&9));
        assert!(parse_baseline("getattr 1").unwrap_err().contains("line 1"));
        assert!(parse_baseline("mkdir = 1")
            .unwrap_err()
            .contains("unknown kind"));
        assert!(parse_baseline("getattr = x")
            .unwrap_err()
            .contains("not a count"));
    }
}
