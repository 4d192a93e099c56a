//! `ceph-virtiofsd-bench echo --socket PATH`: the daemon's vhost-user transport and FUSE server
//! over a filesystem that answers at once from nothing (every name exists, every file is 1 TiB,
//! no Ceph): what a request costs the bench and the daemon's own request path when the storage
//! costs nothing. Its figures are the physical limit the real daemon is measured against
//! (docs/benchmarks.md): a stat storm on it is the round trip through shared memory, both
//! sides' ring work and the FUSE decoding, and nothing else.
//!
//! Serves one frontend connection, then exits.

use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ceph_virtiofsd::server::{AsyncOps, SessionOps, WireOps};
use ceph_virtiofsd::vhost_user::{BackendOptions, GuestBitmap, VhostUserFsBackend};
use clap::Parser;
use fuse_backend_rs::abi::fuse_abi::{stat64, FsOptions, OpenOptions};
use fuse_backend_rs::api::filesystem::{Context, DirEntry, Entry, FileSystem};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

#[derive(Debug, Parser)]
#[command(
    name = "ceph-virtiofsd-bench echo",
    about = "The daemon's request path over a filesystem that answers at once (no Ceph)"
)]
struct Cli {
    /// vhost-user socket to listen on.
    #[arg(long)]
    socket: PathBuf,
    /// Request queues (as the daemon's --queues).
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// As the daemon's --poll-us.
    #[arg(long, default_value_t = 50)]
    poll_us: u64,
    /// As the daemon's --thread-pool-size.
    #[arg(long, default_value_t = 64)]
    thread_pool_size: usize,
}

pub fn main(args: impl Iterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = Cli::parse_from(args);
    let options = BackendOptions {
        tag: None,
        request_queues: cli.queues,
        thread_pool_size: cli.thread_pool_size,
        poll: Duration::from_micros(cli.poll_us),
        nonblocking: false,
    };
    let backend = match VhostUserFsBackend::new(Arc::new(EchoFs::default()), &options) {
        Ok(b) => b,
        Err(e) => {
            crate::print_chain(&e);
            return ExitCode::from(2);
        }
    };
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::<GuestBitmap>::new());
    let served = vhost_user_backend::VhostUserDaemon::new("echo".to_owned(), backend, mem)
        .map_err(|e| format!("{e:?}"))
        .and_then(|mut d| d.serve(&cli.socket).map_err(|e| format!("{e:?}")));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("echo: serving {} failed: {e}", cli.socket.display());
            ExitCode::from(1)
        }
    }
}

/// Every name exists (a directory unless it names a file the bench makes), with a node id of
/// its own; every file is 1 TiB; nothing is stored.
#[derive(Default)]
struct EchoFs {
    ids: Mutex<HashMap<(u64, Vec<u8>), u64>>,
    next: AtomicU64,
}

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;

fn attr(node: u64, dir: bool) -> stat64 {
    // SAFETY: stat64 is a C struct of integers; all-zero is a valid value.
    let mut st: stat64 = unsafe { std::mem::zeroed() };
    st.st_ino = node;
    st.st_mode = if dir {
        S_IFDIR | 0o777
    } else {
        S_IFREG | 0o666
    };
    st.st_nlink = 1;
    st.st_size = 1 << 40;
    st.st_blksize = 4096;
    st
}

/// The bench's workloads make files of these names; everything else is a directory.
fn is_file(name: &[u8]) -> bool {
    name == b"file" || name == b"rw" || name == b"seq" || name.ends_with(b".done")
}

impl EchoFs {
    fn entry(&self, parent: u64, name: &CStr) -> Entry {
        let key = (parent, name.to_bytes().to_vec());
        let node = *self
            .ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_insert_with(|| self.next.fetch_add(1, Ordering::Relaxed) + 2);
        Entry {
            inode: node,
            generation: 0,
            attr: attr(node, !is_file(name.to_bytes())),
            attr_flags: 0,
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_secs(1),
        }
    }
}

impl FileSystem for EchoFs {
    type Inode = u64;
    type Handle = u64;

    fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
        Ok(capable
            & (FsOptions::ASYNC_READ
                | FsOptions::BIG_WRITES
                | FsOptions::MAX_PAGES
                | FsOptions::DO_READDIRPLUS))
    }

    fn lookup(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        Ok(self.entry(parent, name))
    }

    fn forget(&self, _ctx: &Context, _inode: u64, _count: u64) {}

    fn batch_forget(&self, _ctx: &Context, _requests: Vec<(u64, u64)>) {}

    fn getattr(
        &self,
        _ctx: &Context,
        inode: u64,
        _handle: Option<u64>,
    ) -> io::Result<(stat64, Duration)> {
        Ok((attr(inode, inode == 1), Duration::from_secs(1)))
    }

    fn mkdir(
        &self,
        _ctx: &Context,
        parent: u64,
        name: &CStr,
        _mode: u32,
        _umask: u32,
    ) -> io::Result<Entry> {
        Ok(self.entry(parent, name))
    }

    fn mknod(
        &self,
        _ctx: &Context,
        parent: u64,
        name: &CStr,
        _mode: u32,
        _rdev: u32,
        _umask: u32,
    ) -> io::Result<Entry> {
        Ok(self.entry(parent, name))
    }

    fn open(
        &self,
        _ctx: &Context,
        inode: u64,
        _flags: u32,
        _fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        Ok((Some(inode), OpenOptions::empty(), None))
    }

    fn release(
        &self,
        _ctx: &Context,
        _inode: u64,
        _flags: u32,
        _handle: u64,
        _flush: bool,
        _flock_release: bool,
        _lock_owner: Option<u64>,
    ) -> io::Result<()> {
        Ok(())
    }

    fn flush(&self, _ctx: &Context, _inode: u64, _handle: u64, _lock_owner: u64) -> io::Result<()> {
        Ok(())
    }

    fn opendir(
        &self,
        _ctx: &Context,
        inode: u64,
        _flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions)> {
        Ok((Some(inode), OpenOptions::empty()))
    }

    fn readdirplus(
        &self,
        _ctx: &Context,
        _inode: u64,
        _handle: u64,
        _size: u32,
        _offset: u64,
        _add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        Ok(())
    }

    fn releasedir(&self, _ctx: &Context, _inode: u64, _flags: u32, _handle: u64) -> io::Result<()> {
        Ok(())
    }
}

impl WireOps for EchoFs {
    fn copy_file_range(
        &self,
        _ctx: &Context,
        _ino_in: u64,
        _fh_in: u64,
        _off_in: u64,
        _ino_out: u64,
        _fh_out: u64,
        _off_out: u64,
        _len: u64,
        _flags: u64,
    ) -> io::Result<usize> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }

    fn syncfs(&self, _ctx: &Context, _ino: u64) -> io::Result<()> {
        Ok(())
    }
}

impl SessionOps for EchoFs {}

impl AsyncOps for EchoFs {}
