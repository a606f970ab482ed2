//! The manager group's consensus: openraft with our own storage (`log_store`: the Raft log
//! and vote, `state_machine`: the configuration and its snapshots, all fsynced in the
//! manager's data directory) and our own transport (`network`: Raft RPCs as native frames).

// openraft's storage and network traits fix these error types (200+ bytes each).
#![allow(clippy::result_large_err)]

pub(super) mod files;
pub mod log_store;
pub mod network;
pub mod state_machine;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::{BasicNode, SnapshotPolicy};

use super::command::{Applied, Command};

openraft::declare_raft_types!(
    /// Types of the manager group's Raft.
    pub TypeConfig:
        D = Command,
        R = Applied,
        NodeId = u64,
        Node = BasicNode,
);

/// The manager group's Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;
/// Id of a manager in the group (1-based position in the `--managers` list at bootstrap).
pub type ManagerId = u64;

/// The leader heartbeats its followers this often.
pub const HEARTBEAT: Duration = Duration::from_millis(50);
/// Each manager picks its election time-out once, at random in this range. openraft lets a
/// follower that has seen a leader stand for election only after the leader's lease (the
/// maximum) plus its own time-out, so a lost leader is replaced 0.55–0.7 s after its last
/// heartbeat: well under the back-ends' lease (`backend::MANAGER_LEASE`, 1.5 s), so they renew
/// it from the new leader before it lapses.
pub const ELECTION_TIMEOUT_MIN: Duration = Duration::from_millis(200);
pub const ELECTION_TIMEOUT_MAX: Duration = Duration::from_millis(350);
/// Default of `ManagerOptions::snapshot_every`: a snapshot is taken after this many log
/// entries, and the entries more than this far behind it are dropped (a follower lagging
/// further catches up from the snapshot).
pub const SNAPSHOT_EVERY_ENTRIES: u64 = 500;

/// Opens this manager's Raft replica on `dir`, talking to its peers through `network`.
/// The group is bootstrapped with `members` if this replica has never been part of one
/// (every manager of a new group does this with the same list, which is safe: the first
/// membership entry is identical everywhere).
pub async fn open(
    id: ManagerId,
    members: &BTreeMap<ManagerId, String>,
    dir: &Path,
    snapshot_every: u64,
) -> anyhow::Result<(Raft, state_machine::Published)> {
    let snapshot_every = snapshot_every.max(1);
    let config = openraft::Config {
        cluster_name: "fawn-manager".into(),
        heartbeat_interval: HEARTBEAT.as_millis() as u64,
        election_timeout_min: ELECTION_TIMEOUT_MIN.as_millis() as u64,
        election_timeout_max: ELECTION_TIMEOUT_MAX.as_millis() as u64,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(snapshot_every),
        max_in_snapshot_log_to_keep: snapshot_every,
        ..Default::default()
    }
    .validate()?;
    std::fs::create_dir_all(dir)?;
    let log = log_store::LogStore::open(dir)?;
    let fresh = log.is_empty();
    let (sm, published) = state_machine::StateMachine::open(dir)?;
    let raft = Raft::new(id, Arc::new(config), network::Network::new(), log, sm).await?;
    if fresh && !published.has_snapshot() && !members.is_empty() {
        let nodes: BTreeMap<ManagerId, BasicNode> =
            members.iter().map(|(id, addr)| (*id, BasicNode::new(addr.clone()))).collect();
        if let Err(e) = raft.initialize(nodes).await {
            // Another manager's entries got here first: this one joins through them.
            tracing::info!(error = %e, "manager group already initialized");
        }
    }
    Ok((raft, published))
}

/// How long a manager waits for another's membership (`removed`).
const MEMBERSHIP_ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// Whether another member of this replica's group holds a newer membership that leaves this
/// replica out. openraft stops replicating to a removed member as soon as the leader sees the
/// membership without it, so the removed replica never learns of its removal from its own
/// log: it only sees the leader go quiet and starts one election after another. It must ask.
/// The answer of any member suffices: a newer membership leaving this replica out was
/// proposed by a leader that removed it (if that change were lost, the group's next leader
/// replicates to this replica again, and its membership, with it, catches up).
pub async fn removed(raft: &Raft, pool: &fawn_client::pool::Pool) -> bool {
    let (me, mine) = {
        let m = raft.metrics().borrow().clone();
        (m.id, m.membership_config.clone())
    };
    let others: Vec<String> =
        mine.membership().nodes().filter(|(id, _)| **id != me).map(|(_, n)| n.addr.clone()).collect();
    for addr in others {
        if let Some(theirs) = network::membership_of(pool, &addr, MEMBERSHIP_ASK_TIMEOUT).await {
            if leaves_out(&theirs, &mine, me) {
                return true;
            }
        }
    }
    false
}

/// `theirs` is newer than `mine` and has no place for `me`, voter or learner.
fn leaves_out(
    theirs: &openraft::StoredMembership<ManagerId, BasicNode>,
    mine: &openraft::StoredMembership<ManagerId, BasicNode>,
    me: ManagerId,
) -> bool {
    theirs.log_id() > mine.log_id() && theirs.membership().get_node(&me).is_none()
}

/// The id and address of the leader this replica knows of.
pub fn leader(raft: &Raft) -> Option<(ManagerId, String)> {
    let m = raft.metrics().borrow().clone();
    let id = m.current_leader?;
    let addr = m.membership_config.membership().get_node(&id).map(|n| n.addr.clone())?;
    Some((id, addr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, LogId, Membership, StoredMembership};

    fn stored(index: u64, voters: &[u64]) -> StoredMembership<ManagerId, BasicNode> {
        let nodes: BTreeMap<u64, BasicNode> =
            voters.iter().map(|v| (*v, BasicNode::new(format!("m{v}")))).collect();
        let config = vec![voters.iter().copied().collect()];
        let log_id = LogId::new(CommittedLeaderId::new(1, 1), index);
        StoredMembership::new(Some(log_id), Membership::new(config, nodes))
    }

    #[test]
    fn only_a_newer_membership_without_this_replica_removes_it() {
        let mine = stored(3, &[1, 2, 3]);
        assert!(leaves_out(&stored(5, &[1, 2]), &mine, 3), "removed by a newer membership");
        assert!(!leaves_out(&stored(5, &[1, 2, 3]), &mine, 3), "still a member");
        assert!(!leaves_out(&stored(2, &[1, 2]), &mine, 3), "an older membership proves nothing");
        assert!(!leaves_out(&stored(3, &[1, 2]), &mine, 3), "the same position proves nothing");
    }
}
