//! Command line, and its validation into a `Config`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::backend::Ctx;
use crate::floor::FloorSpec;
use crate::session::SessionOpts;
use crate::workload::{Params, Workload};

/// Load generator for vhost-user-fs daemons: plays the guest (virtqueues + FUSE) from the host.
#[derive(Debug, Parser)]
#[command(name = "ceph-virtiofsd-bench", version)]
pub struct Args {
    /// Daemon under test, as NAME=SOCKET (repeat to compare; each workload runs on the targets in
    /// ABBA order).
    /// NAME=ceph:/path/to/ceph.conf[:/root] is the "floor": the same operations called
    /// directly through libcephfs in this process (no daemon, no FUSE).
    #[arg(long = "target", required = true, value_name = "NAME=SOCKET")]
    pub targets: Vec<String>,
    /// cephx id the floor's libcephfs client connects as.
    #[arg(long, default_value = "admin")]
    pub ceph_id: String,
    /// Admin socket of target NAME's libcephfs client, as NAME=PATH (repeatable): MDS
    /// requests per workload are read from its perf counters (client.reply). For a floor
    /// target the bench sets `admin_socket` itself; for a daemon, configure the daemon to
    /// create it (ours: --ceph-opt admin_socket=PATH; ceph-fuse: --admin-socket PATH).
    #[arg(long = "admin-socket", value_name = "NAME=PATH")]
    pub admin_sockets: Vec<String>,
    /// Command that starts target NAME before each of its rounds, as NAME=COMMAND; `{socket}`
    /// is replaced by the target's socket path. Run through `sh -c 'exec COMMAND'`.
    #[arg(long = "launch", value_name = "NAME=COMMAND")]
    pub launch: Vec<String>,
    /// Targets the ratios are computed against, comma-separated (default: the first
    /// target); e.g. `--baseline peer,floor`.
    #[arg(long, value_delimiter = ',')]
    pub baseline: Vec<String>,
    /// Rounds per target.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Comma-separated workloads: walk48, walk5, open-close, create-unlink, readdir5000,
    /// randwrite4k, seqwrite1m, seqread1m, stat-storm (= stat-storm-1,-4,-32), stat-storm-N, all;
    /// randread4k (O_DIRECT random reads of the randwrite4k file), revread4k and fwdread4k
    /// (buffered 4 KiB reads of the seqwrite1m file, backwards and forwards) only when named.
    #[arg(long, default_value = "all", value_delimiter = ',')]
    pub workload: Vec<String>,
    /// Write results (summary + per round) as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Request queues to set up (a Linux 6.1 guest uses 1).
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// Virtqueue size (power of two).
    #[arg(long, default_value_t = 128)]
    pub queue_size: u16,
    /// Largest READ/WRITE payload to offer buffers for, in KiB.
    #[arg(long, default_value_t = 1024)]
    pub max_io_kib: u32,
    /// Seconds to wait for any reply before declaring the daemon stuck.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Do not negotiate VIRTIO_RING_F_EVENT_IDX even when the daemon offers it (a Linux guest
    /// does negotiate it): then the daemon signals every completion and we kick every flush
    /// unless it set VIRTQ_USED_F_NO_NOTIFY.
    #[arg(long)]
    pub no_event_idx: bool,
    /// Most microseconds a wait spins on the used ring before sleeping on the call eventfd, like
    /// a vCPU halt-polled by KVM (halt_poll_ns, 200 us on x86); 0 = off. The window adapts per
    /// queue as KVM's: short waits grow it, waits longer than this shrink it.
    #[arg(long, default_value_t = 200, value_name = "N")]
    pub halt_poll_us: u64,
    /// uid/gid of the unprivileged guest user the workloads run as.
    #[arg(long, default_value_t = 1000)]
    pub uid: u32,
    #[arg(long, default_value_t = 1000)]
    pub gid: u32,
    #[arg(long, default_value_t = 2000)]
    pub walk_iters: usize,
    #[arg(long, default_value_t = 5000)]
    pub open_close_iters: usize,
    #[arg(long, default_value_t = 2000)]
    pub create_unlink_iters: usize,
    #[arg(long, default_value_t = 20)]
    pub readdir_iters: usize,
    /// Entries in the readdir directory.
    #[arg(long, default_value_t = 5000)]
    pub dir_entries: usize,
    /// READDIRPLUS buffer size (a Linux guest asks for one page).
    #[arg(long, default_value_t = 4096)]
    pub readdir_size: u32,
    #[arg(long, default_value_t = 20000)]
    pub randwrite_ops: usize,
    #[arg(long, default_value_t = 64)]
    pub randwrite_depth: usize,
    #[arg(long, default_value_t = 64)]
    pub randwrite_file_mib: u64,
    /// Bytes per seqwrite1m/seqread1m pass, in MiB. The default is five times libcephfs's
    /// object cache (client_oc_size, 200 MiB), so that a write pass measures the flow to the
    /// OSDs rather than the cache filling.
    #[arg(long, default_value_t = 1024)]
    pub seq_mib: u64,
    #[arg(long, default_value_t = 4)]
    pub seq_depth: usize,
    /// MiB of the seqwrite1m file revread4k and fwdread4k read, 4 KiB at a time.
    #[arg(long, default_value_t = 100)]
    pub stride_mib: u64,
    /// GETATTR requests per stat-storm run (total over all streams).
    #[arg(long, default_value_t = 50000)]
    pub stat_ops: usize,
    /// Distinct cached nodes stat-storm cycles over.
    #[arg(long, default_value_t = 10)]
    pub stat_nodes: usize,
}

#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub socket: PathBuf,
    pub launch: Option<String>,
    /// Set for the libcephfs floor (then `socket` is unused).
    pub floor: Option<FloorSpec>,
    /// libcephfs admin socket to read MDS request counts from.
    pub admin_socket: Option<PathBuf>,
}

#[derive(Debug)]
pub struct Config {
    pub targets: Vec<Target>,
    pub baseline: Vec<String>,
    pub rounds: usize,
    pub workloads: Vec<Workload>,
    pub json: Option<PathBuf>,
    pub session: SessionOpts,
    pub params: Params,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--{0} {1:?} is not NAME=VALUE")]
    NotPair(&'static str, String),
    #[error("Target name {0:?} given twice")]
    DuplicateTarget(String),
    #[error("--launch names {0:?}, which is no --target")]
    LaunchWithoutTarget(String),
    #[error("--launch {0:?}: a floor target (ceph:...) runs in-process and cannot be launched")]
    LaunchFloor(String),
    #[error("--admin-socket names {0:?}, which is no --target")]
    AsokWithoutTarget(String),
    #[error("--baseline {0:?} is not one of the targets")]
    Baseline(String),
    #[error("Unknown workload {0:?} (see --help for the list)")]
    Workload(String),
    #[error("--{0} must be {1}")]
    Range(&'static str, &'static str),
}

fn pair(flag: &'static str, s: &str) -> Result<(String, String), ConfigError> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(ConfigError::NotPair(flag, s.to_string())),
    }
}

impl TryFrom<Args> for Config {
    type Error = ConfigError;

    fn try_from(a: Args) -> Result<Self, ConfigError> {
        let mut targets: Vec<Target> = Vec::new();
        for t in &a.targets {
            let (name, socket) = pair("target", t)?;
            if targets.iter().any(|x| x.name == name) {
                return Err(ConfigError::DuplicateTarget(name));
            }
            let floor = FloorSpec::parse(&socket, &a.ceph_id);
            targets.push(Target {
                name,
                socket: socket.into(),
                launch: None,
                floor,
                admin_socket: None,
            });
        }
        for l in &a.launch {
            let (name, cmd) = pair("launch", l)?;
            let t = targets
                .iter_mut()
                .find(|t| t.name == name)
                .ok_or(ConfigError::LaunchWithoutTarget(name))?;
            if t.floor.is_some() {
                return Err(ConfigError::LaunchFloor(t.name.clone()));
            }
            t.launch = Some(cmd);
        }
        for l in &a.admin_sockets {
            let (name, path) = pair("admin-socket", l)?;
            let t = targets
                .iter_mut()
                .find(|t| t.name == name)
                .ok_or(ConfigError::AsokWithoutTarget(name))?;
            let path = PathBuf::from(path);
            if let Some(f) = t.floor.as_mut() {
                f.admin_socket = Some(path.clone());
            }
            t.admin_socket = Some(path);
        }
        let mut baseline = Vec::new();
        for b in a
            .baseline
            .iter()
            .map(|b| b.trim())
            .filter(|b| !b.is_empty())
        {
            if !targets.iter().any(|t| t.name == b) {
                return Err(ConfigError::Baseline(b.to_string()));
            }
            baseline.push(b.to_string());
        }
        if baseline.is_empty() {
            baseline.extend(targets.first().map(|t| t.name.clone()));
        }
        let mut workloads = Vec::new();
        for w in a
            .workload
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
        {
            let v = Workload::parse(w).ok_or_else(|| ConfigError::Workload(w.to_string()))?;
            for x in v {
                if !workloads.contains(&x) {
                    workloads.push(x);
                }
            }
        }
        if a.rounds == 0 {
            return Err(ConfigError::Range("rounds", "at least 1"));
        }
        if !a.queue_size.is_power_of_two() || a.queue_size < 4 {
            return Err(ConfigError::Range(
                "queue-size",
                "a power of two, at least 4",
            ));
        }
        if a.queues == 0 || a.queues > 64 {
            return Err(ConfigError::Range("queues", "between 1 and 64"));
        }
        if a.max_io_kib < 4 || a.max_io_kib > 16 * 1024 {
            return Err(ConfigError::Range("max-io-kib", "between 4 and 16384"));
        }
        if a.halt_poll_us > 1_000_000 {
            return Err(ConfigError::Range("halt-poll-us", "at most 1000000"));
        }
        if a.randwrite_depth == 0
            || a.seq_depth == 0
            || a.randwrite_file_mib == 0
            || a.readdir_size < 512
        {
            return Err(ConfigError::Range(
                "randwrite-depth/seq-depth/randwrite-file-mib/readdir-size",
                "positive (readdir-size at least 512)",
            ));
        }
        let slots = usize::from(a.queue_size / 2);
        let session = SessionOpts {
            request_queues: a.queues,
            queue_size: a.queue_size,
            slots_per_queue: slots,
            max_io: a.max_io_kib * 1024,
            timeout: Duration::from_secs(a.timeout.max(1)),
            event_idx: !a.no_event_idx,
            halt_poll: Duration::from_micros(a.halt_poll_us),
            reconnect: None,
        };
        let params = Params {
            user: Ctx {
                uid: a.uid,
                gid: a.gid,
            },
            walk_iters: a.walk_iters,
            open_close_iters: a.open_close_iters,
            create_unlink_iters: a.create_unlink_iters,
            readdir_iters: a.readdir_iters,
            dir_entries: a.dir_entries,
            readdir_size: a.readdir_size,
            randwrite_ops: a.randwrite_ops,
            randwrite_depth: a.randwrite_depth,
            randwrite_file_mib: a.randwrite_file_mib,
            seq_mib: a.seq_mib,
            stride_mib: a.stride_mib,
            seq_depth: a.seq_depth,
            stat_ops: a.stat_ops,
            stat_nodes: a.stat_nodes,
            seed: 0,
        };
        Ok(Config {
            targets,
            baseline,
            rounds: a.rounds,
            workloads,
            json: a.json,
            session,
            params,
        })
    }
}
