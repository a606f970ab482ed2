//! Not a check by itself: `serve_standalone` (ignored by default) runs the memcached front-end
//! over the in-memory test double on `$FAWN_MEMCACHED_ADDR` until killed, so that
//! `scripts/memcached-compat.sh --against double` can aim memccapable and pymemcache's
//! integration tests at the front-end alone, without a cluster.

mod memcache_support;

use std::sync::Arc;

use fawn_kv::memcache::{serve, MemcacheConfig};
use memcache_support::MemService;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs until killed; used by scripts/memcached-compat.sh --against double"]
async fn serve_standalone() {
    let addr = std::env::var("FAWN_MEMCACHED_ADDR").unwrap_or_else(|_| "127.0.0.1:22123".into());
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    eprintln!("memcached front-end (test double) listening on {addr}");
    let service = Arc::new(MemService::default());
    serve(listener, service, MemcacheConfig::default(), std::future::pending::<()>()).await;
}
