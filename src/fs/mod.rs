//! The filesystem: FUSE requests served by calling CephFS through libcephfs.
//!
//! This layer knows nothing of virtio or vhost-user: it implements fuse-backend-rs's
//! `FileSystem` trait (plus the server's traits, [`crate::server::Servable`], for the opcodes fuse-backend-rs does not
//! dispatch) over the `ceph-client` crate. Node ids and handles are ours ([`nodes`],
//! [`handles`]); credentials come from the request ([`perms`]); how long the guest may cache what
//! we return is [`policy`]'s decision; the SB_NOSEC contract is [`killpriv`]'s. The
//! `FileSystem` impl below is the table of operations, each forwarded to the room of its
//! concern: names and entries (`entries`), attributes (`attr`), open files (`open`), extended
//! attributes (`xattr`), directory streams (`dir`), locks (`locks`) and data I/O (`data`), with
//! quarantine domains (`domain`) and privilege removal (`kill`) beside them.
//!
//! Everything here treats the guest as untrusted: every node id and handle is looked up (unknown
//! → EBADF/ENOENT-class errno, never a dereference), names are checked before they reach
//! libcephfs, offsets and lengths are checked against i64, and every error keeps its raw errno.

#[cfg(libcephfs_nonblocking)]
mod aio;
mod attr;
pub mod cached;
mod data;
mod dir;
mod domain;
mod entries;
pub mod handles;
mod kill;
pub mod killpriv;
pub mod limits;
mod locks;
pub mod names;
pub mod nodes;
mod open;
pub mod perms;
pub mod policy;
pub mod recover;
pub mod shards;
pub mod side;
mod state;
mod stats;
mod tmpfile;
mod xattr;

use arc_swap::ArcSwap;
use std::ffi::CStr;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ceph_client::{Inode, Mount, Statx, CEPH_SNAPDIR, CEPH_STATX_BASIC_STATS, CEPH_STATX_INO};
use fuse_backend_rs::abi::fuse_abi::{
    stat64, statvfs64, CreateIn, FsOptions, OpenOptions, SetattrValid,
};
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileLock, FileSystem, GetxattrReply, ListxattrReply, ZeroCopyReader,
    ZeroCopyWriter,
};

use handles::HandleTable;
use limits::{LimitStats, Table};
use nodes::{NewNode, NodeTable, Vino, NOSNAP};

use crate::idmap::IdMapping;

type Link = nodes::Link<Inode>;
use perms::{Caller, PermCache};
use policy::{CachePolicy, NodeClass};

pub use attr::access_allowed;
pub use dir::DirStream;
pub use open::OpenFile;
pub use policy::{CacheMode, SnapshotPolicy};

/// The longest symlink target (PATH_MAX).
const PATH_MAX: usize = 4096;

/// How long [`CephFs::shutdown`] waits for libcephfs calls still in flight before it gives up
/// the unmount (the MDS then times the session out).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// The attributes every reply carries.
const WANT: u32 = CEPH_STATX_BASIC_STATS;

type Node = nodes::Node<Inode>;

/// What an open handle stands for.
#[derive(Debug)]
pub enum Handle {
    File(Arc<OpenFile>),
    Dir(Mutex<DirStream>),
}

/// Filesystem options, derived from the daemon's configuration.
#[derive(Clone, Debug)]
pub struct FsConfig {
    pub cache: CacheMode,
    /// TTL of the `auto` cache mode.
    pub auto_ttl: Duration,
    /// Upper bound for entry/attr TTLs of inodes whose access can be revoked (quarantine).
    pub revocable_ttl: Duration,
    /// Offer FUSE_HANDLE_KILLPRIV_V2 (lets the guest set SB_NOSEC).
    pub killpriv_v2: bool,
    /// Serve xattrs at all.
    pub xattr: bool,
    /// Offer POSIX ACLs (FUSE_POSIX_ACL): the guest kernel then enforces them and reads and
    /// writes them as `system.posix_acl_*` xattrs; libcephfs enforces them too when its
    /// `client_acl_type` is `posix_acl` (the configuration sets it with this).
    pub posix_acl: bool,
    /// Let guests set/remove `ceph.*` virtual xattrs (layouts, quotas).
    pub allow_ceph_xattr_set: bool,
    /// Quarantine gate (None = quarantine support off). See [`crate::quarantine`].
    pub quarantine: Option<Arc<crate::quarantine::Gate>>,
    /// Most nodes the guest may hold (see [`limits`]).
    pub max_nodes: usize,
    /// Most open handles the guest may hold (see [`limits`]).
    pub max_handles: usize,
    /// Most libcephfs inode references the node table keeps (`--held-inodes`); beyond it the
    /// nodes used least lately release theirs ([`NodeTable::trim`]).
    pub held_inodes: usize,
    /// What the guest may do in `.snap` directories.
    pub snapshots: SnapshotPolicy,
    /// Let MKNOD create character and block device nodes.
    pub allow_device_nodes: bool,
    /// How to open another session, for renames over hard links ([`side`]); without it they
    /// go through the main session, and libcephfs may then hide the file's other names.
    pub second_session: Option<side::Connector>,
    /// uid/gid translation between the guest and CephFS (`--translate-uid/--translate-gid`).
    pub idmap: IdMapping,
    /// `--readonly`: every operation that would change the file system fails with EROFS
    /// ([`CephFs::writable`]).
    pub readonly: bool,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            cache: CacheMode::Auto,
            auto_ttl: policy::AUTO_TTL,
            revocable_ttl: Duration::from_secs(1),
            killpriv_v2: true,
            xattr: true,
            posix_acl: false,
            allow_ceph_xattr_set: false,
            quarantine: None,
            max_nodes: limits::DEFAULT_MAX_NODES,
            max_handles: limits::DEFAULT_MAX_HANDLES,
            held_inodes: limits::DEFAULT_HELD_INODES,
            snapshots: SnapshotPolicy::default(),
            allow_device_nodes: false,
            second_session: None,
            idmap: IdMapping::default(),
            readonly: false,
        }
    }
}

/// CephFS served as a FUSE filesystem.
#[derive(Debug)]
pub struct CephFs {
    /// The CephFS session; replaced by a new one when the MDS evicted this client
    /// ([`recover`]), with no request running.
    mount: ArcSwap<Mount>,
    nodes: NodeTable<Inode>,
    handles: HandleTable<Handle>,
    perms: PermCache,
    policy: CachePolicy,
    cfg: FsConfig,
    /// HANDLE_KILLPRIV_V2 was negotiated with the guest.
    killpriv: AtomicBool,
    /// Inodes whose data libcephfs's object cache may hold.
    cached: cached::CachedInodes,
    /// Refusals at the node and handle limits.
    limits: LimitStats,
    /// Node references released to keep `held_inodes` (trims and MDS recalls), and inodes
    /// found again by number after one.
    nodes_released: AtomicU64,
    nodes_refound: AtomicU64,
    /// A request is trimming the node table (one at a time; the others go on).
    trimming: AtomicBool,
    /// The guest's FUSE session is open: INIT came and no DESTROY since.
    session: AtomicBool,
    /// References held when the last trim ended short of its goal (0 when it reached it): no
    /// trim before the table holds a sixteenth of the limit more (see `bound_held_inodes`).
    trim_floor: AtomicUsize,
    /// Short second sessions, for renames over hard links.
    side: side::SideClient,
    /// The snapshot directory's name (libcephfs's `client_snapdir`).
    snapdir: Box<[u8]>,
    /// Live migration of the guest's session ([`state`]).
    migration: state::Migration,
    /// A new CephFS session after an eviction ([`recover`]).
    recovery: recover::Recovery,
    /// The open O_TMPFILE files and their private names ([`tmpfile`]).
    tmpfiles: tmpfile::TmpFiles,
    /// The flags the last FUSE_INIT was answered with wanting (`FsOptions` bits).
    /// READs and WRITEs of O_DIRECT handles in flight without a thread waiting ([`aio`]).
    #[cfg(libcephfs_nonblocking)]
    aio: aio::Aio,
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// An offset the guest sent, as libcephfs's signed offset.
fn to_off(off: u64) -> io::Result<i64> {
    i64::try_from(off).map_err(|_| errno(libc::EINVAL))
}

/// An offset + length range that must stay within i64.
fn range(off: u64, len: u64) -> io::Result<(i64, i64)> {
    let end = off.checked_add(len).ok_or_else(|| errno(libc::EFBIG))?;
    if i64::try_from(end).is_err() {
        return Err(errno(libc::EFBIG));
    }
    Ok((to_off(off)?, to_off(len)?))
}

/// The permission and special bits of a mode (12 bits: the conversion cannot fail).
fn perm_bits(mode: u32) -> u16 {
    u16::try_from(mode & 0o7777).unwrap_or(0)
}

/// The open flags of the guest's `flags` that are passed on: those of `keep`, which are all below
/// the sign bit, so the result is a valid `int` (EINVAL otherwise).
fn open_flags(flags: u32, keep: i32) -> io::Result<i32> {
    let keep = u32::try_from(keep).map_err(|_| errno(libc::EINVAL))?;
    i32::try_from(flags & keep).map_err(|_| errno(libc::EINVAL))
}

/// A byte count the guest sent, as a buffer length (EINVAL where usize is narrower).
fn to_len(size: u32) -> io::Result<usize> {
    usize::try_from(size).map_err(|_| errno(libc::EINVAL))
}

/// A byte count libcephfs moved, as a file offset delta: usize is at most 64 bits on every
/// target Rust supports, so the saturation is never reached.
fn len64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn vino_of(st: &Statx) -> Vino {
    Vino {
        ino: st.stx_ino,
        snapid: st.snapid(),
    }
}

fn kind_of(st: &Statx) -> u32 {
    u32::from(st.stx_mode) & libc::S_IFMT
}

/// CephFS's root directory inode number (CEPH_INO_ROOT).
const CEPH_INO_ROOT: u64 = 1;

impl CephFs {
    /// Serve the mount's root (the exported subtree) as the FUSE root.
    pub fn new(mount: Mount, cfg: FsConfig) -> io::Result<Self> {
        let root = mount.lookup_root()?;
        let perms = PermCache::default();
        let st = mount.getattr(&root, WANT, 0, &perms.root())?;
        let nodes = NodeTable::new(NewNode {
            vino: vino_of(&st),
            kind: kind_of(&st),
            domain: cfg
                .quarantine
                .as_ref()
                .map_or((0, 0), |g| (g.root_domain(), g.generation())),
            link: None,
            inode: root,
        });
        nodes.set_limit(cfg.max_nodes);
        let handles = HandleTable::default();
        handles.set_limit(cfg.max_handles);
        // The name libcephfs answers lookups of with the snapshot directory.
        let snapdir = mount
            .conf_get("client_snapdir")
            .map_or_else(|_| b".snap".to_vec(), String::into_bytes)
            .into_boxed_slice();
        Ok(CephFs {
            side: side::SideClient::new(cfg.second_session.clone()),
            snapdir,
            mount: ArcSwap::from_pointee(mount),
            nodes,
            handles,
            perms,
            policy: CachePolicy::new(cfg.cache, cfg.auto_ttl, cfg.revocable_ttl),
            cfg,
            killpriv: AtomicBool::new(false),
            cached: cached::CachedInodes::default(),
            limits: LimitStats::default(),
            nodes_released: AtomicU64::new(0),
            nodes_refound: AtomicU64::new(0),
            trimming: AtomicBool::new(false),
            session: AtomicBool::new(false),
            trim_floor: AtomicUsize::new(0),
            migration: state::Migration::default(),
            recovery: recover::Recovery::default(),
            tmpfiles: tmpfile::TmpFiles::default(),
            #[cfg(libcephfs_nonblocking)]
            aio: aio::Aio::default(),
        })
    }

    /// `--readonly`: EROFS for an operation that would change the file system. Checked first
    /// in each such operation of the [`FileSystem`] impl (setattr, symlink, mknod, mkdir,
    /// unlink, rmdir, rename, link, create, write, fallocate, setxattr, removexattr, and an
    /// open for writing or truncation), before anything reaches libcephfs.
    fn writable(&self) -> io::Result<()> {
        if self.cfg.readonly {
            return Err(errno(libc::EROFS));
        }
        Ok(())
    }

    /// Requests refused at the limits so far: (nodes, handles).
    pub fn limit_refusals(&self) -> (u64, u64) {
        self.limits.refusals()
    }

    /// Node table size (for metrics and tests).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Libcephfs inode references: (held now, released so far, found again so far).
    pub fn inode_refs(&self) -> (usize, u64, u64) {
        (
            self.nodes.held(),
            self.nodes_released.load(Ordering::Relaxed),
            self.nodes_refound.load(Ordering::Relaxed),
        )
    }

    /// The MDS recalled `vino` (cache pressure): the node holding it gives its reference up
    /// unless it is pinned; found again by number on its next use.
    pub fn release_recalled(&self, vino: Vino) -> bool {
        let released = self.nodes.release_vino(vino);
        if released {
            self.nodes_released.fetch_add(1, Ordering::Relaxed);
        }
        released
    }

    /// Keep the references the node table holds within `held_inodes`: over it, the request
    /// that notices trims the table down by a sixteenth of the limit (one request at a time;
    /// the rest go on). A load of two counters when under the limit. Should a trim end short
    /// of its goal (only the export root is never released, but requests in flight may hold
    /// what a sweep passes), the next waits until a sixteenth of the limit more is held: a
    /// table that stays over the limit is not swept whole on every request.
    fn bound_held_inodes(&self) {
        let limit = self.cfg.held_inodes;
        let held = self.nodes.held();
        if held <= limit.max(self.trim_floor.load(Ordering::Relaxed))
            || self.trimming.swap(true, Ordering::Acquire)
        {
            return;
        }
        let released = self.nodes.trim(limit - limit / 16);
        self.nodes_released
            .fetch_add(len64(released), Ordering::Relaxed);
        let left = self.nodes.held();
        let floor = if left > limit {
            left.saturating_add(limit / 16 + 1)
        } else {
            0
        };
        self.trim_floor.store(floor, Ordering::Relaxed);
        self.trimming.store(false, Ordering::Release);
    }

    /// Handle table size (for metrics and tests).
    pub fn handle_count(&self) -> usize {
        self.handles.len()
    }

    /// Drop every node and handle the guest was given (closing a handle gives back the locks
    /// taken through it).
    fn end_session(&self) {
        self.handles.clear();
        self.nodes.clear();
        self.tmpfiles_end();
    }

    /// The current CephFS session.
    pub fn mount(&self) -> arc_swap::Guard<Arc<Mount>> {
        self.mount.load()
    }

    /// End of service: close every handle, drop every node, and unmount, so the MDS session
    /// ends cleanly (dirty data flushed, caps returned) even while idle worker threads still
    /// hold the filesystem. Meant for after the requests were drained: a libcephfs call still
    /// in flight is waited for (at most `SHUTDOWN_WAIT`; EBUSY and no unmount after that),
    /// and requests afterwards fail with ENOTCONN ([`Mount::shutdown`]).
    pub fn shutdown(&self) -> io::Result<()> {
        self.handles.clear();
        self.nodes.clear();
        self.tmpfiles_end();
        Ok(self.mount().shutdown(SHUTDOWN_WAIT)?)
    }

    /// See [`names::check_changed`].
    fn changed_name(&self, name: &CStr, change: names::Change) -> io::Result<()> {
        names::check_changed(name, &self.snapdir, self.cfg.snapshots.visible(), change)
            .map_err(errno)
    }

    fn node(&self, id: u64) -> io::Result<Arc<Node>> {
        // An id the guest never got (or already forgot) is a stale handle, not a dereference.
        self.nodes.get(id).ok_or_else(|| errno(libc::ESTALE))
    }

    /// A node's libcephfs inode: the reference it holds, or, if it released it
    /// ([`NodeTable::trim`]), the inode found again by number (libcephfs's cache, else one MDS
    /// round trip; a snapshot-side node through its names, [`Self::refind_by_names`]) and held
    /// again. An inode gone meanwhile (deleted by another client, and no handle keeps it) is
    /// ESTALE, as for an id the guest forgot.
    fn inode(&self, node: &Node) -> io::Result<Arc<Inode>> {
        let mut refound = false;
        let inode = node.inode_or_else(|vino| {
            refound = true;
            self.nodes_refound.fetch_add(1, Ordering::Relaxed);
            if vino.snapid != NOSNAP {
                return self.refind_by_names(node);
            }
            self.mount()
                .lookup_inode(vino.ino)
                .map_err(|e| match e.errno() {
                    libc::ENOENT => errno(libc::ESTALE),
                    _ => e.into(),
                })
        })?;
        // Only a re-found reference adds to what the table holds.
        if refound {
            self.bound_held_inodes();
        }
        Ok(inode)
    }

    /// The inode of a `.snap` directory or a snapshot inode whose reference was released: these
    /// cannot be found by number alone, so each is looked up again by the names it was found
    /// by, down from the nearest ancestor at hand (one holding its reference, or a head
    /// directory, found by number). A snapshot does not change, so each name leads where it
    /// led; what it leads to must be the node's own vino (a snapshot removed and made again
    /// under its name is another), else ESTALE. Ancestors found on the way keep theirs.
    /// Iterative: a snapshot tree is as deep as the directory it was taken of.
    fn refind_by_names(&self, node: &Node) -> io::Result<Inode> {
        let stale = || errno(libc::ESTALE);
        let root = self.perms.root();
        // links[k] leads from ancestor k + 1 to ancestor k (ancestor 0 is `node`).
        let mut links: Vec<Link> = Vec::new();
        let mut link = node.link().ok_or_else(stale)?;
        let mut at = loop {
            let parent = &link.parent;
            let found = if parent.vino.snapid == NOSNAP {
                Some(self.inode(parent)?)
            } else {
                parent.inode()
            };
            if let Some(i) = found {
                break i;
            }
            if links.len() >= PATH_MAX {
                return Err(stale());
            }
            let up = parent.link().ok_or_else(stale)?;
            links.push(link);
            link = up;
        };
        links.push(link);
        for k in (0..links.len()).rev() {
            let name = &links.get(k).ok_or_else(stale)?.name;
            let (inode, st) = self
                .mount()
                .lookup(&at, name, CEPH_STATX_INO, 0, &root)
                .map_err(|e| match e.errno() {
                    libc::ENOENT => stale(),
                    _ => e.into(),
                })?;
            let Some(below) = k.checked_sub(1) else {
                return if vino_of(&st) == node.vino {
                    Ok(inode)
                } else {
                    Err(stale())
                };
            };
            let child = &links.get(below).ok_or_else(stale)?.parent;
            if vino_of(&st) != child.vino {
                return Err(stale());
            }
            self.nodes_refound.fetch_add(1, Ordering::Relaxed);
            at = child.inode_or_else(|_| Ok::<_, io::Error>(inode))?;
        }
        Err(stale())
    }

    /// The caller of a request: where its credentials become CephFS ids (see [`perms`]).
    #[inline]
    fn caller(&self, ctx: &Context) -> io::Result<Caller> {
        Caller::map(ctx, &self.cfg.idmap)
    }

    fn perm(&self, ctx: &Caller) -> Arc<ceph_client::UserPerm> {
        self.perms.get(ctx.host_uid(), ctx.host_gid())
    }

    fn class(&self, node: &Node) -> NodeClass {
        let snap = node.vino.snapid;
        NodeClass {
            in_snapshot: snap != nodes::NOSNAP && snap != CEPH_SNAPDIR,
            revocable: self.domain_of(node) != 0,
        }
    }

    /// ENFILE, counted, when the node table is full, before a request creates something that
    /// would need a new node (a new inode always does), so that it is refused cleanly.
    fn node_room(&self, op: &'static str) -> io::Result<()> {
        if self.nodes.has_room() {
            return Ok(());
        }
        self.limits.refused(Table::Nodes, self.cfg.max_nodes, op);
        Err(errno(libc::ENFILE))
    }
}

impl CephFs {
    /// The FUSE_INIT flags the daemon wants (`flags | flags2 << 32`; the guest gets those of
    /// them it offered): [`FileSystem::init`] answers the ones fuse-backend-rs's `FsOptions`
    /// knows, [`crate::server::WireOps::init_flags`] all of them.
    ///
    /// FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6+): a `MAP_SHARED` mmap of a file opened with
    /// FOPEN_DIRECT_IO (`--cache never`) goes through the guest page cache (written back
    /// with WRITEs, as in `auto`) instead of failing ENODEV. Nothing on our side changes.
    pub(crate) fn init_want(&self) -> u64 {
        let mut want = FsOptions::ASYNC_READ
            | FsOptions::PARALLEL_DIROPS
            | FsOptions::BIG_WRITES
            | FsOptions::MAX_PAGES
            | FsOptions::ATOMIC_O_TRUNC
            | FsOptions::EXPORT_SUPPORT
            | FsOptions::POSIX_LOCKS
            | FsOptions::FLOCK_LOCKS
            | FsOptions::DO_READDIRPLUS
            | FsOptions::READDIRPLUS_AUTO
            | FsOptions::ASYNC_DIO
            | FsOptions::CACHE_SYMLINKS
            | FsOptions::INIT_EXT;
        if self.cfg.cache == CacheMode::Auto {
            want |= FsOptions::AUTO_INVAL_DATA;
        }
        if self.cfg.killpriv_v2 {
            want |= FsOptions::HANDLE_KILLPRIV_V2;
        }
        if self.cfg.posix_acl && self.cfg.xattr {
            want |= FsOptions::POSIX_ACL;
        }
        want.bits() | crate::wire::FUSE_DIRECT_IO_ALLOW_MMAP
    }
}

impl FileSystem for CephFs {
    type Inode = u64;
    type Handle = u64;

    fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
        let want = FsOptions::from_bits_truncate(self.init_want());
        let on = self.cfg.killpriv_v2 && capable.contains(FsOptions::HANDLE_KILLPRIV_V2);
        self.killpriv.store(on, Ordering::Relaxed);
        self.migration.note_init(capable);
        // A guest that rebooted (or reset its driver) sends no DESTROY: the INIT of its new
        // session ends the old one, whose nodes, handles and locks nobody will give back.
        if self.session.swap(true, Ordering::AcqRel) {
            tracing::info!(
                nodes = self.nodes.len(),
                handles = self.handles.len(),
                "A new FUSE session begins before the last one ended (guest reboot or reset): \
                 its nodes, handles and locks are released"
            );
            self.end_session();
        }
        tracing::info!(
            killpriv_v2 = on,
            posix_acl = (want & capable).contains(FsOptions::POSIX_ACL),
            cache = %self.cfg.cache,
            "FUSE session starts"
        );
        Ok(want)
    }

    fn destroy(&self) {
        self.session.store(false, Ordering::Release);
        self.end_session();
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        let ctx = &self.caller(ctx)?;
        self.do_lookup(ctx, parent, name)
    }

    fn forget(&self, _ctx: &Context, inode: u64, count: u64) {
        self.nodes.forget(inode, count);
        self.tmpfile_forgotten(inode);
    }

    fn batch_forget(&self, _ctx: &Context, requests: Vec<(u64, u64)>) {
        for (inode, count) in requests {
            self.nodes.forget(inode, count);
            self.tmpfile_forgotten(inode);
        }
    }

    fn getattr(
        &self,
        ctx: &Context,
        inode: u64,
        _handle: Option<u64>,
    ) -> io::Result<(stat64, Duration)> {
        let ctx = &self.caller(ctx)?;
        self.do_getattr(ctx, inode)
    }

    fn setattr(
        &self,
        ctx: &Context,
        inode: u64,
        attr: stat64,
        handle: Option<u64>,
        valid: SetattrValid,
    ) -> io::Result<(stat64, Duration)> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_setattr(ctx, inode, attr, handle, valid)
    }

    fn readlink(&self, ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
        let ctx = &self.caller(ctx)?;
        self.do_readlink(ctx, inode)
    }

    fn symlink(
        &self,
        ctx: &Context,
        linkname: &CStr,
        parent: u64,
        name: &CStr,
    ) -> io::Result<Entry> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_symlink(ctx, linkname, parent, name)
    }

    fn mknod(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        rdev: u32,
        _umask: u32,
    ) -> io::Result<Entry> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_mknod(ctx, parent, name, mode, rdev)
    }

    fn mkdir(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        _umask: u32,
    ) -> io::Result<Entry> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_mkdir(ctx, parent, name, mode)
    }

    fn unlink(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_unlink(ctx, parent, name)
    }

    fn rmdir(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_rmdir(ctx, parent, name)
    }

    fn rename(
        &self,
        ctx: &Context,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_rename(ctx, olddir, oldname, newdir, newname, flags)
    }

    fn link(&self, ctx: &Context, inode: u64, newparent: u64, newname: &CStr) -> io::Result<Entry> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_link(ctx, inode, newparent, newname)
    }

    fn open(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        if open_flags(flags, libc::O_ACCMODE | libc::O_TRUNC)? != libc::O_RDONLY {
            self.writable()?;
        }
        let ctx = &self.caller(ctx)?;
        self.do_open(ctx, inode, flags, fuse_flags)
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        args: CreateIn,
    ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_create(ctx, parent, name, args)
    }

    fn read(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        lock_owner: Option<u64>,
        flags: u32,
    ) -> io::Result<usize> {
        let ctx = &self.caller(ctx)?;
        self.do_read(ctx, inode, handle, w, size, offset, lock_owner, flags)
    }

    fn write(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        lock_owner: Option<u64>,
        delayed_write: bool,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<usize> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_write(
            ctx,
            inode,
            handle,
            r,
            size,
            offset,
            lock_owner,
            delayed_write,
            flags,
            fuse_flags,
        )
    }

    fn flush(&self, ctx: &Context, inode: u64, handle: u64, lock_owner: u64) -> io::Result<()> {
        self.do_flush(perms::guest_uid(ctx), inode, handle, lock_owner)
    }

    fn fsync(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        let ctx = &self.caller(ctx)?;
        self.do_fsync(ctx, inode, datasync, handle)
    }

    fn fallocate(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_fallocate(ctx, inode, handle, mode, offset, length)
    }

    fn release(
        &self,
        _ctx: &Context,
        inode: u64,
        _flags: u32,
        handle: u64,
        _flush: bool,
        flock_release: bool,
        lock_owner: Option<u64>,
    ) -> io::Result<()> {
        self.do_release(inode, handle, flock_release, lock_owner)
    }

    fn statfs(&self, ctx: &Context, inode: u64) -> io::Result<statvfs64> {
        let ctx = &self.caller(ctx)?;
        self.do_statfs(ctx, inode)
    }

    fn setxattr(
        &self,
        ctx: &Context,
        inode: u64,
        name: &CStr,
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_setxattr(ctx, inode, name, value, flags)
    }

    fn getxattr(
        &self,
        ctx: &Context,
        inode: u64,
        name: &CStr,
        size: u32,
    ) -> io::Result<GetxattrReply> {
        let ctx = &self.caller(ctx)?;
        self.do_getxattr(ctx, inode, name, size)
    }

    fn listxattr(&self, ctx: &Context, inode: u64, size: u32) -> io::Result<ListxattrReply> {
        let ctx = &self.caller(ctx)?;
        self.do_listxattr(ctx, inode, size)
    }

    fn removexattr(&self, ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> {
        self.writable()?;
        let ctx = &self.caller(ctx)?;
        self.do_removexattr(ctx, inode, name)
    }

    fn opendir(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions)> {
        let ctx = &self.caller(ctx)?;
        self.do_opendir(ctx, inode, flags)
    }

    fn readdir(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        let ctx = &self.caller(ctx)?;
        self.do_readdir(ctx, inode, handle, size, offset, add_entry)
    }

    fn readdirplus(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        let ctx = &self.caller(ctx)?;
        self.do_readdirplus(ctx, inode, handle, size, offset, add_entry)
    }

    fn fsyncdir(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        let ctx = &self.caller(ctx)?;
        self.do_fsyncdir(ctx, inode, datasync, handle)
    }

    fn releasedir(&self, ctx: &Context, inode: u64, flags: u32, handle: u64) -> io::Result<()> {
        self.do_releasedir(ctx, inode, flags, handle)
    }

    fn access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
        let ctx = &self.caller(ctx)?;
        self.do_access(ctx, inode, mask)
    }

    fn lseek(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        let ctx = &self.caller(ctx)?;
        self.do_lseek(ctx, inode, handle, offset, whence)
    }

    fn getlk(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        flags: u32,
    ) -> io::Result<FileLock> {
        let ctx = &self.caller(ctx)?;
        self.do_getlk(ctx, inode, handle, owner, lock, flags)
    }

    fn setlk(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        flags: u32,
    ) -> io::Result<()> {
        let ctx = &self.caller(ctx)?;
        self.do_setlk(ctx, inode, handle, owner, lock, flags)
    }

    fn setlkw(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        flags: u32,
    ) -> io::Result<()> {
        let ctx = &self.caller(ctx)?;
        self.do_setlkw(ctx, inode, handle, owner, lock, flags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_past_i64_are_refused() {
        assert!(range(0, 4096).is_ok());
        assert_eq!(
            range(i64::MAX as u64, 1).unwrap_err().raw_os_error(),
            Some(libc::EFBIG)
        );
        assert_eq!(
            range(u64::MAX, 1).unwrap_err().raw_os_error(),
            Some(libc::EFBIG)
        );
        assert_eq!(
            to_off(u64::MAX).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
    }
}
