//! ceph-virtiofsd entry point: parse, validate, set up logging, run, map errors to exit codes.
//! Exit codes are documented on [`ceph_virtiofsd::Exit`].

use std::process::ExitCode;

use clap::Parser;
use tracing::{error, info, warn};

use std::sync::Arc;

use ceph_client::{Mount, MountBuilder};
use ceph_virtiofsd::args::{Args, CacheMode};
use ceph_virtiofsd::config::{CephConfig, Config};
use ceph_virtiofsd::daemon;
use ceph_virtiofsd::fs::{self, CephFs, FsConfig};
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
    #[error("Cannot open the exported CephFS root {root:?}")]
    Root {
        root: String,
        #[source]
        source: std::io::Error,
    },
    #[error("Serving the guest failed")]
    Serve(#[source] ceph_virtiofsd::daemon::DaemonError),
}

impl RunError {
    fn exit(&self) -> Exit {
        match self {
            RunError::Mount { .. } | RunError::Root { .. } => Exit::Ceph,
            RunError::Serve(_) => Exit::Runtime,
        }
    }
}

/// Connect to the cluster and mount the exported subtree (the only libcephfs mount of this
/// daemon). All `ceph_conf_*` work happens here, before the mount exists.
fn mount_ceph(c: &CephConfig) -> Result<Mount, ceph_client::CephError> {
    let mut b = MountBuilder::new(c.client_id.as_deref())?.conf_read_file(c.conf.as_deref())?;
    if let Some(k) = &c.keyring {
        b = b.conf_set("keyring", &k.to_string_lossy())?;
    }
    b = b.conf_set(
        "client_mount_timeout",
        &c.mount_timeout.as_secs().to_string(),
    )?;
    for (k, v) in &c.options {
        b = b.conf_set(k, v)?;
    }
    if let Some(name) = &c.fs_name {
        b = b.select_filesystem(name)?;
    }
    b.mount(&c.root)
}

fn fs_config(config: &Config) -> FsConfig {
    FsConfig {
        cache: match config.cache {
            CacheMode::Never => fs::CacheMode::Never,
            CacheMode::Auto => fs::CacheMode::Auto,
            CacheMode::Metadata => fs::CacheMode::Metadata,
            CacheMode::Always => fs::CacheMode::Always,
        },
        xattr: config.xattr,
        ..FsConfig::default()
    }
}

fn run(config: &Config) -> Result<(), RunError> {
    let root = config.ceph.root.clone();
    info!(root = %root, "mounting CephFS");
    let mount = mount_ceph(&config.ceph).map_err(|source| RunError::Mount {
        root: root.clone(),
        source,
    })?;
    let fs = Arc::new(
        CephFs::new(mount, fs_config(config)).map_err(|source| RunError::Root { root, source })?,
    );
    let served = daemon::serve(config, fs.clone());
    // Idle worker threads may still hold the filesystem after a signal: unmount explicitly.
    match fs.shutdown() {
        Ok(()) => info!("CephFS unmounted"),
        Err(e) => warn!(error = %e, "unmounting CephFS failed; the MDS will time the session out"),
    }
    served.map_err(RunError::Serve)
}

fn main() -> ExitCode {
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
