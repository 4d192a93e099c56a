//! The operations: each one computes what Linux must answer from the model, performs the
//! system call, compares, applies the change to the model and checks every inode it touched.

use std::collections::{HashMap, HashSet};

use crate::check::{
    self, check_inode, compare_listing, verify_fd, verify_fresh, Check, Div, Fresh, Via,
};
use crate::div;
use crate::model::{Id, Inode, Kind, Model, TimeExp, S_ISGID};
use crate::rng::{pattern, Rng};
use crate::sys::{self, errname, AlignedBuf, Errno, Mapping, PAGE};

pub const SLOTS: usize = 6;

#[derive(Clone, Copy, Debug)]
pub enum TimeArg {
    Now,
    Omit,
    Set(i64, i64),
}

impl TimeArg {
    fn raw(self) -> (i64, i64) {
        match self {
            TimeArg::Now => (0, libc::UTIME_NOW),
            TimeArg::Omit => (0, libc::UTIME_OMIT),
            TimeArg::Set(s, ns) => (s, ns),
        }
    }
}

/// What to read a written range back through: the descriptor written with, or a fresh one.
#[derive(Clone, Copy, Debug)]
pub enum Back {
    Same,
    Fresh(Via),
}

#[derive(Clone, Debug)]
pub enum Op {
    Create {
        path: String,
        mode: u32,
    },
    Mkdir {
        path: String,
        mode: u32,
    },
    Rmdir {
        path: String,
    },
    Unlink {
        path: String,
    },
    Link {
        from: String,
        to: String,
    },
    Symlink {
        target: String,
        path: String,
    },
    Readlink {
        path: String,
    },
    Rename {
        from: String,
        to: String,
        noreplace: bool,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    Chown {
        path: String,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    Utimens {
        path: String,
        atime: TimeArg,
        mtime: TimeArg,
    },
    SetXattr {
        path: String,
        name: String,
        len: usize,
        seed: u64,
        flags: i32,
    },
    GetXattr {
        path: String,
        name: String,
    },
    ListXattr {
        path: String,
    },
    RemoveXattr {
        path: String,
        name: String,
    },
    Stat {
        path: String,
    },
    Readdir {
        path: String,
        bufsize: usize,
    },
    BigDir {
        path: String,
        n: usize,
        bufsize: usize,
        seed: u64,
    },
    /// `alone`: every other descriptor of the file is closed first (a real close and reopen).
    Open {
        slot: usize,
        path: String,
        direct: bool,
        trunc: bool,
        alone: bool,
    },
    Close {
        slot: usize,
    },
    Write {
        slot: usize,
        off: u64,
        len: usize,
        seed: u64,
        back: Back,
    },
    MmapWrite {
        slot: usize,
        off: u64,
        len: usize,
        seed: u64,
        back: Back,
    },
    ReadSlot {
        slot: usize,
        off: u64,
        len: usize,
    },
    ReadPath {
        path: String,
        via: Via,
        off: u64,
        len: usize,
    },
    Append {
        path: String,
        len: usize,
        seed: u64,
        pwrite: bool,
    },
    Truncate {
        path: String,
        len: u64,
    },
    Ftruncate {
        slot: usize,
        len: u64,
    },
    Fallocate {
        slot: usize,
        mode: i32,
        off: u64,
        len: u64,
    },
    CopyRange {
        src: usize,
        dst: usize,
        off_in: u64,
        off_out: u64,
        len: usize,
    },
    Fsync {
        slot: usize,
        data_only: bool,
    },
    Fadvise {
        slot: usize,
    },
    DropCaches,
    VerifyAll {
        content: bool,
    },
    Inject {
        kind: String,
        seed: u64,
    },
}

impl Op {
    /// The paths the operation names.
    pub fn paths(&self) -> Vec<&str> {
        match self {
            Op::Link { from, to } | Op::Rename { from, to, .. } => vec![from, to],
            Op::Create { path, .. }
            | Op::Mkdir { path, .. }
            | Op::Rmdir { path }
            | Op::Unlink { path }
            | Op::Symlink { path, .. }
            | Op::Readlink { path }
            | Op::Chmod { path, .. }
            | Op::Chown { path, .. }
            | Op::Utimens { path, .. }
            | Op::SetXattr { path, .. }
            | Op::GetXattr { path, .. }
            | Op::ListXattr { path }
            | Op::RemoveXattr { path, .. }
            | Op::Stat { path }
            | Op::Readdir { path, .. }
            | Op::Open { path, .. }
            | Op::ReadPath { path, .. }
            | Op::Append { path, .. }
            | Op::Truncate { path, .. } => vec![path],
            _ => vec![],
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Op::Create { .. } => "create",
            Op::Mkdir { .. } => "mkdir",
            Op::Rmdir { .. } => "rmdir",
            Op::Unlink { .. } => "unlink",
            Op::Link { .. } => "link",
            Op::Symlink { .. } => "symlink",
            Op::Readlink { .. } => "readlink",
            Op::Rename { .. } => "rename",
            Op::Chmod { .. } => "chmod",
            Op::Chown { .. } => "chown",
            Op::Utimens { .. } => "utimens",
            Op::SetXattr { .. } => "setxattr",
            Op::GetXattr { .. } => "getxattr",
            Op::ListXattr { .. } => "listxattr",
            Op::RemoveXattr { .. } => "removexattr",
            Op::Stat { .. } => "stat",
            Op::Readdir { .. } => "readdir",
            Op::BigDir { .. } => "bigdir",
            Op::Open { .. } => "open",
            Op::Close { .. } => "close",
            Op::Write { .. } => "write",
            Op::MmapWrite { .. } => "mmap-write",
            Op::ReadSlot { .. } => "read-fd",
            Op::ReadPath { .. } => "read-path",
            Op::Append { .. } => "append",
            Op::Truncate { .. } => "truncate",
            Op::Ftruncate { .. } => "ftruncate",
            Op::Fallocate { .. } => "fallocate",
            Op::CopyRange { .. } => "copy_file_range",
            Op::Fsync { .. } => "fsync",
            Op::Fadvise { .. } => "fadvise",
            Op::DropCaches => "drop_caches",
            Op::VerifyAll { .. } => "verify-all",
            Op::Inject { .. } => "inject",
        }
    }
}

/// An open descriptor of the pool.
#[derive(Clone, Debug)]
pub struct Slot {
    pub fd: i32,
    pub id: Id,
    pub direct: bool,
}

pub struct Config {
    pub slack_ns: i128,
    /// An unlinked file outside the tree for `calibrate`.
    pub clock_fd: i32,
    pub direct: bool,
    pub mmap: bool,
    /// user.* extended attributes (Linux 6.1's tmpfs has none).
    pub xattr: bool,
    pub max_size: u64,
}

pub struct World {
    pub m: Model,
    pub slots: Vec<Option<Slot>>,
    pub cfg: Config,
    pub counts: HashMap<&'static str, u64>,
    pub notes: Vec<String>,
    touched: Vec<Id>,
    /// The inodes the last operation touched, for `--trace`.
    last_touched: Vec<Id>,
    /// The filesystem's clock minus ours, in ns (see `calibrate`).
    pub clock_off: i128,
}

fn want<T: std::fmt::Debug, U: std::fmt::Debug>(
    what: &str,
    exp: &Result<T, Errno>,
    got: &Result<U, Errno>,
) -> Check {
    match (exp, got) {
        (Err(e), Err(g)) if e == g => Ok(()),
        (Ok(_), Ok(_)) => Ok(()),
        (Err(e), Ok(g)) => div!("{what}: succeeded ({g:?}), expected {}", errname(*e)),
        (Ok(_), Err(g)) => div!("{what}: {}, expected success", errname(*g)),
        (Err(e), Err(g)) => div!("{what}: {}, expected {}", errname(*g), errname(*e)),
    }
}

/// An Err(errno) unless `ok`.
fn req(ok: bool, e: Errno) -> Result<(), Errno> {
    if ok {
        Ok(())
    } else {
        Err(e)
    }
}

impl World {
    pub fn new(m: Model, cfg: Config) -> World {
        World {
            m,
            slots: vec![None; SLOTS],
            cfg,
            counts: HashMap::new(),
            notes: Vec::new(),
            touched: Vec::new(),
            last_touched: Vec::new(),
            clock_off: 0,
        }
    }

    fn window(&self, t0: i128, t1: i128) -> TimeExp {
        let off = self.clock_off;
        TimeExp::Window(t0 + off - self.cfg.slack_ns, t1 + off + self.cfg.slack_ns)
    }

    /// How far the filesystem's clock is from ours: write a byte to a probe file outside the
    /// tree (opened, and unlinked, at setup) and read its mtime. A TCG guest's clock can be
    /// seconds off its host's (it jumps during a boot on a loaded machine), and "now" means
    /// the filesystem's now.
    pub fn calibrate(&mut self) -> Result<i128, String> {
        let fd = self.cfg.clock_fd;
        let t0 = sys::now_ns();
        sys::pwrite_all(fd, b"x", 0).map_err(|e| format!("write: {}", errname(e)))?;
        let st = sys::fstat(fd);
        let t1 = sys::now_ns();
        let st = st.map_err(|e| format!("fstat: {}", errname(e)))?;
        let fs = st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128;
        self.clock_off = fs - (t0 + t1) / 2;
        Ok(self.clock_off)
    }

    pub fn fds(&self) -> Vec<(i32, Id)> {
        self.slots.iter().flatten().map(|s| (s.fd, s.id)).collect()
    }

    fn touch(&mut self, id: Id) {
        self.touched.push(id);
    }

    fn slot(&self, i: usize) -> Slot {
        self.slots[i].clone().expect("generator picks open slots")
    }

    /// The parent directory of `rel` and the last component.
    fn parent(&self, rel: &str) -> Result<(Id, String), Errno> {
        let (p, name) = Model::split(rel);
        let pid = self.m.lookup(p)?;
        if !self.m.get(pid).is_dir() {
            return Err(libc::ENOTDIR);
        }
        Ok((pid, name.to_string()))
    }

    fn child(&self, pid: Id, name: &str) -> Option<Id> {
        self.m.get(pid).entries().get(name).copied()
    }

    fn dir_w(&self, pid: Id) -> bool {
        self.m.access(pid, 3)
    }

    /// The model's ids of the inodes the last operation touched.
    pub fn last_touched(&self) -> &[Id] {
        &self.last_touched
    }

    pub fn run(&mut self, op: &Op) -> Check {
        *self.counts.entry(op.name()).or_default() += 1;
        self.touched.clear();
        self.exec(op)?;
        let mut t = std::mem::take(&mut self.touched);
        t.sort();
        t.dedup();
        self.last_touched.clone_from(&t);
        let fds = self.fds();
        for (i, &id) in t.iter().enumerate() {
            if let Err(d) = check_inode(&mut self.m, id, &fds) {
                return self.recheck_after_clock_move(d, &t[i..], &fds);
            }
        }
        Ok(())
    }

    /// A check failed: probe the clock again. A TCG guest's clock can stall for seconds
    /// against its host's on a loaded machine; when it moved since the last probe, the
    /// op's "now" windows are widened by the move and the inodes checked again. The move is
    /// noted either way; a divergence that stands says what the clock did.
    fn recheck_after_clock_move(&mut self, d: Div, ids: &[Id], fds: &[(i32, Id)]) -> Check {
        let before = self.clock_off;
        let moved = match self.calibrate() {
            Ok(off) => off - before,
            Err(e) => return Err(Div(format!("{} (clock probe after it: {e})", d.0))),
        };
        let clock = format!(
            "the filesystem's clock is {:.3} s from the guest's, {:.3} s at the last probe",
            self.clock_off as f64 / 1e9,
            before as f64 / 1e9
        );
        if moved.abs() <= self.cfg.slack_ns / 2 {
            return Err(Div(format!("{} ({clock})", d.0)));
        }
        for &id in ids {
            if self.m.live(id) {
                let n = self.m.get_mut(id);
                n.mtime = n.mtime.widen(moved);
                n.ctime = n.ctime.widen(moved);
            }
        }
        for &id in ids {
            check_inode(&mut self.m, id, fds).map_err(|d2| {
                Div(format!(
                    "{} ({clock}; checked again with that: {})",
                    d.0, d2.0
                ))
            })?;
        }
        self.notes.push(format!(
            "the guest's clock moved {:.3} s against the filesystem's: {clock}; this op's \
             \"now\" widened by that (first check said: {})",
            moved as f64 / 1e9,
            d.0
        ));
        Ok(())
    }

    fn exec(&mut self, op: &Op) -> Check {
        match op {
            Op::Create { path, mode } => self.create(path, *mode),
            Op::Mkdir { path, mode } => self.mkdir(path, *mode),
            Op::Rmdir { path } => self.rmdir(path),
            Op::Unlink { path } => self.unlink(path),
            Op::Link { from, to } => self.link(from, to),
            Op::Symlink { target, path } => self.symlink(target, path),
            Op::Readlink { path } => self.readlink(path),
            Op::Rename {
                from,
                to,
                noreplace,
            } => self.rename(from, to, *noreplace),
            Op::Chmod { path, mode } => self.chmod(path, *mode),
            Op::Chown { path, uid, gid } => self.chown(path, *uid, *gid),
            Op::Utimens { path, atime, mtime } => self.utimens(path, *atime, *mtime),
            Op::SetXattr {
                path,
                name,
                len,
                seed,
                flags,
            } => self.setxattr(path, name, *len, *seed, *flags),
            Op::GetXattr { path, name } => self.getxattr(path, name),
            Op::ListXattr { path } => self.listxattr(path),
            Op::RemoveXattr { path, name } => self.removexattr(path, name),
            Op::Stat { path } => self.stat(path),
            Op::Readdir { path, bufsize } => {
                let id = self.m.lookup(path).expect("generator picks a directory");
                check::check_listing(&self.m, id, path, *bufsize)?;
                self.touch(id);
                Ok(())
            }
            Op::BigDir {
                path,
                n,
                bufsize,
                seed,
            } => self.bigdir(path, *n, *bufsize, *seed),
            Op::Open {
                slot,
                path,
                direct,
                trunc,
                alone,
            } => {
                if *alone {
                    if let Ok(id) = self.m.lookup(path) {
                        for i in 0..SLOTS {
                            if self.slots[i].as_ref().is_some_and(|s| s.id == id) {
                                self.close_slot(i)?;
                            }
                        }
                    }
                }
                // Half the real reopens are what a shell's `>` does: O_CREAT|O_TRUNC on the
                // existing file (derived from the slot: the sequence of operations stays).
                self.open(*slot, path, *direct, *trunc, *alone && *slot % 2 == 0)
            }
            Op::Close { slot } => self.close_slot(*slot),
            Op::Write {
                slot,
                off,
                len,
                seed,
                back,
            } => self.write(*slot, *off, *len, *seed, *back),
            Op::MmapWrite {
                slot,
                off,
                len,
                seed,
                back,
            } => self.mmap_write(*slot, *off, *len, *seed, *back),
            Op::ReadSlot { slot, off, len } => {
                let s = self.slot(*slot);
                verify_fd(
                    &self.m,
                    s.id,
                    s.fd,
                    s.direct,
                    *off,
                    *len,
                    &format!(
                        "read through slot {slot}{}",
                        if s.direct { " (O_DIRECT)" } else { "" }
                    ),
                )?;
                self.touch(s.id);
                Ok(())
            }
            Op::ReadPath {
                path,
                via,
                off,
                len,
            } => self.read_path(path, *via, *off, *len),
            Op::Append {
                path,
                len,
                seed,
                pwrite,
            } => self.append(path, *len, *seed, *pwrite),
            Op::Truncate { path, len } => self.truncate(path, *len),
            Op::Ftruncate { slot, len } => self.ftruncate(*slot, *len),
            Op::Fallocate {
                slot,
                mode,
                off,
                len,
            } => self.fallocate(*slot, *mode, *off, *len),
            Op::CopyRange {
                src,
                dst,
                off_in,
                off_out,
                len,
            } => self.copy_range(*src, *dst, *off_in, *off_out, *len),
            Op::Fsync { slot, data_only } => {
                let s = self.slot(*slot);
                let r = sys::fsync(s.fd, *data_only);
                want(if *data_only { "fdatasync" } else { "fsync" }, &Ok(()), &r)?;
                self.touch(s.id);
                Ok(())
            }
            Op::Fadvise { slot } => {
                let s = self.slot(*slot);
                want(
                    "posix_fadvise(DONTNEED)",
                    &Ok(()),
                    &sys::fadvise_dontneed(s.fd),
                )?;
                self.touch(s.id);
                Ok(())
            }
            Op::DropCaches => want("drop_caches", &Ok(()), &sys::drop_caches()),
            Op::VerifyAll { content } => {
                let fds = self.fds();
                check::verify_all(&mut self.m, &fds, *content)?;
                let before = self.clock_off;
                match self.calibrate() {
                    Ok(off) if (off - before).abs() > self.cfg.slack_ns / 2 => {
                        self.notes.push(format!(
                            "the filesystem's clock is {:.3} s from the guest's (was {:.3} s)",
                            off as f64 / 1e9,
                            before as f64 / 1e9
                        ))
                    }
                    Ok(_) => {}
                    Err(e) => div!("clock probe: {e}"),
                }
                Ok(())
            }
            Op::Inject { .. } => Ok(()),
        }
    }

    // ---- metadata -------------------------------------------------------------------------

    fn create(&mut self, path: &str, mode: u32) -> Check {
        let exp = self.parent(path).and_then(|(pid, name)| {
            req(self.child(pid, &name).is_none(), libc::EEXIST)?;
            req(self.dir_w(pid), libc::EACCES)?;
            Ok((pid, name))
        });
        let t0 = sys::now_ns();
        let r = sys::open(
            &self.m.real(path),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
            mode,
        );
        let t1 = sys::now_ns();
        want(&format!("open({path}, O_CREAT|O_EXCL, {mode:o})"), &exp, &r)?;
        if let Ok(fd) = r {
            want("close of the new file", &Ok(()), &sys::close(fd))?;
        }
        if let Ok((pid, name)) = exp {
            let w = self.window(t0, t1);
            let (uid, gid, _) = self.m.new_owner(pid, false);
            let id = self.m.alloc(Inode::new(
                Kind::File(Default::default()),
                mode & 0o7777,
                uid,
                gid,
                w,
            ));
            self.m.add_entry(pid, &name, id);
            self.m.get_mut(pid).set_times(true, true, w);
            self.touch(id);
            self.touch(pid);
        }
        Ok(())
    }

    fn mkdir(&mut self, path: &str, mode: u32) -> Check {
        let exp = self.parent(path).and_then(|(pid, name)| {
            req(self.child(pid, &name).is_none(), libc::EEXIST)?;
            req(self.dir_w(pid), libc::EACCES)?;
            Ok((pid, name))
        });
        let t0 = sys::now_ns();
        let r = sys::mkdir(&self.m.real(path), mode);
        let t1 = sys::now_ns();
        want(&format!("mkdir({path}, {mode:o})"), &exp, &r)?;
        if let Ok((pid, name)) = exp {
            let w = self.window(t0, t1);
            let (uid, gid, extra) = self.m.new_owner(pid, true);
            let id = self.m.alloc(Inode::new(
                Kind::Dir(Default::default()),
                (mode & 0o1777) | extra,
                uid,
                gid,
                w,
            ));
            self.m.add_entry(pid, &name, id);
            self.m.get_mut(pid).set_times(true, true, w);
            self.touch(id);
            self.touch(pid);
        }
        Ok(())
    }

    fn rmdir(&mut self, path: &str) -> Check {
        let exp = self.parent(path).and_then(|(pid, name)| {
            let id = self.child(pid, &name).ok_or(libc::ENOENT)?;
            req(self.dir_w(pid), libc::EACCES)?;
            let n = self.m.get(id);
            req(n.is_dir(), libc::ENOTDIR)?;
            req(n.entries().is_empty(), libc::ENOTEMPTY)?;
            Ok((pid, name))
        });
        let t0 = sys::now_ns();
        let r = sys::rmdir(&self.m.real(path));
        let t1 = sys::now_ns();
        want(&format!("rmdir({path})"), &exp, &r)?;
        if let Ok((pid, name)) = exp {
            let w = self.window(t0, t1);
            self.m.remove_entry(pid, &name);
            self.m.get_mut(pid).set_times(true, true, w);
            self.touch(pid);
        }
        Ok(())
    }

    fn unlink(&mut self, path: &str) -> Check {
        let exp = self.parent(path).and_then(|(pid, name)| {
            let id = self.child(pid, &name).ok_or(libc::ENOENT)?;
            req(self.dir_w(pid), libc::EACCES)?;
            req(!self.m.get(id).is_dir(), libc::EISDIR)?;
            Ok((pid, name))
        });
        let t0 = sys::now_ns();
        let r = sys::unlink(&self.m.real(path));
        let t1 = sys::now_ns();
        want(&format!("unlink({path})"), &exp, &r)?;
        if let Ok((pid, name)) = exp {
            let w = self.window(t0, t1);
            let id = self.m.remove_entry(pid, &name);
            if self.m.live(id) {
                self.m.get_mut(id).ctime = w;
                self.touch(id);
            }
            self.m.get_mut(pid).set_times(true, true, w);
            self.touch(pid);
        }
        Ok(())
    }

    fn link(&mut self, from: &str, to: &str) -> Check {
        let exp = self.m.lookup(from).and_then(|src| {
            let (pid, name) = self.parent(to)?;
            req(self.child(pid, &name).is_none(), libc::EEXIST)?;
            req(self.m.may_link(src), libc::EPERM)?;
            req(self.dir_w(pid), libc::EACCES)?;
            req(!self.m.get(src).is_dir(), libc::EPERM)?;
            Ok((src, pid, name))
        });
        let t0 = sys::now_ns();
        let r = sys::link(&self.m.real(from), &self.m.real(to));
        let t1 = sys::now_ns();
        want(&format!("link({from}, {to})"), &exp, &r)?;
        if let Ok((src, pid, name)) = exp {
            let w = self.window(t0, t1);
            self.m.add_entry(pid, &name, src);
            self.m.get_mut(src).ctime = w;
            self.m.get_mut(pid).set_times(true, true, w);
            self.touch(src);
            self.touch(pid);
        }
        Ok(())
    }

    fn symlink(&mut self, target: &str, path: &str) -> Check {
        let exp = self.parent(path).and_then(|(pid, name)| {
            req(self.child(pid, &name).is_none(), libc::EEXIST)?;
            req(self.dir_w(pid), libc::EACCES)?;
            Ok((pid, name))
        });
        let t0 = sys::now_ns();
        let r = sys::symlink(target, &self.m.real(path));
        let t1 = sys::now_ns();
        want(&format!("symlink({target}, {path})"), &exp, &r)?;
        if let Ok((pid, name)) = exp {
            let w = self.window(t0, t1);
            let (uid, gid, _) = self.m.new_owner(pid, false);
            let id = self.m.alloc(Inode::new(
                Kind::Symlink(target.to_string()),
                0o777,
                uid,
                gid,
                w,
            ));
            self.m.add_entry(pid, &name, id);
            self.m.get_mut(pid).set_times(true, true, w);
            self.touch(id);
            self.touch(pid);
        }
        Ok(())
    }

    fn readlink(&mut self, path: &str) -> Check {
        let exp = self
            .m
            .lookup(path)
            .and_then(|id| match &self.m.get(id).kind {
                Kind::Symlink(t) => Ok(t.clone()),
                _ => Err(libc::EINVAL),
            });
        let r = sys::readlink(&self.m.real(path));
        want(&format!("readlink({path})"), &exp, &r)?;
        if let (Ok(e), Ok(g)) = (&exp, &r) {
            if e != g {
                div!("readlink({path}): \"{g}\", expected \"{e}\"");
            }
        }
        Ok(())
    }

    fn rename(&mut self, from: &str, to: &str, noreplace: bool) -> Check {
        // The order of checks is do_renameat2's and vfs_rename's.
        let exp = (|| {
            let (sp, sname) = self.parent(from)?;
            let (dp, dname) = self.parent(to)?;
            let src = self.child(sp, &sname).ok_or(libc::ENOENT)?;
            let dst = self.child(dp, &dname);
            if noreplace && dst.is_some() {
                return Err(libc::EEXIST);
            }
            if sp != dp {
                // lock_rename's trap: the source may not be an ancestor of the new parent, the
                // target may not be an ancestor of the old parent.
                if self.m.get(src).is_dir() && self.m.ancestor_or_self(src, dp) {
                    return Err(libc::EINVAL);
                }
                if let Some(d) = dst {
                    if self.m.get(d).is_dir() && self.m.ancestor_or_self(d, sp) {
                        return Err(libc::ENOTEMPTY);
                    }
                }
            }
            if dst == Some(src) {
                return Ok(None);
            }
            req(self.dir_w(sp), libc::EACCES)?;
            req(self.dir_w(dp), libc::EACCES)?;
            let src_dir = self.m.get(src).is_dir();
            if let Some(d) = dst {
                let dn = self.m.get(d);
                if src_dir && !dn.is_dir() {
                    return Err(libc::ENOTDIR);
                }
                if !src_dir && dn.is_dir() {
                    return Err(libc::EISDIR);
                }
            }
            if src_dir && sp != dp {
                req(self.m.access(src, 2), libc::EACCES)?;
            }
            if let Some(d) = dst {
                let dn = self.m.get(d);
                if dn.is_dir() && !dn.entries().is_empty() {
                    return Err(libc::ENOTEMPTY);
                }
            }
            Ok(Some((sp, sname, dp, dname, src)))
        })();
        let t0 = sys::now_ns();
        let flags = if noreplace { sys::RENAME_NOREPLACE } else { 0 };
        let r = sys::rename2(&self.m.real(from), &self.m.real(to), flags);
        let t1 = sys::now_ns();
        want(
            &format!(
                "renameat2({from}, {to}{})",
                if noreplace { ", RENAME_NOREPLACE" } else { "" }
            ),
            &exp,
            &r,
        )?;
        if let Ok(Some((sp, sname, dp, dname, src))) = exp {
            let w = self.window(t0, t1);
            if self.child(dp, &dname).is_some() {
                let victim = self.m.remove_entry(dp, &dname);
                if self.m.live(victim) {
                    self.m.get_mut(victim).ctime = w;
                    self.touch(victim);
                }
            }
            self.m.add_entry(dp, &dname, src);
            self.m.remove_entry(sp, &sname);
            let n = self.m.get_mut(src);
            n.ctime = w;
            if n.is_dir() && sp != dp {
                // ".." changes: some filesystems move the directory's mtime too.
                n.mtime = n.mtime.old_or(w);
            }
            self.m.get_mut(sp).set_times(true, true, w);
            self.m.get_mut(dp).set_times(true, true, w);
            self.touch(src);
            self.touch(sp);
            self.touch(dp);
        }
        Ok(())
    }

    fn chmod(&mut self, path: &str, mode: u32) -> Check {
        let exp = self.m.lookup(path).and_then(|id| {
            req(self.m.owner_or_root(id), libc::EPERM)?;
            Ok(id)
        });
        let t0 = sys::now_ns();
        let r = sys::chmod(&self.m.real(path), mode);
        let t1 = sys::now_ns();
        want(&format!("chmod({path}, {mode:04o})"), &exp, &r)?;
        if let Ok(id) = exp {
            let w = self.window(t0, t1);
            let root = self.m.cred.root();
            let in_group = self.m.cred.in_group(self.m.get(id).gid);
            let n = self.m.get_mut(id);
            n.mode = mode & 0o7777;
            if !root && !in_group {
                // setattr_prepare: a caller outside the file's group cannot set setgid.
                n.mode &= !S_ISGID;
            }
            n.ctime = w;
            self.touch(id);
        }
        Ok(())
    }

    fn chown(&mut self, path: &str, uid: Option<u32>, gid: Option<u32>) -> Check {
        let exp = self.m.lookup(path).and_then(|id| {
            if !self.m.cred.root() {
                // setattr_prepare's chown_ok and chgrp_ok.
                let n = self.m.get(id);
                let c = &self.m.cred;
                let owner = n.uid == c.uid;
                if let Some(u) = uid {
                    req(owner && u == n.uid, libc::EPERM)?;
                }
                if let Some(g) = gid {
                    req(owner && (g == n.gid || c.in_group(g)), libc::EPERM)?;
                }
            }
            Ok(id)
        });
        let t0 = sys::now_ns();
        let r = sys::lchown(&self.m.real(path), uid, gid);
        let t1 = sys::now_ns();
        want(&format!("lchown({path}, {uid:?}, {gid:?})"), &exp, &r)?;
        if let Ok(id) = exp {
            let w = self.window(t0, t1);
            self.m.kill_on_chown(id);
            let n = self.m.get_mut(id);
            if let Some(u) = uid {
                n.uid = u;
            }
            if let Some(g) = gid {
                n.gid = g;
            }
            n.ctime = w;
            self.touch(id);
        }
        Ok(())
    }

    fn utimens(&mut self, path: &str, atime: TimeArg, mtime: TimeArg) -> Check {
        let both_now = matches!((atime, mtime), (TimeArg::Now, TimeArg::Now));
        let exp = self.m.lookup(path).and_then(|id| {
            if !self.m.owner_or_root(id) {
                if both_now {
                    req(self.m.access(id, 2), libc::EACCES)?;
                } else {
                    return Err(libc::EPERM);
                }
            }
            Ok(id)
        });
        let t0 = sys::now_ns();
        let r = sys::utimens(&self.m.real(path), [atime.raw(), mtime.raw()]);
        let t1 = sys::now_ns();
        want(
            &format!("utimensat({path}, {atime:?}, {mtime:?})"),
            &exp,
            &r,
        )?;
        if let Ok(id) = exp {
            let w = self.window(t0, t1);
            let n = self.m.get_mut(id);
            match mtime {
                TimeArg::Now => n.mtime = w,
                TimeArg::Set(s, ns) => {
                    n.mtime = TimeExp::Known(s as i128 * 1_000_000_000 + ns as i128)
                }
                TimeArg::Omit => {}
            }
            n.ctime = w;
            self.touch(id);
        }
        Ok(())
    }

    fn xattr_target(&self, path: &str, write: bool) -> Result<Id, Errno> {
        let id = self.m.lookup(path)?;
        let n = self.m.get(id);
        if n.is_symlink() {
            return Err(if write { libc::EPERM } else { libc::ENODATA });
        }
        req(self.m.access(id, if write { 2 } else { 4 }), libc::EACCES)?;
        Ok(id)
    }

    fn setxattr(&mut self, path: &str, name: &str, len: usize, seed: u64, flags: i32) -> Check {
        let val = pattern(seed, len);
        let exp = self.xattr_target(path, true).and_then(|id| {
            let has = self.m.get(id).xattrs.contains_key(name);
            if flags == libc::XATTR_CREATE && has {
                return Err(libc::EEXIST);
            }
            if flags == libc::XATTR_REPLACE && !has {
                return Err(libc::ENODATA);
            }
            Ok(id)
        });
        let t0 = sys::now_ns();
        let r = sys::setxattr(&self.m.real(path), name, &val, flags);
        let t1 = sys::now_ns();
        want(
            &format!("lsetxattr({path}, {name}, {len} bytes, flags {flags})"),
            &exp,
            &r,
        )?;
        if let Ok(id) = exp {
            let w = self.window(t0, t1);
            let n = self.m.get_mut(id);
            n.xattrs.insert(name.to_string(), val);
            n.ctime = w;
            self.touch(id);
        }
        Ok(())
    }

    fn getxattr(&mut self, path: &str, name: &str) -> Check {
        let exp = self.xattr_target(path, false).and_then(|id| {
            self.m
                .get(id)
                .xattrs
                .get(name)
                .cloned()
                .ok_or(libc::ENODATA)
        });
        let r = sys::getxattr(&self.m.real(path), name);
        want(
            &format!("lgetxattr({path}, {name})"),
            &exp.as_ref().map(|v| v.len()).map_err(|e| *e),
            &r.as_ref().map(|v| v.len()).map_err(|e| *e),
        )?;
        if let (Ok(e), Ok(g)) = (&exp, &r) {
            check::compare_bytes(&format!("value of xattr {name} of {path}"), e, g, 0)?;
        }
        Ok(())
    }

    fn listxattr(&mut self, path: &str) -> Check {
        let exp = self
            .m
            .lookup(path)
            .map(|id| self.m.get(id).xattrs.keys().cloned().collect::<Vec<_>>());
        let r = sys::listxattr(&self.m.real(path));
        want(&format!("llistxattr({path})"), &exp, &r)?;
        if let (Ok(e), Ok(g)) = (exp, r) {
            let mut g: Vec<String> = g.into_iter().filter(|n| n.starts_with("user.")).collect();
            g.sort();
            if e != g {
                div!("llistxattr({path}): user.* names {g:?}, expected {e:?}");
            }
        }
        Ok(())
    }

    fn removexattr(&mut self, path: &str, name: &str) -> Check {
        let exp = self.xattr_target(path, true).and_then(|id| {
            req(self.m.get(id).xattrs.contains_key(name), libc::ENODATA)?;
            Ok(id)
        });
        let t0 = sys::now_ns();
        let r = sys::removexattr(&self.m.real(path), name);
        let t1 = sys::now_ns();
        want(&format!("lremovexattr({path}, {name})"), &exp, &r)?;
        if let Ok(id) = exp {
            let w = self.window(t0, t1);
            let n = self.m.get_mut(id);
            n.xattrs.remove(name);
            n.ctime = w;
            self.touch(id);
        }
        Ok(())
    }

    fn stat(&mut self, path: &str) -> Check {
        let exp = self.m.lookup(path);
        let r = sys::lstat(&self.m.real(path));
        want(&format!("lstat({path})"), &exp, &r.map(|_| ()))?;
        if let Ok(id) = exp {
            self.touch(id);
        }
        Ok(())
    }

    /// A directory of `n` entries read with getdents64 while entries are unlinked between
    /// the calls: each entry not unlinked must come exactly once, an unlinked one at most once.
    fn bigdir(&mut self, path: &str, n: usize, bufsize: usize, seed: u64) -> Check {
        let mut rng = Rng::new(seed);
        self.mkdir(path, 0o755)?;
        let did = match self.m.lookup(path) {
            Ok(id) => id,
            Err(_) => return Ok(()),
        };
        for i in 0..n {
            self.create(&format!("{path}/e{i:04}"), 0o644)?;
        }
        self.touched.clear();
        check_inode(&mut self.m, did, &[])?;
        let fd = match sys::open(&self.m.real(path), libc::O_RDONLY | libc::O_DIRECTORY, 0) {
            Ok(fd) => fd,
            Err(e) => div!("opendir {path}: {}", errname(e)),
        };
        let mut seen: HashMap<String, (u32, u64, u8)> = HashMap::new();
        let mut removed: HashSet<String> = HashSet::new();
        let res = loop {
            let batch = match sys::getdents(fd, bufsize) {
                Ok(b) => b,
                Err(e) => break Err(Div(format!("getdents {path}: {}", errname(e)))),
            };
            if batch.is_empty() {
                break Ok(());
            }
            for d in batch {
                let e = seen.entry(d.name).or_insert((0, d.ino, d.dtype));
                e.0 += 1;
            }
            // Unlink a few entries, seen or not yet seen.
            let names: Vec<String> = self.m.get(did).entries().keys().cloned().collect();
            let k = rng.below(6) as usize;
            for _ in 0..k.min(names.len()) {
                let name = rng.pick(&names).clone();
                if removed.contains(&name) {
                    continue;
                }
                if let Err(d) = self.unlink(&format!("{path}/{name}")) {
                    let _ = sys::close(fd);
                    return Err(d);
                }
                removed.insert(name);
            }
        };
        let _ = sys::close(fd);
        res?;
        compare_listing(&self.m, did, path, &seen, &removed)?;
        check::check_listing(&self.m, did, path, 1024)?;
        // Leave the tree small again.
        let names: Vec<String> = self.m.get(did).entries().keys().cloned().collect();
        for name in names {
            self.unlink(&format!("{path}/{name}"))?;
        }
        self.rmdir(path)?;
        let root = self.m.root;
        let pid = self.m.lookup(Model::split(path).0).unwrap_or(root);
        self.touched.clear();
        self.touch(pid);
        Ok(())
    }

    // ---- data -----------------------------------------------------------------------------

    fn close_slot(&mut self, slot: usize) -> Check {
        if let Some(s) = self.slots[slot].take() {
            let r = sys::close(s.fd);
            want(&format!("close(slot {slot})"), &Ok(()), &r)?;
            self.m.get_mut(s.id).open -= 1;
            self.m.maybe_free(s.id);
            if self.m.live(s.id) {
                self.touch(s.id);
            }
        }
        Ok(())
    }

    fn open(&mut self, slot: usize, path: &str, direct: bool, trunc: bool, creat: bool) -> Check {
        self.close_slot(slot)?;
        let exp = self.m.lookup(path).and_then(|id| {
            req(!self.m.get(id).is_dir(), libc::EISDIR)?;
            req(self.m.access(id, 6), libc::EACCES)?;
            Ok(id)
        });
        // O_CREAT only on a file the model has (it exists).
        let creat = creat && exp.is_ok();
        let flags = libc::O_RDWR
            | if direct { libc::O_DIRECT } else { 0 }
            | if trunc { libc::O_TRUNC } else { 0 }
            | if creat { libc::O_CREAT } else { 0 };
        let t0 = sys::now_ns();
        let r = sys::open(&self.m.real(path), flags, 0o644);
        let t1 = sys::now_ns();
        want(
            &format!(
                "open({path}, O_RDWR{}{}{})",
                if direct { "|O_DIRECT" } else { "" },
                if trunc { "|O_TRUNC" } else { "" },
                if creat { "|O_CREAT" } else { "" }
            ),
            &exp,
            &r,
        )?;
        if let (Ok(id), Ok(fd)) = (exp, r) {
            self.slots[slot] = Some(Slot { fd, id, direct });
            self.m.get_mut(id).open += 1;
            if trunc {
                let w = self.window(t0, t1);
                let was_empty = self.m.size(id) == 0;
                self.m.kill_on_write(id);
                let n = self.m.get_mut(id);
                n.data_mut().truncate(0);
                if was_empty {
                    n.mtime = n.mtime.old_or(w);
                    n.ctime = n.ctime.old_or(w);
                } else {
                    n.set_times(true, true, w);
                }
            }
            self.touch(id);
        }
        Ok(())
    }

    fn apply_write(&mut self, id: Id, off: u64, bytes: &[u8], w: TimeExp) {
        if bytes.is_empty() {
            return;
        }
        self.m.kill_on_write(id);
        let n = self.m.get_mut(id);
        n.data_mut().write(off, bytes);
        n.set_times(true, true, w);
    }

    /// Read back what was just written (a little around it too).
    fn read_back(&mut self, s: &Slot, off: u64, len: usize, back: Back) -> Check {
        let lo = off.saturating_sub(512);
        let hi = off + len as u64 + 512;
        match back {
            Back::Same => verify_fd(
                &self.m,
                s.id,
                s.fd,
                s.direct,
                lo,
                (hi - lo) as usize,
                "read back through the same descriptor",
            ),
            Back::Fresh(via) => {
                let Some(p) = self.m.path(s.id) else {
                    return verify_fd(
                        &self.m,
                        s.id,
                        s.fd,
                        s.direct,
                        lo,
                        (hi - lo) as usize,
                        "read back",
                    );
                };
                if !self.m.access(s.id, 4)
                    || (via == Via::Mmap && !self.cfg.mmap)
                    || (via == Via::Direct && !self.cfg.direct)
                {
                    return verify_fd(
                        &self.m,
                        s.id,
                        s.fd,
                        s.direct,
                        lo,
                        (hi - lo) as usize,
                        "read back",
                    );
                }
                if let Fresh::NoMmap(e) =
                    verify_fresh(&self.m, s.id, &p, via, lo, (hi - lo) as usize)?
                {
                    self.no_mmap(e);
                }
                Ok(())
            }
        }
    }

    fn no_mmap(&mut self, e: Errno) {
        if self.cfg.mmap {
            self.cfg.mmap = false;
            self.notes.push(format!(
                "mmap refused with {} (FOPEN_DIRECT_IO on this kernel): mmap ops off",
                errname(e)
            ));
        }
    }

    fn write(&mut self, slot: usize, off: u64, len: usize, seed: u64, back: Back) -> Check {
        let s = self.slot(slot);
        let data = pattern(seed, len);
        let t0 = sys::now_ns();
        let r = if s.direct {
            let mut b = AlignedBuf::new(len);
            b.as_mut_slice().copy_from_slice(&data);
            sys::pwrite_all(s.fd, b.as_slice(), off)
        } else {
            sys::pwrite_all(s.fd, &data, off)
        };
        let t1 = sys::now_ns();
        let what = format!(
            "pwrite(slot {slot}{}, {off}, {len})",
            if s.direct { " O_DIRECT" } else { "" }
        );
        want(&what, &Ok(len), &r)?;
        if r != Ok(len) {
            div!("{what}: wrote {r:?}, expected {len}");
        }
        let w = self.window(t0, t1);
        self.apply_write(s.id, off, &data, w);
        self.touch(s.id);
        self.read_back(&s, off, len, back)
    }

    fn mmap_write(&mut self, slot: usize, off: u64, len: usize, seed: u64, back: Back) -> Check {
        let s = self.slot(slot);
        let data = pattern(seed, len);
        let start = off / PAGE * PAGE;
        let t0 = sys::now_ns();
        let mut map = match Mapping::new(s.fd, start, (off + len as u64 - start) as usize, true) {
            Ok(m) => m,
            Err(e) if e == libc::ENODEV => {
                self.no_mmap(e);
                return Ok(());
            }
            Err(e) => div!("mmap(MAP_SHARED, slot {slot}, {start}): {}", errname(e)),
        };
        map.as_mut_slice()[(off - start) as usize..].copy_from_slice(&data);
        let r = map.msync();
        drop(map);
        let t1 = sys::now_ns();
        want(&format!("msync(slot {slot}, {off}, {len})"), &Ok(()), &r)?;
        let w = self.window(t0, t1);
        // Page-fault writes move mtime on most filesystems, not on tmpfs.
        let (mt, ct) = {
            let n = self.m.get(s.id);
            (n.mtime.old_or(w), n.ctime.old_or(w))
        };
        // Linux kills no setuid/setgid on a page-fault write; a filesystem that kills them when
        // the dirty pages reach it (CephFS does, for writes by non-root) errs on the safe side.
        self.m.maybe_kill_on_write(s.id);
        let n = self.m.get_mut(s.id);
        if let Some(killed) = n.mode_alt.take() {
            n.mode_alt = Some(n.mode);
            n.mode = killed;
        }
        n.data_mut().write(off, &data);
        n.mtime = mt;
        n.ctime = ct;
        self.touch(s.id);
        self.read_back(&s, off, len, back)
    }

    fn read_path(&mut self, path: &str, via: Via, off: u64, len: usize) -> Check {
        let exp = self.m.lookup(path).and_then(|id| {
            req(self.m.access(id, 4), libc::EACCES)?;
            Ok(id)
        });
        match exp {
            Err(e) => {
                let r = sys::open(&self.m.real(path), libc::O_RDONLY, 0);
                if let Ok(fd) = r {
                    let _ = sys::close(fd);
                }
                want(&format!("open({path}, O_RDONLY)"), &Err::<(), _>(e), &r)
            }
            Ok(id) => {
                if let Fresh::NoMmap(e) = verify_fresh(&self.m, id, path, via, off, len)? {
                    self.no_mmap(e);
                }
                self.touch(id);
                Ok(())
            }
        }
    }

    fn append(&mut self, path: &str, len: usize, seed: u64, pwrite: bool) -> Check {
        let exp = self.m.lookup(path).and_then(|id| {
            req(self.m.access(id, 2), libc::EACCES)?;
            Ok(id)
        });
        let data = pattern(seed, len);
        let t0 = sys::now_ns();
        let r = sys::open(&self.m.real(path), libc::O_WRONLY | libc::O_APPEND, 0);
        want(&format!("open({path}, O_WRONLY|O_APPEND)"), &exp, &r)?;
        let (Ok(id), Ok(fd)) = (exp, r) else {
            return Ok(());
        };
        // pwrite on an O_APPEND descriptor appends on Linux, whatever the offset.
        let wr = if pwrite {
            sys::pwrite_once(fd, &data, 0)
        } else {
            sys::write_all(fd, &data)
        };
        let cr = sys::close(fd);
        let t1 = sys::now_ns();
        want(
            &format!(
                "{}(O_APPEND, {len})",
                if pwrite { "pwrite" } else { "write" }
            ),
            &Ok(len),
            &wr,
        )?;
        if wr != Ok(len) {
            div!("append to {path}: wrote {wr:?}, expected {len}");
        }
        want("close", &Ok(()), &cr)?;
        let off = self.m.size(id);
        let w = self.window(t0, t1);
        self.apply_write(id, off, &data, w);
        self.touch(id);
        verify_fresh(
            &self.m,
            id,
            path,
            Via::Buffered,
            off.saturating_sub(100),
            len + 200,
        )
        .map(|_| ())
    }

    fn apply_truncate(&mut self, id: Id, len: u64, w: TimeExp) {
        let old = self.m.size(id);
        self.m.kill_on_write(id);
        let n = self.m.get_mut(id);
        n.data_mut().truncate(len);
        if old == len {
            n.mtime = n.mtime.old_or(w);
            n.ctime = n.ctime.old_or(w);
        } else {
            n.set_times(true, true, w);
        }
    }

    fn truncate(&mut self, path: &str, len: u64) -> Check {
        let exp = self.m.lookup(path).and_then(|id| {
            req(!self.m.get(id).is_dir(), libc::EISDIR)?;
            req(self.m.access(id, 2), libc::EACCES)?;
            Ok(id)
        });
        let t0 = sys::now_ns();
        let r = sys::truncate(&self.m.real(path), len);
        let t1 = sys::now_ns();
        want(&format!("truncate({path}, {len})"), &exp, &r)?;
        if let Ok(id) = exp {
            let w = self.window(t0, t1);
            let old = self.m.size(id);
            self.apply_truncate(id, len, w);
            self.touch(id);
            let lo = old.min(len).saturating_sub(4096);
            verify_fresh(&self.m, id, path, Via::Buffered, lo, 8192 + 1).map(|_| ())?;
        }
        Ok(())
    }

    fn ftruncate(&mut self, slot: usize, len: u64) -> Check {
        let s = self.slot(slot);
        let t0 = sys::now_ns();
        let r = sys::ftruncate(s.fd, len);
        let t1 = sys::now_ns();
        want(&format!("ftruncate(slot {slot}, {len})"), &Ok(()), &r)?;
        let w = self.window(t0, t1);
        let old = self.m.size(s.id);
        self.apply_truncate(s.id, len, w);
        self.touch(s.id);
        let lo = old.min(len).saturating_sub(4096);
        verify_fd(
            &self.m,
            s.id,
            s.fd,
            s.direct,
            lo,
            8192,
            "read after ftruncate",
        )
        .map_err(|Div(d)| {
            // Which side was wrong: the size the guest kernel holds (a direct read that comes
            // back short falls back to the page cache up to it), or what the daemon returned?
            let after = match sys::fstat(s.fd) {
                Ok(st) => format!("fstat size {}", st.st_size),
                Err(e) => format!("fstat: {}", errname(e)),
            };
            Div(format!("{d} ({after} after the read)"))
        })
    }

    fn fallocate(&mut self, slot: usize, mode: i32, off: u64, len: u64) -> Check {
        let s = self.slot(slot);
        let t0 = sys::now_ns();
        let r = sys::fallocate(s.fd, mode, off, len);
        let t1 = sys::now_ns();
        want(
            &format!("fallocate(slot {slot}, mode {mode:#x}, {off}, {len})"),
            &Ok(()),
            &r,
        )?;
        let w = self.window(t0, t1);
        let size = self.m.size(s.id);
        self.m.maybe_kill_on_write(s.id);
        let n = self.m.get_mut(s.id);
        if mode & libc::FALLOC_FL_PUNCH_HOLE != 0 {
            n.data_mut().zero(off, len);
        } else if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && off + len > size {
            n.data_mut().truncate(off + len);
        }
        // Which times fallocate moves differs between filesystems.
        n.mtime = n.mtime.old_or(w);
        n.ctime = n.ctime.old_or(w);
        self.touch(s.id);
        verify_fd(
            &self.m,
            s.id,
            s.fd,
            s.direct,
            off.saturating_sub(100),
            (len + 200).min(64 << 10) as usize,
            "read after fallocate",
        )
    }

    fn copy_range(
        &mut self,
        src: usize,
        dst: usize,
        off_in: u64,
        off_out: u64,
        len: usize,
    ) -> Check {
        let (a, b) = (self.slot(src), self.slot(dst));
        let size_in = self.m.size(a.id);
        let n = if off_in >= size_in {
            0
        } else {
            (len as u64).min(size_in - off_in) as usize
        };
        // generic_copy_file_checks: shortened to EOF first, then refused if overlapping.
        let overlap = a.id == b.id && off_in < off_out + n as u64 && off_out < off_in + n as u64;
        let exp: Result<usize, Errno> = if overlap { Err(libc::EINVAL) } else { Ok(n) };
        let t0 = sys::now_ns();
        let r = sys::copy_file_range(a.fd, off_in, b.fd, off_out, len);
        let t1 = sys::now_ns();
        let what = format!("copy_file_range(slot {src} @{off_in}, slot {dst} @{off_out}, {len})");
        want(&what, &exp, &r)?;
        if exp.is_err() {
            return Ok(());
        }
        if r != exp {
            div!("{what}: copied {r:?}, expected {exp:?}");
        }
        let bytes = check::expected_bytes(&self.m, a.id, off_in, n);
        let w = self.window(t0, t1);
        self.apply_write(b.id, off_out, &bytes, w);
        self.touch(b.id);
        self.touch(a.id);
        verify_fd(
            &self.m,
            b.id,
            b.fd,
            b.direct,
            off_out.saturating_sub(100),
            n + 200,
            "read after copy_file_range",
        )
    }

    /// What the model holds for `rel` and the descriptors of the pool, for a report.
    pub fn describe(&self, rel: &str) -> String {
        match self.m.lookup(rel) {
            Err(e) => format!("{rel}: absent ({})", errname(e)),
            Ok(id) => {
                let n = self.m.get(id);
                let names: Vec<String> = n
                    .dentries
                    .iter()
                    .map(|(p, nm)| Model::join(&self.m.path(*p).unwrap_or_default(), nm))
                    .collect();
                let fds: Vec<String> = self
                    .slots
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| {
                        s.as_ref().filter(|s| s.id == id).map(|s| {
                            format!("slot {i}{}", if s.direct { " (O_DIRECT)" } else { "" })
                        })
                    })
                    .collect();
                format!(
                    "{rel}: {} mode {:04o} {}:{} size {} nlink {} st_ino {} names {names:?}{}",
                    n.type_name(),
                    n.mode,
                    n.uid,
                    n.gid,
                    self.m.size(id),
                    self.m.nlink(id),
                    n.ino.map_or("?".into(), |i| i.to_string()),
                    if fds.is_empty() {
                        String::new()
                    } else {
                        format!(" open in {}", fds.join(", "))
                    }
                )
            }
        }
    }

    // ---- fault injection ------------------------------------------------------------------

    /// Change the filesystem behind the model's back; the checker must then report it.
    pub fn inject(&mut self, kind: &str, seed: u64) -> Result<String, String> {
        let mut rng = Rng::new(seed);
        let all = self.m.walk();
        let pick = |rng: &mut Rng, v: &[(String, Id)]| -> Option<(String, Id)> {
            if v.is_empty() {
                None
            } else {
                Some(rng.pick(v).clone())
            }
        };
        let files: Vec<(String, Id)> = all
            .iter()
            .filter(|(_, id)| self.m.get(*id).is_file() && self.m.access(*id, 6))
            .cloned()
            .collect();
        let owned: Vec<(String, Id)> = all
            .iter()
            .filter(|(p, id)| {
                !p.is_empty() && !self.m.get(*id).is_symlink() && self.m.owner_or_root(*id)
            })
            .cloned()
            .collect();
        let dirs: Vec<(String, Id)> = all
            .iter()
            .filter(|(_, id)| self.m.get(*id).is_dir() && self.m.access(*id, 3))
            .cloned()
            .collect();
        let real = |p: &str| self.m.real(p);
        let res = match kind {
            "flip" => {
                let c: Vec<(String, Id)> = files
                    .iter()
                    .filter(|(_, id)| self.m.size(*id) > 0)
                    .cloned()
                    .collect();
                let Some((p, id)) = pick(&mut rng, &c) else {
                    return Err("no non-empty writable file to flip a byte of".into());
                };
                let off = rng.below(self.m.size(id));
                let b = self.m.get(id).data().byte(off) ^ 0xff;
                let fd = sys::open(&real(&p), libc::O_WRONLY, 0).map_err(errname)?;
                let r = sys::pwrite_all(fd, &[b], off);
                let _ = sys::close(fd);
                r.map_err(errname)?;
                format!("flipped the byte at {off} of {p}")
            }
            "chmod" => {
                let Some((p, id)) = pick(&mut rng, &owned) else {
                    return Err("nothing to chmod".into());
                };
                let mode = self.m.get(id).mode ^ 0o004;
                sys::chmod(&real(&p), mode).map_err(errname)?;
                format!("chmod {p} to {mode:04o}")
            }
            "stray" => {
                let Some((p, _)) = pick(&mut rng, &dirs) else {
                    return Err("no writable directory".into());
                };
                let sp = Model::join(&p, "stray-entry");
                let fd = sys::open(&real(&sp), libc::O_CREAT | libc::O_WRONLY, 0o644)
                    .map_err(errname)?;
                let _ = sys::close(fd);
                format!("created {sp}")
            }
            "mtime" => {
                let Some((p, _)) = pick(&mut rng, &owned) else {
                    return Err("nothing to set the mtime of".into());
                };
                sys::utimens(&real(&p), [(0, libc::UTIME_OMIT), (1_000_000_000, 0)])
                    .map_err(errname)?;
                format!("set the mtime of {p} to 1000000000")
            }
            "link" => {
                let Some((p, _)) = pick(&mut rng, &files) else {
                    return Err("no file to link".into());
                };
                let to = Model::join(Model::split(&p).0, "extra-link");
                sys::link(&real(&p), &real(&to)).map_err(errname)?;
                format!("linked {p} as {to}")
            }
            "truncate" => {
                let Some((p, id)) = pick(&mut rng, &files) else {
                    return Err("no file to truncate".into());
                };
                let len = self.m.size(id) + 1;
                sys::truncate(&real(&p), len).map_err(errname)?;
                format!("truncated {p} to {len}")
            }
            "hang" => {
                // An operation that does not return: the watchdog must report it.
                unsafe { libc::sleep(1 << 20) };
                "slept".to_string()
            }
            _ => return Err(format!("unknown --inject kind {kind}")),
        };
        Ok(res)
    }
}

pub const INJECT_KINDS: &[&str] = &[
    "flip", "chmod", "stray", "mtime", "link", "truncate", "hang",
];
