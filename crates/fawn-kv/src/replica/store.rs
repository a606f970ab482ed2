//! The datastore as the replica state machine sees it: append a record, the highest seq held,
//! read a key, the records after a seq. Served by the real FAWN-DS (`DataStore`) or by
//! [`MemStore`], an in-memory map for the simulator and unit tests.

use std::collections::BTreeMap;
use std::sync::Arc;

use fawn_ds::{BatchOp, DataStore, Meta, RecordKind};
use fawn_proto::native::{OutcomeEntry, ReplEffect, ReqId, WireError};
use fawn_proto::op::{Item, Outcome};

use super::tag::OutcomeTag;

/// A datastore failure, as text (the replica only reports it), or a record too large to store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    TooLarge,
    Failed(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::TooLarge => f.write_str("key or value too large"),
            StoreError::Failed(why) => f.write_str(why),
        }
    }
}

impl From<StoreError> for WireError {
    fn from(e: StoreError) -> WireError {
        match e {
            StoreError::TooLarge => WireError::TooLarge,
            StoreError::Failed(why) => WireError::Storage(why),
        }
    }
}

/// One stored update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredUpdate {
    pub seq: u64,
    pub key: Vec<u8>,
    pub effect: ReplEffect,
}

/// One update to append: its key, effect and sequence number, and the request it answers
/// when known (a head's own order, or a replicated update that carried its origin).
#[derive(Clone, Copy, Debug)]
pub struct Append<'a> {
    pub key: &'a [u8],
    pub effect: &'a ReplEffect,
    pub seq: u64,
    pub origin: Option<(ReqId, &'a Outcome)>,
}

impl<'a> Append<'a> {
    /// An update appended without its request (a resend, a copy).
    pub fn bare(key: &'a [u8], effect: &'a ReplEffect, seq: u64) -> Append<'a> {
        Append { key, effect, seq, origin: None }
    }
}

/// What the replica needs from its datastore.
pub trait ReplicaStore {
    /// Appends the update (its seq above every seq held). A store that keeps outcomes
    /// (`kept_outcomes`) writes the origin's request id and outcome in the same record, so
    /// exactly as durable as it.
    fn append(&mut self, update: &Append<'_>) -> Result<(), StoreError>;
    /// Appends updates in order (seqs increasing, above every seq held), as `append` one by
    /// one would; a store that can writes them with one append, all or none.
    fn append_batch(&mut self, updates: &[Append<'_>]) -> Result<(), StoreError> {
        updates.iter().try_for_each(|u| self.append(u))
    }
    /// The highest sequence number held (0 when empty).
    fn max_seq(&self) -> u64;
    /// The live item of `key` (its cas is the seq of the put that wrote it), expired or not.
    fn read(&self, key: &[u8]) -> Result<Option<Item>, StoreError>;
    /// The updates with a seq above `after`, in seq order: every one of them, or (a log that
    /// compaction has cleaned) at least each key's latest.
    fn updates_after(&self, after: u64) -> Result<Vec<StoredUpdate>, StoreError>;
    /// The outcomes appended with their records (`Append::origin`) that this store still
    /// holds, recent ones at least (those of the dedup window), in seq order: a replica
    /// reopened on the store after a restart remembers them and answers a retry instead of
    /// deciding it again. Outcomes without a record of their own (a failed condition writes
    /// nothing) are not kept: deciding such a retry again is harmless. The default keeps
    /// nothing.
    fn kept_outcomes(&self) -> Vec<OutcomeEntry> {
        Vec::new()
    }
    /// Keeps `outcomes` (of updates that wrote a record) for `kept_outcomes` although this
    /// store holds no record of theirs: a copy came without those records, as its source had
    /// dropped them (superseded or compacted), and a reopened replica must still answer their
    /// retries. Outcomes of seqs kept already are left as they are. The default keeps nothing.
    fn adopt_outcomes(&mut self, _outcomes: &[OutcomeEntry]) -> Result<(), StoreError> {
        Ok(())
    }
    /// The replica remembers no outcome kept with a record below `seq` any more: the store
    /// need not keep those for `kept_outcomes`. The default keeps nothing anyway; a store
    /// that wraps one that keeps outcomes must pass this on, or the wrapped store holds the
    /// most it keeps (`RECENT_TAGS_MAX` for FAWN-DS) whatever the replica forgot.
    fn forget_outcomes_below(&mut self, _seq: u64) {}
}

/// A range's updates in memory, as an uncompacted log: each key's latest, and every update
/// appended by seq (so a resend includes superseded updates, and a checker can tell which
/// updates a replica applied).
#[derive(Clone, Debug, Default)]
pub struct MemStore {
    latest: BTreeMap<Vec<u8>, (u64, ReplEffect)>,
    max_seq: u64,
    log: BTreeMap<u64, (Vec<u8>, ReplEffect)>,
    /// The highest seq of a delete `compact` dropped (FAWN-DS's `dropped_seq_max`).
    dropped_seq_max: u64,
}

impl MemStore {
    /// The seq of `key`'s latest update (put or delete), if any.
    pub fn seq_of(&self, key: &[u8]) -> Option<u64> {
        self.latest.get(key).map(|(seq, _)| *seq)
    }

    /// Whether the update of `seq` was ever appended here.
    pub fn applied(&self, seq: u64) -> bool {
        self.log.contains_key(&seq)
    }

    /// The seqs appended above `after`, in order.
    pub fn applied_after(&self, after: u64) -> impl Iterator<Item = u64> + '_ {
        self.log.range(after + 1..).map(|(seq, _)| *seq)
    }

    /// Every key's latest update, in key order.
    pub fn contents(&self) -> impl Iterator<Item = (&Vec<u8>, &(u64, ReplEffect))> {
        self.latest.iter()
    }

    /// `key`'s latest update, if any.
    pub fn latest_record(&self, key: &[u8]) -> Option<StoredUpdate> {
        let (seq, effect) = self.latest.get(key)?;
        Some(StoredUpdate { seq: *seq, key: key.to_vec(), effect: effect.clone() })
    }

    /// The highest seq of a delete compaction dropped (0: none).
    pub fn dropped_seq_max(&self) -> u64 {
        self.dropped_seq_max
    }

    /// The highest seq held is at least `seq` (records shadowed, as the back-end shadows an
    /// abandoned copy's, keep their seqs).
    pub fn raise_max_seq(&mut self, seq: u64) {
        self.max_seq = self.max_seq.max(seq);
    }

    /// Takes over a drop floor of `seq` (kept across a reopen, as FAWN-DS's `DROPSEQ` and
    /// `MAXSEQ` files keep it): the highest seq held is at least it too.
    pub fn raise_drop_floor(&mut self, seq: u64) {
        self.dropped_seq_max = self.dropped_seq_max.max(seq);
        self.max_seq = self.max_seq.max(seq);
    }

    /// Writes a record copied from another replica's log (a snapshot or suffix stream), as
    /// FAWN-DS's `write_batch` does: its seq need not be above those held (a suffix asked
    /// for again rewrites records an abandoned stream wrote), and a key's latest record is the
    /// one with the highest seq.
    pub fn write_copied(&mut self, seq: u64, key: &[u8], effect: &ReplEffect) {
        if self.latest.get(key).is_none_or(|(s, _)| *s <= seq) {
            self.latest.insert(key.to_vec(), (seq, effect.clone()));
        }
        self.log.insert(seq, (key.to_vec(), effect.clone()));
        self.max_seq = self.max_seq.max(seq);
    }

    /// Compacts the log as FAWN-DS's cleaning does, among the records up to `upto`: drops
    /// superseded records, and deletes at or below `watermark` (every replica holds them:
    /// FAWN-DS's tombstone watermark), which raise the drop floor. `max_seq` stays. Returns
    /// how many records it dropped.
    pub fn compact(&mut self, upto: u64, watermark: u64) -> usize {
        let before = self.log.len();
        let latest = &self.latest;
        let mut dropped_delete = 0;
        self.log.retain(|seq, (key, effect)| {
            if *seq > upto {
                return true;
            }
            let current = latest.get(key).is_some_and(|(s, _)| s == seq);
            let old_delete = matches!(effect, ReplEffect::Delete) && *seq <= watermark;
            if current && old_delete {
                dropped_delete = dropped_delete.max(*seq);
            }
            current && !old_delete
        });
        let log = &self.log;
        self.latest.retain(|_, (seq, _)| log.contains_key(seq));
        self.dropped_seq_max = self.dropped_seq_max.max(dropped_delete);
        before - self.log.len()
    }
}

impl ReplicaStore for MemStore {
    fn append(&mut self, u: &Append<'_>) -> Result<(), StoreError> {
        let (key, effect, seq) = (u.key, u.effect, u.seq);
        if seq <= self.max_seq {
            return Err(StoreError::Failed(format!("append of seq {seq} at or below {}", self.max_seq)));
        }
        self.latest.insert(key.to_vec(), (seq, effect.clone()));
        self.max_seq = seq;
        self.log.insert(seq, (key.to_vec(), effect.clone()));
        Ok(())
    }

    fn max_seq(&self) -> u64 {
        self.max_seq
    }

    fn read(&self, key: &[u8]) -> Result<Option<Item>, StoreError> {
        Ok(self.latest.get(key).and_then(|(seq, effect)| match effect {
            ReplEffect::Put { value, flags, expiry, state } => {
                Some(Item { value: value.clone(), flags: *flags, expiry: *expiry, cas: *seq, state: *state })
            }
            ReplEffect::Delete => None,
        }))
    }

    fn updates_after(&self, after: u64) -> Result<Vec<StoredUpdate>, StoreError> {
        Ok(self
            .log
            .range(after + 1..)
            .map(|(seq, (key, effect))| StoredUpdate { seq: *seq, key: key.clone(), effect: effect.clone() })
            .collect())
    }
}

fn storage(e: fawn_ds::Error) -> StoreError {
    match e {
        fawn_ds::Error::KeyTooLarge { .. } | fawn_ds::Error::ValueTooLarge { .. } => StoreError::TooLarge,
        other => StoreError::Failed(other.to_string()),
    }
}

/// The record of `u` as a FAWN-DS write, its origin in `tag` (record format 3).
fn batch_op<'a>(u: &Append<'a>, tag: &'a [u8]) -> BatchOp<'a> {
    let op = match u.effect {
        ReplEffect::Put { value, flags, expiry, state } => {
            BatchOp::put(u.key, value, Meta { seq: u.seq, flags: *flags, expiry: *expiry, state: *state })
        }
        ReplEffect::Delete => BatchOp::delete(u.key, Meta { seq: u.seq, ..Meta::default() }),
    };
    op.with_tag(tag)
}

/// The real FAWN-DS log (shared with the back-end's other users of the range's datastore).
/// An update's origin is written as the record's tag (`outcome_tag`).
impl ReplicaStore for Arc<DataStore> {
    fn append(&mut self, u: &Append<'_>) -> Result<(), StoreError> {
        self.append_batch(std::slice::from_ref(u))
    }

    /// One `write_batch`: one `pwrite` (and one group commit), all records or none.
    fn append_batch(&mut self, updates: &[Append<'_>]) -> Result<(), StoreError> {
        let tags: Vec<OutcomeTag> = updates.iter().map(|u| OutcomeTag::of(u.origin, u.seq)).collect();
        let ops: Vec<BatchOp<'_>> = updates.iter().zip(&tags).map(|(u, t)| batch_op(u, t.bytes())).collect();
        self.write_batch(&ops).map_err(storage)
    }

    /// The recent tags FAWN-DS kept (`DataStore::recent_tags`: the latest
    /// `RECENT_TAGS_MAX`, at least `DEDUP_ENTRIES_MAX`, none below the seq last named to
    /// `forget_outcomes_below`), decoded.
    fn kept_outcomes(&self) -> Vec<OutcomeEntry> {
        let mut out: Vec<OutcomeEntry> = self
            .recent_tags()
            .into_iter()
            .filter_map(|(seq, tag)| {
                let (req, outcome) = OutcomeTag::decode(&tag, seq)?;
                Some(OutcomeEntry { req, seq, outcome })
            })
            .collect();
        out.sort_by_key(|e| e.seq);
        out
    }

    /// As tags FAWN-DS adopts (`DataStore::adopt_tags`, which writes a checkpoint).
    fn adopt_outcomes(&mut self, outcomes: &[OutcomeEntry]) -> Result<(), StoreError> {
        let tags: Vec<(u64, Vec<u8>)> = outcomes
            .iter()
            .map(|e| (e.seq, OutcomeTag::of(Some((e.req, &e.outcome)), e.seq).bytes().to_vec()))
            .collect();
        self.adopt_tags(&tags).map(|_| ()).map_err(storage)
    }

    fn forget_outcomes_below(&mut self, seq: u64) {
        self.forget_tags_below(seq);
    }

    fn max_seq(&self) -> u64 {
        DataStore::max_seq(self)
    }

    fn read(&self, key: &[u8]) -> Result<Option<Item>, StoreError> {
        let entry = self.lookup(key).map_err(storage)?;
        Ok(entry.map(|e| Item {
            value: e.value,
            flags: e.meta.flags,
            expiry: e.meta.expiry,
            cas: e.meta.seq,
            state: e.meta.state,
        }))
    }

    /// Sorted by seq: log order need not be seq order once maintenance has moved surviving
    /// records to another log.
    fn updates_after(&self, after: u64) -> Result<Vec<StoredUpdate>, StoreError> {
        let mut out = Vec::new();
        for record in self.iter() {
            let record = record.map_err(storage)?;
            if record.meta.seq > after {
                let effect = match record.kind {
                    RecordKind::Put => ReplEffect::Put {
                        value: record.value,
                        flags: record.meta.flags,
                        expiry: record.meta.expiry,
                        state: record.meta.state,
                    },
                    RecordKind::Delete => ReplEffect::Delete,
                };
                out.push(StoredUpdate { seq: record.meta.seq, key: record.key, effect });
            }
        }
        out.sort_by_key(|u| u.seq);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(v: &str) -> ReplEffect {
        ReplEffect::Put { value: v.as_bytes().to_vec(), flags: 0, expiry: 0, state: 0 }
    }

    /// Both stores answer alike for the same appends.
    fn exercise(store: &mut dyn ReplicaStore) {
        store.append(&Append::bare(b"a", &put("1"), 5)).expect("append");
        store.append(&Append::bare(b"b", &put("2"), 7)).expect("append");
        store.append(&Append::bare(b"a", &ReplEffect::Delete, 9)).expect("append");
        assert_eq!(store.max_seq(), 9);
        assert_eq!(store.read(b"a").expect("read"), None);
        assert_eq!(store.read(b"b").expect("read").map(|i| (i.value, i.cas)), Some((b"2".to_vec(), 7)));
        let after: Vec<u64> = store.updates_after(5).expect("after").iter().map(|u| u.seq).collect();
        assert_eq!(after, vec![7, 9]);
    }

    #[test]
    fn mem_store_and_fawn_ds_agree() {
        exercise(&mut MemStore::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let ds = DataStore::open(dir.path(), fawn_ds::Options::default()).expect("open");
        exercise(&mut Arc::new(ds));
    }

    #[test]
    fn mem_store_refuses_a_seq_that_goes_backwards() {
        let mut s = MemStore::default();
        s.append(&Append::bare(b"a", &put("1"), 5)).expect("append");
        assert!(s.append(&Append::bare(b"b", &put("2"), 5)).is_err());
    }
}

/// A replica on the real FAWN-DS, reopened after a crash (no clean close: the records are in
/// the log, the checkpoint is older or absent), answers a retry from the outcomes its
/// records kept instead of deciding it again.
#[cfg(test)]
mod reopen_tests {
    use super::*;
    use crate::replica::machine::{Action, ClientUpdate, Event, Replica};
    use crate::replica::route::Route;
    use fawn_proto::native::RangeConfig;
    use fawn_proto::op::{Mutation, Update};
    use fawn_ring::Range;

    fn update(seq: u64, mutation: Mutation, value: &str) -> Event {
        let update = Update { key: b"n".to_vec(), mutation, value: value.into(), flags: 0, expiry: 0 };
        let req = ReqId { client: 77, seq };
        let (now, now_micros, flush_at) = (0, 0, 0);
        Event::Update(ClientUpdate {
            req,
            update,
            reply_to: None,
            now,
            now_micros,
            flush_at,
            bulk_copy_pending: false,
            floor: 0,
            epoch: fawn_proto::native::Epoch::MAX,
        })
    }

    fn reply(r: &mut Replica<Arc<DataStore>>, event: Event) -> Outcome {
        match r.step(event).as_slice() {
            [Action::Reply { result: Ok(outcome), .. }] => outcome.clone(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_replica_reopened_on_fawn_ds_answers_a_retry_from_its_kept_outcomes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts =
            || fawn_ds::Options { checkpoint_every_bytes: 0, auto_compact: false, ..Default::default() };
        let route = Route { epoch: 1, me: 1, rc: RangeConfig::new(Range::full(), vec![1]) };
        let ds = Arc::new(DataStore::open(dir.path(), opts()).expect("open"));
        let mut r = Replica::new(Arc::clone(&ds), route.clone());
        assert!(matches!(reply(&mut r, update(1, Mutation::Set, "5")), Outcome::Stored { .. }));
        // The reply of this incr is lost: the client will retry it.
        let incr = reply(&mut r, update(2, Mutation::Incr { delta: 3 }, ""));
        assert!(matches!(incr, Outcome::Counter { value: 8, .. }), "{incr:?}");
        // A failed condition writes nothing, so it keeps nothing.
        assert_eq!(reply(&mut r, update(3, Mutation::Add, "x")), Outcome::NotStored);
        let held = ds.max_seq();
        drop(r);
        drop(ds);

        let ds = Arc::new(DataStore::open(dir.path(), opts()).expect("reopen"));
        assert!(!ds.recovery_report().from_checkpoint, "the outcomes come from the log itself");
        let mut r = Replica::new(Arc::clone(&ds), route);
        assert_eq!(reply(&mut r, update(2, Mutation::Incr { delta: 3 }, "")), incr, "the retry is answered");
        assert_eq!(ds.max_seq(), held, "and not applied again");
        assert_eq!(ReplicaStore::read(&ds, b"n").expect("read").map(|i| i.value), Some(b"8".to_vec()));
        let next = reply(&mut r, update(4, Mutation::Incr { delta: 1 }, ""));
        assert!(matches!(next, Outcome::Counter { value: 9, .. }), "{next:?}");
    }
}
