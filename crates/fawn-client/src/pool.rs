//! One live multiplexed connection per peer address, re-established when it dies, and
//! forgotten (closed) once dead or unused for a while, so a node that talked to many peers
//! over its life holds connections only to those it still uses.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_proto::native::{ClusterConfig, NodeState, Request, Response};
use parking_lot::Mutex;

use crate::rpc::{Connection, RpcError};

/// A pooled connection unused for this long is closed by the next sweep.
pub const POOL_IDLE_FORGET: Duration = Duration::from_secs(60);
/// Most time between sweeps of dead and idle connections (a sweep runs on a pool call).
const POOL_SWEEP_EVERY: Duration = Duration::from_secs(5);

struct Entry {
    conn: Arc<Connection>,
    used: Instant,
}

struct Conns {
    map: HashMap<String, Entry>,
    swept: Instant,
}

/// Shared connections to peers.
pub struct Pool {
    conns: Mutex<Conns>,
    connect_timeout: Duration,
    idle_forget: Duration,
}

impl Pool {
    pub fn new(connect_timeout: Duration) -> Pool {
        Pool::with_idle_forget(connect_timeout, POOL_IDLE_FORGET)
    }

    /// A pool that closes connections unused for `idle_forget`.
    pub fn with_idle_forget(connect_timeout: Duration, idle_forget: Duration) -> Pool {
        let conns = Conns { map: HashMap::new(), swept: Instant::now() };
        Pool { conns: Mutex::new(conns), connect_timeout, idle_forget }
    }

    /// A live connection to `addr`, connecting if needed.
    pub async fn get(&self, addr: &str) -> Result<Arc<Connection>, RpcError> {
        if let Some(conn) = self.live(addr) {
            return Ok(conn);
        }
        let conn = Connection::connect(addr, self.connect_timeout).await?;
        let mut conns = self.conns.lock();
        let used = Instant::now();
        // Another task may have connected meanwhile; keep one.
        match conns.map.get_mut(addr) {
            Some(existing) if existing.conn.is_alive() => {
                existing.used = used;
                Ok(existing.conn.clone())
            }
            _ => {
                conns.map.insert(addr.to_string(), Entry { conn: conn.clone(), used });
                Ok(conn)
            }
        }
    }

    /// The pooled connection to `addr` if it is alive, without connecting; sweeps the pool
    /// now and then.
    pub fn live(&self, addr: &str) -> Option<Arc<Connection>> {
        let now = Instant::now();
        let mut conns = self.conns.lock();
        if now.duration_since(conns.swept) >= POOL_SWEEP_EVERY.min(self.idle_forget) {
            conns.swept = now;
            let idle_forget = self.idle_forget;
            // A connection a caller still holds is in use, however long ago it was taken.
            conns.map.retain(|_, e| {
                e.conn.is_alive()
                    && (now.duration_since(e.used) < idle_forget || Arc::strong_count(&e.conn) > 1)
            });
        }
        let entry = conns.map.get_mut(addr)?;
        if !entry.conn.is_alive() {
            conns.map.remove(addr);
            return None;
        }
        entry.used = now;
        Some(entry.conn.clone())
    }

    /// Closes the connection to `addr`, if any (a peer no longer needed).
    pub fn forget(&self, addr: &str) {
        self.conns.lock().map.remove(addr);
    }

    /// Keeps only the connections to addresses `keep` accepts.
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        self.conns.lock().map.retain(|addr, _| keep(addr));
    }

    /// On a configuration change: closes the connections to processes `config` no longer
    /// names (back-ends that left, front-ends gone, an old `reply_to` front-end), keeping those
    /// to its members and to `managers`. A caller still holding a dropped connection finishes
    /// its call on it.
    pub fn retain_members(&self, config: &ClusterConfig, managers: &[String]) {
        self.retain(|addr| {
            config.backends.iter().any(|b| b.addr == addr && b.state != NodeState::Left)
                || config.frontends.iter().any(|f| f.native_addr == addr)
                || managers.iter().any(|m| m == addr)
        });
    }

    /// Peers with a pooled connection now.
    pub fn len(&self) -> usize {
        self.conns.lock().map.len()
    }

    /// Whether no connection is pooled.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One call on the pooled connection to `addr`.
    pub async fn call(&self, addr: &str, request: Request, timeout: Duration) -> Result<Response, RpcError> {
        let conn = self.get(addr).await?;
        conn.call(request, timeout).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fawn_proto::native::{BackendInfo, FrontendInfo};

    #[tokio::test]
    async fn a_configuration_change_forgets_peers_that_left() {
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for _ in 0..4 {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            addrs.push(listener.local_addr().expect("addr").to_string());
            listeners.push(listener);
        }
        let pool = Pool::new(Duration::from_secs(5));
        for addr in &addrs {
            pool.get(addr).await.expect("connect");
        }
        assert_eq!(pool.len(), 4);
        let config = ClusterConfig {
            backends: vec![BackendInfo {
                node: 0,
                addr: addrs[0].clone(),
                state: NodeState::Alive,
                reason: None,
            }],
            frontends: vec![FrontendInfo {
                id: 0,
                native_addr: addrs[1].clone(),
                memcache_addr: String::new(),
            }],
            ..ClusterConfig::default()
        };
        pool.retain_members(&config, std::slice::from_ref(&addrs[2]));
        assert_eq!(pool.len(), 3, "the fourth peer is named nowhere");
        pool.retain_members(&ClusterConfig::default(), &[]);
        assert!(pool.is_empty());
    }
}
