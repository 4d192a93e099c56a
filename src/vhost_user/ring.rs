//! A virtqueue that knows when it stops: vhost-user-backend's `VringMutex`, plus a gate that
//! keeps requests out of guest memory once the frontend stopped the ring.
//!
//! The frontend stops a ring with GET_VRING_BASE (a guest reboot, a driver reset, the end of a
//! migration) and may start it again with new addresses in the same guest memory. From the stop
//! on, that memory is the guest's next driver's (a rebooted kernel's): a request taken before
//! must neither read its arguments there, nor write its reply or a READ's data there, nor put
//! its head on the new used ring, where the new driver would take it for a descriptor it just
//! posted. vhost-user-backend calls no hook of ours at GET_VRING_BASE, but it stops the ring
//! through the ring's own type (`VringT::set_queue_ready(false)`), which a backend chooses. So
//! the backend's ring is this one: a request takes a [`Permit`] for each time it touches guest
//! memory (copying its request in, writing its reply out, a READ or WRITE whose data libcephfs
//! moves in place), and the stop waits until no permit is out (at most [`STOP_WAIT`]) before it
//! stops the ring, then refuses new permits. A restart begins a new generation: requests are
//! known by the generation they were taken in ([`FsVring::generation`]), and one of an older
//! generation gets no permit and is not answered. A request that waits without touching guest
//! memory (SETLKW for another client's lock) holds no permit and does not hold up the stop.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::warn;
use vhost_user_backend::{VringMutex, VringStateGuard, VringStateMutGuard, VringT};
use virtio_queue::Error as VirtQueError;

use super::GuestMem;

/// How long a stop waits for requests still moving data in guest memory (a READ the OSDs are
/// slow to answer). Past it the ring is stopped anyway, and the late request is logged.
pub const STOP_WAIT: Duration = Duration::from_secs(10);

/// The gate of one ring (see the module documentation): one word, so that a permit costs one
/// atomic read-modify-write and no lock; the lock and condition variable serve only a stop
/// waiting for the last permit.
#[derive(Debug, Default)]
struct Gate {
    /// Permits out (bits 0..32), stopped (bit 32), generation (bits 33..64, wrapping).
    word: AtomicU64,
    lock: Mutex<()>,
    idle: Condvar,
}

const WRITERS: u64 = (1 << 32) - 1;
const STOPPED: u64 = 1 << 32;
const GENERATION: u64 = 1 << 33;

fn generation_of(word: u64) -> u64 {
    word >> 33
}

impl Gate {
    fn release(&self) {
        let before = self.word.fetch_sub(1, Ordering::AcqRel);
        if before & WRITERS == 1 && before & STOPPED != 0 {
            // Taking the lock orders this wake-up after the stopper's check of the count.
            let _g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.idle.notify_all();
        }
    }
}

/// Leave to touch the guest memory of a ring, until dropped.
#[must_use]
#[derive(Debug)]
pub struct Permit {
    gate: Arc<Gate>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.release();
    }
}

/// A virtqueue's state (vhost-user-backend's `VringMutex`) and its gate. Cheap to clone
/// (shared).
#[derive(Clone)]
pub struct FsVring {
    inner: VringMutex<GuestMem>,
    gate: Arc<Gate>,
}

impl std::fmt::Debug for FsVring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsVring").finish_non_exhaustive()
    }
}

impl FsVring {
    /// The generation a request taken now belongs to; `None` while the ring stops. Call it
    /// with the ring's state locked (`get_mut`): the gate only changes under that lock, so the
    /// answer holds for the chains popped under it.
    pub fn running(&self) -> Option<u64> {
        let word = self.gate.word.load(Ordering::Acquire);
        (word & STOPPED == 0).then_some(generation_of(word))
    }

    /// Leave to touch guest memory for a request of `generation`; `None` once its ring stopped.
    pub fn permit(&self, generation: u64) -> Option<Permit> {
        let mut word = self.gate.word.load(Ordering::Acquire);
        loop {
            if word & STOPPED != 0 || generation_of(word) != generation || word & WRITERS == WRITERS
            {
                return None;
            }
            match self.gate.word.compare_exchange_weak(
                word,
                word + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(Permit {
                        gate: self.gate.clone(),
                    })
                }
                Err(now) => word = now,
            }
        }
    }

    /// Whether a request of `generation` may still be answered (its ring runs).
    pub fn current(&self, generation: u64) -> bool {
        let word = self.gate.word.load(Ordering::Acquire);
        word & STOPPED == 0 && generation_of(word) == generation
    }

    /// Stop the gate: no new permit, no chain popped, a new generation (under the ring's lock,
    /// see [`Self::running`]), and wait (at most `limit`) for the permits out. Whether they all
    /// came back in time.
    fn stop(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let state = self.inner.get_mut();
        let mut word = self.gate.word.load(Ordering::Acquire);
        while word & STOPPED == 0 {
            let next = word.wrapping_add(GENERATION) | STOPPED;
            match self
                .gate
                .word
                .compare_exchange(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => word = now,
            }
        }
        drop(state);
        let mut g = self
            .gate
            .lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while self.gate.word.load(Ordering::Acquire) & WRITERS != 0 {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            g = self
                .gate
                .idle
                .wait_timeout(g, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    fn start(&self) {
        let _state = self.inner.get_mut();
        self.gate.word.fetch_and(!STOPPED, Ordering::AcqRel);
    }
}

impl<'a> VringStateGuard<'a, GuestMem> for FsVring {
    type G = <VringMutex<GuestMem> as VringStateGuard<'a, GuestMem>>::G;
}

impl<'a> VringStateMutGuard<'a, GuestMem> for FsVring {
    type G = <VringMutex<GuestMem> as VringStateMutGuard<'a, GuestMem>>::G;
}

impl VringT<GuestMem> for FsVring {
    fn new(mem: GuestMem, max_queue_size: u16) -> Result<Self, VirtQueError> {
        Ok(FsVring {
            inner: VringMutex::new(mem, max_queue_size)?,
            gate: Arc::default(),
        })
    }

    fn get_ref(&self) -> <Self as VringStateGuard<'_, GuestMem>>::G {
        self.inner.get_ref()
    }

    fn get_mut(&self) -> <Self as VringStateMutGuard<'_, GuestMem>>::G {
        self.inner.get_mut()
    }

    fn add_used(&self, desc_index: u16, len: u32) -> Result<(), VirtQueError> {
        self.inner.add_used(desc_index, len)
    }

    fn signal_used_queue(&self) -> io::Result<()> {
        self.inner.signal_used_queue()
    }

    fn enable_notification(&self) -> Result<bool, VirtQueError> {
        self.inner.enable_notification()
    }

    fn disable_notification(&self) -> Result<(), VirtQueError> {
        self.inner.disable_notification()
    }

    fn needs_notification(&self) -> Result<bool, VirtQueError> {
        self.inner.needs_notification()
    }

    fn set_enabled(&self, enabled: bool) {
        self.inner.set_enabled(enabled);
    }

    fn set_queue_info(
        &self,
        desc_table: u64,
        avail_ring: u64,
        used_ring: u64,
    ) -> Result<(), VirtQueError> {
        self.inner.set_queue_info(desc_table, avail_ring, used_ring)
    }

    fn queue_next_avail(&self) -> u16 {
        self.inner.queue_next_avail()
    }

    fn set_queue_next_avail(&self, base: u16) {
        self.inner.set_queue_next_avail(base);
    }

    fn set_queue_next_used(&self, idx: u16) {
        self.inner.set_queue_next_used(idx);
    }

    fn queue_used_idx(&self) -> Result<u16, VirtQueError> {
        self.inner.queue_used_idx()
    }

    fn set_queue_size(&self, num: u16) {
        self.inner.set_queue_size(num);
    }

    fn set_queue_event_idx(&self, enabled: bool) {
        self.inner.set_queue_event_idx(enabled);
    }

    /// GET_VRING_BASE (`false`): requests still moving data in guest memory finish first (at
    /// most [`STOP_WAIT`]), and no request of before touches it afterwards. Starting
    /// (`true`) opens the gate to the requests taken from then on.
    fn set_queue_ready(&self, ready: bool) {
        if ready {
            self.start();
        } else if !self.stop(STOP_WAIT) {
            warn!(
                secs = STOP_WAIT.as_secs(),
                "The frontend stopped a ring while a request was still moving data in guest \
                 memory (an OSD slow to answer a READ or WRITE); stopping it anyway: that \
                 request may still write into the memory of the guest's next driver"
            );
        }
        self.inner.set_queue_ready(ready);
    }

    fn set_kick(&self, file: Option<File>) {
        self.inner.set_kick(file);
    }

    fn read_kick(&self) -> io::Result<bool> {
        self.inner.read_kick()
    }

    fn set_call(&self, file: Option<File>) {
        self.inner.set_call(file);
    }

    fn set_err(&self, file: Option<File>) {
        self.inner.set_err(file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};

    fn vring() -> FsVring {
        let gm = GuestMemoryMmap::<super::super::GuestBitmap>::from_ranges(&[(
            GuestAddress(0),
            0x1_0000,
        )])
        .unwrap();
        FsVring::new(GuestMemoryAtomic::new(gm), 16).unwrap()
    }

    /// A stop waits for the permit out, then no request of before gets one; a restart lets
    /// only requests taken after it in.
    #[test]
    fn a_stop_waits_for_writers_and_ends_their_generation() {
        let v = vring();
        v.set_queue_ready(true);
        let old = v.running().unwrap();
        let p = v.permit(old).expect("a running ring gives permits");
        let v2 = v.clone();
        let stopper = std::thread::spawn(move || v2.set_queue_ready(false));
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !stopper.is_finished(),
            "the stop did not wait for the permit"
        );
        drop(p);
        stopper.join().unwrap();
        assert!(v.permit(old).is_none());
        assert!(!v.current(old));
        v.set_queue_ready(true);
        assert!(
            v.permit(old).is_none(),
            "a request of before the stop got a permit"
        );
        let new = v.running().unwrap();
        assert!(v.current(new));
        assert!(v.permit(new).is_some());
    }

    /// A permit never given back does not hold a stop for ever.
    #[test]
    fn a_stop_gives_up_waiting_after_its_bound() {
        let v = vring();
        v.set_queue_ready(true);
        let p = v.permit(v.running().unwrap()).unwrap();
        assert!(!v.stop(Duration::from_millis(20)));
        drop(p);
    }
}
