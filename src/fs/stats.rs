//! What the filesystem reports to the metrics endpoint at scrape time ([`FsStats`]).

use crate::metrics::FsStats;

use super::CephFs;

impl FsStats for CephFs {
    fn node_count(&self) -> usize {
        CephFs::node_count(self)
    }
    fn handle_count(&self) -> usize {
        CephFs::handle_count(self)
    }
    fn limit_refusals(&self) -> (u64, u64) {
        CephFs::limit_refusals(self)
    }
    fn inode_refs(&self) -> (usize, u64, u64) {
        CephFs::inode_refs(self)
    }
}
