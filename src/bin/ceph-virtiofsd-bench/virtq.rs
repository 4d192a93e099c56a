//! A split virtqueue driven from the *driver* (guest) side, laid out in our own guest memory
//! (virtio 1.x, section 2.7): descriptor table, available ring, used ring.
//!
//! Each request slot owns two descriptors: `2*slot` (device-readable request bytes) chained to
//! `2*slot+1` (device-writable reply buffer). Requests without a reply (FORGET) use only the first.
//! Nothing here knows about FUSE.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

const VIRTQ_DESC_F_NEXT: u16 = 1;
const VIRTQ_DESC_F_WRITE: u16 = 2;
const VIRTQ_USED_F_NO_NOTIFY: u16 = 1;

/// Bytes one queue's rings need in guest memory for `size` entries (all three parts, aligned).
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
    last_used: u16,
    pending_kick: bool,
    pub kick: EventFd,
    pub call: EventFd,
    timeout: Duration,
}

impl VirtQueue {
    /// Lays out an empty queue. `slots.len()` must be at most `size / 2`.
    pub fn new(
        index: usize,
        mem: Arc<GuestMemoryMmap>,
        size: u16,
        rings: RingLayout,
        slots: Vec<Slot>,
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
            last_used: 0,
            pending_kick: false,
            kick,
            call,
            timeout,
        };
        Ok(q)
    }

    /// Zeroes the ring headers (flags and idx of both rings).
    pub fn reset_rings(&self) -> Result<(), QueueError> {
        self.store16(self.rings.avail, 0)?;
        self.store16(self.rings.avail.unchecked_add(2), 0)?;
        self.store16(self.rings.used, 0)?;
        self.store16(self.rings.used.unchecked_add(2), 0)
    }

    #[cfg(test)]
    pub fn rings(&self) -> RingLayout {
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

    /// Publishes the available index and kicks the daemon unless it asked not to be notified.
    pub fn flush(&mut self) -> Result<(), QueueError> {
        if !self.pending_kick {
            return Ok(());
        }
        let idx_at = self.rings.avail.unchecked_add(2);
        self.mem
            .store(self.avail_idx, idx_at, Ordering::Release)
            .map_err(|e| QueueError::Memory(idx_at.0, e))?;
        // The device must see the new index before we read its notification flag.
        fence(Ordering::SeqCst);
        let used_flags: u16 = self
            .mem
            .load(self.rings.used, Ordering::Acquire)
            .map_err(|e| QueueError::Memory(self.rings.used.0, e))?;
        self.pending_kick = false;
        if used_flags & VIRTQ_USED_F_NO_NOTIFY == 0 {
            self.kick
                .write(1)
                .map_err(|e| QueueError::Kick(self.index, e))?;
        }
        Ok(())
    }

    /// Takes every completion currently on the used ring.
    pub fn reap(&mut self, out: &mut Vec<Completion>) -> Result<(), QueueError> {
        let idx_at = self.rings.used.unchecked_add(2);
        let used_idx: u16 = self
            .mem
            .load(idx_at, Ordering::Acquire)
            .map_err(|e| QueueError::Memory(idx_at.0, e))?;
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

    /// Blocks until at least one completion is available and returns them all.
    pub fn wait(&mut self, out: &mut Vec<Completion>) -> Result<(), QueueError> {
        let deadline = Instant::now() + self.timeout;
        loop {
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
            let mut pfd = libc::pollfd {
                fd: self.call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
            // SAFETY: `pfd` is a valid, initialised pollfd that lives across the call, and we
            // pass exactly one entry; poll only writes `revents`.
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(QueueError::Wait(self.index, e));
                }
            }
            if r > 0 {
                // Non-blocking: EAGAIN just means someone else already consumed the count.
                let _ = self.call.read();
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
        }
    }

    fn queue() -> VirtQueue {
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
            Duration::from_secs(1),
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
}
