//! The request as fuse-backend-rs reads it: the in-header from a private copy, the rest from
//! guest memory.
//!
//! fuse-backend-rs decodes the in-header itself, from the `Reader` it is given. Built straight
//! from the guest's descriptor chain, that `Reader` reads guest memory, which the guest may
//! rewrite at any time: fuse-backend-rs would then serve another request than the one the
//! queue thread decoded, placed and vetted (an opcode we answer ENOSYS, a length we refused).
//! So the `Reader` is built over a private descriptor chain instead: its first descriptor
//! holds the header bytes the queue thread decoded, in a small region of this thread's own
//! memory, and the following ones are the guest's readable descriptors past the header. Every
//! other byte of the request is read exactly once, by whoever consumes it.
//!
//! The private region lives at [`BASE`], above any guest physical address, in a memory map
//! made of the guest's regions and it; the guest's descriptors are checked to lie within guest
//! memory before they are copied, so none of them can name the private region.

use std::cell::RefCell;
use std::mem::size_of;
use std::sync::Arc;

use super::GuestBitmap;
use fuse_backend_rs::abi::fuse_abi::InHeader;
use virtio_bindings::virtio_ring::VRING_DESC_F_NEXT;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{
    Address, ByteValued, Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, GuestRegionMmap,
    MemoryRegionAddress, MmapRegion,
};

/// Where the private region starts: guest physical addresses stay far below (52 bits at most).
const BASE: u64 = 1 << 62;
/// Layout of the private region (offsets from [`BASE`]).
const HEADER_AT: u64 = 0;
const AVAIL_AT: u64 = 0x40;
const USED_AT: u64 = 0x1000;
const DESC_AT: u64 = 0x4000;
const REGION_SIZE: usize = 0x8000;
/// Descriptors in the private table (a power of two, as virtqueue sizes must be).
const TABLE: u16 = 1024;
/// The most readable descriptors a request may have: one private table slot holds the header.
#[allow(clippy::as_conversions)] // u16 to usize widens, and `From` is not const
pub(super) const MAX_READABLE: usize = TABLE as usize - 1;
/// `VRING_DESC_F_NEXT` (a u32 in virtio-bindings) as a descriptor's u16 flags.
#[allow(clippy::as_conversions, clippy::cast_possible_truncation)] // checked at compile time
const DESC_F_NEXT: u16 = {
    let f = VRING_DESC_F_NEXT as u16;
    assert!(f as u32 == VRING_DESC_F_NEXT);
    f
};

thread_local! {
    /// This thread's private region, made on first use.
    static REGION: RefCell<Option<Arc<GuestRegionMmap<GuestBitmap>>>> = const { RefCell::new(None) };
    /// The last memory map [`compose`] built here: reused while guest memory is unchanged.
    static COMPOSED: RefCell<Option<Arc<GuestMemoryMmap<GuestBitmap>>>> = const { RefCell::new(None) };
}

/// Why the private request could not be built; the chain is returned unanswered.
#[derive(Debug, thiserror::Error)]
pub enum BounceError {
    #[error("The request has more than {MAX_READABLE} readable descriptors")]
    TooLong,
    #[error("A readable descriptor lies outside guest memory")]
    OutsideMemory,
    #[error("Guest memory reaches the private request region")]
    MemoryTooHigh,
    #[error("Cannot set up the private request copy: {0}")]
    Setup(String),
}

fn region() -> Result<Arc<GuestRegionMmap<GuestBitmap>>, BounceError> {
    REGION.with(|r| {
        let mut r = r.borrow_mut();
        if let Some(region) = r.as_ref() {
            return Ok(region.clone());
        }
        let mapping = MmapRegion::<GuestBitmap>::new(REGION_SIZE)
            .map_err(|e| BounceError::Setup(e.to_string()))?;
        let region = GuestRegionMmap::new(mapping, GuestAddress(BASE))
            .map(Arc::new)
            .ok_or_else(|| BounceError::Setup("private region address overflows".into()))?;
        *r = Some(region.clone());
        Ok(region)
    })
}

/// Make this thread's private region now, so that the first request served here does not pay
/// for it (a failure is reported by the request that needs the region).
pub(super) fn warm() {
    let _ = region();
}

/// Guest memory plus this thread's private region. (The guest's regions are shared, not
/// copied; the map is cached per thread while they stay the same, and it keeps the regions
/// it names alive, so a region at the same address is the same mapping.)
pub(super) fn compose(
    guest: &GuestMemoryMmap<GuestBitmap>,
) -> Result<Arc<GuestMemoryMmap<GuestBitmap>>, BounceError> {
    if guest.last_addr().raw_value() >= BASE {
        return Err(BounceError::MemoryTooHigh);
    }
    COMPOSED.with(|c| {
        let mut c = c.borrow_mut();
        // The same guest regions (the very same mappings), in the same order, then ours.
        let same = c.as_ref().is_some_and(|m| {
            m.num_regions() == guest.num_regions() + 1
                && guest.iter().zip(m.iter()).all(|(g, m)| std::ptr::eq(g, m))
        });
        if !same {
            let composed = guest
                .insert_region(region()?)
                .map_err(|e| BounceError::Setup(e.to_string()))?;
            *c = Some(Arc::new(composed));
        }
        c.clone()
            .ok_or_else(|| BounceError::Setup("no memory map".into()))
    })
}

/// A descriptor chain in `composite` (from [`compose`] over `guest`): `header` from the
/// private region, then the readable bytes of `chain` that follow its in-header.
pub(super) fn request_chain<'a, M>(
    composite: &'a GuestMemoryMmap<GuestBitmap>,
    guest: &GuestMemoryMmap<GuestBitmap>,
    chain: DescriptorChain<M>,
    header: &InHeader,
) -> Result<DescriptorChain<&'a GuestMemoryMmap<GuestBitmap>>, BounceError>
where
    M: std::ops::Deref,
    M::Target: GuestMemory,
{
    let region = region()?;
    let setup = |e: vm_memory::GuestMemoryError| BounceError::Setup(e.to_string());
    let put_desc = |i: usize, addr: u64, len: u32, last: bool| {
        // i < TABLE: the index and the next one fit in u16.
        let next = u16::try_from(i + 1).unwrap_or(0);
        let at = u64::try_from(i).map_err(|_| BounceError::TooLong)?;
        let desc = if last {
            Descriptor::new(addr, len, 0, 0)
        } else {
            Descriptor::new(addr, len, DESC_F_NEXT, next)
        };
        region
            .write_obj(desc, MemoryRegionAddress(DESC_AT + 16 * at))
            .map_err(setup)
    };
    let header_len = u32::try_from(size_of::<InHeader>())
        .map_err(|_| BounceError::Setup("the in-header does not fit a descriptor".into()))?;
    region
        .write_slice(header.as_slice(), MemoryRegionAddress(HEADER_AT))
        .map_err(setup)?;
    // Each descriptor is written with NEXT; the last one is written again without it.
    let mut last = (BASE + HEADER_AT, header_len);
    let mut count = 1;
    put_desc(0, last.0, last.1, false)?;
    let mut skip = u64::from(header_len);
    for desc in chain.readable() {
        let (mut addr, mut len) = (desc.addr(), u64::from(desc.len()));
        let skipped = skip.min(len);
        skip -= skipped;
        len -= skipped;
        addr = addr
            .checked_add(skipped)
            .ok_or(BounceError::OutsideMemory)?;
        if len == 0 {
            continue;
        }
        let in_guest = usize::try_from(len).is_ok_and(|n| guest.check_range(addr, n));
        if !in_guest {
            return Err(BounceError::OutsideMemory);
        }
        if count >= usize::from(TABLE) {
            return Err(BounceError::TooLong);
        }
        // `len` came from a u32 and only shrank.
        last = (addr.raw_value(), u32::try_from(len).unwrap_or(0));
        put_desc(count, last.0, last.1, false)?;
        count += 1;
    }
    put_desc(count - 1, last.0, last.1, true)?;
    // Avail ring: flags 0, idx 1, ring[0] = descriptor 0.
    for (at, value) in [(0, 0u16), (2, 1), (4, 0)] {
        region
            .write_obj(value.to_le(), MemoryRegionAddress(AVAIL_AT + at))
            .map_err(setup)?;
    }
    let queue_err = |e: virtio_queue::Error| BounceError::Setup(e.to_string());
    let mut queue = Queue::new(TABLE).map_err(queue_err)?;
    queue
        .try_set_desc_table_address(GuestAddress(BASE + DESC_AT))
        .map_err(queue_err)?;
    queue
        .try_set_avail_ring_address(GuestAddress(BASE + AVAIL_AT))
        .map_err(queue_err)?;
    queue
        .try_set_used_ring_address(GuestAddress(BASE + USED_AT))
        .map_err(queue_err)?;
    queue.set_ready(true);
    let mut iter = queue.iter(composite).map_err(queue_err)?;
    iter.next()
        .ok_or_else(|| BounceError::Setup("the private descriptor chain is empty".into()))
}
