//! FAWN Rust client over the native protocol.
//!
//! [`Client`] fetches the cluster configuration from any front-end or the manager, and sends
//! each request straight to the front-end that owns the key's wedge, over pooled multiplexed
//! connections, with timeouts and bounded retries ([`retry`], the policy the front-ends follow too). [`transport`] (plain or mutual TLS), [`rpc`], [`pool`] and [`framed`] are the
//! transport pieces the cluster services reuse.

pub mod client;
pub mod framed;
pub mod pool;
pub mod retry;
pub mod rpc;
pub mod transport;

pub use client::{Client, ClientError, ClientOptions};
