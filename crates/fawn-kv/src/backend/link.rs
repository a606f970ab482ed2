//! Outbound chain links: one connection (plain or TLS) per peer back-end, carrying chain messages in
//! order, reconnecting (and resending what is unacknowledged) when it breaks.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use fawn_client::transport::{self, NetStream};
use fawn_proto::native::{encode_frame, ChainMsg, Message};
use fawn_ring::NodeId;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tracing::{debug, info};

/// Chain messages queued per link. A replica never waits for room under its range lock: what
/// does not fit is held back in its unacknowledged list or asked for again (`range::queue`);
/// snapshot streams, sent outside the lock, wait.
pub const LINK_QUEUE_MESSAGES_MAX: usize = 8192;
/// Pause between reconnection attempts.
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);
/// Bytes coalesced into one write.
const LINK_BATCH_BYTES: usize = 256 * 1024;

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

/// The links of one back-end.
#[derive(Default)]
pub struct Links {
    senders: Mutex<HashMap<NodeId, mpsc::Sender<ChainMsg>>>,
}

impl Links {
    /// Messages queued on all links.
    pub fn queued(&self) -> u64 {
        self.senders.lock().values().map(|tx| (tx.max_capacity() - tx.capacity()) as u64).sum()
    }

    /// The queue of the link to `peer`, starting its task on first use.
    pub fn to<O: LinkOwner>(&self, owner: &Arc<O>, peer: NodeId) -> mpsc::Sender<ChainMsg> {
        let mut senders = self.senders.lock();
        if let Some(tx) = senders.get(&peer) {
            if !tx.is_closed() {
                return tx.clone();
            }
        }
        let (tx, rx) = mpsc::channel(LINK_QUEUE_MESSAGES_MAX);
        tokio::spawn(run_link(Arc::downgrade(owner), peer, rx));
        senders.insert(peer, tx.clone());
        tx
    }
}

async fn run_link<O: LinkOwner>(owner: Weak<O>, peer: NodeId, mut rx: mpsc::Receiver<ChainMsg>) {
    loop {
        let Some(stream) = connect(&owner, peer).await else { return };
        let Some(o) = owner.upgrade() else { return };
        let mut first = vec![ChainMsg::Hello { from: o.node_id(), cluster: o.cluster_id() }];
        first.extend(o.on_connected(peer).await);
        drop(o);
        info!(peer, resent = first.len() - 1, "chain link up");
        match pump(stream, first, &mut rx).await {
            Pump::QueueClosed => return,
            Pump::WriteFailed => {
                debug!(peer, "chain link down");
                tokio::time::sleep(RECONNECT_PAUSE).await;
            }
        }
    }
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
    QueueClosed,
    WriteFailed,
}

async fn pump(stream: NetStream, first: Vec<ChainMsg>, rx: &mut mpsc::Receiver<ChainMsg>) -> Pump {
    let (mut reader, mut stream) = stream.into_split();
    let mut buf = Vec::new();
    for msg in first {
        push(&mut buf, msg);
    }
    if stream.write_all(&buf).await.is_err() {
        return Pump::WriteFailed;
    }
    // The peer never writes on a link; a readable socket means it closed or died, and writes
    // into a dead peer's socket buffer would otherwise look successful.
    let mut probe = [0u8; 64];
    loop {
        let msg = tokio::select! {
            m = rx.recv() => m,
            _ = reader.read(&mut probe) => return Pump::WriteFailed,
        };
        let Some(msg) = msg else { return Pump::QueueClosed };
        buf.clear();
        push(&mut buf, msg);
        while buf.len() < LINK_BATCH_BYTES {
            match rx.try_recv() {
                Ok(m) => push(&mut buf, m),
                Err(_) => break,
            }
        }
        if stream.write_all(&buf).await.is_err() {
            // The messages in `buf` stay in their senders' unacked lists and are resent.
            return Pump::WriteFailed;
        }
    }
}

fn push(buf: &mut Vec<u8>, msg: ChainMsg) {
    // Chain messages are bounded by the key and value limits, far below the frame limit.
    let _ = encode_frame(0, &Message::Chain(msg), buf);
}
