//! libvirt 11 runs the packaged examples: `packaging/examples/libvirt-domain.xml` (libvirt
//! starts the daemon itself, through `<binary path='/usr/libexec/ceph-virtiofsd-compat'>`) and
//! `packaging/examples/libvirt-domain-socket.xml` (`<source socket=…>`, the daemon started as
//! `ceph-virtiofsd@vm1.service` under systemd). For each: `virsh define` and `virsh start`, the
//! guest mounts `-t virtiofs`, writes a file and reads it back, the bytes are checked through a
//! second CephFS client on the host, `virsh shutdown` (ACPI) powers the guest off, the domain is
//! shut off, and the daemon exits cleanly: exit status 0 (its log says so for the one libvirt ran),
//! its MDS session ended.
//!
//! The lab: `tests/lab/libvirt` (a Debian bookworm root filesystem with libvirt 11 and QEMU 10 from
//! bookworm-backports; libvirtd runs in it with chroot in a private mount namespace, see the
//! script's header). The daemon under test and the packaging files are bind-mounted where the
//! Debian package installs them, so the examples run with their own paths; the test changes only
//! what a lab without KVM, disk image or terminal needs (see [`domain_xml`]).
//!
//! The socket domain's daemon runs under real systemd: `tests/lab/libvirt --systemd` boots the
//! same root filesystem with `systemd-nspawn --boot` (on an overlay) next to libvirtd, with the
//! repository's `ceph-virtiofsd@.service` and the daemon under test installed, and the test runs
//! `systemctl start ceph-virtiofsd@vm1`: the unit as shipped, its user, umask and sandbox
//! included. Both see one /run/ceph-virtiofsd, so QEMU connects to the unit's socket. The daemon
//! keeps serving after the guest (`--keep-serving`); `systemctl stop` ends it, and systemd must
//! report exit status 0 and result "success".
//!
//! Both daemons keep no privilege: the one libvirt starts as root switches to user
//! ceph-virtiofsd after the mount, the unit's runs as a user of its own, and no thread of either
//! keeps a capability (/proc/PID/task/*/status). The share's .toml names the VM (`name`), which
//! the MDS shows in the session's client metadata.
//!
//! [`a_plain_virtiofs_share_never_reaches_ceph_virtiofsd`]: on a host with the Ceph admin
//! keyring in /etc/ceph and no virtiofsd, a domain with a plain `<filesystem>` (a host
//! directory, no `<binary>`) does not get CephFS: as the package installs it (no vhost-user
//! descriptor) libvirt finds no back-end and the domain does not start; with the example
//! descriptor copied to /etc/qemu/vhost-user by an administrator, libvirt runs the compat
//! wrapper, which refuses the directory: the domain does not start, and libvirt's log of the
//! daemon (/var/log/libvirt/qemu/DOMAIN-fs0-virtiofsd.log) holds the reason. On main the descriptor was
//! installed and the wrapper dropped the directory: the domain started with CephFS "/" as
//! client.admin, served by a daemon running as root (the review's run).
//!
//! Run alone: `tests/lab/libvirt` (as root, once), then `cargo test --test libvirt` with the lab's
//! environment (see tests/run). The two tests take turns (one libvirtd at a time).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{ceph_dir, ceph_read_all, Lab};

/// The guest's test: write, read back, then wait for the ACPI power button (what `virsh
/// shutdown` presses) and end; /init then syncs, unmounts and powers off (`poweroff -f`; its
/// isa-debug-exit write does nothing here, the domain has no such device, hence its GUEST-WARN).
const GUEST_SCRIPT: &str = r#"set -e
# The ACPI power button reaches user space as an input event (button.ko + evdev.ko).
insmod /extra/evdev.ko
insmod /extra/button.ko
i=0
: > /tmp/expect
while [ $i -lt 2000 ]; do
  echo "ceph-virtiofsd under libvirt: $DOMAIN line $i" >> /tmp/expect
  i=$((i + 1))
done
cp /tmp/expect written-by-guest
sync
echo 3 > /proc/sys/vm/drop_caches
cmp /tmp/expect written-by-guest
echo "LIBVIRT-WROTE: $(wc -c < written-by-guest) bytes"
set +e
for dev in /sys/class/input/input*; do
  case "$(cat "$dev/name")" in
    *"Power Button"*)
      for ev in "$dev"/event*; do
        ( dd if="/dev/input/${ev##*/}" of=/dev/null bs=24 count=1 2>/dev/null
          echo "LIBVIRT-POWER-BUTTON: ${ev##*/}"; : > /tmp/pressed ) &
      done ;;
  esac
done
echo "LIBVIRT-WAITING: for the ACPI power button"
while [ ! -e /tmp/pressed ]; do sleep 0.2; done
exit 0
"#;

/// What the guest writes (the script's loop, on the host).
fn expected(domain: &str) -> Vec<u8> {
    (0..2000)
        .map(|i| format!("ceph-virtiofsd under libvirt: {domain} line {i}\n"))
        .collect::<String>()
        .into_bytes()
}

fn lab_script(lab: &Lab) -> PathBuf {
    lab.top.join("tests/lab/libvirt")
}

fn show(o: &Output) -> String {
    format!(
        "{}\nstdout:\n{}stderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A libvirtd of the lab, with its state in `run`; destroys its domains and stops it when dropped.
struct Libvirt {
    script: PathBuf,
    run: PathBuf,
}

impl Libvirt {
    fn start(lab: &Lab, run: &Path, binds: &[PathBuf]) -> Libvirt {
        let script = lab_script(lab);
        let daemon = std::fs::canonicalize(env!("CARGO_BIN_EXE_ceph-virtiofsd")).unwrap();
        let out = Command::new(&script)
            .arg("--start")
            .arg(run)
            .arg(&daemon)
            .args(binds)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tests/lab/libvirt --start: {}",
            show(&out)
        );
        Libvirt {
            script,
            run: run.to_owned(),
        }
    }

    /// CMD next to libvirtd (its mount namespace, chroot in the lab's root filesystem).
    fn exec(&self, args: &[&str]) -> Output {
        Command::new(&self.script)
            .arg("--exec")
            .arg(&self.run)
            .args(args)
            .output()
            .unwrap()
    }

    fn virsh(&self, args: &[&str]) -> Output {
        let mut a = vec!["virsh", "-q", "-c", "qemu:///system"];
        a.extend_from_slice(args);
        self.exec(&a)
    }

    fn virsh_ok(&self, args: &[&str]) -> String {
        let o = self.virsh(args);
        assert!(o.status.success(), "virsh {}: {}", args.join(" "), show(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn domstate(&self, dom: &str) -> String {
        self.virsh_ok(&["domstate", dom]).trim().to_owned()
    }

    fn log(&self, rel: &str) -> String {
        std::fs::read_to_string(self.run.join("log").join(rel)).unwrap_or_default()
    }

    /// The logs that tell a failure apart.
    fn diagnostics(&self, dom: &str, console: &Path) -> String {
        format!(
            "---- console ----\n{}\n---- QEMU log ----\n{}\n---- daemon log (libvirt's) ----\n{}\n---- libvirtd ----\n{}",
            std::fs::read_to_string(console).unwrap_or_default(),
            self.log(&format!("libvirt/qemu/{dom}.log")),
            self.log(&format!("libvirt/qemu/{dom}-fs0-virtiofsd.log")),
            self.log("libvirtd.log"),
        )
    }
}

impl Drop for Libvirt {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .arg("--stop")
            .arg(&self.run)
            .status();
    }
}

/// The lab's root filesystem booted with systemd-nspawn next to libvirtd (`tests/lab/libvirt
/// --systemd`), with the repository's unit installed; powered off by `--stop` (the [`Libvirt`]
/// drop).
struct Systemd {
    script: PathBuf,
    run: PathBuf,
}

impl Systemd {
    fn boot(lab: &Lab, run: &Path) -> Systemd {
        let script = lab_script(lab);
        let daemon = std::fs::canonicalize(env!("CARGO_BIN_EXE_ceph-virtiofsd")).unwrap();
        let out = Command::new(&script)
            .arg("--systemd")
            .arg(run)
            .arg(&daemon)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tests/lab/libvirt --systemd: {}\n{}",
            show(&out),
            std::fs::read_to_string(run.join("log/container.log")).unwrap_or_default()
        );
        Systemd {
            script,
            run: run.to_owned(),
        }
    }

    fn exec(&self, args: &[&str]) -> Output {
        Command::new(&self.script)
            .arg("--sysexec")
            .arg(&self.run)
            .args(args)
            .output()
            .unwrap()
    }

    /// `systemctl show -P KEY ceph-virtiofsd@vm1`.
    fn show(&self, key: &str) -> String {
        let o = self.exec(&["systemctl", "show", "-P", key, "ceph-virtiofsd@vm1"]);
        assert!(o.status.success(), "systemctl show: {}", show(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    }

    fn journal(&self) -> String {
        let o = self.exec(&[
            "journalctl",
            "--no-pager",
            "-o",
            "cat",
            "-u",
            "ceph-virtiofsd@vm1",
        ]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

/// `packaging/examples/FILE` as the lab runs it. Changed: `type='qemu'` (TCG; no KVM here), 512
/// MiB and one vCPU (TCG), direct kernel boot of the lab's guest instead of the disk image, the
/// serial console into a file instead of a pty. Everything about the file system (driver,
/// binary, source, target) and the shared memory is the example's own.
fn domain_xml(lab: &Lab, file: &str, kernel: &Path, initrd: &Path, console: &Path) -> String {
    let mut xml = std::fs::read_to_string(lab.top.join("packaging/examples").join(file)).unwrap();
    let mut swap = |from: &str, to: &str| {
        assert!(
            xml.contains(from),
            "{file} no longer contains {from:?}: update tests/libvirt.rs"
        );
        xml = xml.replacen(from, to, 1);
    };
    swap("<domain type='kvm'>", "<domain type='qemu'>");
    swap(
        "<memory unit='GiB'>2</memory>",
        "<memory unit='MiB'>512</memory>",
    );
    swap("<vcpu>2</vcpu>", "<vcpu>1</vcpu>");
    swap(
        "<boot dev='hd'/>",
        &format!(
            "<kernel>{}</kernel>\n    <initrd>{}</initrd>\n    <cmdline>console=ttyS0 quiet panic=-1 vfs_tag=cephfs</cmdline>",
            kernel.display(),
            initrd.display()
        ),
    );
    let (a, b) = (
        xml.find("<disk ").expect("a <disk> in the example"),
        xml.find("</disk>").expect("a </disk> in the example") + "</disk>".len(),
    );
    xml.replace_range(a..b, "<!-- (the lab boots the kernel directly) -->");
    let mut swap = |from: &str, to: &str| {
        assert!(xml.contains(from), "{file} no longer contains {from:?}");
        xml = xml.replacen(from, to, 1);
    };
    swap(
        "<console type='pty'/>",
        &format!(
            "<serial type='file'><source path='{}'/></serial>",
            console.display()
        ),
    );
    roxmltree::Document::parse(&xml)
        .unwrap_or_else(|e| panic!("{file} after the lab's edits: {e}"));
    xml
}

/// (session id, client_metadata.pid) of the MDS sessions whose client mounted `root`.
fn sessions_of_root(lab: &Lab, root: &str) -> Vec<(u64, String)> {
    let out = Command::new("ceph")
        .arg("-c")
        .arg(&lab.conf)
        .args(["tell", "mds.*", "session", "ls", "--format=json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ceph tell mds.* session ls: {}",
        show(&out)
    );
    // One MDS answers (the lab's active one): a JSON array of its sessions.
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("session ls is not JSON ({e}): {}", show(&out)));
    v.as_array()
        .unwrap()
        .iter()
        .filter(|s| s["client_metadata"]["root"].as_str() == Some(root))
        .map(|s| {
            (
                s["id"].as_u64().unwrap(),
                s["client_metadata"]["pid"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            )
        })
        .collect()
}

fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool, diag: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {secs} s\n{}",
            diag()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The `<os>` boot pieces: the lab's guest kernel and an initramfs running [`GUEST_SCRIPT`] with
/// DOMAIN set, plus the ACPI button and evdev modules.
fn initramfs(lab: &Lab, run: &Path, domain: &str) -> (PathBuf, PathBuf) {
    let kdir = std::fs::canonicalize(lab.kernel_cache.join("bookworm")).unwrap();
    let kver = std::fs::read_to_string(kdir.join("kver")).unwrap();
    let modules = kdir
        .join("root/lib/modules")
        .join(kver.trim())
        .join("kernel/drivers");
    let script = run.join(format!("{domain}.sh"));
    std::fs::write(&script, format!("DOMAIN={domain}\n{GUEST_SCRIPT}")).unwrap();
    let initrd = run.join(format!("{domain}.cpio.gz"));
    let st = Command::new(lab.top.join("tests/lab/guest/build-initramfs"))
        .arg("--kernel-cache")
        .arg(&lab.kernel_cache)
        .arg("--out")
        .arg(&initrd)
        .arg("--script")
        .arg(&script)
        .arg("--add")
        .arg(format!(
            "{}:/extra/evdev.ko",
            modules.join("input/evdev.ko").display()
        ))
        .arg("--add")
        .arg(format!(
            "{}:/extra/button.ko",
            modules.join("acpi/button.ko").display()
        ))
        .status()
        .unwrap();
    assert!(st.success(), "build-initramfs: {st}");
    (kdir.join("vmlinux"), initrd)
}

/// define, start, wait for the guest's write, check it from the host (and run `during` while the
/// guest waits), shutdown (ACPI), wait for "shut off" by the guest's own power-off, undefine.
fn run_domain(
    lab: &Lab,
    lv: &Libvirt,
    run: &Path,
    example: &str,
    domain: &str,
    export: &str,
    during: impl Fn(),
) {
    let (kernel, initrd) = initramfs(lab, run, domain);
    let console = run.join(format!("{domain}.console.log"));
    let xml = domain_xml(lab, example, &kernel, &initrd, &console);
    let xml_path = run.join(format!("{domain}.xml"));
    std::fs::write(&xml_path, &xml).unwrap();
    let dom = "vm1"; // the examples' name
    let diag = || lv.diagnostics(dom, &console);
    lv.virsh_ok(&["define", xml_path.to_str().unwrap()]);
    let started = lv.virsh(&["start", dom]);
    assert!(
        started.status.success(),
        "virsh start {dom} ({example}): {}\n{}",
        show(&started),
        diag()
    );
    let read = || std::fs::read_to_string(&console).unwrap_or_default();
    wait_for(
        &format!("{example}: the guest's write and its wait for the power button"),
        300,
        || read().contains("LIBVIRT-WAITING") || read().contains("GUEST-RESULT"),
        diag,
    );
    let con = read();
    assert!(
        con.contains("LIBVIRT-WAITING"),
        "{example}: the guest script failed\n{}",
        diag()
    );
    let want = expected(domain);
    assert!(
        con.contains(&format!("LIBVIRT-WROTE: {} bytes", want.len())),
        "{}",
        diag()
    );
    // The bytes, through another CephFS client.
    let m = lab.ceph();
    let got = ceph_read_all(&m, &ceph_dir(&m, export), "written-by-guest");
    assert!(
        got == want,
        "{example}: CephFS holds {} other bytes than the guest wrote",
        got.len()
    );
    during();
    assert_eq!(lv.domstate(dom), "running", "{}", diag());
    lv.virsh_ok(&["shutdown", dom]);
    wait_for(
        &format!("{example}: shut off after virsh shutdown"),
        180,
        || lv.domstate(dom) == "shut off",
        diag,
    );
    let con = read();
    // Powered off by the guest itself, on the ACPI event: not destroyed.
    assert!(
        con.contains("LIBVIRT-POWER-BUTTON"),
        "{example}: the guest saw no power button\n{}",
        diag()
    );
    assert!(con.contains("GUEST-RESULT: rc=0"), "{example}: {}", diag());
    let reason = lv.virsh_ok(&["domstate", "--reason", dom]);
    assert!(
        reason.contains("shutdown"),
        "{example}: domstate --reason: {reason}"
    );
    lv.virsh_ok(&["undefine", dom]);
}

/// The host's Ceph configuration, as on a hyperconverged host: /etc/ceph/ceph.conf (the
/// cluster's, less its own keyring and run dir) and the client.admin keyring, root-only.
fn write_host_ceph(lab: &Lab, run: &Path) {
    let etc_ceph = run.join("etc-ceph");
    std::fs::create_dir_all(&etc_ceph).unwrap();
    let keyring = etc_ceph.join("ceph.client.admin.keyring");
    let st = Command::new("ceph")
        .arg("-c")
        .arg(&lab.conf)
        .args(["auth", "get", "client.admin", "-o"])
        .arg(&keyring)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "ceph auth get client.admin: {st}");
    set_mode(&keyring, 0o600);
    let conf: String = std::fs::read_to_string(&lab.conf)
        .unwrap()
        .lines()
        .filter(|l| {
            let k = l.trim_start();
            !(k.starts_with("keyring") || k.starts_with("run dir") || k.starts_with("crash dir"))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(etc_ceph.join("ceph.conf"), conf).unwrap();
    set_mode(&etc_ceph.join("ceph.conf"), 0o644);
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
}

/// The share's configuration and key in /etc/ceph-virtiofsd, root-only, as
/// packaging/README.md asks: vm1.toml (its Ceph settings, the VM's name) and vm1.keyring (the
/// lab has client.admin only; the .toml names it explicitly). The systemd unit gets both as
/// credentials; the compat wrapper, run as root by libvirt, reads them directly.
fn write_share_config(lab: &Lab, run: &Path, export: &str) {
    write_host_ceph(lab, run);
    let etc = run.join("etc");
    std::fs::copy(
        run.join("etc-ceph/ceph.client.admin.keyring"),
        etc.join("vm1.keyring"),
    )
    .unwrap();
    std::fs::write(
        etc.join("vm1.toml"),
        format!(
            "# written by tests/libvirt.rs\n[ceph]\nconf = \"/etc/ceph/ceph.conf\"\n\
             client-id = \"{}\"\nkeyring = \"/etc/ceph-virtiofsd/vm1.keyring\"\n\
             root = \"{export}\"\nname = \"vm1\"\n[log]\nlevel = \"info\"\n",
            lab.client_id
        ),
    )
    .unwrap();
    for f in ["vm1.keyring", "vm1.toml"] {
        std::os::unix::fs::chown(etc.join(f), Some(0), Some(0)).unwrap();
        set_mode(&etc.join(f), 0o600);
    }
    std::os::unix::fs::chown(&etc, Some(0), Some(0)).unwrap();
    set_mode(&etc, 0o750);
}

/// Every thread of `pid`: its uids, and no capability in its effective, permitted, bounding or
/// ambient set. The uid (all four the same) is returned.
fn assert_no_privilege_in_any_thread(pid: &str, diag: &dyn Fn() -> String) -> u32 {
    let mut uids = std::collections::BTreeSet::new();
    let mut threads = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/task: {e}\n{}", diag()))
        .filter_map(|t| t.ok())
    {
        let text = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        if text.is_empty() {
            continue;
        }
        threads += 1;
        let line = |f: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{f}:")))
                .map(|v| v.split_whitespace().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let name = line("Name").join(" ");
        let uid = line("Uid");
        assert!(
            uid.len() == 4 && uid.iter().all(|u| *u == uid[0]) && uid[0] != "0",
            "thread {name} of {pid} runs as uid {uid:?}\n{}",
            diag()
        );
        uids.insert(uid[0].to_owned());
        for set in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
            assert_eq!(
                line(set),
                ["0000000000000000"],
                "{set} of thread {name} of {pid}\n{}",
                diag()
            );
        }
    }
    assert!(threads > 1, "{pid}: one thread only");
    assert_eq!(uids.len(), 1, "{pid}: threads of several uids: {uids:?}");
    uids.into_iter().next().unwrap().parse().unwrap()
}

/// (client id, client metadata) of the MDS sessions whose client mounted `root`.
fn metadata_of_root(lab: &Lab, root: &str) -> Vec<serde_json::Value> {
    let out = Command::new("ceph")
        .arg("-c")
        .arg(&lab.conf)
        .args(["tell", "mds.*", "session", "ls", "--format=json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "session ls: {}", show(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s["client_metadata"].clone())
        .filter(|m| m["root"].as_str() == Some(root))
        .collect()
}

/// One libvirtd of the lab at a time: the tests of this file take turns.
static ONE_LIBVIRTD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The unit's `KEY=` value.
fn unit_value(unit: &str, key: &str) -> String {
    let prefix = format!("{key}=");
    let vals: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .collect();
    assert_eq!(
        vals.len(),
        1,
        "ceph-virtiofsd@.service: one {key}= expected"
    );
    vals[0].trim().to_owned()
}

#[test]
fn libvirt_runs_the_packaged_domains() {
    let _turn = ONE_LIBVIRTD.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::get();
    let script = lab_script(&lab);
    let check = Command::new(&script).arg("--check").output().unwrap();
    assert!(
        check.status.success(),
        "the libvirt lab is not ready ({}): run `tests/lab/libvirt` as root once (tests/run \
         does), then this test again",
        check.status
    );
    // A libvirtd left by a run that was killed (no Drop) would keep its domains: stop it first.
    let _ = Command::new(&script)
        .arg("--stop")
        .arg(lab.dir.join("scratch/libvirt"))
        .status();
    let run = std::fs::canonicalize(lab.scratch("libvirt")).unwrap();
    let etc = run.join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    let cluster = std::fs::canonicalize(lab.conf.parent().unwrap()).unwrap();
    let kernel = std::fs::canonicalize(lab.kernel_cache.join("bookworm")).unwrap();
    let lv = Libvirt::start(&lab, &run, &[cluster, kernel]);

    // The package's user and group (packaging/systemd/ceph-virtiofsd.sysusers; the lab's root
    // filesystem has them): a daemon libvirt starts as root switches to that user, and the
    // unit's sockets belong to that group.
    let unit =
        std::fs::read_to_string(lab.top.join("packaging/systemd/ceph-virtiofsd@.service")).unwrap();
    let group = unit_value(&unit, "SupplementaryGroups");
    let id_of = |db: &str, name: &str| -> u32 {
        let o = lv.exec(&["getent", db, name]);
        assert!(
            o.status.success(),
            "no {db} {name} in the lab's root filesystem: {}",
            show(&o)
        );
        String::from_utf8_lossy(&o.stdout)
            .split(':')
            .nth(2)
            .unwrap()
            .parse()
            .unwrap()
    };
    let package_uid = id_of("passwd", "ceph-virtiofsd");

    // --- domain 1: libvirt starts the daemon through the compat wrapper ---
    let export1 = lab.export_dir(&format!("libvirt-binary-{}", std::process::id()));
    write_share_config(&lab, &run, &export1);

    let pid1 = std::cell::RefCell::new(String::new());
    run_domain(
        &lab,
        &lv,
        &run,
        "libvirt-domain.xml",
        "binary",
        &export1,
        || {
            let s = sessions_of_root(&lab, &export1);
            assert!(
                !s.is_empty(),
                "no MDS session of the daemon libvirt started"
            );
            let pid = s[0].1.clone();
            // libvirt 11 runs `BINARY --fd=N --shared-dir DIR --xattr --thread-pool-size=4`; the
            // wrapper made DIR (a file) the config and exec'd the daemon with the rest.
            let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            println!("the daemon libvirt started (pid {pid}): {argv:?}");
            assert_eq!(
                argv.first().map(String::as_str),
                Some("/usr/libexec/ceph-virtiofsd"),
                "{argv:?}"
            );
            assert!(
                argv.windows(2)
                    .any(|w| w[0] == "--config" && w[1] == "/etc/ceph-virtiofsd/vm1.toml"),
                "{argv:?}"
            );
            for want in ["--xattr", "--thread-pool-size=4"] {
                assert!(
                    argv.iter().any(|a| a == want),
                    "{want} not passed on: {argv:?}"
                );
            }
            assert!(argv.iter().any(|a| a.starts_with("--fd=")), "{argv:?}");
            assert!(!argv.iter().any(|a| a.contains("shared-dir")), "{argv:?}");
            // What libvirt passes in the environment: no domain name (hence `name` in the
            // share's .toml file).
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let env: Vec<String> = env
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            println!("its environment: {env:?}");
            // Started as root by libvirt: now the package's user, no capability in any thread.
            let uid = assert_no_privilege_in_any_thread(&pid, &|| {
                lv.log("libvirt/qemu/vm1-fs0-virtiofsd.log")
            });
            assert_eq!(uid, package_uid, "the daemon libvirt started runs as {uid}");
            // The VM's name, from the share's .toml, in the session's metadata.
            let meta = metadata_of_root(&lab, &export1);
            assert!(
                meta.iter().all(|m| m["vm"] == "vm1"),
                "client metadata of the export's session: {meta:#?}"
            );
            *pid1.borrow_mut() = pid;
        },
    );
    let qemu_log = lv.log("libvirt/qemu/vm1.log");
    assert!(
        qemu_log.contains(
            "Starting external device: virtiofsd\n/usr/libexec/ceph-virtiofsd-compat --fd="
        ),
        "libvirt did not start the compat wrapper:\n{qemu_log}"
    );
    let vlog = || lv.log("libvirt/qemu/vm1-fs0-virtiofsd.log");
    wait_for(
        "the daemon libvirt started: its MDS session ends",
        60,
        || sessions_of_root(&lab, &export1).is_empty(),
        vlog,
    );
    let pid = pid1.borrow().clone();
    assert!(!pid.is_empty(), "no pid in the daemon's session metadata");
    // It logs its last line after the unmount that ends the session, then exits.
    wait_for(
        &format!("the daemon libvirt started (pid {pid}) is gone"),
        30,
        || !Path::new(&format!("/proc/{pid}")).exists(),
        vlog,
    );
    // Its exit status is libvirt's to collect: the line logged only on exit status 0.
    let log = vlog();
    assert!(
        log.contains("CephFS unmounted") && log.contains("ceph-virtiofsd stopped"),
        "the daemon libvirt started did not stop cleanly:\n{log}"
    );
    // What libvirt 11 ran (for the notes of docs/libvirt.md): the wrapper, with virtiofsd's options.
    println!("---- daemon log (libvirt's) ----\n{log}");

    // --- domain 2: the daemon of the systemd unit, libvirt connects to its socket ---
    let export2 = lab.export_dir(&format!("libvirt-socket-{}", std::process::id()));
    write_share_config(&lab, &run, &export2);
    // Real systemd (a container booted next to libvirtd) starts the unit as shipped, its sandbox
    // included; /run/ceph-virtiofsd is one directory for both.
    let sd = Systemd::boot(&lab, &run);
    let started = sd.exec(&["systemctl", "start", "ceph-virtiofsd@vm1"]);
    assert!(
        started.status.success(),
        "systemctl start ceph-virtiofsd@vm1: {}\n{}",
        show(&started),
        sd.journal()
    );
    // Type=notify: `systemctl start` returned once the socket listened and CephFS was mounted.
    let sock = run.join("unit-run/vm1.sock");
    assert!(
        sock.exists(),
        "systemctl start ceph-virtiofsd@vm1 returned before its socket existed:\n{}",
        sd.journal()
    );
    assert_eq!(sd.show("ActiveState"), "active", "{}", sd.journal());
    // What the unit promises: the instance's own user owns the socket, group ceph-virtiofsd may
    // connect (read and write), others may not.
    let mode = lv.exec(&["stat", "-c", "%a %u %G", "/run/ceph-virtiofsd/vm1.sock"]);
    let mode = String::from_utf8_lossy(&mode.stdout).trim().to_owned();
    let fields: Vec<&str> = mode.split(' ').collect();
    assert_eq!(
        (fields[0], fields[2]),
        ("770", group.as_str()),
        "the unit's socket ({mode}): 0777 less its UMask, group {group} (--socket-group)"
    );
    let owner: u32 = fields[1].parse().unwrap();
    assert!(
        owner != 0 && owner != package_uid,
        "the socket's owner {owner}: the instance's dynamic user, not root nor the shared user"
    );
    // The daemon's pid in the container's pid namespace, as its session metadata has it.
    let main_pid = sd.show("MainPID");
    // ... and on the host, where /proc shows its threads: the instance's user, no capability.
    let host_pid = {
        let s = sessions_of_root(&lab, &export2);
        assert!(!s.is_empty(), "no session of ceph-virtiofsd@vm1");
        // The session's pid is in the container's namespace: find the host's by NSpid.
        let ns_pid = s[0].1.clone();
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|p| p.chars().all(|c| c.is_ascii_digit()))
            .find(|p| {
                let st = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
                let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
                comm.trim() == "ceph-virtiofsd"
                    && st.lines().any(|l| {
                        l.starts_with("NSpid:") && l.split_whitespace().last() == Some(&ns_pid)
                    })
            })
            .unwrap_or_else(|| panic!("no host pid for the unit's daemon (pid {ns_pid} inside)"))
    };
    assert_eq!(
        assert_no_privilege_in_any_thread(&host_pid, &|| sd.journal()),
        owner,
        "the daemon runs as the socket's owner"
    );
    run_domain(
        &lab,
        &lv,
        &run,
        "libvirt-domain-socket.xml",
        "socket",
        &export2,
        || {
            let s = sessions_of_root(&lab, &export2);
            assert!(
                !s.is_empty() && s.iter().all(|(_, p)| *p == main_pid),
                "the MDS sessions of ceph-virtiofsd@vm1 (MainPID {main_pid}): {s:?}"
            );
        },
    );
    // --keep-serving: the unit's daemon outlives the guest, not restarted.
    assert_eq!(sd.show("ActiveState"), "active", "{}", sd.journal());
    assert_eq!(sd.show("NRestarts"), "0", "{}", sd.journal());
    assert_eq!(sd.show("MainPID"), main_pid, "{}", sd.journal());
    let stopped = sd.exec(&["systemctl", "stop", "ceph-virtiofsd@vm1"]);
    assert!(stopped.status.success(), "{}", show(&stopped));
    // Exit status 0 on SIGTERM, as systemd saw it.
    assert_eq!(sd.show("ExecMainStatus"), "0", "{}", sd.journal());
    assert_eq!(sd.show("Result"), "success", "{}", sd.journal());
    let journal = sd.journal();
    assert!(
        journal.contains("CephFS unmounted") && journal.contains("ceph-virtiofsd stopped"),
        "ceph-virtiofsd@vm1 did not log its clean stop:\n{journal}"
    );
    assert!(
        sessions_of_root(&lab, &export2).is_empty(),
        "the MDS still lists ceph-virtiofsd@vm1's session"
    );
    drop(lv);
}

/// A domain with an ordinary virtiofs share: a host directory, no `<binary>`, libvirt picks the
/// back-end from the vhost-user descriptors.
fn plain_domain_xml(kernel: &Path, initrd: &Path, console: &Path, dir: &Path) -> String {
    format!(
        "<domain type='qemu'>\n  <name>plain</name>\n  <memory unit='MiB'>512</memory>\n  \
         <vcpu>1</vcpu>\n  <memoryBacking>\n    <source type='memfd'/>\n    \
         <access mode='shared'/>\n  </memoryBacking>\n  <os>\n    \
         <type arch='x86_64' machine='q35'>hvm</type>\n    <kernel>{}</kernel>\n    \
         <initrd>{}</initrd>\n    <cmdline>console=ttyS0 quiet panic=-1 vfs_tag=plain</cmdline>\n  \
         </os>\n  <devices>\n    <filesystem type='mount' accessmode='passthrough'>\n      \
         <driver type='virtiofs'/>\n      <source dir='{}'/>\n      <target dir='plain'/>\n    \
         </filesystem>\n    <serial type='file'><source path='{}'/></serial>\n  </devices>\n\
         </domain>\n",
        kernel.display(),
        initrd.display(),
        dir.display(),
        console.display()
    )
}

/// The ceph-virtiofsd processes running in the lab's root filesystem `root` (libvirtd's
/// children are chrooted there; other daemons of the host are not counted).
fn lab_daemons(root: &Path) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|p| p.chars().all(|c| c.is_ascii_digit()))
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| c.trim() == "ceph-virtiofsd")
                && std::fs::read_link(format!("/proc/{p}/root")).is_ok_and(|r| r == root)
        })
        .collect()
}

#[test]
fn a_plain_virtiofs_share_never_reaches_ceph_virtiofsd() {
    let _turn = ONE_LIBVIRTD.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::get();
    let script = lab_script(&lab);
    let check = Command::new(&script).arg("--check").output().unwrap();
    assert!(
        check.status.success(),
        "the libvirt lab is not ready ({}): run `tests/lab/libvirt` as root once (tests/run \
         does), then this test again",
        check.status
    );
    let _ = Command::new(&script)
        .arg("--stop")
        .arg(lab.dir.join("scratch/libvirt-plain"))
        .status();
    let root = PathBuf::from(String::from_utf8_lossy(&check.stdout).trim());
    let run = std::fs::canonicalize(lab.scratch("libvirt-plain")).unwrap();
    // A hyperconverged host: the cluster's ceph.conf and the client.admin keyring in /etc/ceph.
    write_host_ceph(&lab, &run);
    let plain = run.join("srv-plain");
    std::fs::create_dir_all(&plain).unwrap();
    let cluster = std::fs::canonicalize(lab.conf.parent().unwrap()).unwrap();
    let kernel = std::fs::canonicalize(lab.kernel_cache.join("bookworm")).unwrap();
    let lv = Libvirt::start(&lab, &run, &[cluster, kernel]);
    let (kernel, initrd) = initramfs(&lab, &run, "plain");
    let console = run.join("plain.console.log");
    let xml = run.join("plain.xml");
    std::fs::write(&xml, plain_domain_xml(&kernel, &initrd, &console, &plain)).unwrap();
    lv.virsh_ok(&["define", xml.to_str().unwrap()]);
    let sessions_of_all = || metadata_of_root(&lab, "/");
    let before = sessions_of_all().len();
    let daemons_before = lab_daemons(&root);

    // 1. As the package installs it: no descriptor where libvirt looks. libvirt finds no
    //    virtio-fs back-end; the domain does not start, no ceph-virtiofsd runs.
    let started = lv.virsh(&["start", "plain"]);
    let err = String::from_utf8_lossy(&started.stderr).into_owned();
    println!("virsh start plain, no descriptor: {}", show(&started));
    let qemu_log = lv.log("libvirt/qemu/plain.log");
    assert!(
        !started.status.success(),
        "a plain share started a domain with no virtio-fs back-end installed:\n{}\n{qemu_log}",
        show(&started)
    );
    assert!(
        !qemu_log.contains("ceph-virtiofsd"),
        "libvirt started ceph-virtiofsd for a plain share:\n{qemu_log}"
    );
    assert_eq!(lab_daemons(&root), daemons_before);
    assert!(
        sessions_of_all().len() <= before,
        "a new CephFS session on /"
    );
    assert_ne!(lv.domstate("plain"), "running", "{err}");

    // 2. An administrator copied the example descriptor to /etc/qemu/vhost-user, making
    //    ceph-virtiofsd the host's virtio-fs back-end: libvirt runs the compat wrapper, which
    //    refuses the host directory (no ceph-virtiofsd.toml, no Ceph settings); virsh says why.
    std::fs::copy(
        lab.top.join("packaging/examples/60-ceph-virtiofsd.json"),
        run.join("etc-vhost-user/60-ceph-virtiofsd.json"),
    )
    .unwrap();
    let started = lv.virsh(&["start", "plain"]);
    println!(
        "virsh start plain, example descriptor installed: {}",
        show(&started)
    );
    let daemon_log = lv.log("libvirt/qemu/plain-fs0-virtiofsd.log");
    let qemu_log = lv.log("libvirt/qemu/plain.log");
    println!("---- QEMU log ----\n{qemu_log}\n---- daemon log ----\n{daemon_log}");
    assert!(
        !started.status.success(),
        "the plain share started with ceph-virtiofsd as its back-end:\n{}\n{daemon_log}",
        show(&started)
    );
    assert!(
        qemu_log.contains("/usr/libexec/ceph-virtiofsd-compat --fd="),
        "libvirt did not run the descriptor's binary:\n{qemu_log}"
    );
    let refusal = "holds no ceph-virtiofsd.toml";
    assert!(
        daemon_log.contains(refusal),
        "the wrapper's refusal is not in libvirt's log of the daemon:\n{daemon_log}"
    );
    // libvirt 11 reports the back-end's death ("virtiofsd died unexpectedly", or, when it is
    // still exiting, QEMU's refused connection to its socket) without its words: those are in
    // its log of the daemon, checked above, where `virsh start` points an administrator.
    assert_eq!(lab_daemons(&root), daemons_before, "a daemon kept running");
    assert!(
        sessions_of_all().len() <= before,
        "a new CephFS session on /"
    );
    lv.virsh_ok(&["undefine", "plain"]);
    drop(lv);
}
