//! The import layering of `src/` (docs/architecture.md, "The import layers"): every `crate::` path in the library's
//! sources must point at a module the importing module may know. A new upward or circular
//! import fails here with the file and line that makes it.
//!
//! Run alone: `cargo test --test layers`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The layers, bottom to top: each module and the modules it may import. A module may only
/// name modules of rows above its own (checked below), so the table cannot hold a circle.
/// `wire` is the FUSE wire format the server, the filesystem, the transport and the metrics
/// share; the server's traits (`server::Servable` and its parts) are what the filesystem
/// implements, so `fs` sits above `server`.
const LAYERS: &[(&str, &[&str])] = &[
    // Leaves: know nothing of the rest of the daemon.
    ("poll", &[]),
    ("ceph", &[]),
    ("logging", &[]),
    ("sandbox", &[]),
    // systemd's readiness and watchdog notifications (sd_notify).
    ("notify", &[]),
    ("wire", &[]),
    // The uid/gid translation rules and the typed ids of both sides.
    ("idmap", &[]),
    // The device state format of live migration, and the filesystem's side of it as a trait.
    ("migration", &[]),
    // The handover of a session to a successor daemon: moves migration states over a socket.
    ("handover", &["migration"]),
    // Counters take plain values; the wire format names their labels.
    ("metrics", &["wire"]),
    // The quarantine: its gate, watcher and operator command, on its own settings type.
    ("quarantine", &["ceph", "idmap", "metrics"]),
    // FUSE dispatch and the traits it asks of a filesystem: generic, nothing of Ceph.
    ("server", &["metrics", "wire"]),
    // The filesystem: FUSE semantics over CephFS, serving the server's traits.
    (
        "fs",
        &[
            "ceph",
            "idmap",
            "metrics",
            "migration",
            "quarantine",
            "server",
            "wire",
        ],
    ),
    // The vhost-user transport: generic over the filesystem, nothing of Ceph.
    (
        "vhost_user",
        &["handover", "metrics", "migration", "poll", "server", "wire"],
    ),
    // The command line (clap types) and the validated `Config` built from it.
    ("args", &[]),
    (
        "config",
        &[
            "args",
            "ceph",
            "fs",
            "idmap",
            "logging",
            "metrics",
            "migration",
            "quarantine",
            "sandbox",
            "vhost_user",
        ],
    ),
    // Process lifecycle; `main.rs` (the binary) sits on top of everything.
    (
        "daemon",
        &[
            "args",
            "config",
            "handover",
            "metrics",
            "migration",
            "notify",
            "sandbox",
            "server",
            "vhost_user",
            "wire",
        ],
    ),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The library's source files (not the binaries: `main.rs`, `bin/`).
fn library_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let rel = path.strip_prefix(src()).expect("under src");
        if rel == Path::new("bin") || rel == Path::new("main.rs") {
            continue;
        }
        if path.is_dir() {
            library_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` → `["a", "b"]`, `src/a/mod.rs` → `["a"]`, `src/lib.rs` → `[]`.
fn module_of(file: &Path) -> Vec<String> {
    let rel = file
        .strip_prefix(src())
        .expect("under src")
        .with_extension("");
    let mut segs: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
        segs.pop();
    }
    segs
}

/// The table node a module path belongs to: the longest row that is a prefix of it. `None`
/// for the crate root's own items (`crate::report`, `crate::Exit`).
fn node_of(path: &[String]) -> Option<&'static str> {
    LAYERS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| {
            let segs: Vec<&str> = n.split("::").collect();
            segs.len() <= path.len() && segs.iter().zip(path).all(|(a, b)| *a == b)
        })
        .max_by_key(|n| n.len())
}

/// The modules `lib.rs` declares.
fn declared_modules() -> BTreeSet<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("read lib.rs");
    lib.lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("pub mod ")
                .or_else(|| l.trim().strip_prefix("mod "))
        })
        .map(|l| l.trim_end_matches(';').trim().to_owned())
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path a line names after `crate::`, grouped imports (`crate::{a::X, b}`) expanded to
/// their first segments.
fn crate_paths(line: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| is_ident(c) || c == ':' || c == '$') {
            continue; // `other_crate::`, `$crate::` or a longer path: not ours.
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(split_path(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            out.push(split_path(&item));
        } else {
            out.push(split_path(rest));
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

fn split_path(s: &str) -> Vec<String> {
    let s = s.trim_start();
    let end = s
        .char_indices()
        .find(|(_, c)| !(is_ident(*c) || *c == ':'))
        .map_or(s.len(), |(i, _)| i);
    s[..end]
        .split("::")
        .filter(|seg| !seg.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The code of a line: `//` comments (doc comments included) removed.
fn code(line: &str) -> &str {
    match line.find("//") {
        Some(i) => &line[..i],
        None => line,
    }
}

#[test]
fn the_layer_table_points_only_down() {
    for (i, (node, deps)) in LAYERS.iter().enumerate() {
        for dep in *deps {
            let below = LAYERS[..i].iter().any(|(n, _)| n == dep);
            assert!(
                below,
                "layer table: {node} may import {dep}, which is not a row below it"
            );
        }
    }
}

#[test]
fn every_module_is_placed_in_the_table() {
    let missing: Vec<String> = declared_modules()
        .into_iter()
        .filter(|m| !LAYERS.iter().any(|(n, _)| n == m))
        .collect();
    assert!(
        missing.is_empty(),
        "modules missing from the layer table in tests/layers.rs: {missing:?}"
    );
}

#[test]
fn no_import_points_up_or_sideways() {
    let modules = declared_modules();
    let mut files = Vec::new();
    library_files(&src(), &mut files);
    let mut offences = Vec::new();
    for file in &files {
        let module = module_of(file);
        let Some(from) = node_of(&module) else {
            continue; // lib.rs: declares the modules, imports none.
        };
        let allowed = LAYERS
            .iter()
            .find(|(n, _)| *n == from)
            .map(|(_, d)| *d)
            .unwrap_or(&[]);
        let text = std::fs::read_to_string(file).expect("read source");
        for (i, line) in text.lines().enumerate() {
            for path in crate_paths(code(line)) {
                let to = match node_of(&path) {
                    Some(to) => to,
                    None if modules.contains(&path[0]) => "<not in the table>",
                    None => continue, // an item of the crate root (`crate::report`)
                };
                if to == from || allowed.contains(&to) {
                    continue;
                }
                offences.push(format!(
                    "{}:{}: {from} imports {to} (`crate::{}`): {}",
                    file.strip_prefix(src().parent().expect("repo"))
                        .expect("in repo")
                        .display(),
                    i + 1,
                    path.join("::"),
                    line.trim()
                ));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "{} import(s) against the layering (docs/architecture.md, \"The import layers\"; table in tests/layers.rs):\n{}",
        offences.len(),
        offences.join("\n")
    );
}

#[test]
fn the_scanner_sees_grouped_and_nested_paths() {
    let paths = crate_paths(code(
        "use crate::{fs::CephFs, server::ops::{Served, X}}; // crate::poll",
    ));
    assert_eq!(
        paths,
        vec![
            vec!["fs".to_owned(), "CephFs".to_owned()],
            vec!["server".to_owned(), "ops".to_owned()],
        ]
    );
    assert_eq!(
        node_of(&["wire".into(), "opcode".into(), "FUSE_LOOKUP".into()]),
        Some("wire")
    );
    assert_eq!(
        node_of(&["server".into(), "FuseServer".into()]),
        Some("server")
    );
    assert_eq!(node_of(&["report".into()]), None);
    assert!(crate_paths(code("//! see `crate::fs`")).is_empty());
    assert!(crate_paths("$crate::fs::X; other_crate::fs::Y").is_empty());
}

/// docs/architecture.md shows the same table to readers: each module with what it may import.
/// Rows of what is not a module of `src/` (the ceph-client crate, main.rs, the bench) are
/// skipped.
#[test]
fn the_documented_table_is_this_one() {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md");
    let doc = std::fs::read_to_string(&doc_path).expect("read docs/architecture.md");
    // The backquoted names of a cell, outside its parenthesised remarks.
    let backticked = |cell: &str| -> Vec<String> {
        let mut bare = String::new();
        let mut depth = 0usize;
        for c in cell.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                _ if depth == 0 => bare.push(c),
                _ => {}
            }
        }
        bare.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    };
    let mut documented: std::collections::BTreeMap<String, BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // "| layer | module | may import |": ["", layer, module, may import, ""]
        let [_, layer, modules, imports, _] = cells.as_slice() else {
            continue;
        };
        if layer.parse::<u32>().is_err() {
            continue;
        }
        let imports: BTreeSet<String> = backticked(imports).into_iter().collect();
        for m in backticked(modules) {
            if m.contains('/') || m.contains('.') {
                continue;
            }
            documented.insert(m, imports.clone());
        }
    }
    let table: std::collections::BTreeMap<String, BTreeSet<String>> = LAYERS
        .iter()
        .map(|(m, deps)| {
            (
                (*m).to_owned(),
                deps.iter().map(|d| (*d).to_owned()).collect(),
            )
        })
        .collect();
    assert_eq!(
        documented, table,
        "the layer table of docs/architecture.md differs from LAYERS in tests/layers.rs: \
         change both"
    );
}
