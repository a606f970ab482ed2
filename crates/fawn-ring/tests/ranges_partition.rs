//! Guards: the ranges of a ring partition the circle — consecutive, no gap, no overlap, sizes
//! summing to 2^128 — and each range ends at its owner's id. A gap would be an unroutable key; an
//! overlap would be a key with two owners.

mod common;

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn ranges_partition_the_circle(ring in common::ring()) {
        let ranges = ring.ranges();
        prop_assert_eq!(ranges.len(), ring.vids().len());
        let mut total: u128 = 0; // sum of sizes mod 2^128 must be 0 (i.e. exactly 2^128)
        for (i, (range, owner)) in ranges.iter().enumerate() {
            prop_assert_eq!(range.end_inclusive, owner.id);
            let next = &ranges[(i + 1) % ranges.len()].0;
            prop_assert_eq!(range.end_inclusive, next.start_exclusive);
            total = total.wrapping_add(range.len_minus_one()).wrapping_add(1);
            prop_assert_eq!(ring.range_of(owner), *range);
            prop_assert!(ring.vids().windows(2).all(|w| w[0].id <= w[1].id));
        }
        prop_assert_eq!(total, 0);
        if ranges.len() == 1 {
            prop_assert!(ranges[0].0.is_full());
        }
    }

    #[test]
    fn each_node_hosts_the_ranges_whose_chains_name_it(ring in common::ring()) {
        let mut hosted = 0usize;
        for &node in ring.nodes() {
            let mine = ring.ranges_of_node(node);
            for (range, chain) in &mine {
                prop_assert!(chain.contains(node));
                prop_assert_eq!(*range, chain.range);
            }
            // A node always hosts the ranges it owns; the count per node is only R·V on average
            // (a run of another node's vids just before ours puts us in all their chains).
            prop_assert!(mine.len() >= ring.vids_of(node).len());
            hosted += mine.len();
        }
        // Every range is hosted by exactly R nodes.
        prop_assert_eq!(hosted, ring.vids().len() * ring.replicas() as usize);
    }
}
