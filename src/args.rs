//! Command-line types, and nothing else: clap parses them, `config` validates them.
//!
//! The option names follow the Rust virtiofsd (1.14), so that libvirt, Kata, KubeVirt and
//! hand-written QEMU scripts can start ceph-virtiofsd in its place: every option and form of
//! virtiofsd 1.14 is accepted (tests/virtiofsd_flags.rs feeds each to the daemon). Those that
//! mean nothing for a CephFS-backed daemon are ignored with a warning (or silently, where they
//! only choose what ceph-virtiofsd always does); three are refused: `--shared-dir` (there is no
//! host directory: use `--ceph-root`) and `--uid-map`/`--gid-map` (no user namespace: use
//! `--translate-uid`/`--translate-gid`).

use std::path::PathBuf;

use clap::{ArgAction, Parser, ValueEnum};

/// Guest page-cache policy, as in virtiofsd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// No caching in the guest: every access goes to the daemon (most coherent, slowest).
    Never,
    /// Cache for a short time, re-validated on open (the default).
    Auto,
    /// Cache for a long time (fast; only safe when no other client changes the tree).
    Always,
    /// Cache metadata only, not file contents.
    Metadata,
}

/// What the guest may do with CephFS snapshots (`.snap` directories).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Snapshots {
    /// List and read snapshots; creating, renaming or removing them fails with EROFS (the
    /// default).
    ReadOnly,
    /// Create, rename and remove snapshots (mkdir/rmdir in .snap), as the client id's caps
    /// allow.
    ReadWrite,
    /// No .snap directory at all: its lookup fails with ENOENT.
    Hidden,
}

/// An on/off switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    On,
    Off,
}

/// `--nonblocking-io`: how READ and WRITE of O_DIRECT files are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NonblockingIo {
    /// On where the daemon was built against libcephfs 20 or later, off elsewhere.
    Auto,
    /// On; a daemon built against an older libcephfs refuses to start.
    On,
    /// Every READ and WRITE waits in a thread for libcephfs.
    Off,
}

/// What a migration destination does with a node or handle it cannot find again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MigrationOnError {
    /// The guest gets ESTALE for that node or handle; the migration goes on (the default).
    GuestError,
    /// The migration fails and the guest keeps running on the source.
    Abort,
}

/// Quarantine recovery role of a daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecoveryRole {
    /// An ordinary daemon: quarantined directories are refused (the default).
    None,
    /// Keep access to every quarantined directory.
    Global,
}

/// `ceph-virtiofsd quarantine ACTION PATH`: the operator command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QuarantineAction {
    /// Quarantine PATH: every daemon refuses guest access under it within its bound.
    Enable,
    /// Release PATH.
    Disable,
    /// Print whether PATH is quarantined.
    Status,
}

/// Quarantine or release a CephFS subvolume (or directory) for every ceph-virtiofsd daemon.
///
/// The state is the reserved xattr trusted.ceph-virtiofsd.quarantine on PATH. Subvolumes are
/// /volumes/<group>/<name> (the parent of `ceph fs subvolume getpath`).
#[derive(Parser, Debug, Clone)]
#[command(
    name = "ceph-virtiofsd quarantine",
    bin_name = "ceph-virtiofsd quarantine",
    version
)]
pub struct QuarantineArgs {
    #[arg(value_enum)]
    pub action: QuarantineAction,

    /// Absolute CephFS path, e.g. /volumes/_nogroup/sv1.
    pub path: String,

    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// How to reach the cluster: shared by the daemon and the quarantine command.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct ClusterArgs {
    /// ceph.conf to read (default: libcephfs's search path, e.g. /etc/ceph/ceph.conf).
    #[arg(long, value_name = "FILE")]
    pub ceph_conf: Option<PathBuf>,

    /// Ceph client id, without the "client." prefix. The daemon requires it (here or as
    /// client-id in the config file) and never defaults to client.admin: name admin to use it.
    /// The quarantine command defaults to admin.
    #[arg(long, value_name = "ID")]
    pub client_id: Option<String>,

    /// Keyring file holding the client's key (default: from ceph.conf).
    #[arg(long, value_name = "FILE")]
    pub keyring: Option<PathBuf>,

    /// CephFS file system name (default: the cluster's default file system).
    #[arg(long, value_name = "NAME")]
    pub fs_name: Option<String>,
}

/// Log verbosity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Failures that stop an operator's request or the daemon.
    Error,
    /// Abnormal but handled events (malformed guest requests, ignored options).
    Warn,
    /// Lifecycle events: listening, connected, disconnected (the default).
    Info,
    /// One line per request.
    Debug,
    /// Everything, including the rust-vmm crates' internals.
    Trace,
    /// Logging disabled.
    Off,
}

/// What the seccomp filter does with a syscall outside its allow-list (as in virtiofsd).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SeccompMode {
    /// No filter.
    None,
    /// Allow it, and have the kernel log it (audit / kernel log): to find a missing syscall.
    Log,
    /// Kill the daemon (the default).
    Kill,
    /// Send the thread SIGSYS: the daemon ends with a core dump naming the call.
    Trap,
}

/// `--migration-mode`, as virtiofsd names it. ceph-virtiofsd migrates by CephFS inode number
/// (no paths, no file handles, no privilege), whatever the mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MigrationMode {
    /// virtiofsd's default; here: by inode number.
    FindPaths,
    /// Here: by inode number, which is what a file handle is to CephFS.
    FileHandles,
}

/// `--posix-acl` and `--security-label`, as virtiofsd 1.14 takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Support {
    Never,
    Auto,
    Always,
}

/// vhost-user virtio-fs daemon serving CephFS through libcephfs.
///
/// QEMU (or cloud-hypervisor, or the Kata runtime) connects to the vhost-user socket; the guest
/// mounts the filesystem with `mount -t virtiofs TAG /mnt`. Options given on the command line
/// override the same options in the `--config` file.
#[derive(Parser, Debug, Default, Clone)]
#[command(name = "ceph-virtiofsd", version, about, long_about = None)]
#[command(
    override_usage = "ceph-virtiofsd [OPTIONS]\n       \
ceph-virtiofsd quarantine <enable|disable|status> <PATH> [OPTIONS]",
    after_help = "Exit codes: 0 success, 1 runtime failure while serving, \
2 usage or configuration error, 3 Ceph connection/mount failure.\n\
RUST_LOG (tracing-subscriber EnvFilter syntax) overrides --log-level.\n\
Subcommand: `ceph-virtiofsd quarantine enable|disable|status PATH` (also installed as \
`ceph-virtiofsd-quarantine`) quarantines a CephFS subvolume for every daemon; see its --help."
)]
pub struct Args {
    /// TOML configuration file (see config/ceph-virtiofsd.toml); command-line options win.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    // ---- vhost-user ----
    /// Create a vhost-user listening socket at PATH (a stale socket file is replaced).
    /// virtiofsd's deprecated --socket is taken as its alias.
    #[arg(long, value_name = "PATH", conflicts_with = "fd", alias = "socket")]
    pub socket_path: Option<PathBuf>,

    /// Give the --socket-path socket to this group (name or gid), so that the frontend's user
    /// connects through it (read and write by the umask).
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,

    /// Serve on an already listening vhost-user socket inherited as file descriptor FD.
    #[arg(long, value_name = "FD")]
    pub fd: Option<i32>,

    /// Mount tag exported in the virtio-fs config space (at most 36 bytes). Only needed by
    /// frontends that read the config space from the backend (e.g. vhost-user-device).
    #[arg(long, value_name = "TAG")]
    pub tag: Option<String>,

    /// Most worker threads serving FUSE requests at once; they are started when requests wait
    /// and leave after 10 s idle. 0 = serve each request inline in its queue thread. Default: 64.
    #[arg(long, value_name = "N")]
    pub thread_pool_size: Option<usize>,

    /// Number of request queues offered to the guest (a hiprio queue is always added).
    #[arg(long, value_name = "N")]
    pub queues: Option<u16>,

    /// After serving a request queue, poll it for at most US microseconds before sleeping: a
    /// guest's next request is then taken without a kick or a wake-up. The window adapts per
    /// queue (it grows while requests follow each other closely and shrinks to nothing when
    /// they do not), so an idle or slow guest costs no CPU. 0 = never poll. Default: 50.
    #[arg(long, value_name = "US")]
    pub poll_us: Option<u64>,

    /// Serve READ and WRITE of files the guest opened O_DIRECT with libcephfs's asynchronous
    /// calls (ceph_ll_nonblocking_readv_writev, libcephfs 20 and later) while other requests
    /// are in flight: the request is sent from the queue thread and answered when the OSDs
    /// are, and no thread waits for it. A request alone, and cached (non-O_DIRECT) I/O, are
    /// served the blocking way. auto = on where the daemon was built against libcephfs 20 or
    /// later; on fails to start elsewhere. Default: auto.
    #[arg(long, value_name = "MODE")]
    pub nonblocking_io: Option<NonblockingIo>,

    /// Keep listening after the frontend disconnects, for a reconnecting frontend, instead of
    /// exiting.
    #[arg(long)]
    pub keep_serving: bool,

    /// Restart and upgrade without the guest noticing, for frontends that reconnect
    /// (cloud-hypervisor): at start, take the guest's session over from the daemon listening
    /// on this unix socket (if one does), and while serving, listen on it to hand the session
    /// to a successor started with the same options, then exit. Start the new daemon while the
    /// old one runs.
    #[arg(long, value_name = "PATH")]
    pub handover: Option<PathBuf>,

    /// Print the vhost-user capabilities JSON (read by libvirt) and exit.
    #[arg(long)]
    pub print_capabilities: bool,

    /// Live migration, on the destination: what to do with a file, directory or open handle of
    /// the guest that cannot be found again in CephFS (deleted meanwhile, access lost).
    /// Default: guest-error (virtiofsd's is abort).
    #[arg(long, value_enum, value_name = "MODE")]
    pub migration_on_error: Option<MigrationOnError>,

    /// Accepted for virtiofsd compatibility (KubeVirt passes find-paths): ceph-virtiofsd
    /// always migrates by CephFS inode number, which needs neither paths nor privileges and
    /// finds the very inode again (renames do not matter).
    #[arg(long, value_enum, value_name = "MODE", hide_short_help = true)]
    pub migration_mode: Option<MigrationMode>,

    /// Accepted for virtiofsd compatibility: inode numbers already name the very inode, and
    /// the destination checks each one's file type.
    #[arg(long, hide_short_help = true)]
    pub migration_verify_handles: bool,

    /// Accepted for virtiofsd compatibility: no paths are sent, so none need confirming.
    #[arg(long, hide_short_help = true)]
    pub migration_confirm_paths: bool,

    // ---- FUSE behaviour ----
    /// Guest caching policy.
    #[arg(long, value_enum, value_name = "MODE")]
    pub cache: Option<CacheMode>,

    /// Enable extended attributes (the default).
    #[arg(long, overrides_with = "no_xattr")]
    pub xattr: bool,

    /// Disable extended attributes.
    #[arg(long)]
    pub no_xattr: bool,

    /// Serve the export read-only: every request that would change it (write, create, mkdir,
    /// unlink, rename, link, setattr, setxattr, removexattr, fallocate, an open for writing or
    /// truncation) fails with EROFS.
    #[arg(long)]
    pub readonly: bool,

    // ---- per-guest limits and policy ----
    /// Most inodes the guest may hold at once (looked up and not yet forgotten); each takes a
    /// node of the daemon's (its libcephfs inode only within --held-inodes). A lookup beyond it
    /// fails with ENFILE. Default: 500000.
    #[arg(long, value_name = "N")]
    pub max_nodes: Option<usize>,

    /// Most files and directories the guest may hold open at once. An open beyond it fails
    /// with ENFILE. Default: 100000.
    #[arg(long, value_name = "N")]
    pub max_handles: Option<usize>,

    /// Most libcephfs inode references the daemon keeps for the inodes the guest holds (about
    /// 2 KiB each with libcephfs's dentry and caps). Beyond it the inodes used least lately are
    /// given back to libcephfs, which may trim them, and found again by number when the guest
    /// next uses them (one MDS request if libcephfs trimmed them). The MDS's cache-pressure
    /// recalls release references too. Default: 4096.
    #[arg(long, value_name = "N")]
    pub held_inodes: Option<usize>,

    /// Snapshot policy: read-only (the default), read-write or hidden.
    #[arg(long, value_enum, value_name = "POLICY")]
    pub snapshots: Option<Snapshots>,

    /// Let the guest create character and block device nodes (refused with EPERM by default:
    /// other clients mounting CephFS without nodev would honour them).
    #[arg(long)]
    pub allow_device_nodes: bool,

    /// Answer a request whose CephFS call has not returned after SECS seconds with ETIMEDOUT
    /// (as Linux's CephFS client answers an MDS request that ran out of time), log it, and drop
    /// its late result. For guests with a FUSE request timeout (Linux 6.14+,
    /// fs.fuse.default_request_timeout), which abort the whole mount when one request outlives
    /// it: set SECS below that timeout. READ and WRITE are bounded too (their data then passes
    /// through the daemon's own buffers, and guests are offered at most 124 KiB each); locks
    /// are not. 0 = off; at most 86400. Default: 0.
    #[arg(long, value_name = "SECS")]
    pub request_deadline: Option<u64>,

    // ---- logging ----
    /// Log level (RUST_LOG, when set, overrides it).
    #[arg(long, value_enum, value_name = "LEVEL")]
    pub log_level: Option<LogLevel>,

    /// Log to syslog (/dev/log) instead of stderr.
    #[arg(long)]
    pub syslog: bool,

    /// Report a FUSE request still unanswered after SECS seconds: logged once at warn (and at
    /// error after ten times SECS) with its op, ids, age and whether libcephfs waits on the MDS,
    /// the OSDs or itself, and counted in the metrics. 0 = off. Default: 30.
    #[arg(long, value_name = "SECS")]
    pub slow_request_secs: Option<u64>,

    // ---- metrics ----
    /// Serve Prometheus metrics at http://ADDR/metrics. ADDR is PORT (bound to 127.0.0.1) or
    /// IP:PORT. Off unless this or --metrics-socket is given.
    #[arg(long, value_name = "ADDR", conflicts_with = "metrics_socket")]
    pub metrics_addr: Option<String>,

    /// Serve Prometheus metrics over HTTP on a unix socket at PATH instead of TCP.
    #[arg(long, value_name = "PATH")]
    pub metrics_socket: Option<PathBuf>,

    // ---- Ceph ----
    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// Absolute path inside CephFS exported as the guest's root. Required (here or as root in
    /// the config file): the whole file system only when named, --ceph-root /.
    #[arg(long, value_name = "PATH")]
    pub ceph_root: Option<String>,

    /// The guest's name, set in the CephFS session's client metadata (vm=NAME) so that `ceph
    /// tell mds.* session ls` shows which VM a session serves (letters, digits and . _ - : @,
    /// at most 64). Default: none (libvirt passes no domain name; the compat wrapper gives Kata's
    /// sandbox id).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// Extra libcephfs configuration option KEY=VALUE (repeatable), e.g. client_cache_size=16384.
    #[arg(long, value_name = "KEY=VALUE", action = ArgAction::Append)]
    pub ceph_opt: Vec<String>,

    /// Stable identity of this device's CephFS session (letters, digits and . _ - : @, at
    /// most 64). A daemon started with the same NAME and client id ends the session its
    /// predecessor left behind (killed or crashed) before it mounts, so that the old caps and
    /// file locks stop blocking other clients at once instead of after the MDS session
    /// timeout. Only one running daemon may use a NAME: a second one ends the first one's
    /// session. Default: none (no reclaim).
    #[arg(long, value_name = "NAME")]
    pub instance_id: Option<String>,

    /// Give up connecting/mounting after SECS seconds (default: 30).
    #[arg(long, value_name = "SECS")]
    pub mount_timeout: Option<u64>,

    /// libcephfs's object cache (file data it caches and buffers for writing), in MiB:
    /// libcephfs's client_oc_size, and half of it its client_oc_max_dirty; its readahead
    /// (client_readahead_max_bytes) reads at most a sixteenth of it ahead, 512 KiB to 8 MiB.
    /// The guest's page cache is in front of it. 0 turns it off (client_oc=false: every read
    /// and write goes to the OSDs). Default: 32 (libcephfs's own default, 200, costs each
    /// daemon that much RSS after a large file went through it).
    #[arg(long, value_name = "MIB")]
    pub object_cache_mib: Option<u64>,

    /// Inodes libcephfs keeps cached beyond the ones the daemon holds (client_cache_size), about
    /// 2 KiB each; those the daemon holds are bounded by --held-inodes. Default: 8192.
    #[arg(long, value_name = "N")]
    pub inode_cache: Option<u64>,

    // ---- subvolume quarantine (see `ceph-virtiofsd quarantine --help`) ----
    /// Enforce subvolume quarantine: on (the default) or off.
    #[arg(long, value_enum, value_name = "on|off")]
    pub quarantine: Option<Switch>,

    /// Extra quarantine-capable directory, an absolute CephFS path (repeatable); mgr
    /// subvolumes (/volumes/<group>/<name>) are found without it.
    #[arg(long, value_name = "PATH", action = ArgAction::Append)]
    pub quarantine_path: Vec<String>,

    /// Recovery role: "global" keeps access to every quarantined directory.
    #[arg(long, value_enum, value_name = "ROLE")]
    pub quarantine_recovery: Option<RecoveryRole>,

    /// Keep access to quarantined directories at or below PATH (repeatable).
    #[arg(long, value_name = "PATH", action = ArgAction::Append)]
    pub quarantine_recovery_path: Vec<String>,

    /// A quarantine reaches this daemon's guests within MS milliseconds (default: 1000).
    #[arg(long, value_name = "MS")]
    pub quarantine_propagation_ms: Option<u64>,

    /// Ceph client id the quarantine watcher reads the state as, without "client." (default:
    /// --client-id). It needs metadata read access only: mon 'allow r' mds 'allow r
    /// path=/volumes' (and the --quarantine-path directories), no OSD caps; the watcher then
    /// mounts /volumes, and the export's own id may be confined to its subtree.
    #[arg(long, value_name = "ID")]
    pub quarantine_client_id: Option<String>,

    /// Keyring holding the quarantine watcher's key (default: --keyring, or ceph.conf's);
    /// needs --quarantine-client-id.
    #[arg(long, value_name = "FILE")]
    pub quarantine_keyring: Option<PathBuf>,

    // ---- least privilege and id mapping ----
    /// After opening the socket and mounting CephFS, switch to this user (name or uid; needs a
    /// root start). The daemon then needs no host file access. Default: user ceph-virtiofsd
    /// when started as root and that user exists (the Debian package creates it), else none;
    /// --user root keeps uid 0.
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,

    /// Group for --user (name or gid; default: the user's primary group).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,

    /// Syscall filter installed after start-up: none, log (allow and log others), kill
    /// (default: kill the daemon on a syscall outside the allow-list) or trap (SIGSYS: the
    /// daemon ends with a core dump).
    #[arg(long, value_enum, value_name = "MODE")]
    pub seccomp: Option<SeccompMode>,

    /// Translate uids between guest and CephFS (repeatable), as virtiofsd:
    /// map:GUEST:HOST:COUNT, guest:FROM_GUEST:TO_HOST:COUNT, host:FROM_HOST:TO_GUEST:COUNT,
    /// squash-guest:FROM_GUEST:TO_HOST:COUNT, squash-host:FROM_HOST:TO_GUEST:COUNT,
    /// forbid-guest:FROM_GUEST:COUNT.
    #[arg(long, value_name = "RULE", action = ArgAction::Append)]
    pub translate_uid: Vec<String>,

    /// Translate gids between guest and CephFS (repeatable); same forms as --translate-uid.
    #[arg(long, value_name = "RULE", action = ArgAction::Append)]
    pub translate_gid: Vec<String>,

    // ---- virtiofsd compatibility ----
    /// Refused: there is no host directory; use --ceph-root to pick the exported CephFS path.
    #[arg(long, value_name = "PATH", hide_short_help = true)]
    pub shared_dir: Option<PathBuf>,

    /// Ignored (virtiofsd compatibility: no host directory to sandbox).
    #[arg(long, value_name = "MODE", hide_short_help = true)]
    pub sandbox: Option<String>,

    /// Ignored (virtiofsd compatibility).
    #[arg(long, hide_short_help = true)]
    pub announce_submounts: bool,

    /// Accepted (virtiofsd compatibility): the export has no submounts to announce.
    #[arg(long, hide_short_help = true)]
    pub no_announce_submounts: bool,

    /// Ignored (virtiofsd compatibility).
    #[arg(long, value_name = "MODE", num_args = 0..=1, default_missing_value = "prefer",
          hide_short_help = true)]
    pub inode_file_handles: Option<String>,

    /// Ignored (virtiofsd compatibility).
    #[arg(long, hide_short_help = true)]
    pub allow_direct_io: bool,

    /// Ignored (virtiofsd compatibility; KILLPRIV_V2 is always handled).
    #[arg(long, hide_short_help = true)]
    pub killpriv_v2: bool,

    /// Ignored (virtiofsd compatibility).
    #[arg(long, hide_short_help = true)]
    pub no_killpriv_v2: bool,

    /// POSIX ACLs (off by default, as with virtiofsd): offered to the guest (FUSE_POSIX_ACL:
    /// its kernel enforces them, setfacl/getfacl work) and enforced by libcephfs
    /// (client_acl_type=posix_acl), as other CephFS clients with ACLs do. They need xattrs and
    /// no --translate-uid/--translate-gid rules (ACL entries name ids that are not
    /// translated): always refuses to start without, auto then leaves them off with a warning.
    #[arg(long, value_enum, value_name = "WHEN", num_args = 0..=1, require_equals = true,
          default_missing_value = "auto", hide_short_help = true)]
    pub posix_acl: Option<Support>,

    /// Ignored (virtiofsd compatibility): no security labels are stored at file creation;
    /// never is accepted silently.
    #[arg(long, value_enum, value_name = "WHEN", num_args = 0..=1, require_equals = true,
          default_missing_value = "auto", hide_short_help = true)]
    pub security_label: Option<Support>,

    /// Ignored (virtiofsd compatibility).
    #[arg(long, hide_short_help = true)]
    pub writeback: bool,

    /// Ignored (virtiofsd compatibility).
    #[arg(long, hide_short_help = true)]
    pub no_readdirplus: bool,

    /// Ignored (virtiofsd compatibility).
    #[arg(long, hide_short_help = true)]
    pub preserve_noatime: bool,

    /// Accepted (virtiofsd compatibility): shared mmap with `--cache never` is always offered
    /// (FUSE_DIRECT_IO_ALLOW_MMAP, to guests that ask for it).
    #[arg(long, hide_short_help = true)]
    pub allow_mmap: bool,

    /// Ignored (virtiofsd compatibility).
    #[arg(long, value_name = "N", hide_short_help = true)]
    pub rlimit_nofile: Option<u64>,

    /// Ignored (virtiofsd compatibility).
    #[arg(long, value_name = "CAPS", hide_short_help = true)]
    pub modcaps: Option<String>,

    /// Ignored (virtiofsd compatibility).
    #[arg(long, value_name = "MAP", hide_short_help = true)]
    pub xattrmap: Option<String>,

    /// Refused: virtiofsd's user-namespace uid map (libvirt session mode) has no meaning
    /// without a host directory; use --translate-uid.
    #[arg(long, value_name = "MAP", action = ArgAction::Append, hide_short_help = true)]
    pub uid_map: Vec<String>,

    /// Refused: as --uid-map, for gids; use --translate-gid.
    #[arg(long, value_name = "MAP", action = ArgAction::Append, hide_short_help = true)]
    pub gid_map: Vec<String>,

    /// Ignored (virtiofsd compatibility: always runs in the foreground).
    #[arg(short = 'f', hide_short_help = true)]
    pub foreground: bool,

    /// Compatibility: same as --log-level debug.
    #[arg(short = 'd', hide_short_help = true)]
    pub debug: bool,

    /// Legacy virtiofsd options, comma separated (repeatable): cache=MODE, xattr, no_xattr and
    /// thread_pool_size=N are honoured; source=PATH is refused (use --ceph-root); others ignored.
    #[arg(short = 'o', value_name = "OPTS", action = ArgAction::Append, hide_short_help = true)]
    pub legacy_opts: Vec<String>,
}
