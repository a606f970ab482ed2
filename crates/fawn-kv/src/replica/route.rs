//! This node's place in one range's chain: who is before and after it, who heads and tails it.

use fawn_proto::native::{Epoch, RangeConfig};
use fawn_ring::NodeId;

/// This node's place in one range's chain, in one epoch.
#[derive(Clone, Debug)]
pub struct Route {
    pub epoch: Epoch,
    pub me: NodeId,
    pub rc: RangeConfig,
}

impl Route {
    pub fn is_head(&self) -> bool {
        self.rc.head() == Some(self.me)
    }
    /// Last in-sync replica: commits updates and serves gets.
    pub fn is_tail(&self) -> bool {
        self.rc.tail() == Some(self.me)
    }
    pub fn is_syncing(&self) -> bool {
        self.rc.syncing.contains(&self.me)
    }
    pub fn predecessor(&self) -> Option<NodeId> {
        self.rc.predecessor(self.me)
    }
    pub fn successor(&self) -> Option<NodeId> {
        self.rc.successor(self.me)
    }
}
