//! The receiving end of a sync: a syncing replica takes a snapshot (or, rejoining with its old
//! datastore, a suffix) from the last in-sync replica, buffering the live updates meanwhile,
//! and plays them forward through the machine once the copy is complete.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fawn_ds::{BatchOp, Meta, RecordKind};
use fawn_proto::native::{ChainMsg, RecordMark, ReplEffect, SnapshotItem, WireError};
use fawn_ring::NodeId;
use tracing::{info, warn};

use super::source::effect_bytes;
use super::{blocking, queue, storage, warn_full, LinkTo, RangeReplica, WriteState};
use crate::replica::machine::Event;

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
/// Tombstones per datastore write when a syncing replica empties an abandoned copy.
const EMPTY_BATCH_OPS: usize = 4096;

/// Progress of a syncing replica.
#[derive(Debug, Default)]
pub struct SyncProgress {
    pub source: NodeId,
    pub started: bool,
    pub done: bool,
    buffered: Vec<ChainMsg>,
    /// What `buffered` costs (`SYNC_BUFFER_BYTES_MAX`).
    buffered_bytes: usize,
    /// Updates arrived past the budget and were not kept: a resend follows the copy.
    overflowed: bool,
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

impl SyncProgress {
    pub(super) fn new(source: NodeId, suffix: Option<SuffixPlan>) -> SyncProgress {
        SyncProgress { source, suffix, heard_at: Some(Instant::now()), ..SyncProgress::default() }
    }

    /// Keeps a live update until the copy is complete, within `SYNC_BUFFER_BYTES_MAX`; past
    /// it this and every later update is left to a resend after the copy.
    pub(super) fn buffer(&mut self, msg: ChainMsg, range: &fawn_ring::Range) {
        let bytes = match &msg {
            ChainMsg::Replicate { key, effect, .. } => key.len() + effect_bytes(effect),
            _ => 0,
        } + SYNC_BUFFER_UPDATE_OVERHEAD_BYTES;
        if self.overflowed || self.buffered_bytes + bytes > SYNC_BUFFER_BYTES_MAX {
            if !self.overflowed {
                warn!(range = %range.id_string(), buffered = self.buffered.len(), bytes = self.buffered_bytes,
                    "sync buffer full: later updates are asked for again once the copy is complete");
            }
            self.overflowed = true;
            return;
        }
        self.buffered_bytes += bytes;
        self.buffered.push(msg);
    }
}

impl WriteState {
    /// Something arrived from `from`: if it is the sync source, the link from it works.
    pub(super) fn heard(&mut self, from: NodeId) {
        if let Some(sync) = self.sync.as_mut().filter(|s| s.source == from) {
            sync.heard_at = Some(Instant::now());
        }
    }
}

/// Requests a replica wants its back-end to make (they involve the manager or timers).
#[derive(Debug, Default)]
pub struct Followups {
    /// Tell the manager this syncing replica caught up.
    pub sync_done: bool,
    /// How the copy was made (set with `sync_done`).
    pub report: Option<SyncReport>,
}

impl RangeReplica {
    /// Sync progress, if syncing: (source, started, done).
    pub async fn sync_status(&self) -> Option<(NodeId, bool, bool)> {
        self.state.lock().await.sync.as_ref().map(|s| (s.source, s.started, s.done))
    }

    /// The end of a sync, on the new tail's side: whether to report `TailReady` now
    /// (`Replica::reports_tail_ready`).
    pub async fn reports_tail_ready(&self) -> bool {
        self.state.lock().await.machine.reports_tail_ready()
    }

    /// A syncing replica still waiting for its copy: its source and when it last heard from
    /// it. `None` once the copy is complete (nothing more is needed from the source before
    /// the promotion) or refused, or when not syncing.
    pub async fn sync_heard(&self) -> Option<(NodeId, Instant)> {
        let st = self.state.lock().await;
        let sync = st.sync.as_ref().filter(|s| !s.done && !s.refused)?;
        Some((sync.source, sync.heard_at?))
    }

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
                ReplEffect::Put { value, flags, expiry, state } => BatchOp::put(
                    &r.key,
                    value,
                    Meta { seq: r.seq, flags: *flags, expiry: *expiry, state: *state },
                ),
                ReplEffect::Delete => BatchOp::delete(&r.key, Meta { seq: r.seq, ..Meta::default() }),
            })
            .collect();
        if let Err(e) = blocking(self.writes_block, || self.store.write_batch(&ops)) {
            self.note_write_error(&e);
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
        let buffered = std::mem::take(&mut sync.buffered);
        let overflowed = std::mem::take(&mut sync.overflowed);
        sync.buffered_bytes = 0;
        let replayed = buffered.len();
        if let Some(pred) = st.machine.route().predecessor() {
            for msg in buffered {
                if matches!(msg, ChainMsg::Replicate { seq, .. } if seq > upto_seq) {
                    let actions = st.machine.step(Event::Chain { from: pred, msg });
                    self.execute(&mut st, actions, links, &[]);
                }
            }
            // As the machine takes a copy's end or a `CaughtUp` only once it holds what they
            // name: a replica that failed to append what it was sent (a full disk) is not in
            // sync. It asks for a new copy (`tick`) instead of reporting one it does not hold.
            if st.machine.append_failed() {
                warn!(range = %self.range.id_string(), snapshot, upto_seq, held = self.store.max_seq(),
                    "replaying the updates buffered during the copy failed; asking for a new copy");
                if let Some(sync) = st.sync.as_mut() {
                    sync.done = false;
                    sync.abandon();
                }
                return Ok(Followups::default());
            }
            if overflowed {
                // What did not fit the buffer: everything after the last update held.
                let (epoch, range) = (st.machine.route().epoch, self.range);
                let after_seq = self.store.max_seq();
                info!(range = %range.id_string(), after_seq, "asking for the updates the sync buffer did not keep");
                if !queue(links, pred, ChainMsg::Resend { epoch, range, after_seq }) {
                    warn_full(range, pred);
                }
            }
        }
        let mode = if report.suffix { "suffix" } else { "full" };
        info!(range = %self.range.id_string(), mode, records = report.records, bytes = report.bytes,
            upto_seq, replayed, "sync complete");
        Ok(Followups { sync_done: true, report: Some(report) })
    }

    /// A syncing replica's retries: a stream silent for long is abandoned, and one not
    /// started (or abandoned) is asked for again.
    pub(super) fn tick_sync(&self, st: &mut WriteState, links: &dyn LinkTo) {
        let (epoch, pred) = (st.machine.route().epoch, st.machine.route().predecessor());
        if let Some(sync) = st.sync.as_mut().filter(|s| {
            s.started && !s.done && s.progress_at.is_some_and(|t| t.elapsed() >= SNAPSHOT_SILENCE_MAX)
        }) {
            warn!(range = %self.range.id_string(), snapshot = sync.stream, "snapshot stream silent; asking for a new one");
            sync.abandon();
        }
        if let (Some(sync), Some(pred)) = (&st.sync, pred) {
            if !sync.started && !sync.refused {
                let range = self.range;
                let msg = match &sync.suffix {
                    Some(p) => {
                        ChainMsg::SuffixSyncRequest { epoch, range, have_seq: p.have_seq, top: p.top.clone() }
                    }
                    None => ChainMsg::SyncRequest { epoch, range },
                };
                queue(links, pred, msg);
            }
        }
    }

    /// Shadows every live key of this (syncing) replica's store with a tombstone of the same
    /// sequence number. A snapshot abandoned part-way leaves records the next snapshot need
    /// not overwrite: a key deleted since, whose tombstone compaction then dropped at the
    /// source, would come back. Cheap on an empty store (a fresh sync).
    pub(super) fn empty_store(&self) -> Result<(), WireError> {
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
            blocking(self.writes_block, || self.store.write_batch(chunk))
                .inspect_err(|e| self.note_write_error(e))
                .map_err(storage)?;
        }
        Ok(())
    }
}
