//! Physical nodes and their virtual ids.

use serde::{Deserialize, Serialize};

use crate::{key_id, KeyId};

/// A physical back-end node.
pub type NodeId = u32;

/// Domain-separation prefix of the bytes hashed into a virtual id (so a virtual id can never
/// collide with a user key by construction of the input, only by hash accident).
const VID_DOMAIN: &[u8; 9] = b"fawn-vid:";

/// One of a physical node's V positions on the ring.
///
/// `id` is derived deterministically from `(node, index)`:
/// `id = key_id(b"fawn-vid:" ++ node.to_be_bytes() ++ index.to_be_bytes())`,
/// i.e. XXH3-128 of a 17-byte string. Every process therefore computes the same ring from the
/// same membership; changing this encoding moves every range, so it is part of the contract.
///
/// The derived `Ord` compares `node`, then `index`; the ring orders by [`VirtualId::ring_order`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VirtualId {
    pub node: NodeId,
    pub index: u32,
    pub id: KeyId,
}

impl VirtualId {
    /// The `index`-th virtual id of `node`.
    pub fn new(node: NodeId, index: u32) -> VirtualId {
        VirtualId { node, index, id: vid_key_id(node, index) }
    }

    /// The key the ring sorts by: position first; node and index only break (astronomically
    /// unlikely) hash ties so that the order is total and identical everywhere.
    pub fn ring_order(&self) -> (KeyId, NodeId, u32) {
        (self.id, self.node, self.index)
    }
}

/// The ring position of virtual id `index` of `node` (see [`VirtualId`]).
pub fn vid_key_id(node: NodeId, index: u32) -> KeyId {
    let mut bytes = [0u8; 17];
    bytes[..9].copy_from_slice(VID_DOMAIN);
    bytes[9..13].copy_from_slice(&node.to_be_bytes());
    bytes[13..].copy_from_slice(&index.to_be_bytes());
    key_id(&bytes)
}

/// The `v` virtual ids of `node`, indices `0..v`.
pub fn virtual_ids(node: NodeId, v: u32) -> Vec<VirtualId> {
    (0..v).map(|i| VirtualId::new(node, i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vids_are_deterministic_and_distinct() {
        let a = virtual_ids(7, 4);
        assert_eq!(a, virtual_ids(7, 4));
        assert_eq!(a.len(), 4);
        assert_ne!(a[0].id, a[1].id);
        assert_ne!(VirtualId::new(1, 0).id, VirtualId::new(0, 1).id);
        let mut bytes = b"fawn-vid:".to_vec();
        bytes.extend_from_slice(&7u32.to_be_bytes());
        bytes.extend_from_slice(&2u32.to_be_bytes());
        assert_eq!(a[2].id, key_id(&bytes));
    }
}
