//! FAWN-KV services on tokio: back-end, front-end and manager.
//!
//! **Architecture Invariant:** only the front-end (`memcache` module) knows memcached syntax;
//! back-ends and the manager speak only the native protocol.

pub mod auth;
pub mod backend;
pub mod clock;
pub mod frontend;
pub mod launch;
pub mod limits;
pub mod local;
pub mod lockfile;
pub mod manager;
pub mod memcache;
pub mod metrics;
pub mod replica;
pub mod run;
pub mod server;
pub mod service;
pub mod stall;
pub mod view;
