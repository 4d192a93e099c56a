//! Picks the next operation from the model's current state: mostly valid operations on what
//! exists, with a share of the usual error cases (existing names, missing names, wrong types,
//! other owners), over a small name pool so names collide.

use crate::check::Via;
use crate::model::{Id, Model};
use crate::ops::{Back, Op, TimeArg, World, SLOTS};
use crate::rng::Rng;

const NAMES: &[&str] = &["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
const MAX_DEPTH: usize = 3;
/// Past this much file data in the model, writes give way to truncates.
const DATA_BUDGET: u64 = 48 << 20;

/// Operation names (as `Op::name`) of the metadata and data weight tables, in order.
const META_NAMES: &[&str] = &[
    "create",
    "mkdir",
    "rmdir",
    "unlink",
    "link",
    "symlink",
    "readlink",
    "rename",
    "chmod",
    "chown",
    "utimens",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "stat",
    "readdir",
];
const DATA_NAMES: &[&str] = &[
    "open",
    "close",
    "write",
    "mmap-write",
    "read-fd",
    "read-path",
    "append",
    "truncate",
    "ftruncate",
    "fallocate",
    "copy_file_range",
    "fsync",
    "fadvise",
    "drop_caches",
];

/// Every operation name --skip accepts.
pub fn op_names() -> Vec<&'static str> {
    let mut v: Vec<&str> = META_NAMES.iter().chain(DATA_NAMES).copied().collect();
    v.push("bigdir");
    v
}

pub struct Gen {
    pub rng: Rng,
    /// Operations never generated (--skip), to explore past a known divergence.
    pub skip: Vec<String>,
    /// The model's entries by kind, rebuilt when the tree changes.
    view: Option<(u64, View)>,
    /// Share of data operations, in percent.
    pub data_pct: u64,
    /// One large-directory round in this many operations (0: never).
    pub bigdir_every: u64,
    /// Explicit times are drawn below this many seconds (--max-time).
    pub max_time: u64,
    bigdirs: u64,
}

struct View {
    dirs: Vec<(String, Id)>,
    entries: Vec<(String, Id)>,
    files: Vec<(String, Id)>,
    symlinks: Vec<(String, Id)>,
}

fn depth(p: &str) -> usize {
    if p.is_empty() {
        0
    } else {
        p.matches('/').count() + 1
    }
}

impl Gen {
    pub fn new(seed: u64, data_pct: u64, bigdir_every: u64) -> Gen {
        Gen {
            rng: Rng::new(seed),
            data_pct,
            bigdir_every,
            bigdirs: 0,
            view: None,
            skip: Vec::new(),
            max_time: 1 << 32,
        }
    }

    fn masked<const N: usize>(&self, w: &[u64; N], names: &[&str]) -> [u64; N] {
        let mut out = *w;
        for (i, n) in names.iter().enumerate() {
            if self.skip.iter().any(|s| s == n) {
                out[i] = 0;
            }
        }
        if out.iter().all(|x| *x == 0) {
            out[0] = 1;
        }
        out
    }

    fn view(m: &Model) -> View {
        let mut v = View {
            dirs: Vec::new(),
            entries: Vec::new(),
            files: Vec::new(),
            symlinks: Vec::new(),
        };
        for (p, id) in m.walk() {
            let n = m.get(id);
            if n.is_dir() {
                v.dirs.push((p.clone(), id));
            } else if n.is_file() {
                v.files.push((p.clone(), id));
            } else {
                v.symlinks.push((p.clone(), id));
            }
            if !p.is_empty() {
                v.entries.push((p, id));
            }
        }
        v
    }

    pub fn next(&mut self, w: &World) -> Op {
        if self.bigdir_every > 0
            && self.rng.below(self.bigdir_every) == 0
            && !self.skip.iter().any(|s| s == "bigdir")
        {
            self.bigdirs += 1;
            return Op::BigDir {
                path: format!("big{}", self.bigdirs),
                n: self.rng.range(150, 400) as usize,
                bufsize: *self.rng.pick(&[512, 1024, 2048]),
                seed: self.rng.next_u64(),
            };
        }
        let v = match self.view.take() {
            Some((g, v)) if g == w.m.generation => v,
            _ => Gen::view(&w.m),
        };
        let op = if self.rng.pct(self.data_pct) {
            self.data(w, &v)
        } else {
            self.meta(w, &v)
        };
        self.view = Some((w.m.generation, v));
        op
    }

    fn new_path(&mut self, v: &View, dirs_only_shallow: bool) -> String {
        if !dirs_only_shallow && !v.files.is_empty() && self.rng.pct(3) {
            // Under a regular file: ENOTDIR.
            let (f, _) = self.rng.pick(&v.files);
            return format!("{f}/x");
        }
        let dirs: Vec<&(String, Id)> = v
            .dirs
            .iter()
            .filter(|(p, _)| !dirs_only_shallow || depth(p) < MAX_DEPTH)
            .collect();
        let (d, _) = self.rng.pick(&dirs);
        Model::join(d, self.rng.pick::<&str>(NAMES))
    }

    fn entry(&mut self, v: &View) -> Option<String> {
        if v.entries.is_empty() {
            None
        } else {
            Some(self.rng.pick(&v.entries).0.clone())
        }
    }

    fn entry_or_new(&mut self, v: &View) -> String {
        match self.entry(v) {
            Some(e) if !self.rng.pct(8) => e,
            _ => self.new_path(v, false),
        }
    }

    fn file_mode(&mut self) -> u32 {
        let base = *self.rng.pick(&[
            0o644, 0o600, 0o666, 0o755, 0o640, 0o444, 0o700, 0o664, 0o000,
        ]);
        let special = match self.rng.below(10) {
            0 => 0o4000,
            1 => 0o2000,
            2 => 0o6000,
            3 => 0o2000 | 0o010,
            4 => 0o6000 | 0o010,
            _ => 0,
        };
        base | special
    }

    fn dir_mode(&mut self) -> u32 {
        let mut m = 0o700 | self.rng.below(0o100) as u32;
        if self.rng.pct(25) {
            m |= 0o2000;
        }
        if self.rng.pct(10) {
            m |= 0o1000;
        }
        m
    }

    fn time_arg(&mut self) -> TimeArg {
        match self.rng.below(10) {
            0..=2 => TimeArg::Now,
            3 | 4 => TimeArg::Omit,
            _ => TimeArg::Set(
                self.rng.below(self.max_time) as i64,
                self.rng.below(1_000_000_000) as i64,
            ),
        }
    }

    fn meta(&mut self, w: &World, v: &View) -> Op {
        let m = &w.m;
        let crowded = v.entries.len() > 150;
        let weights = [
            if crowded { 2 } else { 10 },    // create
            if crowded { 1 } else { 4 },     // mkdir
            4,                               // rmdir
            if crowded { 20 } else { 8 },    // unlink
            4,                               // link
            3,                               // symlink
            2,                               // readlink
            12,                              // rename
            6,                               // chmod
            5,                               // chown
            8,                               // utimens
            if w.cfg.xattr { 4 } else { 0 }, // setxattr
            if w.cfg.xattr { 3 } else { 0 }, // getxattr
            if w.cfg.xattr { 2 } else { 0 }, // listxattr
            if w.cfg.xattr { 3 } else { 0 }, // removexattr
            3,                               // stat
            4,                               // readdir
        ];
        let k = self.rng.weighted(&self.masked(&weights, META_NAMES));
        let Some(entry) = self.entry(v) else {
            return Op::Create {
                path: self.new_path(v, false),
                mode: 0o644,
            };
        };
        match k {
            0 => Op::Create {
                path: self.new_path(v, false),
                mode: *self
                    .rng
                    .pick(&[0o644, 0o600, 0o666, 0o755, 0o640, 0o444, 0o700]),
            },
            1 => Op::Mkdir {
                path: self.new_path(v, true),
                mode: 0o700
                    | self.rng.below(0o100) as u32
                    | if self.rng.pct(10) { 0o1000 } else { 0 },
            },
            2 => {
                let path = if v.dirs.len() > 1 && self.rng.pct(75) {
                    self.rng.pick(&v.dirs[1..]).0.clone()
                } else {
                    self.entry_or_new(v)
                };
                Op::Rmdir { path }
            }
            3 => Op::Unlink {
                path: self.entry_or_new(v),
            },
            4 => {
                let from = if !v.files.is_empty() && self.rng.pct(90) {
                    self.rng.pick(&v.files).0.clone()
                } else {
                    entry
                };
                Op::Link {
                    from,
                    to: self.new_path(v, false),
                }
            }
            5 => {
                let target = match self.rng.below(10) {
                    0 => "x".repeat(self.rng.range(100, 1000) as usize),
                    1..=3 => format!("../{}", self.rng.pick(NAMES)),
                    _ => self.rng.pick(NAMES).to_string(),
                };
                Op::Symlink {
                    target,
                    path: self.new_path(v, false),
                }
            }
            6 => Op::Readlink {
                path: if !v.symlinks.is_empty() && self.rng.pct(80) {
                    self.rng.pick(&v.symlinks).0.clone()
                } else {
                    entry
                },
            },
            7 => {
                let from = if self.rng.pct(5) {
                    self.new_path(v, false)
                } else {
                    entry
                };
                let to = match self.rng.below(10) {
                    0..=4 => self.new_path(v, false),
                    5..=7 => self.entry(v).unwrap_or_default(),
                    _ => {
                        // Into another directory under the same name: directory moves.
                        let (d, _) = self.rng.pick(&v.dirs);
                        Model::join(d, Model::split(&from).1)
                    }
                };
                Op::Rename {
                    from,
                    to,
                    noreplace: self.rng.pct(20),
                }
            }
            8 => {
                let c: Vec<&(String, Id)> = v
                    .entries
                    .iter()
                    .filter(|(_, id)| !m.get(*id).is_symlink())
                    .collect();
                if c.is_empty() {
                    return Op::Stat { path: entry };
                }
                let (path, id) = self.rng.pick(&c);
                let mode = if m.get(*id).is_dir() {
                    self.dir_mode()
                } else {
                    self.file_mode()
                };
                Op::Chmod {
                    path: path.clone(),
                    mode,
                }
            }
            9 => {
                let (mut uid, mut gid);
                if m.cred.root() {
                    uid =
                        *self
                            .rng
                            .pick(&[None, None, Some(0), Some(1000), Some(2000), Some(65534)]);
                    gid = *self.rng.pick(&[
                        None,
                        Some(0),
                        Some(1000),
                        Some(2000),
                        Some(3000),
                        Some(65534),
                    ]);
                } else {
                    let c = &m.cred;
                    let supp = c.groups.first().copied().unwrap_or(c.gid);
                    uid = match self.rng.below(10) {
                        0..=6 => None,
                        7 | 8 => Some(c.uid),
                        _ => Some(c.uid + 1),
                    };
                    gid = match self.rng.below(10) {
                        0..=2 => Some(c.gid),
                        3..=6 => Some(supp),
                        7 => Some(3333),
                        _ => None,
                    };
                }
                if uid.is_none() && gid.is_none() {
                    uid = None;
                    gid = Some(m.cred.gid);
                }
                Op::Chown {
                    path: entry,
                    uid,
                    gid,
                }
            }
            10 => {
                let c: Vec<&(String, Id)> = v
                    .dirs
                    .iter()
                    .chain(v.entries.iter().filter(|(_, id)| m.get(*id).is_file()))
                    .collect();
                let (path, id) = self.rng.pick(&c);
                let (mut atime, mut mtime) = (self.time_arg(), self.time_arg());
                if matches!((atime, mtime), (TimeArg::Omit, TimeArg::Omit)) {
                    mtime = TimeArg::Now;
                }
                if !m.owner_or_root(*id) {
                    // What the man page defines for others: both now, or both explicit.
                    if self.rng.pct(70) {
                        (atime, mtime) = (TimeArg::Now, TimeArg::Now);
                    } else {
                        (atime, mtime) = (
                            TimeArg::Set(1_500_000_000, 1),
                            TimeArg::Set(1_500_000_000, 2),
                        );
                    }
                }
                Op::Utimens {
                    path: path.clone(),
                    atime,
                    mtime,
                }
            }
            11..=14 => {
                let path = if self.rng.pct(10) {
                    entry
                } else {
                    let c: Vec<&(String, Id)> = v
                        .dirs
                        .iter()
                        .chain(v.entries.iter().filter(|(_, id)| m.get(*id).is_file()))
                        .collect();
                    self.rng.pick(&c).0.clone()
                };
                let name = self
                    .rng
                    .pick(&["user.a", "user.b", "user.c", "user.a.longer.name"])
                    .to_string();
                match k {
                    11 => Op::SetXattr {
                        path,
                        name,
                        len: if self.rng.pct(10) {
                            self.rng.range(500, 900) as usize
                        } else {
                            self.rng.below(100) as usize
                        },
                        seed: self.rng.next_u64(),
                        flags: *self
                            .rng
                            .pick(&[0, 0, 0, libc::XATTR_CREATE, libc::XATTR_REPLACE]),
                    },
                    12 => Op::GetXattr { path, name },
                    13 => Op::ListXattr { path },
                    _ => Op::RemoveXattr { path, name },
                }
            }
            15 => Op::Stat {
                path: self.entry_or_new(v),
            },
            _ => Op::Readdir {
                path: self.rng.pick(&v.dirs).0.clone(),
                bufsize: *self.rng.pick(&[512, 1024, 4096, 32768]),
            },
        }
    }

    fn open_slots(w: &World) -> Vec<usize> {
        (0..SLOTS).filter(|i| w.slots[*i].is_some()).collect()
    }

    fn len(&mut self) -> usize {
        // Mostly small: under emulation moving bytes is what costs; far offsets still make
        // files of up to --max-size, across 4 MiB object boundaries.
        match self.rng.below(100) {
            0..=59 => self.rng.range(1, 4096) as usize,
            60..=89 => self.rng.range(4097, 64 << 10) as usize,
            90..=97 => self.rng.range(64 << 10, 256 << 10) as usize,
            _ => self.rng.range(256 << 10, 2 << 20) as usize,
        }
    }

    fn offset(&mut self, size: u64, max: u64) -> u64 {
        match self.rng.below(10) {
            0..=2 => (size + self.rng.below(16384)).saturating_sub(8192),
            3..=5 => self.rng.below(size + 1),
            6 | 7 => size + self.rng.below(4 << 20),
            _ => self.rng.below(max),
        }
    }

    fn clip(off: u64, len: usize, max: u64) -> (u64, usize) {
        let len = (len as u64).min(max);
        let off = if off + len > max { max - len } else { off };
        (off, len as usize)
    }

    fn align(off: u64, len: usize, max: u64) -> (u64, usize) {
        let len = (len as u64).div_ceil(4096).max(1) * 4096;
        let (off, len) = Gen::clip(off / 4096 * 4096, len as usize, max / 4096 * 4096);
        (off / 4096 * 4096, len)
    }

    fn back(&mut self, w: &World) -> Back {
        match self.rng.below(10) {
            0..=3 => Back::Same,
            4..=5 => Back::Fresh(Via::Buffered),
            6 | 7 if w.cfg.direct => Back::Fresh(Via::Direct),
            _ if w.cfg.mmap => Back::Fresh(Via::Mmap),
            _ => Back::Fresh(Via::Buffered),
        }
    }

    fn new_len(&mut self, size: u64, max: u64) -> u64 {
        match self.rng.below(10) {
            0..=3 => self.rng.below(size + 1),
            4..=6 => (size + self.rng.below(4 << 20)).min(max),
            7 | 8 => self.rng.below(max),
            _ => size,
        }
    }

    fn data(&mut self, w: &World, v: &View) -> Op {
        let m = &w.m;
        let max = w.cfg.max_size;
        if v.files.is_empty() {
            return Op::Create {
                path: self.new_path(v, true),
                mode: 0o644,
            };
        }
        let slots = Gen::open_slots(w);
        let over_budget = m.total_data() > DATA_BUDGET;
        let weights = [
            8,                                 // open
            2,                                 // close
            if over_budget { 0 } else { 24 },  // write
            if w.cfg.mmap { 5 } else { 0 },    // mmap write
            8,                                 // read via a slot
            8,                                 // read via a path
            if over_budget { 0 } else { 4 },   // append
            if over_budget { 12 } else { 4 },  // truncate
            if over_budget { 12 } else { 4 },  // ftruncate
            5,                                 // fallocate
            4,                                 // copy_file_range
            3,                                 // fsync
            2,                                 // fadvise
            if m.cred.root() { 1 } else { 0 }, // drop_caches
        ];
        let mut k = self.rng.weighted(&self.masked(&weights, DATA_NAMES));
        let slot_op = matches!(k, 1..=4 | 8 | 9..=12);
        if slot_op && slots.is_empty() {
            k = 0;
        }
        let slot = if slots.is_empty() {
            0
        } else {
            *self.rng.pick(&slots)
        };
        let sl = w.slots[slot].clone();
        match k {
            0 => {
                let open_files: Vec<String> = w
                    .slots
                    .iter()
                    .flatten()
                    .filter_map(|s| m.path(s.id))
                    .collect();
                let path = if !open_files.is_empty() && self.rng.pct(60) {
                    self.rng.pick(&open_files).clone()
                } else {
                    self.rng.pick(&v.files).0.clone()
                };
                let trunc = self.rng.pct(12);
                Op::Open {
                    slot: self.rng.below(SLOTS as u64) as usize,
                    path,
                    direct: w.cfg.direct && self.rng.pct(40),
                    trunc,
                    alone: trunc && self.rng.pct(50),
                }
            }
            1 => Op::Close { slot },
            2 | 3 => {
                let s = sl.unwrap();
                let size = m.size(s.id);
                if k == 3 && !s.direct && size > 0 {
                    let off = self.rng.below(size);
                    let len = (self.rng.range(1, 64 << 10)).min(size - off) as usize;
                    return Op::MmapWrite {
                        slot,
                        off,
                        len,
                        seed: self.rng.next_u64(),
                        back: self.back(w),
                    };
                }
                let (off, len) = (self.offset(size, max), self.len());
                let (off, len) = if s.direct {
                    Gen::align(off, len, max)
                } else {
                    Gen::clip(off, len, max)
                };
                Op::Write {
                    slot,
                    off,
                    len,
                    seed: self.rng.next_u64(),
                    back: self.back(w),
                }
            }
            4 => {
                let s = sl.unwrap();
                let size = m.size(s.id);
                let off = self.rng.below(size + 8192);
                let len = self.rng.range(1, 128 << 10) as usize;
                let (off, len) = if s.direct {
                    Gen::align(off, len, max + (1 << 20))
                } else {
                    (off, len)
                };
                Op::ReadSlot { slot, off, len }
            }
            5 => {
                let (path, id) = self.rng.pick(&v.files).clone();
                let size = m.size(id);
                let via = match self.rng.below(3) {
                    0 => Via::Buffered,
                    1 if w.cfg.direct => Via::Direct,
                    _ if w.cfg.mmap => Via::Mmap,
                    _ => Via::Buffered,
                };
                let (off, len) = if self.rng.pct(3) {
                    (0, size as usize + 1)
                } else {
                    (
                        self.rng.below(size + 4096),
                        self.rng.range(1, 512 << 10) as usize,
                    )
                };
                Op::ReadPath {
                    path,
                    via,
                    off,
                    len,
                }
            }
            6 => Op::Append {
                path: self.rng.pick(&v.files).0.clone(),
                len: self.rng.range(1, 16 << 10) as usize,
                seed: self.rng.next_u64(),
                pwrite: self.rng.pct(30),
            },
            7 => {
                let path = if self.rng.pct(5) {
                    self.rng.pick(&v.dirs).0.clone()
                } else {
                    self.rng.pick(&v.files).0.clone()
                };
                let size = m.lookup(&path).map(|id| m.size(id)).unwrap_or(0);
                Op::Truncate {
                    path,
                    len: if over_budget {
                        self.rng.below(1 << 20)
                    } else {
                        self.new_len(size, max)
                    },
                }
            }
            8 => {
                let s = sl.unwrap();
                let size = m.size(s.id);
                Op::Ftruncate {
                    slot,
                    len: if over_budget {
                        self.rng.below(1 << 20)
                    } else {
                        self.new_len(size, max)
                    },
                }
            }
            9 => {
                let s = sl.unwrap();
                let size = m.size(s.id);
                let mode = *self.rng.pick(&[
                    0,
                    libc::FALLOC_FL_KEEP_SIZE,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                ]);
                let off = self.rng.below(size + (1 << 20));
                let len = self.rng.range(1, 2 << 20) as usize;
                let (off, len) = Gen::clip(off, len, max);
                Op::Fallocate {
                    slot,
                    mode,
                    off,
                    len: len as u64,
                }
            }
            10 => {
                let buffered: Vec<usize> = slots
                    .iter()
                    .copied()
                    .filter(|i| !w.slots[*i].as_ref().unwrap().direct)
                    .collect();
                if buffered.is_empty() {
                    return Op::Fsync {
                        slot,
                        data_only: false,
                    };
                }
                let (src, dst) = (*self.rng.pick(&buffered), *self.rng.pick(&buffered));
                let sin = m.size(w.slots[src].as_ref().unwrap().id);
                let sout = m.size(w.slots[dst].as_ref().unwrap().id);
                let off_in = self.rng.below(sin + 4096);
                let off_out = self.offset(sout, max);
                let (off_out, len) = Gen::clip(off_out, self.rng.range(1, 256 << 10) as usize, max);
                Op::CopyRange {
                    src,
                    dst,
                    off_in,
                    off_out,
                    len,
                }
            }
            11 => Op::Fsync {
                slot,
                data_only: self.rng.pct(50),
            },
            12 => Op::Fadvise { slot },
            _ => Op::DropCaches,
        }
    }
}
