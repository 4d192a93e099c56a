//! The TOML file's schema (`--config FILE`, see config/ceph-virtiofsd.toml): every key is
//! optional; [`super::Config::merge`] lays the command line over it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::ConfigError;
use crate::args as cli;

/// The TOML file layout. Every key is optional; see config/ceph-virtiofsd.toml.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    #[serde(default)]
    pub vhost_user: FileVhostUser,
    #[serde(default)]
    pub fuse: FileFuse,
    #[serde(default)]
    pub log: FileLog,
    #[serde(default)]
    pub ceph: FileCeph,
    #[serde(default)]
    pub sandbox: FileSandbox,
    #[serde(default)]
    pub metrics: FileMetrics,
    #[serde(default)]
    pub quarantine: FileQuarantine,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileQuarantine {
    pub enabled: Option<bool>,
    #[serde(default)]
    pub paths: Vec<String>,
    pub recovery: Option<crate::args::RecoveryRole>,
    #[serde(default)]
    pub recovery_paths: Vec<String>,
    pub propagation_ms: Option<u64>,
    /// The watcher's own cephx id (`--quarantine-client-id`).
    pub client_id: Option<String>,
    /// Its keyring (`--quarantine-keyring`).
    pub keyring: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileMetrics {
    pub addr: Option<String>,
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileSandbox {
    pub user: Option<String>,
    pub group: Option<String>,
    pub seccomp: Option<cli::SeccompMode>,
    /// uid translation rules (virtiofsd --translate-uid forms).
    #[serde(default)]
    pub translate_uid: Vec<String>,
    /// gid translation rules.
    #[serde(default)]
    pub translate_gid: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileVhostUser {
    pub socket_path: Option<PathBuf>,
    pub tag: Option<String>,
    pub thread_pool_size: Option<usize>,
    pub queues: Option<u16>,
    pub poll_us: Option<u64>,
    pub nonblocking_io: Option<cli::NonblockingIo>,
    pub keep_serving: Option<bool>,
    pub migration_on_error: Option<cli::MigrationOnError>,
    pub handover: Option<PathBuf>,
    /// `--socket-group`.
    pub socket_group: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileFuse {
    pub cache: Option<cli::CacheMode>,
    pub xattr: Option<bool>,
    pub max_nodes: Option<usize>,
    pub max_handles: Option<usize>,
    pub held_inodes: Option<usize>,
    pub snapshots: Option<cli::Snapshots>,
    pub allow_device_nodes: Option<bool>,
    /// `--request-deadline`.
    pub request_deadline: Option<u64>,
    /// `--readonly`.
    pub readonly: Option<bool>,
    /// `--posix-acl` (true: `always`).
    pub posix_acl: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileLog {
    pub level: Option<cli::LogLevel>,
    pub syslog: Option<bool>,
    pub slow_request_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileCeph {
    pub conf: Option<PathBuf>,
    pub client_id: Option<String>,
    pub keyring: Option<PathBuf>,
    pub fs_name: Option<String>,
    pub root: Option<String>,
    pub mount_timeout: Option<u64>,
    /// The device's stable session identity (`--instance-id`).
    pub instance_id: Option<String>,
    /// The guest's name in the session's client metadata (`--name`).
    pub name: Option<String>,
    /// `--object-cache-mib`.
    pub object_cache_mib: Option<u64>,
    /// `--inode-cache`.
    pub inode_cache: Option<u64>,
    /// Extra libcephfs options.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

impl FileConfig {
    /// Parse a TOML configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::ParseFile {
            path: path.to_owned(),
            source: Box::new(source),
        })
    }
}
