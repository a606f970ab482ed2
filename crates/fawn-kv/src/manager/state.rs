//! The manager's configuration state machine: pure transitions on [`ClusterConfig`].
//!
//! Kept free of I/O so it can later be driven by a replicated log (Raft) unchanged: each
//! transition takes the current config and returns the next one (or a refusal).
//!
//! Transitions that may start re-replication also take the [`LinkCuts`] the manager currently
//! believes in, so that no sync is started across a cut chain link.

use std::collections::BTreeSet;

use fawn_proto::native::{BackendInfo, ClusterConfig, FrontendInfo, NodeState, RangeConfig};
use fawn_ring::{KeyId, NodeId, Range, Ring};

/// Largest replication factor accepted.
pub const REPLICAS_MAX: u32 = 7;
/// Most virtual ids per back-end accepted.
pub const VNODES_MAX: u32 = 64;

/// Why a transition was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("front-end id {got} is out of range: the cluster has {expected} front-ends (ids 0..{expected})")]
    FrontendId { expected: u32, got: u32 },
    #[error("unknown back-end {0}")]
    UnknownNode(NodeId),
    #[error("back-end {node} is not syncing range {range}")]
    NotSyncing { node: NodeId, range: String },
}

/// Pairs of back-ends whose chain link is cut while both still reach the manager (reported by
/// one of them, `Request::LinkCut`). Unordered: a cut is treated as both ways, since a chain
/// link needs acknowledgements back. Soft state kept by the manager beside the configuration
/// (not persisted: a restarted manager hears about a lasting cut again from the next report).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkCuts(BTreeSet<(NodeId, NodeId)>);

impl LinkCuts {
    fn key(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
        (a.min(b), a.max(b))
    }

    pub fn insert(&mut self, a: NodeId, b: NodeId) {
        self.0.insert(Self::key(a, b));
    }

    pub fn remove(&mut self, a: NodeId, b: NodeId) {
        self.0.remove(&Self::key(a, b));
    }

    pub fn contains(&self, a: NodeId, b: NodeId) -> bool {
        self.0.contains(&Self::key(a, b))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A fresh configuration for a cluster of `frontends` front-ends.
pub fn initial(replicas: u32, vnodes: u32, frontends: u32) -> ClusterConfig {
    ClusterConfig {
        epoch: 1,
        frontends_expected: frontends.max(1),
        replicas: replicas.clamp(1, REPLICAS_MAX),
        vnodes: vnodes.clamp(1, VNODES_MAX),
        ..ClusterConfig::default()
    }
}

/// A back-end announces its address. Before the cluster forms, this collects members; once
/// `expected_backends` registered, the ranges and chains are fixed. Afterwards a new node is a
/// join, and a failed or departed node coming back rejoins: both are added to the chains that
/// prefer them as syncing replicas. Returns `None` when nothing changed.
pub fn register_backend(
    config: &ClusterConfig,
    expected_backends: usize,
    node: NodeId,
    addr: &str,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    match next.backends.iter_mut().find(|b| b.node == node) {
        Some(b) if b.addr == addr && matches!(b.state, NodeState::Alive | NodeState::Leaving) => {
            return Ok(None)
        }
        Some(b) => {
            b.addr = addr.to_string();
            if matches!(b.state, NodeState::Failed | NodeState::Left) {
                b.state = NodeState::Alive;
            }
        }
        None => {
            next.backends.push(BackendInfo { node, addr: addr.to_string(), state: NodeState::Alive });
            next.backends.sort_by_key(|b| b.node);
        }
    }
    if !next.formed && next.backends.len() >= expected_backends {
        form(&mut next);
    } else if next.formed {
        rebalance(&mut next, cuts);
    }
    next.epoch += 1;
    Ok(Some(next))
}

/// A back-end registers after a restart that may have cost its datastores updates it had
/// acknowledged (its host lost the page cache while its sync policy let acknowledged writes
/// wait there). It must not resume its chain positions from those datastores: it is failed
/// first, so that registering adds it back as a syncing replica of its ranges, which asks
/// the tail for the suffix after its last record and serves only once it caught up. A node in
/// no chain, leaving, or the sole replica of a range registers as usual.
pub fn register_backend_unproven(
    config: &ClusterConfig,
    expected_backends: usize,
    node: NodeId,
    addr: &str,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    let alive = config.backends.iter().any(|b| b.node == node && b.state == NodeState::Alive);
    let in_a_chain = config.ranges.iter().any(|rc| rc.chain.contains(&node) && rc.chain != [node]);
    let failed = if alive && in_a_chain { fail_node(config, node, cuts)? } else { None };
    let base = failed.as_ref().unwrap_or(config);
    Ok(register_backend(base, expected_backends, node, addr, cuts)?.or(failed))
}

/// Fixes the ranges and their chains from the ring of the registered back-ends.
fn form(config: &mut ClusterConfig) {
    let ring = alive_ring(config);
    config.ranges = ring
        .ranges()
        .into_iter()
        .map(|(range, owner)| RangeConfig::new(range, ring.chain_for_range(&owner).nodes))
        .collect();
    config.ranges.sort_by_key(|r| r.range.end_inclusive);
    config.formed = true;
}

fn alive_ring(config: &ClusterConfig) -> Ring {
    let alive: Vec<NodeId> =
        config.backends.iter().filter(|b| b.state == NodeState::Alive).map(|b| b.node).collect();
    Ring::new(&alive, config.vnodes, config.replicas)
}

/// The nodes a range's chain should consist of: its chain on the ring of alive nodes.
fn preferred(ring: &Ring, range: &Range) -> Vec<NodeId> {
    ring.try_chain(range.end_inclusive).map(|c| c.nodes).unwrap_or_default()
}

/// While `rc`'s chain holds more than R replicas (at most the alive nodes), removes the
/// nodes the ring no longer prefers for it, never `keep`. Whether any was removed.
fn shed_unpreferred(rc: &mut RangeConfig, ring: &Ring, replicas: u32, keep: Option<NodeId>) -> bool {
    let want = (replicas as usize).min(ring.nodes().len()).max(1);
    let preferred = preferred(ring, &rc.range);
    let before = rc.chain.len();
    while rc.chain.len() > want {
        let Some(i) = rc.chain.iter().position(|n| !preferred.contains(n) && Some(*n) != keep) else { break };
        rc.chain.remove(i);
    }
    rc.chain.len() < before
}

/// Starts one sync per range whose chain is short or holds a node the ring no longer prefers.
/// Ranges already syncing wait: one membership change per range at a time. A node whose link
/// to the range's tail (the sync source) is cut is not a candidate (a sync across it could
/// never finish). A short chain (re-replication) whose preferred nodes are all cut off from
/// its tail takes the next alive node in the ring's order beyond R; once the cut is over, the
/// ring's preferred node syncs and that one is shed as for a join. A join or a leave's
/// replacement (the chain holds R already) waits until the cut is over.
fn rebalance(config: &mut ClusterConfig, cuts: &LinkCuts) {
    unmark_broken_merges(config);
    plan_splits(config);
    let ring = alive_ring(config);
    let want = (config.replicas as usize).min(ring.nodes().len());
    // Every alive node, in each range's order of preference (the preferred R first).
    let everyone = Ring::new(ring.nodes(), config.vnodes, ring.nodes().len() as u32);
    let fallback = |range: &Range| preferred(&everyone, range);
    for rc in &mut config.ranges {
        if !rc.syncing.is_empty() || rc.chain.is_empty() || rc.splitting.is_some() || rc.merging.is_some() {
            continue;
        }
        let preferred = preferred(&ring, &rc.range);
        let tail = rc.tail();
        let reachable = |p: &NodeId| !rc.chain.contains(p) && !tail.is_some_and(|t| cuts.contains(t, *p));
        let candidate = preferred.iter().copied().find(reachable).or_else(|| {
            let short = rc.chain.len() < want;
            short.then(|| fallback(&rc.range).into_iter().find(reachable)).flatten()
        });
        let Some(candidate) = candidate else { continue };
        if rc.chain.len() < want || rc.chain.iter().any(|n| !preferred.contains(n)) {
            rc.syncing.push(candidate);
        }
    }
    settle_leavers(config);
    plan_merges(config);
}

/// Keeps the ranges the ring's: a range is `(previous virtual id, virtual id]`, so a joined
/// node's virtual ids split the ranges they fall in (paper §3.4.4: the joiner's range is split
/// off its successor's). A range is marked [`RangeConfig::splitting`] at the first alive virtual
/// id inside it only while it is quiet and whole — no syncing replica, its chain at R and all
/// alive — so that re-replication after a failure comes first and no snapshot stream crosses a
/// split; further ids inside it are split after this one ([`split_ready`]). Virtual ids of
/// nodes that failed or left split nothing; the boundaries at ids of nodes that left are
/// merged away ([`plan_merges`]).
fn plan_splits(config: &mut ClusterConfig) {
    let ring = alive_ring(config);
    if ring.is_empty() {
        return;
    }
    let want = (config.replicas as usize).min(ring.nodes().len());
    for rc in &mut config.ranges {
        if rc.splitting.is_none() && rc.merging.is_none() && quiet_and_whole(rc, &ring, want) {
            rc.splitting = first_vid_inside(&ring, &rc.range);
        }
    }
}

/// No replica syncing, the chain at R (`want`) and every member alive.
fn quiet_and_whole(rc: &RangeConfig, ring: &Ring, want: usize) -> bool {
    rc.syncing.is_empty() && rc.chain.len() >= want && rc.chain.iter().all(|n| ring.nodes().contains(n))
}

/// Merges the ranges back where a boundary is no longer a virtual id (paper §3.4.4: a leaving
/// node's range merges into its successor's): two adjacent ranges whose boundary belongs to
/// no node but ones that left (a failed node may come back, so its ids stay boundaries) are
/// both marked [`RangeConfig::merging`] at it once both are quiet and whole and have the same
/// nodes — the ring prefers the same nodes for both once the leaver's replacements are in,
/// which re-replication brings about first. A range takes part in one merge at a time; a
/// marked pair that no longer qualifies (a failure, a cut, the node came back) is unmarked
/// before anything is planned, so no head keeps refusing puts for a merge that cannot end.
fn plan_merges(config: &mut ClusterConfig) {
    let rule = MergeRule::of(config);
    let n = config.ranges.len();
    for i in 0..n {
        let (lower, upper) = (&config.ranges[i], &config.ranges[(i + 1) % n]);
        if lower.merging.is_none() && upper.merging.is_none() && rule.allows(lower, upper) {
            let at = lower.range.end_inclusive;
            config.ranges[i].merging = Some(at);
            config.ranges[(i + 1) % n].merging = Some(at);
        }
    }
}

/// When two adjacent ranges may be merged (see [`plan_merges`]), for one configuration: its
/// rings are built once, not per pair.
struct MergeRule {
    ring: Ring,
    want: usize,
    /// The virtual ids of every node that has not left.
    boundaries: BTreeSet<KeyId>,
    ranges: usize,
}

impl MergeRule {
    fn of(config: &ClusterConfig) -> MergeRule {
        let ring = alive_ring(config);
        let want = (config.replicas as usize).min(ring.nodes().len());
        let present: Vec<NodeId> =
            config.backends.iter().filter(|b| b.state != NodeState::Left).map(|b| b.node).collect();
        let boundaries =
            Ring::new(&present, config.vnodes, config.replicas).vids().iter().map(|v| v.id).collect();
        MergeRule { ring, want, boundaries, ranges: config.ranges.len() }
    }

    /// Whether `lower` and the range above it, `upper`, may be merged now.
    fn allows(&self, lower: &RangeConfig, upper: &RangeConfig) -> bool {
        let at = lower.range.end_inclusive;
        self.ranges > 1
            && at == upper.range.start_exclusive
            && !self.boundaries.contains(&at)
            && lower.splitting.is_none()
            && upper.splitting.is_none()
            && !lower.chain.is_empty()
            && same_nodes(&lower.chain, &upper.chain)
            && quiet_and_whole(lower, &self.ring, self.want)
            && quiet_and_whole(upper, &self.ring, self.want)
    }
}

/// The indexes of the pair (lower, upper) that range `i`, marked merging at `at`, belongs to:
/// `at` is its end or its start. `None` for a mark at neither (never set so).
fn merge_pair(ranges: &[RangeConfig], i: usize, at: KeyId) -> Option<(usize, usize)> {
    let n = ranges.len();
    let range = &ranges[i].range;
    if at == range.end_inclusive {
        Some((i, (i + 1) % n))
    } else if at == range.start_exclusive {
        Some(((i + n - 1) % n, i))
    } else {
        None
    }
}

/// Whether two chains consist of the same nodes (in any order).
fn same_nodes(a: &[NodeId], b: &[NodeId]) -> bool {
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

/// Unmarks every range marked [`RangeConfig::merging`] whose pair no longer qualifies (a
/// failure, a cut or a sync in either, the boundary's node came back) or whose partner is not
/// marked at the same boundary. Run first in every transition, so that a pair broken by it is
/// repaired (re-replicated) at once like any other range.
fn unmark_broken_merges(config: &mut ClusterConfig) {
    let rule = MergeRule::of(config);
    let broken: Vec<usize> = (0..config.ranges.len())
        .filter(|&i| {
            let Some(at) = config.ranges[i].merging else { return false };
            let Some((lower, upper)) = merge_pair(&config.ranges, i, at) else { return true };
            let (lower, upper) = (&config.ranges[lower], &config.ranges[upper]);
            lower.merging != Some(at) || upper.merging != Some(at) || !rule.allows(lower, upper)
        })
        .collect();
    for i in broken {
        config.ranges[i].merging = None;
        config.ranges[i].merge_drained = false;
    }
}

/// The virtual id of `ring` strictly inside `range` (not its end) nearest after its start.
fn first_vid_inside(ring: &Ring, range: &Range) -> Option<KeyId> {
    ring.vids()
        .iter()
        .map(|v| v.id)
        .filter(|id| *id != range.end_inclusive && range.contains(*id))
        .min_by_key(|id| id.0.wrapping_sub(range.start_exclusive.0))
}

/// The head `node` of `range`, marked [`RangeConfig::splitting`], has every update it ordered
/// acknowledged and orders none: every in-sync replica holds the same, final contents, so the
/// range becomes two, `(start, at]` and `(at, end]`, with the same chain; each replica splits its
/// datastore when it installs this configuration. The lower half keeps nothing of the range's
/// name (a range's directory is named by its end), the upper half keeps the datastore. `None`
/// when the range is no longer marked or `node` is not its head (an old report).
pub fn split_ready(
    config: &ClusterConfig,
    node: NodeId,
    range: Range,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    let Some(upper) = next.ranges.iter_mut().find(|r| r.range == range && r.head() == Some(node)) else {
        return Ok(None);
    };
    let Some(at) = upper.splitting.take() else { return Ok(None) };
    let lower = RangeConfig::new(Range::new(range.start_exclusive, at), upper.chain.clone());
    upper.range = Range::new(at, range.end_inclusive);
    next.ranges.push(lower);
    next.ranges.sort_by_key(|r| r.range.end_inclusive);
    Ok(Some(rebalanced(next, cuts)))
}

/// The head `node` of `range`, marked [`RangeConfig::merging`], has every update it ordered
/// acknowledged and orders none: every replica holds the range's final contents. Once the
/// heads of both ranges of the pair said so, the two become one, `(lower's start, upper's
/// end]`, with the upper one's chain (the same nodes; all hold the same contents, so any order
/// is safe); each replica merges the lower range's datastore into the upper's when it installs
/// this configuration. `None` when the range is no longer marked, `node` is not its head (an
/// old report) or it was already recorded.
pub fn merge_ready(
    config: &ClusterConfig,
    node: NodeId,
    range: Range,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    let Some(i) = next.ranges.iter().position(|r| r.range == range && r.head() == Some(node)) else {
        return Ok(None);
    };
    let rc = &mut next.ranges[i];
    let Some(at) = rc.merging else { return Ok(None) };
    if rc.merge_drained {
        return Ok(None);
    }
    rc.merge_drained = true;
    let Some((lower, upper)) = merge_pair(&next.ranges, i, at) else { return Ok(None) };
    let both =
        [lower, upper].iter().all(|&k| next.ranges[k].merging == Some(at) && next.ranges[k].merge_drained);
    if next.ranges.len() > 1 && both {
        let start = next.ranges[lower].range.start_exclusive;
        let up = &mut next.ranges[upper];
        up.range = Range::new(start, up.range.end_inclusive);
        up.merging = None;
        up.merge_drained = false;
        next.ranges.remove(lower);
    }
    Ok(Some(rebalanced(next, cuts)))
}

/// The end of a transition that changed `next`: rebalance and bump the epoch.
fn rebalanced(mut next: ClusterConfig, cuts: &LinkCuts) -> ClusterConfig {
    rebalance(&mut next, cuts);
    next.epoch += 1;
    next
}

/// A leaving node in no chain has left.
fn settle_leavers(config: &mut ClusterConfig) {
    let held: Vec<NodeId> = config.ranges.iter().flat_map(|r| r.path().collect::<Vec<_>>()).collect();
    for b in &mut config.backends {
        if b.state == NodeState::Leaving && !held.contains(&b.node) {
            b.state = NodeState::Left;
        }
    }
}

/// The failure detector declared `node` failed: drop it from every chain (the chain repairs
/// itself: its neighbours become adjacent) and start re-replication. The last in-sync replica
/// of a range stays in its chain: it holds every committed update, so the range serves again
/// as soon as that node is back (an emptied chain could never be refilled; found by the
/// link-cut fault test when an overloaded machine made the manager miss three back-ends at
/// once).
pub fn fail_node(
    config: &ClusterConfig,
    node: NodeId,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    let b = next.backends.iter_mut().find(|b| b.node == node).ok_or(Refused::UnknownNode(node))?;
    if matches!(b.state, NodeState::Failed | NodeState::Left) {
        return Ok(None);
    }
    b.state = NodeState::Failed;
    for rc in &mut next.ranges {
        if rc.path().any(|n| n == node) {
            // A split waits for a whole chain again (`plan_splits`).
            rc.splitting = None;
        }
        if rc.chain != [node] {
            rc.chain.retain(|n| *n != node);
        }
        rc.syncing.retain(|n| *n != node);
    }
    Ok(Some(rebalanced(next, cuts)))
}

/// Graceful leave: replacements sync first; the node leaves each chain once they are in.
pub fn leave(
    config: &ClusterConfig,
    node: NodeId,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    let b = next.backends.iter_mut().find(|b| b.node == node).ok_or(Refused::UnknownNode(node))?;
    if b.state != NodeState::Alive {
        return Ok(None);
    }
    b.state = NodeState::Leaving;
    Ok(Some(rebalanced(next, cuts)))
}

/// A syncing replica caught up: it joins the chain as the new tail, and the chain sheds any
/// node the ring no longer prefers beyond R — except the old tail, which stays as the new
/// tail's predecessor until the new tail reports it serves gets ([`tail_ready`]). Dropping the
/// old tail in the same change would leave it acting as tail by its older configuration
/// (committing updates on its own ack, answering gets) until it installs the new one, while
/// the new chain already commits updates it never sees: a stale read. As the new tail's
/// predecessor it confirms the catch-up only once it has stepped down.
pub fn sync_done(
    config: &ClusterConfig,
    node: NodeId,
    range: Range,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    let ring = alive_ring(&next);
    let replicas = next.replicas;
    let rc = next
        .ranges
        .iter_mut()
        .find(|r| r.range == range && r.syncing.contains(&node))
        .ok_or_else(|| Refused::NotSyncing { node, range: range.id_string() })?;
    let old_tail = rc.tail();
    rc.syncing.retain(|n| *n != node);
    rc.chain.push(node);
    shed_unpreferred(rc, &ring, replicas, old_tail);
    Ok(Some(rebalanced(next, cuts)))
}

/// The tail `node` of `range` serves gets: its predecessor confirmed it caught up, which a
/// predecessor that still acts as tail by an older configuration never does. The chain now
/// sheds the nodes the ring no longer prefers beyond R that [`sync_done`] kept (the old tail).
/// `None` when there is nothing to shed.
pub fn tail_ready(
    config: &ClusterConfig,
    node: NodeId,
    range: Range,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    let ring = alive_ring(&next);
    let replicas = next.replicas;
    let Some(rc) = next.ranges.iter_mut().find(|r| r.range == range && r.tail() == Some(node)) else {
        return Ok(None);
    };
    if !shed_unpreferred(rc, &ring, replicas, Some(node)) {
        return Ok(None);
    }
    Ok(Some(rebalanced(next, cuts)))
}

/// Back-end `node` reports that its chain link to `peer` is cut while both still reach the
/// manager (the caller checked that both answer its heartbeats: a silent node is the failure
/// detector's business). In every range where the two are neighbours on the forwarding path,
/// one of them leaves the path ([`cut_victim`]); re-replication then avoids syncing across
/// `cuts`, which must already hold this pair. `None` when no range has them adjacent (an
/// earlier report was already handled, or the chains moved on).
///
/// **Fencing.** The removed node may still reach the front-ends and the manager, and it
/// learns of its removal only at its next configuration fetch or push. No fence is needed
/// before the new chain commits and serves, because the victim is never the range's tail:
/// * gets go only to the tail, which keeps its role, so the removed node never served a get
///   of this range in the old epoch that the new one could contradict;
/// * a removed *upstream* node (it was the cut link's sender) cannot get anything committed:
///   its updates reach the tail only over the cut link, and once the downstream node is in the
///   new epoch it drops chain messages from a node that is not its predecessor;
/// * a removed *downstream* middle node orders nothing (only the head does): whatever it still
///   forwards was ordered by the head in the old epoch and is a prefix of what the head
///   re-sends to its new successor.
///
/// Removing the downstream *tail* instead (the obvious choice for a mid↔tail cut) would need a
/// fence: the old tail keeps answering gets at the old epoch until it installs the new
/// configuration or its lease runs out, while the new tail would already commit updates it
/// never saw.
pub fn cut_link(
    config: &ClusterConfig,
    node: NodeId,
    peer: NodeId,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    for n in [node, peer] {
        let b = config.backends.iter().find(|b| b.node == n).ok_or(Refused::UnknownNode(n))?;
        if !matches!(b.state, NodeState::Alive | NodeState::Leaving) {
            return Ok(None);
        }
    }
    let mut next = config.clone();
    let mut changed = false;
    for rc in &mut next.ranges {
        let Some(victim) = cut_victim(rc, node, peer) else { continue };
        rc.splitting = None;
        rc.chain.retain(|n| *n != victim);
        rc.syncing.retain(|n| *n != victim);
        changed = true;
    }
    if !changed {
        return Ok(None);
    }
    Ok(Some(rebalanced(next, cuts)))
}

/// The node that leaves `rc`'s forwarding path when the link between `a` and `b` is cut:
/// `None` unless they are neighbours on it. Never the tail (see [`cut_link`] on fencing):
/// * head↔middle, middle↔middle: the downstream one (a middle: nothing is re-routed, the
///   upstream node re-sends its unacknowledged updates to its new successor);
/// * middle↔tail, and head↔tail in a chain of two: the upstream one, so the tail keeps
///   serving and committing (for head↔tail the tail becomes head as well);
/// * tail→syncing replica: the syncing replica (its sync could never finish).
pub fn cut_victim(rc: &RangeConfig, a: NodeId, b: NodeId) -> Option<NodeId> {
    let path: Vec<NodeId> = rc.path().collect();
    let i = path.windows(2).position(|w| (w[0] == a && w[1] == b) || (w[0] == b && w[1] == a))?;
    let (up, down) = (path[i], path[i + 1]);
    Some(if rc.tail() == Some(down) { up } else { down })
}

/// Re-evaluates re-replication after `cuts` changed (a cut the manager no longer hears about
/// is over). `None` when no sync starts.
pub fn settle(config: &ClusterConfig, cuts: &LinkCuts) -> Option<ClusterConfig> {
    if !config.formed {
        return None;
    }
    let mut next = config.clone();
    rebalance(&mut next, cuts);
    if next == *config {
        return None;
    }
    next.epoch += 1;
    Some(next)
}

/// A front-end announces its addresses. Returns `None` when nothing changed.
pub fn register_frontend(
    config: &ClusterConfig,
    id: u32,
    native_addr: &str,
    memcache_addr: &str,
) -> Result<Option<ClusterConfig>, Refused> {
    let info =
        FrontendInfo { id, native_addr: native_addr.to_string(), memcache_addr: memcache_addr.to_string() };
    if id >= config.frontends_expected {
        return Err(Refused::FrontendId { expected: config.frontends_expected, got: id });
    }
    let mut next = config.clone();
    match next.frontends.iter_mut().find(|f| f.id == id) {
        Some(f) if *f == info => return Ok(None),
        Some(f) => *f = info,
        None => {
            next.frontends.push(info);
            next.frontends.sort_by_key(|f| f.id);
        }
    }
    next.epoch += 1;
    Ok(Some(next))
}

/// `flush_all`: everything stored before `at_micros` becomes invisible at `at_micros`.
pub fn set_flush(config: &ClusterConfig, at_micros: u64) -> ClusterConfig {
    let mut next = config.clone();
    next.flush_at_micros = at_micros;
    next.epoch += 1;
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> LinkCuts {
        LinkCuts::default()
    }

    fn formed(n: u32) -> ClusterConfig {
        let mut c = initial(3, 2, 1);
        for node in 0..n {
            c = register_backend(&c, n as usize, node, &format!("a:{node}"), &none()).unwrap().unwrap();
        }
        c
    }

    /// A range marked for a merge whose head has not reported it drained, and that head.
    fn marked_merge(c: &ClusterConfig) -> Option<(NodeId, Range)> {
        let r = c.ranges.iter().find(|r| r.merging.is_some() && !r.merge_drained)?;
        Some((r.head()?, r.range))
    }

    /// Drives every split, merge, sync and tail hand-over the configuration asks for to
    /// completion.
    fn converge(mut c: ClusterConfig) -> ClusterConfig {
        for _ in 0..1000 {
            let split = c.ranges.iter().find(|r| r.splitting.is_some()).map(|r| (r.head().unwrap(), r.range));
            let synced = c.ranges.iter().find_map(|r| r.syncing.first().map(|n| (*n, r.range)));
            c = match (split, marked_merge(&c), synced) {
                (Some((head, range)), _, _) => split_ready(&c, head, range, &none()).unwrap().unwrap(),
                (None, Some((head, range)), _) => merge_ready(&c, head, range, &none()).unwrap().unwrap(),
                (None, None, Some((node, range))) => {
                    let c = sync_done(&c, node, range, &none()).unwrap().unwrap();
                    tail_ready(&c, node, range, &none()).unwrap().unwrap_or(c)
                }
                (None, None, None) => return c,
            };
        }
        panic!("splits, merges and syncs do not converge: {c:?}");
    }

    /// After convergence the configuration's ranges are exactly the alive ring's, each with
    /// the ring's preferred chain.
    fn assert_ranges_are_the_rings(c: &ClusterConfig) {
        let ring = alive_ring(c);
        let ends: Vec<KeyId> = c.ranges.iter().map(|r| r.range.end_inclusive).collect();
        let mut vids: Vec<KeyId> = ring.vids().iter().map(|v| v.id).collect();
        vids.sort();
        assert_eq!(ends, vids, "the ranges are not the ring's: {:?}", c.ranges);
        for rc in &c.ranges {
            assert!(same_nodes(&rc.chain, &preferred(&ring, &rc.range)), "{rc:?}");
            assert!(rc.merging.is_none() && rc.splitting.is_none(), "{rc:?}");
        }
    }

    #[test]
    fn a_node_whose_logs_may_lack_acknowledged_writes_resyncs_before_serving() {
        let c = formed(3);
        let held: Vec<Range> = c.ranges.iter().filter(|r| r.chain.contains(&1)).map(|r| r.range).collect();
        assert!(!held.is_empty());
        let next = register_backend_unproven(&c, 3, 1, "a:1", &none()).unwrap().unwrap();
        assert!(next.epoch > c.epoch);
        for rc in next.ranges.iter().filter(|r| held.contains(&r.range)) {
            assert!(!rc.chain.contains(&1), "node 1 still serves {rc:?}");
            assert!(rc.syncing.contains(&1), "node 1 does not resync {rc:?}");
        }
        assert!(next.backends.iter().any(|b| b.node == 1 && b.state == NodeState::Alive));
        // Once synced it is a replica again, as before.
        assert_ranges_are_the_rings(&converge(next));
        // A proven restart changes nothing.
        assert!(register_backend(&c, 3, 1, "a:1", &none()).unwrap().is_none());
    }

    #[test]
    fn a_leave_merges_the_ranges_back_into_the_rings() {
        let c = converge(register_backend(&formed(4), 4, 4, "a:4", &none()).unwrap().unwrap());
        assert_ranges_are_the_rings(&c);
        let joined = c.ranges.len();
        let c = leave(&c, 4, &none()).unwrap().unwrap();
        // Nothing merges while the leaver is still in chains: its replacements sync first.
        assert!(c.ranges.iter().all(|r| r.merging.is_none() || !r.path().any(|n| n == 4)));
        let c = converge(c);
        assert_eq!(c.backends[4].state, NodeState::Left);
        assert_ranges_are_the_rings(&c);
        assert_eq!(c.ranges.len(), joined - 2, "the leaver's two virtual ids are boundaries no more");
    }

    /// Node 4 joins a formed 4-node cluster, everything converges, then it leaves: the
    /// configuration once its replacements are in and the first pair is marked for a merge.
    fn joined_then_leaving_until_a_merge_is_marked() -> ClusterConfig {
        let c = converge(register_backend(&formed(4), 4, 4, "a:4", &none()).unwrap().unwrap());
        let mut c = leave(&c, 4, &none()).unwrap().unwrap();
        while marked_merge(&c).is_none() {
            let (node, range) =
                c.ranges.iter().find_map(|r| r.syncing.first().map(|n| (*n, r.range))).unwrap();
            c = sync_done(&c, node, range, &none()).unwrap().unwrap();
            c = tail_ready(&c, node, range, &none()).unwrap().unwrap_or(c);
        }
        c
    }

    #[test]
    fn a_merge_reports_only_from_the_head_of_a_marked_pair() {
        let c = joined_then_leaving_until_a_merge_is_marked();
        let (_, first) = marked_merge(&c).unwrap();
        let at = c.ranges.iter().find(|r| r.range == first).unwrap().merging.unwrap();
        let lower = c.ranges.iter().find(|r| r.range.end_inclusive == at).unwrap().clone();
        let upper = c.ranges.iter().find(|r| r.range.start_exclusive == at).unwrap().clone();
        assert_eq!(upper.merging, Some(at), "both ranges of the pair are marked");
        assert!(same_nodes(&lower.chain, &upper.chain));
        // Not the head: an old or foreign report changes nothing.
        assert_eq!(merge_ready(&c, lower.chain[1], lower.range, &none()).unwrap(), None);
        let half = merge_ready(&c, lower.chain[0], lower.range, &none()).unwrap().unwrap();
        assert_eq!(half.ranges.len(), c.ranges.len(), "one head's report does not merge");
        assert_eq!(merge_ready(&half, lower.chain[0], lower.range, &none()).unwrap(), None, "said twice");
        let merged = merge_ready(&half, upper.chain[0], upper.range, &none()).unwrap().unwrap();
        assert_eq!(merged.ranges.len(), c.ranges.len() - 1);
        let m = merged.ranges.iter().find(|r| r.range.end_inclusive == upper.range.end_inclusive).unwrap();
        assert_eq!(m.range, Range::new(lower.range.start_exclusive, upper.range.end_inclusive));
        assert_eq!(m.chain, upper.chain, "the merged range keeps the upper one's chain");
        assert!(m.merging.is_none() && !m.merge_drained);
        // An old report for the merged pair changes nothing.
        assert_eq!(merge_ready(&merged, lower.chain[0], lower.range, &none()).unwrap(), None);
    }

    #[test]
    fn a_failure_in_a_pair_being_merged_calls_the_merge_off_and_a_failed_nodes_ids_stay() {
        let c = joined_then_leaving_until_a_merge_is_marked();
        let (head, marked) = marked_merge(&c).unwrap();
        let c = merge_ready(&c, head, marked, &none()).unwrap().unwrap();
        let victim = c.ranges.iter().find(|r| r.range == marked).unwrap().chain[1];
        let failed = fail_node(&c, victim, &none()).unwrap().unwrap();
        for rc in failed.ranges.iter().filter(|r| r.path().any(|n| n == victim) || r.chain.len() < 3) {
            assert!(
                rc.merging.is_none() && !rc.merge_drained,
                "a pair short of a replica is still marked: {rc:?}"
            );
        }
        assert_eq!(merge_ready(&failed, head, marked, &none()).unwrap(), None);
        // Re-replication first, then the merges; the failed node's ids stay boundaries.
        let c = converge(failed);
        let ring = alive_ring(&c);
        let present = Ring::new(&[0, 1, 2, 3, victim], c.vnodes, c.replicas);
        assert_eq!(c.ranges.len(), present.vids().len());
        for rc in &c.ranges {
            assert!(same_nodes(&rc.chain, &preferred(&ring, &rc.range)), "{rc:?}");
        }
    }

    #[test]
    fn a_join_splits_the_ranges_its_virtual_ids_fall_in() {
        let c = formed(4);
        let before = c.ranges.len();
        let joined = register_backend(&c, 4, 4, "a:4", &none()).unwrap().unwrap();
        let marked: Vec<_> = joined.ranges.iter().filter(|r| r.splitting.is_some()).collect();
        assert!(!marked.is_empty(), "no range marked for the joiner's ids");
        for rc in &marked {
            assert!(rc.syncing.is_empty(), "a sync started into a range being split: {rc:?}");
        }
        // Not the head: an old or foreign report changes nothing.
        let rc = marked[0];
        let not_head = rc.chain.iter().copied().find(|n| Some(*n) != rc.head()).unwrap();
        assert!(split_ready(&joined, not_head, rc.range, &none()).unwrap().is_none());
        let split = split_ready(&joined, rc.head().unwrap(), rc.range, &none()).unwrap().unwrap();
        let at = rc.splitting.unwrap();
        let lower =
            split.ranges.iter().find(|r| r.range == Range::new(rc.range.start_exclusive, at)).unwrap();
        let upper = split.ranges.iter().find(|r| r.range == Range::new(at, rc.range.end_inclusive)).unwrap();
        assert!(lower.chain == rc.chain || !lower.syncing.is_empty(), "{lower:?}");
        assert_eq!(upper.chain, rc.chain);
        assert!(split.ranges.windows(2).all(|w| w[0].range.end_inclusive < w[1].range.end_inclusive));

        let c = converge(joined);
        let ring = alive_ring(&c);
        let mut want: Vec<Range> = ring.ranges().into_iter().map(|(r, _)| r).collect();
        want.sort_by_key(|r| r.end_inclusive);
        let have: Vec<Range> = c.ranges.iter().map(|r| r.range).collect();
        assert_eq!(have, want, "the ranges are not the ring's after the join");
        assert_eq!(c.ranges.len(), before + 2, "two virtual ids, two splits");
        for r in &c.ranges {
            let (mut have, mut want) = (r.chain.clone(), preferred(&ring, &r.range));
            have.sort_unstable();
            want.sort_unstable();
            assert_eq!(have, want, "the chain is not the ring's preferred: {r:?}");
        }
        for vid in ring.vids_of(4) {
            let rc = c.ranges.iter().find(|r| r.range.end_inclusive == vid.id).unwrap();
            // A new replica enters a chain at its tail (chain order is not ring order).
            assert!(rc.chain.contains(&4), "the joiner does not hold its own range: {rc:?}");
        }
    }

    #[test]
    fn a_failure_in_a_range_being_split_calls_the_split_off_until_the_chain_is_whole() {
        let c = register_backend(&formed(4), 4, 4, "a:4", &none()).unwrap().unwrap();
        let rc = c.ranges.iter().find(|r| r.splitting.is_some()).unwrap().clone();
        let victim = *rc.chain.last().unwrap();
        let c = fail_node(&c, victim, &none()).unwrap().unwrap();
        let after = c.ranges.iter().find(|r| r.range == rc.range).unwrap();
        assert_eq!(after.splitting, None, "{after:?}");
        assert_eq!(after.syncing.len(), 1, "re-replication comes first: {after:?}");
        // The old head's report is ignored; the split is planned again once the chain is whole.
        assert!(split_ready(&c, rc.head().unwrap(), rc.range, &none()).unwrap().is_none());
        let c = converge(c);
        assert!(c.ranges.iter().all(|r| r.splitting.is_none() && r.chain.len() == 3));
    }

    #[test]
    fn ranges_form_at_the_expected_count() {
        let c = initial(3, 2, 1);
        let c = register_backend(&c, 2, 1, "a:1", &none()).unwrap().unwrap();
        assert!(!c.formed && c.ranges.is_empty());
        let c = register_backend(&c, 2, 2, "a:2", &none()).unwrap().unwrap();
        assert!(c.formed);
        assert_eq!(c.ranges.len(), 4);
        assert!(c.ranges.iter().all(|r| r.chain.len() == 2 && r.syncing.is_empty()));
        assert!(register_backend(&c, 2, 2, "a:2", &none()).unwrap().is_none());
        let moved = register_backend(&c, 2, 2, "a:9", &none()).unwrap().unwrap();
        assert_eq!(moved.backends[1].addr, "a:9");
    }

    #[test]
    fn the_last_replica_of_a_range_stays_in_its_chain_and_serves_when_back() {
        let c = formed(4);
        let mut c = c;
        for node in [0, 1, 2, 3] {
            c = fail_node(&c, node, &none()).unwrap().unwrap();
            assert!(
                c.ranges.iter().all(|r| !r.chain.is_empty()),
                "a chain emptied after failing {node}: {c:?}"
            );
        }
        // Every chain is down to the one node that failed last among its replicas.
        assert!(c.ranges.iter().all(|r| r.chain.len() == 1));
        let c = register_backend(&c, 4, 3, "a:3", &none()).unwrap().unwrap();
        for rc in c.ranges.iter().filter(|r| r.chain == [3]) {
            assert!(rc.syncing.is_empty(), "no other alive node to sync to: {rc:?}");
        }
        // A node coming back syncs onto the chains it is preferred for, from their survivors.
        let c = register_backend(&c, 4, 0, "a:0", &none()).unwrap().unwrap();
        assert!(c.ranges.iter().any(|r| r.syncing.contains(&0)));
    }

    #[test]
    fn a_failure_shortens_chains_and_starts_re_replication() {
        let c = formed(4);
        let c = fail_node(&c, 1, &none()).unwrap().unwrap();
        for rc in &c.ranges {
            assert!(!rc.chain.contains(&1) && !rc.syncing.contains(&1));
            assert!(rc.chain.len() >= 2);
            assert_eq!(rc.chain.len() + rc.syncing.len(), 3, "{rc:?}");
        }
        // Finishing every sync restores R in-sync replicas.
        let mut c = c;
        while let Some((node, range)) = c.ranges.iter().find_map(|r| r.syncing.first().map(|n| (*n, r.range)))
        {
            c = sync_done(&c, node, range, &none()).unwrap().unwrap();
        }
        assert!(c.ranges.iter().all(|r| r.chain.len() == 3));
    }

    #[test]
    fn a_failed_node_rejoins_through_sync() {
        let c = formed(3);
        let c = fail_node(&c, 2, &none()).unwrap().unwrap();
        assert!(c.ranges.iter().all(|r| r.chain.len() == 2 && r.syncing.is_empty()));
        let c = register_backend(&c, 3, 2, "a:2", &none()).unwrap().unwrap();
        assert!(c.ranges.iter().all(|r| r.syncing == vec![2]));
    }

    #[test]
    fn a_leaver_stays_until_its_replacement_is_in_sync() {
        let c = formed(4);
        let c = leave(&c, 0, &none()).unwrap().unwrap();
        let holding: Vec<_> = c.ranges.iter().filter(|r| r.chain.contains(&0)).collect();
        assert!(!holding.is_empty());
        assert!(holding.iter().all(|r| r.syncing.len() == 1));
        let mut c = c;
        while let Some((node, range)) = c.ranges.iter().find_map(|r| r.syncing.first().map(|n| (*n, r.range)))
        {
            c = sync_done(&c, node, range, &none()).unwrap().unwrap();
            if let Some(next) = tail_ready(&c, node, range, &none()).unwrap() {
                c = next;
            }
        }
        assert!(c.ranges.iter().all(|r| !r.chain.contains(&0) && r.chain.len() == 3));
        assert_eq!(c.backends[0].state, NodeState::Left);
    }

    #[test]
    fn the_old_tail_leaves_only_once_the_new_tail_is_ready() {
        let c = formed(4);
        // Node 0 leaves; take a range where it is the tail.
        let c = leave(&c, 0, &none()).unwrap().unwrap();
        let rc = c.ranges.iter().find(|r| r.tail() == Some(0) && r.syncing.len() == 1).unwrap().clone();
        let s = rc.syncing[0];
        let c = sync_done(&c, s, rc.range, &none()).unwrap().unwrap();
        let after = c.ranges.iter().find(|r| r.range == rc.range).unwrap();
        assert_eq!(after.tail(), Some(s));
        assert_eq!(after.predecessor(s), Some(0), "the old tail left with the promotion: {after:?}");
        assert_ne!(c.backends[0].state, NodeState::Left);
        // Only the new tail's report sheds it.
        assert!(tail_ready(&c, 0, rc.range, &none()).unwrap().is_none());
        let c = tail_ready(&c, s, rc.range, &none()).unwrap().unwrap();
        let after = c.ranges.iter().find(|r| r.range == rc.range).unwrap();
        assert!(!after.chain.contains(&0) && after.chain.len() == 3 && after.tail() == Some(s), "{after:?}");
        assert!(tail_ready(&c, s, rc.range, &none()).unwrap().is_none());
    }

    fn cuts(pairs: &[(NodeId, NodeId)]) -> LinkCuts {
        let mut c = LinkCuts::default();
        for (a, b) in pairs {
            c.insert(*a, *b);
        }
        c
    }

    fn adjacent(rc: &RangeConfig, a: NodeId, b: NodeId) -> bool {
        let path: Vec<NodeId> = rc.path().collect();
        path.windows(2).any(|w| (w[0] == a && w[1] == b) || (w[0] == b && w[1] == a))
    }

    #[test]
    fn a_cut_link_removes_the_middle_node_and_never_the_tail() {
        let c = formed(4);
        let mut seen = (false, false);
        for rc in c.ranges.clone() {
            let (head, mid, tail) = (rc.chain[0], rc.chain[1], rc.chain[2]);
            // head↔mid: the downstream middle leaves; mid↔tail: the upstream middle leaves.
            for (up, down) in [(head, mid), (mid, tail)] {
                assert_eq!(cut_victim(&rc, up, down), Some(mid));
                assert_eq!(cut_victim(&rc, down, up), Some(mid), "the report's direction does not matter");
                let next = cut_link(&c, up, down, &cuts(&[(up, down)])).unwrap().unwrap();
                assert_eq!(next.epoch, c.epoch + 1);
                let after = next.ranges.iter().find(|r| r.range == rc.range).unwrap();
                assert_eq!(after.chain, vec![head, tail], "{rc:?} cut {up}<->{down}");
                // Every range is repaired in the same transition, and none had its tail moved.
                for (old, new) in c.ranges.iter().zip(&next.ranges) {
                    assert!(!adjacent(new, up, down), "{new:?} still links {up}<->{down}");
                    assert_eq!(old.tail(), new.tail(), "a cut moved a tail: {old:?} -> {new:?}");
                }
                // A second report of the same cut changes nothing.
                assert!(cut_link(&next, up, down, &cuts(&[(up, down)])).unwrap().is_none());
                seen = (seen.0 || up == head, seen.1 || down == tail);
            }
        }
        assert!(seen.0 && seen.1);
        // Not neighbours anywhere: nothing to do.
        let rc = &c.ranges[0];
        let mut d = c.clone();
        for r in &mut d.ranges {
            r.chain = rc.chain.clone();
        }
        assert!(cut_link(&d, rc.chain[0], rc.chain[2], &none()).unwrap().is_none());
    }

    #[test]
    fn a_cut_between_head_and_tail_of_a_chain_of_two_keeps_the_tail() {
        let mut c = initial(2, 1, 1);
        for node in 0..2 {
            c = register_backend(&c, 2, node, &format!("a:{node}"), &none()).unwrap().unwrap();
        }
        let rc = c.ranges[0].clone();
        let (head, tail) = (rc.chain[0], rc.chain[1]);
        let next = cut_link(&c, head, tail, &cuts(&[(head, tail)])).unwrap().unwrap();
        for r in &next.ranges {
            assert_eq!(r.chain.len(), 1, "{r:?}");
            assert!(r.syncing.is_empty(), "no sync across the cut: {r:?}");
        }
        assert_eq!(next.ranges.iter().find(|r| r.range == rc.range).unwrap().chain, vec![tail]);
    }

    #[test]
    fn a_cut_to_a_syncing_replica_drops_the_sync_and_does_not_restart_it_across_the_cut() {
        let c = formed(4);
        let c = fail_node(&c, 1, &none()).unwrap().unwrap();
        let rc = c.ranges.iter().find(|r| !r.syncing.is_empty()).unwrap().clone();
        let (tail, s) = (rc.tail().unwrap(), rc.syncing[0]);
        assert_eq!(cut_victim(&rc, tail, s), Some(s));
        let cut = cuts(&[(tail, s)]);
        let next = cut_link(&c, s, tail, &cut).unwrap().unwrap();
        let after = next.ranges.iter().find(|r| r.range == rc.range).unwrap();
        assert_eq!(after.chain, rc.chain);
        assert!(!after.syncing.contains(&s), "{after:?}");
    }

    #[test]
    fn re_replication_cut_off_from_the_tail_takes_another_node_and_hands_back_after_the_cut() {
        // Five nodes, R = 3, node 1 failed: a short chain's preferred target is cut off from
        // the tail during its sync. The sync is dropped and another alive node re-replicates
        // the range; once the cut is over, the ring's preferred node syncs and the stand-in is
        // shed (after the new tail is readable, as for a join).
        let c = formed(5);
        let c = fail_node(&c, 1, &none()).unwrap().unwrap();
        let rc = c.ranges.iter().find(|r| !r.syncing.is_empty()).unwrap().clone();
        let (tail, s) = (rc.tail().unwrap(), rc.syncing[0]);
        let cut = cuts(&[(tail, s)]);
        let c = cut_link(&c, s, tail, &cut).unwrap().unwrap();
        let after = c.ranges.iter().find(|r| r.range == rc.range).unwrap().clone();
        assert_eq!(after.chain, rc.chain, "a cut to a syncing replica changed the chain");
        assert_eq!(after.syncing.len(), 1, "no other node re-replicates the range: {after:?}");
        let x = after.syncing[0];
        assert!(x != s && x != 1 && !rc.chain.contains(&x), "{after:?}");
        assert!(!cut.contains(tail, x));
        // Other transitions during the cut do not sync across it.
        for r in &c.ranges {
            assert!(!(r.tail() == Some(tail) && r.syncing.contains(&s)), "{r:?}");
        }
        let c = sync_done(&c, x, rc.range, &cut).unwrap().unwrap();
        let after = c.ranges.iter().find(|r| r.range == rc.range).unwrap().clone();
        assert_eq!(after.chain.len(), 3, "{after:?}");
        assert_eq!(after.tail(), Some(x));
        // The cut is over: the preferred node comes back, the stand-in goes once s is ready.
        let mut c = settle(&c, &none()).unwrap_or(c);
        let mut steps = 0;
        while let Some((node, range)) = c.ranges.iter().find_map(|r| r.syncing.first().map(|n| (*n, r.range)))
        {
            c = sync_done(&c, node, range, &none()).unwrap().unwrap();
            if let Some(next) = tail_ready(&c, node, range, &none()).unwrap() {
                c = next;
            }
            steps += 1;
            assert!(steps < 100, "syncs do not converge: {c:?}");
        }
        let ring = alive_ring(&c);
        for r in &c.ranges {
            let mut want = preferred(&ring, &r.range);
            let mut have = r.chain.clone();
            want.sort_unstable();
            have.sort_unstable();
            assert_eq!(have, want, "the chain is not back on the ring's preferred nodes: {r:?}");
        }
    }

    #[test]
    fn a_join_cut_off_from_the_tail_is_dropped_and_retried_after_the_cut() {
        // A join (the chain holds R in-sync replicas): the joiner cut off from a tail it syncs
        // from leaves those syncs; no other node stands in (nothing is short), and the join of
        // those ranges starts again once the cut is over.
        let c = formed(3);
        let c = register_backend(&c, 3, 3, "a:3", &none()).unwrap().unwrap();
        let rc = c.ranges.iter().find(|r| r.syncing == [3]).unwrap().clone();
        let tail = rc.tail().unwrap();
        let cut = cuts(&[(tail, 3)]);
        let next = cut_link(&c, 3, tail, &cut).unwrap().unwrap();
        for (old, new) in c.ranges.iter().zip(&next.ranges) {
            assert_eq!(old.chain, new.chain, "a cut to a syncing replica changed a chain");
            if old.tail() == Some(tail) {
                assert!(new.syncing.is_empty(), "{new:?}");
            } else {
                assert_eq!(old.syncing, new.syncing, "a sync not across the cut was dropped");
            }
        }
        assert!(settle(&next, &cut).is_none(), "a sync started across the cut");
        let healed = settle(&next, &none()).unwrap();
        let again = healed.ranges.iter().find(|r| r.range == rc.range).unwrap();
        assert_eq!(again.syncing, vec![3], "the join is not retried after the cut: {again:?}");
    }

    #[test]
    fn re_replication_waits_for_the_cut_to_end() {
        // Three nodes, R = 3: the only node that can restore a chain is the one cut off.
        let c = formed(3);
        let rc = c.ranges[0].clone();
        let (mid, tail) = (rc.chain[1], rc.chain[2]);
        let cut = cuts(&[(mid, tail)]);
        let c = cut_link(&c, mid, tail, &cut).unwrap().unwrap();
        for r in &c.ranges {
            assert!(!adjacent(r, mid, tail), "{r:?}");
        }
        // Other transitions while the cut lasts do not sync across it either.
        let c = register_backend(&c, 3, 0, "a:moved", &cut).unwrap().unwrap();
        for r in &c.ranges {
            assert!(!adjacent(r, mid, tail), "{r:?}");
        }
        assert!(settle(&c, &cut).is_none());
        // The cut is over: the short chains sync their missing replica again.
        let mut c = settle(&c, &none()).unwrap();
        assert!(c.ranges.iter().any(|r| !r.syncing.is_empty()));
        while let Some((node, range)) = c.ranges.iter().find_map(|r| r.syncing.first().map(|n| (*n, r.range)))
        {
            c = sync_done(&c, node, range, &none()).unwrap().unwrap();
        }
        assert!(c.ranges.iter().all(|r| r.chain.len() == 3), "{c:?}");
    }

    #[test]
    fn link_cut_repairs_interleaved_with_failures_and_syncs_never_move_a_tail() {
        // Seeded random walk over cuts, heals, failures, rejoins and finished syncs. The
        // fencing invariant: a link-cut repair never changes any range's tail, never empties
        // a chain, and leaves the two nodes adjacent nowhere.
        use rand::{Rng, SeedableRng};
        for seed in 0..200u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let n = rng.gen_range(2..6u32);
            let mut c = initial(rng.gen_range(2..4), 2, 1);
            for node in 0..n {
                c = register_backend(&c, n as usize, node, &format!("a:{node}"), &none()).unwrap().unwrap();
            }
            let mut cut = LinkCuts::default();
            for step in 0..40 {
                let ctx = format!("seed {seed} step {step}");
                match rng.gen_range(0..6) {
                    0 | 1 => {
                        let rc = &c.ranges[rng.gen_range(0..c.ranges.len())];
                        let path: Vec<NodeId> = rc.path().collect();
                        if path.len() < 2 {
                            continue;
                        }
                        let i = rng.gen_range(0..path.len() - 1);
                        let (a, b) = (path[i], path[i + 1]);
                        cut.insert(a, b);
                        let Some(next) = cut_link(&c, b, a, &cut).unwrap() else { continue };
                        for (old, new) in c.ranges.iter().zip(&next.ranges) {
                            assert_eq!(old.tail(), new.tail(), "{ctx}: tail moved {old:?} -> {new:?}");
                            assert!(!adjacent(new, a, b), "{ctx}: {new:?} still links {a}<->{b}");
                        }
                        c = next;
                    }
                    2 => {
                        cut = LinkCuts::default();
                        if let Some(next) = settle(&c, &cut) {
                            c = next;
                        }
                    }
                    3 => {
                        // Nodes n and n + 1 join (their virtual ids split ranges).
                        let node = rng.gen_range(0..n + 2);
                        let known = c.backends.iter().any(|b| b.node == node);
                        let next = if known && rng.gen_bool(0.5) {
                            if rng.gen_bool(0.5) {
                                fail_node(&c, node, &cut).unwrap()
                            } else {
                                leave(&c, node, &cut).unwrap()
                            }
                        } else {
                            register_backend(&c, n as usize, node, &format!("a:{node}"), &cut).unwrap()
                        };
                        if let Some(next) = next {
                            c = next;
                        }
                    }
                    4 => {
                        let marked = c.ranges.iter().find(|r| r.splitting.is_some());
                        if let Some((head, range)) = marked.and_then(|r| Some((r.head()?, r.range))) {
                            if let Some(next) = split_ready(&c, head, range, &cut).unwrap() {
                                c = next;
                            }
                        }
                        if let Some((head, range)) = marked_merge(&c) {
                            if let Some(next) = merge_ready(&c, head, range, &cut).unwrap() {
                                c = next;
                            }
                        }
                    }
                    _ => {
                        let synced = c.ranges.iter().find_map(|r| r.syncing.first().map(|s| (*s, r.range)));
                        if let Some((node, range)) = synced {
                            c = sync_done(&c, node, range, &cut).unwrap().unwrap();
                        }
                    }
                }
                assert!(c.ranges.iter().all(|r| !r.chain.is_empty()), "{ctx}: empty chain {c:?}");
                // The ranges stay sorted and tile the ring, however they were split.
                let tiled = c.ranges.windows(2).all(|w| {
                    w[0].range.end_inclusive < w[1].range.end_inclusive
                        && w[0].range.end_inclusive == w[1].range.start_exclusive
                });
                let wraps = c.ranges.len() < 2
                    || c.ranges[0].range.start_exclusive == c.ranges[c.ranges.len() - 1].range.end_inclusive;
                assert!(tiled && wraps, "{ctx}: ranges do not tile the ring: {:?}", c.ranges);
                for r in c.ranges.iter().filter(|r| r.splitting.is_some()) {
                    assert!(r.syncing.is_empty(), "{ctx}: a sync into a range being split: {r:?}");
                }
                // A range being merged is quiet, unsplit and paired with its neighbour.
                let k = c.ranges.len();
                for (i, r) in c.ranges.iter().enumerate() {
                    let Some(at) = r.merging else { continue };
                    assert!(r.syncing.is_empty() && r.splitting.is_none(), "{ctx}: {r:?}");
                    let partner = if at == r.range.end_inclusive {
                        &c.ranges[(i + 1) % k]
                    } else {
                        assert_eq!(at, r.range.start_exclusive, "{ctx}: {r:?}");
                        &c.ranges[(i + k - 1) % k]
                    };
                    assert!(
                        partner.merging == Some(at) && same_nodes(&partner.chain, &r.chain),
                        "{ctx}: {r:?} / {partner:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn frontends_register_in_any_order_within_the_expected_count() {
        let c = initial(3, 2, 2);
        assert!(register_frontend(&c, 2, "n", "m").is_err());
        let c = register_frontend(&c, 1, "n1", "m1").unwrap().unwrap();
        let c = register_frontend(&c, 0, "n0", "m0").unwrap().unwrap();
        assert_eq!(c.frontends.iter().map(|f| f.id).collect::<Vec<_>>(), vec![0, 1]);
    }
}
