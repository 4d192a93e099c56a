//! The filesystem: FUSE requests served by calling CephFS through libcephfs.
//!
//! This layer knows nothing of virtio or vhost-user: it implements fuse-backend-rs's
//! `FileSystem` trait (plus [`crate::server::ExtraOps`] for the opcodes fuse-backend-rs does not
//! dispatch) over the `ceph-client` crate. Node ids and handles are ours ([`nodes`],
//! [`handles`]); credentials come from the request ([`perms`]); how long the guest may cache what
//! we return is [`policy`]'s decision; the SB_NOSEC contract is [`killpriv`]'s. The
//! `FileSystem` impl below is the table of operations; directory streams (`dir`), locks
//! (`locks`) and data I/O (`data`) live in rooms of their own.
//!
//! Everything here treats the guest as untrusted: every node id and handle is looked up (unknown
//! → EBADF/ENOENT-class errno, never a dereference), names are checked before they reach
//! libcephfs, offsets and lengths are checked against i64, and every error keeps its raw errno.

pub mod cached;
mod data;
mod dir;
pub mod handles;
pub mod killpriv;
pub mod limits;
mod locks;
pub mod names;
pub mod nodes;
pub mod perms;
pub mod policy;
pub mod side;
mod state;
mod stats;

use std::ffi::{CStr, CString};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ceph_client::{
    Dir, File, Inode, Mount, Statx, CEPH_SETATTR_ATIME, CEPH_SETATTR_ATIME_NOW, CEPH_SETATTR_CTIME,
    CEPH_SETATTR_GID, CEPH_SETATTR_KILL_SGUID, CEPH_SETATTR_MODE, CEPH_SETATTR_MTIME,
    CEPH_SETATTR_MTIME_NOW, CEPH_SETATTR_SIZE, CEPH_SETATTR_UID, CEPH_SNAPDIR,
    CEPH_STATX_BASIC_STATS, CEPH_STATX_INO, CEPH_STATX_MODE, CEPH_STATX_NLINK, CEPH_STATX_UID,
};
use fuse_backend_rs::abi::fuse_abi::{
    stat64, statvfs64, CreateIn, FsOptions, OpenOptions, SetattrValid, FOPEN_IN_KILL_SUIDGID,
    LK_FLOCK, WRITE_KILL_PRIV,
};
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileLock, FileSystem, GetxattrReply, ListxattrReply, ZeroCopyReader,
    ZeroCopyWriter,
};
use fuse_backend_rs::file_buf::FileVolatileSlice;
use fuse_backend_rs::file_traits::FileReadWriteVolatile;

use handles::HandleTable;
use killpriv::{Kill, Trigger};
use limits::{LimitStats, Table};
use names::{Use, XattrAccess};
use nodes::{NewNode, NodeTable, Vino, NOSNAP, ROOT_ID};

use crate::idmap::{GuestUid, HostGid, HostUid, IdMapping};

type Link = nodes::Link<Inode>;
use perms::{Caller, PermCache};
use policy::{CachePolicy, NodeClass};

pub use dir::DirStream;
pub use policy::{CacheMode, SnapshotPolicy};

/// The largest xattr value Linux lets through (XATTR_SIZE_MAX).
const XATTR_SIZE_MAX: usize = 65536;
/// The longest symlink target (PATH_MAX).
const PATH_MAX: usize = 4096;

/// The attributes every reply carries.
const WANT: u32 = CEPH_STATX_BASIC_STATS;

type Node = nodes::Node<Inode>;

/// What an open handle stands for.
#[derive(Debug)]
pub enum Handle {
    File(Arc<OpenFile>),
    Dir(Mutex<DirStream>),
}

#[derive(Debug)]
pub struct OpenFile {
    file: File,
    /// Head inode number of the file.
    ino: u64,
    /// `file` was opened O_DIRECT: libcephfs reads and writes it without its object cache.
    direct: bool,
    /// For a guest's O_DIRECT descriptor open for writing: a second libcephfs handle of the
    /// same inode, opened O_DSYNC instead of O_DIRECT. libcephfs writes O_DIRECT data straight
    /// to the OSDs and leaves whatever its object cache holds of that range in place, so later
    /// buffered reads would return the old bytes; an O_DSYNC write goes into the cache and
    /// flushes exactly its range to the OSDs before returning. Used for the inodes whose data
    /// the cache may hold (see [`cached`]).
    writer: Option<File>,
    /// Buffered I/O through this handle was noted in [`CephFs::cached`].
    noted: AtomicBool,
    /// Opened for writing: an ftruncate through it needs no further permission.
    writable: bool,
    /// POSIX locks were taken through this handle: FLUSH must release the owner's locks.
    locked: AtomicBool,
    /// BSD locks were taken through this handle (a migration asks whether one is held).
    flocked: AtomicBool,
    /// The open flags libcephfs got (a migration opens the file again with them).
    oflags: i32,
    /// The node it was opened on: its quarantine domain is asked on every request, so a
    /// handle follows its node's domain when that is derived again.
    node: Arc<Node>,
}

impl OpenFile {
    /// A handle opened with `oflags` (as libcephfs got them) on `node`.
    fn new(file: File, writer: Option<File>, oflags: i32, node: &Arc<Node>) -> Arc<Self> {
        Arc::new(OpenFile {
            file,
            ino: node.vino.ino,
            direct: oflags & libc::O_DIRECT != 0,
            writer,
            noted: AtomicBool::new(false),
            writable: oflags & libc::O_ACCMODE != libc::O_RDONLY,
            locked: AtomicBool::new(false),
            flocked: AtomicBool::new(false),
            oflags,
            node: node.clone(),
        })
    }
}

/// What a rename would replace.
enum RenameTarget {
    /// Nothing: the new name is free.
    None,
    /// Another link of the file being renamed (POSIX: the rename does nothing).
    Same,
    /// A non-directory that keeps other names after the rename (see [`side`]).
    LinkedFile,
    /// Anything else.
    Other,
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
    /// Let guests set/remove `ceph.*` virtual xattrs (layouts, quotas).
    pub allow_ceph_xattr_set: bool,
    /// Quarantine gate (None = quarantine support off). See [`crate::quarantine`].
    pub quarantine: Option<Arc<crate::quarantine::Gate>>,
    /// Most nodes the guest may hold (see [`limits`]).
    pub max_nodes: usize,
    /// Most open handles the guest may hold (see [`limits`]).
    pub max_handles: usize,
    /// What the guest may do in `.snap` directories.
    pub snapshots: SnapshotPolicy,
    /// Let MKNOD create character and block device nodes.
    pub allow_device_nodes: bool,
    /// How to open another session, for renames over hard links ([`side`]); without it they
    /// go through the main session, and libcephfs may then hide the file's other names.
    pub second_session: Option<side::Connector>,
    /// uid/gid translation between the guest and CephFS (`--translate-uid/--translate-gid`).
    pub idmap: IdMapping,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            cache: CacheMode::Auto,
            auto_ttl: policy::AUTO_TTL,
            revocable_ttl: Duration::from_secs(1),
            killpriv_v2: true,
            xattr: true,
            allow_ceph_xattr_set: false,
            quarantine: None,
            max_nodes: limits::DEFAULT_MAX_NODES,
            max_handles: limits::DEFAULT_MAX_HANDLES,
            snapshots: SnapshotPolicy::default(),
            allow_device_nodes: false,
            second_session: None,
            idmap: IdMapping::default(),
        }
    }
}

/// CephFS served as a FUSE filesystem.
#[derive(Debug)]
pub struct CephFs {
    mount: Mount,
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
    /// Short second sessions, for renames over hard links.
    side: side::SideClient,
    /// The snapshot directory's name (libcephfs's `client_snapdir`).
    snapdir: Box<[u8]>,
    /// Live migration of the guest's session ([`state`]).
    migration: state::Migration,
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

/// The shard `key` falls in: the remainder by the shard count, so sequential keys (inode
/// numbers, handles) spread over all of them. `shards` is never empty.
#[allow(clippy::indexing_slicing)] // the remainder by the length is always a valid index
fn shard<T>(shards: &[T], key: u64) -> &T {
    let count = u64::try_from(shards.len()).unwrap_or(u64::MAX);
    // Below the length, which is a usize: the conversion cannot fail.
    let i = usize::try_from(key % count).unwrap_or(0);
    &shards[i]
}

fn timespec_to(t: &ceph_client::Timespec) -> (i64, i64) {
    (t.tv_sec, t.tv_nsec)
}

/// A libcephfs statx as the stat64 the guest gets: the one place attributes leave the
/// filesystem, where the owner becomes the guest's ids.
fn to_stat(st: &Statx, ids: &IdMapping) -> stat64 {
    // SAFETY: stat64 is a plain C struct of integers (with private padding fields, which is why
    // it cannot be built field by field); the all-zero bit pattern is a valid value for it.
    let mut s: stat64 = unsafe { std::mem::zeroed() };
    s.st_ino = st.stx_ino;
    s.st_nlink = u64::from(st.stx_nlink);
    s.st_mode = u32::from(st.stx_mode);
    s.st_uid = ids.guest_uid(HostUid::new(st.stx_uid)).get();
    s.st_gid = ids.guest_gid(HostGid::new(st.stx_gid)).get();
    s.st_rdev = st.stx_rdev;
    s.st_size = i64::try_from(st.stx_size).unwrap_or(i64::MAX);
    s.st_blksize = i64::from(st.stx_blksize);
    s.st_blocks = i64::try_from(st.stx_blocks).unwrap_or(i64::MAX);
    (s.st_atime, s.st_atime_nsec) = timespec_to(&st.stx_atime);
    (s.st_mtime, s.st_mtime_nsec) = timespec_to(&st.stx_mtime);
    (s.st_ctime, s.st_ctime_nsec) = timespec_to(&st.stx_ctime);
    s
}

/// The libcephfs setattr for a FUSE SETATTR: the attributes and the mask, with `now` for
/// whatever the request leaves to the server to time:
/// - `*_NOW` bits: libcephfs 16 ignores them in ll_setattr, so "now" is taken here;
/// - a size change without a time (ftruncate(2), and O_TRUNC opens the kernel turns into
///   SETATTR): Linux sets mtime and ctime to now. libcephfs does not, and when it grows a file
///   locally under its exclusive cap it takes the mtime from the request as it stands (0);
/// - ctime, on every change (see below).
fn setattr_request(
    attr: &stat64,
    valid: SetattrValid,
    now: ceph_client::Timespec,
) -> io::Result<(Statx, u32)> {
    let mut st = Statx::default();
    let mut mask = 0;
    if valid.contains(SetattrValid::MODE) {
        mask |= CEPH_SETATTR_MODE;
        st.stx_mode = perm_bits(attr.st_mode);
    }
    if valid.contains(SetattrValid::UID) {
        mask |= CEPH_SETATTR_UID;
        st.stx_uid = attr.st_uid;
    }
    if valid.contains(SetattrValid::GID) {
        mask |= CEPH_SETATTR_GID;
        st.stx_gid = attr.st_gid;
    }
    if valid.contains(SetattrValid::SIZE) {
        mask |= CEPH_SETATTR_SIZE;
        st.stx_size = u64::try_from(attr.st_size).map_err(|_| errno(libc::EINVAL))?;
    }
    // A "now" keeps its *_NOW bit next to the time: libcephfs lets a non-owner with write
    // permission set the times to now (utimensat's UTIME_NOW, truncate), only the owner set
    // explicit ones.
    let time = |now_bit, set_bit, tv_sec, tv_nsec| {
        if valid.contains(now_bit) {
            Some((now, true))
        } else if valid.contains(set_bit) {
            Some((ceph_client::Timespec { tv_sec, tv_nsec }, false))
        } else {
            None
        }
    };
    if let Some((t, is_now)) = time(
        SetattrValid::ATIME_NOW,
        SetattrValid::ATIME,
        attr.st_atime,
        attr.st_atime_nsec,
    ) {
        mask |= CEPH_SETATTR_ATIME | if is_now { CEPH_SETATTR_ATIME_NOW } else { 0 };
        st.stx_atime = t;
    }
    if let Some((t, is_now)) = time(
        SetattrValid::MTIME_NOW,
        SetattrValid::MTIME,
        attr.st_mtime,
        attr.st_mtime_nsec,
    ) {
        mask |= CEPH_SETATTR_MTIME | if is_now { CEPH_SETATTR_MTIME_NOW } else { 0 };
        st.stx_mtime = t;
    }
    // CTIME has no "now" form.
    if valid.contains(SetattrValid::CTIME) {
        mask |= CEPH_SETATTR_CTIME;
        st.stx_ctime = ceph_client::Timespec {
            tv_sec: attr.st_ctime,
            tv_nsec: attr.st_ctime_nsec,
        };
    }
    if mask & CEPH_SETATTR_SIZE != 0 && mask & CEPH_SETATTR_MTIME == 0 {
        mask |= CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW;
        st.stx_mtime = now;
    }
    // Every attribute change sets ctime to now on Linux, also one that changes nothing
    // (`chown u:g` to the current owner), which libcephfs skips. Only for the changes that
    // need the owner anyway: libcephfs lets nobody else set ctime.
    if mask & (CEPH_SETATTR_MODE | CEPH_SETATTR_UID | CEPH_SETATTR_GID) != 0
        && mask & CEPH_SETATTR_CTIME == 0
    {
        mask |= CEPH_SETATTR_CTIME;
        st.stx_ctime = now;
    }
    Ok((st, mask))
}

/// What a SETATTR must clear or restore around the setattr (`CephFs::setattr_kill`).
#[derive(Debug, Default, Clone, Copy)]
struct SetattrKill {
    /// Added to the setattr's mask (`CEPH_SETATTR_KILL_SGUID`).
    mask: u32,
    /// Special bits to put right afterwards: (mode read before, mode wanted).
    special_after: Option<(u32, u32)>,
    /// Drop security.capability afterwards.
    remove_caps: bool,
}

/// Whether a SETATTR is a chmod setting setgid, alone (but for ctime), by someone other than
/// root: if the caller owns the file, it is done as root (see `CephFs::setattr`).
fn chmod_sets_sgid(st: &Statx, mask: u32, uid: u32) -> bool {
    mask & CEPH_SETATTR_MODE != 0
        && u32::from(st.stx_mode) & libc::S_ISGID != 0
        && uid != 0
        && mask & !(CEPH_SETATTR_MODE | CEPH_SETATTR_CTIME) == 0
}

/// ftruncate(2) needs only a descriptor open for writing, not write permission on the
/// file now (think of a file created with mode 0): libcephfs checks the mode, so a size
/// change through a writable handle of ours runs with root credentials. Root could set
/// any time: the times are what ftruncate(2) sets, now (explicit times need the owner,
/// and a guest could otherwise date files it does not own as it likes). `None`: the request
/// is more than a size change (and its times), and runs with the caller's credentials.
fn ftruncate_request(st: &Statx, mask: u32, now: ceph_client::Timespec) -> Option<(Statx, u32)> {
    let size_and_times = CEPH_SETATTR_SIZE
        | CEPH_SETATTR_MTIME
        | CEPH_SETATTR_MTIME_NOW
        | CEPH_SETATTR_CTIME
        | CEPH_SETATTR_KILL_SGUID;
    if mask & CEPH_SETATTR_SIZE == 0 || mask & !size_and_times != 0 {
        return None;
    }
    let (mut st, mut mask) = (*st, mask);
    if mask & CEPH_SETATTR_MTIME != 0 {
        mask |= CEPH_SETATTR_MTIME_NOW;
        st.stx_mtime = now;
    }
    mask &= !CEPH_SETATTR_CTIME;
    Some((st, mask))
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

/// Where a walk up a directory's ancestry ended ([`CephFs::walk_up`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Up {
    /// At the export root.
    Root,
    /// At the root of this quarantine domain, below the export root.
    Domain(u32),
    /// Anywhere else: outside the export, or not established.
    Outside,
}

/// Whether inode `child` is what libcephfs can return for a name (other than "." and "..")
/// in directory `parent`: in a head directory a head inode other than itself (and never the
/// filesystem's root) or its own `.snap`; in a `.snap` directory a snapshot of the same
/// directory; in a snapshot another inode of the same snapshot. Names only ever lead down,
/// so with ".." kept from libcephfs this keeps every node inside the export; the check makes
/// it hold whatever libcephfs answers, at the cost of a few comparisons.
fn is_child(parent: Vino, child: Vino) -> bool {
    match parent.snapid {
        NOSNAP => {
            (child.snapid == NOSNAP && child.ino != parent.ino && child.ino != CEPH_INO_ROOT)
                || (child.snapid == CEPH_SNAPDIR && child.ino == parent.ino)
        }
        CEPH_SNAPDIR => {
            child.ino == parent.ino && child.snapid != NOSNAP && child.snapid != CEPH_SNAPDIR
        }
        snap => child.snapid == snap && child.ino != parent.ino && child.ino != CEPH_INO_ROOT,
    }
}

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
            mount,
            nodes,
            handles,
            perms,
            policy: CachePolicy::new(cfg.cache, cfg.auto_ttl, cfg.revocable_ttl),
            cfg,
            killpriv: AtomicBool::new(false),
            cached: cached::CachedInodes::default(),
            limits: LimitStats::default(),
            migration: state::Migration::default(),
        })
    }

    /// Requests refused at the limits so far: (nodes, handles).
    pub fn limit_refusals(&self) -> (u64, u64) {
        self.limits.refusals()
    }

    /// Node table size (for metrics and tests).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Handle table size (for metrics and tests).
    pub fn handle_count(&self) -> usize {
        self.handles.len()
    }

    pub fn mount(&self) -> &Mount {
        &self.mount
    }

    /// End of service: close every handle, drop every node, and unmount, so the MDS session
    /// ends cleanly (dirty data flushed, caps returned) even while idle worker threads still
    /// hold the filesystem. No request may run concurrently or afterwards.
    pub fn shutdown(&self) -> io::Result<()> {
        self.handles.clear();
        self.nodes.clear();
        Ok(self.mount.shutdown()?)
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

    /// Quarantine: the domain of `node` now, and the gate generation it holds for. The hot
    /// path is one atomic load and a comparison with the gate's generation; only after the
    /// gate changed (a domain root registered, a flag flipped, a watcher round while anything
    /// is denied) is the domain derived again, from the node's real ancestry.
    #[inline]
    fn domain_stamp(&self, node: &Node) -> (u32, u32) {
        let Some(g) = &self.cfg.quarantine else {
            return (0, 0);
        };
        let generation = g.generation();
        let (d, at) = node.domain_at();
        if at == generation {
            return (d, generation);
        }
        let d = self.derive_domain(node, g, generation);
        node.set_domain(d, generation);
        (d, generation)
    }

    #[inline]
    fn domain_of(&self, node: &Node) -> u32 {
        self.domain_stamp(node).0
    }

    /// Quarantine: the domain of a child found in `parent` (looked up, listed, created) — the
    /// parent's, unless the child is the root directory of a domain (a lock-free table probe,
    /// directories only) — and the generation it holds for.
    #[inline]
    fn child_domain(&self, parent: &Node, st: &Statx) -> (u32, u32) {
        let (d, generation) = self.domain_stamp(parent);
        match &self.cfg.quarantine {
            Some(g) if kind_of(st) == libc::S_IFDIR => {
                (g.domain_of_root(st.stx_ino).unwrap_or(d), generation)
            }
            // A file with other links may have one in a denied domain (fail closed).
            Some(g) if st.stx_nlink > 1 && g.near_denied() => {
                (crate::quarantine::UNSURE, generation)
            }
            _ => (d, generation),
        }
    }

    /// Derive the domain of `node` from where it is: up the chain of nodes it was found in
    /// (see [`nodes::Node::link`]), to the first domain root or the export root. Each link of
    /// a head inode is confirmed by looking its name up in its parent (answered from
    /// libcephfs's cache while the MDS has not told it otherwise, i.e. unless another client
    /// renamed or removed it): a link that no longer holds, a chain that ends elsewhere, or
    /// a file with more links while a domain near the export is denied (its other names may
    /// lie in it) gives [`crate::quarantine::UNSURE`], which is always denied.
    ///
    /// The directories passed on the way up are stamped too, and the walk stops at the first
    /// one already derived in this generation: after a gate change each directory costs one
    /// lookup, and each file one more.
    fn derive_domain(&self, node: &Node, g: &crate::quarantine::Gate, generation: u32) -> u32 {
        use crate::quarantine::UNSURE;
        let perm = self.perms.root();
        // The ancestors passed, nearest first; all of them lie between `node` and where the
        // walk ended, so they get the same domain (none of them is a domain root).
        let mut chain: Vec<Arc<Node>> = Vec::new();
        let mut domain = UNSURE;
        for _ in 0..PATH_MAX {
            let n: &Node = chain.last().map_or(node, |p| &**p);
            if !chain.is_empty() {
                let (d, at) = n.domain_at();
                if at == generation {
                    domain = d;
                    break;
                }
            }
            if n.id == ROOT_ID {
                domain = g.root_domain();
                break;
            }
            if n.is_dir() {
                if let Some(d) = g.domain_of_root(n.vino.ino) {
                    domain = d;
                    break;
                }
            }
            let head = n.vino.snapid == NOSNAP;
            let Some(link) = n.link() else {
                // A directory found by "..": its ancestry as libcephfs knows it.
                if n.is_dir() && head {
                    domain = match self.walk_up(&n.inode, n.vino.ino, Some(g)) {
                        Up::Root => g.root_domain(),
                        Up::Domain(d) => d,
                        Up::Outside => UNSURE,
                    };
                }
                break;
            };
            if head && !self.link_holds(&link, n.vino, &perm) {
                break;
            }
            if head && !n.is_dir() && g.near_denied() {
                match self.mount.getattr(&n.inode, CEPH_STATX_NLINK, 0, &perm) {
                    Ok(st) if st.stx_nlink <= 1 => {}
                    _ => break,
                }
            }
            chain.push(link.parent);
        }
        for p in &chain {
            p.set_domain(domain, generation);
        }
        domain
    }

    /// Whether `link.name` in `link.parent` is still inode `vino`.
    fn link_holds(&self, link: &Link, vino: Vino, perm: &ceph_client::UserPerm) -> bool {
        match self
            .mount
            .lookup(&link.parent.inode, &link.name, CEPH_STATX_INO, 0, perm)
        {
            Ok((_, st)) => vino_of(&st) == vino,
            Err(_) => false,
        }
    }

    /// Walk the ancestry of head directory `start` (inode `ino`) with libcephfs's ".." (for a
    /// head directory its one parent dentry as libcephfs last learnt it, or the MDS's
    /// LOOKUPPARENT; after another client's rename it can still be the old parent), until the
    /// export root, or, with a gate, the first domain root. Anything else (the filesystem
    /// root, a loop, an error, too deep) is `Outside`. Cold path: ".." of a directory whose
    /// own link no longer holds, and domain derivation of a directory found that way.
    fn walk_up(&self, start: &Inode, ino: u64, g: Option<&crate::quarantine::Gate>) -> Up {
        /// Deeper than any path CephFS serves (PATH_MAX / 2 components).
        const MAX_DEPTH: usize = PATH_MAX / 2;
        let root = self.nodes.root_vino();
        if ino == root.ino {
            return Up::Root;
        }
        let perm = self.perms.root();
        let mut cur: Option<Inode> = None;
        let mut cur_ino = ino;
        for _ in 0..MAX_DEPTH {
            let at = cur.as_ref().unwrap_or(start);
            let (p, st) = match self.mount.lookup(at, c"..", CEPH_STATX_INO, 0, &perm) {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(%e, ino = cur_ino, "walking up a directory's ancestry");
                    return Up::Outside;
                }
            };
            let v = vino_of(&st);
            if v == root {
                return Up::Root;
            }
            if v.snapid != NOSNAP || v.ino == cur_ino || v.ino == CEPH_INO_ROOT {
                return Up::Outside;
            }
            if let Some(d) = g.and_then(|g| g.domain_of_root(v.ino)) {
                return Up::Domain(d);
            }
            cur_ino = v.ino;
            cur = Some(p);
        }
        Up::Outside
    }

    /// Quarantine gate: EACCES (and a rate-limited audit line) when `domain` is denied. For
    /// domain 0 (outside every quarantine-capable directory) this is one comparison.
    #[inline]
    fn gate(&self, domain: u32, op: &'static str, uid: GuestUid) -> io::Result<()> {
        if domain == 0 {
            return Ok(());
        }
        match &self.cfg.quarantine {
            Some(g) if g.denied(domain) => {
                g.audit(domain, op, uid);
                Err(errno(libc::EACCES))
            }
            _ => Ok(()),
        }
    }

    /// The node `id`, if the caller may touch it now (stale id: ESTALE; quarantined: EACCES).
    fn node_op(&self, id: u64, op: &'static str, ctx: &Caller) -> io::Result<Arc<Node>> {
        let node = self.node(id)?;
        self.gate(self.domain_of(&node), op, ctx.guest_uid())?;
        Ok(node)
    }

    /// [`Self::node_op`] for a node a request names as a directory (the parent of a name): a
    /// non-directory is ENOTDIR before libcephfs sees it. libcephfs opens a directory
    /// structure on whatever inode it is handed as a parent, and aborts the daemon
    /// (`Inode::open_dir`: `ceph_assert(dentries.size() < 2)`) when that inode is a file with
    /// two cached names; the guest kernel never sends such a request, a hostile guest can.
    fn dir_op(&self, id: u64, op: &'static str, ctx: &Caller) -> io::Result<Arc<Node>> {
        let node = self.node_op(id, op, ctx)?;
        if !node.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        Ok(node)
    }

    /// Whether `name` in `dir` is the root of a denied domain (rename must not move a
    /// quarantined directory away). Only asked while some domain is denied.
    fn names_denied_root(&self, dir: &Node, name: &CStr, perm: &ceph_client::UserPerm) -> bool {
        let Some(g) = &self.cfg.quarantine else {
            return false;
        };
        if !g.any_denied() {
            return false;
        }
        match self.mount.lookup(&dir.inode, name, WANT, 0, perm) {
            Ok((_, st)) => g.denied(self.child_domain(dir, &st).0),
            Err(_) => false,
        }
    }

    /// Enter an inode libcephfs found in `parent` (lookup of a name, a READDIRPLUS entry, or
    /// one just created there) and build the reply entry (one lookup count for the kernel).
    /// The inode must be what a child of `parent` can be ([`is_child`]), so a node handed to
    /// the guest never names an inode above the one it came from. With `gate`, a child in a
    /// denied domain is refused (its reference released, nothing enters the table).
    /// `op` names the request for the node limit's accounting ([`Self::insert_node`]).
    fn child_entry(
        &self,
        parent: &Arc<Node>,
        name: &[u8],
        inode: Inode,
        st: &Statx,
        op: &'static str,
        gate: Option<(&'static str, GuestUid)>,
    ) -> io::Result<Entry> {
        let vino = vino_of(st);
        if !is_child(parent.vino, vino) {
            tracing::warn!(
                parent = ?parent.vino,
                child = ?vino,
                "libcephfs returned an inode that cannot be a child of the directory asked; \
                 refused (the export boundary holds)"
            );
            return Err(errno(libc::EIO));
        }
        let domain = self.child_domain(parent, st);
        if let Some((op, uid)) = gate {
            self.gate(domain.0, op, uid)?;
        }
        let node = self.insert_node(
            NewNode {
                vino,
                kind: kind_of(st),
                domain,
                link: Some(Link {
                    parent: parent.clone(),
                    name: CString::new(name).map_err(|_| errno(libc::EINVAL))?,
                }),
                inode,
            },
            op,
        )?;
        Ok(self.entry_for(&node, st))
    }

    /// One more lookup of a node the guest may hold already (".", "..", LINK): the same node
    /// if it is still in the table, else the same inode entered again with its parent.
    fn same_entry(&self, node: &Arc<Node>, st: &Statx) -> io::Result<Entry> {
        let n = self.insert_node(
            NewNode {
                vino: node.vino,
                kind: node.kind,
                domain: self.domain_stamp(node),
                link: node.link(),
                inode: node.inode.try_clone()?,
            },
            "lookup",
        )?;
        Ok(self.entry_for(&n, st))
    }

    /// Enter a node; ENFILE, counted, when the guest holds `--max-nodes` nodes and this
    /// would be a new one.
    fn insert_node(&self, new: NewNode<Inode>, op: &'static str) -> io::Result<Arc<Node>> {
        self.nodes.insert(new).map_err(|e| {
            self.limits.refused(Table::Nodes, self.cfg.max_nodes, op);
            errno(e)
        })
    }

    /// Enter an open handle; ENFILE at `--max-handles`.
    fn new_handle(&self, node: u64, h: Handle, op: &'static str) -> io::Result<u64> {
        self.handles.insert(node, h).map_err(|e| {
            self.limits
                .refused(Table::Handles, self.cfg.max_handles, op);
            errno(e)
        })
    }

    /// ENFILE, counted, when the handle table is full: checked before work that cannot be
    /// undone (creating a file) so that a full table refuses the request cleanly.
    fn handle_room(&self, op: &'static str) -> io::Result<()> {
        if self.handles.has_room() {
            return Ok(());
        }
        self.limits
            .refused(Table::Handles, self.cfg.max_handles, op);
        Err(errno(libc::ENFILE))
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

    /// Snapshot policy: EROFS for a namespace change in a `.snap` directory unless the guest
    /// may manage snapshots.
    fn snapdir_change(&self, dir: &Node) -> io::Result<()> {
        if dir.vino.snapid == CEPH_SNAPDIR && !self.cfg.snapshots.writable() {
            return Err(errno(libc::EROFS));
        }
        Ok(())
    }

    /// Snapshot policy `hidden`: an entry that is a `.snap` directory does not exist (its
    /// lookup count is given back).
    fn snapdir_visible(&self, e: Entry) -> io::Result<Entry> {
        if self.cfg.snapshots.visible() || e.inode == 0 {
            return Ok(e);
        }
        match self.nodes.get(e.inode) {
            Some(n) if n.vino.snapid == CEPH_SNAPDIR => {
                self.nodes.forget(e.inode, 1);
                Err(errno(libc::ENOENT))
            }
            _ => Ok(e),
        }
    }

    /// Privileged xattrs: `trusted.*` (CAP_SYS_ADMIN on Linux) may be set or removed, and
    /// `security.capability` (CAP_SETFCAP) set, by CephFS root only. A guest's root whose uid
    /// --translate-uid maps or squashes to another CephFS uid has neither capability here;
    /// libcephfs itself lets any owner write them, and other clients honour file capabilities.
    /// Removing `security.capability` stays open to whoever may write the file: it takes a
    /// privilege away, and it is what the guest kernel's own kill on write sends, with the
    /// writer's credentials.
    fn privileged_xattr(&self, name: &CStr, uid: HostUid, removing: bool) -> io::Result<()> {
        let n = name.to_bytes();
        let caps = n == b"security.capability" && !removing;
        if !uid.is_root() && (n.starts_with(b"trusted.") || caps) {
            return Err(errno(libc::EPERM));
        }
        Ok(())
    }

    fn entry_for(&self, node: &Node, st: &Statx) -> Entry {
        let ttl = self.policy.ttl(self.class(node));
        Entry {
            inode: node.id,
            generation: 0,
            attr: to_stat(st, &self.cfg.idmap),
            attr_flags: 0,
            attr_timeout: ttl.attr,
            entry_timeout: ttl.entry,
        }
    }

    fn file(
        &self,
        node: u64,
        fh: u64,
        op: &'static str,
        uid: GuestUid,
    ) -> io::Result<Arc<OpenFile>> {
        let h = self.handles.get(node, fh).map_err(errno)?;
        match &h.handle {
            Handle::File(f) => {
                // Handles opened before a quarantine are refused too.
                self.gate(self.domain_of(&f.node), op, uid)?;
                Ok(f.clone())
            }
            Handle::Dir(_) => Err(errno(libc::EISDIR)),
        }
    }

    fn killpriv_on(&self) -> bool {
        self.killpriv.load(Ordering::Relaxed)
    }

    /// Whether the inode carries `security.capability`. libcephfs answers from its xattr cache
    /// while it holds the Xs cap, so this is normally no MDS request. Asked as root: the
    /// answer must not depend on whether the caller may read the file's xattrs.
    fn has_caps(&self, node: &Node, _perm: &ceph_client::UserPerm) -> bool {
        let name = c"security.capability";
        match self
            .mount
            .getxattr(&node.inode, name, &mut [], &self.perms.root())
        {
            Ok(_) => true,
            Err(e) => e.errno() != libc::ENODATA,
        }
    }

    /// Clear what `kill` says, as the root of the filesystem would (the guest already decided the
    /// caller may do the operation that triggers it).
    ///
    /// The setuid/setgid bits go with CEPH_SETATTR_KILL_SGUID, not by writing back a mode: the
    /// MDS (or libcephfs under the exclusive auth cap) clears them from the mode the inode has
    /// when the change is applied, so a chmod by anyone between our read and this call stands.
    /// It clears both bits of a file with any execute bit, a little more than Linux (which
    /// keeps setgid without group-execute: a mandatory-locking marker, not a privilege).
    fn apply_kill(&self, node: &Node, kill: Kill) -> io::Result<()> {
        let root = self.perms.root();
        if kill.new_mode.is_some() {
            // Read again here, not at the decision: the fallback below then has the shortest
            // window it can have (libcephfs answers under the As cap, no MDS request).
            let cur = u32::from(
                self.mount
                    .getattr(&node.inode, CEPH_STATX_MODE, 0, &root)?
                    .stx_mode,
            );
            match killpriv::kill_suidgid(cur) {
                None => {}
                Some(m) if killpriv::mds_kill_sguid(cur) == m => {
                    self.mount.setattr(
                        &node.inode,
                        &Statx::default(),
                        CEPH_SETATTR_KILL_SGUID,
                        &root,
                    )?;
                }
                // The MDS's rule differs from Linux's here: without any execute bit it leaves
                // setuid alone (a later chmod +x must not make a setuid program of what
                // another user wrote), and with one it also takes setgid without group-exec
                // (a mandatory-locking marker Linux keeps). The mode is written instead.
                Some(m) => {
                    let st = Statx {
                        stx_mode: perm_bits(m),
                        ..Default::default()
                    };
                    self.mount
                        .setattr(&node.inode, &st, CEPH_SETATTR_MODE, &root)?;
                }
            }
        }
        if kill.remove_caps {
            match self
                .mount
                .removexattr(&node.inode, c"security.capability", &root)
            {
                Ok(()) => {}
                // Gone already (libcephfs says ENOENT when the inode carries other xattrs).
                Err(e) if e.errno() == libc::ENODATA || e.errno() == libc::ENOENT => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Decide and apply privilege removal for a write-like operation. Costs one cached getattr
    /// (flagged requests only: the mode matters only when the guest asks for the suid/sgid
    /// kill) and one cached getxattr when there is nothing to kill; both are answered by
    /// libcephfs under the caps it holds (As, Xs), which the MDS revokes before another client
    /// changes the mode or the xattr, so they are never stale and cost no MDS request.
    fn kill_privs(
        &self,
        node: &Node,
        trigger: Trigger,
        flagged: bool,
        perm: &ceph_client::UserPerm,
    ) -> io::Result<()> {
        if !self.killpriv_on() || node.is_dir() {
            return Ok(());
        }
        let mode = if flagged {
            u32::from(
                self.mount
                    .getattr(&node.inode, CEPH_STATX_MODE, 0, perm)?
                    .stx_mode,
            )
        } else {
            // Unflagged (a CAP_FSETID caller): the bits stay whatever they are.
            0
        };
        let kill = killpriv::decide(trigger, mode, false, flagged, self.has_caps(node, perm));
        if kill.is_empty() {
            return Ok(());
        }
        self.apply_kill(node, kill)
    }

    /// After a size or owner change: give the setuid/setgid bits the state Linux leaves
    /// (`want`, decided on the mode `before` read ahead of the change), where the MDS's rule
    /// left them otherwise. Only while the other mode bits are still those of `before`: a chmod
    /// by anyone since then stands as it is (with the special bits as the MDS left them).
    /// Re-read just before the change, as root (libcephfs answers under the As cap).
    fn put_special_bits(&self, node: &Node, before: u32, want: u32) -> io::Result<()> {
        let root = self.perms.root();
        let now = u32::from(
            self.mount
                .getattr(&node.inode, CEPH_STATX_MODE, 0, &root)?
                .stx_mode,
        );
        let Some(mode) = special_bits_after(before, now, want) else {
            return Ok(());
        };
        let st = Statx {
            stx_mode: perm_bits(mode),
            ..Default::default()
        };
        Ok(self
            .mount
            .setattr(&node.inode, &st, CEPH_SETATTR_MODE, &root)?)
    }

    /// The O_TRUNC of an OPEN or CREATE, done after the open: write permission checked (open(2)
    /// wants it whatever the access mode), then privileges killed (SB_NOSEC), then the data
    /// dropped (`truncate`), so that no moment has the new contents under the old privileges
    /// and a failed kill leaves the data as it was.
    fn open_truncate(
        &self,
        node: &Node,
        oflags: i32,
        flagged: bool,
        truncate: bool,
        perm: &ceph_client::UserPerm,
    ) -> io::Result<()> {
        if oflags & libc::O_ACCMODE == libc::O_RDONLY {
            drop(self.mount.open(&node.inode, libc::O_WRONLY, perm)?);
        }
        self.kill_privs(node, Trigger::Truncate, flagged, perm)?;
        if truncate {
            self.mount.truncate_to_zero(&node.inode, perm)?;
        }
        Ok(())
    }

    /// Whether a setattr libcephfs refused with EPERM is one Linux allows, to be redone with
    /// root credentials (`Ok(false)`: the EPERM stands), decided on the inode's current
    /// attributes. The one case:
    /// an owner's change of its file's group to one of its groups (POSIX). FUSE does not carry
    /// supplementary groups, so libcephfs, which knows only the primary gid, refuses what the
    /// guest kernel (virtiofs always mounts with `default_permissions`) has already checked
    /// against the full group list. A uid in the request equal to the owner's (as chown(1)
    /// sends it) changes nothing; a mode in it is the one chown must leave.
    fn allowed_by_guest(
        &self,
        node: &Node,
        st: &Statx,
        mask: u32,
        ctx: &Caller,
        perm: &ceph_client::UserPerm,
    ) -> io::Result<bool> {
        let cur = self.mount.getattr(&node.inode, WANT, 0, perm)?;
        let chown = CEPH_SETATTR_UID
            | CEPH_SETATTR_GID
            | CEPH_SETATTR_MODE
            | CEPH_SETATTR_CTIME
            | CEPH_SETATTR_KILL_SGUID;
        Ok(HostUid::new(cur.stx_uid) == ctx.host_uid()
            && mask & CEPH_SETATTR_GID != 0
            && mask & !chown == 0
            && (mask & CEPH_SETATTR_UID == 0 || st.stx_uid == cur.stx_uid))
    }

    /// What a rename of `oldname` in `old` to `newname` in `new` would replace. Both names
    /// were just looked up by the guest, so libcephfs answers from its cache (the link count
    /// from the MDS if it lacks the caps that keep it current).
    fn rename_target(
        &self,
        old: &Node,
        oldname: &CStr,
        new: &Node,
        newname: &CStr,
        perm: &ceph_client::UserPerm,
    ) -> io::Result<RenameTarget> {
        let (_, from) = self
            .mount
            .lookup(&old.inode, oldname, CEPH_STATX_INO, 0, perm)?;
        let want = CEPH_STATX_INO | CEPH_STATX_NLINK | CEPH_STATX_MODE;
        match self.mount.lookup(&new.inode, newname, want, 0, perm) {
            Ok(_) if old.vino.snapid != nodes::NOSNAP || new.vino.snapid != nodes::NOSNAP => {
                Ok(RenameTarget::Other)
            }
            Ok((_, to)) if vino_of(&from) == vino_of(&to) => Ok(RenameTarget::Same),
            Ok((_, to)) if kind_of(&to) != libc::S_IFDIR && to.stx_nlink > 1 => {
                Ok(RenameTarget::LinkedFile)
            }
            Ok(_) => Ok(RenameTarget::Other),
            Err(e) if e.errno() == libc::ENOENT => Ok(RenameTarget::None),
            Err(e) => Err(e.into()),
        }
    }

    /// After a rename between two directories: libcephfs 16 keeps the attributes of the
    /// directory an entry left as they were (the MDS's reply describes the target side only),
    /// its mtime and ctime, and
    /// for a directory moved out, its link count (`mkdir P Q P/d; mv P/d Q/d` left P at 3;
    /// the MDS has 2). Reading a directory-statistics vxattr makes libcephfs fetch the inode
    /// from the MDS whatever caps it holds (ll_getattr has no "force sync" in 16:
    /// AT_STATX_FORCE_SYNC is EINVAL), and the reply refreshes its cache. Done at once: the
    /// guest may next see the directory through LOOKUP or READDIRPLUS as well as GETATTR.
    /// One MDS request per rename between directories; a rename within one is described
    /// fully by the reply.
    fn after_rename(&self, old: &Node, new: &Node) {
        if old.id == new.id {
            return;
        }
        let root = self.perms.root();
        let mut buf = [0u8; 32];
        if let Err(e) = self
            .mount
            .getxattr(&old.inode, c"ceph.dir.subdirs", &mut buf, &root)
        {
            tracing::debug!(%e, ino = old.vino.ino, "refreshing a directory after a rename");
        }
    }

    fn lookup_name(&self, parent: &Arc<Node>, name: &CStr, ctx: &Caller) -> io::Result<Entry> {
        let perm = self.perm(ctx);
        let bytes = name.to_bytes();
        if bytes == b"." {
            let st = self.mount.getattr(&parent.inode, WANT, 0, &perm)?;
            return self.same_entry(parent, &st);
        }
        // ".." never reaches libcephfs from the guest: see `lookup_parent`.
        if bytes == b".." {
            return self.lookup_parent(parent, ctx);
        }
        let (inode, st) = self.mount.lookup(&parent.inode, name, WANT, 0, &perm)?;
        self.child_entry(
            parent,
            bytes,
            inode,
            &st,
            "lookup",
            Some(("lookup", ctx.guest_uid())),
        )
    }

    /// LOOKUP "..": the export root's is the export root; a `.snap` directory's is the
    /// directory it belongs to; a snapshot root's is its `.snap`; any other node on the
    /// snapshot side's is the node it was found in (a snapshot does not change); a head
    /// directory's is the node it was found in while its name there still leads to it.
    /// Only otherwise (another client renamed it) is libcephfs asked for a head directory's
    /// ".." (its one parent dentry), and the answer must lie below the export root
    /// ([`Self::walk_up`]): a directory moved out of the export has no parent the guest may
    /// see (EACCES). libcephfs's own ".." of the export root's `.snap` is the export's
    /// parent (issue 13), hence never asked there.
    fn lookup_parent(&self, node: &Arc<Node>, ctx: &Caller) -> io::Result<Entry> {
        let perm = self.perm(ctx);
        let link = node.link();
        let up = if node.id == ROOT_ID {
            node.clone()
        } else if !node.is_dir() {
            // Non-directories have no ".." (libcephfs: ENOTDIR); the kernel never asks.
            return Err(errno(libc::ENOTDIR));
        } else if node.vino.snapid != NOSNAP {
            link.ok_or_else(|| errno(libc::ESTALE))?.parent
        } else if let Some(l) = link.filter(|l| self.link_holds(l, node.vino, &perm)) {
            l.parent
        } else {
            let (inode, st) = self.mount.lookup(&node.inode, c"..", WANT, 0, &perm)?;
            let vino = vino_of(&st);
            if vino == self.nodes.root_vino() {
                self.nodes.get(ROOT_ID).ok_or_else(|| errno(libc::ESTALE))?
            } else {
                if vino.snapid != NOSNAP
                    || kind_of(&st) != libc::S_IFDIR
                    || self.walk_up(&inode, vino.ino, None) != Up::Root
                {
                    tracing::debug!(?vino, "\"..\" of a directory lies outside the export");
                    return Err(errno(libc::EACCES));
                }
                let domain = match &self.cfg.quarantine {
                    Some(g) => {
                        let generation = g.generation();
                        let d = match g.domain_of_root(vino.ino) {
                            Some(d) => d,
                            None => match self.walk_up(&inode, vino.ino, Some(g)) {
                                Up::Root => g.root_domain(),
                                Up::Domain(d) => d,
                                Up::Outside => crate::quarantine::UNSURE,
                            },
                        };
                        (d, generation)
                    }
                    None => (0, 0),
                };
                self.gate(domain.0, "lookup", ctx.guest_uid())?;
                let n = self.insert_node(
                    NewNode {
                        vino,
                        kind: kind_of(&st),
                        domain,
                        link: None,
                        inode,
                    },
                    "lookup",
                )?;
                return Ok(self.entry_for(&n, &st));
            }
        };
        self.gate(self.domain_of(&up), "lookup", ctx.guest_uid())?;
        let st = self.mount.getattr(&up.inode, WANT, 0, &perm)?;
        self.same_entry(&up, &st)
    }

    /// How the guest caches an open file. A guest O_DIRECT open is no reason for
    /// FOPEN_DIRECT_IO: the guest kernel then sends the descriptor's I/O straight to us but
    /// (Linux 6.1) leaves what its page cache holds of the range from other descriptors in
    /// place, so with KEEP_CACHE a buffered reader saw the old bytes. Without it, O_DIRECT I/O
    /// takes the kernel's direct I/O path, which writes back and invalidates the page cache of
    /// its range, as on a local filesystem, and still reaches us uncached.
    fn open_options(&self, node: &Node) -> OpenOptions {
        let class = self.class(node);
        let mut o = OpenOptions::empty();
        if self.policy.direct_io(class) {
            o |= OpenOptions::DIRECT_IO;
        }
        if self.policy.keep_cache(class) {
            o |= OpenOptions::KEEP_CACHE;
        }
        o
    }

    /// Read the whole (filtered) xattr name list.
    fn xattr_list(&self, node: &Node, perm: &ceph_client::UserPerm) -> io::Result<Vec<u8>> {
        loop {
            let size = self.mount.listxattr(&node.inode, &mut [], perm)?;
            let mut buf = vec![0u8; size];
            match self.mount.listxattr(&node.inode, &mut buf, perm) {
                Ok(n) => {
                    buf.truncate(n);
                    names::filter_xattr_list(&mut buf);
                    return Ok(buf);
                }
                // The list grew between the two calls: ask again.
                Err(e) if e.errno() == libc::ERANGE => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Mode bits a chown or truncate must clear, or keep. SB_NOSEC contract: clear
    /// setuid/setgid in the same setattr when the guest flagged it (and did not set the mode
    /// explicitly), and drop security.capability on size or owner changes. And whatever the
    /// guest negotiated: the MDS clears setgid on every chown, also without group-execute,
    /// where Linux keeps it (it marks mandatory locking there, no privilege), so a chown of
    /// a file with special bits names the mode it must end with.
    /// The bits go with CEPH_SETATTR_KILL_SGUID in the same setattr: the MDS clears them
    /// from the mode the inode has then, so a concurrent chmod is never undone by a mode we
    /// read before. Where the MDS's rule and Linux's differ (it keeps setuid without any
    /// execute bit, clears setgid without group-execute, and libcephfs clears both on every
    /// size or owner change by anyone but root), the special bits are put right afterwards
    /// (`special_after`), only if the permission bits are still those read before.
    fn setattr_kill(
        &self,
        node: &Node,
        mask: u32,
        valid: SetattrValid,
        perm: &ceph_client::UserPerm,
    ) -> io::Result<SetattrKill> {
        let mut out = SetattrKill::default();
        let owner_change = mask & (CEPH_SETATTR_UID | CEPH_SETATTR_GID) != 0;
        let size_change = mask & CEPH_SETATTR_SIZE != 0;
        let size_or_owner = owner_change || size_change;
        let flagged = valid.contains(SetattrValid::KILL_SUIDGID);
        let killpriv = self.killpriv_on() && (size_or_owner || flagged);
        if !node.is_dir() && mask & CEPH_SETATTR_MODE == 0 && (killpriv || size_or_owner) {
            let cur = u32::from(
                self.mount
                    .getattr(&node.inode, CEPH_STATX_MODE, 0, perm)?
                    .stx_mode,
            );
            let trigger = if mask & CEPH_SETATTR_SIZE != 0 {
                Trigger::Truncate
            } else {
                Trigger::Chown
            };
            let kill = if killpriv {
                let has_caps = size_or_owner && self.has_caps(node, perm);
                killpriv::decide(trigger, cur, false, flagged, has_caps)
            } else {
                Kill::default()
            };
            if kill.new_mode.is_some() {
                out.mask |= CEPH_SETATTR_KILL_SGUID;
            }
            if cur & (libc::S_ISUID | libc::S_ISGID) != 0 {
                out.special_after = Some((cur, kill.new_mode.unwrap_or(cur)));
            }
            out.remove_caps = kill.remove_caps;
        }
        Ok(out)
    }

    /// What a SETATTR does after the setattr itself.
    fn after_setattr(&self, node: &Node, mask: u32, kill: SetattrKill) -> io::Result<()> {
        // libcephfs keeps explicit times of a directory as dirty caps and sends them to the
        // MDS later, over the times the MDS gave the directory for the entries created or
        // removed in it meanwhile (`touch -d 2001-01-01 D; mkdir D/x` left D at 2001): flush
        // them now. One MDS round trip, for explicit directory times only.
        if node.is_dir() && mask & (CEPH_SETATTR_MTIME | CEPH_SETATTR_ATIME) != 0 {
            self.mount.sync_inode(&node.inode, false)?;
        }
        if let Some((before, want)) = kill.special_after {
            self.put_special_bits(node, before, want)?;
        }
        if kill.remove_caps {
            self.apply_kill(
                node,
                Kill {
                    new_mode: None,
                    remove_caps: kill.remove_caps,
                },
            )?;
        }
        Ok(())
    }
}

impl FileSystem for CephFs {
    type Inode = u64;
    type Handle = u64;

    fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
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
            | FsOptions::CACHE_SYMLINKS;
        if self.cfg.cache == CacheMode::Auto {
            want |= FsOptions::AUTO_INVAL_DATA;
        }
        if self.cfg.killpriv_v2 {
            want |= FsOptions::HANDLE_KILLPRIV_V2;
        }
        let on = self.cfg.killpriv_v2 && capable.contains(FsOptions::HANDLE_KILLPRIV_V2);
        self.killpriv.store(on, Ordering::Relaxed);
        self.migration.note_init(capable);
        tracing::info!(killpriv_v2 = on, cache = %self.cfg.cache, "FUSE session starts");
        Ok(want)
    }

    fn destroy(&self) {
        self.handles.clear();
        self.nodes.clear();
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        let ctx = &self.caller(ctx)?;
        names::check_name(name, Use::Lookup).map_err(errno)?;
        let parent = self.dir_op(parent, "lookup", ctx)?;
        match self
            .lookup_name(&parent, name, ctx)
            .and_then(|e| self.snapdir_visible(e))
        {
            // A negative entry lets the guest cache "not there" for as long as a positive one.
            Err(e)
                if e.raw_os_error() == Some(libc::ENOENT) && self.cfg.cache != CacheMode::Never =>
            {
                Ok(Entry {
                    inode: 0,
                    generation: 0,
                    attr: to_stat(&Statx::default(), &self.cfg.idmap),
                    attr_flags: 0,
                    attr_timeout: Duration::ZERO,
                    entry_timeout: self.policy.ttl(self.class(&parent)).entry,
                })
            }
            r => r,
        }
    }

    fn forget(&self, _ctx: &Context, inode: u64, count: u64) {
        self.nodes.forget(inode, count);
    }

    fn batch_forget(&self, _ctx: &Context, requests: Vec<(u64, u64)>) {
        for (inode, count) in requests {
            self.nodes.forget(inode, count);
        }
    }

    fn getattr(
        &self,
        ctx: &Context,
        inode: u64,
        _handle: Option<u64>,
    ) -> io::Result<(stat64, Duration)> {
        let ctx = &self.caller(ctx)?;
        let node = self.node_op(inode, "getattr", ctx)?;
        let st = self.mount.getattr(&node.inode, WANT, 0, &self.perm(ctx))?;
        Ok((
            to_stat(&st, &self.cfg.idmap),
            self.policy.ttl(self.class(&node)).attr,
        ))
    }

    fn setattr(
        &self,
        ctx: &Context,
        inode: u64,
        attr: stat64,
        handle: Option<u64>,
        valid: SetattrValid,
    ) -> io::Result<(stat64, Duration)> {
        let ctx = &self.caller(ctx)?;
        let attr = perms::setattr_owners(attr, valid, &self.cfg.idmap)?;
        let node = self.node_op(inode, "setattr", ctx)?;
        // Only a regular file has a size to set (Linux's do_truncate: EISDIR, else EINVAL).
        // Pacific's MDS dies of the others: a directory's size set and then lowered is a
        // SIGFPE in Filer::truncate, a special file's trips an assert (hostile suite).
        if valid.contains(SetattrValid::SIZE) && node.kind != libc::S_IFREG {
            return Err(errno(if node.is_dir() {
                libc::EISDIR
            } else {
                libc::EINVAL
            }));
        }
        // A handle, when given, must be one of ours for this node.
        let through_writable_handle = match handle {
            Some(fh) => match &self.handles.get(inode, fh).map_err(errno)?.handle {
                Handle::File(f) => f.writable,
                Handle::Dir(_) => false,
            },
            None => false,
        };
        let mut perm = self.perm(ctx);
        let now = ceph_client::Timespec::now();
        let (mut st, mut mask) = setattr_request(&attr, valid, now)?;
        let kill = self.setattr_kill(&node, mask, valid, &perm)?;
        mask |= kill.mask;
        // chmod g+s by an owner who belongs to the file's group only through a supplementary
        // group: libcephfs, which knows the primary gid only, drops the bit silently. The
        // guest kernel already cleared it where the caller is no member of the group
        // (`default_permissions`), so the owner's mode is set as root.
        if chmod_sets_sgid(&st, mask, ctx.host_uid().get())
            && self
                .mount
                .getattr(&node.inode, CEPH_STATX_UID, 0, &perm)?
                .stx_uid
                == ctx.host_uid().get()
        {
            perm = self.perms.root();
        }
        // ftruncate(2) needs only a descriptor open for writing (`ftruncate_request`).
        if through_writable_handle {
            if let Some((s, m)) = ftruncate_request(&st, mask, now) {
                perm = self.perms.root();
                (st, mask) = (s, m);
            }
        }
        if mask != 0 {
            match self.mount.setattr(&node.inode, &st, mask, &perm) {
                Ok(()) => {}
                // libcephfs checks with the primary gid only and turns "now" into explicit
                // times; some changes Linux allows it refuses. See `allowed_by_guest`.
                Err(e) if e.errno() == libc::EPERM && !ctx.host_uid().is_root() => {
                    if !self.allowed_by_guest(&node, &st, mask, ctx, &perm)? {
                        return Err(e.into());
                    }
                    self.mount
                        .setattr(&node.inode, &st, mask, &self.perms.root())?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.after_setattr(&node, mask, kill)?;
        let out = self.mount.getattr(&node.inode, WANT, 0, &perm)?;
        Ok((
            to_stat(&out, &self.cfg.idmap),
            self.policy.ttl(self.class(&node)).attr,
        ))
    }

    fn readlink(&self, ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
        let ctx = &self.caller(ctx)?;
        let node = self.node_op(inode, "readlink", ctx)?;
        Ok(self.mount.readlink(&node.inode, &self.perm(ctx))?)
    }

    fn symlink(
        &self,
        ctx: &Context,
        linkname: &CStr,
        parent: u64,
        name: &CStr,
    ) -> io::Result<Entry> {
        let ctx = &self.caller(ctx)?;
        self.changed_name(name, names::Change::New)?;
        if linkname.to_bytes().len() >= PATH_MAX {
            return Err(errno(libc::ENAMETOOLONG));
        }
        let parent = self.dir_op(parent, "symlink", ctx)?;
        self.snapdir_change(&parent)?;
        self.node_room("symlink")?;
        let (inode, st) =
            self.mount
                .symlink(&parent.inode, name, linkname, WANT, 0, &self.perm(ctx))?;
        self.child_entry(&parent, name.to_bytes(), inode, &st, "symlink", None)
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
        let ctx = &self.caller(ctx)?;
        self.changed_name(name, names::Change::New)?;
        mknod_allowed(mode, self.cfg.allow_device_nodes)?;
        let parent = self.dir_op(parent, "mknod", ctx)?;
        self.snapdir_change(&parent)?;
        self.node_room("mknod")?;
        let (inode, st) = self.mount.mknod(
            &parent.inode,
            name,
            mode,
            u64::from(rdev),
            WANT,
            0,
            &self.perm(ctx),
        )?;
        self.child_entry(&parent, name.to_bytes(), inode, &st, "mknod", None)
    }

    fn mkdir(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        _umask: u32,
    ) -> io::Result<Entry> {
        let ctx = &self.caller(ctx)?;
        self.changed_name(name, names::Change::New)?;
        let parent = self.dir_op(parent, "mkdir", ctx)?;
        self.snapdir_change(&parent)?;
        self.node_room("mkdir")?;
        let (inode, st) =
            self.mount
                .mkdir(&parent.inode, name, mode & 0o7777, WANT, 0, &self.perm(ctx))?;
        self.child_entry(&parent, name.to_bytes(), inode, &st, "mkdir", None)
    }

    fn unlink(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        let ctx = &self.caller(ctx)?;
        self.changed_name(name, names::Change::Unlink)?;
        let parent = self.dir_op(parent, "unlink", ctx)?;
        self.snapdir_change(&parent)?;
        self.mount.unlink(&parent.inode, name, &self.perm(ctx))?;
        Ok(())
    }

    fn rmdir(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        let ctx = &self.caller(ctx)?;
        self.changed_name(name, names::Change::Rmdir)?;
        let parent = self.dir_op(parent, "rmdir", ctx)?;
        self.snapdir_change(&parent)?;
        let perm = self.perm(ctx);
        if self.names_denied_root(&parent, name, &perm) {
            return Err(errno(libc::EACCES));
        }
        self.mount.rmdir(&parent.inode, name, &perm)?;
        Ok(())
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
        let ctx = &self.caller(ctx)?;
        self.changed_name(oldname, names::Change::Rename)?;
        self.changed_name(newname, names::Change::Rename)?;
        let old = self.dir_op(olddir, "rename", ctx)?;
        let new = self.dir_op(newdir, "rename", ctx)?;
        self.snapdir_change(&old)?;
        self.snapdir_change(&new)?;
        let perm = self.perm(ctx);
        // Moving a quarantined directory itself (or replacing one) is refused as well.
        if self.names_denied_root(&old, oldname, &perm)
            || self.names_denied_root(&new, newname, &perm)
        {
            return Err(errno(libc::EACCES));
        }
        match flags {
            // POSIX: a rename between two links of one file does nothing. Linux's VFS checks
            // it before asking the filesystem, but a guest whose dentries are stale (another
            // client linked the names) sends it, and libcephfs then removed the source name
            // and lost track of the file's other names.
            0 => match self.rename_target(&old, oldname, &new, newname, &perm)? {
                RenameTarget::Same => return Ok(()),
                // See `side`: through the main session, libcephfs would hide the other names.
                RenameTarget::LinkedFile => {
                    if let Some(r) =
                        self.side
                            .rename(old.vino.ino, oldname, new.vino.ino, newname, &perm)
                    {
                        r?;
                        self.after_rename(&old, &new);
                        return Ok(());
                    }
                }
                RenameTarget::None | RenameTarget::Other => {}
            },
            // libcephfs has no atomic "rename unless the target exists": check, then rename.
            // Another client creating the target between the two steps is not caught; within
            // one guest the kernel's directory locks serialise the two.
            f if f == libc::RENAME_NOREPLACE => {
                match self.mount.lookup(&new.inode, newname, 0, 0, &perm) {
                    Ok(_) => return Err(errno(libc::EEXIST)),
                    Err(e) if e.errno() == libc::ENOENT => {}
                    Err(e) => return Err(e.into()),
                }
            }
            // RENAME_EXCHANGE cannot be done atomically through libcephfs; WHITEOUT is overlayfs'.
            _ => return Err(errno(libc::EINVAL)),
        }
        self.mount
            .rename(&old.inode, oldname, &new.inode, newname, &perm)?;
        self.after_rename(&old, &new);
        Ok(())
    }

    fn link(&self, ctx: &Context, inode: u64, newparent: u64, newname: &CStr) -> io::Result<Entry> {
        let ctx = &self.caller(ctx)?;
        self.changed_name(newname, names::Change::New)?;
        let node = self.node_op(inode, "link", ctx)?;
        let parent = self.dir_op(newparent, "link", ctx)?;
        if node.is_dir() {
            // link(2) of a directory; libcephfs would hand it to the MDS.
            return Err(errno(libc::EPERM));
        }
        self.snapdir_change(&parent)?;
        let perm = self.perm(ctx);
        self.mount
            .link(&node.inode, &parent.inode, newname, &perm)?;
        let st = self.mount.getattr(&node.inode, WANT, 0, &perm)?;
        self.same_entry(&node, &st)
    }

    fn open(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        let ctx = &self.caller(ctx)?;
        let node = self.node_op(inode, "open", ctx)?;
        if node.is_dir() {
            return Err(errno(libc::EISDIR));
        }
        // The guest kernel opens FIFOs, sockets and devices itself (no OPEN is sent for
        // them), and a libcephfs handle of one lets writes ask the MDS for a max_size it
        // asserts only files have (the MDS aborts): a request for one is refused.
        if node.kind != libc::S_IFREG {
            return Err(errno(libc::EINVAL));
        }
        let perm = self.perm(ctx);
        // O_DIRECT goes through: libcephfs then writes to the OSDs before WRITE is answered
        // and reads from them, as the guest's O_DIRECT user expects of a device.
        let keep = libc::O_ACCMODE
            | libc::O_APPEND
            | libc::O_TRUNC
            | libc::O_SYNC
            | libc::O_DSYNC
            | libc::O_DIRECT
            | libc::O_NOFOLLOW;
        let oflags = open_flags(flags, keep)?;
        self.handle_room("open")?;
        // O_TRUNC is done here, after the open and the privilege kill (see `open_truncate`).
        let file = self
            .mount
            .open(&node.inode, oflags & !libc::O_TRUNC, &perm)?;
        let writer = self.direct_writer(&node, oflags)?;
        if oflags & libc::O_TRUNC != 0 {
            let flagged = fuse_flags & FOPEN_IN_KILL_SUIDGID != 0;
            self.open_truncate(&node, oflags, flagged, true, &perm)?;
        }
        let fh = self.new_handle(
            inode,
            Handle::File(OpenFile::new(file, writer, oflags, &node)),
            "open",
        )?;
        Ok((Some(fh), self.open_options(&node), None))
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        args: CreateIn,
    ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
        let ctx = &self.caller(ctx)?;
        self.changed_name(name, names::Change::New)?;
        let parent = self.dir_op(parent, "create", ctx)?;
        self.snapdir_change(&parent)?;
        let perm = self.perm(ctx);
        let keep = libc::O_ACCMODE
            | libc::O_CREAT
            | libc::O_EXCL
            | libc::O_APPEND
            | libc::O_TRUNC
            | libc::O_SYNC
            | libc::O_DSYNC
            | libc::O_DIRECT;
        let oflags = open_flags(args.flags, keep)? | libc::O_CREAT;
        // A full table refuses the request before the file exists.
        self.handle_room("create")?;
        self.node_room("create")?;
        let (inode, mut st, file) = self.mount.create(
            &parent.inode,
            name,
            args.mode & 0o7777,
            oflags & !libc::O_TRUNC,
            WANT | ceph_client::CEPH_STATX_SIZE,
            0,
            &perm,
        )?;
        let entry = self.child_entry(&parent, name.to_bytes(), inode, &st, "create", None)?;
        let node = self.node(entry.inode)?;
        // From here on the node holds a lookup for the guest: every failure gives it back,
        // or the guest, which gets an error and no entry, could never FORGET it.
        let opened = (|| {
            let writer = self.direct_writer(&node, oflags)?;
            // CREATE can open an existing file (no O_EXCL): O_TRUNC then has the SB_NOSEC duty.
            // A file with data existed before; an empty one may be new (its setuid/setgid bits
            // are the creator's choice), so only its file capabilities go. Either way the
            // first WRITE takes the bits away.
            if oflags & libc::O_TRUNC != 0 && oflags & libc::O_EXCL == 0 {
                let existing = st.stx_size != 0;
                let flagged = args.fuse_flags & FOPEN_IN_KILL_SUIDGID != 0 && existing;
                self.open_truncate(&node, oflags, flagged, existing, &perm)?;
                if existing {
                    st = self.mount.getattr(&node.inode, WANT, 0, &perm)?;
                }
            }
            self.new_handle(
                node.id,
                Handle::File(OpenFile::new(file, writer, oflags, &node)),
                "create",
            )
        })();
        let fh = match opened {
            Ok(fh) => fh,
            Err(e) => {
                self.nodes.forget(node.id, 1);
                return Err(e);
            }
        };
        let entry = self.entry_for(&node, &st);
        let opts = self.open_options(&node);
        Ok((entry, Some(fh), opts, None))
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
        let h = self.handles.remove(inode, handle).map_err(errno)?;
        if let (Handle::File(f), true, Some(owner)) = (&h.handle, flock_release, lock_owner) {
            // Best effort: the handle goes either way, and closing it drops its locks too.
            if let Err(e) = f.file.flock(libc::LOCK_UN, owner) {
                tracing::debug!(%e, "flock unlock on release");
            }
        }
        Ok(())
    }

    fn statfs(&self, ctx: &Context, inode: u64) -> io::Result<statvfs64> {
        let ctx = &self.caller(ctx)?;
        let node = self.node_op(inode, "statfs", ctx)?;
        let s = self.mount.statfs(&node.inode)?;
        // SAFETY: statvfs64 is a plain C struct of integers (with private padding); all-zero is
        // a valid value for it.
        let mut out: statvfs64 = unsafe { std::mem::zeroed() };
        out.f_bsize = s.f_bsize;
        out.f_frsize = s.f_frsize;
        out.f_blocks = s.f_blocks;
        out.f_bfree = s.f_bfree;
        out.f_bavail = s.f_bavail;
        out.f_files = s.f_files;
        out.f_ffree = s.f_ffree;
        out.f_favail = s.f_favail;
        out.f_fsid = s.f_fsid;
        out.f_flag = s.f_flag;
        out.f_namemax = s.f_namemax;
        Ok(out)
    }

    fn setxattr(
        &self,
        ctx: &Context,
        inode: u64,
        name: &CStr,
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        let ctx = &self.caller(ctx)?;
        if !self.cfg.xattr {
            return Err(errno(libc::ENOSYS));
        }
        match names::xattr_access(name.to_bytes(), self.cfg.allow_ceph_xattr_set) {
            XattrAccess::Full => {}
            XattrAccess::ReadOnly | XattrAccess::Hidden => return Err(errno(libc::EPERM)),
        }
        self.privileged_xattr(name, ctx.host_uid(), false)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(errno(libc::E2BIG));
        }
        let flags = i32::try_from(flags).map_err(|_| errno(libc::EINVAL))?;
        let node = self.node_op(inode, "setxattr", ctx)?;
        Ok(self
            .mount
            .setxattr(&node.inode, name, value, flags, &self.perm(ctx))?)
    }

    fn getxattr(
        &self,
        ctx: &Context,
        inode: u64,
        name: &CStr,
        size: u32,
    ) -> io::Result<GetxattrReply> {
        let ctx = &self.caller(ctx)?;
        if !self.cfg.xattr {
            return Err(errno(libc::ENOSYS));
        }
        if names::xattr_access(name.to_bytes(), true) == XattrAccess::Hidden {
            return Err(errno(libc::ENODATA));
        }
        let node = self.node_op(inode, "getxattr", ctx)?;
        let perm = self.perm(ctx);
        if size == 0 {
            let n = self.mount.getxattr(&node.inode, name, &mut [], &perm)?;
            return Ok(GetxattrReply::Count(
                u32::try_from(n).map_err(|_| errno(libc::E2BIG))?,
            ));
        }
        let mut buf = vec![0u8; to_len(size)?.min(XATTR_SIZE_MAX)];
        let n = self.mount.getxattr(&node.inode, name, &mut buf, &perm)?;
        buf.truncate(n);
        Ok(GetxattrReply::Value(buf))
    }

    fn listxattr(&self, ctx: &Context, inode: u64, size: u32) -> io::Result<ListxattrReply> {
        let ctx = &self.caller(ctx)?;
        if !self.cfg.xattr {
            return Err(errno(libc::ENOSYS));
        }
        let node = self.node_op(inode, "listxattr", ctx)?;
        let list = self.xattr_list(&node, &self.perm(ctx))?;
        let len = u32::try_from(list.len()).map_err(|_| errno(libc::E2BIG))?;
        if size == 0 {
            Ok(ListxattrReply::Count(len))
        } else if len > size {
            Err(errno(libc::ERANGE))
        } else {
            Ok(ListxattrReply::Names(list))
        }
    }

    fn removexattr(&self, ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> {
        let ctx = &self.caller(ctx)?;
        if !self.cfg.xattr {
            return Err(errno(libc::ENOSYS));
        }
        match names::xattr_access(name.to_bytes(), self.cfg.allow_ceph_xattr_set) {
            XattrAccess::Full => {}
            XattrAccess::ReadOnly => return Err(errno(libc::EPERM)),
            XattrAccess::Hidden => return Err(errno(libc::ENODATA)),
        }
        self.privileged_xattr(name, ctx.host_uid(), true)?;
        let node = self.node_op(inode, "removexattr", ctx)?;
        match self.mount.removexattr(&node.inode, name, &self.perm(ctx)) {
            // libcephfs says ENOENT for a name the inode does not carry (when it carries
            // others); Linux says ENODATA. The inode itself exists: we hold it.
            Err(e) if e.errno() == libc::ENOENT => Err(errno(libc::ENODATA)),
            r => Ok(r?),
        }
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
        let node = self.node_op(inode, "access", ctx)?;
        let st = self.mount.getattr(&node.inode, WANT, 0, &self.perm(ctx))?;
        access_allowed(&st, ctx.host_uid().get(), ctx.host_gid().get(), mask)
            .then_some(())
            .ok_or_else(|| errno(libc::EACCES))
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

/// The mode to set after a size or owner change so that the setuid/setgid bits are those of
/// `want` (see `CephFs::put_special_bits`): `None` when they already are, or when the other bits
/// of `now` are no longer those of `before` (someone changed the mode meanwhile: theirs stands).
fn special_bits_after(before: u32, now: u32, want: u32) -> Option<u32> {
    const SPECIAL: u32 = libc::S_ISUID | libc::S_ISGID;
    let (before, now) = (before & 0o7777, now & 0o7777);
    if now & !SPECIAL != before & !SPECIAL || now & SPECIAL == want & SPECIAL {
        return None;
    }
    Some((now & !SPECIAL) | (want & SPECIAL))
}

/// MKNOD's file types: regular files, FIFOs and sockets, and device nodes only when the operator
/// allows them (other clients that mount CephFS without nodev would open the guest's devices).
/// A directory is EPERM and an unknown type EINVAL, as Linux's mknod(2) answers (`may_mknod`);
/// a device node refused by policy is EPERM, as for a caller without CAP_MKNOD.
fn mknod_allowed(mode: u32, devices: bool) -> io::Result<()> {
    match mode & libc::S_IFMT {
        // Type 0 is a regular file for mknod(2).
        0 | libc::S_IFREG | libc::S_IFIFO | libc::S_IFSOCK => Ok(()),
        libc::S_IFCHR | libc::S_IFBLK if devices => Ok(()),
        libc::S_IFCHR | libc::S_IFBLK | libc::S_IFDIR => Err(errno(libc::EPERM)),
        _ => Err(errno(libc::EINVAL)),
    }
}

/// access(2) against the attributes, for the caller's uid and primary gid (FUSE does not carry
/// supplementary groups). root may read/write anything and execute what has any x bit.
pub fn access_allowed(st: &Statx, uid: u32, gid: u32, mask: u32) -> bool {
    let mode = u32::from(st.stx_mode);
    let mask = mask & 0o7;
    if mask == 0 {
        return true;
    }
    if uid == 0 {
        let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
        return mask & 1 == 0 || is_dir || mode & 0o111 != 0;
    }
    let bits = if st.stx_uid == uid {
        (mode >> 6) & 7
    } else if st.stx_gid == gid {
        (mode >> 3) & 7
    } else {
        mode & 7
    };
    bits & mask == mask
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(mode: u32, uid: u32, gid: u32) -> Statx {
        Statx {
            stx_mode: mode as u16,
            stx_uid: uid,
            stx_gid: gid,
            ..Default::default()
        }
    }

    #[test]
    fn hostile_special_bits_never_undo_a_concurrent_chmod() {
        const SGID: u32 = libc::S_ISGID;
        // chown of 02644 (setgid without group-exec, kept by Linux) cleared by the MDS: put back.
        assert_eq!(
            special_bits_after(SGID | 0o644, 0o100644, SGID | 0o644),
            Some(SGID | 0o644)
        );
        // Already as wanted: nothing to do.
        assert_eq!(
            special_bits_after(SGID | 0o644, SGID | 0o644, SGID | 0o644),
            None
        );
        // Someone ran chmod 600 in between: their mode stands, no bit comes back.
        assert_eq!(special_bits_after(SGID | 0o644, 0o600, SGID | 0o644), None);
        // A kill the MDS did not do (setuid without any execute bit): cleared, bits kept.
        assert_eq!(
            special_bits_after(libc::S_ISUID | 0o644, libc::S_ISUID | 0o644, 0o644),
            Some(0o644)
        );
    }

    #[test]
    fn hostile_mknod_types_are_filtered() {
        let e = |r: io::Result<()>| r.unwrap_err().raw_os_error();
        for t in [0, libc::S_IFREG, libc::S_IFIFO, libc::S_IFSOCK] {
            assert!(mknod_allowed(t | 0o644, false).is_ok(), "{t:o}");
        }
        for t in [libc::S_IFCHR, libc::S_IFBLK] {
            assert_eq!(e(mknod_allowed(t | 0o600, false)), Some(libc::EPERM));
            assert!(mknod_allowed(t | 0o600, true).is_ok());
        }
        assert_eq!(
            e(mknod_allowed(libc::S_IFDIR | 0o755, true)),
            Some(libc::EPERM)
        );
        for t in [libc::S_IFLNK, 0o110000, 0o070000] {
            assert_eq!(
                e(mknod_allowed(t | 0o755, true)),
                Some(libc::EINVAL),
                "{t:o}"
            );
        }
    }

    #[test]
    fn access_follows_owner_group_other() {
        let f = st(libc::S_IFREG | 0o640, 1000, 100);
        assert!(access_allowed(&f, 1000, 1, 6));
        assert!(!access_allowed(&f, 1000, 1, 1));
        assert!(access_allowed(&f, 2000, 100, 4));
        assert!(!access_allowed(&f, 2000, 100, 2));
        assert!(!access_allowed(&f, 2000, 200, 4));
        assert!(access_allowed(&f, 0, 0, 6));
        assert!(
            !access_allowed(&f, 0, 0, 1),
            "root needs some x bit to execute"
        );
        assert!(access_allowed(&st(libc::S_IFDIR | 0o700, 5, 5), 0, 0, 1));
        assert!(access_allowed(&f, 2000, 200, 0), "F_OK");
    }

    fn attr() -> stat64 {
        let mut a = to_stat(&Statx::default(), &IdMapping::default());
        a.st_size = 4123;
        a.st_mtime = 978_307_200;
        a.st_mtime_nsec = 5;
        a
    }

    const NOW: ceph_client::Timespec = ceph_client::Timespec {
        tv_sec: 1_800_000_000,
        tv_nsec: 7,
    };

    #[test]
    fn a_size_change_alone_sets_mtime_to_now() {
        // ftruncate(2): the kernel sends the size only.
        let (st, mask) = setattr_request(&attr(), SetattrValid::SIZE, NOW).unwrap();
        assert_eq!(
            mask,
            CEPH_SETATTR_SIZE | CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW
        );
        assert_eq!((st.stx_size, st.stx_mtime), (4123, NOW));
        // truncate(2): size and "mtime now".
        let v = SetattrValid::SIZE | SetattrValid::MTIME | SetattrValid::MTIME_NOW;
        let (st, mask) = setattr_request(&attr(), v, NOW).unwrap();
        assert_eq!(
            mask,
            CEPH_SETATTR_SIZE | CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW
        );
        assert_eq!(st.stx_mtime, NOW);
        // An explicit time given with the size stays as given.
        let v = SetattrValid::SIZE | SetattrValid::MTIME;
        let (st, mask) = setattr_request(&attr(), v, NOW).unwrap();
        assert_eq!(mask, CEPH_SETATTR_SIZE | CEPH_SETATTR_MTIME);
        assert_eq!(
            (st.stx_mtime.tv_sec, st.stx_mtime.tv_nsec),
            (978_307_200, 5)
        );
    }

    #[test]
    fn now_times_keep_their_now_bits() {
        let v = SetattrValid::ATIME
            | SetattrValid::ATIME_NOW
            | SetattrValid::MTIME
            | SetattrValid::MTIME_NOW;
        let (st, mask) = setattr_request(&attr(), v, NOW).unwrap();
        assert_eq!(
            mask,
            CEPH_SETATTR_ATIME
                | CEPH_SETATTR_ATIME_NOW
                | CEPH_SETATTR_MTIME
                | CEPH_SETATTR_MTIME_NOW
        );
        assert_eq!((st.stx_atime, st.stx_mtime), (NOW, NOW));
        // Explicit times carry no NOW bit (libcephfs then requires the owner).
        let v = SetattrValid::ATIME | SetattrValid::MTIME;
        let (_, mask) = setattr_request(&attr(), v, NOW).unwrap();
        assert_eq!(mask, CEPH_SETATTR_ATIME | CEPH_SETATTR_MTIME);
        // A mode or owner change sets ctime to now, even when it changes nothing.
        let v = SetattrValid::MODE | SetattrValid::UID;
        let (st, mask) = setattr_request(&attr(), v, NOW).unwrap();
        assert_eq!(
            mask,
            CEPH_SETATTR_MODE | CEPH_SETATTR_UID | CEPH_SETATTR_CTIME
        );
        assert_eq!(st.stx_ctime, NOW);
    }

    /// Each SETATTR valid bit alone: the field it sets and the mask it asks for.
    #[test]
    fn each_setattr_bit_sets_its_field() {
        let mut a = attr();
        a.st_mode = libc::S_IFREG | 0o4755;
        a.st_uid = 1001;
        a.st_gid = 1002;
        a.st_atime = 111;
        a.st_atime_nsec = 1;
        a.st_ctime = 333;
        a.st_ctime_nsec = 3;
        let req = |v| setattr_request(&a, v, NOW).unwrap();
        let ts = |tv_sec, tv_nsec| ceph_client::Timespec { tv_sec, tv_nsec };

        // MODE: permission and special bits only (never the type); ctime now.
        let (st, mask) = req(SetattrValid::MODE);
        assert_eq!(mask, CEPH_SETATTR_MODE | CEPH_SETATTR_CTIME);
        assert_eq!((st.stx_mode, st.stx_ctime), (0o4755, NOW));
        // UID, GID: the owner; ctime now.
        let (st, mask) = req(SetattrValid::UID);
        assert_eq!(mask, CEPH_SETATTR_UID | CEPH_SETATTR_CTIME);
        assert_eq!((st.stx_uid, st.stx_ctime), (1001, NOW));
        let (st, mask) = req(SetattrValid::GID);
        assert_eq!(mask, CEPH_SETATTR_GID | CEPH_SETATTR_CTIME);
        assert_eq!((st.stx_gid, st.stx_ctime), (1002, NOW));
        // SIZE: the size, and mtime now (see a_size_change_alone_sets_mtime_to_now).
        let (st, mask) = req(SetattrValid::SIZE);
        assert_eq!(
            mask,
            CEPH_SETATTR_SIZE | CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW
        );
        assert_eq!((st.stx_size, st.stx_mtime), (4123, NOW));
        // ATIME, MTIME: explicit times, no NOW bit, no ctime (libcephfs sets it).
        let (st, mask) = req(SetattrValid::ATIME);
        assert_eq!((mask, st.stx_atime), (CEPH_SETATTR_ATIME, ts(111, 1)));
        let (st, mask) = req(SetattrValid::MTIME);
        assert_eq!(
            (mask, st.stx_mtime),
            (CEPH_SETATTR_MTIME, ts(978_307_200, 5))
        );
        // ATIME_NOW, MTIME_NOW: now, with the NOW bit (also without ATIME/MTIME).
        let (st, mask) = req(SetattrValid::ATIME_NOW);
        assert_eq!(
            (mask, st.stx_atime),
            (CEPH_SETATTR_ATIME | CEPH_SETATTR_ATIME_NOW, NOW)
        );
        let (st, mask) = req(SetattrValid::MTIME_NOW);
        assert_eq!(
            (mask, st.stx_mtime),
            (CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW, NOW)
        );
        // CTIME: the explicit ctime, kept (no now).
        let (st, mask) = req(SetattrValid::CTIME);
        assert_eq!((mask, st.stx_ctime), (CEPH_SETATTR_CTIME, ts(333, 3)));
        // An explicit ctime wins over the "ctime now" of a mode change.
        let (st, mask) = req(SetattrValid::MODE | SetattrValid::CTIME);
        assert_eq!(mask, CEPH_SETATTR_MODE | CEPH_SETATTR_CTIME);
        assert_eq!(st.stx_ctime, ts(333, 3));
        // KILL_SUIDGID sets no field of its own: the setuid/setgid clearing it asks for is
        // decided against the inode's mode (`CephFs::setattr_kill`).
        assert_eq!(req(SetattrValid::KILL_SUIDGID).1, 0);
        assert_eq!(req(SetattrValid::empty()).1, 0);
    }

    #[test]
    fn ftruncate_through_a_handle_sets_size_and_times_to_now_only() {
        let (st, mask) = setattr_request(&attr(), SetattrValid::SIZE, NOW).unwrap();
        // ftruncate(2): size, mtime now; ctime is libcephfs's to set (root may not choose it).
        let (ft, fmask) = ftruncate_request(&st, mask | CEPH_SETATTR_CTIME, NOW).unwrap();
        assert_eq!(
            fmask,
            CEPH_SETATTR_SIZE | CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW
        );
        assert_eq!((ft.stx_size, ft.stx_mtime), (4123, NOW));
        // An explicit mtime with the size becomes now: root could set any.
        let v = SetattrValid::SIZE | SetattrValid::MTIME;
        let (st, mask) = setattr_request(&attr(), v, NOW).unwrap();
        let (ft, fmask) = ftruncate_request(&st, mask, NOW).unwrap();
        assert_eq!(
            (fmask, ft.stx_mtime),
            (
                CEPH_SETATTR_SIZE | CEPH_SETATTR_MTIME | CEPH_SETATTR_MTIME_NOW,
                NOW
            )
        );
        // The kill bit stays.
        let (_, fmask) = ftruncate_request(&st, mask | CEPH_SETATTR_KILL_SGUID, NOW).unwrap();
        assert_ne!(fmask & CEPH_SETATTR_KILL_SGUID, 0);
        // Anything more than a size change (and its times), or no size: the caller's rights.
        for v in [
            SetattrValid::SIZE | SetattrValid::MODE,
            SetattrValid::SIZE | SetattrValid::UID,
            SetattrValid::SIZE | SetattrValid::ATIME,
            SetattrValid::MTIME,
        ] {
            let (st, mask) = setattr_request(&attr(), v, NOW).unwrap();
            assert!(ftruncate_request(&st, mask, NOW).is_none(), "{v:?}");
        }
    }

    #[test]
    fn only_a_plain_chmod_g_plus_s_by_a_non_root_caller_goes_as_root() {
        let mut a = attr();
        a.st_mode = libc::S_IFREG | 0o2755;
        let (st, mask) = setattr_request(&a, SetattrValid::MODE, NOW).unwrap();
        assert!(chmod_sets_sgid(&st, mask, 1000));
        assert!(!chmod_sets_sgid(&st, mask, 0), "root needs no help");
        let (st2, mask2) =
            setattr_request(&a, SetattrValid::MODE | SetattrValid::UID, NOW).unwrap();
        assert!(!chmod_sets_sgid(&st2, mask2, 1000), "not a plain chmod");
        a.st_mode = libc::S_IFREG | 0o4755;
        let (st, mask) = setattr_request(&a, SetattrValid::MODE, NOW).unwrap();
        assert!(!chmod_sets_sgid(&st, mask, 1000), "no setgid");
    }

    #[test]
    fn a_negative_size_is_refused() {
        let mut a = attr();
        a.st_size = -1;
        let e = setattr_request(&a, SetattrValid::SIZE, NOW).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }

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

    #[test]
    fn statx_becomes_stat() {
        let mut x = st(libc::S_IFREG | 0o644, 7, 8);
        x.stx_ino = 0x100_0000_0001;
        x.stx_size = u64::MAX;
        x.stx_nlink = 2;
        let s = to_stat(&x, &IdMapping::default());
        assert_eq!(s.st_ino, 0x100_0000_0001);
        assert_eq!(s.st_mode, libc::S_IFREG | 0o644);
        assert_eq!(s.st_size, i64::MAX, "sizes past i64 saturate");
        assert_eq!((s.st_uid, s.st_gid, s.st_nlink), (7, 8, 2));
    }

    #[test]
    fn replied_owners_are_the_guests_ids() {
        let rule = |r: &str| r.parse::<crate::idmap::Rule>().unwrap();
        let ids =
            IdMapping::new(&[rule("map:0:5000:1")], &[rule("squash-host:5000:0:100")]).unwrap();
        let s = to_stat(&st(libc::S_IFREG | 0o644, 5000, 5050), &ids);
        assert_eq!((s.st_uid, s.st_gid), (0, 0));
        let s = to_stat(&st(libc::S_IFREG | 0o644, 42, 42), &ids);
        assert_eq!((s.st_uid, s.st_gid), (42, 42));
    }
}
