//! The validated daemon configuration.
//!
//! [`Config`] is built from the command line ([`Args`]) merged over an optional TOML file
//! (`--config FILE`): a value given on the command line wins over the file, the file wins over
//! the built-in default. Only `Config` travels past `main`. The file's schema is in `file`,
//! virtiofsd's compatibility options in `compat`; this module merges and validates.

mod compat;
mod file;

use std::os::unix::io::RawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::args::{self as cli, Args};
use crate::ceph::{is_secret_option, CephAccess};
use crate::fs::{CacheMode, SnapshotPolicy};
use crate::idmap::{IdMapError, IdMapping, Rule};
pub use crate::logging::{LogConfig, LogLevel};
use crate::sandbox::{SandboxConfig, SandboxError, SeccompMode};
use crate::vhost_user::{MAX_REQUEST_QUEUES, MAX_TAG_LEN};

use compat::{ignored_option_warnings, parse_legacy, Legacy};
pub use file::{
    FileCeph, FileConfig, FileFuse, FileLog, FileMetrics, FileQuarantine, FileSandbox,
    FileVhostUser,
};

/// Default maximum of FUSE worker threads (started on demand, gone when idle), as QEMU's
/// thread pool for blocking I/O.
pub const DEFAULT_THREAD_POOL_SIZE: usize = 64;
/// Whether this daemon was built against a libcephfs with `ceph_ll_nonblocking_readv_writev`
/// (libcephfs 20 and later): what `--nonblocking-io auto` turns into.
pub const NONBLOCKING_BUILT: bool = cfg!(libcephfs_nonblocking);

/// Default request-queue polling window, in microseconds (`--poll-us`).
pub const DEFAULT_POLL_US: u64 = 50;
/// Longest polling window we accept: beyond a millisecond polling only burns CPU.
pub const MAX_POLL_US: u64 = 1000;
/// Default connect/mount timeout.
pub const DEFAULT_MOUNT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `--object-cache-mib`: libcephfs's object cache per daemon. 100 guests take at most
/// 3.2 GiB for it; libcephfs's own default (200 MiB) would take 20 GiB.
pub const DEFAULT_OBJECT_CACHE_MIB: u64 = 32;
/// Largest `--object-cache-mib` (more makes no sense behind a guest's own page cache).
pub const MAX_OBJECT_CACHE_MIB: u64 = 16 * 1024;
/// Default `--inode-cache`: half libcephfs's own `client_cache_size` (16384): with the
/// default `--held-inodes` it met the density targets (docs/benchmarks.md, "Density").
pub const DEFAULT_INODE_CACHE: u64 = 8192;
/// Default bound past which a FUSE request is reported as slow (`--slow-request-secs`).
pub const DEFAULT_SLOW_REQUEST: Duration = Duration::from_secs(30);

/// Where the vhost-user frontend connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// Create a listening socket at this path.
    SocketPath(PathBuf),
    /// Use an inherited listening socket.
    Fd(RawFd),
}

/// How to reach and mount CephFS. Its `Debug` output hides secret option values (see
/// [`CephAccess`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CephConfig {
    /// How to reach the cluster.
    pub access: CephAccess,
    /// Absolute path inside CephFS exported as the guest's root.
    pub root: String,
    /// The device's stable session identity (`--instance-id`): the export's mount and the
    /// quarantine watcher's end the sessions a previous daemon with it left behind (see
    /// [`Self::session_uuid`]). `None`: no reclaim.
    pub instance_id: Option<String>,
}

impl CephConfig {
    /// The uuid of the export's session with `--instance-id` ([`crate::ceph::session_uuid`]);
    /// `None` without.
    pub fn session_uuid(&self) -> Option<String> {
        let id = self.instance_id.as_deref()?;
        Some(crate::ceph::session_uuid(&self.access.cephx_name(), id))
    }
}

/// The validated configuration of one daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub listen: Listen,
    pub tag: Option<String>,
    pub thread_pool_size: usize,
    /// Request queues (the hiprio queue comes on top).
    pub queues: u16,
    /// The most a request queue thread polls for more requests before sleeping (0 = never);
    /// the window adapts below it.
    pub poll_us: u64,
    /// READ and WRITE of O_DIRECT handles through libcephfs's async calls (`--nonblocking-io`,
    /// resolved against what this build has).
    pub nonblocking_io: bool,
    pub keep_serving: bool,
    /// Live migration: what a destination does with entries it cannot resolve.
    pub migration_on_error: crate::migration::OnError,
    /// `--handover`: the unix socket a session is taken over from at start and handed over
    /// on to a successor.
    pub handover: Option<PathBuf>,
    pub cache: CacheMode,
    pub xattr: bool,
    /// `--posix-acl`: POSIX ACLs offered to the guest (FUSE_POSIX_ACL) and enforced by
    /// libcephfs (`client_acl_type=posix_acl`, added to the Ceph options).
    pub posix_acl: bool,
    /// `--readonly`: every request that would change the file system fails with EROFS.
    pub readonly: bool,
    /// `--socket-group`: the group the `--socket-path` socket is given to (read and write for
    /// it, by the umask the daemon starts with).
    pub socket_group: Option<u32>,
    /// Per-guest limits and policy of the filesystem layer.
    pub guest: GuestLimits,
    pub log: LogConfig,
    pub ceph: CephConfig,
    /// Privilege drop and seccomp, applied once the socket is open and CephFS is mounted.
    pub sandbox: SandboxConfig,
    /// uid/gid translation between the guest and CephFS.
    pub idmap: IdMapping,
    /// Warnings about ignored options, to be logged once logging is up.
    pub warnings: Vec<String>,
    /// The metrics endpoint; `None` = off.
    pub metrics: Option<MetricsConfig>,
    /// Subvolume quarantine enforcement.
    pub quarantine: crate::quarantine::QuarantineConfig,
}

/// What one guest may pin and do (`--max-nodes`, `--max-handles`, `--held-inodes`,
/// `--snapshots`, `--allow-device-nodes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestLimits {
    pub max_nodes: usize,
    pub max_handles: usize,
    pub held_inodes: usize,
    pub snapshots: SnapshotPolicy,
    pub allow_device_nodes: bool,
    /// `--request-deadline`; `None` = off.
    pub request_deadline: Option<Duration>,
}

/// Where metrics are served and where libcephfs's admin socket (for MDS health) is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    pub endpoint: crate::metrics::MetricsEndpoint,
    /// libcephfs admin socket path; also set as the `admin_socket` Ceph option.
    pub ceph_admin_socket: Option<PathBuf>,
}

/// Why the configuration was refused. Each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("Cannot read configuration file {path}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Cannot parse configuration file {path}")]
    ParseFile {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("No vhost-user socket: give --socket-path PATH or --fd FD (or socket-path in the config file)")]
    NoSocket,
    #[error("Both a socket path and --fd were given: use only one")]
    SocketAndFd,
    #[error("--fd {0} is not a valid file descriptor number (use 3 or higher)")]
    BadFd(RawFd),
    #[error("--shared-dir/source= is not supported: ceph-virtiofsd exports CephFS, not a host directory; use --ceph-root PATH to pick the exported CephFS path")]
    SharedDir,
    #[error("--uid-map/--gid-map are not supported: they place virtiofsd in a user namespace to share a host directory unprivileged (libvirt session mode); ceph-virtiofsd has no host directory and needs no user namespace. Start it from system libvirt, systemd or as root, and translate ids with --translate-uid/--translate-gid")]
    UserNamespaceMap,
    #[error("Tag {0:?} is invalid: it must be 1 to 36 bytes long")]
    BadTag(String),
    #[error("--queues {0} is out of range: use 1 to 63")]
    BadQueues(u16),
    #[error("--poll-us {0} is out of range: use 0 (no polling) to 1000")]
    BadPoll(u64),
    #[error("--nonblocking-io on needs a daemon built against libcephfs 20 or later (ceph_ll_nonblocking_readv_writev); this one was not: use auto or off")]
    NonblockingUnsupported,
    #[error("Ceph root {0:?} must be an absolute CephFS path such as / or /volumes/vm1")]
    BadCephRoot(String),
    #[error("{0}: ceph-virtiofsd serves no Ceph identity and no CephFS subtree by default. Add {1} (or {2} under [ceph] in the --config file); to serve the whole file system as client.admin, say so: --client-id admin --ceph-root /")]
    NoCephIdentity(&'static str, &'static str, &'static str),
    #[error("Name {0:?} must be 1 to 64 letters, digits or . _ - : @ (e.g. the VM's name)")]
    BadName(String),
    #[error("Ceph option {0:?} must be KEY=VALUE with a non-empty KEY")]
    BadCephOpt(String),
    #[error("Mount timeout must be at least 1 second")]
    BadMountTimeout,
    #[error("--request-deadline {0} is more than a day ({MAX_REQUEST_DEADLINE_SECS} s): give it below the guest's FUSE request timeout, or 0 for off")]
    BadRequestDeadline(u64),
    #[error("{0} must be {1}")]
    BadMemoryOption(&'static str, &'static str),
    #[error("Instance id {0:?} must be 1 to 64 letters, digits or . _ - : @ (e.g. the VM's name)")]
    BadInstanceId(String),
    #[error("Legacy option -o {0}: {1}")]
    BadLegacyOpt(String, String),
    #[error("Invalid --user/--group")]
    Account(#[source] SandboxError),
    #[error("Invalid --socket-group")]
    SocketGroup(#[source] SandboxError),
    #[error("Invalid uid/gid translation")]
    IdMap(#[source] IdMapError),
    #[error("Metrics address {0:?} is invalid: use PORT (bound to 127.0.0.1) or IP:PORT")]
    BadMetricsAddr(String),
    #[error("Both a metrics address and a metrics socket were given: use only one")]
    MetricsAddrAndSocket,
    #[error("Quarantine path {0:?} must be an absolute CephFS path without \"..\", such as /volumes/_nogroup/sv1")]
    BadQuarantinePath(String),
    #[error("Quarantine propagation bound must be at least 40 ms (the default is 1000)")]
    BadQuarantinePropagation,
    #[error("A quarantine keyring was given without a quarantine client id: give --quarantine-client-id (or [quarantine] client-id), the id whose key it holds")]
    QuarantineKeyringWithoutId,
    #[error("Quarantine client id {0:?} is not a Ceph client id: give it without the \"client.\" prefix, such as cvfs-watch")]
    BadQuarantineClientId(String),
    #[error("{0} must be at least 1 (the default is {1})")]
    BadLimit(&'static str, usize),
    #[error("--posix-acl=always cannot be served: {0}; drop --posix-acl or use --posix-acl=auto")]
    PosixAcl(&'static str),
}

// The command line's clap types stop here: `Config` carries the plain types of the layers that
// use them.

impl From<cli::CacheMode> for CacheMode {
    fn from(m: cli::CacheMode) -> Self {
        match m {
            cli::CacheMode::Never => CacheMode::Never,
            cli::CacheMode::Auto => CacheMode::Auto,
            cli::CacheMode::Metadata => CacheMode::Metadata,
            cli::CacheMode::Always => CacheMode::Always,
        }
    }
}

impl From<cli::Snapshots> for SnapshotPolicy {
    fn from(s: cli::Snapshots) -> Self {
        match s {
            cli::Snapshots::ReadOnly => SnapshotPolicy::ReadOnly,
            cli::Snapshots::ReadWrite => SnapshotPolicy::ReadWrite,
            cli::Snapshots::Hidden => SnapshotPolicy::Hidden,
        }
    }
}

impl From<cli::LogLevel> for LogLevel {
    fn from(l: cli::LogLevel) -> Self {
        match l {
            cli::LogLevel::Error => LogLevel::Error,
            cli::LogLevel::Warn => LogLevel::Warn,
            cli::LogLevel::Info => LogLevel::Info,
            cli::LogLevel::Debug => LogLevel::Debug,
            cli::LogLevel::Trace => LogLevel::Trace,
            cli::LogLevel::Off => LogLevel::Off,
        }
    }
}

impl From<cli::SeccompMode> for SeccompMode {
    fn from(m: cli::SeccompMode) -> Self {
        match m {
            cli::SeccompMode::None => SeccompMode::None,
            cli::SeccompMode::Log => SeccompMode::Log,
            cli::SeccompMode::Kill => SeccompMode::Kill,
            cli::SeccompMode::Trap => SeccompMode::Trap,
        }
    }
}

/// Merge and validate the quarantine settings (command line wins; lists are joined).
fn quarantine_config(
    args: &Args,
    file: &FileQuarantine,
) -> Result<crate::quarantine::QuarantineConfig, ConfigError> {
    use crate::args::{RecoveryRole, Switch};
    let norm = |list: Vec<String>| -> Result<Vec<String>, ConfigError> {
        let mut out = Vec::new();
        for p in list {
            let n = crate::quarantine::normalize(&p).ok_or(ConfigError::BadQuarantinePath(p))?;
            if !out.contains(&n) {
                out.push(n);
            }
        }
        Ok(out)
    };
    let ms = args
        .quarantine_propagation_ms
        .or(file.propagation_ms)
        .unwrap_or(1000);
    if ms < 40 {
        return Err(ConfigError::BadQuarantinePropagation);
    }
    let mut paths = file.paths.clone();
    paths.extend(args.quarantine_path.iter().cloned());
    let mut recovery_paths = file.recovery_paths.clone();
    recovery_paths.extend(args.quarantine_recovery_path.iter().cloned());
    let client_id = args
        .quarantine_client_id
        .clone()
        .or_else(|| file.client_id.clone());
    let keyring = args
        .quarantine_keyring
        .clone()
        .or_else(|| file.keyring.clone());
    if let Some(id) = &client_id {
        if id.is_empty()
            || id.starts_with("client.")
            || id.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(ConfigError::BadQuarantineClientId(id.clone()));
        }
    }
    if keyring.is_some() && client_id.is_none() {
        return Err(ConfigError::QuarantineKeyringWithoutId);
    }
    Ok(crate::quarantine::QuarantineConfig {
        enabled: match args.quarantine {
            Some(s) => s == Switch::On,
            None => file.enabled.unwrap_or(true),
        },
        paths: norm(paths)?,
        recovery_global: args.quarantine_recovery.or(file.recovery) == Some(RecoveryRole::Global),
        recovery_paths: norm(recovery_paths)?,
        propagation: Duration::from_millis(ms),
        client_id,
        keyring,
    })
}

fn parse_ceph_opt(opt: &str) -> Result<(String, String), ConfigError> {
    match opt.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(ConfigError::BadCephOpt(opt.to_owned())),
    }
}

fn validate_tag(tag: String) -> Result<String, ConfigError> {
    if tag.is_empty() || tag.len() > MAX_TAG_LEN {
        return Err(ConfigError::BadTag(tag));
    }
    Ok(tag)
}

/// An `--instance-id` or `--name`: it goes into the session uuid or client metadata
/// (`key=value,...`), the logs and `ceph tell mds.* session ls`, so only characters that need
/// no quoting anywhere.
fn check_name(id: String, bad: fn(String) -> ConfigError) -> Result<String, ConfigError> {
    let ok = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:@".contains(&b));
    if ok {
        Ok(id)
    } else {
        Err(bad(id))
    }
}

/// The libcephfs options that bound a daemon's memory (`--object-cache-mib`, `--inode-cache`).
fn memory_options(
    object_cache_mib: u64,
    inode_cache: u64,
) -> Result<Vec<(String, String)>, ConfigError> {
    if object_cache_mib > MAX_OBJECT_CACHE_MIB {
        return Err(ConfigError::BadMemoryOption(
            "--object-cache-mib",
            "between 0 (off) and 16384",
        ));
    }
    if inode_cache == 0 || inode_cache > 1 << 30 {
        return Err(ConfigError::BadMemoryOption(
            "--inode-cache",
            "between 1 and 1073741824",
        ));
    }
    let mut o = vec![("client_cache_size".to_owned(), inode_cache.to_string())];
    if object_cache_mib == 0 {
        o.push(("client_oc".to_owned(), "false".to_owned()));
        return Ok(o);
    }
    let size = object_cache_mib << 20;
    let max_dirty = size / 2;
    // libcephfs flushes from target_dirty (default 8 MiB) on; it must not exceed max_dirty.
    let target_dirty = (8u64 << 20).min(max_dirty / 2);
    o.push(("client_oc_size".to_owned(), size.to_string()));
    o.push(("client_oc_max_dirty".to_owned(), max_dirty.to_string()));
    o.push((
        "client_oc_target_dirty".to_owned(),
        target_dirty.to_string(),
    ));
    o.push((
        "client_readahead_max_bytes".to_owned(),
        readahead_max(size).to_string(),
    ));
    Ok(o)
}

/// libcephfs reads ahead up to 4 object periods (16 MiB with the default layout) unless
/// `client_readahead_max_bytes` says less. In an object cache of 32 MiB, half of it for dirty
/// data, a window that size evicts itself before it is read: 4 KiB reads forwards through a
/// file fell to 59 MiB/s, each third one an OSD round trip; with the window at a sixteenth of
/// the cache (2 MiB of 32) they went at 163 MiB/s (docs/benchmarks.md, "Forward reads").
/// Between 512 KiB and 8 MiB.
fn readahead_max(object_cache: u64) -> u64 {
    (object_cache / 16).clamp(512 << 10, 8 << 20)
}

/// The `admin_socket` Ceph option among `options`, however its key is spelt.
fn admin_socket_option(options: &[(String, String)]) -> Option<&str> {
    let is_asok = |k: &str| k.trim().replace([' ', '-'], "_") == "admin_socket";
    options
        .iter()
        .find(|(k, _)| is_asok(k))
        .map(|(_, v)| v.as_str())
}

impl Config {
    /// The libcephfs admin socket the daemon can ask about its client: the metrics' one, or a
    /// literal `admin_socket` Ceph option set without metrics. `None`: there is none.
    pub fn ceph_admin_socket(&self) -> Option<PathBuf> {
        if let Some(m) = &self.metrics {
            return m.ceph_admin_socket.clone();
        }
        admin_socket_option(&self.ceph.access.options)
            .filter(|v| !v.is_empty() && !v.contains('$'))
            .map(PathBuf::from)
    }
}

/// The metrics endpoint (command line over file) and the libcephfs admin socket it reads: the
/// `admin_socket` Ceph option when the operator set one, else `<socket-path>.ceph.asok` (or
/// `<metrics-socket>.ceph.asok`), which is then added to the Ceph options.
fn metrics_config(
    cli: (Option<String>, Option<PathBuf>),
    file: FileMetrics,
    listen: &Listen,
    options: &mut Vec<(String, String)>,
    warnings: &mut Vec<String>,
) -> Result<Option<MetricsConfig>, ConfigError> {
    use crate::metrics::{parse_metrics_addr, MetricsEndpoint};
    let (addr, socket) = match cli {
        (None, None) => (file.addr, file.socket),
        given => given,
    };
    let endpoint = match (addr, socket) {
        (Some(_), Some(_)) => return Err(ConfigError::MetricsAddrAndSocket),
        (Some(a), None) => {
            MetricsEndpoint::Tcp(parse_metrics_addr(&a).ok_or(ConfigError::BadMetricsAddr(a))?)
        }
        (None, Some(p)) => MetricsEndpoint::Unix(p),
        (None, None) => return Ok(None),
    };
    if let MetricsEndpoint::Tcp(a) = &endpoint {
        if !a.ip().is_loopback() {
            warnings.push(format!(
                "Metrics are served on {a}, reachable from other hosts: prefer a loopback address or --metrics-socket"
            ));
        }
    }
    let set = admin_socket_option(options).map(str::to_owned);
    let with_suffix = |p: &Path| {
        let mut s = p.as_os_str().to_owned();
        s.push(".ceph.asok");
        PathBuf::from(s)
    };
    let ceph_admin_socket = match (set, listen, &endpoint) {
        (Some(v), _, _) if v.contains('$') => {
            warnings.push(format!(
                "admin_socket {v:?} uses $-variables: libcephfs health metrics are off (give a literal path)"
            ));
            None
        }
        (Some(v), _, _) if v.is_empty() => None,
        (Some(v), _, _) => Some(PathBuf::from(v)),
        (None, Listen::SocketPath(p), _) | (None, _, MetricsEndpoint::Unix(p)) => {
            let asok = with_suffix(p);
            options.push((
                "admin_socket".to_owned(),
                asok.to_string_lossy().into_owned(),
            ));
            Some(asok)
        }
        (None, Listen::Fd(_), MetricsEndpoint::Tcp(_)) => {
            warnings.push(
                "No libcephfs admin socket: set --ceph-opt admin_socket=PATH for MDS health metrics"
                    .to_owned(),
            );
            None
        }
    };
    Ok(Some(MetricsConfig {
        endpoint,
        ceph_admin_socket,
    }))
}

impl TryFrom<Args> for Config {
    type Error = ConfigError;

    fn try_from(args: Args) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        Config::merge(args, file)
    }
}

impl Config {
    /// Merge command-line values over file values over defaults, and validate the result:
    /// one function per section of the file, in the order errors are reported.
    pub fn merge(args: Args, file: FileConfig) -> Result<Self, ConfigError> {
        if args.shared_dir.is_some() {
            return Err(ConfigError::SharedDir);
        }
        if !args.uid_map.is_empty() || !args.gid_map.is_empty() {
            return Err(ConfigError::UserNamespaceMap);
        }
        let mut warnings = Vec::new();
        ignored_option_warnings(&args, &mut warnings);
        let legacy = parse_legacy(&args.legacy_opts, &mut warnings)?;
        let quarantine = quarantine_config(&args, &file.quarantine)?;
        let transport = transport_config(&args, &legacy, file.vhost_user, &mut warnings)?;
        let file_posix_acl = file.fuse.posix_acl;
        let fuse = fuse_config(&args, &legacy, file.fuse)?;
        let log = log_config(&args, file.log);
        let mut ceph = ceph_config(&args, file.ceph, &mut warnings)?;
        let (sandbox, idmap) = sandbox_config(&args, file.sandbox)?;
        let posix_acl = posix_acl_config(
            args.posix_acl,
            file_posix_acl,
            fuse.xattr,
            &idmap,
            &mut ceph.access.options,
            &mut warnings,
        )?;
        let metrics = metrics_config(
            (args.metrics_addr, args.metrics_socket),
            file.metrics,
            &transport.listen,
            &mut ceph.access.options,
            &mut warnings,
        )?;
        Ok(Config {
            listen: transport.listen,
            tag: transport.tag,
            thread_pool_size: transport.thread_pool_size,
            queues: transport.queues,
            poll_us: transport.poll_us,
            nonblocking_io: transport.nonblocking_io,
            keep_serving: transport.keep_serving,
            handover: transport.handover,
            migration_on_error: transport.migration_on_error,
            socket_group: transport.socket_group,
            cache: fuse.cache,
            xattr: fuse.xattr,
            posix_acl,
            readonly: fuse.readonly,
            guest: fuse.guest,
            log,
            ceph,
            sandbox,
            idmap,
            warnings,
            metrics,
            quarantine,
        })
    }
}

/// `[vhost-user]`: how the frontend reaches the daemon and how its queues are served.
struct TransportConfig {
    listen: Listen,
    tag: Option<String>,
    queues: u16,
    poll_us: u64,
    nonblocking_io: bool,
    thread_pool_size: usize,
    keep_serving: bool,
    handover: Option<PathBuf>,
    migration_on_error: crate::migration::OnError,
    socket_group: Option<u32>,
}

fn transport_config(
    args: &Args,
    legacy: &Legacy,
    file: FileVhostUser,
    warnings: &mut Vec<String>,
) -> Result<TransportConfig, ConfigError> {
    let listen = match (args.socket_path.clone(), args.fd) {
        (Some(_), Some(_)) => return Err(ConfigError::SocketAndFd),
        (Some(path), None) => Listen::SocketPath(path),
        (None, Some(fd)) if fd < 3 => return Err(ConfigError::BadFd(fd)),
        (None, Some(fd)) => Listen::Fd(fd),
        (None, None) => Listen::SocketPath(file.socket_path.ok_or(ConfigError::NoSocket)?),
    };
    let tag = args
        .tag
        .clone()
        .or(file.tag)
        .map(validate_tag)
        .transpose()?;
    let queues = args.queues.or(file.queues).unwrap_or(1);
    if queues == 0 || queues > MAX_REQUEST_QUEUES {
        return Err(ConfigError::BadQueues(queues));
    }
    let poll_us = args.poll_us.or(file.poll_us).unwrap_or(DEFAULT_POLL_US);
    if poll_us > MAX_POLL_US {
        return Err(ConfigError::BadPoll(poll_us));
    }
    let nonblocking_io = match args
        .nonblocking_io
        .or(file.nonblocking_io)
        .unwrap_or(crate::args::NonblockingIo::Auto)
    {
        crate::args::NonblockingIo::Auto => NONBLOCKING_BUILT,
        crate::args::NonblockingIo::On if NONBLOCKING_BUILT => true,
        crate::args::NonblockingIo::On => return Err(ConfigError::NonblockingUnsupported),
        crate::args::NonblockingIo::Off => false,
    };
    let thread_pool_size = args
        .thread_pool_size
        .or(legacy.thread_pool_size)
        .or(file.thread_pool_size)
        .unwrap_or(DEFAULT_THREAD_POOL_SIZE);
    let migration_on_error = match args.migration_on_error.or(file.migration_on_error) {
        Some(crate::args::MigrationOnError::Abort) => crate::migration::OnError::Abort,
        Some(crate::args::MigrationOnError::GuestError) | None => {
            crate::migration::OnError::GuestError
        }
    };
    let socket_group = args
        .socket_group
        .clone()
        .or(file.socket_group)
        .map(|g| crate::sandbox::resolve_group(&g).map_err(ConfigError::SocketGroup))
        .transpose()?;
    if socket_group.is_some() && matches!(listen, Listen::Fd(_)) {
        warnings.push(
            "Ignoring --socket-group: the socket was inherited (--fd), its creator sets its group"
                .to_owned(),
        );
    }
    Ok(TransportConfig {
        listen,
        tag,
        queues,
        poll_us,
        nonblocking_io,
        thread_pool_size,
        keep_serving: args.keep_serving || file.keep_serving.unwrap_or(false),
        handover: args.handover.clone().or(file.handover),
        migration_on_error,
        socket_group,
    })
}

/// `[fuse]`: what the guest is offered, and how much of the daemon it may hold.
struct FuseConfig {
    cache: CacheMode,
    xattr: bool,
    readonly: bool,
    guest: GuestLimits,
}

/// The longest `--request-deadline`: a day, far above any guest's request timeout. A bound
/// near `u64::MAX` seconds would overflow the deadline's `Instant` on the first request.
pub const MAX_REQUEST_DEADLINE_SECS: u64 = 86_400;

fn fuse_config(args: &Args, legacy: &Legacy, file: FileFuse) -> Result<FuseConfig, ConfigError> {
    let request_deadline = match args.request_deadline.or(file.request_deadline) {
        Some(s) if s > MAX_REQUEST_DEADLINE_SECS => return Err(ConfigError::BadRequestDeadline(s)),
        s => s.filter(|&s| s > 0).map(Duration::from_secs),
    };
    let cli_xattr = if args.no_xattr {
        Some(false)
    } else if args.xattr {
        Some(true)
    } else {
        legacy.xattr
    };
    let limit = |cli: Option<usize>, file: Option<usize>, name, default| match cli
        .or(file)
        .unwrap_or(default)
    {
        0 => Err(ConfigError::BadLimit(name, default)),
        n => Ok(n),
    };
    use crate::fs::limits::{DEFAULT_HELD_INODES, DEFAULT_MAX_HANDLES, DEFAULT_MAX_NODES};
    let guest = GuestLimits {
        max_nodes: limit(
            args.max_nodes,
            file.max_nodes,
            "--max-nodes",
            DEFAULT_MAX_NODES,
        )?,
        max_handles: limit(
            args.max_handles,
            file.max_handles,
            "--max-handles",
            DEFAULT_MAX_HANDLES,
        )?,
        held_inodes: limit(
            args.held_inodes,
            file.held_inodes,
            "--held-inodes",
            DEFAULT_HELD_INODES,
        )?,
        snapshots: args
            .snapshots
            .or(file.snapshots)
            .unwrap_or(cli::Snapshots::ReadOnly)
            .into(),
        allow_device_nodes: args.allow_device_nodes || file.allow_device_nodes.unwrap_or(false),
        request_deadline,
    };
    Ok(FuseConfig {
        cache: args
            .cache
            .or(legacy.cache)
            .or(file.cache)
            .unwrap_or(cli::CacheMode::Auto)
            .into(),
        xattr: cli_xattr.or(file.xattr).unwrap_or(true),
        readonly: args.readonly || file.readonly.unwrap_or(false),
        guest,
    })
}

/// `--posix-acl[=WHEN]` (`posix-acl` in `[fuse]`: true is `always`). `always` and `auto` turn
/// ACLs on, `never` (the default, as with virtiofsd) off. They need xattrs, and ACL entries
/// name ids that the id mapping does not translate: with xattrs off or uid/gid rules, `always`
/// is refused and `auto` stays off with a warning. On, libcephfs enforces them: its
/// `client_acl_type` is set to `posix_acl` unless the operator set it.
fn posix_acl_config(
    cli: Option<cli::Support>,
    file: Option<bool>,
    xattr: bool,
    idmap: &IdMapping,
    options: &mut Vec<(String, String)>,
    warnings: &mut Vec<String>,
) -> Result<bool, ConfigError> {
    let when = cli.or(file.map(|on| {
        if on {
            cli::Support::Always
        } else {
            cli::Support::Never
        }
    }));
    let Some(when @ (cli::Support::Auto | cli::Support::Always)) = when else {
        return Ok(false);
    };
    let obstacle = if !xattr {
        Some("xattrs are off (--no-xattr)")
    } else if !idmap.is_identity() {
        Some("uid/gid translation rules do not translate the ids inside ACLs")
    } else {
        None
    };
    if let Some(why) = obstacle {
        if when == cli::Support::Always {
            return Err(ConfigError::PosixAcl(why));
        }
        warnings.push(format!("--posix-acl=auto: POSIX ACLs stay off: {why}"));
        return Ok(false);
    }
    if !options.iter().any(|(k, _)| k == "client_acl_type") {
        options.push(("client_acl_type".to_owned(), "posix_acl".to_owned()));
    }
    Ok(true)
}

/// `[log]`.
fn log_config(args: &Args, file: FileLog) -> LogConfig {
    let cli_level = args
        .log_level
        .or(args.debug.then_some(cli::LogLevel::Debug));
    LogConfig {
        level: cli_level
            .or(file.level)
            .unwrap_or(cli::LogLevel::Info)
            .into(),
        syslog: args.syslog || file.syslog.unwrap_or(false),
        slow_request: args
            .slow_request_secs
            .or(file.slow_request_secs)
            .map_or(DEFAULT_SLOW_REQUEST, Duration::from_secs),
    }
}

/// `[ceph]`: who the daemon is to the cluster, what it exports, and libcephfs's options.
fn ceph_config(
    args: &Args,
    file: FileCeph,
    warnings: &mut Vec<String>,
) -> Result<CephConfig, ConfigError> {
    let (client_id, root) = identity_and_root(
        args.cluster.client_id.clone().or(file.client_id),
        args.ceph_root.clone().or(file.root),
    )?;
    // Canonical ("/a/b"): libcephfs refuses "//" and "/./" in a mount path, and the
    // quarantine decides the export's domain on the path's components.
    let root = crate::quarantine::normalize(&root).ok_or(ConfigError::BadCephRoot(root))?;
    let options = ceph_options(
        args,
        file.options,
        file.object_cache_mib,
        file.inode_cache,
        warnings,
    )?;
    let mount_timeout = args
        .mount_timeout
        .or(file.mount_timeout)
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_MOUNT_TIMEOUT);
    if mount_timeout.is_zero() {
        return Err(ConfigError::BadMountTimeout);
    }
    let instance_id = args
        .instance_id
        .clone()
        .or(file.instance_id)
        .map(|id| check_name(id, ConfigError::BadInstanceId))
        .transpose()?;
    let name = args
        .name
        .clone()
        .or(file.name)
        .map(|n| check_name(n, ConfigError::BadName))
        .transpose()?;
    Ok(CephConfig {
        access: CephAccess {
            conf: args.cluster.ceph_conf.clone().or(file.conf),
            client_id: Some(client_id),
            keyring: args.cluster.keyring.clone().or(file.keyring),
            fs_name: args.cluster.fs_name.clone().or(file.fs_name),
            options,
            mount_timeout,
            // Set by the daemon on the export's and the watcher's own copies only.
            session_uuid: None,
            name,
        },
        root,
        instance_id,
    })
}

/// No implicit identity or root: client.admin and "/" serve only when named.
fn identity_and_root(
    client_id: Option<String>,
    root: Option<String>,
) -> Result<(String, String), ConfigError> {
    match (client_id, root) {
        (Some(id), Some(root)) => Ok((id, root)),
        (None, None) => Err(ConfigError::NoCephIdentity(
            "No Ceph client id and no export root",
            "--client-id ID --ceph-root PATH",
            "client-id and root",
        )),
        (None, Some(_)) => Err(ConfigError::NoCephIdentity(
            "No Ceph client id",
            "--client-id ID",
            "client-id",
        )),
        (Some(_), None) => Err(ConfigError::NoCephIdentity(
            "No export root",
            "--ceph-root PATH (e.g. the output of `ceph fs subvolume getpath`)",
            "root",
        )),
    }
}

/// libcephfs's options: the memory bounds first, then the file's (sorted by key), then the
/// command line's, each replacing an earlier one of the same key.
fn ceph_options(
    args: &Args,
    file_options: std::collections::BTreeMap<String, String>,
    file_object_cache_mib: Option<u64>,
    file_inode_cache: Option<u64>,
    warnings: &mut Vec<String>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut explicit: Vec<(String, String)> = file_options.into_iter().collect();
    for opt in &args.ceph_opt {
        let (key, value) = parse_ceph_opt(opt)?;
        if is_secret_option(&key) {
            warnings.push(format!(
                "--ceph-opt {key}=... puts a secret on the command line, where local users \
                 can read it (ps, /proc): use a keyring file (--keyring) instead"
            ));
        }
        explicit.retain(|(k, _)| *k != key);
        explicit.push((key, value));
    }
    let mut options = memory_options(
        args.object_cache_mib
            .or(file_object_cache_mib)
            .unwrap_or(DEFAULT_OBJECT_CACHE_MIB),
        args.inode_cache
            .or(file_inode_cache)
            .unwrap_or(DEFAULT_INODE_CACHE),
    )?;
    options.retain(|(k, _)| !explicit.iter().any(|(e, _)| e == k));
    options.extend(explicit);
    Ok(options)
}

/// `[sandbox]`: the account the daemon switches to, its seccomp filter and the id mapping.
fn sandbox_config(
    args: &Args,
    file: FileSandbox,
) -> Result<(SandboxConfig, IdMapping), ConfigError> {
    let account = match (
        args.user.clone().or(file.user),
        args.group.clone().or(file.group),
    ) {
        (Some(u), g) => {
            Some(crate::sandbox::resolve_account(&u, g.as_deref()).map_err(ConfigError::Account)?)
        }
        (None, Some(_)) => return Err(ConfigError::Account(SandboxError::GroupWithoutUser)),
        // Started as root (libvirt, Kata): the package's user, if it exists.
        (None, None) => crate::sandbox::package_account().map_err(ConfigError::Account)?,
    };
    let sandbox = SandboxConfig {
        user: account,
        seccomp: args
            .seccomp
            .or(file.seccomp)
            .unwrap_or(cli::SeccompMode::Kill)
            .into(),
    };
    // Command-line rules replace the file's rules of the same kind (uid or gid).
    let rules = |cli: &[String], file: Vec<String>| {
        let chosen = if cli.is_empty() { file } else { cli.to_vec() };
        chosen
            .iter()
            .map(|r| r.parse::<Rule>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(ConfigError::IdMap)
    };
    let uid_rules = rules(&args.translate_uid, file.translate_uid)?;
    let gid_rules = rules(&args.translate_gid, file.translate_gid)?;
    let idmap = IdMapping::new(&uid_rules, &gid_rules).map_err(ConfigError::IdMap)?;
    Ok((sandbox, idmap))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idmap::{GuestGid, GuestUid, HostGid, HostUid};
    use clap::Parser;

    /// The configuration of `cli`, with a client id and an export root unless it names them
    /// (both are required: see [`no_implicit_identity_or_root`]).
    fn parse(cli: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec!["ceph-virtiofsd"];
        if !cli.iter().any(|a| a.starts_with("--client-id")) {
            argv.push("--client-id=t");
        }
        if !cli.iter().any(|a| a.starts_with("--ceph-root")) {
            argv.push("--ceph-root=/t");
        }
        argv.extend_from_slice(cli);
        parse_exact(&argv)
    }

    fn parse_exact(argv: &[&str]) -> Result<Config, ConfigError> {
        let args = Args::try_parse_from(argv).unwrap_or_else(|e| panic!("clap: {e}"));
        Config::try_from(args)
    }

    /// `file` with the required client id and export root, where it has none.
    fn ident(mut file: FileConfig) -> FileConfig {
        file.ceph.client_id.get_or_insert_with(|| "t".to_owned());
        file.ceph.root.get_or_insert_with(|| "/t".to_owned());
        file
    }

    /// client.admin and "/" serve only when named; a missing client id or root stops the
    /// start with a message naming what to add.
    #[test]
    fn no_implicit_identity_or_root() {
        for (cli, what) in [
            (&["x", "--fd=3"][..], "--client-id ID --ceph-root PATH"),
            (&["x", "--fd=3", "--ceph-root=/v"][..], "--client-id ID"),
            (&["x", "--fd=3", "--client-id=vm1"][..], "--ceph-root PATH"),
        ] {
            match parse_exact(cli) {
                Err(e @ ConfigError::NoCephIdentity(..)) => {
                    let msg = e.to_string();
                    assert!(msg.contains(what), "{cli:?}: {msg}");
                    assert!(msg.contains("--client-id admin --ceph-root /"), "{msg}");
                }
                other => panic!("{cli:?}: {other:?}"),
            }
        }
        // Named, they serve.
        let c = parse_exact(&["x", "--fd=3", "--client-id=admin", "--ceph-root=/"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.ceph.access.client_id.as_deref(), Some("admin"));
        assert_eq!(c.ceph.root, "/");
        // From the file, or half from each.
        let file: FileConfig = toml::from_str("[ceph]\nclient-id = \"vm1\"\nroot = \"/v\"\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x", "--fd=3"]).unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (c.ceph.access.client_id.as_deref(), c.ceph.root.as_str()),
            (Some("vm1"), "/v")
        );
        let file: FileConfig =
            toml::from_str("[ceph]\nroot = \"/v\"\n").unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x", "--fd=3", "--client-id=vm2"])
            .unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.ceph.access.client_id.as_deref(), Some("vm2"));
        let file: FileConfig =
            toml::from_str("[ceph]\nroot = \"/v\"\n").unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x", "--fd=3"]).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            Config::merge(args, file),
            Err(ConfigError::NoCephIdentity(..))
        ));
    }

    #[test]
    fn instance_id_gives_the_export_a_session_uuid() {
        let c = parse(&["--fd=3"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.ceph.instance_id, None);
        assert_eq!(c.ceph.session_uuid(), None, "off by default");
        let c = parse(&["--fd=3", "--client-id=vm1", "--instance-id=host1:vm-1.fs0"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.ceph.session_uuid().as_deref(),
            Some("ceph-virtiofsd/client.vm1/host1:vm-1.fs0")
        );
        // Only the export's own mount carries it (the config's access is shared).
        assert_eq!(c.ceph.access.session_uuid, None);
        let c = parse(&["--fd=3", "--client-id=admin", "--instance-id=vm1"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.ceph.session_uuid().as_deref(),
            Some("ceph-virtiofsd/client.admin/vm1")
        );
        // From the file; the command line wins.
        let file: FileConfig = toml::from_str("[ceph]\ninstance-id = \"from-file\"\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x", "--fd=3"]).unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, ident(file)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.ceph.instance_id.as_deref(), Some("from-file"));
        let file: FileConfig = toml::from_str("[ceph]\ninstance-id = \"from-file\"\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x", "--fd=3", "--instance-id=cli"])
            .unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, ident(file)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.ceph.instance_id.as_deref(), Some("cli"));
    }

    #[test]
    fn hostile_instance_id_is_refused_unless_plain() {
        let long = "a".repeat(65);
        for bad in ["", "vm 1", "a/b", "vm1\n", "x=y", "é", long.as_str()] {
            let arg = format!("--instance-id={bad}");
            assert!(
                matches!(parse(&["--fd=3", &arg]), Err(ConfigError::BadInstanceId(_))),
                "{bad:?}"
            );
        }
        assert!(parse(&["--fd=3", &format!("--instance-id={}", "a".repeat(64))]).is_ok());
    }

    #[test]
    fn hostile_ceph_root_is_canonical() {
        // A guest cannot send this, but a provider's tooling can: "/volumes//_nogroup/sv1/"
        // must mount and be quarantined as /volumes/_nogroup/sv1.
        let c = parse(&["--fd", "3", "--ceph-root", "/volumes//_nogroup/./sv1/"]).unwrap();
        assert_eq!(c.ceph.root, "/volumes/_nogroup/sv1");
    }

    #[test]
    fn hostile_guest_limits_merge_and_validate() {
        let c = parse(&["--socket-path", "/tmp/s"]).unwrap();
        assert_eq!(
            c.guest,
            GuestLimits {
                max_nodes: crate::fs::limits::DEFAULT_MAX_NODES,
                max_handles: crate::fs::limits::DEFAULT_MAX_HANDLES,
                held_inodes: crate::fs::limits::DEFAULT_HELD_INODES,
                snapshots: SnapshotPolicy::ReadOnly,
                allow_device_nodes: false,
                request_deadline: None,
            }
        );
        let file: FileConfig = toml::from_str(
            "[fuse]\nmax-nodes = 10\nmax-handles = 20\nheld-inodes = 40\nsnapshots = \"hidden\"\nallow-device-nodes = true\nrequest-deadline = 8\n",
        )
        .unwrap();
        let args = Args::try_parse_from([
            "ceph-virtiofsd",
            "--socket-path",
            "/tmp/s",
            "--max-nodes",
            "30",
            "--held-inodes",
            "50",
            "--snapshots",
            "read-write",
        ])
        .unwrap();
        let c = Config::merge(args, ident(file)).unwrap();
        assert_eq!(
            c.guest,
            GuestLimits {
                max_nodes: 30,
                max_handles: 20,
                held_inodes: 50,
                snapshots: SnapshotPolicy::ReadWrite,
                allow_device_nodes: true,
                request_deadline: Some(Duration::from_secs(8)),
            }
        );
        for bad in [
            ["--max-nodes", "0"],
            ["--max-handles", "0"],
            ["--held-inodes", "0"],
        ] {
            let mut argv = vec!["--socket-path", "/tmp/s"];
            argv.extend(bad);
            assert!(matches!(parse(&argv), Err(ConfigError::BadLimit(..))));
        }
    }

    #[test]
    fn migration_on_error_from_the_command_line_or_the_file() {
        use crate::migration::OnError;
        let c = parse(&["--socket-path", "/tmp/s"]).unwrap();
        assert_eq!(c.migration_on_error, OnError::GuestError);
        let c = parse(&["--socket-path", "/tmp/s", "--migration-on-error", "abort"]).unwrap();
        assert_eq!(c.migration_on_error, OnError::Abort);
        let file: FileConfig =
            toml::from_str("[vhost-user]\nmigration-on-error = \"abort\"\n").unwrap();
        let args = Args::try_parse_from(["ceph-virtiofsd", "--socket-path", "/tmp/s"]).unwrap();
        assert_eq!(
            Config::merge(args, ident(file)).unwrap().migration_on_error,
            OnError::Abort
        );
        assert!(Args::try_parse_from([
            "ceph-virtiofsd",
            "--socket-path",
            "/tmp/s",
            "--migration-on-error",
            "retry"
        ])
        .is_err());
    }

    #[test]
    fn defaults() {
        let c = parse(&["--socket-path", "/tmp/s"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.listen, Listen::SocketPath("/tmp/s".into()));
        assert_eq!(c.queues, 1);
        assert_eq!(c.thread_pool_size, DEFAULT_THREAD_POOL_SIZE);
        assert_eq!(c.poll_us, DEFAULT_POLL_US);
        assert_eq!(c.cache, CacheMode::Auto);
        assert!(c.xattr);
        assert!(!c.readonly);
        assert_eq!(c.socket_group, None);
        assert_eq!(c.ceph.access.name, None);
        assert_eq!(c.ceph.access.mount_timeout, DEFAULT_MOUNT_TIMEOUT);
        assert_eq!(c.log.slow_request, DEFAULT_SLOW_REQUEST);
        assert!(c.warnings.is_empty());
        // Started as root (libvirt, Kata), the package's user when it exists.
        assert_eq!(
            c.sandbox.user,
            crate::sandbox::package_account().unwrap_or_else(|e| panic!("{e}"))
        );
    }

    /// `--posix-acl`: off by default and with never; on with auto and always, unless xattrs
    /// are off or uid rules translate ids (always refused then, auto off with a warning); an
    /// operator's own client_acl_type is kept.
    #[test]
    fn posix_acl_needs_xattrs_and_untranslated_ids() {
        let c = parse(&["--fd=3"]).unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.posix_acl);
        assert!(!c
            .ceph
            .access
            .options
            .iter()
            .any(|(k, _)| k == "client_acl_type"));
        let c = parse(&["--fd=3", "--posix-acl=never"]).unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.posix_acl);
        let c = parse(&["--fd=3", "--posix-acl=always"]).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.posix_acl);
        assert!(matches!(
            parse(&["--fd=3", "--posix-acl=always", "--no-xattr"]),
            Err(ConfigError::PosixAcl(_))
        ));
        let c =
            parse(&["--fd=3", "--posix-acl=auto", "--no-xattr"]).unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.posix_acl);
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        let c = parse(&["--fd=3", "--posix-acl", "--translate-uid=map:1000:2000:1"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.posix_acl, "auto with translated ids");
        assert!(matches!(
            parse(&[
                "--fd=3",
                "--posix-acl=always",
                "--translate-uid=map:1000:2000:1"
            ]),
            Err(ConfigError::PosixAcl(_))
        ));
        let c = parse(&[
            "--fd=3",
            "--posix-acl",
            "--ceph-opt=client_acl_type=posix_acl",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let acl_types = c
            .ceph
            .access
            .options
            .iter()
            .filter(|(k, _)| k == "client_acl_type");
        assert_eq!(acl_types.count(), 1);
    }

    /// `--name`: the guest's name for the session's client metadata, from the command line or
    /// the file; checked like an instance id (it lands in `key=value,...`).
    #[test]
    fn name_for_the_client_metadata() {
        let c = parse(&["--fd=3", "--name=vm-1.a:b@c"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.ceph.access.name.as_deref(), Some("vm-1.a:b@c"));
        for bad in ["", "a,b", "a=b", "a b", "é"] {
            assert!(
                matches!(
                    parse(&["--fd=3", &format!("--name={bad}")]),
                    Err(ConfigError::BadName(_))
                ),
                "{bad:?}"
            );
        }
        let file: FileConfig =
            toml::from_str("[ceph]\nname = \"from-file\"\n").unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x", "--fd=3"]).unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, ident(file)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.ceph.access.name.as_deref(), Some("from-file"));
    }

    /// virtiofsd 1.14's forms that mean something here: --readonly, --socket-group,
    /// --seccomp trap; the migration flags are accepted; --uid-map/--gid-map refused with a
    /// pointer to --translate-uid.
    #[test]
    fn virtiofsd_1_14_forms() {
        let c = parse(&[
            "--socket=/tmp/s",
            "--readonly",
            "--socket-group=0",
            "--seccomp=trap",
            "--migration-mode=find-paths",
            "--migration-verify-handles",
            "--migration-confirm-paths",
            "--no-announce-submounts",
            "--posix-acl=never",
            "--security-label=never",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.listen, Listen::SocketPath("/tmp/s".into()));
        assert!(c.readonly);
        assert_eq!(c.socket_group, Some(0));
        assert_eq!(c.sandbox.seccomp, SeccompMode::Trap);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let c = parse(&[
            "--fd=3",
            "--posix-acl",
            "--security-label=always",
            "--socket-group=root",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        // --security-label=always is ignored; --posix-acl is served (and sets libcephfs's ACLs).
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        assert!(c.posix_acl);
        assert!(c
            .ceph
            .access
            .options
            .contains(&("client_acl_type".to_owned(), "posix_acl".to_owned())));
        assert!(matches!(
            parse(&["--fd=3", "--socket-group=no-such-group-xyz"]),
            Err(ConfigError::SocketGroup(_))
        ));
        for map in ["--uid-map=:0:100000:65536:", "--gid-map=:0:100000:65536:"] {
            match parse(&["--fd=3", map]) {
                Err(e @ ConfigError::UserNamespaceMap) => {
                    assert!(e.to_string().contains("--translate-uid"), "{e}")
                }
                other => panic!("{map}: {other:?}"),
            }
        }
        let file: FileConfig = toml::from_str(
            "[vhost-user]\nsocket-path = \"/s\"\nsocket-group = \"0\"\n[fuse]\nreadonly = true\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x"]).unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, ident(file)).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.readonly);
        assert_eq!(c.socket_group, Some(0));
    }

    #[test]
    fn slow_request_watchdog_options() {
        let c = parse(&["--fd=3", "--slow-request-secs", "0"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.log.slow_request,
            Duration::ZERO,
            "0 turns the watchdog off"
        );
        let file: FileConfig =
            toml::from_str("[vhost-user]\nsocket-path = \"/s\"\n[log]\nslow-request-secs = 5\n")
                .unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x"]).unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, ident(file)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.log.slow_request, Duration::from_secs(5));
        assert_eq!(c.ceph_admin_socket(), None, "no metrics, no admin socket");
        let file: FileConfig =
            toml::from_str("[log]\nslow-request-secs = 5\n").unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x", "--fd=3", "--slow-request-secs=1"])
            .unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, ident(file)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.log.slow_request,
            Duration::from_secs(1),
            "the command line wins"
        );

        // The watchdog finds libcephfs's admin socket with or without metrics.
        let c = parse(&["--socket-path=/r/vm.sock", "--metrics-addr=9"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.ceph_admin_socket(), Some("/r/vm.sock.ceph.asok".into()));
        let c = parse(&["--fd=3", "--ceph-opt=admin-socket=/r/a.asok"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.ceph_admin_socket(), Some("/r/a.asok".into()));
        let c = parse(&["--fd=3", "--ceph-opt=admin_socket=/r/$pid.asok"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.ceph_admin_socket(), None);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(parse(&[]), Err(ConfigError::NoSocket)));
        assert!(matches!(parse(&["--fd", "1"]), Err(ConfigError::BadFd(1))));
        assert!(matches!(
            parse(&["--fd", "3", "--shared-dir", "/srv"]),
            Err(ConfigError::SharedDir)
        ));
        assert!(matches!(
            parse(&["--fd", "3", "-o", "source=/srv,cache=auto"]),
            Err(ConfigError::SharedDir)
        ));
        assert!(matches!(
            parse(&["--fd", "3", "--tag", &"x".repeat(37)]),
            Err(ConfigError::BadTag(_))
        ));
        assert!(matches!(
            parse(&["--fd", "3", "--queues", "0"]),
            Err(ConfigError::BadQueues(0))
        ));
        assert!(matches!(
            parse(&["--fd", "3", "--poll-us", "1001"]),
            Err(ConfigError::BadPoll(1001))
        ));
        assert!(matches!(
            parse(&["--fd", "3", "--ceph-root", "volumes"]),
            Err(ConfigError::BadCephRoot(_))
        ));
        assert!(matches!(
            parse(&["--fd", "3", "--ceph-root", "/a/../b"]),
            Err(ConfigError::BadCephRoot(_))
        ));
        assert!(matches!(
            parse(&["--fd", "3", "--ceph-opt", "novalue"]),
            Err(ConfigError::BadCephOpt(_))
        ));
        assert!(matches!(
            parse(&["--fd", "3", "--mount-timeout", "0"]),
            Err(ConfigError::BadMountTimeout)
        ));
        // Past a day the deadline's Instant could overflow: refused, never a panic later.
        for bad in ["86401", "18446744073709551615"] {
            assert!(
                matches!(
                    parse(&["--fd", "3", "--request-deadline", bad]),
                    Err(ConfigError::BadRequestDeadline(_))
                ),
                "{bad}"
            );
        }
        let c =
            parse(&["--fd", "3", "--request-deadline", "86400"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.guest.request_deadline, Some(Duration::from_secs(86_400)));
    }

    #[test]
    fn virtiofsd_compat_options() {
        let c = parse(&[
            "--fd=3",
            "--sandbox",
            "none",
            "--seccomp=none",
            "--announce-submounts",
            "--inode-file-handles",
            "-f",
            "-o",
            "cache=always,no_xattr,thread_pool_size=2,no_posix_lock",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.listen, Listen::Fd(3));
        assert_eq!(c.cache, CacheMode::Always);
        assert!(!c.xattr);
        assert_eq!(c.thread_pool_size, 2);
        assert_eq!(c.sandbox.seccomp, SeccompMode::None);
        // sandbox, announce-submounts, inode-file-handles, -f, no_posix_lock
        assert_eq!(c.warnings.len(), 5, "{:?}", c.warnings);
    }

    #[test]
    fn memory_options_defaults_overrides_and_bounds() {
        let opt = |c: &Config, key: &str| {
            c.ceph
                .access
                .options
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let c = parse(&["--fd=3"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(opt(&c, "client_oc_size").as_deref(), Some("33554432"));
        assert_eq!(opt(&c, "client_oc_max_dirty").as_deref(), Some("16777216"));
        assert_eq!(
            opt(&c, "client_oc_target_dirty").as_deref(),
            Some("8388608")
        );
        assert_eq!(opt(&c, "client_cache_size").as_deref(), Some("8192"));
        assert_eq!(opt(&c, "client_oc"), None);
        assert_eq!(
            opt(&c, "client_readahead_max_bytes").as_deref(),
            Some("2097152"),
            "readahead fits the object cache"
        );
        let c = parse(&["--fd=3", "--ceph-opt", "client_readahead_max_bytes=0"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            opt(&c, "client_readahead_max_bytes").as_deref(),
            Some("0"),
            "the operator's own wins"
        );
        assert_eq!(readahead_max(1 << 20), 512 << 10);
        assert_eq!(readahead_max(1 << 30), 8 << 20);

        let c = parse(&["--fd=3", "--object-cache-mib", "8", "--inode-cache", "4096"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(opt(&c, "client_oc_size").as_deref(), Some("8388608"));
        assert_eq!(opt(&c, "client_oc_max_dirty").as_deref(), Some("4194304"));
        // target_dirty stays below max_dirty, as libcephfs needs.
        assert_eq!(
            opt(&c, "client_oc_target_dirty").as_deref(),
            Some("2097152")
        );
        assert_eq!(opt(&c, "client_cache_size").as_deref(), Some("4096"));

        let c = parse(&["--fd=3", "--object-cache-mib=0"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(opt(&c, "client_oc").as_deref(), Some("false"));
        assert_eq!(opt(&c, "client_oc_size"), None);

        // --ceph-opt of the same key wins, and the key appears once.
        let c = parse(&["--fd=3", "--ceph-opt", "client_oc_size=1000000"])
            .unwrap_or_else(|e| panic!("{e}"));
        let n = c
            .ceph
            .access
            .options
            .iter()
            .filter(|(k, _)| k == "client_oc_size")
            .count();
        assert_eq!(
            (opt(&c, "client_oc_size").as_deref(), n),
            (Some("1000000"), 1)
        );

        let file: FileConfig = toml::from_str("[ceph]\nobject-cache-mib = 64\ninode-cache = 100\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x", "--fd=3", "--inode-cache", "200"])
            .unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, ident(file)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(opt(&c, "client_oc_size").as_deref(), Some("67108864"));
        assert_eq!(opt(&c, "client_cache_size").as_deref(), Some("200"));

        for bad in [
            ["--object-cache-mib", "16385"],
            ["--inode-cache", "0"],
            ["--inode-cache", "1073741825"],
        ] {
            assert!(
                matches!(
                    parse(&["--fd=3", bad[0], bad[1]]),
                    Err(ConfigError::BadMemoryOption(..))
                ),
                "{bad:?}"
            );
        }
    }

    /// `--nonblocking-io`: auto follows the build, on is refused by a build without the async
    /// path, off is off; the file's key, overridden by the command line.
    #[test]
    fn nonblocking_io_follows_the_build() {
        let auto = parse(&["--fd=3"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(auto.nonblocking_io, NONBLOCKING_BUILT);
        let off = parse(&["--fd=3", "--nonblocking-io", "off"]).unwrap_or_else(|e| panic!("{e}"));
        assert!(!off.nonblocking_io);
        match parse(&["--fd=3", "--nonblocking-io", "on"]) {
            Ok(c) => assert!(NONBLOCKING_BUILT && c.nonblocking_io),
            Err(e) => assert!(
                !NONBLOCKING_BUILT && matches!(e, ConfigError::NonblockingUnsupported),
                "{e}"
            ),
        }
        let file: FileConfig = toml::from_str(
            r#"
            [vhost-user]
            socket-path = "/run/file.sock"
            nonblocking-io = "off"
            "#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x", "--nonblocking-io", "auto"])
            .unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, ident(file)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.nonblocking_io, NONBLOCKING_BUILT);
    }

    #[test]
    fn cli_overrides_file() {
        let file: FileConfig = toml::from_str(
            r#"
            [vhost-user]
            socket-path = "/run/file.sock"
            thread-pool-size = 8
            queues = 2
            poll-us = 20
            [fuse]
            cache = "never"
            xattr = false
            [ceph]
            root = "/from-file"
            client-id = "file"
            [ceph.options]
            client_cache_size = "100"
            client_oc = "false"
            "#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from([
            "x",
            "--socket-path",
            "/run/cli.sock",
            "--cache",
            "always",
            "--xattr",
            "--ceph-opt",
            "client_oc=true",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, ident(file)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.listen, Listen::SocketPath("/run/cli.sock".into()));
        assert_eq!(c.cache, CacheMode::Always);
        assert!(c.xattr);
        assert_eq!(c.thread_pool_size, 8);
        assert_eq!(c.queues, 2);
        assert_eq!(c.poll_us, 20);
        assert_eq!(c.ceph.root, "/from-file");
        assert_eq!(c.ceph.access.client_id.as_deref(), Some("file"));
        // The memory defaults first, less the keys the file or the command line set.
        assert_eq!(
            c.ceph.access.options,
            vec![
                ("client_oc_size".to_owned(), (32u64 << 20).to_string()),
                ("client_oc_max_dirty".to_owned(), (16u64 << 20).to_string()),
                (
                    "client_oc_target_dirty".to_owned(),
                    (8u64 << 20).to_string()
                ),
                (
                    "client_readahead_max_bytes".to_owned(),
                    (2u64 << 20).to_string()
                ),
                ("client_cache_size".to_owned(), "100".to_owned()),
                ("client_oc".to_owned(), "true".to_owned())
            ]
        );
    }

    #[test]
    fn secrets_never_reach_debug_output() {
        let secret = "AQBKc2Vjc2VjcmV0a2V5bm90Zm9ybG9ncw==";
        let c = parse(&[
            "--fd",
            "3",
            "--ceph-opt",
            &format!("key={secret}"),
            "--ceph-opt",
            &format!("auth-secret={secret}"),
            "--ceph-opt",
            "client_cache_size=100",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let shown = format!("{c:?} {c:#?} {:?}", c.ceph);
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("<redacted>") && shown.contains("client_cache_size"));
        assert!(c
            .ceph
            .access
            .options
            .iter()
            .any(|(k, v)| k == "key" && v == secret));
        assert!(!is_secret_option("keyring") && !is_secret_option("keyfile"));
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        assert!(c.warnings.iter().all(|w| !w.contains(secret)));
    }

    #[test]
    fn sandbox_and_translation_options() {
        let c = parse(&["--fd", "3"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.sandbox.seccomp, SeccompMode::Kill, "kill is the default");
        assert!(c.sandbox.user.is_none());
        assert!(c.idmap.is_identity());

        let c = parse(&[
            "--fd=3",
            "--user=root",
            "--group=0",
            "--seccomp=log",
            "--translate-uid=map:1000:100000:10",
            "--translate-uid=forbid-guest:0:1",
            "--translate-gid=squash-guest:0:100:65536",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let acct = c.sandbox.user.clone().unwrap_or_else(|| panic!("no user"));
        assert_eq!((acct.uid, acct.gid), (0, 0));
        assert_eq!(c.sandbox.seccomp, SeccompMode::Log);
        let uid = |g| c.idmap.host_uid(GuestUid::new(g)).ok().map(HostUid::get);
        assert_eq!(uid(1005), Some(100_005));
        assert!(uid(0).is_none());
        let gid = c.idmap.host_gid(GuestGid::new(42)).ok();
        assert_eq!(gid.map(HostGid::get), Some(100));

        assert!(matches!(
            parse(&[
                "--fd=3",
                "--translate-uid=map:0:100:10",
                "--translate-uid=guest:5:7:1"
            ]),
            Err(ConfigError::IdMap(IdMapError::Overlap(..)))
        ));
        assert!(matches!(
            parse(&["--fd=3", "--translate-gid=map:0:100"]),
            Err(ConfigError::IdMap(_))
        ));
        assert!(matches!(
            parse(&["--fd=3", "--user=no-such-user-xyz"]),
            Err(ConfigError::Account(_))
        ));
        assert!(matches!(
            parse(&["--fd=3", "--group=root"]),
            Err(ConfigError::Account(SandboxError::GroupWithoutUser))
        ));

        let file: FileConfig = toml::from_str(
            "[vhost-user]\nsocket-path = \"/s\"\n[sandbox]\nuser = \"root\"\nseccomp = \"none\"\n\
             translate-uid = [\"map:0:5000:1\"]\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x", "--translate-uid", "map:1:6000:1"])
            .unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, ident(file)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.sandbox.seccomp, SeccompMode::None);
        assert!(c.sandbox.user.is_some());
        // The command line's uid rules replace the file's.
        let uid = |g| c.idmap.host_uid(GuestUid::new(g)).ok().map(HostUid::get);
        assert_eq!(uid(0), Some(0));
        assert_eq!(uid(1), Some(6000));
    }

    #[test]
    fn quarantine_options() {
        let c = parse(&["--fd", "3"]).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.quarantine.enabled);
        assert_eq!(c.quarantine.propagation, Duration::from_secs(1));
        let c = parse(&[
            "--fd",
            "3",
            "--quarantine",
            "off",
            "--quarantine-path",
            "/data//p/",
            "--quarantine-recovery",
            "global",
            "--quarantine-recovery-path",
            "/volumes/_nogroup/sv1",
            "--quarantine-propagation-ms",
            "400",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.quarantine.enabled);
        assert_eq!(c.quarantine.paths, vec!["/data/p".to_owned()]);
        assert!(c.quarantine.recovery_global);
        assert_eq!(c.quarantine.recovery_paths, vec!["/volumes/_nogroup/sv1"]);
        assert_eq!(c.quarantine.propagation, Duration::from_millis(400));
        assert!(matches!(
            parse(&["--fd", "3", "--quarantine-path", "rel"]),
            Err(ConfigError::BadQuarantinePath(_))
        ));
        assert!(matches!(
            parse(&["--fd", "3", "--quarantine-propagation-ms", "5"]),
            Err(ConfigError::BadQuarantinePropagation)
        ));
        // The watcher's own identity: none by default (the export's id reads the state).
        assert_eq!(c.quarantine.client_id, None);
        assert_eq!(c.quarantine.keyring, None);
        let c = parse(&[
            "--fd",
            "3",
            "--quarantine-client-id",
            "cvfs-watch",
            "--quarantine-keyring",
            "/etc/ceph/w.keyring",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.quarantine.client_id.as_deref(), Some("cvfs-watch"));
        assert_eq!(
            c.quarantine.keyring.as_deref(),
            Some(std::path::Path::new("/etc/ceph/w.keyring"))
        );
        // The file's, overridden by the command line.
        let file: FileConfig =
            toml::from_str("[quarantine]\nclient-id = \"file-watch\"\nkeyring = \"/k\"\n")
                .unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x", "--fd", "3", "--client-id=t", "--ceph-root=/t"])
            .unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.quarantine.client_id.as_deref(), Some("file-watch"));
        assert!(matches!(
            parse(&["--fd", "3", "--quarantine-keyring", "/k"]),
            Err(ConfigError::QuarantineKeyringWithoutId)
        ));
        for bad in ["client.cvfs-watch", "", "a b"] {
            assert!(
                matches!(
                    parse(&["--fd", "3", "--quarantine-client-id", bad]),
                    Err(ConfigError::BadQuarantineClientId(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn metrics_options() {
        use crate::metrics::MetricsEndpoint;
        let c = parse(&["--socket-path", "/r/vm.sock"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.metrics, None, "off by default");
        assert!(!c
            .ceph
            .access
            .options
            .iter()
            .any(|(k, _)| k == "admin_socket"));

        let c = parse(&["--socket-path", "/r/vm.sock", "--metrics-addr", "9310"])
            .unwrap_or_else(|e| panic!("{e}"));
        let m = c.metrics.unwrap_or_else(|| panic!("metrics off"));
        assert_eq!(
            m.endpoint,
            MetricsEndpoint::Tcp("127.0.0.1:9310".parse().unwrap_or_else(|e| panic!("{e}")))
        );
        assert_eq!(m.ceph_admin_socket, Some("/r/vm.sock.ceph.asok".into()));
        assert!(c
            .ceph
            .access
            .options
            .iter()
            .any(|(k, v)| k == "admin_socket" && v == "/r/vm.sock.ceph.asok"));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);

        // An operator's admin socket wins; a public address is allowed with a warning.
        let c = parse(&[
            "--fd=3",
            "--metrics-addr=0.0.0.0:9310",
            "--ceph-opt=admin socket=/r/a.asok",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let m = c.metrics.unwrap_or_else(|| panic!("metrics off"));
        assert_eq!(m.ceph_admin_socket, Some("/r/a.asok".into()));
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);

        let c = parse(&["--fd=3", "--metrics-socket=/r/m.sock"]).unwrap_or_else(|e| panic!("{e}"));
        let m = c.metrics.unwrap_or_else(|| panic!("metrics off"));
        assert_eq!(m.endpoint, MetricsEndpoint::Unix("/r/m.sock".into()));
        assert_eq!(m.ceph_admin_socket, Some("/r/m.sock.ceph.asok".into()));

        assert!(matches!(
            parse(&["--fd=3", "--metrics-addr=nonsense"]),
            Err(ConfigError::BadMetricsAddr(_))
        ));
        let file: FileConfig = toml::from_str(
            "[vhost-user]\nsocket-path = \"/s\"\n[metrics]\naddr = \"1\"\nsocket = \"/m\"\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from(["x"]).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            Config::merge(args, ident(file)),
            Err(ConfigError::MetricsAddrAndSocket)
        ));
        // The command line replaces the file's endpoint.
        let file: FileConfig =
            toml::from_str("[vhost-user]\nsocket-path = \"/s\"\n[metrics]\nsocket = \"/m\"\n")
                .unwrap_or_else(|e| panic!("{e}"));
        let args =
            Args::try_parse_from(["x", "--metrics-addr", "9"]).unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, ident(file)).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            c.metrics.map(|m| m.endpoint),
            Some(MetricsEndpoint::Tcp(_))
        ));
    }

    #[test]
    fn unknown_file_key_is_an_error() {
        let r: Result<FileConfig, _> = toml::from_str("[fuse]\ncahce = \"auto\"\n");
        assert!(r.is_err());
    }
}
