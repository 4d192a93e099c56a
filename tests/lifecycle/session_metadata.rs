//! Identity in the cluster: a daemon's CephFS sessions carry `vm=NAME` (`--name`) and
//! `ceph_virtiofsd=VERSION` in their client metadata, so that `ceph tell mds.a session ls`
//! shows which VM each session serves; the name evicts nothing (two daemons of one name both
//! keep their sessions, unlike `--instance-id`). On the lab cluster. (On main there is no
//! `--name`: clap refuses it, exit 2.)

use crate::common::{Daemon, Lab};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The client metadata of every session of process `pid` (the export's, and the quarantine
/// watcher's), from `ceph tell mds.a session ls`.
fn metadata_of(lab: &Lab, pid: u32) -> Vec<serde_json::Value> {
    let out = lab
        .ceph_cli()
        .args(["tell", "mds.a", "session", "ls", "--format=json"])
        .output()
        .expect("run ceph tell mds.a session ls");
    assert!(
        out.status.success(),
        "ceph tell mds.a session ls: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("session ls is not JSON ({e})"));
    v.as_array()
        .expect("a JSON array of sessions")
        .iter()
        .map(|s| s["client_metadata"].clone())
        .filter(|m| m["pid"].as_str() == Some(pid.to_string().as_str()))
        .collect()
}

#[test]
fn sessions_name_the_vm_and_the_daemon() {
    let lab = Lab::get();
    let name = format!("meta-{}", std::process::id());
    let export = lab.export_dir(&name);
    let vm = format!("vm-{}.a", std::process::id());

    let named = Daemon::start(
        &lab,
        &lab.scratch(&format!("{name}-a")),
        &export,
        &["--name", &vm],
    );
    let sessions = metadata_of(&lab, named.pid());
    println!("sessions of the named daemon: {sessions:#?}");
    // The export's session and the quarantine watcher's (default --quarantine on).
    assert_eq!(sessions.len(), 2, "{sessions:#?}");
    for m in &sessions {
        assert_eq!(m["vm"].as_str(), Some(vm.as_str()), "{m}");
        assert_eq!(m["ceph_virtiofsd"].as_str(), Some(VERSION), "{m}");
    }
    assert!(
        sessions
            .iter()
            .any(|m| m["root"].as_str() == Some(export.as_str())),
        "no session of the export {export}: {sessions:#?}"
    );

    // A second daemon of the same name: nothing is evicted, both are listed.
    let twin = Daemon::start(
        &lab,
        &lab.scratch(&format!("{name}-b")),
        &export,
        &["--name", &vm],
    );
    let twins = metadata_of(&lab, twin.pid());
    assert_eq!(twins.len(), 2, "{twins:#?}");
    assert!(twins.iter().all(|m| m["vm"].as_str() == Some(vm.as_str())));
    assert_eq!(
        metadata_of(&lab, named.pid()).len(),
        2,
        "the first daemon's sessions are gone:\n{}",
        named.log_text()
    );

    // Without --name: the daemon's version, no vm.
    let anonymous = Daemon::start(&lab, &lab.scratch(&format!("{name}-c")), &export, &[]);
    let plain = metadata_of(&lab, anonymous.pid());
    assert_eq!(plain.len(), 2, "{plain:#?}");
    for m in &plain {
        assert_eq!(m["ceph_virtiofsd"].as_str(), Some(VERSION), "{m}");
        assert!(m.get("vm").is_none(), "{m}");
    }
}
