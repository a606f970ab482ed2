//! Outbound chain links: one connection (plain or TLS) per peer back-end, carrying chain messages in
//! order, reconnecting (and resending what is unacknowledged) when it breaks.
//!
//! A message sent on a link is encoded at once, in send order, into the link's outbox. The link's
//! task writes what the outbox holds. A sender in a batch (`LinkSender::Outbox` with `corked`: the
//! back-end handling one batch of incoming frames, every range's steps of it) does not wake the
//! task: when the batch ends, it writes the outbox into the socket itself (`Outbox::flush`), so
//! each peer gets the messages of a whole batch in one `write` and no task wakes up. A socket
//! write costs more than a wake-up on loopback; one per message would cost more than it saves. A
//! sender writes only while the task is not writing, on a plain connection that is up, and only
//! what the socket takes now: the rest is left to the task, so a slow peer never holds it.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Weak};
use std::time::Duration;

use fawn_client::transport::{self, NetStream, NetWrite};
use fawn_proto::native::{encode_frame, ChainMsg, Message};
use fawn_ring::NodeId;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc::error::{SendError, TrySendError};
use tokio::sync::{mpsc, Notify};
use tracing::{debug, info};

/// Chain messages queued per link. A replica never waits for room under its range lock: what
/// does not fit is held back in its unacknowledged list or asked for again (`range::queue`);
/// snapshot streams, sent outside the lock, wait.
pub const LINK_QUEUE_MESSAGES_MAX: usize = 8192;
/// Pause between reconnection attempts.
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);
/// Bytes a batch gathers in an outbox before writing them without waiting for its end.
const LINK_BATCH_BYTES: usize = 256 * 1024;
/// Bytes of a native frame's length prefix (the length of the rest of the frame).
const FRAME_LENGTH_BYTES: usize = 4;

/// What a link needs from its back-end.
pub trait LinkOwner: Send + Sync + 'static {
    /// The current address of `peer`, if known.
    fn peer_addr(&self, peer: NodeId) -> Option<String>;
    /// This node's id (sent in the Hello).
    fn node_id(&self) -> NodeId;
    /// This node's cluster id (sent in the Hello).
    fn cluster_id(&self) -> u64;
    /// Messages to send first on a fresh connection: unacked updates for ranges whose
    /// successor is `peer`, the latest acks for ranges whose predecessor is `peer`.
    fn on_connected(&self, peer: NodeId) -> impl std::future::Future<Output = Vec<ChainMsg>> + Send;
}

/// The sending end of a link: messages go out in the order they are sent.
#[derive(Clone)]
pub enum LinkSender {
    /// A back-end's link. `corked`: `try_send` leaves the write to the end of the sender's
    /// batch (`Outbox::flush`), else the link's task is woken to write.
    Outbox { outbox: Arc<Outbox>, corked: bool },
    /// A plain queue: a test's wire, or a closed one (the back-end is shutting down).
    Queue(mpsc::Sender<ChainMsg>),
}

impl From<Arc<Outbox>> for LinkSender {
    /// A sender that wakes the link's task for every message.
    fn from(outbox: Arc<Outbox>) -> LinkSender {
        LinkSender::Outbox { outbox, corked: false }
    }
}

impl LinkSender {
    /// Sends `msg` if there is room for it now; hands it back if the link is full or gone.
    pub fn try_send(&self, msg: ChainMsg) -> Result<(), TrySendError<ChainMsg>> {
        match self {
            LinkSender::Queue(queue) => queue.try_send(msg),
            LinkSender::Outbox { outbox, corked } => {
                let bytes = outbox.push(msg)?;
                if !corked {
                    outbox.wake.notify_one();
                } else if bytes >= LINK_BATCH_BYTES {
                    outbox.flush();
                }
                Ok(())
            }
        }
    }

    /// Sends `msg`, waiting for room. Never corked: streams send outside any batch.
    pub async fn send(&self, msg: ChainMsg) -> Result<(), SendError<ChainMsg>> {
        match self {
            LinkSender::Queue(queue) => queue.send(msg).await,
            LinkSender::Outbox { outbox, .. } => outbox.push_waiting(msg).await,
        }
    }

    /// Whether a message sent now would fit.
    pub fn has_room(&self) -> bool {
        match self {
            LinkSender::Queue(queue) => queue.capacity() > 0,
            LinkSender::Outbox { outbox, .. } => outbox.has_room(),
        }
    }
}

/// The messages of one link not yet written, encoded in order, shared by its senders and its
/// task.
pub struct Outbox {
    state: Mutex<OutboxState>,
    /// Wakes the link's task: bytes to write, or the link is closed.
    wake: Notify,
    /// Wakes senders waiting for room.
    room: Notify,
}

#[derive(Default)]
struct OutboxState {
    /// Encoded frames, in send order, that no one has written or taken yet.
    buf: Vec<u8>,
    /// Frames in `buf`, one a sender began to write included (the link's bound).
    frames: usize,
    /// Bytes at the front of `buf` that end a frame a sender began to write on the current
    /// connection: dropped if it breaks (a new connection must start at a frame).
    begun: usize,
    /// The plain connection's socket, once its opening messages are written: senders may
    /// write into it.
    socket: Option<Arc<OwnedWriteHalf>>,
    /// The task is writing what it took: a sender writing now would overtake it.
    writing: bool,
    /// The link's task is gone (the back-end is shutting down).
    closed: bool,
}

impl OutboxState {
    /// Drops the first `n` bytes of `buf`, written; whether a frame ended among them.
    fn consume(&mut self, n: usize) -> bool {
        if n == 0 {
            return false;
        }
        if n >= self.buf.len() {
            self.buf.clear();
            self.frames = 0;
            self.begun = 0;
            return true;
        }
        let (ended, begun) = written_frames(&self.buf, self.begun, n);
        self.buf.drain(..n);
        debug_assert!(ended <= self.frames, "an outbox counts every frame it holds");
        self.frames = self.frames.saturating_sub(ended);
        self.begun = begun;
        ended > 0
    }
}

/// Of the first `n` bytes of `buf` (frames, the first `begun` bytes ending one begun
/// before), written: how many frames they end, and how many bytes are left of a frame they
/// begin.
fn written_frames(buf: &[u8], begun: usize, n: usize) -> (usize, usize) {
    if n < begun {
        return (0, begun - n);
    }
    let (mut at, mut ended) = (begun, usize::from(begun > 0));
    while at < n {
        let Some(len) = buf.get(at..at + FRAME_LENGTH_BYTES) else {
            debug_assert!(false, "an outbox holds whole frames");
            return (ended, 0);
        };
        let end = at + FRAME_LENGTH_BYTES + u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if end > n {
            return (ended, end - n);
        }
        ended += 1;
        at = end;
    }
    (ended, 0)
}

impl Outbox {
    fn new() -> Outbox {
        Outbox { state: Mutex::default(), wake: Notify::new(), room: Notify::new() }
    }

    /// Encodes `msg` at the end of the outbox unless it is full or closed; the bytes it holds.
    fn push(&self, msg: ChainMsg) -> Result<usize, TrySendError<ChainMsg>> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(TrySendError::Closed(msg));
        }
        if st.frames >= LINK_QUEUE_MESSAGES_MAX {
            return Err(TrySendError::Full(msg));
        }
        // Chain messages are bounded by the key and value limits, far below the frame limit.
        if encode_frame(0, &Message::Chain(msg), &mut st.buf).is_ok() {
            st.frames += 1;
        }
        Ok(st.buf.len())
    }

    /// `push`, waiting for room; the task writes it.
    async fn push_waiting(&self, mut msg: ChainMsg) -> Result<(), SendError<ChainMsg>> {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            match self.push(msg) {
                Ok(_) => {
                    self.wake.notify_one();
                    return Ok(());
                }
                Err(TrySendError::Closed(m)) => return Err(SendError(m)),
                Err(TrySendError::Full(m)) => msg = m,
            }
            room.await;
        }
    }

    fn has_room(&self) -> bool {
        let st = self.state.lock();
        !st.closed && st.frames < LINK_QUEUE_MESSAGES_MAX
    }

    fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    fn queued(&self) -> usize {
        self.state.lock().frames
    }

    /// Writes what the outbox holds into the socket now, if the task is not writing, the
    /// connection is up and plain, and the socket takes bytes; leaves the rest to the task.
    pub fn flush(&self) {
        let mut st = self.state.lock();
        // The task writes what is here once it has written what it took.
        if st.buf.is_empty() || st.writing {
            return;
        }
        let Some(socket) = st.socket.clone() else {
            drop(st);
            self.wake.notify_one();
            return;
        };
        let written = match socket.try_write(&st.buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => {
                // The task finds the connection broken too, and reconnects.
                debug!(error = %e, "chain link write failed");
                0
            }
        };
        let freed = st.consume(written);
        let rest = !st.buf.is_empty();
        drop(st);
        if rest {
            self.wake.notify_one();
        }
        if freed {
            self.room.notify_waiters();
        }
    }

    /// The task takes everything the outbox holds into `out` (emptied first) and writes it;
    /// `None`: the link is closed.
    fn take(&self, out: &mut Vec<u8>) -> Option<()> {
        let mut st = self.state.lock();
        if st.closed {
            return None;
        }
        out.clear();
        if st.buf.is_empty() {
            return Some(());
        }
        std::mem::swap(&mut st.buf, out);
        st.frames = 0;
        st.begun = 0;
        st.writing = true;
        drop(st);
        self.room.notify_waiters();
        Some(())
    }

    /// The task wrote what it took.
    fn written(&self) {
        self.state.lock().writing = false;
    }

    /// A connection is up (its opening messages written): senders may write into `socket`.
    fn connected(&self, socket: Option<Arc<OwnedWriteHalf>>) {
        self.state.lock().socket = socket;
    }

    /// The connection broke: what a sender left of a frame begun on it goes with it (its
    /// message is resent from the unacknowledged lists, as those the task was writing).
    fn disconnected(&self) {
        let mut st = self.state.lock();
        st.socket = None;
        st.writing = false;
        let begun = std::mem::take(&mut st.begun);
        if begun > 0 {
            st.buf.drain(..begun);
            st.frames = st.frames.saturating_sub(1);
        }
    }

    /// The link is gone: senders get their messages back, the task stops.
    fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        st.socket = None;
        drop(st);
        self.wake.notify_one();
        self.room.notify_waiters();
    }
}

/// The links of one back-end.
#[derive(Default)]
pub struct Links {
    outboxes: Mutex<HashMap<NodeId, Arc<Outbox>>>,
}

impl Drop for Links {
    fn drop(&mut self) {
        self.outboxes.get_mut().values().for_each(|o| o.close());
    }
}

impl Links {
    /// Messages queued on all links.
    pub fn queued(&self) -> u64 {
        self.outboxes.lock().values().map(|o| o.queued() as u64).sum()
    }

    /// The outbox of the link to `peer`, starting its task on first use.
    pub fn to<O: LinkOwner>(&self, owner: &Arc<O>, peer: NodeId) -> Arc<Outbox> {
        let mut outboxes = self.outboxes.lock();
        if let Some(outbox) = outboxes.get(&peer) {
            if !outbox.is_closed() {
                return outbox.clone();
            }
        }
        let outbox = Arc::new(Outbox::new());
        tokio::spawn(run_link(Arc::downgrade(owner), peer, outbox.clone()));
        outboxes.insert(peer, outbox.clone());
        outbox
    }
}

async fn run_link<O: LinkOwner>(owner: Weak<O>, peer: NodeId, outbox: Arc<Outbox>) {
    loop {
        let Some(stream) = connect(&owner, peer).await else { break };
        let Some(o) = owner.upgrade() else { break };
        let mut first = vec![ChainMsg::Hello { from: o.node_id(), cluster: o.cluster_id() }];
        first.extend(o.on_connected(peer).await);
        drop(o);
        info!(peer, resent = first.len() - 1, "chain link up");
        let pumped = pump(stream, first, &outbox).await;
        outbox.disconnected();
        match pumped {
            Pump::Closed => return,
            Pump::WriteFailed => {
                debug!(peer, "chain link down");
                tokio::time::sleep(RECONNECT_PAUSE).await;
            }
        }
    }
    outbox.close();
}

async fn connect<O: LinkOwner>(owner: &Weak<O>, peer: NodeId) -> Option<NetStream> {
    loop {
        let addr = owner.upgrade()?.peer_addr(peer);
        if let Some(addr) = addr {
            match transport::current().connect(&addr, Duration::from_secs(1)).await {
                Ok(s) => return Some(s),
                Err(e) => debug!(peer, %addr, error = %e, "chain link connect failed"),
            }
        }
        tokio::time::sleep(RECONNECT_PAUSE).await;
    }
}

enum Pump {
    Closed,
    WriteFailed,
}

/// The task's end of a connection: plain (shared with the senders that write into it) or TLS.
enum Writer {
    Plain(Arc<OwnedWriteHalf>),
    Tls(NetWrite),
}

impl Writer {
    async fn write_all(&mut self, mut buf: &[u8]) -> io::Result<()> {
        match self {
            Writer::Tls(w) => w.write_all(buf).await,
            Writer::Plain(socket) => {
                while !buf.is_empty() {
                    socket.writable().await?;
                    match socket.try_write(buf) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => buf = &buf[n..],
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
        }
    }
}

async fn pump(stream: NetStream, first: Vec<ChainMsg>, outbox: &Outbox) -> Pump {
    let (mut reader, writer) = stream.into_split();
    let mut writer = match writer {
        NetWrite::Plain(w) => Writer::Plain(Arc::new(w)),
        tls => Writer::Tls(tls),
    };
    let mut out = Vec::new();
    for msg in first {
        // Chain messages are bounded by the key and value limits, far below the frame limit.
        let _ = encode_frame(0, &Message::Chain(msg), &mut out);
    }
    if writer.write_all(&out).await.is_err() {
        return Pump::WriteFailed;
    }
    // From here on senders may write into the socket themselves (after what the outbox held
    // while the link was down: they write from its front).
    outbox.connected(match &writer {
        Writer::Plain(socket) => Some(socket.clone()),
        Writer::Tls(_) => None,
    });
    // The peer never writes on a link; a readable socket means it closed or died, and writes
    // into a dead peer's socket buffer would otherwise look successful.
    let mut probe = [0u8; 64];
    loop {
        let woken = outbox.wake.notified();
        if outbox.take(&mut out).is_none() {
            return Pump::Closed;
        }
        if !out.is_empty() {
            let written = writer.write_all(&out).await;
            outbox.written();
            if written.is_err() {
                // What it held stays in its senders' unacked lists and is resent.
                return Pump::WriteFailed;
            }
            continue;
        }
        tokio::select! {
            biased;
            () = woken => {}
            _ = reader.read(&mut probe) => return Pump::WriteFailed,
        }
    }
}

#[cfg(test)]
mod tests;
