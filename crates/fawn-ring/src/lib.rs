//! FAWN ring: key ids, virtual ids, ranges, chains and front-end wedges (paper §3.4,
//! DESIGN.md §5).
//!
//! **Architecture Invariant:** this crate is pure. No I/O, no networking, no clocks, no threads.
//! Every function is deterministic, so every process computes the same ring from the same
//! membership.
//!
//! # Model
//!
//! * The id space is the circle of `u128` values. A user key sits at [`key_id`]`(key)`.
//! * Each physical back-end ([`NodeId`]) has V [`VirtualId`]s, at positions derived from
//!   `(node, index)` by [`vid_key_id`] (XXH3-128 of `b"fawn-vid:" ++ node BE ++ index BE`).
//! * A virtual id owns the [`Range`] `(predecessor's id, its id]`; with a single virtual id the
//!   range is the full circle (`start == end`). [`Ring::ranges`] partition the circle.
//! * The [`Chain`] of a range is its owner's node followed by the next virtual ids clockwise on
//!   **distinct** physical nodes, `R = Ring::replicas()` long (R is clamped to the node count).
//!   Head first (takes puts), tail last (serves gets).
//! * A node hosts one datastore per range whose chain includes it: [`Ring::ranges_of_node`].
//!   [`Range::id_string`] names that datastore stably.
//! * Membership changes are new values: [`Ring::with_node`] / [`Ring::without_node`]. A joining
//!   node's virtual ids take over part of their successor's range; nothing else moves.
//! * Front-ends split the circle into F equal contiguous [`wedges`]; [`wedge_of`] finds one.
//!
//! ```
//! use fawn_ring::{key_id, Ring};
//! let ring = Ring::new(&[1, 2, 3], 2, 3);
//! let chain = ring.chain(key_id(b"user:42"));
//! assert_eq!(chain.nodes.len(), 3);
//! assert!(chain.range.contains(key_id(b"user:42")));
//! let (head, tail) = (chain.head(), chain.tail()); // puts go to head, gets to tail
//! assert_ne!(head, tail);
//! ```

mod chain;
mod key_id;
mod range;
mod ring;
mod vid;
mod wedge;

pub use chain::Chain;
pub use key_id::{key_id, KeyId};
pub use range::Range;
pub use ring::Ring;
pub use vid::{vid_key_id, virtual_ids, NodeId, VirtualId};
pub use wedge::{wedge_of, wedges};
