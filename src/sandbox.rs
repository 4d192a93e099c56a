//! Least privilege: after the daemon has read its configuration, mounted CephFS (libcephfs reads
//! the keyring at mount time) and opened its vhost-user socket, it needs no host filesystem
//! access and no capability. [`enter`] then, in this order:
//!
//! 1. empties the capability bounding set (while we still hold CAP_SETPCAP),
//! 2. with `--user`: sets the supplementary groups to the target group, then gid, then uid
//!    (real, effective and saved). glibc applies set*id calls to every thread of the process,
//!    libcephfs's threads included, and the kernel clears the permitted and effective
//!    capabilities of a thread whose uids all leave 0;
//! 3. clears the ambient and the calling thread's capability sets (threads started later, such
//!    as the vhost-user workers, inherit the empty sets);
//! 4. sets no_new_privs;
//! 5. installs the seccomp allow-list on every thread at once (SECCOMP_FILTER_FLAG_TSYNC).
//!
//! The bounding set is per thread too: [`drop_bounding_set_early`] empties it at the start of
//! `main`, before libcephfs starts any thread, so that every thread inherits the empty set.
//!
//! Started as root without `--user`, the daemon switches to [`PACKAGE_USER`] when that user
//! exists (the Debian package creates it): [`package_account`]. Only `--user root` keeps uid 0,
//! and then the threads libcephfs started before step 3 keep their capabilities (capabilities
//! are per thread).
//!
//! The syscall list is what the daemon, the rust-vmm crates and libcephfs (messenger, timers,
//! logging) were seen to use (`strace -f -c` of the daemon serving a guest running the fs-suite),
//! plus the calls of their error, reconnect and shutdown paths.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// An unprivileged account to switch to, resolved when the configuration is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// As given by the operator (for messages).
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// What the seccomp filter does with a syscall outside its allow-list (`--seccomp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeccompMode {
    /// No filter.
    None,
    /// Allow it, and have the kernel log it.
    Log,
    /// Kill the daemon (the default).
    Kill,
    /// Send the thread SIGSYS (virtiofsd's `trap`): unhandled, it ends the daemon with a core
    /// dump that names the call.
    Trap,
}

/// The unprivileged user the Debian package creates (packaging/systemd/ceph-virtiofsd.sysusers):
/// a daemon started as root without `--user` switches to it when it exists.
pub const PACKAGE_USER: &str = "ceph-virtiofsd";

/// What [`enter`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Switch to this account (`--user`/`--group`); `None` keeps the current ids.
    pub user: Option<Account>,
    pub seccomp: SeccompMode,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            user: None,
            seccomp: SeccompMode::Kill,
        }
    }
}

/// Why the sandbox could not be set up. Each message names the step.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("User {0:?} does not exist: give an existing user name or numeric uid to --user")]
    NoSuchUser(String),
    #[error("Group {0:?} does not exist: give an existing group name or numeric gid")]
    NoSuchGroup(String),
    #[error("Numeric --user {0} has no passwd entry: give its group with --group")]
    NeedGroup(u32),
    #[error("--group needs --user")]
    GroupWithoutUser,
    #[error("Cannot look up user or group {0:?}")]
    Lookup(String, #[source] io::Error),
    #[error("--user {0} needs the daemon to start as root")]
    NotRoot(String),
    #[error("Cannot switch to user {0:?} ({1})")]
    SwitchUser(String, &'static str, #[source] io::Error),
    #[error("Cannot drop capabilities ({0})")]
    Caps(&'static str, #[source] io::Error),
    #[error("Cannot set no_new_privs")]
    NoNewPrivs(#[source] io::Error),
    #[error("Cannot build the seccomp filter: {0}")]
    Filter(String),
    #[error(
        "Cannot install the seccomp filter (use --seccomp none if the kernel lacks seccomp): {0}"
    )]
    Install(String),
}

/// Resolve `--user NAME|UID` and `--group NAME|GID` to ids (reads the passwd/group databases,
/// so call it before [`enter`]).
pub fn resolve_account(user: &str, group: Option<&str>) -> Result<Account, SandboxError> {
    let pw = lookup_user(user)?;
    let uid = match (&pw, user.parse::<u32>()) {
        (Some((uid, _)), _) => *uid,
        (None, Ok(uid)) => uid,
        (None, Err(_)) => return Err(SandboxError::NoSuchUser(user.to_owned())),
    };
    let gid = match group {
        Some(g) => match (lookup_group(g)?, g.parse::<u32>()) {
            (Some(gid), _) | (None, Ok(gid)) => gid,
            (None, Err(_)) => return Err(SandboxError::NoSuchGroup(g.to_owned())),
        },
        None => match pw {
            Some((_, gid)) => gid,
            None => return Err(SandboxError::NeedGroup(uid)),
        },
    };
    Ok(Account {
        name: user.to_owned(),
        uid,
        gid,
    })
}

/// The account a daemon runs as when no `--user` is given: [`PACKAGE_USER`] (and its primary
/// group) if this process runs as root and that user exists, else `None` (keep the starting
/// user). libvirt and Kata start their virtio-fs daemon as root; this keeps such a daemon off
/// uid 0 without any option.
pub fn package_account() -> Result<Option<Account>, SandboxError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    Ok(lookup_user(PACKAGE_USER)?.map(|(uid, gid)| Account {
        name: PACKAGE_USER.to_owned(),
        uid,
        gid,
    }))
}

/// Resolve a group name or number (`--socket-group`) to its gid.
pub fn resolve_group(group: &str) -> Result<u32, SandboxError> {
    match (lookup_group(group)?, group.parse::<u32>()) {
        (Some(gid), _) | (None, Ok(gid)) => Ok(gid),
        (None, Err(_)) => Err(SandboxError::NoSuchGroup(group.to_owned())),
    }
}

/// Empty this thread's capability bounding set, once, before any other thread exists: threads
/// inherit it, and a thread's bounding set only shrinks. Without CAP_SETPCAP (an unprivileged
/// start) there is nothing to drop and this does nothing. Called first thing in `main`.
pub fn drop_bounding_set_early() -> Result<(), SandboxError> {
    drop_bounding_set()
}

fn cstring(s: &str) -> Result<CString, SandboxError> {
    CString::new(s).map_err(|_| SandboxError::NoSuchUser(s.to_owned()))
}

/// (uid, primary gid) of a user name, `None` if there is no such user.
fn lookup_user(name: &str) -> Result<Option<(u32, u32)>, SandboxError> {
    let cname = cstring(name)?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: passwd is a plain C struct; all-zero is a valid value to be overwritten.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: `cname` is NUL-terminated; `pwd`, `buf` (with its true length) and `result` are
    // valid for writes and outlive the call; getpwnam_r writes strings only into `buf`.
    let rc = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 {
        return Err(SandboxError::Lookup(
            name.to_owned(),
            io::Error::from_raw_os_error(rc),
        ));
    }
    Ok((!result.is_null()).then_some((pwd.pw_uid, pwd.pw_gid)))
}

/// gid of a group name, `None` if there is no such group.
fn lookup_group(name: &str) -> Result<Option<u32>, SandboxError> {
    let cname = cstring(name)?;
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: group is a plain C struct; all-zero is a valid value to be overwritten.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: as for getpwnam_r above: NUL-terminated name, valid out pointers and buffer.
    let rc = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 {
        return Err(SandboxError::Lookup(
            name.to_owned(),
            io::Error::from_raw_os_error(rc),
        ));
    }
    Ok((!result.is_null()).then_some(grp.gr_gid))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Apply the whole sandbox (see the module documentation for the order and why).
pub fn enter(config: &SandboxConfig) -> Result<(), SandboxError> {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if let Some(acct) = &config.user {
        if euid != 0 {
            return Err(SandboxError::NotRoot(acct.name.clone()));
        }
    }
    drop_bounding_set()?;
    if let Some(acct) = &config.user {
        switch_user(acct)?;
    }
    drop_capabilities()?;
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) takes no pointers.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })
        .map_err(SandboxError::NoNewPrivs)?;
    install_seccomp(config.seccomp)?;
    match &config.user {
        Some(a) if a.uid == 0 => tracing::warn!(
            user = %a.name, seccomp = ?config.seccomp,
            "Running as root (--user {}): threads started before this point keep root's \
             capabilities; give an unprivileged --user to drop them everywhere",
            a.name
        ),
        Some(a) => tracing::info!(
            user = %a.name, uid = a.uid, gid = a.gid, seccomp = ?config.seccomp,
            "Dropped privileges"
        ),
        None if euid == 0 => tracing::warn!(
            seccomp = ?config.seccomp,
            "Running as root: no --user was given and user {PACKAGE_USER} does not exist; \
             threads started before this point keep root's capabilities: create that user or \
             give --user to drop them everywhere"
        ),
        None => tracing::info!(seccomp = ?config.seccomp, "Dropped capabilities (no --user)"),
    }
    Ok(())
}

fn drop_bounding_set() -> Result<(), SandboxError> {
    for cap in 0..64 {
        // SAFETY: PR_CAPBSET_READ takes an integer capability number, no pointers; an unknown
        // number makes it fail with EINVAL.
        let present = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) };
        if present < 0 {
            break; // past the kernel's last capability
        }
        if present == 0 {
            continue;
        }
        // SAFETY: PR_CAPBSET_DROP takes an integer capability number, no pointers.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            // Without CAP_SETPCAP (an unprivileged start) the set cannot shrink; the later
            // steps still empty this thread's own sets, and no_new_privs blocks regaining any.
            if err.raw_os_error() == Some(libc::EPERM) {
                return Ok(());
            }
            return Err(SandboxError::Caps("bounding set", err));
        }
    }
    Ok(())
}

fn switch_user(acct: &Account) -> Result<(), SandboxError> {
    let fail = |step| {
        let err = io::Error::last_os_error();
        SandboxError::SwitchUser(acct.name.clone(), step, err)
    };
    let groups = [acct.gid];
    // SAFETY: the pointer and length describe `groups`, which outlives the call.
    if unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } != 0 {
        return Err(fail("setgroups"));
    }
    // SAFETY: setresgid/setresuid take integers only.
    if unsafe { libc::setresgid(acct.gid, acct.gid, acct.gid) } != 0 {
        return Err(fail("setresgid"));
    }
    // SAFETY: as above.
    if unsafe { libc::setresuid(acct.uid, acct.uid, acct.uid) } != 0 {
        return Err(fail("setresuid"));
    }
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: the three pointers are to live locals.
    if unsafe { libc::getresuid(&mut r, &mut e, &mut s) } != 0 {
        return Err(fail("getresuid"));
    }
    if [r, e, s] != [acct.uid; 3] {
        return Err(SandboxError::SwitchUser(
            acct.name.clone(),
            "uid check",
            io::Error::from_raw_os_error(libc::EPERM),
        ));
    }
    Ok(())
}

/// The kernel's capability header/data layout (linux/capability.h), version 3.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn drop_capabilities() -> Result<(), SandboxError> {
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes no pointers.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    // EINVAL: a kernel without ambient capabilities (before 4.3), which has none to clear.
    if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
        return Err(SandboxError::Caps("ambient", io::Error::last_os_error()));
    }
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: capset reads one header and, for version 3, two data structs; both pointers are
    // to live, properly laid out (#[repr(C)]) values that outlive the call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    if rc != 0 {
        return Err(SandboxError::Caps("capset", io::Error::last_os_error()));
    }
    Ok(())
}

/// Install the allow-list on every thread (no-op for `SeccompMode::None`).
pub fn install_seccomp(mode: SeccompMode) -> Result<(), SandboxError> {
    let mismatch = match mode {
        SeccompMode::None => return Ok(()),
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Kill => SeccompAction::KillProcess,
        SeccompMode::Trap => SeccompAction::Trap,
    };
    let program = build_filter(mismatch)?;
    seccompiler::apply_filter_all_threads(&program)
        .map_err(|e| SandboxError::Install(e.to_string()))
}

/// The BPF program: allowed syscalls pass, any other gets `mismatch`.
pub fn build_filter(mismatch: SeccompAction) -> Result<BpfProgram, SandboxError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| SandboxError::Filter(e.to_string()))?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = allowed_syscalls()
        .iter()
        .map(|&nr| (nr, Vec::new()))
        .collect();
    // Calls allowed only with some values of one argument (any one of the listed values).
    for (nr, arg, values) in restricted_syscalls() {
        let mut alternatives = Vec::new();
        for &value in values {
            let cond = SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
                .and_then(|c| SeccompRule::new(vec![c]))
                .map_err(|e| SandboxError::Filter(e.to_string()))?;
            alternatives.push(cond);
        }
        rules.insert(nr, alternatives);
    }
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch)
        .map_err(|e| SandboxError::Filter(e.to_string()))?;
    BpfProgram::try_from(filter).map_err(|e| SandboxError::Filter(e.to_string()))
}

/// Syscalls allowed only for some values of one argument: (syscall, argument index, values).
/// ioctl: only the descriptor-flag and non-blocking requests (never terminal ioctls such as
/// TIOCSTI on an inherited tty); prctl: only thread names.
pub fn restricted_syscalls() -> Vec<(i64, u8, &'static [u64])> {
    // The request constants are c_ulong on glibc and c_int on musl: the casts are per libc, in
    // consts (no `From` there), of positive values that fit u64.
    #[allow(clippy::unnecessary_cast, clippy::as_conversions)]
    const IOCTLS: &[u64] = &[
        libc::FIONBIO as u64,
        libc::FIOCLEX as u64,
        libc::FIONCLEX as u64,
        libc::FIONREAD as u64,
        libc::TCGETS as u64, // isatty()
    ];
    #[allow(clippy::as_conversions)] // c_int constants, positive, in a const
    const PRCTLS: &[u64] = &[libc::PR_SET_NAME as u64, libc::PR_GET_NAME as u64];
    vec![(libc::SYS_ioctl, 1, IOCTLS), (libc::SYS_prctl, 0, PRCTLS)]
}

/// The syscalls the daemon may make once sandboxed, whatever their arguments.
pub fn allowed_syscalls() -> Vec<i64> {
    let mut list: Vec<i64> = [
        MEMORY,
        THREADS_AND_SIGNALS,
        TIME_AND_IDENTITY,
        FILES,
        NETWORK,
    ]
    .concat();
    #[cfg(target_arch = "x86_64")]
    list.extend_from_slice(X86_64_LEGACY);
    list.sort_unstable();
    list.dedup();
    list
}

/// Memory.
const MEMORY: &[i64] = &[
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_mlock,
    libc::SYS_munlock,
    libc::SYS_membarrier,
];

/// Threads, scheduling, signals.
const THREADS_AND_SIGNALS: &[i64] = &[
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_rseq,
    libc::SYS_set_tid_address,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_tgkill,
    libc::SYS_tkill,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_getparam,
    libc::SYS_sched_getscheduler,
    libc::SYS_getpriority,
    libc::SYS_setpriority,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
];

/// Time, resource use, system and process identity.
const TIME_AND_IDENTITY: &[i64] = &[
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_times,
    libc::SYS_getrusage,
    libc::SYS_getrandom,
    libc::SYS_uname,
    libc::SYS_sysinfo,
    libc::SYS_prlimit64,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_getgroups,
    libc::SYS_capget,
];

/// File descriptors (guest memory fds, eventfds, epoll, the vhost-user socket).
const FILES: &[i64] = &[
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_pread64,
    libc::SYS_preadv,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_pwrite64,
    libc::SYS_pwritev,
    libc::SYS_close,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_fcntl,
    libc::SYS_lseek,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_fstatfs,
    libc::SYS_openat,
    libc::SYS_readlinkat,
    libc::SYS_getdents64,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_flock,
    libc::SYS_unlinkat, // socket and pid file removal at exit
    libc::SYS_getcwd,
    libc::SYS_eventfd2,
    libc::SYS_pipe2,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
];

/// Network: libcephfs talks to MON/MDS/OSD (and reconnects); syslog; vhost-user accept.
const NETWORK: &[i64] = &[
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_connect,
    libc::SYS_accept4,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_shutdown,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
];

/// The older syscalls x86_64 still has beside their *at/2/3 successors.
#[cfg(target_arch = "x86_64")]
const X86_64_LEGACY: &[i64] = &[
    libc::SYS_arch_prctl,
    libc::SYS_open,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_readlink,
    libc::SYS_unlink,
    libc::SYS_access,
    libc::SYS_poll,
    libc::SYS_select,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_create,
    libc::SYS_pipe,
    libc::SYS_dup2,
    libc::SYS_accept,
    libc::SYS_time,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_users_and_groups() {
        let root = resolve_account("root", None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((root.uid, root.gid), (0, 0));
        let by_number = resolve_account("0", Some("0")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((by_number.uid, by_number.gid), (0, 0));
        assert!(matches!(
            resolve_account("no-such-user-xyz", None),
            Err(SandboxError::NoSuchUser(_))
        ));
        assert!(matches!(
            resolve_account("root", Some("no-such-group-xyz")),
            Err(SandboxError::NoSuchGroup(_))
        ));
        assert!(matches!(
            resolve_account("4000000000", None),
            Err(SandboxError::NeedGroup(4_000_000_000))
        ));
    }

    #[test]
    fn the_filter_compiles_and_is_not_empty() {
        let prog = build_filter(SeccompAction::KillProcess).unwrap_or_else(|e| panic!("{e}"));
        assert!(prog.len() > allowed_syscalls().len());
        for (nr, _, _) in restricted_syscalls() {
            assert!(
                !allowed_syscalls().contains(&nr),
                "{nr} both free and restricted"
            );
        }
        let list = allowed_syscalls();
        // Calls a sandboxed daemon must never make.
        for forbidden in [
            libc::SYS_ptrace,
            libc::SYS_execve,
            libc::SYS_mount,
            libc::SYS_setuid,
            libc::SYS_init_module,
            libc::SYS_kexec_load,
            libc::SYS_bpf,
            libc::SYS_process_vm_writev,
        ] {
            assert!(!list.contains(&forbidden), "{forbidden} is allowed");
        }
    }
}
