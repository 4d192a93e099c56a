//! READ and WRITE on O_DIRECT handles without a thread waiting for each (`--nonblocking-io`;
//! libcephfs 20's `ceph_ll_nonblocking_readv_writev`).
//!
//! The queue thread offers each READ and WRITE it pops to [`FuseServer::start_async`], which
//! takes those the filesystem serves asynchronously (O_DIRECT handles) and leaves every other
//! to the usual dispatch. A request taken is sent to libcephfs from the queue thread itself,
//! which goes on popping: no worker is handed the request, and none sits in a blocking call
//! for the OSDs' answer. The request keeps its in-flight guard, queue-depth guard, guest
//! memory guard and chain in [`Async::ops`] until it is answered, so a stop, a pause, a
//! migration's save and a session's end wait for it as for any other.
//!
//! Completions are answered on one thread of their own, `fuse-complete`, not on the queue
//! threads: a queue thread sleeps in epoll on its kick eventfd, while libcephfs hands
//! completions to a condition variable (`IoQueue`), so a queue thread would have to poll one
//! or the other; and what follows a completion may block (a direct write racing a buffered
//! reader of the same inode is written again through the cache, `after_direct_write`), which
//! must not hold up a ring. One thread suffices: answering is a copy of at most the request's
//! size into guest memory, `add_used` and a notification, microseconds against the OSD round
//! trip each request waited for. Nothing runs on libcephfs's own callback thread.
//!
//! Only while another request is in flight or waits in the ring: a READ or WRITE alone (a
//! guest doing one O_DIRECT request at a time) is served the blocking way, as before. At depth 1 the async path saves no
//! thread (the worker it spares would be idle anyway) and adds the completion thread's wake-up
//! to each request: 4 KiB O_DIRECT writes at depth 1 ran at 0.86-0.91x the blocking path,
//! reads at 0.99-1.06x, while at depth 4 to 64 it gains up to 1.5x (docs/benchmarks.md, "Nonblocking I/O",
//! `tests/bench/results/nonblocking/daemon.txt`).
//!
//! A completion can come before the queue thread has filed its request (libcephfs may call
//! back before `ceph_ll_nonblocking_readv_writev` returns): whichever of the two comes second
//! to [`Async::ops`] answers the request.
//!
//! Never used while a migration logs dirty pages: then requests are served with their vring
//! locked, on the queue thread (`drain_queue_locked`).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tracing::warn;

use super::chain::{self, give_back};
use super::queues::Pending;
use super::{Inner, Vring, HIPRIO_QUEUE};
use crate::metrics;
use crate::server::nonblocking::{AsyncRequest, Started};
use crate::server::FuseServer;
use crate::server::{AsyncReply, Servable};
use crate::wire::{FUSE_READ, FUSE_WRITE};

/// How long the completion thread waits for a completion before it looks whether its backend
/// is still there.
const TICK: Duration = Duration::from_millis(100);

/// The requests in flight on the async path.
#[derive(Default)]
pub(super) struct Async {
    next_tag: AtomicU64,
    ops: Mutex<HashMap<u64, Entry>>,
}

impl std::fmt::Debug for Async {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Async").finish_non_exhaustive()
    }
}

enum Entry {
    /// Sent, waiting for its completion (boxed: the map holds many, most of them waiting).
    Waiting(Box<Op>),
    /// Completed before the queue thread filed it.
    Early(io::Result<AsyncReply>),
}

/// A request in flight and everything that accounts for it until it is answered.
struct Op {
    pending: Pending,
    request: AsyncRequest,
    vring: Vring,
    queue: usize,
}

impl Async {
    fn ops(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        self.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Requests in flight (for the tests).
    #[cfg(test)]
    pub(super) fn in_flight(&self) -> usize {
        self.ops()
            .values()
            .filter(|e| matches!(e, Entry::Waiting(_)))
            .count()
    }
}

/// Offer `p` (popped from `queue`) to the async path. `Some(p)` back: not taken, serve it the
/// usual way. Never panics on guest input.
pub(super) fn try_start<F>(
    aio: &Async,
    server: &FuseServer<F>,
    p: Pending,
    vring: &Vring,
    queue: usize,
) -> Option<Pending>
where
    F: Servable,
{
    match p.request.header {
        Some(h) if queue != HIPRIO_QUEUE && (h.opcode == FUSE_READ || h.opcode == FUSE_WRITE) => {}
        _ => return Some(p),
    }
    let tag = aio.next_tag.fetch_add(1, Ordering::Relaxed);
    // The request as `chain::serve` builds it, from the private copy.
    chain::warm();
    let head = p.request.head;
    match chain::start_async(
        server,
        &p.guard,
        &p.request,
        chain::Live::Check(vring, p.generation),
        queue,
        tag,
    ) {
        None | Some(Started::NotTaken) => Some(p),
        Some(Started::Answered(written)) => {
            let used = used_len(written, queue, head);
            give_back(vring, &p.guard, head, used, queue, p.generation);
            drop(p);
            None
        }
        Some(Started::Sent(request)) => {
            let op = Box::new(Op {
                pending: p,
                request,
                vring: vring.clone(),
                queue,
            });
            let mut ops = aio.ops();
            match ops.remove(&tag) {
                Some(Entry::Early(result)) => {
                    drop(ops);
                    answer(server, op, result);
                }
                Some(Entry::Waiting(other)) => {
                    // Tags are never reused: unreachable, but never a lost request.
                    ops.insert(tag, Entry::Waiting(op));
                    drop(ops);
                    warn!(tag, "async request tag in use twice");
                    answer(server, other, Err(io::Error::from_raw_os_error(libc::EIO)));
                }
                None => {
                    ops.insert(tag, Entry::Waiting(op));
                }
            }
            None
        }
    }
}

/// The completion thread (see the module doc): answer what libcephfs finished, until the
/// backend is gone.
pub(super) fn completion_loop<F>(weak: &Weak<Inner<F>>)
where
    F: Servable + 'static,
{
    loop {
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let Some(aio) = &inner.aio else {
            return;
        };
        if let Some((tag, result)) = inner.server.async_next(TICK) {
            let mut ops = aio.ops();
            match ops.remove(&tag) {
                Some(Entry::Waiting(op)) => {
                    drop(ops);
                    answer(&inner.server, op, result);
                }
                Some(Entry::Early(_)) | None => {
                    ops.insert(tag, Entry::Early(result));
                }
            }
        }
    }
}

/// Write the answer into the request's chain, give the chain back and let its guards go.
fn answer<F>(server: &FuseServer<F>, op: Box<Op>, result: io::Result<AsyncReply>)
where
    F: Servable,
{
    let Op {
        pending,
        request,
        vring,
        queue,
    } = *op;
    let head = pending.request.head;
    // The reply goes to the buffers walked when the request was popped: the guest's
    // descriptors are not read again.
    let written = match chain::finish_async(
        server,
        &pending.guard,
        &pending.request,
        chain::Live::Check(&vring, pending.generation),
        request,
        result,
    ) {
        Ok(n) => Ok(n),
        Err(chain::ChainError::Server(e)) => Err(e),
        Err(e) => {
            warn!(queue, head, error = %e, "Cannot write the reply of an async request");
            metrics::global().record_malformed();
            Ok(0)
        }
    };
    let used = used_len(written, queue, head);
    give_back(
        &vring,
        &pending.guard,
        head,
        used,
        queue,
        pending.generation,
    );
    drop(pending);
    tracing::debug!(queue, head, used, "async request answered");
}

fn used_len(written: Result<usize, crate::server::ServerError>, queue: usize, head: u16) -> u32 {
    match written {
        Ok(n) => u32::try_from(n).unwrap_or(0),
        Err(e) => {
            warn!(queue, head, error = %super::error_chain(&e), "Cannot answer an async request; returning it unanswered");
            0
        }
    }
}
