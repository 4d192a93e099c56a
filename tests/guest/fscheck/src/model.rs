//! The in-memory model of the checker's directory tree: what Linux (tmpfs/ext4 semantics) says the
//! filesystem must show after every operation.

use std::collections::{BTreeMap, HashMap};

use crate::data::Data;
use crate::sys::Errno;

pub type Id = usize;

pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;
pub const S_IXGRP: u32 = 0o010;

pub enum Kind {
    File(Data),
    Dir(BTreeMap<String, Id>),
    Symlink(String),
}

/// What a timestamp must be.
#[derive(Clone, Copy, Debug)]
pub enum TimeExp {
    /// Exactly this (set explicitly, or observed and since unchanged).
    Known(i128),
    /// "Now": within [lo, hi] (the guest clock around the call, widened by the slack).
    Window(i128, i128),
    /// Left alone or set to "now": Linux filesystems differ (e.g. mmap writes on tmpfs).
    OldOrWindow(i128, i128, i128),
}

pub fn fmt_ns(t: i128) -> String {
    let s = t.div_euclid(1_000_000_000);
    let ns = t.rem_euclid(1_000_000_000);
    format!("{s}.{ns:09}")
}

impl TimeExp {
    pub fn accepts(&self, t: i128) -> bool {
        match *self {
            TimeExp::Known(k) => t == k,
            TimeExp::Window(lo, hi) => lo <= t && t <= hi,
            TimeExp::OldOrWindow(old, lo, hi) => t == old || (lo <= t && t <= hi),
        }
    }

    /// The latest time this expectation accepts.
    pub fn latest(&self) -> i128 {
        match *self {
            TimeExp::Known(k) => k,
            TimeExp::Window(_, hi) => hi,
            TimeExp::OldOrWindow(old, _, hi) => old.max(hi),
        }
    }

    pub fn describe(&self) -> String {
        match *self {
            TimeExp::Known(k) => fmt_ns(k),
            TimeExp::Window(lo, hi) => format!("now, in [{}, {}]", fmt_ns(lo), fmt_ns(hi)),
            TimeExp::OldOrWindow(old, lo, hi) => format!(
                "{} (unchanged) or now, in [{}, {}]",
                fmt_ns(old),
                fmt_ns(lo),
                fmt_ns(hi)
            ),
        }
    }

    /// The guest's clock moved `d` ns against the filesystem's at an unknown moment between
    /// the last probe and now: "now" may have been read with either offset.
    pub fn widen(self, d: i128) -> TimeExp {
        let span = |lo: i128, hi: i128| (lo.min(lo + d), hi.max(hi + d));
        match self {
            TimeExp::Known(k) => TimeExp::Known(k),
            TimeExp::Window(lo, hi) => {
                let (lo, hi) = span(lo, hi);
                TimeExp::Window(lo, hi)
            }
            TimeExp::OldOrWindow(old, lo, hi) => {
                let (lo, hi) = span(lo, hi);
                TimeExp::OldOrWindow(old, lo, hi)
            }
        }
    }

    /// "Unchanged or now": from whatever the time was known to be.
    pub fn old_or(self, w: TimeExp) -> TimeExp {
        match (self, w) {
            (TimeExp::Known(old), TimeExp::Window(lo, hi)) => TimeExp::OldOrWindow(old, lo, hi),
            (TimeExp::Window(a, _), TimeExp::Window(_, hi)) => TimeExp::Window(a, hi),
            (TimeExp::OldOrWindow(old, a, _), TimeExp::Window(_, hi)) => {
                TimeExp::OldOrWindow(old, a, hi)
            }
            _ => w,
        }
    }
}

pub struct Inode {
    pub kind: Kind,
    /// Permission and special bits (07777).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The (parent, name) entries naming it; a directory has one, the root none.
    pub dentries: Vec<(Id, String)>,
    pub mtime: TimeExp,
    pub ctime: TimeExp,
    /// st_ino, learned when first seen.
    pub ino: Option<u64>,
    pub xattrs: BTreeMap<String, Vec<u8>>,
    /// Open descriptors (of the checker's pool) on it: keeps an unlinked file alive.
    pub open: u32,
    /// A second acceptable mode where Linux versions differ (see `kill_on_write`).
    pub mode_alt: Option<u32>,
}

impl Inode {
    pub fn new(kind: Kind, mode: u32, uid: u32, gid: u32, t: TimeExp) -> Inode {
        Inode {
            kind,
            mode,
            uid,
            gid,
            dentries: Vec::new(),
            mtime: t,
            ctime: t,
            ino: None,
            xattrs: BTreeMap::new(),
            open: 0,
            mode_alt: None,
        }
    }

    pub fn is_dir(&self) -> bool {
        matches!(self.kind, Kind::Dir(_))
    }

    pub fn is_file(&self) -> bool {
        matches!(self.kind, Kind::File(_))
    }

    pub fn is_symlink(&self) -> bool {
        matches!(self.kind, Kind::Symlink(_))
    }

    pub fn data(&self) -> &Data {
        match &self.kind {
            Kind::File(d) => d,
            _ => panic!("not a file"),
        }
    }

    pub fn data_mut(&mut self) -> &mut Data {
        match &mut self.kind {
            Kind::File(d) => d,
            _ => panic!("not a file"),
        }
    }

    pub fn entries(&self) -> &BTreeMap<String, Id> {
        match &self.kind {
            Kind::Dir(e) => e,
            _ => panic!("not a directory"),
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self.kind {
            Kind::File(_) => "file",
            Kind::Dir(_) => "directory",
            Kind::Symlink(_) => "symlink",
        }
    }

    pub fn ifmt(&self) -> u32 {
        match self.kind {
            Kind::File(_) => libc::S_IFREG,
            Kind::Dir(_) => libc::S_IFDIR,
            Kind::Symlink(_) => libc::S_IFLNK,
        }
    }

    pub fn dtype(&self) -> u8 {
        match self.kind {
            Kind::File(_) => libc::DT_REG,
            Kind::Dir(_) => libc::DT_DIR,
            Kind::Symlink(_) => libc::DT_LNK,
        }
    }

    pub fn set_times(&mut self, mtime: bool, ctime: bool, t: TimeExp) {
        if mtime {
            self.mtime = t;
        }
        if ctime {
            self.ctime = t;
        }
    }
}

/// Who the checker runs as.
#[derive(Clone, Debug)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Cred {
    pub fn root(&self) -> bool {
        self.uid == 0
    }

    pub fn in_group(&self, g: u32) -> bool {
        self.gid == g || self.groups.contains(&g)
    }
}

pub struct Model {
    pub inodes: Vec<Option<Inode>>,
    pub root: Id,
    pub cred: Cred,
    /// Absolute path of the root of the model.
    pub base: String,
    /// Live st_ino -> model inode.
    pub inos: HashMap<u64, Id>,
    /// fs.protected_hardlinks (link(2) of others' files, may_linkat).
    pub protected_hardlinks: bool,
    /// Bumped whenever an entry is added or removed.
    pub generation: u64,
}

impl Model {
    pub fn new(base: String, cred: Cred, root: Inode) -> Model {
        Model {
            inodes: vec![Some(root)],
            root: 0,
            cred,
            base,
            inos: HashMap::new(),
            protected_hardlinks: std::fs::read_to_string("/proc/sys/fs/protected_hardlinks")
                .map(|s| s.trim() == "1")
                .unwrap_or(false),
            generation: 0,
        }
    }

    pub fn get(&self, id: Id) -> &Inode {
        self.inodes[id].as_ref().expect("live inode")
    }

    pub fn get_mut(&mut self, id: Id) -> &mut Inode {
        self.inodes[id].as_mut().expect("live inode")
    }

    pub fn live(&self, id: Id) -> bool {
        self.inodes.get(id).is_some_and(|i| i.is_some())
    }

    pub fn alloc(&mut self, inode: Inode) -> Id {
        if let Some(free) = self.inodes.iter().position(|i| i.is_none()) {
            self.inodes[free] = Some(inode);
            free
        } else {
            self.inodes.push(Some(inode));
            self.inodes.len() - 1
        }
    }

    /// The path to hand to system calls: relative to the root of the model, which is the
    /// working directory (one lookup less per call than an absolute path).
    pub fn real(&self, rel: &str) -> String {
        if rel.is_empty() {
            ".".to_string()
        } else {
            rel.to_string()
        }
    }

    /// The model inode at `rel` (relative to the root, '/'-separated, "" = root).
    pub fn lookup(&self, rel: &str) -> Result<Id, Errno> {
        let mut cur = self.root;
        for c in rel.split('/').filter(|c| !c.is_empty()) {
            let node = self.get(cur);
            match &node.kind {
                Kind::Dir(e) => match e.get(c) {
                    Some(id) => cur = *id,
                    None => return Err(libc::ENOENT),
                },
                Kind::File(_) => return Err(libc::ENOTDIR),
                Kind::Symlink(_) => return Err(libc::ELOOP),
            }
        }
        Ok(cur)
    }

    pub fn split(rel: &str) -> (&str, &str) {
        match rel.rfind('/') {
            Some(i) => (&rel[..i], &rel[i + 1..]),
            None => ("", rel),
        }
    }

    pub fn join(dir: &str, name: &str) -> String {
        if dir.is_empty() {
            name.to_string()
        } else {
            format!("{dir}/{name}")
        }
    }

    /// One path naming `id`, if it has any.
    pub fn path(&self, id: Id) -> Option<String> {
        if id == self.root {
            return Some(String::new());
        }
        let (parent, name) = self.get(id).dentries.first()?;
        let pp = self.path(*parent)?;
        Some(Model::join(&pp, name))
    }

    pub fn nlink(&self, id: Id) -> u64 {
        let n = self.get(id);
        match &n.kind {
            Kind::Dir(e) => 2 + e.values().filter(|c| self.get(**c).is_dir()).count() as u64,
            _ => n.dentries.len() as u64,
        }
    }

    pub fn size(&self, id: Id) -> u64 {
        match &self.get(id).kind {
            Kind::File(d) => d.len(),
            Kind::Symlink(t) => t.len() as u64,
            Kind::Dir(_) => 0,
        }
    }

    /// Linux permission check for the checker's credentials; mask of 4 (r), 2 (w), 1 (x).
    pub fn access(&self, id: Id, mask: u32) -> bool {
        let n = self.get(id);
        if self.cred.root() {
            if mask & 1 != 0 && !n.is_dir() {
                return n.mode & 0o111 != 0;
            }
            return true;
        }
        let bits = if n.uid == self.cred.uid {
            (n.mode >> 6) & 7
        } else if self.cred.in_group(n.gid) {
            (n.mode >> 3) & 7
        } else {
            n.mode & 7
        };
        bits & mask == mask
    }

    pub fn owner_or_root(&self, id: Id) -> bool {
        self.cred.root() || self.get(id).uid == self.cred.uid
    }

    /// may_linkat: with protected hardlinks, only the owner links a file, or anyone to a
    /// regular file without setuid / setgid+group-exec that it can read and write.
    pub fn may_link(&self, id: Id) -> bool {
        if !self.protected_hardlinks || self.owner_or_root(id) {
            return true;
        }
        let n = self.get(id);
        n.is_file()
            && n.mode & S_ISUID == 0
            && n.mode & (S_ISGID | S_IXGRP) != (S_ISGID | S_IXGRP)
            && self.access(id, 6)
    }

    /// Is `a` `b` or one of its ancestors (both directories)?
    pub fn ancestor_or_self(&self, a: Id, b: Id) -> bool {
        let mut cur = b;
        loop {
            if cur == a {
                return true;
            }
            if cur == self.root {
                return false;
            }
            match self.get(cur).dentries.first() {
                Some((p, _)) => cur = *p,
                None => return false,
            }
        }
    }

    pub fn add_entry(&mut self, parent: Id, name: &str, id: Id) {
        self.generation += 1;
        match &mut self.get_mut(parent).kind {
            Kind::Dir(e) => {
                e.insert(name.to_string(), id);
            }
            _ => panic!("add_entry into a non-directory"),
        }
        self.get_mut(id).dentries.push((parent, name.to_string()));
    }

    /// Remove the entry; the inode goes once nothing names it and nothing has it open.
    pub fn remove_entry(&mut self, parent: Id, name: &str) -> Id {
        self.generation += 1;
        let id = match &mut self.get_mut(parent).kind {
            Kind::Dir(e) => e.remove(name).expect("entry present"),
            _ => panic!("remove_entry from a non-directory"),
        };
        let n = self.get_mut(id);
        let pos = n
            .dentries
            .iter()
            .position(|(p, nm)| *p == parent && nm == name)
            .expect("dentry present");
        n.dentries.remove(pos);
        self.maybe_free(id);
        id
    }

    pub fn maybe_free(&mut self, id: Id) {
        let n = self.get(id);
        if n.dentries.is_empty() && n.open == 0 && id != self.root {
            if let Some(ino) = n.ino {
                if self.inos.get(&ino) == Some(&id) {
                    self.inos.remove(&ino);
                }
            }
            self.inodes[id] = None;
        }
    }

    /// A write or truncate by a caller without CAP_FSETID kills setuid, and setgid if
    /// group-exec is set.
    pub fn kill_on_write(&mut self, id: Id) {
        if self.cred.root() {
            return;
        }
        let in_group = self.cred.in_group(self.get(id).gid);
        let n = self.get_mut(id);
        if n.is_file() {
            n.mode &= !S_ISUID;
            if n.mode & S_IXGRP != 0 {
                n.mode &= !S_ISGID;
            } else if n.mode & S_ISGID != 0 && !in_group {
                // Since Linux 6.2 (setattr_should_drop_sgid) setgid without group-exec goes
                // too when the writer is outside the file's group; 6.1 keeps it.
                n.mode_alt = Some(n.mode & !S_ISGID);
            }
        }
    }

    /// fallocate by a caller without CAP_FSETID: some filesystems kill like a write, some not.
    pub fn maybe_kill_on_write(&mut self, id: Id) {
        let before = self.get(id).mode;
        self.kill_on_write(id);
        let n = self.get_mut(id);
        if n.mode != before {
            n.mode_alt = Some(before);
        }
    }

    /// chown of a non-directory kills setuid, and setgid if group-exec is set, whoever calls.
    pub fn kill_on_chown(&mut self, id: Id) {
        let n = self.get_mut(id);
        if !n.is_dir() {
            n.mode &= !S_ISUID;
            if n.mode & S_IXGRP != 0 {
                n.mode &= !S_ISGID;
            }
        }
    }

    /// Owner, group and extra mode bits of a new inode in `parent`.
    pub fn new_owner(&self, parent: Id, is_dir: bool) -> (u32, u32, u32) {
        let p = self.get(parent);
        if p.mode & S_ISGID != 0 {
            (self.cred.uid, p.gid, if is_dir { S_ISGID } else { 0 })
        } else {
            (self.cred.uid, self.cred.gid, 0)
        }
    }

    /// Every live inode reachable from the root, with one path each (directories first).
    pub fn walk(&self) -> Vec<(String, Id)> {
        let mut out = vec![(String::new(), self.root)];
        let mut i = 0;
        while i < out.len() {
            let (p, id) = out[i].clone();
            if let Kind::Dir(e) = &self.get(id).kind {
                for (name, c) in e {
                    out.push((Model::join(&p, name), *c));
                }
            }
            i += 1;
        }
        out
    }

    pub fn total_data(&self) -> u64 {
        self.inodes
            .iter()
            .flatten()
            .map(|n| match &n.kind {
                Kind::File(d) => d.len(),
                _ => 0,
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::TimeExp;

    #[test]
    fn a_clock_move_widens_now_windows_and_leaves_known_times_alone() {
        // The guest fell 3 s behind: the filesystem's "now" may be up to 3 s later.
        assert!(TimeExp::Window(10, 20).widen(3).accepts(23));
        assert!(TimeExp::Window(10, 20).widen(3).accepts(10));
        assert!(!TimeExp::Window(10, 20).widen(3).accepts(24));
        // It ran ahead: up to 3 s earlier.
        assert!(TimeExp::Window(10, 20).widen(-3).accepts(7));
        assert!(!TimeExp::Window(10, 20).widen(-3).accepts(6));
        let w = TimeExp::OldOrWindow(1, 10, 20).widen(3);
        assert!(w.accepts(1) && w.accepts(23) && !w.accepts(2));
        assert!(TimeExp::Known(5).widen(3).accepts(5));
        assert!(!TimeExp::Known(5).widen(3).accepts(8));
    }
}
