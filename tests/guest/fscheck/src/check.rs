//! Comparing what the filesystem shows with the model: attributes, bytes, directory listings.

use std::collections::HashMap;

use crate::model::{fmt_ns, Id, Kind, Model, TimeExp};
use crate::sys::{self, errname, AlignedBuf, Mapping, PAGE};

/// A divergence between the filesystem and the model.
#[derive(Debug)]
pub struct Div(pub String);

pub type Check = Result<(), Div>;

#[macro_export]
macro_rules! div {
    ($($t:tt)*) => { return Err($crate::check::Div(format!($($t)*))) };
}

/// How bytes are read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// A fresh buffered descriptor.
    Buffered,
    /// A fresh O_DIRECT descriptor (aligned buffer and range).
    Direct,
    /// A private read-only mapping of a fresh descriptor.
    Mmap,
}

fn ts(sec: i64, nsec: i64) -> i128 {
    sec as i128 * 1_000_000_000 + nsec as i128
}

/// Compare one stat with the model inode `id` (named `what` in messages); on success, the
/// observed times and st_ino become what the model expects from now on.
pub fn compare_stat(m: &mut Model, id: Id, what: &str, st: &libc::stat) -> Check {
    let n = m.get(id);
    let fmt = st.st_mode & libc::S_IFMT;
    if fmt != n.ifmt() {
        div!(
            "{what}: file type {:o}, expected a {} ({:o})",
            fmt,
            n.type_name(),
            n.ifmt()
        );
    }
    let perm = st.st_mode & 0o7777;
    let want_perm = if n.is_symlink() { 0o777 } else { n.mode };
    if perm != want_perm && (n.is_symlink() || n.mode_alt != Some(perm)) {
        div!("{what}: mode {perm:04o}, expected {want_perm:04o}");
    }
    if st.st_uid != n.uid || st.st_gid != n.gid {
        div!(
            "{what}: owner {}:{}, expected {}:{}",
            st.st_uid,
            st.st_gid,
            n.uid,
            n.gid
        );
    }
    let nlink = if n.dentries.is_empty() && id != m.root {
        0
    } else {
        m.nlink(id)
    };
    if st.st_nlink != nlink {
        div!("{what}: nlink {}, expected {nlink}", st.st_nlink);
    }
    if !n.is_dir() && st.st_size as u64 != m.size(id) {
        div!("{what}: size {}, expected {}", st.st_size, m.size(id));
    }
    let mt = ts(st.st_mtime, st.st_mtime_nsec);
    if !n.mtime.accepts(mt) {
        div!(
            "{what}: mtime {}, expected {}",
            fmt_ns(mt),
            n.mtime.describe()
        );
    }
    let ct = ts(st.st_ctime, st.st_ctime_nsec);
    // libcephfs reports ctime as the later of ctime and mtime, so an mtime set past the
    // expected ctime shows as the ctime (docs/semantics.md, "Known limits"; ceph-client/tests/quirks.rs).
    let ctime_is_later_mtime = ct == mt && mt > n.ctime.latest();
    if !n.ctime.accepts(ct) && !ctime_is_later_mtime {
        div!(
            "{what}: ctime {}, expected {}",
            fmt_ns(ct),
            n.ctime.describe()
        );
    }
    let ino = st.st_ino;
    match n.ino {
        Some(known) if known != ino => {
            div!("{what}: st_ino changed from {known} to {ino}")
        }
        Some(_) => {}
        None => {
            if let Some(other) = m.inos.get(&ino) {
                if *other != id && m.live(*other) {
                    let op = m.path(*other).unwrap_or_else(|| "(open, unlinked)".into());
                    div!("{what}: st_ino {ino} is already the st_ino of live {op}");
                }
            }
            m.inos.insert(ino, id);
        }
    }
    let n = m.get_mut(id);
    n.ino = Some(ino);
    if !n.is_symlink() {
        n.mode = perm;
    }
    n.mode_alt = None;
    n.mtime = TimeExp::Known(mt);
    n.ctime = TimeExp::Known(ct);
    Ok(())
}

/// lstat the inode through one of its paths (or fstat an open descriptor of an unlinked one)
/// and compare.
pub fn check_inode(m: &mut Model, id: Id, fds: &[(i32, Id)]) -> Check {
    if !m.live(id) {
        return Ok(());
    }
    if let Some(p) = m.path(id) {
        let what = if p.is_empty() { ".".to_string() } else { p };
        let st = match sys::lstat(&m.real(&what)) {
            Ok(st) => st,
            Err(e) => div!(
                "lstat {what}: {}, expected a {}",
                errname(e),
                m.get(id).type_name()
            ),
        };
        return compare_stat(m, id, &what, &st);
    }
    if let Some((fd, _)) = fds.iter().find(|(_, i)| *i == id) {
        let st = match sys::fstat(*fd) {
            Ok(st) => st,
            Err(e) => div!("fstat of unlinked open file (fd {fd}): {}", errname(e)),
        };
        return compare_stat(m, id, &format!("unlinked open file (fd {fd})"), &st);
    }
    Ok(())
}

/// Compare bytes read at `off` with the model's; `got` is what the read returned.
pub fn compare_bytes(what: &str, want: &[u8], got: &[u8], off: u64) -> Check {
    if got.len() != want.len() {
        let first = want
            .iter()
            .zip(got)
            .position(|(a, b)| a != b)
            .map(|p| format!(", first differing byte at {}", off + p as u64))
            .unwrap_or_default();
        div!(
            "{what}: read {} bytes at {off}, expected {}{first}",
            got.len(),
            want.len()
        );
    }
    if let Some(p) = want.iter().zip(got).position(|(a, b)| a != b) {
        let diff = want.iter().zip(got).filter(|(a, b)| a != b).count();
        let end = (p + 16).min(want.len());
        let zeros = got[p..].iter().take(4096).all(|b| *b == 0);
        div!(
            "{what}: {diff} of {} bytes differ from offset {} (read at {off}); expected {:02x?}, got {:02x?}{}",
            want.len(),
            off + p as u64,
            &want[p..end],
            &got[p..end],
            if zeros { " (zeros)" } else { "" }
        );
    }
    Ok(())
}

/// The model's bytes of [off, off+len) clipped at EOF.
pub fn expected_bytes(m: &Model, id: Id, off: u64, len: usize) -> Vec<u8> {
    m.get(id).data().read(off, len)
}

/// Read [off, off+len) through `fd` (O_DIRECT if `direct`: the range is aligned outward first)
/// and compare with the model.
pub fn verify_fd(
    m: &Model,
    id: Id,
    fd: i32,
    direct: bool,
    off: u64,
    len: usize,
    what: &str,
) -> Check {
    let (off, len) = if direct {
        align_out(off, len)
    } else {
        (off, len)
    };
    let want = expected_bytes(m, id, off, len);
    let got = if direct {
        let mut b = AlignedBuf::new(len);
        match sys::pread_all(fd, b.as_mut_slice(), off) {
            Ok(n) => b.as_slice()[..n].to_vec(),
            Err(e) => div!("{what}: O_DIRECT pread({off}, {len}): {}", errname(e)),
        }
    } else {
        let mut b = vec![0u8; len];
        match sys::pread_all(fd, &mut b, off) {
            Ok(n) => {
                b.truncate(n);
                b
            }
            Err(e) => div!("{what}: pread({off}, {len}): {}", errname(e)),
        }
    };
    compare_bytes(what, &want, &got, off).map_err(|Div(d)| {
        if got.len() == want.len() {
            return Div(d);
        }
        // A length that differs from the model's: the guest's size (fstat: a short direct read
        // is continued from the page cache up to it), a second read, and what the surplus is
        // tell whether the daemon returned bytes past the end or the guest held a wrong size.
        let size = match sys::fstat(fd) {
            Ok(st) => format!("fstat size {}", st.st_size),
            Err(e) => format!("fstat: {}", errname(e)),
        };
        // The daemon's size now: AT_STATX_FORCE_SYNC makes FUSE ask (GETATTR) instead of
        // answering from the guest's attribute cache.
        let size = {
            // SAFETY: an all-zero statx is a valid out value.
            let mut stx: libc::statx = unsafe { std::mem::zeroed() };
            // SAFETY: fd is open, the path is an empty C string, stx is a valid out pointer.
            let r = unsafe {
                libc::statx(
                    fd,
                    c"".as_ptr(),
                    libc::AT_EMPTY_PATH | libc::AT_STATX_FORCE_SYNC,
                    libc::STATX_SIZE,
                    &mut stx,
                )
            };
            if r == 0 {
                format!("{size}, daemon's size {}", stx.stx_size)
            } else {
                format!("{size}, statx: {}", errname(sys::errno()))
            }
        };
        let surplus = got.get(want.len()..).map_or("none".to_string(), |x| {
            if x.iter().all(|b| *b == 0) {
                format!("{} zero bytes", x.len())
            } else {
                format!("{} bytes, not all zero", x.len())
            }
        });
        let again = if direct {
            let mut b = AlignedBuf::new(len);
            sys::pread_all(fd, b.as_mut_slice(), off)
        } else {
            sys::pread_all(fd, &mut vec![0u8; len], off)
        };
        let again = match again {
            Ok(n) => format!("read again: {n} bytes"),
            Err(e) => format!("read again: {}", errname(e)),
        };
        // One pread(2), not continued: what the first call (the direct one) returned.
        let mut b = AlignedBuf::new(len);
        // SAFETY: b is a live buffer of len bytes for the duration of the call.
        let one = unsafe {
            libc::pread(
                fd,
                b.as_mut_slice().as_mut_ptr().cast(),
                len,
                off as libc::off_t,
            )
        };
        Div(format!(
            "{d} ({size}; surplus: {surplus}; {again}; one pread: {one})"
        ))
    })
}

pub fn align_out(off: u64, len: usize) -> (u64, usize) {
    let s = off / PAGE * PAGE;
    let e = (off + len as u64).div_ceil(PAGE) * PAGE;
    (s, (e - s).max(PAGE) as usize)
}

/// Outcome of reading through a fresh descriptor.
pub enum Fresh {
    Done,
    /// mmap is not available on this mount (FOPEN_DIRECT_IO on Linux < 6.6 refuses shared
    /// mappings; private ones too in some modes): the caller turns mmap off.
    NoMmap(i32),
}

/// Open `rel` afresh and compare [off, off+len) with the model through `via`.
pub fn verify_fresh(
    m: &Model,
    id: Id,
    rel: &str,
    via: Via,
    off: u64,
    len: usize,
) -> Result<Fresh, Div> {
    let path = m.real(rel);
    let flags = libc::O_RDONLY
        | if via == Via::Direct {
            libc::O_DIRECT
        } else {
            0
        };
    let fd = match sys::open(&path, flags, 0) {
        Ok(fd) => fd,
        Err(e) => div!("open {rel} for a {via:?} read: {}", errname(e)),
    };
    let r = match via {
        Via::Buffered | Via::Direct => verify_fd(
            m,
            id,
            fd,
            via == Via::Direct,
            off,
            len,
            &format!("{via:?} read of {rel}"),
        )
        .map(|_| Fresh::Done),
        Via::Mmap => verify_mmap(m, id, fd, off, len, rel),
    };
    let _ = sys::close(fd);
    r
}

fn verify_mmap(m: &Model, id: Id, fd: i32, off: u64, len: usize, rel: &str) -> Result<Fresh, Div> {
    let size = m.size(id);
    if off >= size || len == 0 {
        return Ok(Fresh::Done);
    }
    let end = (off + len as u64).min(size);
    let start = off / PAGE * PAGE;
    let map = match Mapping::new(fd, start, (end - start) as usize, false) {
        Ok(map) => map,
        Err(e) if e == libc::ENODEV => return Ok(Fresh::NoMmap(e)),
        Err(e) => div!("mmap {rel} [{start}, {end}): {}", errname(e)),
    };
    let want = expected_bytes(m, id, off, (end - off) as usize);
    let got = &map.as_slice()[(off - start) as usize..];
    compare_bytes(&format!("mmap read of {rel}"), &want, got, off)?;
    Ok(Fresh::Done)
}

/// Read a whole directory with getdents64 (`bufsize`-byte calls) and compare with the model:
/// every entry exactly once with its st_ino and type, "." and ".." once, nothing else.
pub fn check_listing(m: &Model, id: Id, rel: &str, bufsize: usize) -> Check {
    let shown = if rel.is_empty() { "." } else { rel };
    let fd = match sys::open(&m.real(rel), libc::O_RDONLY | libc::O_DIRECTORY, 0) {
        Ok(fd) => fd,
        Err(e) => div!("opendir {shown}: {}", errname(e)),
    };
    let mut seen: HashMap<String, (u32, u64, u8)> = HashMap::new();
    let r = loop {
        match sys::getdents(fd, bufsize) {
            Ok(v) if v.is_empty() => break Ok(()),
            Ok(v) => {
                for d in v {
                    let e = seen.entry(d.name).or_insert((0, d.ino, d.dtype));
                    e.0 += 1;
                }
            }
            Err(e) => break Err(e),
        }
    };
    let _ = sys::close(fd);
    if let Err(e) = r {
        div!("getdents {shown}: {}", errname(e));
    }
    compare_listing(m, id, shown, &seen, &Default::default())
}

/// `seen`: name -> (times returned, d_ino, d_type); `removed`: names unlinked while reading,
/// which may or may not have been returned (at most once).
pub fn compare_listing(
    m: &Model,
    id: Id,
    shown: &str,
    seen: &HashMap<String, (u32, u64, u8)>,
    removed: &std::collections::HashSet<String>,
) -> Check {
    let entries = m.get(id).entries();
    for dot in [".", ".."] {
        match seen.get(dot) {
            Some((1, _, _)) => {}
            Some((k, _, _)) => div!("readdir {shown}: \"{dot}\" returned {k} times"),
            None => div!("readdir {shown}: no \"{dot}\" entry"),
        }
    }
    for (name, c) in entries {
        let n = m.get(*c);
        match seen.get(name) {
            None => div!(
                "readdir {shown}: {} \"{name}\" missing ({} entries returned, {} expected)",
                n.type_name(),
                seen.len() - 2,
                entries.len()
            ),
            Some((k, _, _)) if *k != 1 => div!("readdir {shown}: \"{name}\" returned {k} times"),
            Some((_, ino, dt)) => {
                if let Some(known) = n.ino {
                    if *ino != known {
                        div!("readdir {shown}: \"{name}\" has d_ino {ino}, st_ino is {known}");
                    }
                }
                if *dt != n.dtype() {
                    div!(
                        "readdir {shown}: \"{name}\" has d_type {dt}, expected {} ({})",
                        n.dtype(),
                        n.type_name()
                    );
                }
            }
        }
    }
    for (name, (k, _, _)) in seen {
        if name == "." || name == ".." || entries.contains_key(name) {
            continue;
        }
        if removed.contains(name) {
            if *k > 1 {
                div!("readdir {shown}: removed \"{name}\" returned {k} times");
            }
            continue;
        }
        div!("readdir {shown}: unexpected entry \"{name}\"");
    }
    Ok(())
}

/// The whole tree: every inode's attributes, every directory's listing, and (if `content`)
/// every readable file's bytes.
pub fn verify_all(m: &mut Model, fds: &[(i32, Id)], content: bool) -> Check {
    for (rel, id) in m.walk() {
        crate::watch_progress();
        check_inode(m, id, fds)?;
        let (is_dir, is_file) = {
            let n = m.get(id);
            (n.is_dir(), n.is_file())
        };
        if is_dir {
            check_listing(m, id, &rel, 4096)?;
        } else if is_file && m.access(id, 4) {
            let size = m.size(id) as usize;
            if content || size <= 256 << 10 {
                // A buffered read never asks for a mapping.
                verify_fresh(m, id, &rel, Via::Buffered, 0, size + 1)?;
            }
        }
        if let Kind::Symlink(t) = &m.get(id).kind {
            match sys::readlink(&m.real(&rel)) {
                Ok(got) if got == *t => {}
                Ok(got) => div!("readlink {rel}: \"{got}\", expected \"{t}\""),
                Err(e) => div!("readlink {rel}: {}", errname(e)),
            }
        }
    }
    for (_, id) in fds {
        if m.live(*id) && m.get(*id).dentries.is_empty() {
            check_inode(m, *id, fds)?;
        }
    }
    Ok(())
}
