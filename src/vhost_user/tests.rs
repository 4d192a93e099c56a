//! Real split virtqueues in fake guest memory, driven from the driver side by
//! `virtio_queue::mock::MockSplitQueue`; the device side is our `handle_event`.

use std::ffi::CStr;
use std::mem::size_of;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{
    AttrOut, CopyFileRangeIn, FileLock as AbiFileLock, GetattrIn, InHeader, InitIn, LkIn,
    OutHeader, ReadIn, WriteOut, ROOT_ID,
};
use fuse_backend_rs::api::filesystem::{Context, Entry, FileLock};
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{ByteValued, Bytes, GuestAddress};

use super::*;
use std::fs::File;
use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use super::queues::Dispatch;
use crate::server::mark_queue_thread;
use crate::server::{AsyncOps, SessionOps, WireOps};
use crate::wire::{FUSE_COPY_FILE_RANGE, FUSE_READ, FUSE_SETLKW, FUSE_SYNCFS};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vm_memory::{Address, GuestAddressSpace};
use vmm_sys_util::epoll::EventSet;

/// The seeds a seeded random checker runs: `{var}_SEED=N` replays seed N alone, `{var}_SEEDS=N`
/// runs seeds 1..=N, and without either seeds 1..=`default`.
pub(crate) fn seeds(var: &str, default: u64) -> Vec<u64> {
    let one = format!("{var}_SEED");
    let many = format!("{var}_SEEDS");
    match std::env::var(&one) {
        Ok(s) => vec![s.parse().unwrap_or_else(|e| panic!("{one}: {e}"))],
        Err(_) => {
            let n = std::env::var(&many).map_or(default, |n| {
                n.parse().unwrap_or_else(|e| panic!("{many}: {e}"))
            });
            (1..=n).collect()
        }
    }
}

/// A xorshift64 generator started from `seed`: the same seed gives the same sequence.
pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    }
}

/// FUSE_SETLK (Linux `include/uapi/linux/fuse.h`).
const FUSE_SETLK: u32 = 32;

const FUSE_INIT: u32 = 26;
const FUSE_GETATTR: u32 = 3;
const FUSE_LOOKUP: u32 = 1;
const QSIZE: u16 = 64;
const MEM_SIZE: usize = 0x10_0000;
const DATA_START: u64 = 0x1_0000;

type CopyArgs = (u64, u64, u64, u64, u64, u64, u64, u64);

/// A tiny filesystem: only the root exists.
#[derive(Default)]
pub(crate) struct TestFs {
    copies: Mutex<Vec<CopyArgs>>,
    /// (opcode, served by a pool worker) of GETATTR and LOOKUP requests, in serving order.
    served: Mutex<Vec<(u32, bool)>>,
    /// A lock held by "another client": SETLKW on handle [`HELD_FH`] waits while it is true.
    held: (Mutex<bool>, std::sync::Condvar),
    /// (stalled, one waits): a LOOKUP of "stall" waits while the first is true, as one held
    /// by a stalled MDS; the second says one is waiting.
    stall: (Mutex<(bool, bool)>, std::sync::Condvar),
    /// Calls of operations the daemon does not serve (BMAP, POLL): none may arrive.
    unserved: Mutex<Vec<&'static str>>,
    /// Handles given by OPEN; FLUSH checks them; DESTROY empties the table.
    handles: Handles,
    /// How often the session was ended (DESTROY, or the end of a frontend's connection).
    pub(crate) destroyed: AtomicUsize,
    /// The lookup counts FORGET and BATCH_FORGET dropped, summed.
    forgotten: std::sync::atomic::AtomicU64,
    /// READ and WRITE of [`nonblocking::ASYNC_FH`] on the async path, answered when the
    /// test lets them.
    #[cfg(libcephfs_nonblocking)]
    aio: nonblocking::TestAio,
}

/// The open handles of a [`TestFs`]: handle → node it was opened on (the transport needs no
/// more than that; the filesystem's own table is not the transport's to know).
#[derive(Default)]
struct Handles {
    next: std::sync::atomic::AtomicU64,
    open: Mutex<std::collections::HashMap<u64, u64>>,
}

impl Handles {
    fn insert(&self, node: u64) -> u64 {
        let fh = self.next.fetch_add(1, AtomicOrdering::SeqCst) + 1;
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(fh, node);
        fh
    }

    /// `fh` if it is open on `node`, EBADF otherwise.
    fn get(&self, node: u64, fh: u64) -> Result<u64, i32> {
        match self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&fh)
        {
            Some(n) if *n == node => Ok(fh),
            _ => Err(libc::EBADF),
        }
    }

    fn clear(&self) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// The handle whose SETLKW waits for [`TestFs::release_lock`].
const HELD_FH: u64 = 77;

impl TestFs {
    fn hold_lock(&self) {
        *self.held.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
    }

    fn release_lock(&self) {
        *self.held.0.lock().unwrap_or_else(PoisonError::into_inner) = false;
        self.held.1.notify_all();
    }
}

impl TestFs {
    fn stall(&self) {
        self.stall
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0 = true;
    }

    fn unstall(&self) {
        self.stall
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0 = false;
        self.stall.1.notify_all();
    }

    /// Wait until a LOOKUP of "stall" waits.
    fn wait_stalled(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut g = self.stall.0.lock().unwrap_or_else(PoisonError::into_inner);
        while !g.1 {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "the LOOKUP of \"stall\" never reached the filesystem"
            );
            g = self
                .stall
                .1
                .wait_timeout(g, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn note_served(&self, opcode: u32) {
        let on_worker = std::thread::current().name() == Some("fuse-worker");
        self.served
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((opcode, on_worker));
    }

    fn take_served(&self) -> Vec<(u32, bool)> {
        std::mem::take(&mut *self.served.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl FileSystem for TestFs {
    type Inode = u64;
    type Handle = u64;

    /// Nothing is found; a LOOKUP of "slow" takes 20 ms, as one sent to the MDS, and one of
    /// "stall" waits while the test stalls it.
    fn lookup(&self, _ctx: &Context, _parent: u64, name: &CStr) -> io::Result<Entry> {
        if name.to_bytes() == b"slow" {
            std::thread::sleep(Duration::from_millis(20));
        }
        if name.to_bytes() == b"stall" {
            let mut g = self.stall.0.lock().unwrap_or_else(PoisonError::into_inner);
            while g.0 {
                g.1 = true;
                self.stall.1.notify_all();
                g = self.stall.1.wait(g).unwrap_or_else(PoisonError::into_inner);
            }
            g.1 = false;
        }
        self.note_served(FUSE_LOOKUP);
        Err(io::Error::from_raw_os_error(libc::ENOENT))
    }

    fn getattr(
        &self,
        _ctx: &Context,
        inode: u64,
        _handle: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        self.note_served(FUSE_GETATTR);
        if inode != ROOT_ID {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        // SAFETY: stat64 is a C struct of integers; all-zero bytes are a valid value.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        st.st_ino = 1;
        st.st_mode = libc::S_IFDIR | 0o755;
        st.st_nlink = 2;
        Ok((st, Duration::from_secs(1)))
    }

    // A lock that is always taken: SETLK fails at once, SETLKW waits (here: is granted).
    fn setlk(
        &self,
        _ctx: &Context,
        _inode: u64,
        _handle: u64,
        _owner: u64,
        _lock: FileLock,
        _flags: u32,
    ) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EAGAIN))
    }

    fn setlkw(
        &self,
        _ctx: &Context,
        _inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        _flags: u32,
    ) -> io::Result<()> {
        if handle == HELD_FH {
            let mut held = self.held.0.lock().unwrap_or_else(PoisonError::into_inner);
            while *held {
                held = self
                    .held
                    .1
                    .wait(held)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            return Ok(());
        }
        assert_eq!((handle, owner, lock.start, lock.end), (7, 9, 0, u64::MAX));
        Ok(())
    }

    /// READ of [`nonblocking::ASYNC_FH`] the blocking way: what the async path answers.
    #[cfg(libcephfs_nonblocking)]
    fn read(
        &self,
        _ctx: &Context,
        _inode: u64,
        handle: u64,
        w: &mut dyn fuse_backend_rs::api::filesystem::ZeroCopyWriter,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _flags: u32,
    ) -> io::Result<usize> {
        self.note_served(FUSE_READ);
        nonblocking::blocking_read(handle, w, size, offset)
    }

    /// READ: nothing to read, noted where it ran.
    #[cfg(not(libcephfs_nonblocking))]
    fn read(
        &self,
        _ctx: &Context,
        _inode: u64,
        _handle: u64,
        _w: &mut dyn fuse_backend_rs::api::filesystem::ZeroCopyWriter,
        _size: u32,
        _offset: u64,
        _lock_owner: Option<u64>,
        _flags: u32,
    ) -> io::Result<usize> {
        self.note_served(FUSE_READ);
        Ok(0)
    }

    #[cfg(libcephfs_nonblocking)]
    fn write(
        &self,
        _ctx: &Context,
        _inode: u64,
        handle: u64,
        r: &mut dyn fuse_backend_rs::api::filesystem::ZeroCopyReader,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _delayed_write: bool,
        _flags: u32,
        _fuse_flags: u32,
    ) -> io::Result<usize> {
        nonblocking::blocking_write(handle, r, size, offset)
    }

    fn forget(&self, _ctx: &Context, _inode: u64, count: u64) {
        self.forgotten.fetch_add(count, AtomicOrdering::SeqCst);
    }

    fn batch_forget(&self, _ctx: &Context, requests: Vec<(u64, u64)>) {
        for (_, count) in requests {
            self.forgotten.fetch_add(count, AtomicOrdering::SeqCst);
        }
    }

    fn destroy(&self) {
        self.handles.clear();
        self.destroyed.fetch_add(1, AtomicOrdering::SeqCst);
    }

    fn open(
        &self,
        _ctx: &Context,
        inode: u64,
        _flags: u32,
        _fuse_flags: u32,
    ) -> io::Result<(
        Option<u64>,
        fuse_backend_rs::api::filesystem::OpenOptions,
        Option<u32>,
    )> {
        let fh = self.handles.insert(inode);
        Ok((
            Some(fh),
            fuse_backend_rs::api::filesystem::OpenOptions::empty(),
            None,
        ))
    }

    fn flush(&self, _ctx: &Context, inode: u64, handle: u64, _owner: u64) -> io::Result<()> {
        self.handles
            .get(inode, handle)
            .map(|_| ())
            .map_err(io::Error::from_raw_os_error)
    }

    fn bmap(&self, _ctx: &Context, _inode: u64, _block: u64, _blocksize: u32) -> io::Result<u64> {
        self.note_unserved("bmap");
        Ok(0)
    }

    fn poll(
        &self,
        _ctx: &Context,
        _inode: u64,
        _handle: u64,
        _khandle: u64,
        _flags: u32,
        _events: u32,
    ) -> io::Result<u32> {
        self.note_unserved("poll");
        Ok(0)
    }
}

impl TestFs {
    fn note_unserved(&self, op: &'static str) {
        self.unserved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(op);
    }
}

impl crate::metrics::FsStats for TestFs {
    fn node_count(&self) -> usize {
        0
    }
    fn handle_count(&self) -> usize {
        0
    }
}

impl WireOps for TestFs {
    fn copy_file_range(
        &self,
        ctx: &Context,
        ino_in: u64,
        fh_in: u64,
        off_in: u64,
        ino_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> io::Result<usize> {
        assert_eq!(ctx.uid, 1000);
        self.copies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((ino_in, fh_in, off_in, ino_out, fh_out, off_out, len, flags));
        usize::try_from(len / 2).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn syncfs(&self, _ctx: &Context, _ino: u64) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EROFS))
    }
}

impl SessionOps for TestFs {}

impl AsyncOps for TestFs {
    #[cfg(libcephfs_nonblocking)]
    fn async_takes(&self, opcode: u32, node: u64, fh: u64) -> bool {
        self.aio.takes(opcode, node, fh)
    }

    #[cfg(libcephfs_nonblocking)]
    fn async_read(
        &self,
        _ctx: &Context,
        _node: u64,
        _fh: u64,
        size: u32,
        offset: u64,
        room: usize,
        tag: u64,
    ) -> io::Result<crate::server::AsyncStart> {
        self.aio.read(size, offset, room, tag)
    }

    #[cfg(libcephfs_nonblocking)]
    fn async_write(
        &self,
        _ctx: &Context,
        _node: u64,
        _fh: u64,
        data: &mut dyn fuse_backend_rs::api::filesystem::ZeroCopyReader,
        size: u32,
        offset: u64,
        _fuse_flags: u32,
        tag: u64,
    ) -> io::Result<crate::server::AsyncStart> {
        self.aio.write(data, size, offset, tag)
    }

    #[cfg(libcephfs_nonblocking)]
    fn async_next(
        &self,
        timeout: Duration,
    ) -> Option<(u64, io::Result<crate::server::AsyncReply>)> {
        self.aio.next(timeout)
    }
}

/// The guest driver's side of one queue.
struct Driver<'a> {
    gm: &'a GuestMemoryMmap<GuestBitmap>,
    mq: MockSplitQueue<'a, GuestMemoryMmap<GuestBitmap>>,
    next_desc: u16,
    next_data: u64,
}

impl<'a> Driver<'a> {
    fn new(gm: &'a GuestMemoryMmap<GuestBitmap>) -> Self {
        Driver {
            gm,
            mq: MockSplitQueue::create(gm, GuestAddress(0), QSIZE),
            next_desc: 0,
            next_data: DATA_START,
        }
    }

    fn vring(&self, mem: &GuestMem) -> Vring {
        let vring = Vring::new(mem.clone(), QSIZE).unwrap_or_else(|e| panic!("{e}"));
        vring
            .set_queue_info(
                self.mq.desc_table_addr().0,
                self.mq.avail_addr().0,
                self.mq.used_addr().0,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        vring.set_queue_size(QSIZE);
        vring.set_queue_ready(true);
        vring
    }

    fn alloc(&mut self, len: u32) -> u64 {
        let addr = self.next_data;
        self.next_data += u64::from(len).next_multiple_of(64);
        addr
    }

    /// Publish one chain of (address, length, device-writable) descriptors.
    fn submit_descs(&mut self, descs: &[(u64, u32, bool)]) {
        let first = self.next_desc;
        let raw: Vec<RawDescriptor> = descs
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, writable))| {
                let last = i + 1 == descs.len();
                let mut flags = if writable { VRING_DESC_F_WRITE } else { 0 };
                if !last {
                    flags |= VRING_DESC_F_NEXT;
                }
                let next = first + u16::try_from(i + 1).unwrap_or(0);
                RawDescriptor::from(SplitDescriptor::new(
                    addr,
                    len,
                    u16::try_from(flags).unwrap_or(0),
                    if last { 0 } else { next },
                ))
            })
            .collect();
        self.mq
            .add_desc_chains(&raw, first)
            .unwrap_or_else(|e| panic!("{e}"));
        self.next_desc += u16::try_from(descs.len()).unwrap_or(0);
    }

    /// Publish a chain of one indirect descriptor whose table holds `descs`.
    fn submit_indirect(&mut self, descs: &[(u64, u32, bool)]) {
        let table_len = u32::try_from(descs.len() * 16).unwrap_or(0);
        let table = self.alloc(table_len);
        for (i, &(addr, len, writable)) in descs.iter().enumerate() {
            let last = i + 1 == descs.len();
            let mut flags = if writable { VRING_DESC_F_WRITE } else { 0 };
            if !last {
                flags |= VRING_DESC_F_NEXT;
            }
            let next = if last {
                0
            } else {
                u16::try_from(i + 1).unwrap_or(0)
            };
            let desc = SplitDescriptor::new(addr, len, u16::try_from(flags).unwrap_or(0), next);
            self.gm
                .write_obj(desc, GuestAddress(table + 16 * i as u64))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let head = RawDescriptor::from(SplitDescriptor::new(
            table,
            table_len,
            u16::try_from(virtio_bindings::virtio_ring::VRING_DESC_F_INDIRECT).unwrap_or(0),
            0,
        ));
        let first = self.next_desc;
        self.mq
            .add_desc_chains(&[head], first)
            .unwrap_or_else(|e| panic!("{e}"));
        self.next_desc += 1;
    }

    /// Publish a request (one readable buffer) with a reply buffer; return the reply address.
    fn submit(&mut self, request: &[u8], reply_len: u32) -> u64 {
        let len = u32::try_from(request.len()).unwrap_or(0);
        let req = self.alloc(len);
        self.gm
            .write_slice(request, GuestAddress(req))
            .unwrap_or_else(|e| panic!("{e}"));
        let reply = self.alloc(reply_len);
        self.submit_descs(&[(req, len, false), (reply, reply_len, true)]);
        reply
    }

    fn used_idx(&self) -> u16 {
        self.mq.used().idx().load()
    }

    /// (head index, bytes written) of used element `i`.
    fn used(&self, i: usize) -> (u32, u32) {
        let elem = self
            .mq
            .used()
            .ring()
            .ref_at(i)
            .unwrap_or_else(|e| panic!("{e}"))
            .load();
        (elem.id(), elem.len())
    }

    fn read<T: ByteValued>(&self, addr: u64) -> T {
        self.gm
            .read_obj(GuestAddress(addr))
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

fn request<T: ByteValued>(opcode: u32, unique: u64, nodeid: u64, body: T) -> Vec<u8> {
    request_bytes(opcode, unique, nodeid, body.as_slice())
}

fn request_bytes(opcode: u32, unique: u64, nodeid: u64, body: &[u8]) -> Vec<u8> {
    let header = InHeader {
        len: u32::try_from(size_of::<InHeader>() + body.len()).unwrap_or(0),
        opcode,
        unique,
        nodeid,
        uid: 1000,
        gid: 1000,
        pid: 42,
        padding: 0,
    };
    let mut bytes = header.as_slice().to_vec();
    bytes.extend_from_slice(body);
    bytes
}

fn lookup_request(unique: u64, name: &str) -> Vec<u8> {
    let mut name = name.as_bytes().to_vec();
    name.push(0);
    request_bytes(FUSE_LOOKUP, unique, ROOT_ID, &name)
}

fn init_request(unique: u64) -> Vec<u8> {
    request(
        FUSE_INIT,
        unique,
        0,
        InitIn {
            major: 7,
            minor: 33,
            max_readahead: 0x20000,
            flags: 0,
        },
    )
}

fn backend(threads: usize, tag: Option<&str>) -> (VhostUserFsBackend<TestFs>, Arc<TestFs>) {
    let fs = Arc::new(TestFs::default());
    let options = BackendOptions {
        tag: tag.map(str::to_owned),
        request_queues: 1,
        thread_pool_size: threads,
        poll: Duration::ZERO,
        nonblocking: false,
    };
    let backend = VhostUserFsBackend::new(fs.clone(), &options).unwrap_or_else(|e| panic!("{e}"));
    (backend, fs)
}

/// A backend serving inline whose queue threads may poll for up to 3 s.
fn polling_backend() -> VhostUserFsBackend<TestFs> {
    let options = BackendOptions {
        tag: None,
        request_queues: 1,
        thread_pool_size: 0,
        poll: Duration::from_secs(3),
        nonblocking: false,
    };
    VhostUserFsBackend::new(Arc::new(TestFs::default()), &options).unwrap_or_else(|e| panic!("{e}"))
}

fn memory() -> (Arc<GuestMemoryMmap<GuestBitmap>>, GuestMem) {
    let gm = GuestMemoryMmap::<GuestBitmap>::from_ranges(&[(GuestAddress(0), MEM_SIZE)])
        .unwrap_or_else(|e| panic!("{e}"));
    let gm = Arc::new(gm);
    let atomic = GuestMemoryAtomic::from(gm.clone());
    (gm, atomic)
}

fn kick(backend: &VhostUserFsBackend<TestFs>, vring: &Vring, queue: usize) {
    backend
        .handle_event(0, EventSet::IN, std::slice::from_ref(vring), queue)
        .unwrap_or_else(|e| panic!("handle_event failed: {e}"));
}

#[test]
fn init_then_getattr_are_answered() {
    for threads in [0, 2] {
        let (gm, mem) = memory();
        let mut driver = Driver::new(&gm);
        let vring = driver.vring(&mem);
        let (backend, _fs) = backend(threads, None);
        backend
            .update_memory(mem.clone())
            .unwrap_or_else(|e| panic!("{e}"));

        let init_reply = driver.submit(&init_request(1), 256);
        let getattr = request(FUSE_GETATTR, 2, ROOT_ID, GetattrIn::default());
        let attr_reply = driver.submit(&getattr, 256);
        kick(&backend, &vring, 1);
        // Waits for the workers: afterwards every popped request has been answered.
        assert!(backend.close_and_drain(std::time::Duration::from_secs(5)));

        assert_eq!(driver.used_idx(), 2, "threads={threads}");
        let mut by_head: Vec<(u32, u32)> = (0..2).map(|i| driver.used(i)).collect();
        by_head.sort_unstable();
        let init_out: OutHeader = driver.read(init_reply);
        assert_eq!((init_out.error, init_out.unique), (0, 1));
        assert_eq!(by_head[0], (0, init_out.len));
        let attr_out: OutHeader = driver.read(attr_reply);
        assert_eq!((attr_out.error, attr_out.unique), (0, 2));
        let expected = u32::try_from(size_of::<OutHeader>() + size_of::<AttrOut>()).unwrap_or(0);
        assert_eq!(attr_out.len, expected);
        assert_eq!(by_head[1], (2, expected));
        let attr: AttrOut = driver.read(attr_reply + size_of::<OutHeader>() as u64);
        assert_eq!(attr.attr.ino, 1);
        assert_eq!(attr.attr.mode, libc::S_IFDIR | 0o755);
    }
}

#[test]
fn getattr_of_unknown_inode_carries_errno() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, _fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    driver.submit(&init_request(1), 256);
    let reply = driver.submit(&request(FUSE_GETATTR, 7, 99, GetattrIn::default()), 256);
    kick(&backend, &vring, 1);
    let out: OutHeader = driver.read(reply);
    assert_eq!((out.error, out.unique), (-libc::ENOENT, 7));
}

#[test]
fn short_header_is_returned_empty_and_serving_continues() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, _fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));

    driver.submit(&[1, 2, 3, 4, 5, 6, 7, 8], 64);
    let ok_reply = driver.submit(&init_request(3), 256);
    kick(&backend, &vring, 1);

    assert_eq!(driver.used_idx(), 2);
    assert_eq!(driver.used(0), (0, 0));
    let out: OutHeader = driver.read(ok_reply);
    assert_eq!((out.error, out.unique), (0, 3));
}

#[test]
fn descriptor_outside_memory_is_returned_empty() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, _fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));

    let reply = driver.alloc(64);
    let outside = u64::try_from(MEM_SIZE).unwrap_or(0) * 16;
    driver.submit_descs(&[(outside, 64, false), (reply, 64, true)]);
    // Writable descriptor outside memory too.
    let req = driver.alloc(64);
    driver.submit_descs(&[(req, 64, false), (outside, 64, true)]);
    kick(&backend, &vring, 1);

    assert_eq!(driver.used_idx(), 2);
    assert_eq!(driver.used(0), (0, 0));
    assert_eq!(driver.used(1), (2, 0));
}

#[test]
fn copy_file_range_reaches_extra_ops() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));

    let arg = CopyFileRangeIn {
        fh_in: 11,
        offset_in: 4096,
        nodeid_out: 5,
        fh_out: 12,
        offset_out: 0,
        len: 1 << 20,
        flags: 0,
    };
    let reply = driver.submit(&request(FUSE_COPY_FILE_RANGE, 9, 4, arg), 64);
    kick(&backend, &vring, 1);

    let copies = fs
        .copies
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert_eq!(copies, vec![(4, 11, 4096, 5, 12, 0, 1 << 20, 0)]);
    let out: OutHeader = driver.read(reply);
    let expected = u32::try_from(size_of::<OutHeader>() + size_of::<WriteOut>()).unwrap_or(0);
    assert_eq!((out.len, out.error, out.unique), (expected, 0, 9));
    let written: WriteOut = driver.read(reply + size_of::<OutHeader>() as u64);
    assert_eq!(written.size, 1 << 19);
    assert_eq!(driver.used(0), (0, expected));
}

#[test]
fn truncated_copy_file_range_gets_einval() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));

    let mut bytes = request(FUSE_COPY_FILE_RANGE, 4, 4, CopyFileRangeIn::default());
    bytes.truncate(size_of::<InHeader>() + 8);
    let reply = driver.submit(&bytes, 64);
    kick(&backend, &vring, 1);

    assert!(fs
        .copies
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .is_empty());
    let out: OutHeader = driver.read(reply);
    assert_eq!((out.error, out.unique), (-libc::EINVAL, 4));
}

#[test]
fn syncfs_error_is_replied_with_errno() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, _fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));

    let reply = driver.submit(&request(FUSE_SYNCFS, 5, ROOT_ID, 0u64), 64);
    kick(&backend, &vring, 1);
    let out: OutHeader = driver.read(reply);
    assert_eq!((out.error, out.unique), (-libc::EROFS, 5));
    assert_eq!(out.len, u32::try_from(size_of::<OutHeader>()).unwrap_or(0));
}

#[test]
fn setlkw_waits_instead_of_failing_like_setlk() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, _fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let lk = LkIn {
        fh: 7,
        owner: 9,
        lk: AbiFileLock {
            start: 0,
            end: u64::MAX,
            type_: libc::F_WRLCK as u32,
            pid: 1,
        },
        lk_flags: 0,
        padding: 0,
    };
    let blocking = driver.submit(&request(FUSE_SETLKW, 6, ROOT_ID, lk), 64);
    let at_once = driver.submit(&request(FUSE_SETLK, 7, ROOT_ID, lk), 64);
    kick(&backend, &vring, 1);
    // SETLKW is served off the queue thread, also without a worker pool.
    wait_used(&driver, 2);
    let out: OutHeader = driver.read(blocking);
    assert_eq!((out.error, out.unique), (0, 6), "SETLKW reached setlkw");
    let out: OutHeader = driver.read(at_once);
    assert_eq!((out.error, out.unique), (-libc::EAGAIN, 7));
}

/// The request a serving thread's slot shows with this unique, if any.
fn in_flight(unique: u64) -> Option<crate::metrics::inflight::Snapshot> {
    crate::metrics::inflight::registry()
        .slots()
        .iter()
        .filter_map(|s| s.read())
        .find(|r| r.info.unique == unique)
}

#[test]
fn a_blocked_request_is_visible_in_flight_until_answered() {
    use crate::metrics::inflight;
    // Tracking stays on for the rest of this test process (other tests may rely on it).
    inflight::set_slow_bound(Duration::from_secs(3600));
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(2, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    fs.hold_lock();
    let unique = 0x5e7_1c3;
    let lk = LkIn {
        fh: HELD_FH,
        owner: 9,
        lk: AbiFileLock {
            start: 4096,
            end: 8191,
            type_: libc::F_WRLCK as u32,
            pid: 1,
        },
        lk_flags: 0,
        padding: 0,
    };
    let before = Instant::now();
    let blocking = driver.submit(&request(FUSE_SETLKW, unique, 42, lk), 64);
    kick(&backend, &vring, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen = loop {
        if let Some(r) = in_flight(unique) {
            break r;
        }
        assert!(Instant::now() < deadline, "the blocked SETLKW never showed");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(
        seen.info,
        inflight::RequestInfo {
            opcode: FUSE_SETLKW,
            unique,
            node: 42,
            queue: 1,
            fh: Some(HELD_FH),
            offset: Some(4096),
            size: Some(4096),
        }
    );
    assert!(seen.started_ns >= inflight::clock_ns(before));
    fs.release_lock();
    wait_used(&driver, 1);
    let out: OutHeader = driver.read(blocking);
    assert_eq!((out.error, out.unique), (0, unique));
    // The worker clears its slot right after writing the reply.
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_flight(unique).is_some() {
        assert!(
            Instant::now() < deadline,
            "the answered SETLKW stayed in flight"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn event_idx_path_serves_all_requests() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    vring.set_queue_event_idx(true);
    let (backend, _fs) = backend(0, None);
    backend.set_event_idx(true);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    for unique in 1..=3 {
        driver.submit(&init_request(unique), 256);
    }
    kick(&backend, &vring, 1);
    assert_eq!(driver.used_idx(), 3);
}

/// A request the guest makes while the queue thread polls is served without a kick, and the
/// guest is told not to kick meanwhile; notifications are back on once the thread goes to sleep.
#[test]
fn polling_serves_requests_made_without_a_kick() {
    for event_idx in [false, true] {
        let (gm, mem) = memory();
        let mut driver = Driver::new(&gm);
        let vring = driver.vring(&mem);
        vring.set_queue_event_idx(event_idx);
        let backend = polling_backend();
        backend.set_event_idx(event_idx);
        backend
            .update_memory(mem.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        // As after a run of short waits (the window starts at zero and adapts).
        backend.set_poll_window(1, Duration::from_secs(3));
        driver.submit(&init_request(1), 256);
        std::thread::scope(|s| {
            let queue_thread = s.spawn(|| kick(&backend, &vring, 1));
            wait_used(&driver, 1);
            if !event_idx {
                let flags: u16 = driver.read(driver.mq.used_addr().0);
                assert_eq!(flags, 1, "VRING_USED_F_NO_NOTIFY while polling");
            }
            // No kick: only the polling thread can see this one.
            driver.submit(&init_request(2), 256);
            wait_used(&driver, 2);
            queue_thread
                .join()
                .unwrap_or_else(|_| panic!("queue thread panicked"));
        });
        let flags: u16 = driver.read(driver.mq.used_addr().0);
        assert_eq!(flags, 0, "notifications re-enabled (event_idx={event_idx})");
        if event_idx {
            // avail_event (after the used ring) asks for a kick on the next request.
            let at = driver.mq.used_addr().0 + 4 + 8 * u64::from(QSIZE);
            let avail_event: u16 = driver.read(at);
            assert_eq!(avail_event, 2);
        }
    }
}

/// The polling window starts at zero and grows when kicks follow each other closely; the
/// hiprio queue never polls.
#[test]
fn polling_window_adapts_to_the_guest() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let backend = polling_backend();
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(backend.poll_window(1), Duration::ZERO);
    for unique in 1..=3 {
        driver.submit(&init_request(unique), 256);
        kick(&backend, &vring, 1);
    }
    // Two waits far shorter than the 3 s maximum, each longer than the window: 10 µs, 20 µs.
    assert_eq!(backend.poll_window(1), crate::poll::GROW_START * 2);
    assert_eq!(driver.used_idx(), 3);
    assert_eq!(backend.poll_window(HIPRIO_QUEUE), Duration::ZERO);
}

/// Wait (at most 10 s) until the device has used `n` chains.
fn wait_used(driver: &Driver<'_>, n: u16) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while driver.used_idx() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "request {n} was not served"
        );
        std::thread::yield_now();
    }
}

#[test]
fn kick_before_memory_table_is_ignored() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, _fs) = backend(0, None);
    driver.submit(&init_request(1), 256);
    kick(&backend, &vring, 1);
    assert_eq!(driver.used_idx(), 0);
}

#[test]
fn features_and_config_space() {
    let (plain, _) = backend(0, None);
    let features = plain.features();
    for bit in [
        VIRTIO_F_VERSION_1,
        VIRTIO_RING_F_EVENT_IDX,
        VIRTIO_RING_F_INDIRECT_DESC,
    ] {
        assert_ne!(features & (1 << bit), 0, "feature bit {bit}");
    }
    assert_ne!(
        features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(),
        0
    );
    assert!(plain
        .protocol_features()
        .contains(VhostUserProtocolFeatures::MQ));
    assert!(!plain
        .protocol_features()
        .contains(VhostUserProtocolFeatures::CONFIG));
    assert!(plain.get_config(0, 40).is_empty());
    assert_eq!(plain.num_queues(), 2);
    assert_eq!(plain.queues_per_thread(), vec![1, 2]);

    let (tagged, _) = backend(0, Some("cephfs"));
    assert!(tagged
        .protocol_features()
        .contains(VhostUserProtocolFeatures::CONFIG));
    let space = tagged.get_config(0, 40);
    assert_eq!(space.len(), 40);
    assert_eq!(space.get(..6), Some(&b"cephfs"[..]));
    assert!(space
        .get(6..36)
        .is_some_and(|rest| rest.iter().all(|b| *b == 0)));
    assert_eq!(space.get(36..), Some(&1u32.to_le_bytes()[..]));
    assert_eq!(tagged.get_config(36, 4), 1u32.to_le_bytes().to_vec());
    assert!(tagged.get_config(38, 4).is_empty());
    assert!(tagged.get_config(u32::MAX, u32::MAX).is_empty());
}

#[test]
fn rejects_bad_queue_count() {
    let options = BackendOptions {
        tag: None,
        request_queues: 0,
        thread_pool_size: 0,
        poll: Duration::ZERO,
        nonblocking: false,
    };
    assert!(matches!(
        VhostUserFsBackend::new(Arc::new(TestFs::default()), &options),
        Err(BackendError::BadQueues(0))
    ));
}

fn limits(core: usize, max: usize, stall_ms: u64, idle_ms: u64) -> super::PoolLimits {
    super::PoolLimits {
        core,
        max,
        stall: Duration::from_millis(stall_ms),
        idle_timeout: Duration::from_millis(idle_ms),
    }
}

type Done = std::sync::mpsc::Sender<()>;

fn wait_done(rx: &std::sync::mpsc::Receiver<()>, n: usize, what: &str) {
    for _ in 0..n {
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{what}"));
    }
}

/// Submit `n` jobs that can only finish together, and wait until they have.
fn run_together(pool: &super::WorkerPool, n: usize) {
    let barrier = Arc::new(std::sync::Barrier::new(n));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for _ in 0..n {
        let (barrier, done): (_, Done) = (barrier.clone(), done_tx.clone());
        pool.submit(
            Box::new(move || {
                barrier.wait();
                let _ = done.send(());
            }),
            false,
        );
    }
    wait_done(&done_rx, n, "blocking jobs did not run side by side");
}

/// Up to `core`, every job that finds no idle worker gets one: eight jobs that can only finish
/// together all run at once.
#[test]
fn pool_starts_core_workers_for_jobs_in_flight() {
    let pool = super::WorkerPool::new(limits(8, 8, 1000, 30_000));
    run_together(&pool, 8);
    assert!(pool.live() <= 8, "live workers: {}", pool.live());
}

/// Past `core`, jobs stuck behind blocked workers make the pool grow up to `max` and no
/// further; jobs that find their worker at once do not.
#[test]
fn pool_grows_past_core_only_when_jobs_wait() {
    let pool = super::WorkerPool::new(limits(1, 4, 5, 30_000));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    // Quick jobs one after the other: one worker is enough.
    for _ in 0..20 {
        let done: Done = done_tx.clone();
        pool.submit(
            Box::new(move || {
                let _ = done.send(());
            }),
            false,
        );
        wait_done(&done_rx, 1, "quick job not served");
    }
    assert_eq!(pool.live(), 1);
    // Eight jobs that each block for 50 ms: the ones taken late add workers.
    let peak = Arc::new(AtomicUsize::new(0));
    let running = Arc::new(AtomicUsize::new(0));
    for _ in 0..8 {
        let (done, peak, running): (Done, _, _) = (done_tx.clone(), peak.clone(), running.clone());
        pool.submit(
            Box::new(move || {
                let now = running.fetch_add(1, AtomicOrdering::SeqCst) + 1;
                peak.fetch_max(now, AtomicOrdering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
                running.fetch_sub(1, AtomicOrdering::SeqCst);
                let _ = done.send(());
            }),
            false,
        );
    }
    wait_done(&done_rx, 8, "blocking jobs not served");
    assert!(
        peak.load(AtomicOrdering::SeqCst) > 1,
        "stuck jobs did not add workers"
    );
    assert!(pool.live() <= 4, "live workers: {}", pool.live());
}

/// A job that may wait for another request gets a worker of its own at once, past `core`.
#[test]
fn a_waiting_job_gets_its_own_worker() {
    let pool = super::WorkerPool::new(limits(1, 4, 60_000, 30_000));
    let (unlock_tx, unlock_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let done: Done = done_tx.clone();
    // Blocks its worker until the next job runs, as a SETLKW waits for an unlock.
    pool.submit(
        Box::new(move || {
            let _ = unlock_rx.recv_timeout(Duration::from_secs(30));
            let _ = done.send(());
        }),
        true,
    );
    pool.submit(
        Box::new(move || {
            let _ = unlock_tx.send(());
        }),
        true,
    );
    wait_done(&done_rx, 1, "the waiting job was never released");
}

/// After a burst grew the pool, one request at a time keeps going to the same worker (the one
/// that went idle last); the others sleep on.
#[test]
fn jobs_go_to_the_worker_that_went_idle_last() {
    let pool = super::WorkerPool::new(limits(4, 4, 1000, 30_000));
    run_together(&pool, 4);
    let (id_tx, id_rx) = std::sync::mpsc::channel();
    let mut ids = std::collections::HashSet::new();
    for _ in 0..20 {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while pool.idle() < 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "workers did not go idle"
            );
            std::thread::yield_now();
        }
        let id = id_tx.clone();
        pool.submit(
            Box::new(move || {
                let _ = id.send(std::thread::current().id());
            }),
            false,
        );
        ids.insert(
            id_rx
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("job not served")),
        );
    }
    assert_eq!(
        ids.len(),
        1,
        "sequential jobs spread over {} workers",
        ids.len()
    );
    assert_eq!(pool.live(), 4);
}

/// Idle workers leave after the idle timeout, and a job after that starts a new one.
#[test]
fn idle_workers_leave_and_come_back() {
    let pool = super::WorkerPool::new(limits(4, 4, 1000, 50));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let job = |done: Done| -> super::pool::Job {
        Box::new(move || {
            let _ = done.send(());
        })
    };
    pool.submit(job(done_tx.clone()), false);
    wait_done(&done_rx, 1, "job not served");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pool.live() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "idle worker did not leave"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    pool.submit(job(done_tx), false);
    wait_done(&done_rx, 1, "job after the workers left was not served");
}

#[test]
fn requests_that_wait_go_to_workers_data_ones_by_their_cost() {
    for op in [16, 20, 30, 43, 47, 50] {
        assert_eq!(Dispatch::of(Some(op)), Dispatch::Blocks, "opcode {op}");
    }
    assert_eq!(Dispatch::of(Some(15)), Dispatch::Cached);
    assert_eq!(Dispatch::of(Some(33)), Dispatch::Waits);
    // LOOKUP, GETATTR, OPEN, RELEASE, READDIRPLUS, garbage, unreadable header.
    for op in [
        Some(1),
        Some(3),
        Some(14),
        Some(18),
        Some(44),
        Some(9999),
        None,
    ] {
        assert_eq!(Dispatch::of(op), Dispatch::Quick, "opcode {op:?}");
    }
}

/// Requests of a kind that has been answering quickly are served by the queue thread itself,
/// in a batch too; a kind that has been slow is spread over the workers, but for the last of
/// a batch, which the queue thread serves after handing the others out. The kinds' costs are
/// set, not learnt (how the means learn is `cost`'s own tests): on a loaded machine a cheap
/// GETATTR preempted for milliseconds would otherwise count as slow.
#[test]
fn cheap_requests_stay_on_the_queue_thread_slow_ones_go_to_workers() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(4, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    backend.inner.cost.freeze_with(&[
        (FUSE_GETATTR, Duration::ZERO),
        (FUSE_LOOKUP, Duration::from_millis(1)),
    ]);
    driver.submit(&init_request(1), 256);
    for unique in 2..=7 {
        let getattr = request(FUSE_GETATTR, unique, ROOT_ID, GetattrIn::default());
        driver.submit(&getattr, 256);
    }
    kick(&backend, &vring, 1);
    wait_used(&driver, 7);
    assert_eq!(fs.take_served(), vec![(FUSE_GETATTR, false); 6]);

    // A batch of slow LOOKUPs: all but the last go to workers.
    for unique in 8..=11 {
        driver.submit(&lookup_request(unique, "slow"), 256);
    }
    kick(&backend, &vring, 1);
    wait_used(&driver, 11);
    let served = fs.take_served();
    assert_eq!(served.iter().filter(|(_, w)| *w).count(), 3, "{served:?}");
    assert_eq!(served.iter().filter(|(_, w)| !*w).count(), 1, "{served:?}");

    // Now a batch of slow ones spreads over the workers, and cached GETATTRs among them still
    // run right here.
    for unique in 12..=19 {
        if unique % 2 == 0 {
            driver.submit(&lookup_request(unique, "slow"), 256);
        } else {
            let getattr = request(FUSE_GETATTR, unique, ROOT_ID, GetattrIn::default());
            driver.submit(&getattr, 256);
        }
    }
    kick(&backend, &vring, 1);
    wait_used(&driver, 19);
    let mut served = fs.take_served();
    served.sort_unstable();
    let mut expected = vec![(FUSE_LOOKUP, true); 4];
    expected.extend([(FUSE_GETATTR, false); 4]);
    assert_eq!(served, expected);
}

/// READs of a kind that has been answering from libcephfs's object cache are served by the
/// queue thread itself, in a batch too; once READs have been slow (OSD round trips) every one
/// goes to a worker, the last of a batch as well, unlike a slow metadata request: the queue
/// stays read while the OSDs answer.
#[test]
fn cached_reads_stay_on_the_queue_thread_slow_ones_all_go_to_workers() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(4, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let read = |unique| {
        let body = ReadIn {
            fh: 1,
            size: 4096,
            ..ReadIn::default()
        };
        request(FUSE_READ, unique, ROOT_ID, body)
    };
    backend
        .inner
        .cost
        .freeze_with(&[(FUSE_READ, Duration::from_micros(3))]);
    driver.submit(&init_request(1), 256);
    for unique in 2..=5 {
        driver.submit(&read(unique), 4096 + 256);
    }
    kick(&backend, &vring, 1);
    wait_used(&driver, 5);
    assert_eq!(fs.take_served(), vec![(FUSE_READ, false); 4]);

    backend
        .inner
        .cost
        .freeze_with(&[(FUSE_READ, Duration::from_micros(300))]);
    for unique in 6..=9 {
        driver.submit(&read(unique), 4096 + 256);
    }
    kick(&backend, &vring, 1);
    wait_used(&driver, 9);
    assert_eq!(fs.take_served(), vec![(FUSE_READ, true); 4]);
}

/// INIT answered, then a LOOKUP of "stall" held inside the filesystem, served on a queue
/// thread of its own (the `handle_event` call; join it once the test unstalls the LOOKUP).
fn hold_a_lookup(
    backend: &VhostUserFsBackend<TestFs>,
    fs: &TestFs,
    driver: &mut Driver<'_>,
    vring: &Vring,
) -> std::thread::JoinHandle<()> {
    driver.submit(&init_request(1), 256);
    kick(backend, vring, 1);
    wait_used(driver, 1);
    fs.stall();
    driver.submit(&lookup_request(2, "stall"), 256);
    let (b, v) = (backend.clone(), vring.clone());
    let queue_thread = std::thread::spawn(move || kick(&b, &v, 1));
    fs.wait_stalled();
    queue_thread
}

/// A request the queue thread serves itself that turns out slow (a LOOKUP while the MDS is
/// stalled) does not hold up the requests put on the queue behind it: the rescuer hands them
/// to workers, with no kick (the guest sends none while the queue thread drains), and they
/// are answered while the LOOKUP still waits.
#[test]
fn requests_behind_a_slow_inline_request_are_served_while_it_waits() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(4, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    backend.inner.cost.freeze_with(&[
        (FUSE_GETATTR, Duration::ZERO),
        (FUSE_LOOKUP, Duration::ZERO),
    ]);
    let queue_thread = hold_a_lookup(&backend, &fs, &mut driver, &vring);
    for unique in 3..=5 {
        let getattr = request(FUSE_GETATTR, unique, ROOT_ID, GetattrIn::default());
        driver.submit(&getattr, 256);
    }
    wait_used(&driver, 4);
    assert!(
        !queue_thread.is_finished(),
        "the LOOKUP was answered although the filesystem still holds it"
    );
    assert_eq!(fs.take_served(), vec![(FUSE_GETATTR, true); 3]);

    fs.unstall();
    queue_thread.join().unwrap();
    wait_used(&driver, 5);
    assert_eq!(fs.take_served(), vec![(FUSE_LOOKUP, false)]);

    // Without a pool the operator asked for everything in order on the queue thread: nobody
    // takes requests from behind a slow one.
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (inline, fs) = self::backend(0, None);
    inline
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let queue_thread = hold_a_lookup(&inline, &fs, &mut driver, &vring);
    let getattr = request(FUSE_GETATTR, 3, ROOT_ID, GetattrIn::default());
    driver.submit(&getattr, 256);
    std::thread::sleep(rescue::LIMIT + rescue::TICK * 4);
    assert_eq!(
        driver.used_idx(),
        1,
        "a request was served behind the stalled one"
    );
    fs.unstall();
    queue_thread.join().unwrap();
    wait_used(&driver, 3);
}

/// A request with the given header fields and body, its declared length as given.
fn raw_request(opcode: u32, unique: u64, len: u32, body: &[u8]) -> Vec<u8> {
    let header = InHeader {
        len,
        opcode,
        unique,
        nodeid: ROOT_ID,
        uid: 1000,
        gid: 1000,
        pid: 42,
        padding: 0,
    };
    let mut bytes = header.as_slice().to_vec();
    bytes.extend_from_slice(body);
    bytes
}

/// Opcodes the daemon does not serve, or that do not exist, are answered ENOSYS by us: they
/// never reach fuse-backend-rs (whose trace line transmutes 0, 7 and 19 into its enum) nor the
/// filesystem, and serving goes on.
#[test]
fn hostile_unserved_opcodes_get_enosys_and_never_reach_the_filesystem() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    driver.submit(&init_request(1), 256);
    kick(&backend, &vring, 1);
    // 52 (STATX) is ENOSYS from this filesystem, which keeps no birth times.
    let opcodes = [0, 7, 19, 37, 39, 40, 41, 48, 49, 52, 4096, u32::MAX];
    let body = [0u8; 64];
    let mut replies = Vec::new();
    for (i, &op) in opcodes.iter().enumerate() {
        let unique = 100 + i as u64;
        let reply = driver.submit(&request_bytes(op, unique, ROOT_ID, &body), 256);
        replies.push((op, unique, reply));
    }
    let getattr = driver.submit(
        &request(FUSE_GETATTR, 999, ROOT_ID, GetattrIn::default()),
        256,
    );
    kick(&backend, &vring, 1);
    for (op, unique, reply) in replies {
        let out: OutHeader = driver.read(reply);
        assert_eq!(
            (out.error, out.unique, out.len),
            (-libc::ENOSYS, unique, size_of::<OutHeader>() as u32),
            "opcode {op}"
        );
    }
    let out: OutHeader = driver.read(getattr);
    assert_eq!((out.error, out.unique), (0, 999));
    assert_eq!(
        *fs.unserved.lock().unwrap_or_else(PoisonError::into_inner),
        Vec::<&str>::new()
    );
}

/// A declared length shorter than the header and the opcode's in-struct, or longer than the
/// chain's readable bytes, is answered EINVAL before fuse-backend-rs decodes the request (it
/// would size a buffer by it, or fail and leave the guest without a reply).
#[test]
fn hostile_declared_length_the_chain_does_not_hold_gets_einval() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let too_long = driver.submit(&raw_request(FUSE_LOOKUP, 5, 40 + 100_000, b"x\0"), 64);
    let too_short = driver.submit(&raw_request(FUSE_LOOKUP, 6, 8, b"x\0"), 64);
    let huge = driver.submit(&raw_request(FUSE_LOOKUP, 7, u32::MAX, b"x\0"), 64);
    // Consistent lengths, but shorter than GETATTR's in-struct.
    let short_struct = driver.submit(&raw_request(FUSE_GETATTR, 8, 40 + 4, &[0; 4]), 64);
    kick(&backend, &vring, 1);
    for (reply, unique) in [(too_long, 5), (too_short, 6), (huge, 7), (short_struct, 8)] {
        let out: OutHeader = driver.read(reply);
        assert_eq!((out.error, out.unique), (-libc::EINVAL, unique));
    }
    assert!(fs.take_served().is_empty(), "LOOKUP reached the filesystem");
}

/// The guest rewrites a request's header after the queue thread popped it (a GETATTR, so the
/// queue thread serves it) into a SETLKW on a held lock: the request is served as the GETATTR
/// that was popped, by our server and by fuse-backend-rs alike, and never waits for the lock.
#[test]
fn hostile_header_rewritten_after_the_pop_cannot_start_a_lock_wait() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(2, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    fs.hold_lock();
    let mut bytes = held_lock_request(21);
    bytes
        .get_mut(4..8)
        .unwrap_or_else(|| panic!("short request"))
        .copy_from_slice(&FUSE_GETATTR.to_ne_bytes());
    let req = driver.next_data;
    let reply = driver.submit(&bytes, 256);
    let pending = backend
        .pop(&vring, mem.memory(), 1)
        .unwrap_or_else(|| panic!("nothing popped"));
    assert_eq!(pending.opcode(), Some(FUSE_GETATTR));
    assert_eq!(Dispatch::of(pending.opcode()), Dispatch::Quick);
    gm.write_obj(FUSE_SETLKW, GuestAddress(req + 4))
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::scope(|s| {
        // A plain thread, as a worker: only the server's own decision keeps it from waiting.
        let t = s.spawn(|| pending.serve(Instant::now(), &backend.inner.server, &vring, 1, None));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let finished = t.is_finished();
        fs.release_lock();
        assert!(finished, "the rewritten request waited for the lock");
    });
    // TestFs knows only the root: GETATTR of node 42 is ENOENT (SETLK would be EAGAIN).
    let out: OutHeader = driver.read(reply);
    assert_eq!((out.error, out.unique), (-libc::ENOENT, 21));
    assert_eq!(fs.take_served(), vec![(FUSE_GETATTR, false)]);
}

fn held_lock_request(unique: u64) -> Vec<u8> {
    let lk = LkIn {
        fh: HELD_FH,
        owner: 9,
        lk: AbiFileLock {
            start: 0,
            end: u64::MAX,
            type_: libc::F_WRLCK as u32,
            pid: 1,
        },
        lk_flags: 0,
        padding: 0,
    };
    request(FUSE_SETLKW, unique, 42, lk)
}

/// A SETLKW that waits for a lock never holds up its queue: with or without a worker pool,
/// and on the hiprio queue too, the request after it is served while it waits.
#[test]
fn hostile_setlkw_never_waits_on_a_queue_thread() {
    for (threads, queue) in [(0, 1), (2, 1), (2, HIPRIO_QUEUE)] {
        let (gm, mem) = memory();
        let mut driver = Driver::new(&gm);
        let vring = driver.vring(&mem);
        let (backend, fs) = backend(threads, None);
        backend
            .update_memory(mem.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        fs.hold_lock();
        let waiting = driver.submit(&held_lock_request(31), 64);
        let getattr = driver.submit(
            &request(FUSE_GETATTR, 32, ROOT_ID, GetattrIn::default()),
            256,
        );
        std::thread::scope(|s| {
            let queue_thread = s.spawn(|| kick(&backend, &vring, queue));
            let deadline = Instant::now() + Duration::from_secs(10);
            let served = loop {
                let out: OutHeader = driver.read(getattr);
                if out.unique == 32 && queue_thread.is_finished() {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            // Let a queue thread stuck in the wait go, so that the test ends either way.
            fs.release_lock();
            assert!(
                served,
                "threads={threads} queue={queue}: the queue thread waited for the lock"
            );
        });
        wait_used(&driver, 2);
        let out: OutHeader = driver.read(waiting);
        assert_eq!((out.error, out.unique), (0, 31), "threads={threads}");
        assert!(backend.close_and_drain(Duration::from_secs(5)));
    }
}

/// Should a SETLKW still end up on a queue thread (no thread could be started for it), it is
/// refused with ENOLCK rather than waited for there.
#[test]
fn hostile_setlkw_reaching_a_queue_thread_is_refused() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    fs.hold_lock();
    let reply = driver.submit(&held_lock_request(41), 64);
    let pending = backend
        .pop(&vring, mem.memory(), 1)
        .unwrap_or_else(|| panic!("nothing popped"));
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            mark_queue_thread();
            pending.serve(Instant::now(), &backend.inner.server, &vring, 1, None);
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let finished = t.is_finished();
        fs.release_lock();
        assert!(finished, "the SETLKW waited on the queue thread");
    });
    let out: OutHeader = driver.read(reply);
    assert_eq!((out.error, out.unique), (-libc::ENOLCK, 41));
}

/// Malformed chains are returned to the guest with nothing written, and serving goes on: more
/// readable descriptors than any request needs (an indirect table of 1100), and a descriptor
/// naming the daemon's private request region instead of guest memory.
#[test]
fn hostile_overlong_and_out_of_memory_chains_are_returned_unanswered() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    // A valid GETATTR, its body spread over 1100 one-byte descriptors.
    let bytes = request(FUSE_GETATTR, 51, ROOT_ID, GetattrIn::default());
    let req = driver.alloc(4096);
    gm.write_slice(&bytes, GuestAddress(req))
        .unwrap_or_else(|e| panic!("{e}"));
    let reply = driver.alloc(256);
    let mut descs = vec![(req, 40, false)];
    descs.extend((0..1100).map(|i| (req + 40 + (i % 16), 1, false)));
    descs.push((reply, 256, true));
    driver.submit_indirect(&descs);
    // The body in the private region (its address is 1 << 62).
    let req2 = driver.alloc(64);
    gm.write_slice(&bytes, GuestAddress(req2))
        .unwrap_or_else(|e| panic!("{e}"));
    let reply2 = driver.alloc(256);
    driver.submit_descs(&[(req2, 40, false), (1 << 62, 16, false), (reply2, 256, true)]);
    let ok = driver.submit(
        &request(FUSE_GETATTR, 53, ROOT_ID, GetattrIn::default()),
        256,
    );
    kick(&backend, &vring, 1);
    assert_eq!(driver.used_idx(), 3);
    assert_eq!(driver.used(0).1, 0, "the overlong chain was answered");
    assert_eq!(
        driver.used(1).1,
        0,
        "the chain into the private region was answered"
    );
    let out: OutHeader = driver.read(ok);
    assert_eq!((out.error, out.unique), (0, 53));
    assert_eq!(fs.take_served(), vec![(FUSE_GETATTR, false)]);
}

/// A request in an indirect table, its header split over two descriptors, is served.
#[test]
fn indirect_chain_with_a_split_header_is_served() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let bytes = request(FUSE_GETATTR, 61, ROOT_ID, GetattrIn::default());
    let req = driver.alloc(64);
    gm.write_slice(&bytes, GuestAddress(req))
        .unwrap_or_else(|e| panic!("{e}"));
    let reply = driver.alloc(256);
    driver.submit_indirect(&[
        (req, 12, false),
        (req + 12, 30, false),
        (req + 42, 14, false),
        (reply, 16, true),
        (reply + 16, 240, true),
    ]);
    kick(&backend, &vring, 1);
    let out: OutHeader = driver.read(reply);
    let expected = u32::try_from(size_of::<OutHeader>() + size_of::<AttrOut>()).unwrap_or(0);
    assert_eq!((out.error, out.unique, out.len), (0, 61, expected));
    assert_eq!(driver.used(0).1, expected);
    assert_eq!(fs.take_served(), vec![(FUSE_GETATTR, false)]);
}

/// A frontend reconnects (`--keep-serving`): the handles the previous one was given are gone
/// before the new one can send a request.
#[test]
fn hostile_reconnect_drops_the_previous_sessions_handles() {
    use fuse_backend_rs::abi::fuse_abi::{FlushIn, OpenIn, OpenOut};
    let (backend, fs) = backend(2, None);
    let flush = |fh| FlushIn {
        fh,
        unused: 0,
        padding: 0,
        lock_owner: 0,
    };
    let fh = {
        let (gm, mem) = memory();
        let mut driver = Driver::new(&gm);
        let vring = driver.vring(&mem);
        backend
            .update_memory(mem.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        driver.submit(&init_request(1), 256);
        let open = driver.submit(&request(14, 2, ROOT_ID, OpenIn::default()), 256);
        kick(&backend, &vring, 1);
        wait_used(&driver, 2);
        let out: OpenOut = driver.read(open + size_of::<OutHeader>() as u64);
        let flushed = driver.submit(&request(25, 3, ROOT_ID, flush(out.fh)), 64);
        kick(&backend, &vring, 1);
        wait_used(&driver, 3);
        let reply: OutHeader = driver.read(flushed);
        assert_eq!((reply.error, reply.unique), (0, 3), "the handle works");
        out.fh
    };
    // The frontend went away without a DESTROY; its queue threads have ended.
    backend.reset_connection();
    assert!(backend.end_session(Duration::from_secs(5)));
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    driver.submit(&init_request(1), 256);
    let flushed = driver.submit(&request(25, 2, ROOT_ID, flush(fh)), 64);
    kick(&backend, &vring, 1);
    wait_used(&driver, 2);
    let reply: OutHeader = driver.read(flushed);
    assert_eq!((reply.error, reply.unique), (-libc::EBADF, 2));
    assert_eq!(fs.destroyed.load(AtomicOrdering::SeqCst), 1);
}

/// The test filesystem's session for migration: its open handles (all files, flags 0).
impl crate::migration::DeviceState for TestFs {
    fn save_state(&self) -> Result<Vec<u8>, MigrationError> {
        if *self.held.0.lock().unwrap_or_else(PoisonError::into_inner) {
            return Err(MigrationError::LocksHeld(1));
        }
        let open = self
            .handles
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut handles: Vec<_> = open
            .iter()
            .map(|(&fh, &node)| crate::migration::HandleState {
                fh,
                node,
                kind: crate::migration::HandleKind::File { oflags: 0 },
            })
            .collect();
        handles.sort_by_key(|h| h.fh);
        Ok(crate::migration::State {
            handles,
            ..Default::default()
        }
        .encode())
    }

    fn load_state(&self, bytes: &[u8]) -> Result<crate::migration::LoadReport, MigrationError> {
        let state = crate::migration::State::decode(bytes)?;
        let mut open = self
            .handles
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for h in &state.handles {
            open.insert(h.fh, h.node);
        }
        Ok(crate::migration::LoadReport {
            handles: state.handles.len(),
            ..Default::default()
        })
    }
}

/// A pipe: (read end, write end).
fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0, "pipe2: {}", io::Error::last_os_error());
    // SAFETY: pipe2 succeeded: both descriptors are open and owned by nobody else.
    unsafe {
        use std::os::fd::FromRawFd;
        (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1]))
    }
}

#[test]
fn device_state_moves_through_set_device_state_fd_and_check() {
    let (src, src_fs) = backend(1, None);
    assert!(!src
        .protocol_features()
        .contains(VhostUserProtocolFeatures::DEVICE_STATE));
    assert_eq!(src.features() & VhostUserVirtioFeatures::LOG_ALL.bits(), 0);
    src.enable_migration(src_fs.clone());
    // QEMU migrates a vhost-user device only if it logs the guest memory it writes.
    assert!(src
        .protocol_features()
        .contains(VhostUserProtocolFeatures::DEVICE_STATE | VhostUserProtocolFeatures::LOG_SHMFD));
    assert_ne!(src.features() & VhostUserVirtioFeatures::LOG_ALL.bits(), 0);
    let a = src_fs.handles.insert(5);
    let b = src_fs.handles.insert(6);

    // Save: the backend writes the state and closes its end; the frontend reads to EOF.
    let (mut rd, wr) = pipe();
    let back = src
        .set_device_state_fd(
            VhostTransferStateDirection::SAVE,
            VhostTransferStatePhase::STOPPED,
            wr,
        )
        .unwrap();
    assert!(back.is_none());
    let mut blob = Vec::new();
    rd.read_to_end(&mut blob).unwrap();
    src.check_device_state().unwrap();
    // A second check without a transfer is an error, not a stale success.
    assert!(src.check_device_state().is_err());

    // Load into another backend.
    let (dst, dst_fs) = backend(1, None);
    dst.enable_migration(dst_fs.clone());
    let (rd, mut wr) = pipe();
    dst.set_device_state_fd(
        VhostTransferStateDirection::LOAD,
        VhostTransferStatePhase::STOPPED,
        rd,
    )
    .unwrap();
    wr.write_all(&blob).unwrap();
    drop(wr);
    dst.check_device_state().unwrap();
    assert_eq!(dst_fs.handles.get(5, a), Ok(a));
    assert_eq!(dst_fs.handles.get(6, b), Ok(b));

    // Damaged bytes fail the check (QEMU then fails the migration).
    let (dst2, dst2_fs) = backend(1, None);
    dst2.enable_migration(dst2_fs);
    let (rd, mut wr) = pipe();
    dst2.set_device_state_fd(
        VhostTransferStateDirection::LOAD,
        VhostTransferStatePhase::STOPPED,
        rd,
    )
    .unwrap();
    wr.write_all(&blob[..blob.len() - 1]).unwrap();
    drop(wr);
    assert!(dst2.check_device_state().is_err());
}

#[test]
fn a_refused_save_closes_the_fd_and_fails_the_check() {
    let (src, src_fs) = backend(1, None);
    src.enable_migration(src_fs.clone());
    *src_fs.held.0.lock().unwrap() = true;
    let (mut rd, wr) = pipe();
    src.set_device_state_fd(
        VhostTransferStateDirection::SAVE,
        VhostTransferStatePhase::STOPPED,
        wr,
    )
    .unwrap();
    // The frontend is not left waiting: EOF with nothing written.
    let mut blob = Vec::new();
    rd.read_to_end(&mut blob).unwrap();
    assert!(blob.is_empty());
    assert!(src.check_device_state().is_err());
}

#[test]
fn without_migration_the_device_state_messages_are_refused() {
    let (b, _) = backend(1, None);
    let (_rd, wr) = pipe();
    assert!(b
        .set_device_state_fd(
            VhostTransferStateDirection::SAVE,
            VhostTransferStatePhase::STOPPED,
            wr,
        )
        .is_err());
}

/// While the frontend logs dirty pages (a migration), every request is answered before the
/// queue thread lets go of the vring: nothing is in flight when QEMU stops the rings.
#[test]
fn while_logging_requests_are_answered_with_the_vring_held() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(2, None);
    backend.update_memory(mem.clone()).unwrap();
    backend.enable_migration(fs.clone());
    backend.acked_features(backend.features());
    // LOOKUPs known to be slow: outside a migration all but the last of a batch go to workers.
    backend
        .inner
        .cost
        .freeze_with(&[(FUSE_LOOKUP, Duration::from_millis(1))]);
    driver.submit(&init_request(1), 256);
    for unique in 2..=5 {
        driver.submit(&lookup_request(unique, "slow"), 256);
    }
    kick(&backend, &vring, 1);
    // No drain: all five were answered on the queue thread before the kick returned.
    assert_eq!(driver.used_idx(), 5);
    assert_eq!(backend.inner.in_flight.count.load(Ordering::Acquire), 0);
    assert_eq!(fs.take_served(), vec![(FUSE_LOOKUP, false); 4]);
    // Logging off: back to the workers.
    backend.acked_features(backend.features() & !VhostUserVirtioFeatures::LOG_ALL.bits());
    assert!(!backend.inner.logging.load(Ordering::Acquire));
}

/// A chain whose writable descriptor leads back to its first one is refused and returned
/// with nothing written; the next request is served. Followed, the loop counted the writable
/// buffer once per pass, and a reply could claim more bytes than the buffer holds (the hostile
/// fuzzer's "overlong-reply").
#[test]
fn hostile_looping_chain_is_returned_unanswered() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let bytes = request(FUSE_GETATTR, 61, ROOT_ID, GetattrIn::default());
    let req = driver.alloc(64);
    gm.write_slice(&bytes, GuestAddress(req))
        .unwrap_or_else(|e| panic!("{e}"));
    let reply = driver.alloc(256);
    let first = driver.next_desc;
    let len = u32::try_from(bytes.len()).unwrap_or(0);
    let next = u16::try_from(VRING_DESC_F_NEXT).unwrap_or(0);
    let write = u16::try_from(VRING_DESC_F_WRITE).unwrap_or(0);
    let raw = [
        RawDescriptor::from(SplitDescriptor::new(req, len, next, first + 1)),
        RawDescriptor::from(SplitDescriptor::new(reply, 256, write | next, first)),
        // Ends the mock's notion of the chain; the device never reaches it.
        RawDescriptor::from(SplitDescriptor::new(reply, 0, write, 0)),
    ];
    driver
        .mq
        .add_desc_chains(&raw, first)
        .unwrap_or_else(|e| panic!("{e}"));
    driver.next_desc += 3;
    let ok = driver.submit(
        &request(FUSE_GETATTR, 62, ROOT_ID, GetattrIn::default()),
        256,
    );
    kick(&backend, &vring, 1);
    assert_eq!(driver.used_idx(), 2);
    assert_eq!(driver.used(0).1, 0, "the looping chain was answered");
    let out: OutHeader = driver.read(ok);
    assert_eq!((out.error, out.unique), (0, 62));
    assert_eq!(fs.take_served(), vec![(FUSE_GETATTR, false)]);
}

/// Past the 16 descriptors kept on the stack the loop check uses a set: a valid request spread
/// over 40 descriptors is served, and one whose 21st descriptor leads back to its 3rd is
/// returned with nothing written.
#[test]
fn hostile_long_chains_are_served_unless_they_loop() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let bytes = request(FUSE_GETATTR, 71, ROOT_ID, GetattrIn::default());
    let req = driver.alloc(64);
    gm.write_slice(&bytes, GuestAddress(req))
        .unwrap_or_else(|e| panic!("{e}"));
    let len = u64::try_from(bytes.len()).unwrap_or(0);
    // Header whole, the 16-byte body one byte a descriptor: 40 descriptors in all.
    let reply = driver.alloc(256);
    let mut descs = vec![(req, 40, false)];
    descs.extend((40..len).map(|off| (req + off, 1, false)));
    descs.extend((0..23).map(|i| (reply + i, 1, true)));
    descs.push((reply + 23, 233, true));
    assert_eq!(descs.len(), 41);
    driver.submit_descs(&descs);
    // The same request again, its 21st descriptor leading back to its 3rd.
    let bytes2 = request(FUSE_GETATTR, 72, ROOT_ID, GetattrIn::default());
    let req2 = driver.alloc(64);
    gm.write_slice(&bytes2, GuestAddress(req2))
        .unwrap_or_else(|e| panic!("{e}"));
    let reply2 = driver.alloc(256);
    let first = driver.next_desc;
    let next = u16::try_from(VRING_DESC_F_NEXT).unwrap_or(0);
    let write = u16::try_from(VRING_DESC_F_WRITE).unwrap_or(0);
    let mut raw = vec![RawDescriptor::from(SplitDescriptor::new(
        req2,
        40,
        next,
        first + 1,
    ))];
    for i in 0..16u16 {
        raw.push(RawDescriptor::from(SplitDescriptor::new(
            req2 + 40 + u64::from(i),
            1,
            next,
            first + 2 + i,
        )));
    }
    for i in 0..4u16 {
        let to = if i == 3 { first + 2 } else { first + 18 + i };
        raw.push(RawDescriptor::from(SplitDescriptor::new(
            reply2 + u64::from(i) * 64,
            64,
            write | next,
            to,
        )));
    }
    // Ends the mock's notion of the chain; the device never reaches it.
    raw.push(RawDescriptor::from(SplitDescriptor::new(
        reply2, 0, write, 0,
    )));
    driver
        .mq
        .add_desc_chains(&raw, first)
        .unwrap_or_else(|e| panic!("{e}"));
    driver.next_desc += u16::try_from(raw.len()).unwrap_or(0);
    kick(&backend, &vring, 1);
    assert_eq!(driver.used_idx(), 2);
    assert!(
        driver.used(0).1 > 0,
        "the long valid chain was not answered"
    );
    let out: OutHeader = driver.read(reply);
    assert_eq!((out.error, out.unique), (0, 71));
    assert_eq!(driver.used(1).1, 0, "the long looping chain was answered");
    assert_eq!(fs.take_served(), vec![(FUSE_GETATTR, false)]);
}

/// Pauses nest (a handover and a session recovery may overlap): requests that came while the
/// queues were closed are served when the last pause is undone, by the reopen itself (the
/// guest will not kick again), and never once the final stop began.
#[test]
fn paused_queues_serve_after_the_last_reopen_and_never_after_the_stop() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, _fs) = backend(0, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let wait = std::time::Duration::from_secs(5);
    driver.submit(&init_request(1), 256);
    kick(&backend, &vring, 1);
    assert_eq!(driver.used_idx(), 1);

    assert!(backend.close_and_drain(wait));
    assert!(backend.close_and_drain(wait));
    let getattr = request(FUSE_GETATTR, 2, ROOT_ID, GetattrIn::default());
    driver.submit(&getattr, 256);
    kick(&backend, &vring, 1);
    assert_eq!(driver.used_idx(), 1, "served while paused");
    backend.reopen();
    assert_eq!(driver.used_idx(), 1, "served with one pause left");
    backend.reopen();
    assert_eq!(driver.used_idx(), 2, "the last reopen serves what waited");

    assert!(backend.stop_and_drain(wait));
    let getattr = request(FUSE_GETATTR, 3, ROOT_ID, GetattrIn::default());
    driver.submit(&getattr, 256);
    kick(&backend, &vring, 1);
    backend.reopen();
    assert_eq!(driver.used_idx(), 2, "served after the stop");
}

#[cfg(libcephfs_nonblocking)]
mod nonblocking;

mod hiprio;

/// A guest reboots while a SETLKW of its previous boot waits: the frontend stops the ring
/// (GET_VRING_BASE), starts it again over the same memory, and the new driver posts a GETATTR
/// on the very descriptor the SETLKW used. The dead request neither reads its arguments from
/// the new boot's memory nor, once the lock is granted, writes anything into the new ring: the
/// new ring's used index counts only the GETATTR.
#[test]
fn hostile_answers_of_a_stopped_ring_never_reach_the_restarted_one() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = backend(2, None);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    fs.hold_lock();
    let waiting = driver.submit(&held_lock_request(81), 64);
    kick(&backend, &vring, 1);
    // The SETLKW is on a worker, waiting. The guest reboots: the ring stops...
    vring.set_queue_ready(false);
    // ... and its new driver sets the rings up again in the same memory, from index 0.
    let dropped = crate::metrics::global().dropped_answers();
    let mut reborn = Driver::new(&gm);
    gm.write_obj(0u16, reborn.mq.avail_addr().unchecked_add(2))
        .unwrap_or_else(|e| panic!("{e}"));
    gm.write_obj(0u16, reborn.mq.used_addr().unchecked_add(2))
        .unwrap_or_else(|e| panic!("{e}"));
    vring.set_queue_next_avail(0);
    vring.set_queue_next_used(0);
    vring.set_queue_ready(true);
    let getattr = reborn.submit(
        &request(FUSE_GETATTR, 82, ROOT_ID, GetattrIn::default()),
        256,
    );
    assert_eq!(reborn.used_idx(), 0);
    kick(&backend, &vring, 1);
    wait_used(&reborn, 1);
    assert_eq!(reborn.used(0).0, 0, "the GETATTR took descriptor 0 again");
    // The old lock is granted now; the dead request must not be answered.
    fs.release_lock();
    assert!(backend.close_and_drain(Duration::from_secs(10)));
    assert_eq!(
        reborn.used_idx(),
        1,
        "the previous boot's SETLKW was answered in the new ring"
    );
    let out: OutHeader = reborn.read(getattr);
    assert_eq!((out.error, out.unique), (0, 82));
    let _ = waiting;
    assert_eq!(crate::metrics::global().dropped_answers(), dropped + 1);
}
