//! Who may ask what, decided from the identity in the peer's certificate (see
//! `fawn_client::transport`), never from what the peer says in a frame. Every native listener
//! applies it ([`crate::server`]) before a request reaches its role.
//!
//! - Consensus between managers and configuration pushes (`Raft`, `Install`): managers only.
//! - Membership and admin requests (`Leave`, manager changes): an admin certificate; a flush:
//!   an admin, or a front-end relaying a memcached client's `flush_all`.
//! - A back-end's reports (register, sync done, link cut, ready to split/merge, tail ready)
//!   and chain messages: a back-end, and only about itself (`Hello.from` is its certificate's
//!   node id).
//! - A front-end's reports (register, heartbeats): a front-end, about itself.
//! - `Committed` notices: back-ends (tails) only; an update naming `reply_to`, and a get or
//!   update marked `forwarded` (which a back-end serves from the front-ends' reply share, and a
//!   front-end does not forward again): front-ends only.
//! - Reads of state (gets, updates, status, configuration, lease renewals, digests, pings),
//!   and a report that a front-end refused connections (the manager checks for itself): any
//!   member.
//!
//! A manager that does not lead passes a request it checked here on to the leader
//! (`manager::raft::network`, over a manager-only `Raft` request), which trusts that check.
//!
//! Without TLS (`--plaintext`) nothing is known of a peer and everything is allowed.

use fawn_proto::native::Request;
use fawn_ring::NodeId;
use fawn_tls::{Identity, Role};

/// Why a peer was refused: what it asked and who it is.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{peer} may not send {what}")]
pub struct Refused {
    pub peer: String,
    pub what: String,
}

fn refuse(peer: &Identity, what: impl Into<String>) -> Refused {
    Refused { peer: peer.to_string(), what: what.into() }
}

/// Checks that `peer` (None: a plaintext connection) may send `request`.
pub fn request(peer: Option<&Identity>, request: &Request) -> Result<(), Refused> {
    let Some(peer) = peer else { return Ok(()) };
    let is = |role: Role| peer.role == role;
    let is_node = |role: Role, node: u32| is(role) && peer.node == node;
    let (allowed, what) = match request {
        Request::Raft(_) => (is(Role::Manager), "Raft".to_string()),
        Request::Install { .. } => (is(Role::Manager), "Install".to_string()),
        Request::Leave { node } => (is(Role::Admin), format!("Leave of node {node}")),
        Request::ChangeManagers { id, .. } => (is(Role::Admin), format!("ChangeManagers of manager {id}")),
        Request::SetFlush { .. } => (is(Role::Admin) || is(Role::Frontend), "SetFlush".to_string()),
        Request::FlushAll { .. } => (is(Role::Admin) || is(Role::Frontend), "FlushAll".to_string()),
        Request::RegisterBackend { node, .. } => {
            (is_node(Role::Backend, *node), format!("RegisterBackend as node {node}"))
        }
        Request::SyncDone { node, .. }
        | Request::LinkCut { node, .. }
        | Request::TailReady { node, .. }
        | Request::SplitReady { node, .. }
        | Request::MergeReady { node, .. }
        | Request::DiskFault { node, .. } => {
            (is_node(Role::Backend, *node), format!("a back-end report as node {node}"))
        }
        Request::RegisterFrontend { id, .. } => {
            (is_node(Role::Frontend, *id), format!("RegisterFrontend as front-end {id}"))
        }
        Request::Heartbeats { frontend, .. } => {
            (is_node(Role::Frontend, *frontend), format!("Heartbeats as front-end {frontend}"))
        }
        Request::Committed { .. } => (is(Role::Backend), "Committed".to_string()),
        Request::Update { reply_to: Some(_), .. } => {
            (is(Role::Frontend), "an Update with reply_to".to_string())
        }
        Request::Get { forwarded: true, .. } | Request::Update { forwarded: true, .. } => {
            (is(Role::Frontend), "a forwarded Get or Update".to_string())
        }
        Request::Get { .. }
        | Request::Update { reply_to: None, .. }
        | Request::ItemStats
        | Request::GetConfig
        | Request::Renew
        | Request::Status
        | Request::RangeDigest { .. }
        | Request::Ping => (true, String::new()),
        // Only a prompt: the manager acts on its own connection attempts alone.
        Request::FrontendRefused { .. } => (true, String::new()),
    };
    if allowed {
        Ok(())
    } else {
        Err(refuse(peer, what))
    }
}

/// Checks that `peer` may open a chain link as back-end `from`.
pub fn hello(peer: Option<&Identity>, from: NodeId) -> Result<(), Refused> {
    match peer {
        Some(peer) if peer.role != Role::Backend || peer.node != from => {
            Err(refuse(peer, format!("chain messages as node {from}")))
        }
        _ => Ok(()),
    }
}

/// A chain `Hello` naming cluster `theirs` is refused by a node of cluster `ours`: the check
/// that fences off processes of another cluster without TLS too (with TLS their certificates
/// already fail the handshake). A node with no configuration yet (`None`) takes chain
/// messages from no one anyway.
pub fn same_cluster(theirs: u64, ours: Option<u64>) -> Result<(), Refused> {
    match ours {
        Some(ours) if ours != theirs => Err(Refused {
            peer: format!("a process of cluster {theirs:016x}"),
            what: format!("chain messages to cluster {ours:016x}"),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fawn_proto::native::ClusterConfig;

    fn id(role: Role, node: u32) -> Identity {
        Identity::new("t", role, node).expect("identity")
    }

    #[test]
    fn roles_ask_only_what_is_theirs() {
        let install = Request::Install { config: ClusterConfig::default() };
        assert!(request(Some(&id(Role::Manager, 1)), &install).is_ok());
        for role in [Role::Backend, Role::Frontend, Role::Admin] {
            assert!(request(Some(&id(role, 1)), &install).is_err(), "{role:?} installed");
        }
        let leave = Request::Leave { node: 2 };
        assert!(request(Some(&id(Role::Admin, 0)), &leave).is_ok());
        assert!(request(Some(&id(Role::Backend, 2)), &leave).is_err());
        let register = Request::RegisterBackend { node: 2, addr: "x:1".into(), logs_complete: true };
        assert!(request(Some(&id(Role::Backend, 2)), &register).is_ok());
        assert!(request(Some(&id(Role::Backend, 3)), &register).is_err(), "registered as another node");
        assert!(request(None, &install).is_ok(), "plaintext decides nothing");
        assert!(request(Some(&id(Role::Backend, 3)), &Request::Ping).is_ok());
        let get = |forwarded| Request::Get { epoch: Default::default(), key: b"k".to_vec(), forwarded };
        assert!(request(Some(&id(Role::Frontend, 1)), &get(true)).is_ok());
        assert!(
            request(Some(&id(Role::Admin, 0)), &get(true)).is_err(),
            "a client took the front-ends' share"
        );
        assert!(request(Some(&id(Role::Admin, 0)), &get(false)).is_ok());
    }

    #[test]
    fn chain_links_only_as_oneself() {
        assert!(hello(Some(&id(Role::Backend, 4)), 4).is_ok());
        assert!(hello(Some(&id(Role::Backend, 4)), 5).is_err());
        assert!(hello(Some(&id(Role::Frontend, 4)), 4).is_err());
        assert!(hello(None, 5).is_ok());
    }
}
