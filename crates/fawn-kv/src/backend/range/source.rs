//! The sending end of a sync: the last in-sync replica streams a snapshot of the range (or a
//! suffix of it, for a replica rejoining with its old datastore) to a syncing successor, from
//! a cut taken under the range's lock, followed by the request outcomes of the updates it
//! copied (`ChainMsg::Outcomes`), then `SnapshotEnd`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_ds::{DataStore, Meta, RecordKind};
use fawn_proto::native::{ChainMsg, Epoch, RecordMark, ReplEffect, SnapshotItem};
use fawn_ring::{key_id, NodeId, Range};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{blocking, queue, LinkTo, RangeReplica, SuffixPlan};

impl RangeReplica {
    /// The last in-sync replica starts a snapshot for its syncing successor. The cut is taken
    /// under the state lock: records up to it go in the snapshot, later ones are forwarded.
    /// The stream is paced to `copy_bytes_per_s` (key + value bytes; 0 = unlimited). It stops
    /// when a newer request replaces it (the receiver takes the newest `SnapshotBegin`) or the
    /// replica is dropped.
    pub async fn on_sync_request(self: &Arc<Self>, from: NodeId, links: &dyn LinkTo, copy_bytes_per_s: u64) {
        let st = self.state.lock().await;
        if !(st.machine.route().is_tail()
            && st.machine.route().successor() == Some(from)
            && st.machine.route().rc.syncing.contains(&from))
        {
            return;
        }
        let epoch = st.machine.route().epoch;
        let snapshot = snapshot_id();
        // A full link: no stream starts; the syncing replica asks again.
        if !queue(links, from, ChainMsg::SnapshotBegin { epoch, range: self.range, snapshot }) {
            return;
        }
        let upto_seq = self.store.max_seq();
        let records = self.store.iter();
        let link = links.link(from);
        let outcomes = st.machine.outcomes_after(0, upto_seq);
        let stream = StreamId::start(self, snapshot, outcomes);
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
        if !(st.machine.route().is_tail()
            && st.machine.route().successor() == Some(from)
            && st.machine.route().rc.syncing.contains(&from))
        {
            return;
        }
        if self.suffix_scan.load(Ordering::Acquire) {
            return;
        }
        let epoch = st.machine.route().epoch;
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
        // Every remembered outcome, not only the suffix's: the rejoiner kept its records but,
        // as a new process, lost their outcomes, and may head the chain later.
        let outcomes = st.machine.outcomes_after(0, upto_seq);
        match verdict {
            Ok(true) => {
                let snapshot = snapshot_id();
                if !queue(links, from, ChainMsg::SuffixBegin { epoch, range, snapshot, after_seq: have_seq })
                {
                    return;
                }
                let stream = StreamId::start(self, snapshot, outcomes);
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
                let stream = StreamId::start(self, snapshot_id(), outcomes);
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
    // The request outcomes of the copied updates, which carry none (see `ChainMsg::Outcomes`).
    for msg in stream.outcomes {
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

pub(super) fn effect_bytes(effect: &ReplEffect) -> usize {
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
    /// Sent after the records (`ChainMsg::Outcomes`).
    outcomes: Vec<ChainMsg>,
    replica: std::sync::Weak<RangeReplica>,
}

impl StreamId {
    /// Starts stream `snapshot` (from `snapshot_id`): it replaces whatever stream of this
    /// range was running.
    fn start(replica: &Arc<RangeReplica>, snapshot: u64, outcomes: Vec<ChainMsg>) -> StreamId {
        replica.snapshot_sending.store(snapshot, Ordering::Release);
        StreamId { snapshot, outcomes, replica: Arc::downgrade(replica) }
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
        RecordKind::Put => {
            ReplEffect::Put { value, flags: meta.flags, expiry: meta.expiry, state: meta.state }
        }
        RecordKind::Delete => ReplEffect::Delete,
    }
}
