//! Front-end failure detection (paper §3.4.4): every `heartbeat` the front-end pings each
//! back-end of its configuration and tells the manager, per back-end, how long it has been
//! since that back-end last answered. The manager decides (see `manager::Manager::heartbeats`):
//! one front-end's silence alone does not remove a back-end that others, or the manager,
//! still reach.
//!
//! The report is also this front-end's own heartbeat to the manager group: the leader answers
//! it with the configuration after confirming a majority still follows it, which renews the
//! front-end's lease (`ownership`). A front-end that finds its wedge lent to another (it was
//! declared dead while slow or cut off) registers again to take it back.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use fawn_client::pool::Pool;
use fawn_proto::native::{Request, Response};
use fawn_ring::NodeId;
use tracing::{info, warn};

use super::{register_once, Frontend};
use crate::manager::client::{self as manager_client, Held, Lease};
use crate::view::{ping_all, watched_backends};

/// The shortest wait for the answer to a report: the leader answers after a round of Raft
/// heartbeats, and a report that times out does not renew the lease.
const REPORT_TIMEOUT_MIN: Duration = Duration::from_millis(500);

/// Runs until the front-end is dropped.
pub(super) async fn heartbeat_backends(frontend: Weak<Frontend>, interval: Duration) {
    // Own connections: a ping must not queue behind large values on the data path's.
    let pool = Arc::new(Pool::new(interval));
    let mut last_answer: HashMap<NodeId, Instant> = HashMap::new();
    let mut manager_unreachable = false;
    loop {
        tokio::time::sleep(interval).await;
        let Some(f) = frontend.upgrade() else { return };
        let (config, manager, id) = (f.config(), f.options.manager.clone(), f.options.id);
        let held = Held { term: f.ownership.term(), epoch: config.epoch };
        drop(f);
        if !config.formed {
            continue;
        }
        let watched = watched_backends(&config);
        let answered: Vec<NodeId> = ping_all(&pool, &watched, interval)
            .await
            .into_iter()
            .filter_map(|(node, answered)| answered.then_some(node))
            .collect();
        let silent_ms = silences(&mut last_answer, &watched, &answered);
        let report = Request::Heartbeats { frontend: id, silent_ms };
        let sent = Instant::now();
        match manager_client::renew(&pool, &manager, report, interval.max(REPORT_TIMEOUT_MIN)).await {
            Ok(lease) => {
                manager_unreachable = false;
                let Some(f) = frontend.upgrade() else { return };
                f.report_answered(sent, held, lease).await;
            }
            other => {
                // Logged once per outage: the manager's own detector takes over meanwhile.
                if !std::mem::replace(&mut manager_unreachable, true) {
                    warn!(result = ?other, "cannot report heartbeats to the manager");
                }
            }
        }
    }
}

impl Frontend {
    /// The leader answered a report sent at `sent`, while this front-end held `held`, with
    /// `lease`. A lease older in term or epoch than what was held is ignored
    /// (`manager::client::accept_lease`).
    async fn report_answered(&self, sent: Instant, held: Held, lease: Lease) {
        if !manager_client::accept_lease(held, &lease) {
            self.counters.stale_leases.fetch_add(1, Ordering::Relaxed);
            warn!(?held, term = lease.term, epoch = lease.config.epoch, "ignoring an older lease");
            return;
        }
        self.install(lease.config);
        self.ownership.renew(sent, lease.term, &self.cache);
        let view = self.current();
        if !view.config.formed || self.ownership.serves(&view.config, self.options.id) {
            return;
        }
        info!(
            epoch = view.config.epoch,
            "this front-end's wedge was lent while it was declared dead; taking it back"
        );
        match register_once(&self.pool, &self.options).await {
            Ok(Response::Config(c)) => self.install(c),
            other => warn!(result = ?other, "cannot register again to take the wedge back"),
        }
    }
}

/// Updates `last_answer` with this round and returns, per watched back-end, the milliseconds
/// since it last answered. Time-based, not a miss count, so a probe that hangs until its
/// time-out does not stretch the threshold; a back-end seen for the first time starts at 0.
fn silences(
    last_answer: &mut HashMap<NodeId, Instant>,
    watched: &[(NodeId, String)],
    answered: &[NodeId],
) -> Vec<(NodeId, u64)> {
    let now = Instant::now();
    last_answer.retain(|node, _| watched.iter().any(|(n, _)| n == node));
    for node in answered {
        last_answer.insert(*node, now);
    }
    watched
        .iter()
        .map(|(node, _)| {
            let since = *last_answer.entry(*node).or_insert(now);
            (*node, now.duration_since(since).as_millis() as u64)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_counts_from_the_last_answer_and_forgets_removed_backends() {
        let mut last = HashMap::new();
        let watched = vec![(1, "a".to_string()), (2, "b".to_string())];
        let first = silences(&mut last, &watched, &[1]);
        assert_eq!(first, vec![(1, 0), (2, 0)]);
        let long_ago = Instant::now() - Duration::from_secs(3);
        last.insert(2, long_ago);
        let second = silences(&mut last, &watched, &[1]);
        assert_eq!(second[0], (1, 0));
        assert!(second[1].1 >= 3000, "{second:?}");
        let third = silences(&mut last, &watched[..1], &[]);
        assert_eq!(third.len(), 1);
        assert!(!last.contains_key(&2));
    }
}
