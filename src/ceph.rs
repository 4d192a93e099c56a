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

/// How to reach the cluster (the `[ceph]` part of the daemon's configuration, and the
/// quarantine command's cluster options). Its `Debug` output hides secret option values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CephAccess {
    /// ceph.conf path; `None` = libcephfs's default search path.
    pub conf: Option<PathBuf>,
    /// Client id without "client." (`None` = libcephfs default, "admin").
    pub client_id: Option<String>,
    pub keyring: Option<PathBuf>,
    pub fs_name: Option<String>,
    /// Extra libcephfs options, applied in this order (keys are unique).
    pub options: Vec<(String, String)>,
    /// libcephfs's `client_mount_timeout`; zero = libcephfs's default.
    pub mount_timeout: Duration,
    /// The stable uuid of the sessions of mounts made through this access (see
    /// [`session_uuid`]): before mounting, the session that has it (left behind by a daemon
    /// that was killed or crashed) is ended at once, releasing its caps and file locks, and the
    /// new session takes it over for the next start to find. `None`: no reclaim. Only for an
    /// access whose mounts never live at the same time: the MDS refuses a session with the uuid
    /// of a live one, and a reclaim with it ends whichever session has it.
    pub session_uuid: Option<String>,
    /// The guest's name (`--name`): `vm=NAME` in the sessions' client metadata (see
    /// [`client_metadata`]). `None`: only the daemon's version is set there.
    pub name: Option<String>,
}

/// The CephFS client metadata of a session of this daemon (libcephfs's `client_metadata`,
/// `key=value,...`; the MDS keeps it with the session, `ceph tell mds.* session ls` shows it and
/// `client evict client_metadata.vm=NAME` selects by it): `vm=NAME` when the guest's name is
/// known, and `ceph_virtiofsd=VERSION`. `operator` is a `client_metadata` the operator set
/// (ceph.conf or `--ceph-opt`), kept after ours. The name is checked by the configuration (no
/// `,` or `=`).
pub fn client_metadata(name: Option<&str>, operator: Option<&str>) -> String {
    let mut pairs = Vec::new();
    if let Some(n) = name {
        pairs.push(format!("vm={n}"));
    }
    pairs.push(format!("ceph_virtiofsd={}", env!("CARGO_PKG_VERSION")));
    if let Some(o) = operator.map(str::trim).filter(|o| !o.is_empty()) {
        pairs.push(o.to_owned());
    }
    pairs.join(",")
}

/// The CephFS session uuid of the device `instance_id` (`--instance-id`) served as cephx user
/// `cephx_name` ("client.vm1"): `ceph-virtiofsd/client.vm1/INSTANCE`, and for the daemon's
/// other long-lived session, the quarantine watcher's, `ceph-virtiofsd/client.vm1/INSTANCE/
/// quarantine`. The MDS keeps it in the session's client metadata (`ceph tell mds.* session
/// ls` shows it as `uuid`); a restarted daemon ends the session that has it. The cephx name is
/// part of it because the MDS lets only the same cephx user end a session: two users that pick
/// the same instance id do not meet.
pub fn session_uuid(cephx_name: &str, instance_id: &str) -> String {
    format!("ceph-virtiofsd/{cephx_name}/{instance_id}")
}

/// A duration option of the not yet mounted client, in whole seconds (at least 1; libcephfs's
/// default `client_mount_timeout`, 300 s, if it cannot be read).
fn conf_secs(b: &MountBuilder, key: &str) -> Duration {
    let secs = b
        .conf_get(key)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 1.0)
        .unwrap_or(300.0);
    Duration::from_secs_f64(secs.min(86_400.0))
}

/// libcephfs options whose value is a secret (the cephx key itself): never printed.
pub fn is_secret_option(key: &str) -> bool {
    let k = key.trim().to_ascii_lowercase().replace('-', "_");
    k == "key" || k.contains("secret") || k.ends_with("_key") || k.contains("password")
}

impl std::fmt::Debug for CephAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let options: Vec<(&str, &str)> = self
            .options
            .iter()
            .map(|(k, v)| {
                let shown = if is_secret_option(k) {
                    "<redacted>"
                } else {
                    v.as_str()
                };
                (k.as_str(), shown)
            })
            .collect();
        f.debug_struct("CephAccess")
            .field("conf", &self.conf)
            .field("client_id", &self.client_id)
            .field("keyring", &self.keyring)
            .field("fs_name", &self.fs_name)
            .field("options", &options)
            .field("mount_timeout", &self.mount_timeout)
            .field("session_uuid", &self.session_uuid)
            .field("name", &self.name)
            .finish()
    }
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
        let is_metadata = |k: &str| k.trim().replace([' ', '-'], "_") == "client_metadata";
        let mut operator_metadata = b.conf_get("client_metadata").ok();
        for (k, v) in &self.options {
            if is_metadata(k) {
                operator_metadata = Some(v.clone());
                continue;
            }
            b = b.conf_set(k, v)?;
        }
        // Which VM and which software a session belongs to, for `session ls` (without
        // evicting anything: it is only metadata).
        b = b.conf_set(
            "client_metadata",
            &client_metadata(self.name.as_deref(), operator_metadata.as_deref()),
        )?;
        if let Some(n) = &self.fs_name {
            b = b.select_filesystem(n)?;
        }
        if let Some(h) = handler {
            b = b.register_callbacks(h);
        }
        let Some(uuid) = &self.session_uuid else {
            return b.mount(root);
        };
        // Reset, the only reclaim the MDS implements: the old session ends, and nothing of it
        // is taken over (the guest's state is rebuilt by the guest, or handed over).
        b = b
            .reclaim(uuid, ceph_client::CEPH_RECLAIM_RESET)?
            .set_uuid(uuid)?;
        // `ceph_start_reclaim` waits for an active MDS without any timeout of its own (with the
        // file system down, a start hung past --mount-timeout until it came back), while
        // `ceph_mount` gives up after `client_mount_timeout`. Bounded here: the reclaim gets
        // that timeout and the mount its own after it. On expiry the call stays blocked in its
        // thread (it cannot be cancelled) and releases the handle if it ever returns; the
        // caller is expected to give up, as the daemon's start does.
        let bound = conf_secs(&b, "client_mount_timeout").saturating_mul(2);
        let (tx, rx) = std::sync::mpsc::channel();
        let root = root.to_owned();
        std::thread::Builder::new()
            .name("ceph-reclaim".to_owned())
            .spawn(move || {
                let _ = tx.send(b.mount(&root));
            })
            .map_err(|e| {
                CephError::new(
                    "ceph_start_reclaim",
                    e.raw_os_error().unwrap_or(libc::EAGAIN),
                )
            })?;
        rx.recv_timeout(bound)
            .unwrap_or(Err(CephError::new("ceph_start_reclaim", libc::ETIMEDOUT)))
    }

    /// The cephx name the mounts authenticate as: "client." and the client id (libcephfs's
    /// default, "admin", without one).
    pub fn cephx_name(&self) -> String {
        format!("client.{}", self.client_id.as_deref().unwrap_or("admin"))
    }

    /// Mount the whole filesystem (the quarantine state of ancestors of an export is needed).
    pub fn mount_root(&self) -> Result<Mount, CephError> {
        self.mount("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_secret_option_values() {
        let secret = "AQBdecafbadc0ffee0000000000000000000000==";
        let access = CephAccess {
            client_id: Some("vm1".to_owned()),
            options: vec![
                ("key".to_owned(), secret.to_owned()),
                ("auth-secret".to_owned(), format!("{secret}2")),
                ("client_cache_size".to_owned(), "4096".to_owned()),
            ],
            ..CephAccess::default()
        };
        let shown = format!("{access:?} {access:#?}");
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        assert!(shown.contains("client_cache_size") && shown.contains("4096"));
        assert!(shown.contains("vm1"));
        assert!(!is_secret_option("keyring") && !is_secret_option("keyfile"));
    }

    #[test]
    fn client_metadata_names_the_vm_and_the_daemon() {
        let v = env!("CARGO_PKG_VERSION");
        assert_eq!(
            client_metadata(Some("vm-1"), None),
            format!("vm=vm-1,ceph_virtiofsd={v}")
        );
        assert_eq!(client_metadata(None, None), format!("ceph_virtiofsd={v}"));
        assert_eq!(
            client_metadata(None, Some(" rack=r1 ")),
            format!("ceph_virtiofsd={v},rack=r1")
        );
        assert_eq!(
            client_metadata(None, Some("")),
            format!("ceph_virtiofsd={v}")
        );
    }
}
