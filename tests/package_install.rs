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
//!    makes the user and /etc/ceph-virtiofsd), the operator's steps of packaging/README.md
//!    (ceph.conf, a keyring readable by group ceph-virtiofsd, /etc/ceph-virtiofsd/vm1.toml) and
//!    `systemctl start ceph-virtiofsd@vm1`: the unit as shipped, its sandbox included. A host
//!    directory is bound at the unit's /run/ceph-virtiofsd, so QEMU on the host connects to
//!    vm1.sock there as it would on the machine itself.
//! 4. The lab's guest mounts the share, reads a file another CephFS client wrote and writes one,
//!    whose bytes the host's own CephFS client then reads.
//! 5. Still running after the guest, never restarted; `systemctl stop ceph-virtiofsd@vm1`: the
//!    daemon logs its clean stop and exits with status 0 (systemd: "Deactivated successfully",
//!    no "Main process exited" nor "Failed with result").
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
/// libcephfs2 and on adduser.
fn check_package(rel: &Release, deb: &Path) {
    the_file(deb.parent().unwrap(), "ddeb");

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
    fs::write(
        input.join(format!("{INSTANCE}.toml")),
        format!(
            "[vhost-user]\ntag = \"cephfs\"\n\n[ceph]\nconf = \"/etc/ceph/ceph.conf\"\n\
             client-id = \"{id}\"\nkeyring = \"/etc/ceph/ceph.client.{id}.keyring\"\n\
             root = \"{export}\"\n",
            id = lab.client_id
        ),
    )
    .unwrap();
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
    // The postinst's user, group and configuration directory.
    c.run(
        "the postinst's user",
        &["getent", "passwd", "ceph-virtiofsd"],
    );
    let etc = c.run(
        "the postinst's /etc/ceph-virtiofsd",
        &["stat", "-c", "%U:%G:%a", "/etc/ceph-virtiofsd"],
    );
    assert_eq!(etc.trim(), "root:ceph-virtiofsd:750");
    // The operator's steps.
    let id = &lab.client_id;
    c.run(
        "the operator's configuration",
        &[
            "sh",
            "-euc",
            &format!(
                "install -D -m 0644 /root/in/ceph.conf /etc/ceph/ceph.conf\n\
                 install -m 0640 -g ceph-virtiofsd /root/in/keyring /etc/ceph/ceph.client.{id}.keyring\n\
                 install -m 0640 -g ceph-virtiofsd /root/in/{INSTANCE}.toml /etc/ceph-virtiofsd/{INSTANCE}.toml"
            ),
        ],
    );

    let unit = format!("ceph-virtiofsd@{INSTANCE}.service");
    c.run("systemctl start", &["systemctl", "start", &unit]);
    let socket = run_dir.join(format!("{INSTANCE}.sock"));
    let deadline = Instant::now() + Duration::from_secs(120);
    while !socket.exists() {
        let state = c.exec(&["systemctl", "is-active", &unit]);
        let state = text(&state.stdout).trim().to_owned();
        assert!(
            state == "active" || state == "activating",
            "{unit} is {state} before listening on {}:\n{}",
            socket.display(),
            c.journal(&unit)
        );
        // Restart=on-failure hides an exit from is-active: count the restarts.
        let restarts = c.exec(&["systemctl", "show", "-p", "NRestarts", "--value", &unit]);
        assert_eq!(
            text(&restarts.stdout).trim(),
            "0",
            "{unit} exited and was restarted before listening:\n{}",
            c.journal(&unit)
        );
        assert!(
            Instant::now() < deadline,
            "{unit} did not listen on {} in 120 s:\n{}",
            socket.display(),
            c.journal(&unit)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
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
    let (who, mode) = owner.trim().rsplit_once(':').unwrap();
    let mode = u32::from_str_radix(mode, 8).unwrap();
    assert_eq!(who, "ceph-virtiofsd:ceph-virtiofsd", "socket owner");
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
