//! Guards: leaving is the inverse of joining. `with_node(n).without_node(n)` is the original ring
//! exactly, and a leave moves only the keys the leaver owned; in every chain the leaver is simply
//! removed and the survivors keep their order (a successor is appended as the new tail when needed),
//! which is what the failure protocol (§3.4.4) relies on.

mod common;

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    #[test]
    fn join_then_leave_is_identity(old in common::ring(), newcomer in 1000u32..1100, v in 1u32..8) {
        prop_assert_eq!(old.with_node(newcomer, v).without_node(newcomer), old.clone());
        // Leaving as a non-member changes nothing.
        prop_assert_eq!(old.without_node(newcomer), old);
    }

    #[test]
    fn leave_moves_only_the_leavers_keys(
        ring in common::ring(),
        pick in any::<proptest::sample::Index>(),
        random in proptest::collection::vec(any::<u128>(), 0..64),
    ) {
        prop_assume!(ring.nodes().len() >= 2);
        let leaver = ring.nodes()[pick.index(ring.nodes().len())];
        let after = ring.without_node(leaver);
        for id in common::probe_ids(&ring, &random) {
            let before = ring.owner(id);
            if before.node != leaver {
                prop_assert_eq!(after.owner(id), before);
            }
            let old: Vec<u32> = ring.chain(id).nodes.into_iter().filter(|&n| n != leaver).collect();
            let new = after.chain(id).nodes;
            prop_assert!(new.starts_with(&old), "chain {:?} -> {:?}", old, new);
        }
    }
}
