//! The shipped example configuration must parse, and the command line must override it.

use std::path::PathBuf;

use ceph_virtiofsd::args::Args;
use ceph_virtiofsd::config::{Config, Listen};
use ceph_virtiofsd::fs::CacheMode;
use ceph_virtiofsd::logging::LogLevel;
use clap::Parser;

fn example() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("config/ceph-virtiofsd.toml")
        .display()
        .to_string()
}

fn config(extra: &[&str]) -> Config {
    let path = example();
    let mut argv = vec!["ceph-virtiofsd", "--config", path.as_str()];
    argv.extend_from_slice(extra);
    let args = Args::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
    Config::try_from(args).unwrap_or_else(|e| panic!("{}", ceph_virtiofsd::report(&e)))
}

#[test]
fn example_config_parses() {
    let c = config(&[]);
    assert_eq!(
        c.listen,
        Listen::SocketPath("/run/ceph-virtiofsd/vm1.sock".into())
    );
    assert_eq!(c.tag.as_deref(), Some("cephfs"));
    assert_eq!(c.thread_pool_size, 64);
    assert_eq!(c.queues, 1);
    assert!(!c.keep_serving);
    assert_eq!(c.cache, CacheMode::Auto);
    assert!(c.xattr);
    assert_eq!(c.log.level, LogLevel::Info);
    assert!(!c.log.syslog);
    assert_eq!(c.log.slow_request.as_secs(), 30);
    assert_eq!(c.ceph.access.client_id.as_deref(), Some("vm1"));
    assert_eq!(c.ceph.access.fs_name.as_deref(), Some("cephfs"));
    assert_eq!(c.ceph.root, "/volumes/_nogroup/vm1");
    assert_eq!(c.ceph.access.mount_timeout.as_secs(), 30);
    assert_eq!(
        c.ceph.access.options,
        [
            ("client_cache_size", "8192"),
            ("client_oc_size", "33554432"),
            ("client_oc_max_dirty", "16777216"),
            ("client_oc_target_dirty", "8388608"),
            ("client_readahead_max_bytes", "8388608"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
    );
    assert_eq!(c.guest.held_inodes, 4096);
    assert!(!c.readonly);
    assert_eq!(c.socket_group, None, "commented out");
    assert_eq!(c.ceph.access.name, None, "commented out");
    assert!(c.warnings.is_empty());
}

#[test]
fn command_line_overrides_example_config() {
    let c = config(&[
        "--fd",
        "3",
        "--cache",
        "never",
        "--no-xattr",
        "--thread-pool-size",
        "0",
        "--ceph-root",
        "/other",
        "--ceph-opt",
        "client_cache_size=1",
        "--log-level",
        "debug",
        "--keep-serving",
        "--slow-request-secs",
        "0",
    ]);
    // --fd replaces the file's socket-path.
    assert_eq!(c.listen, Listen::Fd(3));
    assert_eq!(c.cache, CacheMode::Never);
    assert!(!c.xattr);
    assert_eq!(c.thread_pool_size, 0);
    assert_eq!(c.ceph.root, "/other");
    // --ceph-opt wins over --inode-cache's default and comes last.
    assert_eq!(
        c.ceph.access.options.last(),
        Some(&("client_cache_size".to_owned(), "1".to_owned()))
    );
    assert_eq!(
        c.ceph
            .access
            .options
            .iter()
            .filter(|(k, _)| k == "client_cache_size")
            .count(),
        1
    );
    assert_eq!(c.log.level, LogLevel::Debug);
    assert!(c.keep_serving);
    assert!(c.log.slow_request.is_zero());
    // Untouched values still come from the file.
    assert_eq!(c.ceph.access.client_id.as_deref(), Some("vm1"));
}

/// Every option of `--help` (but those that make no sense in a file) is documented in the
/// example configuration, so a new option cannot be left out of it.
#[test]
fn example_config_documents_every_option() {
    use clap::CommandFactory;
    let text = std::fs::read_to_string(example()).unwrap();
    let not_in_a_file = ["config", "print-capabilities", "help", "version"];
    let missing: Vec<String> = Args::command()
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_hide_short_help_set())
        .filter_map(|a| a.get_long())
        .filter(|name| !not_in_a_file.contains(name))
        .map(|name| format!("--{name}"))
        .filter(|flag| !text.contains(flag.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "config/ceph-virtiofsd.toml does not mention {missing:?}"
    );
}

/// The daemon binary refuses to start with no Ceph client id or no export root (exit 2, usage
/// or configuration error), and says what to add; naming client.admin and "/" is enough. On
/// main it started with client.admin and CephFS "/".
#[test]
fn the_daemon_names_no_identity_or_root_by_itself() {
    use std::process::Command;
    let daemon = env!("CARGO_BIN_EXE_ceph-virtiofsd");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("config-identity");
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let sock = sock.to_str().unwrap();
    let missing = dir.join("no-such-ceph.conf");
    let conf = missing.to_str().unwrap();
    for (extra, what) in [
        (&[][..], "--client-id ID --ceph-root PATH"),
        (
            &["--ceph-root", "/volumes/_nogroup/vm1"][..],
            "--client-id ID",
        ),
        (&["--client-id", "vm1"][..], "--ceph-root PATH"),
    ] {
        let out = Command::new(daemon)
            .args(["--socket-path", sock, "--ceph-conf", conf])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(
            err.contains(what) && err.contains("--client-id admin --ceph-root /"),
            "{err}"
        );
    }
    // Named, the start goes on to the cluster (here: no ceph.conf, exit 3).
    let out = Command::new(daemon)
        .args(["--socket-path", sock, "--ceph-conf", conf])
        .args([
            "--client-id",
            "admin",
            "--ceph-root",
            "/",
            "--mount-timeout",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
