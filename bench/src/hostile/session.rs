//! One request at a time over a [`Device`]: publish a chain on a free slot, wait for that
//! chain to come back, read the reply. Chains the daemon does not return in time stay
//! "lost" (their slot is not reused until they come back); their replies, when they do come
//! back, are kept for [`Session::settle`].

use std::time::Duration;

use super::device::{Buf, DescSpec, Device, DeviceError, Published};
use super::wire::{self, Header};

/// What became of one chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Returned on the used ring with `written` bytes claimed, and those bytes.
    Done { written: u32, reply: Vec<u8> },
    /// Not returned within the timeout.
    Lost,
    /// The used ring held an id we never published (or one returned twice).
    Bogus(u32),
}

pub struct Session {
    pub dev: Device,
    pub timeout: Duration,
    /// Per queue: the chain published on each slot and not yet returned.
    busy: Vec<Vec<Option<Published>>>,
    /// Slots another user of the device (the fuzzer) has chains in flight on.
    reserved: Vec<Vec<bool>>,
    next: Vec<usize>,
    unique: u64,
    /// Per queue: replies of chains that came back after their wait had given up on them.
    late: Vec<Vec<Vec<u8>>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").finish_non_exhaustive()
    }
}

pub const REQUEST_QUEUE: usize = 1;
pub const HIPRIO_QUEUE: usize = 0;
/// Writable bytes offered to a well-formed request.
pub const REPLY_LEN: u32 = 128 * 1024 + 4096;

impl Session {
    pub fn new(dev: Device, timeout: Duration) -> Self {
        let busy = (0..dev.queues.len())
            .map(|q| vec![None; dev.slots(q)])
            .collect();
        let next = vec![0; dev.queues.len()];
        let late = vec![Vec::new(); dev.queues.len()];
        let reserved = (0..dev.queues.len())
            .map(|q| vec![false; dev.slots(q)])
            .collect();
        Session {
            dev,
            timeout,
            busy,
            reserved,
            next,
            unique: 0,
            late,
        }
    }

    pub fn next_unique(&mut self) -> u64 {
        self.unique += 1;
        self.unique
    }

    /// FUSE_INIT as a Linux 6.1 guest sends it; the reply's error (0 on success).
    pub fn init(&mut self) -> Result<i32, DeviceError> {
        let unique = self.next_unique();
        let bytes = crate::fuse::encode_init(unique, crate::fuse::guest_init_flags(), 128 * 1024);
        match self.send(REQUEST_QUEUE, &bytes, REPLY_LEN)? {
            Answer::Done { reply, .. } => Ok(wire::out_header(&reply).map_or(-libc::EIO, |h| h.1)),
            _ => Ok(-libc::ETIMEDOUT),
        }
    }

    /// A well-formed chain: `req` readable, `reply_len` writable (none when 0).
    pub fn send(
        &mut self,
        queue: usize,
        req: &[u8],
        reply_len: u32,
    ) -> Result<Answer, DeviceError> {
        let mut descs = vec![DescSpec::new(Buf::Read(req.to_vec()))];
        if reply_len > 0 {
            descs.push(DescSpec::new(Buf::Write(reply_len)));
        }
        self.chain(queue, &descs)
    }

    /// A request built from header fields and body pieces, on the request queue.
    pub fn fuse(&mut self, mut h: Header, body: &[&[u8]]) -> Result<Answer, DeviceError> {
        if h.unique == 0 {
            h.unique = self.next_unique();
        }
        self.send(REQUEST_QUEUE, &wire::request(&h, body), REPLY_LEN)
    }

    /// Mark `slot` of `queue` as used by someone else (or free again): `chain` leaves it be.
    pub fn reserve(&mut self, queue: usize, slot: usize, reserved: bool) {
        if let Some(r) = self.reserved.get_mut(queue).and_then(|q| q.get_mut(slot)) {
            *r = reserved;
        }
    }

    fn free_slot(&mut self, queue: usize) -> Option<usize> {
        let n = self.busy[queue].len();
        (0..n)
            .map(|k| (self.next[queue] + k) % n)
            .find(|&s| self.busy[queue][s].is_none() && !self.reserved[queue][s])
    }

    /// Any chain: publish, wait for it, read what was written into its writable buffers.
    pub fn chain(&mut self, queue: usize, descs: &[DescSpec]) -> Result<Answer, DeviceError> {
        let Some(slot) = self.free_slot(queue) else {
            return Ok(Answer::Lost);
        };
        self.next[queue] = slot + 1;
        // Clear what a previous request left, so it is not taken for this one's reply.
        let p0 = Published {
            head: 0,
            writable: vec![(self.dev.slot_areas(queue, slot).1, 64)],
        };
        self.dev.poison(&p0)?;
        let p = self.dev.publish(queue, slot, descs)?;
        let head = u32::from(p.head);
        self.busy[queue][slot] = Some(p);
        self.dev.flush(queue)?;
        let deadline = std::time::Instant::now() + self.timeout;
        let mut done = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(Answer::Lost);
            }
            done.clear();
            self.dev.wait(queue, left, &mut done)?;
            let mut mine = None;
            for &(id, written) in &done {
                let Some(published) = self.take_returned(queue, id) else {
                    return Ok(Answer::Bogus(id));
                };
                if id == head {
                    mine = Some((published, written));
                } else {
                    self.keep_late(queue, &published, written);
                }
            }
            if let Some((p, written)) = mine {
                let reply = self.dev.reply(&p, written)?;
                return Ok(Answer::Done { written, reply });
            }
        }
    }

    /// Wait up to `timeout` for every chain of `queue` still out (lost) to come back. Returns
    /// how many are still out, and the replies of those that came back late since the last
    /// call (in the order they came back).
    pub fn settle(
        &mut self,
        queue: usize,
        timeout: Duration,
    ) -> Result<(usize, Vec<Vec<u8>>), DeviceError> {
        let deadline = std::time::Instant::now() + timeout;
        let mut done = Vec::new();
        let out = |s: &Self| s.busy[queue].iter().filter(|b| b.is_some()).count();
        while out(self) > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            done.clear();
            self.dev.wait(queue, left, &mut done)?;
            for &(id, written) in &done {
                // An id we never published is no chain of ours to wait for.
                if let Some(p) = self.take_returned(queue, id) {
                    self.keep_late(queue, &p, written);
                }
            }
        }
        Ok((out(self), std::mem::take(&mut self.late[queue])))
    }

    /// The chain published on the slot whose head the device gave back as `id`, no longer
    /// out; `None` for an id we never published (or one given back twice).
    fn take_returned(&mut self, queue: usize, id: u32) -> Option<Published> {
        let per_slot = super::device::DESCS_PER_SLOT;
        if id % u32::from(per_slot) != 0 {
            return None;
        }
        let s = id as usize / usize::from(per_slot);
        self.busy[queue].get_mut(s).and_then(Option::take)
    }

    /// Keep the reply of a chain that came back after its wait gave up, for `settle`.
    fn keep_late(&mut self, queue: usize, p: &Published, written: u32) {
        // A hostile chain's writable buffers may lie outside guest memory.
        let reply = self.dev.reply(p, written).unwrap_or_default();
        self.late[queue].push(reply);
    }

    /// GETATTR of the root node: does the daemon still answer, and correctly?
    pub fn alive(&mut self) -> Result<bool, DeviceError> {
        let unique = self.next_unique();
        let h = Header {
            opcode: wire::FUSE_GETATTR,
            unique,
            nodeid: 1,
            ..Header::default()
        };
        let body = [0u8; 16];
        Ok(
            match self.send(REQUEST_QUEUE, &wire::request(&h, &[&body]), REPLY_LEN)? {
                Answer::Done { reply, .. } => {
                    matches!(wire::out_header(&reply), Some((_, 0, u)) if u == unique)
                }
                _ => false,
            },
        )
    }
}
