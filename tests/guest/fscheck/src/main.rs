//! fscheck: a model-based filesystem checker. One seed drives a random sequence of file system
//! operations in a fresh directory; every result is compared with an in-memory model right after
//! the operation; the first divergence is reported with a replay command line.
//! See tests/guest/README.md ("fscheck").

mod check;
mod data;
mod generator;
mod model;
mod ops;
mod rng;
mod sys;

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use model::{Cred, Inode, Kind, Model, TimeExp};
use ops::{Config, Op, World};

const USAGE: &str = "usage: fscheck --dir DIR [--seed N] [--ops N] [--as-user UID:GID[:G1,G2...]]
               [--data-pct P] [--op-timeout SECS] [--time-slack MS] [--max-size BYTES]
               [--verify-every N] [--bigdir-every N] [--max-time SECS]
               [--no-direct] [--no-mmap] [--no-xattr]
               [--skip OP[,OP...]] [--inject KIND] [--keep] [--quiet] [--trace]
  Runs N seeded random operations in a fresh subdirectory of DIR and checks each against a model.
  --inject KIND  deliberately changes the tree behind the model's back at a random operation
                 (flip, chmod, stray, mtime, link, truncate): the run must then fail;
                 `hang` sleeps in the operation: the watchdog must report HANG.
  --skip OPS     never generates these operations (to look past a known divergence).
  --max-time S   explicit times are drawn below S seconds (default 2^32: CephFS keeps 32 bits).
  --trace        prints every operation, then the model's numbers of the inodes it touched.
  Exit: 0 ok, 1 divergence, 2 usage or setup error, 3 an operation hung (--op-timeout).";

struct Args {
    seed: u64,
    ops: u64,
    dir: String,
    as_user: Option<Cred>,
    as_user_arg: Option<String>,
    data_pct: u64,
    op_timeout: u64,
    slack_ms: u64,
    max_size: u64,
    verify_every: u64,
    bigdir_every: u64,
    max_time: u64,
    direct: bool,
    mmap: bool,
    xattr: bool,
    inject: Option<String>,
    skip: Vec<String>,
    keep: bool,
    quiet: bool,
    trace: bool,
}

fn usage_exit(msg: &str) -> ! {
    eprintln!("fscheck: {msg}\n{USAGE}");
    std::process::exit(2);
}

fn parse_cred(s: &str) -> Option<Cred> {
    let mut it = s.splitn(3, ':');
    let uid = it.next()?.parse().ok()?;
    let gid = it.next()?.parse().ok()?;
    let groups = match it.next() {
        Some(g) if !g.is_empty() => g
            .split(',')
            .map(|x| x.parse().ok())
            .collect::<Option<Vec<u32>>>()?,
        _ => Vec::new(),
    };
    Some(Cred { uid, gid, groups })
}

fn parse_args() -> Args {
    let mut a = Args {
        seed: sys::now_ns() as u64 ^ (std::process::id() as u64) << 32,
        ops: 1000,
        dir: String::new(),
        as_user: None,
        as_user_arg: None,
        data_pct: 50,
        op_timeout: 60,
        slack_ms: 1000,
        max_size: 16 << 20,
        verify_every: 500,
        bigdir_every: 1500,
        max_time: 1 << 32,
        direct: true,
        mmap: true,
        xattr: true,
        inject: None,
        skip: Vec::new(),
        keep: false,
        quiet: false,
        trace: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    let num = |i: usize, name: &str| -> u64 {
        let v = argv
            .get(i + 1)
            .unwrap_or_else(|| usage_exit(&format!("{name} needs a value")));
        v.parse()
            .unwrap_or_else(|_| usage_exit(&format!("{name}: not a number: {v}")))
    };
    while i < argv.len() {
        let o = argv[i].as_str();
        let mut takes = true;
        match o {
            "--seed" => a.seed = num(i, o),
            "--ops" => a.ops = num(i, o),
            "--dir" => {
                a.dir = argv
                    .get(i + 1)
                    .cloned()
                    .unwrap_or_else(|| usage_exit("--dir needs a value"))
            }
            "--as-user" => {
                let v = argv
                    .get(i + 1)
                    .unwrap_or_else(|| usage_exit("--as-user needs UID:GID[:G1,...]"));
                a.as_user = Some(
                    parse_cred(v)
                        .unwrap_or_else(|| usage_exit(&format!("--as-user: bad value {v}"))),
                );
                a.as_user_arg = Some(v.clone());
            }
            "--data-pct" => a.data_pct = num(i, o).min(100),
            "--op-timeout" => a.op_timeout = num(i, o).max(1),
            "--time-slack" => a.slack_ms = num(i, o),
            "--max-size" => a.max_size = num(i, o).max(1 << 16),
            "--verify-every" => a.verify_every = num(i, o),
            "--bigdir-every" => a.bigdir_every = num(i, o),
            "--max-time" => a.max_time = num(i, o).clamp(1, 1 << 32),
            "--skip" => {
                let v = argv
                    .get(i + 1)
                    .unwrap_or_else(|| usage_exit("--skip needs OP[,OP...]"));
                for n in v.split(',').filter(|n| !n.is_empty()) {
                    if !generator::op_names().contains(&n) {
                        usage_exit(&format!(
                            "--skip: unknown operation {n} (one of {:?})",
                            generator::op_names()
                        ));
                    }
                    a.skip.push(n.to_string());
                }
            }
            "--inject" => {
                let k = argv
                    .get(i + 1)
                    .unwrap_or_else(|| usage_exit("--inject needs a kind"));
                if !ops::INJECT_KINDS.contains(&k.as_str()) {
                    usage_exit(&format!(
                        "--inject: unknown kind {k} (one of {:?})",
                        ops::INJECT_KINDS
                    ));
                }
                a.inject = Some(k.clone());
            }
            _ => {
                takes = false;
                match o {
                    "--no-direct" => a.direct = false,
                    "--no-mmap" => a.mmap = false,
                    "--no-xattr" => a.xattr = false,
                    "--keep" => a.keep = true,
                    "--quiet" => a.quiet = true,
                    "--trace" => a.trace = true,
                    "-h" | "--help" => {
                        println!("{USAGE}");
                        std::process::exit(0);
                    }
                    _ => usage_exit(&format!("unknown argument {o}")),
                }
            }
        }
        i += if takes { 2 } else { 1 };
    }
    if a.dir.is_empty() {
        usage_exit("--dir is required");
    }
    a
}

/// The command line that replays this run up to operation `ops` (exclusive count).
fn replay_line(a: &Args, ops: u64) -> String {
    let mut s = format!("fscheck --seed {} --ops {} --dir {}", a.seed, ops, a.dir);
    if let Some(u) = &a.as_user_arg {
        s += &format!(" --as-user {u}");
    }
    if a.data_pct != 50 {
        s += &format!(" --data-pct {}", a.data_pct);
    }
    if a.op_timeout != 60 {
        s += &format!(" --op-timeout {}", a.op_timeout);
    }
    if a.slack_ms != 1000 {
        s += &format!(" --time-slack {}", a.slack_ms);
    }
    if a.max_size != 16 << 20 {
        s += &format!(" --max-size {}", a.max_size);
    }
    if a.verify_every != 500 {
        s += &format!(" --verify-every {}", a.verify_every);
    }
    if a.bigdir_every != 1500 {
        s += &format!(" --bigdir-every {}", a.bigdir_every);
    }
    if a.max_time != 1 << 32 {
        s += &format!(" --max-time {}", a.max_time);
    }
    if !a.direct {
        s += " --no-direct";
    }
    if !a.mmap {
        s += " --no-mmap";
    }
    if !a.xattr {
        s += " --no-xattr";
    }
    if !a.skip.is_empty() {
        s += &format!(" --skip {}", a.skip.join(","));
    }
    if let Some(k) = &a.inject {
        s += &format!(" --inject {k}");
    }
    s
}

// ---- watchdog -------------------------------------------------------------------------------

struct Watch {
    active: bool,
    index: u64,
    started_ms: u64,
    desc: String,
    replay: String,
    seed: u64,
}

static WATCH: Mutex<Watch> = Mutex::new(Watch {
    active: false,
    index: 0,
    started_ms: 0,
    desc: String::new(),
    replay: String::new(),
    seed: 0,
});

fn watch_begin(index: u64, desc: String, replay: String) {
    let mut w = WATCH.lock().unwrap();
    w.active = true;
    w.index = index;
    w.started_ms = sys::mono_ms();
    w.desc = desc;
    w.replay = replay;
}

fn watch_end() {
    WATCH.lock().unwrap().active = false;
}

/// A sweep of many calls (VerifyAll) moved on to its next entry: the timeout is per call, not
/// per sweep. Under a loaded host a sweep of a large tree with contents took over the 60 s
/// while no request of the daemon's was slow (its 30 s watchdog stayed silent).
pub fn watch_progress() {
    if let Ok(mut w) = WATCH.lock() {
        w.started_ms = sys::mono_ms();
    }
}

fn start_watchdog(timeout_s: u64) {
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(500));
        let w = WATCH.lock().unwrap();
        if w.active && sys::mono_ms().saturating_sub(w.started_ms) > timeout_s * 1000 {
            // Straight to fd 1: the stuck thread may hold the stdout lock.
            sys::raw_write(
                1,
                &format!(
                    "\nHANG: fscheck seed {}: operation #{} did not return within {timeout_s} s\n  op: {}\n  replay: {}\n",
                    w.seed, w.index, w.desc, w.replay
                ),
            );
            unsafe { libc::_exit(3) };
        }
    });
}

extern "C" fn on_sigbus(_: libc::c_int) {
    let msg = match WATCH.try_lock() {
        Ok(w) => format!(
            "\nfscheck: DIVERGENCE (seed {}): SIGBUS touching a mapping during operation #{}: the file is shorter than the model says\n  op: {}\n  replay: {}\n",
            w.seed, w.index, w.desc, w.replay
        ),
        Err(_) => "\nfscheck: DIVERGENCE: SIGBUS touching a mapping\n".to_string(),
    };
    sys::raw_stderr(&msg);
    unsafe { libc::_exit(1) };
}

// ---- setup ----------------------------------------------------------------------------------

fn setup_fail(msg: String) -> ! {
    eprintln!("fscheck: setup: {msg}");
    std::process::exit(2);
}

/// Learn an existing path's attributes into a model inode (setup only).
fn adopt(m: &mut Model, rel: &str, id: model::Id) {
    let st = sys::lstat(&m.real(rel))
        .unwrap_or_else(|e| setup_fail(format!("lstat {rel}: {}", sys::errname(e))));
    let n = m.get_mut(id);
    n.mode = st.st_mode & 0o7777;
    n.uid = st.st_uid;
    n.gid = st.st_gid;
    n.mtime = TimeExp::Known(st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128);
    n.ctime = TimeExp::Known(st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128);
    n.ino = Some(st.st_ino);
    m.inos.insert(st.st_ino, id);
}

/// As root, for an unprivileged run: a root-owned directory the user cannot change, holding
/// files of other owners with the special bits a write by the user must (or must not) kill.
fn setup_foreign(m: &mut Model) {
    let root_cred = m.cred.clone();
    let fid = m.alloc(Inode::new(
        Kind::Dir(Default::default()),
        0o755,
        0,
        0,
        TimeExp::Known(0),
    ));
    sys::mkdir(&m.real("foreign"), 0o755)
        .unwrap_or_else(|e| setup_fail(format!("mkdir foreign: {}", sys::errname(e))));
    let root = m.root;
    m.add_entry(root, "foreign", fid);
    for (name, mode) in [
        ("rw", 0o666),
        ("ro", 0o644),
        ("suid", 0o4666),
        ("sgid-nox", 0o2666),
        ("sgid-x", 0o6676),
    ] {
        let rel = format!("foreign/{name}");
        let data = rng::pattern(mode as u64, 3000);
        let fd = sys::open(&m.real(&rel), libc::O_CREAT | libc::O_WRONLY, 0o600)
            .unwrap_or_else(|e| setup_fail(format!("create {rel}: {}", sys::errname(e))));
        sys::pwrite_all(fd, &data, 0).unwrap();
        sys::close(fd).unwrap();
        sys::chmod(&m.real(&rel), mode).unwrap();
        let id = m.alloc(Inode::new(
            Kind::File(data::Data::from(&data)),
            mode,
            0,
            0,
            TimeExp::Known(0),
        ));
        m.add_entry(fid, name, id);
        adopt(m, &rel, id);
    }
    adopt(m, "foreign", fid);
    m.cred = root_cred;
}

fn drop_privileges(c: &Cred) {
    unsafe {
        let groups: Vec<libc::gid_t> = c.groups.clone();
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0
            || libc::setgid(c.gid) != 0
            || libc::setuid(c.uid) != 0
        {
            setup_fail(format!("dropping to {c:?}: {}", sys::errname(sys::errno())));
        }
    }
}

fn remove_tree(path: &str) {
    if let Ok(st) = sys::lstat(path) {
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            if let Ok(rd) = std::fs::read_dir(path) {
                for e in rd.flatten() {
                    remove_tree(&e.path().to_string_lossy());
                }
            }
            let _ = sys::rmdir(path);
        } else {
            let _ = sys::unlink(path);
        }
    }
}

fn main() {
    let a = parse_args();
    unsafe {
        libc::umask(0);
        libc::signal(libc::SIGBUS, on_sigbus as *const () as libc::sighandler_t);
    }
    // A fresh directory under DIR.
    let mut base = String::new();
    for k in 0.. {
        let b = format!("{}/fscheck.{}.{k}", a.dir.trim_end_matches('/'), a.seed);
        match sys::mkdir(&b, 0o755) {
            Ok(()) => {
                base = b;
                break;
            }
            Err(libc::EEXIST) if k < 1000 => continue,
            Err(e) => setup_fail(format!("mkdir {b}: {}", sys::errname(e))),
        }
    }
    if let Err(e) = std::env::set_current_dir(&base) {
        setup_fail(format!("chdir {base}: {e}"));
    }
    let euid = unsafe { libc::geteuid() };
    let egid = unsafe { libc::getegid() };
    let run_cred = a.as_user.clone().unwrap_or(Cred {
        uid: euid,
        gid: egid,
        groups: Vec::new(),
    });
    let root_inode = Inode::new(
        Kind::Dir(Default::default()),
        0o755,
        0,
        0,
        TimeExp::Known(0),
    );
    let mut m = Model::new(
        base.clone(),
        Cred {
            uid: euid,
            gid: egid,
            groups: Vec::new(),
        },
        root_inode,
    );
    // The clock probe (see World::calibrate), opened before privileges go.
    let probe = format!("{base}.clock");
    let clock_fd = sys::open(&probe, libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC, 0o600)
        .unwrap_or_else(|e| setup_fail(format!("create {probe}: {}", sys::errname(e))));
    let _ = sys::unlink(&probe);
    if let Some(c) = &a.as_user {
        if euid != 0 {
            setup_fail("--as-user needs to start as root".into());
        }
        setup_foreign(&mut m);
        sys::lchown(&base, Some(c.uid), Some(c.gid))
            .unwrap_or_else(|e| setup_fail(format!("chown {base}: {}", sys::errname(e))));
        drop_privileges(c);
    }
    m.cred = run_cred.clone();
    let root = m.root;
    adopt(&mut m, "", root);

    let cfg = Config {
        slack_ns: a.slack_ms as i128 * 1_000_000,
        clock_fd,
        direct: a.direct,
        mmap: a.mmap,
        xattr: a.xattr,
        max_size: a.max_size,
    };
    let mut world = World::new(m, cfg);
    match world.calibrate() {
        Ok(off) if off.abs() > a.slack_ms as i128 * 500_000 => println!(
            "fscheck: the filesystem's clock is {:.3} s from the guest's: \"now\" is taken as the guest's clock plus that",
            off as f64 / 1e9
        ),
        Ok(_) => {}
        Err(e) => setup_fail(format!("clock probe: {e}")),
    }
    let mut gen = generator::Gen::new(a.seed, a.data_pct, a.bigdir_every);
    gen.skip = a.skip.clone();
    gen.max_time = a.max_time;
    // The injection point and what follows it come from their own stream, so the operations
    // before it are the same as without --inject.
    let mut irng = rng::Rng::new(a.seed ^ 0x1f3c_7a5b_d00d_beef);
    let mut inject_at = if a.ops > 4 {
        irng.range(a.ops / 4, a.ops / 2)
    } else {
        0
    };
    WATCH.lock().unwrap().seed = a.seed;
    start_watchdog(a.op_timeout);
    println!(
        "fscheck: seed {} ops {} dir {} as {}:{}{} direct={} mmap={}",
        a.seed,
        a.ops,
        base,
        run_cred.uid,
        run_cred.gid,
        if run_cred.groups.is_empty() {
            String::new()
        } else {
            format!(" groups {:?}", run_cred.groups)
        },
        a.direct,
        a.mmap
    );
    let started = sys::mono_ms();
    let mut history: VecDeque<String> = VecDeque::new();
    let mut verify_at: Option<u64> = None;
    let mut injected_at: Option<u64> = None;
    let mut notes_shown = 0;
    let total = a.ops + 1;
    for i in 0..total {
        let op = if i == a.ops {
            Op::VerifyAll { content: true }
        } else if a.inject.is_some() && i == inject_at {
            verify_at = Some(i + 1);
            Op::Inject {
                kind: a.inject.clone().unwrap(),
                seed: irng.next_u64(),
            }
        } else if verify_at == Some(i) {
            // Right after an injected fault: the whole tree, contents too.
            Op::VerifyAll { content: true }
        } else if a.verify_every > 0 && i > 0 && i % a.verify_every == 0 {
            Op::VerifyAll { content: false }
        } else {
            gen.next(&world)
        };
        let desc = format!("{op:?}");
        if a.trace {
            println!("#{i} {desc}");
        }
        let replay = replay_line(&a, (i + 1).min(a.ops));
        watch_begin(i, desc.clone(), replay.clone());
        let res = if let Op::Inject { kind, seed } = &op {
            match world.inject(kind, *seed) {
                Ok(what) => {
                    println!("fscheck: op #{i}: INJECTED fault ({kind}): {what}");
                    injected_at = Some(i);
                    history.push_back(format!("#{i} INJECT {kind}: {what}"));
                    Ok(())
                }
                // Nothing to inject into yet (say, no non-empty file): try again a few
                // operations later; a run that never gets there fails below.
                Err(why) if i + 6 < a.ops => {
                    println!("fscheck: op #{i}: could not inject {kind} yet ({why}): retrying");
                    inject_at = i + 5;
                    verify_at = None;
                    Ok(())
                }
                Err(why) => {
                    println!("fscheck: op #{i}: could not inject {kind}: {why}");
                    std::process::exit(2);
                }
            }
        } else {
            history.push_back(format!("#{i} {desc}"));
            let r = world.run(&op);
            if a.trace {
                println!("#{i}   touched inodes {:?}", world.last_touched());
            }
            r
        };
        watch_end();
        while history.len() > 20 {
            history.pop_front();
        }
        while notes_shown < world.notes.len() {
            println!("fscheck: note at op #{i}: {}", world.notes[notes_shown]);
            notes_shown += 1;
        }
        if let Err(d) = res {
            println!(
                "fscheck: DIVERGENCE (seed {}) at operation #{i} of {}",
                a.seed, a.ops
            );
            if let Some(k) = injected_at {
                println!("  (after the fault injected at op #{k}: caught)");
            }
            println!("  op:       {desc}");
            println!("  observed: {}", d.0);
            for p in op.paths() {
                println!("  model:    {}", world.describe(p));
            }
            let mut shown = Vec::new();
            for s in world.slots.iter().flatten() {
                if let Some(p) = world.m.path(s.id) {
                    if !op.paths().contains(&p.as_str()) && !shown.contains(&s.id) {
                        shown.push(s.id);
                        println!("  open:     {}", world.describe(&p));
                    }
                }
            }
            println!("  last operations:");
            for h in &history {
                println!("    {h}");
            }
            println!("  tree kept at {}", world.m.base);
            println!("  replay: {replay}");
            std::process::exit(1);
        }
        if !a.quiet && i > 0 && a.ops >= 10 && i % (a.ops / 10).max(1) == 0 && i < a.ops {
            println!(
                "fscheck: seed {}: {i}/{} ops, {:.1} s",
                a.seed,
                a.ops,
                (sys::mono_ms() - started) as f64 / 1000.0
            );
        }
    }
    let secs = (sys::mono_ms() - started) as f64 / 1000.0;
    let mut counts: Vec<_> = world.counts.iter().collect();
    counts.sort();
    let list: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!("fscheck: {:.1} s; by kind: {}", secs, list.join(", "));
    for s in world.slots.iter_mut() {
        if let Some(s) = s.take() {
            let _ = sys::close(s.fd);
        }
    }
    if !a.keep {
        let _ = std::env::set_current_dir("/");
        remove_tree(&base);
    }
    if a.inject.is_some() {
        println!(
            "fscheck: seed {}: the injected fault was NOT detected",
            a.seed
        );
        std::process::exit(1);
    }
    println!("fscheck: seed {}: {} ops ok", a.seed, a.ops);
}
