//! ceph-virtiofsd-bench: measures vhost-user-fs daemons from the host by playing the guest's
//! part (vhost-user frontend, split virtqueues, FUSE requests). See bench/README.md.
//!
//! Layers: `virtq` (rings in guest memory) → `session` (vhost-user + FUSE transport, implements
//! `Backend`) → `workload` (knows only `Backend`) → `stats` (tables, JSON) → `main` (rounds, ABBA per workload).

mod args;
mod asok;
mod backend;
mod cost;
mod density;
mod echo;
mod floor;
mod fuse;
mod hostile;
mod nonblocking;
mod session;
mod stats;
mod upgrade;
mod virtq;
mod workload;

use std::path::Path;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use clap::Parser;

use crate::args::{Args, Config, Target};
use crate::backend::Backend;
use crate::floor::{FloorBackend, FloorError};
use crate::session::{FuseSession, SetupError};
use crate::stats::Row;
use crate::workload::{Sample, WorkloadError};

/// Exit codes: 0 all workloads ran without errno replies, 1 a session or workload failed,
/// 2 bad command line, 3 finished but some requests got errno or malformed replies.
const EXIT_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_ERRORS: u8 = 3;

#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error("Starting target {0} with `{1}` failed")]
    Launch(String, String, #[source] std::io::Error),
    #[error("Target {0}: the launched daemon did not create socket {1} within 10 s")]
    NoSocket(String, String),
    #[error("Target {0}: bringing up the device failed")]
    Setup(String, #[source] SetupError),
    #[error("Target {0}: starting the libcephfs floor failed")]
    Floor(String, #[source] FloorError),
    #[error("Target {0}: {1} failed")]
    Workload(String, String, #[source] WorkloadError),
    #[error("Writing {0} failed")]
    Json(String, #[source] std::io::Error),
}

pub(crate) fn print_chain(e: &dyn std::error::Error) {
    eprintln!("Error: {e}");
    let mut src = e.source();
    let mut i = 1;
    while let Some(s) = src {
        eprintln!("  {i}: {s}");
        src = s.source();
        i += 1;
    }
}

/// ABBA order: the `k`-th pass of a workload over the targets runs them forward when `k` is
/// even, backward when it is odd.
fn abba(targets: usize, k: usize) -> Vec<usize> {
    if k % 2 == 0 {
        (0..targets).collect()
    } else {
        (0..targets).rev().collect()
    }
}

/// The pass number `abba` takes for workload `wi` of `workloads` in `round`. Consecutive
/// workloads of a round alternate direction, and so does one workload from round to round: the
/// stride between rounds is odd (with an even number of workloads, `round * workloads + wi`
/// would run each workload in the same direction every round).
fn pass_index(round: usize, workloads: usize, wi: usize) -> usize {
    round * (workloads | 1) + wi
}

struct Launched {
    child: Child,
}

impl Launched {
    fn start(t: &Target, cmd: &str) -> Result<Self, RunError> {
        let sock = t.socket.display().to_string();
        let cmd = cmd.replace("{socket}", &sock);
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {cmd}"))
            .spawn()
            .map_err(|e| RunError::Launch(t.name.clone(), cmd.clone(), e))?;
        let l = Launched { child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // virtiofsd serves exactly one connection, so probe by existence, not by connect.
            if Path::new(&t.socket).exists() {
                return Ok(l);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(RunError::NoSocket(t.name.clone(), sock))
    }

    /// Waits briefly for the daemon to exit by itself (vhost-user daemons exit when the
    /// frontend disconnects), then kills it by pid.
    fn stop(mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One target, connected for a round: its daemon (when the bench launches it) and the
/// backend the workloads drive.
struct Open {
    conn: Conn,
    launched: Option<Launched>,
}

enum Conn {
    Fuse(FuseSession),
    Floor(FloorBackend),
}

impl Open {
    /// Launch (if configured) and connect target `t`; the first time, print what it offers.
    fn start(cfg: &Config, t: &Target, print_init: bool) -> Result<Self, RunError> {
        let launched = match &t.launch {
            Some(cmd) => {
                let _ = std::fs::remove_file(&t.socket);
                Some(Launched::start(t, cmd)?)
            }
            None => None,
        };
        // On an error `launched` is dropped here, which does not stop the child: stop it.
        let conn = match Self::connect(cfg, t, print_init) {
            Ok(c) => c,
            Err(e) => {
                if let Some(l) = launched {
                    l.stop();
                }
                return Err(e);
            }
        };
        Ok(Open { conn, launched })
    }

    fn connect(cfg: &Config, t: &Target, print_init: bool) -> Result<Conn, RunError> {
        if let Some(spec) = &t.floor {
            let f = FloorBackend::connect(spec, cfg.session.max_io)
                .map_err(|e| RunError::Floor(t.name.clone(), e))?;
            if print_init {
                println!(
                    "# {}: libcephfs floor, {} as client.{}, root {}",
                    t.name,
                    spec.conf.display(),
                    spec.client_id,
                    spec.root
                );
            }
            return Ok(Conn::Floor(f));
        }
        let s = FuseSession::connect(&t.socket, &cfg.session)
            .map_err(|e| RunError::Setup(t.name.clone(), e))?;
        if print_init {
            let i = &s.init;
            println!(
                "# {}: FUSE {}.{} max_write={} max_pages={} max_readahead={} max_background={} time_gran={} request_queues={}",
                t.name, i.major, i.minor, i.max_write, i.max_pages, i.max_readahead, i.max_background, i.time_gran, s.request_queues()
            );
            println!(
                "# {}: flags offered: {}",
                t.name,
                fuse::flag_names(fuse::guest_init_flags())
            );
            println!(
                "# {}: flags answered: {}",
                t.name,
                fuse::flag_names(i.flags)
            );
            println!("# {}: {}", t.name, s.notify_note());
        }
        Ok(Conn::Fuse(s))
    }

    fn backend(&mut self) -> &mut dyn Backend {
        match &mut self.conn {
            Conn::Fuse(s) => s,
            Conn::Floor(f) => f,
        }
    }

    /// Disconnect (printing the round's virtqueue counters) and stop the launched daemon.
    fn close(self, t: &Target, round: usize) {
        if let Conn::Fuse(s) = self.conn {
            println!("# {}: round {round} virtqueue: {}", t.name, s.counters());
            s.close();
        }
        if let Some(l) = self.launched {
            l.stop();
        }
    }
}

/// The setup of one round on one connected backend.
fn setup(t: &Target, params: &workload::Params, b: &mut dyn Backend) -> Result<(), RunError> {
    let notes = workload::setup(b, params)
        .map_err(|e| RunError::Workload(t.name.clone(), "setup".into(), e))?;
    for n in notes {
        println!("# {}: {n}", t.name);
    }
    Ok(())
}

/// One workload on one connected backend; prints one line.
fn run_workload(
    t: &Target,
    round: usize,
    w: workload::Workload,
    params: &workload::Params,
    b: &mut dyn Backend,
) -> Result<Sample, RunError> {
    // MDS request counter of the target's libcephfs client; a failing read is reported and
    // the column stays empty.
    let warned = std::cell::Cell::new(false);
    let probe = || {
        let path = t.admin_socket.as_ref()?;
        match asok::mds_replies(path) {
            Ok(v) => Some(v),
            Err(e) => {
                if !warned.replace(true) {
                    eprintln!("warning: target {}: {e}; MDS requests not counted", t.name);
                }
                None
            }
        }
    };
    let sample = workload::run(b, w, params, &probe)
        .map_err(|e| RunError::Workload(t.name.clone(), w.name(), e))?;
    let thr = if w.is_bandwidth() {
        format!(
            "{:.1} MiB/s",
            sample.bytes as f64 / 1_048_576.0 / sample.wall.as_secs_f64().max(1e-9)
        )
    } else {
        format!(
            "{:.0} ops/s",
            sample.ops as f64 / sample.wall.as_secs_f64().max(1e-9)
        )
    };
    let errs = match &sample.first_error {
        Some(e) => format!(", {} errors (first: {e})", sample.errors),
        None => String::new(),
    };
    let mds = match sample.mds_requests {
        Some(m) => format!(
            ", {m} MDS requests ({:.4}/op)",
            m as f64 / (sample.ops.max(1)) as f64
        ),
        None => String::new(),
    };
    println!(
        "round {round} {:<14} {:<16} {thr}{mds}{errs}",
        t.name,
        w.name()
    );
    Ok(sample)
}

/// One round: every target started and set up, then each workload on every target in turn,
/// the order reversed from one workload to the next (ABBA), so that the runs compared with
/// each other are close in time whatever else the machine is doing.
fn run_round(
    cfg: &Config,
    round: usize,
    seen: &mut [bool],
    all: &mut Vec<(usize, String, String, bool, Sample)>,
) -> Result<(), RunError> {
    let mut params = cfg.params.clone();
    params.seed = round as u64;
    let mut open: Vec<(&Target, Open)> = Vec::new();
    let result = (|| {
        for (ti, t) in cfg.targets.iter().enumerate() {
            let first = seen.get(ti).is_some_and(|s| !s);
            if let Some(s) = seen.get_mut(ti) {
                *s = true;
            }
            let mut o = Open::start(cfg, t, first)?;
            let r = setup(t, &params, o.backend());
            open.push((t, o));
            r?;
        }
        for (wi, w) in cfg.workloads.iter().enumerate() {
            for ti in abba(open.len(), pass_index(round, cfg.workloads.len(), wi)) {
                let Some((t, o)) = open.get_mut(ti) else {
                    continue;
                };
                let sample = run_workload(t, round, *w, &params, o.backend())?;
                all.push((round, t.name.clone(), w.name(), w.is_bandwidth(), sample));
            }
        }
        Ok(())
    })();
    for (t, o) in open {
        o.close(t, round);
    }
    result
}

fn run(cfg: &Config) -> Result<bool, RunError> {
    let mut all: Vec<(usize, String, String, bool, Sample)> = Vec::new();
    let mut seen = vec![false; cfg.targets.len()];
    for round in 0..cfg.rounds {
        run_round(cfg, round, &mut seen, &mut all)?;
    }
    let mut rows = Vec::new();
    for w in &cfg.workloads {
        let wn = w.name();
        for t in &cfg.targets {
            let samples: Vec<Sample> = all
                .iter()
                .filter(|x| x.2 == wn && x.1 == t.name)
                .map(|x| x.4.clone())
                .collect();
            rows.push(Row {
                workload: wn.clone(),
                bandwidth: w.is_bandwidth(),
                target: t.name.clone(),
                summary: stats::summarize(&samples),
            });
        }
    }
    println!();
    println!("{}", stats::table(&rows, &cfg.baseline));
    let mut clean = true;
    for r in &rows {
        for n in &r.summary.notes {
            println!("- {} / {}: {n}", r.workload, r.target);
        }
        if let Some(e) = &r.summary.first_error {
            clean = false;
            println!(
                "- {} / {}: {} errors, first: {e}",
                r.workload, r.target, r.summary.errors
            );
        }
    }
    if let Some(path) = &cfg.json {
        let rounds: Vec<(usize, String, String, Sample)> = all
            .into_iter()
            .map(|(r, t, w, _, s)| (r, t, w, s))
            .collect();
        let meta = vec![
            ("tool".to_string(), "ceph-virtiofsd-bench".to_string()),
            ("baseline".to_string(), cfg.baseline.join(",")),
            ("rounds".to_string(), cfg.rounds.to_string()),
            (
                "request_queues".to_string(),
                cfg.session.request_queues.to_string(),
            ),
            ("event_idx".to_string(), cfg.session.event_idx.to_string()),
            (
                "halt_poll_us".to_string(),
                cfg.session.halt_poll.as_micros().to_string(),
            ),
        ];
        std::fs::write(path, stats::json(&rows, &rounds, &meta))
            .map_err(|e| RunError::Json(path.display().to_string(), e))?;
    }
    Ok(clean)
}

fn main() -> ExitCode {
    // `ceph-virtiofsd-bench hostile ...`: the hostile-guest tools (see hostile/mod.rs).
    if std::env::args_os().nth(1).is_some_and(|a| a == "hostile") {
        return hostile::main(std::env::args_os().skip(1));
    }
    // `ceph-virtiofsd-bench upgrade-stream ...`: a guest that outlives its daemon.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "upgrade-stream")
    {
        return upgrade::main(std::env::args_os().skip(1));
    }
    // `ceph-virtiofsd-bench nonblocking ...`: libcephfs 20's nonblocking I/O against the
    // blocking calls, in this process.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "nonblocking")
    {
        return nonblocking::main(std::env::args_os().skip(1));
    }
    // `ceph-virtiofsd-bench cost ...`: instructions per cached request, under callgrind.
    if std::env::args_os().nth(1).is_some_and(|a| a == "cost") {
        return cost::main(std::env::args_os().skip(1));
    }
    // `ceph-virtiofsd-bench echo ...`: the daemon's request path over a filesystem that
    // answers at once (the physical limit the daemon is measured against).
    if std::env::args_os().nth(1).is_some_and(|a| a == "echo") {
        return echo::main(std::env::args_os().skip(1));
    }
    // `ceph-virtiofsd-bench density ...`: idle guests a script measures (tests/bench/density).
    if std::env::args_os().nth(1).is_some_and(|a| a == "density") {
        return density::main(std::env::args_os().skip(1));
    }
    let cfg = match Config::try_from(Args::parse()) {
        Ok(c) => c,
        Err(e) => {
            print_chain(&e);
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match run(&cfg) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(EXIT_ERRORS),
        Err(e) => {
            print_chain(&e);
            ExitCode::from(EXIT_FAILED)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abba_order() {
        let o: Vec<usize> = (0..4).flat_map(|k| abba(2, k)).collect();
        assert_eq!(o, vec![0, 1, 1, 0, 0, 1, 1, 0]);
        let o: Vec<usize> = (0..2).flat_map(|k| abba(3, k)).collect();
        assert_eq!(o, vec![0, 1, 2, 2, 1, 0]);
    }

    #[test]
    fn every_workload_alternates_direction_between_rounds() {
        for workloads in 1..=6 {
            for wi in 0..workloads {
                let dirs: Vec<usize> = (0..4)
                    .map(|round| abba(2, pass_index(round, workloads, wi))[0])
                    .collect();
                assert_eq!(dirs, [0, 1, 0, 1].map(|d| d ^ (wi % 2)), "{workloads} {wi}");
            }
        }
    }
}
