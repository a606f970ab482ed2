//! One replicated range on one back-end: its datastore and its place in the range's chain.
//!
//! Every write-side step of a range — the head ordering an update, a replica applying one,
//! a configuration change re-wiring the chain, the snapshot cut for a syncing replica — runs
//! under the range's one `state` lock, so each happens entirely before or after the others.
//! Messages to neighbours are queued while holding it, so each link carries a range's updates
//! in sequence order. They are queued without waiting (`queue`): a link whose queue is full (a
//! successor cut off or not reading) must not hold the lock, or nothing else could run on the
//! range — not even the new configuration that repairs the chain around the cut. What does not
//! fit is recovered from `unacked` (`WriteState::held_back`, re-queued by `tick`) or asked for
//! again by the receiver (a gap in `prev_seq`, a promoted tail's `Resend`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_ds::{BatchOp, DataStore, Meta, RecordKind};
use fawn_proto::native::{ChainMsg, Epoch, Origin, RecordMark, ReplEffect, ReqId, SnapshotItem, WireError};
use fawn_proto::op::{decide, Effect, Item, Mutation, Outcome, Update};
use fawn_ring::{key_id, NodeId, Range};
use parking_lot::Mutex;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use crate::clock::{flushed, next_seq, unix_now};
use crate::replica::dedup::Dedup;
pub use crate::replica::machine::UNACKED_UPDATES_MAX;
use crate::replica::machine::{incoming, Incoming};
pub use crate::replica::route::Route;
use crate::replica::store::ReplicaStore;

/// Updates a syncing replica buffers while its snapshot streams in.
pub const SYNC_BUFFER_MESSAGES_MAX: usize = 1_000_000;
/// A snapshot stream that has sent nothing for this long (its sender restarted, or could not
/// read its log) is abandoned; the syncing replica asks for a new one.
pub const SNAPSHOT_SILENCE_MAX: Duration = Duration::from_secs(10);
/// Tombstones per datastore write when a syncing replica empties an abandoned copy.
const EMPTY_BATCH_OPS: usize = 4096;

/// Where a link to a peer back-end can be had.
pub trait LinkTo: Send + Sync {
    fn link(&self, peer: NodeId) -> mpsc::Sender<ChainMsg>;
    /// Tell the front-end at `reply_to` that its update committed (fire and forget).
    fn committed(&self, reply_to: &str, req: ReqId, outcome: Outcome, key: &[u8]);
}

/// Progress of a syncing replica.
#[derive(Debug, Default)]
pub struct SyncProgress {
    pub source: NodeId,
    pub started: bool,
    pub done: bool,
    buffer: Vec<ChainMsg>,
    /// The snapshot stream taken (named by its `SnapshotBegin`, or `SuffixBegin`) and the
    /// index of its next batch: batches and ends of any other stream are ignored, a missing
    /// batch abandons it.
    stream: u64,
    next_batch: u64,
    /// When the stream last made progress.
    progress_at: Option<Instant>,
    /// This replica kept its datastore from before it failed: it asks for the records after
    /// its last one instead of a full snapshot (see `suffix` below).
    suffix: Option<SuffixPlan>,
    /// The source refused the suffix; the back-end replaces this replica by a fresh one.
    refused: bool,
    /// The stream being received is a suffix (the old records stay), not a full snapshot.
    receiving_suffix: bool,
    /// Records and key + value bytes received so far.
    records: u64,
    bytes: u64,
    /// When anything last arrived from `source` (any chain message of this range), or the
    /// replica started syncing: a source silent for long is probed and, if it does not answer
    /// either, reported to the manager as a cut link (`Backend::check_links`).
    heard_at: Option<Instant>,
}

impl SyncProgress {
    /// Gives up the current snapshot stream; the replica asks for a new one (`tick`). A full
    /// snapshot's new `SnapshotBegin` empties what this one wrote; a suffix is asked for
    /// again with the same plan, and the new suffix (every key's latest record above
    /// `have_seq` as of a later cut) supersedes whatever part of the old one was written.
    /// Live updates stay buffered.
    fn abandon(&mut self) {
        self.started = false;
        self.receiving_suffix = false;
        self.stream = 0;
        self.next_batch = 0;
        self.progress_at = None;
    }
}

/// What a rejoining replica asks for: the records after `have_seq`, whose record `top` the
/// source must recognise as committed (see `suffix` below).
#[derive(Clone, Debug)]
pub struct SuffixPlan {
    pub have_seq: u64,
    pub top: RecordMark,
}

/// How a syncing replica got its copy, for the log line and the counters.
#[derive(Clone, Copy, Debug)]
pub struct SyncReport {
    pub suffix: bool,
    pub records: u64,
    pub bytes: u64,
}

struct WriteState {
    route: Route,
    last_seq: u64,
    recent: Dedup,
    sync: Option<SyncProgress>,
    /// The link to the successor was full: the unacknowledged updates from this seq on are in
    /// `unacked` but not (all) queued. Later updates are not queued either (the successor
    /// takes updates only in order) until `tick` has queued these again.
    held_back: Option<u64>,
    /// An ack upstream did not fit its link's queue: `tick` sends the latest one again (acks
    /// are cumulative).
    ack_dropped: bool,
    /// The highest ack the current successor sent: passed upstream again on a new connection
    /// to the predecessor, which may have lost the last one with the old connection.
    acked_by_successor: u64,
}

impl WriteState {
    /// Something arrived from `from`: if it is the sync source, the link from it works.
    fn heard(&mut self, from: NodeId) {
        if let Some(sync) = self.sync.as_mut().filter(|s| s.source == from) {
            sync.heard_at = Some(Instant::now());
        }
    }
}

/// What the head must do after ordering an update.
pub enum Ordered {
    /// Reply now.
    Reply(Outcome),
    /// Wait until `seq` is acknowledged by the tail, then reply.
    AwaitAck { seq: u64, outcome: Outcome },
}

/// Requests a replica wants its back-end to make (they involve the manager or timers).
#[derive(Debug, Default)]
pub struct Followups {
    /// Tell the manager this syncing replica caught up.
    pub sync_done: bool,
    /// How the copy was made (set with `sync_done`).
    pub report: Option<SyncReport>,
}

/// One range's replica.
pub struct RangeReplica {
    writes_block: bool,
    pub range: Range,
    pub store: Arc<DataStore>,
    /// The bulk copy of this range's split-off part, or of its merge with its neighbour, runs
    /// (`presplit.rs`, `merge.rs`): while it does, the head of a range marked `splitting` or
    /// `merging` still orders updates.
    pub bulk_copy_pending: AtomicBool,
    state: tokio::sync::Mutex<WriteState>,
    acked: AtomicU64,
    /// The snapshot stream this replica is sending (0: none). A new `SyncRequest` replaces the
    /// stream in progress: at most one runs per range, however many requests queued up.
    snapshot_sending: AtomicU64,
    /// A tail that was syncing serves gets only after its predecessor confirmed it caught up.
    readable: AtomicBool,
    /// Woken when `readable` turns true (gets that arrived early wait instead of retrying).
    became_readable: tokio::sync::Notify,
    waiters: Mutex<BTreeMap<u64, Vec<oneshot::Sender<()>>>>,
    unacked: Mutex<BTreeMap<u64, ChainMsg>>,
    /// A suffix request is being decided by a scan of the log (the successor's retries
    /// meanwhile are ignored).
    suffix_scan: Arc<AtomicBool>,
}

impl RangeReplica {
    /// A replica in `route`; `fresh_sync` when it starts empty as a syncing replica.
    /// `writes_block`: the store fsyncs on every write (`SyncPolicy::Always`), so writes run
    /// with `block_in_place` instead of stalling the async worker.
    pub fn new(store: DataStore, route: Route, writes_block: bool) -> RangeReplica {
        RangeReplica::build(Arc::new(store), route, writes_block, None)
    }

    /// A replica that takes over from `parents` over `store`: a part of a split range
    /// (`RangeConfig::splitting`; one parent, whose datastore is `store` for the part with its
    /// end) or a range merged from adjacent ones (`RangeConfig::merging`; `store` is the one
    /// they were merged into). It remembers the parents' recent requests, so a retry of an
    /// update ordered before is answered, not applied twice, and continues above their
    /// highest seq.
    pub async fn inheriting(
        store: Arc<DataStore>,
        route: Route,
        writes_block: bool,
        parents: &[&RangeReplica],
    ) -> RangeReplica {
        let heir = RangeReplica::build(store, route, writes_block, None);
        let mut st = heir.state.lock().await;
        for parent in parents {
            let mut from = parent.state.lock().await;
            st.recent.inherit(from.recent.share());
            st.last_seq = st.last_seq.max(from.last_seq);
            heir.acked.fetch_max(parent.acked.load(Ordering::Acquire), Ordering::AcqRel);
        }
        drop(st);
        heir
    }

    /// Head of a range being split: nothing it ordered is unacknowledged, and it orders
    /// nothing new (`order_update` refuses), so every in-sync replica holds the same contents
    /// and the manager may split the range (`Request::SplitReady`).
    pub async fn ready_to_split(&self) -> bool {
        let st = self.state.lock().await;
        st.route.rc.splitting.is_some()
            && !self.bulk_copy_pending.load(Ordering::Acquire)
            && self.drained_head(&st)
    }

    /// Head of a range being merged (`RangeConfig::merging`) that has not said so yet, drained
    /// as for [`RangeReplica::ready_to_split`] (`Request::MergeReady`).
    pub async fn ready_to_merge(&self) -> bool {
        let st = self.state.lock().await;
        st.route.rc.merging.is_some()
            && !st.route.rc.merge_drained
            && !self.bulk_copy_pending.load(Ordering::Acquire)
            && self.drained_head(&st)
    }

    /// The head, with nothing it ordered unacknowledged or held back and no replica syncing.
    fn drained_head(&self, st: &WriteState) -> bool {
        st.route.is_head()
            && st.route.rc.syncing.is_empty()
            && st.held_back.is_none()
            && self.unacked.lock().is_empty()
    }

    /// A syncing replica that keeps `store` (its datastore from before it failed, whose last
    /// record `plan` names) and asks its source for the suffix after it.
    pub fn rejoining(
        store: Arc<DataStore>,
        route: Route,
        writes_block: bool,
        plan: SuffixPlan,
    ) -> RangeReplica {
        RangeReplica::build(store, route, writes_block, Some(plan))
    }

    fn build(
        store: Arc<DataStore>,
        route: Route,
        writes_block: bool,
        plan: Option<SuffixPlan>,
    ) -> RangeReplica {
        let last = store.max_seq();
        let sync = route.is_syncing().then(|| SyncProgress {
            source: route.predecessor().unwrap_or(route.me),
            suffix: plan,
            heard_at: Some(Instant::now()),
            ..SyncProgress::default()
        });
        RangeReplica {
            writes_block,
            range: route.rc.range,
            store,
            readable: AtomicBool::new(!route.is_syncing()),
            bulk_copy_pending: AtomicBool::new(false),
            became_readable: tokio::sync::Notify::new(),
            state: tokio::sync::Mutex::new(WriteState {
                route,
                last_seq: last,
                recent: Dedup::default(),
                sync,
                held_back: None,
                ack_dropped: false,
                acked_by_successor: 0,
            }),
            acked: AtomicU64::new(last),
            snapshot_sending: AtomicU64::new(0),
            waiters: Mutex::new(BTreeMap::new()),
            unacked: Mutex::new(BTreeMap::new()),
            suffix_scan: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The visible item for `key` (absent if deleted, expired or flushed).
    pub fn read(&self, key: &[u8], flush_at: u64) -> Result<Option<Item>, WireError> {
        let entry = self.store.lookup(key).map_err(storage)?;
        let now = unix_now();
        Ok(entry.and_then(|e| {
            let item = Item { value: e.value, flags: e.meta.flags, expiry: e.meta.expiry, cas: e.meta.seq };
            let hidden = fawn_proto::op::is_expired(item.expiry, now) || flushed(item.cas, flush_at);
            (!hidden).then_some(item)
        }))
    }

    /// Tail: may gets be served here now?
    pub fn readable(&self) -> bool {
        self.readable.load(Ordering::Acquire)
    }

    /// Waits up to `timeout` for this replica to become readable; returns whether it is.
    /// A promoted tail usually catches up within milliseconds: a get that waits for it is
    /// answered the moment it can be, where a refusal would cost the client a back-off.
    pub async fn wait_readable(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let woken = self.became_readable.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.readable() {
                return true;
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return self.readable();
            }
        }
    }

    fn set_readable(&self) -> bool {
        let was = self.readable.swap(true, Ordering::AcqRel);
        self.became_readable.notify_waiters();
        was
    }

    /// The route as of now.
    pub async fn route(&self) -> Route {
        self.state.lock().await.route.clone()
    }

    /// Sync progress, if syncing: (source, started, done).
    pub async fn sync_status(&self) -> Option<(NodeId, bool, bool)> {
        self.state.lock().await.sync.as_ref().map(|s| (s.source, s.started, s.done))
    }

    /// A syncing replica still waiting for its copy: its source and when it last heard from
    /// it. `None` once the copy is complete (nothing more is needed from the source before
    /// the promotion) or refused, or when not syncing.
    pub async fn sync_heard(&self) -> Option<(NodeId, Instant)> {
        let st = self.state.lock().await;
        let sync = st.sync.as_ref().filter(|s| !s.done && !s.refused)?;
        Some((sync.source, sync.heard_at?))
    }

    /// Head: decide and append an update, and queue it to the successor.
    pub async fn order_update(
        &self,
        req: ReqId,
        update: &Update,
        reply_to: Option<String>,
        flush_at: u64,
        links: &dyn LinkTo,
    ) -> Result<Ordered, WireError> {
        let mut st = self.state.lock().await;
        if !st.route.is_head() {
            return Err(WireError::WrongNode(format!("node {} is not the head", st.route.me)));
        }
        if let Some((seq, outcome)) = st.recent.get(&req) {
            return Ok(Ordered::AwaitAck { seq: *seq, outcome: outcome.clone() });
        }
        // Until the bulk of the split-off part is copied, updates go on; the copy then only
        // has to catch up with them once they stop.
        if st.route.rc.splitting.is_some() && !self.bulk_copy_pending.load(Ordering::Acquire) {
            return Err(WireError::Unavailable("the range is being split (a node joined)".into()));
        }
        if st.route.rc.merging.is_some() && !self.bulk_copy_pending.load(Ordering::Acquire) {
            return Err(WireError::Unavailable("the range is being merged (a node left)".into()));
        }
        if self.unacked.lock().len() >= UNACKED_UPDATES_MAX {
            return Err(WireError::Unavailable(
                "chain backlog full: the successor is not acknowledging updates".into(),
            ));
        }
        // A plain set does not depend on the current item: skip the read.
        let current = match update.mutation {
            Mutation::Set => None,
            _ => self.read(&update.key, flush_at)?,
        };
        let seq = next_seq(st.last_seq.max(self.store.max_seq()));
        let (outcome, effect) = decide(update, current.as_ref(), unix_now(), seq);
        let effect = match effect {
            Effect::None => {
                // A failed condition was judged against the head's state, which may hold
                // updates not yet committed: reply only once they are. Remember the answer
                // too: a retry of this request must not be decided again later (a delete that
                // found nothing would otherwise erase a put acknowledged in between; found by
                // the fault tests).
                let pending = st.last_seq;
                st.recent.remember(req, pending, outcome.clone());
                return Ok(Ordered::AwaitAck { seq: pending, outcome });
            }
            Effect::Put { value, flags, expiry } => ReplEffect::Put { value, flags, expiry },
            Effect::Delete => ReplEffect::Delete,
        };
        let prev_seq = st.last_seq;
        self.write(&update.key, &effect, seq)?;
        st.last_seq = seq;
        st.recent.remember(req, seq, outcome.clone());
        let msg = ChainMsg::Replicate {
            epoch: st.route.epoch,
            range: self.range,
            seq,
            prev_seq,
            key: update.key.clone(),
            effect,
            origin: Some(Origin { req, outcome: outcome.clone(), reply_to }),
        };
        self.forward(&mut st, seq, msg, links);
        if st.route.is_tail() {
            self.on_ack_local(seq);
            return Ok(Ordered::Reply(outcome));
        }
        Ok(Ordered::AwaitAck { seq, outcome })
    }

    /// Queues an update to the successor (if any), remembering it until acknowledged. Never
    /// waits for room on the link (the caller holds the state lock). In the chain, an update
    /// that does not fit stays in `unacked` and is queued again by `tick` (`held_back`), or
    /// sent on the next connection or to a new successor; nothing is acknowledged before the
    /// tail has it, so a put waits for it as before. From the tail to a syncing replica (which
    /// acknowledges nothing and holds no one's puts up) it is dropped: the replica finds the
    /// gap by `prev_seq` and asks `Resend`, and once promoted it asks `Resend` anyway and
    /// serves gets only after `CaughtUp`, which comes after everything it lacked.
    fn forward(&self, st: &mut WriteState, seq: u64, msg: ChainMsg, links: &dyn LinkTo) {
        let Some(succ) = st.route.successor() else { return };
        if st.route.is_tail() {
            if !queue(links, succ, msg) {
                debug!(range = %self.range.id_string(), peer = succ, seq, "link to the syncing replica full; update dropped");
            }
            return;
        }
        self.unacked.lock().insert(seq, msg.clone());
        let held_back = st.held_back;
        match held_back {
            None => {
                if !queue(links, succ, msg) {
                    warn_full(self.range, succ, seq);
                    st.held_back = Some(seq);
                }
            }
            // Updates wait in `unacked` (this one too): once the link has room again, queue
            // them now rather than at the next tick.
            Some(from) if links.link(succ).capacity() > 0 => self.queue_unacked(st, from, links),
            Some(_) => {}
        }
    }

    /// Sends the latest ack upstream (`ack_dropped` records a miss for `tick`).
    fn ack_upstream(&self, st: &mut WriteState, seq: u64, links: &dyn LinkTo) {
        let Some(pred) = st.route.predecessor() else { return };
        let ack = ChainMsg::Ack { epoch: st.route.epoch, range: self.range, seq };
        st.ack_dropped = !queue(links, pred, ack);
    }

    /// Queues the unacknowledged updates from `from` on to the successor, in order, as far as
    /// they fit; `held_back` names the first that did not.
    fn queue_unacked(&self, st: &mut WriteState, from: u64, links: &dyn LinkTo) {
        st.held_back = None;
        let Some(succ) = st.route.successor().filter(|_| !st.route.is_tail()) else { return };
        let unacked = self.unacked.lock();
        for (seq, m) in unacked.range(from..) {
            if !queue(links, succ, m.clone()) {
                st.held_back = Some(*seq);
                return;
            }
        }
    }

    /// Waits until `seq` is acknowledged by the tail.
    pub async fn wait_acked(&self, seq: u64, timeout: Duration) -> Result<(), WireError> {
        let rx = {
            let mut waiters = self.waiters.lock();
            if self.acked.load(Ordering::Acquire) >= seq {
                return Ok(());
            }
            let (tx, rx) = oneshot::channel();
            waiters.entry(seq).or_default().push(tx);
            rx
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(WireError::Timeout),
        }
    }

    /// Records that everything up to `seq` is committed.
    fn on_ack_local(&self, seq: u64) {
        self.acked.fetch_max(seq, Ordering::AcqRel);
        // Every in-chain replica holds committed deletes, and a new replica starts from a
        // snapshot: compaction may drop tombstones up to here.
        self.store.set_tombstone_watermark(self.acked.load(Ordering::Acquire));
        {
            let mut unacked = self.unacked.lock();
            let rest = unacked.split_off(&(seq + 1));
            *unacked = rest;
        }
        let done = {
            let mut waiters = self.waiters.lock();
            let rest = waiters.split_off(&(seq + 1));
            std::mem::replace(&mut *waiters, rest)
        };
        for tx in done.into_values().flatten() {
            let _ = tx.send(());
        }
    }

    /// An ack from downstream: commit locally and pass it upstream.
    pub async fn on_ack(&self, from: NodeId, seq: u64, links: &dyn LinkTo) {
        let mut st = self.state.lock().await;
        if st.route.successor() != Some(from) {
            return;
        }
        st.acked_by_successor = st.acked_by_successor.max(seq);
        self.on_ack_local(seq);
        self.ack_upstream(&mut st, seq, links);
    }

    /// A replicated update from upstream.
    pub async fn on_replicate(
        &self,
        from: NodeId,
        msg: ChainMsg,
        links: &dyn LinkTo,
    ) -> Result<(), WireError> {
        let mut st = self.state.lock().await;
        if st.route.predecessor() != Some(from) {
            return Ok(());
        }
        st.heard(from);
        if let Some(sync) = st.sync.as_mut().filter(|s| !s.done) {
            if sync.buffer.len() >= SYNC_BUFFER_MESSAGES_MAX {
                return Err(WireError::Unavailable("sync buffer full".into()));
            }
            sync.buffer.push(msg);
            return Ok(());
        }
        self.apply_locked(&mut st, msg, links).await
    }

    async fn apply_locked(
        &self,
        st: &mut WriteState,
        msg: ChainMsg,
        links: &dyn LinkTo,
    ) -> Result<(), WireError> {
        let ChainMsg::Replicate { seq, prev_seq, ref key, ref effect, ref origin, .. } = msg else {
            return Ok(());
        };
        let have = self.store.max_seq();
        let pred = st.route.predecessor();
        let epoch = st.route.epoch;
        match incoming(seq, prev_seq, have) {
            Incoming::Duplicate => {
                if st.route.is_tail() {
                    self.ack_upstream(st, have, links);
                }
                return Ok(());
            }
            Incoming::Gap => {
                if let Some(pred) = pred {
                    warn!(range = %self.range.id_string(), have, prev_seq, "gap in replicated updates; asking for a resend");
                    // Dropped if the link is full: the next update shows the gap again.
                    queue(links, pred, ChainMsg::Resend { epoch, range: self.range, after_seq: have });
                }
                return Ok(());
            }
            Incoming::Next => {}
        }
        self.write(key, effect, seq)?;
        st.last_seq = st.last_seq.max(seq);
        if let Some(origin) = origin {
            st.recent.remember(origin.req, seq, origin.outcome.clone());
        }
        let notify = origin.as_ref().filter(|_| st.route.is_tail()).and_then(|o| {
            let addr = o.reply_to.clone()?;
            Some((addr, o.req, o.outcome.clone(), key.clone()))
        });
        let is_tail = st.route.is_tail();
        self.forward(st, seq, msg, links);
        if is_tail {
            self.on_ack_local(seq);
            if let Some((addr, req, outcome, key)) = notify {
                links.committed(&addr, req, outcome, &key);
            }
            self.ack_upstream(st, seq, links);
        }
        Ok(())
    }

    /// A downstream replica asks for every update after `after_seq`.
    /// Asks `pred`, if it is this replica's predecessor, for every update after what the
    /// datastore holds (`Backend::resend_after_catch_up`).
    pub async fn ask_resend(&self, pred: NodeId, links: &dyn LinkTo) {
        let st = self.state.lock().await;
        if st.route.predecessor() == Some(pred) && st.sync.is_none() {
            let after_seq = self.store.max_seq();
            // Dropped if the link is full: the next update shows the gap.
            queue(links, pred, ChainMsg::Resend { epoch: st.route.epoch, range: self.range, after_seq });
        }
    }

    pub async fn on_resend(&self, from: NodeId, after_seq: u64, links: &dyn LinkTo) -> Result<(), WireError> {
        let mut st = self.state.lock().await;
        if st.route.successor() != Some(from) {
            return Ok(());
        }
        let msgs = self.updates_after(st.route.epoch, after_seq)?;
        info!(range = %self.range.id_string(), after_seq, count = msgs.len(), to = from, "resending updates");
        for m in msgs {
            if !queue(links, from, m) {
                // The link is full: stop here, and without `CaughtUp`. What did not fit is
                // asked for again (a gap at the receiver; a promoted tail asks every tick)
                // and, in the chain, queued again from `unacked` by `tick`.
                warn_full(self.range, from, after_seq);
                if !st.route.is_tail() {
                    let from_seq = st.held_back.map_or(after_seq + 1, |h| h.min(after_seq + 1));
                    st.held_back = Some(from_seq);
                }
                return Ok(());
            }
        }
        // `CaughtUp` makes the receiver a readable tail. A node that is still the tail in its
        // own view (it has not installed the configuration that promoted its syncing
        // successor) keeps committing updates on its own ack, before the successor has them:
        // two tails at once, and a get at the new one could miss an acknowledged put. The
        // promoted tail asks again every tick until this node has stepped down.
        if !st.route.is_tail() {
            let caught_up =
                ChainMsg::CaughtUp { epoch: st.route.epoch, range: self.range, seq: self.store.max_seq() };
            // Dropped if the link is full: the promoted tail asks again.
            queue(links, from, caught_up);
        }
        Ok(())
    }

    /// The predecessor confirmed this replica has everything it had.
    pub async fn on_caught_up(&self, from: NodeId, links: &dyn LinkTo) {
        let mut st = self.state.lock().await;
        if st.route.predecessor() != Some(from) || !st.route.is_tail() {
            return;
        }
        if !self.set_readable() {
            info!(range = %self.range.id_string(), "caught up; serving gets as tail");
        }
        let seq = self.store.max_seq();
        self.on_ack_local(seq);
        self.ack_upstream(&mut st, seq, links);
    }

    /// The last in-sync replica starts a snapshot for its syncing successor. The cut is taken
    /// under the state lock: records up to it go in the snapshot, later ones are forwarded.
    /// The stream is paced to `copy_bytes_per_s` (key + value bytes; 0 = unlimited). It stops
    /// when a newer request replaces it (the receiver takes the newest `SnapshotBegin`) or the
    /// replica is dropped.
    pub async fn on_sync_request(self: &Arc<Self>, from: NodeId, links: &dyn LinkTo, copy_bytes_per_s: u64) {
        let st = self.state.lock().await;
        if !(st.route.is_tail() && st.route.successor() == Some(from) && st.route.rc.syncing.contains(&from))
        {
            return;
        }
        let epoch = st.route.epoch;
        let snapshot = snapshot_id();
        // A full link: no stream starts; the syncing replica asks again.
        if !queue(links, from, ChainMsg::SnapshotBegin { epoch, range: self.range, snapshot }) {
            return;
        }
        let upto_seq = self.store.max_seq();
        let records = self.store.iter();
        let link = links.link(from);
        let stream = StreamId::start(self, snapshot);
        drop(st);
        info!(range = %self.range.id_string(), to = from, upto_seq, snapshot, "streaming snapshot");
        tokio::spawn(stream_records(
            self.range,
            epoch,
            link,
            records,
            None,
            upto_seq,
            copy_bytes_per_s,
            stream,
        ));
    }

    /// A rejoining successor asks for the records after its last one (`have_seq`, record
    /// `top`). Streamed, from a cut taken under the state lock as for a snapshot, only when
    /// [`suffix_refusal`](Self::suffix_refusal) finds nothing against it; else refused.
    /// Each refusal adds one to `refusals`.
    pub async fn on_suffix_sync_request(
        self: &Arc<Self>,
        from: NodeId,
        have_seq: u64,
        top: &RecordMark,
        links: &dyn LinkTo,
        copy_bytes_per_s: u64,
        refusals: &Arc<AtomicU64>,
    ) {
        let st = self.state.lock().await;
        if !(st.route.is_tail() && st.route.successor() == Some(from) && st.route.rc.syncing.contains(&from))
        {
            return;
        }
        if self.suffix_scan.load(Ordering::Acquire) {
            return;
        }
        let epoch = st.route.epoch;
        let link = links.link(from);
        let range = self.range;
        let counter = Arc::clone(refusals);
        let refuse = move |reason: String| {
            counter.fetch_add(1, Ordering::Relaxed);
            info!(range = %range.id_string(), to = from, have_seq, %reason,
                "refusing a suffix sync: the replica will copy the range in full");
            ChainMsg::SuffixRefused { epoch, range, reason }
        };
        // Under the state lock nothing waits for room on the link: what does not fit is
        // dropped, and the rejoining replica asks again.
        let verdict = match self.suffix_refusal(have_seq, top) {
            Some(reason) => {
                queue(links, from, refuse(reason));
                return;
            }
            None => self.top_is_current(top),
        };
        let upto_seq = self.store.max_seq();
        let records = self.store.iter();
        let cut = SuffixCut { after: have_seq, latest: self.store.iter() };
        match verdict {
            Ok(true) => {
                let snapshot = snapshot_id();
                if !queue(links, from, ChainMsg::SuffixBegin { epoch, range, snapshot, after_seq: have_seq })
                {
                    return;
                }
                let stream = StreamId::start(self, snapshot);
                drop(st);
                info!(range = %range.id_string(), to = from, after_seq = have_seq, upto_seq, snapshot, "streaming suffix");
                tokio::spawn(stream_records(
                    range,
                    epoch,
                    link,
                    records,
                    Some(cut),
                    upto_seq,
                    copy_bytes_per_s,
                    stream,
                ));
            }
            Ok(false) => {
                // Not this replica's current version of the key: look for the very record in
                // the log, read from the same cut (no write runs while the state lock is held).
                let scan = self.store.iter();
                let stream = StreamId::start(self, snapshot_id());
                drop(st);
                self.suffix_scan.store(true, Ordering::Release);
                let running = Arc::clone(&self.suffix_scan);
                let top = top.clone();
                tokio::spawn(async move {
                    let found = blocking(true, || log_holds(scan, &top));
                    match found {
                        Ok(true) => {
                            let snapshot = stream.snapshot;
                            let begin = ChainMsg::SuffixBegin { epoch, range, snapshot, after_seq: have_seq };
                            let _ = link.send(begin).await;
                            info!(range = %range.id_string(), to = from, after_seq = have_seq, upto_seq, snapshot,
                                "streaming suffix (its last record found in the log)");
                            stream_records(
                                range,
                                epoch,
                                link,
                                records,
                                Some(cut),
                                upto_seq,
                                copy_bytes_per_s,
                                stream,
                            )
                            .await;
                        }
                        Ok(false) => {
                            let reason =
                                "the replica's last record is not in this log (an update that never \
                                committed, or compacted away)";
                            let _ = link.send(refuse(reason.into())).await;
                        }
                        Err(e) => {
                            let _ = link.send(refuse(format!("reading the log: {e}"))).await;
                        }
                    }
                    // Retries that came meanwhile were ignored: one stream per request.
                    running.store(false, Ordering::Release);
                });
            }
            Err(e) => {
                queue(links, from, refuse(format!("reading the key of the replica's last record: {e}")));
            }
        }
    }

    /// Whether this replica's current record of `top.key` is `top` (a put only: a deleted key
    /// has no current record to compare; the log scan decides then).
    fn top_is_current(&self, top: &RecordMark) -> Result<bool, fawn_ds::Error> {
        if top.delete {
            return Ok(false);
        }
        Ok(self.store.lookup(&top.key)?.is_some_and(|e| {
            e.meta.seq == top.seq
                && e.meta.flags == top.flags
                && e.meta.expiry == top.expiry
                && crc32c::crc32c(&e.value) == top.value_crc
        }))
    }

    /// The checks of a suffix request that need no log read: why the records of this (tail)
    /// replica above `have_seq` would not turn a rejoining replica whose highest record is
    /// `top` into an exact copy, or `None` if they would provided `top` is committed (that is
    /// checked by the caller, point 2 below). Called under the state lock, so the answer holds
    /// for the cut taken right after.
    ///
    /// The argument (docs/PROTOCOL.md, "Rejoin"):
    /// 1. Sequence numbers increase along the range's update order, across head changes (a
    ///    new head continues above everything it holds). A replica receives that order
    ///    without gaps (`prev_seq`), or a snapshot plus the order after it; so its records
    ///    are the range's history up to its last record — except that a head that died may
    ///    have appended updates no one else received. Those form the *end* of its log: any
    ///    record after an uncommitted one is uncommitted too (the tail takes updates in
    ///    order). So if its last record is committed, every record it holds is.
    /// 2. Everything this tail stores is committed. If its log holds `top` (same key, seq and
    ///    contents; checked first against the key's current record, else by a scan of the
    ///    log), the rejoiner's last record is committed, and by 1 the rejoiner holds the
    ///    committed state as of `have_seq` (the back-end's `REPLICA` marker keeps out stores
    ///    that were a snapshot cut off half-way, which hold no prefix).
    /// 3. Every key changed after `have_seq` has its latest record here with a seq above
    ///    `have_seq`, unless compaction dropped it for its age (delete under the tombstone
    ///    watermark, expired put): `dropped_seq_max() <= have_seq` rules that out.
    /// 4. Appending, for every key with records above `have_seq`, its latest one (streamed in
    ///    log order; superseded ones are left out) then leaves the rejoiner with this
    ///    replica's state as of the cut; the
    ///    live stream after the cut follows as for a snapshot. `have_seq <= max_seq()` keeps
    ///    the rejoiner from mistaking later updates for duplicates.
    pub fn suffix_refusal(&self, have_seq: u64, top: &RecordMark) -> Option<String> {
        if top.seq != have_seq || have_seq == 0 {
            return Some("the replica's last record does not carry its highest seq".into());
        }
        if !self.range.contains(fawn_ring::key_id(&top.key)) {
            return Some("the replica's last record is outside this range".into());
        }
        let max = self.store.max_seq();
        if max < have_seq {
            return Some(format!("the replica holds seq {have_seq}, beyond this chain's {max}"));
        }
        let dropped = self.store.dropped_seq_max();
        if dropped > have_seq {
            return Some(format!(
                "compaction here dropped deletes or expired items up to seq {dropped}, above {have_seq}"
            ));
        }
        None
    }

    /// A snapshot stream begins: this replica takes it (and from now on only it), after
    /// emptying what an earlier stream may have written. A newer stream from the source
    /// replaces the one in progress: the source runs only the latest one it was asked for.
    pub async fn on_snapshot_begin(&self, from: NodeId, snapshot: u64) -> Result<(), WireError> {
        let mut st = self.state.lock().await;
        st.heard(from);
        let Some(sync) = st.sync.as_mut().filter(|s| s.source == from && !s.done) else {
            return Ok(());
        };
        // A replica holding old records takes a suffix or nothing: a full snapshot on top of
        // them could keep a record the chain never committed. (It is replaced by a fresh
        // replica, which takes full snapshots, when its suffix is refused.)
        if sync.suffix.is_some() {
            return Ok(());
        }
        if sync.started && sync.stream == snapshot {
            return Ok(());
        }
        if sync.started {
            info!(range = %self.range.id_string(), old = sync.stream, new = snapshot,
                "a newer snapshot stream replaces the one in progress");
            sync.abandon();
        }
        self.empty_store()?;
        sync.started = true;
        sync.stream = snapshot;
        sync.next_batch = 0;
        sync.progress_at = Some(Instant::now());
        Ok(())
    }

    /// The source agreed to a suffix after `after_seq`, streamed as `snapshot`. Taken when no
    /// stream is in progress (a suffix stream abandoned after a gap or silence is asked for
    /// again with the same plan: see `SyncProgress::abandon`).
    /// True when the stream is taken.
    pub async fn on_suffix_begin(&self, from: NodeId, snapshot: u64, after_seq: u64) -> bool {
        let mut st = self.state.lock().await;
        st.heard(from);
        let Some(sync) = st.sync.as_mut().filter(|s| s.source == from && !s.started && !s.done && !s.refused)
        else {
            return false;
        };
        if sync.suffix.as_ref().is_none_or(|p| p.have_seq != after_seq) {
            return false;
        }
        sync.started = true;
        sync.receiving_suffix = true;
        sync.stream = snapshot;
        sync.next_batch = 0;
        sync.progress_at = Some(Instant::now());
        true
    }

    /// Stops taking stream `snapshot` (if it is the one in progress): its later messages are
    /// ignored and the replica asks its source again, as after a gap.
    pub async fn drop_stream(&self, snapshot: u64) {
        let mut st = self.state.lock().await;
        if let Some(sync) = st.sync.as_mut().filter(|s| s.started && !s.done && s.stream == snapshot) {
            sync.abandon();
        }
    }

    /// The source refused the suffix. True when this replica was waiting for one from `from`:
    /// the back-end then replaces it by a fresh replica, which asks for a full snapshot.
    pub async fn on_suffix_refused(&self, from: NodeId) -> bool {
        let mut st = self.state.lock().await;
        st.heard(from);
        match st.sync.as_mut().filter(|s| s.source == from && !s.started && s.suffix.is_some()) {
            Some(sync) => {
                sync.refused = true;
                true
            }
            None => false,
        }
    }

    /// Whether this replica was refused a suffix and waits to be replaced.
    pub async fn suffix_refused(&self) -> bool {
        self.state.lock().await.sync.as_ref().is_some_and(|s| s.refused)
    }

    /// Takes this replica out of every role for good (it is being replaced while others may
    /// still hold it): it orders, applies and serves nothing from now on.
    pub async fn retire(&self) {
        let mut st = self.state.lock().await;
        st.route.rc.chain.clear();
        st.route.rc.syncing.clear();
        st.sync = None;
        self.readable.store(false, Ordering::Release);
    }

    /// Writes a batch of snapshot records with one datastore write.
    pub async fn on_snapshot_batch(
        &self,
        from: NodeId,
        snapshot: u64,
        index: u64,
        records: &[SnapshotItem],
    ) -> Result<(), WireError> {
        let mut st = self.state.lock().await;
        st.heard(from);
        let taken = |s: &&mut SyncProgress| s.source == from && s.started && !s.done && s.stream == snapshot;
        let Some(sync) = st.sync.as_mut().filter(taken) else {
            return Ok(());
        };
        if index != sync.next_batch {
            warn!(range = %self.range.id_string(), snapshot, expected = sync.next_batch, got = index,
                "snapshot batch missing; asking for a new snapshot");
            sync.abandon();
            return Ok(());
        }
        sync.records += records.len() as u64;
        sync.bytes += records.iter().map(|r| (r.key.len() + effect_bytes(&r.effect)) as u64).sum::<u64>();
        let ops: Vec<BatchOp<'_>> = records
            .iter()
            .map(|r| match &r.effect {
                ReplEffect::Put { value, flags, expiry } => {
                    BatchOp::put(&r.key, value, Meta { seq: r.seq, flags: *flags, expiry: *expiry })
                }
                ReplEffect::Delete => BatchOp::delete(&r.key, Meta { seq: r.seq, ..Meta::default() }),
            })
            .collect();
        if let Err(e) = blocking(self.writes_block, || self.store.write_batch(&ops)) {
            sync.abandon();
            return Err(storage(e));
        }
        sync.next_batch += 1;
        sync.progress_at = Some(Instant::now());
        Ok(())
    }

    /// The snapshot is complete: play the buffered updates forward.
    pub async fn on_snapshot_end(
        &self,
        from: NodeId,
        snapshot: u64,
        batches: u64,
        upto_seq: u64,
        links: &dyn LinkTo,
    ) -> Result<Followups, WireError> {
        let mut st = self.state.lock().await;
        st.heard(from);
        let taken = |s: &&mut SyncProgress| s.source == from && s.started && !s.done && s.stream == snapshot;
        let Some(sync) = st.sync.as_mut().filter(taken) else {
            return Ok(Followups::default());
        };
        if batches != sync.next_batch {
            warn!(range = %self.range.id_string(), snapshot, sent = batches, got = sync.next_batch,
                "snapshot incomplete; asking for a new snapshot");
            sync.abandon();
            return Ok(Followups::default());
        }
        sync.done = true;
        let report = SyncReport { suffix: sync.receiving_suffix, records: sync.records, bytes: sync.bytes };
        let buffered = std::mem::take(&mut sync.buffer);
        let replayed = buffered.len();
        for msg in buffered {
            if matches!(msg, ChainMsg::Replicate { seq, .. } if seq > upto_seq) {
                self.apply_locked(&mut st, msg, links).await?;
            }
        }
        let mode = if report.suffix { "suffix" } else { "full" };
        info!(range = %self.range.id_string(), mode, records = report.records, bytes = report.bytes,
            upto_seq, replayed, "sync complete");
        Ok(Followups { sync_done: true, report: Some(report) })
    }

    /// Installs this node's route of a new epoch. Returns messages that re-wire the chain.
    pub async fn install(&self, route: Route, links: &dyn LinkTo) {
        let mut st = self.state.lock().await;
        let old = std::mem::replace(&mut st.route, route.clone());
        if route.successor() != old.successor() {
            st.acked_by_successor = 0;
        }
        let epoch = route.epoch;
        let have = self.store.max_seq();
        if route.is_head() && !old.is_head() {
            st.last_seq = st.last_seq.max(have);
        }
        if old.is_syncing() && !route.is_syncing() {
            st.sync = None;
        }
        // A syncing replica promoted to tail serves gets once its predecessor confirms it
        // has everything; a replica promoted from inside the chain already has.
        if route.is_tail() && old.is_syncing() {
            self.readable.store(false, Ordering::Release);
        } else if route.is_tail() && !old.is_tail() {
            self.set_readable();
        }
        let (pred, succ) = (route.predecessor(), route.successor());
        if pred != old.predecessor() || (route.is_tail() && old.is_syncing()) {
            if let (Some(p), false) = (pred, route.is_syncing()) {
                // Dropped if the link is full: a gap asks again, a promoted tail every tick.
                queue(links, p, ChainMsg::Resend { epoch, range: self.range, after_seq: have });
            }
        }
        if succ != old.successor() || route.is_tail() {
            // A new successor gets every unacknowledged update (a tail has none to send).
            self.queue_unacked(&mut st, 0, links);
        }
        if route.is_tail() && !old.is_tail() && !old.is_syncing() {
            // Everything this replica holds is now committed.
            self.on_ack_local(have);
            self.ack_upstream(&mut st, have, links);
        }
    }

    /// Periodic retries: a syncing replica re-asks for its snapshot; a promoted tail re-asks
    /// for its catch-up confirmation; updates and acks a full link queue held back are queued
    /// again.
    pub async fn tick(&self, links: &dyn LinkTo) {
        let mut st = self.state.lock().await;
        let epoch = st.route.epoch;
        if let Some(from) = st.held_back {
            self.queue_unacked(&mut st, from, links);
        }
        if st.ack_dropped {
            if st.route.is_head() || st.route.is_syncing() {
                st.ack_dropped = false;
            } else {
                let seq = self.acked.load(Ordering::Acquire);
                self.ack_upstream(&mut st, seq, links);
            }
        }
        if let Some(sync) = st.sync.as_mut().filter(|s| {
            s.started && !s.done && s.progress_at.is_some_and(|t| t.elapsed() >= SNAPSHOT_SILENCE_MAX)
        }) {
            warn!(range = %self.range.id_string(), snapshot = sync.stream, "snapshot stream silent; asking for a new one");
            sync.abandon();
        }
        match (&st.sync, st.route.predecessor()) {
            (Some(sync), Some(pred)) if !sync.started && !sync.refused => {
                let range = self.range;
                let msg = match &sync.suffix {
                    Some(p) => {
                        ChainMsg::SuffixSyncRequest { epoch, range, have_seq: p.have_seq, top: p.top.clone() }
                    }
                    None => ChainMsg::SyncRequest { epoch, range },
                };
                queue(links, pred, msg);
            }
            (None, Some(pred)) if st.route.is_tail() && !self.readable() => {
                let after_seq = self.store.max_seq();
                queue(links, pred, ChainMsg::Resend { epoch, range: self.range, after_seq });
            }
            _ => {}
        }
    }

    /// Number of updates forwarded but not yet acknowledged.
    pub fn unacked_len(&self) -> usize {
        self.unacked.lock().len()
    }

    /// Sequence number of the oldest update forwarded but not yet acknowledged (sequence
    /// numbers are microsecond timestamps, so this dates it).
    pub fn oldest_unacked(&self) -> Option<u64> {
        self.unacked.lock().keys().next().copied()
    }

    /// What to send first on a fresh link to `peer`: the unacknowledged updates to the
    /// successor, the latest ack to the predecessor.
    pub async fn resend_on_connect(&self, peer: NodeId) -> Vec<ChainMsg> {
        let st = self.state.lock().await;
        let mut out = Vec::new();
        if st.route.successor() == Some(peer) {
            out.extend(self.unacked.lock().values().cloned());
        }
        if st.route.predecessor() == Some(peer) && st.route.is_tail() {
            out.push(ChainMsg::Ack { epoch: st.route.epoch, range: self.range, seq: self.store.max_seq() });
        } else if st.route.predecessor() == Some(peer) && st.acked_by_successor > 0 {
            // A middle replica's last ack may have been lost with the old connection; with no
            // later update the head would wait for it until the client gave up.
            let seq = st.acked_by_successor;
            out.push(ChainMsg::Ack { epoch: st.route.epoch, range: self.range, seq });
        }
        out
    }

    /// Every update in the log with a sequence number above `after`, as chain messages.
    /// Sorted by sequence number: log order need not be sequence order once maintenance has
    /// moved surviving records to another log.
    fn updates_after(&self, epoch: Epoch, after: u64) -> Result<Vec<ChainMsg>, WireError> {
        let updates = ReplicaStore::updates_after(&self.store, after).map_err(|e| WireError::Storage(e.0))?;
        let mut prev = after;
        let mut out = Vec::with_capacity(updates.len());
        for u in updates {
            let (range, seq) = (self.range, u.seq);
            out.push(ChainMsg::Replicate {
                epoch,
                range,
                seq,
                prev_seq: prev,
                key: u.key,
                effect: u.effect,
                origin: None,
            });
            prev = seq;
        }
        Ok(out)
    }

    /// Shadows every live key of this (syncing) replica's store with a tombstone of the same
    /// sequence number. A snapshot abandoned part-way leaves records the next snapshot need
    /// not overwrite: a key deleted since, whose tombstone compaction then dropped at the
    /// source, would come back. Cheap on an empty store (a fresh sync).
    fn empty_store(&self) -> Result<(), WireError> {
        let mut latest: HashMap<Vec<u8>, Option<u64>> = HashMap::new();
        for record in self.store.iter() {
            let record = record.map_err(storage)?;
            let live = matches!(record.kind, RecordKind::Put).then_some(record.meta.seq);
            latest.insert(record.key, live);
        }
        let ops: Vec<BatchOp<'_>> = latest
            .iter()
            .filter_map(|(key, live)| live.map(|seq| BatchOp::delete(key, Meta { seq, ..Meta::default() })))
            .collect();
        if !ops.is_empty() {
            info!(range = %self.range.id_string(), keys = ops.len(), "emptying an abandoned snapshot copy");
        }
        for chunk in ops.chunks(EMPTY_BATCH_OPS) {
            blocking(self.writes_block, || self.store.write_batch(chunk)).map_err(storage)?;
        }
        Ok(())
    }

    fn write(&self, key: &[u8], effect: &ReplEffect, seq: u64) -> Result<(), WireError> {
        let result = match effect {
            ReplEffect::Put { value, flags, expiry } => {
                let meta = Meta { seq, flags: *flags, expiry: *expiry };
                blocking(self.writes_block, || self.store.store(key, value, meta))
            }
            ReplEffect::Delete => {
                blocking(self.writes_block, || self.store.delete(key, Meta { seq, ..Meta::default() }))
            }
        };
        result.map_err(storage)
    }
}

/// Queues `msg` on the link to `peer` without waiting for room: whether it was queued (a
/// closed link, the back-end shutting down, counts as sent: there is nothing to retry).
fn queue(links: &dyn LinkTo, peer: NodeId, msg: ChainMsg) -> bool {
    !matches!(links.link(peer).try_send(msg), Err(TrySendError::Full(_)))
}

fn warn_full(range: Range, peer: NodeId, seq: u64) {
    warn!(range = %range.id_string(), peer, seq,
        "chain link queue full (successor cut off or not reading); holding updates back instead of waiting");
}

/// A suffix to stream: the records above `after`, each key's latest only; `latest` is a second
/// iterator from the same cut, read first to find them (one key and seq per key changed
/// after `after` held in memory). Superseded records are left out so that a suffix under a
/// workload that rewrites the same keys does not outgrow a full copy.
struct SuffixCut {
    after: u64,
    latest: fawn_ds::Iter,
}

/// Streams `records` (a snapshot iterator taken at the cut `upto_seq`) to a syncing
/// successor in `SnapshotBatch`es, then `SnapshotEnd`: all of them, or with `suffix` only
/// those it selects. Paced to `copy_bytes_per_s` (key + value bytes; 0 = unlimited).
#[allow(clippy::too_many_arguments)]
async fn stream_records(
    range: Range,
    epoch: Epoch,
    link: mpsc::Sender<ChainMsg>,
    records: fawn_ds::Iter,
    suffix: Option<SuffixCut>,
    upto_seq: u64,
    copy_bytes_per_s: u64,
    stream: StreamId,
) {
    let snapshot = stream.snapshot;
    let what = if suffix.is_some() { "suffix" } else { "snapshot" };
    let selection = match suffix {
        None => None,
        Some(cut) => {
            // A read of the whole log: off the async workers, which serve gets meanwhile.
            let after = cut.after;
            let latest = blocking(true, move || {
                let mut latest: HashMap<Vec<u8>, u64> = HashMap::new();
                for record in cut.latest {
                    let record = record?;
                    if record.meta.seq > after {
                        latest.insert(record.key, record.meta.seq);
                    }
                }
                Ok::<_, fawn_ds::Error>(latest)
            });
            let Ok(latest) = latest else {
                warn!(range = %range.id_string(), what, "read failed; the receiver will ask again");
                return;
            };
            Some((after, latest))
        }
    };
    let mut sent = 0u64;
    let mut index = 0u64;
    let mut pacer = Pacer::new(copy_bytes_per_s);
    let mut batch = Vec::new();
    let mut batch_bytes = 0usize;
    let mut records = records.peekable();
    while let Some(record) = records.next() {
        let Ok(record) = record else {
            warn!(range = %range.id_string(), what, "read failed; the receiver will ask again");
            return;
        };
        // A split range's datastore holds the other part's keys until it is compacted.
        let wanted = range.contains(key_id(&record.key))
            && selection.as_ref().is_none_or(|(after, latest)| {
                record.meta.seq > *after && latest.get(&record.key) == Some(&record.meta.seq)
            });
        if wanted {
            batch_bytes += record.key.len() + record.value.len();
            let effect = effect_of(record.kind, record.value, record.meta);
            batch.push(SnapshotItem { seq: record.meta.seq, key: record.key, effect });
        }
        if batch_bytes < SNAPSHOT_BATCH_BYTES && records.peek().is_some() {
            continue;
        }
        if batch.is_empty() {
            continue;
        }
        pacer.pace(batch_bytes).await;
        if !stream.is_current() {
            info!(range = %range.id_string(), what, snapshot, "replaced by a newer stream or no longer needed; stopping it");
            return;
        }
        sent += batch.len() as u64;
        let msg = ChainMsg::SnapshotBatch { range, snapshot, index, records: std::mem::take(&mut batch) };
        index += 1;
        batch_bytes = 0;
        if link.send(msg).await.is_err() {
            return;
        }
    }
    let _ = link.send(ChainMsg::SnapshotEnd { epoch, range, snapshot, batches: index, upto_seq }).await;
    info!(range = %range.id_string(), what, records = sent, bytes = pacer.sent,
        secs = pacer.started.elapsed().as_secs_f64(), "sent");
}

/// The suffix plan of a datastore kept from before a failure: its highest seq and the record
/// that carries it. `None` (copy the range in full) when that record is gone (compaction
/// dropped it; `max_seq` then exceeds every record), or the store is empty. Scans the whole
/// log (a local sequential read).
pub fn suffix_plan(store: &DataStore) -> Result<Option<SuffixPlan>, fawn_ds::Error> {
    let have_seq = store.max_seq();
    if have_seq == 0 {
        return Ok(None);
    }
    let mut top = None;
    for record in store.iter() {
        let record = record?;
        if record.meta.seq == have_seq {
            top = Some(record);
        }
    }
    Ok(top.map(|r| SuffixPlan { have_seq, top: mark_of(r.kind, r.key, &r.value, r.meta) }))
}

fn mark_of(kind: RecordKind, key: Vec<u8>, value: &[u8], meta: Meta) -> RecordMark {
    match kind {
        RecordKind::Put => RecordMark {
            key,
            seq: meta.seq,
            delete: false,
            value_crc: crc32c::crc32c(value),
            flags: meta.flags,
            expiry: meta.expiry,
        },
        RecordKind::Delete => {
            RecordMark { key, seq: meta.seq, delete: true, value_crc: 0, flags: 0, expiry: 0 }
        }
    }
}

/// Whether the records of `scan` include `mark`'s record.
fn log_holds(scan: fawn_ds::Iter, mark: &RecordMark) -> Result<bool, fawn_ds::Error> {
    for record in scan {
        let record = record?;
        if record.meta.seq == mark.seq
            && mark_of(record.kind, record.key, &record.value, record.meta) == *mark
        {
            return Ok(true);
        }
    }
    Ok(false)
}

fn effect_bytes(effect: &ReplEffect) -> usize {
    match effect {
        ReplEffect::Put { value, .. } => value.len(),
        ReplEffect::Delete => 0,
    }
}

/// Key + value bytes per snapshot message: large enough that per-message costs vanish, small
/// enough that pacing stays smooth and a chain link's queue is not held up for long.
const SNAPSHOT_BATCH_BYTES: usize = 64 << 10;
// A batch closes at the first record that reaches the target, so it can exceed it by one
// largest record; with per-item framing overhead it must still fit one frame.
const _: () = assert!(
    2 * (SNAPSHOT_BATCH_BYTES + fawn_ds::limits::RECORD_BYTES_MAX) < fawn_proto::native::FRAME_BYTES_MAX
);

/// Paces a stream to a byte rate: once `sent` bytes went out, the next waits until
/// `sent / rate` seconds have passed since the start (no burst beyond one timer tick).
struct Pacer {
    started: Instant,
    bytes_per_s: u64,
    sent: u64,
}

impl Pacer {
    fn new(bytes_per_s: u64) -> Pacer {
        Pacer { started: Instant::now(), bytes_per_s, sent: 0 }
    }

    async fn pace(&mut self, bytes: usize) {
        self.sent += bytes as u64;
        if self.bytes_per_s == 0 {
            return;
        }
        let due = Duration::from_secs_f64(self.sent as f64 / self.bytes_per_s as f64);
        let elapsed = self.started.elapsed();
        // Sleep only when a few ms ahead: the timer's resolution is 1 ms.
        if due > elapsed + Duration::from_millis(2) {
            tokio::time::sleep(due - elapsed).await;
        }
    }
}

/// One outgoing snapshot or suffix stream of a range: its id and whether the range still
/// wants it (the source runs only the latest stream it was asked for, and none for a range
/// it dropped).
struct StreamId {
    snapshot: u64,
    replica: std::sync::Weak<RangeReplica>,
}

impl StreamId {
    /// Starts stream `snapshot` (from `snapshot_id`): it replaces whatever stream of this
    /// range was running.
    fn start(replica: &Arc<RangeReplica>, snapshot: u64) -> StreamId {
        replica.snapshot_sending.store(snapshot, Ordering::Release);
        StreamId { snapshot, replica: Arc::downgrade(replica) }
    }

    fn is_current(&self) -> bool {
        self.replica.upgrade().is_some_and(|r| r.snapshot_sending.load(Ordering::Acquire) == self.snapshot)
    }
}

/// A name for a new snapshot stream, unique among this process's streams and, being a
/// microsecond clock reading, across its restarts.
fn snapshot_id() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = crate::clock::unix_micros();
    let mut prev = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(prev + 1);
        match LAST.compare_exchange_weak(prev, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(p) => prev = p,
        }
    }
}

fn effect_of(kind: RecordKind, value: Vec<u8>, meta: Meta) -> ReplEffect {
    match kind {
        RecordKind::Put => ReplEffect::Put { value, flags: meta.flags, expiry: meta.expiry },
        RecordKind::Delete => ReplEffect::Delete,
    }
}

/// Runs a storage call that may wait for an fsync without stalling other tasks on this worker.
pub(crate) fn blocking<T>(may_block: bool, f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if may_block && h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

pub fn storage(e: fawn_ds::Error) -> WireError {
    match e {
        fawn_ds::Error::KeyTooLarge { .. } | fawn_ds::Error::ValueTooLarge { .. } => WireError::TooLarge,
        other => WireError::Storage(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fawn_proto::native::RangeConfig;

    type Wire = (mpsc::Sender<ChainMsg>, mpsc::Receiver<ChainMsg>);

    /// Links that keep what is sent, per peer.
    #[derive(Default)]
    struct Wires(Mutex<HashMap<NodeId, Wire>>);

    impl LinkTo for Wires {
        fn link(&self, peer: NodeId) -> mpsc::Sender<ChainMsg> {
            self.0.lock().entry(peer).or_insert_with(|| mpsc::channel(1024)).0.clone()
        }
        fn committed(&self, _: &str, _: ReqId, _: Outcome, _: &[u8]) {}
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
        let effect = ReplEffect::Put { value: value.as_bytes().to_vec(), flags: 0, expiry: 0 };
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
        fn committed(&self, _: &str, _: ReqId, _: Outcome, _: &[u8]) {}
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
                    match head.order_update(req(n), &set(n), None, 0, &*net).await {
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
        let next = head.order_update(req(ordered), &set(ordered), None, 0, &*net).await.expect("order");
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
            head.order_update(req(n), &set(n), None, 0, &wires).await.expect("order");
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
        let mut last = 0;
        for n in 0..UNACKED_UPDATES_MAX as u64 {
            if let Ordered::AwaitAck { seq, .. } =
                head.order_update(req(n), &set(n), None, 0, &wires).await.expect("order")
            {
                last = seq;
            }
        }
        let full = head.order_update(req(1 << 40), &set(0), None, 0, &wires).await;
        assert!(matches!(full, Err(WireError::Unavailable(_))), "{:?}", full.is_ok());
        let retry = head.order_update(req(7), &set(7), None, 0, &wires).await;
        assert!(matches!(retry, Ok(Ordered::AwaitAck { .. })), "a retry was refused");
        head.on_ack(2, last, &wires).await;
        let after = head.order_update(req(1 << 40), &set(0), None, 0, &wires).await;
        assert!(after.is_ok(), "still refused after the acks");
    }

    #[tokio::test]
    async fn a_middle_replica_acks_again_on_a_new_connection_to_its_predecessor() {
        // The ack it passed upstream may have been lost with the old connection; the head
        // must not wait for the next update to learn that its updates committed.
        let dir = tempfile::tempdir().expect("tempdir");
        let wires = Wires::default();
        let middle = replica(dir.path(), route(5, 2, &[1, 2, 3], &[]));
        assert!(middle.resend_on_connect(1).await.is_empty(), "nothing acknowledged yet");
        middle.on_ack(3, 42, &wires).await;
        let first = middle.resend_on_connect(1).await;
        assert!(matches!(first.as_slice(), [ChainMsg::Ack { seq: 42, .. }]), "{first:?}");
        middle.install(route(6, 2, &[1, 2, 4], &[]), &wires).await;
        assert!(middle.resend_on_connect(1).await.is_empty(), "an ack of the old successor");
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
        s.on_snapshot_end(2, 8, 0, 0, &wires).await.expect("end");
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
        c.on_resend(3, 0, &wires).await.expect("resend");
        let sent = wires.sent(3);
        assert!(sent.iter().any(|m| matches!(m, ChainMsg::Replicate { seq: 10, .. })), "{sent:?}");
        assert!(
            !sent.iter().any(|m| matches!(m, ChainMsg::CaughtUp { .. })),
            "a node that is still the tail confirmed its successor caught up: {sent:?}"
        );
        // Once it has stepped down to a middle node, the confirmation follows the updates.
        c.install(route(6, 2, &[1, 2, 3], &[]), &wires).await;
        let _ = wires.sent(3);
        c.on_resend(3, 0, &wires).await.expect("resend");
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
        let f = s.on_snapshot_end(2, 7, 4, 4, &wires).await.expect("end");
        assert!(!f.sync_done, "the end of another stream finished the sync");
        assert_eq!(s.sync_status().await, Some((2, true, false)));
        let f = s.on_snapshot_end(2, 8, 1, 5, &wires).await.expect("end");
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
        assert!(!s.on_snapshot_end(2, 8, 2, 6, &wires).await.expect("end").sync_done);
        // A repeated Begin of the stream taken changes nothing.
        s.on_snapshot_begin(2, 9).await.expect("begin");
        assert!(s.on_snapshot_end(2, 9, 1, 7, &wires).await.expect("end").sync_done);
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
        let f = s.on_snapshot_end(2, 8, 3, 7, &wires).await.expect("end");
        assert!(!f.sync_done, "a stream with a gap finished the sync");
        // The replica asks again; "a" was deleted meanwhile and its tombstone compacted away
        // at the source, so the new snapshot does not mention it: it must not come back.
        s.tick(&wires).await;
        assert!(wires.sent(2).iter().any(|m| matches!(m, ChainMsg::SyncRequest { .. })));
        s.on_snapshot_begin(2, 9).await.expect("begin");
        s.on_snapshot_batch(2, 9, 0, &[put("c", 7, "c")]).await.expect("batch");
        let f = s.on_snapshot_end(2, 9, 1, 9, &wires).await.expect("end");
        assert!(f.sync_done);
        assert_eq!(value(&s, "a"), None, "a record of the abandoned stream came back");
        assert_eq!(value(&s, "c").as_deref(), Some("c"));
    }
}
