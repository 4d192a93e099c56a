//! Thin wrappers over the system calls the checker uses: each returns the raw errno on failure,
//! never retries on its own except to complete a short transfer, and never follows a symlink
//! unless the call itself does.

use std::ffi::CString;

pub type Errno = i32;
pub type Res<T> = Result<T, Errno>;

pub fn errno() -> Errno {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub fn errname(e: Errno) -> String {
    let n = match e {
        0 => "success",
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EACCES => "EACCES",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ENODATA => "ENODATA",
        libc::ERANGE => "ERANGE",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOSYS => "ENOSYS",
        libc::ENODEV => "ENODEV",
        libc::ESTALE => "ESTALE",
        libc::EINTR => "EINTR",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::EMLINK => "EMLINK",
        libc::ELOOP => "ELOOP",
        libc::EBUSY => "EBUSY",
        _ => return format!("errno {e}"),
    };
    n.to_string()
}

fn cs(p: &str) -> CString {
    CString::new(p).expect("path without NUL")
}

fn ck(r: libc::c_int) -> Res<libc::c_int> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

fn ck0(r: libc::c_int) -> Res<()> {
    ck(r).map(|_| ())
}

/// Nanoseconds since the epoch, CLOCK_REALTIME (what the filesystem stamps times with).
pub fn now_ns() -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// Monotonic milliseconds (for the watchdog).
pub fn mono_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

pub fn open(p: &str, flags: i32, mode: u32) -> Res<i32> {
    let c = cs(p);
    ck(unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) })
}

pub fn close(fd: i32) -> Res<()> {
    ck0(unsafe { libc::close(fd) })
}

/// pwrite until everything is written (a regular file only writes short on ENOSPC/EFBIG).
pub fn pwrite_all(fd: i32, buf: &[u8], off: u64) -> Res<usize> {
    let mut done = 0;
    while done < buf.len() {
        let r = unsafe {
            libc::pwrite(
                fd,
                buf[done..].as_ptr() as *const libc::c_void,
                buf.len() - done,
                (off + done as u64) as libc::off_t,
            )
        };
        if r < 0 {
            return Err(errno());
        }
        if r == 0 {
            break;
        }
        done += r as usize;
    }
    Ok(done)
}

/// write(2) at the file position (O_APPEND descriptors), until done.
pub fn write_all(fd: i32, buf: &[u8]) -> Res<usize> {
    let mut done = 0;
    while done < buf.len() {
        let r = unsafe {
            libc::write(
                fd,
                buf[done..].as_ptr() as *const libc::c_void,
                buf.len() - done,
            )
        };
        if r < 0 {
            return Err(errno());
        }
        if r == 0 {
            break;
        }
        done += r as usize;
    }
    Ok(done)
}

/// One pwrite(2) call (O_APPEND: Linux appends whatever the offset).
pub fn pwrite_once(fd: i32, buf: &[u8], off: u64) -> Res<usize> {
    let r = unsafe {
        libc::pwrite(
            fd,
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            off as libc::off_t,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

/// pread until the buffer is full or EOF.
pub fn pread_all(fd: i32, buf: &mut [u8], off: u64) -> Res<usize> {
    let mut done = 0;
    while done < buf.len() {
        let r = unsafe {
            libc::pread(
                fd,
                buf[done..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - done,
                (off + done as u64) as libc::off_t,
            )
        };
        if r < 0 {
            return Err(errno());
        }
        if r == 0 {
            break;
        }
        done += r as usize;
    }
    Ok(done)
}

pub fn lstat(p: &str) -> Res<libc::stat> {
    let c = cs(p);
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    ck0(unsafe { libc::lstat(c.as_ptr(), &mut st) })?;
    Ok(st)
}

pub fn fstat(fd: i32) -> Res<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    ck0(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

pub fn mkdir(p: &str, mode: u32) -> Res<()> {
    let c = cs(p);
    ck0(unsafe { libc::mkdir(c.as_ptr(), mode as libc::mode_t) })
}

pub fn rmdir(p: &str) -> Res<()> {
    let c = cs(p);
    ck0(unsafe { libc::rmdir(c.as_ptr()) })
}

pub fn unlink(p: &str) -> Res<()> {
    let c = cs(p);
    ck0(unsafe { libc::unlink(c.as_ptr()) })
}

pub fn link(from: &str, to: &str) -> Res<()> {
    let (a, b) = (cs(from), cs(to));
    ck0(unsafe { libc::link(a.as_ptr(), b.as_ptr()) })
}

pub fn symlink(target: &str, p: &str) -> Res<()> {
    let (a, b) = (cs(target), cs(p));
    ck0(unsafe { libc::symlink(a.as_ptr(), b.as_ptr()) })
}

pub fn readlink(p: &str) -> Res<String> {
    let c = cs(p);
    let mut buf = vec![0u8; 4096];
    let r = unsafe { libc::readlink(c.as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if r < 0 {
        return Err(errno());
    }
    buf.truncate(r as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

pub const RENAME_NOREPLACE: u32 = 1;

pub fn rename2(from: &str, to: &str, flags: u32) -> Res<()> {
    let (a, b) = (cs(from), cs(to));
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

pub fn chmod(p: &str, mode: u32) -> Res<()> {
    let c = cs(p);
    ck0(unsafe { libc::chmod(c.as_ptr(), mode as libc::mode_t) })
}

/// lchown; None = leave unchanged (-1).
pub fn lchown(p: &str, uid: Option<u32>, gid: Option<u32>) -> Res<()> {
    let c = cs(p);
    ck0(unsafe { libc::lchown(c.as_ptr(), uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX)) })
}

/// utimensat(AT_FDCWD, p, [atime, mtime], 0); tv_nsec may be UTIME_NOW / UTIME_OMIT.
pub fn utimens(p: &str, times: [(i64, i64); 2]) -> Res<()> {
    let c = cs(p);
    let ts = [
        libc::timespec {
            tv_sec: times[0].0 as libc::time_t,
            tv_nsec: times[0].1 as _,
        },
        libc::timespec {
            tv_sec: times[1].0 as libc::time_t,
            tv_nsec: times[1].1 as _,
        },
    ];
    ck0(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) })
}

pub fn truncate(p: &str, len: u64) -> Res<()> {
    let c = cs(p);
    ck0(unsafe { libc::truncate(c.as_ptr(), len as libc::off_t) })
}

pub fn ftruncate(fd: i32, len: u64) -> Res<()> {
    ck0(unsafe { libc::ftruncate(fd, len as libc::off_t) })
}

pub fn fallocate(fd: i32, mode: i32, off: u64, len: u64) -> Res<()> {
    ck0(unsafe { libc::fallocate(fd, mode, off as libc::off_t, len as libc::off_t) })
}

pub fn copy_file_range(
    fd_in: i32,
    off_in: u64,
    fd_out: i32,
    off_out: u64,
    len: usize,
) -> Res<usize> {
    let mut oi = off_in as libc::loff_t;
    let mut oo = off_out as libc::loff_t;
    let r = unsafe { libc::copy_file_range(fd_in, &mut oi, fd_out, &mut oo, len, 0) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

pub fn fsync(fd: i32, data_only: bool) -> Res<()> {
    ck0(unsafe {
        if data_only {
            libc::fdatasync(fd)
        } else {
            libc::fsync(fd)
        }
    })
}

pub fn fadvise_dontneed(fd: i32) -> Res<()> {
    let r = unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        Err(r)
    } else {
        Ok(())
    }
}

pub fn drop_caches() -> Res<()> {
    let fd = open("/proc/sys/vm/drop_caches", libc::O_WRONLY, 0)?;
    let r = write_all(fd, b"3\n");
    let _ = close(fd);
    r.map(|_| ())
}

pub fn setxattr(p: &str, name: &str, val: &[u8], flags: i32) -> Res<()> {
    let (c, n) = (cs(p), cs(name));
    ck0(unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            val.as_ptr() as *const libc::c_void,
            val.len(),
            flags,
        )
    })
}

pub fn getxattr(p: &str, name: &str) -> Res<Vec<u8>> {
    let (c, n) = (cs(p), cs(name));
    let mut buf = vec![0u8; 65536];
    let r = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    if r < 0 {
        return Err(errno());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

pub fn listxattr(p: &str) -> Res<Vec<String>> {
    let c = cs(p);
    let mut buf = vec![0u8; 65536];
    let r =
        unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if r < 0 {
        return Err(errno());
    }
    buf.truncate(r as usize);
    Ok(buf
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect())
}

pub fn removexattr(p: &str, name: &str) -> Res<()> {
    let (c, n) = (cs(p), cs(name));
    ck0(unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) })
}

/// One directory entry from getdents64.
pub struct Dirent {
    pub ino: u64,
    pub dtype: u8,
    pub name: String,
}

/// One getdents64 call with a buffer of `bufsize` bytes; an empty result is the end.
pub fn getdents(fd: i32, bufsize: usize) -> Res<Vec<Dirent>> {
    let mut buf = vec![0u8; bufsize];
    let r = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd,
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    if r < 0 {
        return Err(errno());
    }
    let n = r as usize;
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 19 <= n {
        let ino = u64::from_ne_bytes(buf[pos..pos + 8].try_into().unwrap());
        let reclen = u16::from_ne_bytes(buf[pos + 16..pos + 18].try_into().unwrap()) as usize;
        let dtype = buf[pos + 18];
        let name_bytes = &buf[pos + 19..pos + reclen];
        let end = name_bytes
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(name_bytes.len());
        out.push(Dirent {
            ino,
            dtype,
            name: String::from_utf8_lossy(&name_bytes[..end]).into_owned(),
        });
        if reclen == 0 {
            break;
        }
        pos += reclen;
    }
    Ok(out)
}

/// A heap buffer aligned to 4096 bytes, for O_DIRECT.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let cap = len.max(4096).div_ceil(4096) * 4096;
        let layout = std::alloc::Layout::from_size_align(cap, 4096).unwrap();
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        AlignedBuf { ptr, len }
    }

    pub fn as_slice(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let cap = self.len.max(4096).div_ceil(4096) * 4096;
        let layout = std::alloc::Layout::from_size_align(cap, 4096).unwrap();
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// A file mapping, unmapped on drop.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

pub const PAGE: u64 = 4096;

impl Mapping {
    /// Map `len` bytes of `fd` from the page-aligned `off`.
    pub fn new(fd: i32, off: u64, len: usize, write: bool) -> Res<Mapping> {
        let (prot, flags) = if write {
            (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED)
        } else {
            (libc::PROT_READ, libc::MAP_PRIVATE)
        };
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                flags,
                fd,
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(errno());
        }
        Ok(Mapping {
            ptr: p as *mut u8,
            len,
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn msync(&self) -> Res<()> {
        ck0(unsafe { libc::msync(self.ptr as *mut libc::c_void, self.len, libc::MS_SYNC) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Write straight to stderr (usable from the watchdog and the SIGBUS handler).
pub fn raw_stderr(s: &str) {
    raw_write(2, s)
}

/// Write straight to a descriptor, without std's buffers and locks.
pub fn raw_write(fd: i32, s: &str) {
    let b = s.as_bytes();
    let mut off = 0;
    while off < b.len() {
        let r = unsafe { libc::write(fd, b[off..].as_ptr() as *const libc::c_void, b.len() - off) };
        if r <= 0 {
            break;
        }
        off += r as usize;
    }
}
