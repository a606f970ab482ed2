//! The manager: holds the authoritative cluster configuration and answers registrations and
//! configuration fetches. Run as a group of replicas (3 by default, any odd number) that
//! agree on the configuration through Raft (`raft`): every change is a log entry
//! (`command::Command`) applying one pure transition of `state`, committed on a majority's
//! disks before anyone sees it. Only the group's leader answers: the others pass a caller's
//! reports and renewals on to it (`forwarded`), and tell a caller of anything else who leads
//! (`WireError::NotLeader`); `client` follows the leader across elections.

pub mod client;
pub mod command;
mod detector;
mod persist;
pub mod raft;
pub mod state;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_proto::native::{ClusterConfig, NodeState, NodeStatus, Request, Response, WireError};
use fawn_ring::NodeId;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ServerState};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::server::{self, Handler};
use command::{Applied, Command};
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
    /// Native addresses of the managers a new group is formed from, this one included; manager
    /// `i` of the list has id `i + 1`. Used only when this replica first starts (a group that
    /// exists keeps its membership in its log; change it with `Request::ChangeManagers`).
    /// Empty: this replica joins an existing group (added by the leader, or a member whose
    /// data directory was lost) and forms none of its own.
    pub group: Vec<String>,
    /// This manager's id in the group.
    pub id: raft::ManagerId,
    /// Log entries between snapshots of the configuration (`raft::SNAPSHOT_EVERY_ENTRIES`).
    pub snapshot_every: u64,
}

/// A cut link the manager has not heard about for this long is taken to be over: re-replication
/// may sync across it again. Back-ends re-report a cut about every second while it lasts
/// (`backend::LINK_CUT_REPORT_INTERVAL`).
pub const LINK_CUT_FORGET_AFTER: Duration = Duration::from_secs(3);
/// Before acting on a link-cut report the manager pings the reported peer itself; it must
/// answer within this (a dead or stopped peer is a failure, not a cut).
pub const LINK_CUT_CONFIRM_TIMEOUT: Duration = Duration::from_millis(500);
/// A front-end uses its query cache and sends updates to heads only within this of sending its
/// last heartbeat report that the group's leader answered (`frontend::ownership`).
pub const FRONTEND_LEASE: Duration = Duration::from_millis(1500);
/// The shortest silence after which a front-end is declared dead and its wedges lent, whatever
/// the heartbeat flags say: longer than [`FRONTEND_LEASE`], so that a front-end cut off from
/// the group has stopped acting on its wedges before another front-end takes them.
pub const FRONTEND_SILENCE_MIN: Duration = Duration::from_millis(2000);

const _: () = assert!(FRONTEND_SILENCE_MIN.as_millis() > FRONTEND_LEASE.as_millis());

/// How long a follower waits for the leader's answer to a request it passes on: within the
/// caller's wait for one manager, so that a caller whose follower cannot reach the leader
/// either still has time to try another.
const FORWARD_TIMEOUT: Duration = Duration::from_millis(300);

const _: () = assert!(FORWARD_TIMEOUT.as_millis() < client::ATTEMPT_TIMEOUT.as_millis());

/// Whether a replica that does not lead passes `request` on to the leader (`Manager::forward`)
/// rather than naming the leader to the caller: every renewal and report a back-end or
/// front-end sends, and a configuration fetch. Not a registration: a process that starts
/// is told who leads and then talks to the leader directly, so a frozen follower holds up
/// no one (a caller answered by a follower stays with it; with every request passed on, all
/// processes stayed with the first manager of their list, and freezing that follower for
/// 8 s stalled clients for the whole freeze in `fawn bench failover`). Not a change of the
/// group itself (it waits for a new manager to catch up, far longer than a follower waits),
/// and not what each replica answers for itself (`Status`, `Ping`, `Raft`).
fn forwarded(request: &Request) -> bool {
    matches!(
        request,
        Request::GetConfig
            | Request::Renew
            | Request::Heartbeats { .. }
            | Request::FrontendRefused { .. }
            | Request::SyncDone { .. }
            | Request::Leave { .. }
            | Request::LinkCut { .. }
            | Request::TailReady { .. }
            | Request::SplitReady { .. }
            | Request::MergeReady { .. }
            | Request::SetFlush { .. }
            | Request::DiskFault { .. }
    )
}

/// How long a request waits for a new group's first configuration to be committed.
const FIRST_CONFIG_WAIT: Duration = Duration::from_secs(2);

/// The running manager: one replica of the group.
pub struct Manager {
    options: ManagerOptions,
    raft: raft::Raft,
    /// The configuration as applied from the log.
    published: raft::state_machine::Published,
    /// Cut chain links (unordered pairs) with the time of their latest report. This and the
    /// heartbeat maps below are the leader's soft state, started afresh by each new leader.
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
    started: Instant,
    /// Another member showed this replica a newer membership without it: it no longer
    /// stands for election (`watch_removal`).
    removed: AtomicBool,
    /// Held while a front-end registers and while a refused front-end is declared dead, so
    /// that a registration is either seen by the refusal check or committed after it
    /// (`detector::frontend_refused`).
    frontend_changes: tokio::sync::Mutex<()>,
}

impl Manager {
    /// Opens this manager's replica of the group (its Raft log, vote and snapshot in
    /// `data_dir/raft`), joining or forming the group.
    pub async fn open(options: ManagerOptions) -> anyhow::Result<Arc<Manager>> {
        anyhow::ensure!(
            options.id >= 1 && (options.group.is_empty() || options.id as usize <= options.group.len()),
            "manager id {} is not a position (1..={}) in the manager list",
            options.id,
            options.group.len()
        );
        let members: BTreeMap<raft::ManagerId, String> =
            options.group.iter().enumerate().map(|(i, a)| (i as u64 + 1, a.clone())).collect();
        let (raft, published) =
            raft::open(options.id, &members, &options.data_dir.join("raft"), options.snapshot_every).await?;
        if let Some(c) = published.current() {
            info!(epoch = c.epoch, backends = c.backends.len(), "manager configuration loaded from snapshot");
        }
        Ok(Arc::new(Manager {
            options,
            raft,
            published,
            cuts: Mutex::new(HashMap::new()),
            heartbeat_ok: Mutex::new(HashMap::new()),
            frontend_reports: Mutex::new(HashMap::new()),
            confirming: Mutex::new(std::collections::HashSet::new()),
            one_sided_logged: Mutex::new(HashMap::new()),
            pool: fawn_client::pool::Pool::new(LINK_CUT_CONFIRM_TIMEOUT),
            started: Instant::now(),
            removed: AtomicBool::new(false),
            frontend_changes: tokio::sync::Mutex::new(()),
        }))
    }

    /// The configuration as applied on this replica (empty before the group's first).
    pub fn config(&self) -> ClusterConfig {
        self.published.current().unwrap_or_default()
    }

    /// True while this replica believes it leads the group.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    /// Waits up to `timeout` for this replica to lead the group; true if it does.
    pub async fn wait_leading(&self, timeout: Duration) -> bool {
        let mut metrics = self.raft.metrics();
        let leading = metrics.wait_for(|m| m.state == ServerState::Leader);
        tokio::time::timeout(timeout, leading).await.is_ok_and(|r| r.is_ok())
    }

    /// The address of the manager this replica believes leads the group, if it knows of one.
    pub fn known_leader(&self) -> Option<String> {
        raft::leader(&self.raft).map(|(_, addr)| addr)
    }

    /// The answer of a replica that does not lead: who does, as far as it knows.
    fn not_leader(&self) -> Response {
        Response::Error(WireError::NotLeader { leader: self.known_leader() })
    }

    /// Serves the native protocol and, while leading, runs the failure detector and pushes
    /// configurations, until shutdown.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, shutdown: watch::Receiver<bool>) {
        tokio::spawn(detector::detect_failures(Arc::downgrade(&self), shutdown.clone()));
        tokio::spawn(push_configs(Arc::downgrade(&self), self.published.subscribe(), shutdown.clone()));
        tokio::spawn(lead(Arc::downgrade(&self), shutdown.clone()));
        tokio::spawn(watch_removal(Arc::downgrade(&self), shutdown.clone()));
        server::serve(listener, self.clone(), shutdown).await;
        if let Err(e) = self.raft.shutdown().await {
            warn!(error = %e, "stopping the manager's raft");
        }
    }

    /// The cut links currently believed in.
    fn link_cuts(&self) -> command::Cuts {
        self.cuts.lock().keys().copied().collect()
    }

    /// `node` reports its chain link to `peer` cut. Acted on only while both answer the
    /// manager's heartbeats and `peer` answers a ping from the manager now: a stopped or dead
    /// successor also stalls a link and fails the reporter's probe, and failing it (the
    /// failure detector's job) is the right repair. Without the ping, a node killed less than
    /// half the failure threshold ago still looked alive, and the manager removed the healthy
    /// reporter from a chain whose only other member was the dead node (found by the
    /// link-cut fault test, a third node killed during a cut).
    async fn link_cut(&self, node: NodeId, peer: NodeId) -> Response {
        if !self.is_leader() {
            return self.not_leader();
        }
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
        self.propose(Command::CutLink { node, peer, cuts: self.link_cuts() }).await
    }

    /// Forgets cuts no longer reported and lets re-replication use those links again.
    async fn expire_cuts(&self) {
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
        let _ = self.propose(Command::Settle { cuts: self.link_cuts() }).await;
    }

    /// Commits `command` through the group and answers with its outcome. Only the leader
    /// proposes; a command its current configuration shows to change nothing (a report
    /// re-sent while the change it asks for is committed) is answered without a log entry.
    async fn propose(&self, command: Command) -> Response {
        if !self.is_leader() {
            return self.not_leader();
        }
        if !matches!(command, Command::Init(_)) {
            let Some(current) = self.first_config().await else {
                return Response::Error(WireError::Unavailable(
                    "the manager group has no configuration yet".into(),
                ));
            };
            match command::transition(&current, &command) {
                Ok(None) => return Response::Config(current),
                Err(e) => return Response::Error(WireError::Invalid(e)),
                Ok(Some(_)) => {}
            }
        }
        match self.raft.client_write(command).await {
            Ok(written) => match written.data {
                Applied::Config(c) => {
                    info!(
                        epoch = c.epoch,
                        backends = c.backends.len(),
                        frontends = c.frontends.len(),
                        formed = c.formed,
                        log_index = written.log_id.index,
                        "configuration changed"
                    );
                    Response::Config(c)
                }
                Applied::Refused(e) => Response::Error(WireError::Invalid(e)),
                Applied::NotReady | Applied::Group => Response::Error(WireError::Unavailable(
                    "the manager group has no configuration yet".into(),
                )),
            },
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Response::Error(WireError::NotLeader { leader: f.leader_node.map(|n| n.addr) })
            }
            Err(e) => Response::Error(WireError::Unavailable(format!("manager group: {e}"))),
        }
    }

    /// A lease: the configuration, answered only by a leader that a majority still follows
    /// (checked now), with the term it leads in. A back-end's or front-end's lease is renewed
    /// only by such an answer, so a deposed leader cut off from the group cannot keep them
    /// serving a configuration the group has replaced.
    async fn lease(&self) -> Result<client::Lease, Response> {
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        let read = match self.raft.ensure_linearizable().await {
            Ok(read) => read,
            Err(_) => return Err(self.not_leader()),
        };
        // The read position is at least this leader's first entry of its term, so its term is
        // the one the majority confirmed.
        let term = read.map_or_else(|| self.raft.metrics().borrow().current_term, |l| l.leader_id.term);
        match self.first_config().await {
            Some(config) => Ok(client::Lease { term, config }),
            None => Err(Response::Error(WireError::Unavailable(
                "the manager group has no configuration yet".into(),
            ))),
        }
    }

    /// The configuration as `lease` confirms it (`GetConfig`).
    async fn linearizable_config(&self) -> Response {
        self.lease().await.map_or_else(|e| e, |l| Response::Config(l.config))
    }

    /// The answer to a renewal (`Renew`, `Heartbeats`).
    async fn lease_answer(&self) -> Response {
        self.lease().await.map_or_else(|e| e, |l| Response::Lease { term: l.term, config: l.config })
    }

    /// A request of [`forwarded`] that reached a replica that does not lead: passed on to the
    /// leader it knows, which answers it as if asked directly (and never passes it on again).
    /// A process cut off from the leader but not from a follower (a partial partition) thus
    /// keeps renewing its lease and reporting through the follower. A lease stays as safe as
    /// when asked directly: the leader confirms a majority follows it after the request was
    /// sent, from which the lease runs. The caller's identity was checked at this replica's
    /// listener (`crate::auth`); the leader trusts that check, as it trusts its peers.
    async fn forward(&self, request: Request) -> Response {
        match raft::leader(&self.raft) {
            Some((id, addr)) if id != self.options.id => {
                raft::network::forward(&self.pool, &addr, request, FORWARD_TIMEOUT)
                    .await
                    .unwrap_or_else(|| self.not_leader())
            }
            _ => self.not_leader(),
        }
    }

    /// The applied configuration, waiting a little for the group's first (a new leader of a
    /// new group proposes it at once).
    async fn first_config(&self) -> Option<ClusterConfig> {
        let mut published = self.published.subscribe();
        let first = async { published.wait_for(|c| c.is_some()).await.ok().and_then(|c| c.clone()) };
        tokio::time::timeout(FIRST_CONFIG_WAIT, first).await.ok().flatten()
    }

    /// Adds (as a learner first, then a voter) or removes a manager of the group.
    async fn change_managers(&self, id: raft::ManagerId, addr: String, add: bool) -> Response {
        if !self.is_leader() {
            return self.not_leader();
        }
        let voters: BTreeSet<raft::ManagerId> =
            self.raft.metrics().borrow().membership_config.membership().voter_ids().collect();
        let next: BTreeSet<raft::ManagerId> = if add {
            if let Err(e) = self.raft.add_learner(id, BasicNode::new(addr), true).await {
                return Response::Error(WireError::Unavailable(format!("adding manager {id}: {e}")));
            }
            voters.into_iter().chain([id]).collect()
        } else {
            voters.into_iter().filter(|v| *v != id).collect()
        };
        match self.raft.change_membership(next, false).await {
            Ok(_) => {
                info!(id, add, "manager group membership changed");
                Response::Ok
            }
            Err(e) => Response::Error(WireError::Unavailable(format!("changing the manager group: {e}"))),
        }
    }

    /// This replica's view of the group, as status counters.
    fn group_counters(&self) -> Vec<(String, u64)> {
        let m = self.raft.metrics().borrow().clone();
        let state = match m.state {
            ServerState::Leader => 3,
            ServerState::Candidate => 2,
            ServerState::Follower => 1,
            ServerState::Learner | ServerState::Shutdown => 0,
        };
        vec![
            ("raft_id".to_string(), m.id),
            ("raft_state".to_string(), state),
            ("raft_term".to_string(), m.current_term),
            ("raft_leader".to_string(), m.current_leader.unwrap_or(0)),
            ("raft_last_log_index".to_string(), m.last_log_index.unwrap_or(0)),
            ("raft_applied_index".to_string(), m.last_applied.map_or(0, |l| l.index)),
            ("raft_voters".to_string(), m.membership_config.membership().voter_ids().count() as u64),
            ("raft_removed".to_string(), u64::from(self.removed.load(Ordering::Relaxed))),
        ]
    }
}

/// Meaning of the `raft_state` status counter.
pub const RAFT_STATES: [&str; 4] = ["learner", "follower", "candidate", "leader"];

impl crate::metrics::Exposition for Manager {
    fn metrics(&self) -> String {
        let c = self.config();
        let mut out = String::new();
        crate::metrics::line(&mut out, "fawn_manager_epoch", "", c.epoch);
        crate::metrics::line(&mut out, "fawn_manager_backends", "", c.backends.len() as u64);
        crate::metrics::line(&mut out, "fawn_manager_frontends", "", c.frontends.len() as u64);
        let lent = (0..c.frontends_expected).filter(|w| c.wedge_server(*w) != *w).count();
        crate::metrics::line(&mut out, "fawn_manager_wedges_lent", "", lent as u64);
        for (name, value) in self.group_counters() {
            crate::metrics::line(&mut out, &format!("fawn_manager_{name}"), "", value);
        }
        out
    }
}

impl Handler for Manager {
    async fn request(self: Arc<Self>, request: Request) -> Response {
        match request {
            Request::Raft(body) => {
                let answer = |forwarded_request: Request| {
                    let manager = self.clone();
                    async move {
                        if forwarded(&forwarded_request) {
                            manager.answer(forwarded_request).await
                        } else {
                            Response::Error(WireError::Invalid("not a request a manager passes on".into()))
                        }
                    }
                };
                raft::network::serve(&self.raft, &body, answer).await
            }
            request if forwarded(&request) && !self.is_leader() => self.forward(request).await,
            request => self.answer(request).await,
        }
    }
}

impl Manager {
    /// Answers `request` as this replica: a leader acts on it; a request that only the leader
    /// may answer is otherwise refused with the leader's name (`WireError::NotLeader`).
    async fn answer(self: Arc<Self>, request: Request) -> Response {
        match request {
            Request::GetConfig => self.linearizable_config().await,
            Request::RegisterBackend { node, addr, logs_complete } => {
                if !logs_complete {
                    info!(node, "back-end registers after its host restarted: its logs may lack updates it acknowledged");
                }
                let expected = self.options.expected_backends;
                let cuts = self.link_cuts();
                self.propose(Command::RegisterBackend { expected, node, addr, logs_complete, cuts }).await
            }
            Request::RegisterFrontend { id, native_addr, memcache_addr } => {
                let _serial = self.frontend_changes.lock().await;
                // Its silence counts from now, not from before it was last declared dead.
                self.frontend_reports.lock().insert(id, Instant::now());
                self.propose(Command::RegisterFrontend { id, native_addr, memcache_addr }).await
            }
            Request::FrontendRefused { frontend } => self.frontend_refused(frontend).await,
            Request::SyncDone { node, range } => {
                self.propose(Command::SyncDone { node, range, cuts: self.link_cuts() }).await
            }
            Request::Leave { node } => self.propose(Command::Leave { node, cuts: self.link_cuts() }).await,
            Request::LinkCut { node, peer } => self.link_cut(node, peer).await,
            Request::TailReady { node, range } => {
                self.propose(Command::TailReady { node, range, cuts: self.link_cuts() }).await
            }
            Request::SplitReady { node, range } => {
                self.propose(Command::SplitReady { node, range, cuts: self.link_cuts() }).await
            }
            Request::MergeReady { node, range } => {
                self.propose(Command::MergeReady { node, range, cuts: self.link_cuts() }).await
            }
            Request::SetFlush { at_micros } => self.propose(Command::SetFlush { at_micros }).await,
            Request::DiskFault { node, reason } => {
                warn!(node, reason, "a back-end cannot write its datastore: taking it out of its chains");
                self.propose(Command::DegradeNode { node, reason, cuts: self.link_cuts() }).await
            }
            Request::Status => {
                let mut counters = self.group_counters();
                counters.push(("cut_links".to_string(), self.cuts.lock().len() as u64));
                counters
                    .push(("frontends_reporting_heartbeats".to_string(), self.frontends_reporting() as u64));
                Response::Status(NodeStatus {
                    role: "manager".into(),
                    epoch: self.config().epoch,
                    uptime_secs: self.started.elapsed().as_secs(),
                    counters,
                })
            }
            Request::Heartbeats { frontend, silent_ms } => {
                if !self.is_leader() {
                    return self.not_leader();
                }
                self.heartbeats(frontend, silent_ms);
                // Answered like `Renew`, by a leader a majority still follows: the answer
                // renews the front-end's lease (`frontend::ownership`) and tells it which
                // wedges it serves.
                self.lease_answer().await
            }
            Request::Renew => self.lease_answer().await,
            Request::ChangeManagers { id, addr, add } => self.change_managers(id, addr, add).await,
            Request::Ping => Response::Pong,
            other => Response::Error(WireError::Invalid(format!("the manager does not serve {other:?}"))),
        }
    }
}

/// Leadership duties: when this replica becomes leader it starts the failure detector's and
/// the link-cut bookkeeping afresh (its own observations only), and a group without a
/// configuration gets its first one (the saved file of a manager from before the group, or
/// a fresh one).
async fn lead(manager: std::sync::Weak<Manager>, mut shutdown: watch::Receiver<bool>) {
    let Some(m) = manager.upgrade() else { return };
    let mut metrics = m.raft.metrics();
    drop(m);
    let mut leading = false;
    loop {
        let Some(m) = manager.upgrade() else { return };
        let now_leading = m.is_leader();
        if now_leading && !leading {
            let term = m.raft.metrics().borrow().current_term;
            info!(id = m.options.id, term, "this manager leads the group");
            m.cuts.lock().clear();
            m.heartbeat_ok.lock().clear();
            m.restart_frontend_clocks();
        }
        leading = now_leading;
        if leading && m.published.current().is_none() {
            let first = match ConfigFile::new(&m.options.data_dir).load() {
                Ok(Some(saved)) => saved,
                Ok(None) => {
                    state::initial(m.options.replicas, m.options.vnodes, m.options.expected_frontends)
                }
                Err(e) => {
                    warn!(error = %e, "cannot read the saved configuration; starting a fresh one");
                    state::initial(m.options.replicas, m.options.vnodes, m.options.expected_frontends)
                }
            };
            // The cluster's id is drawn once, here, and then lives in the replicated log.
            let mut first = first;
            if first.cluster_id == 0 {
                first.cluster_id = rand::random::<u64>().max(1);
            }
            if let Response::Error(e) = m.propose(Command::Init(first)).await {
                warn!(error = %e, "proposing the group's first configuration");
            }
        }
        drop(m);
        tokio::select! {
            r = metrics.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// How often a replica that knows no leader asks the other members whether it was removed.
const REMOVAL_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// A replica removed from the group stops standing for election: without a leader it would
/// otherwise start one election after another for as long as it runs (openraft's leader
/// stops replicating to a removed member, so its log never shows the removal; see
/// `raft::removed`). One added back hears from the leader again and stands again.
async fn watch_removal(manager: std::sync::Weak<Manager>, mut shutdown: watch::Receiver<bool>) {
    let pool = fawn_client::pool::Pool::new(LINK_CUT_CONFIRM_TIMEOUT);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(REMOVAL_CHECK_INTERVAL) => {}
            _ = shutdown.changed() => return,
        }
        let Some(m) = manager.upgrade() else { return };
        // Once removed, only a leader's word (replication reaching it again) undoes it: a
        // member that does not answer now proves nothing.
        let was = m.removed.load(Ordering::Relaxed);
        let leaderless = m.raft.metrics().borrow().current_leader.is_none();
        let removed = leaderless && (was || raft::removed(&m.raft, &pool).await);
        if was != removed {
            m.removed.store(removed, Ordering::Relaxed);
            m.raft.runtime_config().elect(!removed);
            if removed {
                warn!(id = m.options.id, "removed from the manager group: no longer standing for election");
            } else {
                info!(id = m.options.id, "a member of the manager group again: standing for election");
            }
        }
    }
}

/// Pushes each new configuration to every back-end and front-end, so a repair takes effect in
/// one round trip instead of at their next poll (they poll too, in case a push is lost).
/// Only the leader pushes.
async fn push_configs(
    manager: std::sync::Weak<Manager>,
    mut published: watch::Receiver<Option<ClusterConfig>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let pool = Arc::new(fawn_client::pool::Pool::new(Duration::from_millis(300)));
    loop {
        tokio::select! {
            r = published.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
        let Some(config) = published.borrow_and_update().clone() else { continue };
        if !manager.upgrade().is_some_and(|m| m.is_leader()) {
            continue;
        }
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
