//! A configuration as every process routes by it.

use std::time::Duration;

use fawn_client::pool::Pool;
use fawn_proto::native::{ClusterConfig, RangeConfig, Request, Response};
use fawn_ring::key_id;

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
pub async fn fetch_config(pool: &Pool, manager: &str) -> Result<ClusterConfig, String> {
    match pool.call(manager, Request::GetConfig, Duration::from_secs(2)).await {
        Ok(Response::Config(c)) => Ok(c),
        Ok(other) => Err(format!("unexpected answer {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}
