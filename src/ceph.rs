//! Reaching the cluster: every libcephfs mount the daemon makes (the export, the quarantine
//! watcher, the operator command) is configured here, in one place.

use std::path::PathBuf;
use std::time::Duration;

use ceph_client::{CephError, Mount, MountBuilder};

/// libcephfs subsystems whose in-memory debug log is off unless the operator asks for it.
///
/// Ceph's defaults (`debug_client = 0/5` …) keep formatting and queueing log entries in memory
/// on every call, for a dump after a crash; measured on the request path, that work took about a
/// tenth of the daemon's CPU time. `--ceph-opt debug_client=0/5` (or ceph.conf) brings it back:
/// options from the file and the command line are applied after these defaults.
const QUIET_LOGS: &[&str] = &[
    "debug_client",
    "debug_ms",
    "debug_objecter",
    "debug_objectcacher",
    "debug_monc",
    "debug_auth",
    "debug_crypto",
    "debug_finisher",
];

/// How to reach the cluster (the `[ceph]` part of the daemon's configuration).
#[derive(Debug, Clone, Default)]
pub struct CephAccess {
    pub conf: Option<PathBuf>,
    pub client_id: Option<String>,
    pub keyring: Option<PathBuf>,
    pub fs_name: Option<String>,
    pub options: Vec<(String, String)>,
    pub mount_timeout: Duration,
}

impl CephAccess {
    /// Connect and mount `root`. All `ceph_conf_*` work happens here, before the mount exists.
    pub fn mount(&self, root: &str) -> Result<Mount, CephError> {
        self.mount_with(root, None)
    }

    /// [`Self::mount`], with libcephfs callbacks going to `handler`.
    pub fn mount_with(
        &self,
        root: &str,
        handler: Option<Box<dyn ceph_client::CallbackHandler>>,
    ) -> Result<Mount, CephError> {
        let mut b =
            MountBuilder::new(self.client_id.as_deref())?.conf_read_file(self.conf.as_deref())?;
        // Only where the file asked for no logging to disk: a file that sets a level keeps it.
        for key in QUIET_LOGS {
            if b.conf_get(key).is_ok_and(|v| v.starts_with("0/")) {
                b = b.conf_set(key, "0/0")?;
            }
        }
        if let Some(k) = &self.keyring {
            b = b.conf_set("keyring", &k.to_string_lossy())?;
        }
        if !self.mount_timeout.is_zero() {
            b = b.conf_set(
                "client_mount_timeout",
                &self.mount_timeout.as_secs().to_string(),
            )?;
        }
        for (k, v) in &self.options {
            b = b.conf_set(k, v)?;
        }
        if let Some(n) = &self.fs_name {
            b = b.select_filesystem(n)?;
        }
        if let Some(h) = handler {
            b = b.register_callbacks(h);
        }
        b.mount(root)
    }

    /// Mount the whole filesystem (the quarantine state of ancestors of an export is needed).
    pub fn mount_root(&self) -> Result<Mount, CephError> {
        self.mount("/")
    }
}

impl From<&crate::config::CephConfig> for CephAccess {
    fn from(c: &crate::config::CephConfig) -> Self {
        CephAccess {
            conf: c.conf.clone(),
            client_id: c.client_id.clone(),
            keyring: c.keyring.clone(),
            fs_name: c.fs_name.clone(),
            options: c.options.clone(),
            mount_timeout: c.mount_timeout,
        }
    }
}
