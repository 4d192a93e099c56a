//! `--request-deadline`: a request whose libcephfs call has not returned within the bound is
//! answered ETIMEDOUT by a timer, and its late result is dropped.
//!
//! Why: a Linux 6.14+ guest with a FUSE request timeout (`fs.fuse.default_request_timeout`)
//! aborts its whole connection when one request stays unanswered past it; the mount is then
//! dead until the guest reboots (docs/semantics.md, "Request timeouts of the guest"). An MDS
//! that stalls or fails over holds the daemon's libcephfs calls for longer than that. A
//! libcephfs call cannot be cancelled, so the answer is given without it: the thread that
//! serves the request and the timer race for the chain through [`Claim`], and only the winner
//! touches the guest's buffers and the used ring.
//!
//! Only requests whose bytes were copied out of guest memory and whose reply goes to the
//! private buffer are bounded ([`eligible`]): a guest buffer given back early could otherwise
//! be rewritten under a write still in flight, or read before its data arrived. With the bound
//! on, a WRITE's data is copied too and a READ's reply goes to the private buffer first (one
//! copy each, paid only then), and guests are offered READs and WRITEs of at most [`IO_MAX`]
//! bytes, so that every one fits; nor do they take the async path (`nonblocking`), which
//! moves data in place. Not bounded: locks (SETLK, SETLKW: the guest must know whether it
//! holds one), and requests without a reply.
//!
//! The errno is Linux's own CephFS client's for an MDS request that ran out of time
//! (`ceph_mdsc_wait_request` in fs/ceph/mds_client.c: ETIMEDOUT), as its OSD requests with
//! `osd_request_timeout` (net/ceph/osd_client.c). A late success that took a reference the
//! guest never heard of (a node lookup, an open handle) is given back by the server
//! (`FuseServer::drop_late_reply`); a late mutation (a mkdir, an unlink) stays done, as with
//! those clients: the guest was told it failed, and a new lookup shows what is there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::InHeader;
use tracing::{info, warn};
use vm_memory::ByteValued;

use std::mem::size_of;

use fuse_backend_rs::abi::fuse_abi::WriteIn;

use super::chain::{copy_out, give_back, Bufs, REPLY_COPY, REQUEST_COPY};
use super::{MemGuard, Vring};
use crate::wire::{
    error_header, FUSE_BATCH_FORGET, FUSE_DESTROY, FUSE_FORGET, FUSE_INIT, FUSE_INTERRUPT,
    FUSE_NOTIFY_REPLY, FUSE_SETLK, FUSE_SETLKW, OUT_HEADER_LEN,
};

fn op_name(opcode: u32) -> &'static str {
    crate::wire::opcode_name(usize::try_from(opcode).unwrap_or(usize::MAX))
}

/// The bound, in milliseconds; 0 = off. Set once at start (`set_request_deadline`).
static BOUND_MS: AtomicU64 = AtomicU64::new(0);
static TIMER: OnceLock<Arc<Timer>> = OnceLock::new();

/// Turn the bound on (`Some`) or off for the requests served from now on. With it on, guests
/// are offered READs and WRITEs no larger than the private buffers (`IO_MAX`) at their next
/// FUSE_INIT, so that every one of them can be bounded.
pub fn set_request_deadline(bound: Option<Duration>) {
    let ms = bound.map_or(0, |b| u64::try_from(b.as_millis()).unwrap_or(u64::MAX));
    BOUND_MS.store(ms, Ordering::Release);
    crate::server::limit_io(bound.map(|_| IO_MAX));
}

/// The most data of a READ or WRITE while the bound is on: a READ's reply (out-header and
/// data) must fit the private reply buffer, a WRITE (in-header, write-in and data) the private
/// request copy. 124 KiB, whole pages.
#[allow(clippy::as_conversions, clippy::cast_possible_truncation)] // constants, checked below
const IO_MAX: u32 = {
    let reply = REPLY_COPY - OUT_HEADER_LEN;
    let request = REQUEST_COPY - size_of::<InHeader>() - size_of::<WriteIn>();
    let least = if reply < request { reply } else { request };
    assert!(least <= u32::MAX as usize);
    (least as u32 / 4096) * 4096
};

/// Whether the bound is on.
pub(super) fn on() -> bool {
    BOUND_MS.load(Ordering::Relaxed) != 0
}

fn bound() -> Option<Duration> {
    match BOUND_MS.load(Ordering::Acquire) {
        0 => None,
        ms => Some(Duration::from_millis(ms)),
    }
}

/// Whether a request may be answered by the timer: see the module documentation.
pub(super) fn eligible(
    opcode: u32,
    readable_copied: bool,
    private_reply: bool,
    room: usize,
) -> bool {
    readable_copied
        && private_reply
        && room >= OUT_HEADER_LEN
        && !matches!(
            opcode,
            FUSE_SETLK
                | FUSE_SETLKW
                | FUSE_FORGET
                | FUSE_BATCH_FORGET
                | FUSE_INTERRUPT
                | FUSE_INIT
                | FUSE_DESTROY
                | FUSE_NOTIFY_REPLY
        )
}

const OPEN: u8 = 0;
const SERVED: u8 = 1;
const TIMED_OUT: u8 = 2;

/// Who answers one request: the thread that serves it or the timer, whichever comes first.
pub(super) struct Claim {
    id: u64,
    state: AtomicU8,
    due: Instant,
    header: InHeader,
    /// What the timer needs to answer: the guest's reply buffers and the chain's ring.
    writable: Bufs,
    head: u16,
    generation: u64,
    queue: usize,
    vring: Vring,
    mem: MemGuard,
}

impl Claim {
    /// The serving thread's turn: `true` if it answers (the timer has not), and from then on
    /// the timer leaves the request alone.
    /// Asked again, the same answer.
    pub(super) fn serve(&self) -> bool {
        match self
            .state
            .compare_exchange(OPEN, SERVED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                if let Some(t) = TIMER.get() {
                    t.forget(self.id);
                }
                true
            }
            Err(state) => state == SERVED,
        }
    }

    /// Whether the timer has answered it already.
    pub(super) fn answered(&self) -> bool {
        self.state.load(Ordering::Acquire) == TIMED_OUT
    }
}

/// The request being served, registered with the timer when the bound is on and the request
/// may be answered early; `None` otherwise.
#[allow(clippy::too_many_arguments)] // one request's parts, each from another place
pub(super) fn register(
    header: InHeader,
    writable: &Bufs,
    head: u16,
    generation: u64,
    queue: usize,
    vring: &Vring,
    mem: &MemGuard,
    start: Instant,
) -> Option<Arc<Claim>> {
    let bound = bound()?;
    let timer = TIMER.get_or_init(Timer::start);
    let claim = Arc::new(Claim {
        id: timer.next.fetch_add(1, Ordering::Relaxed),
        state: AtomicU8::new(OPEN),
        due: start + bound,
        header,
        writable: writable.clone(),
        head,
        generation,
        queue,
        vring: vring.clone(),
        mem: mem.clone(),
    });
    timer.add(claim.clone());
    Some(claim)
}

/// The requests under the bound, and the thread that answers those past it.
struct Timer {
    next: AtomicU64,
    pending: Mutex<HashMap<u64, Arc<Claim>>>,
    wake: Condvar,
}

/// How often the timer looks at the requests in flight: the bound is kept within this.
const TICK: Duration = Duration::from_millis(100);

impl Timer {
    fn start() -> Arc<Timer> {
        let t = Arc::new(Timer {
            next: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            wake: Condvar::new(),
        });
        let weak = Arc::downgrade(&t);
        if let Err(e) = std::thread::Builder::new()
            .name("request-deadline".into())
            .spawn(move || {
                while let Some(t) = weak.upgrade() {
                    t.look();
                }
            })
        {
            // Nothing answers early then: requests wait as without the bound.
            warn!(error = %e, "Cannot start the --request-deadline timer; requests are not bounded");
        }
        t
    }

    fn add(&self, claim: Arc<Claim>) {
        let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let was_empty = p.is_empty();
        p.insert(claim.id, claim);
        drop(p);
        if was_empty {
            self.wake.notify_one();
        }
    }

    fn forget(&self, id: u64) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// One look: sleep while nothing is in flight, else a tick; then answer what is due.
    fn look(&self) {
        let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if p.is_empty() {
            p = self
                .wake
                .wait_timeout(p, Duration::from_secs(1))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(p);
        std::thread::sleep(TICK);
        let now = Instant::now();
        let due: Vec<Arc<Claim>> = {
            let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            let ids: Vec<u64> = p.values().filter(|c| c.due <= now).map(|c| c.id).collect();
            ids.iter().filter_map(|id| p.remove(id)).collect()
        };
        for c in due {
            if c.state
                .compare_exchange(OPEN, TIMED_OUT, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                answer(&c, now);
            }
        }
    }
}

/// Answer `c` ETIMEDOUT: the reply header into the guest's buffers, the chain to the used ring.
fn answer(c: &Claim, now: Instant) {
    let h = &c.header;
    let age = now.saturating_duration_since(c.due) + bound().unwrap_or_default();
    let out = error_header(h.unique, libc::ETIMEDOUT);
    let Some(permit) = c.vring.permit(c.generation) else {
        // The ring stopped: its requests are answered no more, by anyone.
        info!(
            op = op_name(h.opcode),
            unique = h.unique,
            "Request past --request-deadline, but its ring stopped: not answered"
        );
        return;
    };
    let written = copy_out(&c.mem, &c.writable, out.as_slice());
    drop(permit);
    let used = match written {
        Ok(()) => u32::try_from(OUT_HEADER_LEN).unwrap_or(0),
        Err(e) => {
            warn!(op = op_name(h.opcode), unique = h.unique, error = %e, "Cannot write the ETIMEDOUT reply of a request past --request-deadline; returning it empty");
            0
        }
    };
    // Logged before the chain goes back: whoever sees the answer finds the line.
    warn!(
        op = op_name(h.opcode),
        unique = h.unique,
        node = h.nodeid,
        queue = c.queue,
        age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX),
        "Request unanswered at --request-deadline: answered ETIMEDOUT (as Linux's CephFS client answers an MDS request that ran out of time); its libcephfs call goes on, and what it gives is dropped"
    );
    give_back(&c.vring, &c.mem, c.head, used, c.queue, c.generation);
}
