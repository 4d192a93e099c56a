//! virtiofsd's command-line compatibility: the legacy `-o` options we take, and the virtiofsd
//! flags that have no meaning here and are ignored with a warning. `--migration-mode`,
//! `--migration-verify-handles`, `--migration-confirm-paths`, `--no-announce-submounts` and
//! `--security-label=never` and `--allow-mmap` are accepted silently: they ask for what
//! ceph-virtiofsd does anyway (`--posix-acl` has its meaning: `super::posix_acl_config`).

use super::ConfigError;
use crate::args::{self as cli, Args};

/// Values taken from legacy `-o` options.
#[derive(Default)]
pub(super) struct Legacy {
    pub cache: Option<cli::CacheMode>,
    pub xattr: Option<bool>,
    pub thread_pool_size: Option<usize>,
}

pub(super) fn parse_legacy(
    opts: &[String],
    warnings: &mut Vec<String>,
) -> Result<Legacy, ConfigError> {
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
                    "none" | "never" => cli::CacheMode::Never,
                    "auto" => cli::CacheMode::Auto,
                    "always" => cli::CacheMode::Always,
                    "metadata" => cli::CacheMode::Metadata,
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

pub(super) fn ignored_option_warnings(args: &Args, warnings: &mut Vec<String>) {
    let asks = |s: Option<cli::Support>| s.is_some_and(|s| s != cli::Support::Never);
    let flags: [(&str, bool); 12] = [
        ("--sandbox", args.sandbox.is_some()),
        ("--announce-submounts", args.announce_submounts),
        ("--inode-file-handles", args.inode_file_handles.is_some()),
        ("--allow-direct-io", args.allow_direct_io),
        ("--killpriv-v2", args.killpriv_v2),
        ("--no-killpriv-v2", args.no_killpriv_v2),
        ("--security-label", asks(args.security_label)),
        ("--writeback", args.writeback),
        ("--no-readdirplus", args.no_readdirplus),
        ("--preserve-noatime", args.preserve_noatime),
        ("--rlimit-nofile", args.rlimit_nofile.is_some()),
        ("--modcaps", args.modcaps.is_some()),
    ];
    let more = [
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
