//! ceph-virtiofsd-bench: measures vhost-user-fs daemons from the host by playing the guest's
//! part (vhost-user frontend, split virtqueues, FUSE requests). See README.md in this folder.
//!
//! Layers: `virtq` (rings in guest memory) → `session` (vhost-user + FUSE transport, implements
//! `Backend`) → `workload` (knows only `Backend`) → `stats` (tables, JSON) → `main` (ABBA rounds).

mod args;
mod asok;
mod backend;
mod floor;
mod fuse;
mod session;
mod stats;
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

fn print_chain(e: &dyn std::error::Error) {
    eprintln!("Error: {e}");
    let mut src = e.source();
    let mut i = 1;
    while let Some(s) = src {
        eprintln!("  {i}: {s}");
        src = s.source();
        i += 1;
    }
}

/// ABBA order: even rounds run the targets forward, odd rounds backward.
fn abba(targets: usize, rounds: usize) -> Vec<(usize, usize)> {
    (0..rounds)
        .flat_map(|r| {
            let order: Vec<usize> = if r % 2 == 0 {
                (0..targets).collect()
            } else {
                (0..targets).rev().collect()
            };
            order.into_iter().map(move |t| (r, t))
        })
        .collect()
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

fn run_one(
    cfg: &Config,
    t: &Target,
    round: usize,
    print_init: bool,
) -> Result<Vec<(String, bool, Sample)>, RunError> {
    let launched = match &t.launch {
        Some(cmd) => {
            let _ = std::fs::remove_file(&t.socket);
            Some(Launched::start(t, cmd)?)
        }
        None => None,
    };
    let result = (|| {
        if let Some(spec) = &t.floor {
            let mut f = FloorBackend::connect(spec, cfg.session.max_io)
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
            return run_workloads(cfg, t, round, &mut f);
        }
        let mut s = FuseSession::connect(&t.socket, &cfg.session)
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
        let out = run_workloads(cfg, t, round, &mut s);
        println!("# {}: round {round} virtqueue: {}", t.name, s.counters());
        s.close();
        out
    })();
    if let Some(l) = launched {
        l.stop();
    }
    result
}

/// Setup, then every workload on one connected backend; prints one line per workload.
fn run_workloads(
    cfg: &Config,
    t: &Target,
    round: usize,
    b: &mut dyn Backend,
) -> Result<Vec<(String, bool, Sample)>, RunError> {
    let mut params = cfg.params.clone();
    params.seed = round as u64;
    let notes = workload::setup(b, &params)
        .map_err(|e| RunError::Workload(t.name.clone(), "setup".into(), e))?;
    for n in notes {
        println!("# {}: {n}", t.name);
    }
    // MDS request counter of the target's libcephfs client; a failing read is reported once
    // and the column stays empty.
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
    let mut out = Vec::new();
    {
        let b = &mut *b;
        for w in &cfg.workloads {
            let sample = workload::run(b, *w, &params, &probe)
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
            out.push((w.name(), w.is_bandwidth(), sample));
        }
    }
    Ok(out)
}

fn run(cfg: &Config) -> Result<bool, RunError> {
    let mut all: Vec<(usize, String, String, bool, Sample)> = Vec::new();
    let mut seen = vec![false; cfg.targets.len()];
    for (round, ti) in abba(cfg.targets.len(), cfg.rounds) {
        let Some(t) = cfg.targets.get(ti) else {
            continue;
        };
        let first = !seen[ti];
        seen[ti] = true;
        for (w, bw, s) in run_one(cfg, t, round, first)? {
            all.push((round, t.name.clone(), w, bw, s));
        }
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
        let o: Vec<usize> = abba(2, 4).into_iter().map(|(_, t)| t).collect();
        assert_eq!(o, vec![0, 1, 1, 0, 0, 1, 1, 0]);
        let o: Vec<usize> = abba(3, 2).into_iter().map(|(_, t)| t).collect();
        assert_eq!(o, vec![0, 1, 2, 2, 1, 0]);
    }
}
