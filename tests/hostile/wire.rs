//! Scripted attacks of a hostile guest on the real daemon and the real cluster, through the
//! hand-written vhost-user frontend of `ceph-virtiofsd-bench hostile serve`.
//!
//! After every attack the daemon must still answer a GETATTR of the export root, and it must
//! never panic. Every node id or inode number a reply hands out is judged by the oracle (a
//! second libcephfs client mounted at "/", which walks ".." up from the inode): it must lie
//! under the export. The export is `/NAME/data`; `/NAME/other/secret` is what must stay out
//! of reach.

use crate::common;
use crate::common::hostile::{hostile_daemon, op, request, Answer, Body, Hostile, REPLY};
use crate::common::Lab;

/// Collects what went wrong, so one run reports every failing attack.
struct Failures(Vec<String>);

impl Failures {
    fn new() -> Self {
        Failures(Vec::new())
    }

    fn check(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.0.push(what.into());
        }
    }

    /// The daemon answered (or returned) the chain, handed out nothing outside the export,
    /// and still answers afterwards.
    fn survived(&mut self, h: &mut Hostile, what: &str, a: &Answer) {
        match a {
            Answer::Lost => self.0.push(format!("{what}: chain never returned")),
            Answer::Bogus(id) => self.0.push(format!("{what}: used ring returned id {id}")),
            Answer::Done { outside, .. } if !outside.is_empty() => self.0.push(format!(
                "{what}: handed out inodes outside the export: {outside:x?}"
            )),
            _ => {}
        }
        if !h.alive() {
            self.0.push(format!(
                "{what}: the daemon stopped answering GETATTR afterwards"
            ));
        }
    }

    fn assert_none(self, daemon: &common::Daemon) {
        let log = daemon.log_text();
        let mut f = self.0;
        if log.contains("panicked") {
            f.push("the daemon log shows a panic".into());
        }
        assert!(
            f.is_empty(),
            "{} failures:\n  {}\n---- daemon log (tail) ----\n{}",
            f.len(),
            f.join("\n  "),
            log.lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

fn errno_of(a: &Answer) -> Option<i32> {
    a.error().map(|e| -e)
}

/// Not served: answered with an errno, or given back with nothing written.
fn refused(a: &Answer) -> bool {
    match a {
        Answer::Done { written: 0, .. } => true,
        _ => a.error().is_some_and(|e| e != 0),
    }
}

#[test]
fn hostile_unknown_opcodes_get_enosys_and_the_daemon_keeps_serving() {
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-opcodes", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let mut f = Failures::new();
    // 0, 7 and 19 are below 50 and have no variant in fuse-backend-rs's Opcode enum; from 53
    // up nothing is served (50 is SYNCFS, 51 TMPFILE and 52 STATX: see their tests); 1 << 20
    // and FUSE_INIT << 24 are the byte-swapped reserved values.
    let mut ops: Vec<u32> = vec![0, 7, 19];
    ops.extend(53..=64);
    ops.extend([
        100,
        1000,
        4095,
        4096,
        65535,
        1 << 20,
        26 << 24,
        1 << 31,
        u32::MAX - 1,
        u32::MAX,
    ]);
    for o in ops {
        for body in [&[][..], &[0u8; 64][..]] {
            let u = h.next_unique();
            let a = h.raw(1, &request(o, u, 1, None, body), REPLY);
            let what = format!("opcode {o} with a {}-byte body", body.len());
            f.check(
                errno_of(&a) == Some(libc::ENOSYS) && a.unique() == Some(u),
                format!("{what}: want ENOSYS for unique {u}, got {a:?}"),
            );
            f.survived(&mut h, &what, &a);
        }
    }
    f.assert_none(&daemon);
}

/// FUSE_STATX, which the daemon decodes itself (`server::copied`): a body shorter than
/// `fuse_statx_in` gets EINVAL, unknown nodes an errno, a reply room shorter than
/// `fuse_statx_out` is returned empty, a room larger than the private reply buffer ENOSYS (the
/// guest then asks GETATTR); the export root's answer is a whole `fuse_statx_out` with the
/// basic stats and the birth time.
#[test]
fn hostile_statx_short_bodies_small_rooms_and_unknown_nodes_are_refused() {
    const ROOM: u32 = 16 + 288;
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-statx", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let mut f = Failures::new();
    let statx_in = Body::new().u32(0).u32(0).u64(0).u32(0).u32(0x7ff | 0x800).0;
    for len in [0usize, 8, 23] {
        let u = h.next_unique();
        let a = h.raw(
            1,
            &request(op::FUSE_STATX, u, 1, None, &statx_in[..len]),
            ROOM,
        );
        let what = format!("STATX with a {len}-byte body");
        f.check(
            errno_of(&a) == Some(libc::EINVAL),
            format!("{what}: want EINVAL, got {a:?}"),
        );
        f.survived(&mut h, &what, &a);
    }
    for n in [0u64, 2, 4096, 1 << 32, u64::MAX] {
        let u = h.next_unique();
        let a = h.raw(1, &request(op::FUSE_STATX, u, n, None, &statx_in), ROOM);
        let what = format!("STATX of node {n:#x}");
        f.check(refused(&a), format!("{what}: want an errno, got {a:?}"));
        f.survived(&mut h, &what, &a);
    }
    for room in [16u32, 100, ROOM - 1] {
        let u = h.next_unique();
        let a = h.raw(1, &request(op::FUSE_STATX, u, 1, None, &statx_in), room);
        let what = format!("STATX with {room} bytes of reply room");
        f.check(refused(&a), format!("{what}: want it refused, got {a:?}"));
        f.survived(&mut h, &what, &a);
    }
    let u = h.next_unique();
    let a = h.raw(1, &request(op::FUSE_STATX, u, 1, None, &statx_in), REPLY);
    f.check(
        errno_of(&a) == Some(libc::ENOSYS),
        format!("STATX with {REPLY} bytes of room: want ENOSYS, got {a:?}"),
    );
    f.survived(&mut h, "STATX with a large room", &a);
    let u = h.next_unique();
    let a = h.raw(1, &request(op::FUSE_STATX, u, 1, None, &statx_in), ROOM);
    let p = a.payload();
    let mask = p
        .get(32..36)
        .map(|m| u32::from_le_bytes(m.try_into().unwrap()));
    f.check(
        errno_of(&a) == Some(0) && p.len() == 288 && mask == Some(0x7ff | 0x800),
        format!("STATX of the export root: want 288 bytes, mask 0xfff, got {a:?}"),
    );
    f.survived(&mut h, "STATX of the export root", &a);
    f.assert_none(&daemon);
}

/// FUSE_TMPFILE, which the daemon decodes itself (`server`): a body shorter than
/// `fuse_create_in`, a name other than the kernel's ("/" or empty, with its NUL), an unknown
/// or non-directory parent, no write access, or a reply room short of CREATE's whole answer
/// are refused with an errno; the daemon's private names can be neither looked up nor made,
/// renamed or removed; a good one is served, has nlink 0 and a LINK gives it a name, unless
/// it was opened with O_EXCL (ENOENT). The daemon keeps serving throughout.
#[test]
fn hostile_tmpfile_requests_are_checked_and_private_names_stay_out_of_reach() {
    const ROOM: u32 = 16 + 128 + 16;
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-tmpfile", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let mut f = Failures::new();
    let create_in = |flags: i32| {
        Body::new()
            .u32((flags | libc::O_TMPFILE) as u32)
            .u32(libc::S_IFREG | 0o640)
            .u32(0o022)
            .u32(0)
            .0
    };
    let good = Body::new().bytes(&create_in(libc::O_RDWR)).name(b"/").0;
    let tmpfile = |h: &mut Hostile, node: u64, body: &[u8], room: u32| {
        let u = h.next_unique();
        h.raw(1, &request(op::FUSE_TMPFILE, u, node, None, body), room)
    };
    for len in [0usize, 8, 15] {
        let a = tmpfile(&mut h, 1, &good[..len], ROOM);
        let what = format!("TMPFILE with a {len}-byte body");
        f.check(
            errno_of(&a) == Some(libc::EINVAL),
            format!("{what}: want EINVAL, got {a:?}"),
        );
        f.survived(&mut h, &what, &a);
    }
    for name in [
        &b""[..],
        b"/",
        b"x\0",
        b"//\0",
        b"/\0\0",
        b"../x\0",
        &[b'a'; 300],
    ] {
        let body = Body::new().bytes(&create_in(libc::O_RDWR)).bytes(name).0;
        let a = tmpfile(&mut h, 1, &body, ROOM);
        let what = format!("TMPFILE named {:?}", String::from_utf8_lossy(name));
        f.check(
            errno_of(&a) == Some(libc::EINVAL),
            format!("{what}: want EINVAL, got {a:?}"),
        );
        f.survived(&mut h, &what, &a);
    }
    for n in [0u64, 2, 4096, 1 << 32, u64::MAX] {
        let a = tmpfile(&mut h, n, &good, ROOM);
        let what = format!("TMPFILE in node {n:#x}");
        f.check(refused(&a), format!("{what}: want an errno, got {a:?}"));
        f.survived(&mut h, &what, &a);
    }
    let file = h.lookup(1, b"f").entry().expect("lookup f").0;
    let a = tmpfile(&mut h, file, &good, ROOM);
    f.check(
        errno_of(&a) == Some(libc::ENOTDIR),
        format!("TMPFILE in a file: want ENOTDIR, got {a:?}"),
    );
    f.survived(&mut h, "TMPFILE in a file", &a);
    let rdonly = Body::new().bytes(&create_in(libc::O_RDONLY)).name(b"/").0;
    let a = tmpfile(&mut h, 1, &rdonly, ROOM);
    f.check(
        errno_of(&a) == Some(libc::EINVAL),
        format!("TMPFILE O_RDONLY: want EINVAL, got {a:?}"),
    );
    for room in [16u32, 100, ROOM - 1] {
        let a = tmpfile(&mut h, 1, &good, room);
        let what = format!("TMPFILE with {room} bytes of reply room");
        f.check(refused(&a), format!("{what}: want it refused, got {a:?}"));
        f.survived(&mut h, &what, &a);
    }
    // The daemon's own names: not there for LOOKUP, and no request makes or moves one.
    let private = b".ceph-virtiofsd-tmpfile.0.0";
    let a = h.lookup(1, private);
    f.check(
        a.entry().is_none() && a.error().is_some(),
        format!("LOOKUP of a private name: want no entry, got {a:?}"),
    );
    let mkdir = Body::new().u32(0o755).u32(0).name(private).0;
    let a = h.req(op::FUSE_MKDIR, 1, &mkdir);
    f.check(
        errno_of(&a) == Some(libc::EPERM),
        format!("MKDIR of a private name: want EPERM, got {a:?}"),
    );
    let rename = Body::new().u64(1).name(b"f").name(private).0;
    let a = h.req(op::FUSE_RENAME, 1, &rename);
    f.check(
        errno_of(&a) == Some(libc::EPERM),
        format!("RENAME onto a private name: want EPERM, got {a:?}"),
    );
    let a = h.req(op::FUSE_UNLINK, 1, &Body::new().name(private).0);
    f.check(
        errno_of(&a) == Some(libc::EPERM),
        format!("UNLINK of a private name: want EPERM, got {a:?}"),
    );
    // A good one: entry and handle, nlink 0, then a LINK names it.
    let a = tmpfile(&mut h, 1, &good, ROOM);
    let nlink = a
        .payload()
        .get(104..108)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()));
    f.check(
        a.entry().is_some() && nlink == Some(0) && a.payload().len() == 128 + 16,
        format!("TMPFILE in the export root: want an entry with nlink 0 and a handle, got {a:?}"),
    );
    f.survived(&mut h, "TMPFILE in the export root", &a);
    if let Some((node, _)) = a.entry() {
        let link = Body::new().u64(node).name(b"named").0;
        let a = h.req(op::FUSE_LINK, 1, &link);
        f.check(
            a.entry().map(|e| e.0) == Some(node),
            format!("LINK of a tmpfile: want its entry, got {a:?}"),
        );
        f.check(
            h.lookup(1, b"named").entry().map(|e| e.0) == Some(node),
            "the linked tmpfile is not found by its name",
        );
    }
    let excl = Body::new()
        .bytes(&create_in(libc::O_RDWR | libc::O_EXCL))
        .name(b"")
        .0;
    let a = tmpfile(&mut h, 1, &excl, ROOM);
    if let Some((node, _)) = a.entry() {
        let link = Body::new().u64(node).name(b"excl").0;
        let a = h.req(op::FUSE_LINK, 1, &link);
        f.check(
            errno_of(&a) == Some(libc::ENOENT),
            format!("LINK of an O_EXCL tmpfile: want ENOENT, got {a:?}"),
        );
    } else {
        f.check(false, format!("TMPFILE O_EXCL: want an entry, got {a:?}"));
    }
    f.assert_none(&daemon);
}

/// SETXATTR in both sizes of `fuse_setxattr_in`: 8 bytes (size, flags) until an INIT offers
/// FUSE_SETXATTR_EXT, which the daemon takes (its INIT reply says so) although fuse-backend-rs
/// does not know it, then 16 (with setxattr_flags), decoded by the daemon itself; a body
/// short of either, a value of another size than declared and a name without its NUL are
/// EINVAL; an INIT without the flag brings the short form back. The daemon keeps serving.
#[test]
fn hostile_setxattr_in_both_struct_sizes_is_decoded_as_negotiated() {
    const SETXATTR_EXT: u32 = 1 << 29;
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-setxattr", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let mut f = Failures::new();
    let init = |h: &mut Hostile, flags: u32| {
        let body = Body::new()
            .u32(7)
            .u32(38)
            .u32(0)
            .u32(flags)
            .bytes(&[0; 48])
            .0;
        let u = h.next_unique();
        let a = h.raw(1, &request(op::FUSE_INIT, u, 0, None, &body), REPLY);
        a.payload()
            .get(12..16)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let short = |name: &[u8], value: &[u8], flags: u32| {
        Body::new()
            .u32(value.len() as u32)
            .u32(flags)
            .name(name)
            .bytes(value)
            .0
    };
    let long = |name: &[u8], value: &[u8], flags: u32, sx: u32| {
        Body::new()
            .u32(value.len() as u32)
            .u32(flags)
            .u32(sx)
            .u32(0)
            .name(name)
            .bytes(value)
            .0
    };
    let getxattr = |h: &mut Hostile, node: u64, name: &[u8]| {
        let a = h.req(
            op::FUSE_GETXATTR,
            node,
            &Body::new().u32(256).u32(0).name(name).0,
        );
        (a.error() == Some(0)).then(|| a.payload().to_vec())
    };
    // The hostile frontend's INIT offers no SETXATTR_EXT: the short form.
    let file = h.lookup(1, b"f").entry().expect("lookup f").0;
    let a = h.req(op::FUSE_SETXATTR, file, &short(b"user.short", b"one", 0));
    f.check(
        errno_of(&a) == Some(0),
        format!("SETXATTR, short form: want success, got {a:?}"),
    );
    f.check(
        getxattr(&mut h, file, b"user.short").as_deref() == Some(&b"one"[..]),
        "the short form's value does not read back",
    );
    // An INIT offering SETXATTR_EXT: the daemon takes it.
    let flags = init(&mut h, SETXATTR_EXT);
    f.check(
        flags.is_some_and(|fl| fl & SETXATTR_EXT != 0),
        format!("INIT offering SETXATTR_EXT: want it in the reply's flags, got {flags:x?}"),
    );
    let file = h.lookup(1, b"f").entry().expect("lookup f").0;
    for sx in [0u32, 1, 0xffff_ffff] {
        let a = h.req(
            op::FUSE_SETXATTR,
            file,
            &long(
                b"user.long",
                b"twenty-two",
                libc::XATTR_CREATE as u32 * u32::from(sx == 0),
                sx,
            ),
        );
        f.check(
            errno_of(&a) == Some(0),
            format!("SETXATTR, long form, setxattr_flags {sx:#x}: want success, got {a:?}"),
        );
    }
    f.check(
        getxattr(&mut h, file, b"user.long").as_deref() == Some(&b"twenty-two"[..]),
        "the long form's value does not read back",
    );
    let a = h.req(
        op::FUSE_SETXATTR,
        file,
        &long(b"user.long", b"x", libc::XATTR_CREATE as u32, 0),
    );
    f.check(
        errno_of(&a) == Some(libc::EEXIST),
        format!("SETXATTR, long form, XATTR_CREATE of an existing name: want EEXIST, got {a:?}"),
    );
    let good = long(b"user.long", b"v", 0, 0);
    let mut bad: Vec<(String, Vec<u8>)> = vec![
        ("a body of 12 bytes".into(), good[..12].to_vec()),
        ("a body of 15 bytes".into(), good[..15].to_vec()),
        (
            "a name without its NUL".into(),
            Body::new().u32(0).u32(0).u32(0).u32(0).bytes(b"user.x").0,
        ),
        (
            "a value shorter than declared".into(),
            long(b"user.x", b"abc", 0, 0),
        ),
    ];
    let mut wrong_size = long(b"user.x", b"abc", 0, 0);
    wrong_size[0] = 2;
    bad.push(("a value longer than declared".into(), wrong_size));
    bad[3].1[0] = 9;
    for (what, body) in bad {
        let a = h.req(op::FUSE_SETXATTR, file, &body);
        let what = format!("SETXATTR, long form, {what}");
        f.check(
            errno_of(&a) == Some(libc::EINVAL),
            format!("{what}: want EINVAL, got {a:?}"),
        );
        f.survived(&mut h, &what, &a);
    }
    for n in [0u64, 2, 1 << 32, u64::MAX] {
        let a = h.req(op::FUSE_SETXATTR, n, &good);
        let what = format!("SETXATTR, long form, of node {n:#x}");
        f.check(refused(&a), format!("{what}: want an errno, got {a:?}"));
        f.survived(&mut h, &what, &a);
    }
    // An INIT without the flag: the short form again.
    let flags = init(&mut h, 0);
    f.check(
        flags.is_some_and(|fl| fl & SETXATTR_EXT == 0),
        format!("INIT without SETXATTR_EXT: want it off, got {flags:x?}"),
    );
    let file = h.lookup(1, b"f").entry().expect("lookup f").0;
    let a = h.req(op::FUSE_SETXATTR, file, &short(b"user.again", b"3", 0));
    f.check(
        errno_of(&a) == Some(0)
            && getxattr(&mut h, file, b"user.again").as_deref() == Some(&b"3"[..]),
        format!("SETXATTR, short form after a plain INIT: want success, got {a:?}"),
    );
    f.assert_none(&daemon);
}

#[test]
fn hostile_malformed_headers_are_refused_and_the_daemon_keeps_serving() {
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-headers", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let mut f = Failures::new();
    let getattr = Body::new().u32(0).u32(0).u64(0).0;
    let lookup = Body::new().name(b"f").0;
    // A header whose length is shorter than a header, or longer than what the chain holds:
    // never served as if it were whole.
    for (o, body) in [(op::FUSE_GETATTR, &getattr), (op::FUSE_LOOKUP, &lookup)] {
        let real = (40 + body.len()) as u32;
        for len in [0, 1, 8, 39, real + 1, real + 4096, 1 << 20, u32::MAX] {
            let u = h.next_unique();
            let a = h.raw(1, &request(o, u, 1, Some(len), body), REPLY);
            let what = format!("opcode {o} with header len {len} (real {real})");
            f.check(
                a.error() != Some(0),
                format!("{what}: served as a whole request: {a:?}"),
            );
            f.survived(&mut h, &what, &a);
        }
    }
    // Fewer bytes than a header at all.
    for n in [0usize, 1, 8, 39] {
        let u = h.next_unique();
        let bytes = request(op::FUSE_GETATTR, u, 1, None, &getattr);
        let a = h.raw(1, &bytes[..n], REPLY);
        let what = format!("a {n}-byte request");
        f.check(
            a.error() != Some(0),
            format!("{what}: answered with success: {a:?}"),
        );
        f.survived(&mut h, &what, &a);
    }
    // Unique 0 (reserved for notifications) and a unique reused from the last request.
    for u in [0u64, u64::MAX] {
        let a = h.raw(1, &request(op::FUSE_GETATTR, u, 1, None, &getattr), REPLY);
        f.survived(&mut h, &format!("GETATTR with unique {u}"), &a);
    }
    // A second FUSE_INIT with a major version that does not exist, then a normal one.
    for major in [0u32, 6, 8, u32::MAX, 7] {
        let body = Body::new()
            .u32(major)
            .u32(38)
            .u32(0)
            .u32(0)
            .bytes(&[0; 48])
            .0;
        let u = h.next_unique();
        let a = h.raw(1, &request(op::FUSE_INIT, u, 0, None, &body), REPLY);
        f.survived(&mut h, &format!("INIT with major {major}"), &a);
    }
    f.assert_none(&daemon);
}

#[test]
fn hostile_malformed_chains_are_returned_and_the_daemon_keeps_serving() {
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-chains", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    h.set_timeout_ms(20_000);
    let mut f = Failures::new();
    let u = h.next_unique();
    let g = common::hostile::hex(&request(
        op::FUSE_GETATTR,
        u,
        1,
        None,
        &Body::new().u32(0).u32(0).u64(0).0,
    ));
    let half = g.len() / 2 / 2 * 2;
    let mut long = String::new();
    for i in 0..(g.len() / 2) {
        long.push_str(&format!("r:{} ", &g[2 * i..2 * i + 2]));
    }
    // 1023 descriptors in all: the most a 1024-entry queue can chain, still a valid chain.
    let mut longest = long.clone();
    for _ in 0..(1023 - g.len() / 2 - 1) {
        longest.push_str("r: ");
    }
    longest.push_str(&format!("w:{REPLY}"));
    let cases: Vec<(&str, String)> = vec![
        ("no writable descriptor", format!("r:{g}")),
        ("a 1-byte writable buffer", format!("r:{g} w:1")),
        ("a 15-byte writable buffer", format!("r:{g} w:15")),
        ("writable before readable", format!("w:{REPLY} r:{g}")),
        ("only a writable descriptor", format!("w:{REPLY}")),
        (
            "readable bytes outside guest memory",
            format!("x:oob:{} w:{REPLY}", g.len() / 2),
        ),
        (
            "readable bytes straddling the end of guest memory",
            format!("x:edge:{} w:{REPLY}", g.len() / 2),
        ),
        (
            "header split, rest outside guest memory",
            format!("r:{} x:oob:64 w:{REPLY}", &g[..half]),
        ),
        (
            "writable buffer outside guest memory",
            format!("r:{g} xw:oob:4096"),
        ),
        (
            "writable buffer straddling the end of guest memory",
            format!("r:{g} xw:edge:4096"),
        ),
        (
            "writable buffer at address u64::MAX - 8",
            format!("r:{g} xw:0xfffffffffffffff7:4096"),
        ),
        (
            "readable length u32::MAX",
            format!("x:0:4294967295 w:{REPLY}"),
        ),
        ("a loop back to the head", format!("r:{g} w:{REPLY}/n=0")),
        (
            "a loop on the writable descriptor",
            format!("r:{g} w:{REPLY}/n=1"),
        ),
        (
            "next outside the descriptor table",
            format!("r:{g}/n=5000 w:{REPLY}"),
        ),
        ("next = 65535", format!("r:{g}/n=65535")),
        (
            "zero-length descriptors around the request",
            format!("r: r:{g} r: w:0 w:{REPLY}"),
        ),
        (
            "one descriptor per byte (valid)",
            format!("{long}w:{REPLY}"),
        ),
        ("1023 descriptors (valid)", longest),
        ("an indirect table (valid)", format!("[ r:{g} w:{REPLY} ]")),
        (
            "an indirect table with a loop",
            format!("[ r:{g} w:{REPLY}/n=0 ]"),
        ),
        (
            "an indirect table that is not a multiple of 16 bytes",
            "x:0x100000:17/f=4".to_string(),
        ),
        (
            "an indirect table of length 0",
            "x:0x100000:0/f=4".to_string(),
        ),
        (
            "an indirect table outside guest memory",
            "x:oob:32/f=4".to_string(),
        ),
        (
            "an indirect descriptor that also has NEXT",
            format!("[ r:{g} w:4096 ]/f=5 w:4096"),
        ),
        (
            "an indirect table holding an indirect descriptor",
            format!("[ r:{g} x:0x100000:32/f=4 ]"),
        ),
        (
            "a readable descriptor inside an indirect table after the writable one",
            format!("[ w:{REPLY} r:{g} ]"),
        ),
        (
            "flags with every bit set",
            format!("r:{g}/f=65535 w:{REPLY}"),
        ),
    ];
    for (what, tokens) in &cases {
        let a = h.chain(1, tokens);
        if let Answer::Done { written, .. } = &a {
            f.check(
                *written <= REPLY,
                format!("{what}: claims {written} bytes written"),
            );
        }
        f.survived(&mut h, what, &a);
    }
    // The same on the hiprio queue, and a normal request there.
    for (what, tokens) in cases.iter().take(6) {
        let a = h.chain(0, tokens);
        f.survived(&mut h, &format!("hiprio: {what}"), &a);
    }
    f.assert_none(&daemon);
}

#[test]
fn hostile_unknown_node_ids_and_handles_are_refused() {
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-ids", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let mut f = Failures::new();
    let bogus_nodes = [0u64, 2, 3, 4096, 1 << 32, u64::MAX - 1, u64::MAX];
    for n in bogus_nodes {
        for (name, a) in [
            ("GETATTR", h.getattr(n)),
            ("LOOKUP f", h.lookup(n, b"f")),
            ("LOOKUP ..", h.lookup(n, b"..")),
            ("OPENDIR", h.opendir(n)),
            ("OPEN", h.open(n, libc::O_RDONLY as u32)),
            (
                "MKDIR",
                h.req(
                    op::FUSE_MKDIR,
                    n,
                    &Body::new().u32(0o755).u32(0).name(b"m").0,
                ),
            ),
        ] {
            let what = format!("{name} on node {n:#x}");
            f.check(refused(&a), format!("{what}: not refused: {a:?}"));
            f.survived(&mut h, &what, &a);
        }
    }
    // Handles nobody opened, on a real file and directory.
    let file = h.lookup(1, b"f").entry().expect("lookup f").0;
    let dir = h.lookup(1, b"d").entry().expect("lookup d").0;
    for fh in [0u64, 1, 2, 12345, 1 << 40, u64::MAX] {
        for (name, a) in [
            ("READ", h.read(file, fh, 0, 4096)),
            (
                "WRITE",
                h.req(
                    op::FUSE_WRITE,
                    file,
                    &Body::new()
                        .u64(fh)
                        .u64(0)
                        .u32(3)
                        .u32(0)
                        .u64(0)
                        .u32(0)
                        .u32(0)
                        .bytes(b"abc")
                        .0,
                ),
            ),
            ("READDIRPLUS", h.readdirplus(dir, fh)),
            (
                "READDIRPLUS on a file handle's node",
                h.readdirplus(file, fh),
            ),
            (
                "FLUSH",
                h.req(
                    op::FUSE_FLUSH,
                    file,
                    &Body::new().u64(fh).u32(0).u32(0).u64(0).0,
                ),
            ),
            (
                "GETLK",
                h.req(
                    op::FUSE_GETLK,
                    file,
                    &Body::new()
                        .u64(fh)
                        .u64(1)
                        .u64(0)
                        .u64(10)
                        .u32(libc::F_WRLCK as u32)
                        .u32(1)
                        .u32(0)
                        .u32(0)
                        .0,
                ),
            ),
        ] {
            let what = format!("{name} with handle {fh:#x}");
            f.check(refused(&a), format!("{what}: not refused: {a:?}"));
            f.survived(&mut h, &what, &a);
        }
        // RELEASE of a handle never opened: answered (nothing to release), never a crash.
        let a = h.release(file, fh, false);
        f.survived(&mut h, &format!("RELEASE of handle {fh:#x}"), &a);
        let a = h.release(dir, fh, true);
        f.survived(&mut h, &format!("RELEASEDIR of handle {fh:#x}"), &a);
    }
    // A directory handle used as a file handle and the other way round.
    let dfh = h.opendir(dir).fh().expect("opendir d");
    let ffh = h.open(file, libc::O_RDWR as u32).fh().expect("open f");
    let a = h.read(file, dfh, 0, 16);
    f.check(
        a.error() != Some(0),
        format!("READ with a directory's handle: {a:?}"),
    );
    f.survived(&mut h, "READ with a directory's handle", &a);
    let a = h.readdirplus(dir, ffh);
    f.check(
        a.error() != Some(0),
        format!("READDIRPLUS with a file's handle: {a:?}"),
    );
    f.survived(&mut h, "READDIRPLUS with a file's handle", &a);
    // FORGET of nodes never handed out, of the root, and with absurd counts.
    let a = h.forget(&[
        (0, 1),
        (1, u64::MAX),
        (u64::MAX, 1),
        (file, u64::MAX),
        (12345, 0),
    ]);
    f.survived(&mut h, "BATCH_FORGET of unknown nodes and the root", &a);
    let a = h.getattr(1);
    f.check(
        a.error() == Some(0),
        format!("root after forgetting it: {a:?}"),
    );
    let u = h.next_unique();
    let a = h.raw(
        0,
        &request(
            op::FUSE_BATCH_FORGET,
            u,
            0,
            None,
            &Body::new().u32(u32::MAX).u32(0).u64(1).u64(1).0,
        ),
        0,
    );
    f.survived(&mut h, "BATCH_FORGET claiming 4 billion entries", &a);
    f.assert_none(&daemon);
}

#[test]
fn hostile_names_with_slash_overlong_or_unterminated_are_refused() {
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-names", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let mut f = Failures::new();
    let long = vec![b'n'; 256];
    let very_long = vec![b'n'; 5000];
    let names: Vec<(&str, Vec<u8>, bool)> = vec![
        ("'/'", b"/".to_vec(), true),
        ("'d/f'", b"d/f".to_vec(), true),
        ("'../other'", b"../other".to_vec(), true),
        ("'d/../../other'", b"d/../../other".to_vec(), true),
        ("256 bytes", long.clone(), true),
        ("5000 bytes", very_long.clone(), true),
        ("empty", Vec::new(), true),
        ("no NUL", b"f".to_vec(), false),
        ("no NUL, 256 bytes", long.clone(), false),
    ];
    for (what, name, nul) in &names {
        let n = |b: Body| if *nul { b.name(name) } else { b.bytes(name) };
        let attempts = [
            ("LOOKUP", h.req(op::FUSE_LOOKUP, 1, &n(Body::new()).0)),
            (
                "MKDIR",
                h.req(op::FUSE_MKDIR, 1, &n(Body::new().u32(0o755).u32(0)).0),
            ),
            (
                "MKNOD",
                h.req(
                    op::FUSE_MKNOD,
                    1,
                    &n(Body::new().u32(libc::S_IFREG | 0o644).u32(0).u32(0).u32(0)).0,
                ),
            ),
            (
                "CREATE",
                h.req(
                    op::FUSE_CREATE,
                    1,
                    &n(Body::new()
                        .u32(libc::O_RDWR as u32 | libc::O_CREAT as u32)
                        .u32(0o644)
                        .u32(0)
                        .u32(0))
                    .0,
                ),
            ),
            (
                "SYMLINK",
                h.req(op::FUSE_SYMLINK, 1, &n(Body::new()).name(b"f").0),
            ),
            ("UNLINK", h.req(op::FUSE_UNLINK, 1, &n(Body::new()).0)),
            ("RMDIR", h.req(op::FUSE_RMDIR, 1, &n(Body::new()).0)),
            (
                "RENAME f to it",
                h.req(op::FUSE_RENAME, 1, &n(Body::new().u64(1).name(b"f")).0),
            ),
        ];
        for (opname, a) in attempts {
            let w = format!("{opname} of a name {what}");
            // Refused with an errno in a reply: a chain returned empty would leave a guest's
            // request waiting.
            f.check(
                errno_of(&a).is_some_and(|e| e > 0),
                format!("{w}: not answered with an errno: {a:?}"),
            );
            f.survived(&mut h, &w, &a);
        }
    }
    // Nothing with such a name appeared, here or next to the export.
    let m = lab.ceph();
    let perm = ceph_client::UserPerm::root();
    for dir in [export.clone(), export.trim_end_matches("/data").to_owned()] {
        let mut cur = m.lookup_root().unwrap();
        for p in dir.split('/').filter(|p| !p.is_empty()) {
            cur = m
                .lookup(
                    &cur,
                    &common::c(p),
                    ceph_client::CEPH_STATX_BASIC_STATS,
                    0,
                    &perm,
                )
                .unwrap()
                .0;
        }
        let mut d = m.opendir(&cur, &perm).unwrap();
        while let Some(e) = d
            .readdirplus(ceph_client::CEPH_STATX_BASIC_STATS, 0, false)
            .unwrap()
        {
            f.check(
                e.name.len() <= 255 && !e.name.contains(&b'/') && !e.name.is_empty(),
                format!(
                    "{dir} holds an entry named {:?}",
                    String::from_utf8_lossy(&e.name)
                ),
            );
        }
    }
    f.assert_none(&daemon);
}

#[test]
fn hostile_offsets_past_i64_are_refused() {
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-offsets", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let mut f = Failures::new();
    let file = h.lookup(1, b"f").entry().expect("lookup f").0;
    let fh = h.open(file, libc::O_RDWR as u32).fh().expect("open f");
    let dir = h.lookup(1, b"d").entry().expect("lookup d").0;
    let dfh = h.opendir(dir).fh().expect("opendir d");
    for off in [1u64 << 63, (1u64 << 63) + 4096, u64::MAX - 4095, u64::MAX] {
        let attempts = vec![
            ("READ", h.read(file, fh, off, 4096)),
            (
                "WRITE",
                h.req(
                    op::FUSE_WRITE,
                    file,
                    &Body::new()
                        .u64(fh)
                        .u64(off)
                        .u32(3)
                        .u32(0)
                        .u64(0)
                        .u32(0)
                        .u32(0)
                        .bytes(b"abc")
                        .0,
                ),
            ),
            (
                "LSEEK SEEK_SET",
                h.req(
                    op::FUSE_LSEEK,
                    file,
                    &Body::new().u64(fh).u64(off).u32(0).u32(0).0,
                ),
            ),
            (
                "LSEEK SEEK_DATA",
                h.req(
                    op::FUSE_LSEEK,
                    file,
                    &Body::new().u64(fh).u64(off).u32(3).u32(0).0,
                ),
            ),
            (
                "FALLOCATE",
                h.req(
                    op::FUSE_FALLOCATE,
                    file,
                    &Body::new().u64(fh).u64(off).u64(4096).u32(0).u32(0).0,
                ),
            ),
            (
                "FALLOCATE at 0 with that length",
                h.req(
                    op::FUSE_FALLOCATE,
                    file,
                    &Body::new().u64(fh).u64(0).u64(off).u32(0).u32(0).0,
                ),
            ),
            (
                "COPY_FILE_RANGE from it",
                h.req(
                    op::FUSE_COPY_FILE_RANGE,
                    file,
                    &Body::new()
                        .u64(fh)
                        .u64(off)
                        .u64(file)
                        .u64(fh)
                        .u64(0)
                        .u64(4096)
                        .u64(0)
                        .0,
                ),
            ),
            (
                "COPY_FILE_RANGE to it",
                h.req(
                    op::FUSE_COPY_FILE_RANGE,
                    file,
                    &Body::new()
                        .u64(fh)
                        .u64(0)
                        .u64(file)
                        .u64(fh)
                        .u64(off)
                        .u64(4096)
                        .u64(0)
                        .0,
                ),
            ),
            (
                "SETATTR size",
                h.req(
                    op::FUSE_SETATTR,
                    file,
                    &Body::new()
                        .u32(1 << 3)
                        .u32(0)
                        .u64(0)
                        .u64(off)
                        .u64(0)
                        .u64(0)
                        .u64(0)
                        .u64(0)
                        .u32(0)
                        .u32(0)
                        .u32(0)
                        .u32(0)
                        .u32(0)
                        .u32(0)
                        .u32(0)
                        .u32(0)
                        .0,
                ),
            ),
            (
                "SETLK start",
                h.req(
                    op::FUSE_SETLK,
                    file,
                    &Body::new()
                        .u64(fh)
                        .u64(7)
                        .u64(off)
                        .u64(u64::MAX)
                        .u32(libc::F_WRLCK as u32)
                        .u32(1)
                        .u32(0)
                        .u32(0)
                        .0,
                ),
            ),
        ];
        for (name, a) in attempts {
            let w = format!("{name} at {off:#x}");
            f.check(refused(&a), format!("{w}: not refused: {a:?}"));
            f.survived(&mut h, &w, &a);
        }
        // A directory offset nobody handed out: an error or an empty listing, never a crash.
        let a = h.req(
            op::FUSE_READDIRPLUS,
            dir,
            &Body::new()
                .u64(dfh)
                .u64(off)
                .u32(4096)
                .u32(0)
                .u64(0)
                .u32(0)
                .u32(0)
                .0,
        );
        f.survived(&mut h, &format!("READDIRPLUS at {off:#x}"), &a);
    }
    // The file is unchanged in size.
    let a = h.getattr(file);
    let size = a
        .payload()
        .get(16 + 8..16 + 16)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    f.check(
        size == Some(6),
        format!("size of f after the attacks: {size:?}"),
    );
    f.assert_none(&daemon);
}

/// LOOKUP `name` in `parent`; the (node, ino) it hands out, judged by the oracle.
fn walk(h: &mut Hostile, f: &mut Failures, parent: u64, name: &str) -> Option<(u64, u64)> {
    let a = h.lookup(parent, name.as_bytes());
    let what = format!("LOOKUP {name:?} in node {parent}");
    f.survived(h, &what, &a);
    let e = a.entry();
    if let Some((_, ino)) = e {
        let v = h.oracle(ino);
        f.check(
            v == "inside",
            format!("{what}: handed out inode {ino:#x}: {v}"),
        );
    }
    e
}

#[test]
fn hostile_dotdot_of_the_export_root_is_the_export_root() {
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-dotdot-root", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let mut f = Failures::new();
    let root_ino = h.export_ino();
    for _ in 0..3 {
        let e = walk(&mut h, &mut f, 1, "..");
        f.check(
            e.map(|x| x.1) == Some(root_ino),
            format!("\"..\" of the root: {e:x?}, want ino {root_ino:#x}"),
        );
    }
    // And from a subdirectory, "..", "..", "..".
    let d = walk(&mut h, &mut f, 1, "d").expect("lookup d").0;
    let up = walk(&mut h, &mut f, d, "..").expect("lookup d/..");
    f.check(up.1 == root_ino, format!("\"..\" of d: {up:x?}"));
    let up2 = walk(&mut h, &mut f, up.0, "..");
    f.check(
        up2.map(|x| x.1) == Some(root_ino),
        format!("\"..\" of d/..: {up2:x?}"),
    );
    f.assert_none(&daemon);
}

#[test]
fn hostile_dotdot_of_snap_stays_in_the_export() {
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-dotdot-snap", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let mut f = Failures::new();
    let root_ino = h.export_ino();
    // The walk: .snap, .., .., other, secret.
    let snap = walk(&mut h, &mut f, 1, ".snap")
        .expect("lookup .snap of the export root")
        .0;
    let mut cur = snap;
    for step in 0..3 {
        match walk(&mut h, &mut f, cur, "..") {
            Some((n, ino)) => {
                f.check(ino == root_ino, format!("\"..\" step {step} from .snap: inode {ino:#x}, want the export root {root_ino:#x}"));
                cur = n;
            }
            None => break,
        }
    }
    let other = h.lookup(cur, b"other");
    f.check(
        other.entry().is_none(),
        format!("\"other\" reachable from .snap/..: {other:?}"),
    );
    // ".snap" of a subdirectory, and its "..".
    let d = walk(&mut h, &mut f, 1, "d").expect("lookup d").0;
    if let Some((s, _)) = walk(&mut h, &mut f, d, ".snap") {
        walk(&mut h, &mut f, s, "..");
    }
    f.assert_none(&daemon);
}

#[test]
fn hostile_dotdot_of_a_snapshot_root_stays_in_the_export() {
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-dotdot-snapshot", &[]);
    // A snapshot of the export root, made by the operator.
    let m = lab.ceph();
    let perm = ceph_client::UserPerm::root();
    let mut cur = m.lookup_root().unwrap();
    for p in export.split('/').filter(|p| !p.is_empty()).chain([".snap"]) {
        cur = m
            .lookup(
                &cur,
                &common::c(p),
                ceph_client::CEPH_STATX_BASIC_STATS,
                0,
                &perm,
            )
            .unwrap()
            .0;
    }
    m.mkdir(
        &cur,
        &common::c("s1"),
        0o755,
        ceph_client::CEPH_STATX_BASIC_STATS,
        0,
        &perm,
    )
    .expect("mkdir .snap/s1 (snapshots enabled on the lab filesystem?)");
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let mut f = Failures::new();
    let root_ino = h.export_ino();
    let snap = walk(&mut h, &mut f, 1, ".snap").expect("lookup .snap").0;
    let s1 = walk(&mut h, &mut f, snap, "s1").expect("lookup .snap/s1").0;
    // ".." of the snapshot root is its .snap (the export root's inode number), and so on up.
    let mut node = s1;
    for step in 0..4 {
        match walk(&mut h, &mut f, node, "..") {
            Some((n, ino)) => {
                f.check(
                    ino == root_ino,
                    format!("\"..\" step {step} from .snap/s1: inode {ino:#x}, want {root_ino:#x}"),
                );
                node = n;
            }
            None => break,
        }
    }
    // Inside the snapshot: d, and d/.. back to the snapshot root.
    if let Some((d, _)) = walk(&mut h, &mut f, s1, "d") {
        if let Some((up, _)) = walk(&mut h, &mut f, d, "..") {
            walk(&mut h, &mut f, up, "..");
        }
    }
    // READDIRPLUS of .snap hands out only inodes inside.
    if let Some(fh) = h.opendir(snap).fh() {
        let a = h.readdirplus(snap, fh);
        f.survived(&mut h, "READDIRPLUS of .snap", &a);
    }
    m.rmdir(&cur, &common::c("s1"), &perm)
        .expect("remove the snapshot");
    f.assert_none(&daemon);
}

#[test]
fn hostile_lookups_and_opens_without_forget_or_release_grow_the_tables() {
    use common::hostile::daemon_stats;
    let lab = Lab::get();
    let (daemon, export, metrics) = hostile_daemon(&lab, "hostile-growth", &[]);
    // N files, made from the side (faster than through the daemon).
    const N: u64 = 300;
    {
        let m = lab.ceph();
        let perm = ceph_client::UserPerm::root();
        let mut cur = m.lookup_root().unwrap();
        for p in export.split('/').filter(|p| !p.is_empty()) {
            cur = m
                .lookup(
                    &cur,
                    &common::c(p),
                    ceph_client::CEPH_STATX_BASIC_STATS,
                    0,
                    &perm,
                )
                .unwrap()
                .0;
        }
        for i in 0..N {
            m.create(
                &cur,
                &common::c(&format!("g{i}")),
                0o644,
                libc::O_RDWR | libc::O_CREAT,
                ceph_client::CEPH_STATX_BASIC_STATS,
                0,
                &perm,
            )
            .unwrap();
        }
    }
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let base = daemon_stats(&daemon, &metrics);
    let mut nodes = Vec::new();
    for i in 0..N {
        let e = h
            .lookup(1, format!("g{i}").as_bytes())
            .entry()
            .expect("lookup");
        nodes.push(e.0);
    }
    let looked = daemon_stats(&daemon, &metrics);
    let mut handles = Vec::new();
    for &n in &nodes {
        handles.push((n, h.open(n, libc::O_RDONLY as u32).fh().expect("open")));
    }
    // And N more opens of one file.
    for _ in 0..N {
        handles.push((
            nodes[0],
            h.open(nodes[0], libc::O_RDONLY as u32).fh().expect("open"),
        ));
    }
    let opened = daemon_stats(&daemon, &metrics);
    println!(
        "hostile growth: base {base:?}, after {N} lookups {looked:?}, after {} opens {opened:?}",
        2 * N
    );
    assert!(
        looked.nodes >= base.nodes + N,
        "{N} lookups without FORGET: nodes {} -> {}",
        base.nodes,
        looked.nodes
    );
    assert!(
        opened.handles >= base.handles + 2 * N,
        "{} opens without RELEASE: handles {} -> {}",
        2 * N,
        base.handles,
        opened.handles
    );
    // Given back, the tables shrink to where they were: nothing leaks.
    for &(n, fh) in &handles {
        assert_eq!(h.release(n, fh, false).error(), Some(0));
    }
    let pairs: Vec<(u64, u64)> = nodes.iter().map(|&n| (n, 1)).collect();
    h.forget(&pairs);
    assert!(h.alive());
    let after = daemon_stats(&daemon, &metrics);
    println!("hostile growth: after RELEASE and FORGET of everything {after:?}");
    assert_eq!(
        after.handles, base.handles,
        "handles left after releasing all"
    );
    assert_eq!(after.nodes, base.nodes, "nodes left after forgetting all");
    assert!(!daemon.log_text().contains("panicked"));
}

#[test]
fn hostile_replies_the_guest_cannot_receive_leak_no_handle_or_node() {
    use common::hostile::daemon_stats;
    let lab = Lab::get();
    let (daemon, export, metrics) = hostile_daemon(&lab, "hostile-undelivered", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let file = h.lookup(1, b"f").entry().expect("lookup f").0;
    let base = daemon_stats(&daemon, &metrics);
    // OPEN, OPENDIR and LOOKUP whose writable buffer cannot hold the reply (15 bytes: not even
    // the reply header), or lies outside guest memory: the guest never learns the handle or
    // node id, so it can never release or forget it.
    for (i, tokens) in ["w:15", "xw:oob:4096", "w:0"].iter().enumerate() {
        for _ in 0..20 {
            let u = h.next_unique();
            let open = request(op::FUSE_OPEN, u, file, None, &Body::new().u32(0).u32(0).0);
            let a = h.chain(1, &format!("r:{} {tokens}", common::hostile::hex(&open)));
            assert!(
                !matches!(a, Answer::Lost | Answer::Bogus(_)),
                "case {i}: {a:?}"
            );
            let u = h.next_unique();
            let opendir = request(op::FUSE_OPENDIR, u, 1, None, &Body::new().u32(0).u32(0).0);
            h.chain(1, &format!("r:{} {tokens}", common::hostile::hex(&opendir)));
            let u = h.next_unique();
            let lookup = request(op::FUSE_LOOKUP, u, 1, None, &Body::new().name(b"d").0);
            h.chain(1, &format!("r:{} {tokens}", common::hostile::hex(&lookup)));
        }
    }
    assert!(h.alive());
    let after = daemon_stats(&daemon, &metrics);
    println!("hostile undelivered replies: before {base:?}, after {after:?}");
    assert_eq!(
        after.handles, base.handles,
        "60 OPEN and 60 OPENDIR whose replies could not be delivered left handles behind"
    );
    assert_eq!(
        after.nodes, base.nodes,
        "60 LOOKUP whose replies could not be delivered left nodes behind"
    );
}

#[test]
fn hostile_mknod_of_a_directory_type_is_refused_and_the_mds_survives() {
    // On a cluster of its own: on Pacific one MKNOD of type S_IFDIR that reaches the MDS
    // aborts it (C_MDS_mknod_finish: ceph_assert(dir)), taking CephFS down for every client.
    let shared = Lab::get();
    let private = common::hostile::PrivateCluster::start(&shared, "hostile-mknod-dir-cluster");
    let lab = &private.lab;
    let (daemon, export, _m) = hostile_daemon(lab, "hostile-mknod-dir", &[]);
    let mut h = Hostile::connect(lab, &daemon, &export, &[]);
    h.set_timeout_ms(20_000);
    let mut f = Failures::new();
    for (what, mode) in [
        ("S_IFDIR", libc::S_IFDIR | 0o755),
        ("every type bit (0o170000)", libc::S_IFMT | 0o644),
    ] {
        let a = h.req(
            op::FUSE_MKNOD,
            1,
            &Body::new()
                .u32(mode)
                .u32(0)
                .u32(0)
                .u32(0)
                .name(format!("m{mode:o}").as_bytes())
                .0,
        );
        let (healthy, status) = private.healthy();
        f.check(
            healthy,
            format!("MKNOD of type {what}: the MDS is down afterwards:\n{status}"),
        );
        if !healthy {
            break;
        }
        f.check(
            refused(&a),
            format!("MKNOD of type {what}: not refused: {a:?}"),
        );
        f.survived(&mut h, &format!("MKNOD of type {what}"), &a);
    }
    f.assert_none(&daemon);
}

#[test]
fn hostile_truncate_of_a_directory_is_refused() {
    // On a cluster of its own: the Pacific MDS takes a size change of a directory ("unmatched
    // rstat" errors follow), and the fuzzer saw it die of SIGFPE in Filer::truncate after one.
    let shared = Lab::get();
    let private = common::hostile::PrivateCluster::start(&shared, "hostile-dir-size-cluster");
    let lab = &private.lab;
    let (daemon, export, _m) = hostile_daemon(lab, "hostile-dir-size", &[]);
    let mut h = Hostile::connect(lab, &daemon, &export, &[]);
    h.set_timeout_ms(20_000);
    let mut f = Failures::new();
    let d = h.lookup(1, b"d").entry().expect("lookup d").0;
    for (node, what) in [(1u64, "the export root"), (d, "a subdirectory")] {
        for size in [1u64 << 20, 10, 0] {
            // SETATTR with FATTR_SIZE, as root.
            let body = Body::new()
                .u32(1 << 3)
                .u32(0)
                .u64(0)
                .u64(size)
                .bytes(&[0; 64])
                .0;
            let a = h.req_as_root(op::FUSE_SETATTR, node, &body);
            let w = format!("SETATTR size {size} of {what}");
            f.check(
                errno_of(&a) == Some(libc::EISDIR),
                format!("{w}: want EISDIR, got {a:?}"),
            );
            f.survived(&mut h, &w, &a);
            let (healthy, status) = private.healthy();
            f.check(
                healthy,
                format!("{w}: the MDS is down afterwards:\n{status}"),
            );
        }
    }
    f.assert_none(&daemon);
}

#[test]
fn hostile_a_file_as_the_parent_of_a_name_gets_enotdir() {
    // libcephfs opens a directory structure on any inode it is handed as a parent, and
    // aborts (Inode::open_dir: ceph_assert(dentries.size() < 2)) when it is a file with two
    // cached names: the fuzzer's first daemon abort, a LINK into a hard-linked file.
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-file-parent", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    let mut f = Failures::new();
    let file = h.lookup(1, b"f").entry().expect("lookup f").0;
    let dir = h.lookup(1, b"d").entry().expect("lookup d").0;
    // Searchable (root's search of a file with no x bit fails before libcephfs gets that
    // far), with a second name, both names looked up so that both are cached.
    let chmod = Body::new()
        .u32(1) // FATTR_MODE
        .u32(0)
        .bytes(&[0; 48])
        .u32(0)
        .u32(0)
        .u32(0)
        .u32(libc::S_IFREG | 0o755)
        .bytes(&[0; 16])
        .0;
    let a = h.req_as_root(op::FUSE_SETATTR, file, &chmod);
    f.check(a.error() == Some(0), format!("SETATTR f mode 0755: {a:?}"));
    let a = h.req_as_root(op::FUSE_LINK, 1, &Body::new().u64(file).name(b"f2").0);
    f.check(a.error() == Some(0), format!("LINK f f2: {a:?}"));
    h.lookup(1, b"f2").entry().expect("lookup f2");
    let with_name = |head: Body| head.name(b"x").0;
    let cases: Vec<(&str, u32, u64, Vec<u8>)> = vec![
        ("LOOKUP", op::FUSE_LOOKUP, file, Body::new().name(b"x").0),
        (
            "MKDIR",
            op::FUSE_MKDIR,
            file,
            with_name(Body::new().u32(0o755).u32(0)),
        ),
        (
            "MKNOD",
            op::FUSE_MKNOD,
            file,
            with_name(Body::new().u32(libc::S_IFREG | 0o644).u32(0).u32(0).u32(0)),
        ),
        (
            "SYMLINK",
            op::FUSE_SYMLINK,
            file,
            Body::new().name(b"x").name(b"t").0,
        ),
        (
            "CREATE",
            op::FUSE_CREATE,
            file,
            with_name(
                Body::new()
                    .u32(libc::O_RDWR as u32)
                    .u32(0o644)
                    .u32(0)
                    .u32(0),
            ),
        ),
        // LINK: the header names the new parent, the body the node to link.
        (
            "LINK into it",
            op::FUSE_LINK,
            file,
            Body::new().u64(file).name(b"x").0,
        ),
        ("UNLINK", op::FUSE_UNLINK, file, Body::new().name(b"x").0),
        ("RMDIR", op::FUSE_RMDIR, file, Body::new().name(b"x").0),
        (
            "RENAME out of it",
            op::FUSE_RENAME,
            file,
            Body::new().u64(1).name(b"x").name(b"y").0,
        ),
        (
            "RENAME into it",
            op::FUSE_RENAME,
            1,
            Body::new().u64(file).name(b"f").name(b"y").0,
        ),
    ];
    for (what, o, node, body) in cases {
        // As root: libcephfs's own permission checks (EACCES for uid 1000 on a file without
        // search permission) come after it has opened the directory structure.
        let a = h.req_as_root(o, node, &body);
        let w = format!("{what} with the hard-linked file f as the directory");
        f.check(
            errno_of(&a) == Some(libc::ENOTDIR),
            format!("{w}: want ENOTDIR, got {a:?}"),
        );
        f.survived(&mut h, &w, &a);
    }
    // link(2) of a directory is EPERM (Linux), not a request for the MDS.
    let a = h.req(op::FUSE_LINK, 1, &Body::new().u64(dir).name(b"dl").0);
    f.check(
        errno_of(&a) == Some(libc::EPERM),
        format!("LINK of the directory d: want EPERM, got {a:?}"),
    );
    f.survived(&mut h, "LINK of a directory", &a);
    f.assert_none(&daemon);
}

#[test]
fn hostile_log_flood_into_a_stalled_stderr_does_not_kill_the_daemon() {
    // libcephfs makes the daemon's stderr non-blocking (Log::_configure_stderr); once a log
    // reader falls behind, a write fails with EAGAIN. Every request below is logged at error
    // level by fuse-backend-rs; the pipe holds 64 KiB, a few hundred lines.
    let lab = Lab::get();
    let export = common::hostile::hostile_tree(&lab, "hostile-log-flood");
    let work = lab.scratch("hostile-log-flood");
    let (mut daemon, _stalled) = common::hostile::daemon_with_stalled_stderr(
        &lab,
        &work,
        &export,
        &["--log-level", "error"],
    );
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    h.set_timeout_ms(20_000);
    let mut f = Failures::new();
    for i in 0..3000u32 {
        // LOOKUP of a name without its NUL: refused, and logged with the name's bytes.
        let a = h.req(op::FUSE_LOOKUP, 1, &[b'n'; 200]);
        if matches!(a, Answer::Lost | Answer::Bogus(_)) {
            f.check(false, format!("request {i} of the flood: {a:?}"));
            break;
        }
    }
    f.check(
        h.alive(),
        "the daemon stopped answering after the log flood",
    );
    let status = daemon.child.as_mut().unwrap().try_wait().unwrap();
    f.check(status.is_none(), format!("the daemon exited: {status:?}"));
    f.assert_none(&daemon);
}

/// A rename of a name onto itself, or onto another link of the same file, does nothing on
/// Linux; libcephfs 16 then drops the name from its cache, and a rename of a missing name after
/// that marks the name as being renamed for good, so that every later lookup of it waits
/// forever (ceph-client/tests/quirks.rs). The fuzzer's 10M run stalled this way, worker after
/// worker. Each rename must get Linux's answer, and lookups after them must come back.
#[test]
fn hostile_renames_onto_the_same_file_or_of_missing_names_keep_lookups_answering() {
    let lab = Lab::get();
    let (daemon, export, _m) = hostile_daemon(&lab, "hostile-rename-self", &[]);
    let mut h = Hostile::connect(&lab, &daemon, &export, &[]);
    h.set_timeout_ms(15_000);
    let mut f = Failures::new();
    let file = h.lookup(1, b"f").entry().expect("lookup f").0;
    let a = h.req_as_root(op::FUSE_LINK, 1, &Body::new().u64(file).name(b"f2").0);
    f.check(a.error() == Some(0), format!("LINK f f2: {a:?}"));
    let noreplace = libc::RENAME_NOREPLACE;
    let cases: [(u32, &[u8], &[u8], i32); 8] = [
        (0, b"f", b"f", 0),
        (0, b"f", b"f2", 0),
        (0, b"f2", b"f", 0),
        (0, b"nx", b"nx", libc::ENOENT),
        (noreplace, b"nx", b"nx", libc::ENOENT),
        (noreplace, b"nx", b"y", libc::ENOENT),
        (noreplace, b"f", b"f", libc::EEXIST),
        (noreplace, b"f", b"f2", libc::EEXIST),
    ];
    for (flags, from, to, want) in cases {
        let what = format!(
            "RENAME2 flags {flags} {} -> {}",
            String::from_utf8_lossy(from),
            String::from_utf8_lossy(to)
        );
        let a = h.req(
            op::FUSE_RENAME2,
            1,
            &Body::new().u64(1).u32(flags).u32(0).name(from).name(to).0,
        );
        f.survived(&mut h, &what, &a);
        f.check(
            errno_of(&a) == Some(want),
            format!("{what}: want errno {want}, got {a:?}"),
        );
        for (name, there) in [(from, from != b"nx"), (to, to == b"f" || to == b"f2")] {
            let l = h.lookup(1, name);
            // Not there: ENOENT, or a negative entry (node id 0).
            let ok = if there {
                l.entry().is_some()
            } else {
                matches!(errno_of(&l), Some(0 | libc::ENOENT)) && l.entry().is_none()
            };
            f.check(
                ok,
                format!(
                    "after {what}: LOOKUP {} (there: {there}): {l:?}",
                    String::from_utf8_lossy(name)
                ),
            );
        }
    }
    f.assert_none(&daemon);
}
