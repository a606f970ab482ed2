//! The manager: holds the authoritative cluster configuration, persists every change before
//! publishing it, and answers registrations and configuration fetches.

mod persist;
pub mod state;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_proto::native::{ClusterConfig, NodeState, NodeStatus, Request, Response, WireError};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::server::{self, Handler};
pub use persist::ConfigFile;

/// Manager settings.
#[derive(Clone, Debug)]
pub struct ManagerOptions {
    pub data_dir: PathBuf,
    /// Back-ends the ring is formed from; registrations beyond it are refused.
    pub expected_backends: usize,
    pub replicas: u32,
    pub vnodes: u32,
    /// Front-ends (wedges) of the cluster.
    pub expected_frontends: u32,
    /// Interval between heartbeats to each back-end (t_hb).
    pub heartbeat: Duration,
    /// Consecutive missed heartbeats after which a back-end is declared failed.
    pub fd_threshold: u32,
}

/// The running manager.
pub struct Manager {
    options: ManagerOptions,
    config: Mutex<ClusterConfig>,
    file: ConfigFile,
    started: Instant,
    /// Publishes every new configuration to the pusher task.
    published: watch::Sender<ClusterConfig>,
}

impl Manager {
    /// Loads the saved configuration (or makes a fresh one) and persists it.
    pub fn open(options: ManagerOptions) -> std::io::Result<Arc<Manager>> {
        let file = ConfigFile::new(&options.data_dir);
        let config = match file.load()? {
            Some(c) => c,
            None => {
                let c = state::initial(options.replicas, options.vnodes, options.expected_frontends);
                file.save(&c)?;
                c
            }
        };
        info!(epoch = config.epoch, backends = config.backends.len(), "manager configuration loaded");
        let (published, _) = watch::channel(config.clone());
        Ok(Arc::new(Manager {
            options,
            config: Mutex::new(config),
            file,
            started: Instant::now(),
            published,
        }))
    }

    /// The current configuration.
    pub fn config(&self) -> ClusterConfig {
        self.config.lock().clone()
    }

    /// Serves the native protocol and runs the failure detector until shutdown.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, shutdown: watch::Receiver<bool>) {
        tokio::spawn(detect_failures(Arc::downgrade(&self), shutdown.clone()));
        tokio::spawn(push_configs(self.published.subscribe(), shutdown.clone()));
        server::serve(listener, self, shutdown).await
    }

    /// Applies a transition: persist first, then publish.
    fn apply<E: std::fmt::Display>(
        &self,
        transition: impl FnOnce(&ClusterConfig) -> Result<Option<ClusterConfig>, E>,
    ) -> Response {
        let mut config = self.config.lock();
        match transition(&config) {
            Ok(None) => Response::Config(config.clone()),
            Ok(Some(next)) => {
                if let Err(e) = self.file.save(&next) {
                    return Response::Error(WireError::Storage(format!("persisting configuration: {e}")));
                }
                info!(
                    epoch = next.epoch,
                    backends = next.backends.len(),
                    frontends = next.frontends.len(),
                    formed = next.formed,
                    "configuration changed"
                );
                *config = next;
                self.published.send_replace(config.clone());
                Response::Config(config.clone())
            }
            Err(e) => Response::Error(WireError::Invalid(e.to_string())),
        }
    }
}

impl crate::metrics::Exposition for Manager {
    fn metrics(&self) -> String {
        let c = self.config();
        let mut out = String::new();
        crate::metrics::line(&mut out, "fawn_manager_epoch", "", c.epoch);
        crate::metrics::line(&mut out, "fawn_manager_backends", "", c.backends.len() as u64);
        crate::metrics::line(&mut out, "fawn_manager_frontends", "", c.frontends.len() as u64);
        out
    }
}

impl Handler for Manager {
    async fn request(self: Arc<Self>, request: Request) -> Response {
        match request {
            Request::GetConfig => Response::Config(self.config()),
            Request::RegisterBackend { node, addr } => {
                let expected = self.options.expected_backends;
                self.apply(|c| state::register_backend(c, expected, node, &addr))
            }
            Request::RegisterFrontend { id, native_addr, memcache_addr } => {
                self.apply(|c| state::register_frontend(c, id, &native_addr, &memcache_addr))
            }
            Request::SyncDone { node, range } => self.apply(|c| state::sync_done(c, node, range)),
            Request::Leave { node } => self.apply(|c| state::leave(c, node)),
            Request::SetFlush { at_micros } => {
                self.apply(|c| Ok::<_, std::convert::Infallible>(Some(state::set_flush(c, at_micros))))
            }
            Request::Status => Response::Status(NodeStatus {
                role: "manager".into(),
                epoch: self.config.lock().epoch,
                uptime_secs: self.started.elapsed().as_secs(),
                counters: Vec::new(),
            }),
            Request::Ping => Response::Pong,
            other => Response::Error(WireError::Invalid(format!("the manager does not serve {other:?}"))),
        }
    }
}

/// Heartbeats every alive back-end each `heartbeat`; one that has not answered for
/// `heartbeat × fd_threshold` is declared failed, which removes it from its chains and starts
/// re-replication.
async fn detect_failures(manager: std::sync::Weak<Manager>, mut shutdown: watch::Receiver<bool>) {
    let pool = Arc::new(fawn_client::pool::Pool::new(Duration::from_millis(500)));
    // Time-based, so a probe that hangs until its timeout does not stretch the threshold.
    let mut last_ok: HashMap<fawn_ring::NodeId, Instant> = HashMap::new();
    loop {
        let Some(m) = manager.upgrade() else { return };
        let (heartbeat, threshold) = (m.options.heartbeat, m.options.fd_threshold);
        let config = m.config();
        drop(m);
        tokio::select! {
            _ = tokio::time::sleep(heartbeat) => {}
            _ = shutdown.changed() => return,
        }
        if !config.formed {
            continue;
        }
        let mut probes = tokio::task::JoinSet::new();
        for b in config.backends.iter().filter(|b| matches!(b.state, NodeState::Alive | NodeState::Leaving)) {
            let (pool, node, addr) = (pool.clone(), b.node, b.addr.clone());
            probes.spawn(async move {
                (node, matches!(pool.call(&addr, Request::Ping, heartbeat).await, Ok(Response::Pong)))
            });
        }
        let limit = heartbeat * threshold;
        while let Some(Ok((node, alive))) = probes.join_next().await {
            let seen = last_ok.entry(node).or_insert_with(Instant::now);
            if alive {
                *seen = Instant::now();
            } else if seen.elapsed() >= limit {
                last_ok.remove(&node);
                let Some(m) = manager.upgrade() else { return };
                warn!(node, threshold, "back-end missed its heartbeats; declaring it failed");
                let _ = m.apply(|c| state::fail_node(c, node));
            }
        }
    }
}

/// Pushes each new configuration to every back-end and front-end, so a repair takes effect in
/// one round trip instead of at their next poll (they poll too, in case a push is lost).
async fn push_configs(mut published: watch::Receiver<ClusterConfig>, mut shutdown: watch::Receiver<bool>) {
    let pool = Arc::new(fawn_client::pool::Pool::new(Duration::from_millis(300)));
    loop {
        tokio::select! {
            r = published.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
        let config = published.borrow_and_update().clone();
        let backends =
            config.backends.iter().filter(|b| b.state != NodeState::Failed).map(|b| b.addr.clone());
        let targets: Vec<String> =
            backends.chain(config.frontends.iter().map(|f| f.native_addr.clone())).collect();
        for addr in targets {
            let (pool, config) = (pool.clone(), config.clone());
            tokio::spawn(async move {
                let _ = pool.call(&addr, Request::Install { config }, Duration::from_millis(500)).await;
            });
        }
    }
}
