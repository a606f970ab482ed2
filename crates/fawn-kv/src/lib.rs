//! FAWN-KV services on tokio: back-end, front-end and manager.
//!
//! **Architecture Invariant:** only the front-end (`memcache` module) knows memcached syntax;
//! back-ends and the manager speak only the native protocol.

pub mod memcache;
pub mod service;
