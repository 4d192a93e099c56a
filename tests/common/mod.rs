//! The lab the daemon's integration tests run in: a real Ceph cluster (tests/lab/ceph-dev-cluster)
//! and a real Linux guest under QEMU (tests/lab/guest/*), both set up by `tests/run`, which
//! exports where they are. Run the tests through `tests/run`, not bare `cargo test`.

#![allow(dead_code)]

pub mod hostile;
pub mod quarantine;

use std::ffi::CString;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ceph_client::{Mount, MountBuilder, UserPerm, CEPH_STATX_BASIC_STATS};

/// Who may use the lab cluster while a test runs. Cargo runs the tests of one binary on parallel
/// threads (and the binaries one after another), so a test that needs the cluster to itself —
/// it fills it, restarts its MDS, floods `/volumes` — holds [`cluster_alone`] for its whole run,
/// and every other test of its binary holds [`cluster_shared`]; a binary with no such test
/// needs neither. [`every_test_takes_the_cluster_gate`] checks a binary's sources for that.
static CLUSTER_GATE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Wait until no other test of this binary holds the cluster, then keep it until the guard is
/// dropped (the end of the test, also when it fails).
pub fn cluster_alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    // A test that failed holding the gate is over: the next one may go on.
    CLUSTER_GATE
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Use the cluster beside the other tests of this binary, but never beside a test that holds
/// [`cluster_alone`]; kept until the guard is dropped.
pub fn cluster_shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CLUSTER_GATE
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Every `#[test]` fn of the test binary in `tests/<binary>/` (its `main.rs` and modules) takes
/// [`cluster_alone`] or [`cluster_shared`] in its own body, except `exempt` (tests that do not
/// touch the cluster). A test added to a binary that has a test needing the cluster alone
/// fails here until it says which it is.
pub fn every_test_takes_the_cluster_gate(binary: &str, exempt: &[&str]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(binary);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    let mut missing = Vec::new();
    for path in &files {
        let file = path.display();
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.trim() != "#[test]" {
                continue;
            }
            // The fn after its attributes and doc comments; its body ends at the `}` of its
            // own indentation.
            let Some((at, head)) = lines[i..]
                .iter()
                .enumerate()
                .find(|(_, l)| l.trim_start().starts_with("fn "))
            else {
                continue;
            };
            let indent = &head[..head.len() - head.trim_start().len()];
            let name: String = head
                .trim_start()
                .trim_start_matches("fn ")
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let end = format!("{indent}}}");
            let gated = lines[i + at..]
                .iter()
                .take_while(|l| **l != end)
                .any(|l| l.contains("cluster_alone()") || l.contains("cluster_shared()"));
            if !gated && !exempt.contains(&name.as_str()) {
                missing.push(format!("{file}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "tests that take neither common::cluster_shared() nor common::cluster_alone() (one \
         of their binary's tests needs the cluster alone; see tests/common/mod.rs):\n{}",
        missing.join("\n")
    );
}

/// FUSE request credentials of a guest caller.
pub fn ctx(uid: u32, gid: u32) -> fuse_backend_rs::api::filesystem::Context {
    let mut c = fuse_backend_rs::api::filesystem::Context::new();
    c.uid = uid;
    c.gid = gid;
    c
}

pub fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// The raw errno of a call that must fail.
pub fn errno<T>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(_) => panic!("expected an error, got success"),
        Err(e) => e.raw_os_error().expect("raw errno"),
    }
}

/// The daemon the tests run: `CEPH_VIRTIOFSD_DAEMON` if set (tests/run's release cell points it
/// at the daemon built against another Ceph release, run in that release's root filesystem),
/// else the one cargo built with these tests.
pub fn daemon_binary() -> PathBuf {
    std::env::var_os("CEPH_VIRTIOFSD_DAEMON").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_ceph-virtiofsd")),
        PathBuf::from,
    )
}

/// The `ceph-virtiofsd-bench` binary (the hostile guest's frontend), which lives in a crate of
/// its own (`bench/`), so cargo gives this package's tests no `CARGO_BIN_EXE_` for it: the
/// path in `CEPH_VIRTIOFSD_BENCH` if set, else the one next to this test executable's profile
/// directory (`target/<profile>/deps/TEST` → `target/<profile>/ceph-virtiofsd-bench`).
/// `tests/run` builds it before testing; a bare `cargo test` does not.
pub fn bench_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("CEPH_VIRTIOFSD_BENCH") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable lives in target/<profile>/deps");
    let bench = profile.join("ceph-virtiofsd-bench");
    assert!(
        bench.is_file(),
        "{} is missing: build it first with `cargo build -p ceph-virtiofsd-bench` (add \
         --release for a release test run; `cargo build --workspace` builds it too, and \
         tests/run does), or point CEPH_VIRTIOFSD_BENCH at one",
        bench.display()
    );
    bench
}

#[derive(Clone)]
pub struct Lab {
    pub conf: PathBuf,
    pub client_id: String,
    pub kernel_cache: PathBuf,
    pub guest_bin: PathBuf,
    pub dir: PathBuf,
    pub top: PathBuf,
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests through tests/run, which starts the Ceph cluster and prepares the guest")
    })
}

impl Lab {
    pub fn get() -> Lab {
        let top = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        Lab {
            conf: env("CEPH_CONF").into(),
            client_id: std::env::var("CEPH_CLIENT_ID").unwrap_or_else(|_| "admin".into()),
            kernel_cache: env("GUEST_KERNEL_CACHE").into(),
            guest_bin: env("GUEST_BIN_DIR").into(),
            dir: env("CEPH_VIRTIOFSD_LAB").into(),
            top,
        }
    }

    /// The `ceph` CLI on this lab's cluster, as `client_id`: the cluster's own release's
    /// (`ceph-dev-cluster ceph DIR`) when the cluster is one of the lab's, since the host's
    /// Pacific CLI cannot talk to a Tentacle mon; the host's `ceph` otherwise.
    pub fn ceph_cli(&self) -> Command {
        let dir = self
            .conf
            .parent()
            .filter(|d| d.join("cluster.env").is_file());
        let mut c = match dir {
            Some(d) => {
                let mut c = Command::new(self.top.join("tests/lab/ceph-dev-cluster"));
                c.arg("ceph").arg(d);
                c
            }
            None => {
                let mut c = Command::new("ceph");
                c.arg("-c").arg(&self.conf);
                c
            }
        };
        c.args(["--id", &self.client_id]);
        c
    }

    /// A second, independent CephFS client (the "other host"), mounted at the filesystem root.
    pub fn ceph(&self) -> Mount {
        MountBuilder::new(Some(&self.client_id))
            .and_then(|b| b.conf_read_file(Some(&self.conf)))
            .and_then(|b| b.mount("/"))
            .expect("mount CephFS from the test")
    }

    /// Create a fresh, world-writable directory at the CephFS root for one test.
    pub fn export_dir(&self, name: &str) -> String {
        let m = self.ceph();
        let root = m.lookup_root().unwrap();
        let perm = UserPerm::root();
        let cname = CString::new(name).unwrap();
        let (dir, _) = m
            .mkdir(&root, &cname, 0o777, CEPH_STATX_BASIC_STATS, 0, &perm)
            .unwrap_or_else(|e| panic!("mkdir /{name} in CephFS: {e}"));
        // mkdir honours no umask here, but make it explicit.
        let st = ceph_client::Statx {
            stx_mode: 0o777,
            ..Default::default()
        };
        m.setattr(&dir, &st, ceph_client::CEPH_SETATTR_MODE, &perm)
            .unwrap();
        format!("/{name}")
    }

    pub fn scratch(&self, name: &str) -> PathBuf {
        let d = self.dir.join("scratch").join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

/// A running ceph-virtiofsd, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Daemon {
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    pub fn start(lab: &Lab, work: &Path, ceph_root: &str, extra: &[&str]) -> Daemon {
        Daemon::start_as(lab, work, ceph_root, &lab.client_id, extra)
    }

    /// [`Daemon::start`] as cephx client `client_id` (give its keyring in `extra`).
    pub fn start_as(
        lab: &Lab,
        work: &Path,
        ceph_root: &str,
        client_id: &str,
        extra: &[&str],
    ) -> Daemon {
        let socket = work.join("vhost-fs.sock");
        let log = work.join("daemon.log");
        let logf = std::fs::File::create(&log).unwrap();
        let child = Command::new(daemon_binary())
            .arg("--socket-path")
            .arg(&socket)
            .arg("--ceph-conf")
            .arg(&lab.conf)
            .arg("--client-id")
            .arg(client_id)
            .arg("--ceph-root")
            .arg(ceph_root)
            .args(if extra.contains(&"--log-level") {
                &[][..]
            } else {
                &["--log-level", "info"][..]
            })
            .args(extra)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("start ceph-virtiofsd");
        let mut d = Daemon {
            child: Some(child),
            socket,
            log,
        };
        d.wait_listening();
        d
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.socket.exists() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "ceph-virtiofsd exited ({status}) before listening:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "ceph-virtiofsd did not listen within 60 s:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGTERM and wait; the exit status of the daemon.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    /// Stops the daemon as an operator would (SIGTERM: it unmounts and ends its MDS session),
    /// SIGKILL only after the bound of `stop`. A daemon killed outright leaves its session for
    /// the MDS to time out, and an MDS restart in another test then waits for it to reconnect
    /// (tests/faults/main.rs saw a guest's first write wait past its 20 s bound).
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a guest run printed and how it ended.
pub struct GuestRun {
    pub status: ExitStatus,
    pub console: String,
}

impl GuestRun {
    pub fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| 128 + self.status.signal().unwrap_or(0))
    }

    /// The lines of the console that report a failed in-guest check ("not ok ...").
    pub fn not_ok(&self) -> Vec<&str> {
        self.console
            .lines()
            .filter(|l| l.starts_with("not ok"))
            .collect()
    }

    /// The "N passed, M failed" closing line of a suite, if printed.
    pub fn counts(&self, after: &str) -> Option<(u32, u32)> {
        let start = self.console.find(after).unwrap_or(0);
        self.console[start..].lines().find_map(|l| {
            let l = l.trim();
            let (p, rest) = l.split_once(" passed, ")?;
            let f = rest
                .strip_suffix(" failed")
                .or_else(|| rest.split(" failed").next())?;
            Some((
                p.trim().rsplit(' ').next()?.parse().ok()?,
                f.trim().parse().ok()?,
            ))
        })
    }
}

/// Boot the guest kernel with `script` as its test program, the share of `daemon` on /mnt, and
/// `adds` (host path, guest path) copied into the initramfs.
pub fn run_guest(
    lab: &Lab,
    work: &Path,
    daemon: &Daemon,
    script: &str,
    adds: &[(PathBuf, &str)],
    timeout_secs: u32,
) -> GuestRun {
    run_guest_env(lab, work, daemon, script, adds, timeout_secs, &[])
}

/// [`run_guest`] with environment for the harness (GUEST_KERNEL_SUITE, GUEST_SMP,
/// GUEST_FS_QUEUES: see tests/lab/guest/README.md).
pub fn run_guest_env(
    lab: &Lab,
    work: &Path,
    daemon: &Daemon,
    script: &str,
    adds: &[(PathBuf, &str)],
    timeout_secs: u32,
    env: &[(&str, &str)],
) -> GuestRun {
    let script_path = work.join("test.sh");
    std::fs::write(&script_path, script).unwrap();
    let initrd = work.join("initramfs.cpio.gz");
    let mut b = Command::new(lab.top.join("tests/lab/guest/build-initramfs"));
    b.envs(env.iter().copied());
    b.arg("--kernel-cache")
        .arg(&lab.kernel_cache)
        .arg("--out")
        .arg(&initrd)
        .arg("--script")
        .arg(&script_path);
    for (host, guest) in adds {
        b.arg("--add").arg(format!("{}:{}", host.display(), guest));
    }
    let st = b.status().expect("run build-initramfs");
    assert!(st.success(), "build-initramfs failed: {st}");

    let console = work.join("console.log");
    let mut child = Command::new(lab.top.join("tests/lab/guest/run-guest"))
        .envs(env.iter().copied())
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["--tag", "cephfs"])
        .arg("--initrd")
        .arg(&initrd)
        .arg("--kernel-cache")
        .arg(&lab.kernel_cache)
        .args(["--mem", "1G"])
        .args(["--timeout", &timeout_secs.to_string()])
        .arg("--log")
        .arg(&console)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run run-guest");
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let status = child.wait().unwrap();
    // Show the console in the test's output: it is what tells a failure apart.
    println!(
        "---- guest console ({}) ----\n{out}\n---- end ----",
        work.display()
    );
    GuestRun {
        status,
        console: out,
    }
}

/// A seed for a randomized guest run: the value of the environment variable `var` when set
/// (to replay a run), else a new one each run (no RNG crate: the std hasher is randomly keyed).
pub fn seed_from_env(var: &str) -> u64 {
    if let Ok(s) = std::env::var(var) {
        return s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var} must be a u64"));
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    h.finish() >> 1
}

/// WRITE payload from plain memory, standing in for the guest buffer of a virtqueue chain.
pub struct Payload(pub Vec<u8>);

impl std::io::Read for Payload {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0.drain(..n);
        Ok(n)
    }
}

impl fuse_backend_rs::api::filesystem::ZeroCopyReader for Payload {
    fn read_to(
        &mut self,
        f: &mut dyn fuse_backend_rs::file_traits::FileReadWriteVolatile,
        count: usize,
        off: u64,
    ) -> std::io::Result<usize> {
        let n = count.min(self.0.len());
        let slice = vm_memory::VolatileSlice::from(&mut self.0[..n]);
        f.write_at_volatile(
            fuse_backend_rs::file_buf::FileVolatileSlice::from_volatile_slice(&slice),
            off,
        )
    }
}

/// READ reply buffer in plain memory, standing in for the guest buffer of a virtqueue chain.
pub struct Sink(pub Vec<u8>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl fuse_backend_rs::api::filesystem::ZeroCopyWriter for Sink {
    fn write_from(
        &mut self,
        f: &mut dyn fuse_backend_rs::file_traits::FileReadWriteVolatile,
        count: usize,
        off: u64,
    ) -> std::io::Result<usize> {
        let mut buf = vec![0u8; count];
        let slice = vm_memory::VolatileSlice::from(&mut buf[..]);
        let n = f.read_at_volatile(
            fuse_backend_rs::file_buf::FileVolatileSlice::from_volatile_slice(&slice),
            off,
        )?;
        self.0.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn available_bytes(&self) -> usize {
        usize::MAX
    }
}

/// `name` in `parent` through a test's own CephFS client, with its size.
pub fn ceph_lookup(
    m: &Mount,
    parent: &ceph_client::Inode,
    name: &str,
) -> Option<(ceph_client::Inode, u64)> {
    let n = CString::new(name).unwrap();
    m.lookup(parent, &n, CEPH_STATX_BASIC_STATS, 0, &UserPerm::root())
        .ok()
        .map(|(i, st)| (i, st.stx_size))
}

/// The directory at `path` (from the CephFS root) through a test's own CephFS client.
pub fn ceph_dir(m: &Mount, path: &str) -> ceph_client::Inode {
    let mut cur = m.lookup_root().unwrap();
    for c in path.split('/').filter(|c| !c.is_empty()) {
        cur = ceph_lookup(m, &cur, c)
            .unwrap_or_else(|| panic!("{path}: no {c}"))
            .0;
    }
    cur
}

/// Whether `name` exists in `parent`, through a test's own client.
pub fn ceph_exists(m: &Mount, parent: &ceph_client::Inode, name: &str) -> bool {
    ceph_lookup(m, parent, name).is_some()
}

/// The daemon's metrics page, fetched over its Unix socket (`--metrics-socket`); the answer
/// must be an HTTP 200 in the Prometheus text format.
pub fn scrape_metrics(socket: &Path) -> String {
    use std::io::Write;
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connect to metrics socket {}: {e}", socket.display()));
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    body.to_owned()
}

/// The value of the sample of a metrics page whose name-and-labels part is exactly `series`.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.rsplit_once(' ').filter(|(s, _)| *s == series))
        .and_then(|(_, v)| v.parse().ok())
}

/// Create the empty file `name` in the directory `dir` (from the CephFS root) through a test's
/// own client: the usual way to tell a guest script to stop.
pub fn ceph_touch(lab: &Lab, dir: &str, name: &str) {
    let m = lab.ceph();
    let d = ceph_dir(&m, dir);
    let n = CString::new(name).unwrap();
    m.create(
        &d,
        &n,
        0o644,
        libc::O_CREAT | libc::O_WRONLY,
        CEPH_STATX_BASIC_STATS,
        0,
        &UserPerm::root(),
    )
    .unwrap_or_else(|e| panic!("create {dir}/{name}: {e}"));
}

/// A POSIX lock request of type `t` (`F_WRLCK`, `F_UNLCK`, ...) on a whole file.
pub fn whole_file(t: i32) -> libc::flock {
    libc::flock {
        l_type: t as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    }
}

/// Another client's write lock on the whole of file `name` in `dir` (created if missing),
/// taken through a test's own CephFS client: a guest's lock request on the file waits until
/// the returned handle unlocks it or is dropped.
pub fn hold_write_lock(lab: &Lab, dir: &str, name: &str) -> ceph_client::File {
    let m = lab.ceph();
    let d = ceph_dir(&m, dir);
    let n = CString::new(name).unwrap();
    let (_, _, held) = m
        .create(
            &d,
            &n,
            0o666,
            libc::O_RDWR | libc::O_CREAT,
            CEPH_STATX_BASIC_STATS,
            0,
            &UserPerm::root(),
        )
        .unwrap_or_else(|e| panic!("create {dir}/{name}: {e}"));
    held.setlk(&whole_file(libc::F_WRLCK), 1, false)
        .unwrap_or_else(|e| panic!("write-lock {dir}/{name}: {e}"));
    held
}

/// The whole content of `name` in `parent`, read through a test's own CephFS client.
pub fn ceph_read_all(m: &Mount, parent: &ceph_client::Inode, name: &str) -> Vec<u8> {
    let (ino, size) = ceph_lookup(m, parent, name).unwrap_or_else(|| panic!("no {name}"));
    let f = m.open(&ino, libc::O_RDONLY, &UserPerm::root()).unwrap();
    let mut buf = vec![0u8; usize::try_from(size).unwrap()];
    let mut off = 0;
    while off < buf.len() {
        let k = f.read(off as u64, &mut buf[off..]).unwrap();
        if k == 0 {
            break;
        }
        off += k;
    }
    buf.truncate(off);
    buf
}

/// The guest's `MARKER written=N error=...` line and its N (tests that write until refused).
pub fn stop_line(console: &str, marker: &str) -> (String, usize) {
    let line = console
        .lines()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no {marker} line:\n{console}"))
        .to_owned();
    let written = line
        .split("written=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no written=N in {line}"));
    (line, written)
}

/// WRITE of `data` at `off` through handle `fh`, as root, the way the server sends it.
pub fn fs_write(
    fs: &ceph_virtiofsd::fs::CephFs,
    ino: u64,
    fh: u64,
    off: u64,
    data: &[u8],
) -> std::io::Result<usize> {
    use fuse_backend_rs::api::filesystem::FileSystem;
    fs.write(
        &ctx(0, 0),
        ino,
        fh,
        &mut Payload(data.to_vec()),
        u32::try_from(data.len()).unwrap(),
        off,
        None,
        false,
        0,
        0,
    )
}

/// The filesystem layer on a fresh export `name` of the test cluster, called in-process the way
/// fuse-backend-rs's server calls it, after FUSE_INIT with what a Linux 6.1 guest offers.
pub fn fs_layer(lab: &Lab, name: &str) -> ceph_virtiofsd::fs::CephFs {
    fs_layer_with(lab, name, |_| {})
}

/// [`fs_layer`] with options changed by `adjust`.
pub fn fs_layer_with(
    lab: &Lab,
    name: &str,
    adjust: impl FnOnce(&mut ceph_virtiofsd::fs::FsConfig),
) -> ceph_virtiofsd::fs::CephFs {
    use fuse_backend_rs::api::filesystem::FileSystem;
    let export = lab.export_dir(name);
    let mount = MountBuilder::new(Some(&lab.client_id))
        .and_then(|b| b.conf_read_file(Some(&lab.conf)))
        .and_then(|b| b.mount(&export))
        .unwrap();
    let (client_id, conf) = (lab.client_id.clone(), lab.conf.clone());
    let connect = move || {
        MountBuilder::new(Some(&client_id))
            .and_then(|b| b.conf_read_file(Some(&conf)))
            .and_then(|b| b.mount(&export))
    };
    let mut cfg = ceph_virtiofsd::fs::FsConfig {
        second_session: Some(ceph_virtiofsd::fs::side::Connector(std::sync::Arc::new(
            connect,
        ))),
        ..Default::default()
    };
    adjust(&mut cfg);
    let fs = ceph_virtiofsd::fs::CephFs::new(mount, cfg).unwrap();
    fs.init(
        fuse_backend_rs::abi::fuse_abi::FsOptions::HANDLE_KILLPRIV_V2
            | fuse_backend_rs::abi::fuse_abi::FsOptions::ASYNC_READ,
    )
    .unwrap();
    fs
}

/// CREATE of `name` in `parent` (O_RDWR) by `who`: the node id and the open handle.
pub fn create_as(
    fs: &ceph_virtiofsd::fs::CephFs,
    who: &fuse_backend_rs::api::filesystem::Context,
    parent: u64,
    name: &std::ffi::CStr,
    mode: u32,
) -> (u64, u64) {
    use fuse_backend_rs::api::filesystem::FileSystem;
    let (e, fh, _, _) = fs
        .create(
            who,
            parent,
            name,
            fuse_backend_rs::abi::fuse_abi::CreateIn {
                flags: libc::O_RDWR as u32,
                mode,
                umask: 0,
                fuse_flags: 0,
            },
        )
        .unwrap();
    (e.inode, fh.unwrap())
}
