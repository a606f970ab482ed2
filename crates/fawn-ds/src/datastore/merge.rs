//! The maintenance operations of `DataStore`: compaction, cleaning and merges.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use super::DataStore;
use crate::error::Error;
use crate::maint::auto::{append_merge_is_cheaper, clean};
use crate::maint::build::{abandon, lock_maint, raise_drop_floor};
use crate::maint::hot::compact_hot;
use crate::maint::rewrite::{rewrite, rewrite_begin, rewrite_finish, Rewrite};
use crate::report::MaintenanceReport;
use crate::shared::{KeyFilter, Shared};

/// Merges serialize globally so that two merges in opposite directions cannot deadlock.
pub(crate) static MERGE_LOCK: Mutex<()> = Mutex::new(());

impl DataStore {
    /// Full compaction: write a new log holding only the live put of every key in the key
    /// filter (not expired) and the delete records above the tombstone watermark that no
    /// later put supersedes, concurrently with stores, lookups and deletes; then swap it in
    /// under a brief lock. With `Options::hot_cold` the survivors of both logs form a new
    /// cold log and the new hot log holds what was written during the compaction. A crash
    /// at any moment leaves the old or the new state.
    pub fn compact(&self) -> Result<MaintenanceReport, Error> {
        let shared = self.shared();
        let _m = lock_maint(shared)?;
        rewrite(shared, None, None)
    }

    /// Hot compaction (needs `Options::hot_cold`, else `Error::InvalidRequest`): append the
    /// hot log's survivors to the cold log and start a new hot log, without reading or
    /// rewriting the cold log's records. Keeps expired puts, out-of-filter keys and delete
    /// records (a full `compact` drops them). A crash at any moment leaves the old or the
    /// new state.
    pub fn compact_hot(&self) -> Result<MaintenanceReport, Error> {
        let shared = self.shared();
        let _m = lock_maint(shared)?;
        compact_hot(shared, None)
    }

    /// What the automatic compactor runs once the garbage thresholds are crossed: with
    /// `Options::hot_cold`, a hot compaction if it frees at least as many bytes per byte it
    /// copies as a full one would, else a full compaction; without, a full compaction.
    pub fn clean(&self) -> Result<MaintenanceReport, Error> {
        let shared = self.shared();
        let _m = lock_maint(shared)?;
        clean(shared)
    }

    /// Merge `other` into this store: every live put and delete record of `other` is
    /// appended, atomically: after a crash this store holds all of `other` or none of it.
    /// With `Options::hot_cold` (on by default) and most of this store's live data in its
    /// cold log, they are appended to the cold log after the hot log's survivors (a hot
    /// compaction), so the cost is `other`'s live data plus this store's hot survivors:
    /// merge the smaller store into the larger. Otherwise this store's own records are
    /// compacted into a new log at the same time (dropping out-of-filter keys). `other`
    /// is left unchanged; writes to it after `merge` returns are not carried over. The
    /// key ranges are expected to be disjoint; for a key in both, `other`'s version wins
    /// over this store's versions written before the merge began.
    pub fn merge(&self, other: &DataStore) -> Result<MaintenanceReport, Error> {
        self.merge_locked(other, |a, b| {
            if append_merge_is_cheaper(a) {
                compact_hot(a, Some(b))
            } else {
                rewrite(a, Some(b), None)
            }
        })
    }

    /// Runs a merge of `other` into this store under both maintenance locks (and the global
    /// merge lock); refuses a store merged into itself.
    pub(crate) fn merge_locked<T>(
        &self,
        other: &DataStore,
        run: impl FnOnce(&Shared, &Shared) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let (a, b) = (self.shared(), other.shared());
        if Arc::ptr_eq(a, b) {
            return Err(Error::InvalidRequest("a datastore cannot be merged into itself".into()));
        }
        let _g = MERGE_LOCK.lock();
        let _ma = lock_maint(a)?;
        let _mb = lock_maint(b)?;
        run(a, b)
    }

    /// Merge the store of an adjacent key range into this one: `other`'s live put and
    /// unsuperseded deletes of every key `other_keys` selects are written with this store's
    /// survivors into a new log, always by a full rewrite of this store, whose own records
    /// pass through its key filter. So neither side's leftovers of keys outside its range (a
    /// split leaves the split-off keys in the store that kept the log until it is compacted)
    /// survive: set this store's key filter to its own range before, and to the union after.
    /// Atomic and concurrent with other operations as `merge`; `other` is left unchanged.
    pub fn merge_range(&self, other: &DataStore, other_keys: KeyFilter) -> Result<MaintenanceReport, Error> {
        self.merge_locked(other, |a, b| rewrite(a, Some(b), Some(other_keys)))
    }

    /// The first half of [`DataStore::merge_range`]: the scans of both stores' logs into this
    /// store's new log, synced, concurrently with everything else. Both stores keep taking
    /// writes; [`DataStore::merge_range_finish`] copies what they appended meanwhile and
    /// swaps the new state in, so a caller that must stop writes for the merge (replicated
    /// ranges being merged) stops them only for that. Until then no other maintenance runs
    /// on either store (it is refused with `InvalidRequest`; the automatic compactor waits).
    /// Dropping the returned merge removes its files and lifts that.
    pub fn merge_range_begin(
        &self,
        other: &DataStore,
        other_keys: KeyFilter,
    ) -> Result<MergeInProgress, Error> {
        let (a, b) = (Arc::clone(self.shared()), Arc::clone(other.shared()));
        let rewrite = self.merge_locked(other, |a, b| {
            let begun = rewrite_begin(a, Some(b), Some(other_keys))?;
            let synced = match begun.new.cold() {
                Some(cold) => cold.log.sync_data(),
                None => begun.new.log().sync_data(),
            };
            if let Err(e) = synced {
                abandon(a, &begun.old, begun.cold_out);
                return Err(Error::io("syncing a merge's new log", e));
            }
            a.merge_reserved.store(true, Ordering::Release);
            b.merge_reserved.store(true, Ordering::Release);
            Ok(begun)
        })?;
        Ok(MergeInProgress { target: a, other: b, rewrite: Some(rewrite) })
    }

    /// The second half of a merge begun by [`DataStore::merge_range_begin`] on this store
    /// with `other`: catch up with both stores' appends and swap, as `merge_range`.
    pub fn merge_range_finish(
        &self,
        other: &DataStore,
        mut begun: MergeInProgress,
    ) -> Result<MaintenanceReport, Error> {
        let (a, b) = (self.shared(), other.shared());
        if !Arc::ptr_eq(a, &begun.target) || !Arc::ptr_eq(b, &begun.other) {
            return Err(Error::InvalidRequest(
                "a merge finished on other datastores than it began on".into(),
            ));
        }
        let rewrite =
            begun.rewrite.take().ok_or_else(|| Error::InvalidRequest("a merge finished twice".into()))?;
        let _g = MERGE_LOCK.lock();
        let _ma = a.maint.lock();
        let _mb = b.maint.lock();
        let report = rewrite_finish(a, Some(b), rewrite);
        a.merge_reserved.store(false, Ordering::Release);
        b.merge_reserved.store(false, Ordering::Release);
        report
    }

    /// Raises `dropped_seq_max` to at least `seq`, durably before it returns. For a caller
    /// that made this store's history more than a sequence of its own updates (a merge of
    /// another range's records): an older copy of this store with records up to a seq below
    /// `seq` then no longer counts as a prefix of it.
    pub fn raise_dropped_seq_max(&self, seq: u64) -> Result<(), Error> {
        raise_drop_floor(self.shared(), seq)
    }
}

/// A merge whose scans are done ([`DataStore::merge_range_begin`]), to be finished with
/// [`DataStore::merge_range_finish`]. Dropped unfinished, it removes the new log and lets
/// other maintenance run on both stores again.
pub struct MergeInProgress {
    pub(crate) target: Arc<Shared>,
    pub(crate) other: Arc<Shared>,
    pub(crate) rewrite: Option<Rewrite>,
}

impl Drop for MergeInProgress {
    fn drop(&mut self) {
        if let Some(r) = self.rewrite.take() {
            let _m = self.target.maint.lock();
            abandon(&self.target, &r.old, r.cold_out);
            drop(r);
            self.target.merge_reserved.store(false, Ordering::Release);
            self.other.merge_reserved.store(false, Ordering::Release);
        }
    }
}
