//! One live multiplexed connection per peer address, re-established when it dies.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fawn_proto::native::{Request, Response};
use parking_lot::Mutex;

use crate::rpc::{Connection, RpcError};

/// Shared connections to peers.
pub struct Pool {
    conns: Mutex<HashMap<String, Arc<Connection>>>,
    connect_timeout: Duration,
}

impl Pool {
    pub fn new(connect_timeout: Duration) -> Pool {
        Pool { conns: Mutex::new(HashMap::new()), connect_timeout }
    }

    /// A live connection to `addr`, connecting if needed.
    pub async fn get(&self, addr: &str) -> Result<Arc<Connection>, RpcError> {
        if let Some(conn) = self.conns.lock().get(addr) {
            if conn.is_alive() {
                return Ok(conn.clone());
            }
        }
        let conn = Connection::connect(addr, self.connect_timeout).await?;
        let mut conns = self.conns.lock();
        // Another task may have connected meanwhile; keep one.
        match conns.get(addr) {
            Some(existing) if existing.is_alive() => Ok(existing.clone()),
            _ => {
                conns.insert(addr.to_string(), conn.clone());
                Ok(conn)
            }
        }
    }

    /// One call on the pooled connection to `addr`.
    pub async fn call(&self, addr: &str, request: Request, timeout: Duration) -> Result<Response, RpcError> {
        let conn = self.get(addr).await?;
        conn.call(request, timeout).await
    }
}
