//! A syncing replica's copy of its range, sans-I/O: the decisions of both ends of a snapshot
//! or suffix stream. The back-end's shell (`backend::range::{source, sink}`) and the
//! simulator (`fawn-sim`) both drive this code; they keep the pacing, the tasks and the
//! datastore writes.
//!
//! * The **source** is the range's tail, serving its syncing successor ([`serves_sync`]). For
//!   a fresh replica it streams a snapshot; for a replica rejoining with its old datastore,
//!   the *suffix* after that replica's last record, granted only when [`judge_suffix`] finds
//!   nothing against it (see [`suffix_refusal`] for the argument). The cut (`upto_seq`, the
//!   records' iterator) is taken when the request is handled, under the range's lock in the
//!   shell: records up to it travel in the stream, later updates are forwarded live.
//!   [`Stream`] turns the cut into `SnapshotBatch`es, the copied updates' request outcomes
//!   (`Outcomes`) and `SnapshotEnd`. A newer request replaces the stream in progress.
//! * The **sink** ([`SyncProgress`]) takes the newest `SnapshotBegin` (or the `SuffixBegin`
//!   it asked for), buffers live updates meanwhile, abandons a stream with a missing batch or
//!   a silent source, checks at `SnapshotEnd` that it got every batch, then plays the
//!   buffered updates forward through the machine ([`replay`]).
//!
//! Time is an input (a `Duration` since any fixed origin); records are read through
//! [`SyncStore`], which FAWN-DS and the simulator's store implement.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use fawn_ds::{DataStore, RecordKind};
use fawn_proto::native::{ChainMsg, Epoch, OutcomeEntry, RecordMark, ReplEffect, SnapshotItem};
use fawn_ring::{key_id, NodeId, Range};

use super::machine::{Event, Fault, Replica};
use super::route::Route;
use super::store::{MemStore, ReplicaStore, StoreError, StoredUpdate};

/// Bytes of live updates a syncing replica buffers while its snapshot streams in (keys,
/// values and `SYNC_BUFFER_UPDATE_OVERHEAD_BYTES` each). Past it the updates are not kept:
/// once the copy is complete the replica asks its source to resend what follows the last one
/// it holds, from the source's log, so a long copy under heavy put load costs a resend instead
/// of unbounded memory.
pub const SYNC_BUFFER_BYTES_MAX: usize = 64 << 20;
/// What one buffered update costs beyond its key and value (the message and its vector slot).
pub const SYNC_BUFFER_UPDATE_OVERHEAD_BYTES: usize = 128;
/// A snapshot stream that has sent nothing for this long (its sender restarted, or could not
/// read its log) is abandoned; the syncing replica asks for a new one.
pub const SNAPSHOT_SILENCE_MAX: Duration = Duration::from_secs(10);

/// The datastore as a sync reads it.
pub trait SyncStore {
    /// The records in log order, as of now (later appends are not in it).
    type Cut: Iterator<Item = Result<StoredUpdate, StoreError>>;
    /// Takes the cut: the shell takes it under the range's lock, so it holds exactly the
    /// updates up to `max_seq` as of then.
    fn cut(&self) -> Self::Cut;
    /// The highest seq held (a floor: may exceed every record left).
    fn sync_max_seq(&self) -> u64;
    /// Compaction dropped deletes or expired items up to this seq (0: none).
    fn dropped_seq_max(&self) -> u64;
    /// The mark of `key`'s current record, if it is a put.
    fn current_put(&self, key: &[u8]) -> Result<Option<RecordMark>, StoreError>;
}

fn ds_error(e: fawn_ds::Error) -> StoreError {
    StoreError::Failed(e.to_string())
}

fn stored(record: Result<fawn_ds::Record, fawn_ds::Error>) -> Result<StoredUpdate, StoreError> {
    let r = record.map_err(ds_error)?;
    let effect = match r.kind {
        RecordKind::Put => ReplEffect::Put {
            value: r.value,
            flags: r.meta.flags,
            expiry: r.meta.expiry,
            state: r.meta.state,
        },
        RecordKind::Delete => ReplEffect::Delete,
    };
    Ok(StoredUpdate { seq: r.meta.seq, key: r.key, effect })
}

type DsCut = std::iter::Map<
    fawn_ds::Iter,
    fn(Result<fawn_ds::Record, fawn_ds::Error>) -> Result<StoredUpdate, StoreError>,
>;

impl SyncStore for Arc<DataStore> {
    type Cut = DsCut;

    fn cut(&self) -> DsCut {
        self.iter().map(stored as fn(_) -> _)
    }

    fn sync_max_seq(&self) -> u64 {
        self.max_seq()
    }

    fn dropped_seq_max(&self) -> u64 {
        DataStore::dropped_seq_max(self)
    }

    fn current_put(&self, key: &[u8]) -> Result<Option<RecordMark>, StoreError> {
        let entry = self.lookup(key).map_err(ds_error)?;
        Ok(entry.map(|e| RecordMark {
            key: key.to_vec(),
            seq: e.meta.seq,
            delete: false,
            value_crc: crc32c::crc32c(&e.value),
            flags: e.meta.flags,
            expiry: e.meta.expiry,
        }))
    }
}

impl SyncStore for MemStore {
    type Cut = std::vec::IntoIter<Result<StoredUpdate, StoreError>>;

    fn cut(&self) -> Self::Cut {
        let records = self.updates_after(0).unwrap_or_default();
        records.into_iter().map(Ok).collect::<Vec<_>>().into_iter()
    }

    fn sync_max_seq(&self) -> u64 {
        self.max_seq()
    }

    fn dropped_seq_max(&self) -> u64 {
        MemStore::dropped_seq_max(self)
    }

    fn current_put(&self, key: &[u8]) -> Result<Option<RecordMark>, StoreError> {
        Ok(self
            .latest_record(key)
            .filter(|u| matches!(u.effect, ReplEffect::Put { .. }))
            .map(|u| mark_of(&u)))
    }
}

/// Whether `fault` is switched on (only a build with the `faults` feature has any).
fn faulty(fault: Option<Fault>, which: Fault) -> bool {
    cfg!(feature = "faults") && fault == Some(which)
}

// ---- the source ----

/// Whether this replica, in `route`, serves a sync request from `from`: it is the tail and
/// `from` its syncing successor.
pub fn serves_sync(route: &Route, from: NodeId) -> bool {
    route.is_tail() && route.successor() == Some(from) && route.rc.syncing.contains(&from)
}

/// The mark of a record: what a rejoining replica tells its source of its last one.
pub fn mark_of(u: &StoredUpdate) -> RecordMark {
    match &u.effect {
        ReplEffect::Put { value, flags, expiry, .. } => RecordMark {
            key: u.key.clone(),
            seq: u.seq,
            delete: false,
            value_crc: crc32c::crc32c(value),
            flags: *flags,
            expiry: *expiry,
        },
        ReplEffect::Delete => {
            RecordMark { key: u.key.clone(), seq: u.seq, delete: true, value_crc: 0, flags: 0, expiry: 0 }
        }
    }
}

/// What a rejoining replica asks for: the records after `have_seq`, whose record `top` the
/// source must recognise as committed (see [`suffix_refusal`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuffixPlan {
    pub have_seq: u64,
    pub top: RecordMark,
}

/// Whether a datastore kept as a whole replica of `held` may rejoin `range` by a suffix: only
/// when `range` lies inside `held`. A whole replica's records are a prefix of the history of
/// every key it held, so of any range inside it; a range reaching past `held` (a merge of it
/// with others) has keys whose records below the datastore's highest seq it never held, and a
/// suffix after that seq would leave them out.
pub fn suffix_covers(held: &Range, range: &Range) -> bool {
    super::reshape::within(range, held)
}

/// The suffix plan of a datastore kept from before a failure, whose highest seq is `max_seq`
/// and whose records are `records`: `None` (copy the range in full) when the record of
/// `max_seq` is gone (compaction dropped it) or the store is empty.
pub fn suffix_plan(
    max_seq: u64,
    records: impl Iterator<Item = Result<StoredUpdate, StoreError>>,
) -> Result<Option<SuffixPlan>, StoreError> {
    if max_seq == 0 {
        return Ok(None);
    }
    let mut top = None;
    for record in records {
        let record = record?;
        if record.seq == max_seq {
            top = Some(mark_of(&record));
        }
    }
    Ok(top.map(|top| SuffixPlan { have_seq: max_seq, top }))
}

/// The checks of a suffix request that need no log read: why the records of this (tail)
/// replica above `have_seq` would not turn a rejoining replica whose highest record is `top`
/// into an exact copy, or `None` if they would provided `top` is committed (point 2, checked
/// by [`judge_suffix`]). Judged at the cut, so the answer holds for it.
///
/// The argument (docs/PROTOCOL.md, "Rejoin"):
/// 1. Sequence numbers increase along the range's update order, across head changes (a new
///    head continues above everything it holds). A replica receives that order without gaps
///    (`prev_seq`), or a snapshot plus the order after it; so its records are the range's
///    history up to its last record — except that a head that died may have appended
///    updates no one else received. Those form the *end* of its log: any record after an
///    uncommitted one is uncommitted too (the tail takes updates in order). So if its last
///    record is committed, every record it holds is.
/// 2. Everything this tail stores is committed. If its log holds `top` (same key, seq and
///    contents; checked first against the key's current record, else by a scan of the log),
///    the rejoiner's last record is committed, and by 1 the rejoiner holds the committed
///    state as of `have_seq` (the back-end's `REPLICA` marker keeps out stores that were a
///    snapshot cut off half-way, which hold no prefix).
/// 3. Every key changed after `have_seq` has its latest record here with a seq above
///    `have_seq`, unless compaction dropped it for its age (delete under the tombstone
///    watermark, expired put): `dropped_seq_max <= have_seq` rules that out.
/// 4. Appending, for every key with records above `have_seq`, its latest one (streamed in log
///    order; superseded ones are left out) then leaves the rejoiner with this replica's state
///    as of the cut; the live stream after the cut follows as for a snapshot. `have_seq <=
///    max_seq` keeps the rejoiner from mistaking later updates for duplicates.
pub fn suffix_refusal(
    range: &Range,
    have_seq: u64,
    top: &RecordMark,
    max_seq: u64,
    dropped_seq_max: u64,
    fault: Option<Fault>,
) -> Option<String> {
    if top.seq != have_seq || have_seq == 0 {
        return Some("the replica's last record does not carry its highest seq".into());
    }
    if !range.contains(key_id(&top.key)) {
        return Some("the replica's last record is outside this range".into());
    }
    if max_seq < have_seq {
        return Some(format!("the replica holds seq {have_seq}, beyond this chain's {max_seq}"));
    }
    if dropped_seq_max > have_seq && !faulty(fault, Fault::SuffixPastDroppedRecord) {
        return Some(format!(
            "compaction here dropped deletes or expired items up to seq {dropped_seq_max}, above {have_seq}"
        ));
    }
    None
}

/// What a source does with a suffix request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SuffixVerdict {
    /// Refuse, for this reason: the rejoiner copies the range in full.
    Refuse(String),
    /// Grant: `top` is this replica's current record of its key.
    Grant,
    /// Grant only if a scan of the log (from the same cut) finds `top` ([`log_holds`]).
    ScanLog,
}

/// Judges a suffix request against `store` as of the cut.
pub fn judge_suffix<S: SyncStore>(
    store: &S,
    range: &Range,
    have_seq: u64,
    top: &RecordMark,
    fault: Option<Fault>,
) -> SuffixVerdict {
    let (max, dropped) = (store.sync_max_seq(), store.dropped_seq_max());
    if let Some(reason) = suffix_refusal(range, have_seq, top, max, dropped, fault) {
        return SuffixVerdict::Refuse(reason);
    }
    // A deleted key has no current record to compare: the log scan decides.
    if top.delete {
        return SuffixVerdict::ScanLog;
    }
    match store.current_put(&top.key) {
        Ok(Some(current)) if current == *top => SuffixVerdict::Grant,
        Ok(_) => SuffixVerdict::ScanLog,
        Err(e) => SuffixVerdict::Refuse(format!("reading the key of the replica's last record: {e}")),
    }
}

/// Why a log scan refuses a suffix.
pub const NOT_IN_LOG: &str =
    "the replica's last record is not in this log (an update that never committed, or compacted away)";

/// Whether `records` include `mark`'s record.
pub fn log_holds(
    records: impl Iterator<Item = Result<StoredUpdate, StoreError>>,
    mark: &RecordMark,
) -> Result<bool, StoreError> {
    for record in records {
        let record = record?;
        if record.seq == mark.seq && mark_of(&record) == *mark {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Which records of a cut a suffix after `after` sends: each key's latest among those above
/// `after` (superseded ones are left out so that a suffix under a workload that rewrites the
/// same keys does not outgrow a full copy).
#[derive(Clone, Debug, Default)]
pub struct Selection {
    after: u64,
    latest: HashMap<Vec<u8>, u64>,
}

impl Selection {
    /// Reads `records` (a second iterator of the stream's cut) once: one key and seq held per
    /// key changed after `after`.
    pub fn read(
        after: u64,
        records: impl Iterator<Item = Result<StoredUpdate, StoreError>>,
    ) -> Result<Selection, StoreError> {
        let mut latest = HashMap::new();
        for record in records {
            let record = record?;
            if record.seq > after {
                latest.insert(record.key, record.seq);
            }
        }
        Ok(Selection { after, latest })
    }

    fn selects(&self, record: &StoredUpdate) -> bool {
        record.seq > self.after && self.latest.get(&record.key) == Some(&record.seq)
    }
}

/// What a copy is taken from: the records of the source's datastore up to `upto_seq`, and its
/// drop floor as of then. The shell takes both under the range's lock, with the records'
/// iterator, so that no write or compaction comes between them.
pub struct CopyCut<I> {
    pub upto_seq: u64,
    /// The source's `dropped_seq_max`: records up to it that compaction or a merge dropped
    /// are missing from the copy too.
    pub dropped_seq_max: u64,
    pub records: I,
}

impl<I> CopyCut<I> {
    /// The cut of `store` for a copy holding every update up to `upto_seq`.
    pub fn take<S: SyncStore<Cut = I>>(store: &S, upto_seq: u64) -> CopyCut<I> {
        CopyCut { upto_seq, dropped_seq_max: store.dropped_seq_max(), records: store.cut() }
    }
}

/// One outgoing snapshot or suffix stream, from a cut: its messages in order, one at a time
/// (the caller paces and sends them, and stops when a newer stream replaces this one).
pub struct Stream<I: Iterator> {
    range: Range,
    epoch: Epoch,
    snapshot: u64,
    upto_seq: u64,
    dropped_seq_max: u64,
    records: std::iter::Peekable<I>,
    selection: Option<Selection>,
    batch_bytes_max: usize,
    index: u64,
    outcomes: VecDeque<ChainMsg>,
    ended: bool,
    /// Records sent so far.
    pub sent: u64,
}

impl<I: Iterator<Item = Result<StoredUpdate, StoreError>>> Stream<I> {
    /// Stream `snapshot` of `range` in `epoch` over `cut`: all of its records (`selection`
    /// none) or those a suffix selects, in batches of about `batch_bytes_max` key + value
    /// bytes, then `outcomes`, then `SnapshotEnd`.
    pub fn new(
        range: Range,
        epoch: Epoch,
        snapshot: u64,
        cut: CopyCut<I>,
        selection: Option<Selection>,
        outcomes: Vec<ChainMsg>,
        batch_bytes_max: usize,
    ) -> Stream<I> {
        Stream {
            range,
            epoch,
            snapshot,
            upto_seq: cut.upto_seq,
            dropped_seq_max: cut.dropped_seq_max,
            records: cut.records.peekable(),
            selection,
            batch_bytes_max,
            index: 0,
            outcomes: outcomes.into(),
            ended: false,
            sent: 0,
        }
    }

    pub fn snapshot(&self) -> u64 {
        self.snapshot
    }

    pub fn range(&self) -> Range {
        self.range
    }

    /// Sends only what `selection` selects (a suffix, once its selection is read).
    pub fn select(&mut self, selection: Selection) {
        self.selection = Some(selection);
    }

    /// The next message and its key + value bytes (for pacing); `None` after `SnapshotEnd`.
    /// A failed read ends the stream (the receiver, hearing nothing more, asks again).
    pub fn next_msg(&mut self) -> Result<Option<(ChainMsg, usize)>, StoreError> {
        if let Some(batch) = self.next_batch()? {
            return Ok(Some(batch));
        }
        if let Some(msg) = self.outcomes.pop_front() {
            return Ok(Some((msg, 0)));
        }
        if self.ended {
            return Ok(None);
        }
        self.ended = true;
        let (epoch, range, snapshot, batches) = (self.epoch, self.range, self.snapshot, self.index);
        let (upto_seq, dropped_seq_max) = (self.upto_seq, self.dropped_seq_max);
        let end = ChainMsg::SnapshotEnd { epoch, range, snapshot, batches, upto_seq, dropped_seq_max };
        Ok(Some((end, 0)))
    }

    fn next_batch(&mut self) -> Result<Option<(ChainMsg, usize)>, StoreError> {
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        while let Some(record) = self.records.next() {
            let record = record?;
            // A split range's datastore holds the other part's keys until it is compacted.
            let wanted = self.range.contains(key_id(&record.key))
                && self.selection.as_ref().is_none_or(|s| s.selects(&record));
            if wanted {
                bytes += record.key.len() + effect_bytes(&record.effect);
                batch.push(SnapshotItem { seq: record.seq, key: record.key, effect: record.effect });
            }
            if bytes >= self.batch_bytes_max && self.records.peek().is_some() {
                break;
            }
        }
        if batch.is_empty() {
            return Ok(None);
        }
        self.sent += batch.len() as u64;
        let msg = ChainMsg::SnapshotBatch {
            range: self.range,
            snapshot: self.snapshot,
            index: self.index,
            records: batch,
        };
        self.index += 1;
        Ok(Some((msg, bytes)))
    }
}

pub fn effect_bytes(effect: &ReplEffect) -> usize {
    match effect {
        ReplEffect::Put { value, .. } => value.len(),
        ReplEffect::Delete => 0,
    }
}

// ---- the sink ----

/// Whether a syncing replica holding a *finished* copy, in configuration `installed`, must
/// copy afresh on installing `installing`: more than one epoch later, the node may have
/// missed a configuration that dropped its sync, while its source, no longer syncing it,
/// stopped holding the tombstones a resend to it would need (a later resend from its log
/// would then miss deletes). An unfinished copy is left as it is: restarting it on every
/// skipped epoch could keep a long copy from ever finishing under churn.
pub fn finished_copy_outdated(installed: Epoch, installing: Epoch) -> bool {
    installing > installed + 1
}

/// How a syncing replica got its copy, for the log line and the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncReport {
    pub suffix: bool,
    pub records: u64,
    pub bytes: u64,
}

/// What a syncing replica does with a `SnapshotBatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchVerdict {
    /// Not of the stream taken: ignored.
    Ignore,
    /// A batch before it is missing: the stream is abandoned (asked for again).
    Gap { expected: u64 },
    /// Write it, then say how that went (`batch_written`, `write_failed`).
    Write,
}

/// A `SnapshotEnd`'s fields, as the syncing replica takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyEnd {
    pub snapshot: u64,
    pub batches: u64,
    pub upto_seq: u64,
    pub dropped_seq_max: u64,
}

/// What a syncing replica does with a `SnapshotEnd`.
#[derive(Debug, PartialEq)]
pub enum EndVerdict {
    Ignore,
    /// Batches are missing: the stream is abandoned (asked for again).
    Incomplete {
        got: u64,
    },
    /// The copy is whole: remember the copied updates' `outcomes` as held up to the cut
    /// (`Replica::copied`), play `buffered` forward ([`replay`]); if `overflowed`, ask the
    /// source to resend what follows the last update held.
    Complete {
        outcomes: Vec<OutcomeEntry>,
        buffered: Vec<ChainMsg>,
        overflowed: bool,
        report: SyncReport,
    },
}

/// Progress of a syncing replica.
#[derive(Debug)]
pub struct SyncProgress {
    pub source: NodeId,
    pub started: bool,
    pub done: bool,
    buffered: Vec<ChainMsg>,
    /// What `buffered` costs (`SYNC_BUFFER_BYTES_MAX`).
    buffered_bytes: usize,
    buffer_bytes_max: usize,
    /// Updates arrived past the budget and were not kept: a resend follows the copy.
    overflowed: bool,
    /// The snapshot stream taken (named by its `SnapshotBegin`, or `SuffixBegin`) and the
    /// index of its next batch: batches and ends of any other stream are ignored, a missing
    /// batch abandons it.
    stream: u64,
    next_batch: u64,
    /// When the stream last made progress.
    progress_at: Option<Duration>,
    /// This replica kept its datastore from before it failed: it asks for the records after
    /// its last one instead of a full snapshot.
    suffix: Option<SuffixPlan>,
    /// The source refused the suffix; the caller replaces this replica by a fresh one.
    refused: bool,
    /// The stream being received is a suffix (the old records stay), not a full snapshot.
    receiving_suffix: bool,
    /// Records and key + value bytes received so far.
    records: u64,
    bytes: u64,
    /// The request outcomes of the copied updates (`ChainMsg::Outcomes` within the stream),
    /// kept until the end: the copy holds every update up to its cut, even one whose record
    /// the source's compaction dropped (a delete), which the replica's store cannot show.
    outcomes: Vec<OutcomeEntry>,
    /// When anything last arrived from `source` (any chain message of this range), or the
    /// replica started syncing: a source silent for long is probed and, if it does not answer
    /// either, reported to the manager as a cut link (`Backend::check_links`).
    heard_at: Duration,
}

impl SyncProgress {
    /// A replica that starts syncing from `source` at `now`: by full snapshot, or with
    /// `suffix` by the records after its last one.
    pub fn new(source: NodeId, suffix: Option<SuffixPlan>, now: Duration) -> SyncProgress {
        SyncProgress {
            source,
            started: false,
            done: false,
            buffered: Vec::new(),
            buffered_bytes: 0,
            buffer_bytes_max: SYNC_BUFFER_BYTES_MAX,
            overflowed: false,
            stream: 0,
            next_batch: 0,
            progress_at: None,
            suffix,
            refused: false,
            receiving_suffix: false,
            records: 0,
            bytes: 0,
            outcomes: Vec::new(),
            heard_at: now,
        }
    }

    /// Buffers at most `bytes` of live updates (`SYNC_BUFFER_BYTES_MAX` by default).
    pub fn with_buffer_bytes_max(mut self, bytes: usize) -> SyncProgress {
        self.buffer_bytes_max = bytes;
        self
    }

    pub fn suffix_plan(&self) -> Option<&SuffixPlan> {
        self.suffix.as_ref()
    }

    /// Whether the source refused the suffix (the replica waits to be replaced).
    pub fn refused(&self) -> bool {
        self.refused
    }

    /// Gives up the current stream; the replica asks for a new one (`tick`). A full
    /// snapshot's new `SnapshotBegin` empties what this one wrote; a suffix is asked for
    /// again with the same plan, and the new suffix (every key's latest record above
    /// `have_seq` as of a later cut) supersedes whatever part of the old one was written.
    /// Live updates stay buffered.
    pub fn abandon(&mut self) {
        self.started = false;
        self.receiving_suffix = false;
        self.stream = 0;
        self.next_batch = 0;
        self.progress_at = None;
        self.outcomes.clear();
    }

    /// Request outcomes from `from`: kept if they belong to the stream in progress, else
    /// handed back (for the machine: those of a resend).
    pub fn copy_outcomes(&mut self, from: NodeId, entries: Vec<OutcomeEntry>) -> Option<Vec<OutcomeEntry>> {
        if from != self.source || !self.started || self.done {
            return Some(entries);
        }
        self.outcomes.extend(entries);
        None
    }

    /// Something of this range arrived from `from` at `now`.
    pub fn heard(&mut self, from: NodeId, now: Duration) {
        if from == self.source {
            self.heard_at = now;
        }
    }

    /// Still waiting for its copy: the source and when it was last heard from. `None` once
    /// the copy is complete or refused.
    pub fn waiting_on(&self) -> Option<(NodeId, Duration)> {
        (!self.done && !self.refused).then_some((self.source, self.heard_at))
    }

    /// Whether a live update (from the predecessor) goes to the buffer rather than the
    /// machine: until the copy is complete.
    pub fn buffers(&self) -> bool {
        !self.done
    }

    /// Keeps a live update until the copy is complete, within the buffer's bytes; past it
    /// this and every later update is left to a resend after the copy. True when this update
    /// is the first one not kept.
    pub fn buffer(&mut self, msg: ChainMsg) -> bool {
        let bytes = match &msg {
            ChainMsg::Replicate { key, effect, .. } => key.len() + effect_bytes(effect),
            _ => 0,
        } + SYNC_BUFFER_UPDATE_OVERHEAD_BYTES;
        if self.overflowed || self.buffered_bytes + bytes > self.buffer_bytes_max {
            let first = !self.overflowed;
            self.overflowed = true;
            return first;
        }
        self.buffered_bytes += bytes;
        self.buffered.push(msg);
        false
    }

    /// Updates buffered and their bytes.
    pub fn buffered(&self) -> (usize, usize) {
        (self.buffered.len(), self.buffered_bytes)
    }

    /// A `SnapshotBegin` of stream `snapshot` from `from`: true when it is taken. The caller
    /// then empties what earlier streams wrote and calls [`Self::take_snapshot`]. A newer
    /// stream replaces the one in progress (abandoned here): the source runs only the latest
    /// one it was asked for. Returns the replaced stream too, for the log.
    pub fn snapshot_begins(&mut self, from: NodeId, snapshot: u64) -> (bool, Option<u64>) {
        if from != self.source || self.done {
            return (false, None);
        }
        // A replica holding old records takes a suffix or nothing: a full snapshot on top of
        // them could keep a record the chain never committed. (It is replaced by a fresh
        // replica, which takes full snapshots, when its suffix is refused.)
        if self.suffix.is_some() || (self.started && self.stream == snapshot) {
            return (false, None);
        }
        let replaced = self.started.then_some(self.stream);
        if self.started {
            self.abandon();
        }
        (true, replaced)
    }

    /// Stream `snapshot` is taken, the store emptied of earlier streams' records.
    pub fn take_snapshot(&mut self, snapshot: u64, now: Duration) {
        self.started = true;
        self.stream = snapshot;
        self.next_batch = 0;
        self.progress_at = Some(now);
    }

    /// The source agreed to a suffix after `after_seq`, streamed as `snapshot`. Taken when no
    /// stream is in progress and it is the suffix this replica asked for. True when taken.
    pub fn suffix_begins(&mut self, from: NodeId, snapshot: u64, after_seq: u64, now: Duration) -> bool {
        let asked = self.suffix.as_ref().is_some_and(|p| p.have_seq == after_seq);
        if from != self.source || self.started || self.done || self.refused || !asked {
            return false;
        }
        self.take_snapshot(snapshot, now);
        self.receiving_suffix = true;
        true
    }

    /// Stops taking stream `snapshot` (if it is the one in progress): its later messages are
    /// ignored and the replica asks its source again, as after a gap.
    pub fn drop_stream(&mut self, snapshot: u64) {
        if self.started && !self.done && self.stream == snapshot {
            self.abandon();
        }
    }

    /// The source refused the suffix. True when this replica was waiting for one from `from`:
    /// the caller then replaces it by a fresh replica, which asks for a full snapshot.
    pub fn suffix_refused(&mut self, from: NodeId) -> bool {
        let waiting = from == self.source && !self.started && self.suffix.is_some();
        if waiting {
            self.refused = true;
        }
        waiting
    }

    fn taken(&self, from: NodeId, snapshot: u64) -> bool {
        from == self.source && self.started && !self.done && self.stream == snapshot
    }

    /// A `SnapshotBatch` of stream `snapshot`, numbered `index`.
    pub fn batch(&mut self, from: NodeId, snapshot: u64, index: u64) -> BatchVerdict {
        if !self.taken(from, snapshot) {
            return BatchVerdict::Ignore;
        }
        if index != self.next_batch {
            let expected = self.next_batch;
            self.abandon();
            return BatchVerdict::Gap { expected };
        }
        BatchVerdict::Write
    }

    /// The batch said `Write` was written: `records` records of `bytes` key + value bytes.
    pub fn batch_written(&mut self, records: u64, bytes: u64, now: Duration) {
        self.records += records;
        self.bytes += bytes;
        self.next_batch += 1;
        self.progress_at = Some(now);
    }

    /// The batch could not be written: the stream is abandoned (asked for again).
    pub fn write_failed(&mut self) {
        self.abandon();
    }

    /// The `SnapshotEnd` of stream `snapshot`, which sent `batches` batches.
    pub fn end(&mut self, from: NodeId, snapshot: u64, batches: u64) -> EndVerdict {
        if !self.taken(from, snapshot) {
            return EndVerdict::Ignore;
        }
        if batches != self.next_batch {
            let got = self.next_batch;
            self.abandon();
            return EndVerdict::Incomplete { got };
        }
        self.done = true;
        let report = SyncReport { suffix: self.receiving_suffix, records: self.records, bytes: self.bytes };
        self.buffered_bytes = 0;
        EndVerdict::Complete {
            outcomes: std::mem::take(&mut self.outcomes),
            buffered: std::mem::take(&mut self.buffered),
            overflowed: std::mem::take(&mut self.overflowed),
            report,
        }
    }

    /// Playing the buffered updates forward failed to append (a full disk): the replica is
    /// not in sync, and asks for a new copy (`tick`) instead of reporting one it does not hold.
    pub fn replay_failed(&mut self) {
        self.done = false;
        self.abandon();
    }

    /// Periodic retries at `now`: a stream silent for `SNAPSHOT_SILENCE_MAX` is abandoned
    /// (true in the first place), and the request to send the predecessor, if any (a stream
    /// not started or abandoned, unless refused).
    pub fn tick(
        &mut self,
        now: Duration,
        silence_max: Duration,
        epoch: Epoch,
        range: Range,
    ) -> (bool, Option<ChainMsg>) {
        let silent = self.started
            && !self.done
            && self.progress_at.is_some_and(|t| now.saturating_sub(t) >= silence_max);
        if silent {
            self.abandon();
        }
        if self.started || self.refused || self.done {
            return (silent, None);
        }
        let msg = match &self.suffix {
            Some(p) => ChainMsg::SuffixSyncRequest { epoch, range, have_seq: p.have_seq, top: p.top.clone() },
            None => ChainMsg::SyncRequest { epoch, range },
        };
        (silent, Some(msg))
    }

    /// The stream in progress, if any.
    pub fn stream(&self) -> Option<u64> {
        self.started.then_some(self.stream)
    }
}

/// Whether playing a finished copy's buffered updates forward failed to append (a full
/// disk): then the replica is not in sync and asks for a new copy (`SyncProgress::replay_failed`)
/// instead of reporting one it does not hold, as the machine takes a copy's end or a
/// `CaughtUp` only once it holds what they name.
pub fn replay_failed<S: ReplicaStore>(machine: &Replica<S>) -> bool {
    machine.append_failed() && !faulty(machine.fault(), Fault::IncompleteCopyAccepted)
}

/// The drop floor a finished copy takes: its source's (`SnapshotEnd::dropped_seq_max`). The
/// copy lacks every record the source's compaction or merge dropped up to it (a delete, an
/// expired put), so, as a source itself later, it must refuse a suffix below it as its source
/// would (`judge_suffix`): a rejoiner still holding an older put of such a key would keep it.
pub fn copy_drop_floor<S: ReplicaStore>(machine: &Replica<S>, dropped_seq_max: u64) -> u64 {
    if faulty(machine.fault(), Fault::CopyWithoutDropFloor) {
        return 0;
    }
    dropped_seq_max
}

/// The events that play a finished copy's buffered updates forward through the machine, in
/// order: those above the copy's cut `upto_seq` (the copy holds the rest), from `pred`.
pub fn replay(pred: NodeId, buffered: Vec<ChainMsg>, upto_seq: u64) -> impl Iterator<Item = Event> {
    buffered
        .into_iter()
        .filter(move |msg| matches!(msg, ChainMsg::Replicate { seq, .. } if *seq > upto_seq))
        .map(move |msg| Event::Chain { from: pred, msg })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::store::Append;

    fn put(v: &str) -> ReplEffect {
        ReplEffect::Put { value: v.as_bytes().to_vec(), flags: 0, expiry: 0, state: 0 }
    }

    fn store(records: &[(&str, Option<&str>, u64)]) -> MemStore {
        let mut s = MemStore::default();
        for (key, value, seq) in records {
            let effect = value.map_or(ReplEffect::Delete, put);
            s.append(&Append::bare(key.as_bytes(), &effect, *seq)).expect("append");
        }
        s
    }

    /// Every message of `stream`, in order.
    fn drain<I: Iterator<Item = Result<StoredUpdate, StoreError>>>(mut stream: Stream<I>) -> Vec<ChainMsg> {
        std::iter::from_fn(|| stream.next_msg().expect("read").map(|(m, _)| m)).collect()
    }

    fn seqs(msgs: &[ChainMsg]) -> Vec<u64> {
        let records = msgs.iter().filter_map(|m| match m {
            ChainMsg::SnapshotBatch { records, .. } => Some(records.iter().map(|r| r.seq)),
            _ => None,
        });
        records.flatten().collect()
    }

    #[test]
    fn a_suffix_sends_each_keys_latest_record_above_its_start_then_the_end() {
        let s = store(&[("a", Some("1"), 5), ("b", Some("2"), 7), ("a", Some("3"), 9), ("b", None, 11)]);
        let selection = Selection::read(5, s.cut()).expect("read");
        let mut stream = Stream::new(Range::full(), 1, 42, CopyCut::take(&s, 11), None, Vec::new(), 1);
        stream.select(selection);
        let msgs = drain(stream);
        assert_eq!(seqs(&msgs), vec![9, 11], "superseded and old records are left out");
        let (range, snapshot) = (Range::full(), 42);
        let end =
            ChainMsg::SnapshotEnd { epoch: 1, range, snapshot, batches: 2, upto_seq: 11, dropped_seq_max: 0 };
        assert_eq!(msgs.last(), Some(&end), "one record per batch at 1 byte a batch");
        let all = drain(Stream::new(Range::full(), 1, 42, CopyCut::take(&s, 11), None, Vec::new(), 1 << 20));
        assert_eq!(seqs(&all), vec![5, 7, 9, 11], "a snapshot sends the whole log, in one batch");
    }

    #[test]
    fn a_copy_ends_with_its_sources_drop_floor() {
        let mut s = store(&[("a", Some("1"), 5), ("b", Some("2"), 7), ("b", None, 9), ("c", Some("3"), 10)]);
        s.compact(10, 9);
        let msgs = drain(Stream::new(Range::full(), 1, 42, CopyCut::take(&s, 10), None, Vec::new(), 1 << 20));
        assert_eq!(seqs(&msgs), vec![5, 10], "the delete of b is gone, and so is its put");
        let end = msgs.last().expect("an end");
        assert!(
            matches!(end, ChainMsg::SnapshotEnd { upto_seq: 10, dropped_seq_max: 9, .. }),
            "the copy lacks b's delete as its source does, so it must refuse suffixes below 9: {end:?}"
        );
    }

    #[test]
    fn a_suffix_is_refused_past_a_dropped_delete_and_granted_on_the_current_record() {
        let mut s = store(&[("a", Some("1"), 5), ("b", Some("2"), 7), ("b", None, 9), ("c", Some("3"), 10)]);
        let top = mark_of(&s.latest_record(b"a").expect("a"));
        let range = Range::full();
        assert_eq!(judge_suffix(&s, &range, 5, &top, None), SuffixVerdict::Grant);
        s.compact(10, 9);
        assert_eq!(s.dropped_seq_max(), 9);
        assert!(s.latest_record(b"b").is_none(), "the delete is gone");
        assert!(matches!(judge_suffix(&s, &range, 5, &top, None), SuffixVerdict::Refuse(_)));
        let plan = suffix_plan(s.max_seq(), s.cut()).expect("plan").expect("some");
        assert_eq!(plan.have_seq, 10);
        assert_eq!(judge_suffix(&s, &range, 10, &plan.top, None), SuffixVerdict::Grant, "at the floor");
        let mut deleted = plan.top.clone();
        deleted.delete = true;
        assert_eq!(judge_suffix(&s, &range, 10, &deleted, None), SuffixVerdict::ScanLog);
        assert!(!log_holds(s.cut(), &deleted).expect("scan"));
    }

    #[test]
    fn a_whole_replica_rejoins_by_suffix_its_range_or_a_part_never_a_merge() {
        use fawn_ring::KeyId;
        let (low, high) = (Range::new(KeyId(100), KeyId(200)), Range::new(KeyId(200), KeyId(300)));
        let merged = Range::new(KeyId(100), KeyId(300));
        assert!(suffix_covers(&high, &high));
        assert!(suffix_covers(&merged, &high), "a part split from it");
        assert!(suffix_covers(&merged, &low));
        // The merged range's directory is named by its end, as `high`'s: held alone, `high`
        // has none of `low`'s records below its highest seq.
        assert!(!suffix_covers(&high, &merged));
        assert!(!suffix_covers(&low, &merged));
        assert!(suffix_covers(&Range::full(), &merged));
    }

    fn replicate(seq: u64) -> ChainMsg {
        let effect = put("v");
        ChainMsg::Replicate {
            epoch: 1,
            range: Range::full(),
            seq,
            prev_seq: seq - 1,
            key: b"k".to_vec(),
            effect,
            origin: None,
        }
    }

    #[test]
    fn a_sink_takes_the_newest_stream_only_and_checks_its_end() {
        let t = Duration::ZERO;
        let mut sink = SyncProgress::new(1, None, t);
        assert_eq!(sink.snapshot_begins(1, 10), (true, None));
        sink.take_snapshot(10, t);
        assert_eq!(sink.batch(1, 10, 0), BatchVerdict::Write);
        sink.batch_written(3, 30, t);
        sink.buffer(replicate(20));
        // A newer stream replaces it; the older one's messages are ignored from then on.
        assert_eq!(sink.snapshot_begins(1, 11), (true, Some(10)));
        sink.take_snapshot(11, t);
        assert_eq!(sink.batch(1, 10, 1), BatchVerdict::Ignore);
        assert_eq!(sink.end(1, 10, 2), EndVerdict::Ignore);
        assert_eq!(sink.batch(2, 11, 0), BatchVerdict::Ignore, "not from the source");
        assert_eq!(sink.batch(1, 11, 0), BatchVerdict::Write);
        sink.batch_written(1, 10, t);
        // An end that names more batches than arrived abandons the stream.
        assert_eq!(sink.end(1, 11, 2), EndVerdict::Incomplete { got: 1 });
        assert!(!sink.started);
        let (_, ask) = sink.tick(t, SNAPSHOT_SILENCE_MAX, 1, Range::full());
        assert!(matches!(ask, Some(ChainMsg::SyncRequest { .. })));
        assert_eq!(sink.snapshot_begins(1, 12), (true, None));
        sink.take_snapshot(12, t);
        sink.buffer(replicate(21));
        match sink.end(1, 12, 0) {
            EndVerdict::Complete { buffered, overflowed: false, outcomes, .. } => {
                assert!(outcomes.is_empty());
                let replayed: Vec<Event> = replay(1, buffered, 20).collect();
                assert_eq!(replayed.len(), 1, "the copy holds what its cut held");
            }
            other => panic!("{other:?}"),
        }
        assert!(sink.done && !sink.buffers());
    }

    #[test]
    fn a_silent_stream_is_abandoned_and_a_suffix_sink_takes_only_its_suffix() {
        let top = RecordMark { key: b"a".to_vec(), seq: 5, delete: false, value_crc: 0, flags: 0, expiry: 0 };
        let plan = SuffixPlan { have_seq: 5, top };
        let mut sink = SyncProgress::new(1, Some(plan), Duration::ZERO);
        assert_eq!(sink.snapshot_begins(1, 10), (false, None), "a full snapshot over old records");
        assert!(!sink.suffix_begins(1, 10, 4, Duration::ZERO), "not the suffix asked for");
        assert!(sink.suffix_begins(1, 10, 5, Duration::ZERO));
        let (silent, ask) = sink.tick(SNAPSHOT_SILENCE_MAX, SNAPSHOT_SILENCE_MAX, 1, Range::full());
        assert!(silent);
        assert!(matches!(ask, Some(ChainMsg::SuffixSyncRequest { have_seq: 5, .. })));
        assert!(sink.suffix_refused(1));
        assert!(sink.refused() && sink.waiting_on().is_none());
    }
}
