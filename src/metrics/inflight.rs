//! Which FUSE request each serving thread is in, since when and on what: what the slow-request
//! watchdog ([`super::watchdog`]) reads.
//!
//! A guest request that never finishes (a libcephfs call waiting for a grant the MDS never
//! sends) must not stay invisible. So every request is noted where it is served: each thread
//! that serves FUSE requests (queue threads, pool workers) owns one [`Slot`], taken from a
//! process-wide list the first time it serves and given back when it ends. A thread serves one
//! request at a time, so its slot describes at most one; it writes it with relaxed atomic
//! stores framed by a sequence number (a seqlock with one writer). The hot path takes no lock,
//! does no read-modify-write (but when a request was slow) and touches no cache line another
//! serving thread writes: about 20 ns a request (`tracking_cost` below). The watchdog reads
//! every slot once a second and skips one that changed under it.
//!
//! A request is noted from the moment its thread starts serving it: one popped from its queue
//! but still waiting for a pool worker is not in any slot yet (the workers it waits behind are,
//! and `queue_in_flight` counts it).
//!
//! With the watchdog off (`--slow-request-secs 0`) nothing is noted at all.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// What the watchdog says about a request: its FUSE header, and for requests on an open file
/// the handle, offset and size read from their in-struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestInfo {
    pub opcode: u32,
    pub unique: u64,
    pub node: u64,
    /// The virtqueue it came from (0 is hiprio).
    pub queue: u16,
    pub fh: Option<u64>,
    pub offset: Option<u64>,
    pub size: Option<u64>,
}

/// A request seen in flight in one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// The slot's id (unique in the process).
    pub slot: u64,
    /// The request's sequence number in its slot: with `slot`, names this request.
    pub seq: u64,
    pub info: RequestInfo,
    /// When it started, in [`clock_ns`] time.
    pub started_ns: u64,
}

const HAS_FH: u64 = 1 << 48;
const HAS_OFFSET: u64 = 1 << 49;
const HAS_SIZE: u64 = 1 << 50;

/// One serving thread's current request. Aligned to a cache line of its own, so that threads
/// writing their slots do not contend.
#[derive(Debug)]
#[repr(align(128))]
pub struct Slot {
    id: u64,
    /// 4k+1 while request k is being written, 4k+2 while it is served, 4(k+1) once done.
    seq: AtomicU64,
    /// Opcode (bits 0..32), queue (32..48), which of fh/offset/size are there (48..51).
    op_queue: AtomicU64,
    unique: AtomicU64,
    node: AtomicU64,
    fh: AtomicU64,
    offset: AtomicU64,
    size: AtomicU64,
    started_ns: AtomicU64,
    /// The highest `seq` whose slowness was counted already (by the watchdog, or by the
    /// thread when the request finished), so each slow request is counted once.
    claimed: AtomicU64,
}

impl Slot {
    pub fn new(id: u64) -> Self {
        Slot {
            id,
            seq: AtomicU64::new(0),
            op_queue: AtomicU64::new(0),
            unique: AtomicU64::new(0),
            node: AtomicU64::new(0),
            fh: AtomicU64::new(0),
            offset: AtomicU64::new(0),
            size: AtomicU64::new(0),
            started_ns: AtomicU64::new(0),
            claimed: AtomicU64::new(0),
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Note a request that started at `started_ns`; returns its sequence number, for
    /// [`Slot::end`]. Only the owning thread calls this.
    pub fn begin(&self, info: &RequestInfo, started_ns: u64) -> u64 {
        let idle = self.seq.load(Ordering::Relaxed);
        self.seq.store(idle + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let mut op_queue = u64::from(info.opcode) | (u64::from(info.queue) << 32);
        let mut store = |field: &AtomicU64, value: Option<u64>, flag: u64| {
            if let Some(v) = value {
                field.store(v, Ordering::Relaxed);
                op_queue |= flag;
            }
        };
        store(&self.fh, info.fh, HAS_FH);
        store(&self.offset, info.offset, HAS_OFFSET);
        store(&self.size, info.size, HAS_SIZE);
        self.op_queue.store(op_queue, Ordering::Relaxed);
        self.unique.store(info.unique, Ordering::Relaxed);
        self.node.store(info.node, Ordering::Relaxed);
        self.started_ns.store(started_ns, Ordering::Relaxed);
        self.seq.store(idle + 2, Ordering::Release);
        idle + 2
    }

    /// The request `seq` (from [`Slot::begin`]) is answered.
    pub fn end(&self, seq: u64) {
        self.seq.store(seq + 2, Ordering::Release);
    }

    /// The request being served, if any and if the slot did not change while being read.
    pub fn read(&self) -> Option<Snapshot> {
        let seq = self.seq.load(Ordering::Acquire);
        if seq % 4 != 2 {
            return None;
        }
        let op_queue = self.op_queue.load(Ordering::Relaxed);
        let field = |f: &AtomicU64, flag: u64| {
            let v = f.load(Ordering::Relaxed);
            (op_queue & flag != 0).then_some(v)
        };
        let info = RequestInfo {
            // Masked to their widths: the conversions cannot fail.
            opcode: u32::try_from(op_queue & 0xffff_ffff).unwrap_or(0),
            queue: u16::try_from((op_queue >> 32) & 0xffff).unwrap_or(0),
            unique: self.unique.load(Ordering::Relaxed),
            node: self.node.load(Ordering::Relaxed),
            fh: field(&self.fh, HAS_FH),
            offset: field(&self.offset, HAS_OFFSET),
            size: field(&self.size, HAS_SIZE),
        };
        let started_ns = self.started_ns.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if self.seq.load(Ordering::Relaxed) != seq {
            return None;
        }
        Some(Snapshot {
            slot: self.id,
            seq,
            info,
            started_ns,
        })
    }

    /// Take the right to count request `seq` as slow; true for the first caller only.
    pub fn claim(&self, seq: u64) -> bool {
        self.claimed.fetch_max(seq, Ordering::AcqRel) < seq
    }
}

/// Every serving thread's slot. Slots live as long as the process: a thread that ends gives
/// its slot back for the next one, so there are never more than the most threads that served
/// at once, and the hot path holds a plain reference (no reference count to touch).
#[derive(Debug, Default)]
pub struct Registry {
    inner: Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    all: Vec<&'static Slot>,
    free: Vec<&'static Slot>,
}

impl Registry {
    pub const fn new() -> Self {
        Registry {
            inner: Mutex::new(Slots {
                all: Vec::new(),
                free: Vec::new(),
            }),
        }
    }

    /// A slot for a thread: one a finished thread gave back, or a new one.
    pub fn acquire(&self) -> &'static Slot {
        let mut slots = self.lock();
        if let Some(slot) = slots.free.pop() {
            return slot;
        }
        let id = u64::try_from(slots.all.len()).unwrap_or(u64::MAX);
        let slot: &'static Slot = Box::leak(Box::new(Slot::new(id)));
        slots.all.push(slot);
        slot
    }

    /// Give back the slot of a thread that is ending (it serves nothing any more).
    pub fn release(&self, slot: &'static Slot) {
        self.lock().free.push(slot);
    }

    /// Every slot (those given back serve nothing and read as empty).
    pub fn slots(&self) -> Vec<&'static Slot> {
        self.lock().all.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

static REGISTRY: Registry = Registry::new();

/// The process-wide list the serving threads register in.
pub fn registry() -> &'static Registry {
    &REGISTRY
}

/// A thread's hold on its slot, given back when the thread ends.
struct Owned(&'static Slot);

impl Drop for Owned {
    fn drop(&mut self) {
        REGISTRY.release(self.0);
    }
}

thread_local! {
    /// This thread's slot: taken the first time the thread serves a request.
    static MINE: Owned = Owned(REGISTRY.acquire());
}

/// The slow-request bound in nanoseconds; 0 = the watchdog is off and nothing is noted.
static BOUND_NS: AtomicU64 = AtomicU64::new(0);

/// Set the bound past which a request is slow (`--slow-request-secs`); zero turns tracking off.
pub fn set_slow_bound(bound: Duration) {
    BOUND_NS.store(duration_ns(bound), Ordering::Relaxed);
}

/// The bound set by [`set_slow_bound`]; `None` when off.
pub fn slow_bound() -> Option<Duration> {
    match BOUND_NS.load(Ordering::Relaxed) {
        0 => None,
        ns => Some(Duration::from_nanos(ns)),
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The monotonic clock slots are stamped with: nanoseconds since the first use.
pub fn clock_ns(at: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    duration_ns(at.saturating_duration_since(epoch))
}

/// A request noted in this thread's slot; the slot is cleared when this is dropped (also on
/// unwind, so a panicking handler does not leave a request "stuck" forever).
#[derive(Debug)]
pub struct Tracked {
    slot: &'static Slot,
    seq: u64,
    info: RequestInfo,
    bound: Duration,
    /// The slot is the request's own (see [`track_detached`]), given back when it ends.
    detached: bool,
}

/// Note a request that started at `start` in this thread's slot, unless the watchdog is off.
/// `info` is only called when it is on.
pub fn track(start: Instant, info: impl FnOnce() -> RequestInfo) -> Option<Tracked> {
    let bound = slow_bound()?;
    let slot = MINE.try_with(|owned| owned.0).ok()?;
    Some(Tracked::begin(slot, start, info(), bound, false))
}

/// [`track`] for a request no thread serves while it waits (a READ or WRITE in flight in
/// libcephfs without a thread: `vhost_user::nonblocking`): it takes a slot of its own from the
/// registry, given back when it is answered, so the watchdog sees it as any other.
#[cfg(libcephfs_nonblocking)]
pub fn track_detached(start: Instant, info: impl FnOnce() -> RequestInfo) -> Option<Tracked> {
    let bound = slow_bound()?;
    Some(Tracked::begin(
        REGISTRY.acquire(),
        start,
        info(),
        bound,
        true,
    ))
}

impl Tracked {
    fn begin(
        slot: &'static Slot,
        start: Instant,
        info: RequestInfo,
        bound: Duration,
        detached: bool,
    ) -> Tracked {
        let seq = slot.begin(&info, clock_ns(start));
        Tracked {
            slot,
            seq,
            info,
            bound,
            detached,
        }
    }

    /// The request was answered after `elapsed`: clear the slot, and account for it if it was
    /// slow (see [`super::watchdog::finished`]).
    pub fn finish(self, elapsed: Duration) {
        if elapsed >= self.bound {
            let first = self.slot.claim(self.seq);
            super::watchdog::finished(&self.info, elapsed, self.bound, first);
        }
        // Drop clears the slot.
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.slot.end(self.seq);
        if self.detached {
            REGISTRY.release(self.slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_at(fh: u64) -> RequestInfo {
        RequestInfo {
            opcode: 16,
            unique: 42,
            node: 7,
            queue: 1,
            fh: Some(fh),
            offset: Some(4096),
            size: Some(512),
        }
    }

    #[test]
    fn a_slot_shows_the_request_it_serves_and_nothing_after() {
        let slot = Slot::new(3);
        assert_eq!(slot.read(), None, "a fresh slot serves nothing");
        let seq = slot.begin(&write_at(9), 1234);
        let seen = slot.read().unwrap_or_else(|| panic!("request not visible"));
        assert_eq!(
            seen,
            Snapshot {
                slot: 3,
                seq,
                info: write_at(9),
                started_ns: 1234
            }
        );
        slot.end(seq);
        assert_eq!(slot.read(), None);
        // The next request has a new sequence number and none of the old one's fields.
        let getattr = RequestInfo {
            opcode: 3,
            unique: 44,
            node: 1,
            queue: 2,
            ..Default::default()
        };
        let next = slot.begin(&getattr, 99);
        assert!(next > seq);
        let seen = slot.read().unwrap_or_else(|| panic!("request not visible"));
        assert_eq!(seen.info, getattr);
        assert_eq!(seen.seq, next);
        // Guest-sized values survive the packing.
        let odd = RequestInfo {
            opcode: u32::MAX,
            queue: u16::MAX,
            unique: u64::MAX,
            node: u64::MAX,
            fh: Some(u64::MAX),
            offset: Some(0),
            size: None,
        };
        slot.end(next);
        let s = slot.begin(&odd, u64::MAX);
        assert_eq!(slot.read().map(|r| r.info), Some(odd));
        slot.end(s);
    }

    #[test]
    fn a_slow_request_is_claimed_once() {
        let slot = Slot::new(1);
        let first = slot.begin(&write_at(1), 0);
        assert!(slot.claim(first));
        assert!(
            !slot.claim(first),
            "the second claimant must not count it again"
        );
        slot.end(first);
        let second = slot.begin(&write_at(1), 0);
        // A stale claim of the old request does not take the new one's.
        assert!(!slot.claim(first));
        assert!(slot.claim(second));
        slot.end(second);
    }

    #[test]
    fn the_registry_reuses_slots_of_finished_threads() {
        let reg = Registry::new();
        let kept = reg.acquire();
        let gone = reg.acquire();
        assert_ne!(kept.id(), gone.id());
        reg.release(gone);
        let again = reg.acquire();
        assert_eq!(again.id(), gone.id(), "a given-back slot is reused");
        let fresh = reg.acquire();
        let ids: Vec<u64> = reg.slots().iter().map(|s| s.id()).collect();
        assert_eq!(ids, vec![kept.id(), gone.id(), fresh.id()]);
    }

    #[test]
    fn threads_give_their_slot_back_when_they_end() {
        // Tracking stays on for the rest of this test process (other tests may rely on it).
        set_slow_bound(Duration::from_secs(3600));
        let used = std::thread::spawn(|| {
            let t = track(Instant::now(), RequestInfo::default)
                .unwrap_or_else(|| panic!("tracking is on"));
            let id = t.slot.id();
            assert!(t.slot.read().is_some());
            drop(t);
            id
        })
        .join()
        .unwrap_or_else(|_| panic!("thread panicked"));
        let slot = registry()
            .slots()
            .into_iter()
            .find(|s| s.id() == used)
            .unwrap_or_else(|| panic!("slot {used} not listed"));
        assert_eq!(slot.read(), None, "the ended request left nothing behind");
    }

    #[test]
    fn readers_never_see_a_torn_request() {
        // One writer cycles through requests whose fields all carry the same number; a reader
        // must only ever see consistent ones.
        let slot: &'static Slot = Box::leak(Box::new(Slot::new(1)));
        let writer = {
            std::thread::spawn(move || {
                for n in 1..200_000u64 {
                    let info = RequestInfo {
                        opcode: (n % 50) as u32,
                        unique: n,
                        node: n,
                        queue: (n % 7) as u16,
                        fh: Some(n),
                        offset: Some(n),
                        size: (n % 2 == 0).then_some(n),
                    };
                    let seq = slot.begin(&info, n);
                    slot.end(seq);
                }
            })
        };
        let mut seen = 0;
        while !writer.is_finished() {
            if let Some(s) = slot.read() {
                let n = s.info.unique;
                assert_eq!(s.info.node, n);
                assert_eq!(s.info.fh, Some(n));
                assert_eq!(s.info.offset, Some(n));
                assert_eq!(s.info.size, (n % 2 == 0).then_some(n));
                assert_eq!(s.info.opcode, (n % 50) as u32);
                assert_eq!(s.started_ns, n);
                seen += 1;
            }
        }
        writer.join().unwrap_or_else(|_| panic!("writer panicked"));
        println!("{seen} consistent reads");
    }

    /// What tracking adds to a request, on and off. A measurement, not a check:
    /// `cargo test --release --lib tracking_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement: run it alone, in release"]
    fn tracking_cost() {
        const N: u32 = 20_000_000;
        let per_request = |bound: Duration| {
            set_slow_bound(bound);
            let start = Instant::now();
            for i in 0..N {
                let now = Instant::now();
                let info = || RequestInfo {
                    opcode: 3,
                    unique: u64::from(i),
                    node: 1,
                    queue: 1,
                    ..RequestInfo::default()
                };
                let tracked = std::hint::black_box(track(now, info));
                // The server reads the clock once more per request anyway.
                let elapsed = std::hint::black_box(now.elapsed());
                if let Some(t) = tracked {
                    t.finish(elapsed);
                }
            }
            start.elapsed() / N
        };
        let (mut off, mut on) = (Duration::MAX, Duration::MAX);
        for _ in 0..5 {
            off = off.min(per_request(Duration::ZERO));
            on = on.min(per_request(Duration::from_secs(3600)));
        }
        println!("per request, with its two clock reads (best of 5): off {off:?}, on {on:?}");
    }

    #[test]
    fn clock_is_monotonic_from_first_use() {
        let a = clock_ns(Instant::now());
        let b = clock_ns(Instant::now() + Duration::from_secs(1));
        assert!(b >= a + 999_000_000);
    }
}
