//! The manager's configuration state machine: pure transitions on [`ClusterConfig`].
//!
//! Kept free of I/O so it can later be driven by a replicated log (Raft) unchanged: each
//! transition takes the current config and returns the next one (or a refusal).
//!
//! Transitions that may start re-replication also take the [`LinkCuts`] the manager currently
//! believes in, so that no sync is started across a cut chain link.

use std::collections::BTreeSet;

use fawn_proto::native::{BackendInfo, ClusterConfig, NodeState, RangeConfig};
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
/// join, and a failed, departed or degraded node coming back rejoins: both are added to the
/// chains that prefer them as syncing replicas. Returns `None` when nothing changed.
fn add_backend(
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
            if matches!(b.state, NodeState::Failed | NodeState::Left | NodeState::Degraded) {
                b.state = NodeState::Alive;
                b.reason = None;
            }
        }
        None => {
            let state = NodeState::Alive;
            next.backends.push(BackendInfo { node, addr: addr.to_string(), state, reason: None });
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

/// A back-end registers: at its start, or when its process, still running, finds itself
/// declared failed. A registration from a node the configuration still has alive in a chain
/// therefore comes from a new process, which has lost what only memory held: above all the
/// request outcomes its replicas remember so that a client's retry is decided once
/// (`replica::dedup`), and, if its host restarted under a sync policy that lets acknowledged
/// writes wait in the page cache, the end of its logs. It must not resume its chain positions
/// (as head it would order a retry of an update it had already ordered a second time): it is
/// failed first, so that registering adds it back as a syncing replica of its ranges, which
/// asks the tail for the suffix after its last record and serves only once it caught up. A
/// *leaving* node's new process is failed out of its chains the same way, and goes on leaving
/// (its replacements sync from the other replicas). A node in no chain, or the last proven
/// replica of a range ([`last_proven`]), registers as usual.
pub fn register_backend(
    config: &ClusterConfig,
    expected_backends: usize,
    node: NodeId,
    addr: &str,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    let state = config.backends.iter().find(|b| b.node == node).map(|b| b.state);
    let in_a_chain = config.ranges.iter().any(|rc| rc.chain.contains(&node) && !last_proven(rc, node));
    if state == Some(NodeState::Leaving) && in_a_chain {
        return Ok(fail_node(config, node, cuts)?.map(|next| still_leaving(next, node, addr, cuts)));
    }
    let alive = state == Some(NodeState::Alive);
    let failed = if alive && in_a_chain { fail_node(config, node, cuts)? } else { None };
    let base = failed.as_ref().unwrap_or(config);
    Ok(add_backend(base, expected_backends, node, addr, cuts)?.or(failed))
}

/// `next`, where the leaving `node` was just failed out of its chains: it is leaving again
/// (at `addr`), and has left if it holds no range any more.
fn still_leaving(mut next: ClusterConfig, node: NodeId, addr: &str, cuts: &LinkCuts) -> ClusterConfig {
    if let Some(b) = next.backends.iter_mut().find(|b| b.node == node) {
        b.state = NodeState::Leaving;
        b.addr = addr.to_string();
    }
    rebalance(&mut next, cuts);
    next
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
/// Ranges already syncing, or whose new tail is not yet proven ([`tail_ready`]), wait: one
/// membership change per range at a time. A node whose link
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
        let busy = !rc.syncing.is_empty() || rc.unproven_tail.is_some();
        if busy || rc.chain.is_empty() || rc.splitting.is_some() || rc.merging.is_some() {
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

/// No replica syncing, no unproven tail, the chain at R (`want`) and every member alive.
fn quiet_and_whole(rc: &RangeConfig, ring: &Ring, want: usize) -> bool {
    rc.syncing.is_empty()
        && rc.unproven_tail.is_none()
        && rc.chain.len() >= want
        && rc.chain.iter().all(|n| ring.nodes().contains(n))
}

/// **Architecture invariant: an acknowledged update is on every proven replica of its range,
/// and a range always keeps one.** A chain member is *proven* — known to hold every update
/// the range acknowledged — unless it is the [`RangeConfig::unproven_tail`]: a tail appended
/// by [`sync_done`] holds what its source had when the copy ended, but the old tail goes on
/// acknowledging updates alone (by its older configuration, as the chain's tail) until it
/// installs the new one, and what it forwarded meanwhile may be lost. Only once the old tail,
/// stepped down, has re-sent its log after the new tail's last update and confirmed it
/// (`CaughtUp`) does the new tail hold everything: it then reports [`tail_ready`]. Until then
/// no transition removes the chain's last proven member: when it fails it stays in the chain
/// (failed), and the range waits for it — unavailable — rather than be served by a node that
/// may miss acknowledged updates.
fn last_proven(rc: &RangeConfig, node: NodeId) -> bool {
    rc.chain.contains(&node) && rc.chain.iter().all(|n| *n == node || Some(*n) == rc.unproven_tail)
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
/// itself: its neighbours become adjacent) and start re-replication. The last proven replica
/// of a range ([`last_proven`]) stays in its chain: it holds every committed update, so the
/// range serves again as soon as that node is back (an emptied chain could never be refilled;
/// found by the link-cut fault test when an overloaded machine made the manager miss three
/// back-ends at once; a chain left to an unproven tail could serve without updates the failed
/// node acknowledged, found by the simulator). A failed unproven tail is dropped like any
/// other member.
pub fn fail_node(
    config: &ClusterConfig,
    node: NodeId,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    let b = next.backends.iter_mut().find(|b| b.node == node).ok_or(Refused::UnknownNode(node))?;
    if matches!(b.state, NodeState::Failed | NodeState::Left | NodeState::Degraded) {
        return Ok(None);
    }
    b.state = NodeState::Failed;
    drop_from_chains(&mut next, node);
    Ok(Some(rebalanced(next, cuts)))
}

/// Longest `BackendInfo::reason` kept (bytes): a reason is one error message, and a back-end
/// must not grow the configuration every process fetches.
pub const REASON_BYTES_MAX: usize = 256;

/// Back-end `node` reports that one of its datastores fails writes (`reason`: a full disk, an
/// I/O error, a store poisoned by a failed fsync) while it still runs and answers pings, so
/// the failure detector never removes it and every put to its ranges would wait for it. It
/// leaves every chain as for a failure ([`fail_node`]: the last proven replica of a range
/// stays, so that range waits for it, gets included) and re-replication elsewhere starts; it
/// is marked [`NodeState::Degraded`] with the reason, so the ring leaves it out and the
/// detector stops watching it. It serves again only after it registers again
/// ([`register_backend`]: a restart of the back-end once its disk has room), or it is retired
/// ([`leave`]). A report from a node that is not alive or leaving changes nothing.
pub fn degrade_node(
    config: &ClusterConfig,
    node: NodeId,
    reason: &str,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    let b = next.backends.iter_mut().find(|b| b.node == node).ok_or(Refused::UnknownNode(node))?;
    if !matches!(b.state, NodeState::Alive | NodeState::Leaving) {
        return Ok(None);
    }
    b.state = NodeState::Degraded;
    b.reason = Some(truncated(reason, REASON_BYTES_MAX));
    drop_from_chains(&mut next, node);
    Ok(Some(rebalanced(next, cuts)))
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn truncated(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Takes `node` out of every range's forwarding path, but where it is the last proven replica
/// ([`last_proven`]), and stops any split of a range it was on.
fn drop_from_chains(next: &mut ClusterConfig, node: NodeId) {
    for rc in &mut next.ranges {
        if rc.path().any(|n| n == node) {
            // A split waits for a whole chain again (`plan_splits`).
            rc.splitting = None;
        }
        if !last_proven(rc, node) {
            rc.chain.retain(|n| *n != node);
        }
        if rc.unproven_tail == Some(node) {
            rc.unproven_tail = None;
        }
        rc.syncing.retain(|n| *n != node);
    }
}

/// Graceful leave: replacements sync first; the node leaves each chain once they are in. A
/// degraded node ([`degrade_node`]) may leave too: it is in no chain but where it is a range's
/// last proven replica, so it has left once those ranges have other proven replicas.
pub fn leave(
    config: &ClusterConfig,
    node: NodeId,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    let b = next.backends.iter_mut().find(|b| b.node == node).ok_or(Refused::UnknownNode(node))?;
    if !matches!(b.state, NodeState::Alive | NodeState::Degraded) {
        return Ok(None);
    }
    b.state = NodeState::Leaving;
    b.reason = None;
    Ok(Some(rebalanced(next, cuts)))
}

/// A syncing replica caught up: it joins the chain as the new tail, the range's
/// [`RangeConfig::unproven_tail`], and the chain sheds nothing yet: the nodes the ring no
/// longer prefers beyond R (the old tail among them) leave only once the new tail reports it
/// serves gets ([`tail_ready`]).
/// * Dropping the old tail in the same change would leave it acting as tail by its older
///   configuration (committing updates on its own ack, answering gets) until it installs the
///   new one, while the new chain already commits updates it never sees: a stale read. As the
///   new tail's predecessor it confirms the catch-up only once it has stepped down.
/// * Dropping any other proven replica (a leaver, a node a join displaces) would leave the
///   range with one proven replica fewer while the new one is not yet a copy: should the rest
///   fail before the new tail is proven, the range's last proven replica could be one whose
///   disk is already lost, while a live node holding the data had been let go.
pub fn sync_done(
    config: &ClusterConfig,
    node: NodeId,
    range: Range,
    cuts: &LinkCuts,
) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    let rc = next
        .ranges
        .iter_mut()
        .find(|r| r.range == range && r.syncing.contains(&node))
        .ok_or_else(|| Refused::NotSyncing { node, range: range.id_string() })?;
    rc.syncing.retain(|n| *n != node);
    rc.chain.push(node);
    rc.unproven_tail = Some(node);
    Ok(Some(rebalanced(next, cuts)))
}

/// The tail `node` of `range` serves gets: its predecessor confirmed it caught up, which a
/// predecessor that still acts as tail by an older configuration never does. It is proven
/// now (no longer the [`RangeConfig::unproven_tail`]), and the chain sheds the nodes the ring
/// no longer prefers beyond R that [`sync_done`] kept (the old tail). `None` when it was
/// proven already and there is nothing to shed.
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
    let proven = rc.unproven_tail == Some(node);
    if proven {
        rc.unproven_tail = None;
    }
    if !shed_unpreferred(rc, &ring, replicas, Some(node)) && !proven {
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
///
/// The victim is never a range's last proven replica ([`last_proven`]): cut off from an
/// unproven tail, it stays, and that range waits for the cut to end (or for a failure).
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
        if last_proven(rc, victim) {
            // Its only successor is an unproven tail: the range waits for the cut to end.
            continue;
        }
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

/// `flush_all`: everything stored before `at_micros` becomes invisible at `at_micros`.
pub fn set_flush(config: &ClusterConfig, at_micros: u64) -> ClusterConfig {
    let mut next = config.clone();
    next.flush_at_micros = at_micros;
    next.epoch += 1;
    next
}

mod frontends;
pub use frontends::{fail_frontend, live_frontends, register_frontend};

#[cfg(test)]
mod tests;
