//! A split virtqueue driven from the *driver* (guest) side, laid out in our own guest memory
//! (virtio 1.x, section 2.7): descriptor table, available ring, used ring.
//!
//! Each request slot owns two descriptors: `2*slot` (device-readable request bytes) chained to
//! `2*slot+1` (device-writable reply buffer). Requests without a reply (FORGET) use only the first.
//! Nothing here knows about FUSE.
//!
//! Notifications work like a Linux guest's `virtio_ring.c`. Without EVENT_IDX: kick unless the
//! device set `VIRTQ_USED_F_NO_NOTIFY`; the device interrupts after every completion. With
//! EVENT_IDX (section 2.7.10): kick only when the device's `avail_event` lies among the requests
//! published since the last kick decision, and before waiting set `used_event` to the next
//! completion we have not seen, so the device interrupts once per idle-to-busy transition.
//! Waiting can first spin on the used index for a while, like a halt-polled vCPU (see `wait`).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ceph_virtiofsd::poll::{spin_until, AdaptivePoll, Look};

use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

const VIRTQ_DESC_F_NEXT: u16 = 1;
const VIRTQ_DESC_F_WRITE: u16 = 2;
const VIRTQ_USED_F_NO_NOTIFY: u16 = 1;
/// Spin iterations between two clock reads while halt-polling (`spin_until` also yields the CPU
/// there once the wait has lasted `FIRST_YIELD`).
const SPINS_PER_CLOCK_READ: u32 = 64;

/// The spec's `vring_need_event`: the other side asked to be notified once the index moves
/// past `event`, and this update moved it from `old` to `new`; true when `event` lies in
/// [`old`, `new`) modulo 2^16.
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Bytes one queue's rings need in guest memory for `size` entries (all three parts, aligned).
/// The available ring is `flags, idx, ring[size], used_event` (6 + 2*size bytes), the used ring
/// `flags, idx, ring[size], avail_event` (6 + 8*size bytes): the EVENT_IDX fields are included.
pub fn ring_bytes(size: u16) -> u64 {
    let n = u64::from(size);
    let desc = 16 * n;
    let avail = align(6 + 2 * n, 4);
    let used = 6 + 8 * n;
    align(desc + avail, 4) + align(used, 4096)
}

pub fn align(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Guest-physical layout of one queue's rings.
#[derive(Debug, Clone, Copy)]
pub struct RingLayout {
    pub desc: GuestAddress,
    pub avail: GuestAddress,
    pub used: GuestAddress,
}

impl RingLayout {
    pub fn at(base: GuestAddress, size: u16) -> Self {
        let n = u64::from(size);
        let desc = base;
        let avail = GuestAddress(base.0 + 16 * n);
        let used = GuestAddress(base.0 + align(16 * n + align(6 + 2 * n, 4), 4));
        RingLayout { desc, avail, used }
    }
}

/// One request slot: a readable buffer and a writable buffer in guest memory.
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    pub in_addr: GuestAddress,
    pub in_cap: u32,
    pub out_addr: GuestAddress,
    pub out_cap: u32,
}

/// Errors of the transport (not of the filesystem).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("Guest memory access at {0:#x} failed")]
    Memory(u64, #[source] vm_memory::GuestMemoryError),
    #[error("Queue {queue}: the daemon returned descriptor id {id}, which is not the head of a request in flight")]
    BadUsedId { queue: usize, id: u32 },
    #[error("Queue {queue}: the daemon answered nothing for {secs} s with {inflight} requests in flight")]
    Timeout {
        queue: usize,
        secs: u64,
        inflight: usize,
    },
    #[error("Queue {0}: waiting on the call eventfd failed")]
    Wait(usize, #[source] io::Error),
    #[error("Queue {0}: kicking the daemon failed")]
    Kick(usize, #[source] io::Error),
    #[error("Queue {queue}: request needs {need} bytes but slot buffers hold {cap}")]
    TooBig { queue: usize, need: u64, cap: u32 },
    /// The daemon closed the vhost-user socket (it exited) while we waited.
    #[error("Queue {0}: the daemon hung up while a request was waiting")]
    HungUp(usize),
}

/// How a queue is notified and waited on; fixed for the queue's lifetime except `halt_poll`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Notify {
    /// VIRTIO_RING_F_EVENT_IDX was negotiated: use `used_event`/`avail_event`, not flags.
    pub event_idx: bool,
    /// The most `wait` spins on the used index before blocking on the call eventfd (KVM's
    /// halt_poll_ns); the window itself adapts below it (see `VirtQueue::adapt_poll`).
    pub halt_poll: Duration,
}

/// What the queue did to notify and wait, for the run's notes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Flushes that published new requests.
    pub flushes: u64,
    /// Flushes that wrote the kick eventfd.
    pub kicks: u64,
    /// `wait` calls that found nothing on the used ring at first.
    pub idle_waits: u64,
    /// Idle waits the halt-poll spin ended (a completion arrived while spinning).
    pub poll_hits: u64,
    /// poll(2) calls on the call eventfd (each one may sleep).
    pub blocks: u64,
}

impl std::ops::AddAssign for Counters {
    fn add_assign(&mut self, o: Self) {
        self.flushes += o.flushes;
        self.kicks += o.kicks;
        self.idle_waits += o.idle_waits;
        self.poll_hits += o.poll_hits;
        self.blocks += o.blocks;
    }
}

impl std::fmt::Display for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} flushes kicked, {} idle waits: {} ended by halt-poll, {} poll(2) calls",
            self.kicks, self.flushes, self.idle_waits, self.poll_hits, self.blocks
        )
    }
}

/// A completion taken off the used ring.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    pub slot: usize,
    /// Bytes the device says it wrote into the writable buffer.
    pub written: u32,
    pub latency: Duration,
}

#[derive(Debug)]
pub struct VirtQueue {
    pub index: usize,
    mem: Arc<GuestMemoryMmap>,
    size: u16,
    rings: RingLayout,
    slots: Vec<Slot>,
    started: Vec<Option<Instant>>,
    avail_idx: u16,
    /// `avail_idx` at the last kick decision: requests published since then count as new.
    kicked_idx: u16,
    last_used: u16,
    pending_kick: bool,
    notify: Notify,
    /// The halt-poll window, adapting below `notify.halt_poll` as KVM's does per vCPU.
    poll: AdaptivePoll,
    counters: Counters,
    pub kick: EventFd,
    pub call: EventFd,
    timeout: Duration,
    /// The vhost-user socket, watched while blocked when the session reconnects: its hang-up
    /// ends the wait with `HungUp` instead of the timeout.
    hangup: Option<RawFd>,
}

impl VirtQueue {
    /// Lays out an empty queue. `slots.len()` must be at most `size / 2`.
    pub fn new(
        index: usize,
        mem: Arc<GuestMemoryMmap>,
        size: u16,
        rings: RingLayout,
        slots: Vec<Slot>,
        notify: Notify,
        timeout: Duration,
    ) -> io::Result<Self> {
        let kick = EventFd::new(libc::EFD_NONBLOCK)?;
        let call = EventFd::new(libc::EFD_NONBLOCK)?;
        let started = vec![None; slots.len()];
        let q = VirtQueue {
            index,
            mem,
            size,
            rings,
            slots,
            started,
            avail_idx: 0,
            kicked_idx: 0,
            last_used: 0,
            pending_kick: false,
            notify,
            poll: AdaptivePoll::new(notify.halt_poll),
            counters: Counters::default(),
            kick,
            call,
            timeout,
            hangup: None,
        };
        Ok(q)
    }

    /// Zeroes the ring headers (flags and idx of both rings) and both event fields.
    pub fn reset_rings(&self) -> Result<(), QueueError> {
        self.store16(self.rings.avail, 0)?;
        self.store16(self.rings.avail.unchecked_add(2), 0)?;
        self.store16(self.used_event_addr(), 0)?;
        self.store16(self.rings.used, 0)?;
        self.store16(self.rings.used.unchecked_add(2), 0)?;
        self.store16(self.avail_event_addr(), 0)
    }

    /// `used_event`, written by us: the u16 after the available ring's `ring[size]`.
    fn used_event_addr(&self) -> GuestAddress {
        self.rings.avail.unchecked_add(4 + 2 * u64::from(self.size))
    }

    /// `avail_event`, written by the device: the u16 after the used ring's `ring[size]`.
    fn avail_event_addr(&self) -> GuestAddress {
        self.rings.used.unchecked_add(4 + 8 * u64::from(self.size))
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Watch `fd` (the vhost-user socket) while blocked: see [`QueueError::HungUp`].
    pub fn watch_hangup(&mut self, fd: Option<RawFd>) {
        self.hangup = fd;
    }

    /// The used ring's index as the device last published it: after a back-end restart, the
    /// next available entry the new back-end must take (every request the old one took was
    /// answered before it handed over).
    pub fn device_used_idx(&self) -> Result<u16, QueueError> {
        self.load16(self.rings.used.unchecked_add(2), Ordering::Acquire)
    }

    /// Kick the device whatever the notification state: a new back-end must look at the
    /// available ring once, since the kicks of requests made meanwhile went to the old one.
    pub fn kick_now(&mut self) -> Result<(), QueueError> {
        self.kick
            .write(1)
            .map_err(|e| QueueError::Kick(self.index, e))?;
        self.kicked_idx = self.avail_idx;
        Ok(())
    }

    #[cfg(test)]
    pub fn rings(&self) -> RingLayout {
        self.rings
    }

    /// Where the rings are in guest memory.
    pub fn layout(&self) -> RingLayout {
        self.rings
    }

    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    pub fn slot(&self, i: usize) -> Option<Slot> {
        self.slots.get(i).copied()
    }

    pub fn mem(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    pub fn in_flight(&self) -> usize {
        self.started.iter().filter(|s| s.is_some()).count()
    }

    pub fn free_slot(&self) -> Option<usize> {
        self.started.iter().position(|s| s.is_none())
    }

    fn store16(&self, addr: GuestAddress, v: u16) -> Result<(), QueueError> {
        self.mem
            .write_obj(v, addr)
            .map_err(|e| QueueError::Memory(addr.0, e))
    }

    fn load16(&self, addr: GuestAddress, order: Ordering) -> Result<u16, QueueError> {
        self.mem
            .load(addr, order)
            .map_err(|e| QueueError::Memory(addr.0, e))
    }

    /// True when the device has returned something we have not reaped.
    fn used_pending(&self) -> Result<bool, QueueError> {
        let idx = self.load16(self.rings.used.unchecked_add(2), Ordering::Acquire)?;
        Ok(idx != self.last_used)
    }

    fn write_desc(
        &self,
        idx: u16,
        addr: GuestAddress,
        len: u32,
        flags: u16,
        next: u16,
    ) -> Result<(), QueueError> {
        let at = self.rings.desc.unchecked_add(16 * u64::from(idx));
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.0.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.mem
            .write_slice(&d, at)
            .map_err(|e| QueueError::Memory(at.0, e))
    }

    /// Places the request of `slot` (`in_len` readable bytes, `out_len` writable bytes; 0 means
    /// no reply buffer) on the available ring. The daemon sees it at the next `flush`.
    pub fn push(&mut self, slot: usize, in_len: u32, out_len: u32) -> Result<(), QueueError> {
        let s = self.slots[slot];
        if in_len > s.in_cap || out_len > s.out_cap {
            return Err(QueueError::TooBig {
                queue: self.index,
                need: u64::from(in_len.max(out_len)),
                cap: s.in_cap.min(s.out_cap),
            });
        }
        // Slot counts are bounded by size/2 <= u16::MAX / 2 at construction.
        let head = u16::try_from(slot * 2).unwrap_or(u16::MAX);
        if out_len > 0 {
            self.write_desc(head, s.in_addr, in_len, VIRTQ_DESC_F_NEXT, head + 1)?;
            self.write_desc(head + 1, s.out_addr, out_len, VIRTQ_DESC_F_WRITE, 0)?;
        } else {
            self.write_desc(head, s.in_addr, in_len, 0, 0)?;
        }
        let ring_at = self
            .rings
            .avail
            .unchecked_add(4 + 2 * u64::from(self.avail_idx % self.size));
        self.store16(ring_at, head)?;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.started[slot] = Some(Instant::now());
        self.pending_kick = true;
        Ok(())
    }

    /// Publishes the available index and kicks the daemon unless it asked not to be notified
    /// (EVENT_IDX: its `avail_event` is not among the requests published since the last kick
    /// decision; otherwise: `VIRTQ_USED_F_NO_NOTIFY`), like Linux's `virtqueue_kick_prepare`.
    pub fn flush(&mut self) -> Result<(), QueueError> {
        if !self.pending_kick {
            return Ok(());
        }
        let idx_at = self.rings.avail.unchecked_add(2);
        self.mem
            .store(self.avail_idx, idx_at, Ordering::Release)
            .map_err(|e| QueueError::Memory(idx_at.0, e))?;
        // The device must see the new index before we read what it asked for; it does the
        // mirror image (writes avail_event, fence, re-reads avail idx), so one of us sees the
        // other's write and no request is left without a kick.
        fence(Ordering::SeqCst);
        let old = self.kicked_idx;
        self.kicked_idx = self.avail_idx;
        self.pending_kick = false;
        self.counters.flushes += 1;
        let kick = if self.notify.event_idx {
            let event = self.load16(self.avail_event_addr(), Ordering::Acquire)?;
            need_event(event, self.avail_idx, old)
        } else {
            let used_flags = self.load16(self.rings.used, Ordering::Acquire)?;
            used_flags & VIRTQ_USED_F_NO_NOTIFY == 0
        };
        if kick {
            self.counters.kicks += 1;
            self.kick
                .write(1)
                .map_err(|e| QueueError::Kick(self.index, e))?;
        }
        Ok(())
    }

    /// Takes every completion currently on the used ring.
    pub fn reap(&mut self, out: &mut Vec<Completion>) -> Result<(), QueueError> {
        let used_idx = self.load16(self.rings.used.unchecked_add(2), Ordering::Acquire)?;
        let now = Instant::now();
        while self.last_used != used_idx {
            let at = self
                .rings
                .used
                .unchecked_add(4 + 8 * u64::from(self.last_used % self.size));
            let mut e = [0u8; 8];
            self.mem
                .read_slice(&mut e, at)
                .map_err(|err| QueueError::Memory(at.0, err))?;
            let id = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
            let written = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            self.last_used = self.last_used.wrapping_add(1);
            let bad = QueueError::BadUsedId {
                queue: self.index,
                id,
            };
            if id % 2 != 0 {
                return Err(bad);
            }
            let slot = usize::try_from(id / 2).map_err(|_| QueueError::BadUsedId {
                queue: self.index,
                id,
            })?;
            let Some(start) = self.started.get_mut(slot).and_then(Option::take) else {
                return Err(bad);
            };
            out.push(Completion {
                slot,
                written,
                latency: now.saturating_duration_since(start),
            });
        }
        Ok(())
    }

    /// Asks the device to interrupt on the next completion and re-checks the used ring (Linux's
    /// `virtqueue_enable_cb_prepare` + `virtqueue_poll`). Returns true when something arrived
    /// meanwhile: the device may then have read the old `used_event` and not signalled, so the
    /// caller must not block. Without EVENT_IDX the device signals every completion: no-op.
    fn arm_interrupt(&mut self) -> Result<bool, QueueError> {
        if !self.notify.event_idx {
            return Ok(false);
        }
        let at = self.used_event_addr();
        self.mem
            .store(self.last_used, at, Ordering::Release)
            .map_err(|e| QueueError::Memory(at.0, e))?;
        // Our used_event store must be visible before we read the used index; the device
        // writes the used index, fences, then reads used_event.
        fence(Ordering::SeqCst);
        self.used_pending()
    }

    /// Spins for at most `limit` re-reading the used index, like a vCPU halt-polled by KVM
    /// (halt_poll_ns) or by the guest's cpuidle-haltpoll. Returns true when a completion came.
    ///
    /// KVM polls only while the vCPU thread is alone on its CPU (`kvm_vcpu_can_poll`:
    /// `single_task_running() && !need_resched()`). The nearest a process gets is to yield
    /// between spins: when the daemon's thread was woken onto this CPU it runs at once
    /// instead of waiting out our window, which on a 2-core host otherwise turns into a
    /// ~130 µs hand-off per request.
    fn halt_poll(&self, limit: Duration) -> Result<bool, QueueError> {
        let mut failed = None;
        let hit = spin_until(limit, SPINS_PER_CLOCK_READ, || match self.used_pending() {
            Ok(true) => Look::Ready,
            Ok(false) => Look::NotYet,
            Err(e) => {
                failed = Some(e);
                Look::GiveUp
            }
        });
        failed.map_or(Ok(hit), Err)
    }

    /// Blocks until at least one completion is available and returns them all.
    ///
    /// When the used ring is empty: arm the interrupt (EVENT_IDX `used_event`), spin for the
    /// halt-poll time, then sleep in poll(2) on the call eventfd. Completions taken while
    /// spinning leave their signal in the eventfd; it is drained before the last ring check
    /// ahead of each sleep, so a stale count costs nothing and a fresh one is never lost.
    pub fn wait(&mut self, out: &mut Vec<Completion>) -> Result<(), QueueError> {
        self.reap(out)?;
        if !out.is_empty() {
            return Ok(());
        }
        self.counters.idle_waits += 1;
        if self.arm_interrupt()? {
            return self.reap(out);
        }
        let started = Instant::now();
        let window = self.poll.window();
        if !window.is_zero() && self.halt_poll(window)? {
            self.counters.poll_hits += 1;
            return self.reap(out);
        }
        let r = self.block(out);
        self.poll.slept(started.elapsed());
        r
    }

    /// Sleeps on the call eventfd until a completion is on the used ring.
    fn block(&mut self, out: &mut Vec<Completion>) -> Result<(), QueueError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            // Non-blocking: EAGAIN just means there is no count to drain. A completion the
            // reap below misses is signalled after this read, so poll(2) will see it.
            let _ = self.call.read();
            fence(Ordering::SeqCst);
            self.reap(out)?;
            if !out.is_empty() {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(QueueError::Timeout {
                    queue: self.index,
                    secs: self.timeout.as_secs(),
                    inflight: self.in_flight(),
                });
            }
            let mut pfd = [
                libc::pollfd {
                    fd: self.call.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.hangup.unwrap_or(-1),
                    events: libc::POLLRDHUP,
                    revents: 0,
                },
            ];
            let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
            self.counters.blocks += 1;
            // SAFETY: `pfd` is an array of two valid, initialised pollfds that lives across the
            // call, and we pass its length; poll only writes `revents` (a negative fd is
            // ignored by poll).
            let r = unsafe { libc::poll(pfd.as_mut_ptr(), 2, ms) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(QueueError::Wait(self.index, e));
                }
            }
            if pfd[1].revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0 {
                // What the device answered before it went is still taken.
                self.reap(out)?;
                if !out.is_empty() {
                    return Ok(());
                }
                return Err(QueueError::HungUp(self.index));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_aligned_and_disjoint() {
        for size in [2u16, 64, 128, 256, 1024] {
            let base = GuestAddress(0x10000);
            let r = RingLayout::at(base, size);
            let n = u64::from(size);
            assert_eq!(r.avail.0, base.0 + 16 * n);
            assert!(r.used.0 >= r.avail.0 + 6 + 2 * n);
            assert_eq!(r.used.0 % 4, 0);
            assert!(r.used.0 + 6 + 8 * n <= base.0 + ring_bytes(size));
            // The EVENT_IDX fields: used_event ends before the used ring, avail_event inside
            // the queue's share.
            let used_event = r.avail.0 + 4 + 2 * n;
            assert!(used_event + 2 <= r.used.0);
            let avail_event = r.used.0 + 4 + 8 * n;
            assert!(avail_event + 2 <= base.0 + ring_bytes(size));
        }
    }

    #[test]
    fn need_event_matches_the_spec_formula_across_wraparound() {
        // Event in [old, new): notify.
        assert!(need_event(0, 1, 0));
        assert!(need_event(3, 5, 3));
        assert!(need_event(4, 5, 3));
        assert!(need_event(u16::MAX, 1, u16::MAX - 1));
        assert!(need_event(0, 1, u16::MAX));
        // Event already passed before old, or not reached yet: stay quiet.
        assert!(!need_event(0, 2, 1));
        assert!(!need_event(5, 5, 3));
        assert!(!need_event(10, 6, 5));
        assert!(!need_event(u16::MAX - 3, 2, 1));
        // Nothing new published: never notify.
        assert!(!need_event(7, 7, 7));
    }

    fn queue() -> VirtQueue {
        queue_with(Notify::default(), Duration::from_secs(1))
    }

    fn queue_with(notify: Notify, timeout: Duration) -> VirtQueue {
        let mem = Arc::new(
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20000)]).expect("test memory"),
        );
        let slots = (0..2)
            .map(|i| Slot {
                in_addr: GuestAddress(0x8000 + i * 0x2000),
                in_cap: 0x1000,
                out_addr: GuestAddress(0x9000 + i * 0x2000),
                out_cap: 0x1000,
            })
            .collect();
        let q = VirtQueue::new(
            1,
            mem,
            4,
            RingLayout::at(GuestAddress(0), 4),
            slots,
            notify,
            timeout,
        )
        .expect("eventfds");
        q.reset_rings().expect("reset");
        q
    }

    /// Plays the device: returns the head at avail position `pos` as used with `len`.
    fn device_complete(q: &VirtQueue, pos: u16, id: u32, len: u32) {
        let r = q.rings();
        let at = r.used.unchecked_add(4 + 8 * u64::from(pos % 4));
        let mut e = [0u8; 8];
        e[0..4].copy_from_slice(&id.to_le_bytes());
        e[4..8].copy_from_slice(&len.to_le_bytes());
        q.mem().write_slice(&e, at).expect("used elem");
        q.mem()
            .store(
                pos.wrapping_add(1),
                r.used.unchecked_add(2),
                Ordering::Release,
            )
            .expect("used idx");
    }

    #[test]
    fn push_flush_and_reap_roundtrip() {
        let mut q = queue();
        q.push(1, 40, 100).expect("push");
        q.flush().expect("flush");
        let r = q.rings();
        let head: u16 = q.mem().read_obj(r.avail.unchecked_add(4)).expect("ring");
        assert_eq!(head, 2);
        let idx: u16 = q.mem().read_obj(r.avail.unchecked_add(2)).expect("idx");
        assert_eq!(idx, 1);
        let d_flags: u16 = q
            .mem()
            .read_obj(r.desc.unchecked_add(16 * 2 + 12))
            .expect("desc");
        assert_eq!(d_flags, VIRTQ_DESC_F_NEXT);
        let w_flags: u16 = q
            .mem()
            .read_obj(r.desc.unchecked_add(16 * 3 + 12))
            .expect("desc");
        assert_eq!(w_flags, VIRTQ_DESC_F_WRITE);
        assert_eq!(q.kick.read().expect("kicked"), 1);
        device_complete(&q, 0, 2, 16);
        let mut out = Vec::new();
        q.wait(&mut out).expect("completion");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].slot, 1);
        assert_eq!(out[0].written, 16);
        assert_eq!(q.in_flight(), 0);
    }

    #[test]
    fn bogus_used_ids_are_errors_not_panics() {
        let mut q = queue();
        q.push(0, 40, 100).expect("push");
        q.flush().expect("flush");
        device_complete(&q, 0, 3, 0);
        let mut out = Vec::new();
        assert!(matches!(
            q.reap(&mut out),
            Err(QueueError::BadUsedId { id: 3, .. })
        ));
        let mut q = queue();
        q.push(0, 40, 100).expect("push");
        device_complete(&q, 0, 2, 0); // slot 1 is not in flight
        assert!(matches!(
            q.reap(&mut out),
            Err(QueueError::BadUsedId { id: 2, .. })
        ));
        let mut q = queue();
        device_complete(&q, 0, 4000, 0);
        assert!(matches!(
            q.reap(&mut out),
            Err(QueueError::BadUsedId { .. })
        ));
    }

    #[test]
    fn oversized_request_is_refused() {
        let mut q = queue();
        assert!(matches!(
            q.push(0, 0x2000, 10),
            Err(QueueError::TooBig { .. })
        ));
    }

    #[test]
    fn silent_device_times_out() {
        let mut q = queue();
        q.push(0, 40, 100).expect("push");
        q.flush().expect("flush");
        let mut out = Vec::new();
        assert!(matches!(
            q.wait(&mut out),
            Err(QueueError::Timeout { inflight: 1, .. })
        ));
    }

    fn event_idx() -> Notify {
        Notify {
            event_idx: true,
            halt_poll: Duration::ZERO,
        }
    }

    /// Plays the device writing `avail_event`: "kick me when the avail index passes `v`".
    fn set_avail_event(q: &VirtQueue, v: u16) {
        q.mem()
            .store(v, q.avail_event_addr(), Ordering::Release)
            .expect("avail_event");
    }

    fn used_event(q: &VirtQueue) -> u16 {
        q.mem()
            .load(q.used_event_addr(), Ordering::Acquire)
            .expect("used_event")
    }

    fn kicked(q: &VirtQueue) -> bool {
        match q.kick.read() {
            Ok(n) => n > 0,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Err(e) => panic!("kick eventfd: {e}"),
        }
    }

    #[test]
    fn no_notify_flag_suppresses_kicks_without_event_idx() {
        let mut q = queue();
        q.push(0, 40, 100).expect("push");
        q.flush().expect("flush");
        assert!(kicked(&q));
        q.store16(q.rings().used, VIRTQ_USED_F_NO_NOTIFY)
            .expect("flags");
        // avail_event would ask for a kick: it must be ignored without EVENT_IDX.
        set_avail_event(&q, 1);
        q.push(1, 40, 100).expect("push");
        q.flush().expect("flush");
        assert!(!kicked(&q));
        assert_eq!(q.counters().kicks, 1);
        assert_eq!(q.counters().flushes, 2);
    }

    #[test]
    fn event_idx_kicks_only_when_avail_event_is_passed() {
        let mut q = queue_with(event_idx(), Duration::from_secs(1));
        // NO_NOTIFY is a non-EVENT_IDX signal: it must not suppress this kick.
        q.store16(q.rings().used, VIRTQ_USED_F_NO_NOTIFY)
            .expect("flags");
        // avail_event 0: the device waits for the request at index 0.
        q.push(0, 40, 100).expect("push");
        q.flush().expect("flush");
        assert!(kicked(&q), "first request must kick");
        // The device is busy and has not moved avail_event: no kick for index 1.
        q.push(1, 40, 100).expect("push");
        q.flush().expect("flush");
        assert!(!kicked(&q), "device still busy: kick must be suppressed");
        device_complete(&q, 0, 0, 16);
        device_complete(&q, 1, 2, 16);
        let mut out = Vec::new();
        q.reap(&mut out).expect("reap");
        assert_eq!(out.len(), 2);
        // The device went idle after index 1 and asks for index 2.
        set_avail_event(&q, 2);
        q.push(0, 40, 100).expect("push");
        q.flush().expect("flush");
        assert!(kicked(&q), "avail_event 2 was passed: kick");
        // Two requests published in one flush: the earlier one is the one it asked for.
        set_avail_event(&q, 3);
        q.push(1, 40, 100).expect("push");
        q.flush().expect("flush");
        assert!(kicked(&q));
        device_complete(&q, 2, 0, 16);
        device_complete(&q, 3, 2, 16);
        out.clear();
        q.reap(&mut out).expect("reap");
        set_avail_event(&q, 4);
        q.push(0, 40, 100).expect("push");
        q.push(1, 40, 100).expect("push");
        q.flush().expect("flush");
        assert!(kicked(&q), "index 4 is among the two new requests");
        // An event far ahead is not passed.
        device_complete(&q, 4, 0, 16);
        out.clear();
        q.reap(&mut out).expect("reap");
        set_avail_event(&q, 10);
        q.push(0, 40, 100).expect("push");
        q.flush().expect("flush");
        assert!(!kicked(&q));
        assert_eq!(q.counters().flushes, 6);
        assert_eq!(q.counters().kicks, 4);
    }

    #[test]
    fn old_idx_is_the_previous_flush_kicked_or_not() {
        let mut q = queue_with(event_idx(), Duration::from_secs(1));
        set_avail_event(&q, 5);
        q.push(0, 40, 100).expect("push");
        q.flush().expect("flush");
        assert!(!kicked(&q), "window [0, 1) does not hold 5");
        // Like Linux (old = avail idx minus requests added since the last kick_prepare), the
        // next flush looks at [1, 2) only: index 0 was decided on already. A device that asks
        // for 0 again re-reads avail idx after writing avail_event and finds request 0 itself.
        set_avail_event(&q, 0);
        q.push(1, 40, 100).expect("push");
        q.flush().expect("flush");
        assert!(!kicked(&q), "window [1, 2) does not hold 0");
        device_complete(&q, 0, 0, 16);
        device_complete(&q, 1, 2, 16);
        let mut out = Vec::new();
        q.reap(&mut out).expect("reap");
        set_avail_event(&q, 2);
        q.push(0, 40, 100).expect("push");
        q.flush().expect("flush");
        assert!(kicked(&q), "window [2, 3) holds 2");
        assert_eq!(q.counters().kicks, 1);
    }

    #[test]
    fn wait_sets_used_event_to_the_next_completion_before_sleeping() {
        let mut q = queue_with(event_idx(), Duration::from_secs(2));
        q.push(0, 40, 100).expect("push");
        q.push(1, 40, 100).expect("push");
        q.flush().expect("flush");
        device_complete(&q, 0, 0, 16);
        let mut out = Vec::new();
        q.wait(&mut out).expect("first completion");
        assert_eq!(out.len(), 1);
        // Found without waiting: used_event untouched (interrupts stay off, like Linux).
        assert_eq!(used_event(&q), 0);
        // A device thread that signals only when used_event asks for it.
        let mem = q.mem.clone();
        let call = q.call.try_clone().expect("call eventfd");
        let r = q.rings();
        let ue_at = q.used_event_addr();
        let dev = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut seen = 0u16;
            while Instant::now() < deadline {
                seen = mem.load(ue_at, Ordering::Acquire).expect("used_event");
                if seen == 1 {
                    break;
                }
                std::thread::yield_now();
            }
            let mut e = [0u8; 8];
            e[0..4].copy_from_slice(&2u32.to_le_bytes());
            mem.write_slice(&e, r.used.unchecked_add(4 + 8))
                .expect("used elem");
            mem.store(2u16, r.used.unchecked_add(2), Ordering::Release)
                .expect("used idx");
            fence(Ordering::SeqCst);
            let ue: u16 = mem.load(ue_at, Ordering::Acquire).expect("used_event");
            if need_event(ue, 2, 1) {
                call.write(1).expect("signal");
            }
            seen
        });
        out.clear();
        let res = q.wait(&mut out);
        let seen = dev.join().expect("device thread");
        assert_eq!(
            seen, 1,
            "used_event must be last_used before the driver sleeps"
        );
        res.expect("second completion must wake the driver");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].slot, 1);
        assert_eq!(used_event(&q), 1);
        assert!(q.counters().blocks >= 1);
    }

    #[test]
    fn a_completion_racing_the_used_event_write_is_not_lost() {
        // The device completed while used_event still said "no interrupt" (0 is behind):
        // it did not signal. Arming must see the completion so the driver does not sleep.
        let mut q = queue_with(event_idx(), Duration::from_secs(1));
        q.push(0, 40, 100).expect("push");
        q.push(1, 40, 100).expect("push");
        q.flush().expect("flush");
        device_complete(&q, 0, 0, 16);
        let mut out = Vec::new();
        q.reap(&mut out).expect("reap");
        device_complete(&q, 1, 2, 16);
        assert!(!need_event(used_event(&q), 2, 1), "the device stays silent");
        assert!(q.arm_interrupt().expect("arm"));
        assert_eq!(used_event(&q), 1);
        // And wait returns it with the eventfd empty and no sleep.
        out.clear();
        q.wait(&mut out).expect("completion");
        assert_eq!(out.len(), 1);
        assert_eq!(q.counters().blocks, 0);
    }

    /// A device thread serving `n` requests one at a time with EVENT_IDX semantics on both
    /// sides: a lost wake-up would end in QueueError::Timeout.
    fn ping_pong(notify: Notify, n: u16) -> Counters {
        let mut q = queue_with(notify, Duration::from_secs(5));
        let mem = q.mem.clone();
        let call = q.call.try_clone().expect("call eventfd");
        let kick = q.kick.try_clone().expect("kick eventfd");
        let r = q.rings();
        let ue_at = q.used_event_addr();
        let ae_at = q.avail_event_addr();
        let ev = notify.event_idx;
        let dev = std::thread::spawn(move || {
            let mut next = 0u16;
            while next < n {
                let avail: u16 = mem
                    .load(r.avail.unchecked_add(2), Ordering::Acquire)
                    .expect("avail idx");
                if avail == next {
                    // Idle: ask for a kick at `next`, re-check, then sleep on the kick fd.
                    if ev {
                        mem.store(next, ae_at, Ordering::Release)
                            .expect("avail_event");
                    }
                    fence(Ordering::SeqCst);
                    let again: u16 = mem
                        .load(r.avail.unchecked_add(2), Ordering::Acquire)
                        .expect("avail idx");
                    if again == next {
                        let mut pfd = libc::pollfd {
                            fd: kick.as_raw_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        };
                        // SAFETY: one valid pollfd that lives across the call.
                        let rc = unsafe { libc::poll(&mut pfd, 1, 5000) };
                        assert!(rc > 0, "driver never kicked (request {next})");
                        let _ = kick.read();
                    }
                    continue;
                }
                let head: u16 = mem
                    .load(
                        r.avail.unchecked_add(4 + 2 * u64::from(next % 4)),
                        Ordering::Acquire,
                    )
                    .expect("avail ring");
                let mut e = [0u8; 8];
                e[0..4].copy_from_slice(&u32::from(head).to_le_bytes());
                mem.write_slice(&e, r.used.unchecked_add(4 + 8 * u64::from(next % 4)))
                    .expect("used elem");
                let old = next;
                next = next.wrapping_add(1);
                mem.store(next, r.used.unchecked_add(2), Ordering::Release)
                    .expect("used idx");
                fence(Ordering::SeqCst);
                let ue: u16 = mem.load(ue_at, Ordering::Acquire).expect("used_event");
                if !ev || need_event(ue, next, old) {
                    call.write(1).expect("signal");
                }
            }
        });
        let mut out = Vec::new();
        for i in 0..n {
            q.push(usize::from(i % 2), 40, 100).expect("push");
            q.flush().expect("flush");
            out.clear();
            q.wait(&mut out)
                .unwrap_or_else(|e| panic!("request {i}: {e}"));
            assert_eq!(out.len(), 1);
        }
        dev.join().expect("device thread");
        q.counters()
    }

    #[test]
    fn no_lost_wakeup_with_event_idx() {
        let c = ping_pong(event_idx(), 3000);
        assert_eq!(c.flushes, 3000);
    }

    #[test]
    fn no_lost_wakeup_with_event_idx_and_halt_poll() {
        let c = ping_pong(
            Notify {
                event_idx: true,
                halt_poll: Duration::from_micros(50),
            },
            3000,
        );
        assert_eq!(c.flushes, 3000);
        assert!(c.poll_hits <= c.idle_waits);
    }

    #[test]
    fn no_lost_wakeup_without_event_idx() {
        let c = ping_pong(Notify::default(), 3000);
        assert_eq!(c.flushes, 3000);
    }

    #[test]
    fn halt_poll_takes_a_completion_that_was_never_signalled() {
        // A device that never signals: only the spin can see the completion.
        let mut q = queue_with(
            Notify {
                event_idx: false,
                halt_poll: Duration::from_secs(3),
            },
            Duration::from_millis(300),
        );
        // As after a run of short waits: the window has grown to the maximum.
        q.poll = q.poll.with_window(Duration::from_secs(3));
        q.push(0, 40, 100).expect("push");
        q.flush().expect("flush");
        let mem = q.mem.clone();
        let r = q.rings();
        let dev = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            let mut e = [0u8; 8];
            e[0..4].copy_from_slice(&0u32.to_le_bytes());
            mem.write_slice(&e, r.used.unchecked_add(4))
                .expect("used elem");
            mem.store(1u16, r.used.unchecked_add(2), Ordering::Release)
                .expect("used idx");
        });
        let mut out = Vec::new();
        q.wait(&mut out).expect("spin must see the completion");
        dev.join().expect("device thread");
        assert_eq!(out.len(), 1);
        let c = q.counters();
        assert_eq!((c.idle_waits, c.poll_hits, c.blocks), (1, 1, 0));
    }

    #[test]
    fn a_stale_call_count_is_drained_before_sleeping() {
        // Signals left over from completions taken while spinning must not make poll(2)
        // return at once again and again.
        let mut q = queue_with(Notify::default(), Duration::from_millis(200));
        q.push(0, 40, 100).expect("push");
        q.flush().expect("flush");
        q.call.write(3).expect("stale count");
        let mut out = Vec::new();
        assert!(matches!(
            q.wait(&mut out),
            Err(QueueError::Timeout { inflight: 1, .. })
        ));
        // One sleep until the deadline (two if poll(2) woke up early), never a spin.
        assert!(q.counters().blocks <= 2, "{}", q.counters());
        assert!(matches!(q.call.read(), Err(e) if e.kind() == io::ErrorKind::WouldBlock));
    }
}
