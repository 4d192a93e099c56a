//! The guest's part of a virtio-fs device: connects to a daemon's vhost-user socket as the
//! frontend, shares memfd-backed guest memory, lays out the hiprio queue and K request queues,
//! negotiates FUSE_INIT and serves `Backend` calls as FUSE requests on those queues.
//!
//! Notifications: VIRTIO_RING_F_EVENT_IDX is negotiated when the daemon offers it (as a Linux
//! guest does) unless `SessionOpts::event_idx` is off. Waits halt-poll for at most
//! `SessionOpts::halt_poll`, in a window that adapts per queue as KVM's does per vCPU.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::VhostUserHeaderFlag;
use vhost::vhost_user::{
    Frontend, VhostUserFrontend, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::{Address, Bytes, FileOffset, GuestAddress, GuestMemory, GuestMemoryMmap};

use crate::backend::{Backend, Batch, Ctx, Op, OpError, Reply};
use crate::fuse::{self, InitInfo};
use crate::virtq::{
    align, ring_bytes, Completion, Counters, Notify, QueueError, RingLayout, Slot, VirtQueue,
};

const VIRTIO_F_VERSION_1: u64 = 1 << 32;
const EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;

/// Errors while bringing the device up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(
        "Connecting to the vhost-user socket {0} failed (is the daemon running and listening?)"
    )]
    Connect(String, #[source] vhost::Error),
    #[error("vhost-user {0} failed")]
    Vhost(&'static str, #[source] vhost::Error),
    #[error("The daemon lacks virtio feature {0} (features offered: {1:#x})")]
    MissingFeature(&'static str, u64),
    #[error("The daemon serves {have} queues; --queues {want} needs {}: lower --queues", want + 1)]
    TooFewQueues { have: u64, want: usize },
    #[error("Creating {0} bytes of memfd guest memory failed")]
    Memory(u64, #[source] std::io::Error),
    #[error("Mapping guest memory failed")]
    Map(#[source] vm_memory::mmap::FromRangesError),
    #[error("Guest memory is not file-backed")]
    Region(#[source] vhost::Error),
    #[error("Setting up queue {0} failed")]
    Queue(usize, #[source] std::io::Error),
    #[error("FUSE_INIT failed")]
    Init(#[source] OpError),
    #[error("The daemon speaks FUSE {0}.{1}; this frontend needs major version 7")]
    Protocol(u32, u32),
}

/// Frontend options.
#[derive(Debug, Clone)]
pub struct SessionOpts {
    pub request_queues: usize,
    pub queue_size: u16,
    /// Requests in flight per request queue (≤ queue_size / 2).
    pub slots_per_queue: usize,
    /// Largest READ/WRITE payload to plan buffers for.
    pub max_io: u32,
    pub timeout: Duration,
    /// Negotiate VIRTIO_RING_F_EVENT_IDX when the daemon offers it.
    pub event_idx: bool,
    /// The most a wait spins on the used ring before sleeping on the call eventfd (zero:
    /// never); each queue's window adapts below it.
    pub halt_poll: Duration,
    /// Reconnect when the daemon hangs up, as cloud-hypervisor does with a restarted
    /// back-end: retry the socket for at most this long, set the device up again (no
    /// FUSE_INIT: the guest's session goes on) and keep waiting for the request in flight.
    /// None: a hang-up is a transport failure.
    pub reconnect: Option<Duration>,
}

/// Whether the session uses VIRTIO_RING_F_EVENT_IDX, and why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventIdx {
    Negotiated,
    NotOffered,
    Disabled,
}

struct ReqQueue {
    vq: VirtQueue,
    unique: u64,
    meta: Vec<(u64, u32, &'static str)>,
    data_filled: Vec<u32>,
    data_off: u64,
}

impl std::fmt::Debug for ReqQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReqQueue")
            .field("index", &self.vq.index)
            .finish()
    }
}

fn transport(e: QueueError) -> OpError {
    OpError::Transport(Box::new(e))
}

impl ReqQueue {
    fn next_unique(&mut self) -> u64 {
        self.unique += 1;
        ((self.vq.index as u64) << 48) | self.unique
    }

    fn submit(&mut self, slot: usize, ctx: Ctx, op: &Op) -> Result<(), OpError> {
        let unique = self.next_unique();
        let enc = fuse::encode(op, unique, ctx);
        let s = self.vq.slot(slot).ok_or_else(|| {
            transport(QueueError::BadUsedId {
                queue: self.vq.index,
                id: 0,
            })
        })?;
        self.write_bytes(s.in_addr, &enc.bytes)?;
        let hdr_len = u32::try_from(enc.bytes.len()).unwrap_or(u32::MAX);
        if enc.data_len > 0 {
            // WRITE data sits right after the fixed WRITE header; fill it once per slot.
            let filled = self.data_filled.get(slot).copied().unwrap_or(0);
            if filled < enc.data_len {
                let pat: Vec<u8> = (0..enc.data_len).map(|i| (i % 251) as u8).collect();
                self.write_bytes(s.in_addr.unchecked_add(self.data_off), &pat)?;
                if let Some(f) = self.data_filled.get_mut(slot) {
                    *f = enc.data_len;
                }
            }
            if u64::from(hdr_len) != self.data_off {
                return Err(OpError::Malformed {
                    op: enc.name,
                    why: "internal: WRITE header size".into(),
                });
            }
        }
        if let Some(m) = self.meta.get_mut(slot) {
            *m = (unique, enc.opcode, enc.name);
        }
        self.vq
            .push(slot, hdr_len.saturating_add(enc.data_len), enc.reply_len)
            .map_err(transport)
    }

    fn write_bytes(&self, at: GuestAddress, b: &[u8]) -> Result<(), OpError> {
        self.vq
            .mem()
            .write_slice(b, at)
            .map_err(|e| transport(QueueError::Memory(at.0, e)))
    }

    fn complete(&self, c: &Completion) -> Result<Reply, OpError> {
        let (unique, opcode, name) = self.meta.get(c.slot).copied().unwrap_or((0, 0, "?"));
        let s = self.vq.slot(c.slot).ok_or_else(|| {
            transport(QueueError::BadUsedId {
                queue: self.vq.index,
                id: 0,
            })
        })?;
        if c.written > s.out_cap {
            return Err(OpError::Malformed {
                op: name,
                why: format!(
                    "device claims {} bytes written into a {}-byte buffer",
                    c.written, s.out_cap
                ),
            });
        }
        // READ data is not copied out: only its length matters here.
        let want = if opcode == fuse::FUSE_READ {
            fuse::OUT_HDR as u32
        } else {
            c.written
        };
        let mut buf = vec![0u8; want as usize];
        self.vq
            .mem()
            .read_slice(&mut buf, s.out_addr)
            .map_err(|e| transport(QueueError::Memory(s.out_addr.0, e)))?;
        if opcode == fuse::FUSE_READ {
            let n = fuse::check_header(name, unique, c.written, &buf)?;
            return Ok(Reply::Data(u32::try_from(n).unwrap_or(u32::MAX)));
        }
        let payload = fuse::check_reply(name, unique, c.written, &buf)?;
        fuse::decode(opcode, name, payload)
    }
}

/// One connected vhost-user-fs device.
pub struct FuseSession {
    frontend: Frontend,
    socket: std::path::PathBuf,
    features: u64,
    protocol: VhostUserProtocolFeatures,
    queue_size: u16,
    reconnect: Option<Duration>,
    /// Times the daemon hung up and a new one took the session (see `SessionOpts::reconnect`).
    pub reconnects: usize,
    hiprio: VirtQueue,
    hi_unique: u64,
    queues: Vec<ReqQueue>,
    pub init: InitInfo,
    max_io: u32,
    event_idx: EventIdx,
    halt_poll: Duration,
    _mem: Arc<GuestMemoryMmap>,
}

impl std::fmt::Debug for FuseSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FuseSession")
            .field("queues", &self.queues.len())
            .field("init", &self.init)
            .finish()
    }
}

fn memfd(size: u64) -> Result<File, SetupError> {
    // SAFETY: the name is a valid NUL-terminated C string literal; flags are valid constants.
    let fd = unsafe { libc::memfd_create(c"ceph-virtiofsd-bench".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(SetupError::Memory(size, std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by memfd_create, is open, and nothing else owns it.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(size)
        .map_err(|e| SetupError::Memory(size, e))?;
    Ok(file)
}

impl FuseSession {
    pub fn connect(socket: &Path, o: &SessionOpts) -> Result<Self, SetupError> {
        let nq = o.request_queues + 1;
        let v = |what: &'static str| move |e| SetupError::Vhost(what, e);
        let mut fe = Frontend::connect(socket, nq as u64)
            .map_err(|e| SetupError::Connect(socket.display().to_string(), e))?;
        fe.set_owner().map_err(v("SET_OWNER"))?;
        let feats = fe.get_features().map_err(v("GET_FEATURES"))?;
        let pf = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if feats & VIRTIO_F_VERSION_1 == 0 {
            return Err(SetupError::MissingFeature("VERSION_1", feats));
        }
        if feats & pf == 0 {
            return Err(SetupError::MissingFeature("PROTOCOL_FEATURES", feats));
        }
        let event_idx = match (o.event_idx, feats & EVENT_IDX != 0) {
            (false, _) => EventIdx::Disabled,
            (true, false) => EventIdx::NotOffered,
            (true, true) => EventIdx::Negotiated,
        };
        let ring_feats = if event_idx == EventIdx::Negotiated {
            EVENT_IDX
        } else {
            0
        };
        let features = VIRTIO_F_VERSION_1 | pf | ring_feats;
        fe.set_features(features).map_err(v("SET_FEATURES"))?;
        let notify = Notify {
            event_idx: event_idx == EventIdx::Negotiated,
            halt_poll: o.halt_poll,
        };
        let offered = fe
            .get_protocol_features()
            .map_err(v("GET_PROTOCOL_FEATURES"))?;
        let want = offered & (VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK);
        fe.set_protocol_features(want)
            .map_err(v("SET_PROTOCOL_FEATURES"))?;
        if want.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        if want.contains(VhostUserProtocolFeatures::MQ) {
            let have = fe.get_queue_num().map_err(v("GET_QUEUE_NUM"))?;
            if have < nq as u64 {
                return Err(SetupError::TooFewQueues {
                    have,
                    want: o.request_queues,
                });
            }
        } else if o.request_queues > 1 {
            return Err(SetupError::TooFewQueues {
                have: 2,
                want: o.request_queues,
            });
        }

        // Guest memory: rings first, then per-slot buffers.
        let slots = o.slots_per_queue.min(usize::from(o.queue_size / 2)).max(1);
        let rb = align(ring_bytes(o.queue_size), 4096);
        let in_cap = u64::from(o.max_io) + 4096;
        let out_cap = u64::from(o.max_io).max(65536) + 4096;
        let hi_slots = 4usize;
        let hi_in = 65536u64;
        let data_base = align(rb * nq as u64, 1 << 21);
        let per_q = slots as u64 * (in_cap + out_cap);
        let size = data_base + hi_slots as u64 * hi_in + per_q * o.request_queues as u64;
        let size = align(size, 1 << 21);
        let file = memfd(size)?;
        let len = usize::try_from(size)
            .map_err(|_| SetupError::Memory(size, std::io::ErrorKind::OutOfMemory.into()))?;
        let mem = GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(0),
            len,
            Some(FileOffset::new(file, 0)),
        )])
        .map_err(SetupError::Map)?;
        let regions = mem
            .iter()
            .map(VhostUserMemoryRegionInfo::from_guest_region)
            .collect::<Result<Vec<_>, _>>()
            .map_err(SetupError::Region)?;
        fe.set_mem_table(&regions).map_err(v("SET_MEM_TABLE"))?;
        let mem = Arc::new(mem);

        let mut next = data_base;
        let mut mk_slots = |n: usize, ic: u64, oc: u64| -> Vec<Slot> {
            (0..n)
                .map(|_| {
                    let s = Slot {
                        in_addr: GuestAddress(next),
                        in_cap: u32::try_from(ic).unwrap_or(u32::MAX),
                        out_addr: GuestAddress(next + ic),
                        out_cap: u32::try_from(oc).unwrap_or(u32::MAX),
                    };
                    next += ic + oc;
                    s
                })
                .collect()
        };
        let hi_slot_list = mk_slots(hi_slots, hi_in - 4096, 4096);
        let q_slots: Vec<Vec<Slot>> = (0..o.request_queues)
            .map(|_| mk_slots(slots, in_cap, out_cap))
            .collect();

        let mut vqs = Vec::new();
        for (i, sl) in std::iter::once(hi_slot_list).chain(q_slots).enumerate() {
            let rings = RingLayout::at(GuestAddress(rb * i as u64), o.queue_size);
            let vq = VirtQueue::new(i, mem.clone(), o.queue_size, rings, sl, notify, o.timeout)
                .map_err(|e| SetupError::Queue(i, e))?;
            vq.reset_rings()
                .map_err(|e| SetupError::Queue(i, std::io::Error::other(e)))?;
            setup_vring(&mut fe, &mem, i, &vq, rings, o.queue_size, 0)?;
            vqs.push(vq);
        }
        let mut it = vqs.into_iter();
        let hiprio = it.next().ok_or(SetupError::TooFewQueues {
            have: 0,
            want: o.request_queues,
        })?;
        let data_off =
            (fuse::IN_HDR + std::mem::size_of::<fuse_backend_rs::abi::fuse_abi::WriteIn>()) as u64;
        let queues = it
            .map(|vq| {
                let n = vq.slot_count();
                ReqQueue {
                    vq,
                    unique: 0,
                    meta: vec![(0, 0, "?"); n],
                    data_filled: vec![0; n],
                    data_off,
                }
            })
            .collect();
        let mut s = FuseSession {
            frontend: fe,
            socket: socket.to_owned(),
            features,
            protocol: want,
            queue_size: o.queue_size,
            reconnect: o.reconnect,
            reconnects: 0,
            hiprio,
            hi_unique: 0,
            queues,
            init: InitInfo::default(),
            max_io: o.max_io,
            event_idx,
            halt_poll: o.halt_poll,
            _mem: mem,
        };
        s.init = s.fuse_init().map_err(SetupError::Init)?;
        if s.init.major != 7 {
            return Err(SetupError::Protocol(s.init.major, s.init.minor));
        }
        let mut max_io = s.init.max_write.min(o.max_io);
        if s.init.flags & (1 << 22) != 0 && s.init.max_pages > 0 {
            max_io = max_io.min(u32::from(s.init.max_pages) * 4096);
        }
        s.max_io = max_io;
        s.watch_hangups();
        Ok(s)
    }

    /// With `reconnect`, every queue's wait also watches the socket for the daemon's hang-up.
    fn watch_hangups(&mut self) {
        let fd = self.reconnect.map(|_| self.frontend.as_raw_fd());
        self.hiprio.watch_hangup(fd);
        for q in &mut self.queues {
            q.vq.watch_hangup(fd);
        }
    }

    /// The daemon hung up: connect to its successor on the same socket and set the device up
    /// again as it was, each queue resuming at the used index the old daemon published, then
    /// kick every queue once. The guest's FUSE session (node ids, handles) is the successor's
    /// to keep: no FUSE_INIT.
    fn reconnect(&mut self) -> Result<(), SetupError> {
        let wait = self.reconnect.unwrap_or_default();
        let deadline = Instant::now() + wait;
        let nq = self.queues.len() + 1;
        let mut fe = loop {
            match Frontend::connect(&self.socket, nq as u64) {
                Ok(fe) => break fe,
                Err(e) if Instant::now() >= deadline => {
                    return Err(SetupError::Connect(self.socket.display().to_string(), e))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let v = |what: &'static str| move |e| SetupError::Vhost(what, e);
        fe.set_owner().map_err(v("SET_OWNER"))?;
        let offered = fe.get_features().map_err(v("GET_FEATURES"))?;
        if offered & self.features != self.features {
            return Err(SetupError::MissingFeature(
                "the features of the first daemon",
                offered,
            ));
        }
        fe.set_features(self.features).map_err(v("SET_FEATURES"))?;
        let protocol = fe
            .get_protocol_features()
            .map_err(v("GET_PROTOCOL_FEATURES"))?;
        fe.set_protocol_features(protocol & self.protocol)
            .map_err(v("SET_PROTOCOL_FEATURES"))?;
        if self.protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        let mem = self._mem.clone();
        let regions = mem
            .iter()
            .map(VhostUserMemoryRegionInfo::from_guest_region)
            .collect::<Result<Vec<_>, _>>()
            .map_err(SetupError::Region)?;
        fe.set_mem_table(&regions).map_err(v("SET_MEM_TABLE"))?;
        let size = self.queue_size;
        let vqs =
            std::iter::once(&mut self.hiprio).chain(self.queues.iter_mut().map(|q| &mut q.vq));
        for (i, vq) in vqs.enumerate() {
            let base = vq
                .device_used_idx()
                .map_err(|e| SetupError::Queue(i, std::io::Error::other(e)))?;
            setup_vring(&mut fe, &mem, i, vq, vq.layout(), size, base)?;
            vq.kick_now()
                .map_err(|e| SetupError::Queue(i, std::io::Error::other(e)))?;
        }
        self.frontend = fe;
        self.reconnects += 1;
        self.watch_hangups();
        Ok(())
    }

    /// The first request queue (the one a Linux 6.1 guest uses).
    fn first_queue(&mut self) -> Result<&mut ReqQueue, OpError> {
        self.queues.first_mut().ok_or_else(|| {
            transport(QueueError::Timeout {
                queue: 1,
                secs: 0,
                inflight: 0,
            })
        })
    }

    fn fuse_init(&mut self) -> Result<InitInfo, OpError> {
        let q = self.first_queue()?;
        let unique = q.next_unique();
        let bytes = fuse::encode_init(unique, fuse::guest_init_flags(), 128 * 1024);
        let s =
            q.vq.slot(0)
                .ok_or_else(|| transport(QueueError::BadUsedId { queue: 1, id: 0 }))?;
        q.write_bytes(s.in_addr, &bytes)?;
        q.vq.push(
            0,
            u32::try_from(bytes.len()).unwrap_or(u32::MAX),
            fuse::INIT_REPLY_LEN,
        )
        .map_err(transport)?;
        q.vq.flush().map_err(transport)?;
        let mut done = Vec::new();
        q.vq.wait(&mut done).map_err(transport)?;
        let c = done.first().ok_or_else(|| {
            transport(QueueError::Timeout {
                queue: 1,
                secs: 0,
                inflight: 1,
            })
        })?;
        let mut buf = vec![0u8; c.written.min(s.out_cap) as usize];
        q.vq.mem()
            .read_slice(&mut buf, s.out_addr)
            .map_err(|e| transport(QueueError::Memory(s.out_addr.0, e)))?;
        let payload = fuse::check_reply("INIT", unique, c.written, &buf)?;
        fuse::decode_init(payload)
    }

    pub fn request_queues(&self) -> usize {
        self.queues.len()
    }

    /// One line on how this session notifies and waits, for the run's notes.
    pub fn notify_note(&self) -> String {
        let ev = match self.event_idx {
            EventIdx::Negotiated => "EVENT_IDX negotiated",
            EventIdx::NotOffered => "EVENT_IDX not offered by the daemon",
            EventIdx::Disabled => "EVENT_IDX off (--no-event-idx)",
        };
        let hp = if self.halt_poll.is_zero() {
            "halt-poll off".to_string()
        } else {
            format!(
                "adaptive halt-poll, at most {} us per idle wait (as KVM's halt_poll_ns)",
                self.halt_poll.as_micros()
            )
        };
        format!("virtqueue: {ev}, {hp}")
    }

    /// Notification and wait counters of all queues so far.
    pub fn counters(&self) -> Counters {
        let mut c = self.hiprio.counters();
        for q in &self.queues {
            c += q.vq.counters();
        }
        c
    }

    /// Ends the session: the daemon sees the socket close (vhost-user daemons then exit).
    pub fn close(self) {
        drop(self.frontend);
    }
}

/// Hand queue `i` to the daemon: its size, where its rings are, the index it starts at, its
/// eventfds.
fn setup_vring(
    fe: &mut Frontend,
    mem: &GuestMemoryMmap,
    i: usize,
    vq: &VirtQueue,
    rings: RingLayout,
    size: u16,
    base: u16,
) -> Result<(), SetupError> {
    let v = |what: &'static str| move |e| SetupError::Vhost(what, e);
    let hva = |a: GuestAddress| -> Result<u64, SetupError> {
        mem.get_host_address(a)
            .map(|p| p as u64)
            .map_err(|e| SetupError::Queue(i, std::io::Error::other(e)))
    };
    let cfg = VringConfigData {
        queue_max_size: size,
        queue_size: size,
        flags: 0,
        desc_table_addr: hva(rings.desc)?,
        used_ring_addr: hva(rings.used)?,
        avail_ring_addr: hva(rings.avail)?,
        log_addr: None,
    };
    fe.set_vring_num(i, size).map_err(v("SET_VRING_NUM"))?;
    fe.set_vring_base(i, base).map_err(v("SET_VRING_BASE"))?;
    fe.set_vring_addr(i, &cfg).map_err(v("SET_VRING_ADDR"))?;
    fe.set_vring_call(i, &vq.call)
        .map_err(v("SET_VRING_CALL"))?;
    fe.set_vring_kick(i, &vq.kick)
        .map_err(v("SET_VRING_KICK"))?;
    fe.set_vring_enable(i, true).map_err(v("SET_VRING_ENABLE"))
}

fn run_stream(
    q: &mut ReqQueue,
    ctx: Ctx,
    depth: usize,
    count: usize,
    next: &AtomicUsize,
    make: &(dyn Fn(usize) -> Op + Sync),
) -> Result<Batch, OpError> {
    let mut b = Batch::default();
    let depth = depth.min(q.vq.slot_count()).max(1);
    let mut inflight = 0usize;
    let take = || {
        let i = next.fetch_add(1, Ordering::Relaxed);
        (i < count).then_some(i)
    };
    for slot in 0..depth {
        let Some(i) = take() else { break };
        q.submit(slot, ctx, &make(i))?;
        inflight += 1;
    }
    q.vq.flush().map_err(transport)?;
    let mut done = Vec::new();
    while inflight > 0 {
        done.clear();
        q.vq.wait(&mut done).map_err(transport)?;
        for c in &done {
            inflight -= 1;
            match q.complete(c) {
                Ok(r) => {
                    b.latencies.push(c.latency);
                    if let Reply::Written(n) | Reply::Data(n) = r {
                        b.bytes += u64::from(n);
                    }
                }
                Err(e @ OpError::Transport(_)) => return Err(e),
                Err(e) => b.errors.push(e),
            }
            if let Some(i) = take() {
                q.submit(c.slot, ctx, &make(i))?;
                inflight += 1;
            }
        }
        q.vq.flush().map_err(transport)?;
    }
    Ok(b)
}

impl Backend for FuseSession {
    fn call(&mut self, ctx: Ctx, op: Op) -> Result<Reply, OpError> {
        let q = self.first_queue()?;
        q.submit(0, ctx, &op)?;
        q.vq.flush().map_err(transport)?;
        let mut done = Vec::new();
        loop {
            let q = self.first_queue()?;
            match q.vq.wait(&mut done) {
                Ok(()) => break,
                Err(QueueError::HungUp(_)) if self.reconnect.is_some() => {
                    self.reconnect()
                        .map_err(|e| OpError::Transport(Box::new(e)))?;
                }
                Err(e) => return Err(transport(e)),
            }
        }
        let q = self.first_queue()?;
        let c = done.first().ok_or_else(|| {
            transport(QueueError::Timeout {
                queue: 1,
                secs: 0,
                inflight: 1,
            })
        })?;
        q.complete(c)
    }

    fn pipeline(
        &mut self,
        ctx: Ctx,
        depth: usize,
        count: usize,
        make: &(dyn Fn(usize) -> Op + Sync),
    ) -> Result<Batch, OpError> {
        let nq = self.queues.len().min(depth).max(1);
        let next = AtomicUsize::new(0);
        let start = Instant::now();
        let results: Vec<Result<Batch, OpError>> = std::thread::scope(|sc| {
            let handles: Vec<_> = self
                .queues
                .iter_mut()
                .take(nq)
                .enumerate()
                .map(|(i, q)| {
                    let d = depth / nq + usize::from(i < depth % nq);
                    let next = &next;
                    sc.spawn(move || run_stream(q, ctx, d, count, next, make))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(OpError::Malformed {
                            op: "pipeline",
                            why: "worker thread panicked".into(),
                        })
                    })
                })
                .collect()
        });
        let mut all = Batch {
            wall: start.elapsed(),
            ..Batch::default()
        };
        for r in results {
            let b = r?;
            all.latencies.extend(b.latencies);
            all.bytes += b.bytes;
            all.errors.extend(b.errors);
        }
        Ok(all)
    }

    fn forget(&mut self, nodes: &[(u64, u64)]) -> Result<(), OpError> {
        let per_msg = 2000usize;
        for chunk in nodes.chunks(per_msg) {
            self.hi_unique += 1;
            let bytes = fuse::encode_batch_forget(self.hi_unique, chunk);
            let slot = match self.hiprio.free_slot() {
                Some(s) => s,
                None => {
                    let mut done = Vec::new();
                    self.hiprio.wait(&mut done).map_err(transport)?;
                    done.first().map(|c| c.slot).unwrap_or(0)
                }
            };
            let s = self
                .hiprio
                .slot(slot)
                .ok_or_else(|| transport(QueueError::BadUsedId { queue: 0, id: 0 }))?;
            self.hiprio
                .mem()
                .write_slice(&bytes, s.in_addr)
                .map_err(|e| transport(QueueError::Memory(s.in_addr.0, e)))?;
            self.hiprio
                .push(slot, u32::try_from(bytes.len()).unwrap_or(u32::MAX), 0)
                .map_err(transport)?;
            self.hiprio.flush().map_err(transport)?;
        }
        // FORGET has no reply; collect what the daemon already returned so slots get reused.
        let mut done = Vec::new();
        self.hiprio.reap(&mut done).map_err(transport)?;
        Ok(())
    }

    fn root(&self) -> u64 {
        1
    }

    fn max_io(&self) -> u32 {
        self.max_io
    }
}
