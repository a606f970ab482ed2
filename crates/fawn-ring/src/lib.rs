//! FAWN ring: key ids, virtual ids, ranges and chains.
//!
//! **Architecture Invariant:** this crate is pure. No I/O, no networking, no clocks, no threads.

mod key_id;

pub use key_id::{key_id, KeyId};
