//! One request's trip, from the descriptor chain the guest made available to the used ring: the
//! only code that reads a chain's descriptors or a request's bytes in guest memory.
//!
//! **Once.** When a chain is popped, its descriptors are read once, by [`walk`], into a
//! [`Request`]: the readable and the writable buffers (guest address and length), and the FUSE
//! in-header copied out of the first readable bytes. Everything decided about the request
//! (where it runs, what the server does) is decided from that copy; the guest rewriting its
//! descriptors or its header afterwards changes nothing. The walk follows virtio's rules as
//! virtio-queue's `DescriptorChain` does (one level of indirect table, a chain ends at the
//! table's size, at 4 GiB, or at a descriptor that cannot be read) and refuses a chain that comes
//! back to a descriptor it has been through (a loop: virtio-queue would follow it until its TTL
//! ran out, counting the same buffer again and again), one with more descriptors than a
//! request may have, and one whose buffers lie outside guest memory.
//!
//! **Private bytes.** The serving thread then copies the request's bytes out of guest memory
//! once, into memory of its own, and writes the reply there: only the bytes of a WRITE's data
//! stay in guest memory (zero copy), and only a READ's data (and a reply too large for the
//! private buffer) is written straight into the guest's buffers. So a guest rewriting a name
//! or an argument while its request is served cannot make the server see two different values,
//! and the reply's head (errno, size: the metrics) is read back from our own copy.
//!
//! **Two servers.** The opcodes the server decodes itself ([`FuseServer::serves_copied`]: the
//! cached metadata requests a guest repeats all the time) are served from that copy into the
//! private reply buffer, plain memory. Every other request goes to fuse-backend-rs, which reads
//! a request only through its `Reader` and writes through its `Writer`, both built from a
//! descriptor chain: for those the copy lives in a small region of this thread's own memory
//! mapped at [`BASE`] (above any guest physical address) next to the guest's regions, and a
//! private descriptor chain in that region points at the copy, at the WRITE data left in guest
//! memory, and at the private reply buffer (or at the guest's writable buffers). The private
//! queue is made once per thread; a request only rewrites its descriptors. Guest buffers are
//! checked to lie below the guest's last address, so none can name the private region.
//!
//! Nothing here panics on what the guest wrote.

use std::cell::RefCell;
use std::mem::size_of;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{InHeader, WriteIn};
use fuse_backend_rs::transport::{Reader, VirtioFsWriter, Writer};
use smallvec::SmallVec;
use tracing::warn;
use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{
    Address, ByteValued, Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap, MemoryRegionAddress, MmapRegion, VolatileSlice,
};

use super::deadline::{self, Claim};
use super::ring::Permit;
use super::{GuestBitmap, GuestMem, MemGuard, Vring};
use crate::metrics;
use crate::server::{FuseServer, Servable, Served, ServerError};
use crate::wire::{FUSE_READ, FUSE_WRITE, REPLY_HEAD_LEN};
use vhost_user_backend::VringState;

/// Where the private region starts: guest physical addresses stay far below (52 bits at most).
const BASE: u64 = 1 << 62;
/// Descriptors in the private table (a power of two, as virtqueue sizes must be).
const TABLE: u16 = 1024;
/// The most descriptors a request may have: the private chain needs one more for the request's
/// copy and one for the reply buffer.
#[allow(clippy::as_conversions)] // u16 to usize widens, and `From` is not const
pub(super) const MAX_DESCS: usize = TABLE as usize - 2;
/// Layout of the private region (offsets from [`BASE`]).
const DESC_AT: u64 = 0;
const AVAIL_AT: u64 = 0x4000;
const USED_AT: u64 = 0x5000;
const REQUEST_AT: u64 = 0x8000;
/// The most bytes of a request copied into private memory: every request Linux sends but a
/// WRITE's data fits (SETXATTR, the largest, carries 64 KiB of value and a name).
pub(super) const REQUEST_COPY: usize = 0x2_0000;
const REPLY_AT: u64 = REQUEST_AT + 0x2_0000;
/// The largest reply written into private memory first; READ's data, and a reply to a request
/// offering more room than this, go straight into the guest's buffers.
pub(super) const REPLY_COPY: usize = 0x2_0000;
const REGION_SIZE: usize = 0x4_8000;

/// `VRING_DESC_F_*` (u32 in virtio-bindings) as a descriptor's u16 flags.
#[allow(clippy::as_conversions, clippy::cast_possible_truncation)] // checked at compile time
const fn flag(f: u32) -> u16 {
    assert!(f <= 0xffff);
    f as u16
}
const F_NEXT: u16 = flag(VRING_DESC_F_NEXT);
const F_WRITE: u16 = flag(VRING_DESC_F_WRITE);
const F_INDIRECT: u16 = flag(VRING_DESC_F_INDIRECT);
/// Size of a split-ring descriptor.
const DESC_LEN: u64 = 16;

/// A buffer of the guest's: one descriptor's range of guest memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Buf {
    pub addr: u64,
    pub len: u32,
}

/// A request's buffers: a few fit inline, as for every request but large READs and WRITEs.
pub(super) type Bufs = SmallVec<[Buf; 4]>;

/// Why a chain is returned to the guest unanswered.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("The descriptor chain loops (a descriptor comes back)")]
    Loop,
    #[error("The request has more than {MAX_DESCS} descriptors")]
    TooLong,
    #[error("A descriptor lies outside guest memory")]
    OutsideMemory,
    #[error("The request is shorter than a FUSE in-header")]
    ShortHeader,
    #[error("Guest memory reaches the private request region")]
    MemoryTooHigh,
    #[error("Cannot copy the request out of guest memory")]
    CopyIn(#[source] vm_memory::GuestMemoryError),
    #[error("Cannot copy the reply into guest memory")]
    CopyOut(#[source] vm_memory::GuestMemoryError),
    #[error("Cannot set up the private request copy: {0}")]
    Setup(String),
    #[error("Cannot map the request's descriptors")]
    Transport(#[source] fuse_backend_rs::transport::Error),
    #[error("Cannot serve the request")]
    Server(#[source] ServerError),
    #[error("The ring stopped after the request was taken")]
    Stopped,
    #[error("The request was answered at --request-deadline before it was served")]
    Late,
}

/// How [`serve`] knows the request's ring still runs when it touches guest memory: after a stop
/// (GET_VRING_BASE) that memory belongs to whatever the guest does next (a rebooted kernel), and
/// a request taken before must not read or write it (`ring`).
#[derive(Clone, Copy)]
pub(super) enum Live<'a> {
    /// Take a permit of the ring for the request's generation.
    Check(&'a Vring, u64),
    /// The caller holds the vring's lock for the whole request (`drain_queue_locked`): the
    /// ring cannot stop meanwhile.
    Locked,
}

impl Live<'_> {
    /// Leave to touch guest memory: `None` if the ring stopped; `Some(None)` when the caller's
    /// lock is the leave.
    fn permit(self) -> Option<Option<Permit>> {
        match self {
            Live::Locked => Some(None),
            Live::Check(vring, generation) => vring.permit(generation).map(Some),
        }
    }

    /// Run `f` with leave to touch guest memory; `None` (nothing run) if the ring stopped.
    fn with<T>(self, f: impl FnOnce() -> T) -> Option<T> {
        let permit = self.permit()?;
        let out = f();
        drop(permit);
        Some(out)
    }
}

/// A popped chain, its descriptors read once (see the module documentation).
#[derive(Debug)]
pub(super) struct Request {
    pub head: u16,
    /// The in-header, copied from the first readable bytes; `None`: the chain is malformed
    /// (`fault`) or holds fewer readable bytes than a header.
    pub header: Option<InHeader>,
    readable: Bufs,
    writable: Bufs,
    readable_len: usize,
    writable_len: usize,
    /// Why the chain cannot be served; it is returned with nothing written.
    fault: Option<Fault>,
}

/// What [`walk`] found wrong with a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Loop,
    TooLong,
    OutsideMemory,
    ShortHeader,
}

impl From<Fault> for ChainError {
    fn from(f: Fault) -> Self {
        match f {
            Fault::Loop => ChainError::Loop,
            Fault::TooLong => ChainError::TooLong,
            Fault::OutsideMemory => ChainError::OutsideMemory,
            Fault::ShortHeader => ChainError::ShortHeader,
        }
    }
}

impl Request {
    pub fn opcode(&self) -> Option<u32> {
        self.header.map(|h| h.opcode)
    }
}

/// Reads descriptor `i` of a table: through one slice of the whole table when the table lies
/// in one region (always, for the tables drivers make), else one read each.
struct Table<'a> {
    mem: &'a GuestMemoryMmap<GuestBitmap>,
    addr: GuestAddress,
    size: u16,
    slice: Option<VolatileSlice<'a, vm_memory::bitmap::MS<'a, GuestMemoryMmap<GuestBitmap>>>>,
}

impl<'a> Table<'a> {
    fn new(mem: &'a GuestMemoryMmap<GuestBitmap>, addr: GuestAddress, size: u16) -> Self {
        let bytes = usize::from(size) * 16;
        Table {
            mem,
            addr,
            size,
            slice: mem.get_slice(addr, bytes).ok(),
        }
    }

    fn get(&self, i: u16) -> Option<Descriptor> {
        let off = u64::from(i) * DESC_LEN;
        match &self.slice {
            Some(s) => s.read_obj(usize::try_from(off).ok()?).ok(),
            None => self.mem.read_obj(self.addr.checked_add(off)?).ok(),
        }
    }
}

/// The indices of one table a walk has been through.
struct Seen {
    words: SmallVec<[u64; 16]>,
}

impl Seen {
    fn new(size: u16) -> Self {
        let n = usize::from(size).div_ceil(64);
        let mut words = SmallVec::new();
        words.resize(n, 0);
        Seen { words }
    }

    /// Mark `i`; false if it was marked already.
    fn first(&mut self, i: u16) -> bool {
        let (w, b) = (usize::from(i / 64), i % 64);
        match self.words.get_mut(w) {
            Some(word) => {
                let was = *word & (1 << b) != 0;
                *word |= 1 << b;
                !was
            }
            None => false,
        }
    }
}

/// Read the chain starting at descriptor `head` of the queue whose descriptor table is at
/// `table` with `size` entries (see the module documentation). Never fails: a chain that cannot
/// be served carries its fault.
pub(super) fn walk(
    mem: &GuestMemoryMmap<GuestBitmap>,
    table: GuestAddress,
    size: u16,
    head: u16,
) -> Request {
    let mut r = Request {
        head,
        header: None,
        readable: Bufs::new(),
        writable: Bufs::new(),
        readable_len: 0,
        writable_len: 0,
        fault: None,
    };
    if let Err(f) = collect(&mut r, mem, table, size, head) {
        r.fault = Some(f);
        return r;
    }
    r.header = read_header(mem, &r.readable);
    if r.header.is_none() {
        r.fault = Some(Fault::ShortHeader);
    }
    r
}

/// Follow the chain as virtio-queue's `DescriptorChain` does, into `r`'s buffers.
fn collect(
    r: &mut Request,
    mem: &GuestMemoryMmap<GuestBitmap>,
    table: GuestAddress,
    size: u16,
    head: u16,
) -> Result<(), Fault> {
    // Guest buffers must end at or below this (the private region is far above).
    let end_of_memory = mem.last_addr().raw_value().saturating_add(1);
    let mut t = Table::new(mem, table, size);
    let mut seen = Seen::new(size);
    let mut next = head;
    let mut indirect = false;
    let mut total: u32 = 0;
    let mut count = 0usize;
    loop {
        if next >= t.size {
            return Ok(());
        }
        if !seen.first(next) {
            return Err(Fault::Loop);
        }
        let Some(desc) = t.get(next) else {
            return Ok(());
        };
        if desc.flags() & F_INDIRECT != 0 {
            // One level only, a whole number of descriptors, at most 2^16 of them (virtio
            // 2.7.5.3); otherwise the chain ends here, as virtio-queue ends it.
            if indirect || u64::from(desc.len()) % DESC_LEN != 0 {
                return Ok(());
            }
            let Ok(n) = u16::try_from(u64::from(desc.len()) / DESC_LEN) else {
                return Ok(());
            };
            indirect = true;
            t = Table::new(mem, desc.addr(), n);
            seen = Seen::new(n);
            next = 0;
            continue;
        }
        // A chain of 4 GiB or more ends (virtio 2.7.5.2).
        let Some(sum) = total.checked_add(desc.len()) else {
            return Ok(());
        };
        total = sum;
        count += 1;
        if count > MAX_DESCS {
            return Err(Fault::TooLong);
        }
        let buf = Buf {
            addr: desc.addr().raw_value(),
            len: desc.len(),
        };
        let end = buf.addr.checked_add(u64::from(buf.len));
        if !end.is_some_and(|e| e <= end_of_memory) {
            return Err(Fault::OutsideMemory);
        }
        let len = usize::try_from(buf.len).unwrap_or(usize::MAX);
        if desc.flags() & F_WRITE != 0 {
            r.writable.push(buf);
            r.writable_len = r.writable_len.saturating_add(len);
        } else {
            r.readable.push(buf);
            r.readable_len = r.readable_len.saturating_add(len);
        }
        if desc.flags() & F_NEXT == 0 {
            return Ok(());
        }
        next = desc.next();
    }
}

/// The in-header from the first readable bytes (they may span descriptors).
fn read_header(mem: &GuestMemoryMmap<GuestBitmap>, readable: &[Buf]) -> Option<InHeader> {
    let mut header = InHeader::default();
    let n = copy_in(mem, readable, 0, header.as_mut_slice()).ok()?;
    (n == size_of::<InHeader>()).then_some(header)
}

/// A guest range as one slice when it lies in one region (the rule), else `None`.
fn slice_of(
    mem: &GuestMemoryMmap<GuestBitmap>,
    addr: u64,
    len: usize,
) -> Option<VolatileSlice<'_, vm_memory::bitmap::MS<'_, GuestMemoryMmap<GuestBitmap>>>> {
    mem.get_slice(GuestAddress(addr), len).ok()
}

/// Copy the readable bytes from offset `skip` on into `dst`, as far as both go; the number of
/// bytes copied.
fn copy_in(
    mem: &GuestMemoryMmap<GuestBitmap>,
    bufs: &[Buf],
    mut skip: usize,
    dst: &mut [u8],
) -> Result<usize, vm_memory::GuestMemoryError> {
    let mut done = 0;
    for b in bufs {
        if done == dst.len() {
            break;
        }
        let len = usize::try_from(b.len).unwrap_or(usize::MAX);
        if skip >= len {
            skip -= len;
            continue;
        }
        let addr = b.addr.saturating_add(len64(skip));
        let take = (len - skip).min(dst.len() - done);
        skip = 0;
        let Some(out) = dst.get_mut(done..done + take) else {
            break;
        };
        match slice_of(mem, addr, take) {
            Some(s) => {
                s.copy_to(out);
            }
            None => mem.read_slice(out, GuestAddress(addr))?,
        }
        done += take;
    }
    Ok(done)
}

/// Copy `src` into the writable buffers, in order.
pub(super) fn copy_out(
    mem: &GuestMemoryMmap<GuestBitmap>,
    bufs: &[Buf],
    mut src: &[u8],
) -> Result<(), vm_memory::GuestMemoryError> {
    for b in bufs {
        if src.is_empty() {
            break;
        }
        let take = usize::try_from(b.len).unwrap_or(usize::MAX).min(src.len());
        let (now, rest) = src.split_at(take);
        match slice_of(mem, b.addr, take) {
            Some(s) => s.copy_from(now),
            None => mem.write_slice(now, GuestAddress(b.addr))?,
        }
        src = rest;
    }
    Ok(())
}

/// `len` bytes of a buffer count.
fn len64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// This thread's private memory (see the module documentation).
struct Private {
    /// Request copy and reply of requests the server decodes itself.
    request: Vec<u8>,
    reply: Vec<u8>,
    /// The region at [`BASE`] and the private queue over it, for fuse-backend-rs; made on the
    /// first request that needs them.
    mapped: Option<Mapped>,
}

struct Mapped {
    region: Arc<GuestRegionMmap<GuestBitmap>>,
    queue: Queue,
    /// The guest's regions plus ours, rebuilt when guest memory changes. (The guest's regions
    /// are shared, not copied; the map keeps the regions it names alive, so a region at the
    /// same address is the same mapping.)
    composed: Option<Arc<GuestMemoryMmap<GuestBitmap>>>,
}

thread_local! {
    static PRIVATE: RefCell<Private> = const {
        RefCell::new(Private { request: Vec::new(), reply: Vec::new(), mapped: None })
    };
}

impl Mapped {
    fn new() -> Result<Self, ChainError> {
        let setup = |e: &dyn std::fmt::Display| ChainError::Setup(e.to_string());
        let mapping = MmapRegion::<GuestBitmap>::new(REGION_SIZE).map_err(|e| setup(&e))?;
        let region = GuestRegionMmap::new(mapping, GuestAddress(BASE))
            .map(Arc::new)
            .ok_or_else(|| ChainError::Setup("private region address overflows".into()))?;
        // Avail ring: flags 0, idx 1, ring[0] = descriptor 0, for good: each request rewinds
        // the queue to pop that one entry again.
        for (at, value) in [(0, 0u16), (2, 1), (4, 0)] {
            region
                .write_obj(value.to_le(), MemoryRegionAddress(AVAIL_AT + at))
                .map_err(|e| setup(&e))?;
        }
        let mut queue = Queue::new(TABLE).map_err(|e| setup(&e))?;
        queue
            .try_set_desc_table_address(GuestAddress(BASE + DESC_AT))
            .map_err(|e| setup(&e))?;
        queue
            .try_set_avail_ring_address(GuestAddress(BASE + AVAIL_AT))
            .map_err(|e| setup(&e))?;
        queue
            .try_set_used_ring_address(GuestAddress(BASE + USED_AT))
            .map_err(|e| setup(&e))?;
        queue.set_ready(true);
        Ok(Mapped {
            region,
            queue,
            composed: None,
        })
    }

    /// Guest memory plus this thread's region.
    fn compose(
        &mut self,
        guest: &GuestMemoryMmap<GuestBitmap>,
    ) -> Result<Arc<GuestMemoryMmap<GuestBitmap>>, ChainError> {
        if guest.last_addr().raw_value() >= BASE {
            return Err(ChainError::MemoryTooHigh);
        }
        // The same guest regions (the very same mappings), in the same order, then ours.
        let same = self.composed.as_ref().is_some_and(|m| {
            m.num_regions() == guest.num_regions() + 1
                && guest.iter().zip(m.iter()).all(|(g, m)| std::ptr::eq(g, m))
        });
        if !same {
            let composed = guest
                .insert_region(self.region.clone())
                .map_err(|e| ChainError::Setup(e.to_string()))?;
            self.composed = Some(Arc::new(composed));
        }
        self.composed
            .clone()
            .ok_or_else(|| ChainError::Setup("no memory map".into()))
    }

    fn put_desc(&self, i: usize, addr: u64, len: u32, flags: u16) -> Result<(), ChainError> {
        let next = u16::try_from(i + 1).unwrap_or(0);
        let desc = Descriptor::new(addr, len, flags, next);
        self.region
            .write_obj(desc, MemoryRegionAddress(DESC_AT + DESC_LEN * len64(i)))
            .map_err(|e| ChainError::Setup(e.to_string()))
    }
}

/// Make this thread's private memory now, so that the first request served here does not pay
/// for it (a failure is reported by the request that needs it).
pub(super) fn warm() {
    PRIVATE.with(|p| {
        let mut p = p.borrow_mut();
        if p.mapped.is_none() {
            p.mapped = Mapped::new().ok();
        }
    });
}

/// Serve request `r` of queue `queue` (popped with guest memory `mem`): copy it out, run the
/// server, copy the reply in. The bytes written to the guest, for the used ring.
pub(super) fn serve<F>(
    server: &FuseServer<F>,
    mem: &MemGuard,
    r: &Request,
    live: Live<'_>,
    queue: usize,
    start: Instant,
    claim: Option<&Claim>,
) -> Outcome
where
    F: Servable,
{
    let Some(header) = r.header.filter(|_| r.fault.is_none()) else {
        let fault = r.fault.unwrap_or(Fault::ShortHeader);
        return Outcome {
            used: Err(fault.into()),
            took: None,
        };
    };
    let mem: &GuestMemoryMmap<GuestBitmap> = mem;
    PRIVATE.with(|p| {
        let mut p = p.borrow_mut();
        if FuseServer::<F>::serves_copied(header.opcode)
            && r.readable_len <= REQUEST_COPY
            && r.writable_len <= REPLY_COPY
        {
            let trip = Trip {
                live,
                queue,
                start,
                claim,
            };
            serve_copied(server, mem, r, header, &mut p, trip)
        } else {
            let trip = Trip {
                live,
                queue,
                start,
                claim,
            };
            serve_mapped(server, mem, r, header, &mut p, trip)
        }
    })
}

/// Where a request being served came from and when it began.
#[derive(Clone, Copy)]
struct Trip<'a> {
    live: Live<'a>,
    queue: usize,
    start: Instant,
    /// `--request-deadline`: the serving thread answers only if the timer has not.
    claim: Option<&'a Claim>,
}

impl Trip<'_> {
    /// Whether this thread still answers the request (no claim: always).
    fn answers(&self) -> bool {
        self.claim.map_or(true, Claim::serve)
    }
}

/// What [`serve`] did: the bytes written to the guest (or why the chain goes back
/// unanswered), and how long the server took, when it was called.
pub(super) struct Outcome {
    pub used: Result<usize, ChainError>,
    pub took: Option<Duration>,
}

/// A request the server decodes itself: all of it copied into plain memory, the reply too.
fn serve_copied<F>(
    server: &FuseServer<F>,
    mem: &GuestMemoryMmap<GuestBitmap>,
    r: &Request,
    header: InHeader,
    p: &mut Private,
    trip: Trip<'_>,
) -> Outcome
where
    F: Servable,
{
    let Private { request, reply, .. } = p;
    // The buffers only grow (never zeroed again: every byte used is written first).
    let request = grown(request, r.readable_len);
    let head = size_of::<InHeader>();
    // The header as walked (the guest may have rewritten it since), then the rest.
    if let Some(h) = request.get_mut(..head) {
        h.copy_from_slice(header.as_slice());
    }
    if let Some(rest) = request.get_mut(head..) {
        let copied = trip
            .live
            .with(|| copy_in(mem, &r.readable, head, rest))
            .ok_or(ChainError::Stopped)
            .and_then(|c| c.map_err(ChainError::CopyIn));
        if let Err(e) = copied {
            return Outcome {
                used: Err(e),
                took: None,
            };
        }
    }
    let reply = grown(reply, r.writable_len);
    let served = server.serve_copied(header, request, reply, trip.queue, trip.start);
    if !trip.answers() {
        if let Ok(n) = served.written {
            server.drop_late_reply(&header, reply.get(..n).unwrap_or(&[]));
        }
        return Outcome {
            used: Err(ChainError::Late),
            took: Some(served.took),
        };
    }
    let used = served.written.map_err(ChainError::Server).and_then(|n| {
        let out = reply.get(..n).unwrap_or(&[]);
        trip.live
            .with(|| copy_out(mem, &r.writable, out))
            .ok_or(ChainError::Stopped)?
            .map_err(ChainError::CopyOut)?;
        Ok(n)
    });
    Outcome {
        used,
        took: Some(served.took),
    }
}

/// The first `len` bytes of `buf`, grown (zeroed) to hold them if it is shorter.
fn grown(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buf.len() < len {
        buf.resize(len, 0);
    }
    buf.get_mut(..len).unwrap_or(&mut [])
}

/// A request for fuse-backend-rs: the private chain (see the module documentation).
fn serve_mapped<F>(
    server: &FuseServer<F>,
    mem: &GuestMemoryMmap<GuestBitmap>,
    r: &Request,
    header: InHeader,
    p: &mut Private,
    trip: Trip<'_>,
) -> Outcome
where
    F: Servable,
{
    let private_reply = reply_private(header.opcode, r);
    let copied = copied_len(header, r);
    // A request whose data libcephfs moves in place (a WRITE's, a READ's) or whose reply goes
    // straight into the guest's buffers touches guest memory while it is served: it holds its
    // leave all along, and a stop waits for it. The others take it for their copies only, so
    // that one waiting long (SETLKW for another client's lock) does not hold up a stop.
    let in_place = r.readable_len > copied || !private_reply;
    let held = if in_place {
        match trip.live.permit() {
            Some(p) => Some(p),
            None => {
                return Outcome {
                    used: Err(ChainError::Stopped),
                    took: None,
                }
            }
        }
    } else {
        None
    };
    let live = if held.is_some() {
        Live::Locked
    } else {
        trip.live
    };
    let m = match mapped(p) {
        Ok(m) => m,
        Err(e) => {
            return Outcome {
                used: Err(e),
                took: None,
            }
        }
    };
    let region = m.region.clone();
    let served = with_private_io(
        m,
        mem,
        r,
        header,
        live,
        copied,
        private_reply,
        |reader, writer| {
            server.handle_message(header, reader, writer, trip.queue, trip.start, |n| {
                reply_head(mem, &region, private_reply, &r.writable, n)
            })
        },
    );
    if private_reply && !trip.answers() {
        if let Ok(Served { written: Ok(n), .. }) = &served {
            let mut late = vec![0u8; *n];
            if region
                .read_slice(&mut late, MemoryRegionAddress(REPLY_AT))
                .is_ok()
            {
                server.drop_late_reply(&header, &late);
            }
        }
        return Outcome {
            used: Err(ChainError::Late),
            took: served.as_ref().ok().map(|s| s.took),
        };
    }
    let outcome = match served {
        Ok(served) => Outcome {
            used: live
                .with(|| answer_mapped(mem, &region, r, header, private_reply, served.written))
                .unwrap_or(Err(ChainError::Stopped)),
            took: Some(served.took),
        },
        Err(e) => Outcome {
            used: Err(e),
            took: None,
        },
    };
    drop(held);
    outcome
}

/// Whether `r`'s reply is written into private memory first: every reply that fits, but a
/// READ's data, which goes straight into the guest's buffers unless `--request-deadline` may
/// answer it first (`deadline`).
fn reply_private(opcode: u32, r: &Request) -> bool {
    r.writable_len <= REPLY_COPY && (opcode != FUSE_READ || deadline::on())
}

/// What of `r` is copied into private memory: all of a request but a WRITE, whose data stays
/// where it is unless `--request-deadline` may answer it first (`deadline`).
fn copied_len(header: InHeader, r: &Request) -> usize {
    if header.opcode == FUSE_WRITE && !deadline::on() {
        r.readable_len
            .min(size_of::<InHeader>() + size_of::<WriteIn>())
    } else {
        r.readable_len.min(REQUEST_COPY)
    }
}

/// What fuse-backend-rs's answer makes of the chain: the private reply copied into the guest's
/// buffers, or a refusal answered with its errno.
fn answer_mapped(
    mem: &GuestMemoryMmap<GuestBitmap>,
    region: &GuestRegionMmap<GuestBitmap>,
    r: &Request,
    header: InHeader,
    private_reply: bool,
    result: Result<usize, ServerError>,
) -> Result<usize, ChainError> {
    let n = match result {
        Ok(n) => n,
        // fuse-backend-rs refused the request before serving it, without a reply: answer it
        // with the errno.
        Err(e) => match crate::server::refused_errno(&e) {
            Some(errno) if !is_forget(header.opcode) => {
                let out = crate::wire::error_header(header.unique, errno);
                let bytes = out.as_slice();
                if bytes.len() > r.writable_len {
                    return Err(ChainError::Server(e));
                }
                copy_out(mem, &r.writable, bytes).map_err(ChainError::CopyOut)?;
                return Ok(bytes.len());
            }
            _ => return Err(ChainError::Server(e)),
        },
    };
    if private_reply {
        reply_out(mem, region, r, n)?;
    }
    Ok(n)
}

/// This thread's private region and queue, made on first use.
fn mapped(p: &mut Private) -> Result<&mut Mapped, ChainError> {
    if p.mapped.is_none() {
        p.mapped = Some(Mapped::new()?);
    }
    p.mapped
        .as_mut()
        .ok_or_else(|| ChainError::Setup("no private region".into()))
}

/// Copy the first `n` bytes of the private reply buffer into the guest's writable buffers.
fn reply_out(
    mem: &GuestMemoryMmap<GuestBitmap>,
    region: &GuestRegionMmap<GuestBitmap>,
    r: &Request,
    n: usize,
) -> Result<(), ChainError> {
    if n == 0 {
        return Ok(());
    }
    let out = region
        .get_slice(MemoryRegionAddress(REPLY_AT), n)
        .map_err(|e| ChainError::Setup(e.to_string()))?;
    copy_region_out(mem, &r.writable, &out).map_err(ChainError::CopyOut)
}

/// Build fuse-backend-rs's reader and writer of `r` over the private chain and run `f` with
/// them: the reader starts with the private copy of the request (all of it but a WRITE's
/// data); the writer is the private reply buffer when `private_reply`, else the guest's
/// writable buffers.
#[allow(clippy::too_many_arguments)] // one request's parts, each from another place
fn with_private_io<T>(
    m: &mut Mapped,
    mem: &GuestMemoryMmap<GuestBitmap>,
    r: &Request,
    header: InHeader,
    live: Live<'_>,
    copied: usize,
    private_reply: bool,
    f: impl FnOnce(
        Reader<'_, vm_memory::bitmap::MS<'_, GuestMemoryMmap<GuestBitmap>>>,
        Writer<'_, vm_memory::bitmap::MS<'_, GuestMemoryMmap<GuestBitmap>>>,
    ) -> T,
) -> Result<T, ChainError> {
    let composite = m.compose(mem)?;
    let head = size_of::<InHeader>();
    let setup = |e: &dyn std::fmt::Display| ChainError::Setup(e.to_string());
    let copy = m
        .region
        .get_slice(MemoryRegionAddress(REQUEST_AT), copied)
        .map_err(|e| setup(&e))?;
    // The header as walked (the guest may have rewritten it since), then the rest.
    copy.write_slice(header.as_slice(), 0)
        .map_err(|e| setup(&e))?;
    let rest = copy.offset(head).map_err(|e| setup(&e))?;
    live.with(|| copy_region_in(mem, &r.readable, head, &rest))
        .ok_or(ChainError::Stopped)?
        .map_err(ChainError::CopyIn)?;
    // The private chain: the copy, the readable bytes past it, the reply space.
    let mut descs: SmallVec<[(u64, u32, u16); 8]> = SmallVec::new();
    let copied32 = u32::try_from(copied).map_err(|_| ChainError::TooLong)?;
    descs.push((BASE + REQUEST_AT, copied32, 0));
    let mut skip = copied;
    for b in &r.readable {
        let len = usize::try_from(b.len).unwrap_or(usize::MAX);
        if skip >= len {
            skip -= len;
            continue;
        }
        let rest = u32::try_from(len - skip).unwrap_or(0);
        descs.push((b.addr.saturating_add(len64(skip)), rest, 0));
        skip = 0;
    }
    if private_reply {
        let room = u32::try_from(r.writable_len).unwrap_or(0);
        descs.push((BASE + REPLY_AT, room, F_WRITE));
    } else {
        descs.extend(r.writable.iter().map(|b| (b.addr, b.len, F_WRITE)));
    }
    let last = descs.len() - 1;
    for (i, (addr, len, flags)) in descs.into_iter().enumerate() {
        let next = if i == last { 0 } else { F_NEXT };
        m.put_desc(i, addr, len, flags | next)?;
    }
    m.queue.set_next_avail(0);
    let chain = m
        .queue
        .pop_descriptor_chain(&*composite)
        .ok_or_else(|| ChainError::Setup("the private queue is empty".into()))?;
    let reader =
        Reader::from_descriptor_chain(&*composite, chain.clone()).map_err(ChainError::Transport)?;
    let writer = VirtioFsWriter::new(&*composite, chain).map_err(ChainError::Transport)?;
    Ok(f(reader, Writer::from(writer)))
}

/// Offer `r` to the server's async path (`nonblocking`), through the private chain as
/// [`serve`] builds it: a READ's reply space is the guest's buffers, a WRITE's the private
/// reply buffer. `None`: the chain cannot be offered (serve it the usual way, which says why).
#[cfg(libcephfs_nonblocking)]
pub(super) fn start_async<F>(
    server: &FuseServer<F>,
    mem: &MemGuard,
    r: &Request,
    live: Live<'_>,
    queue: usize,
    tag: u64,
) -> Option<crate::server::nonblocking::Started>
where
    F: Servable,
{
    use crate::server::nonblocking::Started;
    // The async path moves data in place: nothing the bound could answer first.
    if deadline::on() {
        return None;
    }
    let header = r.header.filter(|_| r.fault.is_none())?;
    let mem: &GuestMemoryMmap<GuestBitmap> = mem;
    let private_reply = reply_private(header.opcode, r);
    PRIVATE.with(|p| {
        let mut p = p.borrow_mut();
        let m = mapped(&mut p).ok()?;
        let region = m.region.clone();
        // The submission reads the request and a WRITE's data out of guest memory (an
        // answer given at once is written there too): with the ring's leave throughout.
        let _permit = live.permit()?;
        let copied = copied_len(header, r);
        let started = with_private_io(
            m,
            mem,
            r,
            header,
            Live::Locked,
            copied,
            private_reply,
            |reader, writer| server.start_async(header, reader, writer, queue, tag),
        )
        .ok()?;
        Some(match started {
            Started::Answered(Ok(n)) if private_reply => Started::Answered(
                reply_out(mem, &region, r, n)
                    .map(|()| n)
                    .map_err(|e| ServerError::WriteReply(std::io::Error::other(e.to_string()))),
            ),
            other => other,
        })
    })
}

/// Answer an async request into the buffers `r` was walked with (the guest's descriptors are
/// not read again). The bytes written.
#[cfg(libcephfs_nonblocking)]
pub(super) fn finish_async<F>(
    server: &FuseServer<F>,
    mem: &MemGuard,
    r: &Request,
    live: Live<'_>,
    request: crate::server::nonblocking::AsyncRequest,
    result: std::io::Result<crate::server::AsyncReply>,
) -> Result<usize, ChainError>
where
    F: Servable,
{
    let header = r.header.ok_or(ChainError::ShortHeader)?;
    let mem: &GuestMemoryMmap<GuestBitmap> = mem;
    PRIVATE.with(|p| {
        let mut p = p.borrow_mut();
        let m = mapped(&mut p)?;
        // The reply goes straight into the guest's buffers: with the ring's leave throughout.
        let _permit = live.permit().ok_or(ChainError::Stopped)?;
        let copied = copied_len(header, r);
        with_private_io(
            m,
            mem,
            r,
            header,
            Live::Locked,
            copied,
            false,
            |_, writer| server.finish_async(request, result, writer),
        )?
        .map_err(ChainError::Server)
    })
}

fn is_forget(opcode: u32) -> bool {
    opcode == crate::wire::FUSE_FORGET || opcode == crate::wire::FUSE_BATCH_FORGET
}

type RegionSlice<'a> = VolatileSlice<'a, vm_memory::bitmap::BS<'a, GuestBitmap>>;

/// [`copy_in`] into a slice of the private region.
fn copy_region_in(
    mem: &GuestMemoryMmap<GuestBitmap>,
    bufs: &[Buf],
    mut skip: usize,
    dst: &RegionSlice<'_>,
) -> Result<(), vm_memory::GuestMemoryError> {
    let mut done = 0;
    for b in bufs {
        if done >= dst.len() {
            break;
        }
        let len = usize::try_from(b.len).unwrap_or(usize::MAX);
        if skip >= len {
            skip -= len;
            continue;
        }
        let addr = b.addr.saturating_add(len64(skip));
        let take = (len - skip).min(dst.len() - done);
        skip = 0;
        let to = dst.subslice(done, take)?;
        match slice_of(mem, addr, take) {
            Some(s) => {
                s.copy_to_volatile_slice(to);
            }
            None => {
                let mut tmp = vec![0u8; take];
                mem.read_slice(&mut tmp, GuestAddress(addr))?;
                to.copy_from(&tmp);
            }
        }
        done += take;
    }
    Ok(())
}

/// [`copy_out`] from a slice of the private region.
fn copy_region_out(
    mem: &GuestMemoryMmap<GuestBitmap>,
    bufs: &[Buf],
    src: &RegionSlice<'_>,
) -> Result<(), vm_memory::GuestMemoryError> {
    let mut done = 0;
    for b in bufs {
        if done >= src.len() {
            break;
        }
        let take = usize::try_from(b.len)
            .unwrap_or(usize::MAX)
            .min(src.len() - done);
        let from = src.subslice(done, take)?;
        match slice_of(mem, b.addr, take) {
            Some(s) => {
                from.copy_to_volatile_slice(s);
            }
            None => {
                let mut tmp = vec![0u8; take];
                from.copy_to(&mut tmp[..]);
                mem.write_slice(&tmp, GuestAddress(b.addr))?;
            }
        }
        done += take;
    }
    Ok(())
}

/// The first bytes of an `n`-byte reply, for the metrics: from the private reply buffer, or
/// read back from the guest's buffers.
fn reply_head(
    mem: &GuestMemoryMmap<GuestBitmap>,
    region: &GuestRegionMmap<GuestBitmap>,
    private: bool,
    writable: &[Buf],
    n: usize,
) -> ([u8; REPLY_HEAD_LEN], usize) {
    let mut head = [0u8; REPLY_HEAD_LEN];
    let want = n.min(head.len());
    let Some(dst) = head.get_mut(..want) else {
        return (head, 0);
    };
    let filled = if private {
        region
            .read_slice(dst, MemoryRegionAddress(REPLY_AT))
            .map_or(0, |()| want)
    } else {
        copy_in(mem, writable, 0, dst).unwrap_or(0)
    };
    (head, filled)
}

/// Return chain `head` to the guest with `used` bytes written, and notify it when it asked to
/// be (EVENT_IDX's used_event, or no NO_INTERRUPT): one hold of the vring's lock. Nothing when
/// the ring the request came from was stopped meanwhile (`ring`). `mem` is the memory map the
/// request was served with: the used ring is written through it as the reply was.
pub(super) fn give_back(
    vring: &Vring,
    mem: &GuestMemoryMmap<GuestBitmap>,
    head: u16,
    used: u32,
    queue: usize,
    generation: u64,
) {
    use vhost_user_backend::VringT;
    let mut state = vring.get_mut();
    if !state.get_queue().ready() || !vring.current(generation) {
        metrics::global().record_dropped_answer();
        tracing::debug!(
            queue,
            head,
            "The ring stopped after this request was taken: its answer is dropped"
        );
        return;
    }
    used_ring(&mut state, mem, head, used, queue);
}

/// The used-ring end of a trip, for a caller holding the ring's lock: `head` used with `used`
/// bytes, and the guest notified if it asked to be. Through `split`, with the memory map the
/// caller holds: `VringState`'s own methods load the frontend's map anew for each call (two
/// atomic loads and releases per request), and translate each ring field anew.
fn used_ring(
    state: &mut VringState<GuestMem>,
    mem: &GuestMemoryMmap<GuestBitmap>,
    head: u16,
    used: u32,
    queue: usize,
) {
    match super::split::add_used(state.get_queue_mut(), mem, head, used) {
        Err(e) => {
            warn!(queue, head, error = %e, "Cannot return a descriptor chain to the guest");
        }
        Ok(false) => {}
        Ok(true) => {
            if let Err(e) = state.signal_used_queue() {
                warn!(queue, error = %e, "Cannot notify the guest");
            }
        }
    }
}

/// The whole trip of `r` for a caller that holds its ring's lock throughout
/// (`drain_queue_locked`: the ring cannot stop meanwhile).
pub(super) fn complete_locked<F>(
    server: &FuseServer<F>,
    state: &mut VringState<GuestMem>,
    mem: &MemGuard,
    r: &Request,
    queue: usize,
) where
    F: Servable,
{
    let outcome = serve(server, mem, r, Live::Locked, queue, Instant::now(), None);
    let used = used_len(outcome.used, queue, r.head);
    used_ring(state, mem, r.head, used, queue);
}

/// Serve `r` and give its chain back: the whole trip, begun at `start`. Never panics on guest
/// input. How long the server took, when it was called.
#[allow(clippy::too_many_arguments)] // one request's parts, each from another place
pub(super) fn complete<F>(
    server: &FuseServer<F>,
    vring: &Vring,
    mem: &MemGuard,
    r: &Request,
    generation: u64,
    queue: usize,
    start: Instant,
    claim: Option<&Claim>,
) -> Option<Duration>
where
    F: Servable,
{
    if claim.is_some_and(Claim::answered) {
        // The timer answered it while it waited for a thread: nothing left to do.
        return None;
    }
    let live = Live::Check(vring, generation);
    let outcome = serve(server, mem, r, live, queue, start, claim);
    if let Some(c) = claim {
        // Every way out resolves the claim: a chain the timer answered is not given back twice.
        if !c.serve() {
            return outcome.took;
        }
    }
    let used = used_len(outcome.used, queue, r.head);
    give_back(vring, mem, r.head, used, queue, generation);
    outcome.took
}

/// `--request-deadline`'s claim on `r`, popped just now from ring `vring` of `queue`, when the
/// bound is on and `r` is a request the timer may answer (`deadline`).
pub(super) fn claim(
    r: &Request,
    generation: u64,
    queue: usize,
    vring: &Vring,
    mem: &MemGuard,
) -> Option<Arc<Claim>> {
    // Off (the default): one load, no clock read, nothing of the request looked at.
    if !deadline::on() {
        return None;
    }
    let popped = Instant::now();
    let h = r.header.filter(|h| {
        r.fault.is_none()
            && deadline::eligible(
                h.opcode,
                r.readable_len <= REQUEST_COPY,
                reply_private(h.opcode, r),
                r.writable_len,
            )
    })?;
    deadline::register(
        h,
        &r.writable,
        r.head,
        generation,
        queue,
        vring,
        mem,
        popped,
    )
}

/// The used length of a served request: what was written, or 0 for a chain returned unanswered
/// (counted as malformed unless the server counted it).
pub(super) fn used_len(result: Result<usize, ChainError>, queue: usize, head: u16) -> u32 {
    match result {
        Ok(n) => u32::try_from(n).unwrap_or_else(|_| {
            warn!(
                queue,
                head, "Reply longer than 4 GiB; returning the chain empty"
            );
            0
        }),
        // Not answered at all: `give_back` sees the stop too and counts it.
        Err(ChainError::Stopped) => 0,
        // Answered by the timer already; the caller does not give it back.
        Err(ChainError::Late) => 0,
        Err(e) => {
            if !matches!(e, ChainError::Server(_)) {
                metrics::global().record_malformed();
            }
            warn!(queue, head, error = %super::error_chain(&e), "Malformed request; returning it unanswered");
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::QueueOwnedT;

    const MEM: usize = 0x2_0000;
    const SIZE: u16 = 16;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn flags(r: &mut Rng, indirect_ok: bool) -> u16 {
        let mut f = 0;
        if r.below(4) != 0 {
            f |= F_NEXT;
        }
        if r.below(3) == 0 {
            f |= F_WRITE;
        }
        if indirect_ok && r.below(8) == 0 {
            f |= F_INDIRECT;
        }
        f
    }

    fn buf_addr(r: &mut Rng) -> u64 {
        match r.below(20) {
            0 => MEM as u64 - r.below(64),
            1 => 1 << 62,
            _ => 0x8000 + r.below(0x1_0000),
        }
    }

    /// Our walk against virtio-queue's `DescriptorChain` over seeded random descriptor tables
    /// (indirect tables, loops, indices past the table, buffers outside memory): the same
    /// buffers in the same order when we serve the chain, and when we refuse it, the reason is
    /// in what virtio-queue yields (a descriptor again or a chain cut by its TTL, too many, one
    /// outside memory). We refuse a chain that comes back to a descriptor even where
    /// virtio-queue's TTL would cut it short and serve the rest: no driver builds one.
    #[test]
    fn the_walk_reads_chains_as_virtio_queue_does() {
        for seed in 0..3000u64 {
            let mut r = Rng(seed);
            let gm =
                GuestMemoryMmap::<GuestBitmap>::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
            let mq = MockSplitQueue::create(&gm, GuestAddress(0), SIZE);
            for i in 0..SIZE {
                let f = flags(&mut r, true);
                let (addr, len) = if f & F_INDIRECT != 0 {
                    // An indirect table somewhere in 0x1_0000.., sometimes oddly sized.
                    let n = if r.below(10) == 0 {
                        1100
                    } else {
                        1 + r.below(12)
                    };
                    let at = 0x1_0000 + 16 * r.below(64);
                    let len = if r.below(10) == 0 { 16 * n + 3 } else { 16 * n };
                    for j in 0..n.min(1100) {
                        let nested = r.below(10) == 0;
                        let (a, l) = (buf_addr(&mut r), r.below(200) as u32);
                        let f = flags(&mut r, nested);
                        let d = Descriptor::new(a, l, f, r.below(n + 2) as u16);
                        let _ = gm.write_obj(d, GuestAddress(at + 16 * j));
                    }
                    (at, len as u32)
                } else {
                    (
                        buf_addr(&mut r),
                        if r.below(30) == 0 {
                            u32::MAX
                        } else {
                            r.below(100) as u32
                        },
                    )
                };
                let next = r.below(u64::from(SIZE) + 3) as u16;
                mq.desc_table()
                    .store(i, RawDescriptor::from(Descriptor::new(addr, len, f, next)))
                    .unwrap();
            }
            let head = r.below(u64::from(SIZE) + 2) as u16;
            mq.avail().ring().ref_at(0).unwrap().store(head);
            mq.avail().idx().store(1);
            let mut q: Queue = mq.create_queue().unwrap();
            let theirs: Vec<Descriptor> = q.iter(&gm).unwrap().next().unwrap().collect();
            let ours = walk(&gm, mq.desc_table_addr(), SIZE, head);
            let ctx = format!("seed {seed}: ours {ours:?}, virtio-queue {theirs:?}");
            let as_buf = |d: &Descriptor| Buf {
                addr: d.addr().raw_value(),
                len: d.len(),
            };
            match ours.fault {
                None | Some(Fault::ShortHeader) => {
                    let read: Vec<Buf> = theirs
                        .iter()
                        .filter(|d| !d.is_write_only())
                        .map(as_buf)
                        .collect();
                    let write: Vec<Buf> = theirs
                        .iter()
                        .filter(|d| d.is_write_only())
                        .map(as_buf)
                        .collect();
                    assert_eq!(ours.readable.to_vec(), read, "{ctx}");
                    assert_eq!(ours.writable.to_vec(), write, "{ctx}");
                    assert_eq!(ours.fault.is_none(), ours.header.is_some(), "{ctx}");
                }
                Some(Fault::Loop) => {
                    // virtio-queue follows the loop until the table's size runs out (its TTL):
                    // it yields a descriptor again, or stops on one that still says NEXT.
                    let mut seen = std::collections::HashSet::new();
                    let repeats = theirs
                        .iter()
                        .any(|d| !seen.insert((d.addr().0, d.len(), d.flags(), d.next())));
                    let cut = theirs.last().is_some_and(|d| d.has_next());
                    assert!(repeats || cut, "{ctx}: a loop virtio-queue ends normally");
                }
                Some(Fault::TooLong) => assert!(theirs.len() > MAX_DESCS, "{ctx}"),
                Some(Fault::OutsideMemory) => {
                    let outside = theirs.iter().any(|d| {
                        d.addr()
                            .0
                            .checked_add(u64::from(d.len()))
                            .is_none_or(|e| e > MEM as u64)
                    });
                    assert!(outside, "{ctx}");
                }
            }
        }
    }

    /// The header is copied as walked, and the copy is what is served even when it spans
    /// descriptors; a guest changing its bytes afterwards changes nothing we decided.
    #[test]
    fn the_header_spans_descriptors_and_is_taken_once() {
        let gm = GuestMemoryMmap::<GuestBitmap>::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
        let mq = MockSplitQueue::create(&gm, GuestAddress(0), SIZE);
        let h = InHeader {
            len: 56,
            opcode: 3,
            unique: 9,
            nodeid: 1,
            ..Default::default()
        };
        gm.write_slice(h.as_slice(), GuestAddress(0x8000)).unwrap();
        let descs = [
            (0x8000u64, 7u32, F_NEXT),
            (0x8007, 33, F_NEXT),
            (0x9000, 64, F_WRITE),
        ];
        for (i, (a, l, f)) in descs.iter().enumerate() {
            let next = u16::try_from(i + 1).unwrap();
            mq.desc_table()
                .store(
                    next - 1,
                    RawDescriptor::from(Descriptor::new(*a, *l, *f, next)),
                )
                .unwrap();
        }
        let req = walk(&gm, mq.desc_table_addr(), SIZE, 0);
        gm.write_obj(0xffu32, GuestAddress(0x8004)).unwrap();
        assert_eq!(req.header.map(|h| (h.opcode, h.unique)), Some((3, 9)));
        assert_eq!((req.readable_len, req.writable_len), (40, 64));
    }
}
