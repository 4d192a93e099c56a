//! The escape oracle off the fuzzer's send path: judgements run on a thread of their own, fed
//! through a bounded queue.
//!
//! An oracle judgement is a getattr (and a walk up by "..") through a second libcephfs client.
//! The MDS may hold such a request for seconds (the daemon's client must give up caps first,
//! and the MDS journal entry that grants the lock may wait for the MDS's next tick to be
//! flushed). Judged inline, that stalled every request behind it. Here the fuzzer only queues
//! `(inode number, request)` and goes on sending; nothing is dropped: when the queue is full the
//! sender waits (that wait is counted apart), and [`Judging::finish`] waits for every
//! judgement. Each escape comes back with the request index and the chain that produced it, so
//! its replay is printed as if it had been judged inline.
//!
//! Directories are judged at once; other inodes wait for the next [`Judging::listing`] (a
//! listing of the export's tree), as with the inline oracle.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::gen::Case;
use super::oracle::{Oracle, Verdict};

/// What the judging thread needs of an oracle (a trait, so the queue is tested without a
/// cluster).
pub trait Judge: Send + 'static {
    /// A verdict if it needs no listing (known, gone, or a directory); `None` otherwise.
    fn check_dir(&mut self, ino: u64) -> Option<Verdict>;
    /// A verdict, listing the export if need be.
    fn check(&mut self, ino: u64) -> Verdict;
    /// The export's tree may have changed since the last listing.
    fn stale(&mut self);
    /// Tentative escapes a fresh client overturned.
    fn overturned(&self) -> u64;
}

impl Judge for Oracle {
    fn check_dir(&mut self, ino: u64) -> Option<Verdict> {
        Oracle::check_dir(self, ino)
    }
    fn check(&mut self, ino: u64) -> Verdict {
        Oracle::check(self, ino)
    }
    fn stale(&mut self) {
        Oracle::stale(self);
    }
    fn overturned(&self) -> u64 {
        self.overturned
    }
}

/// An inode number to judge and the request that handed it out.
#[derive(Debug, Clone)]
pub struct Job {
    pub ino: u64,
    /// The request's number in the run (for the replay).
    pub index: u64,
    pub case: Case,
}

enum Msg {
    Judge(Job),
    Listing,
}

/// An inode outside the export, with the request that handed it out.
#[derive(Debug, Clone)]
pub struct Escape {
    pub index: u64,
    pub why: String,
    pub case: Case,
}

/// Judgement times in power-of-two millisecond buckets: bucket 0 is under 1 ms, bucket `i`
/// under 2^i ms, the last everything longer.
#[derive(Debug, Default, Clone)]
pub struct Histogram {
    counts: [u64; 16],
    pub max: Duration,
    pub n: u64,
}

impl Histogram {
    pub fn add(&mut self, d: Duration) {
        let ms = d.as_millis();
        let i = if ms == 0 {
            0
        } else {
            (u128::BITS - ms.leading_zeros()) as usize
        };
        self.counts[i.min(self.counts.len() - 1)] += 1;
        self.max = self.max.max(d);
        self.n += 1;
    }

    /// An upper bound of the `q` quantile (the bound of its bucket, at most the maximum).
    pub fn quantile(&self, q: f64) -> Duration {
        if self.n == 0 {
            return Duration::ZERO;
        }
        let rank = ((self.n as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Duration::from_millis(1 << i).min(self.max);
            }
        }
        self.max
    }

    /// Judgements that took at least `ms` milliseconds (a power of two).
    pub fn at_least_ms(&self, ms: u64) -> u64 {
        let from = (u64::BITS - ms.leading_zeros()) as usize;
        self.counts.iter().skip(from).sum()
    }
}

/// What the judging thread did.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Jobs that reached a verdict (inside, gone or outside). Equals [`Judging::queued`]
    /// when none was lost.
    pub judged: u64,
    pub inside: u64,
    pub gone: u64,
    pub outside: u64,
    /// Time of each oracle call (a judgement of one inode; a listing counts with the first
    /// inode it was made for).
    pub times: Histogram,
    pub overturned: u64,
}

pub struct Judging {
    tx: Option<SyncSender<Msg>>,
    escapes: Receiver<Escape>,
    /// The thread's tally, sent when it has judged everything.
    done: Receiver<Tally>,
    worker: Option<JoinHandle<()>>,
    /// How long the sender waits for room, and `finish` for the last judgements, before
    /// calling the oracle stuck (one of its requests held by the MDS).
    stuck_after: Duration,
    /// The oracle was found stuck: nothing more is sent.
    pub stuck: bool,
    /// Jobs submitted (each must be judged: compare [`Tally::judged`]).
    pub queued: u64,
    /// Sends that found the queue full, and the time the sender waited for room.
    pub full: u64,
    pub wait: Duration,
    pub wait_max: Duration,
}

impl std::fmt::Debug for Judging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Judging")
            .field("queued", &self.queued)
            .finish_non_exhaustive()
    }
}

impl Judging {
    /// Start the judging thread with a queue of `capacity` jobs; a queue that stays full, or
    /// judgements not done, `stuck_after` mean a stuck oracle.
    pub fn start<J: Judge>(
        judge: J,
        capacity: usize,
        stuck_after: Duration,
    ) -> std::io::Result<Judging> {
        let (tx, rx) = mpsc::sync_channel(capacity.max(1));
        let (etx, erx) = mpsc::channel();
        let (dtx, drx) = mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("hostile-oracle".into())
            .spawn(move || {
                let _ = dtx.send(work(judge, rx, etx));
            })?;
        Ok(Judging {
            tx: Some(tx),
            escapes: erx,
            done: drx,
            worker: Some(worker),
            stuck_after,
            stuck: false,
            queued: 0,
            full: 0,
            wait: Duration::ZERO,
            wait_max: Duration::ZERO,
        })
    }

    /// False when the message could not be queued: the thread is gone, or the queue stayed
    /// full for `stuck_after` (then `stuck` is set and nothing more is sent).
    fn send(&mut self, msg: Msg) -> bool {
        let Some(tx) = self.tx.as_ref().filter(|_| !self.stuck) else {
            return false;
        };
        let mut msg = match tx.try_send(msg) {
            Ok(()) => return true,
            Err(TrySendError::Full(msg)) => msg,
            Err(TrySendError::Disconnected(_)) => return false,
        };
        let t = Instant::now();
        let ok = loop {
            std::thread::sleep(Duration::from_millis(1));
            match tx.try_send(msg) {
                Ok(()) => break true,
                Err(TrySendError::Full(m)) if t.elapsed() < self.stuck_after => msg = m,
                Err(TrySendError::Full(_)) => {
                    self.stuck = true;
                    break false;
                }
                Err(TrySendError::Disconnected(_)) => break false,
            }
        };
        let waited = t.elapsed();
        self.full += 1;
        self.wait += waited;
        self.wait_max = self.wait_max.max(waited);
        ok
    }

    /// Queue one inode number for judgement, waiting for room if the queue is full. False when
    /// the judging thread is gone (it panicked: [`Judging::finish`] says so).
    pub fn submit(&mut self, job: Job) -> bool {
        self.queued += 1;
        self.send(Msg::Judge(job))
    }

    /// Judge the inodes waiting for a listing (after those queued before).
    pub fn listing(&mut self) -> bool {
        self.send(Msg::Listing)
    }

    /// Escapes found so far and not yet taken.
    pub fn escapes(&self) -> Vec<Escape> {
        self.escapes.try_iter().collect()
    }

    /// Wait for every judgement (the inodes still waiting for a listing get one); the tally
    /// and the escapes not yet taken. An error if the judging thread panicked, or if the
    /// oracle was stuck (the queue stayed full, or the last judgements took longer than
    /// `stuck_after`); a stuck thread is left behind (it ends with the process).
    pub fn finish(&mut self) -> Result<(Tally, Vec<Escape>), String> {
        self.tx = None;
        let stuck = || {
            format!(
                "the oracle was stuck: a judgement (an MDS request of its client) did not end within {:?}",
                self.stuck_after
            )
        };
        if self.stuck {
            return Err(stuck());
        }
        match self.done.recv_timeout(self.stuck_after) {
            Ok(tally) => {
                if let Some(w) = self.worker.take() {
                    let _ = w.join();
                }
                Ok((tally, self.escapes.try_iter().collect()))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => Err(stuck()),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err("the oracle's judging thread panicked".to_owned())
            }
        }
    }
}

/// The judging thread: every job reaches a verdict, directories at once, others at the next
/// listing (or when the queue closes).
fn work<J: Judge>(mut judge: J, rx: Receiver<Msg>, escapes: mpsc::Sender<Escape>) -> Tally {
    let mut t = Tally::default();
    // Inodes waiting for a listing: the first job that named each, and how many did.
    let mut waiting: HashMap<u64, (Job, u64)> = HashMap::new();
    for msg in rx {
        match msg {
            Msg::Judge(job) => {
                let start = Instant::now();
                let v = judge.check_dir(job.ino);
                t.times.add(start.elapsed());
                match v {
                    Some(v) => record(&mut t, &escapes, v, job, 1),
                    None => match waiting.entry(job.ino) {
                        Entry::Occupied(mut e) => e.get_mut().1 += 1,
                        Entry::Vacant(e) => {
                            e.insert((job, 1));
                        }
                    },
                }
            }
            Msg::Listing => list(&mut judge, &mut t, &escapes, &mut waiting),
        }
    }
    list(&mut judge, &mut t, &escapes, &mut waiting);
    t.overturned = judge.overturned();
    t
}

fn list<J: Judge>(
    judge: &mut J,
    t: &mut Tally,
    escapes: &mpsc::Sender<Escape>,
    waiting: &mut HashMap<u64, (Job, u64)>,
) {
    if waiting.is_empty() {
        return;
    }
    judge.stale();
    for (ino, (job, jobs)) in waiting.drain() {
        let start = Instant::now();
        let v = judge.check(ino);
        t.times.add(start.elapsed());
        record(t, escapes, v, job, jobs);
    }
}

/// `jobs` jobs (for one inode) reached verdict `v`; an escape is sent with the first of them.
fn record(t: &mut Tally, escapes: &mpsc::Sender<Escape>, v: Verdict, job: Job, jobs: u64) {
    t.judged += jobs;
    match v {
        Verdict::Inside => t.inside += jobs,
        Verdict::Gone => t.gone += jobs,
        Verdict::Outside(why) => {
            t.outside += jobs;
            // The receiver outlives the thread (`Judging::finish` joins before dropping it).
            let _ = escapes.send(Escape {
                index: job.index,
                why,
                case: job.case,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Directories are even inode numbers, others odd; inode 13 is outside, 15 gone. Each
    /// call sleeps `delay` (a slow MDS) and is logged.
    struct Fake {
        delay: Duration,
        calls: Arc<Mutex<Vec<(char, u64)>>>,
        stale: bool,
    }

    impl Judge for Fake {
        fn check_dir(&mut self, ino: u64) -> Option<Verdict> {
            std::thread::sleep(self.delay);
            self.calls.lock().unwrap().push(('d', ino));
            (ino % 2 == 0).then_some(Verdict::Inside)
        }
        fn check(&mut self, ino: u64) -> Verdict {
            assert!(self.stale, "a non-directory judged without a fresh listing");
            self.calls.lock().unwrap().push(('c', ino));
            match ino {
                13 => Verdict::Outside(format!("{ino} outside")),
                15 => Verdict::Gone,
                _ => Verdict::Inside,
            }
        }
        fn stale(&mut self) {
            self.stale = true;
        }
        fn overturned(&self) -> u64 {
            0
        }
    }

    fn case(i: u64) -> Case {
        Case {
            queue: 1,
            descs: Vec::new(),
            opcode: 1,
            unique: Some(i),
            proper: true,
            kind: "test",
        }
    }

    #[test]
    fn hostile_oracle_queue_judges_every_job_even_when_full() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let fake = Fake {
            delay: Duration::from_millis(2),
            calls: calls.clone(),
            stale: false,
        };
        let mut j = Judging::start(fake, 2, Duration::from_secs(600)).unwrap();
        // 40 jobs through a queue of 2 with a slow judge: the sender must wait, nothing drops.
        // Inode 13 (outside) is named by two requests, 21 by three.
        let inos: Vec<u64> = (0..40)
            .map(|i| match i {
                5 | 30 => 13,
                7..=9 => 21,
                i => 100 + i,
            })
            .collect();
        for (i, &ino) in inos.iter().enumerate() {
            assert!(j.submit(Job {
                ino,
                index: i as u64,
                case: case(i as u64)
            }));
        }
        assert!(j.listing());
        assert!(j.submit(Job {
            ino: 15,
            index: 99,
            case: case(99)
        }));
        let (tally, escapes) = j.finish().unwrap();
        assert_eq!(tally.judged, 41, "{tally:?}");
        assert_eq!(tally.judged, tally.inside + tally.gone + tally.outside);
        assert_eq!((tally.outside, tally.gone), (2, 1), "{tally:?}");
        // One escape report for inode 13, carrying the first request that named it.
        assert_eq!(escapes.len(), 1);
        assert_eq!(escapes[0].index, 5);
        assert_eq!(escapes[0].case.unique, Some(5));
        assert!(escapes[0].why.contains("13 outside"));
        // Every job went through the judge; each non-directory once at a listing: 13, 21 and
        // the 17 other odd ones at the first, 15 (queued after it) at the final one.
        let calls = calls.lock().unwrap();
        assert_eq!(calls.iter().filter(|c| c.0 == 'd').count(), 41);
        let listed: Vec<u64> = calls.iter().filter(|c| c.0 == 'c').map(|c| c.1).collect();
        assert_eq!(listed.len(), 20, "{listed:?}");
        assert_eq!(listed.last(), Some(&15));
    }

    #[test]
    fn hostile_oracle_histogram_bounds_its_quantiles() {
        let mut h = Histogram::default();
        for _ in 0..98 {
            h.add(Duration::from_micros(300));
        }
        h.add(Duration::from_millis(3));
        h.add(Duration::from_millis(5004));
        assert_eq!(h.n, 100);
        assert_eq!(h.quantile(0.5), Duration::from_millis(1));
        assert_eq!(h.quantile(0.99), Duration::from_millis(4));
        assert_eq!(h.quantile(1.0), Duration::from_millis(5004));
        assert_eq!(h.max, Duration::from_millis(5004));
        assert_eq!(h.at_least_ms(1024), 1);
        assert_eq!(h.at_least_ms(2), 2);
    }

    /// A judge whose every call waits for a gate the test never opens: an MDS that holds the
    /// oracle's request.
    struct Stuck(Mutex<mpsc::Receiver<()>>);

    impl Judge for Stuck {
        fn check_dir(&mut self, _: u64) -> Option<Verdict> {
            let _ = self.0.lock().unwrap().recv();
            None
        }
        fn check(&mut self, _: u64) -> Verdict {
            let _ = self.0.lock().unwrap().recv();
            Verdict::Gone
        }
        fn stale(&mut self) {}
        fn overturned(&self) -> u64 {
            0
        }
    }

    #[test]
    fn hostile_oracle_stuck_judge_is_reported_not_waited_for_forever() {
        let (_gate, rx) = mpsc::channel();
        let mut j = Judging::start(Stuck(Mutex::new(rx)), 1, Duration::from_millis(50)).unwrap();
        // The first job is taken by the thread (and stays there), one more fits the queue; at
        // the latest the third finds the queue full for good.
        let queued: Vec<bool> = (0..3)
            .map(|i| {
                j.submit(Job {
                    ino: i,
                    index: i,
                    case: case(i),
                })
            })
            .collect();
        assert!(queued.contains(&false), "{queued:?}");
        assert!(j.stuck);
        assert_eq!(j.queued, 3);
        let e = j.finish().unwrap_err();
        assert!(e.contains("stuck"), "{e}");
    }
}
