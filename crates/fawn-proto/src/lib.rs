//! FAWN wire formats.
//!
//! - [`op`]: the update operations a chain head decides (shared by the native protocol and the
//!   memcached front-end).
//! - `native`: length-prefixed binary frames between clients, front-ends, back-ends and manager.
//! - `memcache`: the memcached text protocol parser and encoder (used only by front-ends).
//!
//! **Architecture Invariant:** this crate does no I/O. Decoders take bytes and say "incomplete",
//! "invalid" or return a frame; they never panic on any input.

pub mod memcache;
pub mod native;
pub mod op;
