//! Failure detection (paper §3.4.4). The front-ends heartbeat every back-end each t_hb and
//! report each round (`Request::Heartbeats`); the manager declares a back-end failed when
//! a report shows it silent for `heartbeat × fd_threshold`, nobody (another front-end, the
//! manager) heard from it within that time, and it does not answer the manager's own ping.
//! The confirmation keeps one front-end cut off from a healthy back-end from having it
//! removed from every chain. While no front-end reports (all of them down, or a cluster run
//! without any), the manager heartbeats the back-ends itself, so failures are still found.
//!
//! The reports are also the front-ends' own heartbeats: a front-end that has not reported for
//! [`super::FRONTEND_SILENCE_MIN`] (or `heartbeat × fd_threshold`, if longer) is declared dead and
//! its wedges move to live front-ends (`state::fail_frontend`). The limit is longer than the
//! front-end's own lease ([`super::FRONTEND_LEASE`]), so a front-end cut off from the group stops
//! using its cache and sending updates before anyone else takes its wedge.
//!
//! A front-end whose addresses refuse the manager's own connections is declared dead at once
//! (`Request::FrontendRefused`, sent by whoever was refused): a refusal is the peer host's
//! kernel saying no socket listens there, so no process is left to act on the old lease. A
//! silence (a stopped process, a cut link, a dead host) proves nothing and waits for the limit.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use fawn_proto::native::Response;
use fawn_ring::NodeId;
use tokio::sync::watch;
use tracing::{info, warn};

use super::command::Command;
use super::Manager;
use crate::view::{answers_ping, ping_all, watched_backends};

/// How often the manager repeats that a front-end cannot reach a back-end it can reach itself.
const ONE_SIDED_LOG_EVERY: Duration = Duration::from_secs(10);
/// How long the manager's own connection to a front-end reported refusing may take: one that
/// neither connects nor is refused by then proves nothing.
const REFUSAL_CHECK_TIMEOUT: Duration = Duration::from_millis(500);

/// Whether nothing listens at `addr`: a connection attempt refused (a TCP reset from the
/// host), not one that connects, times out, or fails for another reason (no route, a host
/// that is down). A process that is alive, even stopped or cut off, keeps its listening
/// socket, so its connections queue or time out but are never refused.
pub(crate) async fn refuses(addr: &str, timeout: Duration) -> bool {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        Ok(Ok(_)) | Err(_) => false,
    }
}

impl Manager {
    /// Silence after which a back-end is declared failed.
    fn failure_limit(&self) -> Duration {
        self.options.heartbeat * self.options.fd_threshold.max(1)
    }

    /// Records that `node` answered a heartbeat at `at` (keeps the latest).
    fn heard(&self, node: NodeId, at: Instant) {
        let mut seen = self.heartbeat_ok.lock();
        let t = seen.entry(node).or_insert(at);
        *t = (*t).max(at);
    }

    /// Whether `node` was heard within the failure limit.
    fn heard_recently(&self, node: NodeId) -> bool {
        self.heartbeat_ok.lock().get(&node).is_some_and(|t| t.elapsed() < self.failure_limit())
    }

    /// Silence after which a front-end is declared dead.
    fn frontend_limit(&self) -> Duration {
        self.failure_limit().max(super::FRONTEND_SILENCE_MIN)
    }

    /// A new leader starts every front-end's silence now: it cannot know when a front-end last
    /// reported to the leader before it, but no report answered by that one was sent after
    /// this leader was elected.
    pub(super) fn restart_frontend_clocks(&self) {
        let now = Instant::now();
        let mut reports = self.frontend_reports.lock();
        reports.clear();
        for f in &self.config().frontends {
            reports.insert(f.id, now);
        }
    }

    /// Declares dead every front-end that serves wedges and has been silent past the limit,
    /// if another front-end is live to take them.
    async fn fail_silent_frontends(&self) {
        let config = self.config();
        let limit = self.frontend_limit();
        let silent: Vec<(u32, Duration)> = {
            let now = Instant::now();
            let mut reports = self.frontend_reports.lock();
            config
                .frontends
                .iter()
                .map(|f| (f.id, now.duration_since(*reports.entry(f.id).or_insert(now))))
                .filter(|(_, quiet)| *quiet >= limit)
                .collect()
        };
        for (id, quiet) in silent {
            if !matches!(super::state::fail_frontend(&config, id), Ok(Some(_))) {
                continue;
            }
            warn!(
                frontend = id,
                silent_ms = quiet.as_millis() as u64,
                "front-end stopped reporting heartbeats; lending its wedges to live front-ends"
            );
            let _ = self.propose(Command::FailFrontend { id }).await;
        }
    }

    /// Someone was refused a connection to front-end `id`. Checked here, by the leader's own
    /// connection attempts: if both of its addresses refuse, no process serves them and its
    /// wedges are lent now. A process started there since (a restart on the same ports)
    /// listens before it registers, so it either answers the check or registers after it
    /// began; the registration is then seen here (both hold `frontend_changes`) or commits
    /// after the lending and takes the wedge back.
    pub(super) async fn frontend_refused(&self, id: u32) -> Response {
        if !self.is_leader() {
            return self.not_leader();
        }
        let config = self.config();
        let Some(info) = config.frontends.iter().find(|f| f.id == id).cloned() else {
            return Response::Config(config);
        };
        if !config.formed || !matches!(super::state::fail_frontend(&config, id), Ok(Some(_))) {
            return Response::Config(config);
        }
        let asked = Instant::now();
        let gone = refuses(&info.native_addr, REFUSAL_CHECK_TIMEOUT).await
            && refuses(&info.memcache_addr, REFUSAL_CHECK_TIMEOUT).await;
        if !gone {
            return Response::Config(self.config());
        }
        let _serial = self.frontend_changes.lock().await;
        if self.frontend_reports.lock().get(&id).is_some_and(|t| *t >= asked) {
            return Response::Config(self.config());
        }
        warn!(
            frontend = id,
            addr = %info.native_addr,
            "front-end refuses connections (no process listens); lending its wedges to live front-ends"
        );
        self.propose(Command::FailFrontend { id }).await
    }

    /// Front-ends that reported a heartbeat round within the failure limit.
    pub(super) fn frontends_reporting(&self) -> usize {
        let limit = self.failure_limit();
        self.frontend_reports.lock().values().filter(|t| t.elapsed() < limit).count()
    }

    /// A front-end's heartbeat round: records who answered it and checks, in the background,
    /// every back-end it reports silent past the limit.
    pub(super) fn heartbeats(self: &Arc<Self>, frontend: u32, silent_ms: Vec<(NodeId, u64)>) {
        let now = Instant::now();
        self.frontend_reports.lock().insert(frontend, now);
        let limit = self.failure_limit();
        for (node, ms) in silent_ms {
            let silent = Duration::from_millis(ms);
            if let Some(at) = now.checked_sub(silent) {
                self.heard(node, at);
            }
            if silent >= limit {
                tokio::spawn(self.clone().suspect(node, frontend, silent));
            }
        }
    }

    /// `frontend` has not heard from `node` for `silent`: declare it failed unless someone
    /// heard it since the limit began or it answers the manager now.
    async fn suspect(self: Arc<Self>, node: NodeId, frontend: u32, silent: Duration) {
        let Some(addr) = self.watched_addr(node) else { return };
        if self.heard_recently(node) || !self.confirming.lock().insert(node) {
            return;
        }
        if !answers_ping(&self.pool, &addr, self.options.heartbeat).await {
            self.declare_failed(node, silent).await;
        } else {
            self.heard(node, Instant::now());
            if self.first_report_in_a_while(frontend, node) {
                warn!(
                    node,
                    frontend,
                    silent_ms = silent.as_millis() as u64,
                    "front-end cannot reach the back-end but the manager can: not declaring it failed"
                );
            }
        }
        self.confirming.lock().remove(&node);
    }

    /// Whether to log that `frontend` cannot reach `node`: once per `ONE_SIDED_LOG_EVERY`
    /// per pair, not at every heartbeat while the link stays down.
    fn first_report_in_a_while(&self, frontend: u32, node: NodeId) -> bool {
        let mut logged = self.one_sided_logged.lock();
        let now = Instant::now();
        match logged.get(&(frontend, node)) {
            Some(t) if now.duration_since(*t) < ONE_SIDED_LOG_EVERY => false,
            _ => {
                logged.insert((frontend, node), now);
                true
            }
        }
    }

    /// The address of `node` if it is one the detector watches (alive or leaving).
    fn watched_addr(&self, node: NodeId) -> Option<String> {
        let watched = watched_backends(&self.config());
        watched.into_iter().find_map(|(n, addr)| (n == node).then_some(addr))
    }

    async fn declare_failed(&self, node: NodeId, silent: Duration) {
        warn!(
            node,
            silent_ms = silent.as_millis() as u64,
            threshold = self.options.fd_threshold,
            "back-end missed its heartbeats; declaring it failed"
        );
        self.heartbeat_ok.lock().remove(&node);
        let _ = self.propose(Command::FailNode { node, cuts: self.link_cuts() }).await;
    }
}

/// Every `heartbeat`: expires old link cuts and, while no front-end reports heartbeats,
/// heartbeats every alive back-end itself.
pub(super) async fn detect_failures(manager: Weak<Manager>, mut shutdown: watch::Receiver<bool>) {
    let pool = Arc::new(fawn_client::pool::Pool::new(Duration::from_millis(500)));
    let mut probing = false;
    loop {
        let Some(m) = manager.upgrade() else { return };
        let heartbeat = m.options.heartbeat;
        drop(m);
        tokio::select! {
            _ = tokio::time::sleep(heartbeat) => {}
            _ = shutdown.changed() => return,
        }
        let Some(m) = manager.upgrade() else { return };
        // Only the leader detects failures: its proposals are the only ones that commit.
        if !m.is_leader() {
            probing = false;
            // A later term of this replica as leader starts the front-ends' silences afresh.
            m.frontend_reports.lock().clear();
            continue;
        }
        m.expire_cuts().await;
        let config = m.config();
        if config.formed {
            m.fail_silent_frontends().await;
        }
        let own = config.formed && m.frontends_reporting() == 0;
        if own != probing {
            probing = own;
            info!(
                manager_probes = own,
                "failure detection: {}",
                if own {
                    "no front-end reports heartbeats; the manager heartbeats the back-ends"
                } else {
                    "front-ends report heartbeats"
                }
            );
        }
        drop(m);
        if own {
            probe_round(&manager, &pool, &config, heartbeat).await;
        }
    }
}

/// One round of the manager's own heartbeats.
async fn probe_round(
    manager: &Weak<Manager>,
    pool: &Arc<fawn_client::pool::Pool>,
    config: &fawn_proto::native::ClusterConfig,
    heartbeat: Duration,
) {
    for (node, alive) in ping_all(pool, &watched_backends(config), heartbeat).await {
        let Some(m) = manager.upgrade() else { return };
        let now = Instant::now();
        if alive {
            m.heard(node, now);
            continue;
        }
        // Time-based, so a probe that hangs until its time-out does not stretch the
        // threshold; a back-end first seen silent starts its count now.
        let since = *m.heartbeat_ok.lock().entry(node).or_insert(now);
        if now.duration_since(since) >= m.failure_limit() {
            m.declare_failed(node, now.duration_since(since)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_a_port_nobody_listens_on_refuses() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        assert!(!refuses(&addr, Duration::from_secs(5)).await, "a listening port accepts");
        drop(listener);
        assert!(refuses(&addr, Duration::from_secs(5)).await, "a closed port refuses");
        assert!(!refuses("not an address", Duration::from_secs(5)).await, "other failures prove nothing");
    }
}
