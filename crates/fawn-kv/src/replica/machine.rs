//! One range replica's chain write path as a pure state machine: `step(event) -> actions`.
//!
//! It covers ordering at the head (dedup, decide, seq), applying at every other replica (gap
//! and duplicate detection by `prev_seq`), acks from the tail back up, resends (asked for on a
//! gap, a new predecessor or a promotion; unacknowledged updates re-sent on a new connection
//! or to a new successor), gets at the tail, and a syncing replica catching up. The datastore
//! is written through [`ReplicaStore`] inside `step`, so append order is seq order. A syncing
//! replica's copy is a snapshot or suffix stream whose decisions are `replica::sync`'s; the
//! back-end's shell (`backend::range`) and the simulator run them, and this machine with
//! `with_shell_sync`: the caller buffers a syncing replica's updates while its copy streams
//! in and feeds them here afterwards (`sync::replay`), then `SnapshotEnd` ends the sync.
//! Without `with_shell_sync` (unit tests) a syncing replica catches up by asking its source to
//! resend its log (`Resend` after 0), and a `SnapshotEnd` after the resent updates ends it.
//!
//! Sends are executed by the caller in order per peer; one that does not fit its link is
//! reported back (`Event::Dropped`) together with everything after it to the same peer, and
//! retried from `unacked` (updates) or the latest ack (acks) on `Tick` or `Room`.

use std::collections::{BTreeMap, HashMap};

use fawn_proto::native::{ChainMsg, Epoch, Origin, OutcomeEntry, ReplEffect, ReqId, WireError};
use fawn_proto::op::{decide, is_expired, Effect, Item, Mutation, Outcome, UnixSeconds, Update};
use fawn_ring::{NodeId, Range};

use super::dedup::Dedup;
use super::route::Route;
use super::store::{Append, ReplicaStore, StoreError, StoredUpdate};

/// Updates a head keeps forwarded but unacknowledged before it refuses new ones
/// (`Unavailable`, which clients retry): the backpressure a full link queue gave when the head
/// waited for room, without holding the range lock (a successor cut off under put load).
pub const UNACKED_UPDATES_MAX: usize = 16_384;

/// Faults that can be switched on to show the simulator finds them. Only a build with the
/// `faults` feature can switch one on (`Replica::with_fault`); otherwise `faulty` is false.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A replica promoted to head starts with an empty dedup table.
    ForgetDedupOnPromotion,
    /// A replica whose successor changes does not send it its unacknowledged updates.
    NoUnackedToNewSuccessor,
    /// A syncing replica promoted to tail serves gets before its predecessor said `CaughtUp`.
    TailReadsBeforeCaughtUp,
    /// A replica applies an update whose `prev_seq` it does not hold.
    ApplyAcrossGap,
    /// A node still tail in its own view confirms `CaughtUp` to its promoted successor.
    CaughtUpFromOldTail,
    /// Resent updates travel without the request outcomes of the updates they carry.
    NoOutcomesWithResend,
    /// A range's unproven tail reports `TailReady` as soon as it is promoted, before its
    /// predecessor said `CaughtUp`: the manager takes it for a copy of the range too early.
    TailReadyBeforeCaughtUp,
    /// A syncing or promoted replica takes the end of its copy (`SnapshotEnd`, `CaughtUp`)
    /// without checking it stored everything up to the seq it names (appends failed: a full
    /// disk).
    IncompleteCopyAccepted,
    /// A replica made by a split or merge does not take over its parent's recent requests.
    HeirForgetsRequests,
    /// A head orders a copy of a request below its client's floor that it no longer
    /// remembers (a late copy of an attempt the client gave up on) as a new request.
    StaleCopyOrdered,
    /// A sync source grants a suffix although compaction dropped a delete or expired item
    /// above the rejoiner's last record (`replica::sync::suffix_refusal`, point 3).
    SuffixPastDroppedRecord,
    /// A full copy does not take its source's drop floor (`SnapshotEnd::dropped_seq_max`), so
    /// it grants suffixes past records its source's compaction dropped before the copy.
    CopyWithoutDropFloor,
    /// A replica does not ask its predecessor to resend on a new connection to it, so an
    /// update lost with the old one waits for a later update to show the gap.
    NoResendAskOnConnect,
    /// A head orders an update routed by a configuration older than its headship (a late
    /// copy of an attempt another head may have decided).
    OrderedAcrossHeadship,
    /// A copy's request outcomes (`Outcomes` with the stream) are remembered but not kept by
    /// the store: a restart of the copy forgets them.
    CopiedOutcomesNotKept,
}

impl Fault {
    /// Every fault, for tools that pick one by name.
    pub const ALL: [Fault; 15] = [
        Fault::ForgetDedupOnPromotion,
        Fault::NoUnackedToNewSuccessor,
        Fault::TailReadsBeforeCaughtUp,
        Fault::ApplyAcrossGap,
        Fault::CaughtUpFromOldTail,
        Fault::NoOutcomesWithResend,
        Fault::TailReadyBeforeCaughtUp,
        Fault::IncompleteCopyAccepted,
        Fault::HeirForgetsRequests,
        Fault::StaleCopyOrdered,
        Fault::SuffixPastDroppedRecord,
        Fault::CopyWithoutDropFloor,
        Fault::NoResendAskOnConnect,
        Fault::OrderedAcrossHeadship,
        Fault::CopiedOutcomesNotKept,
    ];
}

/// Request outcomes per `Outcomes` message (each entry is a few dozen bytes: far below a frame).
pub const OUTCOMES_PER_MESSAGE_MAX: usize = 4096;

/// What happens to a replica.
#[derive(Clone, Debug)]
pub enum Event {
    /// A client update, to the head.
    Update(ClientUpdate),
    /// Client updates that arrived together, in order: handled as one `Update` event each
    /// would be, but each run of plain sets among them appended with one
    /// `ReplicaStore::append_batch`.
    Updates(Vec<ClientUpdate>),
    /// A client get, to the tail; `token` names it in the reply.
    Get { token: u64, key: Vec<u8>, now: UnixSeconds },
    /// A chain message from a neighbour.
    Chain { from: NodeId, msg: ChainMsg },
    /// Replicated updates that arrived together from `from`, in order: handled as one
    /// `Chain` event each would be, but appended with one `ReplicaStore::append_batch`.
    Replicates { from: NodeId, msgs: Vec<ChainMsg> },
    /// This replica's route in a new epoch.
    Install(Route),
    /// A fresh connection to `peer` (what was in flight on the old one is lost).
    Connected { peer: NodeId },
    /// Periodic retries.
    Tick,
    /// `msg` to `to` (and whatever followed it to `to` in the same step) did not fit the link.
    Dropped { to: NodeId, msg: ChainMsg },
    /// The link to `peer` has room again: send what a full link held back.
    Room { peer: NodeId },
    /// A newer configuration was just installed because `from` sent something of it: ask
    /// `from`, if it is the predecessor, for everything after what this replica holds (what it
    /// sent before the install was dropped, and nothing else would send it again).
    AskResend { from: NodeId },
}

/// A client update as the head receives it.
#[derive(Clone, Debug)]
pub struct ClientUpdate {
    pub req: ReqId,
    pub update: Update,
    /// The front-end the tail tells `Committed`.
    pub reply_to: Option<String>,
    /// Judges expiry.
    pub now: UnixSeconds,
    /// Floors the new seq (seqs are microsecond timestamps, so they date updates).
    pub now_micros: u64,
    /// A `flush_all` hides items older than this once `now_micros` reaches it (0: none).
    pub flush_at: u64,
    /// The bulk copy of a split or merge runs: the head of a reshaping range still orders.
    pub bulk_copy_pending: bool,
    /// The client's floor (`ReqId`; 0: none known): its outcomes below it may be forgotten.
    pub floor: u64,
    /// The configuration the sender routed it by: one older than this replica's headship
    /// is refused (`Replica::head_since`).
    pub epoch: Epoch,
}

/// An update the head decided, with its seq, before its bookkeeping.
struct Ordered {
    req: ReqId,
    seq: u64,
    prev_seq: u64,
    key: Vec<u8>,
    effect: ReplEffect,
    outcome: Outcome,
    reply_to: Option<String>,
}

/// What `stage` made of a client update.
enum Stage {
    /// Decided: joins the run appended together.
    Run(Staged),
    /// Not a plain set: ordered alone, after the run before it is appended.
    Alone(ClientUpdate),
}

/// A plain set decided by `stage`, not yet appended, with what ordering it alone needs.
struct Staged {
    ordered: Ordered,
    mutation: Mutation,
    now: UnixSeconds,
    now_micros: u64,
    flush_at: u64,
    bulk_copy_pending: bool,
    epoch: Epoch,
}

impl Staged {
    /// The client update it was decided from.
    fn into_update(self) -> ClientUpdate {
        let Staged { ordered, mutation, now, now_micros, flush_at, bulk_copy_pending, epoch } = self;
        let Ordered { req, key, effect, reply_to, .. } = ordered;
        // Only sets are staged: the effect is a put.
        let (value, flags, expiry) = match effect {
            ReplEffect::Put { value, flags, expiry, .. } => (value, flags, expiry),
            ReplEffect::Delete => (Vec::new(), 0, 0),
        };
        let update = Update { key, mutation, value, flags, expiry };
        // The floor was taken when the update arrived (`Replica::step`).
        ClientUpdate { req, update, reply_to, now, now_micros, flush_at, bulk_copy_pending, floor: 0, epoch }
    }
}

/// What the caller must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Send a chain message to a neighbour (in order, per peer).
    Send { to: NodeId, msg: ChainMsg },
    /// Answer an update.
    Reply { req: ReqId, result: Result<Outcome, WireError> },
    /// Answer a get.
    GetReply { token: u64, result: Result<Option<Item>, WireError> },
    /// Tell the front-end at `reply_to` that `req` committed (the tail does).
    Committed { reply_to: String, req: ReqId, outcome: Outcome, key: Vec<u8> },
    /// Tell the manager this syncing replica caught up.
    SyncDone,
}

/// An incoming update relative to what a replica holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Incoming {
    /// Held already (seq at or below the highest held).
    Duplicate,
    /// An update before it is missing: ask for a resend after the highest held.
    Gap,
    /// The next one: apply it.
    Next,
}

/// Where an update of `seq` following `prev_seq` stands at a replica holding up to `have`.
pub fn incoming(seq: u64, prev_seq: u64, have: u64) -> Incoming {
    if seq <= have {
        Incoming::Duplicate
    } else if prev_seq > have {
        Incoming::Gap
    } else {
        Incoming::Next
    }
}

/// The seq of a `Replicate` (0 for any other message).
fn replicate_seq(msg: &ChainMsg) -> u64 {
    match msg {
        ChainMsg::Replicate { seq, .. } => *seq,
        _ => 0,
    }
}

/// Whether a request with this outcome wrote a record (a failed condition writes none; its
/// outcome is remembered at the seq before it, which belongs to another update).
fn wrote(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Stored { .. } | Outcome::Deleted | Outcome::Counter { .. } | Outcome::Touched { .. }
    )
}

/// One range's replica on one node.
pub struct Replica<S> {
    range: Range,
    route: Route,
    store: S,
    /// Highest seq ordered or applied here.
    last_seq: u64,
    /// Everything up to here is committed (stored at the tail).
    acked: u64,
    /// Compaction may drop deletes up to here (`tombstone_watermark`).
    watermark: u64,
    /// The highest ack a successor sent in this replica's life (what it may pass upstream
    /// again): every ack starts at a tail, so it stays true when the successor changes. Not
    /// `acked`, which a replica opened on its datastore takes from the seqs it holds.
    acked_by_successor: u64,
    recent: Dedup,
    /// Forwarded to the successor, not yet acknowledged, by seq.
    unacked: BTreeMap<u64, ChainMsg>,
    /// Head: updates waiting for the tail's ack before their reply, by seq.
    waiting: BTreeMap<u64, Vec<(ReqId, Outcome)>>,
    /// A tail serves gets; a syncing replica promoted to tail only after `CaughtUp`.
    readable: bool,
    /// A syncing replica that has caught up (reported `SyncDone`).
    synced: bool,
    /// The async back-end syncs this replica by snapshot: no log-resend stand-in.
    shell_sync: bool,
    /// The link to the successor was full: unacknowledged updates from this seq on are not
    /// (all) sent, and later ones wait behind them (the successor takes updates in order).
    held_back: Option<u64>,
    /// An ack upstream did not fit its link: `Tick` sends the latest one again.
    ack_dropped: bool,
    /// The predecessor and `after_seq` of the last `Resend` a gap made this replica ask for
    /// since the last `Tick`: until the resend arrives every later update shows the same gap,
    /// and each ask costs the predecessor a scan of its log, so one ask per gap and tick.
    gap_asked: Option<(NodeId, u64)>,
    /// An append of replicated updates failed (a full disk): `Tick` asks the predecessor to
    /// resend from what is held. Not at once: the resend would most likely fail the same way,
    /// and each costs the predecessor a scan of its log.
    append_failed: bool,
    /// The highest seq the predecessor sent that this replica could not apply (its append
    /// failed, or it came after a gap): until the store holds it, each `Tick` asks for a resend
    /// again. The ask may be lost with its connection, and nothing else would send the update
    /// again when no later update follows it to show the gap.
    missing: u64,
    /// The epoch this replica became its range's head in (it has been head in every one
    /// since). An update routed by an older configuration was sent before then, to another
    /// head or to this one in an earlier term as head: it may be a late copy of an attempt
    /// whose request another head decided and answered (a failed condition, which only that
    /// head remembered) while its client has moved on, in this range, to nothing that would
    /// have told this replica its floor. It is refused (`StaleEpoch`); a client that still
    /// waits retries by the new configuration. Since this replica has led, every attempt
    /// routed here reached it, so its dedup table (or the floor) answers late copies of those.
    head_since: Epoch,
    #[cfg(feature = "faults")]
    fault: Option<Fault>,
}

impl<S: ReplicaStore> Replica<S> {
    /// A replica on `store`; the request outcomes the store kept with its records (a restart)
    /// are remembered again.
    pub fn new(store: S, route: Route) -> Replica<S> {
        let last = store.max_seq();
        let mut recent = Dedup::default();
        for e in store.kept_outcomes() {
            recent.remember(e.req, e.seq, e.outcome);
        }
        Replica {
            range: route.rc.range,
            head_since: route.epoch,
            readable: !route.is_syncing(),
            route,
            store,
            last_seq: last,
            acked: last,
            watermark: 0,
            acked_by_successor: 0,
            recent,
            unacked: BTreeMap::new(),
            waiting: BTreeMap::new(),
            synced: false,
            shell_sync: false,
            held_back: None,
            ack_dropped: false,
            gap_asked: None,
            append_failed: false,
            missing: 0,
            #[cfg(feature = "faults")]
            fault: None,
        }
    }

    /// Remembers request outcomes for `micros` of seq instead of `DEDUP_WINDOW_MICROS`
    /// (`Dedup::set_window`; a simulated cluster's runs last seconds).
    pub fn with_dedup_window(mut self, micros: u64) -> Replica<S> {
        self.recent.set_window(micros);
        self
    }

    /// The caller syncs this replica by snapshot or suffix stream (see the module doc).
    pub fn with_shell_sync(mut self) -> Replica<S> {
        self.shell_sync = true;
        self
    }

    /// An heir of a split or merge takes over its parent's recent requests (a retry of an
    /// update the parent ordered is answered, not applied twice) and its clients' floors (a
    /// stale copy of a request the parent forgot is refused, not applied again), continues
    /// above its seqs and knows what it committed.
    pub fn inherit<P>(&mut self, parent: &mut Replica<P>) {
        if !self.faulty(Fault::HeirForgetsRequests) {
            self.recent.inherit(parent.recent.share());
        }
        self.recent.take_floors(&parent.recent);
        self.last_seq = self.last_seq.max(parent.last_seq);
        self.acked = self.acked.max(parent.acked);
    }

    /// An append of replicated updates failed since the last `Tick` (nothing after it applied).
    pub fn append_failed(&self) -> bool {
        self.append_failed
    }

    /// Takes this replica out of every role for good: it orders, applies and serves nothing.
    pub fn retire(&mut self) {
        self.route.rc.chain.clear();
        self.route.rc.syncing.clear();
        self.readable = false;
    }

    /// The head, with nothing it ordered unacknowledged or held back and no replica syncing:
    /// every in-sync replica holds the same contents.
    pub fn drained_head(&self) -> bool {
        self.route.is_head()
            && self.route.rc.syncing.is_empty()
            && self.held_back.is_none()
            && self.unacked.is_empty()
    }

    /// The first unacknowledged update a full link held back.
    pub fn held_back(&self) -> Option<u64> {
        self.held_back
    }

    /// The seq of the oldest update forwarded but not acknowledged.
    pub fn oldest_unacked(&self) -> Option<u64> {
        self.unacked.keys().next().copied()
    }

    /// A syncing replica that reported `SyncDone`.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// Switches a fault on (tests only).
    #[cfg(feature = "faults")]
    pub fn with_fault(mut self, fault: Option<Fault>) -> Replica<S> {
        self.fault = fault;
        self
    }

    /// The fault switched on, if any (the sync code takes it too: `replica::sync`).
    #[cfg(feature = "faults")]
    pub fn fault(&self) -> Option<Fault> {
        self.fault
    }

    #[cfg(not(feature = "faults"))]
    pub fn fault(&self) -> Option<Fault> {
        None
    }

    #[cfg(feature = "faults")]
    fn faulty(&self, fault: Fault) -> bool {
        self.fault == Some(fault)
    }

    #[cfg(not(feature = "faults"))]
    fn faulty(&self, _: Fault) -> bool {
        false
    }

    pub fn route(&self) -> &Route {
        &self.route
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// The seq a copy served from this replica is cut at, with the request outcomes up to it:
    /// its store's highest seq, or its own last seq where that is higher. A replica made by a
    /// full copy holds the range's state as of the copy's cut, which lies above its highest
    /// record when the source's compaction had dropped deletes at the top of its log; cut at
    /// its highest record, a copy from it would leave out those deletes' outcomes, and a later
    /// head holding that copy would decide a retry of such a delete again.
    pub fn copy_cut_seq(&self) -> u64 {
        self.store.max_seq().max(self.last_seq)
    }

    /// The datastore itself, for what happens to it outside the write path (a simulated
    /// disk's sync or fill-up).
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// Everything up to this seq is committed.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    pub fn unacked_len(&self) -> usize {
        self.unacked.len()
    }

    pub fn readable(&self) -> bool {
        self.readable
    }

    /// Whether to report `TailReady` to the manager (repeated while it holds): this replica is
    /// its range's unproven tail (`RangeConfig::unproven_tail`) and holds every update the
    /// range acknowledged, which it knows once its predecessor, stepped down from tail,
    /// confirmed the catch-up (`CaughtUp`, which made it readable). Until the manager hears
    /// this, it keeps the chain's last other member however it fails (`manager::state`).
    pub fn reports_tail_ready(&self) -> bool {
        let unproven = self.route.is_tail() && self.route.rc.unproven_tail == Some(self.route.me);
        unproven && (self.readable || self.faulty(Fault::TailReadyBeforeCaughtUp))
    }

    /// Whether an update routed by `epoch` predates this replica's headship (`head_since`).
    fn routed_before_headship(&self, epoch: Epoch) -> bool {
        epoch < self.head_since && !self.faulty(Fault::OrderedAcrossHeadship)
    }

    /// Takes a client update's floor: never above its own seq, which the client still sends.
    fn take_floor(&mut self, u: &ClientUpdate) {
        self.recent.raise_floor(u.req.client, u.floor.min(u.req.seq));
    }

    /// Handles one event; returns what to do, in order.
    pub fn step(&mut self, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::Update(u) => {
                self.take_floor(&u);
                self.on_update(u, &mut out)
            }
            Event::Updates(us) => {
                us.iter().for_each(|u| self.take_floor(u));
                self.on_updates(us, &mut out)
            }
            Event::Get { token, key, now } => {
                out.push(Action::GetReply { token, result: self.get(&key, now) })
            }
            Event::Chain { from, msg } => self.on_chain(from, msg, &mut out),
            Event::Replicates { from, msgs } => {
                if self.route.predecessor() == Some(from) {
                    self.apply_batch(msgs, &mut out)
                }
            }
            Event::Install(route) => self.install(route, &mut out),
            Event::Connected { peer } => self.on_connected(peer, &mut out),
            Event::Tick => self.tick(&mut out),
            Event::Dropped { to, msg } => self.on_dropped(to, &msg),
            Event::Room { peer } => {
                if self.route.successor() == Some(peer) {
                    self.send_held_back(&mut out);
                }
            }
            Event::AskResend { from } => {
                if self.route.predecessor() == Some(from) && !(self.shell_sync && self.route.is_syncing()) {
                    self.ask_resend(&mut out);
                }
            }
        }
        if self.route.rc.syncing.is_empty() && self.route.rc.unproven_tail.is_none() {
            self.watermark = self.acked;
        }
        out
    }

    /// The seq up to which the datastore's compaction may drop deletes (FAWN-DS's tombstone
    /// watermark): what the tail acknowledged, as every chain member holds it — but held
    /// where it was while the range has a syncing replica or an unproven tail. Those may
    /// still ask for updates after their copy's cut or their last one (a live update lost,
    /// a promotion), and a resend read from a log that dropped a delete above that point
    /// would leave them an older put of its key: a deleted item would come back.
    pub fn tombstone_watermark(&self) -> u64 {
        self.watermark
    }

    /// A send did not fit its link: an update to the successor waits in `unacked` (sent again
    /// by `Tick`/`Room`), an ack is sent again by `Tick`; anything else is asked for again by
    /// its receiver.
    fn on_dropped(&mut self, to: NodeId, msg: &ChainMsg) {
        match msg {
            ChainMsg::Replicate { seq, .. }
                if self.route.successor() == Some(to) && !self.route.is_tail() =>
            {
                self.held_back = Some(self.held_back.map_or(*seq, |h| h.min(*seq)));
            }
            ChainMsg::Ack { .. } if self.route.predecessor() == Some(to) => self.ack_dropped = true,
            _ => {}
        }
    }

    /// Sends the unacknowledged updates a full link held back, in order.
    fn send_held_back(&mut self, out: &mut Vec<Action>) {
        let Some(from) = self.held_back.take() else { return };
        let Some(succ) = self.route.successor().filter(|_| !self.route.is_tail()) else { return };
        for msg in self.unacked.range(from..).map(|(_, m)| m) {
            out.push(Action::Send { to: succ, msg: msg.clone() });
        }
    }

    /// The updates above `after_seq`, in seq order, for a resend: taken from `unacked` when it
    /// holds them all, without reading the datastore (whose read is a scan of its log). It
    /// does when this replica forwards (not the tail), the gap starts at or above `acked`
    /// (every update above `acked` it applied was forwarded and is kept until acknowledged),
    /// and its newest entry is the newest seq held.
    fn updates_to_resend(&self, after_seq: u64) -> Result<Vec<StoredUpdate>, StoreError> {
        let max_seq = self.store.max_seq();
        let newest = self.unacked.keys().next_back().copied();
        let held = !self.route.is_tail()
            && after_seq >= self.acked
            && newest.map_or(after_seq >= max_seq, |n| n == max_seq);
        if !held {
            return self.store.updates_after(after_seq);
        }
        let from = after_seq.saturating_add(1);
        let updates = self.unacked.range(from..).filter_map(|(_, msg)| match msg {
            ChainMsg::Replicate { seq, key, effect, .. } => {
                Some(StoredUpdate { seq: *seq, key: key.clone(), effect: effect.clone() })
            }
            _ => None,
        });
        Ok(updates.collect())
    }

    fn get(&self, key: &[u8], now: UnixSeconds) -> Result<Option<Item>, WireError> {
        if !self.route.is_tail() {
            return Err(WireError::WrongNode(format!("node {} is not the tail", self.route.me)));
        }
        if !self.readable {
            return Err(WireError::Unavailable("the new tail has not caught up yet".into()));
        }
        let item = self.store.read(key).map_err(WireError::from)?;
        Ok(item.filter(|i| !is_expired(i.expiry, now)))
    }

    fn on_update(&mut self, u: ClientUpdate, out: &mut Vec<Action>) {
        let req = u.req;
        match self.order(u, out) {
            Ok((seq, outcome)) => self.reply_when_acked(req, seq, outcome, out),
            Err(e) => out.push(Action::Reply { req, result: Err(e) }),
        }
    }

    /// Head: decides and appends an update and forwards it. Returns the seq to wait for (the
    /// reply goes once it is committed) and the outcome.
    fn order(&mut self, u: ClientUpdate, out: &mut Vec<Action>) -> Result<(u64, Outcome), WireError> {
        let ClientUpdate {
            req, update, reply_to, now, now_micros, flush_at, bulk_copy_pending, epoch, ..
        } = u;
        if !self.route.is_head() {
            return Err(WireError::WrongNode(format!("node {} is not the head", self.route.me)));
        }
        if let Some(remembered) = self.recent.get(&req) {
            return Ok(remembered);
        }
        if self.recent.is_stale(&req) && !self.faulty(Fault::StaleCopyOrdered) {
            return Err(WireError::Invalid(format!(
                "request {} of client {:x} is below the client's floor: a stale copy, not applied",
                req.seq, req.client
            )));
        }
        if self.routed_before_headship(epoch) {
            return Err(WireError::StaleEpoch { current: self.route.epoch });
        }
        // Until the bulk of a split-off or merged part is copied, updates go on; the copy then
        // only has to catch up with them once they stop.
        if self.route.rc.is_reshaping() && !bulk_copy_pending {
            return Err(WireError::Unavailable("the range is being split or merged".into()));
        }
        if self.unacked.len() >= UNACKED_UPDATES_MAX {
            return Err(WireError::Unavailable(
                "chain backlog full: the successor is not acknowledging updates".into(),
            ));
        }
        // A plain set does not depend on the current item: skip the read.
        let current = match update.mutation {
            Mutation::Set => None,
            _ => self.store.read(&update.key).map_err(WireError::from)?,
        };
        // A `flush_all` hides what was stored before it.
        let flushed = |i: &Item| flush_at != 0 && now_micros >= flush_at && i.cas < flush_at;
        let current = current.filter(|i| !flushed(i));
        let prev_seq = self.last_seq.max(self.store.max_seq());
        let seq = (prev_seq + 1).max(now_micros);
        assert!(seq > prev_seq, "the head's seqs must strictly increase");
        let (outcome, effect) = decide(&update, current.as_ref(), now, seq);
        let effect = match effect {
            // A failed condition was judged against state that may hold uncommitted updates:
            // reply once they commit, and remember the answer so a retry is not decided again.
            Effect::None => {
                self.recent.advance(now_micros);
                self.remember(req, prev_seq, outcome.clone());
                return Ok((prev_seq, outcome));
            }
            Effect::Put { value, flags, expiry, state } => ReplEffect::Put { value, flags, expiry, state },
            Effect::Delete => ReplEffect::Delete,
        };
        let record = Append { key: &update.key, effect: &effect, seq, origin: Some((req, &outcome)) };
        self.store.append(&record).map_err(WireError::from)?;
        let ordered = Ordered { req, seq, prev_seq, key: update.key, effect, outcome, reply_to };
        Ok(self.appended(ordered, out))
    }

    /// Head: after an ordered update was appended, remember its outcome, forward it and, at
    /// the tail, commit it. Returns the seq to wait for and the outcome.
    fn appended(&mut self, o: Ordered, out: &mut Vec<Action>) -> (u64, Outcome) {
        let Ordered { req, seq, prev_seq, key, effect, outcome, reply_to } = o;
        self.last_seq = seq;
        self.remember(req, seq, outcome.clone());
        let floor = self.recent.floor_of(req.client);
        let origin = Some(Origin { req, outcome: outcome.clone(), reply_to, floor });
        let msg = ChainMsg::Replicate {
            epoch: self.route.epoch,
            range: self.range,
            seq,
            prev_seq,
            key,
            effect,
            origin,
        };
        self.forward(seq, msg, out);
        if self.route.is_tail() {
            self.commit(seq, out);
        }
        (seq, outcome)
    }

    /// Head: client updates that arrived together. Each run of plain sets (no read of the
    /// current item, nothing to refuse) is decided in order, seqs assigned as one by one, and
    /// appended with one `append_batch`; anything else first has the run before it appended,
    /// then is ordered alone. The actions are those of one `Update` event each. If a run's
    /// append fails, its updates are ordered again one by one (a record too large fails alone).
    fn on_updates(&mut self, updates: Vec<ClientUpdate>, out: &mut Vec<Action>) {
        let mut run: Vec<Staged> = Vec::new();
        for u in updates {
            match self.stage(u, &run) {
                Stage::Run(staged) => run.push(staged),
                Stage::Alone(u) => {
                    self.append_run(std::mem::take(&mut run), out);
                    self.on_update(u, out);
                }
            }
        }
        self.append_run(run, out);
    }

    /// Decides `u` after `run` (not yet appended) if it is a plain set that ordering alone
    /// would take without looking at the store or refusing it; else gives it back. The key,
    /// value and `reply_to` move into the decision (no copy per update).
    fn stage(&self, mut u: ClientUpdate, run: &[Staged]) -> Stage {
        let plain = u.update.mutation == Mutation::Set
            && self.route.is_head()
            && (!self.route.rc.is_reshaping() || u.bulk_copy_pending)
            && self.unacked.len() + run.len() < UNACKED_UPDATES_MAX
            && !run.iter().any(|s| s.ordered.req == u.req)
            && self.recent.get(&u.req).is_none()
            && !self.recent.is_stale(&u.req)
            && !self.routed_before_headship(u.epoch);
        if !plain {
            return Stage::Alone(u);
        }
        let prev_seq = run.last().map_or_else(|| self.last_seq.max(self.store.max_seq()), |s| s.ordered.seq);
        let seq = (prev_seq + 1).max(u.now_micros);
        // Decided without the value (a set's decision does not look at it), which then moves in.
        let value = std::mem::take(&mut u.update.value);
        let (outcome, effect) = decide(&u.update, None, u.now, seq);
        let Effect::Put { value: _, flags, expiry, state } = effect else {
            u.update.value = value;
            return Stage::Alone(u);
        };
        let effect = ReplEffect::Put { value, flags, expiry, state };
        let ClientUpdate {
            req, update, reply_to, now, now_micros, flush_at, bulk_copy_pending, epoch, ..
        } = u;
        let ordered = Ordered { req, seq, prev_seq, key: update.key, effect, outcome, reply_to };
        Stage::Run(Staged {
            ordered,
            mutation: update.mutation,
            now,
            now_micros,
            flush_at,
            bulk_copy_pending,
            epoch,
        })
    }

    /// Appends a run of staged sets with one call and does the rest of ordering each.
    fn append_run(&mut self, run: Vec<Staged>, out: &mut Vec<Action>) {
        if run.is_empty() {
            return;
        }
        let records: Vec<Append<'_>> = run
            .iter()
            .map(|Staged { ordered: o, .. }| Append {
                key: &o.key,
                effect: &o.effect,
                seq: o.seq,
                origin: Some((o.req, &o.outcome)),
            })
            .collect();
        if let Err(e) = self.store.append_batch(&records) {
            tracing::warn!(range = %self.range.id_string(), error = %e, "head batch append failed; ordering one by one");
            run.into_iter().for_each(|s| self.on_update(s.into_update(), out));
            return;
        }
        for Staged { ordered, .. } in run {
            let req = ordered.req;
            let (seq, outcome) = self.appended(ordered, out);
            self.reply_when_acked(req, seq, outcome, out);
        }
    }

    fn reply_when_acked(&mut self, req: ReqId, seq: u64, outcome: Outcome, out: &mut Vec<Action>) {
        if self.acked >= seq {
            out.push(Action::Reply { req, result: Ok(outcome) });
        } else {
            self.waiting.entry(seq).or_default().push((req, outcome));
        }
    }

    /// Sends an update on to the successor, remembering it until acknowledged; from the tail
    /// to a syncing replica (which acknowledges nothing) it is only sent.
    fn forward(&mut self, seq: u64, msg: ChainMsg, out: &mut Vec<Action>) {
        let Some(succ) = self.route.successor() else { return };
        if !self.route.is_tail() {
            self.unacked.insert(seq, msg.clone());
            if self.held_back.is_some() {
                // Waits behind the held-back ones (`Tick`, `Room`).
                return;
            }
        }
        out.push(Action::Send { to: succ, msg });
    }

    /// Everything up to `seq` is committed: reply to whoever waits, forget acknowledged updates.
    fn commit(&mut self, seq: u64, out: &mut Vec<Action>) {
        self.acked = self.acked.max(seq);
        self.unacked = self.unacked.split_off(&(self.acked + 1));
        let rest = self.waiting.split_off(&(self.acked + 1));
        for (req, outcome) in std::mem::replace(&mut self.waiting, rest).into_values().flatten() {
            out.push(Action::Reply { req, result: Ok(outcome) });
        }
    }

    fn ack_upstream(&mut self, seq: u64, out: &mut Vec<Action>) {
        self.ack_dropped = false;
        if let Some(pred) = self.route.predecessor() {
            let msg = ChainMsg::Ack { epoch: self.route.epoch, range: self.range, seq };
            out.push(Action::Send { to: pred, msg });
        }
    }

    fn ask_resend(&self, out: &mut Vec<Action>) {
        self.ask_resend_after(self.store.max_seq(), out)
    }

    /// A gap after `have`: asks for a resend unless it was asked for since the last tick.
    fn ask_resend_for_gap(&mut self, have: u64, out: &mut Vec<Action>) {
        let Some(pred) = self.route.predecessor() else { return };
        if self.gap_asked == Some((pred, have)) {
            return;
        }
        self.gap_asked = Some((pred, have));
        self.ask_resend_after(have, out);
    }

    fn ask_resend_after(&self, after_seq: u64, out: &mut Vec<Action>) {
        if let Some(pred) = self.route.predecessor() {
            let msg = ChainMsg::Resend { epoch: self.route.epoch, range: self.range, after_seq };
            out.push(Action::Send { to: pred, msg });
        }
    }

    fn on_chain(&mut self, from: NodeId, msg: ChainMsg, out: &mut Vec<Action>) {
        let from_pred = self.route.predecessor() == Some(from);
        let from_succ = self.route.successor() == Some(from);
        match msg {
            ChainMsg::Replicate { .. } if from_pred => self.apply(msg, out),
            ChainMsg::Ack { seq, .. } if from_succ && !self.route.is_tail() => {
                self.acked_by_successor = self.acked_by_successor.max(seq);
                self.commit(seq, out);
                self.ack_upstream(seq, out);
            }
            ChainMsg::Resend { after_seq, .. } if from_succ => self.resend(from, after_seq, out),
            ChainMsg::CaughtUp { seq, .. } if from_pred => self.on_caught_up(seq, out),
            ChainMsg::SnapshotEnd { upto_seq, .. } if from_pred => self.on_copy_end(upto_seq, out),
            ChainMsg::Outcomes { entries, .. } if from_pred => self.remember_outcomes(entries),
            _ => {}
        }
    }

    /// Request outcomes of updates the predecessor resent or copied without their origin: kept
    /// for those this replica holds, so that as head it answers a retry of one instead of
    /// ordering it again. (One it does not hold is not known to be stored here: it may yet
    /// arrive, with its outcome, or never.)
    pub fn remember_outcomes(&mut self, entries: Vec<OutcomeEntry>) {
        let have = self.store.max_seq();
        for e in entries.into_iter().filter(|e| e.seq <= have) {
            self.remember(e.req, e.seq, e.outcome);
        }
    }

    /// A syncing replica's copy is complete: it holds the range's state as of `upto_seq`
    /// (each key's latest record up to it, or none where the source's compaction dropped a
    /// delete), so it remembers the copied updates' `outcomes` up to it, and as a later head
    /// orders above it. The store keeps the outcomes of copied updates that wrote something,
    /// also of those whose records the copy did not carry (superseded or compacted at the
    /// source), so that they survive a restart (`ReplicaStore::adopt_outcomes`).
    pub fn copied(&mut self, upto_seq: u64, outcomes: Vec<OutcomeEntry>) {
        let outcomes: Vec<OutcomeEntry> = outcomes.into_iter().filter(|e| e.seq <= upto_seq).collect();
        let kept: Vec<OutcomeEntry> = outcomes.iter().filter(|e| wrote(&e.outcome)).cloned().collect();
        if !self.faulty(Fault::CopiedOutcomesNotKept) {
            if let Err(e) = self.store.adopt_outcomes(&kept) {
                tracing::warn!(range = %self.range.id_string(), error = %e,
                    "keeping a copy's request outcomes failed: a restart forgets them");
            }
        }
        for e in outcomes {
            self.remember(e.req, e.seq, e.outcome);
        }
        self.last_seq = self.last_seq.max(upto_seq);
    }

    /// Remembers a request's outcome in the dedup table. (One whose update this replica
    /// appended went into the store with the record: `Append::origin`.)
    fn remember(&mut self, req: ReqId, seq: u64, outcome: Outcome) {
        self.recent.remember(req, seq, outcome);
    }

    /// The outcomes of the requests whose updates have seqs in `after+1..=upto`, as messages.
    pub fn outcomes_after(&self, after: u64, upto: u64) -> Vec<ChainMsg> {
        let entries = self.recent.entries_in(after + 1..=upto);
        entries
            .chunks(OUTCOMES_PER_MESSAGE_MAX)
            .map(|c| ChainMsg::Outcomes { epoch: self.route.epoch, range: self.range, entries: c.to_vec() })
            .collect()
    }

    /// A replicated update from the predecessor.
    fn apply(&mut self, msg: ChainMsg, out: &mut Vec<Action>) {
        self.apply_batch(vec![msg], out)
    }

    /// Replicated updates from the predecessor, in order: each is judged (`incoming`) against
    /// what the ones before it leave held, those to apply are appended with one call, then
    /// forwarded, committed and acknowledged one by one as if each had come alone. If the
    /// append fails nothing is applied, and the next `Tick` asks for a resend.
    fn apply_batch(&mut self, msgs: Vec<ChainMsg>, out: &mut Vec<Action>) {
        let mut have = self.store.max_seq();
        let mut judged = Vec::with_capacity(msgs.len());
        for msg in msgs {
            let ChainMsg::Replicate { seq, prev_seq, .. } = msg else { continue };
            let verdict = match incoming(seq, prev_seq, have) {
                Incoming::Gap if self.faulty(Fault::ApplyAcrossGap) => Incoming::Next,
                v => v,
            };
            judged.push((verdict, have, msg));
            if verdict == Incoming::Next {
                have = seq;
            }
        }
        let appended = {
            let records: Vec<Append<'_>> = judged
                .iter()
                .filter(|(v, _, _)| *v == Incoming::Next)
                .filter_map(|(_, _, m)| match m {
                    ChainMsg::Replicate { seq, key, effect, origin, .. } => {
                        let origin = origin.as_ref().map(|o| (o.req, &o.outcome));
                        Some(Append { key, effect, seq: *seq, origin })
                    }
                    _ => None,
                })
                .collect();
            records.is_empty() || {
                let r = self.store.append_batch(&records);
                if let Err(e) = &r {
                    let (first, last) = (records[0].seq, records[records.len() - 1].seq);
                    tracing::warn!(range = %self.range.id_string(), first, last, error = %e, "apply failed");
                }
                r.is_ok()
            }
        };
        for (verdict, have, msg) in judged {
            match verdict {
                Incoming::Duplicate if self.route.is_tail() => self.ack_upstream(have, out),
                // A predecessor resends what it holds unacknowledged (a new successor, a
                // resend): if the tail's ack of it already passed here, say so again, or it
                // waits for the next update (the ack it missed may have come in an epoch it had
                // not installed yet).
                Incoming::Duplicate if replicate_seq(&msg) <= self.acked_by_successor => {
                    self.ack_upstream(self.acked_by_successor, out)
                }
                Incoming::Duplicate => {}
                Incoming::Gap => {
                    self.missing = self.missing.max(replicate_seq(&msg));
                    self.ask_resend_for_gap(have, out)
                }
                Incoming::Next if appended => self.applied(msg, out),
                Incoming::Next => {
                    // Nothing after a failed append applies (each would find a gap).
                    self.append_failed = true;
                    self.missing = self.missing.max(replicate_seq(&msg));
                    return;
                }
            }
        }
    }

    /// Bookkeeping after a replicated update was appended: remember its outcome, forward it,
    /// and at the tail commit it, tell its front-end and acknowledge it.
    fn applied(&mut self, msg: ChainMsg, out: &mut Vec<Action>) {
        let ChainMsg::Replicate { seq, ref key, ref origin, .. } = msg else { return };
        self.last_seq = self.last_seq.max(seq);
        if let Some(origin) = origin {
            self.recent.raise_floor(origin.req.client, origin.floor);
            self.remember(origin.req, seq, origin.outcome.clone());
        }
        let notify = origin.as_ref().filter(|_| self.route.is_tail()).and_then(|o| {
            let reply_to = o.reply_to.clone()?;
            Some(Action::Committed { reply_to, req: o.req, outcome: o.outcome.clone(), key: key.clone() })
        });
        let is_tail = self.route.is_tail();
        self.forward(seq, msg, out);
        if is_tail {
            self.commit(seq, out);
            out.extend(notify);
            self.ack_upstream(seq, out);
        }
    }

    /// The successor asks for every update after `after_seq`: sent from the log, then
    /// `CaughtUp` — except from a node that is still the tail in its own view to a promoted
    /// successor: it still commits on its own, so the successor must not serve gets yet (it
    /// asks again every tick). A syncing successor is told, which ends its sync.
    fn resend(&mut self, to: NodeId, after_seq: u64, out: &mut Vec<Action>) {
        let updates = match self.updates_to_resend(after_seq) {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(range = %self.range.id_string(), error = %e, "resend read failed");
                return;
            }
        };
        let epoch = self.route.epoch;
        let upto_seq = self.store.max_seq();
        let mut origins = self.resent_origins(after_seq, upto_seq);
        let mut prev = after_seq;
        for u in updates {
            let msg = ChainMsg::Replicate {
                epoch,
                range: self.range,
                seq: u.seq,
                prev_seq: prev,
                key: u.key,
                effect: u.effect,
                origin: origins.remove(&u.seq),
            };
            prev = u.seq;
            out.push(Action::Send { to, msg });
        }
        // A syncing successor may be a rejoiner that kept its records but, as a new process,
        // lost their outcomes: it gets every outcome this replica remembers, not only the
        // resent updates'.
        let outcomes_from = if self.route.rc.syncing.contains(&to) { 0 } else { after_seq };
        if !self.faulty(Fault::NoOutcomesWithResend) {
            for msg in self.outcomes_after(outcomes_from, upto_seq) {
                out.push(Action::Send { to, msg });
            }
        }
        // Both ends name the last update sent (`prev`), which the receiver must hold to take
        // them: not `max_seq`, which a datastore's seq floor may raise above every record it
        // still holds (a dropped tombstone or expired put), so that no receiver would reach it.
        if self.route.is_tail() && self.route.rc.syncing.contains(&to) && !self.shell_sync {
            // The copy is complete: the log-resend stand-in for a snapshot stream's end. It
            // serves machines without a shell, whose stores are never compacted: no floor.
            let (range, upto_seq) = (self.range, prev);
            let msg =
                ChainMsg::SnapshotEnd { epoch, range, snapshot: 0, batches: 0, upto_seq, dropped_seq_max: 0 };
            out.push(Action::Send { to, msg });
        }
        if !self.route.is_tail() || self.faulty(Fault::CaughtUpFromOldTail) {
            out.push(Action::Send { to, msg: ChainMsg::CaughtUp { epoch, range: self.range, seq: prev } });
        }
    }

    /// The origins of the updates with seqs in `after+1..=upto` that this replica remembers,
    /// by seq, for resent updates to carry: the `Outcomes` after them may be lost with the
    /// connection (the sender crashed in between), and a replica holding an update without
    /// its request's outcome would, as head, decide a retry of it again. Only outcomes of
    /// updates that wrote something: a failed condition is remembered at the seq before it,
    /// which belongs to another update (it travels in `Outcomes` only; it stored nothing, so
    /// a retry of it decided again is as if decided first then).
    fn resent_origins(&self, after: u64, upto: u64) -> HashMap<u64, Origin> {
        if self.faulty(Fault::NoOutcomesWithResend) {
            return HashMap::new();
        }
        let entries = self.recent.entries_in(after + 1..=upto);
        entries
            .into_iter()
            .filter(|e| wrote(&e.outcome))
            .map(|e| {
                let floor = self.recent.floor_of(e.req.client);
                (e.seq, Origin { req: e.req, outcome: e.outcome, reply_to: None, floor })
            })
            .collect()
    }

    /// The source sent a syncing replica everything it held, up to `upto_seq`. Unless this
    /// replica stored all of it (an append may have failed: a full disk), the copy is not
    /// complete, and `Tick` asks for the rest.
    fn on_copy_end(&mut self, upto_seq: u64, out: &mut Vec<Action>) {
        let complete = self.store.max_seq() >= upto_seq || self.faulty(Fault::IncompleteCopyAccepted);
        if self.route.is_syncing() && !self.synced && complete {
            self.synced = true;
            out.push(Action::SyncDone);
        }
    }

    /// The predecessor, no longer a tail, confirmed it sent a promoted tail everything it had,
    /// up to `upto_seq`. Taken only if this replica stored all of it (an append may have failed:
    /// a full disk); otherwise `Tick` asks for a resend again.
    fn on_caught_up(&mut self, upto_seq: u64, out: &mut Vec<Action>) {
        if !self.route.is_tail() || self.route.is_syncing() {
            return;
        }
        if self.store.max_seq() < upto_seq && !self.faulty(Fault::IncompleteCopyAccepted) {
            return;
        }
        self.readable = true;
        let seq = self.store.max_seq();
        self.commit(seq, out);
        self.ack_upstream(seq, out);
    }

    /// A new route: re-wire the chain around this replica.
    fn install(&mut self, route: Route, out: &mut Vec<Action>) {
        let old = std::mem::replace(&mut self.route, route);
        let have = self.store.max_seq();
        if self.route.is_head() && !old.is_head() {
            self.head_since = self.route.epoch;
            self.last_seq = self.last_seq.max(have);
            if self.faulty(Fault::ForgetDedupOnPromotion) {
                self.recent = Dedup::default();
            }
        }
        if old.is_head() && !self.route.is_head() {
            self.release_waiting(out);
        }
        let promoted_from_syncing = self.route.is_tail() && old.is_syncing();
        if promoted_from_syncing {
            self.readable = self.faulty(Fault::TailReadsBeforeCaughtUp);
        } else if self.route.is_tail() && !old.is_tail() {
            self.readable = true;
        }
        if self.route.is_tail() && self.route.predecessor().is_none() && !self.readable {
            // Alone in the chain: no one is left to confirm a catch-up, and what it holds is
            // all the chain has; waiting would refuse gets for ever.
            self.readable = true;
            self.commit(have, out);
        }
        let syncs_in_shell = self.shell_sync && self.route.is_syncing();
        if self.route.predecessor() != old.predecessor() {
            // What the old predecessor sent is not owed by the new one, which is asked below.
            self.missing = 0;
        }
        if (self.route.predecessor() != old.predecessor() || promoted_from_syncing) && !syncs_in_shell {
            self.ask_resend(out);
        }
        // A middle with a new predecessor tells it what the tail acknowledged: an update this
        // replica acked to its old predecessor (a node since removed) may be unacknowledged at
        // the new one, whose re-send of it arrived before this install and was dropped; no
        // later ack would come without a later update (and a drained head is what a split or
        // merge waits for).
        let middle = !self.route.is_tail() && !self.route.is_syncing();
        if middle && self.route.predecessor() != old.predecessor() && self.acked > 0 {
            self.ack_upstream(self.acked, out);
        }
        if (self.route.successor() != old.successor() || self.route.is_tail())
            && !self.faulty(Fault::NoUnackedToNewSuccessor)
        {
            self.send_unacked(out);
        }
        if self.route.is_tail() && !old.is_tail() && !old.is_syncing() {
            // Everything this replica holds is now committed.
            self.commit(have, out);
            self.ack_upstream(have, out);
        }
    }

    /// No longer the head: no ack will answer the requests waiting here (this replica left
    /// the chain, or will hear of no later commit). Each is told to retry by the new
    /// configuration, where the new head answers it from its dedup table if the update
    /// reached it, or orders it (the update then never committed: it is on no replica of the
    /// new chain), instead of waiting for the client's timeout.
    fn release_waiting(&mut self, out: &mut Vec<Action>) {
        let current = self.route.epoch;
        for (req, _) in std::mem::take(&mut self.waiting).into_values().flatten() {
            out.push(Action::Reply { req, result: Err(WireError::StaleEpoch { current }) });
        }
    }

    /// Every unacknowledged update, in seq order, to the successor (a tail has none).
    fn send_unacked(&mut self, out: &mut Vec<Action>) {
        self.held_back = None;
        let Some(succ) = self.route.successor().filter(|_| !self.route.is_tail()) else { return };
        for msg in self.unacked.values() {
            out.push(Action::Send { to: succ, msg: msg.clone() });
        }
    }

    /// A fresh connection: what was in flight on the old one may be lost.
    fn on_connected(&mut self, peer: NodeId, out: &mut Vec<Action>) {
        if self.route.successor() == Some(peer) {
            // Sent first on the new connection; what a full link held back may follow again.
            let held_back = self.held_back;
            self.send_unacked(out);
            self.held_back = held_back;
        }
        if self.route.predecessor() == Some(peer) && !self.route.is_syncing() {
            // Acks are cumulative and the last one may have been lost with the old
            // connection: with no later update, the head would wait for it for ever.
            let seq = if self.route.is_tail() { self.store.max_seq() } else { self.acked_by_successor };
            if seq > 0 {
                self.ack_upstream(seq, out);
            }
            // An update lost with the old connection is sent again by no one unless asked:
            // the predecessor resends its unacknowledged updates only on a new connection of
            // its own, a gap shows only with a later update, and the head takes a client's
            // retries of an update in flight as duplicates. So is one this replica dropped
            // under an older configuration when its request to catch up was lost too.
            if !self.faulty(Fault::NoResendAskOnConnect) {
                self.ask_resend(out);
            }
        }
        if self.route.predecessor() == Some(peer)
            && self.route.is_syncing()
            && !self.synced
            && !self.shell_sync
        {
            self.ask_resend(out);
        }
    }

    /// Periodic retries: updates and an ack a full link held back are sent again, a promoted
    /// tail asks for its catch-up confirmation, a syncing replica for its copy.
    fn tick(&mut self, out: &mut Vec<Action>) {
        self.gap_asked = None;
        // The store keeps outcomes for a reopen only as far back as this replica remembers.
        if let Some(oldest) = self.recent.oldest_seq() {
            self.store.forget_outcomes_below(oldest);
        }
        self.send_held_back(out);
        if self.ack_dropped {
            if self.route.is_head() || self.route.is_syncing() {
                self.ack_dropped = false;
            } else {
                self.ack_upstream(self.acked, out);
            }
        }
        let promoted = self.route.is_tail() && !self.readable;
        let syncing = self.route.is_syncing() && !self.synced && !self.shell_sync;
        let missing = std::mem::take(&mut self.append_failed) || self.missing > self.store.max_seq();
        let failed = missing && !(self.shell_sync && self.route.is_syncing());
        if promoted || syncing || failed {
            self.ask_resend(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::store::MemStore;
    use fawn_proto::native::RangeConfig;
    use fawn_proto::op::Mutation;

    fn route(epoch: u64, me: NodeId, chain: &[NodeId]) -> Route {
        Route { epoch, me, rc: RangeConfig::new(Range::full(), chain.to_vec()) }
    }

    fn set(key: &str, value: &str) -> Update {
        Update { key: key.into(), mutation: Mutation::Set, value: value.into(), flags: 0, expiry: 0 }
    }

    fn update(req: u64, u: Update) -> Event {
        let req = ReqId { client: 1, seq: req };
        Event::Update(ClientUpdate {
            req,
            update: u,
            reply_to: None,
            now: 0,
            now_micros: 0,
            flush_at: 0,
            bulk_copy_pending: false,
            floor: 0,
            epoch: Epoch::MAX,
        })
    }

    /// Replicas of `chain`, with messages delivered in order until none is left; returns the
    /// non-`Send` actions.
    struct Chain(BTreeMap<NodeId, Replica<MemStore>>);

    impl Chain {
        fn new(chain: &[NodeId]) -> Chain {
            Chain(
                chain.iter().map(|n| (*n, Replica::new(MemStore::default(), route(1, *n, chain)))).collect(),
            )
        }

        fn run(&mut self, at: NodeId, event: Event) -> Vec<Action> {
            let mut todo = vec![(at, event)];
            let mut done = Vec::new();
            while !todo.is_empty() {
                let (node, event) = todo.remove(0);
                for a in self.0.get_mut(&node).expect("node").step(event) {
                    match a {
                        Action::Send { to, msg } => todo.push((to, Event::Chain { from: node, msg })),
                        other => done.push(other),
                    }
                }
            }
            done
        }
    }

    #[test]
    fn an_update_replies_once_the_tail_has_it_and_a_retry_is_not_applied_again() {
        let mut c = Chain::new(&[1, 2, 3]);
        let out = c.run(1, update(1, set("k", "v")));
        let [Action::Reply { result: Ok(Outcome::Stored { cas }), .. }] = out.as_slice() else {
            panic!("{out:?}")
        };
        for r in c.0.values() {
            assert_eq!(r.store().seq_of(b"k"), Some(*cas));
            assert_eq!(r.acked(), *cas, "node {}", r.route().me);
        }
        let again = c.run(1, update(1, set("k", "v")));
        assert_eq!(again, out, "a retry must get the first answer");
        assert_eq!(c.0[&3].store().max_seq(), *cas, "a retry was applied twice");
        let get = c.run(3, Event::Get { token: 9, key: b"k".to_vec(), now: 0 });
        assert!(matches!(&get[..], [Action::GetReply { result: Ok(Some(_)), .. }]), "{get:?}");
        let at_head = c.run(1, Event::Get { token: 9, key: b"k".to_vec(), now: 0 });
        assert!(matches!(&at_head[..], [Action::GetReply { result: Err(WireError::WrongNode(_)), .. }]));
    }

    /// `event`, a client update, as routed by the configuration of `epoch`.
    fn routed_by(epoch: Epoch, event: Event) -> Event {
        let Event::Update(u) = event else { panic!("not an update: {event:?}") };
        Event::Update(ClientUpdate { epoch, ..u })
    }

    #[test]
    fn a_head_refuses_an_update_routed_before_it_became_head_but_answers_what_it_decided() {
        // Tail at epoch 5, head alone from epoch 7: an update routed by epoch 6 was meant for
        // the head of then, which may have decided and answered it.
        let mut r = Replica::new(MemStore::default(), route(5, 1, &[2, 1]));
        r.step(Event::Install(route(7, 1, &[1])));
        let late = r.step(routed_by(6, update(1, set("k", "v"))));
        let stale = [Action::Reply {
            req: ReqId { client: 1, seq: 1 },
            result: Err(WireError::StaleEpoch { current: 7 }),
        }];
        assert_eq!(late, stale);
        assert_eq!(r.store().max_seq(), 0, "refused, not applied");
        let now = r.step(routed_by(7, update(1, set("k", "v"))));
        assert!(matches!(&now[..], [Action::Reply { result: Ok(Outcome::Stored { .. }), .. }]), "{now:?}");
        // Decided here: a late copy from before gets the same answer, not a refusal.
        assert_eq!(r.step(routed_by(6, update(1, set("k", "v")))), now);
        // A head since its start takes updates routed by its own epoch and later ones.
        let mut fresh = Replica::new(MemStore::default(), route(9, 1, &[1]));
        let out = fresh.step(routed_by(9, update(2, set("k", "w"))));
        assert!(matches!(&out[..], [Action::Reply { result: Ok(_), .. }]), "{out:?}");
    }

    /// A `MemStore` that counts reads of its log (`updates_after`).
    struct CountingStore(MemStore, std::rc::Rc<std::cell::Cell<usize>>);

    impl ReplicaStore for CountingStore {
        fn append(&mut self, update: &Append<'_>) -> Result<(), StoreError> {
            self.0.append(update)
        }
        fn max_seq(&self) -> u64 {
            self.0.max_seq()
        }
        fn read(&self, key: &[u8]) -> Result<Option<Item>, StoreError> {
            self.0.read(key)
        }
        fn updates_after(&self, after: u64) -> Result<Vec<StoredUpdate>, StoreError> {
            self.1.set(self.1.get() + 1);
            self.0.updates_after(after)
        }
    }

    #[test]
    fn a_resend_of_unacknowledged_updates_does_not_read_the_log() {
        let reads = std::rc::Rc::new(std::cell::Cell::new(0));
        let store = CountingStore(MemStore::default(), reads.clone());
        let mut head = Replica::new(store, route(1, 1, &[1, 2, 3]));
        let mut seqs = Vec::new();
        for i in 0..3 {
            for a in head.step(update(i, set(&format!("k{i}"), "v"))) {
                if let Action::Send { msg: ChainMsg::Replicate { seq, .. }, .. } = a {
                    seqs.push(seq);
                }
            }
        }
        let resend = |after_seq| Event::Chain {
            from: 2,
            msg: ChainMsg::Resend { epoch: 1, range: Range::full(), after_seq },
        };
        let resent = |out: Vec<Action>| -> Vec<(u64, u64)> {
            out.into_iter()
                .filter_map(|a| match a {
                    Action::Send { to: 2, msg: ChainMsg::Replicate { seq, prev_seq, .. } } => {
                        Some((seq, prev_seq))
                    }
                    _ => None,
                })
                .collect()
        };
        // Nothing acknowledged: all three, from `unacked`.
        let want: Vec<(u64, u64)> =
            seqs.iter().enumerate().map(|(i, s)| (*s, if i == 0 { 0 } else { seqs[i - 1] })).collect();
        assert_eq!(resent(head.step(resend(0))), want);
        assert_eq!(reads.get(), 0, "a resend of unacknowledged updates read the log");
        // The gap after the first: the other two.
        assert_eq!(resent(head.step(resend(seqs[0]))), want[1..].to_vec());
        assert_eq!(reads.get(), 0);
        // The first acknowledged: a gap below `acked` is read from the log.
        head.step(Event::Chain {
            from: 2,
            msg: ChainMsg::Ack { epoch: 1, range: Range::full(), seq: seqs[0] },
        });
        assert_eq!(resent(head.step(resend(0))), want);
        assert_eq!(reads.get(), 1, "a gap below what is acknowledged must be read from the log");
    }

    #[test]
    fn a_middle_with_a_new_predecessor_acks_what_the_tail_acknowledged() {
        let mut c = Chain::new(&[1, 2, 3]);
        let head = c.0.get_mut(&1).expect("head").step(update(1, set("k", "v")));
        let [Action::Send { to: 2, msg }] = head.as_slice() else { panic!("{head:?}") };
        c.run(2, Event::Chain { from: 1, msg: msg.clone() });
        let acked = c.0[&2].acked();
        assert!(acked > 0);
        // Node 1 left the chain; node 5, whose re-send of that update this middle dropped
        // before it installed the new route, heads it now.
        let out = c.0.get_mut(&2).expect("middle").step(Event::Install(route(2, 2, &[5, 2, 3])));
        let acks: Vec<u64> = out
            .iter()
            .filter_map(|a| match a {
                Action::Send { to: 5, msg: ChainMsg::Ack { seq, .. } } => Some(*seq),
                _ => None,
            })
            .collect();
        assert_eq!(acks, vec![acked], "{out:?}");
    }

    #[test]
    fn a_middle_acks_a_resent_update_the_tail_already_acked() {
        let mut c = Chain::new(&[1, 2, 3]);
        let head = c.0.get_mut(&1).expect("head").step(update(1, set("k", "v")));
        let [Action::Send { to: 2, msg }] = head.as_slice() else { panic!("{head:?}") };
        let msg = msg.clone();
        let done = c.run(2, Event::Chain { from: 1, msg: msg.clone() });
        assert!(matches!(&done[..], [Action::Reply { .. }]), "{done:?}");
        // The head resends it (say the ack reached it in an epoch it had not installed): the
        // middle passes the tail's ack up again rather than wait for a later update.
        let again = c.0.get_mut(&2).expect("middle").step(Event::Chain { from: 1, msg });
        assert!(
            matches!(&again[..], [Action::Send { to: 1, msg: ChainMsg::Ack { seq, .. } }] if *seq == c.0[&3].acked()),
            "{again:?}"
        );
    }

    #[test]
    fn a_gap_asks_for_a_resend_and_applies_nothing() {
        let mut r = Replica::new(MemStore::default(), route(1, 2, &[1, 2]));
        let msg = ChainMsg::Replicate {
            epoch: 1,
            range: Range::full(),
            seq: 7,
            prev_seq: 5,
            key: b"k".to_vec(),
            effect: ReplEffect::Delete,
            origin: None,
        };
        let out = r.step(Event::Chain { from: 1, msg: msg.clone() });
        assert!(
            matches!(&out[..], [Action::Send { to: 1, msg: ChainMsg::Resend { after_seq: 0, .. } }]),
            "{out:?}"
        );
        assert_eq!(r.store().max_seq(), 0);
        // The same gap again before a tick: no second scan of the predecessor's log; after
        // a tick (the resend may be lost) it is asked for again.
        assert_eq!(r.step(Event::Chain { from: 1, msg: msg.clone() }), vec![]);
        r.step(Event::Tick);
        let again = r.step(Event::Chain { from: 1, msg });
        assert!(
            matches!(&again[..], [Action::Send { msg: ChainMsg::Resend { after_seq: 0, .. }, .. }]),
            "{again:?}"
        );
    }

    /// A store whose appends fail while `full` (a disk with no room).
    #[derive(Default)]
    struct Fillable {
        mem: MemStore,
        full: bool,
    }

    impl ReplicaStore for Fillable {
        fn append(&mut self, u: &Append<'_>) -> Result<(), StoreError> {
            if self.full {
                return Err(StoreError::Failed("no space left on device".into()));
            }
            self.mem.append(u)
        }
        fn max_seq(&self) -> u64 {
            self.mem.max_seq()
        }
        fn read(&self, key: &[u8]) -> Result<Option<Item>, StoreError> {
            self.mem.read(key)
        }
        fn updates_after(&self, after: u64) -> Result<Vec<StoredUpdate>, StoreError> {
            self.mem.updates_after(after)
        }
    }

    #[test]
    fn a_replica_that_could_not_append_an_update_asks_each_tick_until_it_holds_it() {
        let full = Fillable { full: true, ..Fillable::default() };
        let mut r = Replica::new(full, route(1, 2, &[1, 2]));
        let msg = ChainMsg::Replicate {
            epoch: 1,
            range: Range::full(),
            seq: 7,
            prev_seq: 0,
            key: b"k".to_vec(),
            effect: ReplEffect::Delete,
            origin: None,
        };
        assert_eq!(r.step(Event::Chain { from: 1, msg: msg.clone() }), vec![]);
        let resend = |out: &[Action]| {
            matches!(out, [Action::Send { to: 1, msg: ChainMsg::Resend { after_seq: 0, .. } }])
        };
        let first = r.step(Event::Tick);
        assert!(resend(&first), "{first:?}");
        // That ask was lost with its connection, and no later update shows the gap: the next
        // tick asks again, and again, until the update is held.
        r.store_mut().full = false;
        let again = r.step(Event::Tick);
        assert!(resend(&again), "{again:?}");
        let applied = r.step(Event::Chain { from: 1, msg });
        assert!(
            matches!(&applied[..], [Action::Send { to: 1, msg: ChainMsg::Ack { seq: 7, .. } }]),
            "{applied:?}"
        );
        assert_eq!(r.step(Event::Tick), vec![]);
    }

    #[test]
    fn a_new_head_answers_a_retry_from_the_origin_it_was_sent() {
        let mut c = Chain::new(&[1, 2, 3]);
        let first = c.run(1, update(4, set("k", "v")));
        c.0.remove(&1);
        for (n, r) in c.0.iter_mut() {
            r.step(Event::Install(route(2, *n, &[2, 3])));
        }
        let retry = c.run(2, update(4, set("k", "v")));
        assert_eq!(retry, first);
        assert_eq!(c.0[&3].store().max_seq(), c.0[&2].store().max_seq());
    }

    /// A client's floor reaches every replica with the updates (`Origin::floor`): a promoted
    /// follower has forgotten what the head forgot, and still answers a retry at the floor.
    #[test]
    fn every_replica_forgets_below_a_client_floor_and_a_new_head_answers_a_retry_at_it() {
        let mut c = Chain::new(&[1, 2, 3]);
        let with_floor = |req, key, floor| {
            let Event::Update(u) = update(req, set(key, "v")) else { unreachable!() };
            Event::Update(ClientUpdate { floor, ..u })
        };
        let first = c.run(1, with_floor(1, "a", 1));
        let second = c.run(1, with_floor(2, "b", 1));
        // A floor above the request's own seq is taken as that seq.
        c.run(1, with_floor(3, "c", 99));
        for r in c.0.values() {
            assert_eq!(r.recent.floor_of(1), 3);
            assert_eq!(r.recent.get(&ReqId { client: 1, seq: 1 }), None);
            assert!(r.recent.get(&ReqId { client: 1, seq: 3 }).is_some());
        }
        assert!(!first.is_empty() && !second.is_empty());
        c.0.remove(&1);
        for (n, r) in c.0.iter_mut() {
            r.step(Event::Install(route(2, *n, &[2, 3])));
        }
        let held = c.0[&2].store().max_seq();
        let retry = c.run(2, with_floor(3, "c", 3));
        assert!(
            matches!(&retry[..], [Action::Reply { result: Ok(Outcome::Stored { cas }), .. }] if *cas == held)
        );
        assert_eq!(c.0[&2].store().max_seq(), held, "the retry at the floor was not applied again");
        // A stale copy of a request below the floor, whose outcome is forgotten, is refused,
        // alone or among others, and not applied a second time.
        let stale = c.run(2, with_floor(1, "a", 1));
        assert!(
            matches!(&stale[..], [Action::Reply { result: Err(WireError::Invalid(_)), .. }]),
            "{stale:?}"
        );
        let Event::Update(again) = with_floor(2, "b", 0) else { unreachable!() };
        let Event::Update(next) = with_floor(4, "d", 4) else { unreachable!() };
        let both = c.run(2, Event::Updates(vec![again, next]));
        assert!(matches!(&both[0], Action::Reply { result: Err(WireError::Invalid(_)), .. }), "{both:?}");
        assert_eq!(c.0[&2].store().applied_after(held).count(), 1, "only the new request was applied");
    }

    /// A split or merge heir knows its parent's floors: a slow copy of a request its parent
    /// forgot (the client's floor passed it), routed to the heir by its key, is refused, not
    /// applied a second time.
    #[test]
    fn an_heir_refuses_a_stale_copy_its_parent_forgot() {
        let mut parent = Replica::new(MemStore::default(), route(1, 1, &[1]));
        let with_floor = |req, key, floor| {
            let Event::Update(u) = update(req, set(key, "v")) else { unreachable!() };
            Event::Update(ClientUpdate { floor, ..u })
        };
        parent.step(with_floor(1, "a", 1));
        parent.step(with_floor(2, "b", 2));
        assert_eq!(parent.recent.get(&ReqId { client: 1, seq: 1 }), None, "forgotten below the floor");
        let mut heir = Replica::new(MemStore::default(), route(2, 1, &[1]));
        heir.inherit(&mut parent);
        let stale = heir.step(with_floor(1, "a", 1));
        assert!(
            matches!(&stale[..], [Action::Reply { result: Err(WireError::Invalid(_)), .. }]),
            "{stale:?}"
        );
        assert_eq!(heir.store().max_seq(), 0, "the stale copy was not applied");
    }

    #[test]
    fn outcomes_after_a_resend_let_a_new_head_answer_a_retry_of_an_update_it_holds() {
        let mut r = Replica::new(MemStore::default(), route(1, 2, &[1, 2]));
        let put = ReplEffect::Put { value: b"v".to_vec(), flags: 0, expiry: 0, state: 0 };
        let resent = ChainMsg::Replicate {
            epoch: 1,
            range: Range::full(),
            seq: 5,
            prev_seq: 0,
            key: b"k".to_vec(),
            effect: put,
            origin: None,
        };
        r.step(Event::Chain { from: 1, msg: resent });
        let held = ReqId { client: 1, seq: 1 };
        let not_held = ReqId { client: 1, seq: 2 };
        let entries = vec![
            OutcomeEntry { req: held, seq: 5, outcome: Outcome::Stored { cas: 5 } },
            OutcomeEntry { req: not_held, seq: 9, outcome: Outcome::Stored { cas: 9 } },
        ];
        r.step(Event::Chain { from: 1, msg: ChainMsg::Outcomes { epoch: 1, range: Range::full(), entries } });
        r.step(Event::Install(route(2, 2, &[2])));
        let retry = r.step(update(1, set("k", "v")));
        assert_eq!(retry, vec![Action::Reply { req: held, result: Ok(Outcome::Stored { cas: 5 }) }]);
        assert_eq!(r.store().max_seq(), 5, "a retry of an update held here was ordered again");
        // An outcome of an update this replica never got is not taken: that request is new here.
        let other = r.step(update(2, set("k", "w")));
        assert!(
            matches!(&other[..], [Action::Reply { result: Ok(Outcome::Stored { cas }), .. }] if *cas > 5)
        );
    }

    #[test]
    fn a_resent_update_carries_its_requests_outcome() {
        let mut c = Chain::new(&[1, 2]);
        let out = c.run(1, update(1, set("k", "v")));
        let [Action::Reply { result: Ok(outcome), .. }] = out.as_slice() else { panic!("{out:?}") };
        let (outcome, mut tail) = (outcome.clone(), c.0.remove(&2).expect("tail"));
        // A failed condition is remembered at the seq of the update before it: not an origin.
        let cas = Update { mutation: Mutation::Cas { unique: 99 }, ..set("k", "w") };
        c.0.get_mut(&1).expect("head").step(update(2, cas));
        let resend = ChainMsg::Resend { epoch: 1, range: Range::full(), after_seq: 0 };
        let out = c.0.get_mut(&1).expect("head").step(Event::Chain { from: 2, msg: resend });
        let origins: Vec<_> = out
            .iter()
            .filter_map(|a| match a {
                Action::Send { msg: ChainMsg::Replicate { origin, .. }, .. } => Some(origin.clone()),
                _ => None,
            })
            .collect();
        let req = ReqId { client: 1, seq: 1 };
        assert_eq!(origins, vec![Some(Origin { req, outcome: outcome.clone(), reply_to: None, floor: 0 })]);
        // The receiver, its copy emptied, takes the update with its outcome alone.
        tail = Replica::new(MemStore::default(), tail.route().clone());
        for a in out {
            if let Action::Send { msg: msg @ ChainMsg::Replicate { .. }, .. } = a {
                tail.step(Event::Chain { from: 1, msg });
            }
        }
        tail.step(Event::Install(route(2, 2, &[2])));
        let retry = tail.step(update(1, set("k", "v")));
        assert_eq!(retry, vec![Action::Reply { req, result: Ok(outcome) }]);
    }

    /// Node 2, syncing behind node 1 at epoch 1, then promoted to tail of `[1, 2]` at epoch 2
    /// (it has not heard `CaughtUp` yet).
    fn promoted_behind_node_1() -> Replica<MemStore> {
        let syncing = Route {
            epoch: 1,
            me: 2,
            rc: RangeConfig { syncing: vec![2], ..RangeConfig::new(Range::full(), vec![1]) },
        };
        let mut r = Replica::new(MemStore::default(), syncing);
        r.step(Event::Install(route(2, 2, &[1, 2])));
        r
    }

    #[test]
    fn a_promoted_tail_left_alone_in_the_chain_serves_gets() {
        // Promoted from syncing, it waits for its predecessor's `CaughtUp`; if that
        // predecessor fails first, no one is left to send it, and it must not refuse for ever.
        let mut r = promoted_behind_node_1();
        assert!(!r.readable(), "a promoted tail served gets before it caught up");
        r.step(Event::Install(route(3, 2, &[2])));
        assert!(r.readable());
        let get = r.step(Event::Get { token: 1, key: b"k".to_vec(), now: 0 });
        assert_eq!(get, vec![Action::GetReply { token: 1, result: Ok(None) }]);
    }

    #[test]
    fn a_promoted_tail_missing_what_caught_up_names_stays_unreadable_and_asks_again() {
        // Its appends of the resent updates failed (a full disk): `CaughtUp` names a seq it
        // does not hold, and serving gets would answer from a copy that lacks them.
        let mut r = promoted_behind_node_1();
        let caught_up = |seq| ChainMsg::CaughtUp { epoch: 2, range: Range::full(), seq };
        r.step(Event::Chain { from: 1, msg: caught_up(9) });
        assert!(!r.readable(), "a tail missing seq 9 took CaughtUp for it");
        let out = r.step(Event::Tick);
        assert!(
            matches!(&out[..], [Action::Send { to: 1, msg: ChainMsg::Resend { after_seq: 0, .. } }]),
            "{out:?}"
        );
        r.step(Event::Chain { from: 1, msg: caught_up(0) });
        assert!(r.readable());
    }

    #[test]
    fn a_head_removed_from_the_chain_tells_its_waiting_clients_to_retry() {
        let mut head = Replica::new(MemStore::default(), route(1, 1, &[1, 2]));
        let out = head.step(update(1, set("k", "v")));
        assert!(matches!(&out[..], [Action::Send { to: 2, .. }]), "answered before the ack: {out:?}");
        let out = head.step(Event::Install(route(2, 1, &[2])));
        let req = ReqId { client: 1, seq: 1 };
        assert_eq!(out, vec![Action::Reply { req, result: Err(WireError::StaleEpoch { current: 2 }) }]);
        assert!(head.step(Event::Install(route(3, 1, &[2]))).is_empty(), "told twice");
    }

    #[test]
    fn updates_applied_as_one_batch_act_as_applied_one_by_one() {
        let msg = |seq, prev_seq| ChainMsg::Replicate {
            epoch: 1,
            range: Range::full(),
            seq,
            prev_seq,
            key: format!("k{seq}").into_bytes(),
            effect: ReplEffect::Put { value: b"v".to_vec(), flags: 0, expiry: 0, state: 0 },
            origin: Some(Origin {
                req: ReqId { client: 1, seq },
                outcome: Outcome::Stored { cas: seq },
                reply_to: Some("fe".into()),
                floor: 0,
            }),
        };
        // New, new, a duplicate, a gap, then one that follows what is held again.
        let msgs = vec![msg(5, 0), msg(7, 5), msg(7, 5), msg(11, 9), msg(12, 7)];
        for me in [2, 3] {
            let mut one = Replica::new(MemStore::default(), route(1, me, &[1, 2, 3]));
            let mut batch = Replica::new(MemStore::default(), route(1, me, &[1, 2, 3]));
            let from = me - 1;
            let singly: Vec<Action> =
                msgs.iter().flat_map(|m| one.step(Event::Chain { from, msg: m.clone() })).collect();
            let together = batch.step(Event::Replicates { from, msgs: msgs.clone() });
            assert_eq!(together, singly, "node {me}");
            assert_eq!(batch.store().applied_after(0).collect::<Vec<_>>(), vec![5, 7, 12]);
            assert_eq!((batch.acked(), batch.unacked_len()), (one.acked(), one.unacked_len()));
        }
    }

    #[test]
    fn client_updates_ordered_as_one_batch_act_as_ordered_one_by_one() {
        let cas = |unique| Update { mutation: Mutation::Cas { unique }, ..set("a", "x") };
        let Event::Update(retry) = update(1, set("a", "again")) else { unreachable!() };
        // Sets, a retry of one of them in the same batch, a condition on what the batch wrote,
        // then sets again.
        let updates: Vec<ClientUpdate> = [
            update(1, set("a", "1")),
            update(2, set("b", "2")),
            Event::Update(retry),
            update(3, cas(1)),
            update(4, set("c", "3")),
            update(5, set("a", "4")),
        ]
        .into_iter()
        .map(|e| match e {
            Event::Update(u) => u,
            _ => unreachable!(),
        })
        .collect();
        for chain in [&[1, 2, 3][..], &[1][..]] {
            let mut one = Replica::new(MemStore::default(), route(1, 1, chain));
            let mut batch = Replica::new(MemStore::default(), route(1, 1, chain));
            let singly: Vec<Action> =
                updates.iter().flat_map(|u| one.step(Event::Update(u.clone()))).collect();
            let together = batch.step(Event::Updates(updates.clone()));
            assert_eq!(together, singly, "chain {chain:?}");
            let applied = |r: &Replica<MemStore>| r.store().applied_after(0).collect::<Vec<_>>();
            assert_eq!(applied(&batch), applied(&one));
            assert_eq!(applied(&batch).len(), 5, "chain {chain:?}");
            assert_eq!(batch.store().seq_of(b"a"), one.store().seq_of(b"a"));
            assert_eq!((batch.acked(), batch.unacked_len()), (one.acked(), one.unacked_len()));
        }
    }

    /// Node 2 syncing the range from node 1 (shell sync), its copy holding one put of `k`
    /// at seq 5.
    fn syncing_with_k_copied_at_5() -> Replica<MemStore> {
        let syncing = Route {
            epoch: 1,
            me: 2,
            rc: RangeConfig { syncing: vec![2], ..RangeConfig::new(Range::full(), vec![1]) },
        };
        let mut r = Replica::new(MemStore::default(), syncing).with_shell_sync();
        let put = ReplEffect::Put { value: b"v".to_vec(), flags: 0, expiry: 0, state: 0 };
        r.store_mut().write_copied(5, b"k", &put);
        r
    }

    #[test]
    fn a_copy_remembers_its_outcomes_up_to_its_cut_and_a_later_head_orders_above_it() {
        // The source's compaction dropped the delete at the top of its log (seq 9): the copy's
        // highest record is 5, yet the delete's outcome is part of the copy.
        let mut r = syncing_with_k_copied_at_5();
        let (stored, deleted, after_cut) =
            (ReqId { client: 1, seq: 1 }, ReqId { client: 1, seq: 2 }, ReqId { client: 1, seq: 3 });
        r.copied(
            9,
            vec![
                OutcomeEntry { req: stored, seq: 5, outcome: Outcome::Stored { cas: 5 } },
                OutcomeEntry { req: deleted, seq: 9, outcome: Outcome::Deleted },
                OutcomeEntry { req: after_cut, seq: 12, outcome: Outcome::Stored { cas: 12 } },
            ],
        );
        r.step(Event::Install(route(2, 2, &[2])));
        let delete = Update { mutation: Mutation::Delete, ..set("j", "") };
        // The retry is answered from the copy's outcome (once seq 9 counts as committed),
        // not decided again.
        assert!(r.step(update(2, delete)).is_empty());
        assert_eq!(r.store().max_seq(), 5, "the retried delete was ordered again");
        // An outcome above the cut is not the copy's: that request is new here, and is
        // ordered above the cut.
        let new = r.step(update(3, set("k", "w")));
        let replies = vec![
            Action::Reply { req: deleted, result: Ok(Outcome::Deleted) },
            Action::Reply { req: after_cut, result: Ok(Outcome::Stored { cas: 10 }) },
        ];
        assert_eq!(new, replies);
    }

    #[test]
    fn a_copy_served_by_a_copy_is_cut_at_the_first_copy_s_cut_with_its_outcomes() {
        // This replica's own copy was cut at 9 above its highest record (5): the source had
        // dropped the delete at 9. A copy served from it must carry that delete's outcome.
        let mut r = syncing_with_k_copied_at_5();
        let deleted = ReqId { client: 1, seq: 2 };
        r.copied(9, vec![OutcomeEntry { req: deleted, seq: 9, outcome: Outcome::Deleted }]);
        assert_eq!(r.copy_cut_seq(), 9, "cut at the highest record, below the copy's own cut");
        let carried = r.outcomes_after(0, r.copy_cut_seq());
        let entries: Vec<_> = carried
            .iter()
            .flat_map(|m| match m {
                ChainMsg::Outcomes { entries, .. } => entries.clone(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(entries, vec![OutcomeEntry { req: deleted, seq: 9, outcome: Outcome::Deleted }]);
    }

    #[test]
    fn the_tombstone_watermark_holds_while_a_replica_syncs_or_a_new_tail_is_unproven() {
        let mut c = Chain::new(&[1, 2]);
        c.run(1, update(1, set("a", "1")));
        let before = c.0[&2].acked();
        assert!(before > 0);
        let marks = |c: &Chain| c.0.values().map(|r| r.tombstone_watermark()).collect::<Vec<_>>();
        assert_eq!(marks(&c), vec![before, before]);
        let install = |c: &mut Chain, epoch: u64, rc: RangeConfig| {
            let nodes: Vec<NodeId> = c.0.keys().copied().collect();
            for n in nodes {
                c.run(n, Event::Install(Route { epoch, me: n, rc: rc.clone() }));
            }
        };
        // Node 3 syncs behind the tail, then joins as the unproven tail: a resend to it from
        // a log compacted up to `acked` could lack a delete it needs.
        let syncing = RangeConfig { syncing: vec![3], ..RangeConfig::new(Range::full(), vec![1, 2]) };
        c.0.insert(3, Replica::new(MemStore::default(), Route { epoch: 2, me: 3, rc: syncing.clone() }));
        install(&mut c, 2, syncing);
        c.run(1, update(2, set("a", "2")));
        assert!(c.0[&2].acked() > before);
        assert_eq!(marks(&c)[..2], [before, before], "the watermark passed a syncing replica");
        let unproven =
            RangeConfig { unproven_tail: Some(3), ..RangeConfig::new(Range::full(), vec![1, 2, 3]) };
        install(&mut c, 3, unproven);
        c.run(1, update(3, set("a", "3")));
        assert_eq!(marks(&c)[..2], [before, before], "the watermark passed an unproven tail");
        // Proven: it follows what the tail acknowledged again.
        install(&mut c, 4, RangeConfig::new(Range::full(), vec![1, 2, 3]));
        c.run(1, update(4, set("a", "4")));
        let acked = c.0[&3].acked();
        assert_eq!(marks(&c), vec![acked; 3]);
    }

    #[test]
    fn incoming_tells_duplicates_gaps_and_the_next_update_apart() {
        assert_eq!(incoming(5, 3, 5), Incoming::Duplicate);
        assert_eq!(incoming(6, 5, 5), Incoming::Next);
        assert_eq!(incoming(6, 4, 5), Incoming::Next);
        assert_eq!(incoming(7, 6, 5), Incoming::Gap);
    }
}
