//! Unit tests of a degraded back-end (its datastore fails writes): out of its chains,
//! re-replicated elsewhere, back only by registering again.

use super::*;

const FULL: &str = "no space left on device";

fn state_of(c: &ClusterConfig, node: NodeId) -> (NodeState, Option<String>) {
    let b = c.backends.iter().find(|b| b.node == node).unwrap();
    (b.state, b.reason.clone())
}

#[test]
fn a_degraded_node_leaves_its_chains_and_they_re_replicate_elsewhere() {
    let c = formed(4);
    assert!(c.ranges.iter().any(|r| r.chain.contains(&1)));
    let d = degrade_node(&c, 1, FULL, &none()).unwrap().unwrap();
    assert!(d.epoch > c.epoch);
    assert_eq!(state_of(&d, 1), (NodeState::Degraded, Some(FULL.to_string())));
    for rc in &d.ranges {
        assert!(!rc.path().any(|n| n == 1), "node 1 still on {rc:?}");
        assert_eq!(rc.chain.len() + rc.syncing.len(), 3, "{rc:?}");
    }
    // Once every sync is done each chain has R in-sync replicas again, none of them node 1.
    let d = converge(d);
    assert!(d.ranges.iter().all(|r| r.chain.len() == 3 && !r.chain.contains(&1)), "{:?}", d.ranges);
    assert_eq!(state_of(&d, 1).0, NodeState::Degraded);
    // Nothing brings it back by itself: a repeated report, a failure, a re-evaluation.
    assert_eq!(degrade_node(&d, 1, FULL, &none()).unwrap(), None);
    assert_eq!(fail_node(&d, 1, &none()).unwrap(), None);
    assert_eq!(settle(&d, &none()), None);
    assert_eq!(degrade_node(&d, 9, FULL, &none()), Err(Refused::UnknownNode(9)));
}

#[test]
fn a_degraded_node_rejoins_by_registering_again() {
    let d = converge(degrade_node(&formed(4), 2, FULL, &none()).unwrap().unwrap());
    let back = register_backend(&d, 4, 2, "a:2", &none()).unwrap().unwrap();
    assert_eq!(state_of(&back, 2), (NodeState::Alive, None));
    assert!(back.ranges.iter().any(|r| r.syncing.contains(&2)), "it does not resync anything");
    assert!(back.ranges.iter().all(|r| !r.chain.contains(&2)), "it serves before it synced");
    assert_ranges_are_the_rings(&converge(back));
}

#[test]
fn a_degraded_last_proven_replica_stays_in_its_chain() {
    let mut c = formed(3);
    for node in [1, 2] {
        c = fail_node(&c, node, &none()).unwrap().unwrap();
    }
    assert!(c.ranges.iter().all(|r| r.chain == [0]));
    let d = degrade_node(&c, 0, FULL, &none()).unwrap().unwrap();
    assert_eq!(state_of(&d, 0).0, NodeState::Degraded);
    assert!(d.ranges.iter().all(|r| r.chain == [0] && r.syncing.is_empty()), "{:?}", d.ranges);
    // A node coming back syncs from it; the chains then drop it as for a failure.
    let d = converge(register_backend(&d, 3, 1, "a:1", &none()).unwrap().unwrap());
    assert!(d.ranges.iter().all(|r| r.chain == [1]), "{:?}", d.ranges);
}

#[test]
fn a_degraded_node_may_be_retired_with_leave() {
    let d = converge(degrade_node(&formed(4), 3, FULL, &none()).unwrap().unwrap());
    let left = leave(&d, 3, &none()).unwrap().unwrap();
    assert_eq!(state_of(&left, 3), (NodeState::Left, None));
}

#[test]
fn a_leaving_node_may_be_degraded_and_a_failed_one_not() {
    let c = formed(4);
    let leaving = leave(&c, 0, &none()).unwrap().unwrap();
    let d = degrade_node(&leaving, 0, FULL, &none()).unwrap().unwrap();
    assert!(d.ranges.iter().all(|r| !r.path().any(|n| n == 0)), "{:?}", d.ranges);
    let failed = fail_node(&c, 0, &none()).unwrap().unwrap();
    assert_eq!(degrade_node(&failed, 0, FULL, &none()).unwrap(), None);
}

#[test]
fn a_long_reason_is_cut_at_a_character_boundary() {
    let reason = "é".repeat(REASON_BYTES_MAX);
    let d = degrade_node(&formed(3), 1, &reason, &none()).unwrap().unwrap();
    let kept = state_of(&d, 1).1.unwrap();
    assert!(kept.len() <= REASON_BYTES_MAX && kept.len() >= REASON_BYTES_MAX - 1, "{}", kept.len());
    assert!(reason.starts_with(&kept));
}
