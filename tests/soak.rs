//! The soak of issue #17: a real guest runs the correctness checker (fscheck), fsx (every
//! read checked against its model of the file, buffered and O_DIRECT, mmap included) and a
//! metadata storm at once over the daemon, while the cluster's active MDS fails over to its
//! standby every few minutes. Nothing may diverge, hang or be lost: every fscheck and fsx run
//! ends clean, every storm round finds its tree as it built it, after each failover the guest
//! is answered again within [`ANSWER_BOUND`] of the new MDS being active, and when it ends no
//! request is stuck.
//!
//! `SOAK_SECS` (default 300: the five-minute form CI runs) sets how long the workloads run,
//! `SOAK_FAILOVER_SECS` (default 60) the time between failovers; the long run is
//! `SOAK_SECS=3600 SOAK_FAILOVER_SECS=180`. `SOAK_DAEMON_ARGS` adds daemon options (say
//! `--held-inodes 16 --inode-cache 128`, so that nodes give their inodes back all along).
//! `SOAK_INJECT=KIND` makes the first fscheck run inject a fault (fscheck's `--inject`: flip,
//! chmod, stray, ...): the test must then fail,
//! which shows the soak sees what the checker finds. Printed for the record: per failover how long it
//! took and how soon after it the guest's ticker (a file created every second) was answered,
//! with p50/p99, and the totals of each workload.
//!
//! fio is not in the guest: Debian's fio links librbd and ceph-common (about 100 MB of shared
//! libraries in an initramfs); fsx takes its place as the data workload that verifies what it
//! reads.
//!
//! A binary of its own: it starts its own cluster (with a standby MDS).

mod common;

use std::time::{Duration, Instant};

use common::hostile::{metric, scrape_metrics, PrivateCluster};
use common::{run_guest, Daemon, Lab};

/// How long after a failover has finished the guest may take to be answered again.
const ANSWER_BOUND: Duration = Duration::from_secs(120);
/// fscheck operations per run; each run is a fresh seed in a fresh directory.
const FSCHECK_OPS: u64 = 1500;
/// fsx operations per run.
const FSX_OPS: u64 = 3000;

fn env_secs(name: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

/// fsx's configuration: an 8 MiB file, so operations cross 4 MiB object boundaries.
const FSX_CONF: &str = "flen = 8388608\n\
    [opsize]\nmax = 131072\n\
    [weights]\n\
    read = 10\nwrite = 10\nmapread = 5\nmapwrite = 5\ninvalidate = 1\n\
    truncate = 2\nclose_open = 1\nfsync = 1\nfdatasync = 1\n\
    punch_hole = 1\ncopy_file_range = 1\nsendfile = 1\nposix_fadvise = 1\n\
    posix_fallocate = 0\n";

/// The guest: four loops in the background until the host creates /mnt/stop, then a summary.
/// Every loop line starts with SOAK-; lines with BAD are what the test fails on.
fn script(seed: u64, inject: &str) -> String {
    format!(
        r#"#!/bin/sh
mkdir -p /mnt/fc /mnt/fsx /mnt/storm /mnt/tick
fscheck_loop() {{
  k=0; bad=0
  while [ ! -e /mnt/stop ]; do
    s=$(({seed} + k))
    inj=""
    [ $k = 0 ] && [ -n "{inject}" ] && inj="--inject {inject}"
    /opt/bin/fscheck --seed $s --ops {FSCHECK_OPS} --dir /mnt/fc --max-time 1700000000 --op-timeout 300 --quiet $inj > /tmp/fc.log 2>&1
    rc=$?
    if [ $rc = 0 ]; then echo "SOAK-FSCHECK seed=$s ok"; else bad=$((bad+1)); echo "SOAK-FSCHECK seed=$s rc=$rc BAD"; tail -n 40 /tmp/fc.log; fi
    k=$((k+1))
  done
  echo "SOAK-FSCHECK-END runs=$k bad=$bad"
}}
fsx_loop() {{
  k=0; bad=0
  while [ ! -e /mnt/stop ]; do
    s=$(({seed} + 7919 * (k + 1)))
    if [ $((k % 2)) = 1 ]; then d=1; else d=0; fi
    FSX_O_DIRECT=$d /opt/bin/fsx -N {FSX_OPS} -S $s -f /opt/fsx.toml -P /tmp /mnt/fsx/f$k.bin > /tmp/fsx.log 2>&1
    rc=$?
    if [ $rc = 0 ]; then echo "SOAK-FSX seed=$s direct=$d ok"; rm -f /mnt/fsx/f$k.bin; else bad=$((bad+1)); echo "SOAK-FSX seed=$s direct=$d rc=$rc BAD"; tail -n 40 /tmp/fsx.log; fi
    k=$((k+1))
  done
  echo "SOAK-FSX-END runs=$k bad=$bad"
}}
storm_loop() {{
  k=0; bad=0
  while [ ! -e /mnt/stop ]; do
    d=/mnt/storm/r$k
    mkdir -p $d/a $d/b
    i=0
    while [ $i -lt 40 ]; do
      echo "$k $i" > $d/a/f$i
      mv $d/a/f$i $d/b/g$i
      ln $d/b/g$i $d/b/h$i
      ln -s g$i $d/b/s$i
      i=$((i+1))
    done
    i=0
    while [ $i -lt 40 ]; do
      [ "$(cat $d/b/h$i)" = "$k $i" ] && [ "$(readlink $d/b/s$i)" = "g$i" ] && [ "$(stat -c %h $d/b/g$i)" = 2 ] || {{ bad=$((bad+1)); echo "SOAK-STORM round=$k entry=$i BAD: $(ls -l $d/b | head -n 5)"; }}
      rm $d/b/g$i
      i=$((i+1))
    done
    n=$(ls $d/b | wc -l); m=$(ls $d/a | wc -l)
    [ "$n" = 80 ] && [ "$m" = 0 ] && [ "$(stat -c %h $d)" = 4 ] || {{ bad=$((bad+1)); echo "SOAK-STORM round=$k listing BAD: b=$n a=$m nlink=$(stat -c %h $d)"; }}
    rm -r $d || {{ bad=$((bad+1)); echo "SOAK-STORM round=$k rm BAD"; }}
    [ -e $d ] && {{ bad=$((bad+1)); echo "SOAK-STORM round=$k still there BAD"; }}
    echo "SOAK-STORM round=$k ok"
    k=$((k+1))
  done
  echo "SOAK-STORM-END rounds=$k bad=$bad"
}}
tick_loop() {{
  n=0
  while [ ! -e /mnt/stop ]; do
    : > /mnt/tick/t$n && rm -f /mnt/tick/t$((n-1)) && echo "SOAK-TICK $n"
    n=$((n+1))
    sleep 1
  done
}}
echo SOAK-STARTED
# The three logs exist before tail opens them: busybox's tail -f skips a file missing at its
# start, and a loop whose subshell had not yet made its log lost all its lines (the summary
# read "fsx 0 runs" though fsx ran clean).
: > /tmp/o.fc; : > /tmp/o.fsx; : > /tmp/o.storm
fscheck_loop > /tmp/o.fc 2>&1 &
p1=$!
fsx_loop > /tmp/o.fsx 2>&1 &
p2=$!
storm_loop > /tmp/o.storm 2>&1 &
p3=$!
tail -f /tmp/o.fc /tmp/o.fsx /tmp/o.storm 2>/dev/null | grep -v '^==>' &
tp=$!
tick_loop
wait $p1 $p2 $p3
sleep 2
kill $tp 2>/dev/null
bad=$(cat /tmp/o.fc /tmp/o.fsx /tmp/o.storm | grep -c ' BAD')
echo "SOAK-DONE bad=$bad"
exit $bad
"#
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted
        .get(i.min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

/// The ticks the guest has printed so far.
fn ticks(console: &std::path::Path) -> usize {
    std::fs::read_to_string(console)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("SOAK-TICK "))
        .count()
}

/// `key=N` of the summary line that starts with `prefix`.
fn summary(console: &str, prefix: &str, key: &str) -> Option<u64> {
    console
        .lines()
        .find(|l| l.starts_with(prefix))?
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))?
        .parse()
        .ok()
}

#[test]
fn checker_fsx_and_a_metadata_storm_ride_out_mds_failovers() {
    let secs = env_secs("SOAK_SECS", 300);
    let every = env_secs("SOAK_FAILOVER_SECS", 60);
    let seed = common::seed_from_env("SOAK_SEED");
    let shared = Lab::get();
    let name = format!("soak-{}", std::process::id());
    // Named after the process too: a long run and a short one may share the lab.
    let private =
        PrivateCluster::start_with(&shared, &format!("{name}-cluster"), &["--standby-mds"]);
    let lab = &private.lab;
    let export = lab.export_dir(&name);
    let work = lab.scratch(&name);
    let metrics = work.join("metrics.sock");
    std::fs::write(work.join("fsx.toml"), FSX_CONF).unwrap();
    let more = std::env::var("SOAK_DAEMON_ARGS").unwrap_or_default();
    let mut args = vec!["--metrics-socket", metrics.to_str().unwrap()];
    args.extend(more.split_whitespace());
    let daemon = Daemon::start(lab, &work, &export, &args);
    println!(
        "soak: {} s, an MDS failover every {} s, seed {seed} (replay: SOAK_SEED={seed}), daemon {args:?}",
        secs.as_secs(),
        every.as_secs()
    );
    let console = work.join("console.log");
    let adds = [
        (lab.guest_bin.join("fscheck"), "/opt/bin/fscheck".to_owned()),
        (lab.guest_bin.join("fsx"), "/opt/bin/fsx".to_owned()),
        (work.join("fsx.toml"), "/opt/fsx.toml".to_owned()),
    ];
    let guest = {
        let (lab, work, socket) = (lab.clone(), work.clone(), daemon.socket.clone());
        let inject = std::env::var("SOAK_INJECT").unwrap_or_default();
        assert!(
            inject.chars().all(|c| c.is_ascii_alphanumeric()),
            "SOAK_INJECT takes one of fscheck's --inject kinds"
        );
        let script = script(seed, &inject);
        let timeout = u32::try_from(secs.as_secs())
            .unwrap_or(u32::MAX)
            .saturating_add(1800);
        std::thread::spawn(move || {
            let stand_in = Daemon {
                child: None,
                socket,
                log: work.join("daemon.log"),
            };
            let adds: Vec<(std::path::PathBuf, &str)> =
                adds.iter().map(|(h, g)| (h.clone(), g.as_str())).collect();
            run_guest(&lab, &work, &stand_in, &script, &adds, timeout)
        })
    };

    let first_tick_after = |n: usize, deadline: Instant| -> Option<Instant> {
        loop {
            if ticks(&console) > n {
                return Some(Instant::now());
            }
            if Instant::now() > deadline || guest.is_finished() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert!(
        first_tick_after(0, Instant::now() + Duration::from_secs(900)).is_some(),
        "the guest's workloads never got going; daemon log:\n{}",
        daemon.log_text()
    );
    let start = Instant::now();
    let mut took = Vec::new();
    let mut answered = Vec::new();
    while start.elapsed() + every <= secs {
        std::thread::sleep(every);
        let before = ticks(&console);
        let t0 = Instant::now();
        private.fail_mds();
        let active = Instant::now();
        let seen = ticks(&console).max(before);
        let at = first_tick_after(seen, active + ANSWER_BOUND).unwrap_or_else(|| {
            panic!(
                "failover {}: the guest was not answered within {ANSWER_BOUND:?} after the new \
                 MDS was active (guest finished: {})\ndaemon log:\n{}",
                took.len(),
                guest.is_finished(),
                daemon.log_text()
            )
        });
        println!(
            "soak: failover {} took {:?}; the guest's next tick came +{:?} after the new MDS was active",
            took.len(),
            active - t0,
            at - active
        );
        took.push(active - t0);
        answered.push(at - active);
    }
    std::thread::sleep(secs.saturating_sub(start.elapsed()));
    // While the guest still runs (the daemon ends with its frontend): nothing stuck now.
    let stuck_at_end = metric(
        &scrape_metrics(&metrics),
        "ceph_virtiofsd_fuse_requests_stuck",
    );

    common::ceph_touch(lab, &export, "stop");
    let run = guest.join().expect("the guest thread");
    let text = run.console.clone();
    let _ = std::fs::write(work.join("soak-console.txt"), &text);
    let bad: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("SOAK-") && l.contains(" BAD"))
        .collect();
    let fscheck = summary(&text, "SOAK-FSCHECK-END", "runs").unwrap_or(0);
    let fsx = summary(&text, "SOAK-FSX-END", "runs").unwrap_or(0);
    let storm = summary(&text, "SOAK-STORM-END", "rounds").unwrap_or(0);
    took.sort_unstable();
    answered.sort_unstable();
    println!(
        "soak: {} failovers, took p50 {:?} p99 {:?}; guest answered after the new MDS was active \
         p50 {:?} p99 {:?}; fscheck {fscheck} runs of {FSCHECK_OPS} ops, fsx {fsx} runs of \
         {FSX_OPS} ops, storm {storm} rounds; guest exit {}",
        took.len(),
        percentile(&took, 0.5),
        percentile(&took, 0.99),
        percentile(&answered, 0.5),
        percentile(&answered, 0.99),
        run.code()
    );
    assert!(
        bad.is_empty() && run.code() == 0 && text.contains("SOAK-DONE bad=0"),
        "the soak found problems (seed {seed}):\n{}\nconsole tail:\n{}",
        bad.join("\n"),
        text.lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        fscheck > 0 && fsx > 0 && storm > 0,
        "a workload never completed a run: fscheck {fscheck}, fsx {fsx}, storm {storm}"
    );
    assert_eq!(
        stuck_at_end,
        Some(0.0),
        "requests stuck when the workloads were told to stop"
    );
    let log = daemon.log_text();
    assert!(!log.contains("panicked"), "{log}");
}
