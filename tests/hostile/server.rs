//! The end of a frontend's FUSE session against the real cluster: what the vhost-user layer
//! does when a `--keep-serving` frontend goes away without a DESTROY.

use std::sync::Arc;

use ceph_virtiofsd::server::FuseServer;
use fuse_backend_rs::api::filesystem::FileSystem;

use crate::common;
use crate::common::{c, ctx, errno, Lab};

/// Ending the session drops every node and handle the frontend was given (their libcephfs
/// references with them): the next frontend can use neither, and its handle numbers do not
/// follow on from the last session's.
#[test]
fn hostile_session_end_drops_the_frontends_nodes_and_handles() {
    let lab = Lab::get();
    let fs = Arc::new(common::fs_layer(
        &lab,
        &format!("hostile-session-{}", std::process::id()),
    ));
    let root = ctx(0, 0);
    let (node, fh) = common::create_as(&fs, &root, 1, &c("f"), 0o644);
    fs.mkdir(&root, 1, &c("d"), 0o755, 0).unwrap();
    assert!(fs.node_count() >= 3, "nodes: {}", fs.node_count());
    assert_eq!(fs.handle_count(), 1);

    FuseServer::new(fs.clone()).end_session();

    assert_eq!(fs.node_count(), 1, "only the export root is left");
    assert_eq!(fs.handle_count(), 0);
    assert_eq!(errno(fs.getattr(&root, node, None)), libc::ESTALE);
    let flushed = fs.flush(&root, node, fh, 0);
    assert!(
        matches!(errno(flushed), libc::ESTALE | libc::EBADF),
        "the old handle still works"
    );
    // The next session looks the file up again and opens it under a new handle number.
    let entry = fs.lookup(&root, 1, &c("f")).unwrap();
    assert_eq!(entry.inode, node);
    let (fh2, _, _) = fs.open(&root, node, libc::O_RDWR as u32, 0).unwrap();
    let fh2 = fh2.unwrap();
    assert_ne!(
        fh2,
        fh + 1,
        "handle numbers follow on from the last session"
    );
    assert_ne!(fh2, fh);
}
