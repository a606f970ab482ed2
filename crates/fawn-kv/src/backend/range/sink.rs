//! The receiving end of a sync: a syncing replica takes a snapshot (or, rejoining with its old
//! datastore, a suffix) from the last in-sync replica, buffering the live updates meanwhile,
//! and plays them forward through the machine once the copy is complete.

use std::collections::HashMap;
use std::time::Instant;

use fawn_ds::{BatchOp, Meta, RecordKind};
use fawn_proto::native::{ChainMsg, ReplEffect, SnapshotItem, WireError};
use fawn_ring::NodeId;
use tracing::{info, warn};

use super::{blocking, queue, storage, warn_full, LinkTo, RangeReplica, WriteState};
use crate::replica::sync::{
    copy_drop_floor, effect_bytes, replay, replay_failed, BatchVerdict, CopyEnd, EndVerdict,
    SNAPSHOT_SILENCE_MAX,
};
pub use crate::replica::sync::{SuffixPlan, SyncReport};

/// Tombstones per datastore write when a syncing replica empties an abandoned copy.
const EMPTY_BATCH_OPS: usize = 4096;

impl WriteState {
    /// Something arrived from `from`: if it is the sync source, the link from it works.
    pub(super) fn heard(&mut self, from: NodeId) {
        let now = self.origin.elapsed();
        if let Some(sync) = self.sync.as_mut() {
            sync.heard(from, now);
        }
    }

    /// Time for the sync code: since this replica was built.
    fn now(&self) -> std::time::Duration {
        self.origin.elapsed()
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
        let (source, heard) = st.sync.as_ref()?.waiting_on()?;
        Some((source, st.origin + heard))
    }

    /// Live updates from the predecessor while the copy is incomplete go to the sync buffer
    /// (true when taken there).
    pub(super) fn buffer_if_syncing(&self, st: &mut WriteState, msgs: &mut Vec<ChainMsg>) -> bool {
        let Some(sync) = st.sync.as_mut().filter(|s| s.buffers()) else { return false };
        for msg in msgs.drain(..) {
            if sync.buffer(msg) {
                let (updates, bytes) = sync.buffered();
                warn!(range = %self.range.id_string(), buffered = updates, bytes,
                    "sync buffer full: later updates are asked for again once the copy is complete");
            }
        }
        true
    }

    /// A snapshot stream begins: taken if newer than the one in progress (see
    /// `SyncProgress::snapshot_begins`), emptying what an earlier stream may have written.
    pub async fn on_snapshot_begin(&self, from: NodeId, snapshot: u64) -> Result<(), WireError> {
        let mut st = self.state.lock().await;
        st.heard(from);
        let now = st.now();
        let Some(sync) = st.sync.as_mut() else { return Ok(()) };
        let (taken, replaced) = sync.snapshot_begins(from, snapshot);
        if let Some(old) = replaced {
            info!(range = %self.range.id_string(), old, new = snapshot,
                "a newer snapshot stream replaces the one in progress");
        }
        if !taken {
            return Ok(());
        }
        self.empty_store()?;
        sync.take_snapshot(snapshot, now);
        Ok(())
    }

    /// The source agreed to a suffix after `after_seq`, streamed as `snapshot`. Taken when no
    /// stream is in progress (a suffix stream abandoned after a gap or silence is asked for
    /// again with the same plan: see `SyncProgress::abandon`).
    /// True when the stream is taken.
    pub async fn on_suffix_begin(&self, from: NodeId, snapshot: u64, after_seq: u64) -> bool {
        let mut st = self.state.lock().await;
        st.heard(from);
        let now = st.now();
        st.sync.as_mut().is_some_and(|sync| sync.suffix_begins(from, snapshot, after_seq, now))
    }

    /// Stops taking stream `snapshot` (if it is the one in progress): its later messages are
    /// ignored and the replica asks its source again, as after a gap.
    pub async fn drop_stream(&self, snapshot: u64) {
        if let Some(sync) = self.state.lock().await.sync.as_mut() {
            sync.drop_stream(snapshot);
        }
    }

    /// The source refused the suffix. True when this replica was waiting for one from `from`:
    /// the back-end then replaces it by a fresh replica, which asks for a full snapshot.
    pub async fn on_suffix_refused(&self, from: NodeId) -> bool {
        let mut st = self.state.lock().await;
        st.heard(from);
        st.sync.as_mut().is_some_and(|sync| sync.suffix_refused(from))
    }

    /// Whether this replica was refused a suffix and waits to be replaced.
    pub async fn suffix_refused(&self) -> bool {
        self.state.lock().await.sync.as_ref().is_some_and(|s| s.refused())
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
        let now = st.now();
        let Some(sync) = st.sync.as_mut() else { return Ok(()) };
        match sync.batch(from, snapshot, index) {
            BatchVerdict::Ignore => return Ok(()),
            BatchVerdict::Gap { expected } => {
                warn!(range = %self.range.id_string(), snapshot, expected, got = index,
                    "snapshot batch missing; asking for a new snapshot");
                return Ok(());
            }
            BatchVerdict::Write => {}
        }
        let bytes = records.iter().map(|r| (r.key.len() + effect_bytes(&r.effect)) as u64).sum::<u64>();
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
            sync.write_failed();
            return Err(storage(e));
        }
        sync.batch_written(records.len() as u64, bytes, now);
        Ok(())
    }

    /// The snapshot is complete: take the source's drop floor, play the buffered updates
    /// forward.
    pub async fn on_snapshot_end(
        &self,
        from: NodeId,
        end: CopyEnd,
        links: &dyn LinkTo,
    ) -> Result<Followups, WireError> {
        let CopyEnd { snapshot, batches, upto_seq, dropped_seq_max } = end;
        let mut st = self.state.lock().await;
        st.heard(from);
        let Some(sync) = st.sync.as_mut() else { return Ok(Followups::default()) };
        let (outcomes, buffered, overflowed, report) = match sync.end(from, snapshot, batches) {
            EndVerdict::Ignore => return Ok(Followups::default()),
            EndVerdict::Incomplete { got } => {
                warn!(range = %self.range.id_string(), snapshot, sent = batches, got,
                    "snapshot incomplete; asking for a new snapshot");
                return Ok(Followups::default());
            }
            EndVerdict::Complete { outcomes, buffered, overflowed, report } => {
                (outcomes, buffered, overflowed, report)
            }
        };
        let floor = copy_drop_floor(&st.machine, dropped_seq_max);
        if let Err(e) = blocking(self.writes_block, || self.store.raise_dropped_seq_max(floor)) {
            self.note_write_error(&e);
            warn!(range = %self.range.id_string(), snapshot, floor, error = %e,
                "storing the copy's drop floor failed; asking for a new copy");
            if let Some(sync) = st.sync.as_mut() {
                sync.replay_failed();
            }
            return Err(storage(e));
        }
        st.machine.copied(upto_seq, outcomes);
        let replayed = buffered.len();
        if let Some(pred) = st.machine.route().predecessor() {
            for event in replay(pred, buffered, upto_seq) {
                let actions = st.machine.step(event);
                self.execute(&mut st, actions, links, &[]);
            }
            if replay_failed(&st.machine) {
                warn!(range = %self.range.id_string(), snapshot, upto_seq, held = self.store.max_seq(),
                    "replaying the updates buffered during the copy failed; asking for a new copy");
                if let Some(sync) = st.sync.as_mut() {
                    sync.replay_failed();
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
        let now = st.now();
        let Some(sync) = st.sync.as_mut() else { return };
        let stream = sync.stream();
        let (silent, request) = sync.tick(now, SNAPSHOT_SILENCE_MAX, epoch, self.range);
        if silent {
            warn!(range = %self.range.id_string(), snapshot = ?stream, "snapshot stream silent; asking for a new one");
        }
        if let (Some(msg), Some(pred)) = (request, pred) {
            queue(links, pred, msg);
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
