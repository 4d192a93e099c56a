//! `hostile fuzz`: drive a daemon with generated requests and chains, many in flight, and judge
//! every answer:
//!
//! - the daemon stays alive and answering (process not gone, a GETATTR of node 1 answered at
//!   every checkpoint and at the end, no chain lost);
//! - no escape: every inode number an entry or attr reply hands out is inside the export
//!   (the [`Oracle`], judging on its own thread: see [`Judging`]);
//! - replies are well-formed: a written length within what was offered, a reply header whose
//!   length is the written length, an errno in 0..=4095, the request's unique echoed;
//! - bounded: at each checkpoint the fuzzer forgets every node and releases every handle it
//!   was given, then the daemon's node and handle tables (its metrics endpoint) and its RSS
//!   (/proc) must stay under the given bounds.
//!
//! Feedback: a request whose (opcode, errno) pair is new joins a corpus that later requests
//! are mutated from (a cheap coverage signal that needs no instrumented build).
//!
//! Each finding is printed with its request number, the seed and the chain as `hostile serve`
//! tokens, which replays that one request.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::device::{Buf, DescSpec, DESCS_PER_SLOT};
use super::gen::{self, Case, Known, Rng};
use super::judging::{Escape, Job, Judging, Tally};
use super::oracle::Oracle;
use super::session::{Session, HIPRIO_QUEUE, REQUEST_QUEUE};
use super::wire::{self, Header};

#[derive(Debug, Clone)]
pub struct FuzzOpts {
    pub requests: u64,
    pub seed: u64,
    pub depth: usize,
    pub checkpoint_every: u64,
    pub pid: Option<u32>,
    pub metrics_socket: Option<PathBuf>,
    pub max_rss_mib: u64,
    pub max_nodes: u64,
    pub max_handles: u64,
    /// A chain not returned within this is lost.
    pub timeout: Duration,
    /// Findings of one kind printed in full (the rest only counted).
    pub print_per_kind: u64,
    /// Per mille of generated requests that change the tree.
    pub mutating_per_mille: u64,
    /// Inode numbers queued for the oracle at most (the sender waits when it is full).
    pub oracle_queue: usize,
}

#[derive(Debug, Default)]
pub struct Summary {
    pub sent: u64,
    pub answered: u64,
    pub escapes: u64,
    /// Tentative escapes (from the oracle's cached walk) a fresh client overturned.
    pub oracle_overturned: u64,
    pub lost: u64,
    pub malformed_replies: u64,
    pub unanswered_proper: u64,
    pub bound_violations: u64,
    pub dead: bool,
    pub pairs: usize,
    pub max_rss_kib: u64,
    pub max_nodes: u64,
    pub max_handles: u64,
    /// Inode numbers handed to the oracle's thread, and what it did with them (every one
    /// judged unless it died: see `oracle_unjudged`).
    pub oracle_queued: u64,
    pub oracle: Tally,
    /// Jobs queued but never judged (the judging thread died): a failure.
    pub oracle_unjudged: u64,
    /// Sends that found the oracle's queue full, and how long the fuzzer waited for room.
    /// While it waits it does not listen, so that is not counted as the daemon's silence.
    pub oracle_queue_full: u64,
    pub oracle_queue_wait: Duration,
    pub oracle_queue_wait_max: Duration,
    /// How long the end of the run waited for the judgements still queued (not in `elapsed`).
    pub oracle_tail: Duration,
    pub elapsed: Duration,
    pub findings: HashMap<&'static str, u64>,
    pub kinds: HashMap<&'static str, u64>,
    pub unanswered_by_op: HashMap<u32, u64>,
}

impl Summary {
    pub fn failed(&self) -> bool {
        self.dead
            || self.escapes > 0
            || self.lost > 0
            || self.malformed_replies > 0
            || self.bound_violations > 0
            || self.oracle_unjudged > 0
    }
}

struct InFlight {
    case: Case,
    index: u64,
    published: super::device::Published,
    offered: u64,
}

/// The daemon's resident set, from /proc.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Is process `pid` there and not a zombie?
pub fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|st| st != "Z" && st != "X"),
        Err(_) => false,
    }
}

/// One sample of the daemon's Prometheus text over its metrics unix socket.
pub fn scrape(socket: &std::path::Path) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out.split_once("\r\n\r\n")?.1.to_owned())
}

pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.rsplit_once(' ').filter(|(s, _)| *s == series))
        .and_then(|(_, v)| v.parse().ok())
}

pub struct Fuzzer<'a> {
    s: &'a mut Session,
    judging: Judging,
    o: FuzzOpts,
    rng: Rng,
    known: Known,
    /// Every handle we were given, with the node it was opened on: a RELEASE must name both
    /// (the daemon refuses a handle under another node id with EBADF).
    owned: Vec<(u64, u64)>,
    /// Lookup counts of the node ids we were handed (forgotten at checkpoints).
    held: HashMap<u64, u64>,
    seen_nodes: HashSet<u64>,
    /// Inode numbers already queued for the oracle (cleared when large).
    judged: HashSet<u64>,
    pairs: HashSet<(u32, i32)>,
    corpus: Vec<Case>,
    inflight: Vec<Option<InFlight>>,
    hi_inflight: Vec<Option<u64>>,
    /// Slots whose chain was lost: not reused unless it comes back.
    retired: HashSet<usize>,
    sum: Summary,
}

impl std::fmt::Debug for Fuzzer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fuzzer").finish_non_exhaustive()
    }
}

const CORPUS_CAP: usize = 1024;
/// The least time the oracle may take for one judgement before it counts as stuck.
const ORACLE_STUCK: Duration = Duration::from_secs(60);

impl<'a> Fuzzer<'a> {
    /// A fuzzer over session `s`; `oracle` moves to a judging thread of its own.
    pub fn new(s: &'a mut Session, oracle: Oracle, o: FuzzOpts) -> std::io::Result<Self> {
        let slots = s.dev.slots(REQUEST_QUEUE);
        let hi = s.dev.slots(HIPRIO_QUEUE);
        // An oracle request the MDS holds this long is a stuck oracle, not a slow one (the MDS
        // answers held requests at its next tick, every few seconds).
        let judging = Judging::start(oracle, o.oracle_queue, (o.timeout * 12).max(ORACLE_STUCK))?;
        Ok(Fuzzer {
            rng: Rng::new(o.seed),
            s,
            judging,
            o,
            known: Known::new(),
            owned: Vec::new(),
            held: HashMap::new(),
            seen_nodes: HashSet::new(),
            judged: HashSet::new(),
            pairs: HashSet::new(),
            corpus: Vec::new(),
            inflight: (0..slots).map(|_| None).collect(),
            hi_inflight: vec![None; hi],
            retired: HashSet::new(),
            sum: Summary::default(),
        })
    }

    fn finding(&mut self, kind: &'static str, index: u64, detail: &str, case: Option<&Case>) {
        let n = self.sum.findings.entry(kind).or_insert(0);
        *n += 1;
        if *n <= self.o.print_per_kind {
            println!(
                "FINDING {kind} at request #{index} (seed {}): {detail}",
                self.o.seed
            );
            if let Some(c) = case {
                println!(
                    "  replay (one request, `hostile serve`): chain {} {}",
                    c.queue,
                    gen::tokens(&c.descs)
                );
            }
            println!(
                "  replay (the run up to it): ceph-virtiofsd-bench hostile fuzz --seed {} --requests {} --depth 1 ...",
                self.o.seed,
                index + 1
            );
        }
    }

    pub fn run(mut self) -> Summary {
        let start = Instant::now();
        let mut last_report = Instant::now();
        let mut next_checkpoint = self.o.checkpoint_every;
        let mut issued = 0u64;
        let depth = self.o.depth.clamp(1, self.inflight.len());
        let mut done = Vec::new();
        // How long the fuzzer has listened without a chain coming back. Only time spent waiting
        // on the used ring counts: while the fuzzer waits for room in the oracle's queue (a
        // judgement can wait seconds on the MDS), the daemon's answers pile up unseen, and
        // counting that time once declared answered chains lost.
        let mut silence = Duration::ZERO;
        while issued < self.o.requests || self.inflight.iter().any(Option::is_some) {
            // Fill up to `depth` in flight, but stop at a checkpoint until all came back.
            let at_checkpoint = issued >= next_checkpoint;
            let mut published = false;
            while issued < self.o.requests && !at_checkpoint {
                let busy = self.inflight.iter().filter(|x| x.is_some()).count();
                if busy >= depth {
                    break;
                }
                let unique = self.s.next_unique();
                let case = gen::next(
                    &mut self.rng,
                    &self.known,
                    unique,
                    self.s.dev.mem_size,
                    &self.corpus,
                    self.o.mutating_per_mille,
                );
                if !self.publish(case, issued) {
                    break;
                }
                issued += 1;
                published = true;
            }
            if published {
                if let Err(e) = self.s.dev.flush(REQUEST_QUEUE) {
                    self.finding("transport", issued, &e.to_string(), None);
                    self.sum.dead = true;
                    break;
                }
            }
            self.reap_hiprio();
            done.clear();
            let listening = Instant::now();
            if let Err(e) = self
                .s
                .dev
                .wait(REQUEST_QUEUE, Duration::from_millis(200), &mut done)
            {
                self.finding("transport", issued, &e.to_string(), None);
                self.sum.dead = true;
                break;
            }
            if done.is_empty() {
                silence += listening.elapsed();
            } else {
                silence = Duration::ZERO;
            }
            for &(id, written) in &done.clone() {
                self.complete(id, written);
            }
            for e in self.judging.escapes() {
                self.escape(e);
            }
            let busy = self.inflight.iter().filter(|x| x.is_some()).count();
            if busy > 0 && silence > self.o.timeout {
                // Whatever is still out is lost: report each, never reuse their slots.
                let lost: Vec<usize> = (0..self.inflight.len())
                    .filter(|&i| self.inflight[i].is_some())
                    .collect();
                for i in lost {
                    if let Some(f) = self.inflight[i].take() {
                        self.sum.lost += 1;
                        let detail = format!(
                            "{} (opcode {}) not returned within {:?}",
                            f.case.kind, f.case.opcode, self.o.timeout
                        );
                        self.finding("lost", f.index, &detail, Some(&f.case));
                        self.retire_slot(i);
                    }
                }
                if !self.o.pid.map_or(true, running) {
                    self.sum.dead = true;
                    break;
                }
                silence = Duration::ZERO;
            }
            if at_checkpoint && self.inflight.iter().all(Option::is_none) {
                if !self.checkpoint(issued) {
                    break;
                }
                next_checkpoint = issued + self.o.checkpoint_every;
            }
            if last_report.elapsed() > Duration::from_secs(30) {
                last_report = Instant::now();
                let secs = start.elapsed().as_secs_f64().max(1e-9);
                println!(
                    "# hostile fuzz: {issued} requests, {:.0}/s, {} (opcode, errno) pairs, corpus {}, findings {}",
                    issued as f64 / secs,
                    self.pairs.len(),
                    self.corpus.len(),
                    self.sum.findings.values().sum::<u64>()
                );
            }
            if self.retired.len() >= self.inflight.len() {
                self.finding(
                    "lost",
                    issued,
                    "every slot lost: the daemon returns nothing",
                    None,
                );
                self.sum.dead = true;
                break;
            }
        }
        self.sum.sent = issued;
        if !self.sum.dead {
            self.checkpoint(issued);
        }
        self.sum.elapsed = start.elapsed();
        self.finish_judging();
        self.sum.pairs = self.pairs.len();
        self.sum
    }

    /// Wait for the oracle's last judgements (the run's rate is measured without this wait).
    fn finish_judging(&mut self) {
        self.sum.oracle_queued = self.judging.queued;
        self.sum.oracle_queue_full = self.judging.full;
        self.sum.oracle_queue_wait = self.judging.wait;
        self.sum.oracle_queue_wait_max = self.judging.wait_max;
        let t = Instant::now();
        let finished = self.judging.finish();
        self.sum.oracle_tail = t.elapsed();
        match finished {
            Ok((tally, escapes)) => {
                for e in escapes {
                    self.escape(e);
                }
                self.sum.oracle_unjudged = self.sum.oracle_queued.saturating_sub(tally.judged);
                self.sum.oracle_overturned = tally.overturned;
                self.sum.oracle = tally;
            }
            Err(e) => {
                self.sum.oracle_unjudged = self.sum.oracle_queued;
                self.finding("oracle", self.sum.sent, &e, None);
            }
        }
        if self.sum.oracle_unjudged > 0 {
            let d = format!(
                "{} of {} inode numbers queued for the oracle were never judged",
                self.sum.oracle_unjudged, self.sum.oracle_queued
            );
            self.finding("oracle-unjudged", self.sum.sent, &d, None);
        }
    }

    fn escape(&mut self, e: Escape) {
        self.sum.escapes += 1;
        self.finding("escape", e.index, &e.why, Some(&e.case));
    }

    fn retire_slot(&mut self, i: usize) {
        self.retired.insert(i);
    }

    fn publish(&mut self, case: Case, index: u64) -> bool {
        if case.queue == HIPRIO_QUEUE {
            let Some(slot) = self.hi_inflight.iter().position(Option::is_none) else {
                return true; // hiprio full: drop this one, the next will do
            };
            match self.s.dev.publish(HIPRIO_QUEUE, slot, &case.descs) {
                Ok(_) => {
                    self.hi_inflight[slot] = Some(index);
                    self.s.reserve(HIPRIO_QUEUE, slot, true);
                    let _ = self.s.dev.flush(HIPRIO_QUEUE);
                    *self.sum.kinds.entry(case.kind).or_insert(0) += 1;
                }
                Err(e) => self.finding("generator", index, &e.to_string(), Some(&case)),
            }
            return true;
        }
        let Some(slot) = (0..self.inflight.len())
            .find(|&i| self.inflight[i].is_none() && !self.retired.contains(&i))
        else {
            return false;
        };
        match self.s.dev.publish(REQUEST_QUEUE, slot, &case.descs) {
            Ok(p) => {
                let offered =
                    p.writable.iter().map(|w| u64::from(w.1)).sum::<u64>() + raw_writable(&case);
                *self.sum.kinds.entry(case.kind).or_insert(0) += 1;
                self.s.reserve(REQUEST_QUEUE, slot, true);
                self.inflight[slot] = Some(InFlight {
                    case,
                    index,
                    published: p,
                    offered,
                });
                true
            }
            Err(e) => {
                self.finding("generator", index, &e.to_string(), Some(&case));
                true
            }
        }
    }

    fn reap_hiprio(&mut self) {
        let mut done = Vec::new();
        if self.s.dev.reap(HIPRIO_QUEUE, &mut done).is_err() {
            return;
        }
        for (id, _) in done {
            let slot = (id / u32::from(DESCS_PER_SLOT)) as usize;
            match self.hi_inflight.get_mut(slot) {
                Some(x @ Some(_)) if id % u32::from(DESCS_PER_SLOT) == 0 => {
                    *x = None;
                    self.s.reserve(HIPRIO_QUEUE, slot, false);
                }
                _ => {
                    self.sum.malformed_replies += 1;
                    self.finding("bogus-used-id", 0, &format!("hiprio used id {id}"), None);
                }
            }
        }
    }

    fn complete(&mut self, id: u32, written: u32) {
        let slot = (id / u32::from(DESCS_PER_SLOT)) as usize;
        let Some(f) = (id % u32::from(DESCS_PER_SLOT) == 0)
            .then(|| self.inflight.get_mut(slot).and_then(Option::take))
            .flatten()
        else {
            if self.retired.remove(&slot) {
                self.s.reserve(REQUEST_QUEUE, slot, false);
                return; // a lost chain came back late
            }
            self.sum.malformed_replies += 1;
            self.finding(
                "bogus-used-id",
                0,
                &format!("used id {id} was not in flight"),
                None,
            );
            return;
        };
        self.sum.answered += 1;
        self.s.reserve(REQUEST_QUEUE, slot, false);
        let case = &f.case;
        if u64::from(written) > f.offered {
            self.sum.malformed_replies += 1;
            let d = format!("claims {written} bytes written, {} offered", f.offered);
            let c = case.clone();
            self.finding("overlong-reply", f.index, &d, Some(&c));
            return;
        }
        if written == 0 {
            if case.proper {
                self.sum.unanswered_proper += 1;
                *self.sum.unanswered_by_op.entry(case.opcode).or_insert(0) += 1;
            }
            self.note_pair(case, -1000);
            return;
        }
        let Ok(reply) = self.s.dev.reply(&f.published, written) else {
            return;
        };
        // Raw writable descriptors (outside our areas) cannot be read back; judge what we have.
        let Some((len, error, unique)) = wire::out_header(&reply) else {
            if case.proper {
                self.sum.malformed_replies += 1;
                let c = case.clone();
                self.finding(
                    "short-reply",
                    f.index,
                    &format!("{written} bytes"),
                    Some(&c),
                );
            }
            return;
        };
        let mut bad = Vec::new();
        if reply.len() as u64 == u64::from(written) && len != written {
            bad.push(format!("header len {len}, {written} written"));
        }
        if !(-4095..=0).contains(&error) {
            bad.push(format!("error {error}"));
        }
        if let Some(u) = case.unique {
            if unique != u && case.proper {
                bad.push(format!("unique {unique}, request had {u}"));
            }
        }
        if !bad.is_empty() {
            self.sum.malformed_replies += 1;
            let c = case.clone();
            self.finding("malformed-reply", f.index, &bad.join("; "), Some(&c));
            return;
        }
        self.note_pair(case, error);
        if error != 0 {
            return;
        }
        let opcode = case.opcode;
        for (node, ino) in wire::handed_out(opcode, &reply) {
            if node != 0 {
                *self.held.entry(node).or_insert(0) += 1;
                if self.seen_nodes.insert(node) {
                    self.known.nodes.push(node);
                    if self.known.nodes.len() > 4096 {
                        self.known
                            .nodes
                            .swap_remove(1 + self.rng.below(4095) as usize);
                    }
                }
            }
            if !self.judged.contains(&ino) {
                self.judge(ino, f.index, case.clone());
            }
        }
        if let Some(h) = wire::handle_of(opcode, &reply) {
            if self.known.handles.len() < 4096 {
                self.known.handles.push(h);
            }
            let node = match opcode {
                wire::FUSE_CREATE => wire::handed_out(opcode, &reply)
                    .first()
                    .map_or(0, |&(node, _)| node),
                _ => request_nodeid(case).unwrap_or(0),
            };
            self.owned.push((node, h));
        }
    }

    fn note_pair(&mut self, case: &Case, errno: i32) {
        let op = if case.opcode > 51 { 51 } else { case.opcode };
        if self.pairs.insert((op, errno)) && self.corpus.len() < CORPUS_CAP {
            self.corpus.push(case.clone());
        }
    }

    /// Queue `ino` for the oracle's thread: directories are judged at once (a walk up by
    /// ".."), other inodes at the next checkpoint's listing of the export.
    fn judge(&mut self, ino: u64, index: u64, case: Case) {
        self.judged.insert(ino);
        // False when the judging thread is gone: `finish_judging` reports it.
        let _ = self.judging.submit(Job { ino, index, case });
    }

    /// Forget and release everything we hold, judge pending inodes, check liveness and bounds.
    fn checkpoint(&mut self, issued: u64) -> bool {
        // The hiprio queue's completions must not be taken by the session's sends below (and
        // the other way round): let our FORGETs come back first.
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while self.hi_inflight.iter().any(Option::is_some) && std::time::Instant::now() < until {
            self.reap_hiprio();
            std::thread::sleep(Duration::from_millis(1));
        }
        // Release handles first (a handle pins its node).
        self.known.handles.clear();
        let handles = std::mem::take(&mut self.owned);
        for (nodeid, h) in handles {
            for op in [wire::FUSE_RELEASE, wire::FUSE_RELEASEDIR] {
                let unique = self.s.next_unique();
                let hdr = Header {
                    opcode: op,
                    unique,
                    nodeid,
                    ..Header::default()
                };
                let body = gen_release(h);
                let _ = self.s.fuse(hdr, &[&body]);
            }
        }
        let held: Vec<(u64, u64)> = self.held.drain().collect();
        for chunk in held.chunks(500) {
            let unique = self.s.next_unique();
            let bytes = crate::fuse::encode_batch_forget(unique, chunk);
            let _ = self.s.send(HIPRIO_QUEUE, &bytes, 0);
        }
        self.known.nodes.truncate(1);
        self.seen_nodes.clear();
        self.reap_hiprio();
        // Have the inodes waiting for a listing judged (on the oracle's thread; false when
        // that thread is gone, which `finish_judging` reports).
        let _ = self.judging.listing();
        if self.judged.len() > 100_000 {
            self.judged.clear();
        }
        // Alive?
        let alive = self.s.alive().unwrap_or(false) && self.o.pid.map_or(true, running);
        if !alive {
            self.sum.dead = true;
            self.finding(
                "dead",
                issued,
                "GETATTR of node 1 not answered after the last requests",
                None,
            );
            return false;
        }
        // Bounded?
        if let Some(pid) = self.o.pid {
            if let Some(rss) = rss_kib(pid) {
                self.sum.max_rss_kib = self.sum.max_rss_kib.max(rss);
                if rss > self.o.max_rss_mib * 1024 {
                    self.sum.bound_violations += 1;
                    self.finding(
                        "rss",
                        issued,
                        &format!("daemon RSS {} MiB > {} MiB", rss / 1024, self.o.max_rss_mib),
                        None,
                    );
                }
            }
        }
        if let Some(text) = self.o.metrics_socket.as_deref().and_then(scrape) {
            let nodes = sample(&text, "ceph_virtiofsd_inodes").unwrap_or(0.0) as u64;
            let handles = sample(&text, "ceph_virtiofsd_handles").unwrap_or(0.0) as u64;
            self.sum.max_nodes = self.sum.max_nodes.max(nodes);
            self.sum.max_handles = self.sum.max_handles.max(handles);
            if nodes > self.o.max_nodes {
                self.sum.bound_violations += 1;
                self.finding(
                    "node-table",
                    issued,
                    &format!(
                        "{nodes} nodes after forgetting all we were given (bound {})",
                        self.o.max_nodes
                    ),
                    None,
                );
            }
            if handles > self.o.max_handles {
                self.sum.bound_violations += 1;
                self.finding(
                    "handle-table",
                    issued,
                    &format!(
                        "{handles} handles after releasing all we were given (bound {})",
                        self.o.max_handles
                    ),
                    None,
                );
            }
        }
        true
    }
}

/// The node id in the header of a case's request, when its readable bytes hold a header.
fn request_nodeid(c: &Case) -> Option<u64> {
    fn readable(descs: &[DescSpec], bytes: &mut Vec<u8>) -> bool {
        for d in descs {
            match &d.buf {
                Buf::Read(b) => bytes.extend_from_slice(b),
                Buf::Indirect(inner) => {
                    if !readable(inner, bytes) {
                        return false;
                    }
                }
                _ => return false,
            }
            if bytes.len() >= wire::IN_HDR {
                return false;
            }
        }
        true
    }
    let mut bytes = Vec::new();
    readable(&c.descs, &mut bytes);
    // InHeader: len u32, opcode u32, unique u64, nodeid u64, ...
    let id = bytes.get(16..24)?;
    Some(u64::from_le_bytes(id.try_into().ok()?))
}

fn gen_release(fh: u64) -> Vec<u8> {
    let mut v = fh.to_le_bytes().to_vec();
    v.extend_from_slice(&[0u8; 16]);
    v
}

/// Bytes of writable descriptors at raw addresses (offered, but not readable back by us).
fn raw_writable(c: &Case) -> u64 {
    c.descs
        .iter()
        .filter(|d| {
            matches!(d.buf, Buf::Raw { .. })
                && d.flags.unwrap_or(0) & super::device::VIRTQ_DESC_F_WRITE != 0
        })
        .map(|d| match d.buf {
            Buf::Raw { len, .. } => u64::from(len),
            _ => 0,
        })
        .sum()
}
