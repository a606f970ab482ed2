//! Guards: every key has exactly one chain, of exactly R distinct physical nodes (R clamped to the
//! node count), headed by the key's owner, whose range contains the key. This is what lets every
//! front-end route a key to the same head and tail.

mod common;

use std::collections::BTreeSet;

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_key_has_one_chain_of_r_distinct_nodes(
        ring in common::ring(),
        random in proptest::collection::vec(any::<u128>(), 0..64),
    ) {
        let r = ring.replicas() as usize;
        prop_assert!(r >= 1 && r <= ring.nodes().len());
        prop_assert_eq!(r, (ring.replicas_wanted() as usize).min(ring.nodes().len()));
        for id in common::probe_ids(&ring, &random) {
            let chain = ring.chain(id);
            let distinct: BTreeSet<_> = chain.nodes.iter().collect();
            prop_assert_eq!(chain.nodes.len(), r);
            prop_assert_eq!(distinct.len(), r);
            let owner = ring.owner(id);
            prop_assert_eq!(chain.head(), owner.node);
            prop_assert!(chain.range.contains(id));
            prop_assert_eq!(chain.range, ring.range_of(&owner));
            prop_assert_eq!(&chain, &ring.chain_for_range(&owner));
            // Exactly one range of the ring holds the key.
            let holders = ring.ranges().iter().filter(|(rg, _)| rg.contains(id)).count();
            prop_assert_eq!(holders, 1);
        }
    }
}
