//! The datastore as the replica state machine sees it: append a record, the highest seq held,
//! read a key, the records after a seq. Served by the real FAWN-DS (`DataStore`) or by
//! [`MemStore`], an in-memory map for the simulator and unit tests.

use std::collections::BTreeMap;
use std::sync::Arc;

use fawn_ds::{BatchOp, DataStore, Meta, RecordKind};
use fawn_proto::native::{OutcomeEntry, ReplEffect, ReqId, WireError};
use fawn_proto::op::{Item, Outcome};

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

/// What the replica needs from its datastore.
pub trait ReplicaStore {
    /// Appends the update of sequence number `seq` (above every seq held).
    fn append(&mut self, key: &[u8], effect: &ReplEffect, seq: u64) -> Result<(), StoreError>;
    /// Appends updates in order (seqs increasing, above every seq held), as `append` one by
    /// one would; a store that can writes them with one append, all or none.
    fn append_batch(&mut self, records: &[(&[u8], &ReplEffect, u64)]) -> Result<(), StoreError> {
        records.iter().try_for_each(|(key, effect, seq)| self.append(key, effect, *seq))
    }
    /// The highest sequence number held (0 when empty).
    fn max_seq(&self) -> u64;
    /// The live item of `key` (its cas is the seq of the put that wrote it), expired or not.
    fn read(&self, key: &[u8]) -> Result<Option<Item>, StoreError>;
    /// The updates with a seq above `after`, in seq order: every one of them, or (a log that
    /// compaction has cleaned) at least each key's latest.
    fn updates_after(&self, after: u64) -> Result<Vec<StoredUpdate>, StoreError>;
    /// Keeps a request's outcome with the record of `seq` (held already), exactly as
    /// durable as that record, so that a replica reopened on this store after a restart
    /// remembers it (`kept_outcomes`) and answers a retry instead of deciding it again. The
    /// default keeps nothing: FAWN-DS records carry no request id (yet), so the real back-end
    /// restarts with an empty dedup table.
    fn keep_outcome(&mut self, _req: ReqId, _seq: u64, _outcome: &Outcome) {}
    /// Every outcome kept with a record this store still holds, in seq order.
    fn kept_outcomes(&self) -> Vec<OutcomeEntry> {
        Vec::new()
    }
}

/// A range's updates in memory, as an uncompacted log: each key's latest, and every update
/// appended by seq (so a resend includes superseded updates, and a checker can tell which
/// updates a replica applied).
#[derive(Clone, Debug, Default)]
pub struct MemStore {
    latest: BTreeMap<Vec<u8>, (u64, ReplEffect)>,
    max_seq: u64,
    log: BTreeMap<u64, (Vec<u8>, ReplEffect)>,
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
}

impl ReplicaStore for MemStore {
    fn append(&mut self, key: &[u8], effect: &ReplEffect, seq: u64) -> Result<(), StoreError> {
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

/// The real FAWN-DS log (shared with the back-end's other users of the range's datastore).
impl ReplicaStore for Arc<DataStore> {
    fn append(&mut self, key: &[u8], effect: &ReplEffect, seq: u64) -> Result<(), StoreError> {
        match effect {
            ReplEffect::Put { value, flags, expiry, state } => {
                self.store(key, value, Meta { seq, flags: *flags, expiry: *expiry, state: *state })
            }
            ReplEffect::Delete => self.delete(key, Meta { seq, ..Meta::default() }),
        }
        .map_err(storage)
    }

    /// One `write_batch`: one `pwrite` (and one group commit), all records or none.
    fn append_batch(&mut self, records: &[(&[u8], &ReplEffect, u64)]) -> Result<(), StoreError> {
        let ops: Vec<BatchOp<'_>> = records
            .iter()
            .map(|(key, effect, seq)| match effect {
                ReplEffect::Put { value, flags, expiry, state } => BatchOp::put(
                    key,
                    value,
                    Meta { seq: *seq, flags: *flags, expiry: *expiry, state: *state },
                ),
                ReplEffect::Delete => BatchOp::delete(key, Meta { seq: *seq, ..Meta::default() }),
            })
            .collect();
        self.write_batch(&ops).map_err(storage)
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
        store.append(b"a", &put("1"), 5).expect("append");
        store.append(b"b", &put("2"), 7).expect("append");
        store.append(b"a", &ReplEffect::Delete, 9).expect("append");
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
        s.append(b"a", &put("1"), 5).expect("append");
        assert!(s.append(b"b", &put("2"), 5).is_err());
    }
}
