//! The operator command's work: quarantine, release or report one path, for every daemon.

use ceph_client::{CephError, UserPerm};

use super::*;

/// What the operator asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Enable,
    Disable,
    Status,
}

/// Why the operator command failed. Each message names the step and what to do.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{0:?} is not an absolute CephFS path such as /volumes/_nogroup/sv1")]
    BadPath(String),
    #[error("Cannot connect to the Ceph cluster or mount CephFS: check --ceph-conf, --client-id and --keyring")]
    Mount(#[source] CephError),
    #[error("Cannot find {path} in CephFS: check the path (ceph fs subvolume getpath gives a subvolume's path; quarantine its parent /volumes/<group>/<name>)")]
    Resolve {
        path: String,
        #[source]
        source: CephError,
    },
    #[error(
        "Cannot {step} the quarantine state of {path}: this client needs rw and 'p' caps on it"
    )]
    State {
        step: &'static str,
        path: String,
        #[source]
        source: CephError,
    },
}

/// Run `quarantine enable|disable|status PATH`; returns the line to print.
pub fn command(access: &CephAccess, action: Action, path: &str) -> Result<String, CommandError> {
    let path = normalize(path).ok_or_else(|| CommandError::BadPath(path.to_owned()))?;
    let mount = access.mount_root().map_err(CommandError::Mount)?;
    let perm = UserPerm::root();
    let dir = resolve(&mount, &path, &perm).map_err(|source| CommandError::Resolve {
        path: path.clone(),
        source,
    })?;
    let state = |step: &'static str| {
        let path = path.clone();
        move |source| CommandError::State { step, path, source }
    };
    let kind = match subvolume_of(&path) {
        Some(s) if s == path => "subvolume",
        _ => "directory (enforced by daemons that list it with --quarantine-path)",
    };
    let out = match action {
        Action::Enable => {
            mount
                .setxattr(&dir, STATE_XATTR, QUARANTINED, 0, &perm)
                .map_err(state("set"))?;
            format!("{path}: quarantined ({kind})")
        }
        Action::Disable => {
            match mount.removexattr(&dir, STATE_XATTR, &perm) {
                Ok(()) => {}
                Err(e) if e.errno() == libc::ENODATA => {}
                Err(e) => return Err(state("clear")(e)),
            }
            format!("{path}: released ({kind})")
        }
        Action::Status => {
            let q = read_state(&mount, &dir, &perm).map_err(state("read"))?;
            format!(
                "{path}: {} ({kind})",
                if q { "quarantined" } else { "released" }
            )
        }
    };
    drop(dir);
    // Nothing is in flight: this thread is the mount's only user.
    let _ = mount.shutdown(std::time::Duration::ZERO);
    Ok(out)
}
