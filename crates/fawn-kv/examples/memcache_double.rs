//! The memcached front-end over the in-memory test double, on `$FAWN_MEMCACHED_ADDR`
//! (default 127.0.0.1:22123), until killed. `scripts/memcached-compat.sh --against double`
//! aims memccapable and pymemcache's integration tests at the front-end alone, without a
//! cluster.

#[path = "../tests/memcache_support/mod.rs"]
mod memcache_support;

use std::sync::Arc;

use fawn_kv::memcache::{serve, MemcacheConfig};
use memcache_support::MemService;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("FAWN_MEMCACHED_ADDR").unwrap_or_else(|_| "127.0.0.1:22123".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("memcached front-end (test double) listening on {addr}");
    let service = Arc::new(MemService::default());
    serve(listener, service, MemcacheConfig::default(), std::future::pending::<()>()).await;
    Ok(())
}
