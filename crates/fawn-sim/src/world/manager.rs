//! The manager: the real membership transitions of `fawn_kv::manager::state`, fed with the
//! simulator's reports (failures it decides, registrations, `SyncDone`, `TailReady`), each
//! new configuration published to every node.

use fawn_kv::manager::state::{self, LinkCuts, Refused};
use fawn_proto::native::ClusterConfig;
use fawn_ring::NodeId;

use super::{RangeIx, World};

/// Replication factor 3 at most in a small cluster: one virtual id per node gives as many
/// ranges as nodes, each on a different chain.
const VNODES: u32 = 1;

impl World {
    /// The cluster as the manager forms it once every back-end registered.
    pub(super) fn form(&self) -> ClusterConfig {
        let none = LinkCuts::default();
        let nodes = self.cfg.nodes;
        let mut config = state::initial(self.cfg.replicas as u32, VNODES, 1);
        for node in 1..=nodes as NodeId {
            let next = state::register_backend(&config, nodes, node, &addr(node), &none);
            config = next.expect("registration").expect("a new back-end changes the configuration");
        }
        assert!(config.formed, "the cluster forms once every back-end registered");
        config
    }

    /// Runs one transition on the current configuration and publishes its result. A refusal
    /// is an old report (the real manager answers it with an error the back-end logs).
    fn transition(
        &mut self,
        f: impl FnOnce(&ClusterConfig, &LinkCuts) -> Result<Option<ClusterConfig>, Refused>,
    ) {
        let next = f(self.config(), &self.cuts);
        if let Ok(Some(next)) = next {
            assert!(next.epoch > self.config().epoch, "a new configuration has a newer epoch");
            self.check_config(&next);
            self.publish(next);
        }
    }

    /// The failure detector declared `node` failed.
    pub(super) fn manager_failed(&mut self, node: NodeId) {
        self.transition(|c, cuts| state::fail_node(c, node, cuts));
    }

    /// A node registers: a restarted process, or one the manager declared failed while it
    /// kept running.
    pub(super) fn manager_registered(&mut self, node: NodeId) {
        let expected = self.cfg.nodes;
        self.transition(|c, cuts| state::register_backend(c, expected, node, &addr(node), cuts));
    }

    /// Two nodes that both reach the manager report their chain link cut (`self.cuts` holds
    /// the pair already).
    pub(super) fn manager_cut_link(&mut self, a: NodeId, b: NodeId) {
        self.transition(|c, cuts| state::cut_link(c, a, b, cuts));
    }

    /// The manager no longer hears of a cut: re-replication may cross it again.
    pub(super) fn manager_settle(&mut self) {
        self.transition(|c, cuts| Ok(state::settle(c, cuts)));
    }

    /// `node` leaves gracefully (`fawn leave`).
    pub(super) fn manager_leave(&mut self, node: NodeId) {
        self.transition(|c, cuts| state::leave(c, node, cuts));
    }

    /// The drained head `node` of range `ix` reports it ready to split or merge.
    pub(super) fn manager_drained(&mut self, node: NodeId, ix: RangeIx, merge: bool) {
        let range = self.ranges[ix];
        let before = self.config().ranges.len();
        match merge {
            false => self.transition(|c, cuts| state::split_ready(c, node, range, cuts)),
            true => self.transition(|c, cuts| state::merge_ready(c, node, range, cuts)),
        }
        let after = self.config().ranges.len();
        self.splits += after.saturating_sub(before);
        self.merges += before.saturating_sub(after);
    }

    pub(super) fn manager_sync_done(&mut self, node: NodeId, ix: RangeIx) {
        let range = self.ranges[ix];
        self.transition(|c, cuts| state::sync_done(c, node, range, cuts));
    }

    pub(super) fn manager_tail_ready(&mut self, node: NodeId, ix: RangeIx) {
        let range = self.ranges[ix];
        self.transition(|c, cuts| state::tail_ready(c, node, range, cuts));
    }

    /// What the simulator relies on in every configuration the manager makes: a proven
    /// member in every chain, and, in runs without joins and leaves, the ranges it formed
    /// with (no split or merge starts).
    fn check_config(&mut self, next: &ClusterConfig) {
        let fixed = self.cfg.joins_max == 0 && self.cfg.leaves_max == 0;
        let ranges: Vec<_> = next.ranges.iter().map(|rc| rc.range).collect();
        if fixed && ranges != self.ranges {
            self.violations.push(format!("epoch {}: the ranges changed: {ranges:?}", next.epoch));
        }
        for rc in &next.ranges {
            if fixed && rc.is_reshaping() {
                self.violations.push(format!("epoch {}: a split or merge started: {rc:?}", next.epoch));
            }
            if super::proven(rc).next().is_none() {
                self.violations
                    .push(format!("epoch {}: a range without a proven replica: {rc:?}", next.epoch));
            }
        }
    }
}

fn addr(node: NodeId) -> String {
    format!("sim:{node}")
}
