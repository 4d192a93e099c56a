//! The async READ/WRITE path (`vhost_user::nonblocking`) on real split virtqueues: requests
//! in flight with no thread waiting, answered when their completions come (also before the
//! queue thread filed them), guards held until then, and the same answers as the blocking
//! path for every request the async path does not take.

use std::collections::{HashMap, VecDeque};
use std::sync::Condvar;

use fuse_backend_rs::abi::fuse_abi::{ReadIn, WriteIn};
use fuse_backend_rs::api::filesystem::{ZeroCopyReader, ZeroCopyWriter};

use super::*;
use crate::server::{AsyncReply, AsyncStart};
use crate::wire::{FUSE_READ, FUSE_WRITE};

/// The handle TestFs serves asynchronously (an "O_DIRECT" one); every other is unknown.
pub(super) const ASYNC_FH: u64 = 0xa51c;

/// What a READ at `off` finds: byte `i` of the file is `i % 251`.
fn file_bytes(off: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| u8::try_from((off + i) % 251).unwrap_or(0))
        .collect()
}

/// The file's size: reads past it are short.
const FILE_SIZE: u64 = 1 << 20;

fn check_range(size: u32, offset: u64) -> io::Result<usize> {
    let end = offset.checked_add(u64::from(size));
    if end.map_or(true, |e| i64::try_from(e).is_err()) {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    }
    let left = FILE_SIZE.saturating_sub(offset);
    Ok(usize::try_from(left.min(u64::from(size))).unwrap_or(0))
}

/// The blocking READ of TestFs (for requests the async path leaves, and as the reference).
pub(super) fn blocking_read(
    handle: u64,
    w: &mut dyn ZeroCopyWriter,
    size: u32,
    offset: u64,
) -> io::Result<usize> {
    let len = check_range(size, offset)?;
    if handle != ASYNC_FH {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    let data = file_bytes(offset, len.min(w.available_bytes()));
    w.write_all(&data)?;
    Ok(data.len())
}

/// The blocking WRITE of TestFs: range, then handle, then the data.
pub(super) fn blocking_write(
    handle: u64,
    r: &mut dyn ZeroCopyReader,
    size: u32,
    offset: u64,
) -> io::Result<usize> {
    check_range(size, offset)?;
    if handle != ASYNC_FH {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    let mut buf = vec![0u8; usize::try_from(size).unwrap_or(0)];
    r.read(&mut buf)
}

#[derive(Default)]
pub(super) struct TestAio {
    state: Mutex<AioState>,
    ready: Condvar,
}

#[derive(Default)]
struct AioState {
    /// Completions are kept back until [`TestAio::release`].
    hold: bool,
    held: Vec<(u64, io::Result<AsyncReply>)>,
    done: VecDeque<(u64, io::Result<AsyncReply>)>,
    /// What WRITEs brought, by offset.
    written: HashMap<u64, Vec<u8>>,
    started: usize,
}

impl TestAio {
    fn lock(&self) -> std::sync::MutexGuard<'_, AioState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn takes(&self, opcode: u32, _node: u64, fh: u64) -> bool {
        (opcode == FUSE_READ || opcode == FUSE_WRITE) && fh == ASYNC_FH
    }

    fn complete(&self, tag: u64, r: io::Result<AsyncReply>) {
        let mut s = self.lock();
        s.started += 1;
        if s.hold {
            s.held.push((tag, r));
        } else {
            s.done.push_back((tag, r));
            self.ready.notify_all();
        }
    }

    pub(super) fn read(
        &self,
        size: u32,
        offset: u64,
        room: usize,
        tag: u64,
    ) -> io::Result<AsyncStart> {
        let len = check_range(size, offset)?.min(room);
        if len == 0 {
            return Ok(AsyncStart::Done(AsyncReply::Read(Vec::new())));
        }
        self.complete(tag, Ok(AsyncReply::Read(file_bytes(offset, len))));
        Ok(AsyncStart::Sent)
    }

    pub(super) fn write(
        &self,
        data: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        tag: u64,
    ) -> io::Result<AsyncStart> {
        check_range(size, offset)?;
        let mut buf = vec![0u8; usize::try_from(size).unwrap_or(0)];
        let n = data.read(&mut buf)?;
        buf.truncate(n);
        self.lock().written.insert(offset, buf);
        self.complete(tag, Ok(AsyncReply::Written(n)));
        Ok(AsyncStart::Sent)
    }

    pub(super) fn next(&self, timeout: Duration) -> Option<(u64, io::Result<AsyncReply>)> {
        let s = self.lock();
        let (mut s, _) = self
            .ready
            .wait_timeout_while(s, timeout, |s| s.done.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        s.done.pop_front()
    }

    fn hold(&self) {
        self.lock().hold = true;
    }

    /// Let every completion kept back go, and the later ones at once.
    fn release(&self) {
        let mut s = self.lock();
        s.hold = false;
        let held: Vec<_> = s.held.drain(..).collect();
        s.done.extend(held);
        self.ready.notify_all();
    }

    fn started(&self) -> usize {
        self.lock().started
    }

    fn written(&self, offset: u64) -> Option<Vec<u8>> {
        self.lock().written.get(&offset).cloned()
    }
}

fn async_backend(threads: usize) -> (VhostUserFsBackend<TestFs>, Arc<TestFs>) {
    let fs = Arc::new(TestFs::default());
    let options = BackendOptions {
        tag: None,
        request_queues: 1,
        thread_pool_size: threads,
        poll: Duration::ZERO,
        nonblocking: true,
    };
    let backend = VhostUserFsBackend::new(fs.clone(), &options).unwrap_or_else(|e| panic!("{e}"));
    (backend, fs)
}

fn read_in(fh: u64, offset: u64, size: u32) -> ReadIn {
    ReadIn {
        fh,
        offset,
        size,
        ..ReadIn::default()
    }
}

/// A WRITE request: header, in-struct, then the data.
fn write_request(unique: u64, fh: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let arg = WriteIn {
        fh,
        offset,
        size: u32::try_from(data.len()).unwrap_or(0),
        ..WriteIn::default()
    };
    let mut body = arg.as_slice().to_vec();
    body.extend_from_slice(data);
    request_bytes(FUSE_WRITE, unique, 5, &body)
}

fn in_flight_async(backend: &VhostUserFsBackend<TestFs>) -> usize {
    backend.inner.aio.as_ref().map_or(0, |a| a.in_flight())
}

/// Many READs and WRITEs in flight at once, none answered until their completions come;
/// meanwhile a drain does not finish (their in-flight guards are held); then every one is
/// answered with its own data, byte for byte.
#[test]
fn async_requests_are_answered_when_they_complete() {
    crate::metrics::inflight::set_slow_bound(Duration::from_secs(3600));
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = async_backend(2);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    fs.aio.hold();
    // 24 chains of two descriptors: the 64-entry table holds them all at once.
    let n = 12u64;
    let mut reads = Vec::new();
    for i in 0..n {
        let unique = 0xa000 + i;
        let req = request(FUSE_READ, unique, 5, read_in(ASYNC_FH, i * 4096 + 7, 4096));
        reads.push((unique, i * 4096 + 7, driver.submit(&req, 16 + 4096)));
    }
    let mut writes = Vec::new();
    for i in 0..n {
        let unique = 0xb000 + i;
        let data = file_bytes(i * 1000 + 3, 512 + usize::try_from(i).unwrap_or(0));
        let req = write_request(unique, ASYNC_FH, i * 8192, &data);
        writes.push((unique, i * 8192, data, driver.submit(&req, 64)));
    }
    kick(&backend, &vring, 1);
    assert_eq!(fs.aio.started(), 2 * 12);
    assert_eq!(
        in_flight_async(&backend),
        2 * 12,
        "every request is in flight"
    );
    assert_eq!(
        driver.used_idx(),
        0,
        "nothing answered before its completion"
    );
    assert!(
        in_flight(0xa000).is_some(),
        "the watchdog sees an async request"
    );
    assert!(
        !backend.close_and_drain(Duration::from_millis(200)),
        "a drain waits for the async requests"
    );
    fs.aio.release();
    wait_used(&driver, 24);
    assert!(backend.close_and_drain(Duration::from_secs(5)));
    assert_eq!(in_flight_async(&backend), 0);
    for (unique, off, reply) in reads {
        let out: OutHeader = driver.read(reply);
        assert_eq!((out.error, out.unique, out.len), (0, unique, 16 + 4096));
        let mut data = vec![0u8; 4096];
        gm.read_slice(&mut data, GuestAddress(reply + 16))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(data == file_bytes(off, 4096), "READ {unique:#x} data");
    }
    for (unique, off, data, reply) in writes {
        let out: OutHeader = driver.read(reply);
        assert_eq!((out.error, out.unique), (0, unique));
        let w: WriteOut = driver.read(reply + 16);
        assert_eq!(w.size as usize, data.len());
        assert_eq!(fs.aio.written(off), Some(data), "WRITE {unique:#x} data");
    }
    assert!(
        in_flight(0xa000).is_none(),
        "answered: out of the watchdog's view"
    );
}

/// Completions that come at once (before the queue thread filed the request) are answered
/// too, under load from several kicks.
#[test]
fn completions_before_filing_are_answered() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, _fs) = async_backend(0);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut total = 0;
    for round in 0..4u64 {
        let mut replies = Vec::new();
        for i in 0..6u64 {
            let unique = round * 100 + i + 1;
            let off = (round * 6 + i) * 512;
            let req = request(FUSE_READ, unique, 5, read_in(ASYNC_FH, off, 512));
            replies.push((unique, off, driver.submit(&req, 16 + 512)));
        }
        kick(&backend, &vring, 1);
        total += 6;
        wait_used(&driver, total);
        for (unique, off, reply) in replies {
            let out: OutHeader = driver.read(reply);
            assert_eq!((out.error, out.unique, out.len), (0, unique, 16 + 512));
            let mut data = vec![0u8; 512];
            gm.read_slice(&mut data, GuestAddress(reply + 16))
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(data == file_bytes(off, 512));
        }
    }
    assert!(backend.stop_and_drain(Duration::from_secs(5)));
}

/// What the guest gets for each of these requests, from a backend with or without the async
/// path: the reply's bytes (out-header and data) as they land in guest memory.
fn replies(nonblocking: bool, requests: &[(Vec<u8>, u32)]) -> Vec<Vec<u8>> {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, _fs) = if nonblocking {
        async_backend(0)
    } else {
        backend(0, None)
    };
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let at: Vec<(u64, u32)> = requests
        .iter()
        .map(|(r, room)| (driver.submit(r, *room), *room))
        .collect();
    kick(&backend, &vring, 1);
    wait_used(&driver, u16::try_from(requests.len()).unwrap_or(0));
    assert!(backend.stop_and_drain(Duration::from_secs(5)));
    let used: HashMap<u32, u32> = (0..requests.len()).map(|i| driver.used(i)).collect();
    at.iter()
        .enumerate()
        .map(|(i, &(reply, room))| {
            let head = u32::try_from(2 * i).unwrap_or(0);
            let len = used.get(&head).copied().unwrap_or(0).min(room);
            let mut b = vec![0u8; len as usize];
            gm.read_slice(&mut b, GuestAddress(reply))
                .unwrap_or_else(|e| panic!("{e}"));
            b
        })
        .collect()
}

/// Bad handles, offsets past i64, short or lying in-structs, replies with no room: the async
/// path answers each exactly as the blocking path does, and serving goes on.
#[test]
fn odd_requests_get_the_blocking_answers() {
    let huge = u64::MAX - 100;
    let mut short_read = request(FUSE_READ, 5, 5, read_in(ASYNC_FH, 0, 64));
    short_read.truncate(short_read.len() - 8);
    let len = u32::try_from(short_read.len()).unwrap_or(0);
    short_read[..4].copy_from_slice(&len.to_ne_bytes());
    let mut lying = request(FUSE_READ, 6, 5, read_in(ASYNC_FH, 0, 64));
    lying[..4].copy_from_slice(&4000u32.to_ne_bytes());
    let requests = vec![
        (request(FUSE_READ, 1, 5, read_in(ASYNC_FH + 1, 0, 64)), 256),
        (request(FUSE_READ, 2, 5, read_in(ASYNC_FH, huge, 64)), 256),
        (
            request(FUSE_READ, 3, 5, read_in(ASYNC_FH, i64::MAX as u64, 1)),
            256,
        ),
        (write_request(4, ASYNC_FH, huge, &[1, 2, 3]), 64),
        (short_read, 256),
        (lying, 256),
        // Reply space shorter than an out-header.
        (request(FUSE_READ, 7, 5, read_in(ASYNC_FH, 0, 64)), 8),
        // Room for part of the data only, and a read past the end of the file.
        (
            request(FUSE_READ, 8, 5, read_in(ASYNC_FH, 0, 4096)),
            16 + 100,
        ),
        (
            request(FUSE_READ, 9, 5, read_in(ASYNC_FH, FILE_SIZE - 10, 64)),
            256,
        ),
        (
            request(FUSE_READ, 10, 5, read_in(ASYNC_FH, FILE_SIZE + 10, 64)),
            256,
        ),
        (write_request(11, ASYNC_FH + 1, 0, &[1, 2, 3]), 64),
        (request(FUSE_READ, 12, 5, read_in(ASYNC_FH, 100, 64)), 256),
        // Larger than any request a guest kernel sends: the blocking way.
        (
            request(FUSE_READ, 13, 5, read_in(ASYNC_FH, 0, 2 << 20)),
            256,
        ),
    ];
    let blocking = replies(false, &requests);
    let nonblocking = replies(true, &requests);
    for (i, (b, n)) in blocking.iter().zip(&nonblocking).enumerate() {
        assert_eq!(b, n, "request #{i}: blocking and async answers differ");
    }
    let errno_of = |r: &Vec<u8>| i32::from_ne_bytes(r[4..8].try_into().unwrap_or([0; 4]));
    assert_eq!(errno_of(&nonblocking[0]), -libc::EBADF);
    assert_eq!(errno_of(&nonblocking[1]), -libc::EFBIG);
    assert_eq!(errno_of(&nonblocking[2]), -libc::EFBIG);
    assert_eq!(errno_of(&nonblocking[4]), -libc::EINVAL);
    assert_eq!(
        nonblocking[8].len(),
        16 + 10,
        "short read at the end of the file"
    );
    assert_eq!(nonblocking[9].len(), 16, "nothing past the end of the file");
    assert_eq!(nonblocking[11].len(), 16 + 64);
}

/// A stop with async requests in flight waits for them (bounded), and once they complete
/// they are answered and the stop finishes.
#[test]
fn stop_waits_for_async_requests_in_flight() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = async_backend(2);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    fs.aio.hold();
    for i in 0..8u64 {
        let req = write_request(i + 1, ASYNC_FH, i * 4096, &[7u8; 4096]);
        driver.submit(&req, 64);
    }
    kick(&backend, &vring, 1);
    assert_eq!(in_flight_async(&backend), 8);
    assert!(!backend.stop_and_drain(Duration::from_millis(100)));
    let releaser = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            fs.aio.release();
        })
    };
    assert!(backend.stop_and_drain(Duration::from_secs(5)));
    releaser
        .join()
        .unwrap_or_else(|_| panic!("releaser panicked"));
    assert_eq!(driver.used_idx(), 8);
    // Stopped: a new request is not taken.
    driver.submit(&write_request(99, ASYNC_FH, 0, &[1]), 64);
    kick(&backend, &vring, 1);
    assert_eq!(fs.aio.started(), 8);
    assert_eq!(driver.used_idx(), 8);
}

/// A READ alone (nothing else in flight, nothing behind it in the ring) is served the blocking
/// way: at depth 1 the async path does not pay. The next burst goes async again.
#[test]
fn a_lone_request_goes_the_blocking_way() {
    let (gm, mem) = memory();
    let mut driver = Driver::new(&gm);
    let vring = driver.vring(&mem);
    let (backend, fs) = async_backend(2);
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let reply = driver.submit(&request(FUSE_READ, 1, 5, read_in(ASYNC_FH, 64, 128)), 256);
    kick(&backend, &vring, 1);
    wait_used(&driver, 1);
    assert_eq!(fs.aio.started(), 0, "served the blocking way");
    let out: OutHeader = driver.read(reply);
    assert_eq!((out.error, out.unique, out.len), (0, 1, 16 + 128));
    for i in 0..4u64 {
        driver.submit(
            &request(FUSE_READ, 10 + i, 5, read_in(ASYNC_FH, i, 64)),
            256,
        );
    }
    kick(&backend, &vring, 1);
    wait_used(&driver, 5);
    assert!(fs.aio.started() >= 3, "a burst goes async");
    assert!(backend.stop_and_drain(Duration::from_secs(5)));
}
