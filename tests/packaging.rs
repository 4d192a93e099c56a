//! packaging/: the files QEMU, libvirt, Kata, systemd and dpkg read are checked against the
//! daemon they describe and against the guest harness, so they cannot go stale:
//! - the systemd unit passes `systemd-analyze verify` and an offline security review, and the
//!   command line it runs is a valid ceph-virtiofsd configuration;
//! - the vhost-user descriptor agrees with `--print-capabilities`, names an installed file, and
//!   is shipped as an example only (never where libvirt looks for one);
//! - the compat wrapper turns libvirt's and Kata's virtiofsd command lines into ours;
//! - the man page is the one clap_mangen generates from the CLI today;
//! - the libvirt domain examples are well-formed and point at what the package installs;
//! - the QEMU example is, argument for argument, what tests/lab/guest/run-guest runs;
//! - `cargo deb` builds the package, it holds what it should, and lintian finds nothing to
//!   warn about (bookworm's lintian, the host's; trixie's package: tests/package_install.rs).
//!
//! No Ceph cluster and no guest are needed. Needs `systemd-analyze` (package systemd),
//! `dpkg-deb`, lintian and cargo-deb (`cargo install cargo-deb --locked`).
//! After a CLI change, regenerate the man page: `UPDATE_MANPAGE=1 cargo test --test packaging`.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ceph_virtiofsd::args::Args;
use ceph_virtiofsd::config::{Config, Listen};
use ceph_virtiofsd::fs::CacheMode;
use clap::{CommandFactory, Parser};

const DAEMON: &str = env!("CARGO_BIN_EXE_ceph-virtiofsd");

fn top() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let p = top().join(rel);
    fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// A fresh scratch directory for one test, under cargo's per-target tmp dir.
fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("packaging")
        .join(name);
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
    // Canonical, so paths the scripts resolve with `pwd` compare equal.
    fs::canonicalize(&d).unwrap()
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e} (is the program installed?)"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write_script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, body).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// `[package.metadata.deb]` of Cargo.toml.
fn deb_metadata() -> toml::Value {
    let manifest: toml::Value = toml::from_str(&read("Cargo.toml")).expect("parse Cargo.toml");
    manifest["package"]["metadata"]["deb"].clone()
}

/// `[package.metadata.deb].assets` of Cargo.toml: source -> installed absolute path. A symlink
/// (`{ dest, link_name }`) is listed as `symlink:DEST` -> its target.
fn deb_assets() -> BTreeMap<String, String> {
    let assets = deb_metadata()["assets"]
        .as_array()
        .expect("[package.metadata.deb] assets")
        .clone();
    assets
        .iter()
        .map(|a| {
            if let Some(t) = a.as_table() {
                let dest = t["dest"].as_str().unwrap();
                let target = t["link_name"].as_str().unwrap();
                return (format!("symlink:/{dest}"), target.to_owned());
            }
            let a = a.as_array().expect("asset is [source, dest, mode]");
            let src = a[0].as_str().unwrap().to_owned();
            let dest = a[1].as_str().unwrap();
            (src, format!("/{dest}"))
        })
        .collect()
}

fn installed(src: &str) -> String {
    deb_assets()
        .remove(src)
        .unwrap_or_else(|| panic!("{src} is not installed by [package.metadata.deb] assets"))
}

const UNIT: &str = "packaging/systemd/ceph-virtiofsd@.service";

/// The `Key=value` lines of the unit's [Service] section, in order.
fn unit_settings() -> Vec<(String, String)> {
    read(UNIT)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn unit_get(key: &str) -> String {
    let found = unit_all(key);
    assert_eq!(found.len(), 1, "{UNIT}: expected exactly one {key}=");
    found[0].clone()
}

/// Every value of `key` in the unit.
fn unit_all(key: &str) -> Vec<String> {
    unit_settings()
        .into_iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v)
        .collect()
}

#[test]
fn systemd_unit_verifies_and_is_hardened() {
    let exec = unit_get("ExecStart");
    let installed_daemon = installed("target/release/ceph-virtiofsd");
    assert!(
        exec.starts_with(&format!("{installed_daemon} ")),
        "ExecStart must run the packaged daemon {installed_daemon}: {exec}"
    );

    // systemd-analyze wants ExecStart's program to exist: point it at the built binary.
    let dir = scratch("unit");
    let unit = read(UNIT).replace(&installed_daemon, DAEMON);
    fs::write(dir.join("ceph-virtiofsd@.service"), unit).unwrap();
    let instance = dir.join("ceph-virtiofsd@vm1.service");
    let out = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&instance));
    // verify exits 0 on unknown keys and bad values, but says so on stderr.
    assert!(
        out.status.success() && out.stderr.is_empty() && out.stdout.is_empty(),
        "systemd-analyze verify: {}\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    // Exposure at most 2.0 of 10 ("OK").
    let out = run(Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--threshold=20"])
        .arg(&instance));
    assert!(
        out.status.success(),
        "systemd-analyze security: exposure above 2.0\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    for (key, value) in [
        // systemctl start returns once the socket listens and CephFS is mounted, and a wedged
        // daemon stops its pings.
        ("Type", "notify"),
        ("WatchdogSec", "30s"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ReadWritePaths", "/run/ceph-virtiofsd"),
        ("ReadOnlyPaths", "-/etc/ceph"),
        // No instance sees another's configuration or keyring: each gets its own as
        // credentials, under a user of its own.
        ("InaccessiblePaths", "-/etc/ceph-virtiofsd"),
        ("DynamicUser", "yes"),
        // Named after the instance: a template's implied name is its prefix, ceph-virtiofsd,
        // the package's static user, which all instances would then share.
        ("User", "cvfs-%i"),
        ("SupplementaryGroups", "ceph-virtiofsd"),
        ("CapabilityBoundingSet", ""),
        ("SystemCallArchitectures", "native"),
        // The daemon installs its own seccomp filter: seccomp(2) must pass systemd's.
        ("SystemCallFilter", "@system-service seccomp"),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
        ("EnvironmentFile", "-/etc/ceph-virtiofsd/%i.env"),
    ] {
        assert_eq!(unit_get(key), value, "{UNIT}: {key}=");
    }
    assert_eq!(
        unit_all("LoadCredential"),
        [
            "config:/etc/ceph-virtiofsd/%i.toml",
            "keyring:/etc/ceph-virtiofsd/%i.keyring"
        ],
        "{UNIT}: the instance's configuration and keyring as credentials"
    );
    // A shared static user would let every instance read every keyring; nothing mlocks.
    for gone in ["Group", "RuntimeDirectory", "LimitMEMLOCK"] {
        assert!(unit_all(gone).is_empty(), "{UNIT}: {gone}= is back");
    }
    // The socket directory, shared and sticky, owned by the group QEMU's user joins.
    assert_eq!(
        read("packaging/systemd/ceph-virtiofsd.tmpfiles")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .collect::<Vec<_>>(),
        ["d /run/ceph-virtiofsd 1770 root ceph-virtiofsd -"]
    );
    assert_eq!(
        installed("packaging/systemd/ceph-virtiofsd.tmpfiles"),
        "/usr/lib/tmpfiles.d/ceph-virtiofsd.conf"
    );

    // The command line the unit runs, for instance vm1 with the example config as its
    // credential, is a valid configuration listening where the unit's sandbox lets it write,
    // with the instance's keyring and socket group.
    let creds = scratch("unit-credentials");
    fs::copy(
        top().join("config/ceph-virtiofsd.toml"),
        creds.join("config"),
    )
    .unwrap();
    // The group the package's sysusers file makes; a host without the package has root.
    let group_exists = run(Command::new("getent").args(["group", "ceph-virtiofsd"]))
        .status
        .success();
    let words: Vec<String> = exec
        .split_whitespace()
        .filter(|w| *w != "$CEPH_VIRTIOFSD_ARGS")
        .map(|w| {
            let w = w
                .replace("%d", creds.to_str().unwrap())
                .replace("%i", "vm1");
            if w == "ceph-virtiofsd" && !group_exists {
                "root".to_owned()
            } else {
                w
            }
        })
        .collect();
    let args = Args::try_parse_from(&words).unwrap_or_else(|e| panic!("{exec}: {e}"));
    let config = Config::try_from(args).unwrap_or_else(|e| panic!("{exec}: {e}"));
    assert_eq!(
        config.listen,
        Listen::SocketPath("/run/ceph-virtiofsd/vm1.sock".into())
    );
    assert!(config.keep_serving);
    assert_eq!(
        config.ceph.access.keyring,
        Some(creds.join("keyring")),
        "the credential, not the .toml file's keyring"
    );
    assert!(exec.contains("--socket-group ceph-virtiofsd"), "{exec}");
}

const DESCRIPTOR: &str = "packaging/examples/60-ceph-virtiofsd.json";
const COMPAT: &str = "packaging/compat/ceph-virtiofsd-compat";

#[test]
fn vhost_user_descriptor_agrees_with_print_capabilities() {
    let desc: serde_json::Value = serde_json::from_str(&read(DESCRIPTOR)).expect("parse JSON");
    let obj = desc.as_object().expect("descriptor is a JSON object");
    // QEMU's docs/interop/vhost-user.json VhostUserBackend: description, type, binary, *tags.
    for key in obj.keys() {
        assert!(
            ["description", "type", "binary", "tags"].contains(&key.as_str()),
            "{DESCRIPTOR}: unknown key {key}"
        );
    }
    assert_eq!(
        desc["binary"].as_str(),
        Some(installed(COMPAT).as_str()),
        "{DESCRIPTOR}: binary must be the installed compat wrapper (libvirt runs it with virtiofsd's options)"
    );
    // An example only: libvirt takes the first "fs" descriptor it finds in
    // /usr/share/qemu/vhost-user (or /etc/qemu/vhost-user) for every <filesystem> without
    // <binary path>; there it would capture ordinary host-directory shares (tests/libvirt.rs).
    for (src, dest) in deb_assets() {
        assert!(
            !dest.contains("/qemu/vhost-user"),
            "{src} is installed as {dest}, where libvirt looks for back-ends"
        );
    }
    assert!(
        deb_assets().contains_key("packaging/examples/*"),
        "the examples (the descriptor among them) are installed"
    );

    // What libvirt runs: the descriptor's binary with --print-capabilities.
    let mut direct = Command::new(DAEMON);
    direct.arg("--print-capabilities");
    let mut wrapped = Command::new(top().join(COMPAT));
    wrapped
        .env("CEPH_VIRTIOFSD", DAEMON)
        .arg("--print-capabilities");
    for mut cmd in [direct, wrapped] {
        let out = run(&mut cmd);
        assert!(out.status.success(), "{cmd:?}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), ceph_virtiofsd::CAPABILITIES_JSON);
        let caps: serde_json::Value = serde_json::from_slice(&out.stdout).expect("caps JSON");
        assert_eq!(
            caps["type"], desc["type"],
            "descriptor type vs capabilities"
        );
        assert_eq!(caps["type"], "fs");
        // libvirt refuses to migrate a domain whose virtiofs back-end does not say this.
        assert!(
            caps["features"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f == "migrate-precopy")),
            "{caps}"
        );
    }
}

/// Run the compat wrapper with a stand-in daemon that prints its arguments, one per line.
fn compat_run(args: &[&str]) -> Output {
    // Written once: tests run in parallel, and a script being rewritten cannot be executed.
    static ECHO: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let echo = ECHO.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("packaging");
        fs::create_dir_all(&dir).unwrap();
        let echo = dir.join(format!("echo-args-{}", std::process::id()));
        write_script(&echo, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n");
        echo
    });
    run(Command::new(top().join(COMPAT))
        .env("CEPH_VIRTIOFSD", echo)
        .args(args))
}

/// [`compat_run`], which must succeed: the daemon's arguments.
fn compat_translate(args: &[&str]) -> Vec<String> {
    let out = compat_run(args);
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    text(&out.stdout).lines().map(str::to_owned).collect()
}

/// An ordinary directory never becomes a share: a source directory without
/// ceph-virtiofsd.toml, on a command line that names no Ceph settings (what libvirt sends for
/// a plain `<filesystem>`), is refused (exit 2, the reason on stderr, which libvirt logs), and
/// the daemon is not started. On main it was dropped and the daemon started with its defaults
/// (client.admin, CephFS "/").
#[test]
fn compat_wrapper_refuses_a_plain_directory() {
    let dir = scratch("compat-plain");
    let plain = dir.join("srv-plain");
    fs::create_dir(&plain).unwrap();
    let plain = plain.to_str().unwrap();
    let opts = format!("source={plain},cache=always");
    for argv in [
        vec!["--fd=21", "--shared-dir", plain, "--xattr"],
        vec!["--fd=21", "-o", opts.as_str()],
        // Half the Ceph settings are not enough.
        vec!["--fd=3", "--shared-dir", plain, "--client-id=vm1"],
    ] {
        let out = compat_run(&argv);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{argv:?}: {}",
            text(&out.stdout)
        );
        assert!(
            out.stdout.is_empty(),
            "the daemon ran: {}",
            text(&out.stdout)
        );
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!(
                "source directory {plain} holds no ceph-virtiofsd.toml"
            )) && err.contains("/usr/libexec/virtiofsd"),
            "{argv:?}: {err}"
        );
    }
}

fn config_of(args: &[String]) -> Config {
    let argv = std::iter::once("ceph-virtiofsd".to_owned()).chain(args.iter().cloned());
    let parsed = Args::try_parse_from(argv).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    Config::try_from(parsed).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

#[test]
fn compat_wrapper_maps_libvirt_and_kata_command_lines() {
    let dir = scratch("compat");
    let conf = top().join("config/ceph-virtiofsd.toml");
    let conf = conf.to_str().unwrap();
    let share = dir.join("share");
    fs::create_dir(&share).unwrap();
    fs::copy(conf, share.join("ceph-virtiofsd.toml")).unwrap();
    let share = share.to_str().unwrap();
    // Kata's sandbox directory: /run/kata-containers/shared/sandboxes/<sandbox id>/shared.
    let sandbox_id = "4f1c0ffee4f1c0ffee4f1c0ffee4f1c0ffee4f1c0ffee4f1c0ffee4f1c0ffee9";
    let sandbox = dir.join(format!("sandboxes/{sandbox_id}/shared"));
    fs::create_dir_all(&sandbox).unwrap();
    let sandbox = sandbox.to_str().unwrap();

    // libvirt with "separate-options" (what our capabilities announce); source is a file.
    let got = compat_translate(&[
        "--fd=3",
        "--shared-dir",
        conf,
        "--cache",
        "never",
        "--sandbox",
        "chroot",
        "--xattr",
        "--thread-pool-size=2",
        "--rlimit-nofile=4096",
        "--log-level",
        "debug",
    ]);
    assert_eq!(got[..2], ["--config", conf]);
    assert!(!got.iter().any(|a| a.contains("shared-dir")), "{got:?}");
    let c = config_of(&got);
    assert_eq!(c.listen, Listen::Fd(3));
    assert_eq!(c.cache, CacheMode::Never);
    assert_eq!(c.thread_pool_size, 2);
    assert_eq!(c.ceph.access.client_id.as_deref(), Some("vm1"));

    // Older libvirt: -o source=...; source is a directory holding ceph-virtiofsd.toml.
    let opts = format!("source={share},cache=always,xattr");
    let got = compat_translate(&["--fd=4", "-o", &opts, "--thread-pool-size=1"]);
    let want_conf = format!("{share}/ceph-virtiofsd.toml");
    assert_eq!(
        got,
        [
            "--config",
            want_conf.as_str(),
            "--fd=4",
            "-o",
            "cache=always,xattr",
            "--thread-pool-size=1"
        ]
    );
    let c = config_of(&got);
    assert_eq!(c.listen, Listen::Fd(4));
    assert_eq!(c.cache, CacheMode::Always);

    // Kata: the sandbox directory is dropped, the Ceph options come from virtio_fs_extra_args
    // (packaging/examples/kata-configuration-qemu.toml).
    let kata: toml::Value =
        toml::from_str(&read("packaging/examples/kata-configuration-qemu.toml")).unwrap();
    let q = &kata["hypervisor"]["qemu"];
    assert_eq!(q["shared_fs"].as_str(), Some("virtio-fs"));
    assert_eq!(
        q["virtio_fs_daemon"].as_str(),
        Some(installed(COMPAT).as_str())
    );
    let cache = format!("--cache={}", q["virtio_fs_cache"].as_str().unwrap());
    let shared = format!("--shared-dir={sandbox}");
    let mut argv = vec!["--syslog", &cache, &shared, "--fd=3"];
    let extra: Vec<&str> = q["virtio_fs_extra_args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    argv.extend(&extra);
    let got = compat_translate(&argv);
    assert!(!got.iter().any(|a| a.contains("shared-dir")), "{got:?}");
    assert!(!got.iter().any(|a| a == "--config"), "{got:?}");
    let c = config_of(&got);
    assert_eq!(c.listen, Listen::Fd(3));
    assert_eq!(c.cache, CacheMode::Auto);
    assert_eq!(c.ceph.access.client_id.as_deref(), Some("kata"));
    assert_eq!(c.ceph.root, "/volumes/_nogroup/kata");
    assert!(c.log.syslog);
    // The sandbox id names the CephFS session (client metadata vm=<id>).
    assert_eq!(c.ceph.access.name.as_deref(), Some(sandbox_id));
    // A --name of the extra args wins.
    argv.push("--name=pod-a");
    let got = compat_translate(&argv);
    assert_eq!(config_of(&got).ceph.access.name.as_deref(), Some("pod-a"));
}

const MANPAGE: &str = "packaging/man/ceph-virtiofsd.8";

/// What roff::Roff puts before each rendering: kept once, at the top of a page.
const ROFF_PREAMBLE: &str = ".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n";

/// One clap_mangen section, without the preamble.
fn roff_part(render: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> String {
    let mut buf = Vec::new();
    render(&mut buf).expect("render man page section");
    let s = String::from_utf8(buf).expect("roff is UTF-8");
    s.strip_prefix(ROFF_PREAMBLE).unwrap_or(&s).to_owned()
}

/// Text for roff: backslashes and hyphens escaped, no line starting with a control character.
fn roff_text(s: &str) -> String {
    let s = s.replace('\\', "\\e").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}

/// A template of packaging/man/*.in with its `@NAME@` lines replaced by `parts`.
fn fill_template(template: &str, parts: &[(&str, String)]) -> String {
    let text = read(template);
    let mut out = String::from(ROFF_PREAMBLE);
    for line in text.lines() {
        match parts.iter().find(|(k, _)| line.trim() == *k) {
            Some((_, part)) => out.push_str(part),
            None => {
                assert!(
                    !line.starts_with('@'),
                    "{template}: {line} is not a part the generator knows"
                );
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// `@KEYS@` of ceph-virtiofsd.toml(5): the example configuration's tables, keys and comments.
/// A comment block describes the keys right under it (a table, when a table line follows it);
/// a key shown commented out (`# key = value`) is one the example leaves unset.
fn config_keys_roff() -> String {
    fn key_of(line: &str) -> Option<String> {
        let (set, rest) = match line.strip_prefix("# ") {
            Some(r) => (false, r),
            None => (true, line),
        };
        let (k, _) = rest.split_once(" = ")?;
        let ok = k.starts_with(|c: char| c.is_ascii_lowercase())
            && k.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
        ok.then(|| {
            if set {
                format!("\\fB{}\\fR", roff_text(rest))
            } else {
                format!("\\fB{}\\fR (unset in the example)", roff_text(rest))
            }
        })
    }
    fn flush(out: &mut String, keys: &mut Vec<String>, text: &mut Vec<String>) {
        if keys.is_empty() {
            return;
        }
        out.push_str(".TP\n");
        out.push_str(&keys.join("\n.br\n"));
        out.push('\n');
        out.push_str(&roff_text(&text.join(" ")));
        out.push('\n');
        keys.clear();
        text.clear();
    }
    let example = read("config/ceph-virtiofsd.toml");
    let mut out = String::new();
    let mut comment: Vec<String> = Vec::new();
    let mut keys: Vec<String> = Vec::new();
    let mut text: Vec<String> = Vec::new();
    let mut in_table = false;
    for line in example.lines() {
        let t = line.trim();
        if let Some(table) = t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            flush(&mut out, &mut keys, &mut text);
            out.push_str(&format!(".SS \"[{}]\"\n", roff_text(table)));
            if in_table && !comment.is_empty() {
                out.push_str(&format!(".PP\n{}\n", roff_text(&comment.join(" "))));
            }
            comment.clear();
            in_table = true;
            continue;
        }
        if !in_table {
            continue; // the file's own header
        }
        if let Some(key) = key_of(t) {
            if !comment.is_empty() {
                flush(&mut out, &mut keys, &mut text);
                text = std::mem::take(&mut comment);
            }
            keys.push(key);
        } else if let Some(c) = t.strip_prefix('#') {
            flush(&mut out, &mut keys, &mut text);
            comment.push(c.trim().to_owned());
        }
    }
    flush(&mut out, &mut keys, &mut text);
    out
}

/// The man pages, generated: (path, content).
fn manpages() -> Vec<(&'static str, String)> {
    // The daemon: virtiofsd's compatibility options under a heading of their own, with their
    // help (clap_mangen writes no help for an option hidden from `-h`).
    let cmd = Args::command().mut_args(|a| {
        if a.is_hide_short_help_set() {
            a.hide_short_help(false)
                .help_heading("VIRTIOFSD COMPATIBILITY OPTIONS")
        } else {
            a
        }
    });
    let man = clap_mangen::Man::new(cmd)
        .section("8")
        .manual("System Manager's Manual");
    let daemon = fill_template(
        "packaging/man/ceph-virtiofsd.8.in",
        &[
            ("@TITLE@", roff_part(|w| man.render_title(w))),
            ("@NAME@", roff_part(|w| man.render_name_section(w))),
            ("@OPTIONS@", roff_part(|w| man.render_options_section(w))),
            ("@VERSION@", roff_part(|w| man.render_version_section(w))),
        ],
    );

    let qman = clap_mangen::Man::new(ceph_virtiofsd::args::QuarantineArgs::command())
        .title("ceph-virtiofsd-quarantine")
        .section("8")
        .manual("System Manager's Manual");
    let quarantine = fill_template(
        "packaging/man/ceph-virtiofsd-quarantine.8.in",
        &[
            ("@TITLE@", roff_part(|w| qman.render_title(w))),
            ("@OPTIONS@", roff_part(|w| qman.render_options_section(w))),
            ("@VERSION@", roff_part(|w| qman.render_version_section(w))),
        ],
    );

    let tman = clap_mangen::Man::new(Args::command())
        .title("ceph-virtiofsd.toml")
        .section("5")
        .manual("File Formats Manual");
    let toml = fill_template(
        "packaging/man/ceph-virtiofsd.toml.5.in",
        &[
            ("@TITLE@", roff_part(|w| tman.render_title(w))),
            ("@KEYS@", config_keys_roff()),
            ("@VERSION@", roff_part(|w| tman.render_version_section(w))),
        ],
    );
    vec![
        (MANPAGE, daemon),
        ("packaging/man/ceph-virtiofsd-quarantine.8", quarantine),
        ("packaging/man/ceph-virtiofsd.toml.5", toml),
    ]
}

#[test]
fn manpage_is_generated_from_the_cli() {
    let update = std::env::var_os("UPDATE_MANPAGE").is_some();
    for (rel, page) in manpages() {
        let path = top().join(rel);
        if update {
            fs::write(&path, &page).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        }
        let current = fs::read_to_string(&path).unwrap_or_default();
        assert!(
            current == page,
            "{rel} is stale (the CLI, the example configuration or the template changed): \
             regenerate it with `UPDATE_MANPAGE=1 cargo test --test packaging manpage` and \
             commit it"
        );
        let name = Path::new(rel).file_name().unwrap().to_str().unwrap();
        let section = name.rsplit('.').next().unwrap();
        assert_eq!(
            installed(rel),
            format!("/usr/share/man/man{section}/{name}"),
            "{rel} is installed where man finds it"
        );
        // mandoc, where installed, lints the page.
        if let Ok(out) = Command::new("mandoc")
            .args(["-T", "lint", "-W", "warning"])
            .arg(&path)
            .output()
        {
            assert!(
                out.status.success(),
                "mandoc -T lint {rel}:\n{}{}",
                text(&out.stdout),
                text(&out.stderr)
            );
        }
    }
}

/// The operator's quarantine command on PATH: /usr/sbin/ceph-virtiofsd-quarantine, a symlink
/// to the daemon, answers with its own help and usage under its own name (main: the command
/// existed only as `/usr/libexec/ceph-virtiofsd quarantine`).
#[test]
fn quarantine_command_is_on_path_with_its_own_help() {
    assert_eq!(
        deb_assets()
            .get("symlink:/usr/sbin/ceph-virtiofsd-quarantine")
            .map(String::as_str),
        Some("../libexec/ceph-virtiofsd"),
        "/usr/sbin/ceph-virtiofsd-quarantine -> the daemon"
    );
    let dir = scratch("quarantine-cmd");
    let link = dir.join("ceph-virtiofsd-quarantine");
    std::os::unix::fs::symlink(DAEMON, &link).unwrap();
    let out = run(Command::new(&link).arg("--help"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let help = text(&out.stdout);
    assert!(
        help.contains("Usage: ceph-virtiofsd-quarantine [OPTIONS] <ACTION> <PATH>")
            && help.contains("enable")
            && help.contains("--client-id"),
        "{help}"
    );
    let out = run(&mut Command::new(&link));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("Usage: ceph-virtiofsd-quarantine"),
        "{}",
        text(&out.stderr)
    );
    // The daemon's own help points at it.
    let out = run(Command::new(DAEMON).arg("--help"));
    assert!(text(&out.stdout).contains("ceph-virtiofsd-quarantine"));
}

fn child<'a>(n: roxmltree::Node<'a, 'a>, tag: &str) -> roxmltree::Node<'a, 'a> {
    n.children()
        .find(|c| c.has_tag_name(tag))
        .unwrap_or_else(|| panic!("<{}> has no <{tag}>", n.tag_name().name()))
}

#[test]
fn libvirt_examples_are_well_formed_and_match_the_package() {
    for (file, socket) in [
        ("packaging/examples/libvirt-domain.xml", false),
        ("packaging/examples/libvirt-domain-socket.xml", true),
    ] {
        let xml = read(file);
        let doc = roxmltree::Document::parse(&xml).unwrap_or_else(|e| panic!("{file}: {e}"));
        let domain = doc.root_element();
        assert!(domain.has_tag_name("domain"), "{file}");
        let mb = child(domain, "memoryBacking");
        assert_eq!(
            child(mb, "access").attribute("mode"),
            Some("shared"),
            "{file}"
        );
        let fs_node = child(child(domain, "devices"), "filesystem");
        assert_eq!(fs_node.attribute("type"), Some("mount"), "{file}");
        assert_eq!(
            child(fs_node, "driver").attribute("type"),
            Some("virtiofs"),
            "{file}"
        );
        assert_eq!(
            child(fs_node, "target").attribute("dir"),
            Some("cephfs"),
            "{file}"
        );
        let source = child(fs_node, "source");
        if socket {
            // The socket ceph-virtiofsd@vm1.service listens on.
            assert_eq!(
                source.attribute("socket"),
                Some("/run/ceph-virtiofsd/vm1.sock"),
                "{file}"
            );
            assert!(unit_get("ExecStart").contains("--socket-path /run/ceph-virtiofsd/%i.sock"));
        } else {
            let binary = child(fs_node, "binary").attribute("path");
            assert_eq!(binary, Some(installed(COMPAT).as_str()), "{file}");
            assert!(source.attribute("dir").is_some(), "{file}");
        }
    }
}

#[test]
fn qemu_example_is_the_harness_command_line() {
    let dir = scratch("qemu");
    // A stand-in QEMU: records its arguments (NUL-separated), then reports a passing guest the
    // way the harness expects (verdict on the serial console, isa-debug-exit status 1 = rc 0).
    let fake = dir.join("fake-qemu");
    write_script(
        &fake,
        "#!/bin/sh\n\
         printf '%s\\0' \"$@\" > \"$FAKE_QEMU_OUT\"\n\
         prev=\n\
         for a in \"$@\"; do\n\
           if [ \"$prev\" = -serial ]; then echo 'GUEST-RESULT: rc=0' > \"${a#file:}\"; fi\n\
           prev=$a\n\
         done\n\
         exit 1\n",
    );
    let sock = dir.join("vm1.sock");
    let _listener = UnixListener::bind(&sock).expect("bind a stand-in daemon socket");
    let kdir = dir.join("kernel");
    fs::create_dir(&kdir).unwrap();
    fs::write(kdir.join(".complete"), "").unwrap();
    fs::write(kdir.join("vmlinux"), "").unwrap();
    let initrd = dir.join("initrd.img");
    fs::write(&initrd, "").unwrap();
    let console = dir.join("console.log");

    let harness_env = [
        "GUEST_ACCEL",
        "GUEST_SMP",
        "GUEST_FS_QUEUES",
        "GUEST_QEMU_ARGS",
        "GUEST_KERNEL_SUITE",
        "GUEST_APPEND",
    ];
    for queues in [None, Some("2")] {
        // The harness, as tests/common/mod.rs runs it.
        let harness_out = dir.join("harness.args");
        let mut cmd = Command::new(top().join("tests/lab/guest/run-guest"));
        for v in harness_env {
            cmd.env_remove(v);
        }
        if let Some(q) = queues {
            cmd.env("GUEST_FS_QUEUES", q);
        }
        cmd.env("GUEST_QEMU", &fake)
            .env("FAKE_QEMU_OUT", &harness_out)
            .arg("--socket")
            .arg(&sock)
            .args(["--tag", "cephfs", "--mem", "1G", "--timeout", "60"])
            .arg("--initrd")
            .arg(&initrd)
            .arg("--kernel-cache")
            .arg(&kdir)
            .arg("--log")
            .arg(&console);
        let out = run(&mut cmd);
        assert!(
            out.status.success(),
            "run-guest with a stand-in QEMU: {}\n{}",
            out.status,
            text(&out.stderr)
        );

        // The example, with the same settings.
        let example_out = dir.join("example.args");
        let mut cmd = Command::new(top().join("packaging/examples/qemu-cmdline.sh"));
        for v in [
            "ACCEL", "SMP", "QUEUES", "APPEND", "MEM", "SOCK", "TAG", "KERNEL", "INITRD",
        ] {
            cmd.env_remove(v);
        }
        if let Some(q) = queues {
            cmd.env("QUEUES", q);
        }
        cmd.env("QEMU", &fake)
            .env("FAKE_QEMU_OUT", &example_out)
            .env("MEM", "1G")
            .env("SOCK", &sock)
            .env("KERNEL", kdir.join("vmlinux"))
            .env("INITRD", &initrd)
            .env("CONSOLE", &console);
        let out = run(&mut cmd);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));

        let harness = fs::read(&harness_out).unwrap();
        let example = fs::read(&example_out).unwrap();
        let split = |b: &[u8]| -> Vec<String> {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(text)
                .collect()
        };
        assert_eq!(
            split(&example),
            split(&harness),
            "packaging/examples/qemu-cmdline.sh differs from tests/lab/guest/run-guest (queues {queues:?})"
        );
        assert!(split(&harness).len() > 20);
    }
}

#[test]
fn debian_package_builds_with_the_expected_contents() {
    let dir = scratch("deb");
    // Package the binary this test run built, laid out as a release build in a scratch target
    // directory: no release build needed here, and the real target/release is left alone.
    let release = dir.join("target/release");
    fs::create_dir_all(&release).unwrap();
    let bin = release.join("ceph-virtiofsd");
    if fs::hard_link(DAEMON, &bin).is_err() {
        fs::copy(DAEMON, &bin).unwrap();
    }
    let out_dir = dir.join("out");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = run(Command::new(&cargo)
        .current_dir(top())
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .args(["deb", "--no-build", "--fast", "--output"])
        .arg(&out_dir));
    assert!(
        out.status.success(),
        "cargo deb failed (install it with `cargo install cargo-deb --locked`): {}\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    let deb = fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("cargo deb wrote no .deb");

    let out = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    // "-rwxr-xr-x root/root  123 2024-01-01 00:00 ./usr/libexec/ceph-virtiofsd"
    let files: BTreeMap<String, String> = listing
        .lines()
        .filter_map(|l| {
            let mode = l.split_whitespace().next()?;
            let path = l.split_whitespace().last()?.trim_start_matches('.');
            Some((path.to_owned(), mode.to_owned()))
        })
        .collect();
    for (src, dest) in deb_assets() {
        if src.ends_with('*') || src.starts_with("symlink:") {
            continue;
        }
        let found = files
            .keys()
            .any(|f| f == &dest || f.starts_with(&format!("{dest}.")));
        assert!(
            found,
            "{dest} (from {src}) missing from the package:\n{listing}"
        );
    }
    for must in [
        "/usr/libexec/ceph-virtiofsd",
        "/usr/libexec/ceph-virtiofsd-compat",
        "/usr/lib/systemd/system/ceph-virtiofsd@.service",
        "/usr/lib/tmpfiles.d/ceph-virtiofsd.conf",
        "/usr/share/doc/ceph-virtiofsd/examples/60-ceph-virtiofsd.json",
        "/usr/share/doc/ceph-virtiofsd/changelog.Debian.gz",
        "/usr/share/doc/ceph-virtiofsd/copyright",
        "/usr/share/doc/ceph-virtiofsd/examples/ceph-virtiofsd.toml",
        "/usr/share/doc/ceph-virtiofsd/examples/libvirt-domain.xml",
        "/usr/share/doc/ceph-virtiofsd/examples/qemu-cmdline.sh",
        "/usr/share/doc/ceph-virtiofsd/examples/kata-configuration-qemu.toml",
        "/usr/share/doc/ceph-virtiofsd/examples/cloud-hypervisor.sh",
    ] {
        assert!(files.contains_key(must), "{must} missing:\n{listing}");
    }
    for page in [
        "ceph-virtiofsd.8",
        "ceph-virtiofsd-quarantine.8",
        "ceph-virtiofsd-compat.8",
    ] {
        assert!(
            files
                .keys()
                .any(|f| f.starts_with(&format!("/usr/share/man/man8/{page}"))),
            "man page {page} missing:\n{listing}"
        );
    }
    // Never where libvirt looks for vhost-user back-ends.
    assert!(
        !files.keys().any(|f| f.contains("/qemu/vhost-user")),
        "a vhost-user descriptor is installed:\n{listing}"
    );
    // The quarantine command on PATH: a relative symlink to the daemon.
    assert!(
        listing.lines().any(|l| l.starts_with('l')
            && l.contains("./usr/sbin/ceph-virtiofsd-quarantine -> ../libexec/ceph-virtiofsd")),
        "no /usr/sbin/ceph-virtiofsd-quarantine symlink:\n{listing}"
    );
    for exe in [
        "/usr/libexec/ceph-virtiofsd",
        "/usr/libexec/ceph-virtiofsd-compat",
    ] {
        assert!(
            files[exe].starts_with("-rwxr-xr-x"),
            "{exe}: {}",
            files[exe]
        );
    }
    // Nothing else of the workspace (the bench tool is not shipped).
    assert!(
        !files.keys().any(|f| f.contains("bench")),
        "unexpected file:\n{listing}"
    );

    let out = run(Command::new("dpkg-deb")
        .args(["-f"])
        .arg(&deb)
        .arg("Depends"));
    let depends = text(&out.stdout);
    assert!(depends.contains("libcephfs2"), "Depends: {depends}");
    let out = run(Command::new("dpkg-deb").args(["-I"]).arg(&deb));
    let info = text(&out.stdout);
    assert!(info.contains("postinst"), "no postinst:\n{info}");
    let out = run(Command::new("dpkg-deb")
        .arg("-f")
        .arg(&deb)
        .arg("Maintainer"));
    assert_eq!(
        text(&out.stdout).trim(),
        deb_metadata()["maintainer"].as_str().unwrap()
    );

    // A distribution's checker finds nothing to warn about (errors, warnings; informational
    // and pedantic tags are printed).
    lintian_clean(&deb);

    // The daemon ships stripped; its symbols are in the -dbgsym package, under the build id.
    let unpacked = dir.join("unpacked");
    let out = run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shipped = unpacked.join("usr/libexec/ceph-virtiofsd");
    let sections = elf_sections(&shipped);
    assert!(
        // .debug_gdb_scripts is loaded data (rustc's pretty-printer hint), not debug info.
        !sections
            .iter()
            .any(|s| s.starts_with(".debug_") && s != ".debug_gdb_scripts"),
        "the packaged daemon carries debug sections: {sections:?}"
    );
    let id = build_id(&shipped);
    let ddeb = fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "ddeb"))
        .expect("cargo deb wrote no -dbgsym .ddeb");
    let out = run(Command::new("dpkg-deb").arg("-f").arg(&ddeb).arg("Package"));
    assert_eq!(text(&out.stdout).trim(), "ceph-virtiofsd-dbgsym");
    let symbols = dir.join("symbols");
    let out = run(Command::new("dpkg-deb").arg("-x").arg(&ddeb).arg(&symbols));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (dir_part, file_part) = id.split_at(2);
    let debug = symbols.join(format!(
        "usr/lib/debug/.build-id/{dir_part}/{file_part}.debug"
    ));
    assert!(
        debug.is_file(),
        "no {} in the -dbgsym package (build id {id})",
        debug.display()
    );
    assert!(
        elf_sections(&debug).iter().any(|s| s == ".debug_line"),
        "{} holds no line tables",
        debug.display()
    );
}

/// lintian (the host's: Debian bookworm's) on `deb`: no error and no warning.
pub fn lintian_clean(deb: &Path) {
    let out = run(Command::new("lintian")
        .args(["--info", "--display-info", "--pedantic", "--color=never"])
        .arg(deb));
    let report = text(&out.stdout) + &text(&out.stderr);
    println!("lintian {}:\n{report}", deb.display());
    let bad: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("E: ") || l.starts_with("W: "))
        .collect();
    assert!(
        bad.is_empty() && out.status.code().is_some_and(|c| c == 0 || c == 2),
        "lintian (exit {}): {bad:#?}\n{report}",
        out.status
    );
}

/// The Debian changelog's first entry is this version's (revision 1), and the copyright file
/// carries the BSD-3-Clause text (Debian has no common-licenses file for it) and the license
/// files exist in the source tree.
#[test]
fn changelog_copyright_and_license_texts() {
    let changelog = read(deb_metadata()["changelog"].as_str().unwrap());
    let first = changelog.lines().next().unwrap_or_default();
    let want = format!("ceph-virtiofsd ({}-1) ", env!("CARGO_PKG_VERSION"));
    assert!(
        first.starts_with(&want),
        "packaging/deb/changelog: the first entry is {first:?}, the package's version is \
         {want:?}: add an entry for it"
    );
    let copyright = read("packaging/deb/copyright");
    let bsd = read("LICENSE-BSD-3-Clause");
    for clause in [
        "Redistributions of source code must retain",
        "Neither the name of the copyright holder",
        "THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS",
    ] {
        assert!(
            bsd.contains(clause) && copyright.contains(clause),
            "{clause}"
        );
    }
    assert!(copyright.contains("/usr/share/common-licenses/Apache-2.0"));
    assert!(
        read("LICENSE-APACHE").contains("Apache License\n                           Version 2.0")
    );
    let manifest: toml::Value = toml::from_str(&read("Cargo.toml")).unwrap();
    assert_eq!(
        manifest["workspace"]["package"]["license"].as_str(),
        Some("Apache-2.0 OR BSD-3-Clause")
    );
}

/// The maintainer scripts: no systemctl but the guarded daemon-reload, nothing restarted or
/// stopped on upgrade, /etc/ceph-virtiofsd made only when missing, no debhelper token (cargo
/// deb does not expand it).
#[test]
fn maintainer_scripts_restart_nothing() {
    for script in ["packaging/deb/postinst", "packaging/deb/postrm"] {
        let text = read(script);
        assert!(!text.contains("#DEBHELPER#"), "{script}");
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            if line.contains("systemctl") {
                assert!(
                    line.contains("systemctl --system daemon-reload"),
                    "{script}: {line}"
                );
            }
            for verb in [
                "restart",
                "try-restart",
                "stop",
                "reload-or-restart",
                "invoke-rc.d",
            ] {
                assert!(
                    !line.split_whitespace().any(|w| w == verb),
                    "{script}: {line}"
                );
            }
        }
    }
    let postinst = read("packaging/deb/postinst");
    assert!(postinst.contains("if [ ! -d /etc/ceph-virtiofsd ]"));
    assert!(postinst.contains("never restarted"));
}

/// Section names of an ELF file (`readelf -SW`).
fn elf_sections(path: &Path) -> Vec<String> {
    let out = run(Command::new("readelf").arg("-SW").arg(path));
    assert!(out.status.success(), "readelf: {}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix('[')?.split_once(']')?.1;
            Some(rest.split_whitespace().next()?.to_owned())
        })
        .collect()
}

/// The GNU build id of an ELF file, in hex (`readelf -n`).
fn build_id(path: &Path) -> String {
    let out = run(Command::new("readelf").arg("-n").arg(path));
    assert!(out.status.success(), "readelf: {}", text(&out.stderr));
    let notes = text(&out.stdout);
    notes
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Build ID:")
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("{} has no build id:\n{notes}", path.display()))
}
