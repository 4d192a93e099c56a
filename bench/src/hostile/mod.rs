//! `ceph-virtiofsd-bench hostile ...`: the guest as an attacker. A vhost-user frontend that
//! writes its descriptor tables by hand, so it can send any FUSE request and any chain a
//! guest driver could build, and an escape oracle on a second libcephfs client.
//!
//! - `hostile serve`: a line protocol on stdin/stdout (see `serve.rs`) for scripted attacks
//!   (tests/hostile/wire.rs drives it).
//! - `hostile fuzz`: generated requests and chains, many in flight, every answer judged (see
//!   `fuzz.rs`; tests/hostile/fuzz.rs runs it short, bench/README.md gives the long run).
//! - `hostile states`: generated device states sent as a hostile frontend (LOAD), and what the
//!   daemon serves from each judged (see `states.rs`; tests/hostile/fuzz.rs runs it short,
//!   bench/README.md gives the long run).

mod device;
mod fuzz;
mod gen;
mod judging;
mod oracle;
mod serve;
mod session;
mod states;
mod wire;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "ceph-virtiofsd-bench hostile",
    about = "Play a hostile guest against a vhost-user-fs daemon: scripted requests and chains (serve) or a fuzzer (fuzz)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Read commands from stdin, one per line, and print one answer line each.
    Serve(ServeArgs),
    /// Send generated requests and judge every answer; exit 1 on any finding.
    Fuzz(FuzzArgs),
    /// Send generated device states (LOAD) as a hostile frontend and judge what the daemon
    /// serves from them; exit 1 on any finding. The daemon needs --keep-serving.
    States(StatesArgs),
}

#[derive(Debug, Args)]
struct StatesArgs {
    #[command(flatten)]
    c: Common,
    /// Device states to send.
    #[arg(long, default_value_t = 10_000)]
    states: u64,
    /// Number of the first state (a replay of state N: --first N --states 1).
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Seed of the generator (same seed, same states).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The daemon's --max-nodes (states just over it must be refused).
    #[arg(long, default_value_t = 500_000)]
    max_nodes: usize,
    /// The daemon's --max-handles.
    #[arg(long, default_value_t = 100_000)]
    max_handles: usize,
    /// The daemon's pid: checked to be running after every state.
    #[arg(long)]
    pid: Option<u32>,
    /// Findings of one kind printed in full (the others are counted).
    #[arg(long, default_value_t = 5)]
    print_per_kind: u64,
    /// Send FUSE_INIT on each connection first: every state must then be refused.
    #[arg(long)]
    init_first: bool,
}

#[derive(Debug, Args)]
struct Common {
    /// The daemon's vhost-user socket.
    #[arg(long)]
    socket: PathBuf,
    /// ceph.conf for the oracle's own libcephfs client (mounted at "/").
    #[arg(long)]
    ceph_conf: Option<PathBuf>,
    /// cephx id of the oracle's client.
    #[arg(long, default_value = "admin")]
    client_id: String,
    /// The daemon's export (its --ceph-root), as a path from the CephFS root.
    #[arg(long)]
    export: Option<String>,
    /// Milliseconds to wait for a chain to come back before calling it lost.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
}

#[derive(Debug, Args)]
struct ServeArgs {
    #[command(flatten)]
    c: Common,
    /// Do not send FUSE_INIT after connecting (to test requests sent before it).
    #[arg(long)]
    no_init: bool,
}

#[derive(Debug, Args)]
struct FuzzArgs {
    #[command(flatten)]
    c: Common,
    /// Requests to send.
    #[arg(long, default_value_t = 100_000)]
    requests: u64,
    /// Seed of the generator (same seed, same requests).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Requests in flight at once (at most 64).
    #[arg(long, default_value_t = 32)]
    depth: usize,
    /// Requests between checkpoints (forget and release all, judge, check bounds).
    #[arg(long, default_value_t = 20_000)]
    checkpoint_every: u64,
    /// The daemon's pid: checked to be running, and its RSS read from /proc.
    #[arg(long)]
    pid: Option<u32>,
    /// The daemon's --metrics-socket: node and handle table sizes are read from it.
    #[arg(long)]
    metrics_socket: Option<PathBuf>,
    /// Most daemon RSS allowed at a checkpoint, MiB.
    #[arg(long, default_value_t = 1024)]
    max_rss_mib: u64,
    /// Most node-table entries allowed after forgetting everything we were given.
    #[arg(long, default_value_t = 4096)]
    max_nodes: u64,
    /// Most open handles allowed after releasing everything we were given.
    #[arg(long, default_value_t = 1024)]
    max_handles: u64,
    /// Findings of one kind printed in full (the others are counted).
    #[arg(long, default_value_t = 5)]
    print_per_kind: u64,
    /// Per mille of requests that change the tree (MKDIR, CREATE, WRITE, RENAME, ...): they
    /// wait for the MDS's journal and set the pace of a run.
    #[arg(long, default_value_t = gen::MUTATING_PER_MILLE)]
    mutating_per_mille: u64,
    /// Inode numbers waiting for the oracle's thread at most; when the queue is full the
    /// fuzzer waits (reported as oracle_queue_wait_ms).
    #[arg(long, default_value_t = 1024)]
    oracle_queue: usize,
}

fn connect(c: &Common, init: bool) -> Result<session::Session, String> {
    let dev = device::Device::connect(&c.socket).map_err(|e| error_chain(&e))?;
    let mut s = session::Session::new(dev, Duration::from_millis(c.timeout_ms));
    if init {
        let e = s.init().map_err(|e| error_chain(&e))?;
        if e != 0 {
            return Err(format!("FUSE_INIT answered error {e}"));
        }
    }
    Ok(s)
}

fn oracle(c: &Common) -> Result<Option<oracle::Oracle>, String> {
    match (&c.ceph_conf, &c.export) {
        (Some(conf), Some(export)) => oracle::Oracle::new(conf, &c.client_id, export)
            .map(Some)
            .map_err(|e| error_chain(&e)),
        (None, None) => Ok(None),
        _ => Err("--ceph-conf and --export go together (the oracle needs both)".into()),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

pub fn main(args: impl Iterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = Cli::parse_from(args);
    let r: Result<bool, String> = match cli.cmd {
        Cmd::Serve(a) => (|| {
            let o = oracle(&a.c)?;
            let s = connect(&a.c, !a.no_init)?;
            serve::run(s, o).map_err(|e| format!("stdin/stdout: {e}"))?;
            Ok(true)
        })(),
        Cmd::States(a) => (|| {
            let (Some(conf), Some(export)) = (a.c.ceph_conf.clone(), a.c.export.clone()) else {
                return Err("states needs the oracle: give --ceph-conf and --export".into());
            };
            let opts = states::StatesOpts {
                socket: a.c.socket.clone(),
                ceph_conf: conf,
                client_id: a.c.client_id.clone(),
                export,
                states: a.states,
                first: a.first,
                seed: a.seed,
                max_nodes: a.max_nodes,
                max_handles: a.max_handles,
                pid: a.pid,
                timeout: Duration::from_millis(a.c.timeout_ms),
                print_per_kind: a.print_per_kind,
                init_first: a.init_first,
            };
            let sum = states::run(&opts)?;
            states::print_summary(&sum, a.seed);
            Ok(!sum.failed())
        })(),
        Cmd::Fuzz(a) => (|| {
            let o = oracle(&a.c)?.ok_or("fuzz needs the oracle: give --ceph-conf and --export")?;
            let mut s = connect(&a.c, true)?;
            let opts = fuzz::FuzzOpts {
                requests: a.requests,
                seed: a.seed,
                depth: a.depth,
                checkpoint_every: a.checkpoint_every.max(1),
                pid: a.pid,
                metrics_socket: a.metrics_socket.clone(),
                max_rss_mib: a.max_rss_mib,
                max_nodes: a.max_nodes,
                max_handles: a.max_handles,
                timeout: Duration::from_millis(a.c.timeout_ms),
                print_per_kind: a.print_per_kind,
                mutating_per_mille: a.mutating_per_mille.min(1000),
                oracle_queue: a.oracle_queue.max(1),
            };
            let sum = fuzz::Fuzzer::new(&mut s, o, opts)
                .map_err(|e| format!("starting the oracle's judging thread: {e}"))?
                .run();
            print_summary(&sum, a.seed);
            Ok(!sum.failed())
        })(),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::from(2)
        }
    }
}

fn print_summary(s: &fuzz::Summary, seed: u64) {
    let mut kinds: Vec<_> = s.kinds.iter().collect();
    kinds.sort();
    println!(
        "# hostile fuzz: chain kinds sent: {}",
        kinds
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    if !s.unanswered_by_op.is_empty() {
        let mut v: Vec<_> = s.unanswered_by_op.iter().collect();
        v.sort();
        println!(
            "# hostile fuzz: well-formed requests answered with nothing, by opcode: {}",
            v.iter()
                .map(|(k, n)| format!("{k}:{n}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    if s.oracle_overturned > 0 {
        println!(
            "# hostile fuzz: {} tentative escapes from the oracle's cached \"..\" walk, each overturned by a fresh client",
            s.oracle_overturned
        );
    }
    let o = &s.oracle;
    println!(
        "# hostile fuzz: oracle judged {} of {} inode numbers ({} inside, {} gone, {} outside); judgement p50 <= {} ms, p99 <= {} ms, max {} ms, {} of at least 1 s; queue full {} times, waited {} ms in all, {} ms at most; the last judgements took {} ms after the run",
        o.judged,
        s.oracle_queued,
        o.inside,
        o.gone,
        o.outside,
        o.times.quantile(0.5).as_millis(),
        o.times.quantile(0.99).as_millis(),
        o.times.max.as_millis(),
        o.times.at_least_ms(1024),
        s.oracle_queue_full,
        s.oracle_queue_wait.as_millis(),
        s.oracle_queue_wait_max.as_millis(),
        s.oracle_tail.as_millis(),
    );
    let mut f: Vec<_> = s.findings.iter().collect();
    f.sort();
    println!(
        "hostile fuzz: seed={seed} requests={} answered={} secs={:.1} rate={:.0}/s pairs={} escapes={} lost={} malformed_replies={} bound_violations={} dead={} unanswered_proper={} max_rss_mib={} max_nodes={} max_handles={} oracle_judged={} oracle_unjudged={} oracle_p99_ms={} oracle_max_ms={} oracle_queue_wait_ms={} findings={}",
        s.sent,
        s.answered,
        s.elapsed.as_secs_f64(),
        s.sent as f64 / s.elapsed.as_secs_f64().max(1e-9),
        s.pairs,
        s.escapes,
        s.lost,
        s.malformed_replies,
        s.bound_violations,
        s.dead,
        s.unanswered_proper,
        s.max_rss_kib / 1024,
        s.max_nodes,
        s.max_handles,
        o.judged,
        s.oracle_unjudged,
        o.times.quantile(0.99).as_millis(),
        o.times.max.as_millis(),
        s.oracle_queue_wait.as_millis(),
        f.iter()
            .map(|(k, n)| format!("{k}:{n}"))
            .collect::<Vec<_>>()
            .join(",")
    );
}
