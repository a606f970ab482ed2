//! A configuration as every process routes by it.

use std::sync::Arc;
use std::time::Duration;

use fawn_client::pool::Pool;
use fawn_proto::native::{ClusterConfig, NodeState, RangeConfig, Request, Response};
use fawn_ring::{key_id, NodeId};

/// One epoch's configuration.
pub struct View {
    pub config: ClusterConfig,
}

impl View {
    pub fn new(config: ClusterConfig) -> View {
        View { config }
    }

    /// The range (and chain) holding `key`.
    pub fn range_for_key(&self, key: &[u8]) -> Option<&RangeConfig> {
        self.config.range_of(key_id(key))
    }

    /// Native address of a back-end.
    pub fn backend_addr(&self, node: fawn_ring::NodeId) -> Option<&str> {
        self.config.backend_addr(node)
    }
}

/// Fetches the current configuration from the manager.
pub async fn fetch_config(pool: &Pool, managers: &str) -> Result<ClusterConfig, String> {
    match crate::manager::client::call(pool, managers, Request::GetConfig, Duration::from_secs(2)).await {
        Ok(Response::Config(c)) => Ok(c),
        Ok(other) => Err(format!("unexpected answer {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

/// The back-ends failure detection watches (alive or leaving), with their addresses.
pub fn watched_backends(config: &ClusterConfig) -> Vec<(NodeId, String)> {
    config
        .backends
        .iter()
        .filter(|b| matches!(b.state, NodeState::Alive | NodeState::Leaving))
        .map(|b| (b.node, b.addr.clone()))
        .collect()
}

/// Whether the process at `addr` answers a `Ping` within `timeout`, connecting included.
pub async fn answers_ping(pool: &Pool, addr: &str, timeout: Duration) -> bool {
    let ping = pool.call(addr, Request::Ping, timeout);
    matches!(tokio::time::timeout(timeout, ping).await, Ok(Ok(Response::Pong)))
}

/// Pings every back-end of `backends` at once; returns whether each answered within
/// `timeout`.
pub async fn ping_all(
    pool: &Arc<Pool>,
    backends: &[(NodeId, String)],
    timeout: Duration,
) -> Vec<(NodeId, bool)> {
    let mut probes = tokio::task::JoinSet::new();
    for (node, addr) in backends {
        let (pool, node, addr) = (Arc::clone(pool), *node, addr.clone());
        probes.spawn(async move { (node, answers_ping(&pool, &addr, timeout).await) });
    }
    let mut answers = Vec::with_capacity(backends.len());
    while let Some(joined) = probes.join_next().await {
        match joined {
            Ok(answer) => answers.push(answer),
            Err(e) => tracing::warn!(error = %e, "heartbeat probe task failed"),
        }
    }
    answers
}
