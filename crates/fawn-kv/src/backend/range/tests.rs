//! Unit tests of the range shell.
use super::*;
use std::time::Instant;

use fawn_ds::Meta;
use fawn_proto::native::{Epoch, Origin, RangeConfig, ReplEffect, SnapshotItem};
use fawn_proto::op::Mutation;

use crate::replica::machine::UNACKED_UPDATES_MAX;
use crate::replica::sync::CopyEnd;

/// Request `req` with the client's `floor`, routed by a configuration no older than any here.
fn client(req: ReqId, floor: u64) -> ClientReq {
    ClientReq { req, floor, epoch: Epoch::MAX }
}

/// The end of stream `snapshot` of `batches` batches up to `upto_seq`, from a source that
/// dropped nothing.
fn end(snapshot: u64, batches: u64, upto_seq: u64) -> CopyEnd {
    CopyEnd { snapshot, batches, upto_seq, dropped_seq_max: 0 }
}

type Wire = (mpsc::Sender<ChainMsg>, mpsc::Receiver<ChainMsg>);

/// Links that keep what is sent, per peer, and the `Committed` requests (front-end, their
/// requests).
#[derive(Default)]
struct Wires(Mutex<HashMap<NodeId, Wire>>, Mutex<Vec<(String, Vec<ReqId>)>>);

impl LinkTo for Wires {
    fn link(&self, peer: NodeId) -> mpsc::Sender<ChainMsg> {
        self.0.lock().entry(peer).or_insert_with(|| mpsc::channel(1024)).0.clone()
    }
    fn committed(&self, reply_to: &str, notices: Vec<CommittedNotice>) {
        self.1.lock().push((reply_to.to_string(), notices.iter().map(|n| n.req).collect()));
    }
}

impl Wires {
    fn sent(&self, peer: NodeId) -> Vec<ChainMsg> {
        let mut wires = self.0.lock();
        let mut out = Vec::new();
        if let Some((_, rx)) = wires.get_mut(&peer) {
            while let Ok(m) = rx.try_recv() {
                out.push(m);
            }
        }
        out
    }
}

fn route(epoch: Epoch, me: NodeId, chain: &[NodeId], syncing: &[NodeId]) -> Route {
    Route {
        epoch,
        me,
        rc: RangeConfig { syncing: syncing.to_vec(), ..RangeConfig::new(Range::full(), chain.to_vec()) },
    }
}

fn replica(dir: &std::path::Path, route: Route) -> RangeReplica {
    let store = DataStore::open(dir, fawn_ds::Options::default()).expect("open store");
    RangeReplica::new(store, route, false)
}

fn put(key: &str, seq: u64, value: &str) -> SnapshotItem {
    let effect = ReplEffect::Put { value: value.as_bytes().to_vec(), flags: 0, expiry: 0, state: 0 };
    SnapshotItem { seq, key: key.as_bytes().to_vec(), effect }
}

fn value(r: &RangeReplica, key: &str) -> Option<String> {
    r.read(key.as_bytes(), 0).expect("read").map(|i| String::from_utf8(i.value).expect("utf-8"))
}

fn set(n: u64) -> Update {
    Update {
        key: format!("k{}", n % 1000).into_bytes(),
        mutation: Mutation::Set,
        value: vec![b'v'; 2000],
        flags: 0,
        expiry: 0,
    }
}

fn resend(after_seq: u64) -> ChainMsg {
    ChainMsg::Resend { epoch: 5, range: Range::full(), after_seq }
}

fn req(n: u64) -> ReqId {
    ReqId { client: 7, seq: n }
}

/// Real chain links (`link::Links`, TCP) from node 1 to peers at fixed addresses.
struct RealLinks {
    links: crate::backend::link::Links,
    addrs: HashMap<NodeId, String>,
    me: std::sync::Weak<RealLinks>,
}

impl crate::backend::link::LinkOwner for RealLinks {
    fn peer_addr(&self, peer: NodeId) -> Option<String> {
        self.addrs.get(&peer).cloned()
    }
    fn node_id(&self) -> NodeId {
        1
    }
    fn cluster_id(&self) -> u64 {
        0
    }
    async fn on_connected(&self, _peer: NodeId) -> Vec<ChainMsg> {
        Vec::new()
    }
}

impl LinkTo for RealLinks {
    fn link(&self, peer: NodeId) -> mpsc::Sender<ChainMsg> {
        match self.me.upgrade() {
            Some(me) => self.links.to(&me, peer),
            None => mpsc::channel(1).0,
        }
    }
    fn committed(&self, _: &str, _: Vec<CommittedNotice>) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_link_to_a_cut_off_successor_does_not_hold_the_range_lock() {
    // Node 1 heads [1, 2]; node 2 accepts the chain connection and never reads, as a
    // successor behind a cut link does once the socket buffers are full. Under put load
    // the link's queue fills. The manager's repair (here: node 1 alone) must install at
    // once. It used to wait: the put that found the queue full waited for room while
    // holding the range lock, for as long as the cut lasted.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let net = Arc::new_cyclic(|me| RealLinks {
        links: crate::backend::link::Links::default(),
        addrs: HashMap::from([(2, addr)]),
        me: me.clone(),
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let head = Arc::new(replica(dir.path(), route(5, 1, &[1, 2], &[])));
    let stop = Arc::new(AtomicBool::new(false));
    // Set when the head refuses puts for its backlog (UNACKED_UPDATES_MAX): that bound may
    // be reached before the queue fills, when the socket buffers hold many updates.
    let refused = Arc::new(AtomicBool::new(false));
    let putter = {
        let (head, net, stop, refused) =
            (Arc::clone(&head), Arc::clone(&net), Arc::clone(&stop), Arc::clone(&refused));
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match head.order_update(client(req(n), 0), &set(n), None, 0, &*net).await {
                    Ok(_) => n += 1,
                    Err(WireError::Unavailable(_)) => {
                        refused.store(true, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err(e) => panic!("order: {e}"),
                }
                if n.is_multiple_of(256) {
                    tokio::task::yield_now().await;
                }
            }
            n
        })
    };
    let full = crate::backend::link::LINK_QUEUE_MESSAGES_MAX as u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while net.links.queued() < full && !refused.load(Ordering::Relaxed) {
        assert!(Instant::now() < deadline, "the link's queue never filled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::Relaxed);
    let repair = head.install(route(6, 1, &[1], &[]), &*net);
    assert!(
        tokio::time::timeout(Duration::from_secs(5), repair).await.is_ok(),
        "installing the repaired chain waited behind a put blocked on the full link (range lock held)"
    );
    let ordered = tokio::time::timeout(Duration::from_secs(5), putter)
        .await
        .expect("the putter is still blocked")
        .expect("putter");
    // Nothing was lost: alone in the chain, node 1 committed everything it ordered.
    assert!(ordered > full, "{ordered} puts");
    eprintln!(
        "{ordered} puts ordered; queue full: {}, backlog refusals: {}",
        net.links.queued() >= full,
        refused.load(Ordering::Relaxed)
    );
    assert_eq!(head.unacked_len(), 0);
    let last = ordered - 1;
    let item = head.read(format!("k{}", last % 1000).as_bytes(), 0).expect("read").expect("the last put");
    assert_eq!(item.value, set(last).value);
    let next =
        head.order_update(client(req(ordered), 0), &set(ordered), None, 0, &*net).await.expect("order");
    assert!(matches!(next, Ordered::Reply(_)), "a put after the repair must commit at once");
}

#[tokio::test]
async fn updates_a_full_link_held_back_are_queued_again_in_order() {
    // The fake link holds 1024 messages. The head never waits for room: what does not fit
    // stays unacknowledged, later updates queue behind it, and the tick queues them once
    // there is room, in sequence order (the successor takes updates only in order).
    let dir = tempfile::tempdir().expect("tempdir");
    let wires = Wires::default();
    let head = replica(dir.path(), route(5, 1, &[1, 2], &[]));
    for n in 0..1500 {
        head.order_update(client(req(n), 0), &set(n), None, 0, &wires).await.expect("order");
    }
    assert_eq!(head.unacked_len(), 1500);
    let first = wires.sent(2);
    assert_eq!(first.len(), 1024, "the link took more than it holds");
    head.tick(&wires).await;
    let rest = wires.sent(2);
    let seqs: Vec<(u64, u64)> = first
        .iter()
        .chain(&rest)
        .map(|m| match m {
            ChainMsg::Replicate { seq, prev_seq, .. } => (*seq, *prev_seq),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(seqs.len(), 1500, "held-back updates were not queued again");
    for w in seqs.windows(2) {
        assert_eq!(w[1].1, w[0].0, "out of order after the hold-back: {w:?}");
    }
    // Nothing more is sent once the link has taken everything.
    head.tick(&wires).await;
    assert!(wires.sent(2).is_empty());
    head.on_ack(2, seqs[1499].0, &wires).await;
    assert_eq!(head.unacked_len(), 0);
}

#[tokio::test]
async fn a_head_with_a_full_backlog_refuses_new_updates_until_acks_come_back() {
    // Not waiting for room on the link must not let the head run ahead without bound: at
    // UNACKED_UPDATES_MAX unacknowledged updates it refuses new ones (retryable), and a
    // retry of an update it already ordered still gets its answer.
    let dir = tempfile::tempdir().expect("tempdir");
    let wires = Wires::default();
    let head = replica(dir.path(), route(5, 1, &[1, 2], &[]));
    for n in 0..UNACKED_UPDATES_MAX as u64 {
        head.order_update(client(req(n), 0), &set(n), None, 0, &wires).await.expect("order");
    }
    let last = head.store.max_seq();
    let full = head.order_update(client(req(1 << 40), 0), &set(0), None, 0, &wires).await;
    assert!(matches!(full, Err(WireError::Unavailable(_))), "{:?}", full.is_ok());
    let retry = head.order_update(client(req(7), 0), &set(7), None, 0, &wires).await;
    assert!(matches!(retry, Ok(Ordered::AwaitAck(_))), "a retry was refused");
    head.on_ack(2, last, &wires).await;
    let after = head.order_update(client(req(1 << 40), 0), &set(0), None, 0, &wires).await;
    assert!(after.is_ok(), "still refused after the acks");
}

#[tokio::test]
async fn a_middle_replica_acks_and_asks_again_on_a_new_connection_to_its_predecessor() {
    // The ack it passed upstream may have been lost with the old connection; the head
    // must not wait for the next update to learn that its updates committed. An update
    // lost with it is asked for again: no one else would send it before the next update.
    let dir = tempfile::tempdir().expect("tempdir");
    let wires = Wires::default();
    let middle = replica(dir.path(), route(5, 2, &[1, 2, 3], &[]));
    let fresh = middle.resend_on_connect(1).await;
    assert!(
        matches!(fresh.as_slice(), [ChainMsg::Resend { after_seq: 0, .. }]),
        "nothing acknowledged yet: {fresh:?}"
    );
    middle.on_ack(3, 42, &wires).await;
    let first = middle.resend_on_connect(1).await;
    assert!(
        matches!(first.as_slice(), [ChainMsg::Ack { seq: 42, .. }, ChainMsg::Resend { .. }]),
        "{first:?}"
    );
    // What a former successor acknowledged stays committed (every ack starts at a tail): it
    // is still passed upstream after the successor changed.
    middle.install(route(6, 2, &[1, 2, 4], &[]), &wires).await;
    let after = middle.resend_on_connect(1).await;
    assert!(
        matches!(after.as_slice(), [ChainMsg::Ack { seq: 42, .. }, ChainMsg::Resend { .. }]),
        "{after:?}"
    );
}

#[tokio::test]
async fn a_syncing_replica_notes_when_it_last_heard_from_its_source() {
    // The tail keeps no unacknowledged updates for a syncing replica, so the replica
    // watches the link: `sync_heard` dates the last message from its source, and is gone
    // once the copy is complete.
    let dir = tempfile::tempdir().expect("tempdir");
    let wires = Wires::default();
    let s = replica(dir.path(), route(5, 3, &[1, 2], &[3]));
    let (source, started) = s.sync_heard().await.expect("syncing");
    assert_eq!(source, 2);
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Not from the source: not evidence that its link works.
    s.on_snapshot_begin(1, 8).await.expect("begin");
    assert_eq!(s.sync_heard().await.map(|(_, t)| t), Some(started));
    s.on_snapshot_begin(2, 8).await.expect("begin");
    let (_, heard) = s.sync_heard().await.expect("syncing");
    assert!(heard > started);
    s.on_snapshot_end(2, end(8, 0, 0), &wires).await.expect("end");
    assert_eq!(s.sync_heard().await, None, "a complete copy needs nothing more from the source");
}

#[tokio::test]
async fn a_tail_that_has_not_stepped_down_does_not_confirm_its_successor_caught_up() {
    // Node 2 is the tail of [1, 2] with 3 syncing; the manager has since promoted 3 to tail
    // (3 installed that and asks `Resend`), but 2 has not installed it yet and would still
    // commit updates on its own ack: 3 must not become a readable tail before 2 steps down.
    let dir = tempfile::tempdir().expect("tempdir");
    let wires = Wires::default();
    let c = replica(dir.path(), route(5, 2, &[1, 2], &[3]));
    c.store.store(b"k", b"v", Meta { seq: 10, ..Meta::default() }).expect("store");
    c.on_chain(3, resend(0), &wires).await;
    let sent = wires.sent(3);
    assert!(sent.iter().any(|m| matches!(m, ChainMsg::Replicate { seq: 10, .. })), "{sent:?}");
    assert!(
        !sent.iter().any(|m| matches!(m, ChainMsg::CaughtUp { .. })),
        "a node that is still the tail confirmed its successor caught up: {sent:?}"
    );
    // Once it has stepped down to a middle node, the confirmation follows the updates.
    c.install(route(6, 2, &[1, 2, 3], &[]), &wires).await;
    let _ = wires.sent(3);
    c.on_chain(3, resend(0), &wires).await;
    let sent = wires.sent(3);
    assert!(matches!(sent.last(), Some(ChainMsg::CaughtUp { seq: 10, .. })), "{sent:?}");
}

#[tokio::test]
async fn a_syncing_replica_takes_only_the_snapshot_stream_it_began() {
    // Two streams from the same source on one link (a repeated SyncRequest, or a restart
    // of this replica while the first stream was still being sent): the older stream's
    // batches, with older versions, and its end must not be taken for the newer one's.
    let dir = tempfile::tempdir().expect("tempdir");
    let wires = Wires::default();
    let s = replica(dir.path(), route(5, 3, &[1, 2], &[3]));
    s.on_snapshot_begin(2, 8).await.expect("begin");
    s.on_snapshot_batch(2, 8, 0, &[put("a", 5, "new")]).await.expect("batch");
    s.on_snapshot_batch(2, 7, 3, &[put("a", 3, "old"), put("b", 4, "gone")]).await.expect("batch");
    let f = s.on_snapshot_end(2, end(7, 4, 4), &wires).await.expect("end");
    assert!(!f.sync_done, "the end of another stream finished the sync");
    assert_eq!(s.sync_status().await, Some((2, true, false)));
    let f = s.on_snapshot_end(2, end(8, 1, 5), &wires).await.expect("end");
    assert!(f.sync_done);
    assert_eq!(value(&s, "a").as_deref(), Some("new"));
    assert_eq!(value(&s, "b"), None);
}

#[tokio::test]
async fn a_newer_snapshot_stream_replaces_the_one_in_progress() {
    // The source runs only the stream of the latest request: a newer Begin means the
    // older stream stops, so the replica switches and empties what the older one wrote.
    let dir = tempfile::tempdir().expect("tempdir");
    let wires = Wires::default();
    let s = replica(dir.path(), route(5, 3, &[1, 2], &[3]));
    s.on_snapshot_begin(2, 8).await.expect("begin");
    s.on_snapshot_batch(2, 8, 0, &[put("a", 5, "deleted later")]).await.expect("batch");
    s.on_snapshot_begin(2, 9).await.expect("begin");
    s.on_snapshot_batch(2, 8, 1, &[put("x", 6, "old stream")]).await.expect("batch");
    s.on_snapshot_batch(2, 9, 0, &[put("b", 6, "b")]).await.expect("batch");
    assert!(!s.on_snapshot_end(2, end(8, 2, 6), &wires).await.expect("end").sync_done);
    // A repeated Begin of the stream taken changes nothing.
    s.on_snapshot_begin(2, 9).await.expect("begin");
    assert!(s.on_snapshot_end(2, end(9, 1, 7), &wires).await.expect("end").sync_done);
    assert_eq!(value(&s, "a"), None);
    assert_eq!(value(&s, "x"), None);
    assert_eq!(value(&s, "b").as_deref(), Some("b"));
}

#[tokio::test]
async fn a_snapshot_with_a_missing_batch_is_abandoned_and_the_next_one_starts_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wires = Wires::default();
    let s = replica(dir.path(), route(5, 3, &[1, 2], &[3]));
    s.on_snapshot_begin(2, 8).await.expect("begin");
    s.on_snapshot_batch(2, 8, 0, &[put("a", 5, "deleted later")]).await.expect("batch");
    // Batch 1 was lost (a chain connection broke mid-stream).
    s.on_snapshot_batch(2, 8, 2, &[put("c", 7, "c")]).await.expect("batch");
    assert_eq!(s.sync_status().await, Some((2, false, false)), "a stream with a gap was kept");
    let f = s.on_snapshot_end(2, end(8, 3, 7), &wires).await.expect("end");
    assert!(!f.sync_done, "a stream with a gap finished the sync");
    // The replica asks again; "a" was deleted meanwhile and its tombstone compacted away
    // at the source, so the new snapshot does not mention it: it must not come back.
    s.tick(&wires).await;
    assert!(wires.sent(2).iter().any(|m| matches!(m, ChainMsg::SyncRequest { .. })));
    s.on_snapshot_begin(2, 9).await.expect("begin");
    s.on_snapshot_batch(2, 9, 0, &[put("c", 7, "c")]).await.expect("batch");
    let f = s.on_snapshot_end(2, end(9, 1, 9), &wires).await.expect("end");
    assert!(f.sync_done);
    assert_eq!(value(&s, "a"), None, "a record of the abandoned stream came back");
    assert_eq!(value(&s, "c").as_deref(), Some("c"));
}

/// Streams a snapshot of `source` to node 2 and plays it into a new replica on `dir`, which
/// finishes its sync; the stream must carry outcomes.
async fn copy_of(source: &Arc<RangeReplica>, dir: &std::path::Path, wires: &Wires) -> RangeReplica {
    let _ = wires.sent(2);
    source.on_sync_request(2, wires, 0).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = Vec::new();
    while !matches!(stream.last(), Some(ChainMsg::SnapshotEnd { .. })) {
        assert!(Instant::now() < deadline, "no SnapshotEnd: {stream:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
        stream.extend(wires.sent(2));
    }
    assert!(stream.iter().any(|m| matches!(m, ChainMsg::Outcomes { .. })), "no outcomes: {stream:?}");
    let copy = replica(dir, route(5, 2, &[1], &[2]));
    for msg in stream {
        match msg {
            ChainMsg::SnapshotBegin { snapshot, .. } => {
                copy.on_snapshot_begin(1, snapshot).await.expect("begin")
            }
            ChainMsg::SnapshotBatch { snapshot, index, records, .. } => {
                copy.on_snapshot_batch(1, snapshot, index, &records).await.expect("batch")
            }
            ChainMsg::SnapshotEnd { snapshot, batches, upto_seq, dropped_seq_max, .. } => {
                let f = copy
                    .on_snapshot_end(1, CopyEnd { snapshot, batches, upto_seq, dropped_seq_max }, wires)
                    .await
                    .expect("end");
                assert!(f.sync_done);
            }
            m @ ChainMsg::Outcomes { .. } => copy.on_chain(1, m, wires).await,
            other => panic!("unexpected {other:?}"),
        }
    }
    copy
}

/// A lone tail on `dir` that committed one set (`req(1)`), and its outcome.
async fn source_with_one_set(dir: &std::path::Path, wires: &Wires) -> (Arc<RangeReplica>, Outcome) {
    let source = Arc::new(replica(dir, route(5, 1, &[1], &[2])));
    let ordered = source.order_update(client(req(1), 0), &set(1), None, 0, wires).await.expect("order");
    let Ordered::Reply(first) = ordered else { panic!("a lone tail commits at once") };
    (source, first)
}

/// `copy`, promoted and then alone, answers a retry of `req(1)` as `first` without ordering it.
async fn answers_the_retry(copy: &RangeReplica, first: &Outcome, wires: &Wires) {
    copy.install(route(6, 2, &[1, 2], &[]), wires).await;
    copy.install(route(7, 2, &[2], &[]), wires).await;
    let seq = copy.store.max_seq();
    let retry = copy.order_update(client(req(1), 0), &set(1), None, 0, wires).await.expect("retry");
    assert!(matches!(retry, Ordered::Reply(ref o) if o == first), "the retry was answered differently");
    assert_eq!(copy.store.max_seq(), seq, "the retry was ordered a second time");
}

#[tokio::test]
async fn a_snapshot_carries_the_outcomes_that_let_the_copy_answer_a_retry_as_head() {
    // The stream carries the copied updates' outcomes, and a copy that later heads the chain
    // answers a retry instead of ordering it again.
    let (src_dir, dst_dir) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let wires = Wires::default();
    let (source, first) = source_with_one_set(src_dir.path(), &wires).await;
    let copy = copy_of(&source, dst_dir.path(), &wires).await;
    answers_the_retry(&copy, &first, &wires).await;
}

#[tokio::test]
async fn a_copys_outcomes_survive_a_restart_of_the_copy() {
    // The copy keeps the copied updates' outcomes in its datastore (adopted tags), as it keeps
    // those of updates it appends: its process restarts (the datastore reopened after a
    // crash), and as head it still answers a retry.
    let (src_dir, dst_dir) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let wires = Wires::default();
    let (source, first) = source_with_one_set(src_dir.path(), &wires).await;
    let copy = copy_of(&source, dst_dir.path(), &wires).await;
    drop(copy);
    let reopened = replica(dst_dir.path(), route(5, 2, &[1, 2], &[]));
    answers_the_retry(&reopened, &first, &wires).await;
}

#[tokio::test]
async fn a_sync_buffer_past_its_byte_budget_asks_for_the_rest_once_the_copy_is_complete() {
    // Live updates that arrive while the snapshot streams in are buffered up to
    // `SYNC_BUFFER_BYTES_MAX`; the rest are dropped and asked for again (`Resend` after the
    // last one held) when the copy ends, instead of growing memory without bound.
    let dir = tempfile::tempdir().expect("tempdir");
    let wires = Wires::default();
    let s = replica(dir.path(), route(5, 3, &[1, 2], &[3]));
    s.on_snapshot_begin(2, 8).await.expect("begin");
    let value = vec![b'v'; 1 << 20];
    let per_update = (1 << 20) + 8 + crate::replica::sync::SYNC_BUFFER_UPDATE_OVERHEAD_BYTES;
    let kept = (crate::replica::sync::SYNC_BUFFER_BYTES_MAX / per_update) as u64;
    let msgs: Vec<ChainMsg> = (1..=kept + 3)
        .map(|seq| ChainMsg::Replicate {
            epoch: 5,
            range: Range::full(),
            seq,
            prev_seq: seq - 1,
            key: format!("k{seq:07}").into_bytes(),
            effect: ReplEffect::Put { value: value.clone(), flags: 0, expiry: 0, state: 0 },
            origin: None,
        })
        .collect();
    s.on_replicates(2, msgs, &wires).await.expect("buffered");
    assert!(s.on_snapshot_end(2, end(8, 0, 0), &wires).await.expect("end").sync_done);
    assert_eq!(s.store.max_seq(), kept, "the buffered updates are applied");
    let sent = wires.sent(2);
    assert!(
        sent.iter().any(|m| matches!(m, ChainMsg::Resend { after_seq, .. } if *after_seq == kept)),
        "no resend of what the buffer dropped: {sent:?}"
    );
}

#[tokio::test]
async fn a_tail_tells_each_front_end_of_a_step_s_commits_in_one_request() {
    // Updates applied together at the tail cost each front-end one `Committed` request
    // carrying its notices in order, not one request per update.
    let dir = tempfile::tempdir().expect("tempdir");
    let wires = Wires::default();
    let tail = replica(dir.path(), route(5, 2, &[1, 2], &[]));
    let replicate = |n: u64, reply_to: &str| ChainMsg::Replicate {
        epoch: 5,
        range: Range::full(),
        seq: n,
        prev_seq: n - 1,
        key: format!("k{n}").into_bytes(),
        effect: ReplEffect::Put { value: b"v".to_vec(), flags: 0, expiry: 0, state: 0 },
        origin: Some(Origin {
            req: req(n),
            outcome: Outcome::Stored { cas: n },
            reply_to: Some(reply_to.into()),
            floor: 0,
        }),
    };
    let msgs = vec![replicate(1, "fe-a"), replicate(2, "fe-b"), replicate(3, "fe-a")];
    tail.on_replicates(1, msgs, &wires).await.expect("replicates");
    let sent = wires.1.lock().clone();
    assert_eq!(sent, vec![("fe-a".to_string(), vec![req(1), req(3)]), ("fe-b".to_string(), vec![req(2)])]);
}

#[tokio::test]
async fn a_copy_whose_buffered_updates_fail_to_append_is_not_reported_done() {
    // The updates buffered while the snapshot streamed in are appended when it ends; if that
    // fails (a full disk) the replica does not hold what the sync names: it must not report
    // the sync done, and asks for a new copy instead.
    let dir = tempfile::tempdir().expect("tempdir");
    let wires = Wires::default();
    let failing = Arc::new(AtomicBool::new(false));
    let fail = Arc::clone(&failing);
    let faults = fawn_ds::FaultInjector::new(move |op| {
        (op == fawn_ds::IoOp::Write && fail.load(Ordering::Acquire))
            .then(|| std::io::Error::from_raw_os_error(libc::ENOSPC))
    });
    let store = DataStore::open(dir.path(), fawn_ds::Options { faults, ..Default::default() }).expect("open");
    let s = RangeReplica::new(store, route(5, 3, &[1, 2], &[3]), false);
    s.on_snapshot_begin(2, 8).await.expect("begin");
    s.on_snapshot_batch(2, 8, 0, &[put("a", 5, "a")]).await.expect("batch");
    let effect = ReplEffect::Put { value: b"b".to_vec(), flags: 0, expiry: 0, state: 0 };
    let update = |seq| ChainMsg::Replicate {
        epoch: 5,
        range: Range::full(),
        seq,
        prev_seq: seq - 1,
        key: b"b".to_vec(),
        effect: effect.clone(),
        origin: None,
    };
    s.on_replicates(2, vec![update(6), update(7)], &wires).await.expect("buffered");
    failing.store(true, Ordering::Release);
    let f = s.on_snapshot_end(2, end(8, 1, 5), &wires).await.expect("end");
    assert!(!f.sync_done, "a sync was reported done though its buffered updates were not stored");
    assert_eq!(s.store.max_seq(), 5);
    // The disk has room again: the replica asks for a new copy, and that one completes.
    failing.store(false, Ordering::Release);
    s.tick(&wires).await;
    assert!(wires.sent(2).iter().any(|m| matches!(m, ChainMsg::SyncRequest { .. })));
    s.on_snapshot_begin(2, 9).await.expect("begin");
    s.on_snapshot_batch(2, 9, 0, &[put("a", 5, "a"), put("b", 7, "b")]).await.expect("batch");
    assert!(s.on_snapshot_end(2, end(9, 1, 7), &wires).await.expect("end").sync_done);
    assert_eq!(value(&s, "b").as_deref(), Some("b"));
}

#[tokio::test]
async fn a_head_leaves_to_the_tail_s_notice_only_updates_it_sent_on_with_a_front_end_s_reply_to() {
    // The head does not wait to answer an update it forwarded with the `reply_to` of a
    // front-end the tail will notify; it still waits for one naming any other address, one
    // without `reply_to`, and one held back behind a full link (the waiter answers those).
    let dir = tempfile::tempdir().expect("tempdir");
    let wires = Wires::default();
    let head = replica(dir.path(), route(5, 1, &[1, 2], &[]));
    let fe = |to: &str| Some(to.to_string());
    let updates = vec![
        (client(req(1), 0), set(1), fe("fe")),
        (client(req(2), 0), set(2), fe("stranger")),
        (client(req(3), 0), set(3), None),
    ];
    let ordered = head.order_updates(updates, 0, &wires, |to| to == "fe").await;
    let kinds: Vec<&str> = ordered
        .iter()
        .map(|o| match o {
            Ok(Ordered::Notified) => "notified",
            Ok(Ordered::AwaitAck(_)) => "await",
            Ok(Ordered::Reply(_)) => "reply",
            Err(_) => "error",
        })
        .collect();
    assert_eq!(kinds, ["notified", "await", "await"]);
    let sent = wires.sent(2);
    assert_eq!(sent.len(), 3, "every update goes on to the successor");
    // Behind one a full link held back, an update is not sent in its step: a waiter answers it.
    let link = wires.link(2);
    while link.try_send(resend(0)).is_ok() {}
    let first = head.order_updates(vec![(client(req(4), 0), set(4), fe("fe"))], 0, &wires, |_| true).await;
    assert!(matches!(first[..], [Ok(Ordered::Notified)]), "sent, though the link dropped it");
    let held = head.order_updates(vec![(client(req(5), 0), set(5), fe("fe"))], 0, &wires, |_| true).await;
    assert!(matches!(held[..], [Ok(Ordered::AwaitAck(_))]), "a held-back update was left to a notice");
}

/// The work of a chain of three replicas per update, without sockets, tasks or a runtime
/// between them: the head orders a batch of sets, each hop's `Replicate`s are encoded and
/// decoded as frames and applied by the next replica (one step, one append), and the acks
/// go back up. Prints the CPU time per update per replica: what a back-end's update costs
/// at the least, to compare with what a cluster process burns per set. A measurement, not
/// a check (release build: `cargo test --release -p fawn-kv --lib chain_work -- --ignored
/// --nocapture`; `FAWN_CHAIN_WORK_UPDATES`, `FAWN_CHAIN_WORK_BATCH`).
#[tokio::test(flavor = "current_thread")]
#[ignore = "a measurement: run by hand in a release build"]
async fn chain_work_per_update() {
    use fawn_proto::native::{decode_frame, encode_frame, Message, Request};
    let env =
        |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (updates, batch) = (env("FAWN_CHAIN_WORK_UPDATES", 200_000), env("FAWN_CHAIN_WORK_BATCH", 16).max(1));
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    let chain = [1, 2, 3];
    let nodes: Vec<RangeReplica> =
        (0..3).map(|i| replica(dirs[i].path(), route(5, chain[i], &chain, &[]))).collect();
    let wires = Wires::default();
    // Each hop's messages as they cross a socket: one buffer of frames, decoded again.
    let wire = |msgs: Vec<ChainMsg>| -> Vec<ChainMsg> {
        let mut buf = Vec::new();
        for msg in msgs {
            encode_frame(0, &Message::Chain(msg), &mut buf).expect("encode");
        }
        let (mut at, mut out) = (0, Vec::new());
        while let Some((_, Message::Chain(msg), used)) = decode_frame(&buf[at..]).expect("decode") {
            out.push(msg);
            at += used;
        }
        out
    };
    let set256 = |n: u64| Update {
        key: format!("key:{:012}", n.wrapping_mul(2_654_435_761) % 1_000_000).into_bytes(),
        mutation: Mutation::Set,
        value: vec![b'v'; 256],
        flags: 0,
        expiry: 0,
    };
    let (cpu, wall) = (process_cpu(), Instant::now());
    let mut n = 0;
    while n < updates {
        // The head: a batch of updates as a front-end sends them (one frame each).
        let frames: Vec<u8> = (n..n + batch).fold(Vec::new(), |mut buf, i| {
            let request = Request::Update {
                epoch: 5,
                req: req(i),
                update: set256(i),
                forwarded: true,
                reply_to: Some("fe:1".into()),
                // Every earlier batch was answered, as a front-end's floor would say.
                floor: n,
            };
            encode_frame(i, &Message::Request(request), &mut buf).expect("encode");
            buf
        });
        let (mut at, mut batch_in) = (0, Vec::new());
        while let Some((_, Message::Request(r), used)) = decode_frame(&frames[at..]).expect("decode") {
            let Request::Update { req, update, reply_to, floor, epoch, .. } = r else { unreachable!() };
            batch_in.push((ClientReq { req, floor, epoch }, update, reply_to));
            at += used;
        }
        let results = nodes[0].order_updates(batch_in, 0, &wires, |_| true).await;
        assert!(results.iter().all(|r| matches!(r, Ok(Ordered::Notified))));
        nodes[1].on_replicates(1, wire(wires.sent(2)), &wires).await.expect("middle");
        nodes[2].on_replicates(2, wire(wires.sent(3)), &wires).await.expect("tail");
        for msg in wire(wires.sent(2)) {
            nodes[1].on_chain(3, msg, &wires).await;
        }
        for msg in wire(wires.sent(1)) {
            nodes[0].on_chain(2, msg, &wires).await;
        }
        n += batch;
    }
    let (cpu, wall) = (process_cpu() - cpu, wall.elapsed());
    let noticed: usize = wires.1.lock().iter().map(|(_, reqs)| reqs.len()).sum();
    assert_eq!(noticed as u64, n, "every update committed at the tail");
    assert_eq!(nodes[0].unacked_len(), 0);
    let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64 / 3.0;
    eprintln!(
        "chain work: {n} updates of 256 B in batches of {batch}: {:.2} µs CPU ({:.2} µs wall) per update per replica",
        per(cpu),
        per(wall)
    );
}

/// CPU time of this process so far, all threads (the datastores' background syncs too), from
/// `/proc/self/stat` (in clock ticks of 10 ms).
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let fields: Vec<&str> = stat.rsplit_once(')').expect("stat").1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

#[tokio::test]
async fn the_datastore_forgets_the_outcomes_below_what_the_replica_remembers() {
    // Guards the shell passing `forget_outcomes_below` on to FAWN-DS: without it the store
    // keeps the tags of its latest `RECENT_TAGS_MAX` records (1.5 MB a range) for ever,
    // although the client's floor let the replica forget all but the last outcome.
    let dir = tempfile::tempdir().expect("tempdir");
    let wires = Wires::default();
    let head = replica(dir.path(), route(5, 1, &[1], &[]));
    for n in 1..=200u64 {
        head.order_update(client(req(n), n), &set(n), None, 0, &wires).await.expect("order");
    }
    assert!(head.store.recent_tags().len() >= 200, "each record keeps its outcome until a tick");
    head.tick(&wires).await;
    let kept: Vec<u64> = head.store.recent_tags().iter().map(|(seq, _)| *seq).collect();
    assert_eq!(
        (kept.len(), kept.last()),
        (1, Some(&head.store.max_seq())),
        "only the outcome at the floor stays"
    );
}
