//! The "floor": the same operations the workloads send as FUSE requests, called directly
//! through libcephfs (the ceph-client crate) on the host. No vhost-user, no FUSE, no daemon:
//! what is left is the cost of libcephfs and the cluster, the lower bound for any daemon.
//!
//! Each operation maps to the ll call our daemon makes for the corresponding FUSE request
//! (same `want` mask, same open flags), so the MDS traffic is comparable:
//! LOOKUP → `ceph_ll_lookup`, GETATTR → `ceph_ll_getattr`, OPEN/RELEASE → `ceph_ll_open` /
//! `ceph_ll_close`, CREATE → `ceph_ll_create`, READDIRPLUS → `ceph_readdirplus_r` (filling a
//! page the way FUSE packs `fuse_direntplus` records), WRITE/READ → `ceph_ll_write` /
//! `ceph_ll_read`. Node ids and handles are this backend's own (FUSE semantics: every entry
//! returned carries one lookup reference, FORGET drops them).

use std::collections::HashMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ceph_client::{
    CephError, Dir, DirEntryPlus, File, Inode, Mount, MountBuilder, Statx, UserPerm,
    CEPH_SETATTR_SIZE, CEPH_STATX_BASIC_STATS,
};

use crate::backend::{Backend, Batch, Ctx, DirEntry, Op, OpError, Reply};

/// The attributes our daemon asks for on every lookup/getattr (src/fs: `WANT`).
const WANT: u32 = CEPH_STATX_BASIC_STATS;
/// Size of `fuse_entry_out` + the fixed part of `fuse_dirent`: one READDIRPLUS record is
/// this plus the name padded to 8 bytes.
const DIRENTPLUS_FIXED: usize = 128 + 24;
const ROOT: u64 = 1;

/// Where the floor's libcephfs client connects.
#[derive(Debug, Clone)]
pub struct FloorSpec {
    pub conf: PathBuf,
    pub root: String,
    pub client_id: String,
    /// `admin_socket` for this client, so its perf counters can be read.
    pub admin_socket: Option<PathBuf>,
}

impl FloorSpec {
    /// Parses `ceph:/path/to/ceph.conf[:/root]`; `None` if `s` is not a floor target.
    pub fn parse(s: &str, client_id: &str) -> Option<FloorSpec> {
        let rest = s.strip_prefix("ceph:")?;
        let (conf, root) = match rest.split_once(':') {
            Some((c, r)) if !r.is_empty() => (c, r.to_string()),
            Some((c, _)) => (c, "/".to_string()),
            None => (rest, "/".to_string()),
        };
        if conf.is_empty() {
            return None;
        }
        Some(FloorSpec {
            conf: conf.into(),
            root,
            client_id: client_id.to_string(),
            admin_socket: None,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FloorError {
    #[error("Mounting CephFS {root} with {conf} as client.{id} failed (is the cluster up and the keyring readable?)")]
    Mount {
        conf: String,
        root: String,
        id: String,
        #[source]
        source: CephError,
    },
    #[error("Looking up the mount's root failed")]
    Root(#[source] CephError),
}

struct OpenDir {
    dir: Dir,
    /// Position after the last entry handed out (what the next READDIRPLUS asks for).
    pos: u64,
    /// An entry read from libcephfs that did not fit in the previous page.
    pending: Option<DirEntryPlus>,
}

enum Handle {
    File(File),
    Dir(Box<OpenDir>),
}

/// A libcephfs client playing the daemon's part, in-process.
pub struct FloorBackend {
    mount: Mount,
    nodes: HashMap<u64, (Inode, u64)>,
    handles: HashMap<u64, Handle>,
    next_node: u64,
    next_fh: u64,
    perms: HashMap<Ctx, Arc<UserPerm>>,
    max_io: u32,
    /// A reusable buffer for WRITE data (pattern) and READ data in `call`.
    buf: Vec<u8>,
}

impl std::fmt::Debug for FloorBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FloorBackend")
            .field("nodes", &self.nodes.len())
            .field("handles", &self.handles.len())
            .finish_non_exhaustive()
    }
}

fn errno(op: &'static str) -> impl Fn(CephError) -> OpError {
    move |e| OpError::Errno {
        op,
        errno: e.errno(),
    }
}

fn bad(op: &'static str, errno: i32) -> OpError {
    OpError::Errno { op, errno }
}

fn cname(op: &'static str, name: &str) -> Result<CString, OpError> {
    CString::new(name).map_err(|_| bad(op, libc::EINVAL))
}

fn entry(node: u64, st: &Statx) -> Reply {
    Reply::Entry {
        node,
        mode: u32::from(st.stx_mode),
        size: st.stx_size,
        uid: st.stx_uid,
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// The operations that only read the node/handle tables (safe to run from many threads).
fn shared_op(
    mount: &Mount,
    nodes: &HashMap<u64, (Inode, u64)>,
    handles: &HashMap<u64, Handle>,
    perm: &UserPerm,
    op: &Op,
    buf: &mut Vec<u8>,
) -> Result<Reply, OpError> {
    let file = |fh: u64, what| match handles.get(&fh) {
        Some(Handle::File(f)) => Ok(f),
        _ => Err(bad(what, libc::EBADF)),
    };
    match op {
        Op::Getattr { node } => {
            let (inode, _) = nodes.get(node).ok_or(bad("GETATTR", libc::ENOENT))?;
            let st = mount
                .getattr(inode, WANT, 0, perm)
                .map_err(errno("GETATTR"))?;
            Ok(Reply::Attr {
                mode: u32::from(st.stx_mode),
                size: st.stx_size,
                uid: st.stx_uid,
            })
        }
        Op::Write {
            fh, offset, len, ..
        } => {
            let f = file(*fh, "WRITE")?;
            let len = usize::try_from(*len).map_err(|_| bad("WRITE", libc::EINVAL))?;
            if buf.len() < len {
                *buf = pattern(len);
            }
            let data = buf.get(..len).ok_or(bad("WRITE", libc::EINVAL))?;
            let n = f.write(*offset, data).map_err(errno("WRITE"))?;
            Ok(Reply::Written(u32::try_from(n).unwrap_or(u32::MAX)))
        }
        Op::Read {
            fh, offset, len, ..
        } => {
            let f = file(*fh, "READ")?;
            let len = usize::try_from(*len).map_err(|_| bad("READ", libc::EINVAL))?;
            if buf.len() < len {
                buf.resize(len, 0);
            }
            let out = buf.get_mut(..len).ok_or(bad("READ", libc::EINVAL))?;
            let n = f.read(*offset, out).map_err(errno("READ"))?;
            Ok(Reply::Data(u32::try_from(n).unwrap_or(u32::MAX)))
        }
        Op::Fsync { fh, .. } => {
            let f = file(*fh, "FSYNC")?;
            f.fsync(false).map(|_| Reply::Empty).map_err(errno("FSYNC"))
        }
        _ => Err(OpError::Malformed {
            op: "pipeline",
            why: format!("the floor backend pipelines only GETATTR/READ/WRITE/FSYNC, not {op:?}"),
        }),
    }
}

impl FloorBackend {
    /// Mounts CephFS (one libcephfs client per session, like one daemon per guest).
    pub fn connect(spec: &FloorSpec, max_io: u32) -> Result<FloorBackend, FloorError> {
        let merr = |source| FloorError::Mount {
            conf: spec.conf.display().to_string(),
            root: spec.root.clone(),
            id: spec.client_id.clone(),
            source,
        };
        let mut b = MountBuilder::new(Some(&spec.client_id))
            .and_then(|b| b.conf_read_file(Some(Path::new(&spec.conf))))
            .map_err(merr)?;
        if let Some(a) = &spec.admin_socket {
            b = b
                .conf_set("admin_socket", &a.to_string_lossy())
                .map_err(merr)?;
        }
        let mount = b.mount(&spec.root).map_err(merr)?;
        let root = mount.lookup_root().map_err(FloorError::Root)?;
        let mut nodes = HashMap::new();
        nodes.insert(ROOT, (root, 1));
        Ok(FloorBackend {
            mount,
            nodes,
            handles: HashMap::new(),
            next_node: ROOT + 1,
            next_fh: 1,
            perms: HashMap::new(),
            max_io,
            buf: Vec::new(),
        })
    }

    fn perm(&mut self, ctx: Ctx) -> Arc<UserPerm> {
        self.perms
            .entry(ctx)
            .or_insert_with(|| Arc::new(UserPerm::new(ctx.uid, ctx.gid, &[])))
            .clone()
    }

    fn inode(&self, node: u64, op: &'static str) -> Result<&Inode, OpError> {
        self.nodes
            .get(&node)
            .map(|(i, _)| i)
            .ok_or(bad(op, libc::ENOENT))
    }

    fn add_node(&mut self, inode: Inode) -> u64 {
        let id = self.next_node;
        self.next_node += 1;
        self.nodes.insert(id, (inode, 1));
        id
    }

    fn add_handle(&mut self, h: Handle) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, h);
        fh
    }

    fn readdirplus(
        &mut self,
        perm: &UserPerm,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Result<Reply, OpError> {
        let _ = perm;
        let Some(Handle::Dir(d)) = self.handles.get_mut(&fh) else {
            return Err(bad("READDIRPLUS", libc::EBADF));
        };
        if offset != d.pos {
            d.dir
                .seekdir(i64::try_from(offset).map_err(|_| bad("READDIRPLUS", libc::EINVAL))?);
            d.pending = None;
            d.pos = offset;
        }
        let limit = usize::try_from(size).unwrap_or(usize::MAX);
        let mut used = 0usize;
        let mut got: Vec<DirEntryPlus> = Vec::new();
        loop {
            let e = match d.pending.take() {
                Some(e) => e,
                None => match d
                    .dir
                    .readdirplus(WANT, 0, true)
                    .map_err(errno("READDIRPLUS"))?
                {
                    Some(e) => e,
                    None => break,
                },
            };
            let rec = DIRENTPLUS_FIXED + e.name.len().div_ceil(8) * 8;
            if used + rec > limit {
                d.pending = Some(e);
                break;
            }
            used += rec;
            d.pos = u64::try_from(e.offset).unwrap_or(0);
            got.push(e);
        }
        let mut out = Vec::with_capacity(got.len());
        for e in got {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            let kind = u32::from(e.d_type);
            let node = match e.inode {
                Some(i) if name != "." && name != ".." => self.add_node(i),
                _ => 0,
            };
            out.push(DirEntry {
                name,
                node,
                offset: u64::try_from(e.offset).unwrap_or(0),
                kind,
            });
        }
        Ok(Reply::Dir(out))
    }
}

impl Backend for FloorBackend {
    fn call(&mut self, ctx: Ctx, op: Op) -> Result<Reply, OpError> {
        let perm = self.perm(ctx);
        match op {
            Op::Lookup { parent, name } => {
                let c = cname("LOOKUP", &name)?;
                let (inode, st) = self
                    .mount
                    .lookup(self.inode(parent, "LOOKUP")?, &c, WANT, 0, &perm)
                    .map_err(errno("LOOKUP"))?;
                Ok(entry(self.add_node(inode), &st))
            }
            Op::Mkdir { parent, name, mode } => {
                let c = cname("MKDIR", &name)?;
                let (inode, st) = self
                    .mount
                    .mkdir(self.inode(parent, "MKDIR")?, &c, mode, WANT, 0, &perm)
                    .map_err(errno("MKDIR"))?;
                Ok(entry(self.add_node(inode), &st))
            }
            Op::Mknod { parent, name, mode } => {
                let c = cname("MKNOD", &name)?;
                let (inode, st) = self
                    .mount
                    .mknod(self.inode(parent, "MKNOD")?, &c, mode, 0, WANT, 0, &perm)
                    .map_err(errno("MKNOD"))?;
                Ok(entry(self.add_node(inode), &st))
            }
            Op::Create {
                parent,
                name,
                mode,
                flags,
            } => {
                let c = cname("CREATE", &name)?;
                let oflags = i32::try_from(flags).map_err(|_| bad("CREATE", libc::EINVAL))?;
                let (inode, _st, file) = self
                    .mount
                    .create(
                        self.inode(parent, "CREATE")?,
                        &c,
                        mode,
                        oflags,
                        WANT,
                        0,
                        &perm,
                    )
                    .map_err(errno("CREATE"))?;
                let node = self.add_node(inode);
                let fh = self.add_handle(Handle::File(file));
                Ok(Reply::Created { node, fh })
            }
            Op::Unlink { parent, name } => {
                let c = cname("UNLINK", &name)?;
                self.mount
                    .unlink(self.inode(parent, "UNLINK")?, &c, &perm)
                    .map_err(errno("UNLINK"))?;
                Ok(Reply::Empty)
            }
            Op::Open { node, flags } => {
                let oflags = i32::try_from(flags).map_err(|_| bad("OPEN", libc::EINVAL))?;
                let file = self
                    .mount
                    .open(self.inode(node, "OPEN")?, oflags, &perm)
                    .map_err(errno("OPEN"))?;
                Ok(Reply::Open {
                    fh: self.add_handle(Handle::File(file)),
                })
            }
            Op::Release { fh, .. } => match self.handles.remove(&fh) {
                Some(Handle::File(f)) => f.close().map(|_| Reply::Empty).map_err(errno("RELEASE")),
                Some(h @ Handle::Dir(_)) => {
                    self.handles.insert(fh, h);
                    Err(bad("RELEASE", libc::EBADF))
                }
                None => Err(bad("RELEASE", libc::EBADF)),
            },
            Op::Opendir { node } => {
                let dir = self
                    .mount
                    .opendir(self.inode(node, "OPENDIR")?, &perm)
                    .map_err(errno("OPENDIR"))?;
                Ok(Reply::Open {
                    fh: self.add_handle(Handle::Dir(Box::new(OpenDir {
                        dir,
                        pos: 0,
                        pending: None,
                    }))),
                })
            }
            Op::Readdirplus {
                fh, offset, size, ..
            } => self.readdirplus(&perm, fh, offset, size),
            Op::Releasedir { fh, .. } => match self.handles.remove(&fh) {
                Some(Handle::Dir(_)) => Ok(Reply::Empty),
                Some(h) => {
                    self.handles.insert(fh, h);
                    Err(bad("RELEASEDIR", libc::EBADF))
                }
                None => Err(bad("RELEASEDIR", libc::EBADF)),
            },
            Op::Truncate { node, size } => {
                let stx = Statx {
                    stx_size: size,
                    ..Statx::default()
                };
                self.mount
                    .setattr(self.inode(node, "SETATTR")?, &stx, CEPH_SETATTR_SIZE, &perm)
                    .map_err(errno("SETATTR"))?;
                Ok(Reply::Empty)
            }
            op @ (Op::Getattr { .. } | Op::Write { .. } | Op::Read { .. } | Op::Fsync { .. }) => {
                let mut buf = std::mem::take(&mut self.buf);
                let r = shared_op(
                    &self.mount,
                    &self.nodes,
                    &self.handles,
                    &perm,
                    &op,
                    &mut buf,
                );
                self.buf = buf;
                r
            }
        }
    }

    fn pipeline(
        &mut self,
        ctx: Ctx,
        depth: usize,
        count: usize,
        make: &(dyn Fn(usize) -> Op + Sync),
    ) -> Result<Batch, OpError> {
        let perm = self.perm(ctx);
        let (mount, nodes, handles) = (&self.mount, &self.nodes, &self.handles);
        let next = AtomicUsize::new(0);
        let start = Instant::now();
        // One thread per request in flight: libcephfs calls block, so this is how a
        // daemon's worker pool would keep `depth` of them outstanding.
        let results: Vec<Batch> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..depth.clamp(1, 256))
                .map(|_| {
                    let (perm, next) = (&perm, &next);
                    sc.spawn(move || {
                        let mut b = Batch::default();
                        let mut buf = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= count {
                                break;
                            }
                            let op = make(i);
                            let t = Instant::now();
                            match shared_op(mount, nodes, handles, perm, &op, &mut buf) {
                                Ok(r) => {
                                    b.latencies.push(t.elapsed());
                                    if let Reply::Written(n) | Reply::Data(n) = r {
                                        b.bytes += u64::from(n);
                                    }
                                }
                                Err(e) => b.errors.push(e),
                            }
                        }
                        b
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| Batch {
                        errors: vec![OpError::Malformed {
                            op: "pipeline",
                            why: "worker thread panicked".into(),
                        }],
                        ..Batch::default()
                    })
                })
                .collect()
        });
        let mut all = Batch {
            wall: start.elapsed(),
            ..Batch::default()
        };
        for b in results {
            all.latencies.extend(b.latencies);
            all.bytes += b.bytes;
            all.errors.extend(b.errors);
        }
        Ok(all)
    }

    fn forget(&mut self, nodes: &[(u64, u64)]) -> Result<(), OpError> {
        for &(node, count) in nodes {
            if node == ROOT {
                continue;
            }
            if let Some((_, refs)) = self.nodes.get_mut(&node) {
                *refs = refs.saturating_sub(count);
                if *refs == 0 {
                    self.nodes.remove(&node);
                }
            }
        }
        Ok(())
    }

    fn root(&self) -> u64 {
        ROOT
    }

    fn max_io(&self) -> u32 {
        self.max_io
    }
}

impl Drop for FloorBackend {
    fn drop(&mut self) {
        // Close handles and drop inode references before the mount goes away.
        self.handles.clear();
        self.nodes.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_target_syntax() {
        let s = FloorSpec::parse("ceph:/x/ceph.conf", "admin").expect("floor");
        assert_eq!(s.conf, PathBuf::from("/x/ceph.conf"));
        assert_eq!(s.root, "/");
        let s = FloorSpec::parse("ceph:/x/ceph.conf:/sub", "bench").expect("floor");
        assert_eq!(s.root, "/sub");
        assert_eq!(s.client_id, "bench");
        assert!(FloorSpec::parse("/tmp/a.sock", "admin").is_none());
        assert!(FloorSpec::parse("ceph:", "admin").is_none());
    }
}
