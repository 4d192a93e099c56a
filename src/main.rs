//! ceph-virtiofsd entry point: parse, validate, set up logging, run, map errors to exit codes.
//! Exit codes are documented on [`ceph_virtiofsd::Exit`].

// Nothing a guest sends may panic the daemon or be silently truncated: no unwrap/expect, no
// indexing or slicing that can panic, no lossy or silent `as`. Use `get`, `try_from` with a
// real errno, and `unwrap_or_else(|e| e.into_inner())` on a poisoned lock; allow a lint only on
// the item that needs it, with a one-line reason. Unit tests are exempt.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        clippy::cast_sign_loss,
        clippy::as_conversions
    )
)]

use std::process::ExitCode;

use clap::Parser;
use tracing::{error, info, warn};

use std::sync::Arc;

use ceph_client::ReclaimOutcome;
use ceph_virtiofsd::args::{Args, QuarantineAction, QuarantineArgs};
use ceph_virtiofsd::ceph::CephAccess;
use ceph_virtiofsd::config::{Config, DEFAULT_MOUNT_TIMEOUT};
use ceph_virtiofsd::fs::{self, CephFs, FsConfig};
use ceph_virtiofsd::quarantine::{self, Gate, Watcher};
use ceph_virtiofsd::{daemon, handover};
use ceph_virtiofsd::{logging, report, Exit, CAPABILITIES_JSON};

/// Why the daemon stopped with an error, and which exit code that means.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error("Cannot connect to the Ceph cluster or mount CephFS {root:?}: check the monitor addresses in the ceph.conf, the client id and its keyring, and that the path exists")]
    Mount {
        root: String,
        #[source]
        source: ceph_client::CephError,
    },
    #[error("Cannot end the CephFS session that the previous daemon of --instance-id {instance_id:?} left behind (session uuid {uuid}): check that the MDS is active and that this daemon uses the same --client-id as before; the old session ends by itself after the MDS session timeout, or evict it now with `ceph tell mds.* client evict client_metadata.uuid={uuid}`")]
    Reclaim {
        instance_id: String,
        uuid: String,
        #[source]
        source: ceph_client::CephError,
    },
    #[error("Cannot open the exported CephFS root {root:?}")]
    Root {
        root: String,
        #[source]
        source: std::io::Error,
    },
    #[error("Serving the guest failed")]
    Serve(#[source] ceph_virtiofsd::daemon::DaemonError),
    #[error("--handover: taking the running daemon's session over failed (it serves on)")]
    TakeOver(#[source] handover::TakeOverError),
}

impl RunError {
    fn exit(&self) -> Exit {
        match self {
            RunError::Mount { .. } | RunError::Reclaim { .. } | RunError::Root { .. } => Exit::Ceph,
            RunError::Serve(_) | RunError::TakeOver(_) => Exit::Runtime,
        }
    }
}

fn fs_config(config: &Config) -> FsConfig {
    FsConfig {
        cache: config.cache,
        xattr: config.xattr,
        posix_acl: config.posix_acl,
        readonly: config.readonly,
        max_nodes: config.guest.max_nodes,
        max_handles: config.guest.max_handles,
        held_inodes: config.guest.held_inodes,
        snapshots: config.guest.snapshots,
        allow_device_nodes: config.guest.allow_device_nodes,
        idmap: config.idmap.clone(),
        second_session: Some(fs::side::Connector({
            let access = config.ceph.access.clone();
            let root = config.ceph.root.clone();
            std::sync::Arc::new(move || access.mount(&root))
        })),
        ..FsConfig::default()
    }
}

/// Start quarantine enforcement for the daemon (None when `--quarantine off`).
fn start_quarantine(config: &Config) -> std::io::Result<Option<(Arc<Gate>, Watcher)>> {
    if !config.quarantine.enabled {
        // Logged under the quarantine's target, as before the wiring moved here.
        info!(
            target: "ceph_virtiofsd::quarantine",
            "quarantine: enforcement off (--quarantine off)"
        );
        return Ok(None);
    }
    // The watcher's session is the daemon's other long-lived one: a killed daemon leaves it
    // behind too, with caps on the directories it reads. With an id of its own
    // (--quarantine-client-id) it reads as that id; the uuid still names the export's id and
    // instance, which tell the devices apart.
    let access = CephAccess {
        session_uuid: config
            .ceph
            .session_uuid()
            .map(|u| format!("{u}/quarantine")),
        ..quarantine::watcher_access(&config.ceph.access, &config.quarantine)
    };
    info!(
        target: "ceph_virtiofsd::quarantine",
        id = %access.cephx_name(),
        mount = %quarantine::watch_base(&config.quarantine),
        "quarantine: the watcher reads the state as this id, on its own mount of this directory"
    );
    quarantine::start(access, config.quarantine.clone(), &config.ceph.root).map(Some)
}

/// `ceph-virtiofsd quarantine ACTION PATH [ceph options]` (`argv` starts with "quarantine"),
/// or `ceph-virtiofsd-quarantine ACTION PATH ...` (the package's /usr/sbin command, a symlink to
/// the daemon; `argv` starts with the program): `name` is the command's name in its help.
/// Exit codes: 0 done, 2 usage, 3 Ceph failure.
fn quarantine_command(
    name: &'static str,
    argv: impl IntoIterator<Item = std::ffi::OsString>,
) -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    // clap prints usage errors and help itself, and exits (2 for an error).
    let matches = QuarantineArgs::command()
        .name(name)
        .bin_name(name)
        .get_matches_from(argv);
    let a = match QuarantineArgs::from_arg_matches(&matches) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    let access = CephAccess {
        conf: a.cluster.ceph_conf,
        client_id: a.cluster.client_id,
        keyring: a.cluster.keyring,
        fs_name: a.cluster.fs_name,
        options: Vec::new(),
        mount_timeout: DEFAULT_MOUNT_TIMEOUT,
        session_uuid: None,
        name: None,
    };
    let action = match a.action {
        QuarantineAction::Enable => quarantine::Action::Enable,
        QuarantineAction::Disable => quarantine::Action::Disable,
        QuarantineAction::Status => quarantine::Action::Status,
    };
    match quarantine::command(&access, action, &a.path) {
        Ok(line) => {
            println!("{line}");
            Exit::Ok.into()
        }
        Err(e) => {
            eprintln!("ceph-virtiofsd quarantine: {}", report(&e));
            match e {
                quarantine::CommandError::BadPath(_) => Exit::Usage.into(),
                _ => Exit::Ceph.into(),
            }
        }
    }
}

fn run(config: &Config) -> Result<(), RunError> {
    let root = config.ceph.root.clone();
    info!(root = %root, "mounting CephFS");
    // The MDS's cache-pressure recalls release the recalled inodes' references (fs::limits),
    // once the filesystem exists.
    let recall_target = fs::limits::RecallTarget::default();
    let recalls: Box<dyn ceph_client::CallbackHandler> =
        Box::new(fs::limits::RecallHandler::new(&recall_target));
    // Only the export's own mount carries the device's session uuid (the second session of
    // fs::side lives next to it, with the plain access).
    let session_uuid = config.ceph.session_uuid();
    let access = CephAccess {
        session_uuid: session_uuid.clone(),
        ..config.ceph.access.clone()
    };
    let mount = access
        .mount_with(&config.ceph.root, Some(recalls))
        .map_err(|source| match (&config.ceph.instance_id, &session_uuid) {
            (Some(id), Some(uuid)) if source.op == "ceph_start_reclaim" => RunError::Reclaim {
                instance_id: id.clone(),
                uuid: uuid.clone(),
                source,
            },
            _ => RunError::Mount {
                root: root.clone(),
                source,
            },
        })?;
    log_reclaim(config, &mount);
    // The client id is what an operator evicts (`ceph tell mds.* client evict id=N`) if this
    // process dies without unmounting.
    info!(client_id = mount.instance_id(), "CephFS mounted");
    // Subvolume quarantine: the state is read once before serving, then kept current.
    let quarantine = start_quarantine(config).map_err(|source| RunError::Root {
        root: root.clone(),
        source,
    })?;
    let mut fsc = fs_config(config);
    if let Some((gate, _)) = &quarantine {
        fsc.quarantine = Some(gate.clone());
        fsc.revocable_ttl = config.quarantine.ttl_bound();
    }
    let fs = Arc::new(CephFs::new(mount, fsc).map_err(|source| RunError::Root { root, source })?);
    // Set once, here: the cell is new.
    let _ = recall_target.set(Arc::downgrade(&fs));
    fs.set_migration_on_error(config.migration_on_error);
    // After an eviction, a new session like this one (fs::recover).
    let remount_root = config.ceph.root.clone();
    fs.set_remount(Box::new(move || {
        let recalls: Box<dyn ceph_client::CallbackHandler> =
            Box::new(fs::limits::RecallHandler::new(&recall_target));
        Ok(access.mount_with(&remount_root, Some(recalls))?)
    }));
    // --handover: a running daemon of this device hands its guest's session over first.
    let took_over = match &config.handover {
        None => false,
        Some(path) => match handover::take_over(path, &*fs) {
            Ok(handover::TakeOver::Nobody) => {
                info!(path = %path.display(), "--handover: no daemon to take a session over from; starting a fresh one");
                false
            }
            Ok(handover::TakeOver::Taken(_)) => true,
            Err(source) => {
                if let Err(e) = fs.shutdown() {
                    warn!(error = %e, "unmounting CephFS failed; the MDS will time the session out");
                }
                return Err(RunError::TakeOver(source));
            }
        },
    };
    if let Some(bound) = config.guest.request_deadline {
        info!(
            bound_s = bound.as_secs(),
            "Request deadline on: a request whose CephFS call outlives --request-deadline is answered ETIMEDOUT"
        );
    }
    ceph_virtiofsd::vhost_user::set_request_deadline(config.guest.request_deadline);
    // daemon::serve drops privileges and installs seccomp once the socket is open.
    let served = daemon::serve_session(config, fs.clone(), took_over);
    // Idle worker threads may still hold the filesystem after a signal: unmount explicitly,
    // unless a request is still blocked inside libcephfs (unmounting under it is not safe).
    if !matches!(served, Err(daemon::DaemonError::RequestsStuck(_))) {
        match fs.shutdown() {
            Ok(()) => info!("CephFS unmounted"),
            Err(e) => {
                warn!(error = %e, "unmounting CephFS failed; the MDS will time the session out")
            }
        }
    }
    served.map_err(RunError::Serve)
}

/// What the start did with the session of the device's previous daemon (`--instance-id`).
fn log_reclaim(config: &Config, mount: &ceph_client::Mount) {
    let (Some(id), Some(uuid)) = (&config.ceph.instance_id, config.ceph.session_uuid()) else {
        info!(
            "No --instance-id: if this daemon dies without unmounting, its CephFS session keeps \
             its caps and file locks until the MDS times it out (or it is evicted)"
        );
        return;
    };
    match mount.reclaim_outcome() {
        Some(ReclaimOutcome::Reclaimed) => info!(
            instance_id = %id,
            session_uuid = %uuid,
            "Ended the CephFS session the previous daemon of this device left behind: its caps \
             and file locks are released"
        ),
        _ => info!(
            instance_id = %id,
            session_uuid = %uuid,
            "No CephFS session of a previous daemon of this device to end"
        ),
    }
}

/// The quarantine command's own name: the package installs it as /usr/sbin/ceph-virtiofsd-
/// quarantine, a symlink to the daemon.
const QUARANTINE_PROGRAM: &str = "ceph-virtiofsd-quarantine";

fn main() -> ExitCode {
    // Before any thread exists (libcephfs starts its own): every thread inherits the empty
    // bounding set, and the environment is changed while nobody else reads it.
    if let Err(e) = ceph_virtiofsd::sandbox::drop_bounding_set_early() {
        eprintln!("ceph-virtiofsd: {}", report(&e));
        return Exit::Runtime.into();
    }
    if let Err(e) = ceph_virtiofsd::notify::init_from_env() {
        eprintln!("ceph-virtiofsd: {}", report(&e));
        return Exit::Usage.into();
    }
    // `ceph-virtiofsd quarantine ...` (or the daemon run as ceph-virtiofsd-quarantine) is the
    // operator command; everything else is the daemon's flat, virtiofsd-compatible command line.
    let program = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&program)
        .file_name()
        .is_some_and(|n| n == QUARANTINE_PROGRAM)
    {
        return quarantine_command(QUARANTINE_PROGRAM, std::env::args_os());
    }
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "quarantine")
    {
        return quarantine_command("ceph-virtiofsd quarantine", std::env::args_os().skip(1));
    }
    let args = Args::parse(); // clap prints usage errors itself and exits with 2.
    if args.print_capabilities {
        print!("{CAPABILITIES_JSON}");
        return ExitCode::SUCCESS;
    }
    let config = match Config::try_from(args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("ceph-virtiofsd: {}", report(&e));
            return Exit::Usage.into();
        }
    };
    logging::init(&config.log);
    for warning in &config.warnings {
        warn!("{warning}");
    }
    info!(
        version = env!("CARGO_PKG_VERSION"),
        name = config.ceph.access.name.as_deref().unwrap_or("-"),
        nonblocking_io = config.nonblocking_io,
        readonly = config.readonly,
        "ceph-virtiofsd starting"
    );
    match run(&config) {
        Ok(()) => {
            info!("ceph-virtiofsd stopped");
            Exit::Ok.into()
        }
        Err(e) => {
            error!("{}", report(&e));
            e.exit().into()
        }
    }
}
