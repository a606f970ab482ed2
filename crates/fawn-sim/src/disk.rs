//! A range's datastore on a simulated disk: the records in memory (`MemStore`) and how far
//! they are durable, so that a crash can lose what was not synced, and a disk that can fill up.

use std::collections::BTreeMap;

use fawn_kv::replica::store::{Append, MemStore, ReplicaStore, StoreError, StoredUpdate};
use fawn_kv::replica::sync::SyncStore;
use fawn_proto::native::{OutcomeEntry, RecordMark, ReplEffect, SnapshotItem};
use fawn_proto::op::Item;
use fawn_ring::{key_id, Range};

/// When appended records become durable (as `fawn_ds::SyncPolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Each append is durable before it returns.
    Always,
    /// A background sync makes every append durable this often (microseconds).
    Interval(u64),
}

/// One range's records on one node's simulated disk.
#[derive(Clone, Debug, Default)]
pub struct DiskStore {
    mem: MemStore,
    /// Every record up to this seq is durable.
    synced: u64,
    /// Synced at each append (`SyncPolicy::Always`).
    always: bool,
    /// Appends refused (the disk is full).
    full: bool,
    /// Request outcomes are kept with their records (unless `Config::volatile_outcomes`), by seq,
    /// as FAWN-DS keeps them in the record's tag: only those appended with their record.
    keeps_outcomes: bool,
    outcomes: BTreeMap<u64, OutcomeEntry>,
    /// A whole replica's store (the back-end's `REPLICA` marker): an in-sync replica's, or a
    /// finished copy. A syncing replica's copy is not, nor a store taking a suffix: a node
    /// back from a crash rejoins with it only if whole.
    whole: bool,
}

impl DiskStore {
    pub fn new(policy: SyncPolicy) -> DiskStore {
        DiskStore { always: policy == SyncPolicy::Always, ..DiskStore::default() }
    }

    /// Keeps each request's outcome with its record, as a log whose records carry it would.
    pub fn keeping_outcomes(mut self, keep: bool) -> DiskStore {
        self.keeps_outcomes = keep;
        self
    }

    pub fn mem(&self) -> &MemStore {
        &self.mem
    }

    /// Makes every record appended so far durable (the interval sync).
    pub fn sync(&mut self) {
        self.synced = self.mem.max_seq();
    }

    pub fn set_full(&mut self, full: bool) {
        self.full = full;
    }

    pub fn whole(&self) -> bool {
        self.whole
    }

    pub fn set_whole(&mut self, whole: bool) {
        self.whole = whole;
    }

    /// An empty store with this one's settings, not whole, holding seqs up to this one's:
    /// a new copy's over an abandoned one (the back-end shadows every record it held).
    pub fn emptied(&self) -> DiskStore {
        let mut empty = self.clone_settings();
        empty.mem.raise_max_seq(self.mem.max_seq());
        empty.synced = self.synced.min(empty.mem.max_seq());
        empty
    }

    /// Raises the drop floor to `seq` (a finished copy takes its source's).
    pub fn raise_drop_floor(&mut self, seq: u64) {
        self.mem.raise_drop_floor(seq);
    }

    /// Writes records copied from another replica (`MemStore::write_copied`) with one write,
    /// all or none: refused on a full disk.
    pub fn write_copied(&mut self, records: &[SnapshotItem]) -> Result<(), StoreError> {
        if self.full {
            return Err(StoreError::Failed("no space left on device".into()));
        }
        for r in records {
            self.mem.write_copied(r.seq, &r.key, &r.effect);
        }
        if self.always {
            self.synced = self.mem.max_seq();
        }
        Ok(())
    }

    /// Compaction (`MemStore::compact`) of the durable records: deletes at or below
    /// `watermark` are dropped.
    pub fn compact(&mut self, watermark: u64) -> usize {
        self.mem.compact(self.synced, watermark)
    }

    /// What a crash of the host leaves: every synced record, then the unsynced ones up to
    /// `survive` (the page cache wrote back some of them; the first lost one may be torn,
    /// which the datastore cuts at open): the log's prefix up to `survive` or `synced`,
    /// whichever is later. A full disk is full no longer (the operator made room).
    pub fn after_crash(&self, survive: u64) -> DiskStore {
        let keep = survive.max(self.synced);
        let mut mem = MemStore::default();
        let records = self.mem.updates_after(0).unwrap_or_default();
        for u in records.into_iter().take_while(|u| u.seq <= keep) {
            mem.append(&Append::bare(&u.key, &u.effect, u.seq)).expect("records in seq order");
        }
        let synced = mem.max_seq();
        mem.raise_drop_floor(self.mem.dropped_seq_max().min(keep));
        // An outcome is as durable as the record it was appended with, also once compaction
        // dropped that record (FAWN-DS keeps recent tags in its checkpoint, not in the records):
        // kept up to what survived of the log, not only up to the highest record left.
        let outcomes = self.outcomes.range(..=keep).map(|(s, e)| (*s, e.clone())).collect();
        DiskStore {
            mem,
            synced,
            always: self.always,
            full: false,
            keeps_outcomes: self.keeps_outcomes,
            outcomes,
            whole: self.whole,
        }
    }

    /// The datastore of `part` that a split cuts out of this one: the records of `part`'s
    /// keys, each as durable as here, and every kept outcome (as the back-end's split hands a
    /// part its parent's recent tags: a superset of its own, which is harmless).
    pub fn part(&self, part: &Range) -> DiskStore {
        let mut mem = MemStore::default();
        let records = self.mem.updates_after(0).unwrap_or_default();
        for u in records.into_iter().filter(|u| part.contains(key_id(&u.key))) {
            mem.append(&Append::bare(&u.key, &u.effect, u.seq)).expect("records in seq order");
        }
        let synced = mem.applied_after(0).take_while(|s| *s <= self.synced).last().unwrap_or(0);
        mem.raise_drop_floor(self.mem.dropped_seq_max());
        DiskStore { mem, synced, outcomes: self.outcomes.clone(), whole: self.whole, ..self.clone_settings() }
    }

    /// The datastore a merge makes of `parts` (each holding only its own range's keys): each
    /// key's latest record in seq order (FAWN-DS's merge rewrites the live entries), durable
    /// (the back-end makes a merge durable before the merged replica serves), with their kept
    /// outcomes. `Err(seq)` if two parts' latest records have the same seq (two ranges ordered
    /// an update in the same microsecond), which one log of seqs cannot hold.
    pub fn merged(parts: &[&DiskStore]) -> Result<DiskStore, u64> {
        let mut records: Vec<(u64, &Vec<u8>, &ReplEffect)> =
            parts.iter().flat_map(|p| p.mem.contents().map(|(k, (seq, e))| (*seq, k, e))).collect();
        records.sort_by_key(|(seq, _, _)| *seq);
        let mut mem = MemStore::default();
        for (seq, key, effect) in records {
            mem.append(&Append::bare(key, effect, seq)).map_err(|_| seq)?;
        }
        let first = parts.first().map(|p| p.clone_settings()).unwrap_or_default();
        let outcomes = parts.iter().flat_map(|p| p.outcomes.iter().map(|(s, e)| (*s, e.clone()))).collect();
        let whole = parts.iter().all(|p| p.whole);
        mem.raise_drop_floor(parts.iter().map(|p| p.mem.dropped_seq_max()).max().unwrap_or(0));
        Ok(DiskStore { synced: mem.max_seq(), mem, outcomes, whole, ..first })
    }

    /// An empty store with this one's settings (sync policy, outcomes kept, full disk).
    fn clone_settings(&self) -> DiskStore {
        DiskStore {
            always: self.always,
            full: self.full,
            keeps_outcomes: self.keeps_outcomes,
            ..DiskStore::default()
        }
    }

    /// The update of `seq`, if this log holds it.
    pub fn record(&self, seq: u64) -> Option<StoredUpdate> {
        let updates = self.mem.updates_after(seq.checked_sub(1)?).ok()?;
        updates.into_iter().next().filter(|u| u.seq == seq)
    }
}

impl SyncStore for DiskStore {
    type Cut = <MemStore as SyncStore>::Cut;

    fn cut(&self) -> Self::Cut {
        self.mem.cut()
    }

    fn sync_max_seq(&self) -> u64 {
        self.mem.max_seq()
    }

    fn dropped_seq_max(&self) -> u64 {
        self.mem.dropped_seq_max()
    }

    fn current_put(&self, key: &[u8]) -> Result<Option<RecordMark>, StoreError> {
        self.mem.current_put(key)
    }
}

impl ReplicaStore for DiskStore {
    fn append(&mut self, u: &Append<'_>) -> Result<(), StoreError> {
        if self.full {
            return Err(StoreError::Failed("no space left on device".into()));
        }
        self.mem.append(u)?;
        if let Some((req, outcome)) = u.origin.filter(|_| self.keeps_outcomes) {
            self.outcomes.insert(u.seq, OutcomeEntry { req, seq: u.seq, outcome: outcome.clone() });
        }
        if self.always {
            self.synced = u.seq;
        }
        Ok(())
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

    /// As FAWN-DS adopts tags: kept as if appended with their records (and lost with them
    /// by a crash that loses those seqs).
    fn adopt_outcomes(&mut self, outcomes: &[OutcomeEntry]) -> Result<(), StoreError> {
        if self.keeps_outcomes {
            for e in outcomes {
                self.outcomes.entry(e.seq).or_insert_with(|| e.clone());
            }
        }
        Ok(())
    }

    fn kept_outcomes(&self) -> Vec<OutcomeEntry> {
        self.outcomes.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fawn_proto::native::{ReplEffect, ReqId};
    use fawn_proto::op::Outcome;

    fn put(v: &str) -> ReplEffect {
        ReplEffect::Put { value: v.as_bytes().to_vec(), flags: 0, expiry: 0, state: 0 }
    }

    #[test]
    fn a_crash_keeps_the_synced_prefix_and_what_was_written_back() {
        let mut d = DiskStore::new(SyncPolicy::Interval(100));
        d.append(&Append::bare(b"a", &put("1"), 5)).expect("append");
        d.sync();
        d.append(&Append::bare(b"b", &put("2"), 7)).expect("append");
        d.append(&Append::bare(b"a", &put("3"), 9)).expect("append");
        assert_eq!(d.after_crash(0).max_seq(), 5);
        assert_eq!(d.after_crash(8).max_seq(), 7);
        assert_eq!(d.after_crash(9).read(b"a").expect("read").map(|i| i.cas), Some(9));
        let mut always = DiskStore::new(SyncPolicy::Always);
        always.append(&Append::bare(b"a", &put("1"), 5)).expect("append");
        assert_eq!(always.after_crash(0).max_seq(), 5);
    }

    #[test]
    fn kept_outcomes_survive_a_crash_with_their_records_only() {
        let req = |seq| ReqId { client: 1, seq };
        let (v1, v2) = (put("1"), put("2"));
        let (s5, s7) = (Outcome::Stored { cas: 5 }, Outcome::Stored { cas: 7 });
        let first = Append { key: b"a", effect: &v1, seq: 5, origin: Some((req(1), &s5)) };
        let second = Append { key: b"b", effect: &v2, seq: 7, origin: Some((req(2), &s7)) };
        let mut d = DiskStore::new(SyncPolicy::Interval(100)).keeping_outcomes(true);
        d.append(&first).expect("append");
        d.sync();
        d.append(&second).expect("append");
        d.append(&Append::bare(b"c", &v1, 9)).expect("append");
        let kept = |d: &DiskStore| d.kept_outcomes().into_iter().map(|e| e.req).collect::<Vec<_>>();
        assert_eq!(kept(&d.after_crash(0)), vec![req(1)]);
        assert_eq!(kept(&d.after_crash(7)), vec![req(1), req(2)]);
        let mut off = DiskStore::new(SyncPolicy::Always);
        off.append(&first).expect("append");
        assert!(off.after_crash(0).kept_outcomes().is_empty());
    }

    #[test]
    fn a_split_cuts_the_log_by_key_and_a_merge_joins_the_latest_records() {
        let mut d = DiskStore::new(SyncPolicy::Interval(100));
        for (key, seq) in [("a", 5), ("b", 6), ("a", 7), ("c", 8)] {
            d.append(&Append::bare(key.as_bytes(), &put(key), seq)).expect("append");
        }
        d.sync();
        let id = |k: &str| key_id(k.as_bytes());
        let lower = Range::new(fawn_ring::KeyId(id("a").0.wrapping_sub(1)), id("a"));
        let upper = Range::new(id("a"), fawn_ring::KeyId(id("a").0.wrapping_sub(1)));
        let (l, u) = (d.part(&lower), d.part(&upper));
        assert_eq!(l.mem().applied_after(0).collect::<Vec<_>>(), vec![5, 7]);
        assert_eq!(u.mem().applied_after(0).collect::<Vec<_>>(), vec![6, 8]);
        assert_eq!(l.after_crash(0).max_seq(), 7, "as durable as the parent");
        let m = DiskStore::merged(&[&l, &u]).expect("distinct seqs");
        assert_eq!(m.mem().applied_after(0).collect::<Vec<_>>(), vec![6, 7, 8]);
        assert!(m.mem().contents().eq(d.mem().contents()));
        let mut clash = DiskStore::new(SyncPolicy::Always);
        clash.append(&Append::bare(b"b", &put("x"), 7)).expect("append");
        assert_eq!(DiskStore::merged(&[&l, &clash]).err(), Some(7));
    }

    #[test]
    fn a_full_disk_refuses_appends() {
        let mut d = DiskStore::new(SyncPolicy::Always);
        d.set_full(true);
        assert!(d.append(&Append::bare(b"a", &put("1"), 5)).is_err());
        d.set_full(false);
        assert!(d.append(&Append::bare(b"a", &put("1"), 5)).is_ok());
    }
}
