//! The manager: holds the authoritative cluster configuration, persists every change before
//! publishing it, and answers registrations and configuration fetches.

mod detector;
mod persist;
pub mod state;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_proto::native::{ClusterConfig, NodeState, NodeStatus, Request, Response, WireError};
use fawn_ring::NodeId;
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

/// A cut link the manager has not heard about for this long is taken to be over: re-replication
/// may sync across it again. Back-ends re-report a cut about every second while it lasts
/// (`backend::LINK_CUT_REPORT_INTERVAL`).
pub const LINK_CUT_FORGET_AFTER: Duration = Duration::from_secs(3);
/// Before acting on a link-cut report the manager pings the reported peer itself; it must
/// answer within this (a dead or stopped peer is a failure, not a cut).
pub const LINK_CUT_CONFIRM_TIMEOUT: Duration = Duration::from_millis(500);

/// The running manager.
pub struct Manager {
    options: ManagerOptions,
    config: Mutex<ClusterConfig>,
    /// Cut chain links (unordered pairs) with the time of their latest report.
    cuts: Mutex<HashMap<(NodeId, NodeId), Instant>>,
    /// When each back-end was last heard answering a heartbeat: a front-end's (as reported)
    /// or the manager's own.
    heartbeat_ok: Mutex<HashMap<NodeId, Instant>>,
    /// When each front-end last reported a heartbeat round (`Request::Heartbeats`).
    frontend_reports: Mutex<HashMap<u32, Instant>>,
    /// Back-ends the manager is pinging to confirm a reported silence.
    confirming: Mutex<std::collections::HashSet<NodeId>>,
    /// When the manager last logged that a front-end cannot reach a back-end it can.
    one_sided_logged: Mutex<HashMap<(u32, NodeId), Instant>>,
    /// Connections for confirming link-cut reports.
    pool: fawn_client::pool::Pool,
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
            cuts: Mutex::new(HashMap::new()),
            heartbeat_ok: Mutex::new(HashMap::new()),
            frontend_reports: Mutex::new(HashMap::new()),
            confirming: Mutex::new(std::collections::HashSet::new()),
            one_sided_logged: Mutex::new(HashMap::new()),
            pool: fawn_client::pool::Pool::new(LINK_CUT_CONFIRM_TIMEOUT),
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
        tokio::spawn(detector::detect_failures(Arc::downgrade(&self), shutdown.clone()));
        tokio::spawn(push_configs(self.published.subscribe(), shutdown.clone()));
        server::serve(listener, self, shutdown).await
    }

    /// The cut links currently believed in.
    fn link_cuts(&self) -> state::LinkCuts {
        let mut cuts = state::LinkCuts::default();
        for (a, b) in self.cuts.lock().keys() {
            cuts.insert(*a, *b);
        }
        cuts
    }

    /// `node` reports its chain link to `peer` cut. Acted on only while both answer the
    /// manager's heartbeats and `peer` answers a ping from the manager now: a stopped or dead
    /// successor also stalls a link and fails the reporter's probe, and failing it (the
    /// failure detector's job) is the right repair. Without the ping, a node killed less than
    /// half the failure threshold ago still looked alive, and the manager removed the healthy
    /// reporter from a chain whose only other member was the dead node (found by the
    /// link-cut fault test, a third node killed during a cut).
    async fn link_cut(&self, node: NodeId, peer: NodeId) -> Response {
        let fresh = self.options.heartbeat * (self.options.fd_threshold / 2).max(1);
        {
            let seen = self.heartbeat_ok.lock();
            for n in [node, peer] {
                if seen.get(&n).is_none_or(|t| t.elapsed() > fresh) {
                    return Response::Error(WireError::Unavailable(format!(
                        "back-end {n} is not answering heartbeats: the failure detector decides"
                    )));
                }
            }
        }
        let addr = self.config().backend_addr(peer).map(str::to_string);
        let answered = match addr {
            Some(addr) => crate::view::answers_ping(&self.pool, &addr, LINK_CUT_CONFIRM_TIMEOUT).await,
            None => false,
        };
        if !answered {
            return Response::Error(WireError::Unavailable(format!(
                "back-end {peer} does not answer the manager either: the failure detector decides"
            )));
        }
        let known = self.cuts.lock().insert((node.min(peer), node.max(peer)), Instant::now()).is_some();
        if !known {
            warn!(node, peer, "chain link reported cut; repairing the chains around it");
        }
        let cuts = self.link_cuts();
        self.apply(|c| state::cut_link(c, node, peer, &cuts))
    }

    /// Forgets cuts no longer reported and lets re-replication use those links again.
    fn expire_cuts(&self) {
        let expired: Vec<(NodeId, NodeId)> = {
            let mut cuts = self.cuts.lock();
            let old: Vec<_> =
                cuts.iter().filter(|(_, t)| t.elapsed() >= LINK_CUT_FORGET_AFTER).map(|(k, _)| *k).collect();
            for k in &old {
                cuts.remove(k);
            }
            old
        };
        if expired.is_empty() {
            return;
        }
        for (a, b) in &expired {
            info!(a, b, "chain link no longer reported cut");
        }
        let cuts = self.link_cuts();
        let _ = self.apply(|c| Ok::<_, std::convert::Infallible>(state::settle(c, &cuts)));
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
            Request::RegisterBackend { node, addr, logs_complete } => {
                let expected = self.options.expected_backends;
                let cuts = self.link_cuts();
                if logs_complete {
                    self.apply(|c| state::register_backend(c, expected, node, &addr, &cuts))
                } else {
                    self.apply(|c| state::register_backend_unproven(c, expected, node, &addr, &cuts))
                }
            }
            Request::RegisterFrontend { id, native_addr, memcache_addr } => {
                self.apply(|c| state::register_frontend(c, id, &native_addr, &memcache_addr))
            }
            Request::SyncDone { node, range } => {
                let cuts = self.link_cuts();
                self.apply(|c| state::sync_done(c, node, range, &cuts))
            }
            Request::Leave { node } => {
                let cuts = self.link_cuts();
                self.apply(|c| state::leave(c, node, &cuts))
            }
            Request::LinkCut { node, peer } => self.link_cut(node, peer).await,
            Request::TailReady { node, range } => {
                let cuts = self.link_cuts();
                self.apply(|c| state::tail_ready(c, node, range, &cuts))
            }
            Request::SplitReady { node, range } => {
                let cuts = self.link_cuts();
                self.apply(|c| state::split_ready(c, node, range, &cuts))
            }
            Request::MergeReady { node, range } => {
                let cuts = self.link_cuts();
                self.apply(|c| state::merge_ready(c, node, range, &cuts))
            }
            Request::SetFlush { at_micros } => {
                self.apply(|c| Ok::<_, std::convert::Infallible>(Some(state::set_flush(c, at_micros))))
            }
            Request::Status => Response::Status(NodeStatus {
                role: "manager".into(),
                epoch: self.config.lock().epoch,
                uptime_secs: self.started.elapsed().as_secs(),
                counters: vec![
                    ("cut_links".to_string(), self.cuts.lock().len() as u64),
                    ("frontends_reporting_heartbeats".to_string(), self.frontends_reporting() as u64),
                ],
            }),
            Request::Heartbeats { frontend, silent_ms } => {
                self.heartbeats(frontend, silent_ms);
                Response::Ok
            }
            Request::Ping => Response::Pong,
            other => Response::Error(WireError::Invalid(format!("the manager does not serve {other:?}"))),
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
