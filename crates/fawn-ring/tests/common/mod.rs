//! Shared proptest strategies for the ring scenarios.
#![allow(dead_code)]

use std::collections::BTreeSet;

use fawn_ring::{KeyId, Ring};
use proptest::prelude::*;

/// A ring of 1..12 distinct nodes with V in 1..8 and R in 1..5 (R may exceed the node count).
pub fn ring() -> impl Strategy<Value = Ring> {
    (proptest::collection::btree_set(0u32..1000, 1..12), 1u32..8, 1u32..5).prop_map(|(nodes, v, r)| {
        let nodes: Vec<u32> = nodes.into_iter().collect();
        Ring::new(&nodes, v, r)
    })
}

/// Random ids plus the ids at, just before and just after every virtual id of `ring`, where
/// off-by-one errors in (start, end] live.
pub fn probe_ids(ring: &Ring, random: &[u128]) -> Vec<KeyId> {
    let mut ids: BTreeSet<u128> = random.iter().copied().collect();
    ids.extend([0, 1, u128::MAX, u128::MAX - 1]);
    for v in ring.vids() {
        ids.extend([v.id.0, v.id.0.wrapping_add(1), v.id.0.wrapping_sub(1)]);
    }
    ids.into_iter().map(KeyId).collect()
}
