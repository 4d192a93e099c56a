//! Open files: OPEN, CREATE and RELEASE, the handle table's entries (with the `--max-handles`
//! limit), the O_TRUNC of an open, and how the guest may cache an open file.

use std::ffi::CStr;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use ceph_client::{File, Inode};
use fuse_backend_rs::abi::fuse_abi::{CreateIn, OpenOptions, FOPEN_IN_KILL_SUIDGID};
use fuse_backend_rs::api::filesystem::Entry;

use crate::idmap::GuestUid;

use super::killpriv::Trigger;
use super::limits::Table;
use super::perms::Caller;
use super::state;
use super::{errno, names, open_flags, CephFs, Handle, Node, WANT};

#[derive(Debug)]
pub struct OpenFile {
    /// Shared with the async reads and writes in flight on it (`fs::aio`).
    pub(super) file: Arc<File>,
    /// Head inode number of the file.
    pub(super) ino: u64,
    /// `file` was opened O_DIRECT: libcephfs reads and writes it without its object cache.
    pub(super) direct: bool,
    /// For a guest's O_DIRECT descriptor open for writing: a second libcephfs handle of the
    /// same inode, opened O_DSYNC instead of O_DIRECT. libcephfs writes O_DIRECT data straight
    /// to the OSDs and leaves whatever its object cache holds of that range in place, so later
    /// buffered reads would return the old bytes; an O_DSYNC write goes into the cache and
    /// flushes exactly its range to the OSDs before returning. Used for the inodes whose data
    /// the cache may hold (see [`cached`]).
    pub(super) writer: Option<File>,
    /// Buffered I/O through this handle was noted in [`CephFs::cached`].
    pub(super) noted: AtomicBool,
    /// Opened for writing: an ftruncate through it needs no further permission.
    pub(super) writable: bool,
    /// POSIX locks were taken through this handle: FLUSH must release the owner's locks.
    pub(super) locked: AtomicBool,
    /// BSD locks were taken through this handle (a migration asks whether one is held).
    pub(super) flocked: AtomicBool,
    /// The open flags libcephfs got (a migration opens the file again with them).
    pub(super) oflags: i32,
    /// The guest caller that opened it (a migration opens the file again as that caller).
    pub(super) opener: crate::migration::Opener,
    /// The node it was opened on: its quarantine domain is asked on every request, so a
    /// handle follows its node's domain when that is derived again.
    pub(super) node: Arc<Node>,
    /// The inode it was opened on, held for the handle's life (libcephfs's `Fh` holds it
    /// anyway): a READ asks its size without going through the node, whose reference
    /// `--held-inodes` may have released.
    pub(super) inode: Arc<Inode>,
    /// A backward scan through this handle ([`CephFs::read_behind`]): where the last READ
    /// began (`u64::MAX`: none yet), how many READs in a row ended just below the one before,
    /// and the lowest offset already read ahead below them.
    pub(super) last_read: AtomicU64,
    pub(super) descents: AtomicU64,
    pub(super) behind_low: AtomicU64,
}

impl OpenFile {
    /// A handle `opener` opened with `oflags` (as libcephfs got them) on `node`, whose inode is
    /// `inode`.
    pub(super) fn new(
        file: File,
        writer: Option<File>,
        oflags: i32,
        node: &Arc<Node>,
        inode: Arc<Inode>,
        opener: crate::migration::Opener,
    ) -> Arc<Self> {
        Arc::new(OpenFile {
            file: Arc::new(file),
            ino: node.vino.ino,
            direct: oflags & libc::O_DIRECT != 0,
            writer,
            noted: AtomicBool::new(false),
            writable: oflags & libc::O_ACCMODE != libc::O_RDONLY,
            locked: AtomicBool::new(false),
            flocked: AtomicBool::new(false),
            oflags,
            opener,
            node: node.clone(),
            inode,
            last_read: AtomicU64::new(u64::MAX),
            descents: AtomicU64::new(0),
            behind_low: AtomicU64::new(u64::MAX),
        })
    }
}

impl CephFs {
    /// Enter an open handle; ENFILE at `--max-handles`.
    pub(super) fn new_handle(&self, node: u64, h: Handle, op: &'static str) -> io::Result<u64> {
        self.handles.insert(node, h).map_err(|e| {
            self.limits
                .refused(Table::Handles, self.cfg.max_handles, op);
            errno(e)
        })
    }

    /// ENFILE, counted, when the handle table is full: checked before work that cannot be
    /// undone (creating a file) so that a full table refuses the request cleanly.
    pub(super) fn handle_room(&self, op: &'static str) -> io::Result<()> {
        if self.handles.has_room() {
            return Ok(());
        }
        self.limits
            .refused(Table::Handles, self.cfg.max_handles, op);
        Err(errno(libc::ENFILE))
    }

    pub(super) fn file(
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
            drop(
                self.mount()
                    .open(&*self.inode(node)?, libc::O_WRONLY, perm)?,
            );
        }
        self.kill_privs(node, Trigger::Truncate, flagged, perm)?;
        if truncate {
            self.mount().truncate_to_zero(&*self.inode(node)?, perm)?;
        }
        Ok(())
    }

    /// How the guest caches an open file. A guest O_DIRECT open is no reason for
    /// FOPEN_DIRECT_IO: the guest kernel then sends the descriptor's I/O straight to us but
    /// (Linux 6.1) leaves what its page cache holds of the range from other descriptors in
    /// place, so with KEEP_CACHE a buffered reader saw the old bytes. Without it, O_DIRECT I/O
    /// takes the kernel's direct I/O path, which writes back and invalidates the page cache of
    /// its range, as on a local filesystem, and still reaches us uncached.
    pub(super) fn open_options(&self, node: &Node) -> OpenOptions {
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

    pub(super) fn do_open(
        &self,
        ctx: &Caller,
        inode: u64,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
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
        let ino_ref = self.inode(&node)?;
        let file = self
            .mount()
            .open(&ino_ref, oflags & !libc::O_TRUNC, &perm)?;
        let writer = self.direct_writer(&ino_ref, oflags)?;
        if oflags & libc::O_TRUNC != 0 {
            let flagged = fuse_flags & FOPEN_IN_KILL_SUIDGID != 0;
            self.open_truncate(&node, oflags, flagged, true, &perm)?;
        }
        let fh = self.new_handle(
            inode,
            Handle::File(OpenFile::new(
                file,
                writer,
                oflags,
                &node,
                ino_ref,
                state::opener_of(ctx),
            )),
            "open",
        )?;
        Ok((Some(fh), self.open_options(&node), None))
    }

    pub(super) fn do_create(
        &self,
        ctx: &Caller,
        parent: u64,
        name: &CStr,
        args: CreateIn,
    ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
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
        let (inode, mut st, file) = self.mount().create(
            &*self.inode(&parent)?,
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
            let ino_ref = self.inode(&node)?;
            let writer = self.direct_writer(&ino_ref, oflags)?;
            // CREATE can open an existing file (no O_EXCL): O_TRUNC then has the SB_NOSEC duty.
            // A file with data existed before; an empty one may be new (its setuid/setgid bits
            // are the creator's choice), so only its file capabilities go. Either way the
            // first WRITE takes the bits away.
            if oflags & libc::O_TRUNC != 0 && oflags & libc::O_EXCL == 0 {
                let existing = st.stx_size != 0;
                let flagged = args.fuse_flags & FOPEN_IN_KILL_SUIDGID != 0 && existing;
                self.open_truncate(&node, oflags, flagged, existing, &perm)?;
                if existing {
                    st = self.mount().getattr(&ino_ref, WANT, 0, &perm)?;
                }
            }
            self.new_handle(
                node.id,
                Handle::File(OpenFile::new(
                    file,
                    writer,
                    oflags,
                    &node,
                    ino_ref,
                    state::opener_of(ctx),
                )),
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

    pub(super) fn do_release(
        &self,
        inode: u64,
        handle: u64,
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
}
