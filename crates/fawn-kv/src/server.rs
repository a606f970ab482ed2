//! The native-protocol server shape shared by every role: a listener with a bounded number of
//! connections, one reader and one writer task per connection, requests handled concurrently,
//! chain messages handled in arrival order, graceful shutdown. Connections are plain TCP or
//! mutual TLS as the process's transport says (`fawn_client::transport`); under TLS each
//! request is checked against the peer's certificate ([`crate::auth`]) before it is handled.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fawn_client::framed::{FrameReader, ReadError, ReadTimeouts};
use fawn_client::transport::{self, NetStream, NetWrite};
use fawn_proto::native::{
    encode_frame, ChainMsg, FrameError, Message, Request, Response, WireError, PROTOCOL_VERSION,
};
use fawn_ring::NodeId;
use fawn_tls::Identity;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

use crate::auth;

/// Connections one native listener serves at once (before the file-descriptor limit lowers
/// it, see [`crate::limits`]); one more is accepted, told so in an error frame, and closed.
pub const NATIVE_CONNECTIONS_MAX: usize = 1024;
/// Responses queued per connection before request handlers wait.
pub const CONNECTION_RESPONSES_QUEUED_MAX: usize = 4096;
/// Requests in flight per connection before the reader stops reading (backpressure).
pub const CONNECTION_REQUESTS_IN_FLIGHT_MAX: usize = 4096;
/// A connection with no request in flight and no frame begun for this long is closed. Every
/// peer of the cluster talks more often than this (heartbeats, leases), and the pooled
/// connections of clients reconnect when the server closes them.
pub const NATIVE_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Most time from a frame's first byte to its last (a peer dripping bytes is closed).
pub const NATIVE_FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// A peer that takes no byte of queued responses for this long is closed (a peer that never
/// reads holds its responses no longer; a slow but steady one is not cut).
pub const NATIVE_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of responses one connection may have in the making or queued for its writer (its
/// cap within the server's [`ReplyBudget`]). A request is charged what its response may take
/// before it is handled ([`response_charge`]); past the cap the server stops reading that
/// connection's requests (they wait in the kernel). A front-end sends all its requests to a
/// back-end on one pooled connection, so this also caps its gets in flight there (63 with
/// 1 MiB values).
pub const CONNECTION_OUTPUT_BYTES_MAX: usize = 64 << 20;
/// Bytes of responses all connections of one native server may have in the making or queued
/// for their writers, split in shares ([`Share`]); `--native-reply-budget-mib`. With the
/// write timeout this bounds what peers that never read can hold, however many connect.
pub const NATIVE_REPLY_BUDGET_BYTES: usize = 512 << 20;
/// The smallest reply budget a server takes: every share holds at least one get's charge.
pub const NATIVE_REPLY_BUDGET_BYTES_MIN: usize = 16 << 20;
/// What a request other than a get is charged up front; a larger response takes what more it
/// needs from the budget if it is free (it never waits for it: no deadlock between handlers).
const RESPONSE_CHARGE_BYTES: usize = 4 << 10;
/// What a get is charged up front: its response carries at most one value.
const GET_RESPONSE_CHARGE_BYTES: usize =
    fawn_ds::limits::VALUE_BYTES_MAX + fawn_ds::limits::KEY_BYTES_MAX + RESPONSE_CHARGE_BYTES;
const _: () = assert!(
    GET_RESPONSE_CHARGE_BYTES * 16 <= CONNECTION_OUTPUT_BYTES_MAX,
    "a connection must fit many gets in flight"
);
const _: () = assert!(CONNECTION_OUTPUT_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(
    NATIVE_REPLY_BUDGET_BYTES_MIN / 8 >= GET_RESPONSE_CHARGE_BYTES,
    "the smallest share must hold one get's charge"
);
/// Chain messages of one connection handled as one batch (`Handler::chain_batch`): those
/// already read, up to this many.
pub const CHAIN_BATCH_MESSAGES_MAX: usize = 4096;
/// Updates of one connection handed to the handler together (`Handler::updates`): those
/// already read, up to this many.
pub const UPDATE_BATCH_REQUESTS_MAX: usize = 1024;
const _: () = assert!(UPDATE_BATCH_REQUESTS_MAX <= CONNECTION_REQUESTS_IN_FLIGHT_MAX);
/// A refused connection is given this long to take its error frame.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// Most bytes of queued responses coalesced into one write.
const WRITE_BATCH_BYTES: usize = 64 * 1024;

/// Bounds of every native listener of this process.
#[derive(Clone, Copy, Debug)]
pub struct NativeLimits {
    pub connections_max: usize,
    pub read: ReadTimeouts,
    pub write_timeout: Duration,
    /// Each server's [`ReplyBudget`], in bytes (at least [`NATIVE_REPLY_BUDGET_BYTES_MIN`]).
    pub reply_budget_bytes: usize,
}

impl Default for NativeLimits {
    fn default() -> Self {
        NativeLimits {
            connections_max: NATIVE_CONNECTIONS_MAX,
            read: ReadTimeouts { idle: NATIVE_IDLE_TIMEOUT, frame: NATIVE_FRAME_TIMEOUT },
            write_timeout: NATIVE_WRITE_TIMEOUT,
            reply_budget_bytes: NATIVE_REPLY_BUDGET_BYTES,
        }
    }
}

/// Which share of a server's [`ReplyBudget`] a request's response is charged to. The shares
/// exist so that no request ever waits for room held by requests that wait for it (which
/// would deadlock a chain or a pair of front-ends once hostile clients fill the budget):
/// - Chain messages (`Hello`, replication, acks, sync streams) and one-way requests (a
///   tail's `Committed`) have no responses: they take no room, and are never stopped by the
///   budget.
/// - [`Share::Forwarded`]: requests a front-end sends on behalf of its clients (`forwarded`
///   gets and updates: to the tail or head of a chain, or to the front-end owning the key).
///   Whoever waits for them holds room in another share or on another server; they wait
///   only for a back-end's store or chain (a front-end never forwards them again), which
///   takes no room. So clients of a back-end that never read cannot slow a front-end's reads.
/// - [`Share::ClientGets`]: gets sent directly by clients; a back-end answers them from its
///   store without waiting for anything. Clients that never read hold room here until the
///   write timeout closes them; well-behaved direct clients' gets then wait their turn.
/// - [`Share::Other`]: every other request (updates from clients, configuration installs,
///   pings, status, reports): small responses, never
///   queued behind gets. A request here may wait for a chain (a head's update), which takes
///   no room, or for another server (a front-end's request to a back-end: another budget);
///   all such waits end at their time-outs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    Forwarded,
    ClientGets,
    Other,
}

impl Share {
    pub const ALL: [Share; 3] = [Share::Forwarded, Share::ClientGets, Share::Other];

    /// The name metrics and logs use.
    pub fn name(self) -> &'static str {
        match self {
            Share::Forwarded => "forwarded",
            Share::ClientGets => "client_gets",
            Share::Other => "other",
        }
    }

    /// The share `request`'s response is charged to.
    pub fn of(request: &Request) -> Share {
        match request {
            Request::Get { forwarded: true, .. } | Request::Update { forwarded: true, .. } => {
                Share::Forwarded
            }
            Request::Get { forwarded: false, .. } => Share::ClientGets,
            _ => Share::Other,
        }
    }

    /// Eighths of the budget: forwarded 3, client gets 4, other 1.
    fn eighths(self) -> usize {
        match self {
            Share::Forwarded => 3,
            Share::ClientGets => 4,
            Share::Other => 1,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The bytes of responses that all connections of one native server may hold in the making
/// or queued for their writers, in [`Share`]s; each connection is also capped at
/// [`CONNECTION_OUTPUT_BYTES_MAX`]. A connection that finds no room stops being read until
/// room is free (its requests wait in the kernel); room comes back as responses are written,
/// or when a connection whose peer does not read is closed by the write timeout.
pub struct ReplyBudget {
    shares: [Arc<Semaphore>; 3],
    bytes: [usize; 3],
    waits: [AtomicU64; 3],
    stalled_closed: AtomicU64,
}

impl ReplyBudget {
    /// A budget of `bytes` (raised to [`NATIVE_REPLY_BUDGET_BYTES_MIN`]) split in shares.
    pub fn new(bytes: usize) -> ReplyBudget {
        let bytes = bytes.clamp(NATIVE_REPLY_BUDGET_BYTES_MIN, Semaphore::MAX_PERMITS);
        let sizes = Share::ALL.map(|s| bytes / 8 * s.eighths());
        ReplyBudget {
            shares: sizes.map(|b| Arc::new(Semaphore::new(b))),
            bytes: sizes,
            waits: Default::default(),
            stalled_closed: AtomicU64::new(0),
        }
    }

    /// The size of `share`, in bytes.
    pub fn share_bytes(&self, share: Share) -> usize {
        self.bytes[share.index()]
    }

    /// Bytes of `share` free now.
    pub fn free_bytes(&self, share: Share) -> usize {
        self.shares[share.index()].available_permits()
    }

    /// Requests that found no room in `share` and waited for it.
    pub fn waits(&self, share: Share) -> u64 {
        self.waits[share.index()].load(Ordering::Relaxed)
    }

    /// Connections closed because their peer took no byte of their responses for the write
    /// timeout.
    pub fn stalled_closed(&self) -> u64 {
        self.stalled_closed.load(Ordering::Relaxed)
    }

    fn room(&self, share: Share) -> &Arc<Semaphore> {
        &self.shares[share.index()]
    }
}

impl Default for ReplyBudget {
    fn default() -> Self {
        ReplyBudget::new(limits().reply_budget_bytes)
    }
}

/// A response's room: in its connection's cap and in its server's share.
struct Charge {
    connection: OwnedSemaphorePermit,
    server: OwnedSemaphorePermit,
}

impl Charge {
    /// Room for `request`'s response, waiting for it: first within the connection's cap, then
    /// in the server's share (counted as a wait if none is free at once). `None` once the
    /// budget is closed (never: the semaphores are not closed).
    async fn wait(connection: &Arc<Semaphore>, budget: &ReplyBudget, request: &Request) -> Option<Charge> {
        let bytes = response_charge(request) as u32;
        let connection = connection.clone().acquire_many_owned(bytes).await.ok()?;
        let share = Share::of(request);
        let room = budget.room(share).clone();
        let server = match room.clone().try_acquire_many_owned(bytes) {
            Ok(p) => p,
            Err(_) => {
                budget.waits[share.index()].fetch_add(1, Ordering::Relaxed);
                room.acquire_many_owned(bytes).await.ok()?
            }
        };
        Some(Charge { connection, server })
    }

    /// Room for a response of `bytes` in `share` if it is free now.
    fn now(connection: &Arc<Semaphore>, budget: &ReplyBudget, share: Share, bytes: usize) -> Option<Charge> {
        let connection = connection.clone().try_acquire_many_owned(bytes as u32).ok()?;
        let server = budget.room(share).clone().try_acquire_many_owned(bytes as u32).ok()?;
        Some(Charge { connection, server })
    }

    /// Settles the charge with the response's real size `bytes`: the excess goes back at
    /// once; a shortfall is taken if free, else the frame goes out over budget (waiting could
    /// deadlock handlers that all hold part of the budget).
    fn settle(&mut self, bytes: usize) {
        for permit in [&mut self.connection, &mut self.server] {
            let held = permit.num_permits();
            if bytes < held {
                drop(permit.split(held - bytes));
            } else if let Ok(more) = permit.semaphore().clone().try_acquire_many_owned((bytes - held) as u32)
            {
                permit.merge(more);
            }
        }
    }
}

static LIMITS: OnceLock<NativeLimits> = OnceLock::new();

/// Sets the bounds of this process's native listeners, once, before the first one starts
/// (the process start-up derives them from its file-descriptor limit and its flags). False if
/// they were set already.
pub fn set_limits(limits: NativeLimits) -> bool {
    LIMITS.set(limits).is_ok()
}

/// The bounds native listeners use: those set at start-up, else the defaults.
pub fn limits() -> NativeLimits {
    *LIMITS.get_or_init(NativeLimits::default)
}

/// What a role does with the messages it receives.
pub trait Handler: Send + Sync + 'static {
    /// Answers one request. Called concurrently.
    fn request(self: Arc<Self>, request: Request) -> impl Future<Output = Response> + Send;

    /// Handles a one-way request (`Request::is_one_way`: a tail's `Committed`), which is
    /// never answered: in the connection's task, in arrival order, without waiting. By
    /// default it is dropped (only a front-end takes notices).
    fn one_way(&self, request: Request) {
        debug!(?request, "one-way request not taken here; dropped");
    }

    /// Handles one chain message from back-end `from` (as named by the connection's `Hello`).
    /// Messages of one connection are handled one at a time, in order.
    fn chain(self: Arc<Self>, from: NodeId, msg: ChainMsg) -> impl Future<Output = ()> + Send {
        let _ = (from, msg);
        async {}
    }

    /// The id of the cluster this process belongs to, which a chain `Hello` must name
    /// (`None`: this role takes no chain connections, or has no configuration yet).
    fn cluster_id(&self) -> Option<u64> {
        None
    }

    /// Answers updates (`Request::Update`) that arrived together on one connection, in order
    /// (a handler may order them as one step): one answer each, in order. By default each is
    /// answered as `request` answers it.
    fn updates(self: Arc<Self>, requests: Vec<Request>) -> impl Future<Output = Vec<Answer>> + Send {
        async move { requests.into_iter().map(|r| Answer::Later(Box::pin(self.clone().request(r)))).collect() }
    }

    /// Handles chain messages from `from` that arrived together, in order (a handler may
    /// batch their work); by default one at a time.
    fn chain_batch(self: Arc<Self>, from: NodeId, msgs: Vec<ChainMsg>) -> impl Future<Output = ()> + Send {
        async move {
            for msg in msgs {
                self.clone().chain(from, msg).await;
            }
        }
    }
}

/// A request's response: ready, to wait for, or none (an update whose success the tail's
/// `Committed` notice tells its front-end; see `Request::Update`).
pub enum Answer {
    Now(Response),
    Later(Pin<Box<dyn Future<Output = Response> + Send>>),
    Notified,
}

/// Serves `handler` on `listener` until `shutdown` turns true, within [`limits`] and a reply
/// budget of its own.
pub async fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>, shutdown: watch::Receiver<bool>) {
    serve_within(listener, handler, limits(), Arc::default(), shutdown).await
}

/// Serves `handler` on `listener` until `shutdown` turns true, its connections' responses
/// within `budget`. Every connection is accepted at once (none waits in the backlog); past
/// `limits.connections_max` it is told so and closed.
pub async fn serve_within<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    limits: NativeLimits,
    budget: Arc<ReplyBudget>,
    mut shutdown: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(limits.connections_max));
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.changed() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    debug!(%peer, max = limits.connections_max, "native connection refused: too many");
                    tokio::spawn(refuse(stream));
                    continue;
                };
                debug!(%peer, "native connection");
                let handler = handler.clone();
                let shutdown = shutdown.clone();
                let budget = budget.clone();
                tokio::spawn(async move {
                    // A peer gets as long for the handshake as for one frame.
                    let transport = transport::current();
                    match tokio::time::timeout(limits.read.frame, transport.accept(stream)).await {
                        Ok(Ok((stream, identity))) => {
                            connection(stream, peer, identity, handler, limits, budget, shutdown).await;
                        }
                        Ok(Err(e)) => {
                            warn!(%peer, error = %e, "native connection refused: TLS handshake failed")
                        }
                        Err(_) => warn!(%peer, "native connection refused: TLS handshake timed out"),
                    }
                    drop(permit);
                });
            }
            Err(e) => {
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The error frame a connection past the cap receives before it is closed.
pub fn refusal_frame() -> Vec<u8> {
    let err = Response::Error(WireError::Unavailable("too many open connections".into()));
    let mut frame = Vec::new();
    // A short error always encodes.
    let _ = encode_frame(0, &Message::Response(err), &mut frame);
    frame
}

async fn refuse(stream: TcpStream) {
    let frame = refusal_frame();
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, async {
        let Ok((stream, _)) = transport::current().accept(stream).await else { return };
        let (_reader, mut writer) = stream.into_split();
        let _ = writer.write_all(&frame).await;
        let _ = writer.shutdown().await;
    })
    .await;
}

/// Serves one connection from `peer_addr` (`peer`: its certificate's identity; `None` on plain TCP). A
/// request or chain link the peer may not send ([`auth`]) is answered with an error, logged,
/// and the connection closed.
async fn connection<H: Handler>(
    stream: NetStream,
    peer_addr: SocketAddr,
    peer: Option<Identity>,
    handler: Arc<H>,
    limits: NativeLimits,
    budget: Arc<ReplyBudget>,
    mut shutdown: watch::Receiver<bool>,
) {
    let (reader, writer) = stream.into_split();
    let (tx, rx) = mpsc::channel::<Output>(CONNECTION_RESPONSES_QUEUED_MAX);
    // This connection's cap; its responses also take room in the server's `budget`.
    let output = Arc::new(Semaphore::new(CONNECTION_OUTPUT_BYTES_MAX));
    let writer_task =
        tokio::spawn(write_responses(writer, rx, limits.write_timeout, budget.clone(), peer_addr));
    let in_flight = Arc::new(Semaphore::new(CONNECTION_REQUESTS_IN_FLIGHT_MAX));
    let mut frames = FrameReader::new(reader);
    let mut from: Option<NodeId> = None;
    // A frame read while gathering a batch of chain messages that is not one of them.
    let mut held: Option<Result<(u64, Message), ReadError>> = None;
    loop {
        let next = match held.take() {
            Some(frame) => frame.map(Some),
            // In this order, without drawing a random one per frame: a shutdown or a writer
            // that gave up is seen before the next frame.
            None => tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                // The writer gave up (the peer does not read): stop reading its requests.
                _ = tx.closed() => break,
                n = frames.next_within(limits.read) => n,
            },
        };
        match next {
            Ok(Some((id, Message::Request(req)))) => {
                if let Err(refused) = auth::request(peer.as_ref(), &req) {
                    refuse_peer(id, refused, &tx, &output, &budget).await;
                    break;
                }
                if req.is_one_way() {
                    // No response: no slot, no room, no task.
                    handler.one_way(req);
                    continue;
                }
                let Ok(permit) = in_flight.clone().acquire_owned().await else { break };
                // Back-pressure: no more of this peer's requests are read until its response
                // has room.
                let charged = tokio::select! {
                    biased;
                    _ = shutdown.changed() => break,
                    _ = tx.closed() => break,
                    c = Charge::wait(&output, &budget, &req) => c,
                };
                let Some(charged) = charged else { break };
                if let Request::Update { .. } = req {
                    // Every update already read is handed over as one batch.
                    let mut batch = vec![(id, req, permit, charged)];
                    while batch.len() < UPDATE_BATCH_REQUESTS_MAX {
                        match frames.buffered() {
                            Ok(Some((id, Message::Request(r @ Request::Update { .. }))))
                                if auth::request(peer.as_ref(), &r).is_ok() =>
                            {
                                match admit_now(&in_flight, &output, &budget, &r) {
                                    Some((permit, charged)) => batch.push((id, r, permit, charged)),
                                    None => {
                                        held = Some(Ok((id, Message::Request(r))));
                                        break;
                                    }
                                }
                            }
                            Ok(None) => break,
                            other => {
                                held = other.transpose();
                                break;
                            }
                        }
                    }
                    tokio::spawn(answer_updates(handler.clone(), batch, tx.clone()));
                    continue;
                }
                let (handler, tx) = (handler.clone(), tx.clone());
                tokio::spawn(async move {
                    let resp = handler.request(req).await;
                    let _ = tx.send(output_frame(id, resp, charged)).await;
                    drop(permit);
                });
            }
            Ok(Some((id, Message::Chain(ChainMsg::Hello { from: node, cluster })))) => {
                let hello = auth::hello(peer.as_ref(), node)
                    .and_then(|()| auth::same_cluster(cluster, handler.cluster_id()));
                if let Err(refused) = hello {
                    refuse_peer(id, refused, &tx, &output, &budget).await;
                    break;
                }
                from = Some(node);
            }
            Ok(Some((_, Message::Chain(msg)))) => match from {
                Some(node) => {
                    // Every chain message already read is handled as one batch.
                    let mut batch = vec![msg];
                    while batch.len() < CHAIN_BATCH_MESSAGES_MAX {
                        match frames.buffered() {
                            Ok(Some((_, Message::Chain(m)))) if !matches!(m, ChainMsg::Hello { .. }) => {
                                batch.push(m)
                            }
                            Ok(None) => break,
                            other => {
                                held = other.transpose();
                                break;
                            }
                        }
                    }
                    handler.clone().chain_batch(node, batch).await
                }
                None => {
                    debug!("chain message before Hello; closing");
                    break;
                }
            },
            Ok(Some((id, Message::Response(_)))) => {
                let err = Response::Error(WireError::Invalid("unexpected response frame".into()));
                // Never answered: not a request (no handler runs), and a peer that sends
                // responses is not a client waiting for this.
                let Some(charged) = Charge::now(&output, &budget, Share::Other, RESPONSE_CHARGE_BYTES) else {
                    break;
                };
                let _ = tx.send(output_frame(id, err, charged)).await;
            }
            Ok(None) => break,
            // Idle, but waiting for answers to its requests: not idle.
            Err(ReadError::Idle(_)) if in_flight.available_permits() < CONNECTION_REQUESTS_IN_FLIGHT_MAX => {}
            Err(e @ ReadError::Frame(FrameError::Version(_))) => {
                warn!(error = %e, ours = PROTOCOL_VERSION, "closing a connection from a peer of another protocol version");
                break;
            }
            Err(e) => {
                debug!(error = %e, "closing native connection");
                break;
            }
        }
    }
    drop(tx);
    let _ = writer_task.await;
}

/// An in-flight slot and the response charge for `request` if both are free now.
fn admit_now(
    in_flight: &Arc<Semaphore>,
    output: &Arc<Semaphore>,
    budget: &ReplyBudget,
    request: &Request,
) -> Option<(OwnedSemaphorePermit, Charge)> {
    let permit = in_flight.clone().try_acquire_owned().ok()?;
    let charged = Charge::now(output, budget, Share::of(request), response_charge(request))?;
    Some((permit, charged))
}

/// Hands updates that arrived together to the handler and queues each answer: the ready ones
/// at once, then the others in order (a batch's updates commit in order).
async fn answer_updates<H: Handler>(
    handler: Arc<H>,
    batch: Vec<(u64, Request, OwnedSemaphorePermit, Charge)>,
    tx: mpsc::Sender<Output>,
) {
    let mut requests = Vec::with_capacity(batch.len());
    let mut slots = Vec::with_capacity(batch.len());
    for (id, request, permit, charged) in batch {
        requests.push(request);
        slots.push((id, permit, charged));
    }
    let mut answers = handler.updates(requests).await.into_iter();
    let mut later = Vec::new();
    for (id, permit, charged) in slots {
        let missing = || Answer::Now(Response::Error(WireError::Invalid("no answer".into())));
        match answers.next().unwrap_or_else(missing) {
            Answer::Now(resp) => {
                let _ = tx.send(output_frame(id, resp, charged)).await;
                drop(permit);
            }
            Answer::Later(answer) => later.push((id, answer, permit, charged)),
            // No frame: the request's slot and room are free again.
            Answer::Notified => drop((permit, charged)),
        }
    }
    for (id, answer, permit, charged) in later {
        let resp = answer.await;
        let _ = tx.send(output_frame(id, resp, charged)).await;
        drop(permit);
    }
}

/// Logs a refused request or link and answers it with an error (the caller then closes).
async fn refuse_peer(
    id: u64,
    refused: auth::Refused,
    tx: &mpsc::Sender<Output>,
    output: &Arc<Semaphore>,
    budget: &ReplyBudget,
) {
    warn!(error = %refused, "native request refused; closing the connection");
    let err = Response::Error(WireError::Invalid(format!("refused: {refused}")));
    if let Some(charged) = Charge::now(output, budget, Share::Other, RESPONSE_CHARGE_BYTES) {
        let _ = tx.send(output_frame(id, err, charged)).await;
    }
}

/// An encoded response and its room in the connection's cap and the server's budget,
/// returned once it is written.
struct Output {
    frame: Vec<u8>,
    _charged: Charge,
}

/// What a request's response may take of the output budget before it is handled.
fn response_charge(request: &Request) -> usize {
    match request {
        Request::Get { .. } => GET_RESPONSE_CHARGE_BYTES,
        _ => RESPONSE_CHARGE_BYTES,
    }
}

/// Encodes a response, settling its charge with its real size ([`Charge::settle`]).
fn output_frame(id: u64, resp: Response, mut charged: Charge) -> Output {
    let mut frame = Vec::new();
    push_response(&mut frame, id, resp);
    charged.settle(frame.len().min(CONNECTION_OUTPUT_BYTES_MAX));
    Output { frame, _charged: charged }
}

async fn write_responses(
    mut writer: NetWrite,
    mut rx: mpsc::Receiver<Output>,
    write_timeout: Duration,
    budget: Arc<ReplyBudget>,
    peer: SocketAddr,
) {
    let mut buf = Vec::new();
    // Held until their frames are written.
    let mut charges = Vec::new();
    while let Some(first) = rx.recv().await {
        buf.clear();
        buf.extend_from_slice(&first.frame);
        charges.push(first);
        if rx.is_empty() {
            // Woken by the first response, this task would write it alone before the other
            // handlers that are ready to run queue theirs: let them run first, so that
            // responses finished together share one write (a yield costs less than a send).
            tokio::task::yield_now().await;
        }
        while buf.len() < WRITE_BATCH_BYTES {
            match rx.try_recv() {
                Ok(more) => {
                    buf.extend_from_slice(&more.frame);
                    charges.push(more);
                }
                Err(_) => break,
            }
        }
        match crate::stall::write_all_or_stall(&mut writer, &buf, write_timeout).await {
            Ok(()) => {
                charges.clear();
                // An idle connection keeps no large buffer from its last big response.
                buf.shrink_to(WRITE_BATCH_BYTES);
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                budget.stalled_closed.fetch_add(1, Ordering::Relaxed);
                info!(
                    %peer,
                    ?write_timeout,
                    unwritten_bytes = buf.len(),
                    responses_queued = rx.len(),
                    "closing a native connection: its peer took no byte of its responses for the write timeout"
                );
                return;
            }
            Err(e) => {
                debug!(error = %e, "closing a native connection: writing to it failed");
                return;
            }
        }
    }
}

fn push_response(buf: &mut Vec<u8>, id: u64, resp: Response) {
    if let Err(e) = encode_frame(id, &Message::Response(resp), buf) {
        // Only an oversize response can fail; tell the caller instead of dropping it.
        let err = Response::Error(WireError::Invalid(format!("response not encodable: {e}")));
        let _ = encode_frame(id, &Message::Response(err), buf);
    }
}

/// Guards the reply budget's arithmetic: shares that fit the budget and hold a get each, the
/// share each request is charged to, a full share that holds up no other, and a charge
/// settled to a response's real size.
#[cfg(test)]
mod tests {
    use super::*;

    fn get(forwarded: bool) -> Request {
        Request::Get { epoch: 1, key: b"k".to_vec(), forwarded }
    }

    fn connection_cap() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(CONNECTION_OUTPUT_BYTES_MAX))
    }

    #[test]
    fn shares_fit_the_budget_and_each_holds_a_get() {
        for bytes in [0, NATIVE_REPLY_BUDGET_BYTES_MIN, NATIVE_REPLY_BUDGET_BYTES, 3 << 30] {
            let budget = ReplyBudget::new(bytes);
            let total: usize = Share::ALL.iter().map(|&s| budget.share_bytes(s)).sum();
            assert!(total <= bytes.max(NATIVE_REPLY_BUDGET_BYTES_MIN), "{bytes}: {total}");
            for share in Share::ALL {
                assert!(budget.share_bytes(share) >= GET_RESPONSE_CHARGE_BYTES, "{bytes}: {share:?}");
                assert_eq!(budget.free_bytes(share), budget.share_bytes(share));
            }
        }
    }

    #[test]
    fn requests_are_charged_to_their_share() {
        assert_eq!(Share::of(&get(true)), Share::Forwarded);
        assert_eq!(Share::of(&get(false)), Share::ClientGets);
        assert_eq!(Share::of(&Request::Ping), Share::Other);
        assert_eq!(Share::of(&Request::Status), Share::Other);
    }

    /// Takes one-way notices and answers pings.
    #[derive(Default)]
    struct Notices(parking_lot::Mutex<Vec<fawn_proto::native::ReqId>>);

    impl Handler for Notices {
        async fn request(self: Arc<Self>, _: Request) -> Response {
            Response::Pong
        }
        fn one_way(&self, request: Request) {
            if let Request::Committed { notices } = request {
                self.0.lock().extend(notices.iter().map(|n| n.req));
            }
        }
    }

    #[tokio::test]
    async fn a_one_way_request_is_taken_and_never_answered() {
        use fawn_client::rpc::{Connection, OneWay};
        use fawn_proto::native::{CommittedNotice, ReqId};
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let handler = Arc::new(Notices::default());
        let (_stop, shutdown) = watch::channel(false);
        tokio::spawn(serve(listener, handler.clone(), shutdown));
        let notice = |seq| CommittedNotice {
            req: ReqId { client: 1, seq },
            outcome: fawn_proto::op::Outcome::Stored { cas: seq },
            key: b"k".to_vec(),
        };
        let committed = Request::Committed { notices: vec![notice(1), notice(2)] };
        // Raw frames: a notice, then a ping; the only response is the ping's.
        let mut frames = Vec::new();
        encode_frame(0, &Message::Request(committed.clone()), &mut frames).expect("encode");
        encode_frame(7, &Message::Request(Request::Ping), &mut frames).expect("encode");
        let stream = TcpStream::connect(&addr).await.expect("connect");
        let (reader, mut writer) = stream.into_split();
        writer.write_all(&frames).await.expect("write");
        let mut responses = FrameReader::new(reader);
        let first = responses.next().await.expect("read").expect("a response");
        assert_eq!(first, (7, Message::Response(Response::Pong)), "the notice was answered");
        assert_eq!(*handler.0.lock(), [ReqId { client: 1, seq: 1 }, ReqId { client: 1, seq: 2 }]);
        // Through an rpc connection: queued without a pending call; a call after it is
        // answered (and nothing answers the notice: the reader would find no caller).
        let conn = Connection::connect(&addr, Duration::from_secs(5)).await.expect("connect");
        assert!(conn.send_now(OneWay::new(committed).expect("encode")).is_ok());
        let pong = conn.call(Request::Ping, Duration::from_secs(30)).await.expect("ping");
        assert_eq!(pong, Response::Pong);
        assert_eq!(handler.0.lock().len(), 4);
        drop(writer);
        assert!(responses.next().await.expect("read").is_none(), "a response came for the notice");
    }

    #[tokio::test]
    async fn a_full_share_of_client_gets_holds_up_no_other_share() {
        let budget = ReplyBudget::new(NATIVE_REPLY_BUDGET_BYTES_MIN);
        let mut held = Vec::new();
        // Clients' gets take all of their share, each on a connection of its own.
        while let Some(c) =
            Charge::now(&connection_cap(), &budget, Share::ClientGets, GET_RESPONSE_CHARGE_BYTES)
        {
            held.push(c);
        }
        assert!(!held.is_empty());
        let connection = connection_cap();
        let client_get = get(false);
        let waiting =
            tokio::time::timeout(Duration::from_millis(50), Charge::wait(&connection, &budget, &client_get));
        assert!(waiting.await.is_err(), "a client's get found room in a full share");
        assert_eq!(budget.waits(Share::ClientGets), 1);
        let forwarded =
            Charge::wait(&connection, &budget, &get(true)).await.expect("room for a forwarded get");
        let mut small = Charge::wait(&connection, &budget, &Request::Ping).await.expect("room for a ping");
        // Settled to its real size, a response gives the rest back at once.
        small.settle(40);
        assert_eq!(budget.free_bytes(Share::Other), budget.share_bytes(Share::Other) - 40);
        drop((forwarded, small, held));
        for share in Share::ALL {
            assert_eq!(budget.free_bytes(share), budget.share_bytes(share), "{share:?}");
        }
    }
}
