//! A vhost-user-fs device whose descriptor tables we write by hand, descriptor by descriptor:
//! well-formed 2-descriptor FUSE requests, and any chain a hostile guest driver could build
//! (wrong lengths, no writable buffer, addresses outside guest memory, loops, indirect tables).
//!
//! One memfd region of guest memory at guest address 0: the rings of the hiprio queue and of
//! one request queue, then per-slot buffers. Slot `s` of a queue owns descriptors
//! `[s * DESCS_PER_SLOT, (s + 1) * DESCS_PER_SLOT)` and one readable and one writable area.
//! EVENT_IDX is not negotiated: the device signals every completion, we kick every flush.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::VhostUserHeaderFlag;
use vhost::vhost_user::{
    Frontend, VhostUserFrontend, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemory, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::virtq::{align, ring_bytes, RingLayout};

pub const VIRTQ_DESC_F_NEXT: u16 = 1;
pub const VIRTQ_DESC_F_WRITE: u16 = 2;
pub const VIRTQ_DESC_F_INDIRECT: u16 = 4;
const VIRTIO_F_VERSION_1: u64 = 1 << 32;
const VIRTIO_RING_F_INDIRECT_DESC: u64 = 1 << 28;

/// Entries of each queue (the daemon's maximum).
pub const QUEUE_SIZE: u16 = 1024;
/// Descriptors each slot owns.
pub const DESCS_PER_SLOT: u16 = 16;
/// Request slots of the request queue (all its descriptors).
pub const SLOTS: usize = (QUEUE_SIZE / DESCS_PER_SLOT) as usize;
/// Slots of the hiprio queue.
pub const HI_SLOTS: usize = 8;
/// Readable bytes per slot: a 128 KiB WRITE plus its headers, and room for indirect tables.
pub const IN_CAP: u64 = 132 * 1024;
/// Writable bytes per slot: a 128 KiB READ reply plus its header.
pub const OUT_CAP: u64 = 132 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("Connecting to the vhost-user socket {0} failed (is the daemon running?)")]
    Connect(String, #[source] vhost::Error),
    #[error("vhost-user {0} failed")]
    Vhost(&'static str, #[source] vhost::Error),
    #[error("Creating the guest memory failed")]
    Memory(#[source] std::io::Error),
    #[error("Guest memory access at {0:#x} failed")]
    Access(u64, #[source] vm_memory::GuestMemoryError),
    #[error("A chain needs more than its slot holds: {0}")]
    TooBig(String),
    #[error("Queue {0}: kick or wait failed")]
    Event(usize, #[source] std::io::Error),
}

/// Where a descriptor points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Buf {
    /// These bytes, placed in the slot's readable area.
    Read(Vec<u8>),
    /// This many bytes of the slot's writable area (device-writable).
    Write(u32),
    /// Exactly this guest address and length (anywhere, in guest memory or not).
    Raw { addr: u64, len: u32 },
    /// An indirect table holding these descriptors, placed in the slot's readable area.
    Indirect(Vec<DescSpec>),
}

/// One descriptor of a hand-built chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescSpec {
    pub buf: Buf,
    /// Flags to write instead of the computed ones (NEXT unless last, WRITE for `Write`,
    /// INDIRECT for `Indirect`).
    pub flags: Option<u16>,
    /// `next` to write instead of the following descriptor: an index relative to the chain's
    /// first descriptor (so `Some(0)` on the last one makes a loop), or, from `QUEUE_SIZE` up,
    /// that very value (outside the table). Sets NEXT unless `flags`.
    pub next: Option<u16>,
}

impl DescSpec {
    pub fn new(buf: Buf) -> Self {
        DescSpec {
            buf,
            flags: None,
            next: None,
        }
    }
}

/// The writable pieces of a published chain, to gather the reply from.
#[derive(Debug, Clone, Default)]
pub struct Published {
    pub head: u16,
    pub writable: Vec<(GuestAddress, u32)>,
}

#[derive(Debug)]
pub struct RawQueue {
    rings: RingLayout,
    avail_idx: u16,
    last_used: u16,
    kick: EventFd,
    call: EventFd,
    slot_base: u64,
    slots: usize,
}

/// A connected device: guest memory and the two queues.
pub struct Device {
    _frontend: Frontend,
    pub mem: GuestMemoryMmap,
    pub mem_size: u64,
    pub queues: Vec<RawQueue>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("mem_size", &self.mem_size)
            .finish_non_exhaustive()
    }
}

fn memfd(size: u64) -> Result<File, DeviceError> {
    // SAFETY: the name is a valid NUL-terminated C string literal; flags are valid constants.
    let fd = unsafe { libc::memfd_create(c"ceph-virtiofsd-hostile".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(DeviceError::Memory(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by memfd_create, is open, and nothing else owns it.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(size).map_err(DeviceError::Memory)?;
    Ok(file)
}

impl Device {
    /// Connect to `socket` as a frontend with 1 request queue and set both queues up.
    pub fn connect(socket: &Path) -> Result<Device, DeviceError> {
        Device::connect_with(socket, false, None)
    }

    /// [`Device::connect`], negotiating the device-state protocol too when `device_state` (the
    /// daemon must offer it: `hostile states` sends device states), and failing a vhost-user
    /// message the daemon does not answer within `reply_timeout` (a daemon that hangs is a
    /// finding, not a fuzzer that waits for ever).
    pub fn connect_with(
        socket: &Path,
        device_state: bool,
        reply_timeout: Option<Duration>,
    ) -> Result<Device, DeviceError> {
        let v = |what: &'static str| move |e| DeviceError::Vhost(what, e);
        let stream = std::os::unix::net::UnixStream::connect(socket).map_err(|e| {
            DeviceError::Connect(
                socket.display().to_string(),
                vhost::Error::VhostUserProtocol(vhost::vhost_user::Error::SocketConnect(e)),
            )
        })?;
        stream
            .set_read_timeout(reply_timeout)
            .map_err(DeviceError::Memory)?;
        let mut fe = Frontend::from_stream(stream, 2);
        fe.set_owner().map_err(v("SET_OWNER"))?;
        let feats = fe.get_features().map_err(v("GET_FEATURES"))?;
        let pf = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        let want = VIRTIO_F_VERSION_1 | pf | (feats & VIRTIO_RING_F_INDIRECT_DESC);
        fe.set_features(feats & want).map_err(v("SET_FEATURES"))?;
        let offered = fe
            .get_protocol_features()
            .map_err(v("GET_PROTOCOL_FEATURES"))?;
        let mut want_proto = VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK;
        if device_state {
            want_proto |= VhostUserProtocolFeatures::DEVICE_STATE;
        }
        let proto = offered & want_proto;
        fe.set_protocol_features(proto)
            .map_err(v("SET_PROTOCOL_FEATURES"))?;
        if proto.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }

        let rb = align(ring_bytes(QUEUE_SIZE), 4096);
        let data_base = align(2 * rb, 1 << 20);
        let slot_bytes = IN_CAP + OUT_CAP;
        let size = align(data_base + (HI_SLOTS + SLOTS) as u64 * slot_bytes, 1 << 21);
        let file = memfd(size)?;
        let len = usize::try_from(size)
            .map_err(|_| DeviceError::Memory(std::io::ErrorKind::OutOfMemory.into()))?;
        let mem = GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(0),
            len,
            Some(FileOffset::new(file, 0)),
        )])
        .map_err(|e| DeviceError::Memory(std::io::Error::other(e)))?;
        let regions = mem
            .iter()
            .map(VhostUserMemoryRegionInfo::from_guest_region)
            .collect::<Result<Vec<_>, _>>()
            .map_err(v("memory region"))?;
        fe.set_mem_table(&regions).map_err(v("SET_MEM_TABLE"))?;

        let mut queues = Vec::new();
        for i in 0..2usize {
            let rings = RingLayout::at(GuestAddress(rb * i as u64), QUEUE_SIZE);
            let (slot_base, slots) = if i == 0 {
                (data_base, HI_SLOTS)
            } else {
                (data_base + HI_SLOTS as u64 * slot_bytes, SLOTS)
            };
            let q = RawQueue {
                rings,
                avail_idx: 0,
                last_used: 0,
                kick: EventFd::new(libc::EFD_NONBLOCK).map_err(|e| DeviceError::Event(i, e))?,
                call: EventFd::new(libc::EFD_NONBLOCK).map_err(|e| DeviceError::Event(i, e))?,
                slot_base,
                slots,
            };
            for at in [rings.avail, rings.used] {
                mem.write_slice(&[0u8; 4], at)
                    .map_err(|e| DeviceError::Access(at.0, e))?;
            }
            let hva = |a: GuestAddress| -> Result<u64, DeviceError> {
                mem.get_host_address(a)
                    .map(|p| p as u64)
                    .map_err(|e| DeviceError::Access(a.0, e))
            };
            let cfg = VringConfigData {
                queue_max_size: QUEUE_SIZE,
                queue_size: QUEUE_SIZE,
                flags: 0,
                desc_table_addr: hva(rings.desc)?,
                used_ring_addr: hva(rings.used)?,
                avail_ring_addr: hva(rings.avail)?,
                log_addr: None,
            };
            fe.set_vring_num(i, QUEUE_SIZE)
                .map_err(v("SET_VRING_NUM"))?;
            fe.set_vring_base(i, 0).map_err(v("SET_VRING_BASE"))?;
            fe.set_vring_addr(i, &cfg).map_err(v("SET_VRING_ADDR"))?;
            fe.set_vring_call(i, &q.call).map_err(v("SET_VRING_CALL"))?;
            fe.set_vring_kick(i, &q.kick).map_err(v("SET_VRING_KICK"))?;
            fe.set_vring_enable(i, true)
                .map_err(v("SET_VRING_ENABLE"))?;
            queues.push(q);
        }
        Ok(Device {
            _frontend: fe,
            mem,
            mem_size: size,
            queues,
        })
    }

    /// SET_DEVICE_STATE_FD(LOAD, STOPPED): the write end of the pipe the daemon now reads the
    /// state from, until EOF (drop it when written). See [`Device::check_state`].
    pub fn start_load(&self) -> Result<File, DeviceError> {
        use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};
        let mut fds = [0; 2];
        // SAFETY: `fds` is an array of two ints for pipe2 to fill; the flags are valid.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        if rc != 0 {
            return Err(DeviceError::Memory(std::io::Error::last_os_error()));
        }
        // SAFETY: pipe2 succeeded: both descriptors are open and owned by nobody else.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let back = self
            ._frontend
            .set_device_state_fd(
                VhostTransferStateDirection::LOAD,
                VhostTransferStatePhase::STOPPED,
                rd,
            )
            .map_err(|e| DeviceError::Vhost("SET_DEVICE_STATE_FD", e))?;
        // A back-end that offers its own descriptor instead is not what the daemon does.
        drop(back);
        Ok(File::from(wr))
    }

    /// CHECK_DEVICE_STATE: whether the daemon took the state it read.
    pub fn check_state(&self) -> Result<(), DeviceError> {
        self._frontend
            .check_device_state()
            .map_err(|e| DeviceError::Vhost("CHECK_DEVICE_STATE", e))
    }

    pub fn slots(&self, queue: usize) -> usize {
        self.queues.get(queue).map_or(0, |q| q.slots)
    }

    /// Readable and writable areas of `slot` of `queue`.
    pub fn slot_areas(&self, queue: usize, slot: usize) -> (GuestAddress, GuestAddress) {
        let q = &self.queues[queue];
        let base = q.slot_base + slot as u64 * (IN_CAP + OUT_CAP);
        (GuestAddress(base), GuestAddress(base + IN_CAP))
    }

    fn write_desc(
        &self,
        table: GuestAddress,
        idx: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) -> Result<(), DeviceError> {
        let at = GuestAddress(table.0 + 16 * u64::from(idx));
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.mem
            .write_slice(&d, at)
            .map_err(|e| DeviceError::Access(at.0, e))
    }

    fn write(&self, at: GuestAddress, b: &[u8]) -> Result<(), DeviceError> {
        self.mem
            .write_slice(b, at)
            .map_err(|e| DeviceError::Access(at.0, e))
    }

    /// Write `descs` as one chain in the descriptors of `slot` (a chain longer than a slot
    /// runs on into the following slots' descriptors: only while nothing else is in flight)
    /// and put its head on the available ring. The daemon sees it at the next `flush`.
    pub fn publish(
        &mut self,
        queue: usize,
        slot: usize,
        descs: &[DescSpec],
    ) -> Result<Published, DeviceError> {
        let (in_area, out_area) = self.slot_areas(queue, slot);
        let q = &self.queues[queue];
        let first = u16::try_from(slot * usize::from(DESCS_PER_SLOT))
            .map_err(|_| DeviceError::TooBig(format!("slot {slot}")))?;
        if descs.len() > usize::from(QUEUE_SIZE) {
            return Err(DeviceError::TooBig(format!("{} descriptors", descs.len())));
        }
        let mut in_used = 0u64;
        let mut out_used = 0u64;
        let mut published = Published {
            head: first,
            writable: Vec::new(),
        };
        let table = q.rings.desc;
        let wrap =
            |i: usize| -> u16 { ((usize::from(first) + i) % usize::from(QUEUE_SIZE)) as u16 };
        let place = |b: &[u8], in_used: &mut u64| -> Result<u64, DeviceError> {
            let len = b.len() as u64;
            if *in_used + len > IN_CAP {
                return Err(DeviceError::TooBig(format!(
                    "{} readable bytes, slot holds {IN_CAP}",
                    *in_used + len
                )));
            }
            let at = in_area.0 + *in_used;
            self.write(GuestAddress(at), b)?;
            // Keep following pieces 16-byte aligned (indirect tables must be).
            *in_used = align(*in_used + len, 16);
            Ok(at)
        };
        let resolve = |d: &DescSpec,
                       in_used: &mut u64,
                       out_used: &mut u64,
                       published: &mut Published|
         -> Result<(u64, u32, u16), DeviceError> {
            Ok(match &d.buf {
                Buf::Read(b) => (place(b, in_used)?, b.len() as u32, 0),
                Buf::Write(n) => {
                    let n64 = u64::from(*n);
                    if *out_used + n64 > OUT_CAP {
                        return Err(DeviceError::TooBig(format!(
                            "{} writable bytes, slot holds {OUT_CAP}",
                            *out_used + n64
                        )));
                    }
                    let at = out_area.0 + *out_used;
                    *out_used += n64;
                    published.writable.push((GuestAddress(at), *n));
                    (at, *n, VIRTQ_DESC_F_WRITE)
                }
                Buf::Raw { addr, len } => (*addr, *len, 0),
                Buf::Indirect(inner) => {
                    // Laid out after everything else of this chain's readable bytes.
                    let mut table = Vec::with_capacity(16 * inner.len());
                    for (k, e) in inner.iter().enumerate() {
                        let (addr, len, base_flags) = match &e.buf {
                            Buf::Read(b) => (place(b, in_used)?, b.len() as u32, 0),
                            Buf::Write(n) => {
                                let n64 = u64::from(*n);
                                if *out_used + n64 > OUT_CAP {
                                    return Err(DeviceError::TooBig("indirect writable".into()));
                                }
                                let at = out_area.0 + *out_used;
                                *out_used += n64;
                                published.writable.push((GuestAddress(at), *n));
                                (at, *n, VIRTQ_DESC_F_WRITE)
                            }
                            Buf::Raw { addr, len } => (*addr, *len, 0),
                            Buf::Indirect(_) => (0, 0, VIRTQ_DESC_F_INDIRECT),
                        };
                        let last = k + 1 == inner.len();
                        let next = e.next.unwrap_or(if last { 0 } else { k as u16 + 1 });
                        let flags = e.flags.unwrap_or(
                            base_flags
                                | if !last || e.next.is_some() {
                                    VIRTQ_DESC_F_NEXT
                                } else {
                                    0
                                },
                        );
                        table.extend_from_slice(&addr.to_le_bytes());
                        table.extend_from_slice(&len.to_le_bytes());
                        table.extend_from_slice(&flags.to_le_bytes());
                        table.extend_from_slice(&next.to_le_bytes());
                    }
                    let at = place(&table, in_used)?;
                    (at, table.len() as u32, VIRTQ_DESC_F_INDIRECT)
                }
            })
        };
        for (i, d) in descs.iter().enumerate() {
            let (addr, len, base_flags) = resolve(d, &mut in_used, &mut out_used, &mut published)?;
            let last = i + 1 == descs.len();
            let next = match d.next {
                // Past the table: written as is (a `next` no descriptor has).
                Some(n) if n >= QUEUE_SIZE => n,
                Some(rel) => wrap(usize::from(rel)),
                None if last => 0,
                None => wrap(i + 1),
            };
            let flags = d.flags.unwrap_or(
                base_flags
                    | if !last || d.next.is_some() {
                        VIRTQ_DESC_F_NEXT
                    } else {
                        0
                    },
            );
            self.write_desc(table, wrap(i), addr, len, flags, next)?;
        }
        self.push_head(queue, first)?;
        Ok(published)
    }

    /// Put `head` on the available ring of `queue` (not yet visible: see `flush`).
    pub fn push_head(&mut self, queue: usize, head: u16) -> Result<(), DeviceError> {
        let q = &self.queues[queue];
        let at = GuestAddress(q.rings.avail.0 + 4 + 2 * u64::from(q.avail_idx % QUEUE_SIZE));
        self.write(at, &head.to_le_bytes())?;
        let q = &mut self.queues[queue];
        q.avail_idx = q.avail_idx.wrapping_add(1);
        Ok(())
    }

    /// Publish the available index and kick.
    pub fn flush(&mut self, queue: usize) -> Result<(), DeviceError> {
        let q = &self.queues[queue];
        let at = GuestAddress(q.rings.avail.0 + 2);
        self.mem
            .store(q.avail_idx, at, Ordering::Release)
            .map_err(|e| DeviceError::Access(at.0, e))?;
        fence(Ordering::SeqCst);
        q.kick.write(1).map_err(|e| DeviceError::Event(queue, e))
    }

    /// Take every completion on the used ring of `queue`: (descriptor id, bytes written).
    pub fn reap(&mut self, queue: usize, out: &mut Vec<(u32, u32)>) -> Result<(), DeviceError> {
        let q = &self.queues[queue];
        let at = GuestAddress(q.rings.used.0 + 2);
        let used: u16 = self
            .mem
            .load(at, Ordering::Acquire)
            .map_err(|e| DeviceError::Access(at.0, e))?;
        let mut last = q.last_used;
        while last != used {
            let at = GuestAddress(q.rings.used.0 + 4 + 8 * u64::from(last % QUEUE_SIZE));
            let mut e = [0u8; 8];
            self.mem
                .read_slice(&mut e, at)
                .map_err(|err| DeviceError::Access(at.0, err))?;
            out.push((
                u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
                u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            ));
            last = last.wrapping_add(1);
        }
        self.queues[queue].last_used = last;
        Ok(())
    }

    /// Wait until `queue` has completions (or `timeout` passes) and take them.
    pub fn wait(
        &mut self,
        queue: usize,
        timeout: Duration,
        out: &mut Vec<(u32, u32)>,
    ) -> Result<(), DeviceError> {
        let deadline = Instant::now() + timeout;
        loop {
            let _ = self.queues[queue].call.read();
            self.reap(queue, out)?;
            if !out.is_empty() {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            let mut pfd = libc::pollfd {
                fd: self.queues[queue].call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd that lives across the call.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(DeviceError::Event(queue, e));
                }
            }
        }
    }

    /// The bytes the device wrote into `p`'s writable buffers (at most `written`).
    pub fn reply(&self, p: &Published, written: u32) -> Result<Vec<u8>, DeviceError> {
        let mut left = written as usize;
        let mut out = Vec::with_capacity(left.min(1 << 20));
        for &(at, len) in &p.writable {
            if left == 0 {
                break;
            }
            let n = (len as usize).min(left);
            let start = out.len();
            out.resize(start + n, 0);
            self.mem
                .read_slice(&mut out[start..], at)
                .map_err(|e| DeviceError::Access(at.0, e))?;
            left -= n;
        }
        Ok(out)
    }

    /// Fill `p`'s writable buffers with a poison byte, so stale bytes are not taken for a reply.
    pub fn poison(&self, p: &Published) -> Result<(), DeviceError> {
        for &(at, len) in &p.writable {
            let n = (len as usize).min(64);
            self.write(at, &vec![0xa5; n])?;
        }
        Ok(())
    }
}
