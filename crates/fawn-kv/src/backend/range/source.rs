//! The sending end of a sync: the last in-sync replica streams a snapshot of the range (or a
//! suffix of it, for a replica rejoining with its old datastore) to a syncing successor, from
//! a cut taken under the range's lock, followed by the request outcomes of the updates it
//! copied (`ChainMsg::Outcomes`), then `SnapshotEnd`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_ds::DataStore;
use fawn_proto::native::{ChainMsg, RecordMark};
use fawn_ring::NodeId;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{blocking, queue, LinkTo, RangeReplica, SuffixPlan};
use crate::replica::store::StoreError;
use crate::replica::sync::{
    judge_suffix, log_holds, serves_sync, CopyCut, Selection, Stream, SuffixVerdict, SyncStore, NOT_IN_LOG,
};

/// The records of a cut of the range's datastore.
type Cut = <Arc<DataStore> as SyncStore>::Cut;

impl RangeReplica {
    /// The last in-sync replica starts a snapshot for its syncing successor. The cut is taken
    /// under the state lock: records up to it go in the snapshot, later ones are forwarded.
    /// The stream is paced to `copy_bytes_per_s` (key + value bytes; 0 = unlimited). It stops
    /// when a newer request replaces it (the receiver takes the newest `SnapshotBegin`) or the
    /// replica is dropped.
    pub async fn on_sync_request(self: &Arc<Self>, from: NodeId, links: &dyn LinkTo, copy_bytes_per_s: u64) {
        let st = self.state.lock().await;
        if !serves_sync(st.machine.route(), from) {
            return;
        }
        let epoch = st.machine.route().epoch;
        let snapshot = snapshot_id();
        // A full link: no stream starts; the syncing replica asks again.
        if !queue(links, from, ChainMsg::SnapshotBegin { epoch, range: self.range, snapshot }) {
            return;
        }
        let upto_seq = st.machine.copy_cut_seq();
        let cut = CopyCut::take(&self.store, upto_seq);
        let link = links.link(from);
        let outcomes = st.machine.outcomes_after(0, upto_seq);
        let stream = Stream::new(self.range, epoch, snapshot, cut, None, outcomes, SNAPSHOT_BATCH_BYTES);
        let current = StreamId::start(self, snapshot);
        drop(st);
        info!(range = %self.range.id_string(), to = from, upto_seq, snapshot, "streaming snapshot");
        tokio::spawn(stream_records(link, stream, None, copy_bytes_per_s, current));
    }

    /// A rejoining successor asks for the records after its last one (`have_seq`, record
    /// `top`). Streamed, from a cut taken under the state lock as for a snapshot, only when
    /// `replica::sync::judge_suffix` finds nothing against it; else refused.
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
        if !serves_sync(st.machine.route(), from) {
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
        let verdict = judge_suffix(&self.store, &range, have_seq, top, st.machine.fault());
        if let SuffixVerdict::Refuse(reason) = verdict {
            queue(links, from, refuse(reason));
            return;
        }
        let upto_seq = st.machine.copy_cut_seq();
        let cut = CopyCut::take(&self.store, upto_seq);
        let latest = self.store.cut();
        // Every remembered outcome, not only the suffix's: the rejoiner kept its records but,
        // as a new process, lost their outcomes, and may head the chain later.
        let outcomes = st.machine.outcomes_after(0, upto_seq);
        let snapshot = snapshot_id();
        let stream = Stream::new(range, epoch, snapshot, cut, None, outcomes, SNAPSHOT_BATCH_BYTES);
        let suffix = Some((have_seq, latest));
        if verdict == SuffixVerdict::Grant {
            if !queue(links, from, ChainMsg::SuffixBegin { epoch, range, snapshot, after_seq: have_seq }) {
                return;
            }
            let current = StreamId::start(self, snapshot);
            drop(st);
            info!(range = %range.id_string(), to = from, after_seq = have_seq, upto_seq, snapshot, "streaming suffix");
            tokio::spawn(stream_records(link, stream, suffix, copy_bytes_per_s, current));
            return;
        }
        // Not this replica's current version of the key: look for the very record in the
        // log, read from the same cut (no write runs while the state lock is held).
        let scan = self.store.cut();
        let current = StreamId::start(self, snapshot);
        drop(st);
        self.suffix_scan.store(true, Ordering::Release);
        let running = Arc::clone(&self.suffix_scan);
        let top = top.clone();
        tokio::spawn(async move {
            match blocking(true, || log_holds(scan, &top)) {
                Ok(true) => {
                    let begin = ChainMsg::SuffixBegin { epoch, range, snapshot, after_seq: have_seq };
                    let _ = link.send(begin).await;
                    info!(range = %range.id_string(), to = from, after_seq = have_seq, upto_seq, snapshot,
                        "streaming suffix (its last record found in the log)");
                    stream_records(link, stream, suffix, copy_bytes_per_s, current).await;
                }
                Ok(false) => {
                    let _ = link.send(refuse(NOT_IN_LOG.into())).await;
                }
                Err(e) => {
                    let _ = link.send(refuse(format!("reading the log: {e}"))).await;
                }
            }
            // Retries that came meanwhile were ignored: one stream per request.
            running.store(false, Ordering::Release);
        });
    }
}

/// Sends `stream`'s messages on `link`, paced to `copy_bytes_per_s` (key + value bytes; 0 =
/// unlimited), while it is the range's current stream. A suffix (`after`, and a second
/// iterator of the cut) first reads which records it selects.
async fn stream_records(
    link: mpsc::Sender<ChainMsg>,
    mut stream: Stream<Cut>,
    suffix: Option<(u64, Cut)>,
    copy_bytes_per_s: u64,
    current: StreamId,
) {
    let (snapshot, range) = (stream.snapshot(), stream.range().id_string());
    let what = if suffix.is_some() { "suffix" } else { "snapshot" };
    if let Some((after, latest)) = suffix {
        // A read of the whole log: off the async workers, which serve gets meanwhile.
        match blocking(true, move || Selection::read(after, latest)) {
            Ok(selection) => stream.select(selection),
            Err(e) => {
                warn!(range = %range, snapshot, what, error = %e, "read failed; the receiver will ask again");
                return;
            }
        }
    }
    let mut pacer = Pacer::new(copy_bytes_per_s);
    loop {
        let msg = match stream.next_msg() {
            Ok(Some(msg)) => msg,
            Ok(None) => break,
            Err(e) => {
                warn!(range = %range, snapshot, what, error = %e, "read failed; the receiver will ask again");
                return;
            }
        };
        let (msg, bytes) = msg;
        if matches!(msg, ChainMsg::SnapshotBatch { .. }) {
            pacer.pace(bytes).await;
            if !current.is_current() {
                info!(range = %range, what, snapshot, "replaced by a newer stream or no longer needed; stopping it");
                return;
            }
        }
        if link.send(msg).await.is_err() {
            return;
        }
    }
    info!(range = %range, what, snapshot, records = stream.sent, bytes = pacer.sent,
        secs = pacer.started.elapsed().as_secs_f64(), "sent");
}

/// The suffix plan of a datastore kept from before a failure: its highest seq and the record
/// that carries it. `None` (copy the range in full) when that record is gone (compaction
/// dropped it; `max_seq` then exceeds every record), or the store is empty. Scans the whole
/// log (a local sequential read).
pub fn suffix_plan(store: &Arc<DataStore>) -> Result<Option<SuffixPlan>, StoreError> {
    crate::replica::sync::suffix_plan(store.sync_max_seq(), store.cut())
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

/// Whether an outgoing stream is still the one its range wants (the source runs only the
/// latest stream it was asked for, and none for a range it dropped).
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
