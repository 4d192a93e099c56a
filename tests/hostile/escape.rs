//! A hostile guest trying to leave its export, at the filesystem layer against the real cluster.
//!
//! The daemon exports `/<tag>/tenantA/data`; `/<tag>/tenantB/secret` is another tenant's. The
//! guest sends every LOOKUP, READDIRPLUS and node-creating request it can think of ("..", ".",
//! `.snap`, snapshots of the export and of its parent, and ".." chains from everything it
//! got). The oracle: every inode a reply names is resolved through a second libcephfs client
//! mounted at "/" and must lie in the export's subtree.

use std::collections::{BTreeSet, HashSet};
use std::ffi::CString;

use ceph_client::{Mount, MountBuilder, UserPerm, CEPH_STATX_BASIC_STATS};
use ceph_virtiofsd::fs::{CephFs, FsConfig};
use fuse_backend_rs::abi::fuse_abi::FsOptions;
use fuse_backend_rs::api::filesystem::{Entry, FileSystem};

use crate::common;
use crate::common::{c, ctx, errno, Lab};

/// mkdir -p of `path` (relative to `/`) with the "/" client; returns the last inode number.
fn mkdirs(m: &Mount, path: &str) -> u64 {
    let perm = UserPerm::root();
    let mut cur = m.lookup_root().unwrap();
    let mut ino = 1;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        let name = c(part);
        let (i, st) = match m.lookup(&cur, &name, CEPH_STATX_BASIC_STATS, 0, &perm) {
            Ok(r) => r,
            Err(_) => m
                .mkdir(&cur, &name, 0o777, CEPH_STATX_BASIC_STATS, 0, &perm)
                .unwrap(),
        };
        ino = st.stx_ino;
        cur = i;
    }
    ino
}

/// The oracle: the inode numbers of everything in the export's subtree, as the "/" client sees
/// it (head inodes; an inode of a snapshot has the number of its head, and nothing is removed
/// in these tests).
struct Oracle {
    m: Mount,
    export: String,
    inside: HashSet<u64>,
}

impl Oracle {
    fn new(m: Mount, export: &str) -> Oracle {
        let mut o = Oracle {
            m,
            export: export.to_owned(),
            inside: HashSet::new(),
        };
        o.refresh();
        o
    }

    fn refresh(&mut self) {
        let perm = UserPerm::root();
        let root = ceph_virtiofsd::quarantine::resolve(&self.m, &self.export, &perm).unwrap();
        let st = self
            .m
            .getattr(&root, CEPH_STATX_BASIC_STATS, 0, &perm)
            .unwrap();
        self.inside.clear();
        self.inside.insert(st.stx_ino);
        let mut todo = vec![root];
        while let Some(dir) = todo.pop() {
            let mut d = self.m.opendir(&dir, &perm).unwrap();
            while let Some(e) = d.readdirplus(CEPH_STATX_BASIC_STATS, 0, true).unwrap() {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                self.inside.insert(e.statx.stx_ino);
                if e.d_type == libc::DT_DIR {
                    todo.push(e.inode.unwrap());
                }
            }
        }
    }

    /// Whether inode number `ino` lies in the export (with a path for the message if not).
    fn check(&self, what: &str, ino: u64) {
        assert!(
            self.inside.contains(&ino),
            "ESCAPE: {what} names inode {ino:#x}, which is not in {} (its path from /: {})",
            self.export,
            self.path_of(ino)
        );
    }

    fn path_of(&self, ino: u64) -> String {
        let perm = UserPerm::root();
        let Ok(mut cur) = self.m.lookup_inode(ino) else {
            return "?".into();
        };
        let mut parts = Vec::new();
        let mut cur_ino = ino;
        for _ in 0..64 {
            let Ok((p, st)) = self
                .m
                .lookup(&cur, &c(".."), CEPH_STATX_BASIC_STATS, 0, &perm)
            else {
                break;
            };
            if st.stx_ino == cur_ino {
                break;
            }
            parts.push(format!("{cur_ino:#x}"));
            cur_ino = st.stx_ino;
            cur = p;
        }
        parts.reverse();
        format!("/{}", parts.join("/"))
    }
}

struct Setup {
    fs: CephFs,
    oracle: Oracle,
    top: String,
}

fn setup(lab: &Lab, tag: &str) -> Setup {
    let top = lab.export_dir(tag);
    let m = lab.ceph();
    let export = format!("{top}/tenantA/data");
    mkdirs(&m, &format!("{export}/d/e"));
    mkdirs(&m, &format!("{top}/tenantB/secret"));
    let mount = MountBuilder::new(Some(&lab.client_id))
        .and_then(|b| b.conf_read_file(Some(&lab.conf)))
        .and_then(|b| b.mount(&export))
        .unwrap();
    // The guest makes snapshots itself here: the most it may do (`--snapshots read-write`).
    let cfg = FsConfig {
        snapshots: ceph_virtiofsd::fs::SnapshotPolicy::ReadWrite,
        ..FsConfig::default()
    };
    let fs = CephFs::new(mount, cfg).unwrap();
    fs.init(FsOptions::ASYNC_READ).unwrap();
    let oracle = Oracle::new(m, &export);
    Setup { fs, oracle, top }
}

fn is_dir(e: &Entry) -> bool {
    e.attr.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// Every name the guest can send in a directory: ".", "..", ".snap" and what READDIRPLUS lists.
/// Every entry with a node is checked, READDIRPLUS's too.
fn names_in(s: &Setup, id: u64, what: &str) -> Vec<CString> {
    let root = ctx(0, 0);
    let mut names = vec![c("."), c(".."), c(".snap")];
    if let Ok((Some(fh), _)) = s.fs.opendir(&root, id, 0) {
        let mut listed = Vec::new();
        let mut off = 0;
        loop {
            let mut got = 0;
            s.fs.readdirplus(&root, id, fh, 65536, off, &mut |d, e| {
                got += 1;
                off = d.offset;
                listed.push((d.name.to_vec(), e.inode, e.attr.st_ino));
                Ok(1)
            })
            .unwrap();
            if got == 0 {
                break;
            }
        }
        s.fs.releasedir(&root, id, 0, fh).unwrap();
        for (name, node, ino) in listed {
            if node != 0 {
                s.oracle.check(
                    &format!("READDIRPLUS of {what}: {}", String::from_utf8_lossy(&name)),
                    ino,
                );
                let (st, _) = s.fs.getattr(&root, node, None).unwrap();
                s.oracle.check(
                    &format!("GETATTR of a READDIRPLUS node in {what}"),
                    st.st_ino,
                );
            }
            if name != b"." && name != b".." {
                names.push(CString::new(name).unwrap());
            }
        }
    }
    names
}

/// Breadth-first over everything reachable by name from node 1, plus ".." chains from every
/// directory reached; every node is checked by the oracle. Returns the directories walked.
fn explore(s: &Setup) -> usize {
    let root = ctx(0, 0);
    let mut seen = BTreeSet::from([1u64]);
    let mut queue = vec![(1u64, "/".to_string())];
    let mut walked = 0;
    while let Some((id, what)) = queue.pop() {
        walked += 1;
        assert!(walked < 2000, "exploration does not end");
        for name in names_in(s, id, &what) {
            let Ok(e) = s.fs.lookup(&root, id, &name) else {
                continue;
            };
            if e.inode == 0 {
                continue;
            }
            let path = format!("{what}/{}", name.to_string_lossy());
            s.oracle.check(&format!("LOOKUP {path}"), e.attr.st_ino);
            let (st, _) = s.fs.getattr(&root, e.inode, None).unwrap();
            s.oracle.check(&format!("GETATTR of {path}"), st.st_ino);
            if is_dir(&e) && seen.insert(e.inode) {
                queue.push((e.inode, path.clone()));
            }
            // ".." chains from here, as far as they go.
            let mut up = e.inode;
            for i in 0..8 {
                match s.fs.lookup(&root, up, &c("..")) {
                    Ok(p) if p.inode != 0 => {
                        s.oracle.check(
                            &format!("LOOKUP {path}{}", "/..".repeat(i + 1)),
                            p.attr.st_ino,
                        );
                        up = p.inode;
                    }
                    _ => break,
                }
            }
        }
    }
    walked
}

#[test]
fn hostile_dotdot_routes_stay_in_the_export() {
    let lab = Lab::get();
    let tag = format!("hostile_escape_{}", std::process::id());
    let s = setup(&lab, &tag);
    let root = ctx(0, 0);
    let fs = &s.fs;

    // The route of the issue: .snap of the export root, then "..", then ".." again.
    let snapdir = fs.lookup(&root, 1, &c(".snap")).unwrap();
    let up = fs.lookup(&root, snapdir.inode, &c("..")).unwrap();
    s.oracle.check("/.snap/..", up.attr.st_ino);
    assert_eq!(
        up.inode, 1,
        "\"..\" of the export root's .snap is the export root"
    );
    let up2 = fs.lookup(&root, up.inode, &c("..")).unwrap();
    assert_eq!(up2.inode, 1, "\"..\" of the export root is the export root");
    assert_eq!(fs.lookup(&root, 1, &c("..")).unwrap().inode, 1);
    // A subdirectory and its .snap.
    let d = fs.lookup(&root, 1, &c("d")).unwrap().inode;
    assert_eq!(fs.lookup(&root, d, &c("..")).unwrap().inode, 1);
    let dsnap = fs.lookup(&root, d, &c(".snap")).unwrap().inode;
    assert_eq!(fs.lookup(&root, dsnap, &c("..")).unwrap().inode, d);
    let e = fs.lookup(&root, d, &c("e")).unwrap().inode;
    assert_eq!(fs.lookup(&root, e, &c("..")).unwrap().inode, d);

    // Snapshots: of the export root (by the guest), of the export's parent and of the
    // filesystem's top test directory (by another client: they show up in the export's .snap
    // as _<name>_<ino>).
    let s1 = fs.mkdir(&root, snapdir.inode, &c("s1"), 0o755, 0).unwrap();
    s.oracle.check("mkdir /.snap/s1", s1.attr.st_ino);
    assert_eq!(
        fs.lookup(&root, s1.inode, &c("..")).unwrap().inode,
        snapdir.inode,
        "\"..\" of a snapshot root is its .snap"
    );
    let s1d = fs.lookup(&root, s1.inode, &c("d")).unwrap().inode;
    assert_eq!(fs.lookup(&root, s1d, &c("..")).unwrap().inode, s1.inode);
    let m = &s.oracle.m;
    let perm = UserPerm::root();
    for dir in [format!("{}/tenantA", s.top), s.top.clone()] {
        let snap = ceph_virtiofsd::quarantine::resolve(m, &format!("{dir}/.snap"), &perm).unwrap();
        m.mkdir(&snap, &c("outer"), 0o755, CEPH_STATX_BASIC_STATS, 0, &perm)
            .unwrap();
    }
    fs.mkdir(&root, dsnap, &c("ds"), 0o755, 0).unwrap();
    // Every ancestor's snapshot, entered through the export root's .snap, and ".." from it.
    let mut outer = 0;
    let snap_ino = snapdir.attr.st_ino;
    for name in names_in(&s, snapdir.inode, "/.snap") {
        if !name.to_bytes().starts_with(b"_outer_") {
            continue;
        }
        outer += 1;
        let r = fs.lookup(&root, snapdir.inode, &name).unwrap();
        assert_eq!(r.attr.st_ino, snap_ino, "a snapshot of the export root");
        assert_eq!(
            fs.lookup(&root, r.inode, &c("..")).unwrap().inode,
            snapdir.inode
        );
        let rd = fs.lookup(&root, r.inode, &c("d")).unwrap().inode;
        assert_eq!(fs.lookup(&root, rd, &c("..")).unwrap().inode, r.inode);
    }
    assert_eq!(
        outer, 2,
        "both outer snapshots are listed in the export's .snap"
    );

    let walked = explore(&s);
    println!("explored {walked} directories, every node inside the export");
}

#[test]
fn hostile_created_nodes_stay_in_the_export() {
    let lab = Lab::get();
    let tag = format!("hostile_escape_create_{}", std::process::id());
    let mut s = setup(&lab, &tag);
    let root = ctx(0, 0);
    let d = s.fs.mkdir(&root, 1, &c("made"), 0o755, 0).unwrap();
    let (f, fh) = common::create_as(&s.fs, &root, d.inode, &c("f"), 0o644);
    s.fs.release(&root, f, 0, fh, false, false, None).unwrap();
    let l =
        s.fs.symlink(&root, &c("../../../tenantB"), d.inode, &c("l"))
            .unwrap();
    let n =
        s.fs.mknod(&root, d.inode, &c("p"), libc::S_IFIFO | 0o644, 0, 0)
            .unwrap();
    let h = s.fs.link(&root, f, 1, &c("hl")).unwrap();
    s.oracle.refresh();
    for (what, e) in [("mkdir", &d), ("symlink", &l), ("mknod", &n), ("link", &h)] {
        s.oracle.check(what, e.attr.st_ino);
    }
    s.oracle
        .check("create", s.fs.getattr(&root, f, None).unwrap().0.st_ino);
    // A symlink is never followed by the daemon: its target is the guest's business.
    assert_eq!(errno(s.fs.lookup(&root, l.inode, &c(".."))), libc::ENOTDIR);
    explore(&s);
}

/// A directory the guest holds, moved out of the export by another client: its ".." is not
/// handed out (the directory itself is another client's doing: see docs/threat-model.md).
#[test]
fn hostile_dotdot_of_a_directory_moved_out() {
    let lab = Lab::get();
    let tag = format!("hostile_escape_moved_{}", std::process::id());
    let s = setup(&lab, &tag);
    let root = ctx(0, 0);
    let m = &s.oracle.m;
    let perm = UserPerm::root();
    mkdirs(m, &format!("{}/tenantA/data/mv/deeper", s.top));
    let mv = s.fs.lookup(&root, 1, &c("mv")).unwrap().inode;
    let deeper = s.fs.lookup(&root, mv, &c("deeper")).unwrap().inode;
    let data =
        ceph_virtiofsd::quarantine::resolve(m, &format!("{}/tenantA/data", s.top), &perm).unwrap();
    let b = ceph_virtiofsd::quarantine::resolve(m, &format!("{}/tenantB", s.top), &perm).unwrap();
    m.rename(&data, &c("mv"), &b, &c("mv"), &perm).unwrap();
    for id in [mv, deeper] {
        let mut up = id;
        for _ in 0..4 {
            match s.fs.lookup(&root, up, &c("..")) {
                Ok(p) if p.inode != 0 => {
                    assert!(
                        p.inode == 1 || p.inode == mv,
                        "\"..\" of a directory moved out of the export gave node {:#x} (ino {:#x})",
                        p.inode,
                        p.attr.st_ino
                    );
                    up = p.inode;
                }
                Ok(_) => break,
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EACCES));
                    break;
                }
            }
        }
    }
}
