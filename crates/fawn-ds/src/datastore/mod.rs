//! `DataStore`, the public handle: open, the data operations, iteration, sync, checkpoints,
//! stats and close. Maintenance operations (`compact`, `merge`, `split`) are in `maint`.

pub(crate) mod merge;
pub(crate) mod split;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::error::Error;
use crate::files;
use crate::iter::Iter;
use crate::limits::{GARBAGE_STALL_US, LOG_HEADER_BYTES};
use crate::maint::auto::spawn_auto_compactor;
use crate::recovery;
use crate::shared::{Background, KeyFilter, Shared};
use crate::store::{BatchOp, Counters};
use crate::types::{Entry, Meta, Options, RecordKind, RecoveryReport, Stats, SyncPolicy};

/// A datastore: one directory holding the log, the index checkpoint and a lock file.
/// `Send + Sync`: share it as `Arc<DataStore>`.
#[derive(Debug)]
pub struct DataStore {
    shared: Arc<Shared>,
    report: RecoveryReport,
    background: Option<Background>,
}
/// The interval sync thread: wakes every `every`, syncs the current log if it has
/// unsynced appends.
fn spawn_interval_sync(shared: &Arc<Shared>, every: Duration) -> Result<Background, Error> {
    Background::spawn_periodic(shared, "fawn-ds-sync", every.max(Duration::from_millis(1)), |shared| {
        let inner = shared.current();
        let end = inner.written_end();
        if end > inner.synced() && !inner.is_poisoned() {
            // A failure poisons the store; writers see it on their next call. Nobody waits
            // on this sync, so report it here: the error log and the counter (a metric).
            if let Err(e) = inner.sync_to(end) {
                inner.counters().background_sync_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::error!(dir = %shared.dir.display(), error = %e, "background fsync failed; the datastore is poisoned and refuses writes");
            }
        }
    })
    .map_err(|e| Error::io("starting the sync thread", e))
}

impl DataStore {
    /// Open (or create) the datastore in directory `dir`: lock it, load the checkpoint if
    /// valid, replay the log after it (or rebuild from the whole log), cut a torn tail.
    /// Leftovers of maintenance interrupted by a crash are removed (the old state stands).
    pub fn open(dir: &Path, options: Options) -> Result<DataStore, Error> {
        let counters = Arc::new(Counters::default());
        let (inner, report, floor) = recovery::open(dir, options.clone(), Arc::clone(&counters))?;
        let drop_floor = files::read_drop_floor(dir)?;
        let inner = Arc::new(inner);
        inner.register();
        inner.start_migrator();
        let shared = Arc::new(Shared {
            cur: RwLock::new(Arc::clone(&inner)),
            dir: dir.to_path_buf(),
            opts: options,
            counters,
            maint: Mutex::new(()),
            watermark: AtomicU64::new(0),
            filter: RwLock::new(None),
            seq_floor: AtomicU64::new(floor),
            drop_floor: AtomicU64::new(drop_floor),
            auto: Mutex::new(None),
            cancel: AtomicBool::new(false),
            merge_reserved: AtomicBool::new(false),
        });
        let background = match inner.opts().sync {
            SyncPolicy::Interval(every) => Some(spawn_interval_sync(&shared, every)?),
            _ => None,
        };
        if shared.opts.auto_compact {
            *shared.auto.lock() = spawn_auto_compactor(&shared);
        }
        Ok(DataStore { shared, report, background })
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// What recovery found when this store was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    fn write(&self, kind: RecordKind, key: &[u8], value: &[u8], meta: Meta) -> Result<(), Error> {
        self.stall_if_over_limit();
        // The read guard spans the append, so maintenance's swap never loses it.
        let (inner, end) = {
            let cur = self.shared.cur.read();
            let end = cur.write(kind, key, value, meta)?;
            (Arc::clone(&cur), end)
        };
        // A swap after the append is fine: the new log holds the record, made durable
        // before the swap; syncing the old one too is harmless.
        inner.after_write(end)
    }

    /// Write many records with one append (one `pwrite`), in order, as if each had been
    /// stored or deleted one after the other by this thread; other writers' records do not
    /// interleave with the batch's. All ops are checked first: if any is invalid (empty or
    /// oversize key or value), nothing is written. Under `SyncPolicy::Always` returns once
    /// the whole batch is durable, with one `fdatasync` (shared with concurrent writers).
    ///
    /// Acknowledgement is per batch: after a crash before this returns, a prefix of the
    /// batch may be present (each record is whole and checked; recovery cuts a torn one).
    /// The batch is encoded into one buffer of about its log bytes: size batches to taste
    /// (a few hundred KiB to a few MiB is enough for full sequential write speed).
    pub fn write_batch(&self, ops: &[BatchOp<'_>]) -> Result<(), Error> {
        self.stall_if_over_limit();
        let (inner, end) = {
            let cur = self.shared.cur.read();
            let end = cur.write_batch(ops)?;
            (Arc::clone(&cur), end)
        };
        inner.after_write(end)
    }

    /// The tags of the latest records written with one (`BatchOp::with_tag`), at most
    /// `limits::RECENT_TAGS_MAX` (none below the seq last named to `forget_tags_below`),
    /// oldest first, each with its record's seq: what this store
    /// wrote since it was opened plus what it held when opened (the checkpoint keeps them,
    /// the replay of the log after it adds the rest; a record cut as a torn tail takes its
    /// tag with it).
    pub fn recent_tags(&self) -> Vec<(u64, Vec<u8>)> {
        self.shared.counters.recent_tags.lock().to_vec()
    }

    /// Keeps `tags` (seq, tag) as recent tags of records this store does not hold: the
    /// caller copied a state whose source had dropped those records (superseded, compacted)
    /// but needs their tags after a reopen as if it held them. A seq that has a tag kept
    /// already is skipped. If any was added, an index checkpoint is written, as the log has no
    /// record to replay them from. Returns how many were added.
    pub fn adopt_tags(&self, tags: &[(u64, Vec<u8>)]) -> Result<usize, Error> {
        let added = self.shared.counters.recent_tags.lock().adopt(tags);
        if added > 0 {
            // Held across the write so that maintenance does not swap the log underneath.
            let cur = self.shared.cur.read();
            cur.write_checkpoint_of_tags()?;
        }
        Ok(added)
    }

    /// Keeps no tags of records with a seq below `seq` any more (their caller no longer needs
    /// them after a reopen), and gives their memory back.
    pub fn forget_tags_below(&self, seq: u64) {
        self.shared.counters.recent_tags.lock().forget_below(seq);
    }

    /// Store `value` under `key` (appends a put record). Under `SyncPolicy::Always` returns
    /// only once the record is durable.
    pub fn store(&self, key: &[u8], value: &[u8], meta: Meta) -> Result<(), Error> {
        self.write(RecordKind::Put, key, value, meta)
    }

    /// Delete `key`: appends a delete record (tombstone) carrying `meta.seq`, even if the
    /// key is absent (replicas keep identical logs).
    pub fn delete(&self, key: &[u8], meta: Meta) -> Result<(), Error> {
        self.write(RecordKind::Delete, key, &[], meta)
    }

    /// The value of `key`, or None if absent or deleted. Expiry is not filtered here (but
    /// compaction drops expired items).
    pub fn lookup(&self, key: &[u8]) -> Result<Option<Entry>, Error> {
        self.shared.current().lookup(key)
    }

    /// All records in log order — the cold log's, then the hot log's — from the start to
    /// the end at call time (a snapshot: the
    /// iterator keeps reading the log it started on even if maintenance replaces it).
    ///
    /// Order: for each key, its records come in the order they were applied, i.e. in
    /// increasing `seq` when the caller writes each key in seq order; replaying the whole
    /// iteration yields the latest version of every key. The iteration as a whole is in
    /// log order, which is *not* globally seq-ordered after a `merge` (the other store's
    /// records follow this one's) — sort by seq if you need that.
    pub fn iter(&self) -> Iter {
        let inner = self.shared.current();
        let end = inner.written_end();
        let hot = (Arc::clone(inner.log()), LOG_HEADER_BYTES, end);
        match inner.cold() {
            Some(c) => {
                Iter::chain((Arc::clone(&c.log), LOG_HEADER_BYTES, c.end.load(Ordering::Acquire)), vec![hot])
            }
            None => Iter::chain(hot, Vec::new()),
        }
    }

    /// Records of the hot log from `offset` (a `Record::offset` of a hot-log record or an
    /// `end_offset()` seen earlier).
    /// Offsets refer to the current log: compaction and merge replace it, after which
    /// older offsets are meaningless (iteration from one returns an error or other records).
    /// With hot/cold separation, `iter()` first yields the cold log's records, whose
    /// offsets are positions in the cold log, not valid here.
    pub fn iter_from(&self, offset: u64) -> Iter {
        let inner = self.shared.current();
        let end = inner.written_end();
        Iter::new(Arc::clone(inner.log()), offset, end)
    }

    /// Log position after the last appended record (shrinks when compaction replaces the log).
    pub fn end_offset(&self) -> u64 {
        self.shared.current().written_end()
    }

    /// Highest `meta.seq` appended or recovered (puts and deletes), 0 if none. Never goes
    /// backwards: not when compaction drops the record that held it, not after a restart
    /// (maintenance persists it in the `MAXSEQ` file).
    pub fn max_seq(&self) -> u64 {
        let inner = self.shared.current().max_seq();
        inner.max(self.shared.seq_floor.load(Ordering::Acquire))
    }

    /// A seq at or above every record that maintenance dropped for its age or its key — a
    /// delete at or below the tombstone watermark, an expired put, an out-of-filter key —
    /// rather than because a later record of the same key survives; 0 if none was. So every
    /// record with a seq above this that was its key's latest is still in the logs: the
    /// records above a seq `s >= dropped_seq_max()` are a complete account of every key
    /// changed after `s`. Persisted (`DROPSEQ`) before the maintenance that needs it commits;
    /// never lowered.
    pub fn dropped_seq_max(&self) -> u64 {
        self.shared.drop_floor.load(Ordering::Acquire)
    }

    /// Make every record appended so far durable.
    pub fn sync(&self) -> Result<(), Error> {
        loop {
            let inner = self.shared.current();
            let end = inner.written_end();
            inner.sync_to(end)?;
            // A maintenance swap may have replaced that log while it was synced, after the
            // swap's check of what the old log had durable: then the records live on in
            // the new log, which is synced too. (`current` waits for a swap under way.)
            if Arc::ptr_eq(&inner, &self.shared.current()) {
                return Ok(());
            }
        }
    }

    /// Write an index checkpoint (after syncing the log it covers).
    pub fn checkpoint(&self) -> Result<(), Error> {
        // Held across the write so that maintenance does not swap the log underneath.
        let cur = self.shared.cur.read();
        cur.write_checkpoint()
    }

    /// Sync, checkpoint, stop the background threads and release the directory lock.
    pub fn close(mut self) -> Result<(), Error> {
        self.stop_background();
        self.sync()?;
        self.checkpoint()
    }

    /// Counters and sizes.
    pub fn stats(&self) -> Stats {
        let watermark = self.shared.watermark.load(Ordering::Acquire);
        self.shared.current().stats(files::now_secs(), watermark)
    }

    /// The datastore directory.
    pub fn path(&self) -> &Path {
        &self.shared.dir
    }

    /// Compaction may drop delete records whose `seq <=` this watermark (a caller that
    /// knows every replica has seen them says so). Default 0: every tombstone is kept.
    /// Never lowers a watermark already set.
    pub fn set_tombstone_watermark(&self, seq: u64) {
        self.shared.watermark.fetch_max(seq, Ordering::AcqRel);
    }

    /// Keys for which `filter` returns false are out of range: compaction (manual or
    /// automatic) drops their records. `None` keeps all keys (the default).
    pub fn set_key_filter(&self, filter: Option<KeyFilter>) {
        *self.shared.filter.write() = filter;
    }

    /// Backpressure (`Options::stall_garbage_ratio`): a write first sleeps while garbage is
    /// far past the compaction thresholds, so that compaction catches up with the writers.
    fn stall_if_over_limit(&self) {
        if self.shared.over_stall_limit() {
            self.shared.counters.write_stalls.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_micros(GARBAGE_STALL_US));
        }
    }

    /// Stops, and waits for, the helper threads that create files in this store's directory
    /// (automatic maintenance, checkpoints, the index migrator), for a caller about to remove
    /// the directory: a file created while it is emptied fails the removal, and one created
    /// after it lands in the directory of the store that replaces this one. A maintenance
    /// pass under way is cancelled. The store still reads and appends to its open log; it
    /// starts no helper again. Idempotent.
    pub fn halt(&self) {
        self.shared.cancel.store(true, Ordering::Release);
        let auto = self.shared.auto.lock().take();
        if let Some(mut a) = auto {
            a.shutdown();
        }
        // After the maintenance thread is joined: a pass it cancelled may have restarted the
        // helpers of the state it handed back.
        self.shared.current().stop_migrator();
    }

    fn stop_background(&mut self) {
        if let Some(mut bg) = self.background.take() {
            bg.shutdown();
        }
        self.halt();
    }
}

impl Drop for DataStore {
    fn drop(&mut self) {
        self.stop_background();
        // Best effort: a dropped (not closed) store still syncs what it acknowledged under
        // an interval policy. Errors poison nothing further; there is no caller to tell.
        if matches!(self.shared.opts.sync, SyncPolicy::Interval(_)) {
            let _ = self.sync();
        }
    }
}
