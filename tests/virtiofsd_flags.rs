//! Drop-in for virtiofsd: every option of the installed virtiofsd (1.14, the peer the lab
//! builds into /opt/virtiofsd) is read from its own `--help` and given, with each valid value
//! (or a sample one), to ceph-virtiofsd. None may be refused (exit 2) but those on
//! [`DENIED`], which must be refused with a message pointing at what to use instead.
//!
//! To tell "accepted" from "refused" without a cluster, the daemon gets a ceph.conf that does
//! not exist: a command line it accepts goes on to mount CephFS and stops there with exit 3
//! ("Cannot connect to the Ceph cluster"); a refused one stops with exit 2 before. So each
//! accepted form must end with exit 3 (0 for --help, --version and --print-capabilities).
//!
//! KubeVirt's fixed argument set (its virtiofs container runs `virtiofsd --socket-path=…
//! --shared-dir=… --sandbox=none --cache=auto --migration-on-error=guest-error
//! --migration-mode=find-paths [--migration-verify-handles]`) goes through the compat wrapper,
//! with the shared directory holding ceph-virtiofsd.toml.
//!
//! `VIRTIOFSD` names the peer if it is not /opt/virtiofsd/bin/virtiofsd (tests/lab/setup
//! builds it there: `cargo install --locked virtiofsd --version 1.14.0 --root /opt/virtiofsd`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The daemon under test: `CEPH_VIRTIOFSD_DAEMON` if set (as tests/common's), else the one
/// cargo built with this test.
fn daemon() -> PathBuf {
    std::env::var_os("CEPH_VIRTIOFSD_DAEMON").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_ceph-virtiofsd")),
        PathBuf::from,
    )
}

/// virtiofsd options ceph-virtiofsd refuses (exit 2), and a word the refusal must contain.
/// README "Running it" and `ceph-virtiofsd --help` document them.
const DENIED: &[(&str, &str)] = &[
    // There is no host directory: the export is a CephFS path.
    ("--shared-dir", "--ceph-root"),
    // A user namespace for an unprivileged host-directory share: use the id translation.
    ("--uid-map", "--translate-uid"),
    ("--gid-map", "--translate-uid"),
];

/// Values for virtiofsd options that take a free-form one (the others list their choices in
/// their help). A new option of the peer that takes a value fails the test until it is here.
fn sample_value(long: &str, scratch: &Path) -> Option<String> {
    let v = match long {
        "--shared-dir" => scratch.to_str()?.to_owned(),
        "--tag" => "cephfs".to_owned(),
        "--socket" | "--socket-path" => scratch.join("vfs.sock").to_str()?.to_owned(),
        "--socket-group" => "root".to_owned(),
        "--fd" => "3".to_owned(),
        "--thread-pool-size" => "4".to_owned(),
        "--xattrmap" => ":map::user.virtiofs.:".to_owned(),
        "--modcaps" => "+sys_admin:-chown".to_owned(),
        "--rlimit-nofile" => "4096".to_owned(),
        "-o" => "cache=auto,xattr".to_owned(),
        "--uid-map" | "--gid-map" => ":0:100000:65536:".to_owned(),
        "--translate-uid" | "--translate-gid" => "map:1000:101000:1000".to_owned(),
        _ => return None,
    };
    Some(v)
}

/// One option of virtiofsd's `--help`.
#[derive(Debug, Clone)]
struct PeerOption {
    /// `--name` or `-x` (the long form when there is one).
    name: String,
    /// `<X>`: a value must follow.
    takes_value: bool,
    /// `=<X>` or `[=<X>]`: the value is attached with `=`.
    equals: bool,
    /// `[=<X>]`: the value may be left out.
    optional: bool,
    /// The values its help lists (`<a|b>`, "(a, b, c)" or "- a:" items); empty if free-form.
    choices: Vec<String>,
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn peer() -> PathBuf {
    let p = std::env::var_os("VIRTIOFSD").map_or_else(
        || PathBuf::from("/opt/virtiofsd/bin/virtiofsd"),
        PathBuf::from,
    );
    assert!(
        p.is_file(),
        "{} is missing: tests/lab/setup builds virtiofsd 1.14 there (`cargo install --locked \
         virtiofsd --version 1.14.0 --root /opt/virtiofsd`, needs libseccomp-dev \
         libcap-ng-dev pkg-config), or point VIRTIOFSD at one",
        p.display()
    );
    p
}

/// The choices a help paragraph lists: "(a, b, c)" on its first line, or "- a:" items.
fn listed_choices(paragraph: &[&str]) -> Vec<String> {
    let word = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase() || c == '-');
    let items: Vec<String> = paragraph
        .iter()
        .filter_map(|l| l.trim().strip_prefix("- ")?.split_once(':'))
        .map(|(w, _)| w.trim().to_owned())
        .filter(|w| word(w))
        .collect();
    if !items.is_empty() {
        return items;
    }
    let first = paragraph.first().copied().unwrap_or("");
    if let Some((_, rest)) = first.rsplit_once('(') {
        if let Some((inside, _)) = rest.split_once(')') {
            let list: Vec<String> = inside.split(", ").map(|w| w.trim().to_owned()).collect();
            if list.len() > 1 && list.iter().all(|w| word(w)) {
                return list;
            }
        }
    }
    Vec::new()
}

/// The options of the peer's `--help` (clap's long help: one option per line starting with
/// spaces and a dash, its description indented below).
fn peer_options(help: &str) -> Vec<PeerOption> {
    let lines: Vec<&str> = help.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        // An option line: "-x", "--name"; not a description's "- item:" bullet.
        let is_option =
            t.starts_with("--") || t.as_bytes().get(1).is_some_and(u8::is_ascii_alphabetic);
        if !t.starts_with('-') || !is_option || line.len() - t.len() < 2 {
            continue;
        }
        // "-h, --help", "--cache <CACHE>", "--posix-acl[=<never|auto|always>]", "-o <X>".
        let head = t.split_whitespace().collect::<Vec<_>>();
        let flag = head
            .iter()
            .find(|w| w.starts_with("--"))
            .or_else(|| head.first())
            .map(|w| w.trim_end_matches(','))
            .unwrap_or_default();
        let (name, attached) = match flag.find(['[', '=']) {
            Some(at) => (&flag[..at], &flag[at..]),
            None => (flag, ""),
        };
        let spec = if attached.is_empty() {
            head.iter()
                .skip_while(|w| !w.starts_with(name))
                .nth(1)
                .copied()
                .unwrap_or("")
        } else {
            attached
        };
        let paragraph: Vec<&str> = lines[i + 1..]
            .iter()
            .copied()
            .skip_while(|l| l.trim().is_empty())
            .take_while(|l| !l.trim_start().starts_with('-') || l.trim_start().starts_with("- "))
            .filter(|l| !l.trim().is_empty())
            .collect();
        let inline: Vec<String> = spec
            .trim_start_matches(['[', '='])
            .trim_end_matches(']')
            .trim_start_matches('<')
            .trim_end_matches('>')
            .split('|')
            .map(str::to_owned)
            .collect();
        let choices = if inline.len() > 1 {
            inline
        } else {
            listed_choices(&paragraph)
        };
        out.push(PeerOption {
            name: name.to_owned(),
            takes_value: spec.contains('<'),
            equals: spec.starts_with('=') || spec.starts_with("[="),
            optional: spec.starts_with('['),
            choices,
        });
    }
    out
}

/// Every form of `opt` to try: each choice, the bare flag where the value is optional, or
/// the sample value.
fn forms(opt: &PeerOption, scratch: &Path) -> Vec<Vec<String>> {
    let with = |v: &str| {
        if opt.equals {
            vec![format!("{}={v}", opt.name)]
        } else {
            vec![opt.name.clone(), v.to_owned()]
        }
    };
    if !opt.takes_value {
        return vec![vec![opt.name.clone()]];
    }
    let mut out = Vec::new();
    if opt.optional {
        out.push(vec![opt.name.clone()]);
    }
    if opt.choices.is_empty() {
        let v = sample_value(&opt.name, scratch).unwrap_or_else(|| {
            panic!(
                "virtiofsd's {} takes a value its help does not enumerate: add a sample to \
                 sample_value() in tests/virtiofsd_flags.rs",
                opt.name
            )
        });
        out.push(with(&v));
    } else {
        for c in &opt.choices {
            out.push(with(c));
        }
    }
    out
}

/// ceph-virtiofsd with `form`, on a ceph.conf that does not exist (see the module doc).
fn ours(form: &[String], scratch: &Path) -> Output {
    let mut cmd = Command::new(daemon());
    cmd.args([
        "--client-id",
        "t",
        "--ceph-root",
        "/t",
        "--mount-timeout",
        "1",
    ])
    .arg("--ceph-conf")
    .arg(scratch.join("no-such-ceph.conf"));
    let socket_given = form.iter().any(|a| {
        a.starts_with("--socket") && !a.starts_with("--socket-group") || a.starts_with("--fd")
    });
    if !socket_given {
        cmd.arg("--socket-path").arg(scratch.join("ours.sock"));
    }
    cmd.args(form).env_remove("RUST_LOG");
    cmd.output()
        .unwrap_or_else(|e| panic!("run {}: {e}", daemon().display()))
}

fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("virtiofsd-flags")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn every_virtiofsd_option_is_accepted_or_documented_as_refused() {
    let out = Command::new(peer()).arg("--help").output().unwrap();
    assert!(
        out.status.success(),
        "virtiofsd --help: {}",
        text(&out.stderr)
    );
    let help = text(&out.stdout);
    let version = Command::new(peer()).arg("--version").output().unwrap();
    println!("peer: {}", text(&version.stdout).trim());
    let options = peer_options(&help);
    let names: Vec<&str> = options.iter().map(|o| o.name.as_str()).collect();
    // The parse found the options (a changed help layout must not pass by finding none).
    for must in [
        "--shared-dir",
        "--socket-path",
        "--cache",
        "--readonly",
        "--migration-mode",
    ] {
        assert!(
            names.contains(&must),
            "{must} not found in virtiofsd --help: {names:?}"
        );
    }
    assert!(
        options.len() >= 40,
        "only {} options parsed: {names:?}",
        options.len()
    );

    let dir = scratch("each");
    let mut refused = BTreeMap::new();
    let mut tried = 0;
    for opt in &options {
        for form in forms(opt, &dir) {
            tried += 1;
            let out = ours(&form, &dir);
            let code = out.status.code();
            let err = text(&out.stderr);
            let want = match opt.name.as_str() {
                "-h" | "--help" | "-V" | "--version" | "--print-capabilities" => Some(0),
                _ => Some(3),
            };
            if let Some((_, hint)) = DENIED.iter().find(|(n, _)| *n == opt.name) {
                assert_eq!(code, Some(2), "{form:?} must be refused: {err}");
                assert!(
                    err.contains(hint),
                    "{form:?}: the refusal must name {hint}: {err}"
                );
                continue;
            }
            if code != want {
                refused.insert(form.join(" "), format!("exit {code:?}: {}", err.trim()));
            } else if want == Some(3) && !form.iter().any(|a| a == "off" || a == "--syslog") {
                // (--log-level off and --syslog leave stderr empty)
                assert!(
                    err.contains("Cannot connect to the Ceph cluster"),
                    "{form:?}: exit 3 for another reason: {err}"
                );
            }
        }
    }
    println!(
        "{tried} forms of {} virtiofsd options tried: {names:?}",
        options.len()
    );
    assert!(
        refused.is_empty(),
        "virtiofsd options ceph-virtiofsd does not take as a drop-in:\n{refused:#?}"
    );
}

#[test]
fn kubevirt_argument_set_through_the_compat_wrapper() {
    let dir = scratch("kubevirt");
    let share = dir.join("share");
    std::fs::create_dir(&share).unwrap();
    std::fs::write(
        share.join("ceph-virtiofsd.toml"),
        format!(
            "[ceph]\nconf = \"{}\"\nclient-id = \"kubevirt\"\nroot = \"/volumes/_nogroup/pvc\"\n\
             mount-timeout = 1\n",
            dir.join("no-such-ceph.conf").display()
        ),
    )
    .unwrap();
    let socket = format!("--socket-path={}", dir.join("kv.sock").display());
    let shared = format!("--shared-dir={}", share.display());
    let compat =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/compat/ceph-virtiofsd-compat");
    for extra in [&[][..], &["--migration-verify-handles"][..]] {
        let out = Command::new(&compat)
            .env("CEPH_VIRTIOFSD", daemon())
            .args([
                socket.as_str(),
                shared.as_str(),
                "--sandbox=none",
                "--cache=auto",
                "--migration-on-error=guest-error",
                "--migration-mode=find-paths",
            ])
            .args(extra)
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(3),
            "KubeVirt's arguments {extra:?}: {err}"
        );
        assert!(err.contains("Cannot connect to the Ceph cluster"), "{err}");
        // Only --sandbox draws a warning; the migration options are what ceph-virtiofsd does.
        assert!(err.contains("Ignoring --sandbox"), "{err}");
        assert!(!err.contains("migration"), "{err}");
    }
}
