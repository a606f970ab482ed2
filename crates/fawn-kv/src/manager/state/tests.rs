//! Unit tests of the membership transitions.

use super::*;

mod degraded;

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
fn a_restarted_node_resyncs_before_serving() {
    let c = formed(3);
    let held: Vec<Range> = c.ranges.iter().filter(|r| r.chain.contains(&1)).map(|r| r.range).collect();
    assert!(!held.is_empty());
    let next = register_backend(&c, 3, 1, "a:1", &none()).unwrap().unwrap();
    assert!(next.epoch > c.epoch);
    for rc in next.ranges.iter().filter(|r| held.contains(&r.range)) {
        assert!(!rc.chain.contains(&1), "node 1 still serves {rc:?}");
        assert!(rc.syncing.contains(&1), "node 1 does not resync {rc:?}");
    }
    assert!(next.backends.iter().any(|b| b.node == 1 && b.state == NodeState::Alive));
    // Once synced it is a replica again, as before.
    assert_ranges_are_the_rings(&converge(next));
}

/// Found by the simulator with joins and leaves (seed 3941): a leaver restarted on an empty
/// disk kept its chain positions and was the sync source of its replacement.
#[test]
fn a_restarted_leaver_leaves_its_chains_at_once_and_goes_on_leaving() {
    let c = leave(&formed(4), 1, &none()).unwrap().unwrap();
    assert!(c.ranges.iter().any(|r| r.chain.contains(&1)));
    let next = register_backend(&c, 4, 1, "a:1", &none()).unwrap().unwrap();
    assert!(next.epoch > c.epoch);
    assert!(next.ranges.iter().all(|r| !r.chain.contains(&1) && !r.syncing.contains(&1)), "{next:?}");
    let state = next.backends.iter().find(|b| b.node == 1).map(|b| b.state);
    assert!(matches!(state, Some(NodeState::Leaving | NodeState::Left)), "{state:?}");
    let done = converge(next);
    assert!(done.ranges.iter().all(|r| !r.chain.contains(&1)));
    assert_eq!(done.backends.iter().find(|b| b.node == 1).map(|b| b.state), Some(NodeState::Left));
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
        let (node, range) = c.ranges.iter().find_map(|r| r.syncing.first().map(|n| (*n, r.range))).unwrap();
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
    let lower = split.ranges.iter().find(|r| r.range == Range::new(rc.range.start_exclusive, at)).unwrap();
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
    let moved = register_backend(&c, 2, 2, "a:9", &none()).unwrap().unwrap();
    assert_eq!(moved.backends[1].addr, "a:9");
}

#[test]
fn the_last_replica_of_a_range_stays_in_its_chain_and_serves_when_back() {
    let c = formed(4);
    let mut c = c;
    for node in [0, 1, 2, 3] {
        c = fail_node(&c, node, &none()).unwrap().unwrap();
        assert!(c.ranges.iter().all(|r| !r.chain.is_empty()), "a chain emptied after failing {node}: {c:?}");
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

/// Three nodes, R = 3, after nodes 1 and 2 failed and 1 came back and synced: every range's
/// chain is `[0, 1]` with 1 its unproven tail (node 0 acknowledged updates alone until it
/// installed that configuration, and 1 may miss some of them).
fn a_new_tail_behind_a_lone_node() -> ClusterConfig {
    let mut c = formed(3);
    for node in [1, 2] {
        c = fail_node(&c, node, &none()).unwrap().unwrap();
    }
    assert!(c.ranges.iter().all(|r| r.chain == [0]), "{c:?}");
    c = register_backend(&c, 3, 1, "a:1", &none()).unwrap().unwrap();
    let ranges: Vec<Range> = c.ranges.iter().map(|r| r.range).collect();
    for range in ranges {
        c = sync_done(&c, 1, range, &none()).unwrap().unwrap();
    }
    for rc in &c.ranges {
        assert_eq!((rc.chain.as_slice(), rc.unproven_tail), (&[0, 1][..], Some(1)), "{rc:?}");
    }
    c
}

#[test]
fn a_range_waits_for_its_last_proven_replica_rather_than_serve_from_an_unproven_tail() {
    let c = a_new_tail_behind_a_lone_node();
    // Node 0 fails before node 1 reported `TailReady`: it stays, failed, in every chain.
    let failed = fail_node(&c, 0, &none()).unwrap().unwrap();
    assert_eq!(failed.backends[0].state, NodeState::Failed);
    for rc in &failed.ranges {
        assert_eq!((rc.chain.as_slice(), rc.unproven_tail), (&[0, 1][..], Some(1)), "{rc:?}");
        assert!(rc.syncing.is_empty(), "a sync started from the unproven tail: {rc:?}");
    }
    // A cut between them, or a restart that may have lost acknowledged writes, does not
    // remove it either.
    assert_eq!(cut_link(&c, 0, 1, &cuts(&[(0, 1)])).unwrap(), None);
    let unproven_restart = register_backend(&c, 3, 0, "a:0", &none()).unwrap();
    assert!(unproven_restart.is_none_or(|n| n.ranges.iter().all(|r| r.chain == [0, 1])));
    // Back, node 0 heads the chains again; node 1, caught up, is proven, and only then may
    // node 0 go.
    let back = register_backend(&failed, 3, 0, "a:0", &none()).unwrap().unwrap();
    let mut c = back;
    let ranges: Vec<Range> = c.ranges.iter().map(|r| r.range).collect();
    for range in ranges {
        assert_eq!(tail_ready(&c, 0, range, &none()).unwrap(), None, "not the tail");
        c = tail_ready(&c, 1, range, &none()).unwrap().unwrap();
        assert_eq!(tail_ready(&c, 1, range, &none()).unwrap(), None, "said twice");
    }
    assert!(c.ranges.iter().all(|r| r.unproven_tail.is_none()));
    let c = fail_node(&c, 0, &none()).unwrap().unwrap();
    assert!(c.ranges.iter().all(|r| r.chain == [1]), "{c:?}");
}

#[test]
fn a_failed_unproven_tail_leaves_the_chain_and_its_mark() {
    let c = fail_node(&a_new_tail_behind_a_lone_node(), 1, &none()).unwrap().unwrap();
    assert!(c.ranges.iter().all(|r| r.chain == [0] && r.unproven_tail.is_none()), "{c:?}");
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
    while let Some((node, range)) = c.ranges.iter().find_map(|r| r.syncing.first().map(|n| (*n, r.range))) {
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
    while let Some((node, range)) = c.ranges.iter().find_map(|r| r.syncing.first().map(|n| (*n, r.range))) {
        c = sync_done(&c, node, range, &none()).unwrap().unwrap();
        if let Some(next) = tail_ready(&c, node, range, &none()).unwrap() {
            c = next;
        }
    }
    assert!(c.ranges.iter().all(|r| !r.chain.contains(&0) && r.chain.len() == 3));
    assert_eq!(c.backends[0].state, NodeState::Left);
}

#[test]
fn a_leaver_stays_in_a_chain_until_its_replacement_is_proven() {
    let c = formed(4);
    let c = leave(&c, 0, &none()).unwrap().unwrap();
    let of = |c: &ClusterConfig, range: Range| c.ranges.iter().find(|r| r.range == range).unwrap().clone();
    // A range where the leaver is not the tail (the old tail was always kept until then).
    let rc = c.ranges.iter().find(|r| r.chain.contains(&0) && r.tail() != Some(0) && r.syncing.len() == 1);
    let rc = rc.unwrap().clone();
    let s = rc.syncing[0];
    let c = sync_done(&c, s, rc.range, &none()).unwrap().unwrap();
    let after = of(&c, rc.range);
    assert!(after.chain.contains(&0), "the leaver left before its replacement was proven: {after:?}");
    assert_eq!((after.tail(), after.unproven_tail), (Some(s), Some(s)));
    // Should the range's other proven members fail now, the leaver, which holds every update,
    // is what the range keeps.
    let mut failed = c.clone();
    for n in after.chain.iter().filter(|n| **n != 0 && **n != s) {
        failed = fail_node(&failed, *n, &none()).unwrap().unwrap();
    }
    assert!(of(&failed, rc.range).chain.contains(&0), "{:?}", of(&failed, rc.range));
    let c = tail_ready(&c, s, rc.range, &none()).unwrap().unwrap();
    let after = of(&c, rc.range);
    assert!(!after.chain.contains(&0) && after.chain.len() == 3 && after.tail() == Some(s), "{after:?}");
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
    let c = tail_ready(&c, x, rc.range, &cut).unwrap().unwrap();
    // The cut is over: the preferred node comes back, the stand-in goes once s is ready.
    let mut c = settle(&c, &none()).unwrap_or(c);
    let mut steps = 0;
    while let Some((node, range)) = c.ranges.iter().find_map(|r| r.syncing.first().map(|n| (*n, r.range))) {
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
    let c = settle(&c, &none()).unwrap();
    assert!(c.ranges.iter().any(|r| !r.syncing.is_empty()));
    let c = converge(c);
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
                        // Only a range's last proven member and its unproven tail stay linked.
                        let waits = new.chain.len() == 2 && new.unproven_tail.is_some();
                        assert!(waits || !adjacent(new, a, b), "{ctx}: {new:?} still links {a}<->{b}");
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
                    let unproven = c.ranges.iter().find_map(|r| Some((r.unproven_tail?, r.range)));
                    if let Some((node, range)) = unproven.filter(|_| rng.gen_bool(0.5)) {
                        c = tail_ready(&c, node, range, &cut).unwrap().unwrap();
                    }
                }
            }
            assert!(c.ranges.iter().all(|r| !r.chain.is_empty()), "{ctx}: empty chain {c:?}");
            // Every range keeps a proven replica; an unproven one is the tail.
            for r in &c.ranges {
                assert!(r.chain.iter().any(|n| Some(*n) != r.unproven_tail), "{ctx}: none proven {r:?}");
                assert!(r.unproven_tail.is_none_or(|u| r.tail() == Some(u)), "{ctx}: {r:?}");
            }
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
