//! Live migration of the device state: SET_DEVICE_STATE_FD moves the guest's session (saved by
//! the source, loaded by the destination) through a pipe on a thread of its own, and
//! CHECK_DEVICE_STATE joins it (`crate::migration` is the format, the filesystem the content).

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use tracing::{error, warn};
use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};

use super::session::InFlight;
use super::VhostUserFsBackend;
use crate::migration::{DeviceState, MigrationError, MAX_STATE_LEN};
use crate::server::Servable;

/// How long a save waits for requests of the stopped device that are still being answered.
const SAVE_DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// Source side: write the state to `file` and close it (the frontend reads until EOF).
fn save_device_state(
    state: &dyn DeviceState,
    in_flight: &InFlight,
    mut file: File,
) -> Result<(), MigrationError> {
    let started = Instant::now();
    if !in_flight.wait_idle(SAVE_DRAIN_LIMIT) {
        return Err(MigrationError::Busy);
    }
    let bytes = state.save_state()?;
    file.write_all(&bytes)?;
    drop(file);
    tracing::info!(
        bytes = bytes.len(),
        ms = started.elapsed().as_millis(),
        "migration: device state sent"
    );
    Ok(())
}

/// Destination side: read the state until EOF, then resolve it.
fn load_device_state(state: &dyn DeviceState, file: File) -> Result<(), MigrationError> {
    let started = Instant::now();
    let mut bytes = Vec::new();
    file.take(MAX_STATE_LEN + 1).read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > MAX_STATE_LEN {
        return Err(crate::migration::FormatError::Corrupt(
            "longer than the most a state may take",
        )
        .into());
    }
    let report = state.load_state(&bytes)?;
    tracing::info!(
        bytes = bytes.len(),
        ms = started.elapsed().as_millis(),
        %report,
        "migration: device state loaded"
    );
    Ok(())
}

impl<F> VhostUserFsBackend<F>
where
    F: Servable + 'static,
{
    /// Offer live migration (VHOST_USER_PROTOCOL_F_DEVICE_STATE): `state` saves and loads the
    /// guest's session. Call before the first frontend connects.
    pub fn enable_migration(&self, state: Arc<dyn DeviceState>) {
        if self.inner.device_state.set(state).is_err() {
            warn!("migration was already enabled on this backend");
        }
    }

    /// SET_DEVICE_STATE_FD: move the state through `file` on a thread of its own (the
    /// vhost-user request must not wait for the transfer); CHECK_DEVICE_STATE joins it.
    pub(super) fn start_transfer(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<()> {
        let Some(state) = self.inner.device_state.get().cloned() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "migration is not enabled",
            ));
        };
        if phase != VhostTransferStatePhase::STOPPED {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "device state can only be moved while the device is stopped",
            ));
        }
        let mut slot = self
            .inner
            .transfer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A transfer nobody checked: its result no longer matters.
        if let Some(old) = slot.take() {
            let _ = old.join();
        }
        let in_flight = self.inner.in_flight.clone();
        let job = std::thread::Builder::new().name("device-state".to_owned());
        let handle = match direction {
            VhostTransferStateDirection::SAVE => {
                job.spawn(move || save_device_state(&*state, &in_flight, file))?
            }
            VhostTransferStateDirection::LOAD => {
                job.spawn(move || load_device_state(&*state, file))?
            }
        };
        *slot = Some(handle);
        Ok(())
    }

    /// CHECK_DEVICE_STATE: the result of the last transfer.
    pub(super) fn finish_transfer(&self) -> io::Result<()> {
        let job = self
            .inner
            .transfer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(job) = job else {
            return Err(io::Error::other("no device state transfer was started"));
        };
        let result = job
            .join()
            .map_err(|_| io::Error::other("the device state transfer thread panicked"))?;
        result.map_err(|e| {
            error!(error = %crate::report(&e), "migration: device state transfer failed; the frontend fails the migration");
            io::Error::other(e)
        })
    }
}
