//! Device state for live migration: what a guest's FUSE session holds, in a versioned byte
//! format, and the interface between the vhost-user layer (which moves the bytes) and the
//! filesystem (which produces and resolves them).
//!
//! A leaf: nothing here knows Ceph, FUSE dispatch or virtqueues. The format is documented in
//! docs/architecture.md ("The migration state format"); in short, all integers little-endian:
//!
//! ```text
//! header   magic "CVFSSTAT" (8 bytes), version u32, body length u64, FNV-1a 64 of the body u64
//! body     fuse_capable u64          FUSE INIT flags the guest offered (flags | flags2 << 32)
//!          idmap_fingerprint u64     FNV-1a of the --translate-uid/--translate-gid rules
//!          root_ino u64, root_snapid u64   the export root (node 1)
//!          node_count u32, then per node:
//!            id u64, ino u64, snapid u64, kind u32 (S_IFMT bits), lookups u64,
//!            parent u64 (0: none), name_len u16, name bytes
//!          handle_count u32, then per handle:
//!            fh u64, node u64, type u8 (1 file, 2 directory),
//!            file: oflags i32 | directory: position u64,
//!            opener_uid u32, opener_gid u32   (version 2: the guest ids that opened it;
//!                                             u32::MAX both: unknown)
//! ```
//!
//! Version 2 is written; version 1 (no opener ids) is still read, and its handles, whose
//! openers are unknown, are not opened again (see [`Opener`]). Any other version is refused.
//!
//! # A state is untrusted input
//! It comes from the vhost-user frontend (or a handover predecessor): a frontend the guest
//! escaped into can forge one. [`State::decode_within`] bounds it by the destination's own
//! limits before anything is allocated ([`Bounds`]); the filesystem then proves every node to
//! lie below its export and opens handles again only as their openers (`fs::state`).

use std::fmt;

/// First bytes of every state blob.
pub const MAGIC: [u8; 8] = *b"CVFSSTAT";
/// The format version this daemon writes.
pub const VERSION: u32 = 2;
/// The oldest version it reads.
pub const OLDEST_VERSION: u32 = 1;
/// Most bytes a state blob may take whatever the limits (a frontend cannot make the destination
/// allocate more); a destination's own bound is [`Bounds::max_len`], far lower by default.
/// 100,000 nodes take about 6 MB.
pub const MAX_STATE_LEN: u64 = 1 << 30;
/// Longest name of a node in its parent: one CephFS path component (NAME_MAX).
const MAX_NAME: usize = 255;
/// Header: magic, version, body length, checksum.
const HEADER: usize = 8 + 4 + 8 + 8;
/// Body before the node records: options, id mapping, root, and the two counts.
const BODY_FIXED: usize = 8 + 8 + 8 + 8 + 4 + 4;
/// Fixed part of a node record and the smallest handle record: how many records a body of a
/// given length can hold at most (a count beyond it is corrupt, and is never allocated for).
const NODE_FIXED: usize = 8 + 8 + 8 + 4 + 8 + 8 + 2;
const HANDLE_MIN: usize = 8 + 8 + 1 + 4;
/// The largest handle record (version 2: a directory position and the opener ids).
const HANDLE_MAX: usize = 8 + 8 + 1 + 8 + 4 + 4;
/// Opener ids of a handle whose opener is unknown.
const NO_OPENER: u32 = u32::MAX;

const HANDLE_FILE: u8 = 1;
const HANDLE_DIR: u8 = 2;

/// The FUSE session of a guest, as moved from the source daemon to the destination.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// FUSE INIT flags the guest offered (what `FileSystem::init` got as `capable`).
    pub fuse_capable: u64,
    /// [`fingerprint`] of the id mapping: the destination must translate ids the same way.
    pub idmap_fingerprint: u64,
    /// The export root's inode number and snapshot id.
    pub root: (u64, u64),
    /// Every node the guest holds but the root.
    pub nodes: Vec<NodeState>,
    /// Every open handle.
    pub handles: Vec<HandleState>,
    /// Who opened each handle, by handle number (version 2); a handle missing here has no
    /// known opener and is not opened again by a destination.
    pub openers: std::collections::HashMap<u64, Opener>,
}

/// The guest caller (its uid and gid as the guest sent them, before the id mapping) that
/// opened a handle: a destination opens the handle again as that caller, through its own id
/// mapping (which must equal the source's, see [`State::idmap_fingerprint`]), so that a forged
/// state cannot open a file with more rights than a request of the guest could.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opener {
    pub uid: u32,
    pub gid: u32,
}

/// What a destination accepts: its `--max-nodes` and `--max-handles`. A state over them is
/// refused before its records are allocated, and one longer than they allow before it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Most nodes, the export root included (`--max-nodes`).
    pub max_nodes: usize,
    /// Most handles (`--max-handles`).
    pub max_handles: usize,
}

impl Bounds {
    /// The longest state these limits allow: every node with the longest name and every
    /// handle of the largest kind (never more than [`MAX_STATE_LEN`]). With the defaults
    /// (500,000 nodes, 100,000 handles) about 154 MB.
    pub fn max_len(&self) -> u64 {
        let nodes = self.max_nodes.saturating_sub(1);
        let len = nodes
            .saturating_mul(NODE_FIXED + MAX_NAME)
            .saturating_add(self.max_handles.saturating_mul(HANDLE_MAX))
            .saturating_add(HEADER + BODY_FIXED);
        u64::try_from(len).unwrap_or(u64::MAX).min(MAX_STATE_LEN)
    }
}

/// One node: a guest node id and the CephFS inode it stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeState {
    pub id: u64,
    pub ino: u64,
    pub snapid: u64,
    /// `S_IFMT` bits: a node whose inode came back as another type is not restored.
    pub kind: u32,
    /// Lookups the guest holds (what it will FORGET).
    pub lookups: u64,
    /// The node it was found in (0: none, or no longer in the table) and its name there.
    pub parent: u64,
    pub name: Vec<u8>,
}

/// One open handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandleState {
    pub fh: u64,
    pub node: u64,
    pub kind: HandleKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleKind {
    /// An open file and the open(2) flags libcephfs got.
    File { oflags: i32 },
    /// A directory stream and the offset of its next entry.
    Dir { pos: u64 },
}

/// Why a state blob could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("not a ceph-virtiofsd device state (bad magic)")]
    BadMagic,
    #[error("device state version {found} is not supported (this daemon reads version {VERSION}): migrate to a daemon of the same or a newer release")]
    Version { found: u32 },
    #[error("device state is truncated (reading {0})")]
    Truncated(&'static str),
    #[error("device state is corrupt ({0})")]
    Corrupt(&'static str),
    #[error("device state checksum mismatch: the bytes were damaged on the way")]
    Checksum,
    #[error("device state holds {count} {what}, more than this daemon's limit of {max}: start the destination with at least the source's --max-nodes and --max-handles")]
    OverLimit {
        what: &'static str,
        count: usize,
        max: usize,
    },
    #[error("device state is {len} bytes, more than the {max} this daemon's --max-nodes and --max-handles allow: start the destination with at least the source's limits")]
    TooLong { len: u64, max: u64 },
}

/// What the destination made of a loaded state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    pub nodes: usize,
    pub handles: usize,
    /// Nodes whose inode could not be found again (deleted meanwhile, access lost): ESTALE.
    pub lost_nodes: usize,
    /// Handles that could not be opened again: ESTALE on every use.
    pub lost_handles: usize,
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} nodes and {} handles restored, {} nodes and {} handles lost",
            self.nodes, self.handles, self.lost_nodes, self.lost_handles
        )
    }
}

/// Why a migration step failed on one side. The vhost-user layer reports it to the frontend as
/// a failed CHECK_DEVICE_STATE, so QEMU fails the migration and the source keeps running.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("the guest holds {0} file lock(s): migration is refused (locks are not moved); release them and migrate again")]
    LocksHeld(usize),
    #[error("the destination exports another directory (root inode {found:#x}, the source's is {expected:#x}): start it with the same --ceph-root")]
    OtherExport { expected: u64, found: u64 },
    #[error("the destination translates ids differently (--translate-uid/--translate-gid): start it with the source's rules")]
    IdMapping,
    #[error("the destination already serves a FUSE session ({0} nodes, {1} handles): load state only into a fresh daemon")]
    SessionActive(usize, usize),
    #[error("the frontend sent a device state after the guest's FUSE session started on this connection (FUSE INIT, or a state loaded before): refused; a state is loaded only into a fresh connection, before the guest's first request")]
    SessionServed,
    #[error("{lost} of the guest's nodes and handles could not be found again (first: {first}), and --migration-on-error abort is set")]
    Unresolved { lost: usize, first: String },
    #[error("requests of the guest are still running: the device was not stopped")]
    Busy,
    #[error("state transfer: {0}")]
    Io(#[from] std::io::Error),
}

/// What to do with an entry the destination cannot resolve.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnError {
    /// The node or handle answers ESTALE in the guest; the migration goes on.
    #[default]
    GuestError,
    /// The migration fails (the source keeps running).
    Abort,
}

/// The filesystem's side of migration: the vhost-user layer calls these while the device is
/// stopped (no request is running).
pub trait DeviceState: Send + Sync {
    /// The guest's session as a state blob (see the module doc).
    fn save_state(&self) -> Result<Vec<u8>, MigrationError>;
    /// Take over the session in `bytes` (from the frontend: untrusted): resolve every entry
    /// before returning. Refused once the connection served a FUSE session (see
    /// [`DeviceState::connection_started`]).
    fn load_state(&self, bytes: &[u8]) -> Result<LoadReport, MigrationError>;
    /// Take over the session a handover predecessor sent (`--handover`): a process of the
    /// daemon's own user, checked by the socket's peer credentials, which could read the
    /// daemon's key anyway. The same checks as [`DeviceState::load_state`], except that what
    /// cannot be proven to lie in the export (a file the guest holds open after another client
    /// deleted it: it has no name left) is kept as the predecessor had it.
    fn load_peer_state(&self, bytes: &[u8]) -> Result<LoadReport, MigrationError> {
        self.load_state(bytes)
    }
    /// The most bytes a state this daemon loads may take: read no more from the frontend
    /// (longer ones are refused by [`DeviceState::load_state`] anyway).
    fn max_state_len(&self) -> u64 {
        MAX_STATE_LEN
    }
    /// A new frontend connection begins (the previous one's session ended): a LOAD is accepted
    /// again, until the first FUSE INIT (or successful LOAD) of this connection. Without this
    /// call, a LOAD is refused once the daemon served any session.
    fn connection_started(&self) {}
}

/// FNV-1a, 64 bit: the body checksum and the id mapping's fingerprint (no crate for 10 lines).
pub fn fingerprint(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl State {
    /// The state blob.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(48 + self.nodes.len() * 64 + self.handles.len() * 32);
        body.extend_from_slice(&self.fuse_capable.to_le_bytes());
        body.extend_from_slice(&self.idmap_fingerprint.to_le_bytes());
        body.extend_from_slice(&self.root.0.to_le_bytes());
        body.extend_from_slice(&self.root.1.to_le_bytes());
        put_count(&mut body, self.nodes.len());
        for n in &self.nodes {
            body.extend_from_slice(&n.id.to_le_bytes());
            body.extend_from_slice(&n.ino.to_le_bytes());
            body.extend_from_slice(&n.snapid.to_le_bytes());
            body.extend_from_slice(&n.kind.to_le_bytes());
            body.extend_from_slice(&n.lookups.to_le_bytes());
            // A name too long for the format (never: CephFS names are at most 255 bytes) is
            // saved without its link rather than cut.
            let name = if n.name.len() <= MAX_NAME {
                &n.name[..]
            } else {
                &[]
            };
            let parent = if name.is_empty() { 0 } else { n.parent };
            body.extend_from_slice(&parent.to_le_bytes());
            let len = u16::try_from(name.len()).unwrap_or(0);
            body.extend_from_slice(&len.to_le_bytes());
            body.extend_from_slice(name);
        }
        put_count(&mut body, self.handles.len());
        for h in &self.handles {
            body.extend_from_slice(&h.fh.to_le_bytes());
            body.extend_from_slice(&h.node.to_le_bytes());
            match h.kind {
                HandleKind::File { oflags } => {
                    body.push(HANDLE_FILE);
                    body.extend_from_slice(&oflags.to_le_bytes());
                }
                HandleKind::Dir { pos } => {
                    body.push(HANDLE_DIR);
                    body.extend_from_slice(&pos.to_le_bytes());
                }
            }
            let o = self.openers.get(&h.fh).copied().unwrap_or(Opener {
                uid: NO_OPENER,
                gid: NO_OPENER,
            });
            body.extend_from_slice(&o.uid.to_le_bytes());
            body.extend_from_slice(&o.gid.to_le_bytes());
        }
        let mut out = Vec::with_capacity(body.len() + 28);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&u64::try_from(body.len()).unwrap_or(u64::MAX).to_le_bytes());
        out.extend_from_slice(&fingerprint(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Read a state blob: any damage is an error, never a panic or a huge allocation.
    pub fn decode(bytes: &[u8]) -> Result<State, FormatError> {
        Self::decode_within(
            bytes,
            &Bounds {
                max_nodes: usize::MAX,
                max_handles: usize::MAX,
            },
        )
    }

    /// [`State::decode`] within a destination's limits: a blob longer than they allow, or
    /// counts over them, are refused before any record is read.
    pub fn decode_within(bytes: &[u8], bounds: &Bounds) -> Result<State, FormatError> {
        let (mut r, version) = Cursor::body(bytes, bounds)?;
        let mut s = State {
            fuse_capable: r.u64("fuse options")?,
            idmap_fingerprint: r.u64("id mapping")?,
            root: (r.u64("root")?, r.u64("root")?),
            ..State::default()
        };
        s.nodes = r.nodes(bounds)?;
        r.handles(bounds, version, &mut s)?;
        if !r.0.is_empty() {
            return Err(FormatError::Corrupt("bytes after the last handle"));
        }
        Ok(s)
    }
}

impl<'a> Cursor<'a> {
    /// The body of a state blob, after its header (magic, version, body length, checksum) is
    /// checked, and the format version.
    fn body(bytes: &'a [u8], bounds: &Bounds) -> Result<(Self, u32), FormatError> {
        let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        let max = bounds.max_len();
        if len > max {
            return Err(FormatError::TooLong { len, max });
        }
        let mut r = Cursor(bytes);
        let magic = r.take(MAGIC.len(), "magic")?;
        if magic != MAGIC {
            return Err(FormatError::BadMagic);
        }
        let version = r.u32("version")?;
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return Err(FormatError::Version { found: version });
        }
        let len = r.u64("body length")?;
        let sum = r.u64("checksum")?;
        let len = usize::try_from(len).map_err(|_| FormatError::Corrupt("body length"))?;
        if len != r.0.len() {
            return Err(if len > r.0.len() {
                FormatError::Truncated("body")
            } else {
                FormatError::Corrupt("bytes after the body")
            });
        }
        if fingerprint(r.0) != sum {
            return Err(FormatError::Checksum);
        }
        Ok((r, version))
    }

    /// The node table: its count (within `bounds`), then each node.
    fn nodes(&mut self, bounds: &Bounds) -> Result<Vec<NodeState>, FormatError> {
        let count = self.count("node count", NODE_FIXED)?;
        // The root is node 1 and not in the state.
        let max = bounds.max_nodes.saturating_sub(1);
        if count > max {
            return Err(FormatError::OverLimit {
                what: "nodes besides the root",
                count,
                max,
            });
        }
        let mut nodes = Vec::with_capacity(count);
        for _ in 0..count {
            nodes.push(self.node()?);
        }
        Ok(nodes)
    }

    fn node(&mut self) -> Result<NodeState, FormatError> {
        let id = self.u64("node")?;
        let ino = self.u64("node")?;
        let snapid = self.u64("node")?;
        let kind = self.u32("node")?;
        let lookups = self.u64("node")?;
        let parent = self.u64("node")?;
        let name_len = usize::from(self.u16("node name")?);
        if name_len > MAX_NAME {
            return Err(FormatError::Corrupt("node name length"));
        }
        let name = self.take(name_len, "node name")?.to_vec();
        if id == 0 || lookups == 0 {
            return Err(FormatError::Corrupt("node without id or lookups"));
        }
        Ok(NodeState {
            id,
            ino,
            snapid,
            kind,
            lookups,
            parent,
            name,
        })
    }

    /// The handle table into `s`: its count (within `bounds`), then each handle and its
    /// opener (from `version` 2 on).
    fn handles(&mut self, bounds: &Bounds, version: u32, s: &mut State) -> Result<(), FormatError> {
        let count = self.count("handle count", HANDLE_MIN)?;
        if count > bounds.max_handles {
            return Err(FormatError::OverLimit {
                what: "handles",
                count,
                max: bounds.max_handles,
            });
        }
        s.handles.reserve(count);
        for _ in 0..count {
            let fh = self.u64("handle")?;
            let node = self.u64("handle")?;
            let kind = self.handle_kind()?;
            if version >= 2 {
                let uid = self.u32("handle opener")?;
                let gid = self.u32("handle opener")?;
                if uid != NO_OPENER
                    && gid != NO_OPENER
                    && s.openers.insert(fh, Opener { uid, gid }).is_some()
                {
                    return Err(FormatError::Corrupt("two handles of one number"));
                }
            }
            s.handles.push(HandleState { fh, node, kind });
        }
        Ok(())
    }

    fn handle_kind(&mut self) -> Result<HandleKind, FormatError> {
        Ok(match self.u8("handle type")? {
            HANDLE_FILE => HandleKind::File {
                oflags: i32::from_le_bytes(self.array("handle flags")?),
            },
            HANDLE_DIR => HandleKind::Dir {
                pos: self.u64("directory position")?,
            },
            _ => return Err(FormatError::Corrupt("handle type")),
        })
    }
}

fn put_count(out: &mut Vec<u8>, n: usize) {
    // Tables hold far fewer than 2^32 entries (--max-nodes, --max-handles).
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], FormatError> {
        if n > self.0.len() {
            return Err(FormatError::Truncated(what));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], FormatError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, FormatError> {
        Ok(u8::from_le_bytes(self.array(what)?))
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    /// A record count, checked against what the rest of the body can hold.
    fn count(&mut self, what: &'static str, min_record: usize) -> Result<usize, FormatError> {
        let n = usize::try_from(self.u32(what)?).map_err(|_| FormatError::Corrupt(what))?;
        if n > self.0.len() / min_record {
            return Err(FormatError::Truncated(what));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> State {
        State {
            fuse_capable: 0x1234_5678_9abc_def0,
            idmap_fingerprint: fingerprint(b"rules"),
            root: (0x1000, u64::MAX - 1),
            nodes: vec![
                NodeState {
                    id: 0x1001,
                    ino: 0x1001,
                    snapid: u64::MAX - 1,
                    kind: libc::S_IFDIR,
                    lookups: 3,
                    parent: 1,
                    name: b"dir".to_vec(),
                },
                NodeState {
                    id: (1 << 63) | 2,
                    ino: 0x1002,
                    snapid: 7,
                    kind: libc::S_IFREG,
                    lookups: 1,
                    parent: 0,
                    name: Vec::new(),
                },
            ],
            handles: vec![
                HandleState {
                    fh: 77,
                    node: 0x1001,
                    kind: HandleKind::Dir { pos: 0x5555 },
                },
                HandleState {
                    fh: 78,
                    node: (1 << 63) | 2,
                    kind: HandleKind::File {
                        oflags: libc::O_RDWR | libc::O_APPEND,
                    },
                },
            ],
            openers: [(
                77,
                Opener {
                    uid: 1000,
                    gid: 100,
                },
            )]
            .into_iter()
            .collect(),
        }
    }

    /// A blob of `version` around `body`.
    fn blob(version: u32, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&fingerprint(body).to_le_bytes());
        out.extend_from_slice(body);
        out
    }

    /// A version 1 state (no opener ids) is still read; its handles have no opener.
    #[test]
    fn version_1_is_read_without_openers() {
        let mut body = Vec::new();
        for v in [7u64, 8, 0x1000, u64::MAX - 1] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.extend_from_slice(&0u32.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&77u64.to_le_bytes());
        body.extend_from_slice(&1u64.to_le_bytes());
        body.push(HANDLE_FILE);
        body.extend_from_slice(&libc::O_RDWR.to_le_bytes());
        let s = State::decode(&blob(1, &body)).unwrap();
        assert_eq!(s.handles.len(), 1);
        assert!(s.openers.is_empty());
        assert_eq!((s.fuse_capable, s.root), (7, (0x1000, u64::MAX - 1)));
    }

    /// Counts over the destination's limits and blobs longer than they allow are refused
    /// before a record is read; a state within them is read whole.
    #[test]
    fn hostile_a_state_over_the_limits_is_refused_before_it_is_read() {
        let s = sample();
        let bytes = s.encode();
        let fits = Bounds {
            max_nodes: 3,
            max_handles: 2,
        };
        assert_eq!(State::decode_within(&bytes, &fits).unwrap(), s);
        let nodes = Bounds {
            max_nodes: 2,
            ..fits
        };
        assert!(matches!(
            State::decode_within(&bytes, &nodes),
            Err(FormatError::OverLimit {
                count: 2,
                max: 1,
                ..
            })
        ));
        let handles = Bounds {
            max_handles: 1,
            ..fits
        };
        assert!(matches!(
            State::decode_within(&bytes, &handles),
            Err(FormatError::OverLimit {
                count: 2,
                max: 1,
                ..
            })
        ));
        // The length bound: two nodes with the longest names and two handles fit in it; more
        // bytes do not, whatever they hold.
        assert!(bytes.len() as u64 <= fits.max_len());
        let mut long = bytes.clone();
        long.resize(fits.max_len() as usize + 1, 0);
        assert!(matches!(
            State::decode_within(&long, &fits),
            Err(FormatError::TooLong { .. })
        ));
        // A node name longer than a path component is corrupt.
        let mut named = sample();
        named.nodes[0].name = vec![b'x'; 256];
        named.nodes[0].parent = 1;
        let mut body = Vec::new();
        body.extend_from_slice(&[0u8; 32]);
        body.extend_from_slice(&1u32.to_le_bytes());
        for v in [5u64, 5, u64::MAX - 1] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.extend_from_slice(&libc::S_IFREG.to_le_bytes());
        body.extend_from_slice(&1u64.to_le_bytes());
        body.extend_from_slice(&1u64.to_le_bytes());
        body.extend_from_slice(&256u16.to_le_bytes());
        body.extend_from_slice(&[b'x'; 256]);
        body.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            State::decode(&blob(VERSION, &body)).unwrap_err(),
            FormatError::Corrupt("node name length")
        );
        // The default limits bound a state far below the format's own maximum.
        let defaults = Bounds {
            max_nodes: 500_000,
            max_handles: 100_000,
        };
        assert!(defaults.max_len() < 160_000_000, "{}", defaults.max_len());
    }

    #[test]
    fn state_round_trips() {
        let s = sample();
        let bytes = s.encode();
        assert_eq!(&bytes[..8], b"CVFSSTAT");
        assert_eq!(State::decode(&bytes).unwrap(), s);
        let empty = State::default();
        assert_eq!(State::decode(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn hostile_every_truncation_is_a_clean_error() {
        let bytes = sample().encode();
        for n in 0..bytes.len() {
            let e = State::decode(&bytes[..n]).unwrap_err();
            assert!(
                matches!(e, FormatError::Truncated(_) | FormatError::BadMagic),
                "{n}: {e}"
            );
        }
    }

    #[test]
    fn hostile_corrupt_bytes_are_refused_without_panic() {
        let bytes = sample().encode();
        // Every single-byte change in the body is caught by the checksum; in the header by
        // the magic, version or length checks.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x41;
            assert!(State::decode(&b).is_err(), "byte {i} changed and accepted");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            State::decode(&longer).unwrap_err(),
            FormatError::Corrupt("bytes after the body")
        );
        // A body with a valid checksum whose counts lie: no allocation for 2^32 records.
        let mut body = Vec::new();
        body.extend_from_slice(&[0u8; 32]);
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        let forged = blob(VERSION, &body);
        assert_eq!(
            State::decode(&forged).unwrap_err(),
            FormatError::Truncated("node count")
        );
    }

    #[test]
    fn other_versions_are_refused() {
        let mut bytes = sample().encode();
        bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(
            State::decode(&bytes).unwrap_err(),
            FormatError::Version { found: 3 }
        );
        bytes[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            State::decode(&bytes).unwrap_err(),
            FormatError::Version { found: 0 }
        );
        bytes[..8].copy_from_slice(b"CVFSSTAX");
        assert_eq!(State::decode(&bytes).unwrap_err(), FormatError::BadMagic);
    }

    #[test]
    fn state_of_100k_nodes_stays_small() {
        let mut s = sample();
        s.nodes = (0..100_000u64)
            .map(|i| NodeState {
                id: 0x1_0000_0000 + i,
                ino: 0x1_0000_0000 + i,
                snapid: u64::MAX - 1,
                kind: libc::S_IFREG,
                lookups: 1,
                parent: 1,
                name: format!("file-{i:06}").into_bytes(),
            })
            .collect();
        s.handles.clear();
        s.openers.clear();
        let bytes = s.encode();
        assert!(bytes.len() < 100_000 * 64, "{}", bytes.len());
        assert_eq!(State::decode(&bytes).unwrap().nodes.len(), 100_000);
    }
}
