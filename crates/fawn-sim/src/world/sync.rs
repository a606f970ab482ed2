//! Syncing replicas by real snapshot and suffix streams (`fawn_kv::replica::sync`), as the
//! back-end's shell runs them: the range's tail answers a `SyncRequest` with a snapshot of
//! its store from a cut, or a `SuffixSyncRequest` with the suffix after the rejoiner's last
//! record when `judge_suffix` (and the log scan it may ask for) finds nothing against it;
//! its batches travel one message at a time on the simulated network (delayed, lost with a
//! cut connection or a crash); the syncing replica buffers live updates, takes the newest
//! stream, abandons one with a missing batch or a silent source, checks the end, replays the
//! buffer through its machine and reports `SyncDone`. A suffix refused makes the replica a
//! fresh one, which asks for a full snapshot.

use fawn_kv::replica::machine::Event;
use fawn_kv::replica::route::Route;
use fawn_kv::replica::store::ReplicaStore;
use fawn_kv::replica::sync::{
    copy_drop_floor, finished_copy_outdated, judge_suffix, log_holds, replay, replay_failed, serves_sync,
    suffix_plan, BatchVerdict, CopyCut, CopyEnd, EndVerdict, Selection, Stream, SuffixVerdict, SyncProgress,
    SyncStore, NOT_IN_LOG,
};
use fawn_proto::native::ChainMsg;
use fawn_ring::NodeId;
use rand::Rng;
use std::time::Duration;

use crate::disk::DiskStore;

use super::{Ev, Micros, RangeIx, World, MS};

/// Key + value bytes per snapshot batch: small, so that a copy takes several batches.
const SIM_BATCH_BYTES: usize = 24;
/// Live-update bytes a syncing replica buffers: small, so that long copies overflow it and
/// ask for the rest by a resend after the copy.
const SIM_BUFFER_BYTES_MAX: usize = 2_048;
/// A stream silent this long is abandoned and asked for again.
const SIM_SILENCE_MAX: Duration = Duration::from_millis(400);
/// Time between two messages of an outgoing stream (its pacing).
const STREAM_GAP_MAX: Micros = 3 * MS;

/// The records of a cut of a simulated store.
pub(super) type Cut = <DiskStore as SyncStore>::Cut;

/// A stream a node is sending: its receiver and the stream.
pub(super) struct Outgoing {
    to: NodeId,
    stream: Stream<Cut>,
}

impl World {
    /// Now, as the sync code takes it.
    fn sync_now(&self) -> Duration {
        Duration::from_micros(self.now)
    }

    /// A chain message for `to`'s replica of range `ix`: the sync's messages and the live
    /// updates a syncing replica buffers are handled here, the rest by the machine.
    pub(super) fn deliver_chain(&mut self, to: NodeId, ix: RangeIx, from: NodeId, msg: ChainMsg) {
        let now = self.sync_now();
        let Some(n) = self.nodes.get_mut(&to).filter(|n| n.alive) else { return };
        if let Some(sync) = n.syncs.get_mut(&ix) {
            sync.heard(from, now);
        }
        match msg {
            ChainMsg::SyncRequest { .. } => self.serve_snapshot(to, ix, from),
            ChainMsg::SuffixSyncRequest { have_seq, top, .. } => {
                self.serve_suffix(to, ix, from, have_seq, &top)
            }
            ChainMsg::SnapshotBegin { snapshot, .. } => self.on_snapshot_begin(to, ix, from, snapshot),
            ChainMsg::SuffixBegin { snapshot, after_seq, .. } => {
                let Some(n) = self.nodes.get_mut(&to) else { return };
                if n.syncs.get_mut(&ix).is_some_and(|s| s.suffix_begins(from, snapshot, after_seq, now)) {
                    if let Some(r) = n.replicas.get_mut(&ix) {
                        r.store_mut().set_whole(false);
                    }
                }
            }
            ChainMsg::SuffixRefused { .. } => {
                let refused = self
                    .nodes
                    .get_mut(&to)
                    .and_then(|n| n.syncs.get_mut(&ix))
                    .is_some_and(|s| s.suffix_refused(from));
                if refused {
                    self.restart_sync_fresh(to, ix);
                }
            }
            ChainMsg::SnapshotBatch { snapshot, index, records, .. } => {
                let Some(n) = self.nodes.get_mut(&to) else { return };
                let (Some(sync), Some(r)) = (n.syncs.get_mut(&ix), n.replicas.get_mut(&ix)) else { return };
                if sync.batch(from, snapshot, index) != BatchVerdict::Write {
                    return;
                }
                let bytes: u64 = records
                    .iter()
                    .map(|r| (r.key.len() + fawn_kv::replica::sync::effect_bytes(&r.effect)) as u64)
                    .sum();
                match r.store_mut().write_copied(&records) {
                    Ok(()) => sync.batch_written(records.len() as u64, bytes, now),
                    Err(_) => sync.write_failed(),
                }
            }
            ChainMsg::SnapshotEnd { snapshot, batches, upto_seq, dropped_seq_max, .. } => {
                let end = CopyEnd { snapshot, batches, upto_seq, dropped_seq_max };
                self.on_snapshot_end(to, ix, from, end)
            }
            msg @ ChainMsg::Replicate { .. } => {
                let Some(n) = self.nodes.get_mut(&to) else { return };
                let from_pred = n.replicas.get(&ix).is_some_and(|r| r.route().predecessor() == Some(from));
                let buffering = from_pred && n.syncs.get(&ix).is_some_and(|s| s.buffers());
                match n.syncs.get_mut(&ix).filter(|_| buffering) {
                    Some(sync) => {
                        sync.buffer(msg);
                    }
                    None => self.step(to, ix, Event::Chain { from, msg }),
                }
            }
            ChainMsg::Outcomes { epoch, range, entries } => {
                let Some(n) = self.nodes.get_mut(&to) else { return };
                let entries = match n.syncs.get_mut(&ix) {
                    Some(sync) => sync.copy_outcomes(from, entries),
                    None => Some(entries),
                };
                if let Some(entries) = entries {
                    self.step(
                        to,
                        ix,
                        Event::Chain { from, msg: ChainMsg::Outcomes { epoch, range, entries } },
                    );
                }
            }
            msg => self.step(to, ix, Event::Chain { from, msg }),
        }
    }

    /// The tail starts a snapshot for its syncing successor `to`, replacing any stream of the
    /// range it was sending.
    fn serve_snapshot(&mut self, node: NodeId, ix: RangeIx, to: NodeId) {
        let snapshot = self.next_snapshot();
        let Some(r) = self.nodes.get(&node).and_then(|n| n.replicas.get(&ix)) else { return };
        if !serves_sync(r.route(), to) {
            return;
        }
        let (epoch, range) = (r.route().epoch, r.route().rc.range);
        let upto_seq = r.copy_cut_seq();
        let outcomes = r.outcomes_after(0, upto_seq);
        let cut = CopyCut::take(r.store(), upto_seq);
        let stream = Stream::new(range, epoch, snapshot, cut, None, outcomes, SIM_BATCH_BYTES);
        self.send(node, to, ChainMsg::SnapshotBegin { epoch, range, snapshot });
        self.start_stream(node, ix, to, stream);
    }

    /// The tail judges a suffix request from `to` as the back-end does, and streams the
    /// suffix or refuses it.
    fn serve_suffix(
        &mut self,
        node: NodeId,
        ix: RangeIx,
        to: NodeId,
        have_seq: u64,
        top: &fawn_proto::native::RecordMark,
    ) {
        let snapshot = self.next_snapshot();
        let Some(r) = self.nodes.get(&node).and_then(|n| n.replicas.get(&ix)) else { return };
        if !serves_sync(r.route(), to) {
            return;
        }
        let (epoch, range) = (r.route().epoch, r.route().rc.range);
        let refusal = match judge_suffix(r.store(), &range, have_seq, top, r.fault()) {
            SuffixVerdict::Refuse(reason) => Some(reason),
            SuffixVerdict::Grant => None,
            SuffixVerdict::ScanLog => match log_holds(r.store().cut(), top) {
                Ok(true) => None,
                Ok(false) => Some(NOT_IN_LOG.to_string()),
                Err(e) => Some(format!("reading the log: {e}")),
            },
        };
        if let Some(reason) = refusal {
            if self.cfg.trace {
                eprintln!(
                    "{:>9} node {node} refuses range {ix}'s suffix after {have_seq} to {to}: {reason}",
                    self.now
                );
            }
            self.send(node, to, ChainMsg::SuffixRefused { epoch, range, reason });
            return;
        }
        let upto_seq = r.copy_cut_seq();
        let outcomes = r.outcomes_after(0, upto_seq);
        let Ok(selection) = Selection::read(have_seq, r.store().cut()) else { return };
        let cut = CopyCut::take(r.store(), upto_seq);
        let mut stream = Stream::new(range, epoch, snapshot, cut, None, outcomes, SIM_BATCH_BYTES);
        stream.select(selection);
        self.send(node, to, ChainMsg::SuffixBegin { epoch, range, snapshot, after_seq: have_seq });
        self.start_stream(node, ix, to, stream);
    }

    fn next_snapshot(&mut self) -> u64 {
        self.snapshots += 1;
        self.snapshots
    }

    /// Starts `stream` (its begin just sent), replacing the range's stream in progress. The
    /// shell's old stream checks it is still current only before each batch: one batch may
    /// race past the new begin, and its outcomes and end, sent unchecked, follow its last
    /// batch. Modelled here: the old stream's next batch goes after the new begin half the
    /// time, and what follows its last batch always.
    fn start_stream(&mut self, node: NodeId, ix: RangeIx, to: NodeId, stream: Stream<Cut>) {
        let old = self.nodes.get_mut(&node).and_then(|n| n.sending.remove(&ix)).filter(|o| o.to == to);
        if let Some(mut old) = old {
            let mut raced = false;
            while let Ok(Some((msg, _))) = old.stream.next_msg() {
                if matches!(msg, ChainMsg::SnapshotBatch { .. }) {
                    if raced || !self.rng.gen_bool(0.5) {
                        break;
                    }
                    raced = true;
                }
                self.send(node, to, msg);
            }
        }
        let Some(n) = self.nodes.get_mut(&node) else { return };
        let (life, snapshot) = (n.life, stream.snapshot());
        n.sending.insert(ix, Outgoing { to, stream });
        let d = self.rng.gen_range(100..STREAM_GAP_MAX);
        self.at(d, Ev::StreamNext { node, life, range: ix, snapshot });
    }

    /// The next message of `node`'s stream `snapshot` of range `ix`, if it is still the one
    /// it sends (a newer one replaces it; a crash or a dropped replica ends it).
    pub(super) fn stream_next(&mut self, node: NodeId, life: u32, ix: RangeIx, snapshot: u64) {
        let Some(n) = self.nodes.get_mut(&node).filter(|n| n.alive && n.life == life) else { return };
        if !n.replicas.contains_key(&ix) {
            n.sending.remove(&ix);
            return;
        }
        let Some(out) = n.sending.get_mut(&ix).filter(|o| o.stream.snapshot() == snapshot) else { return };
        let to = out.to;
        match out.stream.next_msg() {
            Ok(Some((msg, _))) => {
                self.send(node, to, msg);
                let d = self.rng.gen_range(100..STREAM_GAP_MAX);
                self.at(d, Ev::StreamNext { node, life, range: ix, snapshot });
            }
            Ok(None) | Err(_) => {
                n.sending.remove(&ix);
            }
        }
    }

    fn on_snapshot_begin(&mut self, node: NodeId, ix: RangeIx, from: NodeId, snapshot: u64) {
        let now = self.sync_now();
        let Some(n) = self.nodes.get_mut(&node) else { return };
        let (Some(sync), Some(r)) = (n.syncs.get_mut(&ix), n.replicas.get_mut(&ix)) else { return };
        let (taken, _) = sync.snapshot_begins(from, snapshot);
        if !taken {
            return;
        }
        // What earlier streams wrote goes (the back-end shadows it with tombstones).
        let emptied = r.store().emptied();
        *r.store_mut() = emptied;
        sync.take_snapshot(snapshot, now);
    }

    fn on_snapshot_end(&mut self, node: NodeId, ix: RangeIx, from: NodeId, end: CopyEnd) {
        let CopyEnd { snapshot, batches, upto_seq, dropped_seq_max } = end;
        let Some(n) = self.nodes.get_mut(&node) else { return };
        let Some(sync) = n.syncs.get_mut(&ix) else { return };
        let EndVerdict::Complete { outcomes, buffered, overflowed, .. } = sync.end(from, snapshot, batches)
        else {
            return;
        };
        let Some(r) = n.replicas.get_mut(&ix) else { return };
        let floor = copy_drop_floor(r, dropped_seq_max);
        r.store_mut().raise_drop_floor(floor);
        r.copied(upto_seq, outcomes);
        let Some(pred) = r.route().predecessor() else { return };
        for event in replay(pred, buffered, upto_seq) {
            self.step(node, ix, event);
        }
        let Some(n) = self.nodes.get_mut(&node) else { return };
        let Some(r) = n.replicas.get_mut(&ix) else { return };
        if replay_failed(r) {
            if let Some(sync) = n.syncs.get_mut(&ix) {
                sync.replay_failed();
            }
            return;
        }
        r.store_mut().set_whole(true);
        let (epoch, range, after_seq) = (r.route().epoch, r.route().rc.range, r.store().max_seq());
        if overflowed {
            self.send(node, pred, ChainMsg::Resend { epoch, range, after_seq });
        }
        if self.cfg.trace {
            eprintln!("{:>9} node {node} synced range {ix} up to {upto_seq}", self.now);
        }
        let d = self.delay();
        self.at(d, Ev::SyncDone { node, range: ix });
    }

    /// Whether `node` would report its copy of range `ix` done now: its replica syncs and
    /// holds a complete copy.
    pub(super) fn sync_done_holds(&self, node: NodeId, ix: RangeIx) -> bool {
        let Some(n) = self.nodes.get(&node).filter(|n| n.alive) else { return false };
        let syncing = n.replicas.get(&ix).is_some_and(|r| r.route().is_syncing());
        syncing && n.syncs.get(&ix).is_some_and(|s| s.done)
    }

    /// A syncing replica's retries (the shell's `tick_sync`).
    pub(super) fn tick_sync(&mut self, node: NodeId, ix: RangeIx) {
        let now = self.sync_now();
        let Some(n) = self.nodes.get_mut(&node) else { return };
        let (Some(sync), Some(r)) = (n.syncs.get_mut(&ix), n.replicas.get(&ix)) else { return };
        let (epoch, range, pred) = (r.route().epoch, r.route().rc.range, r.route().predecessor());
        let (_, request) = sync.tick(now, SIM_SILENCE_MAX, epoch, range);
        if let (Some(msg), Some(pred)) = (request, pred) {
            self.send(node, pred, msg);
        }
    }

    /// `node` starts syncing range `ix` in `route`: on `store` by a suffix if it holds a
    /// whole replica's records with a plan, else on an empty store by a full snapshot.
    pub(super) fn start_sync(&mut self, node: NodeId, ix: RangeIx, route: Route, store: Option<DiskStore>) {
        let store = store.filter(|s| s.whole());
        let plan = store.as_ref().and_then(|s| suffix_plan(s.sync_max_seq(), s.cut()).ok().flatten());
        let store = match (&plan, store) {
            (Some(_), Some(store)) => store,
            _ => self.empty_store(),
        };
        let source = route.predecessor().unwrap_or(node);
        let replica = self.open_replica(store, route);
        let sync =
            SyncProgress::new(source, plan, self.sync_now()).with_buffer_bytes_max(SIM_BUFFER_BYTES_MAX);
        let Some(n) = self.nodes.get_mut(&node) else { return };
        self.high.remove(&(node, ix, n.life));
        n.replicas.insert(ix, replica);
        n.syncs.insert(ix, sync);
    }

    /// The suffix was refused: the replica starts over on an empty store.
    fn restart_sync_fresh(&mut self, node: NodeId, ix: RangeIx) {
        let Some(route) = self.nodes.get(&node).and_then(|n| n.replicas.get(&ix)).map(|r| r.route().clone())
        else {
            return;
        };
        if self.cfg.trace {
            eprintln!("{:>9} node {node} range {ix}: suffix refused, copying in full", self.now);
        }
        self.start_sync(node, ix, route, None);
    }

    /// After an install: every syncing replica has its sync progress, and no other one has;
    /// every in-sync replica's store is whole.
    pub(super) fn settle_syncs(&mut self, node: NodeId) {
        let now = self.sync_now();
        let Some(n) = self.nodes.get_mut(&node) else { return };
        let replicas: Vec<RangeIx> = n.replicas.keys().copied().collect();
        for ix in replicas {
            let Some(r) = n.replicas.get_mut(&ix) else { continue };
            if !r.route().is_syncing() {
                n.syncs.remove(&ix);
                r.store_mut().set_whole(true);
            } else if let std::collections::btree_map::Entry::Vacant(slot) = n.syncs.entry(ix) {
                let source = r.route().predecessor().unwrap_or(node);
                let sync = SyncProgress::new(source, None, now).with_buffer_bytes_max(SIM_BUFFER_BYTES_MAX);
                slot.insert(sync);
            }
        }
        n.syncs.retain(|ix, _| n.replicas.contains_key(ix));
        n.sending.retain(|ix, _| n.replicas.contains_key(ix));
    }

    /// Whether `node`'s replica of `ix` holds a finished copy that `route` outdates
    /// (`replica::sync::finished_copy_outdated`, as the back-end's `install_range`): it copies
    /// the range afresh.
    pub(super) fn copy_done_across_a_gap(&self, node: NodeId, ix: RangeIx, route: &Route) -> bool {
        let Some(n) = self.nodes.get(&node) else { return false };
        let done = n.syncs.get(&ix).is_some_and(|s| s.done);
        done && n.replicas.get(&ix).is_some_and(|r| finished_copy_outdated(r.route().epoch, route.epoch))
    }

    /// Whether `node`'s syncing replica of `ix` syncs from a source other than `route`'s
    /// predecessor (or has no sync at all): the back-end starts such a copy afresh.
    pub(super) fn sync_source_changed(&self, node: NodeId, ix: RangeIx, route: &Route) -> bool {
        let source = self.nodes.get(&node).and_then(|n| n.syncs.get(&ix)).map(|s| s.source);
        source.is_none() || source != route.predecessor()
    }
}
