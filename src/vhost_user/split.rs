//! The split virtqueue's avail and used rings (virtio 1.2, 2.7.6 and 2.7.8), read and written
//! through one translation of each ring per request.
//!
//! virtio-queue's `Queue` reads and writes every field through `GuestMemory`, which looks the
//! guest address up in the region table again for each one (about 120 instructions a field):
//! taking a chain, using it and deciding on the notification cost six of them, more than a
//! third of what the daemon spends on a cached GETATTR. Here each ring is turned into one
//! `VolatileSlice` (bounds-checked, dirty-logged on writes like any other guest write) and the
//! fields are read and written in it.
//!
//! The state stays in the `Queue` (next_avail, next_used): this only does what its
//! `pop_descriptor_chain`, `add_used` and `needs_notification` do, field for field and with the
//! same memory orderings. Whenever the fast way cannot be taken (a ring that does not lie in
//! one region, a misaligned ring, a queue not set up), `Queue`'s own methods run instead, so a
//! hostile frontend's ring gets the same answers as before.

use std::num::Wrapping;
use std::sync::atomic::{fence, Ordering};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, GuestMemoryMmap};

use super::GuestBitmap;

type Mem = GuestMemoryMmap<GuestBitmap>;

/// `flags` and `idx` before the ring's entries, in both rings.
const RING_HEADER: usize = 4;
const AVAIL_ENTRY: usize = 2;
const USED_ENTRY: usize = 8;

/// Take the next available chain's head index, as `Queue::pop_descriptor_chain` does; `None`
/// when the guest has made none (or the queue is not usable).
pub(super) fn pop_head(q: &mut Queue, mem: &Mem) -> Option<u16> {
    match fast_pop(q, mem) {
        Some(taken) => taken,
        None => q.pop_descriptor_chain(mem).map(|c| c.head_index()),
    }
}

/// `Some(result)` when the fast way could decide; `None`: use `Queue`'s own method.
fn fast_pop(q: &mut Queue, mem: &Mem) -> Option<Option<u16>> {
    let size = q.size();
    if !q.ready() || q.avail_ring() == 0 || size == 0 {
        return None;
    }
    // The ring's idx and entries (the used_event field after them is not needed here).
    let len = RING_HEADER + AVAIL_ENTRY * usize::from(size);
    let ring = mem.get_slice(GuestAddress(q.avail_ring()), len).ok()?;
    let idx = u16::from_le(ring.load::<u16>(2, Ordering::Acquire).ok()?);
    let next = q.next_avail();
    if idx == next {
        return Some(None);
    }
    // A driver claiming more new entries than the ring holds would have entries served twice:
    // virtio-queue refuses that (and logs it), so its method answers.
    if idx.wrapping_sub(next) > size {
        return None;
    }
    let at = RING_HEADER + AVAIL_ENTRY * usize::from(next % size);
    let head = u16::from_le(ring.load::<u16>(at, Ordering::Acquire).ok()?);
    q.set_next_avail(next.wrapping_add(1));
    Some(Some(head))
}

/// Put chain `head` in the used ring with `len` bytes written and publish it, as
/// `Queue::add_used` does, then tell whether the guest asked to be notified of it, as
/// `Queue::needs_notification` does right after one `add_used` (true also when the guest's
/// wish cannot be read). An error: nothing was published.
pub(super) fn add_used(
    q: &mut Queue,
    mem: &Mem,
    head: u16,
    len: u32,
) -> Result<bool, virtio_queue::Error> {
    if let Some(notify) = fast_add_used(q, mem, head, len) {
        return Ok(notify);
    }
    q.add_used(mem, head, len)?;
    // Published: a used_event that cannot be read is answered with a notification.
    Ok(q.needs_notification(mem).unwrap_or(true))
}

fn fast_add_used(q: &mut Queue, mem: &Mem, head: u16, len: u32) -> Option<bool> {
    let size = q.size();
    // Out-of-range heads and unusable queues: `Queue` refuses them with its own error.
    if head >= size || q.used_ring() == 0 || q.avail_ring() == 0 {
        return None;
    }
    let used = mem
        .get_slice(
            GuestAddress(q.used_ring()),
            RING_HEADER + USED_ENTRY * usize::from(size),
        )
        .ok()?;
    let event_idx = q.event_idx_enabled();
    // The driver's used_event, after the avail ring's entries (read only under EVENT_IDX).
    let used_event_at = RING_HEADER + AVAIL_ENTRY * usize::from(size);
    let avail = if event_idx {
        Some(
            mem.get_slice(GuestAddress(q.avail_ring()), used_event_at + 2)
                .ok()?,
        )
    } else {
        None
    };
    // The element's two fields are aligned words (the ring is 4-aligned when the checked
    // stores below succeed); written before the index that publishes them.
    let next = Wrapping(q.next_used());
    let at = RING_HEADER + USED_ENTRY * usize::from(next.0 % size);
    used.store(u32::to_le(u32::from(head)), at, Ordering::Relaxed)
        .ok()?;
    used.store(u32::to_le(len), at + 4, Ordering::Relaxed)
        .ok()?;
    let new = next + Wrapping(1);
    used.store(u16::to_le(new.0), 2, Ordering::Release).ok()?;
    q.set_next_used(new.0);
    // `needs_notification`: the index is visible before the driver's wish is read.
    fence(Ordering::SeqCst);
    let Some(avail) = avail else {
        // VRING_AVAIL_F_NO_INTERRUPT is a hint the device may ignore; virtio-queue does.
        return Some(true);
    };
    let Ok(used_event) = avail.load::<u16>(used_event_at, Ordering::Relaxed) else {
        // The used element is published: `Queue`'s answer to an unreadable used_event.
        return Some(true);
    };
    // One element added since the last check: notify when used_event == the old index.
    let used_event = Wrapping(u16::from_le(used_event));
    Some(new - used_event - Wrapping(1) < Wrapping(1))
}

/// A lock-free watch on the avail ring's index (`poll_avail`, `more_avail`): the idx field
/// translated once, and the index the queue pops next when the watch began.
pub(super) struct AvailWatch<'m> {
    idx: vm_memory::volatile_memory::VolatileSlice<'m, vm_memory::bitmap::MS<'m, Mem>>,
    next: u16,
}

impl<'m> AvailWatch<'m> {
    /// `None` when the ring's idx does not lie in guest memory.
    pub(super) fn new(q: &Queue, mem: &'m Mem) -> Option<Self> {
        Self::at(GuestAddress(q.avail_ring()), q.next_avail(), mem)
    }

    /// The avail ring at `avail_ring`, whose next entry not popped is `next`.
    pub(super) fn at(avail_ring: GuestAddress, next: u16, mem: &'m Mem) -> Option<Self> {
        let idx = mem.get_slice(avail_ring.checked_add(2)?, 2).ok()?;
        Some(AvailWatch { idx, next })
    }

    /// Whether the guest has made a request since; `None` when the idx cannot be read.
    pub(super) fn moved(&self) -> Option<bool> {
        let idx = self.idx.load::<u16>(0, Ordering::Acquire).ok()?;
        Some(u16::from_le(idx) != self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::GuestAddress;

    fn memory() -> Mem {
        Mem::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
    }

    const AVAIL: u64 = 0x1000;
    const USED: u64 = 0x2000;

    /// A ready queue of `size` entries: the descriptor table at 0, the avail ring at
    /// [`AVAIL`], the used ring at [`USED`], both indexes at 0. (Set up by hand: virtio-queue's
    /// mock lays its used ring over the end of its avail ring.)
    fn queue(mem: &Mem, size: u16, event_idx: bool) -> Queue {
        let mock = MockSplitQueue::new(mem, size);
        let mut q: Queue = mock.create_queue().unwrap();
        q.set_avail_ring_address(Some(AVAIL as u32), Some(0));
        q.set_used_ring_address(Some(USED as u32), Some(0));
        q.set_event_idx(event_idx);
        q
    }

    fn put(mem: &Mem, at: u64, v: u16) {
        mem.write_obj(u16::to_le(v), GuestAddress(at)).unwrap();
    }

    fn get16(mem: &Mem, at: u64) -> u16 {
        u16::from_le(mem.read_obj(GuestAddress(at)).unwrap())
    }

    fn get32(mem: &Mem, at: u64) -> u32 {
        u32::from_le(mem.read_obj(GuestAddress(at)).unwrap())
    }

    /// The driver makes `heads` available, in order, from index `start`.
    fn offer(mem: &Mem, size: u16, heads: &[u16], start: u16) {
        for (i, h) in (0u16..).zip(heads) {
            let slot = start.wrapping_add(i) % size;
            put(mem, AVAIL + 4 + 2 * u64::from(slot), *h);
        }
        let n = u16::try_from(heads.len()).unwrap();
        put(mem, AVAIL + 2, start.wrapping_add(n));
    }

    /// Against virtio-queue's own `Queue`, on twin queues driven alike: the same heads taken,
    /// the same used ring written, the same notifications decided, through index wrap-around
    /// and with every used_event the driver may set.
    #[test]
    fn takes_uses_and_notifies_as_virtio_queue_does() {
        for event_idx in [false, true] {
            let (ma, mb) = (memory(), memory());
            let size = 8u16;
            let (mut qa, mut qb) = (queue(&ma, size, event_idx), queue(&mb, size, event_idx));
            // Start near the wrap of the 16-bit indexes.
            let mut start = 65_530u16;
            for (q, m) in [(&mut qa, &ma), (&mut qb, &mb)] {
                q.set_next_avail(start);
                q.set_next_used(start);
                put(m, AVAIL + 2, start);
                put(m, USED + 2, start);
            }
            let mut seed = 0x9e37_79b9_u32;
            let mut answers = [0u32; 2];
            for round in 0..200u32 {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                let n = (seed >> 16) as u16 % 4;
                let heads: Vec<u16> = (0..n)
                    .map(|i| u16::try_from(round).unwrap().wrapping_add(i) % size)
                    .collect();
                // The driver's used_event, after the avail ring's entries: anywhere near the
                // indexes in play, so that both answers come up.
                let used_event = start.wrapping_add((seed >> 8) as u16 % 6).wrapping_sub(1);
                for m in [&ma, &mb] {
                    offer(m, size, &heads, start);
                    put(m, AVAIL + 4 + 2 * u64::from(size), used_event);
                }
                start = start.wrapping_add(n);
                loop {
                    let a = pop_head(&mut qa, &ma);
                    let b = qb.pop_descriptor_chain(&mb).map(|c| c.head_index());
                    assert_eq!(a, b, "round {round}: taken");
                    let Some(head) = a else { break };
                    let len = seed ^ u32::from(head);
                    let na = add_used(&mut qa, &ma, head, len).unwrap();
                    qb.add_used(&mb, head, len).unwrap();
                    let nb = qb.needs_notification(&mb).unwrap();
                    assert_eq!(
                        na, nb,
                        "round {round}: notification (event_idx {event_idx})"
                    );
                    answers[usize::from(na)] += 1;
                }
                assert_eq!(qa.next_avail(), qb.next_avail());
                assert_eq!(qa.next_used(), qb.next_used());
                assert_eq!(get16(&ma, USED + 2), get16(&mb, USED + 2), "round {round}");
                for i in 0..u64::from(size) {
                    for field in [4 + 8 * i, 8 + 8 * i] {
                        assert_eq!(
                            get32(&ma, USED + field),
                            get32(&mb, USED + field),
                            "round {round}, used ring byte {field}"
                        );
                    }
                }
            }
            if event_idx {
                assert!(
                    answers[0] > 0 && answers[1] > 0,
                    "both answers should come up: {answers:?}"
                );
            }
        }
    }

    /// Rings the fast way cannot take (outside memory, misaligned, an out-of-range head) get
    /// virtio-queue's answers.
    #[test]
    fn hostile_rings_get_virtio_queues_answers() {
        let mem = memory();
        let mut q = queue(&mem, 8, true);
        // A head past the queue's size is refused, and nothing is published.
        let before = q.next_used();
        assert!(add_used(&mut q, &mem, 8, 0).is_err());
        assert_eq!(q.next_used(), before);
        // A used ring past the end of memory: an error, the index not moved.
        q.set_used_ring_address(Some(0x10_0000 - 8), Some(0));
        assert!(add_used(&mut q, &mem, 1, 0).is_err());
        assert_eq!(q.next_used(), before);
        // An avail ring past the end of memory: nothing taken.
        q.set_avail_ring_address(Some(0x10_0000 - 2), Some(0));
        assert_eq!(pop_head(&mut q, &mem), None);
        // A misaligned avail ring, with a request made in it: the same answer as a twin
        // queue of virtio-queue's gives.
        let mut twin = queue(&mem, 8, true);
        for q in [&mut q, &mut twin] {
            q.set_avail_ring_address(Some(0x8001), Some(0));
            q.set_next_avail(0);
        }
        mem.write_obj(u16::to_le(1), GuestAddress(0x8003)).unwrap();
        let theirs = twin.pop_descriptor_chain(&mem).map(|c| c.head_index());
        assert_eq!(pop_head(&mut q, &mem), theirs);
        assert_eq!(q.next_avail(), twin.next_avail());
    }

    /// Seeded random rings against virtio-queue's: random sizes, ring addresses (misaligned,
    /// across the end of memory, overlapping), indexes, heads and used_events, as a hostile
    /// guest or frontend may set them; both must take the same heads, publish the same used
    /// rings and make the same notification decisions. A failure prints its seed
    /// (`SPLIT_SEED=N cargo test --lib split::tests::random` replays it).
    #[test]
    fn random_rings_get_virtio_queues_answers() {
        // SPLIT_SEEDS=N runs seeds 1..=N (a longer soak than CI's 300).
        for seed in crate::vhost_user::tests::seeds("SPLIT", 300) {
            let mut next = crate::vhost_user::tests::xorshift(seed);
            let size = 1u16 << (next() % 9);
            let (ma, mb) = (memory(), memory());
            let (mut qa, mut qb) = (queue(&ma, size, true), queue(&mb, size, true));
            let event_idx = next() % 4 != 0;
            // Mostly sane addresses, sometimes hostile ones.
            let addr = |r: u64| -> u32 {
                match r % 8 {
                    0 => 0x10_0000 - u32::try_from(r % 64).unwrap(),
                    1 => 0x1001 + u32::try_from(r % 7).unwrap(),
                    _ => 0x1000 * (1 + u32::try_from(r % 0xf0).unwrap()),
                }
            };
            let (avail, used) = (addr(next()), addr(next()));
            for q in [&mut qa, &mut qb] {
                q.set_event_idx(event_idx);
                q.set_avail_ring_address(Some(avail), Some(0));
                q.set_used_ring_address(Some(used), Some(0));
            }
            let start = u16::try_from(next() % 65_536).unwrap();
            for q in [&mut qa, &mut qb] {
                q.set_next_avail(start);
                q.set_next_used(start.wrapping_sub(u16::try_from(next() % 3).unwrap_or(0)));
            }
            // Keep the twins' state identical (next_used above drew twice).
            qb.set_next_used(qa.next_used());
            for step in 0..64 {
                // The guest writes some random 16-bit words into its avail ring area.
                for _ in 0..next() % 6 {
                    let at = u64::from(avail) + next() % (4 + 2 * u64::from(size) + 2);
                    let v = u16::try_from(next() % 65_536).unwrap();
                    for m in [&ma, &mb] {
                        let _ = m.write_obj(v, GuestAddress(at));
                    }
                }
                let a = pop_head(&mut qa, &ma);
                let b = qb.pop_descriptor_chain(&mb).map(|c| c.head_index());
                assert_eq!(a, b, "seed {seed} step {step}: taken");
                assert_eq!(qa.next_avail(), qb.next_avail(), "seed {seed} step {step}");
                // Used: the head taken, or any head at all (a buggy or hostile caller).
                let head = a.unwrap_or(u16::try_from(next() % 65_536).unwrap() % (size * 2));
                let len = u32::try_from(next() % (1 << 32)).unwrap();
                let ours = add_used(&mut qa, &ma, head, len);
                let theirs = qb
                    .add_used(&mb, head, len)
                    .map(|()| qb.needs_notification(&mb).unwrap_or(true));
                assert_eq!(
                    ours.is_ok(),
                    theirs.is_ok(),
                    "seed {seed} step {step}: used"
                );
                if let (Ok(x), Ok(y)) = (ours, theirs) {
                    assert_eq!(x, y, "seed {seed} step {step}: notification");
                }
                assert_eq!(qa.next_used(), qb.next_used(), "seed {seed} step {step}");
                let (mut ba, mut bb) = ([0u8; 4096], [0u8; 4096]);
                let area = GuestAddress(u64::from(used) & !0xfff);
                if ma.read_slice(&mut ba, area).is_ok() {
                    mb.read_slice(&mut bb, area).unwrap();
                    assert!(ba == bb, "seed {seed} step {step}: used ring bytes differ");
                }
            }
        }
    }
}
