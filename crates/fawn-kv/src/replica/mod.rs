//! The write path of one range replica as a pure state machine, and the pieces it shares with
//! the async back-end (`backend::range`).
//!
//! No tokio, sockets or clocks here: time and messages come in as events, and what is to be
//! sent or answered goes out as actions, so a deterministic simulator (`fawn-sim`) can drive
//! many replicas in one thread. The datastore sits behind [`store::ReplicaStore`].

pub mod dedup;
pub mod machine;
pub mod reshape;
pub mod route;
pub mod store;
pub mod sync;
pub mod tag;
