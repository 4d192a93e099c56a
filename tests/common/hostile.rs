//! The hostile guest for tests: drives `ceph-virtiofsd-bench hostile serve` (a vhost-user
//! frontend that writes its descriptor tables by hand, with an escape oracle on a second
//! libcephfs client mounted at "/"), builds FUSE requests with any header field and body, and
//! measures the daemon's tables and RSS.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use super::{Daemon, Lab};

pub const IN_HDR: usize = 40;
pub const OUT_HDR: usize = 16;
/// Writable bytes offered to a reply.
pub const REPLY: u32 = 132 * 1024;

/// FUSE opcode numbers: the daemon's table (`wire`), which the bench's frontend uses too.
pub use ceph_virtiofsd::wire::opcode as op;

/// What became of one chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Given back with `written` bytes, those bytes, and the inode numbers of the reply that
    /// the oracle found outside the export.
    Done {
        written: u32,
        reply: Vec<u8>,
        outside: Vec<u64>,
    },
    Lost,
    Bogus(u32),
}

impl Answer {
    /// The reply header's error (0 = success); `None` without a reply header.
    pub fn error(&self) -> Option<i32> {
        match self {
            Answer::Done { reply, .. } if reply.len() >= OUT_HDR => {
                Some(i32::from_le_bytes(reply[4..8].try_into().unwrap()))
            }
            _ => None,
        }
    }

    pub fn unique(&self) -> Option<u64> {
        match self {
            Answer::Done { reply, .. } if reply.len() >= OUT_HDR => {
                Some(u64::from_le_bytes(reply[8..16].try_into().unwrap()))
            }
            _ => None,
        }
    }

    pub fn payload(&self) -> &[u8] {
        match self {
            Answer::Done { reply, .. } => reply.get(OUT_HDR..).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// (node id, attr.ino) of an entry reply.
    pub fn entry(&self) -> Option<(u64, u64)> {
        let p = self.payload();
        if self.error() != Some(0) || p.len() < 48 {
            return None;
        }
        let node = u64::from_le_bytes(p[0..8].try_into().unwrap());
        // Node id 0 is a negative entry: "no such name", cached by the kernel for its TTL.
        if node == 0 {
            return None;
        }
        Some((node, u64::from_le_bytes(p[40..48].try_into().unwrap())))
    }

    /// The handle of an OPEN/OPENDIR reply.
    pub fn fh(&self) -> Option<u64> {
        let p = self.payload();
        (self.error() == Some(0) && p.len() >= 8)
            .then(|| u64::from_le_bytes(p[0..8].try_into().unwrap()))
    }

    pub fn outside(&self) -> &[u64] {
        match self {
            Answer::Done { outside, .. } => outside,
            _ => &[],
        }
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex from the tool"))
        .collect()
}

/// FUSE request bytes: the in-header (length = header + body unless `len` is given) and body.
pub fn request(opcode: u32, unique: u64, nodeid: u64, len: Option<u32>, body: &[u8]) -> Vec<u8> {
    let len = len.unwrap_or((IN_HDR + body.len()) as u32);
    let mut v = Vec::new();
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&opcode.to_le_bytes());
    v.extend_from_slice(&unique.to_le_bytes());
    v.extend_from_slice(&nodeid.to_le_bytes());
    v.extend_from_slice(&1000u32.to_le_bytes()); // uid
    v.extend_from_slice(&1000u32.to_le_bytes()); // gid
    v.extend_from_slice(&4242u32.to_le_bytes()); // pid
    v.extend_from_slice(&[0u8; 4]);
    v.extend_from_slice(body);
    v
}

/// A body from little-endian fields.
#[derive(Debug, Default, Clone)]
pub struct Body(pub Vec<u8>);

impl Body {
    pub fn new() -> Self {
        Body(Vec::new())
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
    /// A name and its NUL.
    pub fn name(self, n: &[u8]) -> Self {
        self.bytes(n).bytes(&[0])
    }
}

/// A running `ceph-virtiofsd-bench hostile serve` connected to a daemon.
pub struct Hostile {
    child: Child,
    /// `None` once closed (in Drop).
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    unique: u64,
    pub mem_size: u64,
}

impl Hostile {
    /// Connect to `daemon` (exporting `export`), FUSE_INIT done unless `extra` has --no-init.
    pub fn connect(lab: &Lab, daemon: &Daemon, export: &str, extra: &[&str]) -> Hostile {
        let mut cmd = Command::new(super::bench_binary());
        cmd.args(["hostile", "serve", "--socket"])
            .arg(&daemon.socket)
            .arg("--ceph-conf")
            .arg(&lab.conf)
            .args(["--client-id", &lab.client_id, "--export", export])
            .args(extra);
        Self::spawn(cmd, daemon)
    }

    /// Connect to `daemon` without the oracle: the frontend then has no CephFS session of its
    /// own (none left behind when it is killed), and [`Answer::outside`] is always empty.
    pub fn connect_without_oracle(daemon: &Daemon) -> Hostile {
        let mut cmd = Command::new(super::bench_binary());
        cmd.args(["hostile", "serve", "--socket"])
            .arg(&daemon.socket);
        Self::spawn(cmd, daemon)
    }

    fn spawn(mut cmd: Command, daemon: &Daemon) -> Hostile {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start ceph-virtiofsd-bench hostile serve");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut h = Hostile {
            child,
            stdin: Some(stdin),
            stdout,
            unique: 1000,
            mem_size: 0,
        };
        let ready = h.line();
        let size = ready.strip_prefix("ready ").unwrap_or_else(|| {
            panic!(
                "hostile serve did not start: {ready:?}\n{}",
                daemon.log_text()
            )
        });
        h.mem_size = size.parse().unwrap();
        h
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.stdout
            .read_line(&mut l)
            .expect("read from hostile serve");
        l.trim_end().to_owned()
    }

    /// One command, one answer line.
    pub fn cmd(&mut self, c: &str) -> String {
        let stdin = self.stdin.as_mut().expect("hostile serve's stdin is open");
        writeln!(stdin, "{c}").expect("write to hostile serve");
        stdin.flush().unwrap();
        let a = self.line();
        assert!(!a.is_empty(), "hostile serve ended (command {c})");
        assert!(!a.starts_with("error "), "hostile serve: {a} (command {c})");
        a
    }

    fn answer(line: &str) -> Answer {
        let mut t = line.split(' ');
        match t.next() {
            Some("done") => {
                let written = t.next().unwrap().parse().unwrap();
                let reply = unhex(t.next().unwrap_or(""));
                let outside = t
                    .find_map(|f| f.strip_prefix("outside="))
                    .map(|l| {
                        l.split(',')
                            .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap())
                            .collect()
                    })
                    .unwrap_or_default();
                Answer::Done {
                    written,
                    reply,
                    outside,
                }
            }
            Some("lost") => Answer::Lost,
            Some("bogus") => Answer::Bogus(t.next().unwrap().parse().unwrap()),
            _ => panic!("unexpected answer {line:?}"),
        }
    }

    pub fn next_unique(&mut self) -> u64 {
        self.unique += 1;
        self.unique
    }

    /// Raw request bytes on `queue` (0 hiprio, 1 request) with `reply_len` writable bytes.
    pub fn raw(&mut self, queue: usize, bytes: &[u8], reply_len: u32) -> Answer {
        let l = self.cmd(&format!("fuse {queue} {reply_len} {}", hex(bytes)));
        Self::answer(&l)
    }

    /// A hand-built chain (tokens of `hostile serve`: r:HEX w:LEN x:ADDR:LEN [ ] /n= /f=).
    pub fn chain(&mut self, queue: usize, tokens: &str) -> Answer {
        let l = self.cmd(&format!("chain {queue} {tokens}"));
        Self::answer(&l)
    }

    /// A well-formed request on the request queue.
    pub fn req(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> Answer {
        let u = self.next_unique();
        self.raw(1, &request(opcode, u, nodeid, None, body), REPLY)
    }

    /// [`Self::req`] with uid 0 and gid 0 in the header.
    pub fn req_as_root(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> Answer {
        let u = self.next_unique();
        let mut req = request(opcode, u, nodeid, None, body);
        req[24..32].fill(0); // InHeader uid, gid
        self.raw(1, &req, REPLY)
    }

    pub fn lookup(&mut self, parent: u64, name: &[u8]) -> Answer {
        self.req(op::FUSE_LOOKUP, parent, &Body::new().name(name).0)
    }

    pub fn getattr(&mut self, node: u64) -> Answer {
        self.req(op::FUSE_GETATTR, node, &Body::new().u32(0).u32(0).u64(0).0)
    }

    pub fn open(&mut self, node: u64, flags: u32) -> Answer {
        self.req(op::FUSE_OPEN, node, &Body::new().u32(flags).u32(0).0)
    }

    pub fn opendir(&mut self, node: u64) -> Answer {
        self.req(op::FUSE_OPENDIR, node, &Body::new().u32(0).u32(0).0)
    }

    pub fn release(&mut self, node: u64, fh: u64, dir: bool) -> Answer {
        let o = if dir {
            op::FUSE_RELEASEDIR
        } else {
            op::FUSE_RELEASE
        };
        self.req(o, node, &Body::new().u64(fh).u32(0).u32(0).u64(0).0)
    }

    pub fn read(&mut self, node: u64, fh: u64, offset: u64, size: u32) -> Answer {
        self.read_into(node, fh, offset, size, REPLY)
    }

    /// [`Self::read`] with `room` writable bytes for the reply (Linux gives a READ its
    /// out-header and `size`).
    pub fn read_into(&mut self, node: u64, fh: u64, offset: u64, size: u32, room: u32) -> Answer {
        let body = Body::new()
            .u64(fh)
            .u64(offset)
            .u32(size)
            .u32(0)
            .u64(0)
            .u32(0)
            .u32(0)
            .0;
        let u = self.next_unique();
        self.raw(1, &request(op::FUSE_READ, u, node, None, &body), room)
    }

    pub fn readdirplus(&mut self, node: u64, fh: u64) -> Answer {
        self.req(
            op::FUSE_READDIRPLUS,
            node,
            &Body::new()
                .u64(fh)
                .u64(0)
                .u32(65536)
                .u32(0)
                .u64(0)
                .u32(0)
                .u32(0)
                .0,
        )
    }

    /// BATCH_FORGET of (node, count) pairs on the hiprio queue.
    pub fn forget(&mut self, nodes: &[(u64, u64)]) -> Answer {
        let mut b = Body::new().u32(nodes.len() as u32).u32(0);
        for &(n, c) in nodes {
            b = b.u64(n).u64(c);
        }
        let u = self.next_unique();
        self.raw(0, &request(op::FUSE_BATCH_FORGET, u, 0, None, &b.0), 0)
    }

    /// Does the daemon still answer a GETATTR of node 1?
    pub fn alive(&mut self) -> bool {
        self.cmd("alive") == "alive"
    }

    /// The oracle's verdict on inode number `ino`: "inside", "gone" or "outside ...".
    pub fn oracle(&mut self, ino: u64) -> String {
        self.cmd(&format!("oracle {ino:#x}"))
    }

    /// The export root's inode number.
    pub fn export_ino(&mut self) -> u64 {
        let l = self.cmd("export");
        u64::from_str_radix(l.trim_start_matches("export 0x"), 16).unwrap()
    }

    pub fn set_timeout_ms(&mut self, ms: u64) {
        assert_eq!(self.cmd(&format!("timeout {ms}")), "ok");
    }

    /// Wait up to `ms` for the chains of `queue` answered `lost` to come back: how many are
    /// still out, and the replies of those that came back since the last call.
    pub fn settle(&mut self, queue: usize, ms: u64) -> (usize, Vec<Vec<u8>>) {
        let l = self.cmd(&format!("settle {queue} {ms}"));
        let mut t = l.split_whitespace();
        assert_eq!(t.next(), Some("settled"), "unexpected answer {l:?}");
        let out = t.next().and_then(|n| n.parse().ok()).expect("settled OUT");
        let late = t
            .map(|r| if r == "-" { Vec::new() } else { unhex(r) })
            .collect();
        (out, late)
    }
}

impl Drop for Hostile {
    /// Closes its stdin, so that `hostile serve` ends and unmounts its oracle's CephFS session;
    /// SIGKILL only if it has not ended 10 s later. Killed outright, it left that session for
    /// the MDS to time out, and an MDS restart meanwhile waited about 50 s in reconnect for it.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The daemon's table sizes and memory, as an operator sees them: node and handle counts from
/// its metrics endpoint (`--metrics-socket`), RSS from /proc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonStats {
    pub nodes: u64,
    pub handles: u64,
    pub rss_kib: u64,
}

/// The body of one HTTP GET /metrics on a unix socket.
pub fn scrape_metrics(socket: &Path) -> String {
    use std::io::Read;
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connect to metrics socket {}: {e}", socket.display()));
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .expect("an HTTP answer")
        .1
        .to_owned()
}

/// The value of the sample whose name-and-labels part is exactly `series`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.rsplit_once(' ').filter(|(s, _)| *s == series))
        .and_then(|(_, v)| v.parse().ok())
}

pub fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon /proc status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

pub fn daemon_stats(daemon: &Daemon, metrics_socket: &Path) -> DaemonStats {
    let t = scrape_metrics(metrics_socket);
    DaemonStats {
        nodes: metric(&t, "ceph_virtiofsd_inodes").expect("ceph_virtiofsd_inodes") as u64,
        handles: metric(&t, "ceph_virtiofsd_handles").expect("ceph_virtiofsd_handles") as u64,
        rss_kib: rss_kib(daemon.pid()),
    }
}

/// An export for a hostile test: `/NAME-UNIQ/data` (the export, with a directory `d` and a
/// file `f` in it) next to `/NAME-UNIQ/other/secret` (what must stay out of reach). Returns
/// the export path.
pub fn hostile_tree(lab: &Lab, name: &str) -> String {
    use ceph_client::{UserPerm, CEPH_STATX_BASIC_STATS};
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name = &format!("{name}-{}-{stamp}", std::process::id());
    let top = lab.export_dir(name);
    let m = lab.ceph();
    let perm = UserPerm::root();
    let root = m.lookup_root().unwrap();
    let c = |s: &str| std::ffi::CString::new(s).unwrap();
    let (t, _) = m
        .lookup(&root, &c(name), CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    let (data, _) = m
        .mkdir(&t, &c("data"), 0o777, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    let (other, _) = m
        .mkdir(&t, &c("other"), 0o777, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    let (_, _, f) = m
        .create(
            &other,
            &c("secret"),
            0o644,
            libc::O_RDWR | libc::O_CREAT,
            CEPH_STATX_BASIC_STATS,
            0,
            &perm,
        )
        .unwrap();
    f.write(0, b"tenant B's secret\n").unwrap();
    drop(f);
    m.mkdir(&data, &c("d"), 0o777, CEPH_STATX_BASIC_STATS, 0, &perm)
        .unwrap();
    let (_, _, f) = m
        .create(
            &data,
            &c("f"),
            0o666,
            libc::O_RDWR | libc::O_CREAT,
            CEPH_STATX_BASIC_STATS,
            0,
            &perm,
        )
        .unwrap();
    f.write(0, b"hello\n").unwrap();
    format!("{top}/data")
}

/// A daemon on a fresh hostile tree with a metrics socket, and the metrics socket's path.
pub fn hostile_daemon(lab: &Lab, name: &str, extra: &[&str]) -> (Daemon, String, PathBuf) {
    let export = hostile_tree(lab, name);
    let work = lab.scratch(name);
    let metrics = work.join("metrics.sock");
    let mut args: Vec<&str> = vec!["--metrics-socket", metrics.to_str().unwrap()];
    args.extend_from_slice(extra);
    let d = Daemon::start(lab, &work, &export, &args);
    (d, export, metrics)
}

/// A Ceph cluster of a test's own, for attacks that may take the MDS down (which must not end
/// the shared lab cluster for every other test). Stopped when dropped.
/// An MDS (or OSD) [`PrivateCluster::stop_mds`] stopped; dropping it resumes it.
pub struct StoppedMds(i32);

impl Drop for StoppedMds {
    fn drop(&mut self) {
        // SAFETY: as in `PrivateCluster::stop_mds`.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

pub struct PrivateCluster {
    pub dir: PathBuf,
    pub lab: Lab,
}

impl PrivateCluster {
    /// The pid of the cluster's mds.`id`, from its pid file.
    pub fn mds_pid(&self, id: &str) -> i32 {
        self.pid(&format!("mds.{id}"))
    }

    /// The pid of the cluster's daemon `who` (`mds.a`, `osd.0`), from its pid file.
    fn pid(&self, who: &str) -> i32 {
        let p = self.dir.join(format!("pids/{who}.pid"));
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .parse()
            .unwrap()
    }

    /// Stop mds.`id` (SIGSTOP) until the guard is dropped: it resumes the MDS (SIGCONT) even
    /// when the test fails half-way, so the cluster can be stopped.
    pub fn stop_mds(&self, id: &str) -> StoppedMds {
        self.stop(&format!("mds.{id}"))
    }

    /// [`Self::stop_mds`] for osd.`id`: every read and write that reaches the OSDs waits.
    pub fn stop_osd(&self, id: &str) -> StoppedMds {
        self.stop(&format!("osd.{id}"))
    }

    fn stop(&self, who: &str) -> StoppedMds {
        let pid = self.pid(who);
        // SAFETY: kill(2) with a pid read from the cluster's pid file; no memory is involved.
        let rc = unsafe { libc::kill(pid, libc::SIGSTOP) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, SIGSTOP): {}",
            std::io::Error::last_os_error()
        );
        StoppedMds(pid)
    }

    pub fn start(lab: &Lab, name: &str) -> PrivateCluster {
        Self::start_with(lab, name, &[])
    }

    /// [`PrivateCluster::start`] with options for `ceph-dev-cluster start` (`--standby-mds`).
    pub fn start_with(lab: &Lab, name: &str, opts: &[&str]) -> PrivateCluster {
        let dir = lab.scratch(name).join("cluster");
        let script = lab.top.join("tests/lab/ceph-dev-cluster");
        let out = Command::new(&script)
            .arg("start")
            .arg(&dir)
            .args(opts)
            .stdin(Stdio::null())
            .output()
            .expect("run tests/lab/ceph-dev-cluster start");
        assert!(
            out.status.success(),
            "starting a private cluster in {} failed:\n{}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let conf = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .expect("ceph-dev-cluster prints the ceph.conf path")
            .trim()
            .to_owned();
        PrivateCluster {
            dir,
            lab: Lab {
                conf: conf.into(),
                client_id: "admin".into(),
                kernel_cache: lab.kernel_cache.clone(),
                guest_bin: lab.guest_bin.clone(),
                dir: lab.dir.clone(),
                top: lab.top.clone(),
            },
        }
    }

    /// Set the OSD's configuration option `key` to `value` through its admin socket.
    pub fn osd_config(&self, key: &str, value: &str) {
        let asok = self.dir.join("run/ceph-osd.0.asok");
        let out = Command::new("ceph")
            .arg("--admin-daemon")
            .arg(&asok)
            .args(["config", "set", key, value])
            .output()
            .expect("run ceph --admin-daemon");
        assert!(
            out.status.success(),
            "ceph --admin-daemon {} config set {key} {value}: {}",
            asok.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `ceph-dev-cluster fail-mds`: the active MDS fails over to a standby; returns once the
    /// new one is active (the cluster must have been started with a standby).
    pub fn fail_mds(&self) {
        let out = Command::new(self.lab.top.join("tests/lab/ceph-dev-cluster"))
            .arg("fail-mds")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output()
            .expect("run tests/lab/ceph-dev-cluster fail-mds");
        assert!(
            out.status.success(),
            "ceph-dev-cluster fail-mds {}: {}",
            self.dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `ceph-dev-cluster status`: every daemon running and the MDS active.
    pub fn healthy(&self) -> (bool, String) {
        let out = Command::new(self.lab.top.join("tests/lab/ceph-dev-cluster"))
            .arg("status")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output()
            .expect("run tests/lab/ceph-dev-cluster status");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && text.contains("up:active"), text)
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = Command::new(self.lab.top.join("tests/lab/ceph-dev-cluster"))
            .arg("stop")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output();
    }
}

/// A daemon whose stderr is a pipe nobody reads (as a log collector that has fallen behind),
/// and that pipe's read end (kept open, so writes do not fail with EPIPE). Stdout goes to the
/// usual log file.
pub fn daemon_with_stalled_stderr(
    lab: &Lab,
    work: &Path,
    ceph_root: &str,
    extra: &[&str],
) -> (Daemon, std::process::ChildStderr) {
    let socket = work.join("vhost-fs.sock");
    let log = work.join("daemon.log");
    let logf = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(super::daemon_binary())
        .arg("--socket-path")
        .arg(&socket)
        .arg("--ceph-conf")
        .arg(&lab.conf)
        .args(["--client-id", &lab.client_id, "--ceph-root", ceph_root])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(logf)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ceph-virtiofsd");
    let stderr = child.stderr.take().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !socket.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "ceph-virtiofsd exited before listening"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "ceph-virtiofsd did not listen"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (
        Daemon {
            child: Some(child),
            socket,
            log,
        },
        stderr,
    )
}
