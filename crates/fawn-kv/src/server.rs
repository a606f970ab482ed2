//! The native-protocol server shape shared by every role: a listener with a bounded number of
//! connections, one reader and one writer task per connection, requests handled concurrently,
//! chain messages handled in arrival order, graceful shutdown.

use std::future::Future;
use std::sync::Arc;

use fawn_client::framed::{FrameReader, ReadError};
use fawn_proto::native::{
    encode_frame, ChainMsg, FrameError, Message, Request, Response, WireError, PROTOCOL_VERSION,
};
use fawn_ring::NodeId;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tracing::{debug, warn};

/// Connections one native listener serves at once; more wait in the accept backlog.
pub const NATIVE_CONNECTIONS_MAX: usize = 1024;
/// Responses queued per connection before request handlers wait.
pub const CONNECTION_RESPONSES_QUEUED_MAX: usize = 4096;
/// Requests in flight per connection before the reader stops reading (backpressure).
pub const CONNECTION_REQUESTS_IN_FLIGHT_MAX: usize = 4096;

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
}

/// Serves `handler` on `listener` until `shutdown` turns true.
pub async fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>, mut shutdown: watch::Receiver<bool>) {
    let permits = Arc::new(Semaphore::new(NATIVE_CONNECTIONS_MAX));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.changed() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                debug!(%peer, "native connection");
                let handler = handler.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    connection(stream, handler, shutdown).await;
                    drop(permit);
                });
            }
            Err(e) => {
                warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

async fn connection<H: Handler>(stream: TcpStream, handler: Arc<H>, mut shutdown: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let (reader, writer) = stream.into_split();
    let (tx, rx) = mpsc::channel::<(u64, Response)>(CONNECTION_RESPONSES_QUEUED_MAX);
    let writer_task = tokio::spawn(write_responses(writer, rx));
    let in_flight = Arc::new(Semaphore::new(CONNECTION_REQUESTS_IN_FLIGHT_MAX));
    let mut frames = FrameReader::new(reader);
    let mut from: Option<NodeId> = None;
    loop {
        let next = tokio::select! {
            n = frames.next() => n,
            _ = shutdown.changed() => break,
        };
        match next {
            Ok(Some((id, Message::Request(req)))) => {
                let Ok(permit) = in_flight.clone().acquire_owned().await else { break };
                let (handler, tx) = (handler.clone(), tx.clone());
                tokio::spawn(async move {
                    let resp = handler.request(req).await;
                    let _ = tx.send((id, resp)).await;
                    drop(permit);
                });
            }
            Ok(Some((_, Message::Chain(ChainMsg::Hello { from: node })))) => from = Some(node),
            Ok(Some((_, Message::Chain(msg)))) => match from {
                Some(node) => handler.clone().chain(node, msg).await,
                None => {
                    debug!("chain message before Hello; closing");
                    break;
                }
            },
            Ok(Some((id, Message::Response(_)))) => {
                let err = WireError::Invalid("unexpected response frame".into());
                let _ = tx.send((id, Response::Error(err))).await;
            }
            Ok(None) => break,
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

async fn write_responses(
    mut writer: tokio::net::tcp::OwnedWriteHalf,
    mut rx: mpsc::Receiver<(u64, Response)>,
) {
    let mut buf = Vec::new();
    while let Some((id, resp)) = rx.recv().await {
        buf.clear();
        push_response(&mut buf, id, resp);
        while buf.len() < 64 * 1024 {
            match rx.try_recv() {
                Ok((id, resp)) => push_response(&mut buf, id, resp),
                Err(_) => break,
            }
        }
        if writer.write_all(&buf).await.is_err() {
            return;
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
