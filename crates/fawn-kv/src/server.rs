//! The native-protocol server shape shared by every role: a listener with a bounded number of
//! connections, one reader and one writer task per connection, requests handled concurrently,
//! chain messages handled in arrival order, graceful shutdown. Connections are plain TCP or
//! mutual TLS as the process's transport says (`fawn_client::transport`); under TLS each
//! request is checked against the peer's certificate ([`crate::auth`]) before it is handled.

use std::future::Future;
use std::pin::Pin;
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
use tracing::{debug, warn};

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
/// Bytes of responses one connection may have in the making or queued for its writer. A
/// request is charged what its response may take before it is handled ([`response_charge`]);
/// past the budget the server stops reading that connection's requests. With the write
/// timeout this bounds what a peer that never reads can hold.
pub const CONNECTION_OUTPUT_BYTES_MAX: usize = 64 << 20;
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
}

impl Default for NativeLimits {
    fn default() -> Self {
        NativeLimits {
            connections_max: NATIVE_CONNECTIONS_MAX,
            read: ReadTimeouts { idle: NATIVE_IDLE_TIMEOUT, frame: NATIVE_FRAME_TIMEOUT },
            write_timeout: NATIVE_WRITE_TIMEOUT,
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

/// A request's response: ready, or to wait for.
pub enum Answer {
    Now(Response),
    Later(Pin<Box<dyn Future<Output = Response> + Send>>),
}

/// Serves `handler` on `listener` until `shutdown` turns true, within [`limits`].
pub async fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>, shutdown: watch::Receiver<bool>) {
    serve_within(listener, handler, limits(), shutdown).await
}

/// Serves `handler` on `listener` until `shutdown` turns true. Every connection is accepted
/// at once (none waits in the backlog); past `limits.connections_max` it is told so and
/// closed.
pub async fn serve_within<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    limits: NativeLimits,
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
                tokio::spawn(async move {
                    // A peer gets as long for the handshake as for one frame.
                    let transport = transport::current();
                    match tokio::time::timeout(limits.read.frame, transport.accept(stream)).await {
                        Ok(Ok((stream, identity))) => {
                            connection(stream, identity, handler, limits, shutdown).await;
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

/// Serves one connection from `peer` (its certificate's identity; `None` on plain TCP). A
/// request or chain link the peer may not send ([`auth`]) is answered with an error, logged,
/// and the connection closed.
async fn connection<H: Handler>(
    stream: NetStream,
    peer: Option<Identity>,
    handler: Arc<H>,
    limits: NativeLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let (reader, writer) = stream.into_split();
    let (tx, rx) = mpsc::channel::<Output>(CONNECTION_RESPONSES_QUEUED_MAX);
    let output = Arc::new(Semaphore::new(CONNECTION_OUTPUT_BYTES_MAX));
    let writer_task = tokio::spawn(write_responses(writer, rx, limits.write_timeout));
    let in_flight = Arc::new(Semaphore::new(CONNECTION_REQUESTS_IN_FLIGHT_MAX));
    let mut frames = FrameReader::new(reader);
    let mut from: Option<NodeId> = None;
    // A frame read while gathering a batch of chain messages that is not one of them.
    let mut held: Option<Result<(u64, Message), ReadError>> = None;
    loop {
        let next = match held.take() {
            Some(frame) => frame.map(Some),
            None => tokio::select! {
                n = frames.next_within(limits.read) => n,
                _ = shutdown.changed() => break,
                // The writer gave up (the peer does not read): stop reading its requests.
                _ = tx.closed() => break,
            },
        };
        match next {
            Ok(Some((id, Message::Request(req)))) => {
                if let Err(refused) = auth::request(peer.as_ref(), &req) {
                    refuse_peer(id, refused, &tx, &output).await;
                    break;
                }
                let Ok(permit) = in_flight.clone().acquire_owned().await else { break };
                let charge = response_charge(&req) as u32;
                let charged = tokio::select! {
                    c = output.clone().acquire_many_owned(charge) => c,
                    _ = shutdown.changed() => break,
                    _ = tx.closed() => break,
                };
                let Ok(charged) = charged else { break };
                if let Request::Update { .. } = req {
                    // Every update already read is handed over as one batch.
                    let mut batch = vec![(id, req, permit, charged)];
                    while batch.len() < UPDATE_BATCH_REQUESTS_MAX {
                        match frames.buffered() {
                            Ok(Some((id, Message::Request(r @ Request::Update { .. }))))
                                if auth::request(peer.as_ref(), &r).is_ok() =>
                            {
                                match admit_now(&in_flight, &output, &r) {
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
                    tokio::spawn(answer_updates(handler.clone(), batch, tx.clone(), output.clone()));
                    continue;
                }
                let (handler, tx, output) = (handler.clone(), tx.clone(), output.clone());
                tokio::spawn(async move {
                    let resp = handler.request(req).await;
                    let _ = tx.send(output_frame(id, resp, charged, &output)).await;
                    drop(permit);
                });
            }
            Ok(Some((id, Message::Chain(ChainMsg::Hello { from: node, cluster })))) => {
                let hello = auth::hello(peer.as_ref(), node)
                    .and_then(|()| auth::same_cluster(cluster, handler.cluster_id()));
                if let Err(refused) = hello {
                    refuse_peer(id, refused, &tx, &output).await;
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
                let Ok(charged) = output.clone().acquire_many_owned(RESPONSE_CHARGE_BYTES as u32).await
                else {
                    break;
                };
                let _ = tx.send(output_frame(id, err, charged, &output)).await;
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
    request: &Request,
) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
    let permit = in_flight.clone().try_acquire_owned().ok()?;
    let charged = output.clone().try_acquire_many_owned(response_charge(request) as u32).ok()?;
    Some((permit, charged))
}

/// Hands updates that arrived together to the handler and queues each answer: the ready ones
/// at once, then the others in order (a batch's updates commit in order).
async fn answer_updates<H: Handler>(
    handler: Arc<H>,
    batch: Vec<(u64, Request, OwnedSemaphorePermit, OwnedSemaphorePermit)>,
    tx: mpsc::Sender<Output>,
    output: Arc<Semaphore>,
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
                let _ = tx.send(output_frame(id, resp, charged, &output)).await;
                drop(permit);
            }
            Answer::Later(answer) => later.push((id, answer, permit, charged)),
        }
    }
    for (id, answer, permit, charged) in later {
        let resp = answer.await;
        let _ = tx.send(output_frame(id, resp, charged, &output)).await;
        drop(permit);
    }
}

/// Logs a refused request or link and answers it with an error (the caller then closes).
async fn refuse_peer(id: u64, refused: auth::Refused, tx: &mpsc::Sender<Output>, output: &Arc<Semaphore>) {
    warn!(error = %refused, "native request refused; closing the connection");
    let err = Response::Error(WireError::Invalid(format!("refused: {refused}")));
    if let Ok(charged) = output.clone().try_acquire_many_owned(RESPONSE_CHARGE_BYTES as u32) {
        let _ = tx.send(output_frame(id, err, charged, output)).await;
    }
}

/// An encoded response and its share of the connection's output budget, returned once it is
/// written.
struct Output {
    frame: Vec<u8>,
    _charged: OwnedSemaphorePermit,
}

/// What a request's response may take of the output budget before it is handled.
fn response_charge(request: &Request) -> usize {
    match request {
        Request::Get { .. } => GET_RESPONSE_CHARGE_BYTES,
        _ => RESPONSE_CHARGE_BYTES,
    }
}

/// Encodes a response, settling its charge with its real size: the excess goes back at once;
/// a shortfall is taken if free, else the frame goes out over budget (waiting could deadlock
/// handlers that all hold part of the budget).
fn output_frame(
    id: u64,
    resp: Response,
    mut charged: OwnedSemaphorePermit,
    budget: &Arc<Semaphore>,
) -> Output {
    let mut frame = Vec::new();
    push_response(&mut frame, id, resp);
    let need = frame.len().min(CONNECTION_OUTPUT_BYTES_MAX);
    let held = charged.num_permits();
    if need < held {
        drop(charged.split(held - need));
    } else if let Ok(more) = budget.clone().try_acquire_many_owned((need - held) as u32) {
        charged.merge(more);
    }
    Output { frame, _charged: charged }
}

async fn write_responses(mut writer: NetWrite, mut rx: mpsc::Receiver<Output>, write_timeout: Duration) {
    let mut buf = Vec::new();
    // Held until their frames are written.
    let mut charges = Vec::new();
    while let Some(first) = rx.recv().await {
        buf.clear();
        buf.extend_from_slice(&first.frame);
        charges.push(first);
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
            Err(e) => {
                debug!(error = %e, ?write_timeout, "closing a native connection: writing to it failed or stalled");
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
