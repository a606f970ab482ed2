//! Network partitions: a set of nodes cut off from the rest for a while, then healed.
//!
//! Two kinds. A *full* partition cuts the set off from the other nodes, the manager and the
//! clients: chain connections across it break (what was in flight is lost, what is sent
//! meanwhile too), clients' requests and answers across it are lost (they time out and retry),
//! configurations and reports do not cross it (a `SyncDone` is retried until it does), and the
//! failure detector declares the cut-off nodes failed if the partition outlasts it. A *chain*
//! partition cuts only the chain connections between the set and the rest, which all still
//! reach the manager: the nodes report the cut links they are neighbours on
//! (`state::cut_link`), and the manager settles once the cut is over (`state::settle`). At the
//! heal every broken connection reconnects; a node the manager declared failed meanwhile,
//! whose process kept running, registers again with its datastores (as the back-end's
//! configuration poll does).
//!
//! A partition cuts both ways, but for a *one-way* chain partition
//! (`Config::one_way_partitions`): only what the cut-off nodes send over chain links to the
//! rest is lost, while the rest's messages to them still arrive (a link that drops one
//! direction: a half-broken route, a full send queue on one side). The nodes' link probes are
//! round trips, so they notice it as a cut all the same and report it. Drawn from their own
//! random stream, so that a run without them replays as before.

use fawn_proto::native::NodeState;
use fawn_ring::NodeId;
use rand::seq::SliceRandom;
use rand::Rng;

use super::{Ev, World, MS};

/// One partition in force.
#[derive(Clone, Debug)]
pub(super) struct Partition {
    /// Names this partition in its events (a later one may be in force by then).
    pub id: u64,
    /// The nodes cut off from the rest.
    pub side: Vec<NodeId>,
    /// Only the chain connections are cut; the manager and clients reach every node.
    pub chain_only: bool,
    /// Only the chain connections from `side` to the rest are cut (with `chain_only`).
    pub one_way: bool,
}

/// The longest a partition lasts.
pub(super) const PARTITION_MAX: u64 = 3_000 * MS;

impl World {
    /// Whether `node` is cut off from the manager and the clients now.
    pub(super) fn isolated(&self, node: NodeId) -> bool {
        self.partition.as_ref().is_some_and(|p| !p.chain_only && p.side.contains(&node))
    }

    /// Whether `node` is on the cut-off side of the partition in force.
    pub(super) fn partitioned_off(&self, node: NodeId) -> bool {
        self.partition.as_ref().is_some_and(|p| p.side.contains(&node))
    }

    /// Whether the chain connection from `a` to `b` is cut now.
    pub(super) fn partitioned(&self, a: NodeId, b: NodeId) -> bool {
        self.partition.as_ref().is_some_and(|p| {
            let across = p.side.contains(&a) != p.side.contains(&b);
            across && (!p.one_way || p.side.contains(&a))
        })
    }

    /// Starts a partition (none is in force): a random proper subset of the nodes, for a
    /// random while.
    pub(super) fn start_partition(&mut self) {
        // Not while a node is down: its crash lost its data, and the detector dropping the
        // cut-off replicas could leave it the range's last (see `World::crash`).
        let down = self.nodes.values().any(|n| !n.alive);
        if self.partition.is_some() || self.partitions >= self.cfg.partitions_max || down {
            return;
        }
        let mut nodes: Vec<NodeId> = self.nodes.keys().copied().collect();
        nodes.shuffle(&mut self.prng);
        let size = self.prng.gen_range(1..=nodes.len() / 2);
        let mut side = nodes[..size].to_vec();
        side.sort_unstable();
        let chain_only = self.prng.gen_bool(0.5);
        let one_way = chain_only && self.cfg.one_way_partitions && self.prng.gen_bool(0.5);
        self.partitions += 1;
        let id = self.partitions as u64;
        if self.cfg.trace {
            eprintln!(
                "{:>9} partition {id}: {side:?} cut off (chain links only: {chain_only}, one way: {one_way})",
                self.now
            );
        }
        let p = Partition { id, side: side.clone(), chain_only, one_way };
        self.partition = Some(p);
        // What is in flight across the cut is lost.
        let cut: Vec<(NodeId, NodeId)> =
            self.links.keys().copied().filter(|(a, b)| self.partitioned(*a, *b)).collect();
        for key in cut {
            if let Some(link) = self.links.get_mut(&key) {
                link.conn += 1;
                link.down = None;
            }
        }
        let lasts = self.prng.gen_range(200 * MS..PARTITION_MAX);
        self.at(lasts, Ev::Heal { id });
        let noticed = self.prng.gen_range(50 * MS..500 * MS);
        self.at(noticed, Ev::PartitionNoticed { id });
    }

    /// The failure detector (full partition) or the nodes' link probes (chain partition)
    /// notice the partition if it is still in force.
    pub(super) fn partition_noticed(&mut self, id: u64) {
        let Some(p) = self.partition.clone().filter(|p| p.id == id) else { return };
        // Noticed again while it lasts: the chains change meanwhile.
        let again = self.prng.gen_range(100 * MS..500 * MS);
        self.at(again, Ev::PartitionNoticed { id });
        if !p.chain_only {
            for node in &p.side {
                self.manager_failed(*node);
            }
            return;
        }
        // Each pair of chain neighbours across the cut is reported, once per pair.
        let mut pairs = Vec::new();
        for rc in &self.config().ranges {
            let path: Vec<NodeId> = rc.path().collect();
            for w in path.windows(2) {
                let (a, b) = (w[0].min(w[1]), w[0].max(w[1]));
                if p.side.contains(&a) != p.side.contains(&b) && !pairs.contains(&(a, b)) {
                    pairs.push((a, b));
                }
            }
        }
        for (a, b) in pairs {
            let alive = |n: NodeId| self.nodes.get(&n).is_some_and(|n| n.alive);
            if alive(a) && alive(b) && !self.cuts.contains(a, b) {
                self.cuts.insert(a, b);
                self.manager_cut_link(a, b);
            }
        }
    }

    /// The partition ends: every connection across it reconnects, the manager forgets the
    /// cuts and settles, and each cut-off node fetches the configuration (registering again
    /// if it was declared failed).
    pub(super) fn heal(&mut self, id: u64) {
        let Some(p) = self.partition.take().filter(|p| p.id == id) else { return };
        if self.cfg.trace {
            eprintln!("{:>9} partition {id} healed", self.now);
        }
        // Every connection across, also one first used during the partition (what was sent on
        // it was lost too).
        let nodes: Vec<NodeId> = self.nodes.keys().copied().collect();
        let across: Vec<(NodeId, NodeId)> = nodes
            .iter()
            .flat_map(|a| nodes.iter().map(move |b| (*a, *b)))
            .filter(|(from, to)| p.side.contains(from) != p.side.contains(to))
            .filter(|(from, _)| !p.one_way || p.side.contains(from))
            .collect();
        for (from, to) in across {
            let link = self.links.entry((from, to)).or_default();
            link.conn += 1;
            link.down = Some(Vec::new());
            let conn = link.conn;
            let d = self.prng.gen_range(MS..50 * MS);
            self.at(d, Ev::Connected { from, to, conn });
        }
        if p.chain_only {
            let others: Vec<NodeId> = self.nodes.keys().copied().filter(|n| !p.side.contains(n)).collect();
            for a in &p.side {
                for b in &others {
                    self.cuts.remove(*a, *b);
                }
            }
            self.manager_settle();
            return;
        }
        for node in p.side {
            if !self.nodes.get(&node).is_some_and(|n| n.alive) {
                continue;
            }
            let failed =
                self.config().backends.iter().any(|b| b.node == node && b.state == NodeState::Failed);
            if failed {
                self.manager_registered(node);
            }
            let epoch = self.config().epoch;
            if let Some(n) = self.nodes.get_mut(&node) {
                n.registered = epoch;
            }
            self.install_now(node, epoch);
        }
    }
}
