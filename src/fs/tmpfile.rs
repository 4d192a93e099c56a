//! O_TMPFILE (FUSE_TMPFILE): an open regular file with no name, that the guest may give one
//! later with `linkat(fd, "", dir, name, AT_EMPTY_PATH)` (a LINK of its node), and that is gone
//! when the guest closes it without.
//!
//! CephFS has no such file: libcephfs has no O_TMPFILE, and a file whose last name was removed
//! cannot be linked again (`ceph_ll_link` of an unlinked, still open inode answers ENOENT on
//! Pacific: the MDS keeps it as a stray). So the daemon gives the file a name of its own while
//! it is open: it creates it, as the caller and with the mode asked (the kernel applied the
//! umask, as for CREATE), under a private name ([`names::PRIVATE_NAME_PREFIX`], a random
//! token and a counter) in the very directory the guest asked for. That keeps the file where
//! a named one would be: in the directory's quota, layout, subvolume and snapshot realm (a
//! link out of a realm would be EXDEV), in its quarantine domain, with its setgid group, and
//! with the directory's permission checked by the MDS as for any create.
//!
//! The guest never sees that name: LOOKUP answers ENOENT, READDIR skips it, and every request
//! that would make, remove or rename an entry of that name is EPERM ([`names::check_changed`]).
//! The file's link count is shown one lower while the private name holds, so `fstat` shows 0
//! as Linux does, and the guest kernel itself refuses to link an O_TMPFILE opened with
//! O_EXCL (ENOENT, `vfs_link`); a LINK the guest sends anyway for such a node is ENOENT here
//! too. A LINK of a linkable one links the new name and then removes the private one
//! (a link is refused with EEXIST by the MDS when the name exists, atomically, which a rename
//! could not be). The node forgotten without a link (the guest closed the file), the private
//! name is removed, and CephFS purges the file.
//!
//! Other CephFS clients see the private name while the file is open, and an `rmdir` of the
//! directory is ENOTEMPTY meanwhile (Linux would let it go). A daemon that ends without its
//! session ending (killed, or the host gone) leaves the names behind: they are files of the
//! caller, found with `find -name '.ceph-virtiofsd-tmpfile.*'`, and may be removed by any
//! client once no daemon serves a guest that has them open.

use std::collections::HashMap;
use std::ffi::CString;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use fuse_backend_rs::abi::fuse_abi::{CreateIn, OpenOptions};
use fuse_backend_rs::api::filesystem::Entry;

use super::open::OpenFile;
use super::perms::Caller;
use super::{errno, names, open_flags, state, CephFs, Handle, Node, WANT};

/// An open O_TMPFILE's private name.
#[derive(Debug)]
struct Private {
    parent: Arc<Node>,
    name: CString,
    /// Opened without O_EXCL: a LINK may give it a name.
    linkable: bool,
}

/// The open O_TMPFILE files, by node id.
#[derive(Debug)]
pub(super) struct TmpFiles {
    /// How many: the hot paths (GETATTR, FORGET) look at nothing else while it is 0.
    live: AtomicUsize,
    files: Mutex<HashMap<u64, Private>>,
    /// This daemon's token in the private names, and the counter after it.
    token: u64,
    next: AtomicU64,
}

impl Default for TmpFiles {
    fn default() -> Self {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        TmpFiles {
            live: AtomicUsize::new(0),
            files: Mutex::new(HashMap::new()),
            token: h.finish(),
            next: AtomicU64::new(0),
        }
    }
}

impl TmpFiles {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Private>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, id: u64, p: Private) {
        if self.lock().insert(id, p).is_none() {
            self.live.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn take(&self, id: u64) -> Option<Private> {
        if self.live.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let p = self.lock().remove(&id);
        if p.is_some() {
            self.live.fetch_sub(1, Ordering::Relaxed);
        }
        p
    }

    fn take_all(&self) -> Vec<Private> {
        let all: Vec<Private> = self.lock().drain().map(|(_, p)| p).collect();
        self.live.fetch_sub(all.len(), Ordering::Relaxed);
        all
    }

    fn holds(&self, id: u64) -> bool {
        self.live.load(Ordering::Relaxed) != 0 && self.lock().contains_key(&id)
    }

    fn new_name(&self) -> CString {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut name = names::PRIVATE_NAME_PREFIX.to_vec();
        name.extend_from_slice(format!("{:016x}.{n}", self.token).as_bytes());
        // The prefix and the digits hold no NUL.
        CString::new(name).unwrap_or_default()
    }
}

impl CephFs {
    /// FUSE_TMPFILE in directory `parent`: CREATE's entry and open handle for a new file that
    /// has no name the guest can see (see the module doc).
    pub(super) fn do_tmpfile(
        &self,
        ctx: &Caller,
        parent: u64,
        args: CreateIn,
    ) -> io::Result<(Entry, u64, OpenOptions)> {
        let parent = self.dir_op(parent, "tmpfile", ctx)?;
        self.snapdir_change(&parent)?;
        let keep = libc::O_ACCMODE
            | libc::O_EXCL
            | libc::O_APPEND
            | libc::O_SYNC
            | libc::O_DSYNC
            | libc::O_DIRECT;
        let oflags = open_flags(args.flags, keep)?;
        // open(2): O_TMPFILE without write access is EINVAL.
        if oflags & libc::O_ACCMODE == libc::O_RDONLY {
            return Err(errno(libc::EINVAL));
        }
        let linkable = oflags & libc::O_EXCL == 0;
        self.handle_room("tmpfile")?;
        self.node_room("tmpfile")?;
        let perm = self.perm(ctx);
        let dir = self.inode(&parent)?;
        let mut made = None;
        // A name another file holds already (a token and counter met again): the next one.
        for _ in 0..4 {
            let name = self.tmpfiles.new_name();
            match self.mount().create(
                &dir,
                &name,
                (args.mode & 0o7777) | libc::S_IFREG,
                (oflags & !libc::O_EXCL) | libc::O_CREAT | libc::O_EXCL,
                WANT,
                0,
                &perm,
            ) {
                Ok(r) => {
                    made = Some((name, r));
                    break;
                }
                Err(e) if e.errno() == libc::EEXIST => {}
                Err(e) => return Err(e.into()),
            }
        }
        let (name, (inode, st, file)) = made.ok_or_else(|| errno(libc::EEXIST))?;
        let forget_name = |e: io::Error| {
            self.remove_private(&parent, &name);
            e
        };
        let entry = self
            .child_entry(&parent, name.to_bytes(), inode, &st, "tmpfile", None)
            .map_err(forget_name)?;
        let node = self.node(entry.inode).map_err(forget_name)?;
        self.tmpfiles.insert(
            node.id,
            Private {
                parent: parent.clone(),
                name: name.clone(),
                linkable,
            },
        );
        let opened = (|| {
            let ino_ref = self.inode(&node)?;
            let writer = self.direct_writer(&ino_ref, oflags)?;
            self.new_handle(
                node.id,
                Handle::File(OpenFile::new(
                    file,
                    writer,
                    oflags & !libc::O_EXCL,
                    &node,
                    ino_ref,
                    state::opener_of(ctx),
                )),
                "tmpfile",
            )
        })();
        let fh = match opened {
            Ok(fh) => fh,
            Err(e) => {
                // The guest gets no entry: its lookup is given back, and the name with it.
                self.nodes.forget(node.id, 1);
                self.tmpfile_forgotten(node.id);
                return Err(e);
            }
        };
        // entry_for shows the link count without the private name.
        let entry = self.entry_for(&node, &st);
        Ok((entry, fh, self.open_options(&node)))
    }

    /// A LINK of node `id`: `link` links the node's inode at the new name; for an O_TMPFILE
    /// its private name is removed afterwards. An O_TMPFILE opened with O_EXCL is never
    /// linked (ENOENT, as Linux answers).
    pub(super) fn link_node(
        &self,
        id: u64,
        link: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let Some(p) = self.tmpfiles.take(id) else {
            return link();
        };
        if !p.linkable {
            self.tmpfiles.insert(id, p);
            return Err(errno(libc::ENOENT));
        }
        if let Err(e) = link() {
            self.tmpfiles.insert(id, p);
            return Err(e);
        }
        self.remove_private(&p.parent, &p.name);
        Ok(())
    }

    /// After a FORGET of node `id`: an O_TMPFILE that left the table (the guest closed it)
    /// loses its private name. One atomic load while no O_TMPFILE is open.
    pub(super) fn tmpfile_forgotten(&self, id: u64) {
        if self.tmpfiles.live.load(Ordering::Relaxed) == 0 || self.nodes.get(id).is_some() {
            return;
        }
        if let Some(p) = self.tmpfiles.take(id) {
            self.remove_private(&p.parent, &p.name);
        }
    }

    /// The session ended (DESTROY, a new INIT, the frontend gone, shutdown): every O_TMPFILE's
    /// private name goes.
    pub(super) fn tmpfiles_end(&self) {
        for p in self.tmpfiles.take_all() {
            self.remove_private(&p.parent, &p.name);
        }
    }

    /// The link count the guest sees of node `id`: one less while its private name holds.
    #[inline]
    pub(super) fn tmpfile_nlink<N>(&self, id: u64, nlink: &mut N)
    where
        N: Copy + From<u8> + PartialOrd + std::ops::Sub<Output = N>,
    {
        if self.tmpfiles.holds(id) && *nlink >= N::from(1) {
            *nlink = *nlink - N::from(1);
        }
    }

    /// Remove a private name, as root (the directory's mode may have changed since). A
    /// failure is logged: the name stays (see the module doc).
    fn remove_private(&self, parent: &Node, name: &CString) {
        let root = self.perms.root();
        let r = self
            .inode(parent)
            .and_then(|dir| Ok(self.mount().unlink(&dir, name, &root)?));
        if let Err(e) = r {
            tracing::warn!(
                %e,
                dir = parent.vino.ino,
                name = %name.to_string_lossy(),
                "Cannot remove the private name of an O_TMPFILE; remove it by hand once no \
                 guest has the file open"
            );
        }
    }
}
