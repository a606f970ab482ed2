//! The consistent-hashing ring with virtual ids and chain replication.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::{virtual_ids, Chain, KeyId, NodeId, Range, VirtualId};

/// The ring: every virtual id of every back-end, sorted by position, and the replication factor.
///
/// A virtual id owns `(predecessor's id, its id]`. The chain of a range is its owner followed by
/// the next virtual ids clockwise that sit on physical nodes not yet in the chain, until the chain
/// has [`Ring::replicas`] nodes.
///
/// A ring is a value: membership changes produce a new ring ([`Ring::with_node`],
/// [`Ring::without_node`]). Two processes given the same membership compute identical rings.
///
/// Lookups (`owner`, `range_of`, `chain`, ...) on an **empty** ring panic; check
/// [`Ring::is_empty`] (or use [`Ring::try_chain`]) where an empty membership is possible.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "RingWire", into = "RingWire")]
pub struct Ring {
    /// Sorted by [`VirtualId::ring_order`], no duplicate `(node, index)`.
    vids: Vec<VirtualId>,
    /// Distinct physical nodes, sorted.
    nodes: Vec<NodeId>,
    /// R as asked for; the effective value is clamped by [`Ring::replicas`].
    replicas_wanted: u32,
}

/// Serialized form: only the inputs. Deserializing re-sorts and re-derives, so a hand-edited or
/// foreign ring can never break the sorted-order invariant the lookups rely on.
#[derive(Serialize, Deserialize)]
struct RingWire {
    vids: Vec<VirtualId>,
    replicas: u32,
}

impl From<RingWire> for Ring {
    fn from(w: RingWire) -> Ring {
        Ring::from_vids(w.vids, w.replicas)
    }
}

impl From<Ring> for RingWire {
    fn from(r: Ring) -> RingWire {
        RingWire { vids: r.vids, replicas: r.replicas_wanted }
    }
}

impl Ring {
    /// A ring of `nodes` (duplicates ignored), each with `vnodes_per_node` virtual ids
    /// (indices `0..V`), replicating each range `replicas` times.
    ///
    /// The effective replication factor is clamped to `1..=number of distinct nodes`.
    pub fn new(nodes: &[NodeId], vnodes_per_node: u32, replicas: u32) -> Ring {
        let vids = nodes.iter().flat_map(|&n| virtual_ids(n, vnodes_per_node)).collect();
        Ring::from_vids(vids, replicas)
    }

    /// A ring from explicit virtual ids (e.g. a configuration where nodes have different V).
    /// The ids are recomputed from `(node, index)`, so a stale or forged `id` cannot misplace one.
    pub fn from_vids(vids: Vec<VirtualId>, replicas: u32) -> Ring {
        let mut vids: Vec<VirtualId> = vids.into_iter().map(|v| VirtualId::new(v.node, v.index)).collect();
        vids.sort_by_key(VirtualId::ring_order);
        vids.dedup_by_key(|v| (v.node, v.index));
        let nodes: BTreeSet<NodeId> = vids.iter().map(|v| v.node).collect();
        Ring { vids, nodes: nodes.into_iter().collect(), replicas_wanted: replicas }
    }

    /// The effective replication factor: as asked, but at least 1 and at most the number of
    /// distinct physical nodes (0 only for an empty ring).
    pub fn replicas(&self) -> u32 {
        let n = u32::try_from(self.nodes.len()).unwrap_or(u32::MAX);
        self.replicas_wanted.max(1).min(n)
    }

    /// The replication factor that was asked for (before clamping).
    pub fn replicas_wanted(&self) -> u32 {
        self.replicas_wanted
    }

    /// All virtual ids, sorted by ring position.
    pub fn vids(&self) -> &[VirtualId] {
        &self.vids
    }

    /// The distinct physical nodes, sorted.
    pub fn nodes(&self) -> &[NodeId] {
        &self.nodes
    }

    /// The virtual ids of one node, in ring order.
    pub fn vids_of(&self, node: NodeId) -> Vec<VirtualId> {
        self.vids.iter().filter(|v| v.node == node).copied().collect()
    }

    /// Whether the ring has no virtual ids.
    pub fn is_empty(&self) -> bool {
        self.vids.is_empty()
    }

    /// Index of the virtual id owning `id`: the first with `vid.id >= id`, wrapping to 0.
    fn owner_index(&self, id: KeyId) -> usize {
        assert!(!self.vids.is_empty(), "fawn-ring: lookup on an empty ring");
        let i = self.vids.partition_point(|v| v.id < id);
        if i == self.vids.len() {
            0
        } else {
            i
        }
    }

    /// Index of `owner` if it is in the ring, else of the virtual id that owns `owner.id`.
    fn index_of(&self, owner: &VirtualId) -> usize {
        match self.vids.binary_search_by_key(&owner.ring_order(), VirtualId::ring_order) {
            Ok(i) => i,
            Err(_) => self.owner_index(owner.id),
        }
    }

    /// The virtual id that owns `id`: the first (clockwise) with `vid.id >= id`.
    pub fn owner(&self, id: KeyId) -> VirtualId {
        self.vids[self.owner_index(id)]
    }

    fn range_at(&self, i: usize) -> Range {
        let n = self.vids.len();
        let pred = self.vids[(i + n - 1) % n];
        // With one virtual id, pred == owner and (x, x] is the full circle, as documented.
        Range::new(pred.id, self.vids[i].id)
    }

    fn chain_at(&self, i: usize) -> Chain {
        let r = self.replicas() as usize;
        let n = self.vids.len();
        let mut nodes = Vec::with_capacity(r);
        // Walk clockwise from the owner; at most one lap, which always finds R distinct nodes
        // because R <= number of distinct nodes.
        for step in 0..n {
            let node = self.vids[(i + step) % n].node;
            if !nodes.contains(&node) {
                nodes.push(node);
                if nodes.len() == r {
                    break;
                }
            }
        }
        Chain { range: self.range_at(i), nodes }
    }

    /// The range `(predecessor's id, owner.id]` owned by `owner`.
    ///
    /// If `owner` is not in the ring, the range of the member that owns `owner.id`.
    pub fn range_of(&self, owner: &VirtualId) -> Range {
        self.range_at(self.index_of(owner))
    }

    /// Every range with its owner, in ring order. The ranges partition the circle.
    pub fn ranges(&self) -> Vec<(Range, VirtualId)> {
        (0..self.vids.len()).map(|i| (self.range_at(i), self.vids[i])).collect()
    }

    /// The chain of the range that contains `id`.
    pub fn chain(&self, id: KeyId) -> Chain {
        self.chain_at(self.owner_index(id))
    }

    /// Like [`Ring::chain`], but `None` on an empty ring instead of panicking.
    pub fn try_chain(&self, id: KeyId) -> Option<Chain> {
        (!self.is_empty()).then(|| self.chain(id))
    }

    /// The chain of the range owned by `owner` (see [`Ring::range_of`] for non-members).
    pub fn chain_for_range(&self, owner: &VirtualId) -> Chain {
        self.chain_at(self.index_of(owner))
    }

    /// Every range whose chain includes `node`, with that chain, in ring order.
    ///
    /// This is the set of datastores the node hosts: R·V of them on average (summed over all
    /// nodes it is exactly R × the number of virtual ids). One node can host more or fewer, e.g.
    /// more when a run of another node's virtual ids lies just before one of its own, since then
    /// it completes all of their chains.
    pub fn ranges_of_node(&self, node: NodeId) -> Vec<(Range, Chain)> {
        (0..self.vids.len())
            .map(|i| self.chain_at(i))
            .filter(|c| c.contains(node))
            .map(|c| (c.range, c))
            .collect()
    }

    /// This ring with `node` joined with `vnodes` virtual ids (replacing its old ones if present).
    pub fn with_node(&self, node: NodeId, vnodes: u32) -> Ring {
        let mut vids = self.vids.clone();
        vids.retain(|v| v.node != node);
        vids.extend(virtual_ids(node, vnodes));
        Ring::from_vids(vids, self.replicas_wanted)
    }

    /// This ring without `node` (unchanged if it was not a member).
    pub fn without_node(&self, node: NodeId) -> Ring {
        let mut vids = self.vids.clone();
        vids.retain(|v| v.node != node);
        Ring::from_vids(vids, self.replicas_wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_vid_owns_everything() {
        let ring = Ring::new(&[1], 1, 3);
        assert_eq!(ring.replicas(), 1);
        let (range, owner) = ring.ranges()[0];
        assert!(range.is_full());
        assert_eq!(ring.owner(KeyId(0)), owner);
        assert_eq!(ring.chain(KeyId(42)).nodes, vec![1]);
    }

    #[test]
    fn chains_have_distinct_nodes() {
        let ring = Ring::new(&[1, 2, 3], 2, 3);
        for (_, owner) in ring.ranges() {
            let c = ring.chain_for_range(&owner);
            assert_eq!(c.head(), owner.node);
            let mut n = c.nodes.clone();
            n.sort();
            assert_eq!(n, vec![1, 2, 3]);
        }
    }

    #[test]
    fn serde_round_trip_resorts() {
        let ring = Ring::new(&[5, 9, 2], 3, 2);
        let json = serde_json_like(&ring);
        assert_eq!(ring, json);
    }

    // fawn-ring has no serde_json dependency; exercise the wire conversion directly.
    fn serde_json_like(ring: &Ring) -> Ring {
        let mut wire: RingWire = ring.clone().into();
        wire.vids.reverse();
        Ring::from(wire)
    }

    #[test]
    fn empty_ring() {
        let ring = Ring::new(&[], 4, 3);
        assert!(ring.is_empty());
        assert_eq!(ring.replicas(), 0);
        assert!(ring.try_chain(KeyId(1)).is_none());
        assert!(ring.ranges().is_empty());
    }
}
