//! Unit tests of chain links: the outbox's frame accounting and corked sends.
use super::*;

use fawn_proto::native::{decode_frame, ReplEffect, SnapshotItem};
use fawn_ring::Range;
use tokio::net::{TcpListener, TcpStream};

fn ack(seq: u64) -> ChainMsg {
    ChainMsg::Ack { epoch: 1, range: Range::full(), seq }
}

/// A message of about `bytes` bytes.
fn batch(index: u64, bytes: usize) -> ChainMsg {
    let effect = ReplEffect::Put { value: vec![7; bytes], flags: 0, expiry: 0, state: 0 };
    let records = vec![SnapshotItem { seq: index, key: b"k".to_vec(), effect }];
    ChainMsg::SnapshotBatch { range: Range::full(), snapshot: 1, index, records }
}

fn frame(msg: ChainMsg) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(0, &Message::Chain(msg), &mut out).expect("encode");
    out
}

/// The chain messages of the whole frames at the front of `bytes`, and the bytes left.
fn decode_all(mut bytes: &[u8]) -> (Vec<ChainMsg>, usize) {
    let mut msgs = Vec::new();
    while let Ok(Some((_, msg, used))) = decode_frame(bytes) {
        match msg {
            Message::Chain(m) => msgs.push(m),
            other => panic!("not a chain message: {other:?}"),
        }
        bytes = &bytes[used..];
    }
    (msgs, bytes.len())
}

#[test]
fn written_frames_counts_the_frames_a_write_ends() {
    let one = frame(ack(1)).len();
    let buf: Vec<u8> = (1..=3).flat_map(|s| frame(ack(s))).collect();
    assert_eq!(written_frames(&buf, 0, 0), (0, 0));
    assert_eq!(written_frames(&buf, 0, 1), (0, one - 1));
    assert_eq!(written_frames(&buf, 0, one), (1, 0));
    assert_eq!(written_frames(&buf, 0, one + 2), (1, one - 2));
    assert_eq!(written_frames(&buf, 0, 3 * one), (3, 0));
    // The first 5 bytes end a frame begun before.
    let begun: Vec<u8> = [vec![0; 5], buf.clone()].concat();
    assert_eq!(written_frames(&begun, 5, 3), (0, 2));
    assert_eq!(written_frames(&begun, 5, 5), (1, 0));
    assert_eq!(written_frames(&begun, 5, 5 + one + 1), (2, one - 1));
}

/// A connected socket pair: the outbox's end, and the peer's (never read unless asked).
async fn pair() -> (Arc<OwnedWriteHalf>, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (mine, theirs) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let (_, write) = mine.expect("connect").into_split();
    (Arc::new(write), theirs.expect("accept").0)
}

#[tokio::test]
async fn a_frame_half_written_when_the_connection_breaks_is_dropped() {
    // A sender's write that the socket takes only part of leaves the rest of a frame in the
    // outbox. If that connection breaks, the rest must go: the next connection has to start
    // at a frame, or the peer reads garbage.
    let outbox = Outbox::new();
    let (socket, _peer) = pair().await;
    outbox.connected(Some(socket));
    let mut pushed = 0;
    loop {
        outbox.push(batch(pushed, 65_537)).expect("room");
        pushed += 1;
        outbox.flush();
        let st = outbox.state.lock();
        if st.begun > 0 {
            break;
        }
        assert!(st.buf.is_empty(), "the socket filled up exactly at a frame's end: nothing to test");
    }
    for i in 0..3 {
        outbox.push(batch(pushed + i, 100)).expect("room");
    }
    outbox.disconnected();
    let st = outbox.state.lock();
    let (msgs, left) = decode_all(&st.buf);
    assert_eq!(left, 0, "the outbox holds whole frames only");
    assert_eq!(msgs.len(), st.frames, "every frame it holds is counted");
    assert!(msgs.len() >= 3);
}

/// A back-end at a fixed address for one link.
struct Owner(String);

impl LinkOwner for Owner {
    fn peer_addr(&self, _: NodeId) -> Option<String> {
        Some(self.0.clone())
    }
    fn node_id(&self) -> NodeId {
        1
    }
    fn cluster_id(&self) -> u64 {
        0
    }
    async fn on_connected(&self, _: NodeId) -> Vec<ChainMsg> {
        Vec::new()
    }
}

/// Reads frames from `peer` until `n` chain messages arrived, or nothing for `quiet`.
async fn read_msgs(peer: &mut TcpStream, n: usize, quiet: Duration) -> Vec<ChainMsg> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let (msgs, _) = decode_all(&bytes);
        if msgs.len() >= n {
            return msgs;
        }
        match tokio::time::timeout(quiet, peer.read(&mut chunk)).await {
            Ok(Ok(k)) if k > 0 => bytes.extend_from_slice(&chunk[..k]),
            _ => return msgs,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corked_sends_are_written_in_order_when_the_batch_ends() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let owner = Arc::new(Owner(listener.local_addr().expect("addr").to_string()));
    let links = Links::default();
    let outbox = links.to(&owner, 2);
    let (mut peer, _) = listener.accept().await.expect("accept");
    let hello = read_msgs(&mut peer, 1, Duration::from_secs(5)).await;
    assert!(matches!(hello[..], [ChainMsg::Hello { from: 1, .. }]), "{hello:?}");
    let corked = LinkSender::Outbox { outbox: outbox.clone(), corked: true };
    for seq in 0..100 {
        corked.try_send(ack(seq)).expect("room");
    }
    let early = read_msgs(&mut peer, 1, Duration::from_millis(200)).await;
    assert!(early.is_empty(), "a corked send was written before its batch ended");
    outbox.flush();
    let msgs = read_msgs(&mut peer, 100, Duration::from_secs(5)).await;
    let seqs: Vec<u64> = msgs
        .iter()
        .map(|m| match m {
            ChainMsg::Ack { seq, .. } => *seq,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(seqs, (0..100).collect::<Vec<_>>());
    // Sent alone, a message is written by the link's task at once.
    LinkSender::from(outbox).try_send(ack(100)).expect("room");
    let alone = read_msgs(&mut peer, 1, Duration::from_secs(5)).await;
    assert!(matches!(alone[..], [ChainMsg::Ack { seq: 100, .. }]), "{alone:?}");
}
