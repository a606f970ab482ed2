//! Talking to the manager group from any process: given the managers' addresses (a
//! comma-separated list), find the leader and follow it across elections. A manager that does
//! not lead answers `WireError::NotLeader` naming the leader it knows; an unreachable or
//! frozen one is skipped after a short time-out. Every caller of the manager goes through
//! `call`, so the rule lives here once.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use fawn_client::pool::Pool;
use fawn_client::rpc::RpcError;
use fawn_proto::native::{ClusterConfig, Epoch, Request, Response, WireError};
use parking_lot::Mutex;

/// How long one manager gets to answer before the next is tried: a frozen leader must not
/// hold a caller past the back-ends' lease (`backend::MANAGER_LEASE`).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(400);
/// Pause before asking again while the group has no leader (an election is on).
pub const NO_LEADER_PAUSE: Duration = Duration::from_millis(50);
/// A manager that did not answer is not followed again on another manager's word for this
/// long: the others name a frozen leader until their election time-out passes, and going
/// back to it would cost a full attempt each time.
pub const SUSPECT_FOR: Duration = Duration::from_millis(1000);

/// The managers of one group as one caller sees them.
pub struct Managers {
    addrs: Mutex<Vec<String>>,
    /// Index into `addrs` of the manager believed to lead.
    leader: Mutex<usize>,
    /// When each manager last failed to answer.
    silent: Mutex<HashMap<String, Instant>>,
}

/// The managers' addresses of a comma-separated list.
pub fn parse_list(list: &str) -> Vec<String> {
    list.split(',').map(str::trim).filter(|a| !a.is_empty()).map(str::to_string).collect()
}

impl Managers {
    pub fn new(addrs: Vec<String>) -> Managers {
        Managers { addrs: Mutex::new(addrs), leader: Mutex::new(0), silent: Mutex::new(HashMap::new()) }
    }

    /// The manager believed to lead.
    pub fn leader(&self) -> Option<String> {
        self.addrs.lock().get(*self.leader.lock()).cloned()
    }

    fn follow(&self, addr: &str) {
        let mut addrs = self.addrs.lock();
        let i = match addrs.iter().position(|a| a == addr) {
            Some(i) => i,
            None => {
                addrs.push(addr.to_string());
                addrs.len() - 1
            }
        };
        *self.leader.lock() = i;
    }

    fn suspect(&self, addr: &str) -> bool {
        self.silent.lock().get(addr).is_some_and(|t| t.elapsed() < SUSPECT_FOR)
    }

    /// Moves on to the manager after `after`, skipping recently silent ones unless all are.
    fn next(&self, after: &str) {
        let addrs = self.addrs.lock();
        let n = addrs.len().max(1);
        let from = addrs.iter().position(|a| a == after).unwrap_or(n - 1);
        let order = (1..=n).map(|k| (from + k) % n);
        let pick = order.clone().find(|i| addrs.get(*i).is_some_and(|a| !self.suspect(a)));
        *self.leader.lock() = pick.or_else(|| order.clone().next()).unwrap_or(0);
    }

    /// Sends `request` to the group's leader over `pool`, following redirects and skipping
    /// managers that do not answer, until one answers or `timeout` passes.
    pub async fn call(&self, pool: &Pool, request: Request, timeout: Duration) -> Result<Response, RpcError> {
        let deadline = Instant::now() + timeout;
        let mut last = RpcError::Timeout(timeout);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(last);
            }
            let Some(addr) = self.leader() else {
                return Err(RpcError::Connect { addr: String::new(), reason: "no manager address".into() });
            };
            match pool.call(&addr, request.clone(), left.min(ATTEMPT_TIMEOUT)).await {
                Ok(Response::Error(WireError::NotLeader { leader: Some(l) }))
                    if l != addr && !self.suspect(&l) =>
                {
                    self.follow(&l)
                }
                Ok(Response::Error(WireError::NotLeader { .. })) => {
                    last = RpcError::Protocol(format!("manager {addr} knows no leader"));
                    self.next(&addr);
                    tokio::time::sleep(NO_LEADER_PAUSE.min(left)).await;
                }
                Ok(answer) => {
                    self.silent.lock().remove(&addr);
                    return Ok(answer);
                }
                Err(e) => {
                    last = e;
                    self.silent.lock().insert(addr.clone(), Instant::now());
                    self.next(&addr);
                    if self.addrs.lock().len() <= 1 {
                        tokio::time::sleep(NO_LEADER_PAUSE.min(left)).await;
                    }
                }
            }
        }
    }
}

/// The shared `Managers` of a comma-separated address list: every caller in this process
/// naming the same list follows the leader together. (Only the leader hint is shared: the
/// connections are the caller's, bound to its runtime.)
pub fn managers(list: &str) -> Arc<Managers> {
    static ALL: OnceLock<Mutex<HashMap<String, Arc<Managers>>>> = OnceLock::new();
    let all = ALL.get_or_init(|| Mutex::new(HashMap::new()));
    all.lock().entry(list.to_string()).or_insert_with(|| Arc::new(Managers::new(parse_list(list)))).clone()
}

/// Sends `request` over `pool` to the leader of the manager group `list` (see
/// `Managers::call`).
pub async fn call(
    pool: &Pool,
    list: &str,
    request: Request,
    timeout: Duration,
) -> Result<Response, RpcError> {
    managers(list).call(pool, request, timeout).await
}

/// A lease as the manager group granted it (`Response::Lease`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The group's Raft term in which the leader confirmed that a majority still followed it.
    pub term: u64,
    /// The group's configuration at that moment.
    pub config: ClusterConfig,
}

/// What a process held when it asked for a lease: the newest term it had been granted a
/// lease in, and the epoch of its configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub term: u64,
    pub epoch: Epoch,
}

/// Whether a process that held `held` when it asked may take `lease`. A lease of an older
/// term or carrying an older configuration than the process already had is ignored: it
/// comes from a leader the group has since replaced (a delayed answer, or a replica that
/// kept a stale view), and renewing from it would let that leader's word outlast its
/// successor's. Compared with what was held when the request was sent, not when the answer
/// came: a renewal overtaken by another answer is still as good as when it was granted (it
/// was confirmed after it was sent), and its configuration is then merely not installed.
pub fn accept_lease(held: Held, lease: &Lease) -> bool {
    lease.term >= held.term && lease.config.epoch >= held.epoch
}

/// Sends `request` (`Renew`, or a front-end's `Heartbeats`) to the group's leader and returns
/// the lease it grants. The lease runs from before this call was made.
pub async fn renew(pool: &Pool, list: &str, request: Request, timeout: Duration) -> Result<Lease, String> {
    match call(pool, list, request, timeout).await {
        Ok(Response::Lease { term, config }) => Ok(Lease { term, config }),
        Ok(other) => Err(format!("unexpected answer {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(term: u64, epoch: Epoch) -> Lease {
        Lease { term, config: ClusterConfig { epoch, ..ClusterConfig::default() } }
    }

    #[test]
    fn a_lease_older_in_term_or_epoch_than_held_is_ignored() {
        let held = Held { term: 4, epoch: 10 };
        assert!(accept_lease(held, &lease(4, 10)), "the same term and epoch renews");
        assert!(accept_lease(held, &lease(5, 10)), "a newer leader");
        assert!(accept_lease(held, &lease(4, 12)), "a newer configuration");
        assert!(!accept_lease(held, &lease(3, 12)), "a deposed leader's lease");
        assert!(!accept_lease(held, &lease(5, 9)), "a configuration older than the one held");
        assert!(accept_lease(Held::default(), &lease(1, 0)), "nothing held yet");
    }
}
