//! One replicated range on one back-end: the async shell around the range's replica state
//! machine (`replica::machine::Replica`), its datastore and its snapshot streams.
//!
//! The chain protocol — ordering at the head, dedup, applying with gap detection, acks,
//! resends, re-wiring on a new configuration, who may serve gets — lives in the machine. This
//! shell turns calls and chain messages into machine events and carries out the actions it
//! returns: sends queued on links, replies to waiting requests, `Committed` to front-ends.
//! Snapshot and suffix streams, source (`source.rs`) and sink (`sink.rs`), stay here.
//!
//! Every step of the machine runs under the range's one `state` lock, so each happens
//! entirely before or after the others, and the datastore is appended inside the step: append
//! order is sequence order. Sends are queued while holding the lock, so each link carries a
//! range's updates in sequence order. They are queued without waiting (`queue`): a link whose
//! queue is full (a successor cut off or not reading) must not hold the lock, or nothing else
//! could run on the range — not even the new configuration that repairs the chain around the
//! cut. What does not fit is reported back to the machine (`Event::Dropped`, with everything
//! after it to the same peer left unsent), which sends it again from its unacknowledged list
//! (`Event::Tick`, `Event::Room`), or is asked for again by the receiver (a gap in
//! `prev_seq`, a promoted tail's `Resend`).
//!
//! Gets do not take the lock: the handler checks the machine's `readable` (mirrored in an
//! atomic after every step) and reads the datastore directly.

mod sink;
mod source;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fawn_ds::DataStore;
use fawn_proto::native::{ChainMsg, CommittedNotice, Epoch, OutcomeEntry, ReqId, WireError};
use fawn_proto::op::{Item, Outcome, Update};
use fawn_ring::{NodeId, Range};
use parking_lot::Mutex;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use crate::clock::{flushed, unix_micros, unix_now};

use crate::replica::machine::{Action, ClientUpdate, Event, Replica};
pub use crate::replica::route::Route;
use crate::replica::store::{Append, ReplicaStore, StoreError, StoredUpdate};
use crate::replica::sync::SyncProgress;
pub use sink::SuffixPlan;
pub use source::suffix_plan;

/// Where a link to a peer back-end can be had.
pub trait LinkTo: Send + Sync {
    fn link(&self, peer: NodeId) -> mpsc::Sender<ChainMsg>;
    /// Tell the front-end at `reply_to` that these updates of it committed (fire and forget).
    fn committed(&self, reply_to: &str, notices: Vec<CommittedNotice>);
}

/// The first write error of a range's datastore (a full disk, an I/O error, a poisoned
/// store), kept for the back-end to report (`Backend::check_disk`).
type WriteFault = Arc<Mutex<Option<String>>>;

/// Keeps `e` as the datastore's write fault unless one is kept already. A record too large is
/// the client's error, not the disk's.
fn note_write_fault(fault: &WriteFault, e: &StoreError) {
    if let StoreError::Failed(why) = e {
        fault.lock().get_or_insert_with(|| why.clone());
    }
}

/// The range's datastore as the machine writes it: appends that may wait for an fsync run
/// with `block_in_place` (`writes_block`); a failed append is kept as the write fault.
struct ShellStore {
    ds: Arc<DataStore>,
    writes_block: bool,
    fault: WriteFault,
}

impl ReplicaStore for ShellStore {
    fn append(&mut self, update: &Append<'_>) -> Result<(), StoreError> {
        let ds = &mut self.ds;
        let r = blocking(self.writes_block, || ds.append(update));
        r.inspect_err(|e| note_write_fault(&self.fault, e))
    }

    fn append_batch(&mut self, updates: &[Append<'_>]) -> Result<(), StoreError> {
        let ds = &mut self.ds;
        let r = blocking(self.writes_block, || ds.append_batch(updates));
        r.inspect_err(|e| note_write_fault(&self.fault, e))
    }

    fn kept_outcomes(&self) -> Vec<OutcomeEntry> {
        ReplicaStore::kept_outcomes(&self.ds)
    }

    fn forget_outcomes_below(&mut self, seq: u64) {
        ReplicaStore::forget_outcomes_below(&mut self.ds, seq);
    }

    /// Writes a checkpoint when it adopts any: always with `block_in_place`.
    fn adopt_outcomes(&mut self, outcomes: &[OutcomeEntry]) -> Result<(), StoreError> {
        let ds = &mut self.ds;
        let r = blocking(true, || ReplicaStore::adopt_outcomes(ds, outcomes));
        r.inspect_err(|e| note_write_fault(&self.fault, e))
    }

    fn max_seq(&self) -> u64 {
        self.ds.max_seq()
    }

    fn read(&self, key: &[u8]) -> Result<Option<Item>, StoreError> {
        ReplicaStore::read(&self.ds, key)
    }

    fn updates_after(&self, after: u64) -> Result<Vec<StoredUpdate>, StoreError> {
        ReplicaStore::updates_after(&self.ds, after)
    }
}

struct WriteState {
    machine: Replica<ShellStore>,
    sync: Option<SyncProgress>,
    /// What the sync code's times count from.
    origin: std::time::Instant,
}

/// Who sent a client update, as the head takes it: its request id, the client's floor
/// (`ReqId`) and the epoch of the configuration it was routed by.
#[derive(Clone, Copy, Debug)]
pub struct ClientReq {
    pub req: ReqId,
    pub floor: u64,
    pub epoch: Epoch,
}

/// What the head did with an update.
pub enum Ordered {
    /// Reply now.
    Reply(Outcome),
    /// The reply comes once the tail has acknowledged the update.
    AwaitAck(oneshot::Receiver<Result<Outcome, WireError>>),
    /// Forwarded with its front-end's `reply_to`: the tail's `Committed` notice answers it,
    /// and nothing waits here (a notice that never comes makes the front-end ask again).
    Notified,
}

/// Updates waiting for their reply, by request (a retry of a request still waiting waits
/// too; replies for one request come in the order its updates arrived).
type Pending = HashMap<ReqId, VecDeque<oneshot::Sender<Result<Outcome, WireError>>>>;

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
    /// Mirrors of the machine, read without the lock.
    acked: AtomicU64,
    /// The tombstone watermark last given to the datastore.
    watermark: AtomicU64,
    unacked_len: AtomicUsize,
    /// 0: none.
    oldest_unacked: AtomicU64,
    readable: AtomicBool,
    /// The snapshot stream this replica is sending (0: none). A new `SyncRequest` replaces the
    /// stream in progress: at most one runs per range, however many requests queued up.
    snapshot_sending: AtomicU64,
    /// Woken when `readable` turns true (gets that arrived early wait instead of retrying).
    became_readable: tokio::sync::Notify,
    pending: Mutex<Pending>,
    /// A suffix request is being decided by a scan of the log (the successor's retries
    /// meanwhile are ignored).
    suffix_scan: Arc<AtomicBool>,
    /// The first failed write of the datastore (chain appends and snapshot batches).
    write_fault: WriteFault,
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
            st.machine.inherit(&mut from.machine);
        }
        heir.mirror(&st.machine);
        drop(st);
        heir
    }

    /// Head of a range being split: nothing it ordered is unacknowledged, and it orders
    /// nothing new (`order_update` refuses), so every in-sync replica holds the same contents
    /// and the manager may split the range (`Request::SplitReady`).
    pub async fn ready_to_split(&self) -> bool {
        let st = self.state.lock().await;
        st.machine.route().rc.splitting.is_some()
            && !self.bulk_copy_pending.load(Ordering::Acquire)
            && st.machine.drained_head()
    }

    /// Head of a range being merged (`RangeConfig::merging`) that has not said so yet, drained
    /// as for [`RangeReplica::ready_to_split`] (`Request::MergeReady`).
    pub async fn ready_to_merge(&self) -> bool {
        let st = self.state.lock().await;
        let rc = &st.machine.route().rc;
        rc.merging.is_some()
            && !rc.merge_drained
            && !self.bulk_copy_pending.load(Ordering::Acquire)
            && st.machine.drained_head()
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
        let source = route.predecessor().unwrap_or(route.me);
        let sync = route.is_syncing().then(|| SyncProgress::new(source, plan, Duration::ZERO));
        let range = route.rc.range;
        let write_fault = WriteFault::default();
        let shell_store =
            ShellStore { ds: Arc::clone(&store), writes_block, fault: Arc::clone(&write_fault) };
        let machine = Replica::new(shell_store, route).with_shell_sync();
        let (acked, readable) = (machine.acked(), machine.readable());
        RangeReplica {
            writes_block,
            range,
            store,
            readable: AtomicBool::new(readable),
            bulk_copy_pending: AtomicBool::new(false),
            became_readable: tokio::sync::Notify::new(),
            acked: AtomicU64::new(acked),
            watermark: AtomicU64::new(0),
            unacked_len: AtomicUsize::new(0),
            oldest_unacked: AtomicU64::new(0),
            snapshot_sending: AtomicU64::new(0),
            pending: Mutex::new(HashMap::new()),
            suffix_scan: Arc::new(AtomicBool::new(false)),
            write_fault,
            state: tokio::sync::Mutex::new(WriteState { machine, sync, origin: std::time::Instant::now() }),
        }
    }

    /// Why this replica's datastore cannot be written, if it failed a write or is poisoned
    /// (a background fsync failed: every later write fails). Sticky: a full disk that got room
    /// again does not make the node a safe replica by itself (see `Backend::check_disk`).
    pub fn write_fault(&self) -> Option<String> {
        if let Some(why) = self.write_fault.lock().clone() {
            return Some(why);
        }
        self.store.stats().poisoned.then(|| fawn_ds::Error::Poisoned.to_string())
    }

    /// Keeps a failed snapshot write as the write fault (see [`RangeReplica::write_fault`]).
    fn note_write_error(&self, e: &fawn_ds::Error) {
        if !matches!(e, fawn_ds::Error::KeyTooLarge { .. } | fawn_ds::Error::ValueTooLarge { .. }) {
            self.write_fault.lock().get_or_insert_with(|| e.to_string());
        }
    }

    /// The visible item for `key` (absent if deleted, expired or flushed).
    pub fn read(&self, key: &[u8], flush_at: u64) -> Result<Option<Item>, WireError> {
        let entry = self.store.lookup(key).map_err(storage)?;
        let now = unix_now();
        Ok(entry.and_then(|e| {
            let meta = e.meta;
            let item = Item {
                value: e.value,
                flags: meta.flags,
                expiry: meta.expiry,
                cas: meta.seq,
                state: meta.state,
            };
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

    /// The route as of now.
    pub async fn route(&self) -> Route {
        self.state.lock().await.machine.route().clone()
    }

    /// Head: decide and append an update, and queue it to the successor.
    pub async fn order_update(
        &self,
        from: ClientReq,
        update: &Update,
        reply_to: Option<String>,
        flush_at: u64,
        links: &dyn LinkTo,
    ) -> Result<Ordered, WireError> {
        let ClientReq { req, floor, epoch } = from;
        let mut st = self.state.lock().await;
        let event = Event::Update(ClientUpdate {
            req,
            update: update.clone(),
            reply_to,
            now: unix_now(),
            now_micros: unix_micros(),
            flush_at,
            bulk_copy_pending: self.bulk_copy_pending.load(Ordering::Acquire),
            floor,
            epoch,
        });
        let actions = st.machine.step(event);
        let answer = self.execute(&mut st, actions, links, &[req]).pop().flatten();
        self.ordered(req, answer)
    }

    /// Head: client updates that arrived together, in order, as one step of the machine
    /// (`Event::Updates`: the plain sets among them with one append), their sends queued
    /// together. One result each, in order: `Ordered::Notified` for one this step forwarded
    /// with a `reply_to` that `notice_reaches` (the tail will tell that front-end).
    pub async fn order_updates(
        &self,
        updates: Vec<(ClientReq, Update, Option<String>)>,
        flush_at: u64,
        links: &dyn LinkTo,
        notice_reaches: impl Fn(&str) -> bool,
    ) -> Vec<Result<Ordered, WireError>> {
        let mut st = self.state.lock().await;
        let (now, now_micros) = (unix_now(), unix_micros());
        let bulk_copy_pending = self.bulk_copy_pending.load(Ordering::Acquire);
        let reqs: Vec<ReqId> = updates.iter().map(|(from, ..)| from.req).collect();
        let reaches: Vec<bool> =
            updates.iter().map(|(_, _, to)| to.as_deref().is_some_and(&notice_reaches)).collect();
        let event = Event::Updates(
            updates
                .into_iter()
                .map(|(ClientReq { req, floor, epoch }, update, reply_to)| ClientUpdate {
                    req,
                    update,
                    reply_to,
                    now,
                    now_micros,
                    flush_at,
                    bulk_copy_pending,
                    floor,
                    epoch,
                })
                .collect(),
        );
        let actions = st.machine.step(event);
        let (answers, forwarded) = self.execute_step(&mut st, actions, links, &reqs);
        reqs.into_iter()
            .zip(answers)
            .zip(reaches)
            .map(|((req, answer), reaches)| match answer {
                None if reaches && forwarded.contains(&req) => Ok(Ordered::Notified),
                answer => self.ordered(req, answer),
            })
            .collect()
    }

    /// What the head did with `req`, given the reply a step gave it, if any. Called under the
    /// state lock: a waiter is registered before any later step can answer it.
    fn ordered(&self, req: ReqId, answer: Option<Result<Outcome, WireError>>) -> Result<Ordered, WireError> {
        match answer {
            Some(Ok(outcome)) => Ok(Ordered::Reply(outcome)),
            Some(Err(e)) => Err(e),
            None => {
                let (tx, rx) = oneshot::channel();
                self.pending.lock().entry(req).or_default().push_back(tx);
                Ok(Ordered::AwaitAck(rx))
            }
        }
    }

    /// Waits up to `timeout` for the reply to `req` (`Ordered::AwaitAck`).
    pub async fn wait_reply(
        &self,
        req: ReqId,
        rx: oneshot::Receiver<Result<Outcome, WireError>>,
        timeout: Duration,
    ) -> Result<Outcome, WireError> {
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => reply,
            _ => {
                // Forget waiters that gave up: a reply that never comes must not pin them.
                let mut pending = self.pending.lock();
                if let Some(q) = pending.get_mut(&req) {
                    q.retain(|tx| !tx.is_closed());
                    if q.is_empty() {
                        pending.remove(&req);
                    }
                }
                Err(WireError::Timeout)
            }
        }
    }

    /// Steps the machine with `event` and carries out its actions.
    async fn run(&self, event: Event, links: &dyn LinkTo) {
        let mut st = self.state.lock().await;
        let actions = st.machine.step(event);
        self.execute(&mut st, actions, links, &[]);
    }

    /// Carries out the machine's actions, in order. A send that does not fit its link is
    /// reported back (`Event::Dropped`), and nothing after it goes to the same peer in this
    /// batch (the receiver takes updates in order, and a `CaughtUp` must not overtake what
    /// it confirms). The `Committed` notices of the step go as one request per front-end.
    /// Returns the reply to each of `mine` (the caller's requests, in order), if one came: the
    /// caller answers those; a request's first reply goes to its first entry.
    fn execute(
        &self,
        st: &mut WriteState,
        actions: Vec<Action>,
        links: &dyn LinkTo,
        mine: &[ReqId],
    ) -> Vec<Option<Result<Outcome, WireError>>> {
        self.execute_step(st, actions, links, mine).0
    }

    /// [`Self::execute`], also returning those of `mine` whose update this step sent on with
    /// a `reply_to` (the tail tells that front-end when it commits).
    fn execute_step(
        &self,
        st: &mut WriteState,
        actions: Vec<Action>,
        links: &dyn LinkTo,
        mine: &[ReqId],
    ) -> (Vec<Option<Result<Outcome, WireError>>>, Vec<ReqId>) {
        let mut forwarded = Vec::new();
        let mut answers: Vec<Option<Result<Outcome, WireError>>> = mine.iter().map(|_| None).collect();
        let mut slots: HashMap<ReqId, VecDeque<usize>> = HashMap::new();
        for (i, req) in mine.iter().enumerate() {
            slots.entry(*req).or_default().push_back(i);
        }
        let mut notices: Vec<(String, Vec<CommittedNotice>)> = Vec::new();
        let mut actions = actions;
        // At most one `Room` retry: a link that fills again waits for the tick.
        for _ in 0..2 {
            let mut full: Vec<NodeId> = Vec::new();
            let superseded = superseded_acks(&actions);
            for (i, action) in actions.into_iter().enumerate() {
                match action {
                    Action::Send { to, msg } => {
                        if full.contains(&to) || superseded[i] {
                            continue;
                        }
                        if let ChainMsg::Replicate { origin: Some(o), .. } = &msg {
                            if o.reply_to.is_some() && slots.contains_key(&o.req) {
                                forwarded.push(o.req);
                            }
                        }
                        if let Err(TrySendError::Full(msg)) = links.link(to).try_send(msg) {
                            full.push(to);
                            warn_full(self.range, to);
                            st.machine.step(Event::Dropped { to, msg });
                        }
                    }
                    Action::Reply { req, result } => match slots.get_mut(&req).and_then(|q| q.pop_front()) {
                        Some(i) => answers[i] = Some(result),
                        None => self.answer(req, result),
                    },
                    Action::Committed { reply_to, req, outcome, key } => {
                        let notice = CommittedNotice { req, outcome, key };
                        match notices.iter_mut().find(|(to, _)| *to == reply_to) {
                            Some((_, batch)) => batch.push(notice),
                            None => notices.push((reply_to, vec![notice])),
                        }
                    }
                    // Gets are served without the machine; the sink reports a finished sync.
                    Action::GetReply { .. } | Action::SyncDone => {}
                }
            }
            actions = match st.machine.route().successor() {
                Some(succ) if st.machine.held_back().is_some() && links.link(succ).capacity() > 0 => {
                    st.machine.step(Event::Room { peer: succ })
                }
                _ => break,
            };
        }
        for (reply_to, batch) in notices {
            links.committed(&reply_to, batch);
        }
        self.mirror(&st.machine);
        (answers, forwarded)
    }

    fn answer(&self, req: ReqId, result: Result<Outcome, WireError>) {
        let mut pending = self.pending.lock();
        if let Some(q) = pending.get_mut(&req) {
            if let Some(tx) = q.pop_front() {
                let _ = tx.send(result);
            }
            if q.is_empty() {
                pending.remove(&req);
            }
        }
    }

    /// Copies what is read without the lock out of the machine.
    fn mirror(&self, m: &Replica<ShellStore>) {
        let acked = m.acked();
        self.acked.fetch_max(acked, Ordering::AcqRel);
        // Every in-chain replica holds committed deletes, and a new replica starts from a
        // snapshot: compaction may drop tombstones up to here (`Replica::tombstone_watermark`).
        let watermark = m.tombstone_watermark();
        if self.watermark.fetch_max(watermark, Ordering::AcqRel) < watermark {
            self.store.set_tombstone_watermark(watermark);
        }
        self.unacked_len.store(m.unacked_len(), Ordering::Release);
        self.oldest_unacked.store(m.oldest_unacked().unwrap_or(0), Ordering::Release);
        let readable = m.readable();
        if readable != self.readable.swap(readable, Ordering::AcqRel) && readable {
            info!(range = %self.range.id_string(), "serving gets as tail");
            self.became_readable.notify_waiters();
        }
    }

    /// An ack from downstream: commit locally and pass it upstream.
    pub async fn on_ack(&self, from: NodeId, seq: u64, links: &dyn LinkTo) {
        let (epoch, range) = (0, self.range);
        self.run(Event::Chain { from, msg: ChainMsg::Ack { epoch, range, seq } }, links).await;
    }

    /// Replicated updates from upstream that arrived together, in order (buffered while a
    /// snapshot streams in): one step of the machine, so one append, and their sends and
    /// acks queued together.
    pub async fn on_replicates(
        &self,
        from: NodeId,
        msgs: Vec<ChainMsg>,
        links: &dyn LinkTo,
    ) -> Result<(), WireError> {
        let mut st = self.state.lock().await;
        if st.machine.route().predecessor() != Some(from) {
            return Ok(());
        }
        st.heard(from);
        let mut msgs = msgs;
        if self.buffer_if_syncing(&mut st, &mut msgs) {
            return Ok(());
        }
        let actions = st.machine.step(Event::Replicates { from, msgs });
        self.execute(&mut st, actions, links, &[]);
        Ok(())
    }

    /// Chain messages the machine handles as they come: `Resend`, `CaughtUp`, `Outcomes`.
    pub async fn on_chain(&self, from: NodeId, msg: ChainMsg, links: &dyn LinkTo) {
        if let ChainMsg::Resend { after_seq, .. } = msg {
            info!(range = %self.range.id_string(), after_seq, to = from, "resending updates");
        }
        let mut st = self.state.lock().await;
        st.heard(from);
        // A copy's outcomes wait for its end (`SyncProgress::copy_outcomes`).
        let msg = match (msg, st.sync.as_mut()) {
            (ChainMsg::Outcomes { epoch, range, entries }, Some(sync)) => {
                match sync.copy_outcomes(from, entries) {
                    Some(entries) => ChainMsg::Outcomes { epoch, range, entries },
                    None => return,
                }
            }
            (msg, _) => msg,
        };
        let actions = st.machine.step(Event::Chain { from, msg });
        self.execute(&mut st, actions, links, &[]);
    }

    /// Asks `pred`, if it is this replica's predecessor, for every update after what the
    /// datastore holds (`Backend::resend_after_catch_up`).
    pub async fn ask_resend(&self, pred: NodeId, links: &dyn LinkTo) {
        self.run(Event::AskResend { from: pred }, links).await;
    }

    /// Takes this replica out of every role for good (it is being replaced while others may
    /// still hold it): it orders, applies and serves nothing from now on.
    pub async fn retire(&self) {
        let mut st = self.state.lock().await;
        st.machine.retire();
        st.sync = None;
        self.readable.store(false, Ordering::Release);
    }

    /// Installs this node's route of a new epoch, re-wiring the chain.
    pub async fn install(&self, route: Route, links: &dyn LinkTo) {
        let mut st = self.state.lock().await;
        if st.machine.route().is_syncing() && !route.is_syncing() {
            st.sync = None;
        }
        let actions = st.machine.step(Event::Install(route));
        self.execute(&mut st, actions, links, &[]);
    }

    /// Periodic retries: a syncing replica re-asks for its snapshot (`sink.rs`); the machine
    /// sends again what a full link held back and a promoted tail re-asks for its catch-up
    /// confirmation.
    pub async fn tick(&self, links: &dyn LinkTo) {
        let mut st = self.state.lock().await;
        self.tick_sync(&mut st, links);
        let actions = st.machine.step(Event::Tick);
        self.execute(&mut st, actions, links, &[]);
    }

    /// Number of updates forwarded but not yet acknowledged.
    pub fn unacked_len(&self) -> usize {
        self.unacked_len.load(Ordering::Acquire)
    }

    /// Sequence number of the oldest update forwarded but not yet acknowledged (sequence
    /// numbers are microsecond timestamps, so this dates it).
    pub fn oldest_unacked(&self) -> Option<u64> {
        Some(self.oldest_unacked.load(Ordering::Acquire)).filter(|s| *s > 0)
    }

    /// What to send first on a fresh link to `peer`: the unacknowledged updates to the
    /// successor, the latest ack to the predecessor.
    pub async fn resend_on_connect(&self, peer: NodeId) -> Vec<ChainMsg> {
        let mut st = self.state.lock().await;
        let actions = st.machine.step(Event::Connected { peer });
        self.mirror(&st.machine);
        actions
            .into_iter()
            .filter_map(|a| match a {
                Action::Send { to, msg } if to == peer => Some(msg),
                _ => None,
            })
            .collect()
    }
}

/// Which of `actions` are acks another ack of the same range to the same peer makes
/// needless: acks are cumulative, so of a batch's acks only the highest of each is sent.
fn superseded_acks(actions: &[Action]) -> Vec<bool> {
    let mut best: HashMap<(NodeId, Range), (u64, usize)> = HashMap::new();
    let mut superseded = vec![false; actions.len()];
    for (i, action) in actions.iter().enumerate() {
        if let Action::Send { to, msg: ChainMsg::Ack { range, seq, .. } } = action {
            match best.get_mut(&(*to, *range)) {
                Some((top, at)) if *seq >= *top => {
                    superseded[*at] = true;
                    (*top, *at) = (*seq, i);
                }
                Some(_) => superseded[i] = true,
                None => {
                    best.insert((*to, *range), (*seq, i));
                }
            }
        }
    }
    superseded
}

/// Queues `msg` on the link to `peer` without waiting for room: whether it was queued (a
/// closed link, the back-end shutting down, counts as sent: there is nothing to retry).
fn queue(links: &dyn LinkTo, peer: NodeId, msg: ChainMsg) -> bool {
    !matches!(links.link(peer).try_send(msg), Err(TrySendError::Full(_)))
}

fn warn_full(range: Range, peer: NodeId) {
    warn!(range = %range.id_string(), peer,
        "chain link queue full (successor cut off or not reading); holding messages back instead of waiting");
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
