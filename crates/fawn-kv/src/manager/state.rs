//! The manager's configuration state machine: pure transitions on [`ClusterConfig`].
//!
//! Kept free of I/O so it can later be driven by a replicated log (Raft) unchanged: each
//! transition takes the current config and returns the next one (or a refusal).

use fawn_proto::native::{BackendInfo, ClusterConfig, FrontendInfo, NodeState, RangeConfig};
use fawn_ring::{NodeId, Range, Ring};

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
        rebalance(&mut next);
    }
    next.epoch += 1;
    Ok(Some(next))
}

/// Fixes the ranges and their chains from the ring of the registered back-ends.
fn form(config: &mut ClusterConfig) {
    let ring = alive_ring(config);
    config.ranges = ring
        .ranges()
        .into_iter()
        .map(|(range, owner)| RangeConfig {
            range,
            chain: ring.chain_for_range(&owner).nodes,
            syncing: Vec::new(),
        })
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

/// Starts one sync per range whose chain is short or holds a node the ring no longer prefers.
/// Ranges already syncing wait: one membership change per range at a time.
fn rebalance(config: &mut ClusterConfig) {
    let ring = alive_ring(config);
    let want = (config.replicas as usize).min(ring.nodes().len());
    for rc in &mut config.ranges {
        if !rc.syncing.is_empty() || rc.chain.is_empty() {
            continue;
        }
        let preferred = preferred(&ring, &rc.range);
        let Some(candidate) = preferred.iter().find(|p| !rc.chain.contains(p)) else { continue };
        if rc.chain.len() < want || rc.chain.iter().any(|n| !preferred.contains(n)) {
            rc.syncing.push(*candidate);
        }
    }
    settle_leavers(config);
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
pub fn fail_node(config: &ClusterConfig, node: NodeId) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    let b = next.backends.iter_mut().find(|b| b.node == node).ok_or(Refused::UnknownNode(node))?;
    if matches!(b.state, NodeState::Failed | NodeState::Left) {
        return Ok(None);
    }
    b.state = NodeState::Failed;
    for rc in &mut next.ranges {
        if rc.chain != [node] {
            rc.chain.retain(|n| *n != node);
        }
        rc.syncing.retain(|n| *n != node);
    }
    rebalance(&mut next);
    next.epoch += 1;
    Ok(Some(next))
}

/// Graceful leave: replacements sync first; the node leaves each chain once they are in.
pub fn leave(config: &ClusterConfig, node: NodeId) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    let b = next.backends.iter_mut().find(|b| b.node == node).ok_or(Refused::UnknownNode(node))?;
    if b.state != NodeState::Alive {
        return Ok(None);
    }
    b.state = NodeState::Leaving;
    rebalance(&mut next);
    next.epoch += 1;
    Ok(Some(next))
}

/// A syncing replica caught up: it joins the chain as the new tail, and the chain sheds any
/// node the ring no longer prefers beyond R.
pub fn sync_done(
    config: &ClusterConfig,
    node: NodeId,
    range: Range,
) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    let ring = alive_ring(&next);
    let want = (next.replicas as usize).min(ring.nodes().len()).max(1);
    let rc = next
        .ranges
        .iter_mut()
        .find(|r| r.range == range && r.syncing.contains(&node))
        .ok_or_else(|| Refused::NotSyncing { node, range: range.id_string() })?;
    rc.syncing.retain(|n| *n != node);
    rc.chain.push(node);
    let preferred = preferred(&ring, &rc.range);
    while rc.chain.len() > want {
        let Some(i) = rc.chain.iter().position(|n| !preferred.contains(n)) else { break };
        rc.chain.remove(i);
    }
    rebalance(&mut next);
    next.epoch += 1;
    Ok(Some(next))
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

    fn formed(n: u32) -> ClusterConfig {
        let mut c = initial(3, 2, 1);
        for node in 0..n {
            c = register_backend(&c, n as usize, node, &format!("a:{node}")).unwrap().unwrap();
        }
        c
    }

    #[test]
    fn ranges_form_at_the_expected_count() {
        let c = initial(3, 2, 1);
        let c = register_backend(&c, 2, 1, "a:1").unwrap().unwrap();
        assert!(!c.formed && c.ranges.is_empty());
        let c = register_backend(&c, 2, 2, "a:2").unwrap().unwrap();
        assert!(c.formed);
        assert_eq!(c.ranges.len(), 4);
        assert!(c.ranges.iter().all(|r| r.chain.len() == 2 && r.syncing.is_empty()));
        assert!(register_backend(&c, 2, 2, "a:2").unwrap().is_none());
        let moved = register_backend(&c, 2, 2, "a:9").unwrap().unwrap();
        assert_eq!(moved.backends[1].addr, "a:9");
    }

    #[test]
    fn the_last_replica_of_a_range_stays_in_its_chain_and_serves_when_back() {
        let c = formed(4);
        let mut c = c;
        for node in [0, 1, 2, 3] {
            c = fail_node(&c, node).unwrap().unwrap();
            assert!(
                c.ranges.iter().all(|r| !r.chain.is_empty()),
                "a chain emptied after failing {node}: {c:?}"
            );
        }
        // Every chain is down to the one node that failed last among its replicas.
        assert!(c.ranges.iter().all(|r| r.chain.len() == 1));
        let c = register_backend(&c, 4, 3, "a:3").unwrap().unwrap();
        for rc in c.ranges.iter().filter(|r| r.chain == [3]) {
            assert!(rc.syncing.is_empty(), "no other alive node to sync to: {rc:?}");
        }
        // A node coming back syncs onto the chains it is preferred for, from their survivors.
        let c = register_backend(&c, 4, 0, "a:0").unwrap().unwrap();
        assert!(c.ranges.iter().any(|r| r.syncing.contains(&0)));
    }

    #[test]
    fn a_failure_shortens_chains_and_starts_re_replication() {
        let c = formed(4);
        let c = fail_node(&c, 1).unwrap().unwrap();
        for rc in &c.ranges {
            assert!(!rc.chain.contains(&1) && !rc.syncing.contains(&1));
            assert!(rc.chain.len() >= 2);
            assert_eq!(rc.chain.len() + rc.syncing.len(), 3, "{rc:?}");
        }
        // Finishing every sync restores R in-sync replicas.
        let mut c = c;
        while let Some((node, range)) = c.ranges.iter().find_map(|r| r.syncing.first().map(|n| (*n, r.range)))
        {
            c = sync_done(&c, node, range).unwrap().unwrap();
        }
        assert!(c.ranges.iter().all(|r| r.chain.len() == 3));
    }

    #[test]
    fn a_failed_node_rejoins_through_sync() {
        let c = formed(3);
        let c = fail_node(&c, 2).unwrap().unwrap();
        assert!(c.ranges.iter().all(|r| r.chain.len() == 2 && r.syncing.is_empty()));
        let c = register_backend(&c, 3, 2, "a:2").unwrap().unwrap();
        assert!(c.ranges.iter().all(|r| r.syncing == vec![2]));
    }

    #[test]
    fn a_leaver_stays_until_its_replacement_is_in_sync() {
        let c = formed(4);
        let c = leave(&c, 0).unwrap().unwrap();
        let holding: Vec<_> = c.ranges.iter().filter(|r| r.chain.contains(&0)).collect();
        assert!(!holding.is_empty());
        assert!(holding.iter().all(|r| r.syncing.len() == 1));
        let mut c = c;
        while let Some((node, range)) = c.ranges.iter().find_map(|r| r.syncing.first().map(|n| (*n, r.range)))
        {
            c = sync_done(&c, node, range).unwrap().unwrap();
        }
        assert!(c.ranges.iter().all(|r| !r.chain.contains(&0) && r.chain.len() == 3));
        assert_eq!(c.backends[0].state, NodeState::Left);
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
