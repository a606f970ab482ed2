//! A multiplexed native-protocol connection: many requests in flight, answered by id.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::framed::FrameReader;
use crate::transport::{self, NetRead, NetWrite};
use fawn_proto::native::{encode_frame, Message, Request, Response};
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

/// Frames queued for the writer task of one connection.
pub const CONNECTION_QUEUE_FRAMES_MAX: usize = 1024;
/// A writer coalesces queued frames up to this many bytes per write.
const WRITE_BATCH_BYTES: usize = 64 * 1024;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    #[error("connect to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("connection to {0} closed")]
    Closed(String),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("protocol: {0}")]
    Protocol(String),
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Response>>>>;

/// One connection (plain or TLS, see [`transport`]) with a writer task and a reader task.
pub struct Connection {
    addr: String,
    next_id: AtomicU64,
    pending: Pending,
    outbox: mpsc::Sender<Vec<u8>>,
    alive: Arc<AtomicBool>,
}

impl Connection {
    /// Connects within `timeout` (TCP and, under TLS, the handshake).
    pub async fn connect(addr: &str, timeout: Duration) -> Result<Arc<Connection>, RpcError> {
        let connect_err = |reason: String| RpcError::Connect { addr: addr.to_string(), reason };
        let stream =
            transport::current().connect(addr, timeout).await.map_err(|e| connect_err(e.to_string()))?;
        let (reader, writer) = stream.into_split();
        let (outbox, rx) = mpsc::channel(CONNECTION_QUEUE_FRAMES_MAX);
        let pending: Pending = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        tokio::spawn(write_loop(writer, rx, alive.clone()));
        tokio::spawn(read_loop(reader, pending.clone(), alive.clone()));
        Ok(Arc::new(Connection {
            addr: addr.to_string(),
            next_id: AtomicU64::new(1),
            pending,
            outbox,
            alive,
        }))
    }

    /// The peer address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// False once either direction failed; callers reconnect.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    /// Sends `request` and waits for its response.
    pub async fn call(&self, request: Request, timeout: Duration) -> Result<Response, RpcError> {
        if !self.is_alive() {
            return Err(RpcError::Closed(self.addr.clone()));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::new();
        encode_frame(id, &Message::Request(request), &mut frame)
            .map_err(|e| RpcError::Protocol(e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(id, tx);
        // A caller may stop waiting (drop this future), e.g. for an update whose answer came
        // another way: its entry must not stay behind for a response that never comes.
        let mut forget = Forget { pending: &self.pending, id, armed: true };
        let result = tokio::time::timeout(timeout, async {
            self.outbox.send(frame).await.map_err(|_| RpcError::Closed(self.addr.clone()))?;
            rx.await.map_err(|_| RpcError::Closed(self.addr.clone()))
        })
        .await;
        match result {
            Ok(Ok(resp)) => {
                // The reader took the entry out.
                forget.armed = false;
                Ok(resp)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RpcError::Timeout(timeout)),
        }
    }
}

/// A one-way request (answered by nothing: `Request::is_one_way`), encoded once, for
/// [`Connection::send_now`] or [`Connection::send`]. Its frame's id is 0: no response names it.
pub struct OneWay(Vec<u8>);

impl OneWay {
    pub fn new(request: Request) -> Result<OneWay, RpcError> {
        debug_assert!(request.is_one_way());
        let mut frame = Vec::new();
        encode_frame(0, &Message::Request(request), &mut frame)
            .map_err(|e| RpcError::Protocol(e.to_string()))?;
        Ok(OneWay(frame))
    }
}

impl Connection {
    /// Queues `msg` if the writer has room now: no pending entry, no timer, no task. Hands
    /// it back if the connection is closed or its queue full.
    pub fn send_now(&self, msg: OneWay) -> Result<(), OneWay> {
        if !self.is_alive() {
            return Err(msg);
        }
        self.outbox.try_send(msg.0).map_err(|e| OneWay(e.into_inner()))
    }

    /// Queues `msg`, waiting up to `timeout` for room in the writer's queue.
    pub async fn send(&self, msg: OneWay, timeout: Duration) -> Result<(), RpcError> {
        if !self.is_alive() {
            return Err(RpcError::Closed(self.addr.clone()));
        }
        match tokio::time::timeout(timeout, self.outbox.send(msg.0)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(RpcError::Closed(self.addr.clone())),
            Err(_) => Err(RpcError::Timeout(timeout)),
        }
    }
}

/// Removes a call's entry from the pending map when the call ends without its response.
struct Forget<'a> {
    pending: &'a Pending,
    id: u64,
    armed: bool,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.pending.lock().remove(&self.id);
        }
    }
}

async fn write_loop(mut writer: NetWrite, mut rx: mpsc::Receiver<Vec<u8>>, alive: Arc<AtomicBool>) {
    let mut batch = Vec::new();
    while let Some(frame) = rx.recv().await {
        batch.clear();
        batch.extend_from_slice(&frame);
        if rx.is_empty() {
            // Woken by the first call, this task would write its frame alone before the other
            // calls that are ready to run queue theirs: let them run first, so that concurrent
            // calls share one write (a yield costs less than a send per frame).
            tokio::task::yield_now().await;
        }
        // Coalesce whatever else is queued into one write: pipelining without extra syscalls.
        while let Ok(more) = rx.try_recv() {
            batch.extend_from_slice(&more);
            if batch.len() > WRITE_BATCH_BYTES {
                break;
            }
        }
        if writer.write_all(&batch).await.is_err() {
            break;
        }
    }
    alive.store(false, Ordering::Relaxed);
}

async fn read_loop(reader: NetRead, pending: Pending, alive: Arc<AtomicBool>) {
    let mut frames = FrameReader::new(reader);
    while let Ok(Some((id, Message::Response(resp)))) = frames.next().await {
        if let Some(tx) = pending.lock().remove(&id) {
            let _ = tx.send(resp);
        }
    }
    alive.store(false, Ordering::Relaxed);
    // Dropping the senders wakes every waiter with "closed".
    pending.lock().clear();
}
