//! `hostile states`: the vhost-user frontend as the attacker. A frontend the guest escaped
//! into (or any process on the socket while `--keep-serving` waits) can send the daemon a
//! device state (`SET_DEVICE_STATE_FD`, LOAD) before the guest's first request. This mode
//! sends generated ones, framed validly with hostile contents, and judges what the daemon
//! then serves:
//!
//! - node ids and inode numbers of the export, of its parent and siblings (another tenant's
//!   tree), of "/", of /volumes subvolumes (other quarantine domains), of snapshots, and
//!   random ones; snapids; kinds; lookup counts; links that hold, links into the wrong parent,
//!   ".." and ".snap" names, parent loops; handles with any open flags, positions and openers;
//!   counts over the daemon's limits; version 1 states, truncations, wrong roots and id
//!   mappings, corrupt bytes;
//! - after a load the daemon accepts, every node the state named is probed (GETATTR,
//!   OPENDIR + READDIRPLUS, LOOKUP of ".."; a file is opened and read) and every handle used
//!   (READ, a one-byte WRITE past the end of the file's data, READDIRPLUS).
//!
//! Judged (each finding printed with a replay line and the state's bytes):
//! - **escape**: an inode number a reply hands out that the [`Oracle`] (a second client
//!   mounted at "/") finds outside the export;
//! - **privilege**: a handle that reads or writes a file of the surveyed tree although the
//!   opener the state names could not (mode bits; its owner may, as the daemon's owner
//!   override lets it), or whose state names no opener at all;
//! - **refusal**: a state that must be refused (over the limits, truncated, another root, id
//!   mapping, version or magic) that was taken;
//! - **lost**, **malformed**: a request not answered within the timeout, a reply whose
//!   header does not echo the request;
//! - **dead**: the daemon gone, or not accepting the next frontend, or not answering a fresh
//!   session's INIT and GETATTR at the end.
//!
//! A state the daemon takes latches the connection (no second LOAD until the session ends),
//! so the fuzzer connects anew after each; refused states share a connection. With
//! `--init-first` every connection sends FUSE_INIT first, as a guest that mounted, and every
//! state must be refused. Each state is
//! generated from the seed and its number alone: `--first N --states 1` replays state N.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ceph_client::{Mount, MountBuilder, UserPerm, CEPH_STATX_BASIC_STATS};
use ceph_virtiofsd::migration::{
    fingerprint, HandleKind, HandleState, NodeState, Opener, State, MAGIC,
};

use super::device::Device;
use super::gen::Rng;
use super::oracle::{Oracle, Verdict};
use super::session::{Answer, Session};
use super::wire::{self, Header};

/// CephFS's "no snapshot" and snapshot-directory snapids.
const NOSNAP: u64 = u64::MAX - 1;
const SNAPDIR: u64 = u64::MAX;
/// Node ids the daemon allocates carry the top bit.
const ALLOCATED: u64 = 1 << 63;
/// Entries the survey records at most (the trees the tests build are far smaller).
const SURVEY_CAP: usize = 4000;
/// Node ids and handles probed per state at most.
const PROBE_NODES: usize = 24;
const PROBE_HANDLES: usize = 12;
/// A vhost-user message the daemon does not answer within this is a dead daemon (a LOAD of
/// the largest state the fuzzer sends is resolved in well under a second).
const VHOST_REPLY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct StatesOpts {
    pub socket: PathBuf,
    pub ceph_conf: PathBuf,
    pub client_id: String,
    pub export: String,
    pub states: u64,
    pub first: u64,
    pub seed: u64,
    /// The daemon's --max-nodes and --max-handles (states just over them must be refused).
    pub max_nodes: usize,
    pub max_handles: usize,
    pub pid: Option<u32>,
    pub timeout: Duration,
    pub print_per_kind: u64,
    /// Send FUSE_INIT on every new connection before its first state: every state must then
    /// be refused (a LOAD after the guest's session started).
    pub init_first: bool,
}

/// One inode of the surveyed trees.
#[derive(Debug, Clone)]
struct Entry {
    ino: u64,
    snapid: u64,
    kind: u32,
    /// Index of the entry it was found in (`None`: the export root, or found otherwise).
    parent: Option<usize>,
    name: Vec<u8>,
    uid: u32,
    gid: u32,
    mode: u32,
    inside: bool,
}

/// What the fuzzer knows of the cluster: the export's tree, its parent's (another tenant's),
/// the export's ancestors, "/" and its children, /volumes subvolumes, and snapshots.
#[derive(Debug, Default)]
struct Survey {
    entries: Vec<Entry>,
    /// Index of the export root.
    root: usize,
    /// Index of the export's parent (if the export is not "/").
    parent: Option<usize>,
    by_vino: HashMap<(u64, u64), usize>,
}

impl Survey {
    fn add(&mut self, e: Entry) -> usize {
        if let Some(&i) = self.by_vino.get(&(e.ino, e.snapid)) {
            return i;
        }
        let i = self.entries.len();
        self.by_vino.insert((e.ino, e.snapid), i);
        self.entries.push(e);
        i
    }

    fn root_ino(&self) -> u64 {
        self.entries.get(self.root).map_or(0, |e| e.ino)
    }
}

fn entry(st: &ceph_client::Statx, parent: Option<usize>, name: &[u8], inside: bool) -> Entry {
    Entry {
        ino: st.stx_ino,
        snapid: st.snapid(),
        kind: u32::from(st.stx_mode) & libc::S_IFMT,
        parent,
        name: name.to_vec(),
        uid: st.stx_uid,
        gid: st.stx_gid,
        mode: u32::from(st.stx_mode) & 0o7777,
        inside,
    }
}

/// Walk what the fuzzer will name: `export` and its ancestors from "/", the tree under the
/// export's parent (the export's and its siblings'), "/"'s children and /volumes/*/*, and the
/// snapshots of the surveyed directories.
fn survey(m: &Mount, export: &str) -> Result<Survey, String> {
    let perm = UserPerm::root();
    let mut s = Survey::default();
    let mut cur = m
        .lookup_root()
        .map_err(|e| format!("lookup of \"/\": {e}"))?;
    let st = m
        .getattr(&cur, CEPH_STATX_BASIC_STATS, 0, &perm)
        .map_err(|e| format!("getattr of \"/\": {e}"))?;
    let parts: Vec<&str> = export.split('/').filter(|p| !p.is_empty()).collect();
    let mut at = s.add(entry(&st, None, b"", parts.is_empty()));
    // (directory, its entry, list its whole subtree)
    let mut dirs = Vec::new();
    let mut parent_dir = None;
    for part in &parts {
        let name = CString::new(*part).map_err(|_| format!("export {export}: bad name"))?;
        let (next, st) = m
            .lookup(&cur, &name, CEPH_STATX_BASIC_STATS, 0, &perm)
            .map_err(|e| format!("lookup of {part} in {export}: {e}"))?;
        s.parent = Some(at);
        parent_dir = Some(cur);
        at = s.add(entry(&st, Some(at), part.as_bytes(), false));
        cur = next;
    }
    s.root = at;
    if let Some(e) = s.entries.get_mut(at) {
        e.inside = true;
    }
    // The export's parent's whole tree (the export's and its siblings'), or the export's.
    match (s.parent, parent_dir) {
        (Some(p), Some(d)) => dirs.push((d, p, true)),
        _ => dirs.push((cur, s.root, true)),
    }
    // "/" and its children, /volumes/<group>/<subvolume>.
    dirs.push((m.lookup_root().map_err(|e| e.to_string())?, 0, false));
    let mut listed = HashSet::new();
    while let Some((dir, idx, deep)) = dirs.pop() {
        if s.entries.len() >= SURVEY_CAP || !listed.insert(idx) {
            continue;
        }
        let Ok(mut d) = m.opendir(&dir, &perm) else {
            continue;
        };
        let dir_inside = s.entries.get(idx).is_some_and(|e| e.inside);
        // Under /volumes: the groups and their subvolumes are listed too.
        let depth_below_volumes = {
            let mut depth = None;
            let mut cur = Some(idx);
            let mut k = 0;
            while let Some(c) = cur {
                let Some(e) = s.entries.get(c) else { break };
                if e.name == b"volumes" && e.parent == Some(0) {
                    depth = Some(k);
                    break;
                }
                cur = e.parent;
                k += 1;
            }
            depth
        };
        while let Ok(Some(e)) = d.readdirplus(CEPH_STATX_BASIC_STATS, 0, true) {
            if e.name == b"." || e.name == b".." || s.entries.len() >= SURVEY_CAP {
                continue;
            }
            let ino = e.statx.stx_ino;
            let is_root = ino == s.root_ino() && e.statx.snapid() == NOSNAP;
            let child = if is_root {
                s.root
            } else {
                s.add(entry(&e.statx, Some(idx), &e.name, dir_inside))
            };
            let is_dir = u32::from(e.statx.stx_mode) & libc::S_IFMT == libc::S_IFDIR;
            let volumes =
                (idx == 0 && e.name == b"volumes") || depth_below_volumes.is_some_and(|d| d < 2);
            if is_dir && (deep || volumes) {
                if let Some(i) = e.inode {
                    dirs.push((i, child, deep));
                }
            }
        }
    }
    // Snapshots of the surveyed directories under the export's parent: ".snap", its
    // snapshots, and one level in each.
    let snapdirs: Vec<usize> = (0..s.entries.len())
        .filter(|&i| {
            s.entries
                .get(i)
                .is_some_and(|e| e.kind == libc::S_IFDIR && e.snapid == NOSNAP && i != 0)
        })
        .take(64)
        .collect();
    for i in snapdirs {
        let Some(e) = s.entries.get(i).cloned() else {
            continue;
        };
        let Ok(dir) = m.lookup_inode(e.ino) else {
            continue;
        };
        let Ok((snapdir, st)) = m.lookup(&dir, c".snap", CEPH_STATX_BASIC_STATS, 0, &perm) else {
            continue;
        };
        let sd = s.add(entry(&st, Some(i), b".snap", e.inside));
        let Ok(mut d) = m.opendir(&snapdir, &perm) else {
            continue;
        };
        let mut snaps = Vec::new();
        while let Ok(Some(x)) = d.readdirplus(CEPH_STATX_BASIC_STATS, 0, true) {
            if x.name == b"." || x.name == b".." {
                continue;
            }
            let si = s.add(entry(&x.statx, Some(sd), &x.name, e.inside));
            if let Some(inode) = x.inode {
                snaps.push((inode, si));
            }
        }
        for (snap, si) in snaps {
            let Ok(mut d) = m.opendir(&snap, &perm) else {
                continue;
            };
            while let Ok(Some(x)) = d.readdirplus(CEPH_STATX_BASIC_STATS, 0, true) {
                if x.name != b"." && x.name != b".." {
                    s.add(entry(&x.statx, Some(si), &x.name, e.inside));
                }
            }
        }
    }
    Ok(s)
}

/// How a generated state must be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Anything: taken or refused.
    Any,
    /// Refused (over the limits, truncated, another root or id mapping, bad framing).
    Refused,
}

/// One generated state: its bytes, what it claims (for probing and judging), its shape.
#[derive(Debug, Clone)]
struct Generated {
    bytes: Vec<u8>,
    state: State,
    expect: Expect,
    shape: &'static str,
    /// Race: send requests while the daemon loads it.
    race: bool,
}

struct Gen<'a> {
    s: &'a Survey,
    fingerprint: u64,
    max_nodes: usize,
    max_handles: usize,
    snapdir: u64,
}

const NAMES: [&[u8]; 9] = [
    b"..", b".", b".snap", b"", b"a/b", b"data", b"other", b"secret", b"volumes",
];

impl Gen<'_> {
    fn entry(&self, r: &mut Rng) -> Option<&Entry> {
        self.s
            .entries
            .get(r.below(self.s.entries.len() as u64) as usize)
    }

    fn inside(&self, r: &mut Rng) -> Option<usize> {
        let v: Vec<usize> = (0..self.s.entries.len())
            .filter(|&i| self.s.entries.get(i).is_some_and(|e| e.inside))
            .collect();
        r.pick(&v).copied()
    }

    fn outside(&self, r: &mut Rng) -> Option<usize> {
        let v: Vec<usize> = (0..self.s.entries.len())
            .filter(|&i| self.s.entries.get(i).is_some_and(|e| !e.inside))
            .collect();
        r.pick(&v).copied()
    }

    /// The node id the daemon gives an inode (head inodes: their number) or a hostile one.
    fn id_for(&self, r: &mut Rng, ino: u64, snapid: u64) -> u64 {
        let direct = snapid == NOSNAP && ino != 1 && ino & ALLOCATED == 0;
        match r.below(20) {
            0 => 0,
            1 => 1,
            2 => u64::MAX,
            3 => ALLOCATED | (1 << 62),
            4 => ALLOCATED | r.below(1 << 20),
            5 => r.u64(),
            6 => ino.wrapping_add(1),
            _ if direct => ino,
            _ => ALLOCATED | (2 + r.below(64)),
        }
    }

    fn kind(&self, r: &mut Rng, real: u32) -> u32 {
        match r.below(12) {
            0 => libc::S_IFDIR,
            1 => libc::S_IFREG,
            2 => libc::S_IFLNK,
            3 => r.u32(),
            4 => 0,
            _ => real,
        }
    }

    fn lookups(&self, r: &mut Rng) -> u64 {
        match r.below(10) {
            0 => u64::MAX,
            1 => 1 << 40,
            2 => r.u64().max(1),
            _ => 1 + r.below(4),
        }
    }

    fn name(&self, r: &mut Rng, real: &[u8]) -> Vec<u8> {
        match r.below(10) {
            0 | 1 => r.pick(&NAMES).map_or(Vec::new(), |n| n.to_vec()),
            2 => {
                let n = 1 + r.below(300) as usize;
                r.bytes(n).into_iter().map(|b| b.max(1)).collect()
            }
            3 => self.entry(r).map_or(Vec::new(), |e| e.name.clone()),
            _ => real.to_vec(),
        }
    }

    /// A node for survey entry `i`, linked to `parent` (an id already in the state, or 1) by
    /// its real name, unless the dice say otherwise.
    fn node(&self, r: &mut Rng, i: usize, parent: u64, hostile: bool) -> Option<NodeState> {
        let e = self.s.entries.get(i)?;
        let (ino, snapid) = if hostile && r.chance(150) {
            match r.below(4) {
                0 => (r.u64(), NOSNAP),
                1 => (e.ino.wrapping_add(1 + r.below(8)), NOSNAP),
                2 => (e.ino, SNAPDIR),
                _ => (e.ino, r.below(16)),
            }
        } else {
            (e.ino, e.snapid)
        };
        let id = if hostile {
            self.id_for(r, ino, snapid)
        } else if snapid == NOSNAP && ino != 1 {
            ino
        } else {
            ALLOCATED | (2 + r.below(1 << 16))
        };
        Some(NodeState {
            id: id.max(1),
            ino,
            snapid,
            kind: if hostile {
                self.kind(r, e.kind)
            } else {
                e.kind
            },
            lookups: if hostile { self.lookups(r) } else { 1 },
            parent,
            name: if hostile {
                self.name(r, &e.name)
            } else {
                e.name.clone()
            },
        })
    }

    /// Nodes for the path from the export root down to survey entry `i` (each linked to the
    /// previous one by its real name), if `i` lies below the export root.
    fn chain(&self, r: &mut Rng, i: usize) -> Vec<NodeState> {
        let mut path = Vec::new();
        let mut cur = Some(i);
        while let Some(c) = cur {
            if c == self.s.root {
                break;
            }
            path.push(c);
            cur = self.s.entries.get(c).and_then(|e| e.parent);
            if path.len() > 64 {
                return Vec::new();
            }
        }
        if cur != Some(self.s.root) {
            return Vec::new();
        }
        let mut nodes: Vec<NodeState> = Vec::new();
        let mut parent = 1;
        for &c in path.iter().rev() {
            let Some(n) = self.node(r, c, parent, false) else {
                break;
            };
            parent = n.id;
            nodes.push(n);
        }
        nodes
    }

    fn handle(&self, r: &mut Rng, nodes: &[NodeState], fh: u64) -> (HandleState, Option<Opener>) {
        let node = match r.below(10) {
            0 => 1,
            1 => r.u64(),
            _ => r.pick(nodes).map_or(1, |n| n.id),
        };
        let is_dir = node == 1
            || nodes
                .iter()
                .any(|n| n.id == node && n.kind == libc::S_IFDIR);
        let kind = if is_dir != r.chance(150) {
            HandleKind::Dir {
                pos: match r.below(4) {
                    0 => r.u64(),
                    1 => 1 << 28,
                    _ => 0,
                },
            }
        } else {
            let acc = [
                libc::O_RDONLY,
                libc::O_WRONLY,
                libc::O_RDWR,
                libc::O_ACCMODE,
            ];
            let extra = [
                0,
                libc::O_APPEND,
                libc::O_TRUNC,
                libc::O_CREAT | libc::O_EXCL,
                libc::O_DIRECT,
                libc::O_SYNC,
                libc::O_NOFOLLOW,
                libc::O_PATH,
                libc::O_DIRECTORY,
                libc::O_TMPFILE,
            ];
            let oflags = if r.chance(100) {
                r.u32() as i32
            } else {
                r.pick(&acc).copied().unwrap_or(0) | r.pick(&extra).copied().unwrap_or(0)
            };
            HandleKind::File { oflags }
        };
        let opener = match r.below(10) {
            0 => None,
            1 | 2 => Some(Opener { uid: 0, gid: 0 }),
            3 => Some(Opener {
                uid: r.u32(),
                gid: r.u32(),
            }),
            4 => Some(Opener {
                uid: 65534,
                gid: 65534,
            }),
            _ => {
                // The owner of a surveyed file, or someone else.
                let e = self.entry(r);
                let uid = e.map_or(1000, |e| e.uid);
                let gid = e.map_or(1000, |e| e.gid);
                Some(if r.chance(500) {
                    Opener { uid, gid }
                } else {
                    Opener {
                        uid: 1000 + r.below(3) as u32,
                        gid: 1000 + r.below(3) as u32,
                    }
                })
            }
        };
        (HandleState { fh, node, kind }, opener)
    }

    fn generate(&self, r: &mut Rng) -> Generated {
        let mut state = State {
            fuse_capable: if r.chance(900) {
                crate::fuse::guest_init_flags()
            } else {
                r.u64()
            },
            idmap_fingerprint: self.fingerprint,
            root: (self.s.root_ino(), NOSNAP),
            ..State::default()
        };
        let mut expect = Expect::Any;
        let roll = r.below(1000);
        let shape: &'static str = match roll {
            0..=249 => {
                // A chain that holds, mutated or not.
                if let Some(i) = self.inside(r) {
                    state.nodes = self.chain(r, i);
                }
                if r.chance(600) {
                    self.mutate(r, &mut state);
                    "chain-mutated"
                } else {
                    "chain"
                }
            }
            250..=449 => {
                // Outside inodes with every kind of link.
                for _ in 0..1 + r.below(4) {
                    let Some(i) = self.outside(r) else { break };
                    let parent = match r.below(5) {
                        0 => 0,
                        1 => 1,
                        2 => state.nodes.last().map_or(1, |n| n.id),
                        3 => r.u64(),
                        _ => 1,
                    };
                    let hostile = r.chance(300);
                    if let Some(n) = self.node(r, i, parent, hostile) {
                        state.nodes.push(n);
                    }
                }
                if r.chance(300) {
                    // The export's parent, as ".." of the export root.
                    if let Some(p) = self.s.parent.and_then(|p| self.s.entries.get(p)) {
                        state.nodes.push(NodeState {
                            id: p.ino,
                            ino: p.ino,
                            snapid: NOSNAP,
                            kind: libc::S_IFDIR,
                            lookups: 1,
                            parent: 1,
                            name: b"..".to_vec(),
                        });
                    }
                }
                "outside"
            }
            450..=649 => {
                for _ in 0..1 + r.below(12) {
                    let parent = if r.chance(300) {
                        1
                    } else {
                        state.nodes.last().map_or(1, |n| n.id)
                    };
                    let i = r.below(self.s.entries.len() as u64) as usize;
                    if let Some(n) = self.node(r, i, parent, true) {
                        state.nodes.push(n);
                    }
                }
                "mixed"
            }
            650..=849 => {
                if let Some(i) = self.inside(r) {
                    state.nodes = self.chain(r, i);
                }
                if r.chance(300) {
                    if let Some(i) = self.outside(r) {
                        if let Some(n) = self.node(r, i, 1, true) {
                            state.nodes.push(n);
                        }
                    }
                }
                for k in 0..1 + r.below(6) {
                    let fh = match r.below(10) {
                        0 => 0,
                        1 => u64::MAX - k,
                        2 => 1 << 63,
                        _ => 0x1000 + k,
                    };
                    let (h, o) = self.handle(r, &state.nodes, fh);
                    if let Some(o) = o {
                        state.openers.insert(h.fh, o);
                    }
                    state.handles.push(h);
                }
                "handles"
            }
            850..=889 => {
                // Just over (or at) the limits.
                let over = r.below(3);
                if r.chance(500) {
                    let n = self.max_nodes.saturating_sub(1) + over as usize;
                    state.nodes = (0..n as u64)
                        .map(|k| NodeState {
                            id: 0x7000_0000 + k,
                            ino: 0x7000_0000 + k,
                            snapid: NOSNAP,
                            kind: libc::S_IFREG,
                            lookups: 1,
                            parent: 1,
                            name: format!("n{k}").into_bytes(),
                        })
                        .collect();
                } else {
                    state.handles = (0..(self.max_handles as u64 + over))
                        .map(|k| HandleState {
                            fh: 0x1000 + k,
                            node: 1,
                            kind: HandleKind::Dir { pos: 0 },
                        })
                        .collect();
                }
                if over > 0 {
                    expect = Expect::Refused;
                }
                "limits"
            }
            890..=929 => {
                if let Some(i) = self.inside(r) {
                    state.nodes = self.chain(r, i);
                }
                let bytes = state.encode();
                let cut = r.below(bytes.len() as u64) as usize;
                return Generated {
                    bytes: bytes.get(..cut).unwrap_or(&[]).to_vec(),
                    state,
                    expect: Expect::Refused,
                    shape: "truncated",
                    race: false,
                };
            }
            930..=959 => {
                if let Some(i) = self.inside(r) {
                    state.nodes = self.chain(r, i);
                }
                for k in 0..r.below(3) {
                    let (h, _) = self.handle(r, &state.nodes, 0x2000 + k);
                    state.handles.push(h);
                }
                return Generated {
                    bytes: encode_v1(&state),
                    state,
                    expect: Expect::Any,
                    shape: "version-1",
                    race: false,
                };
            }
            960..=979 => {
                if let Some(i) = self.inside(r) {
                    state.nodes = self.chain(r, i);
                }
                match r.below(3) {
                    0 => state.root = (self.outside(r).map_or(1, |i| self.ino(i)), NOSNAP),
                    1 => state.idmap_fingerprint ^= 1 + r.below(u64::MAX - 1),
                    _ => state.root.1 = SNAPDIR,
                }
                expect = Expect::Refused;
                "other-export"
            }
            _ => {
                // Corrupt bytes: refused unless the checksum is computed again (then the
                // contents are just hostile).
                if let Some(i) = self.inside(r) {
                    state.nodes = self.chain(r, i);
                }
                let mut bytes = state.encode();
                let at = 28 + r.below(bytes.len().saturating_sub(28).max(1) as u64) as usize;
                if let Some(b) = bytes.get_mut(at) {
                    *b ^= 1 << r.below(8);
                }
                let resum = r.chance(500);
                if resum {
                    let sum = fingerprint(bytes.get(28..).unwrap_or(&[]));
                    if let Some(s) = bytes.get_mut(20..28) {
                        s.copy_from_slice(&sum.to_le_bytes());
                    }
                }
                return Generated {
                    bytes,
                    state,
                    expect: if resum { Expect::Any } else { Expect::Refused },
                    shape: if resum { "corrupt-resummed" } else { "corrupt" },
                    race: false,
                };
            }
        };
        // A state with a node or a handle the daemon may take: sometimes race it.
        let race = r.chance(100);
        Generated {
            bytes: state.encode(),
            state,
            expect,
            shape,
            race,
        }
    }

    fn ino(&self, i: usize) -> u64 {
        self.s.entries.get(i).map_or(0, |e| e.ino)
    }

    /// One hostile change to a chain that holds.
    fn mutate(&self, r: &mut Rng, state: &mut State) {
        let n = state.nodes.len();
        let pick = r.below(n.max(1) as u64) as usize;
        match r.below(10) {
            0 => {
                // An outside inode under an inside name.
                if let (Some(o), Some(node)) = (self.outside(r), state.nodes.get_mut(pick)) {
                    let ino = self.ino(o);
                    node.ino = ino;
                    node.id = ino;
                }
            }
            1 => {
                if let Some(node) = state.nodes.get_mut(pick) {
                    node.parent = r.u64();
                }
            }
            2 => {
                // A loop: the first node's parent is the last.
                let last = state.nodes.last().map(|x| x.id);
                if let (Some(first), Some(last)) = (state.nodes.first_mut(), last) {
                    first.parent = last;
                }
            }
            3 => {
                if let Some(node) = state.nodes.get_mut(pick) {
                    node.name = self.name(r, &[]);
                }
            }
            4 => {
                if let Some(node) = state.nodes.get_mut(pick) {
                    node.kind = self.kind(r, node.kind);
                }
            }
            5 => {
                // A duplicate of a node under another id, or the same id twice.
                if let Some(mut d) = state.nodes.get(pick).cloned() {
                    if r.chance(500) {
                        d.id = ALLOCATED | (2 + r.below(64));
                    }
                    state.nodes.push(d);
                }
            }
            6 => {
                if let Some(node) = state.nodes.get_mut(pick) {
                    node.snapid = if r.chance(500) { SNAPDIR } else { r.below(8) };
                }
            }
            7 => {
                // The snapshot directory named by another name, or a snapshot under a head
                // directory's name.
                if let Some(node) = state.nodes.get_mut(pick) {
                    node.name = b".snap".to_vec();
                    node.snapid = self.snapdir;
                }
            }
            8 => {
                if let Some(node) = state.nodes.get_mut(pick) {
                    node.id = self.id_for(r, node.ino, node.snapid);
                }
            }
            _ => {
                // "/" under the export root.
                state.nodes.push(NodeState {
                    id: ALLOCATED | 2,
                    ino: 1,
                    snapid: NOSNAP,
                    kind: libc::S_IFDIR,
                    lookups: 1,
                    parent: if r.chance(500) { 1 } else { 0 },
                    name: self.name(r, b".."),
                });
            }
        }
    }
}

/// A version 1 blob of `s` (no opener ids; names cut to what version 1 allowed).
fn encode_v1(s: &State) -> Vec<u8> {
    let mut body = Vec::new();
    for v in [s.fuse_capable, s.idmap_fingerprint, s.root.0, s.root.1] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    body.extend_from_slice(&(s.nodes.len() as u32).to_le_bytes());
    for n in &s.nodes {
        for v in [n.id, n.ino, n.snapid] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.extend_from_slice(&n.kind.to_le_bytes());
        body.extend_from_slice(&n.lookups.to_le_bytes());
        body.extend_from_slice(&n.parent.to_le_bytes());
        let name = n.name.get(..n.name.len().min(4096)).unwrap_or(&[]);
        body.extend_from_slice(&(name.len() as u16).to_le_bytes());
        body.extend_from_slice(name);
    }
    body.extend_from_slice(&(s.handles.len() as u32).to_le_bytes());
    for h in &s.handles {
        body.extend_from_slice(&h.fh.to_le_bytes());
        body.extend_from_slice(&h.node.to_le_bytes());
        match h.kind {
            HandleKind::File { oflags } => {
                body.push(1);
                body.extend_from_slice(&oflags.to_le_bytes());
            }
            HandleKind::Dir { pos } => {
                body.push(2);
                body.extend_from_slice(&pos.to_le_bytes());
            }
        }
    }
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&fingerprint(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// The seed of state number `k` of a run: each state on its own, for replays.
fn state_seed(seed: u64, k: u64) -> u64 {
    let mut r = Rng::new(seed ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    r.u64()
}

#[derive(Debug, Default)]
pub struct Summary {
    pub states: u64,
    pub accepted: u64,
    pub refused: u64,
    pub by_shape: HashMap<&'static str, (u64, u64)>,
    pub requests: u64,
    pub served_nodes: u64,
    pub listed: u64,
    pub handles_used: u64,
    pub judged: u64,
    pub escapes: u64,
    pub privilege: u64,
    pub wrongly_taken: u64,
    pub lost: u64,
    pub malformed: u64,
    pub reconnects: u64,
    pub dead: bool,
    pub findings: HashMap<&'static str, u64>,
    pub elapsed: Duration,
}

impl Summary {
    pub fn failed(&self) -> bool {
        self.dead
            || self.escapes > 0
            || self.privilege > 0
            || self.wrongly_taken > 0
            || self.lost > 0
            || self.malformed > 0
    }
}

/// What the probing of one taken state found.
struct Probe<'a> {
    s: &'a mut Session,
    oracle: &'a mut Oracle,
    survey: &'a Survey,
    sum: &'a mut Summary,
    /// Findings of this state (kind, text).
    found: Vec<(&'static str, String)>,
}

impl Probe<'_> {
    fn request(&mut self, opcode: u32, nodeid: u64, body: &[&[u8]]) -> Option<Vec<u8>> {
        let unique = self.s.next_unique();
        let h = Header {
            opcode,
            unique,
            nodeid,
            ..Header::default()
        };
        self.sum.requests += 1;
        match self.s.fuse(h, body) {
            Ok(Answer::Done { reply, .. }) => match wire::out_header(&reply) {
                Some((len, err, u)) if u == unique && (-4095..=0).contains(&err) => {
                    if len as usize != reply.len() && err == 0 {
                        self.found.push((
                            "malformed",
                            format!(
                                "opcode {opcode} node {nodeid:#x}: header length {len}, {} bytes written",
                                reply.len()
                            ),
                        ));
                    }
                    Some(reply)
                }
                other => {
                    self.found.push((
                        "malformed",
                        format!("opcode {opcode} node {nodeid:#x}: reply header {other:?}"),
                    ));
                    None
                }
            },
            Ok(Answer::Lost) => {
                self.found.push((
                    "lost",
                    format!("opcode {opcode} node {nodeid:#x}: not answered in time"),
                ));
                None
            }
            Ok(Answer::Bogus(id)) => {
                self.found.push((
                    "malformed",
                    format!("opcode {opcode}: used ring gave back id {id} never published"),
                ));
                None
            }
            Err(e) => {
                self.found
                    .push(("dead", format!("opcode {opcode}: the device failed: {e}")));
                None
            }
        }
    }

    /// Judge every inode number a successful reply to `opcode` hands out.
    fn judge(&mut self, opcode: u32, reply: &[u8], why: &str) {
        for (node, ino) in wire::handed_out(opcode, reply) {
            self.sum.judged += 1;
            if opcode == wire::FUSE_READDIRPLUS {
                self.sum.listed += 1;
            }
            if let Verdict::Outside(path) = self.oracle.check(ino) {
                self.found.push((
                    "escape",
                    format!("{why}: node {node:#x} inode {ino:#x} lies outside the export: {path}"),
                ));
            }
        }
    }

    fn ok(reply: &Option<Vec<u8>>) -> bool {
        reply
            .as_deref()
            .and_then(wire::out_header)
            .is_some_and(|h| h.1 == 0)
    }

    fn read_in(fh: u64, offset: u64, size: u32) -> Vec<u8> {
        let mut b = Vec::with_capacity(40);
        b.extend_from_slice(&fh.to_le_bytes());
        b.extend_from_slice(&offset.to_le_bytes());
        b.extend_from_slice(&size.to_le_bytes());
        b.extend_from_slice(&[0u8; 20]);
        b
    }

    fn list(&mut self, node: u64, fh: u64, why: &str) -> bool {
        let r = self.request(
            wire::FUSE_READDIRPLUS,
            node,
            &[&Self::read_in(fh, 0, 64 * 1024)],
        );
        if let Some(reply) = &r {
            self.judge(wire::FUSE_READDIRPLUS, reply, why);
        }
        Self::ok(&r)
    }

    /// Probe a node id the state named: GETATTR, and as a directory OPENDIR + READDIRPLUS
    /// and LOOKUP "..", as a file OPEN + READ.
    fn node(&mut self, id: u64) {
        let r = self.request(wire::FUSE_GETATTR, id, &[&[0u8; 16]]);
        if let Some(reply) = &r {
            self.judge(wire::FUSE_GETATTR, reply, "GETATTR of a restored node");
        }
        if !Self::ok(&r) {
            return;
        }
        self.sum.served_nodes += 1;
        let mut open_in = [0u8; 8];
        open_in[..4].copy_from_slice(&(libc::O_RDONLY as u32).to_le_bytes());
        let r = self.request(wire::FUSE_OPENDIR, id, &[&open_in]);
        if let Some(fh) = r
            .as_deref()
            .and_then(|reply| wire::handle_of(wire::FUSE_OPENDIR, reply))
        {
            self.list(id, fh, "READDIRPLUS of a restored node");
            let mut rel = [0u8; 24];
            rel[..8].copy_from_slice(&fh.to_le_bytes());
            self.request(wire::FUSE_RELEASEDIR, id, &[&rel]);
            let r = self.request(wire::FUSE_LOOKUP, id, &[b"..\0"]);
            if let Some(reply) = &r {
                self.judge(wire::FUSE_LOOKUP, reply, "LOOKUP \"..\" of a restored node");
            }
            return;
        }
        let r = self.request(wire::FUSE_OPEN, id, &[&open_in]);
        if let Some(fh) = r
            .as_deref()
            .and_then(|reply| wire::handle_of(wire::FUSE_OPEN, reply))
        {
            self.request(wire::FUSE_READ, id, &[&Self::read_in(fh, 0, 64)]);
            let mut rel = [0u8; 24];
            rel[..8].copy_from_slice(&fh.to_le_bytes());
            self.request(wire::FUSE_RELEASE, id, &[&rel]);
        }
    }

    /// Use a handle the state named; judge what it reaches and as whom.
    fn handle(&mut self, h: &HandleState, opener: Option<Opener>) {
        let (node, fh) = (h.node, h.fh);
        let read = self.request(wire::FUSE_READ, node, &[&Self::read_in(fh, 0, 64)]);
        let mut w = Vec::with_capacity(41);
        w.extend_from_slice(&fh.to_le_bytes());
        // Past the data the tree's files hold: the fuzzer's writes change no byte a test
        // reads, only sizes.
        w.extend_from_slice(&(1u64 << 20).to_le_bytes());
        w.extend_from_slice(&1u32.to_le_bytes());
        w.extend_from_slice(&[0u8; 20]);
        w.push(b'z');
        let write = self.request(wire::FUSE_WRITE, node, &[&w]);
        let listed = self.list(node, fh, "READDIRPLUS through a restored handle");
        let (read, write) = (Self::ok(&read), Self::ok(&write));
        if !(read || write || listed) {
            return;
        }
        self.sum.handles_used += 1;
        // What it reached: the node's inode, judged.
        let attr = self.request(wire::FUSE_GETATTR, node, &[&[0u8; 16]]);
        let ino = attr.as_deref().and_then(|reply| {
            wire::handed_out(wire::FUSE_GETATTR, reply)
                .first()
                .map(|p| p.1)
        });
        if let Some(reply) = &attr {
            self.judge(
                wire::FUSE_GETATTR,
                reply,
                "GETATTR of a restored handle's node",
            );
        }
        // As whom: the surveyed owner and mode of that inode against the opener.
        let Some(e) = ino.and_then(|i| {
            self.survey
                .by_vino
                .get(&(i, NOSNAP))
                .and_then(|&k| self.survey.entries.get(k))
        }) else {
            return;
        };
        let used = [(read || listed, 4u32, "read"), (write, 2u32, "write")];
        for (done, bit, what) in used {
            if !done {
                continue;
            }
            let allowed = match opener {
                None => false,
                Some(o) => {
                    o.uid == 0
                        || o.uid == e.uid
                        || (o.gid == e.gid && e.mode & (bit << 3) != 0)
                        || e.mode & bit != 0
                }
            };
            if !allowed {
                self.found.push((
                    "privilege",
                    format!(
                        "handle {fh:#x} of node {node:#x} could {what} inode {:#x} (owner {}:{} mode {:o}) as opener {opener:?}",
                        e.ino, e.uid, e.gid, e.mode
                    ),
                ));
            }
        }
    }
}

pub fn run(opts: &StatesOpts) -> Result<Summary, String> {
    let mount = MountBuilder::new(Some(&opts.client_id))
        .and_then(|b| b.conf_read_file(Some(&opts.ceph_conf)))
        .and_then(|b| b.mount("/"))
        .map_err(|e| format!("mounting \"/\" for the survey: {e}"))?;
    let survey = survey(&mount, &opts.export)?;
    let snapdir = survey
        .entries
        .iter()
        .find(|e| e.snapid == SNAPDIR)
        .map_or(SNAPDIR, |e| e.snapid);
    drop(mount);
    let inside = survey.entries.iter().filter(|e| e.inside).count();
    println!(
        "# hostile states: surveyed {} inodes ({} inside the export {:#x}, {} snapshot inodes)",
        survey.entries.len(),
        inside,
        survey.root_ino(),
        survey.entries.iter().filter(|e| e.snapid != NOSNAP).count()
    );
    let mut oracle = Oracle::new(&opts.ceph_conf, &opts.client_id, &opts.export)
        .map_err(|e| super::error_chain(&e))?;
    let gen = Gen {
        s: &survey,
        fingerprint: fingerprint(
            format!("{:?}", ceph_virtiofsd::idmap::IdMapping::default()).as_bytes(),
        ),
        max_nodes: opts.max_nodes,
        max_handles: opts.max_handles,
        snapdir,
    };
    let connect = |sum: &mut Summary| -> Result<Session, String> {
        sum.reconnects += 1;
        let dev = Device::connect_with(&opts.socket, true, Some(VHOST_REPLY_TIMEOUT))
            .map_err(|e| super::error_chain(&e))?;
        Ok(Session::new(dev, opts.timeout))
    };
    let mut sum = Summary::default();
    let started = Instant::now();
    let mut session: Option<Session> = None;
    let mut printed: HashMap<&'static str, u64> = HashMap::new();
    let replay = |k: u64| {
        format!(
            "ceph-virtiofsd-bench hostile states --socket {} --ceph-conf {} --client-id {} --export {} --max-nodes {} --max-handles {} --seed {} --first {k} --states 1",
            opts.socket.display(),
            opts.ceph_conf.display(),
            opts.client_id,
            opts.export,
            opts.max_nodes,
            opts.max_handles,
            opts.seed
        )
    };
    let end = opts.first.saturating_add(opts.states);
    for k in opts.first..end {
        let mut r = Rng::new(state_seed(opts.seed, k));
        let g = gen.generate(&mut r);
        sum.states += 1;
        let mut found: Vec<(&'static str, String)> = Vec::new();
        let s = match session.take() {
            Some(s) => s,
            None => match connect(&mut sum) {
                Ok(mut s) if opts.init_first => match s.init() {
                    Ok(0) => s,
                    other => {
                        sum.dead = true;
                        println!("FINDING dead: state {k}: FUSE_INIT answered {other:?}");
                        break;
                    }
                },
                Ok(s) => s,
                Err(e) => {
                    sum.dead = true;
                    println!("FINDING dead: state {k}: the daemon takes no new frontend: {e}");
                    break;
                }
            },
        };
        let mut s = s;
        let taken = match load(&mut s, &g, &survey) {
            Ok(taken) => taken,
            Err(e) => {
                found.push(("dead", format!("the LOAD failed on the way: {e}")));
                false
            }
        };
        let counts = sum.by_shape.entry(g.shape).or_default();
        if taken {
            counts.0 += 1;
            sum.accepted += 1;
        } else {
            counts.1 += 1;
            sum.refused += 1;
        }
        if taken && opts.init_first {
            sum.wrongly_taken += 1;
            found.push((
                "refusal",
                format!(
                    "a {} state was taken after the connection's FUSE_INIT (the guest's session)",
                    g.shape
                ),
            ));
        } else if taken && g.expect == Expect::Refused {
            sum.wrongly_taken += 1;
            found.push((
                "refusal",
                format!("a {} state the daemon must refuse was taken", g.shape),
            ));
        }
        let keep = if taken {
            let mut p = Probe {
                s: &mut s,
                oracle: &mut oracle,
                survey: &survey,
                sum: &mut sum,
                found: Vec::new(),
            };
            let mut ids: Vec<u64> = vec![1];
            ids.extend(g.state.nodes.iter().map(|n| n.id));
            ids.dedup();
            for id in ids.into_iter().take(PROBE_NODES) {
                p.node(id);
            }
            for h in g.state.handles.iter().take(PROBE_HANDLES) {
                p.handle(h, g.state.openers.get(&h.fh).copied());
            }
            found.append(&mut p.found);
            // Taken: the connection is latched; the next state needs a new frontend.
            false
        } else {
            // Refused: the next state may use this frontend, unless requests raced this one
            // (their nodes would make the next LOAD find a session).
            !g.race
        };
        if let Some(pid) = opts.pid {
            if !super::fuzz::running(pid) {
                found.push(("dead", format!("the daemon (pid {pid}) is gone")));
            }
        }
        let mut fatal = false;
        for (kind, text) in found {
            *sum.findings.entry(kind).or_default() += 1;
            match kind {
                "escape" => sum.escapes += 1,
                "privilege" => sum.privilege += 1,
                "lost" => sum.lost += 1,
                "malformed" => sum.malformed += 1,
                "dead" => {
                    sum.dead = true;
                    fatal = true;
                }
                _ => {}
            }
            let n = printed.entry(kind).or_default();
            *n += 1;
            if *n <= opts.print_per_kind {
                let hex = wire::hex(g.bytes.get(..g.bytes.len().min(2048)).unwrap_or(&[]));
                println!(
                    "FINDING {kind}: state {k} ({}): {text}\n  replay: {}\n  state ({} bytes): {hex}{}",
                    g.shape,
                    replay(k),
                    g.bytes.len(),
                    if g.bytes.len() > 2048 { "..." } else { "" }
                );
            }
        }
        if fatal {
            break;
        }
        if keep {
            session = Some(s);
        }
        if (k + 1 - opts.first) % 100_000 == 0 {
            println!(
                "# hostile states: {} states, {} taken, {} s, findings {:?}",
                sum.states,
                sum.accepted,
                started.elapsed().as_secs(),
                sum.findings
            );
        }
    }
    drop(session);
    // The daemon keeps serving: a fresh frontend's FUSE session works.
    if !sum.dead {
        match connect(&mut sum).and_then(|mut s| {
            let e = s.init().map_err(|e| super::error_chain(&e))?;
            let alive = s.alive().map_err(|e| super::error_chain(&e))?;
            Ok(e == 0 && alive)
        }) {
            Ok(true) => {}
            Ok(false) => {
                sum.dead = true;
                println!("FINDING dead: after the run, a fresh session's INIT or GETATTR failed");
            }
            Err(e) => {
                sum.dead = true;
                println!("FINDING dead: after the run, no fresh session: {e}");
            }
        }
    }
    sum.elapsed = started.elapsed();
    Ok(sum)
}

/// Send `g` as a LOAD (racing requests against it when `g.race`): whether the daemon took it.
fn load(s: &mut Session, g: &Generated, survey: &Survey) -> Result<bool, String> {
    let mut pipe = s.dev.start_load().map_err(|e| super::error_chain(&e))?;
    // The daemon reads until EOF on a thread of its own; a write error (it gave up reading)
    // shows in the check.
    let _ = pipe.write_all(&g.bytes);
    drop(pipe);
    if g.race {
        // Requests while the daemon resolves the state: a name of the export root, and node 1.
        let name = survey
            .entries
            .iter()
            .find(|e| e.parent == Some(survey.root) && e.inside)
            .map(|e| e.name.clone())
            .unwrap_or_else(|| b"x".to_vec());
        let mut lookup = name;
        lookup.push(0);
        for (opcode, body) in [
            (wire::FUSE_LOOKUP, lookup),
            (wire::FUSE_GETATTR, vec![0u8; 16]),
        ] {
            let unique = s.next_unique();
            let h = Header {
                opcode,
                unique,
                nodeid: 1,
                ..Header::default()
            };
            let _ = s.fuse(h, &[&body]);
        }
    }
    match s.dev.check_state() {
        Ok(()) => Ok(true),
        // The daemon's answer "not taken" (a non-zero CHECK_DEVICE_STATE reply).
        Err(super::device::DeviceError::Vhost(
            _,
            vhost::Error::VhostUserProtocol(vhost::vhost_user::Error::BackendInternalError),
        )) => Ok(false),
        Err(e) => Err(super::error_chain(&e)),
    }
}

/// Print the run's figures; the last line is the one tests parse.
pub fn print_summary(s: &Summary, seed: u64) {
    let mut shapes: Vec<_> = s.by_shape.iter().collect();
    shapes.sort();
    println!(
        "# hostile states: by shape (taken/refused): {}",
        shapes
            .iter()
            .map(|(k, (a, r))| format!("{k}={a}/{r}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut f: Vec<_> = s.findings.iter().collect();
    f.sort();
    println!(
        "hostile states: seed={seed} states={} taken={} refused={} requests={} served_nodes={} listed={} handles_used={} judged={} escapes={} privilege={} wrongly_taken={} lost={} malformed={} dead={} reconnects={} secs={:.1} rate={:.0}/s findings={}",
        s.states,
        s.accepted,
        s.refused,
        s.requests,
        s.served_nodes,
        s.listed,
        s.handles_used,
        s.judged,
        s.escapes,
        s.privilege,
        s.wrongly_taken,
        s.lost,
        s.malformed,
        s.dead,
        s.reconnects,
        s.elapsed.as_secs_f64(),
        s.states as f64 / s.elapsed.as_secs_f64().max(1e-9),
        f.iter()
            .map(|(k, n)| format!("{k}:{n}"))
            .collect::<Vec<_>>()
            .join(",")
    );
}
