//! The hiprio ring served by the request-queue threads while they poll (`vhost_user::hiprio`):
//! FORGETs made while one polls need no kick and are served; the hiprio queue's notifications
//! are on again once it sleeps; a watcher held by a slow request leaves the hiprio ring to the
//! rescuer; and seeded random schedules of a guest, the hiprio thread and the request queue's
//! thread never leave a FORGET in a ring nobody watches, nor serve one twice.

use std::sync::atomic::fence;
use std::sync::mpsc;

use fuse_backend_rs::abi::fuse_abi::ForgetIn;
use vm_memory::GuestMemory;

use super::*;

/// FUSE_FORGET (Linux `include/uapi/linux/fuse.h`).
const FUSE_FORGET: u32 = 2;
/// Where the two rings and their buffers lie in the test's guest memory.
const REQUEST_RING: u64 = 0x4_0000;
const HIPRIO_RING: u64 = 0x6_0000;
/// Bytes of one request's buffers (request, then reply).
const SLOT_BYTES: u64 = 512;
const REPLY_AT: u64 = 256;

/// A guest driver of one ring that reuses its descriptors (laid out by hand: virtio-queue's
/// mock lays its used ring over the end of its avail ring): chain `i` of the ring takes slot
/// `i % slots`, and a slot is taken again only once the device has used as many chains as
/// there are slots since. Request chains are a readable descriptor and, with `reply`, a
/// writable one (hiprio chains have none, as the Linux driver sends them).
struct Ring<'a> {
    gm: &'a GuestMemoryMmap<GuestBitmap>,
    /// Descriptor table, avail ring, used ring.
    desc: u64,
    avail: u64,
    used: u64,
    data: u64,
    reply: bool,
    event_idx: bool,
    /// Chains published.
    published: u16,
    /// The avail index at the last kick decision.
    decided: u16,
}

impl<'a> Ring<'a> {
    fn new(gm: &'a GuestMemoryMmap<GuestBitmap>, base: u64, reply: bool, event_idx: bool) -> Self {
        Ring {
            gm,
            desc: base,
            avail: base + 0x400,
            used: base + 0x800,
            data: base + 0x1000,
            reply,
            event_idx,
            published: 0,
            decided: 0,
        }
    }

    fn slots(&self) -> u16 {
        if self.reply {
            QSIZE / 2
        } else {
            QSIZE
        }
    }

    fn vring(&self, mem: &GuestMem) -> Vring {
        let vring = Vring::new(mem.clone(), QSIZE).unwrap_or_else(|e| panic!("{e}"));
        vring
            .set_queue_info(self.desc, self.avail, self.used)
            .unwrap_or_else(|e| panic!("{e}"));
        vring.set_queue_size(QSIZE);
        vring.set_queue_event_idx(self.event_idx);
        vring.set_queue_ready(true);
        vring
    }

    fn load16(&self, at: u64) -> u16 {
        let slice = self
            .gm
            .get_slice(GuestAddress(at), 2)
            .unwrap_or_else(|e| panic!("{e}"));
        u16::from_le(
            slice
                .load::<u16>(0, Ordering::Acquire)
                .unwrap_or_else(|e| panic!("{e}")),
        )
    }

    fn store16(&self, at: u64, v: u16) {
        let slice = self
            .gm
            .get_slice(GuestAddress(at), 2)
            .unwrap_or_else(|e| panic!("{e}"));
        slice
            .store(u16::to_le(v), 0, Ordering::Release)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    fn used(&self) -> u16 {
        self.load16(self.used + 2)
    }

    fn avail_event(&self) -> u16 {
        self.load16(self.used + 4 + 8 * u64::from(QSIZE))
    }

    fn used_flags(&self) -> u16 {
        self.load16(self.used)
    }

    /// Publish `request` (waiting, at most 10 s, for a free slot).
    fn publish(&mut self, request: &[u8]) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.published.wrapping_sub(self.used()) >= self.slots() {
            assert!(
                Instant::now() < deadline,
                "no slot came free: {} published, {} used",
                self.published,
                self.used()
            );
            std::thread::yield_now();
        }
        let slot = self.published % self.slots();
        let req = self.data + u64::from(slot) * SLOT_BYTES;
        self.gm
            .write_slice(request, GuestAddress(req))
            .unwrap_or_else(|e| panic!("{e}"));
        let len = u32::try_from(request.len()).unwrap_or(0);
        let (head, descs) = if self.reply {
            let head = 2 * slot;
            let next = u16::try_from(VRING_DESC_F_NEXT).unwrap_or(0);
            let write = u16::try_from(VRING_DESC_F_WRITE).unwrap_or(0);
            (
                head,
                vec![
                    (head, SplitDescriptor::new(req, len, next, head + 1)),
                    (
                        head + 1,
                        SplitDescriptor::new(req + REPLY_AT, 256, write, 0),
                    ),
                ],
            )
        } else {
            (slot, vec![(slot, SplitDescriptor::new(req, len, 0, 0))])
        };
        for (i, d) in descs {
            self.gm
                .write_obj(d, GuestAddress(self.desc + 16 * u64::from(i)))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let avail = self.avail;
        self.store16(avail + 4 + 2 * u64::from(self.published % QSIZE), head);
        self.published = self.published.wrapping_add(1);
        self.store16(avail + 2, self.published);
    }

    /// Whether the device asked to be kicked for what was published since the last decision
    /// (Linux's `virtqueue_kick_prepare`).
    fn needs_kick(&mut self) -> bool {
        // The index is visible before the device's wish is read (the driver's full barrier).
        fence(Ordering::SeqCst);
        let (old, new) = (self.decided, self.published);
        self.decided = new;
        if self.event_idx {
            let event = self.avail_event();
            new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
        } else {
            self.used_flags() & 1 == 0
        }
    }
}

fn forget(unique: u64) -> Vec<u8> {
    request(FUSE_FORGET, unique, 5, ForgetIn { nlookup: 1 })
}

fn getattr(unique: u64) -> Vec<u8> {
    request(FUSE_GETATTR, unique, ROOT_ID, GetattrIn::default())
}

/// A backend of one request queue with `threads` workers, polling for up to `poll`.
fn polling(threads: usize, poll: Duration) -> (VhostUserFsBackend<TestFs>, Arc<TestFs>) {
    let fs = Arc::new(TestFs::default());
    let options = BackendOptions {
        tag: None,
        request_queues: 1,
        thread_pool_size: threads,
        poll,
        nonblocking: false,
    };
    let backend = VhostUserFsBackend::new(fs.clone(), &options).unwrap_or_else(|e| panic!("{e}"));
    (backend, fs)
}

/// Wait, at most 10 s, until `done`.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::yield_now();
    }
}

/// The start the tests share: the guest's first FORGET, which the hiprio thread serves before it
/// sleeps with its notifications on; the request queue's polling window opened at `window`; an
/// INIT published on the request ring, whose kick is due.
fn begin(
    backend: &VhostUserFsBackend<TestFs>,
    rq: &mut Ring<'_>,
    hi: &mut Ring<'_>,
    hv: &Vring,
    window: Duration,
) {
    hi.publish(&forget(1));
    assert!(hi.needs_kick());
    kick(backend, hv, HIPRIO_QUEUE);
    assert_eq!(hi.used(), 1);
    backend.set_poll_window(1, window);
    rq.publish(&init_request(2));
    assert!(rq.needs_kick());
}

/// While the request queue's thread polls, it serves the FORGETs of the hiprio ring: after
/// the first (whose kick the hiprio thread still asked for), none needs a kick. Once it
/// sleeps, the hiprio queue's notifications are on again. Each FORGET reaches the filesystem
/// once.
#[test]
fn forgets_made_while_a_request_queue_polls_need_no_kick() {
    for event_idx in [false, true] {
        let (gm, mem) = memory();
        let mut rq = Ring::new(&gm, REQUEST_RING, true, event_idx);
        let mut hi = Ring::new(&gm, HIPRIO_RING, false, event_idx);
        let (rv, hv) = (rq.vring(&mem), hi.vring(&mem));
        let (backend, fs) = polling(2, Duration::from_secs(3));
        backend
            .update_memory(mem.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        begin(&backend, &mut rq, &mut hi, &hv, Duration::from_secs(3));
        std::thread::scope(|s| {
            let queue_thread = s.spawn(|| kick(&backend, &rv, 1));
            until("the request thread watches the hiprio ring", || {
                backend.inner.hiprio.any()
            });
            // The hiprio thread turned its notifications on when it slept: this one is kicked.
            hi.publish(&forget(3));
            if hi.needs_kick() {
                kick(&backend, &hv, HIPRIO_QUEUE);
            }
            until("FORGET 3 served", || hi.used() == 2);
            for unique in 4..40u64 {
                hi.publish(&forget(unique));
                assert!(
                    !hi.needs_kick(),
                    "FORGET {unique} asked for a kick while a request thread polls \
                     (event_idx={event_idx})"
                );
                until("a FORGET served without a kick", || {
                    u64::from(hi.used()) == unique - 1
                });
                if unique % 4 == 0 {
                    rq.publish(&getattr(unique + 1000));
                    assert!(!rq.needs_kick());
                    until("a GETATTR served without a kick", || {
                        u64::from(rq.used()) == 1 + unique / 4 - 1
                    });
                }
            }
            queue_thread
                .join()
                .unwrap_or_else(|_| panic!("queue thread panicked"));
        });
        assert!(!backend.inner.hiprio.any());
        // Asleep: the next FORGET asks for a kick again.
        if event_idx {
            assert_eq!(
                hi.avail_event(),
                hi.published,
                "avail_event after the watch"
            );
        } else {
            assert_eq!(hi.used_flags(), 0, "VRING_USED_F_NO_NOTIFY after the watch");
        }
        hi.publish(&forget(99));
        assert!(hi.needs_kick());
        kick(&backend, &hv, HIPRIO_QUEUE);
        assert_eq!(hi.used(), hi.published);
        assert_eq!(
            fs.forgotten.load(Ordering::SeqCst),
            u64::from(hi.published),
            "each FORGET reaches the filesystem once"
        );
    }
}

/// Without workers there is no rescuer to serve the hiprio ring while a watcher is held by a
/// slow request (every request is served in order on its queue): a polling thread leaves the
/// hiprio ring to its own thread.
#[test]
fn without_workers_a_polling_thread_leaves_the_hiprio_ring_alone() {
    let (gm, mem) = memory();
    let mut rq = Ring::new(&gm, REQUEST_RING, true, true);
    let mut hi = Ring::new(&gm, HIPRIO_RING, false, true);
    let (rv, hv) = (rq.vring(&mem), hi.vring(&mem));
    let (backend, _fs) = polling(0, Duration::from_millis(300));
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    begin(&backend, &mut rq, &mut hi, &hv, Duration::from_millis(300));
    std::thread::scope(|s| {
        let queue_thread = s.spawn(|| kick(&backend, &rv, 1));
        until("the INIT served", || rq.used() == 1);
        for _ in 0..100 {
            assert!(!backend.inner.hiprio.any());
            hi.publish(&forget(3));
            assert!(hi.needs_kick(), "the hiprio ring's notifications stay on");
            kick(&backend, &hv, HIPRIO_QUEUE);
            assert_eq!(hi.used(), hi.published);
        }
        queue_thread
            .join()
            .unwrap_or_else(|_| panic!("queue thread panicked"));
    });
}

/// The request queue's thread watches the hiprio ring, then serves a LOOKUP that stalls (an
/// MDS that does not answer): the FORGETs the guest puts on the hiprio ring meanwhile, without
/// a kick, are served by the rescuer.
#[test]
fn a_watcher_held_by_a_stalled_request_leaves_the_hiprio_ring_to_the_rescuer() {
    let (gm, mem) = memory();
    let mut rq = Ring::new(&gm, REQUEST_RING, true, true);
    let mut hi = Ring::new(&gm, HIPRIO_RING, false, true);
    let (rv, hv) = (rq.vring(&mem), hi.vring(&mem));
    let (backend, fs) = polling(2, Duration::from_secs(3));
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    begin(&backend, &mut rq, &mut hi, &hv, Duration::from_secs(3));
    std::thread::scope(|s| {
        let queue_thread = s.spawn(|| kick(&backend, &rv, 1));
        until("the request thread watches the hiprio ring", || {
            backend.inner.hiprio.any()
        });
        fs.stall();
        // Should an assertion below fail, the LOOKUP must end for the scope to.
        let _unstall = Unstall(&fs);
        rq.publish(&lookup_request(3, "stall"));
        assert!(!rq.needs_kick());
        fs.wait_stalled();
        hi.publish(&forget(4));
        if hi.needs_kick() {
            kick(&backend, &hv, HIPRIO_QUEUE);
        }
        until("FORGET 4 served", || hi.used() == 2);
        hi.publish(&forget(5));
        assert!(!hi.needs_kick(), "a watcher is registered");
        until("FORGET 5 served while the watcher is stalled", || {
            hi.used() == 3
        });
        assert_eq!(rq.used(), 1, "the LOOKUP is still stalled");
        fs.unstall();
        until("the LOOKUP answered", || rq.used() == 2);
        queue_thread
            .join()
            .unwrap_or_else(|_| panic!("queue thread panicked"));
    });
    assert_eq!(fs.forgotten.load(Ordering::SeqCst), 3);
}

/// Lets a stalled LOOKUP go when dropped.
struct Unstall<'a>(&'a TestFs);

impl Drop for Unstall<'_> {
    fn drop(&mut self) {
        self.0.unstall();
    }
}

/// Seeded random schedules: a guest puts FORGETs on the hiprio ring and GETATTRs on the
/// request ring, kicking only when the device asks, pausing for random spans so that the
/// request queue's thread polls, sleeps and comes back (short windows, with and without
/// workers and EVENT_IDX), while two threads play the queues' epoll threads. Every request
/// must be served within 10 s (a lost one never is), each FORGET must reach the filesystem
/// once, and once everything sleeps the next FORGET must ask for a kick. A failure prints its
/// seed: `HIPRIO_SEED=N cargo test --lib hiprio::random` replays it, `HIPRIO_SEEDS=N` runs
/// seeds 1..=N (CI runs 60).
#[test]
fn random_schedules_never_leave_a_forget_unwatched() {
    for seed in seeds("HIPRIO", 60) {
        random_schedule(seed);
    }
}

fn random_schedule(seed: u64) {
    let mut next = xorshift(seed);
    let event_idx = next() % 2 == 0;
    let threads = if next() % 2 == 0 { 0 } else { 2 };
    let poll = [50, 200, 2_000][usize::try_from(next() % 3).unwrap_or(0)];
    let setting = format!("seed {seed}: event_idx={event_idx} threads={threads} poll={poll} µs");
    let (gm, mem) = memory();
    let mut rq = Ring::new(&gm, REQUEST_RING, true, event_idx);
    let mut hi = Ring::new(&gm, HIPRIO_RING, false, event_idx);
    let (rv, hv) = (rq.vring(&mem), hi.vring(&mem));
    let (backend, fs) = polling(threads, Duration::from_micros(poll));
    backend
        .update_memory(mem.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut forgets = 0u64;
    let mut unique = 0u64;
    let mut trace: Vec<String> = Vec::new();
    // Kicks sent and not yet handled to their end, in both epoll threads.
    let busy = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let (rq_tx, rq_kicks) = mpsc::channel::<()>();
        let (hi_tx, hi_kicks) = mpsc::channel::<()>();
        let (b, rv, hv, busy) = (&backend, &rv, &hv, &busy);
        s.spawn(move || {
            while rq_kicks.recv().is_ok() {
                kick(b, rv, 1);
                busy.fetch_sub(1, Ordering::SeqCst);
            }
        });
        s.spawn(move || {
            while hi_kicks.recv().is_ok() {
                kick(b, hv, HIPRIO_QUEUE);
                busy.fetch_sub(1, Ordering::SeqCst);
            }
        });
        let to_rq = |()| {
            busy.fetch_add(1, Ordering::SeqCst);
            let _ = rq_tx.send(());
        };
        let to_hi = |()| {
            busy.fetch_add(1, Ordering::SeqCst);
            let _ = hi_tx.send(());
        };
        unique += 1;
        rq.publish(&init_request(unique));
        if rq.needs_kick() {
            to_rq(());
        }
        for step in 0..300 {
            match next() % 10 {
                0..=3 => {
                    let n = 1 + next() % 3;
                    for _ in 0..n {
                        unique += 1;
                        hi.publish(&forget(unique));
                        forgets += 1;
                    }
                    let k = hi.needs_kick();
                    trace.push(format!("{step}: {n} FORGET, kick {k}"));
                    if k {
                        to_hi(());
                    }
                }
                4..=6 => {
                    unique += 1;
                    rq.publish(&getattr(unique));
                    let k = rq.needs_kick();
                    trace.push(format!("{step}: GETATTR, kick {k}"));
                    if k {
                        to_rq(());
                    }
                }
                7 | 8 => {
                    let spin = Duration::from_micros(next() % 100);
                    trace.push(format!("{step}: spin {spin:?}"));
                    let t = Instant::now();
                    while t.elapsed() < spin {
                        std::hint::spin_loop();
                    }
                }
                _ => {
                    let nap = Duration::from_micros(next() % 2_000);
                    trace.push(format!("{step}: sleep {nap:?}"));
                    std::thread::sleep(nap);
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while hi.used() != hi.published || rq.used() != rq.published {
            if Instant::now() > deadline {
                let last: Vec<_> = trace.iter().rev().take(12).rev().collect();
                panic!(
                    "{setting}: requests left unserved: hiprio {} of {} used, requests {} of \
                     {}, watchers {}, hiprio avail_event {} flags {}; last steps: {last:#?}",
                    hi.used(),
                    hi.published,
                    rq.used(),
                    rq.published,
                    backend.inner.hiprio.any(),
                    hi.avail_event(),
                    hi.used_flags(),
                );
            }
            std::thread::yield_now();
        }
        until(&format!("{setting}: both epoll threads asleep"), || {
            busy.load(Ordering::SeqCst) == 0
        });
        assert!(
            !backend.inner.hiprio.any(),
            "{setting}: a watcher left over"
        );
        unique += 1;
        hi.publish(&forget(unique));
        forgets += 1;
        assert!(
            hi.needs_kick(),
            "{setting}: with every thread asleep a FORGET must ask for a kick"
        );
        to_hi(());
        until(&format!("{setting}: the last FORGET served"), || {
            hi.used() == hi.published
        });
        drop((rq_tx, hi_tx));
    });
    assert_eq!(
        fs.forgotten.load(Ordering::SeqCst),
        forgets,
        "{setting}: each FORGET reaches the filesystem once"
    );
}

/// Run `f` on a thread of its own; false if it has not returned within `limit` (the thread
/// is left behind: it holds nothing the other tests need).
fn returns_within(limit: Duration, f: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(limit).is_ok()
}

/// A guest that claims more new requests than its ring holds (an avail index `QSIZE + 5`
/// ahead) gets none of them served, and neither the queue's thread nor a polling thread
/// watching the hiprio ring keeps spinning on it: each goes to sleep.
#[test]
fn hostile_avail_index_past_the_ring_holds_no_thread() {
    for (queue, threads) in [(1, 0), (1, 2), (HIPRIO_QUEUE, 0), (HIPRIO_QUEUE, 2)] {
        let gm: &'static _ = Box::leak(Box::new(memory()));
        let (gm, mem) = (&*gm.0, gm.1.clone());
        let mut rq = Ring::new(gm, REQUEST_RING, true, true);
        let mut hi = Ring::new(gm, HIPRIO_RING, false, true);
        let (rv, hv) = (rq.vring(&mem), hi.vring(&mem));
        let (backend, _fs) = polling(threads, Duration::from_millis(300));
        backend
            .update_memory(mem.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        begin(&backend, &mut rq, &mut hi, &hv, Duration::from_millis(300));
        let what = format!("queue {queue}, {threads} workers");
        let (b, r) = (backend.clone(), rv.clone());
        let polling = std::thread::spawn(move || kick(&b, &r, 1));
        until(&what, || rq.used() == 1);
        // The hostile index, then the kick a guest gives with it.
        let ring = if queue == HIPRIO_QUEUE { &hi } else { &rq };
        ring.store16(ring.avail + 2, ring.published.wrapping_add(QSIZE + 5));
        let (b, v) = (backend.clone(), if queue == HIPRIO_QUEUE { hv } else { rv });
        assert!(
            returns_within(Duration::from_secs(20), move || kick(&b, &v, queue)),
            "{what}: the kicked thread keeps spinning on the hostile index"
        );
        let done = returns_within(Duration::from_secs(20), move || {
            let _ = polling.join();
        });
        assert!(done, "{what}: the polling thread never went to sleep");
        assert_eq!(
            hi.used(),
            1,
            "{what}: nothing of the hostile ring is served"
        );
    }
}
