//! A configuration and the ring computed from it: what every process routes by.

use std::collections::HashMap;
use std::time::Duration;

use fawn_client::pool::Pool;
use fawn_proto::native::{ClusterConfig, Request, Response};
use fawn_ring::{Chain, Range, Ring};

/// One epoch's configuration with its ring.
pub struct View {
    pub config: ClusterConfig,
    pub ring: Ring,
    pub(crate) chains: HashMap<Range, Chain>,
}

impl View {
    pub fn new(config: ClusterConfig) -> View {
        let nodes: Vec<_> = config.backends.iter().map(|b| b.node).collect();
        let ring = Ring::new(&nodes, config.vnodes, config.replicas);
        let chains =
            ring.ranges().iter().map(|(range, owner)| (*range, ring.chain_for_range(owner))).collect();
        View { config, ring, chains }
    }

    /// Native address of a back-end.
    pub fn backend_addr(&self, node: fawn_ring::NodeId) -> Option<&str> {
        self.config.backends.iter().find(|b| b.node == node).map(|b| b.addr.as_str())
    }
}

/// Fetches the current configuration from the manager.
pub async fn fetch_config(pool: &Pool, manager: &str) -> Result<ClusterConfig, String> {
    match pool.call(manager, Request::GetConfig, Duration::from_secs(2)).await {
        Ok(Response::Config(c)) => Ok(c),
        Ok(other) => Err(format!("unexpected answer {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}
