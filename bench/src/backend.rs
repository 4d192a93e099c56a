//! What a workload needs from the thing under test. The FUSE-over-vhost-user frontend implements
//! it; a "floor" backend calling libcephfs directly (ceph-client) can implement the same trait.
//! Node ids and handles are opaque to workloads: each backend hands out its own.

use std::time::Duration;

/// Credentials a request runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
}

impl Ctx {
    pub const ROOT: Ctx = Ctx { uid: 0, gid: 0 };
}

/// One filesystem operation, as a guest would issue it.
#[derive(Debug, Clone)]
pub enum Op {
    Lookup {
        parent: u64,
        name: String,
    },
    Getattr {
        node: u64,
    },
    Mkdir {
        parent: u64,
        name: String,
        mode: u32,
    },
    Mknod {
        parent: u64,
        name: String,
        mode: u32,
    },
    Create {
        parent: u64,
        name: String,
        mode: u32,
        flags: u32,
    },
    Unlink {
        parent: u64,
        name: String,
    },
    Open {
        node: u64,
        flags: u32,
    },
    Release {
        node: u64,
        fh: u64,
    },
    Opendir {
        node: u64,
    },
    Readdirplus {
        node: u64,
        fh: u64,
        offset: u64,
        size: u32,
    },
    Releasedir {
        node: u64,
        fh: u64,
    },
    /// Writes `len` bytes of a fixed pattern; `kill_suidgid` as a non-root guest sets it.
    Write {
        node: u64,
        fh: u64,
        offset: u64,
        len: u32,
        kill_suidgid: bool,
    },
    Read {
        node: u64,
        fh: u64,
        offset: u64,
        len: u32,
    },
    /// Writes the file's dirty data back (FSYNC, not datasync).
    Fsync {
        node: u64,
        fh: u64,
    },
    /// Truncates/extends through SETATTR(size).
    Truncate {
        node: u64,
        size: u64,
    },
}

/// A directory entry returned by READDIRPLUS (the entry carries a lookup reference when
/// `node != 0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub node: u64,
    pub offset: u64,
    /// `DT_*` type of the entry (`DT_DIR` = 4), 0 when unknown.
    pub kind: u32,
}

/// Successful result of an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Entry {
        node: u64,
        mode: u32,
        size: u64,
        uid: u32,
    },
    Attr {
        mode: u32,
        size: u64,
        uid: u32,
    },
    Open {
        fh: u64,
    },
    /// CREATE: a new node (with one lookup reference) and an open handle.
    Created {
        node: u64,
        fh: u64,
    },
    /// Directory entries; an empty vector means end of directory.
    Dir(Vec<DirEntry>),
    Written(u32),
    Data(u32),
    Empty,
}

/// Errors a backend reports for one operation.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// The filesystem answered with this errno (normal traffic).
    #[error("{op} failed with errno {errno} ({})", std::io::Error::from_raw_os_error(*errno))]
    Errno { op: &'static str, errno: i32 },
    /// The daemon answered something that is not a valid reply.
    #[error("Malformed reply to {op}: {why}")]
    Malformed { op: &'static str, why: String },
    /// The transport broke (queue, socket, memory): the session cannot go on.
    #[error("Transport failure")]
    Transport(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl OpError {
    pub fn errno(&self) -> Option<i32> {
        match self {
            OpError::Errno { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// Result of a pipelined batch: per-op latency of the successes, and the failures.
#[derive(Debug, Default)]
pub struct Batch {
    pub latencies: Vec<Duration>,
    pub bytes: u64,
    pub errors: Vec<OpError>,
    pub wall: Duration,
}

pub trait Backend {
    /// Issues one operation and waits for its answer.
    fn call(&mut self, ctx: Ctx, op: Op) -> Result<Reply, OpError>;

    /// Issues `count` independent operations made by `make(i)`, keeping `depth` of them in
    /// flight (spread over the backend's parallel channels), and times each one.
    /// Only transport failures end the batch early; errno replies are collected.
    fn pipeline(
        &mut self,
        ctx: Ctx,
        depth: usize,
        count: usize,
        make: &(dyn Fn(usize) -> Op + Sync),
    ) -> Result<Batch, OpError>;

    /// Drops lookup references (FUSE FORGET semantics): `(node, count)`.
    fn forget(&mut self, nodes: &[(u64, u64)]) -> Result<(), OpError>;

    /// The root node id.
    fn root(&self) -> u64;

    /// Largest WRITE/READ payload the backend accepts.
    fn max_io(&self) -> u32;
}
