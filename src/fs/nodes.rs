//! The inode table: FUSE node ids → CephFS inode references with lookup counts.
//!
//! Node ids are ours. A head inode (snapid == CEPH_NOSNAP) gets its CephFS inode number as node
//! id, so the hot path needs one map and no reverse index; the export root is always
//! `FUSE_ROOT_ID` (1). Ids that would be ambiguous — snapshot inodes (same ino as their head,
//! other snapid), the filesystem's own root when a subtree is exported, inode numbers with the top
//! bit set — are allocated from a counter in the top-bit range and found again through a small
//! reverse index. CephFS inode numbers never use the top bit, so the two ranges cannot meet.
//!
//! The table is sharded: a lookup or forget takes one shard lock, for the time of a map update,
//! and never while calling into libcephfs. There is no table-wide lock (libcephfs already has its
//! `client_lock`; a second global serialisation point would cap the scaling the kernel client had
//! to fight for).
//!
//! Kernel contract: every `Entry` we return adds one lookup; FORGET takes `count` away; at zero
//! the node leaves the table and its libcephfs reference is released (when the last `Arc` goes,
//! e.g. after an open handle on it is released).
//!
//! A node's libcephfs reference is not held for as long as the guest holds the node: a guest
//! with a warm dentry cache holds every inode it ever walked, and libcephfs cannot trim an inode
//! it has a reference on (about 1.9 KiB each with its dentry and caps). The table keeps at most
//! a set number of references ([`NodeTable::trim`], second chance over a used bit); a node
//! whose reference was released keeps its vino and finds its inode again on its next use
//! ([`Node::inode_or_else`]: libcephfs's cache, or one MDS round trip; a `.snap` directory or a
//! snapshot inode, which cannot be found by number alone, by its names again from the nearest
//! ancestor at hand). Only the export root always keeps its reference. A node that leaves the
//! table gives its reference up at once and keeps none it finds again afterwards (a request
//! using it, or a child's link walked up, holds its own for the time it needs it), so the
//! references held are the table's, which a trim can always release.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::hash::{BuildHasher, BuildHasherDefault};

use super::shards::{IdHasher, IdMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::shards::Shards;

/// FUSE's root node id.
pub const ROOT_ID: u64 = 1;

/// Node ids allocated by the table carry this bit.
const ALLOCATED_BIT: u64 = 1 << 63;

const SHARDS: usize = 64;

fn pack((domain, generation): (u32, u32)) -> u64 {
    u64::from(generation) << 32 | u64::from(domain)
}

/// CephFS "no snapshot": the live (head) version of an inode.
pub const NOSNAP: u64 = u64::MAX - 1; // CEPH_NOSNAP = (uint64_t)(-2)

/// Version of an inode: inode number + snapshot id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Vino {
    pub ino: u64,
    pub snapid: u64,
}

/// One node: what the guest's node id stands for.
#[derive(Debug)]
pub struct Node<T> {
    pub id: u64,
    pub vino: Vino,
    /// File type bits (`S_IFMT` part of the mode); never changes for an inode.
    pub kind: u32,
    /// Quarantine domain as last derived, packed with the gate generation it was derived at
    /// (`generation << 32 | domain`): see [`Node::domain_at`].
    domain: AtomicU64,
    /// The node this one was last found in (looked up, listed, created, linked or renamed
    /// to by the guest) and the name it was found by; None for the export root (and a
    /// directory found by ".." whose own link could not be confirmed). It is what ".."
    /// resolves to (libcephfs's own ".." cannot be trusted: ".." of the export root's `.snap`
    /// is the export's parent, and a directory another client renamed keeps its old parent
    /// there), and the chain quarantine domains are derived along, each link confirmed by a
    /// lookup of its name. A file with hard links also keeps the other names it was found by
    /// lately (see [`Names`]), so that unlinking one of them leaves it a name that holds.
    /// Holding the parent keeps the parent node (which, once the guest forgot it, keeps no
    /// libcephfs reference: see the module doc). Cold paths only.
    link: Mutex<Names<T>>,
    /// The libcephfs reference, when held (see the module doc). Locked only to clone, fill or
    /// take the `Arc`, never across a call into libcephfs.
    inode: Mutex<Option<Arc<T>>>,
    /// Used since the last trim sweep passed it (second chance).
    used: AtomicBool,
    /// Never releases its reference: the export root.
    pinned: bool,
    /// In the table (cleared when it leaves it): only then is a reference found kept.
    in_table: AtomicBool,
    /// The table's count of held references (shared: a node can outlive its table entry).
    held: Arc<AtomicUsize>,
    lookups: AtomicU64,
}

/// Where a node was found: its parent node and its name there.
#[derive(Debug)]
pub struct Link<T> {
    pub parent: Arc<Node<T>>,
    pub name: CString,
}

impl<T> Clone for Link<T> {
    fn clone(&self) -> Self {
        Link {
            parent: self.parent.clone(),
            name: self.name.clone(),
        }
    }
}

impl<T> Link<T> {
    /// Whether this is `name` in the node `parent`.
    fn is(&self, parent: u64, name: &CStr) -> bool {
        self.parent.id == parent && *self.name == *name
    }
}

/// The most names a node keeps (the newest): a file with more hard links than that, all
/// looked up, keeps the names it was found by last.
const MAX_NAMES: usize = 4;

/// The names a node was found by, newest first. Almost every node has one name: the others
/// live out of line, allocated only for a file found by several.
#[derive(Debug)]
struct Names<T> {
    first: Option<Link<T>>,
    more: Option<Box<[Link<T>]>>,
}

impl<T> Names<T> {
    fn one(link: Option<Link<T>>) -> Self {
        Names {
            first: link,
            more: None,
        }
    }

    /// Every name, newest first.
    fn all(&self) -> Vec<Link<T>> {
        self.first
            .iter()
            .chain(self.more.iter().flat_map(|m| m.iter()))
            .cloned()
            .collect()
    }

    /// Take every name out (the node is being dropped, or its names replaced).
    fn take(&mut self) -> Vec<Link<T>> {
        let mut out: Vec<Link<T>> = self.first.take().into_iter().collect();
        out.extend(self.more.take().map(Vec::from).unwrap_or_default());
        out
    }

    /// `link` becomes the newest name; an older entry of the same name goes, and the oldest
    /// beyond [`MAX_NAMES`]. What was removed is returned, to be dropped outside the lock.
    fn found_at(&mut self, link: Link<T>) -> Vec<Link<T>> {
        // Found again by the name it was found by last: every LOOKUP and READDIRPLUS entry of
        // a node the guest holds. Nothing changes and nothing is allocated. (`link`'s parent
        // is the first name's too, so dropping it here releases no node.)
        if self
            .first
            .as_ref()
            .is_some_and(|f| f.is(link.parent.id, &link.name))
        {
            return Vec::new();
        }
        let mut all = self.take();
        let (dup, mut kept): (Vec<_>, Vec<_>) = all
            .drain(..)
            .partition(|l| l.is(link.parent.id, &link.name));
        kept.insert(0, link);
        let mut gone = dup;
        gone.extend(kept.drain(MAX_NAMES.min(kept.len())..));
        let mut it = kept.into_iter();
        self.first = it.next();
        let rest: Vec<_> = it.collect();
        self.more = (!rest.is_empty()).then(|| rest.into_boxed_slice());
        gone
    }

    /// `name` in `parent` is gone (renamed away): its entry goes; what was removed is returned.
    fn lost(&mut self, parent: u64, name: &CStr) -> Vec<Link<T>> {
        let (gone, kept): (Vec<_>, Vec<_>) =
            self.take().into_iter().partition(|l| l.is(parent, name));
        let mut it = kept.into_iter();
        self.first = it.next();
        let rest: Vec<_> = it.collect();
        self.more = (!rest.is_empty()).then(|| rest.into_boxed_slice());
        gone
    }
}

impl<T> Drop for Node<T> {
    /// Parent chains are as deep as the paths: release them iteratively, not by recursion.
    fn drop(&mut self) {
        if self
            .inode
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        let take = |m: &mut Mutex<Names<T>>| {
            m.get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .into_iter()
                .map(|l| l.parent)
        };
        let mut next: Vec<Arc<Node<T>>> = take(&mut self.link).collect();
        while let Some(p) = next.pop() {
            if let Ok(mut n) = Arc::try_unwrap(p) {
                next.extend(take(&mut n.link));
            }
        }
    }
}

impl<T> Node<T> {
    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }
    /// The quarantine domain last derived and the (low 32 bits of the) gate generation it was
    /// derived at. One atomic, so a domain is never read with another derivation's generation.
    pub fn domain_at(&self) -> (u32, u32) {
        let v = self.domain.load(Ordering::Acquire);
        // Each half is masked or shifted to 32 bits: the conversions cannot fail.
        let domain = u32::try_from(v & u64::from(u32::MAX)).unwrap_or(0);
        let generation = u32::try_from(v >> 32).unwrap_or(0);
        (domain, generation)
    }
    /// Where the node was last found (see the field).
    pub fn link(&self) -> Option<Link<T>> {
        self.link
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .first
            .clone()
    }

    /// Every name the node keeps (see the field), newest first.
    pub fn links(&self) -> Vec<Link<T>> {
        self.link.lock().unwrap_or_else(|e| e.into_inner()).all()
    }

    /// The guest renamed `from_name` in node `from` to `to`: that is the node's newest name
    /// now, and the old one is gone (its other names stay).
    pub fn renamed(&self, from: u64, from_name: &CStr, to: Link<T>) {
        let gone = {
            let mut names = self.link.lock().unwrap_or_else(|e| e.into_inner());
            let mut gone = names.lost(from, from_name);
            gone.extend(names.found_at(to));
            gone
        };
        // Parents released after the lock.
        drop(gone);
    }

    /// The libcephfs reference, if the node holds it now (marks the node used).
    pub fn inode(&self) -> Option<Arc<T>> {
        self.touch();
        self.inode.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The libcephfs reference: the one held, or one found again by `resolve` (called with
    /// the node's vino, outside every lock) and kept. Marks the node used.
    pub fn inode_or_else<E>(
        &self,
        resolve: impl FnOnce(Vino) -> Result<T, E>,
    ) -> Result<Arc<T>, E> {
        if let Some(i) = self.inode() {
            return Ok(i);
        }
        let found = Arc::new(resolve(self.vino)?);
        Ok(self.fill(found))
    }

    /// Keep `inode` as the node's reference unless it holds one already; the one kept. A
    /// reference not kept is released by the caller, outside the lock. A node out of the
    /// table keeps none: `inode` is only handed back.
    fn fill(&self, inode: Arc<T>) -> Arc<T> {
        let mut slot = self.inode.lock().unwrap_or_else(|e| e.into_inner());
        match &*slot {
            Some(held) => held.clone(),
            None if !self.in_table.load(Ordering::Acquire) => inode,
            None => {
                self.held.fetch_add(1, Ordering::Relaxed);
                *slot = Some(inode.clone());
                inode
            }
        }
    }

    /// Whether the node holds its libcephfs reference now.
    pub fn holds_inode(&self) -> bool {
        self.inode
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Release the libcephfs reference (not for a pinned node); whether one was released.
    /// A request using the inode keeps its own `Arc` until it is done.
    pub fn release(&self) -> bool {
        if self.pinned {
            return false;
        }
        let old = self.inode.lock().unwrap_or_else(|e| e.into_inner()).take();
        if old.is_some() {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        // `old` drops here, after the lock: the last reference goes back to libcephfs.
        old.is_some()
    }

    /// Whether the node was used since the last sweep (the bit is cleared for the next).
    fn second_chance(&self) -> bool {
        self.used.load(Ordering::Relaxed) && {
            self.used.store(false, Ordering::Relaxed);
            true
        }
    }

    fn touch(&self) {
        // A load first: a node used by every request (a shared directory) is not written to.
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
    }

    /// Record a derived domain (see [`Node::domain_at`]).
    pub fn set_domain(&self, domain: u32, generation: u32) {
        self.domain
            .store(pack((domain, generation)), Ordering::Release);
    }

    /// Set where the node was found (migration: links are restored once every node is).
    pub fn set_link(&self, link: Option<Link<T>>) {
        let old = std::mem::replace(
            &mut *self.link.lock().unwrap_or_else(|e| e.into_inner()),
            Names::one(link),
        );
        drop(old);
    }
}

/// What a lookup produced, to be entered in the table.
#[derive(Debug)]
pub struct NewNode<T> {
    pub vino: Vino,
    pub kind: u32,
    /// Domain and the gate generation it was derived at (see [`Node::domain_at`]).
    pub domain: (u32, u32),
    /// Where it was found (see [`Node::link`]).
    pub link: Option<Link<T>>,
    pub inode: T,
}

impl<T> NewNode<T> {
    /// The node with id `id` and `lookups` lookups, counted in `held`.
    fn into_node(self, id: u64, lookups: u64, held: &Arc<AtomicUsize>) -> Arc<Node<T>> {
        held.fetch_add(1, Ordering::Relaxed);
        Arc::new(Node {
            id,
            vino: self.vino,
            kind: self.kind,
            domain: AtomicU64::new(pack(self.domain)),
            link: Mutex::new(Names::one(self.link)),
            inode: Mutex::new(Some(Arc::new(self.inode))),
            used: AtomicBool::new(true),
            pinned: id == ROOT_ID,
            in_table: AtomicBool::new(true),
            held: held.clone(),
            lookups: AtomicU64::new(lookups),
        })
    }
}

#[derive(Debug)]
pub struct NodeTable<T> {
    shards: Shards<RwLock<IdMap<Arc<Node<T>>>>, SHARDS>,
    root: Vino,
    /// Reverse index for allocated ids. Lock order: `allocated` before a shard.
    allocated: Mutex<HashMap<Vino, u64>>,
    next_id: AtomicU64,
    /// Nodes in the table, the root included (kept next to the shards so that the limit check
    /// takes no shard lock but the one being written).
    count: AtomicUsize,
    /// Most nodes the table holds (root included); an insert of a new node beyond it fails
    /// with ENFILE. `usize::MAX`: no limit.
    max: AtomicUsize,
    /// Nodes (in the table or still used by a request) holding their libcephfs reference.
    held: Arc<AtomicUsize>,
    /// Where the next trim sweep starts (a shard index).
    sweep: AtomicUsize,
}

impl<T> NodeTable<T> {
    /// A table holding the export root as node 1.
    pub fn new(root: NewNode<T>) -> Self {
        let t = NodeTable {
            shards: Shards::new(|| RwLock::new(IdMap::default())),
            root: root.vino,
            allocated: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(ALLOCATED_BIT | 2),
            count: AtomicUsize::new(1),
            max: AtomicUsize::new(usize::MAX),
            held: Arc::new(AtomicUsize::new(0)),
            sweep: AtomicUsize::new(0),
        };
        // The root is never forgotten (the kernel never sends FORGET for it), and has no link.
        let node = NewNode { link: None, ..root }.into_node(ROOT_ID, 1, &t.held);
        t.shard(ROOT_ID)
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ROOT_ID, node);
        t
    }

    fn shard(&self, id: u64) -> &RwLock<IdMap<Arc<Node<T>>>> {
        let h = BuildHasherDefault::<IdHasher>::default().hash_one(id);
        self.shards.get(h)
    }

    pub fn root_vino(&self) -> Vino {
        self.root
    }

    /// The node id a head inode would get without allocation, if any.
    fn direct_id(&self, vino: Vino) -> Option<u64> {
        if vino == self.root {
            Some(ROOT_ID)
        } else if vino.snapid == NOSNAP && vino.ino != ROOT_ID && vino.ino & ALLOCATED_BIT == 0 {
            Some(vino.ino)
        } else {
            None
        }
    }

    /// Find a node by id (the hot path: one shard read lock).
    pub fn get(&self, id: u64) -> Option<Arc<Node<T>>> {
        self.shard(id)
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    /// Limit the table to `max` nodes, the root included (at least the root: 1).
    pub fn set_limit(&self, max: usize) {
        self.max.store(max.max(1), Ordering::Relaxed);
    }

    /// Whether one more node fits under the limit now (a hint: concurrent inserts may take
    /// the room; [`Self::insert`] is what enforces the limit).
    pub fn has_room(&self) -> bool {
        self.count.load(Ordering::Relaxed) < self.max.load(Ordering::Relaxed)
    }

    /// Enter a looked-up inode, or add one lookup to the node that already stands for it.
    /// A duplicate reference (`new.inode`) is dropped, which releases it. A new node beyond
    /// the limit is refused with ENFILE (`new.inode` is released); a node already in the
    /// table takes its lookup whatever the limit.
    pub fn insert(&self, new: NewNode<T>) -> Result<Arc<Node<T>>, i32> {
        match self.direct_id(new.vino) {
            Some(id) => self.insert_at(id, new),
            None => {
                let mut rev = self.allocated.lock().unwrap_or_else(|e| e.into_inner());
                let vino = new.vino;
                let mut fresh = false;
                let id = *rev.entry(vino).or_insert_with(|| {
                    fresh = true;
                    self.next_id.fetch_add(1, Ordering::Relaxed)
                });
                let r = self.insert_at(id, new);
                if r.is_err() && fresh {
                    rev.remove(&vino);
                }
                r
            }
        }
    }

    fn insert_at(&self, id: u64, new: NewNode<T>) -> Result<Arc<Node<T>>, i32> {
        let mut shard = self.shard(id).write().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = shard.get(&id) {
            n.lookups.fetch_add(1, Ordering::Relaxed);
            let n = n.clone();
            // A node that had released its reference takes the one just found; otherwise the
            // duplicate is released (after the shard lock).
            let dup = if n.holds_inode() {
                Some(new.inode)
            } else {
                n.fill(Arc::new(new.inode));
                None
            };
            n.touch();
            // A head inode found again is where it was found last (renamed since, or another
            // link of a file); a snapshot does not change. Names let go are released after
            // the shard lock.
            let old = match new.link {
                Some(l) if new.vino.snapid == NOSNAP => {
                    // Its domain is the one derived for this place just now.
                    n.domain.store(pack(new.domain), Ordering::Release);
                    n.link.lock().unwrap_or_else(|e| e.into_inner()).found_at(l)
                }
                _ => Vec::new(),
            };
            drop(shard);
            drop(old);
            drop(dup);
            return Ok(n);
        }
        let max = self.max.load(Ordering::Relaxed);
        if self.count.fetch_add(1, Ordering::Relaxed) >= max {
            self.count.fetch_sub(1, Ordering::Relaxed);
            return Err(libc::ENFILE);
        }
        let node = new.into_node(id, 1, &self.held);
        shard.insert(id, node.clone());
        Ok(node)
    }

    /// Take `count` lookups away; at zero the node leaves the table. Unknown ids and the root
    /// are ignored (FORGET has no reply, so there is nobody to tell).
    pub fn forget(&self, id: u64, count: u64) {
        if id == ROOT_ID {
            return;
        }
        let rev = (id & ALLOCATED_BIT != 0)
            .then(|| self.allocated.lock().unwrap_or_else(|e| e.into_inner()));
        let removed = {
            let mut shard = self.shard(id).write().unwrap_or_else(|e| e.into_inner());
            let Some(n) = shard.get(&id) else { return };
            let left = n.lookups.load(Ordering::Relaxed).saturating_sub(count);
            n.lookups.store(left, Ordering::Relaxed);
            if left == 0 {
                self.count.fetch_sub(1, Ordering::Relaxed);
                shard
                    .remove(&id)
                    .inspect(|n| n.in_table.store(false, Ordering::Release))
            } else {
                None
            }
        };
        if let (Some(node), Some(mut rev)) = (&removed, rev) {
            rev.remove(&node.vino);
        }
        // Outside every lock (releasing the libcephfs reference may take libcephfs's
        // client_lock): a node still linked to by a child, or used by a request, gives its
        // reference up now.
        if let Some(node) = removed {
            node.release();
        }
    }

    /// Every node but the root (migration: the device is stopped, nothing changes the table).
    pub fn snapshot(&self) -> Vec<Arc<Node<T>>> {
        let mut out = Vec::with_capacity(self.count.load(Ordering::Relaxed));
        for s in &self.shards {
            let s = s.read().unwrap_or_else(|e| e.into_inner());
            out.extend(
                s.iter()
                    .filter(|(&id, _)| id != ROOT_ID)
                    .map(|(_, n)| n.clone()),
            );
        }
        out
    }

    /// Enter a node under the id and with the lookups a previous daemon gave the guest
    /// (migration). The node limit is not applied: the guest holds these already. EEXIST for
    /// an id in use (the root, or a duplicate), EINVAL for an id this table would give another
    /// inode (a head inode's id is its inode number).
    pub fn restore(&self, id: u64, new: NewNode<T>, lookups: u64) -> Result<Arc<Node<T>>, i32> {
        match self.direct_id(new.vino) {
            Some(direct) if direct != id => return Err(libc::EINVAL),
            Some(_) => {}
            None if id & ALLOCATED_BIT == 0 => return Err(libc::EINVAL),
            None => {
                let mut rev = self.allocated.lock().unwrap_or_else(|e| e.into_inner());
                if rev.contains_key(&new.vino) {
                    return Err(libc::EEXIST);
                }
                rev.insert(new.vino, id);
                // Ids allocated from now on come after every restored one.
                self.next_id
                    .fetch_max(id.saturating_add(1), Ordering::Relaxed);
            }
        }
        let mut shard = self.shard(id).write().unwrap_or_else(|e| e.into_inner());
        if shard.contains_key(&id) {
            return Err(libc::EEXIST);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let node = new.into_node(id, lookups.max(1), &self.held);
        shard.insert(id, node.clone());
        Ok(node)
    }

    /// Give the export root (node 1) another inode of the same file (a new CephFS session
    /// after an eviction: the old session's inode is unusable). Its domain stays.
    pub fn replace_root(&self, inode: T) {
        let mut shard = self
            .shard(ROOT_ID)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let Some(old) = shard.get(&ROOT_ID).cloned() else {
            return;
        };
        let node = NewNode {
            vino: old.vino,
            kind: old.kind,
            domain: old.domain_at(),
            link: None,
            inode,
        }
        .into_node(ROOT_ID, 1, &self.held);
        shard.insert(ROOT_ID, node);
        drop(shard);
        // The old root's inode is released here, outside the lock.
        drop(old);
    }

    /// Nodes holding their libcephfs reference now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Release the libcephfs references of nodes not used lately until at most `keep` are
    /// held; the number released. Second chance: a sweep clears the used bit of each node it
    /// passes and releases the reference of a node whose bit was already clear, so a node
    /// keeps its reference while it is used at least once per sweep. Shards are swept in
    /// turn, from where the last trim stopped, at most twice round (the second time every bit
    /// the first cleared is seen); each shard's read lock is held only to pick, and the
    /// references are released after it.
    pub fn trim(&self, keep: usize) -> usize {
        let mut released = 0;
        for _ in 0..2 * SHARDS {
            let over = self.held().saturating_sub(keep);
            if over == 0 {
                break;
            }
            let i = self.sweep.fetch_add(1, Ordering::Relaxed) % SHARDS;
            let victims: Vec<Arc<Node<T>>> = {
                let shard = self
                    .shards
                    .get(u64::try_from(i).unwrap_or(0))
                    .read()
                    .unwrap_or_else(|e| e.into_inner());
                shard
                    .values()
                    .filter(|n| !n.pinned && !n.second_chance() && n.holds_inode())
                    .take(over)
                    .cloned()
                    .collect()
            };
            released += victims.iter().filter(|n| n.release()).count();
        }
        released
    }

    /// Release the reference of the node of `vino`, if any (the MDS recalled the inode);
    /// whether one was released.
    pub fn release_vino(&self, vino: Vino) -> bool {
        self.find(vino).is_some_and(|n| n.release())
    }

    /// The node standing for `vino`, if the table has one.
    pub fn find(&self, vino: Vino) -> Option<Arc<Node<T>>> {
        let id = match self.direct_id(vino) {
            Some(id) => id,
            None => *self
                .allocated
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&vino)?,
        };
        self.get(id).filter(|n| n.vino == vino)
    }

    /// Number of nodes in the table.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop every node but the root (DESTROY, or a new FUSE session).
    pub fn clear(&self) {
        let mut dropped = Vec::new();
        {
            let mut rev = self.allocated.lock().unwrap_or_else(|e| e.into_inner());
            for s in &self.shards {
                let mut s = s.write().unwrap_or_else(|e| e.into_inner());
                let ids: Vec<u64> = s.keys().copied().filter(|&id| id != ROOT_ID).collect();
                dropped.extend(ids.iter().filter_map(|id| s.remove(id)));
                for n in &dropped {
                    n.in_table.store(false, Ordering::Release);
                }
            }
            rev.clear();
            self.count.store(1, Ordering::Relaxed);
        }
        // The references are released here, outside every lock.
        for n in dropped {
            n.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(ino: u64) -> Vino {
        Vino {
            ino,
            snapid: NOSNAP,
        }
    }

    /// A payload that counts its drops, standing in for a libcephfs reference.
    #[derive(Debug)]
    struct Ref(Arc<AtomicU64>);
    impl Drop for Ref {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn table(root_ino: u64, drops: &Arc<AtomicU64>) -> NodeTable<Ref> {
        NodeTable::new(NewNode {
            vino: head(root_ino),
            kind: libc::S_IFDIR,
            domain: (0, 0),
            link: None,
            inode: Ref(drops.clone()),
        })
    }

    fn ins(t: &NodeTable<Ref>, n: NewNode<Ref>) -> Arc<Node<Ref>> {
        t.insert(n).unwrap()
    }

    fn new(vino: Vino, drops: &Arc<AtomicU64>) -> NewNode<Ref> {
        NewNode {
            vino,
            kind: libc::S_IFREG,
            domain: (0, 0),
            link: None,
            inode: Ref(drops.clone()),
        }
    }

    #[test]
    fn head_inodes_use_their_ino_and_root_is_one() {
        let d = Arc::new(AtomicU64::new(0));
        let t = table(0x1000, &d);
        assert_eq!(t.get(ROOT_ID).unwrap().vino, head(0x1000));
        let n = ins(&t, new(head(0x2000), &d));
        assert_eq!(n.id, 0x2000);
        // Looking up the export root again yields node 1, never a second id for it.
        let r = ins(&t, new(head(0x1000), &d));
        assert_eq!(r.id, ROOT_ID);
        assert_eq!(d.load(Ordering::Relaxed), 1, "duplicate reference released");
    }

    #[test]
    fn lookup_counts_and_forget_release_exactly_once() {
        let d = Arc::new(AtomicU64::new(0));
        let t = table(1, &d);
        let n = ins(&t, new(head(0x2000), &d));
        ins(&t, new(head(0x2000), &d));
        ins(&t, new(head(0x2000), &d));
        assert_eq!(n.lookups(), 3);
        assert_eq!(d.load(Ordering::Relaxed), 2);
        drop(n);
        t.forget(0x2000, 2);
        assert!(t.get(0x2000).is_some());
        t.forget(0x2000, 1);
        assert!(t.get(0x2000).is_none());
        assert_eq!(d.load(Ordering::Relaxed), 3);
        // Forgetting again, an unknown id or the root does nothing.
        t.forget(0x2000, 1);
        t.forget(0xdead, u64::MAX);
        t.forget(ROOT_ID, u64::MAX);
        assert!(t.get(ROOT_ID).is_some());
        assert_eq!(d.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn snapshots_get_their_own_ids() {
        let d = Arc::new(AtomicU64::new(0));
        let t = table(1, &d);
        let h = ins(&t, new(head(0x2000), &d));
        let s1 = ins(
            &t,
            new(
                Vino {
                    ino: 0x2000,
                    snapid: 5,
                },
                &d,
            ),
        );
        let s2 = ins(
            &t,
            new(
                Vino {
                    ino: 0x2000,
                    snapid: 6,
                },
                &d,
            ),
        );
        assert_ne!(h.id, s1.id);
        assert_ne!(s1.id, s2.id);
        assert!(s1.id & ALLOCATED_BIT != 0);
        // The same snapshot inode maps to the same id while it is known...
        assert_eq!(
            ins(
                &t,
                new(
                    Vino {
                        ino: 0x2000,
                        snapid: 5
                    },
                    &d
                )
            )
            .id,
            s1.id
        );
        t.forget(s1.id, 2);
        assert!(t.get(s1.id).is_none());
        // ...and to a fresh one afterwards.
        let again = ins(
            &t,
            new(
                Vino {
                    ino: 0x2000,
                    snapid: 5,
                },
                &d,
            ),
        );
        assert_ne!(again.id, s1.id);
    }

    #[test]
    fn filesystem_root_of_a_subtree_export_is_not_node_one() {
        let d = Arc::new(AtomicU64::new(0));
        let t = table(0x1000, &d);
        let fsroot = ins(&t, new(head(1), &d));
        assert_ne!(fsroot.id, ROOT_ID);
        assert_eq!(t.get(ROOT_ID).unwrap().vino.ino, 0x1000);
    }

    #[test]
    fn hostile_deep_parent_chains_drop_without_recursion() {
        // A guest can make paths as deep as it likes: dropping the chain of parents of the
        // deepest node must not recurse once per level (worker threads have small stacks).
        let d = Arc::new(AtomicU64::new(0));
        let t = table(1, &d);
        let mut parent = t.get(ROOT_ID);
        for i in 0..200_000u64 {
            let mut n = new(head(0x1000 + i), &d);
            n.link = parent.take().map(|parent| Link {
                parent,
                name: CString::new("x").unwrap(),
            });
            parent = Some(t.insert(n).unwrap());
            t.forget(0x1000 + i, 1);
        }
        drop(parent);
        assert_eq!(d.load(Ordering::Relaxed), 200_000);
    }

    #[test]
    fn a_node_keeps_its_newest_names_and_follows_its_renames() {
        let d = Arc::new(AtomicU64::new(0));
        let t = table(1, &d);
        let dirs: Vec<_> = (0..6u64)
            .map(|i| {
                let mut n = new(head(0x100 + i), &d);
                n.kind = libc::S_IFDIR;
                ins(&t, n)
            })
            .collect();
        let at = |p: usize, name: &str| Link {
            parent: dirs[p].clone(),
            name: CString::new(name).unwrap(),
        };
        let names = |n: &Node<Ref>| -> Vec<(u64, String)> {
            n.links()
                .iter()
                .map(|l| (l.parent.id, l.name.to_str().unwrap().to_owned()))
                .collect()
        };
        let found = |p: usize, name: &str| {
            let mut n = new(head(0x10), &d);
            n.link = Some(at(p, name));
            ins(&t, n)
        };
        let f = found(0, "a");
        found(1, "b");
        // Found again by an older name: that one is the newest now, listed once.
        found(0, "a");
        assert_eq!(names(&f), [(0x100, "a".into()), (0x101, "b".into())]);
        for (i, n) in ["c", "d", "e"].iter().enumerate() {
            found(i + 2, n);
        }
        assert_eq!(names(&f).len(), MAX_NAMES);
        assert_eq!(f.link().unwrap().name.to_str().unwrap(), "e");
        assert!(!names(&f).contains(&(0x101, "b".into())), "the oldest goes");
        // A rename moves the name renamed and leaves the others.
        f.renamed(0x100, c"a", at(5, "z"));
        assert_eq!(
            names(&f),
            [
                (0x105, "z".into()),
                (0x104, "e".into()),
                (0x103, "d".into()),
                (0x102, "c".into())
            ]
        );
        // A name it never had: only the new one is added.
        f.renamed(0x100, c"nothing", at(0, "a"));
        assert_eq!(names(&f).first(), Some(&(0x100, "a".into())));
        assert_eq!(names(&f).len(), MAX_NAMES);
        // Migration sets one name.
        f.set_link(Some(at(1, "b")));
        assert_eq!(names(&f), [(0x101, "b".into())]);
        // Every parent a node keeps is released with it, iteratively.
        drop(dirs);
        t.clear();
        drop(f);
        // Six directories, the file, and the five duplicates of its lookups.
        assert_eq!(
            d.load(Ordering::Relaxed),
            6 + 1 + 5,
            "every reference released once"
        );
    }

    #[test]
    fn concurrent_lookups_and_forgets_balance() {
        let d = Arc::new(AtomicU64::new(0));
        let t = Arc::new(table(1, &d));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let t = t.clone();
                let d = d.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        let ino = 0x100 + (i % 17);
                        ins(&t, new(head(ino), &d));
                        t.forget(ino, 1);
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(t.len(), 1, "only the root is left");
    }

    #[test]
    fn restored_nodes_keep_their_ids_and_lookups() {
        let d = Arc::new(AtomicU64::new(0));
        let t = table(1, &d);
        let n = t.restore(0x2000, new(head(0x2000), &d), 4).unwrap();
        assert_eq!((n.id, n.lookups()), (0x2000, 4));
        let snap = Vino {
            ino: 0x2000,
            snapid: 5,
        };
        let id = ALLOCATED_BIT | 40;
        assert_eq!(t.restore(id, new(snap, &d), 1).unwrap().id, id);
        // The same snapshot looked up again is the restored node; a new one comes after it.
        assert_eq!(ins(&t, new(snap, &d)).id, id);
        let other = Vino {
            ino: 0x2001,
            snapid: 5,
        };
        assert!(ins(&t, new(other, &d)).id > id);
        // A head inode under another id, an allocated id for a head inode, a duplicate.
        assert_eq!(
            t.restore(0x3000, new(head(0x3001), &d), 1).unwrap_err(),
            libc::EINVAL
        );
        assert_eq!(
            t.restore(ALLOCATED_BIT | 50, new(head(0x3001), &d), 1)
                .unwrap_err(),
            libc::EINVAL
        );
        assert_eq!(
            t.restore(0x2000, new(head(0x2000), &d), 1).unwrap_err(),
            libc::EEXIST
        );
        assert_eq!(
            t.restore(ROOT_ID, new(head(1), &d), 1).unwrap_err(),
            libc::EEXIST
        );
        assert_eq!(t.snapshot().len(), 3);
        t.forget(0x2000, 4);
        assert!(t.get(0x2000).is_none());
    }

    #[test]
    fn hostile_node_limit_refuses_new_nodes_only() {
        let d = Arc::new(AtomicU64::new(0));
        let t = table(1, &d);
        t.set_limit(3);
        ins(&t, new(head(0x10), &d));
        ins(&t, new(head(0x11), &d));
        assert!(!t.has_room());
        assert_eq!(t.insert(new(head(0x12), &d)).unwrap_err(), libc::ENFILE);
        assert_eq!(
            d.load(Ordering::Relaxed),
            1,
            "the refused reference is released"
        );
        // A node already in the table still takes lookups.
        assert_eq!(ins(&t, new(head(0x10), &d)).lookups(), 2);
        // A refused snapshot inode leaves no reverse-index entry behind.
        let snap = Vino {
            ino: 0x10,
            snapid: 4,
        };
        assert_eq!(t.insert(new(snap, &d)).unwrap_err(), libc::ENFILE);
        assert!(t.allocated.lock().unwrap().is_empty());
        // FORGET makes room again.
        t.forget(0x11, 1);
        assert!(t.has_room());
        ins(&t, new(snap, &d));
        assert_eq!(t.len(), 3);
        t.clear();
        assert!(t.has_room());
        assert_eq!(t.count.load(Ordering::Relaxed), 1);
    }

    /// Nodes holding their reference now (the root included).
    fn holding(t: &NodeTable<Ref>) -> usize {
        t.snapshot().iter().filter(|n| n.holds_inode()).count() + 1
    }

    #[test]
    fn cold_nodes_release_their_references_and_find_them_again() {
        let d = Arc::new(AtomicU64::new(0));
        let t = table(1, &d);
        let nodes: Vec<_> = (0..100u64)
            .map(|i| ins(&t, new(head(0x100 + i), &d)))
            .collect();
        assert_eq!(t.held(), 101);
        // Every node is freshly used: the first sweep gives each its second chance, the second
        // releases.
        let released = t.trim(10);
        assert_eq!(released, 91);
        assert_eq!(t.held(), 10);
        assert_eq!(holding(&t), 10);
        assert_eq!(d.load(Ordering::Relaxed), 91, "each released exactly once");
        // A released node keeps its id and lookups, and finds its inode again on its next use.
        let cold = nodes.iter().find(|n| !n.holds_inode()).unwrap();
        assert!(cold.inode().is_none());
        let mut asked = Vec::new();
        let got = cold
            .inode_or_else(|v| {
                asked.push(v);
                Ok::<_, i32>(Ref(d.clone()))
            })
            .unwrap();
        assert_eq!(asked, vec![cold.vino]);
        assert_eq!(t.held(), 11);
        // Held now: the next use takes the same reference, resolving nothing.
        let again = cold
            .inode_or_else(|_| -> Result<Ref, i32> { panic!("resolved twice") })
            .unwrap();
        assert!(Arc::ptr_eq(&got, &again));
        // A failed resolve changes nothing.
        let other = nodes.iter().find(|n| !n.holds_inode()).unwrap();
        assert_eq!(
            other.inode_or_else(|_| Err(libc::ESTALE)).unwrap_err(),
            libc::ESTALE
        );
        assert!(!other.holds_inode());
        assert_eq!(t.held(), 11);
    }

    #[test]
    fn a_node_used_between_sweeps_keeps_its_reference() {
        let d = Arc::new(AtomicU64::new(0));
        let t = table(1, &d);
        let nodes: Vec<_> = (0..64u64)
            .map(|i| ins(&t, new(head(0x100 + i), &d)))
            .collect();
        assert_eq!(t.trim(65), 0, "under the limit a trim does nothing");
        // As after a sweep that cleared every bit, then one node used again.
        for n in &nodes {
            n.used.store(false, Ordering::Relaxed);
        }
        let hot = &nodes[7];
        assert!(hot.inode().is_some());
        assert_eq!(t.trim(2), 63, "every cold node goes, the hot one stays");
        assert!(hot.holds_inode());
        assert_eq!(
            t.trim(1),
            1,
            "not used since its second chance: it goes next"
        );
        assert!(!hot.holds_inode());
        assert_eq!(t.held(), 1, "the root");
    }

    #[test]
    fn only_the_root_keeps_its_reference() {
        let d = Arc::new(AtomicU64::new(0));
        let t = table(0x1000, &d);
        let snapshot = |snapid| Vino {
            ino: 0x2000,
            snapid,
        };
        // A `.snap` directory and a snapshot inode count like any other node (finding 3 of
        // the review of f9264a9: pinned, they were a way around `--held-inodes`).
        let snapdir = ins(&t, new(snapshot(u64::MAX), &d));
        let snap = ins(&t, new(snapshot(7), &d));
        let head_node = ins(&t, new(head(0x2000), &d));
        assert_eq!(t.trim(0), 3, "everything but the root goes");
        assert!(t.get(ROOT_ID).unwrap().holds_inode());
        assert!(!head_node.holds_inode() && !snap.holds_inode() && !snapdir.holds_inode());
        assert!(!t.release_vino(head(0x1000)), "the root is pinned");
        assert_eq!(t.held(), 1);
        // Found again, a snapshot inode is released by a recall like the others.
        snap.inode_or_else(|_| Ok::<_, i32>(Ref(d.clone())))
            .unwrap();
        assert!(t.release_vino(snap.vino));
        assert_eq!(t.held(), 1);
    }

    #[test]
    fn a_recall_releases_the_recalled_node_only() {
        let d = Arc::new(AtomicU64::new(0));
        let t = table(1, &d);
        let a = ins(&t, new(head(0x10), &d));
        let b = ins(&t, new(head(0x11), &d));
        assert!(t.release_vino(head(0x10)));
        assert!(!a.holds_inode() && b.holds_inode());
        assert!(!t.release_vino(head(0x10)), "released already");
        assert!(!t.release_vino(head(0x99)), "unknown inode");
        assert_eq!(d.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_lookup_of_a_released_node_gives_it_the_reference_found() {
        let d = Arc::new(AtomicU64::new(0));
        let t = table(1, &d);
        let n = ins(&t, new(head(0x10), &d));
        assert!(n.release());
        assert_eq!(d.load(Ordering::Relaxed), 1);
        let again = ins(&t, new(head(0x10), &d));
        assert!(Arc::ptr_eq(&n, &again));
        assert!(
            n.holds_inode(),
            "the lookup's reference is kept, not released"
        );
        assert_eq!(d.load(Ordering::Relaxed), 1);
        assert_eq!(n.lookups(), 2);
        // Held: a second lookup's duplicate is released.
        ins(&t, new(head(0x10), &d));
        assert_eq!(d.load(Ordering::Relaxed), 2);
        assert_eq!(t.held(), 2);
    }

    #[test]
    fn held_count_follows_forgets_releases_and_requests_outliving_the_table() {
        let d = Arc::new(AtomicU64::new(0));
        let t = table(1, &d);
        let a = ins(&t, new(head(0x10), &d));
        ins(&t, new(head(0x11), &d));
        assert_eq!(t.held(), 3);
        // A request still uses `a` when the guest forgets it: the node gives its reference up
        // at once (the request holds its own for as long as it needs it), and keeps none it
        // finds again.
        let used = a.inode().unwrap();
        t.forget(0x10, 1);
        assert_eq!(t.held(), 2);
        assert_eq!(
            d.load(Ordering::Relaxed),
            0,
            "the request's reference lives on"
        );
        drop(used);
        assert_eq!(d.load(Ordering::Relaxed), 1);
        let again = a.inode_or_else(|_| Ok::<_, i32>(Ref(d.clone()))).unwrap();
        assert!(!a.holds_inode(), "out of the table, a node keeps nothing");
        assert_eq!(t.held(), 2);
        drop(again);
        drop(a);
        assert_eq!(t.held(), 2);
        // A released node leaving the table leaves the count alone.
        t.get(0x11).unwrap().release();
        assert_eq!(t.held(), 1);
        t.forget(0x11, 1);
        assert_eq!(t.held(), 1);
        t.clear();
        assert_eq!(t.held(), 1, "the root stays");
        assert_eq!(d.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn concurrent_uses_trims_and_forgets_keep_the_count_exact() {
        let d = Arc::new(AtomicU64::new(0));
        let t = Arc::new(table(1, &d));
        let threads: Vec<_> = (0..4u64)
            .map(|k| {
                let t = t.clone();
                let d = d.clone();
                std::thread::spawn(move || {
                    for i in 0..3000u64 {
                        let ino = 0x100 + (i * 7 + k) % 257;
                        let n = ins(&t, new(head(ino), &d));
                        let _ = n.inode_or_else(|_| Ok::<_, i32>(Ref(d.clone())));
                        match (i + k) % 5 {
                            0 => {
                                t.trim(32);
                            }
                            1 => {
                                t.release_vino(head(0x100 + i % 257));
                            }
                            _ => {}
                        }
                        if i % 3 == 0 {
                            t.forget(ino, 1);
                        }
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(t.held(), holding(&t));
        t.clear();
        assert_eq!(t.held(), 1);
    }
}
