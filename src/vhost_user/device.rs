//! The vhost-user device: what the backend offers the frontend (features, protocol features,
//! the config space with the mount tag), the guest memory it is given, and the events of the
//! queue threads.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use tracing::{debug, error, warn};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost_user_backend::VhostUserBackend;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::{
    GuestBitmap, GuestMem, VhostUserFsBackend, Vring, MAX_TAG_LEN, QUEUE_SIZE, VIRTIO_FS_CONFIG_LEN,
};
use crate::server::{mark_queue_thread, Servable};

/// Build `struct virtio_fs_config` for a tag.
pub(super) fn config_space(tag: &str, request_queues: u16) -> [u8; VIRTIO_FS_CONFIG_LEN] {
    let mut space = [0u8; VIRTIO_FS_CONFIG_LEN];
    let bytes = tag.as_bytes();
    let n = bytes.len().min(MAX_TAG_LEN);
    if let (Some(dst), Some(src)) = (space.get_mut(..n), bytes.get(..n)) {
        dst.copy_from_slice(src);
    }
    if let Some(dst) = space.get_mut(MAX_TAG_LEN..) {
        dst.copy_from_slice(&u32::from(request_queues).to_le_bytes());
    }
    space
}

impl<F> VhostUserBackend for VhostUserFsBackend<F>
where
    F: Servable + 'static,
{
    type Bitmap = GuestBitmap;
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        1 + usize::from(self.inner.request_queues)
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | if self.inner.device_state.get().is_some() {
                // Migration: the guest memory we write is logged (see `GuestBitmap`).
                VhostUserVirtioFeatures::LOG_ALL.bits()
            } else {
                0
            }
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let mut f = VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK;
        if self.inner.config_space.is_some() {
            f |= VhostUserProtocolFeatures::CONFIG;
        }
        if self.inner.device_state.get().is_some() {
            f |= VhostUserProtocolFeatures::DEVICE_STATE | VhostUserProtocolFeatures::LOG_SHMFD;
        }
        f
    }

    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<Option<File>> {
        self.start_transfer(direction, phase, file)?;
        Ok(None)
    }

    fn check_device_state(&self) -> io::Result<()> {
        self.finish_transfer()
    }

    fn acked_features(&self, features: u64) {
        let logging = features & VhostUserVirtioFeatures::LOG_ALL.bits() != 0;
        if self.inner.logging.swap(logging, Ordering::AcqRel) != logging {
            debug!(logging, "dirty page logging changed");
        }
    }

    /// The handler sets each ring's EVENT_IDX itself; the backend keeps nothing of it.
    fn set_event_idx(&self, _enabled: bool) {}

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let Some(space) = &self.inner.config_space else {
            return Vec::new();
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = start.saturating_add(usize::try_from(size).unwrap_or(usize::MAX));
        match space.get(start..end) {
            Some(bytes) => bytes.to_vec(),
            None => {
                warn!(
                    offset,
                    size, "Frontend read outside the virtio-fs config space"
                );
                Vec::new()
            }
        }
    }

    fn update_memory(&self, mem: GuestMem) -> io::Result<()> {
        *self
            .inner
            .mem
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(mem);
        Ok(())
    }

    /// One vhost-user epoll thread per queue: thread i serves queue i.
    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.num_queues()).map(|i| 1u64 << i).collect()
    }

    /// vhost-user-backend 0.22 registers the consumer with its thread's epoll through
    /// `into_raw_fd()` and never closes it: a new eventfd for each connection left one
    /// descriptor per queue thread open for good, and a frontend reconnecting to a
    /// `--keep-serving` daemon some 10,000 times exhausted its descriptors (found by the
    /// device-state fuzzer). So each thread index gets one exit event for the daemon's life,
    /// emptied before it is given to the next connection's handler (whose epoll is new; the
    /// previous connection's threads were joined before it is made).
    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let mut events = self
            .inner
            .exit_events
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if events.len() <= thread_index {
            events.resize_with(thread_index + 1, || None);
        }
        let slot = events.get_mut(thread_index)?;
        if slot.is_none() {
            match new_event_consumer_and_notifier(EventFlag::NONBLOCK) {
                Ok(pair) => *slot = Some(pair),
                Err(e) => {
                    error!(thread_index, error = %e, "Cannot create a queue thread exit event");
                    return None;
                }
            }
        }
        let (consumer, notifier) = slot.as_ref()?;
        // The previous connection's exit: a non-blocking read empties the counter (EAGAIN once
        // it is 0), so the new thread does not exit at once.
        let _ = consumer.consume();
        let notifier = match notifier.try_clone() {
            Ok(n) => n,
            Err(e) => {
                error!(thread_index, error = %e, "Cannot duplicate a queue thread exit event");
                return None;
            }
        };
        // SAFETY: the new consumer aliases the descriptor `exit_events` owns for the daemon's
        // whole life. VringEpollHandler::new (vhost-user-backend 0.22, pinned in Cargo.lock)
        // turns it into a raw fd at once, adds that to its epoll and never closes it, so the
        // descriptor is closed exactly once, by `exit_events`. A handler that closed it would
        // make the next connection's epoll registration fail:
        // `hostile_keep_serving_reconnects_leave_no_descriptors` reconnects 200 times.
        let alias = unsafe { EventConsumer::from_raw_fd(consumer.as_raw_fd()) };
        Some((alias, notifier))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            warn!(
                device_event,
                ?evset,
                "Unexpected event set on a queue; ignoring"
            );
            return Ok(());
        }
        // With one queue per thread, `device_event` indexes this thread's single vring and the
        // thread index is the queue index.
        let Some(vring) = vrings.get(usize::from(device_event)) else {
            warn!(device_event, "Event for an unknown queue; ignoring");
            return Ok(());
        };
        mark_queue_thread();
        debug!(queue = thread_id, "Queue kicked");
        if let Some(slot) = self.inner.vrings.get(thread_id) {
            let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.is_none() {
                *slot = Some(vring.clone());
            }
        }
        // An error here means the guest's ring addresses are unusable. Returning it would end
        // this queue's thread for good; log it and retry on the next kick instead.
        if let Err(e) = self.process_queue(vring, thread_id) {
            warn!(queue = thread_id, error = %e, "Cannot process queue");
        }
        Ok(())
    }
}
