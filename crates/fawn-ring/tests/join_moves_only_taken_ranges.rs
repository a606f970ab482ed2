//! Guards: a join disturbs only what it must. Adding a node moves a key's ownership only if the
//! key falls in a range that one of the new virtual ids takes over; and a key's chain changes only
//! if a new virtual id sits within the arc its old chain was built from, in which case the new
//! chain is the old one with the newcomer inserted (and the old tail dropped if the chain was full).
//! This bounds the data a join has to copy (paper §3.4.4). (If R was clamped by the node count,
//! the join raises it and every chain gains the newcomer; that case is checked separately.)

mod common;

use fawn_ring::{KeyId, Range};
use proptest::prelude::*;

/// The arc from `id` clockwise to the virtual id that completed `id`'s chain in `ring`.
fn chain_arc(ring: &fawn_ring::Ring, id: KeyId) -> Range {
    let chain = ring.chain(id);
    let vids = ring.vids();
    let start = vids.partition_point(|v| v.id < id) % vids.len();
    let mut seen = Vec::new();
    let mut last = vids[start];
    for step in 0..vids.len() {
        last = vids[(start + step) % vids.len()];
        if !seen.contains(&last.node) {
            seen.push(last.node);
        }
        if seen.len() == chain.nodes.len() {
            break;
        }
    }
    Range::new(KeyId(id.0.wrapping_sub(1)), last.id)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    #[test]
    fn join_moves_only_taken_over_keys(
        old in common::ring(),
        newcomer in 1000u32..1100,
        v in 1u32..8,
        random in proptest::collection::vec(any::<u128>(), 0..64),
    ) {
        let new = old.with_node(newcomer, v);
        let taken: Vec<Range> = new.vids_of(newcomer).iter().map(|x| new.range_of(x)).collect();
        for id in common::probe_ids(&new, &random) {
            let (before, after) = (old.owner(id), new.owner(id));
            let in_taken = taken.iter().any(|r| r.contains(id));
            if in_taken {
                prop_assert_eq!(after.node, newcomer);
            } else {
                prop_assert_eq!(before, after, "key {:x} moved outside taken ranges", id.0);
            }

            let (c_old, c_new) = (old.chain(id), new.chain(id));
            let arc = chain_arc(&old, id);
            let near = new.vids_of(newcomer).iter().any(|x| arc.contains(x.id));
            if old.replicas() < new.replicas() {
                // R was clamped by the node count and grew with the join: every chain gains the
                // newcomer (the cluster is re-replicating to its configured R).
                prop_assert!(c_new.contains(newcomer));
            } else if !near {
                prop_assert_eq!(&c_old.nodes, &c_new.nodes);
            }
            // Without the newcomer, the new chain is a prefix of the old one.
            let rest: Vec<u32> = c_new.nodes.iter().copied().filter(|&n| n != newcomer).collect();
            prop_assert!(c_old.nodes.starts_with(&rest));
            prop_assert!(c_old.nodes.len() - rest.len() <= 1);
            prop_assert_eq!(c_new.nodes.len(), new.replicas() as usize);
        }
    }
}
