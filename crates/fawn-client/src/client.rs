//! The ring-aware client.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fawn_proto::native::{ClusterConfig, ReqId, Request, Response, WireError};
use fawn_proto::op::{Item, Mutation, Outcome, Update};
use fawn_ring::key_id;
use parking_lot::RwLock;

use crate::pool::Pool;
use crate::retry::{Attempt, Next, Retry, RetryPolicy};
use crate::rpc::RpcError;

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub retry: RetryPolicy,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            retry: RetryPolicy::DEFAULT,
        }
    }
}

/// Why an operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    #[error("transport: {0}")]
    Rpc(#[from] RpcError),
    #[error("cluster: {0}")]
    Cluster(#[from] WireError),
    #[error("no front-end in the configuration")]
    NoFrontend,
    #[error("unexpected response: {0}")]
    Unexpected(String),
}

/// A ring-aware FAWN client.
pub struct Client {
    bootstrap: Vec<String>,
    config: RwLock<ClusterConfig>,
    pool: Pool,
    options: ClientOptions,
    client_id: u64,
    next_req: AtomicU64,
    /// When this client last reported a front-end refusing connections.
    refusal_reported: parking_lot::Mutex<Option<std::time::Instant>>,
}

/// Shortest time between two of a client's reports that a front-end refuses connections.
const REFUSAL_REPORT_INTERVAL: Duration = Duration::from_millis(100);

impl Client {
    /// Connects through any of `bootstrap` (front-end or manager native addresses).
    pub async fn connect(bootstrap: &[String], options: ClientOptions) -> Result<Arc<Client>, ClientError> {
        let client = Arc::new(Client {
            bootstrap: bootstrap.to_vec(),
            config: RwLock::new(ClusterConfig::default()),
            pool: Pool::new(options.connect_timeout),
            options,
            client_id: rand::random(),
            next_req: AtomicU64::new(1),
            refusal_reported: parking_lot::Mutex::new(None),
        });
        client.refresh().await?;
        Ok(client)
    }

    /// The configuration the client routes by.
    pub fn config(&self) -> ClusterConfig {
        self.config.read().clone()
    }

    /// Re-fetches the configuration from the bootstrap addresses or known front-ends.
    pub async fn refresh(&self) -> Result<(), ClientError> {
        let mut candidates = self.bootstrap.clone();
        candidates.extend(self.config.read().frontends.iter().map(|f| f.native_addr.clone()));
        let mut last = ClientError::NoFrontend;
        for addr in candidates {
            match self.pool.call(&addr, Request::GetConfig, self.options.request_timeout).await {
                Ok(Response::Config(c)) if !c.frontends.is_empty() => {
                    let mut cur = self.config.write();
                    if c.epoch >= cur.epoch {
                        *cur = c;
                    }
                    return Ok(());
                }
                Ok(other) => last = ClientError::Unexpected(format!("{other:?}")),
                Err(e) => last = e.into(),
            }
        }
        Err(last)
    }

    fn frontend_for(&self, key: &[u8]) -> Result<(String, u64), ClientError> {
        let config = self.config.read();
        // The front-end serving the key's wedge: its own, or the one it is lent to while its
        // own is declared dead.
        let frontend = config.frontend_for(key_id(key)).ok_or(ClientError::NoFrontend)?;
        Ok((frontend.native_addr.clone(), config.epoch))
    }

    /// Reads a key; `None` if absent, deleted, expired or flushed.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Item>, ClientError> {
        let resp = self
            .with_retries(|epoch| Request::Get { epoch, key: key.to_vec(), forwarded: false }, key)
            .await?;
        match resp {
            Response::Get(item) => Ok(item),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Applies any update (set, add, cas, incr, delete, ...).
    pub async fn update(&self, update: Update) -> Result<Outcome, ClientError> {
        let req = ReqId { client: self.client_id, seq: self.next_req.fetch_add(1, Ordering::Relaxed) };
        let key = update.key.clone();
        let resp = self
            .with_retries(
                |epoch| Request::Update {
                    epoch,
                    req,
                    update: update.clone(),
                    forwarded: false,
                    reply_to: None,
                    // No floor: this client's outcomes go by the heads' window and count.
                    floor: 0,
                },
                &key,
            )
            .await?;
        match resp {
            Response::Update(outcome) => Ok(outcome),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Unconditional store; returns the new item's cas unique.
    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<u64, ClientError> {
        let update =
            Update { key: key.to_vec(), mutation: Mutation::Set, value: value.to_vec(), flags: 0, expiry: 0 };
        match self.update(update).await? {
            Outcome::Stored { cas } => Ok(cas),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Deletes a key; true if it existed.
    pub async fn delete(&self, key: &[u8]) -> Result<bool, ClientError> {
        let update =
            Update { key: key.to_vec(), mutation: Mutation::Delete, value: Vec::new(), flags: 0, expiry: 0 };
        match self.update(update).await? {
            Outcome::Deleted => Ok(true),
            Outcome::NotFound => Ok(false),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    async fn with_retries(&self, make: impl Fn(u64) -> Request, key: &[u8]) -> Result<Response, ClientError> {
        let mut retry = Retry::new(self.options.retry);
        loop {
            let routed_by = self.config.read().epoch;
            let result = self.try_once(&make, key).await;
            if let Err(ClientError::Rpc(RpcError::Connect { addr, .. })) = &result {
                self.report_refused(addr).await;
            }
            let attempt = match &result {
                Ok(_) => Attempt::Answered,
                Err(ClientError::Rpc(_)) => Attempt::Unreachable,
                Err(ClientError::Cluster(e)) => Attempt::Refused(e),
                Err(_) => return result,
            };
            match retry.after(attempt, routed_by) {
                Next::Stop => return result,
                Next::RetryNow => {}
                Next::RetryAfter(wait) => tokio::time::sleep(wait).await,
            }
            let _ = self.refresh().await;
        }
    }

    /// The front-end at `addr` could not be connected to: tell the cluster through another
    /// front-end (or a manager among the bootstrap addresses), whose leader checks that
    /// nothing listens there and then lends its wedge at once; installs the answer.
    async fn report_refused(&self, addr: &str) {
        let (frontend, others) = {
            let config = self.config.read();
            let Some(f) = config.frontends.iter().find(|f| f.native_addr == addr) else { return };
            let others: Vec<String> =
                config.frontends.iter().filter(|o| o.id != f.id).map(|o| o.native_addr.clone()).collect();
            (f.id, others)
        };
        {
            let mut last = self.refusal_reported.lock();
            if last.is_some_and(|t| t.elapsed() < REFUSAL_REPORT_INTERVAL) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        let candidates = others.into_iter().chain(self.bootstrap.iter().filter(|b| *b != addr).cloned());
        for via in candidates {
            let request = Request::FrontendRefused { frontend };
            if let Ok(Response::Config(c)) = self.pool.call(&via, request, self.options.request_timeout).await
            {
                let mut cur = self.config.write();
                if c.epoch >= cur.epoch && !c.frontends.is_empty() {
                    *cur = c;
                }
                return;
            }
        }
    }

    async fn try_once(&self, make: &impl Fn(u64) -> Request, key: &[u8]) -> Result<Response, ClientError> {
        let (addr, epoch) = self.frontend_for(key)?;
        match self.pool.call(&addr, make(epoch), self.options.request_timeout).await? {
            Response::Error(e) => Err(ClientError::Cluster(e)),
            resp => Ok(resp),
        }
    }
}
