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
//! Run alone: `tests/lab/libvirt` (as root, once), then `cargo test --test libvirt` with the lab's
//! environment (see tests/run).

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

/// The keyring of client.admin alone, for the shares' .toml files.
fn write_share_config(lab: &Lab, run: &Path, export: &str) {
    let etc = run.join("etc");
    let keyring = etc.join("ceph.client.admin.keyring");
    let st = Command::new("ceph")
        .arg("-c")
        .arg(&lab.conf)
        .args(["auth", "get", "client.admin", "-o"])
        .arg(&keyring)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "ceph auth get client.admin: {st}");
    // The cluster's ceph.conf names its own keyring and run dir (root's): the daemon of the
    // systemd unit (user ceph-virtiofsd) reads a copy without them, next to its keyring.
    let conf: String = std::fs::read_to_string(&lab.conf)
        .unwrap()
        .lines()
        .filter(|l| {
            let k = l.trim_start();
            !(k.starts_with("keyring") || k.starts_with("run dir") || k.starts_with("crash dir"))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(etc.join("ceph.conf"), conf).unwrap();
    std::fs::write(
        etc.join("vm1.toml"),
        format!(
            "# written by tests/libvirt.rs\n[ceph]\nconf = \"/etc/ceph-virtiofsd/ceph.conf\"\n\
             client-id = \"{}\"\nkeyring = \"/etc/ceph-virtiofsd/ceph.client.admin.keyring\"\n\
             root = \"{export}\"\n[log]\nlevel = \"info\"\n",
            lab.client_id
        ),
    )
    .unwrap();
}

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

    // The group of the unit's user owns /etc/ceph-virtiofsd and reads the keyring (what the
    // postinst and packaging/README.md ask of the administrator).
    let unit =
        std::fs::read_to_string(lab.top.join("packaging/systemd/ceph-virtiofsd@.service")).unwrap();
    let (user, group) = (unit_value(&unit, "User"), unit_value(&unit, "Group"));
    let gid = lv.exec(&["getent", "group", &group]);
    assert!(
        gid.status.success(),
        "no group {group} in the lab's root filesystem: {}",
        show(&gid)
    );
    let gid: u32 = String::from_utf8_lossy(&gid.stdout)
        .split(':')
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();

    // --- domain 1: libvirt starts the daemon through the compat wrapper ---
    let export1 = lab.export_dir(&format!("libvirt-binary-{}", std::process::id()));
    write_share_config(&lab, &run, &export1);
    for f in ["ceph.client.admin.keyring", "vm1.toml", "ceph.conf"] {
        std::os::unix::fs::chown(etc.join(f), Some(0), Some(gid)).unwrap();
        std::fs::set_permissions(
            etc.join(f),
            std::os::unix::fs::PermissionsExt::from_mode(0o640),
        )
        .unwrap();
    }
    std::os::unix::fs::chown(&etc, Some(0), Some(gid)).unwrap();
    std::fs::set_permissions(&etc, std::os::unix::fs::PermissionsExt::from_mode(0o750)).unwrap();

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
    for f in ["ceph.client.admin.keyring", "vm1.toml", "ceph.conf"] {
        std::os::unix::fs::chown(etc.join(f), Some(0), Some(gid)).unwrap();
        std::fs::set_permissions(
            etc.join(f),
            std::os::unix::fs::PermissionsExt::from_mode(0o640),
        )
        .unwrap();
    }
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
    let sock = run.join("unit-run/vm1.sock");
    wait_for(
        "ceph-virtiofsd@vm1 listens on /run/ceph-virtiofsd/vm1.sock",
        60,
        || {
            let active = sd.show("ActiveState");
            assert!(
                active == "active" || active == "activating",
                "ceph-virtiofsd@vm1 is {active}:\n{}",
                sd.journal()
            );
            sock.exists()
        },
        || sd.journal(),
    );
    // What the unit promises: its user and group own the socket, the group may connect (read and
    // write), others may not. (Names as the lab's root filesystem has them.)
    let mode = lv.exec(&["stat", "-c", "%a %U %G", "/run/ceph-virtiofsd/vm1.sock"]);
    assert_eq!(
        String::from_utf8_lossy(&mode.stdout).trim(),
        format!("770 {user} {group}"),
        "the unit's socket: 0777 less its UMask, its User= and Group="
    );
    // The daemon's pid in the container's pid namespace, as its session metadata has it.
    let main_pid = sd.show("MainPID");
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
