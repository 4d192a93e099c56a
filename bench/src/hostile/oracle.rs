//! The escape oracle: is an inode number the daemon handed out inside its export?
//!
//! Answered through a second, independent libcephfs client mounted at the filesystem root "/":
//! a directory is looked up by number and walked up by ".." to the root; it is inside when the
//! walk passes the export's root. A non-directory (which has no ".." to walk) is inside when a
//! listing of the export's tree holds it. An inode that no longer exists (removed meanwhile,
//! or an unlinked file still open) is "gone", not an escape.
//!
//! libcephfs answers ".." of a directory from the first dentry it has cached for it, lease
//! or no lease, so a client that listed a directory before the daemon renamed it can walk a
//! parent chain that no longer exists (even a loop). An "outside" found through the oracle's
//! long-lived cache is therefore judged again by a fresh client with an empty cache, whose
//! every ".." is a LOOKUPPARENT answered by the MDS; only that verdict is reported, and the
//! fresh client replaces the stale one.

use std::collections::HashSet;
use std::ffi::CString;
use std::path::Path;

use ceph_client::{Inode, Mount, MountBuilder, UserPerm, CEPH_STATX_BASIC_STATS};

/// libcephfs's root inode number.
const CEPH_INO_ROOT: u64 = 1;
/// Most entries a listing of the export reads (the trees the tests build are far smaller).
const LISTING_CAP: usize = 200_000;
/// Most ".." steps from a directory to the root.
const MAX_DEPTH: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Inside,
    /// Outside the export: the path of inode numbers walked, or why.
    Outside(String),
    /// No such inode any more (or an unlinked one): nothing to judge.
    Gone,
}

pub struct Oracle {
    conf: std::path::PathBuf,
    client_id: String,
    export_path: String,
    mount: Mount,
    export: Inode,
    export_ino: u64,
    inside: HashSet<u64>,
    outside: HashSet<u64>,
    perm: UserPerm,
    /// The listing in `inside` is current (see `stale`).
    fresh: bool,
    pub checks: u64,
    /// Tentative "outside" verdicts a fresh client overturned (stale cache in the old one).
    pub overturned: u64,
}

impl std::fmt::Debug for Oracle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oracle")
            .field("export_ino", &self.export_ino)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OracleError {
    #[error("Mounting CephFS \"/\" with {0} as client.{1} for the escape oracle failed (is the cluster up and the keyring readable?)")]
    Mount(String, String, #[source] ceph_client::CephError),
    #[error("Looking up the export {0} from \"/\" failed (does it exist?)")]
    Export(String, #[source] ceph_client::CephError),
}

impl Oracle {
    pub fn new(conf: &Path, client_id: &str, export: &str) -> Result<Oracle, OracleError> {
        let mount = MountBuilder::new(Some(client_id))
            .and_then(|b| b.conf_read_file(Some(conf)))
            .and_then(|b| b.mount("/"))
            .map_err(|e| OracleError::Mount(conf.display().to_string(), client_id.into(), e))?;
        let perm = UserPerm::root();
        let mut cur = mount
            .lookup_root()
            .map_err(|e| OracleError::Export(export.into(), e))?;
        let mut ino = CEPH_INO_ROOT;
        for part in export.split('/').filter(|p| !p.is_empty()) {
            let name = CString::new(part).map_err(|_| {
                OracleError::Export(
                    export.into(),
                    ceph_client::CephError::new("name", libc::EINVAL),
                )
            })?;
            let (next, st) = mount
                .lookup(&cur, &name, CEPH_STATX_BASIC_STATS, 0, &perm)
                .map_err(|e| OracleError::Export(export.into(), e))?;
            cur = next;
            ino = st.stx_ino;
        }
        let mut inside = HashSet::new();
        inside.insert(ino);
        Ok(Oracle {
            conf: conf.to_path_buf(),
            client_id: client_id.into(),
            export_path: export.into(),
            mount,
            export: cur,
            export_ino: ino,
            inside,
            outside: HashSet::new(),
            perm,
            fresh: false,
            checks: 0,
            overturned: 0,
        })
    }

    pub fn export_ino(&self) -> u64 {
        self.export_ino
    }

    /// The export's tree may have changed: the next non-directory not known to be inside
    /// makes `check` list it again.
    pub fn stale(&mut self) {
        self.fresh = false;
    }

    /// Judge `ino` if that needs no listing: known, gone, or a directory (walked up by "..").
    /// `None` for a non-directory not known yet.
    pub fn check_dir(&mut self, ino: u64) -> Option<Verdict> {
        if self.inside.contains(&ino) {
            return Some(Verdict::Inside);
        }
        if self.outside.contains(&ino) {
            return Some(Verdict::Outside(format!("{ino:#x} (known outside)")));
        }
        let Ok(inode) = self.mount.lookup_inode(ino) else {
            return Some(Verdict::Gone);
        };
        let st = self
            .mount
            .getattr(&inode, CEPH_STATX_BASIC_STATS, 0, &self.perm)
            .ok()?;
        if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFDIR {
            self.checks += 1;
            let first = self.walk_up(inode, ino);
            return Some(self.confirm(ino, first));
        }
        None
    }

    /// Judge a tentative verdict again with a fresh client (see the module comment); an
    /// "outside" stands only if the fresh client finds it too.
    fn confirm(&mut self, ino: u64, first: Verdict) -> Verdict {
        let Verdict::Outside(why) = first else {
            return first;
        };
        let mut fresh = match Oracle::new(&self.conf, &self.client_id, &self.export_path) {
            Ok(o) => o,
            Err(e) => {
                return Verdict::Outside(format!("{why} (not confirmed: {e})"));
            }
        };
        fresh.inside = std::mem::take(&mut self.inside);
        fresh.outside = std::mem::take(&mut self.outside);
        fresh.checks = self.checks;
        fresh.overturned = self.overturned;
        let second = fresh.check_fresh(ino);
        if !matches!(second, Verdict::Outside(_)) {
            fresh.overturned += 1;
        }
        *self = fresh;
        match second {
            Verdict::Outside(why2) => {
                self.outside.insert(ino);
                Verdict::Outside(format!("{why2} (cached walk: {why})"))
            }
            other => other,
        }
    }

    /// Judge inode number `ino` (as the daemon put it in an attr's `ino`).
    pub fn check(&mut self, ino: u64) -> Verdict {
        if self.inside.contains(&ino) {
            return Verdict::Inside;
        }
        if self.outside.contains(&ino) {
            return Verdict::Outside(format!("{ino:#x} (known outside)"));
        }
        self.checks += 1;
        let first = self.check_fresh(ino);
        self.confirm(ino, first)
    }

    /// `check` without the known sets' shortcut and without confirmation.
    fn check_fresh(&mut self, ino: u64) -> Verdict {
        let Ok(inode) = self.mount.lookup_inode(ino) else {
            return Verdict::Gone;
        };
        let Ok(st) = self
            .mount
            .getattr(&inode, CEPH_STATX_BASIC_STATS, 0, &self.perm)
        else {
            return Verdict::Gone;
        };
        if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFDIR {
            return self.walk_up(inode, ino);
        }
        if st.stx_nlink == 0 {
            return Verdict::Gone;
        }
        if !self.fresh {
            self.relist();
            self.fresh = true;
        }
        if self.inside.contains(&ino) {
            return Verdict::Inside;
        }
        // Removed between the lookup and the listing?
        match self.mount.lookup_inode(ino).and_then(|i| {
            self.mount
                .getattr(&i, CEPH_STATX_BASIC_STATS, 0, &self.perm)
        }) {
            Ok(st) if st.stx_nlink > 0 => Verdict::Outside(format!(
                "{ino:#x}: a non-directory (mode {:o}) not in the export's tree",
                st.stx_mode
            )),
            _ => Verdict::Gone,
        }
    }

    fn walk_up(&mut self, start: Inode, ino: u64) -> Verdict {
        let dotdot = c"..";
        let mut path = vec![ino];
        let mut cur = start;
        let mut cur_ino = ino;
        for _ in 0..MAX_DEPTH {
            if cur_ino == self.export_ino || self.inside.contains(&cur_ino) {
                self.inside.extend(path.iter().copied());
                return Verdict::Inside;
            }
            if cur_ino == CEPH_INO_ROOT || self.outside.contains(&cur_ino) {
                return Verdict::Outside(format!(
                    "directory {ino:#x}: walking \"..\" reaches the root without passing the export {:#x}: {}",
                    self.export_ino,
                    path.iter()
                        .map(|i| format!("{i:#x}"))
                        .collect::<Vec<_>>()
                        .join(" -> ")
                ));
            }
            let Ok((next, st)) =
                self.mount
                    .lookup(&cur, dotdot, CEPH_STATX_BASIC_STATS, 0, &self.perm)
            else {
                return Verdict::Gone;
            };
            if st.stx_ino == cur_ino && st.stx_nlink == 0 {
                // libcephfs answers ".." of a directory the MDS cannot place (removed,
                // waiting in a stray directory) with the directory itself.
                return Verdict::Gone;
            }
            cur = next;
            cur_ino = st.stx_ino;
            let looped = path.contains(&cur_ino);
            path.push(cur_ino);
            if looped {
                return Verdict::Outside(format!(
                    "directory {ino:#x}: walking \"..\" loops: {}",
                    path.iter()
                        .map(|i| format!("{i:#x}"))
                        .collect::<Vec<_>>()
                        .join(" -> ")
                ));
            }
        }
        Verdict::Outside(format!(
            "directory {ino:#x}: no root within {MAX_DEPTH} steps: {}",
            path.iter()
                .take(12)
                .map(|i| format!("{i:#x}"))
                .collect::<Vec<_>>()
                .join(" -> ")
        ))
    }

    /// Add every inode number of the export's tree (breadth first, capped) to `inside`.
    fn relist(&mut self) {
        let Ok(root) = self.export.try_clone() else {
            return;
        };
        let mut queue = vec![root];
        let mut seen = 0usize;
        while let Some(dir) = queue.pop() {
            let Ok(mut d) = self.mount.opendir(&dir, &self.perm) else {
                continue;
            };
            while let Ok(Some(e)) = d.readdirplus(CEPH_STATX_BASIC_STATS, 0, true) {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                seen += 1;
                if seen > LISTING_CAP {
                    return;
                }
                self.inside.insert(e.statx.stx_ino);
                if u32::from(e.statx.stx_mode) & libc::S_IFMT == libc::S_IFDIR {
                    if let Some(i) = e.inode {
                        queue.push(i);
                    }
                }
            }
        }
    }
}
