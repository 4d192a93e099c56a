//! `ceph-virtiofsd-bench upgrade-stream`: a guest that keeps working while its daemon is
//! replaced (`ceph-virtiofsd --handover`). It reconnects like cloud-hypervisor when the daemon
//! hangs up (see `SessionOpts::reconnect`), and checks that its open handles and node ids still
//! work with the successor.
//!
//! It makes a directory with `--files` files, keeps every file open, unlinks the last one (an
//! open file another client could purge once nobody holds it), and then, until `--seconds` have
//! passed or `--stop-file` exists, appends one 4 KiB record per file per round: WRITE at the
//! record's offset through the open handle, READ it back, GETATTR the node and check its size.
//! Every failed or wrong answer is an error. One line of figures at the end:
//!
//! ```text
//! upgrade-stream: rounds=R ops=N errors=E reconnects=C rounds_after_reconnect=A dir=NAME
//! ```
//!
//! Record k of every file holds bytes `(i % 251)` for i in 0..4096 at offset k * 4096 (the
//! bench's WRITE pattern), so another client can check the bytes. Exit 0 only with no error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

use crate::backend::{Backend, Ctx, Op, OpError, Reply};
use crate::session::{FuseSession, SessionOpts};

#[derive(Debug, Parser)]
#[command(
    name = "ceph-virtiofsd-bench upgrade-stream",
    about = "Keep files open and write, read and stat them while the daemon is replaced; reconnect when it hangs up"
)]
struct Cli {
    /// The daemon's vhost-user socket.
    #[arg(long)]
    socket: PathBuf,
    /// Files kept open (the last one is unlinked while open).
    #[arg(long, default_value_t = 4)]
    files: usize,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Stop once this file exists (checked every round).
    #[arg(long)]
    stop_file: Option<PathBuf>,
    /// Seconds to retry the socket after the daemon hung up.
    #[arg(long, default_value_t = 60)]
    reconnect_secs: u64,
    /// Name of the directory made under the export's root.
    #[arg(long, default_value = "upgrade-stream")]
    dir: String,
}

const RECORD: u32 = 4096;

struct Stream {
    s: FuseSession,
    ops: u64,
    errors: Vec<String>,
}

impl Stream {
    fn call(&mut self, op: Op) -> Result<Reply, OpError> {
        self.ops += 1;
        self.s.call(Ctx::ROOT, op)
    }

    fn check(&mut self, what: String, r: Result<Reply, OpError>, ok: impl Fn(&Reply) -> bool) {
        match r {
            Ok(reply) if ok(&reply) => {}
            Ok(reply) => self.errors.push(format!("{what}: unexpected {reply:?}")),
            Err(e) => self.errors.push(format!("{what}: {e}")),
        }
    }
}

pub fn main(args: impl Iterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = Cli::parse_from(args);
    let opts = SessionOpts {
        request_queues: 1,
        queue_size: 128,
        slots_per_queue: 8,
        max_io: 64 * 1024,
        timeout: Duration::from_secs(60),
        event_idx: true,
        halt_poll: Duration::ZERO,
        reconnect: Some(Duration::from_secs(cli.reconnect_secs)),
    };
    let s = match FuseSession::connect(&cli.socket, &opts) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("upgrade-stream: cannot start the session");
            crate::print_chain(&e);
            return ExitCode::from(2);
        }
    };
    let mut st = Stream {
        s,
        ops: 0,
        errors: Vec::new(),
    };
    match run(&cli, &mut st) {
        Ok(summary) => {
            println!("{summary}");
            for e in st.errors.iter().take(20) {
                println!("  error: {e}");
            }
            if st.errors.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("upgrade-stream: the session broke after {} ops", st.ops);
            crate::print_chain(&e);
            ExitCode::from(3)
        }
    }
}

fn run(cli: &Cli, st: &mut Stream) -> Result<String, OpError> {
    let root = st.s.root();
    let dir = match st.call(Op::Mkdir {
        parent: root,
        name: cli.dir.clone(),
        mode: 0o755,
    })? {
        Reply::Entry { node, .. } => node,
        other => {
            return Err(OpError::Malformed {
                op: "MKDIR",
                why: format!("{other:?}"),
            })
        }
    };
    let mut files = Vec::new();
    for i in 0..cli.files.max(1) {
        let name = format!("f{i}");
        match st.call(Op::Create {
            parent: dir,
            name: name.clone(),
            mode: 0o644,
            flags: libc::O_RDWR as u32,
        })? {
            Reply::Created { node, fh } => files.push((name, node, fh)),
            other => {
                return Err(OpError::Malformed {
                    op: "CREATE",
                    why: format!("{other:?}"),
                })
            }
        }
    }
    if let Some((name, _, _)) = files.last() {
        let name = name.clone();
        let r = st.call(Op::Unlink { parent: dir, name });
        st.check("UNLINK of the last file".into(), r, |r| *r == Reply::Empty);
    }
    let started = Instant::now();
    let mut rounds = 0u64;
    let mut rounds_after = 0u64;
    loop {
        if started.elapsed() >= Duration::from_secs(cli.seconds)
            || cli.stop_file.as_ref().is_some_and(|f| f.exists())
        {
            break;
        }
        let before = st.s.reconnects;
        let off = rounds * u64::from(RECORD);
        for (name, node, fh) in files.clone() {
            let r = st.call(Op::Write {
                node,
                fh,
                offset: off,
                len: RECORD,
                kill_suidgid: false,
            });
            st.check(format!("WRITE {name} @{off}"), r, |r| {
                *r == Reply::Written(RECORD)
            });
            let r = st.call(Op::Read {
                node,
                fh,
                offset: off,
                len: RECORD,
            });
            st.check(format!("READ {name} @{off}"), r, |r| {
                *r == Reply::Data(RECORD)
            });
            let r = st.call(Op::Getattr { node });
            let want = off + u64::from(RECORD);
            st.check(
                format!("GETATTR {name} (size {want})"),
                r,
                |r| matches!(r, Reply::Attr { size, .. } if *size == want),
            );
        }
        rounds += 1;
        if st.s.reconnects > 0 && before == st.s.reconnects {
            rounds_after += 1;
        }
    }
    // The handles go back; the unlinked file goes with its last one.
    for (name, node, fh) in files.clone() {
        let r = st.call(Op::Release { node, fh });
        st.check(format!("RELEASE {name}"), r, |r| *r == Reply::Empty);
    }
    Ok(format!(
        "upgrade-stream: rounds={rounds} ops={} errors={} reconnects={} rounds_after_reconnect={rounds_after} dir={}",
        st.ops,
        st.errors.len(),
        st.s.reconnects,
        cli.dir
    ))
}
