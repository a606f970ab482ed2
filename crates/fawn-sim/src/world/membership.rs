//! Joins and graceful leaves under load (`Config::joins_max`, `Config::leaves_max`), and the
//! splits and merges they cause.
//!
//! In FAWN a join or leave is a change of the ring, which the manager's real transitions turn
//! into range changes (`fawn_kv::manager::state`): a joiner registers and is synced into the
//! chains that prefer it, and once a range is quiet and whole it is marked `splitting` at the
//! joiner's virtual id; a leaver is marked `Leaving`, replaced by syncs, drops out of the chains
//! and, once the two ranges around its virtual id have the same nodes, they are marked
//! `merging`. The back-end's shell does the rest, modelled here with the same messages and
//! the same decision code:
//! * **drain** (`backend/drain.rs`, the tick): the head of a marked range that is drained
//!   (`Replica::drained_head`: nothing it ordered unacknowledged) reports `SplitReady` or
//!   `MergeReady` (a merge only until its mark says `merge_drained`). It says so after each step
//!   that may have drained it (the real drain watch polls every 2 ms) and at every tick. The
//!   bulk pre-copy is not modelled: a marked head refuses puts at once, as a back-end's head
//!   does when its replica was created after the mark.
//! * **install** (`backend/install.rs`, `merge.rs`): a node installing a configuration that
//!   split a range it held in sync cuts its store into the pieces
//!   (`replica::reshape::split_parts`), each a new replica that inherits the parent's request
//!   outcomes and seqs (`Replica::inherit`); then it merges the held pieces that tile a range it
//!   does not hold yet (`replica::reshape::merge_target`), the merged replica inheriting from
//!   every piece. Replicas of ranges gone from the configuration are dropped. What a crash kept
//!   of a range since split or merged is cut or merged the same way when the node comes back
//!   (the back-end's `recover_split_parts` and `recover_merges`).
//!
//! The datastores are the simulator's (`DiskStore::part`, `DiskStore::merged`), not FAWN-DS's
//! split and merge. Drawn from their own random stream, so a run without them replays as
//! before. A node that left is stopped (its operator's part); a joiner gets the next node id.

use fawn_kv::replica::machine::Replica;
use fawn_kv::replica::reshape;
use fawn_kv::replica::route::Route;
use fawn_proto::native::{ClusterConfig, NodeState};
use fawn_ring::{NodeId, Range};
use rand::Rng;

use super::{Ev, Node, RangeIx, World, MS, TICK_INTERVAL};
use crate::disk::DiskStore;

/// Longest gap between two chances of a join or leave.
pub(super) const MEMBERSHIP_GAP_MAX: u64 = 2_000 * MS;

impl World {
    /// A chance of a join or a leave (while faults are on and some are left to do).
    pub(super) fn membership_change(&mut self) {
        if !self.faults_on {
            return;
        }
        let gap = self.mrng.gen_range(100 * MS..MEMBERSHIP_GAP_MAX);
        self.at(gap, Ev::Membership);
        let join = self.mrng.gen_bool(0.5);
        if join && self.joins < self.cfg.joins_max {
            self.join();
        } else if !join && self.leaves < self.cfg.leaves_max {
            self.leave();
        }
    }

    /// A new node (the next id) starts and registers: the manager adds it to the ring.
    fn join(&mut self) {
        // Never the id of a node that left: a joiner is a new node.
        let node = self.config().backends.iter().map(|b| b.node).max().unwrap_or(0) + 1;
        if self.cfg.trace {
            eprintln!("{:>9} node {node} joins", self.now);
        }
        self.joins += 1;
        let node_state = Node {
            life: 0,
            alive: true,
            registered: 0,
            installed: 0,
            replicas: Default::default(),
            kept: Default::default(),
            disk_full: false,
            syncs: Default::default(),
            sending: Default::default(),
        };
        self.nodes.insert(node, node_state);
        self.manager_registered(node);
        let epoch = self.config().epoch;
        if let Some(n) = self.nodes.get_mut(&node) {
            n.registered = epoch;
        }
        self.install_now(node, epoch);
        self.at(TICK_INTERVAL, Ev::Tick { node, life: 0 });
        self.schedule_disk_sync(node, 0);
    }

    /// A random alive member leaves gracefully, if the ring keeps R alive nodes without it.
    fn leave(&mut self) {
        let config = self.config();
        let alive: Vec<NodeId> =
            config.backends.iter().filter(|b| b.state == NodeState::Alive).map(|b| b.node).collect();
        let candidates: Vec<NodeId> = alive
            .iter()
            .copied()
            .filter(|n| self.nodes.get(n).is_some_and(|n| n.alive) && !self.isolated(*n))
            .collect();
        if alive.len() <= self.cfg.replicas || candidates.is_empty() {
            return;
        }
        let node = candidates[self.mrng.gen_range(0..candidates.len())];
        if self.cfg.trace {
            eprintln!("{:>9} node {node} leaves", self.now);
        }
        self.leaves += 1;
        self.manager_leave(node);
    }

    /// Nodes the configuration says have left stop (their operator shuts them down).
    pub(super) fn stop_departed(&mut self, config: &ClusterConfig) {
        for b in config.backends.iter().filter(|b| b.state == NodeState::Left) {
            if self.nodes.remove(&b.node).is_some() && self.cfg.trace {
                eprintln!("{:>9} node {} left and stops", self.now, b.node);
            }
        }
    }

    /// As the back-end's drain watch and tick: the drained head of a range marked for a split
    /// or merge reports it (`always`: at a tick; else once per node, range and epoch).
    pub(super) fn report_drained(&mut self, node: NodeId, ix: RangeIx, always: bool) {
        let Some(r) = self.nodes.get(&node).and_then(|n| n.replicas.get(&ix)) else { return };
        let rc = &r.route().rc;
        let split = rc.splitting.is_some();
        let merge = rc.merging.is_some() && !rc.merge_drained;
        if !(split || merge) || !r.drained_head() {
            return;
        }
        if !self.drain_reported.insert((node, ix, r.route().epoch)) && !always {
            return;
        }
        let d = self.delay();
        self.at(d, Ev::Drained { node, range: ix, merge: !split });
    }

    /// Before `node` installs `config`: splits and merges its held replicas as the back-end
    /// does (see the module doc).
    pub(super) fn reshape(&mut self, node: NodeId, config: &ClusterConfig) {
        let epoch = config.epoch;
        let Some(n) = self.nodes.get(&node) else { return };
        let held: Vec<RangeIx> = n.replicas.keys().copied().collect();
        for ix in held {
            let range = self.ranges[ix];
            let parts = reshape::split_parts(config, node, &range);
            let Some(n) = self.nodes.get_mut(&node) else { return };
            if parts.is_empty() || n.replicas[&ix].route().is_syncing() {
                continue;
            }
            let Some(mut old) = n.replicas.remove(&ix) else { continue };
            self.high.remove(&(node, ix, n.life));
            old.retire();
            for rc in parts {
                let store = old.store().part(&rc.range);
                let part_ix = self.note_range(rc.range);
                let mut part = self.open_replica(store, Route { epoch, me: node, rc });
                part.inherit(&mut old);
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.replicas.insert(part_ix, part);
                }
            }
            if self.cfg.trace {
                eprintln!("{:>9} node {node} split range {ix}", self.now);
            }
        }
        for rc in config.ranges.iter().filter(|rc| rc.chain.contains(&node)) {
            let merged_ix = self.note_range(rc.range);
            let Some(n) = self.nodes.get(&node) else { return };
            if n.replicas.contains_key(&merged_ix) {
                continue;
            }
            let inside: Vec<RangeIx> = n
                .replicas
                .iter()
                .filter(|(ix, r)| {
                    let range = self.ranges[**ix];
                    range != rc.range && reshape::within(&range, &rc.range) && !r.route().is_syncing()
                })
                .map(|(ix, _)| *ix)
                .collect();
            let pieces: Vec<Range> = inside.iter().map(|ix| self.ranges[*ix]).collect();
            if inside.is_empty() || reshape::merge_target(&pieces, &rc.range).is_none() {
                continue;
            }
            let Some(n) = self.nodes.get_mut(&node) else { return };
            let mut parts: Vec<Replica<DiskStore>> =
                inside.iter().filter_map(|ix| n.replicas.remove(ix)).collect();
            for ix in &inside {
                self.high.remove(&(node, *ix, n.life));
            }
            for p in &mut parts {
                p.retire();
            }
            let stores: Vec<&DiskStore> = parts.iter().map(|p| p.store()).collect();
            let store = match DiskStore::merged(&stores) {
                Ok(store) => store,
                Err(seq) => {
                    self.violations
                        .push(format!("node {node}: ranges merged into {:?} both hold seq {seq}", rc.range));
                    continue;
                }
            };
            let mut whole = self.open_replica(store, Route { epoch, me: node, rc: rc.clone() });
            for p in &mut parts {
                whole.inherit(p);
            }
            if let Some(n) = self.nodes.get_mut(&node) {
                n.replicas.insert(merged_ix, whole);
            }
            if self.cfg.trace {
                eprintln!("{:>9} node {node} merged ranges {inside:?} into range {merged_ix}", self.now);
            }
        }
    }

    /// What a crash kept of `range` on `node`'s disks: its own store, or cut from a kept
    /// range it was split from, or (for a chain member, as the back-end's
    /// `recover_unstarted_merges`) merged from kept pieces that tile it. A syncing replica gets
    /// no merge: it would rejoin by the suffix after the highest seq of its pieces, which
    /// leaves out what the others lack below it (`replica::sync::suffix_covers`).
    pub(super) fn take_kept(&mut self, node: NodeId, range: &Range, syncing: bool) -> Option<DiskStore> {
        let ranges = &self.ranges;
        let n = self.nodes.get_mut(&node)?;
        let ix = ranges.iter().position(|r| r == range)?;
        if let Some(kept) = n.kept.remove(&ix) {
            return Some(kept);
        }
        if let Some(whole) = n.kept.keys().copied().find(|k| reshape::within(range, &ranges[*k])) {
            return Some(n.kept[&whole].part(range));
        }
        if syncing {
            return None;
        }
        let inside: Vec<RangeIx> =
            n.kept.keys().copied().filter(|k| reshape::within(&ranges[*k], range)).collect();
        let pieces: Vec<Range> = inside.iter().map(|k| ranges[*k]).collect();
        reshape::merge_target(&pieces, range)?;
        let stores: Vec<DiskStore> = inside.iter().filter_map(|k| n.kept.remove(k)).collect();
        DiskStore::merged(&stores.iter().collect::<Vec<_>>()).ok()
    }
}
