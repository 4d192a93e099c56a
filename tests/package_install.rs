//! The Debian package as an operator meets it, for Debian bookworm (Ceph 16) and for trixie
//! (Ceph 18): built against that release's libcephfs2, installed with dpkg into a root filesystem
//! of that release, started by systemd from its unit, serving a real guest.
//!
//! Per release:
//! 1. The package. bookworm's is packaged on the host (a bookworm machine) from this test run's
//!    daemon; trixie's daemon is built in the lab's trixie root filesystem (`tests/lab/rootfs
//!    --run 18`) against trixie's libcephfs-dev and packaged there. Both with `cargo deb
//!    --no-build` from a debug build laid out as a release build: the packaging of `cargo deb`
//!    (stripping, -dbgsym, dpkg-shlibdeps of that release), without a release build's many
//!    minutes. Its Depends must name that release's libcephfs2.
//! 2. The root filesystem: the lab's cached one of that release (`tests/lab/rootfs 16|18`), under
//!    an overlay in a private mount namespace (lower: the cache, never written; upper: a scratch
//!    directory). The cache stays as it was, so a cluster may run from it meanwhile, and each
//!    run starts from a clean system. The mount dies with the namespace, even on SIGKILL.
//! 3. Real systemd: `systemd-nspawn --boot` of the overlay. In it, `dpkg -i` (the postinst
//!    makes the user, /etc/ceph-virtiofsd and, through tmpfiles.d, /run/ceph-virtiofsd), the
//!    operator's steps of packaging/README.md (ceph.conf, /etc/ceph-virtiofsd/vm1.toml and
//!    vm1.keyring, root-only) and `systemctl start ceph-virtiofsd@vm1`: the unit as shipped,
//!    its sandbox included. A host directory is bound at the unit's /run/ceph-virtiofsd, so
//!    QEMU on the host connects to vm1.sock there as it would on the machine itself.
//! 4. The reboot-order race: the socket exists the moment `systemctl start` returns (the unit
//!    is Type=notify: the daemon says READY=1 once it listens and CephFS is mounted), and QEMU
//!    starts right then. With main's Type=simple unit, start returned before the mount, and the
//!    socket was not there yet.
//! 5. The lab's guest mounts the share, reads a file another CephFS client wrote and writes one,
//!    whose bytes the host's own CephFS client then reads.
//! 6. Least privilege: the daemon runs as the instance's own dynamic user, no thread keeps a
//!    capability; a second instance (vm2) cannot read vm1's keyring, and vm1 cannot read vm2's
//!    (as each daemon's uid and groups, in its own mount namespace: /etc/ceph-virtiofsd is not
//!    there, and the other's credentials are the other user's alone). The watchdog is on.
//! 7. An upgrade (`dpkg -i` of the package again) restarts nothing: same MainPID, NRestarts=0.
//! 8. Still running after the guest, never restarted; `systemctl stop ceph-virtiofsd@vm1`: the
//!    daemon logs its clean stop and exits with status 0 (systemd: "Deactivated successfully",
//!    no "Main process exited" nor "Failed with result").
//!
//! The package is also checked with that release's lintian (bookworm's on the host, trixie's in
//! the trixie root filesystem, added there by `tests/lab/rootfs --install 18 lintian`): no error
//! and no warning.
//!
//! `CEPH_VIRTIOFSD_DEB_BOOKWORM` / `CEPH_VIRTIOFSD_DEB_TRIXIE` name a package built elsewhere (a
//! release build, `cargo deb`; its .ddeb beside it) to test instead of building one.
//!
//! Needs root, systemd-nspawn (package systemd-container), overlayfs, cargo-deb and the lab of
//! tests/run (cluster, guest kernel). The root filesystems are made on first use (minutes,
//! network); the trixie daemon's first build in its root filesystem takes minutes too, later
//! ones are incremental (target/trixie-build).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{ceph_dir, ceph_read_all, run_guest, Daemon, Lab};

const DAEMON: &str = env!("CARGO_BIN_EXE_ceph-virtiofsd");
const INSTANCE: &str = "vm1";
/// A second instance, beside the first: neither may read the other's keyring.
const OTHER: &str = "vm2";

struct Release {
    /// tests/lab/rootfs's name for it
    number: &'static str,
    suite: &'static str,
    /// the major version of that release's libcephfs2 (Ceph)
    ceph_major: u32,
}

const BOOKWORM: Release = Release {
    number: "16",
    suite: "bookworm",
    ceph_major: 16,
};
const TRIXIE: Release = Release {
    number: "18",
    suite: "trixie",
    ceph_major: 18,
};

fn top() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Run `cmd`; panic naming `step` with its output when it cannot start or fails.
fn must(step: &str, cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{step}: cannot run {cmd:?}: {e} (is it installed?)"));
    assert!(
        out.status.success(),
        "{step}: {cmd:?} failed ({}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The lab's cached root filesystem of `rel`, made on first use (tests/lab/rootfs).
fn rootfs(rel: &Release) -> PathBuf {
    let out = must(
        &format!(
            "the {} root filesystem (tests/lab/rootfs {})",
            rel.suite, rel.number
        ),
        Command::new(top().join("tests/lab/rootfs"))
            .arg(rel.number)
            .stderr(Stdio::inherit()),
    );
    PathBuf::from(out.trim())
}

/// The one file ending in `ext` in `dir`.
fn the_file(dir: &Path, ext: &str) -> PathBuf {
    let found: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one .{ext} in {}: {found:?}",
        dir.display()
    );
    found[0].clone()
}

/// Build the package of `rel` into a fresh directory; the .deb's path.
fn build_package(rel: &Release) -> PathBuf {
    // A package built elsewhere (a release build: see packaging/README.md) is tested as is.
    let var = format!("CEPH_VIRTIOFSD_DEB_{}", rel.suite.to_uppercase());
    if let Some(deb) = std::env::var_os(&var) {
        let deb = PathBuf::from(deb);
        assert!(deb.is_file(), "{var}={}: no such file", deb.display());
        check_package(rel, &deb);
        return deb;
    }
    // Laid out as a release build (cargo deb --no-build packages target/release/ceph-virtiofsd).
    let (out_dir, mut cmd) = if rel.suite == "bookworm" {
        let host = fs::read_to_string("/etc/os-release").unwrap_or_default();
        assert!(
            host.lines().any(|l| l == "VERSION_CODENAME=bookworm"),
            "the bookworm package is built on the host, which must run Debian bookworm:\n{host}"
        );
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("package-bookworm");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("target/release")).unwrap();
        let bin = dir.join("target/release/ceph-virtiofsd");
        if fs::hard_link(DAEMON, &bin).is_err() {
            fs::copy(DAEMON, &bin).unwrap();
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(top())
            .env("CARGO_TARGET_DIR", dir.join("target"))
            .args(["deb", "--no-build", "--fast", "--output"])
            .arg(dir.join("out"));
        (dir.join("out"), cmd)
    } else {
        // In the root filesystem, whose `--run` sets CARGO_TARGET_DIR=<repo>/target/SUITE-build.
        let build = top().join(format!("target/{}-build", rel.suite));
        let dir = build.join("package");
        let _ = fs::remove_dir_all(&dir);
        let script = "set -e; \
            cargo build --locked -p ceph-virtiofsd; \
            p=$CARGO_TARGET_DIR/package; mkdir -p $p/target/release; \
            cp $CARGO_TARGET_DIR/debug/ceph-virtiofsd $p/target/release/; \
            CARGO_TARGET_DIR=$p/target cargo deb --no-build --fast --variant trixie --output $p/out";
        let mut cmd = Command::new(top().join("tests/lab/rootfs"));
        cmd.args(["--run", rel.number, script]);
        (dir.join("out"), cmd)
    };
    must(
        &format!(
            "building the {} package (cargo-deb: `cargo install cargo-deb --locked`)",
            rel.suite
        ),
        &mut cmd,
    );
    let deb = the_file(&out_dir, "deb");
    check_package(rel, &deb);
    deb
}

/// The package of `rel`: stripped, with its -dbgsym beside it, depending on that release's
/// libcephfs2 and on adduser, and lintian clean with that release's lintian.
fn check_package(rel: &Release, deb: &Path) {
    the_file(deb.parent().unwrap(), "ddeb");
    lintian(rel, deb);

    // Stripped: the debug sections went to the -dbgsym package (.debug_gdb_scripts is loaded
    // data, rustc's pretty-printer hint, not debug info).
    let unpacked =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("unpacked-{}", rel.suite));
    let _ = fs::remove_dir_all(&unpacked);
    must(
        "dpkg-deb -x",
        Command::new("dpkg-deb").arg("-x").arg(deb).arg(&unpacked),
    );
    let sections = must(
        "readelf -SW",
        Command::new("readelf")
            .arg("-SW")
            .arg(unpacked.join("usr/libexec/ceph-virtiofsd")),
    );
    assert!(
        !sections
            .split_whitespace()
            .any(|w| w.starts_with(".debug_") && w != ".debug_gdb_scripts"),
        "{}: the packaged daemon carries debug sections:\n{sections}",
        rel.suite
    );

    // Linked against that release's libcephfs2, which Depends names.
    let depends = must(
        "dpkg-deb -f Depends",
        Command::new("dpkg-deb").arg("-f").arg(deb).arg("Depends"),
    );
    println!(
        "{} package: {}\n  Depends: {}",
        rel.suite,
        deb.display(),
        depends.trim()
    );
    // dpkg-shlibdeps' own bound is what the symbols used need (16.2.6 on both releases); the
    // trixie variant adds its release's floor. The highest bound is that release's Ceph.
    let major = depends
        .split(',')
        .map(str::trim)
        .filter(|d| d.starts_with("libcephfs2 ") || *d == "libcephfs2")
        .map(|d| {
            let version = d
                .split_once(">=")
                .map(|(_, v)| v.trim().trim_end_matches(')'))
                .unwrap_or_else(|| panic!("{}: no version in '{d}'", rel.suite));
            version
                .split(['.', ':'])
                .next()
                .and_then(|m| m.parse::<u32>().ok())
                .unwrap_or_else(|| panic!("{}: cannot read the version of '{d}'", rel.suite))
        })
        .max()
        .unwrap_or_else(|| panic!("{}: Depends names no libcephfs2: {depends}", rel.suite));
    assert_eq!(
        major, rel.ceph_major,
        "{}: Depends {depends}: not that release's libcephfs2",
        rel.suite
    );
    assert!(
        depends.split(',').any(|d| d.trim().starts_with("adduser")),
        "the postinst may run adduser: Depends must name it: {depends}"
    );
}

/// A booted root filesystem: systemd-nspawn on an overlay of `lower`, in a private mount
/// namespace. Powered off (SIGTERM to nspawn), and killed after a bound, when dropped.
struct Container {
    nspawn: Option<Child>,
    pid1: u32,
    log: PathBuf,
}

/// The container's init: the child of nspawn that runs systemd (nspawn forks helpers too).
fn container_init(nspawn: u32) -> Option<u32> {
    children(nspawn).into_iter().find(|p| {
        fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "systemd")
    })
}

/// The pids whose parent is `ppid`.
fn children(ppid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if parent == Some(ppid) {
            found.push(pid);
        }
    }
    found
}

impl Container {
    /// Boot `lower` with the overlay's upper layer in `work`, binding each (host dir, container
    /// dir, read-only).
    fn boot(lower: &Path, work: &Path, name: &str, binds: &[(&Path, &str, bool)]) -> Container {
        let log = work.join("container.log");
        let logf = fs::File::create(&log).unwrap();
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-euc"])
            .arg(
                "lower=$1 work=$2; shift 2\n\
                 mkdir -p \"$work/upper\" \"$work/overlay-work\" \"$work/merged\"\n\
                 mount -t overlay overlay -o \"lowerdir=$lower,upperdir=$work/upper,workdir=$work/overlay-work\" \"$work/merged\"\n\
                 exec systemd-nspawn --boot --keep-unit --register=no -D \"$work/merged\" \"$@\"",
            )
            .arg("boot")
            .arg(lower)
            .arg(work)
            .arg(format!("--machine={name}"));
        for (host, inside, ro) in binds {
            let opt = if *ro { "--bind-ro" } else { "--bind" };
            cmd.arg(format!("{opt}={}:{inside}", host.display()));
        }
        let mut nspawn = cmd
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .unwrap_or_else(|e| panic!("booting {}: cannot run unshare: {e}", lower.display()));
        // unshare and sh exec, so this pid is nspawn's; the container's init is its child.
        let deadline = Instant::now() + Duration::from_secs(120);
        let pid1 = loop {
            if let Some(st) = nspawn.try_wait().unwrap() {
                panic!(
                    "booting {} with systemd-nspawn (package systemd-container; the overlay \
                     mount needs root): exited {st} before starting the container:\n{}",
                    lower.display(),
                    fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if let Some(p) = container_init(nspawn.id()) {
                break p;
            }
            assert!(
                Instant::now() < deadline,
                "systemd-nspawn started no systemd in 120 s:\n{}",
                fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let c = Container {
            nspawn: Some(nspawn),
            pid1,
            log,
        };
        // Until the boot is done: "running", or "degraded" when a unit of the image failed
        // (the lab's root filesystems carry Ceph's units; nvmf-autoconnect fails in a container).
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let out = c.exec(&["systemctl", "is-system-running", "--wait"]);
            let state = text(&out.stdout).trim().to_owned();
            let error = text(&out.stderr);
            if state == "running" || state == "degraded" {
                if state == "degraded" {
                    let failed = c.exec(&["systemctl", "--failed", "--no-legend", "--plain"]);
                    println!("{name}: booted degraded:\n{}", text(&failed.stdout));
                }
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: systemd did not finish booting in 300 s (state '{state}', \
                 error '{}'):\n{}",
                error.trim(),
                c.console()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        c
    }

    fn console(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Run `args` in the container (all its namespaces, its root), with a plain environment.
    fn exec(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .args(["--target", &self.pid1.to_string(), "--all", "--"])
            .args([
                "/usr/bin/env",
                "-i",
                "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C",
            ])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run nsenter (util-linux)")
    }

    /// [`Container::exec`], which must succeed; its stdout.
    fn run(&self, step: &str, args: &[&str]) -> String {
        let out = self.exec(args);
        assert!(
            out.status.success(),
            "{step}: `{}` in the container failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    fn journal(&self, unit: &str) -> String {
        text(
            &self
                .exec(&["journalctl", "--no-pager", "-o", "cat", "-u", unit])
                .stdout,
        )
    }

    /// Power off (nspawn turns SIGTERM into an orderly shutdown of the container), SIGKILL
    /// after a bound.
    fn poweroff(&mut self) {
        let Some(mut nspawn) = self.nspawn.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &nspawn.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if nspawn.try_wait().unwrap().is_some() {
                return;
            }
            if Instant::now() > deadline {
                // The container's init first: its pid namespace goes with it.
                let _ = Command::new("kill")
                    .args(["-KILL", &self.pid1.to_string()])
                    .status();
                let _ = nspawn.kill();
                let _ = nspawn.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.poweroff();
    }
}

/// `key = value` of the lab's ceph.conf (first occurrence; spaces and underscores alike).
fn conf_value(conf: &str, key: &str) -> String {
    let norm = |s: &str| s.trim().replace('_', " ");
    conf.lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| norm(k) == key)
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_else(|| panic!("the lab's ceph.conf has no '{key}'"))
}

/// The `[client.ID]` section of a keyring file.
fn keyring_section(keyring: &str, id: &str) -> String {
    let head = format!("[client.{id}]");
    let mut out = String::new();
    let mut inside = false;
    for l in keyring.lines() {
        if l.trim_start().starts_with('[') {
            inside = l.trim() == head;
        }
        if inside {
            out.push_str(l);
            out.push('\n');
        }
    }
    assert!(!out.is_empty(), "the lab's keyring has no {head}");
    out
}

/// That release's lintian on `deb`: no error, no warning. bookworm's is the host's (the lab's
/// host runs bookworm; tests/lab/setup installs it); trixie's runs in the lab's trixie root
/// filesystem, where `tests/lab/rootfs --install` adds it once.
fn lintian(rel: &Release, deb: &Path) {
    let deb = fs::canonicalize(deb).unwrap();
    let args = "--info --display-info --pedantic --color=never";
    let out = if rel.suite == "bookworm" {
        Command::new("sh")
            .arg("-c")
            .arg(format!("lintian {args} \"$1\"; echo \"lintian-exit=$?\""))
            .arg("lintian")
            .arg(&deb)
            .output()
    } else {
        must(
            &format!("lintian in the {} root filesystem", rel.suite),
            Command::new(top().join("tests/lab/rootfs"))
                .args(["--install", rel.number, "lintian"])
                .stderr(Stdio::inherit()),
        );
        // The package must be inside the repository (bound into the root filesystem).
        assert!(
            deb.starts_with(top()),
            "{}: not under the repository",
            deb.display()
        );
        Command::new(top().join("tests/lab/rootfs"))
            .args(["--run", rel.number])
            .arg(format!(
                "lintian {args} '{}'; echo \"lintian-exit=$?\"",
                deb.display()
            ))
            .output()
    }
    .unwrap_or_else(|e| panic!("run lintian: {e}"));
    let report = text(&out.stdout) + &text(&out.stderr);
    println!("lintian ({}) of {}:\n{report}", rel.suite, deb.display());
    let bad: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("E: ") || l.starts_with("W: "))
        .collect();
    // lintian exits 0, or 2 when only informational tags are shown.
    let exit_ok = report
        .lines()
        .any(|l| l == "lintian-exit=0" || l == "lintian-exit=2");
    assert!(
        bad.is_empty() && exit_ok,
        "{}: lintian: {bad:#?}\n{report}",
        rel.suite
    );
}

fn install_and_serve(rel: &Release) {
    let lab = Lab::get();
    let name = format!("pkg-{}-{}", rel.suite, std::process::id());
    let lower = rootfs(rel);
    let deb = build_package(rel);

    // What the operator puts in /etc (packaging/README.md), pointing at the lab's cluster.
    let work = lab.scratch(&name);
    let input = work.join("in");
    let run_dir = work.join("run");
    fs::create_dir_all(&input).unwrap();
    fs::create_dir_all(&run_dir).unwrap();
    let deb_name = deb.file_name().unwrap().to_str().unwrap().to_owned();
    fs::copy(&deb, input.join(&deb_name)).unwrap();
    let conf = fs::read_to_string(&lab.conf).unwrap();
    fs::write(
        input.join("ceph.conf"),
        format!(
            "[global]\nfsid = {}\nmon host = {}\n",
            conf_value(&conf, "fsid"),
            conf_value(&conf, "mon host")
        ),
    )
    .unwrap();
    let keyring = fs::read_to_string(conf_value(&conf, "keyring")).unwrap();
    fs::write(
        input.join("keyring"),
        keyring_section(&keyring, &lab.client_id),
    )
    .unwrap();
    let export = lab.export_dir(&name);
    let export2 = lab.export_dir(&format!("{name}-vm2"));
    for (instance, root) in [(INSTANCE, &export), (OTHER, &export2)] {
        fs::write(
            input.join(format!("{instance}.toml")),
            format!(
                "[vhost-user]\ntag = \"cephfs\"\n\n[ceph]\nconf = \"/etc/ceph/ceph.conf\"\n\
                 client-id = \"{id}\"\nroot = \"{root}\"\nname = \"{instance}\"\n",
                id = lab.client_id
            ),
        )
        .unwrap();
    }
    let host_text = format!(
        "written by another CephFS client for the {} package\n",
        rel.suite
    );
    {
        let m = lab.ceph();
        let dir = ceph_dir(&m, &export);
        let (_, _, f) = m
            .create(
                &dir,
                &common::c("from-host.txt"),
                0o644,
                libc::O_WRONLY | libc::O_CREAT,
                ceph_client::CEPH_STATX_BASIC_STATS,
                0,
                &ceph_client::UserPerm::root(),
            )
            .unwrap();
        assert_eq!(f.write(0, host_text.as_bytes()).unwrap(), host_text.len());
    }

    let c = Container::boot(
        &lower,
        &work,
        &name,
        &[
            (&input, "/root/in", true),
            (&run_dir, "/run/ceph-virtiofsd", false),
        ],
    );
    c.run(
        "installing the package",
        &["dpkg", "-i", &format!("/root/in/{deb_name}")],
    );
    let status = c.run(
        "dpkg-query",
        &["dpkg-query", "-W", "-f=${Status}", "ceph-virtiofsd"],
    );
    assert_eq!(status, "install ok installed");
    // The postinst's user, group and directories.
    c.run(
        "the postinst's user",
        &["getent", "passwd", "ceph-virtiofsd"],
    );
    let etc = c.run(
        "the postinst's /etc/ceph-virtiofsd",
        &["stat", "-c", "%U:%G:%a", "/etc/ceph-virtiofsd"],
    );
    assert_eq!(etc.trim(), "root:root:750");
    let sockets = c.run(
        "the socket directory (tmpfiles.d, at configure)",
        &["stat", "-c", "%U:%G:%a", "/run/ceph-virtiofsd"],
    );
    assert_eq!(sockets.trim(), "root:ceph-virtiofsd:1770");
    // The operator's steps: the configuration and the key of each share, root-only.
    c.run(
        "the operator's configuration",
        &[
            "sh",
            "-euc",
            &format!(
                "install -D -m 0644 /root/in/ceph.conf /etc/ceph/ceph.conf\n\
                 for i in {INSTANCE} {OTHER}; do\n\
                   install -m 0600 /root/in/$i.toml /etc/ceph-virtiofsd/$i.toml\n\
                   install -m 0600 /root/in/keyring /etc/ceph-virtiofsd/$i.keyring\n\
                 done"
            ),
        ],
    );

    let unit = format!("ceph-virtiofsd@{INSTANCE}.service");
    c.run("systemctl start", &["systemctl", "start", &unit]);
    // The reboot-order race: a guest started the moment `systemctl start` returns (as an
    // autostarted domain ordered after the unit) must find the socket. Checked at once, no wait.
    let socket = run_dir.join(format!("{INSTANCE}.sock"));
    assert!(
        socket.exists(),
        "`systemctl start {unit}` returned before the socket existed (Type=simple?): a guest \
         started now fails to connect\n{}",
        c.journal(&unit)
    );
    let owner = c.run(
        "the socket's owner",
        &[
            "stat",
            "-c",
            "%U:%G:%a",
            &format!("/run/ceph-virtiofsd/{INSTANCE}.sock"),
        ],
    );
    // UMask=0007: the frontend's user connects through the group (write access), others not.
    // The owner is the instance's own dynamic user, the group the package's (--socket-group).
    let (who, mode) = owner.trim().rsplit_once(':').unwrap();
    let mode = u32::from_str_radix(mode, 8).unwrap();
    let (user, group) = who.split_once(':').unwrap();
    assert_eq!(group, "ceph-virtiofsd", "socket group");
    assert!(
        user != "root" && user != "ceph-virtiofsd",
        "socket owner {user}: not the instance's own user"
    );
    assert!(
        mode & 0o060 == 0o060 && mode & 0o007 == 0,
        "socket mode {mode:o}: want group rw, nothing for others"
    );

    // The guest, as QEMU on the host would run it against the unit's socket.
    let guest_text = format!("written by the guest through the {} package\n", rel.suite);
    let script = format!(
        "#!/bin/sh\n\
         grep -q ' /mnt virtiofs ' /proc/mounts || {{ echo 'not ok: /mnt is not virtiofs'; exit 1; }}\n\
         [ \"$(cat /mnt/from-host.txt)\" = '{host}' ] || {{ echo 'not ok: from-host.txt'; cat /mnt/from-host.txt; exit 1; }}\n\
         printf '%s\\n' '{guest}' > /mnt/from-guest.txt || exit 1\n\
         sync\n\
         [ \"$(cat /mnt/from-guest.txt)\" = '{guest}' ] || {{ echo 'not ok: from-guest.txt'; exit 1; }}\n\
         echo PACKAGE-GUEST-DONE\n",
        host = host_text.trim_end(),
        guest = guest_text.trim_end()
    );
    let served = Daemon {
        child: None,
        socket,
        log: work.join("container.log"),
    };
    let guest = run_guest(&lab, &work, &served, &script, &[], 600);
    // (QEMU was started right after `systemctl start` returned: the race of step 4.)
    assert!(
        guest.code() == 0 && guest.console.contains("PACKAGE-GUEST-DONE"),
        "the guest on the {} package's daemon failed (exit {}):\n{}\n---- journal of {unit} ----\n{}",
        rel.suite,
        guest.code(),
        guest.console,
        c.journal(&unit)
    );

    // The guest's bytes, through another client.
    let m = lab.ceph();
    let dir = ceph_dir(&m, &export);
    assert_eq!(text(&ceph_read_all(&m, &dir, "from-guest.txt")), guest_text);

    // Served the guest from the first start: still running, never restarted.
    let show = c.run(
        "systemctl show",
        &[
            "systemctl",
            "show",
            "-p",
            "ActiveState,SubState,NRestarts",
            &unit,
        ],
    );
    for want in ["ActiveState=active", "SubState=running", "NRestarts=0"] {
        assert!(
            show.lines().any(|l| l == want),
            "{unit} after the guest: want {want}:\n{show}\n{}",
            c.journal(&unit)
        );
    }

    // Least privilege: the instance's own user, no capability in any thread, the watchdog on.
    let show = c.run(
        "systemctl show",
        &[
            "systemctl",
            "show",
            "-p",
            "Type,WatchdogUSec,DynamicUser,MainPID",
            &unit,
        ],
    );
    for want in ["Type=notify", "WatchdogUSec=30s", "DynamicUser=yes"] {
        assert!(
            show.lines().any(|l| l == want),
            "{unit}: want {want}:\n{show}"
        );
    }
    let privileges = c.run(
        "the daemon's threads",
        &[
            "sh",
            "-euc",
            &format!(
                "pid=$(systemctl show -p MainPID --value {unit})\n\
                 for t in /proc/$pid/task/*; do\n\
                   grep -E '^(Uid|CapEff|CapPrm|CapBnd|CapAmb):' $t/status | tr -s '\\t ' ' ' | tr '\\n' ' '; echo\n\
                 done"
            ),
        ],
    );
    let lines: Vec<&str> = privileges
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(lines.len() > 1, "{privileges}");
    for l in &lines {
        assert!(
            !l.contains("Uid: 0 ") && l.matches(" 0000000000000000").count() == 4,
            "a thread of {unit} keeps a uid 0 or a capability: {l}\n{privileges}"
        );
    }

    // One instance cannot read another's keyring: vm2, started beside vm1, and each daemon's
    // uid and groups in its own mount namespace.
    let other = format!("ceph-virtiofsd@{OTHER}.service");
    c.run("systemctl start vm2", &["systemctl", "start", &other]);
    let as_daemon = |unit: &str, file: &str| -> Output {
        c.exec(&[
            "sh",
            "-euc",
            &format!(
                "pid=$(systemctl show -p MainPID --value {unit})\n\
                 uid=$(awk '/^Uid:/ {{ print $2 }}' /proc/$pid/status)\n\
                 gid=$(awk '/^Gid:/ {{ print $2 }}' /proc/$pid/status)\n\
                 groups=$(awk '/^Groups:/ {{ $1 = \"\"; print $0 }}' /proc/$pid/status | tr -s ' ' ',' | sed 's/^,//; s/,$//')\n\
                 exec nsenter --target $pid --mount -- setpriv --reuid=$uid --regid=$gid --groups=\"${{groups:-$gid}}\" -- cat {file}"
            ),
        ])
    };
    for (me, my, theirs) in [(&unit, INSTANCE, &other), (&other, OTHER, &unit)] {
        let own = as_daemon(me, &format!("/run/credentials/{me}/keyring"));
        assert!(
            own.status.success() && text(&own.stdout).contains("key = "),
            "{me} cannot read its own keyring credential: {}",
            text(&own.stderr)
        );
        for file in [
            format!("/run/credentials/{theirs}/keyring"),
            format!(
                "/etc/ceph-virtiofsd/{}.keyring",
                if my == INSTANCE { OTHER } else { INSTANCE }
            ),
            format!("/etc/ceph-virtiofsd/{my}.keyring"),
        ] {
            let o = as_daemon(me, &file);
            assert!(
                !o.status.success() && !text(&o.stdout).contains("key = "),
                "{me} reads {file}:\n{}",
                text(&o.stdout)
            );
        }
    }
    c.run("systemctl stop vm2", &["systemctl", "stop", &other]);

    // An upgrade restarts nothing (QEMU would lose the share): the same package again.
    let pid_before = c.run(
        "MainPID",
        &["systemctl", "show", "-p", "MainPID", "--value", &unit],
    );
    c.run(
        "upgrading the package",
        &["dpkg", "-i", &format!("/root/in/{deb_name}")],
    );
    let after = c.run(
        "systemctl show",
        &[
            "systemctl",
            "show",
            "-p",
            "MainPID,NRestarts,ActiveState",
            &unit,
        ],
    );
    assert!(
        after
            .lines()
            .any(|l| l == format!("MainPID={}", pid_before.trim()))
            && after.lines().any(|l| l == "NRestarts=0")
            && after.lines().any(|l| l == "ActiveState=active"),
        "{unit} after the upgrade (MainPID was {}):\n{after}",
        pid_before.trim()
    );

    // The daemon runs on that release's libcephfs2, the one its Depends asked for.
    let lib = c.run(
        "the daemon's libcephfs",
        &[
            "sh",
            "-euc",
            &format!(
                "pid=$(systemctl show -p MainPID --value {unit})\n\
                 lib=$(grep -m1 -o '/[^ ]*/libcephfs\\.so[^ ]*' /proc/$pid/maps)\n\
                 pkg=$(dpkg -S \"$lib\" | cut -d: -f1)\n\
                 echo \"$lib $(dpkg-query -W -f='${{Package}} ${{Version}}' \"$pkg\")\""
            ),
        ],
    );
    println!("{}: the daemon maps {}", rel.suite, lib.trim());
    let version = lib.split_whitespace().nth(2).unwrap_or_default();
    assert!(
        lib.split_whitespace().nth(1) == Some("libcephfs2")
            && version.starts_with(&format!("{}.", rel.ceph_major)),
        "{}: the daemon runs on '{}', not that release's libcephfs2",
        rel.suite,
        lib.trim()
    );

    // Stopped as the operator would: a clean exit. (Once inactive, systemd unloads the instance
    // and `systemctl show` answers defaults, so the verdict comes from is-active and the journal.)
    c.run("systemctl stop", &["systemctl", "stop", &unit]);
    let state = c.exec(&["systemctl", "is-active", &unit]);
    let journal = c.journal(&unit);
    println!("---- journal of {unit} ({}) ----\n{journal}", rel.suite);
    assert_eq!(
        text(&state.stdout).trim(),
        "inactive",
        "{unit} after stop (a failed unit stays 'failed'):\n{journal}"
    );
    // The daemon's own last words before exit status 0, and systemd's Result=success.
    for want in ["ceph-virtiofsd stopped", "Deactivated successfully"] {
        assert!(
            journal.contains(want),
            "{unit}: no '{want}' in its journal:\n{journal}"
        );
    }
    // What systemd logs for an exit status other than 0, a signal, or a stop timeout.
    for bad in [
        "Main process exited",
        "Failed with result",
        "Killing process",
    ] {
        assert!(
            !journal.contains(bad),
            "{unit}: '{bad}' in its journal:\n{journal}"
        );
    }

    // Passed: the container's upper layer (about 25 MB) is not worth keeping.
    drop(c);
    let _ = fs::remove_dir_all(&work);
}

#[test]
fn bookworm_package_installs_and_serves_a_guest() {
    install_and_serve(&BOOKWORM);
}

#[test]
fn trixie_package_installs_and_serves_a_guest() {
    install_and_serve(&TRIXIE);
}
