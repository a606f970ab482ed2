//! Raft RPCs between the managers of the group over our own TCP: each RPC is one native
//! request (`Request::Raft`) whose body is the bincode encoding of openraft's request, on the
//! manager's ordinary listener and the pooled multiplexed connections every process uses.
//! Two more requests ride the same channel: a manager's membership, asked by a replica that
//! may have been removed from the group (`super::removed`), and a caller's request that a
//! follower passes on to the leader (`forward`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bincode::Options;
use fawn_client::pool::Pool;
use fawn_proto::native::{Request, Response, FRAME_BYTES_MAX};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, StoredMembership};
use serde::{Deserialize, Serialize};

use super::{ManagerId, Raft, TypeConfig};

/// How long connecting to another manager may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);

/// A Raft RPC as sent.
#[derive(Serialize, Deserialize)]
enum Rpc {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<u64>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// The membership the receiver has (last, so the earlier variants keep their tags).
    Membership,
    /// The configuration, answered as the receiver answers `GetConfig` when it leads (sent
    /// by followers of the previous protocol version; now `Forward(GetConfig)`).
    Config,
    /// A caller's request, answered as the receiver answers it when it leads, never passed on
    /// again.
    Forward(Request),
}

/// Its answer.
#[derive(Serialize, Deserialize)]
enum Reply {
    AppendEntries(Result<AppendEntriesResponse<u64>, RaftError<u64>>),
    Vote(Result<VoteResponse<u64>, RaftError<u64>>),
    InstallSnapshot(Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>),
    Membership(StoredMembership<u64, BasicNode>),
    Config(Response),
    Forward(Response),
}

fn codec() -> impl bincode::Options {
    bincode::DefaultOptions::new().with_limit(FRAME_BYTES_MAX as u64)
}

/// Answers one encoded RPC from another manager with the local replica; `forwarded` answers
/// a request a follower passes on (as a leader answers it, without passing it on again).
pub async fn serve<F: Future<Output = Response>>(
    raft: &Raft,
    body: &[u8],
    forwarded: impl FnOnce(Request) -> F,
) -> Response {
    let rpc: Rpc = match codec().deserialize(body) {
        Ok(r) => r,
        Err(e) => return Response::Error(fawn_proto::native::WireError::Invalid(format!("raft rpc: {e}"))),
    };
    let reply = match rpc {
        Rpc::AppendEntries(r) => Reply::AppendEntries(raft.append_entries(r).await),
        Rpc::Vote(r) => Reply::Vote(raft.vote(r).await),
        Rpc::InstallSnapshot(r) => Reply::InstallSnapshot(raft.install_snapshot(r).await),
        Rpc::Membership => Reply::Membership(raft.metrics().borrow().membership_config.as_ref().clone()),
        Rpc::Config => Reply::Config(forwarded(Request::GetConfig).await),
        Rpc::Forward(request) => Reply::Forward(forwarded(request).await),
    };
    match codec().serialize(&reply) {
        Ok(bytes) => Response::Raft(bytes),
        Err(e) => Response::Error(fawn_proto::native::WireError::Invalid(format!("raft reply: {e}"))),
    }
}

/// The membership the manager at `addr` has (its latest, committed or not), if it answers
/// within `timeout`.
pub async fn membership_of(
    pool: &Pool,
    addr: &str,
    timeout: Duration,
) -> Option<StoredMembership<u64, BasicNode>> {
    let bytes = codec().serialize(&Rpc::Membership).ok()?;
    match pool.call(addr, Request::Raft(bytes), timeout).await {
        Ok(Response::Raft(b)) => match codec().deserialize(&b) {
            Ok(Reply::Membership(m)) => Some(m),
            _ => None,
        },
        _ => None,
    }
}

/// `request` as the manager at `addr` answers it if it leads (never passed on further), if it
/// answers within `timeout`.
pub async fn forward(pool: &Pool, addr: &str, request: Request, timeout: Duration) -> Option<Response> {
    let bytes = codec().serialize(&Rpc::Forward(request)).ok()?;
    match pool.call(addr, Request::Raft(bytes), timeout).await {
        Ok(Response::Raft(b)) => match codec().deserialize(&b) {
            Ok(Reply::Forward(r)) => Some(r),
            _ => None,
        },
        _ => None,
    }
}

/// Makes the per-peer senders; they share one connection pool.
pub struct Network {
    pool: Arc<Pool>,
}

impl Network {
    pub fn new() -> Network {
        Network { pool: Arc::new(Pool::new(CONNECT_TIMEOUT)) }
    }
}

impl Default for Network {
    fn default() -> Self {
        Network::new()
    }
}

/// Sends RPCs to one other manager.
pub struct Peer {
    target: ManagerId,
    addr: String,
    pool: Arc<Pool>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: ManagerId, node: &BasicNode) -> Peer {
        Peer { target, addr: node.addr.clone(), pool: self.pool.clone() }
    }
}

type RpcResult<T, E = openraft::error::Infallible> = Result<T, RPCError<u64, BasicNode, RaftError<u64, E>>>;

impl Peer {
    async fn call(
        &self,
        rpc: &Rpc,
        option: &RPCOption,
    ) -> Result<Reply, RPCError<u64, BasicNode, NetworkError>> {
        let bytes = codec().serialize(rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        match self.pool.call(&self.addr, Request::Raft(bytes), option.hard_ttl()).await {
            Ok(Response::Raft(b)) => {
                codec().deserialize(&b).map_err(|e| RPCError::Network(NetworkError::new(&e)))
            }
            Ok(other) => {
                let e = std::io::Error::other(format!("unexpected answer {other:?}"));
                Err(RPCError::Network(NetworkError::new(&e)))
            }
            Err(e) => Err(RPCError::Unreachable(Unreachable::new(&e))),
        }
    }

    fn unexpected<T, E: std::error::Error>() -> RpcResult<T, E> {
        let e = std::io::Error::other("mismatched raft reply");
        Err(RPCError::Network(NetworkError::new(&e)))
    }

    fn remote<T, E: std::error::Error>(&self, r: Result<T, RaftError<u64, E>>) -> RpcResult<T, E> {
        r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

/// Re-types a transport error (it carries no remote error).
fn transport<E: std::error::Error>(
    e: RPCError<u64, BasicNode, NetworkError>,
) -> RPCError<u64, BasicNode, RaftError<u64, E>> {
    match e {
        RPCError::Unreachable(u) => RPCError::Unreachable(u),
        RPCError::Network(n) => RPCError::Network(n),
        RPCError::Timeout(t) => RPCError::Timeout(t),
        other => RPCError::Network(NetworkError::new(&other)),
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>> {
        match self.call(&Rpc::AppendEntries(rpc), &option).await.map_err(transport)? {
            Reply::AppendEntries(r) => self.remote(r),
            _ => Self::unexpected(),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        match self.call(&Rpc::InstallSnapshot(rpc), &option).await.map_err(transport)? {
            Reply::InstallSnapshot(r) => self.remote(r),
            _ => Self::unexpected(),
        }
    }

    async fn vote(&mut self, rpc: VoteRequest<u64>, option: RPCOption) -> RpcResult<VoteResponse<u64>> {
        match self.call(&Rpc::Vote(rpc), &option).await.map_err(transport)? {
            Reply::Vote(r) => self.remote(r),
            _ => Self::unexpected(),
        }
    }
}
