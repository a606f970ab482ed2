//! Replication chains.

use serde::{Deserialize, Serialize};

use crate::{NodeId, Range};

/// The replica chain of one range: `nodes[0]` is the head (takes puts), the last is the tail
/// (serves gets and answers puts). The nodes are distinct physical nodes.
///
/// A chain obtained from a non-empty [`crate::Ring`] always has at least one node; `head` and
/// `tail` panic on a hand-built empty chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    pub range: Range,
    pub nodes: Vec<NodeId>,
}

impl Chain {
    /// The head: first node, where puts enter.
    pub fn head(&self) -> NodeId {
        self.nodes[0]
    }

    /// The tail: last node, which serves gets and acknowledges puts.
    pub fn tail(&self) -> NodeId {
        self.nodes[self.nodes.len() - 1]
    }

    /// Number of replicas in the chain.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the chain has no nodes (never true for chains from a non-empty ring).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Position of `n` in the chain (0 = head).
    pub fn position(&self, n: NodeId) -> Option<usize> {
        self.nodes.iter().position(|&x| x == n)
    }

    /// Whether `n` replicates this range.
    pub fn contains(&self, n: NodeId) -> bool {
        self.position(n).is_some()
    }

    /// The node after `n` (towards the tail), or `None` if `n` is the tail or not in the chain.
    pub fn successor(&self, n: NodeId) -> Option<NodeId> {
        let p = self.position(n)?;
        self.nodes.get(p + 1).copied()
    }

    /// The node before `n` (towards the head), or `None` if `n` is the head or not in the chain.
    pub fn predecessor(&self, n: NodeId) -> Option<NodeId> {
        let p = self.position(n)?;
        p.checked_sub(1).map(|q| self.nodes[q])
    }

    /// Whether `n` is the head.
    pub fn is_head(&self, n: NodeId) -> bool {
        self.nodes.first() == Some(&n)
    }

    /// Whether `n` is the tail.
    pub fn is_tail(&self, n: NodeId) -> bool {
        self.nodes.last() == Some(&n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn navigation() {
        let c = Chain { range: Range::full(), nodes: vec![3, 1, 2] };
        assert_eq!((c.head(), c.tail()), (3, 2));
        assert_eq!(c.successor(3), Some(1));
        assert_eq!(c.successor(2), None);
        assert_eq!(c.predecessor(3), None);
        assert_eq!(c.predecessor(2), Some(1));
        assert_eq!(c.position(9), None);
        assert_eq!(c.successor(9), None);
        assert!(c.is_head(3) && c.is_tail(2) && !c.is_tail(1));
    }
}
