//! The interface a client-facing protocol (memcached, native) uses to reach the cluster.
//!
//! The front-end implements [`KvService`] by routing to chains; the memcached server is written
//! against this trait only, so it knows nothing of rings or chains.

use std::future::Future;

use fawn_proto::op::{Item, Outcome, Update};

/// Why the cluster could not serve a request. The memcached front-end maps every variant to
/// `SERVER_ERROR <message>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// No live chain for the key right now (failures, reconfiguration); retry later.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The request timed out; its effect is unknown.
    #[error("timeout")]
    Timeout,
    /// The value or key exceeds a limit of the cluster.
    #[error("object too large for cache")]
    TooLarge,
    /// A back-end reported a failure (I/O error, full disk, poisoned store).
    #[error("{0}")]
    Backend(String),
}

/// Cluster operations available to a front-end protocol handler.
pub trait KvService: Send + Sync + 'static {
    /// Read a key at the tail of its chain (or from the coherent front-end cache).
    /// Expired items are returned as `None`.
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Option<Item>, ServiceError>> + Send;

    /// Apply an update at the head of the key's chain; the head decides conditional
    /// mutations (`fawn_proto::op::decide`) and replicates the effect.
    fn update(&self, update: Update) -> impl Future<Output = Result<Outcome, ServiceError>> + Send;

    /// Invalidate every item in the whole cluster stored before `at_unix` (seconds); items
    /// stored earlier become misses once that time is reached (`flush_all [delay]`).
    fn flush_all(&self, at_unix: u32) -> impl Future<Output = Result<(), ServiceError>> + Send;

    /// Cluster-wide item counts for `stats` (curr_items, bytes), summed over range tails.
    fn item_stats(&self) -> impl Future<Output = Result<ItemStats, ServiceError>> + Send;

    /// Bytes of log the cluster can address, from its current configuration (`stats`
    /// `limit_maxbytes`): past it a range's datastore refuses writes.
    fn capacity_bytes(&self) -> u64;
}

/// Item counts of the whole cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ItemStats {
    /// Live (not deleted, not superseded) items.
    pub curr_items: u64,
    /// Bytes of live keys and values.
    pub bytes: u64,
}
