//! The validated daemon configuration.
//!
//! [`Config`] is built from the command line ([`Args`]) merged over an optional TOML file
//! (`--config FILE`): a value given on the command line wins over the file, the file wins over
//! the built-in default. Only `Config` travels past `main`.

use std::collections::BTreeMap;
use std::os::unix::io::RawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::args::{Args, CacheMode, LogLevel};

/// Longest mount tag the virtio-fs config space can carry (`struct virtio_fs_config.tag`).
pub const MAX_TAG_LEN: usize = 36;
/// Most request queues we offer (one vhost-user worker thread per queue, 64-bit queue masks).
pub const MAX_REQUEST_QUEUES: u16 = 63;
/// Default number of FUSE worker threads.
pub const DEFAULT_THREAD_POOL_SIZE: usize = 4;
/// Default connect/mount timeout.
pub const DEFAULT_MOUNT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the vhost-user frontend connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// Create a listening socket at this path.
    SocketPath(PathBuf),
    /// Use an inherited listening socket.
    Fd(RawFd),
}

/// Logging settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    pub level: LogLevel,
    pub syslog: bool,
}

/// How to reach and mount CephFS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CephConfig {
    /// ceph.conf path; `None` = libcephfs's default search path.
    pub conf: Option<PathBuf>,
    /// Client id without "client." (`None` = libcephfs default, "admin").
    pub client_id: Option<String>,
    pub keyring: Option<PathBuf>,
    pub fs_name: Option<String>,
    /// Absolute path inside CephFS exported as the guest's root.
    pub root: String,
    /// Extra libcephfs options, applied in this order (keys are unique).
    pub options: Vec<(String, String)>,
    pub mount_timeout: Duration,
}

/// The validated configuration of one daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub listen: Listen,
    pub tag: Option<String>,
    pub thread_pool_size: usize,
    /// Request queues (the hiprio queue comes on top).
    pub queues: u16,
    pub keep_serving: bool,
    pub cache: CacheMode,
    pub xattr: bool,
    pub log: LogConfig,
    pub ceph: CephConfig,
    /// Warnings about ignored options, to be logged once logging is up.
    pub warnings: Vec<String>,
}

/// Why the configuration was refused. Each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("Cannot read configuration file {path}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Cannot parse configuration file {path}")]
    ParseFile {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("No vhost-user socket: give --socket-path PATH or --fd FD (or socket-path in the config file)")]
    NoSocket,
    #[error("Both a socket path and --fd were given: use only one")]
    SocketAndFd,
    #[error("--fd {0} is not a valid file descriptor number (use 3 or higher)")]
    BadFd(RawFd),
    #[error("--shared-dir/source= is not supported: ceph-virtiofsd exports CephFS, not a host directory; use --ceph-root PATH to pick the exported CephFS path")]
    SharedDir,
    #[error("Tag {0:?} is invalid: it must be 1 to 36 bytes long")]
    BadTag(String),
    #[error("--queues {0} is out of range: use 1 to 63")]
    BadQueues(u16),
    #[error("Ceph root {0:?} must be an absolute CephFS path such as / or /volumes/vm1")]
    BadCephRoot(String),
    #[error("Ceph option {0:?} must be KEY=VALUE with a non-empty KEY")]
    BadCephOpt(String),
    #[error("Mount timeout must be at least 1 second")]
    BadMountTimeout,
    #[error("Legacy option -o {0}: {1}")]
    BadLegacyOpt(String, String),
}

/// The TOML file layout. Every key is optional; see config/ceph-virtiofsd.toml.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    #[serde(default)]
    pub vhost_user: FileVhostUser,
    #[serde(default)]
    pub fuse: FileFuse,
    #[serde(default)]
    pub log: FileLog,
    #[serde(default)]
    pub ceph: FileCeph,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileVhostUser {
    pub socket_path: Option<PathBuf>,
    pub tag: Option<String>,
    pub thread_pool_size: Option<usize>,
    pub queues: Option<u16>,
    pub keep_serving: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileFuse {
    pub cache: Option<CacheMode>,
    pub xattr: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileLog {
    pub level: Option<LogLevel>,
    pub syslog: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileCeph {
    pub conf: Option<PathBuf>,
    pub client_id: Option<String>,
    pub keyring: Option<PathBuf>,
    pub fs_name: Option<String>,
    pub root: Option<String>,
    pub mount_timeout: Option<u64>,
    /// Extra libcephfs options.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

impl FileConfig {
    /// Parse a TOML configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::ParseFile {
            path: path.to_owned(),
            source: Box::new(source),
        })
    }
}

/// Values taken from legacy `-o` options.
#[derive(Default)]
struct Legacy {
    cache: Option<CacheMode>,
    xattr: Option<bool>,
    thread_pool_size: Option<usize>,
}

fn parse_legacy(opts: &[String], warnings: &mut Vec<String>) -> Result<Legacy, ConfigError> {
    let mut legacy = Legacy::default();
    for opt in opts
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|o| !o.is_empty())
    {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        match (key, value) {
            ("source", _) => return Err(ConfigError::SharedDir),
            ("cache", Some(v)) => {
                let mode = match v {
                    "none" | "never" => CacheMode::Never,
                    "auto" => CacheMode::Auto,
                    "always" => CacheMode::Always,
                    "metadata" => CacheMode::Metadata,
                    _ => {
                        return Err(ConfigError::BadLegacyOpt(
                            opt.to_owned(),
                            "use cache=never|auto|always|metadata".to_owned(),
                        ))
                    }
                };
                legacy.cache = Some(mode);
            }
            ("xattr", None) => legacy.xattr = Some(true),
            ("no_xattr", None) => legacy.xattr = Some(false),
            ("thread_pool_size", Some(v)) => {
                let n = v.parse().map_err(|_| {
                    ConfigError::BadLegacyOpt(opt.to_owned(), "expected a number".to_owned())
                })?;
                legacy.thread_pool_size = Some(n);
            }
            _ => warnings.push(format!(
                "Ignoring legacy option -o {opt}: not used by ceph-virtiofsd"
            )),
        }
    }
    Ok(legacy)
}

fn ignored_option_warnings(args: &Args, warnings: &mut Vec<String>) {
    let flags: [(&str, bool); 15] = [
        ("--sandbox", args.sandbox.is_some()),
        ("--seccomp", args.seccomp.is_some()),
        ("--announce-submounts", args.announce_submounts),
        ("--inode-file-handles", args.inode_file_handles.is_some()),
        ("--allow-direct-io", args.allow_direct_io),
        ("--killpriv-v2", args.killpriv_v2),
        ("--no-killpriv-v2", args.no_killpriv_v2),
        ("--posix-acl", args.posix_acl),
        ("--security-label", args.security_label),
        ("--writeback", args.writeback),
        ("--no-readdirplus", args.no_readdirplus),
        ("--preserve-noatime", args.preserve_noatime),
        ("--allow-mmap", args.allow_mmap),
        ("--socket-group", args.socket_group.is_some()),
        ("--rlimit-nofile", args.rlimit_nofile.is_some()),
    ];
    let more = [
        ("--modcaps", args.modcaps.is_some()),
        ("--xattrmap", args.xattrmap.is_some()),
        ("-f", args.foreground),
    ];
    for (name, given) in flags.iter().chain(more.iter()) {
        if *given {
            warnings.push(format!(
                "Ignoring {name}: a virtiofsd option that has no meaning for ceph-virtiofsd"
            ));
        }
    }
}

fn parse_ceph_opt(opt: &str) -> Result<(String, String), ConfigError> {
    match opt.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(ConfigError::BadCephOpt(opt.to_owned())),
    }
}

fn validate_tag(tag: String) -> Result<String, ConfigError> {
    if tag.is_empty() || tag.len() > MAX_TAG_LEN {
        return Err(ConfigError::BadTag(tag));
    }
    Ok(tag)
}

impl TryFrom<Args> for Config {
    type Error = ConfigError;

    fn try_from(args: Args) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        Config::merge(args, file)
    }
}

impl Config {
    /// Merge command-line values over file values over defaults, and validate the result.
    pub fn merge(args: Args, file: FileConfig) -> Result<Self, ConfigError> {
        if args.shared_dir.is_some() {
            return Err(ConfigError::SharedDir);
        }
        let mut warnings = Vec::new();
        ignored_option_warnings(&args, &mut warnings);
        let legacy = parse_legacy(&args.legacy_opts, &mut warnings)?;

        let listen = match (args.socket_path, args.fd) {
            (Some(_), Some(_)) => return Err(ConfigError::SocketAndFd),
            (Some(path), None) => Listen::SocketPath(path),
            (None, Some(fd)) if fd < 3 => return Err(ConfigError::BadFd(fd)),
            (None, Some(fd)) => Listen::Fd(fd),
            (None, None) => match file.vhost_user.socket_path {
                Some(path) => Listen::SocketPath(path),
                None => return Err(ConfigError::NoSocket),
            },
        };

        let tag = args
            .tag
            .or(file.vhost_user.tag)
            .map(validate_tag)
            .transpose()?;

        let queues = args.queues.or(file.vhost_user.queues).unwrap_or(1);
        if queues == 0 || queues > MAX_REQUEST_QUEUES {
            return Err(ConfigError::BadQueues(queues));
        }

        let thread_pool_size = args
            .thread_pool_size
            .or(legacy.thread_pool_size)
            .or(file.vhost_user.thread_pool_size)
            .unwrap_or(DEFAULT_THREAD_POOL_SIZE);

        let cli_xattr = if args.no_xattr {
            Some(false)
        } else if args.xattr {
            Some(true)
        } else {
            legacy.xattr
        };
        let xattr = cli_xattr.or(file.fuse.xattr).unwrap_or(true);
        let cache = args
            .cache
            .or(legacy.cache)
            .or(file.fuse.cache)
            .unwrap_or(CacheMode::Auto);

        let cli_level = args.log_level.or(args.debug.then_some(LogLevel::Debug));
        let log = LogConfig {
            level: cli_level.or(file.log.level).unwrap_or(LogLevel::Info),
            syslog: args.syslog || file.log.syslog.unwrap_or(false),
        };

        let root = args
            .ceph_root
            .or(file.ceph.root)
            .unwrap_or_else(|| "/".to_owned());
        if !root.starts_with('/') || root.split('/').any(|c| c == "..") {
            return Err(ConfigError::BadCephRoot(root));
        }

        // File options first (sorted by key), then command-line options replacing same keys.
        let mut options: Vec<(String, String)> = file.ceph.options.into_iter().collect();
        for opt in &args.ceph_opt {
            let (key, value) = parse_ceph_opt(opt)?;
            options.retain(|(k, _)| *k != key);
            options.push((key, value));
        }

        let secs = args
            .mount_timeout
            .or(file.ceph.mount_timeout)
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_MOUNT_TIMEOUT);
        if secs.is_zero() {
            return Err(ConfigError::BadMountTimeout);
        }

        Ok(Config {
            listen,
            tag,
            thread_pool_size,
            queues,
            keep_serving: args.keep_serving || file.vhost_user.keep_serving.unwrap_or(false),
            cache,
            xattr,
            log,
            ceph: CephConfig {
                conf: args.ceph_conf.or(file.ceph.conf),
                client_id: args.client_id.or(file.ceph.client_id),
                keyring: args.keyring.or(file.ceph.keyring),
                fs_name: args.fs_name.or(file.ceph.fs_name),
                root,
                options,
                mount_timeout: secs,
            },
            warnings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(cli: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec!["ceph-virtiofsd"];
        argv.extend_from_slice(cli);
        let args = Args::try_parse_from(argv).unwrap_or_else(|e| panic!("clap: {e}"));
        Config::try_from(args)
    }

    #[test]
    fn defaults() {
        let c = parse(&["--socket-path", "/tmp/s"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.listen, Listen::SocketPath("/tmp/s".into()));
        assert_eq!(c.queues, 1);
        assert_eq!(c.thread_pool_size, DEFAULT_THREAD_POOL_SIZE);
        assert_eq!(c.cache, CacheMode::Auto);
        assert!(c.xattr);
        assert_eq!(c.ceph.root, "/");
        assert_eq!(c.ceph.mount_timeout, DEFAULT_MOUNT_TIMEOUT);
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(parse(&[]), Err(ConfigError::NoSocket)));
        assert!(matches!(parse(&["--fd", "1"]), Err(ConfigError::BadFd(1))));
        assert!(matches!(
            parse(&["--fd", "3", "--shared-dir", "/srv"]),
            Err(ConfigError::SharedDir)
        ));
        assert!(matches!(
            parse(&["--fd", "3", "-o", "source=/srv,cache=auto"]),
            Err(ConfigError::SharedDir)
        ));
        assert!(matches!(
            parse(&["--fd", "3", "--tag", &"x".repeat(37)]),
            Err(ConfigError::BadTag(_))
        ));
        assert!(matches!(
            parse(&["--fd", "3", "--queues", "0"]),
            Err(ConfigError::BadQueues(0))
        ));
        assert!(matches!(
            parse(&["--fd", "3", "--ceph-root", "volumes"]),
            Err(ConfigError::BadCephRoot(_))
        ));
        assert!(matches!(
            parse(&["--fd", "3", "--ceph-opt", "novalue"]),
            Err(ConfigError::BadCephOpt(_))
        ));
        assert!(matches!(
            parse(&["--fd", "3", "--mount-timeout", "0"]),
            Err(ConfigError::BadMountTimeout)
        ));
    }

    #[test]
    fn virtiofsd_compat_options() {
        let c = parse(&[
            "--fd=3",
            "--sandbox",
            "none",
            "--seccomp=none",
            "--announce-submounts",
            "--inode-file-handles",
            "-f",
            "-o",
            "cache=always,no_xattr,thread_pool_size=2,no_posix_lock",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.listen, Listen::Fd(3));
        assert_eq!(c.cache, CacheMode::Always);
        assert!(!c.xattr);
        assert_eq!(c.thread_pool_size, 2);
        // sandbox, seccomp, announce-submounts, inode-file-handles, -f, no_posix_lock
        assert_eq!(c.warnings.len(), 6, "{:?}", c.warnings);
    }

    #[test]
    fn cli_overrides_file() {
        let file: FileConfig = toml::from_str(
            r#"
            [vhost-user]
            socket-path = "/run/file.sock"
            thread-pool-size = 8
            queues = 2
            [fuse]
            cache = "never"
            xattr = false
            [ceph]
            root = "/from-file"
            client-id = "file"
            [ceph.options]
            client_cache_size = "100"
            client_oc = "false"
            "#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let args = Args::try_parse_from([
            "x",
            "--socket-path",
            "/run/cli.sock",
            "--cache",
            "always",
            "--xattr",
            "--ceph-opt",
            "client_oc=true",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let c = Config::merge(args, file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.listen, Listen::SocketPath("/run/cli.sock".into()));
        assert_eq!(c.cache, CacheMode::Always);
        assert!(c.xattr);
        assert_eq!(c.thread_pool_size, 8);
        assert_eq!(c.queues, 2);
        assert_eq!(c.ceph.root, "/from-file");
        assert_eq!(c.ceph.client_id.as_deref(), Some("file"));
        assert_eq!(
            c.ceph.options,
            vec![
                ("client_cache_size".to_owned(), "100".to_owned()),
                ("client_oc".to_owned(), "true".to_owned())
            ]
        );
    }

    #[test]
    fn unknown_file_key_is_an_error() {
        let r: Result<FileConfig, _> = toml::from_str("[fuse]\ncahce = \"auto\"\n");
        assert!(r.is_err());
    }
}
