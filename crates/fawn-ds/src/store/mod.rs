//! `Inner`: one state of the engine — its hot (and cold) log, its index, the writer and sync
//! state — with the accessors every layer above uses. Its read path, write path, index growth
//! and durability are in the child modules.

mod durability;
mod growth;
mod read;
mod write;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::checkpoint::Loaded;
use crate::error::Error;
use crate::index::{Index, Loc};
use crate::limits::{
    pad_to_unit, COLD_UNITS_BIT, KEY_BYTES_MAX, LOG_HEADER_BYTES, OFFSET_UNIT, RECORD_HEADER_BYTES,
    VALUE_BYTES_MAX,
};
use crate::log::{LogFile, Scanner};
use crate::reclaim::Reclaim;
use crate::report::LockPhases;
use crate::tags::RecentTags;
use crate::types::{Meta, Options, RecordKind, Stats};

/// A 4 KiB page of the log device: lookups read within one, `page_aligned_records` keeps
/// records inside one.
const PAGE: u64 = 4096;

/// Serialized by `Inner::writer`: appends happen in this order.
#[derive(Debug)]
pub(crate) struct WriterState {
    /// Where the next record goes.
    pub end: u64,
}

#[derive(Debug, Default)]
struct SyncState {
    /// Log bytes known durable.
    synced: u64,
    /// A thread is running `fdatasync` right now (the group-commit leader).
    leader: bool,
}

/// Helper threads: the index migrator and the automatic checkpointer.
#[derive(Debug, Default)]
struct Migrator {
    handle: Option<JoinHandle<()>>,
    checkpointer: Option<JoinHandle<()>>,
    /// Set by `DataStore` drop/close: the thread exits after its current step.
    stop: Arc<AtomicBool>,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub lookups: AtomicU64,
    pub extra_reads: AtomicU64,
    pub fsyncs: AtomicU64,
    pub checkpoints: AtomicU64,
    pub checkpoint_errors: AtomicU64,
    /// Background (`SyncPolicy::Interval`) fsyncs that failed (each poisons the store).
    pub background_sync_errors: AtomicU64,
    pub growth_step_max_us: AtomicU64,
    /// Log bytes read by index growth scans.
    pub growth_scan_bytes: AtomicU64,
    /// Index entries the refresh scan could not refresh (stashed with the hash bits they know).
    pub growth_unplaced: AtomicU64,
    /// Bytes appended to logs by any write (user writes and maintenance copies).
    pub appended_bytes: AtomicU64,
    /// Bytes appended by maintenance (split/merge/compact copies), all time this open.
    pub cleaning_bytes: AtomicU64,
    /// Completed compactions / merges (operations that replaced the log).
    pub maintenance_ops: AtomicU64,
    pub last_maintenance_us: AtomicU64,
    pub last_lock_hold_us: AtomicU64,
    pub max_lock_hold_us: AtomicU64,
    /// What the last maintenance lock hold spent its time on.
    pub last_lock_phases: Mutex<LockPhases>,
    /// Automatic compactions that failed.
    pub auto_compact_errors: AtomicU64,
    pub write_stalls: AtomicU64,
    /// The tags of the latest tagged records. Here because, like the counters, every state
    /// of the store shares it: a maintenance swap keeps it. Changed under a state's writer
    /// lock, so a checkpoint's snapshot holds exactly the tags of the records it covers.
    pub recent_tags: Mutex<RecentTags>,
}

/// The cold log of a hot/cold datastore (`data.cold`): records that survived a compaction.
/// Only maintenance appends to it, while building a new state; a published state's cold log
/// never changes (every cold record is older than every hot one).
#[derive(Debug)]
pub(crate) struct ColdLog {
    pub log: Arc<LogFile>,
    /// Random id in the cold log's header (the `LOGS` manifest names it).
    pub nonce: u64,
    /// End of the cold log's records.
    pub end: AtomicU64,
}

/// State shared by the store handle and its background sync thread.
#[derive(Debug)]
pub(crate) struct Inner {
    dir: PathBuf,
    opts: Options,
    log: Arc<LogFile>,
    /// Random id written in the log header; a checkpoint is only valid for the same log.
    nonce: u64,
    /// The cold log, if this store separates hot and cold records (`Options::hot_cold`).
    cold: Option<ColdLog>,
    /// Bytes of live records in the cold log (`live_bytes` counts the hot log's).
    cold_live_bytes: AtomicU64,
    index: RwLock<Index>,
    writer: Mutex<WriterState>,
    /// End of the fully appended records (readers and iterators stop here).
    written_end: AtomicU64,
    /// End of the records whose index update is done too (trails `written_end` briefly):
    /// maintenance scans stop here, so every record they judge is already in the index.
    applied_end: AtomicU64,
    max_seq: AtomicU64,
    /// Bytes of records that are live: the current put of every key, and delete records.
    live_bytes: AtomicU64,
    /// Log bytes known durable (mirror of `SyncState::synced`, readable without the lock);
    /// stamped into every record for recovery.
    durable: AtomicU64,
    poisoned: AtomicBool,
    /// This state's log was renamed into place by maintenance and the directory entry may
    /// not be durable yet: `sync_to` syncs the directory before it reports anything durable
    /// (see `maint::swap`, which clears it after its own directory sync).
    dir_sync_pending: AtomicBool,
    /// Expiring puts and delete records by when a full compaction may drop them.
    reclaim: Mutex<Reclaim>,
    sync: Mutex<SyncState>,
    sync_cv: Condvar,
    /// Serializes checkpoints; holds the log end the last one covered.
    ckpt: Mutex<u64>,
    counters: Arc<Counters>,
    /// The background index migrator (see `start_migrator`).
    migrator: Mutex<Migrator>,
    /// The growth scan's turn (one scanner at a time) and its scanner, kept between steps
    /// of one range so each log byte is read once: (migration, cold log?, scanner).
    growth: Mutex<Option<(u64, bool, Scanner)>>,
    /// A weak handle on ourselves, for spawning the migrator (set once by `DataStore::open`).
    this: std::sync::OnceLock<std::sync::Weak<Inner>>,
    /// The flock'ed lock file; closing it releases the directory. Shared with the `Inner`
    /// that replaces this one after maintenance.
    lock: Arc<File>,
    /// Bytes of the last checkpoint file written (spaces automatic checkpoints).
    ckpt_image_bytes: AtomicU64,
    /// Records are kept inside 4 KiB pages (`page_aligned_records`, on a log that allows it).
    pads: bool,
    /// Size of the last record a lookup read: the next lookup's first read (one `pread`
    /// for a record of the usual size).
    read_guess: AtomicUsize,
}

impl Inner {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dir: PathBuf,
        opts: Options,
        log: LogFile,
        nonce: u64,
        lock: Arc<File>,
        end: u64,
        counters: Arc<Counters>,
        cold: Option<ColdLog>,
    ) -> Inner {
        let index = Index::for_keys(opts.expected_keys);
        let pads = opts.page_aligned_records && log.allows_padding();
        Inner {
            ckpt_image_bytes: AtomicU64::new(0),
            pads,
            read_guess: AtomicUsize::new(read::LOOKUP_READ_BYTES_GUESS),
            dir,
            opts,
            log: Arc::new(log),
            nonce,
            cold,
            cold_live_bytes: AtomicU64::new(0),
            index: RwLock::new(index),
            writer: Mutex::new(WriterState { end }),
            written_end: AtomicU64::new(end),
            applied_end: AtomicU64::new(end),
            max_seq: AtomicU64::new(0),
            live_bytes: AtomicU64::new(0),
            durable: AtomicU64::new(LOG_HEADER_BYTES),
            poisoned: AtomicBool::new(false),
            dir_sync_pending: AtomicBool::new(false),
            reclaim: Mutex::new(Reclaim::default()),
            sync: Mutex::new(SyncState { synced: end, leader: false }),
            sync_cv: Condvar::new(),
            ckpt: Mutex::new(0),
            counters,
            migrator: Mutex::new(Migrator::default()),
            growth: Mutex::new(None),
            this: std::sync::OnceLock::new(),
            lock,
        }
    }

    fn check_key(&self, key: &[u8]) -> Result<(), Error> {
        let max = self.opts.key_bytes_max.min(KEY_BYTES_MAX);
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        if key.len() > max {
            return Err(Error::KeyTooLarge { len: key.len(), max });
        }
        Ok(())
    }

    fn check_value(&self, value: &[u8]) -> Result<(), Error> {
        let max = self.opts.value_bytes_max.min(VALUE_BYTES_MAX);
        if value.len() > max {
            return Err(Error::ValueTooLarge { len: value.len(), max });
        }
        Ok(())
    }

    pub(crate) fn check_writable(&self) -> Result<(), Error> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        Ok(())
    }

    /// The log and the byte offset an index entry (offset units with the cold bit) names.
    pub fn locate(&self, units: u32) -> Result<(&LogFile, u64), Error> {
        let offset = (units & !COLD_UNITS_BIT) as u64 * OFFSET_UNIT;
        if units & COLD_UNITS_BIT == 0 {
            return Ok((&self.log, offset));
        }
        match &self.cold {
            Some(c) => Ok((&c.log, offset)),
            None => Err(Error::corrupt(offset, "index entry points into a cold log that does not exist")),
        }
    }

    /// The datastore directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn opts(&self) -> &Options {
        &self.opts
    }

    /// The hot log.
    pub(crate) fn log(&self) -> &Arc<LogFile> {
        &self.log
    }

    /// The hot log's random id (a checkpoint is valid only for the same log).
    pub(crate) fn nonce(&self) -> u64 {
        self.nonce
    }

    /// The cold log, if this state has one.
    pub(crate) fn cold(&self) -> Option<&ColdLog> {
        self.cold.as_ref()
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The flock'ed lock file, handed on to the state that replaces this one.
    pub(crate) fn lock_file(&self) -> &Arc<File> {
        &self.lock
    }

    /// End of the fully appended records of the hot log.
    pub(crate) fn written_end(&self) -> u64 {
        self.written_end.load(Ordering::Acquire)
    }

    /// End of the hot-log records whose index update is done too.
    pub(crate) fn applied_end(&self) -> u64 {
        self.applied_end.load(Ordering::Acquire)
    }

    /// Highest seq appended or replayed in this state.
    pub(crate) fn max_seq(&self) -> u64 {
        self.max_seq.load(Ordering::Acquire)
    }

    /// Raises `max_seq` to at least `seq`.
    pub(crate) fn raise_max_seq(&self, seq: u64) {
        self.max_seq.fetch_max(seq, Ordering::AcqRel);
    }

    /// Bytes of live records in the hot log.
    pub(crate) fn live_bytes(&self) -> u64 {
        self.live_bytes.load(Ordering::Acquire)
    }

    /// Bytes of live records in the cold log.
    pub(crate) fn cold_live_bytes(&self) -> u64 {
        self.cold_live_bytes.load(Ordering::Acquire)
    }

    /// Keys with a live value.
    pub(crate) fn live_keys(&self) -> u64 {
        self.index.read().live()
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// Estimated bytes a full compaction would drop beyond garbage as of `now` and
    /// `watermark`: expired puts and delete records at or below it (`Reclaim`).
    pub(crate) fn droppable_bytes(&self, now: u32, watermark: u64) -> u64 {
        self.reclaim.lock().droppable_bytes(now, watermark)
    }

    /// Makes this state reachable by its helper threads (the migrator, the checkpointer):
    /// called once it is in an `Arc`, before it is published.
    pub(crate) fn register(self: &Arc<Self>) {
        let _ = self.this.set(Arc::downgrade(self));
    }

    /// Maintenance renamed this state's log into place and has not synced the directory yet
    /// (`true`), or has (`false`); see `sync_to`.
    pub(crate) fn set_dir_sync_pending(&self, pending: bool) {
        self.dir_sync_pending.store(pending, Ordering::Release);
    }

    #[cfg(test)]
    pub(crate) fn dir_sync_pending(&self) -> bool {
        self.dir_sync_pending.load(Ordering::Acquire)
    }

    /// Open: appends continue at `end`, where recovery left the log, all of it durable.
    pub(crate) fn set_recovered_end(&self, end: u64) {
        self.writer.lock().end = end;
        self.written_end.store(end, Ordering::Release);
        self.applied_end.store(end, Ordering::Release);
        self.durable.store(end, Ordering::Release);
    }

    /// Open: the index and counters of a valid checkpoint.
    pub(crate) fn restore_checkpoint(&self, loaded: Loaded) {
        *self.index.write() = loaded.index;
        self.max_seq.store(loaded.max_seq, Ordering::Release);
        self.live_bytes.store(loaded.live_bytes, Ordering::Release);
        self.cold_live_bytes.store(loaded.cold_live_bytes, Ordering::Release);
        *self.ckpt.lock() = loaded.covered_end;
        *self.counters.recent_tags.lock() = loaded.tags;
    }

    /// Open, before a rebuild from the logs: an empty index sized for `keys`.
    pub(crate) fn presize_index(&self, keys: u64) {
        *self.index.write() = Index::for_keys(keys);
    }

    /// A consistent snapshot for a hot compaction, as for a checkpoint: writers pause for
    /// one copy of the index.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let w = self.writer.lock();
        let reclaim = self.reclaim.lock().clone();
        Snapshot { index: self.index.read().clone(), end: w.end, cold_live: self.cold_live_bytes(), reclaim }
    }

    /// Gives a state being built (not yet published) a snapshot's index, updated to point at
    /// the records moved into this state's cold log, with the matching counters.
    pub(crate) fn install_moved(&self, index: Index, reclaim: Reclaim, cold_live: u64, max_seq: u64) {
        *self.index.write() = index;
        *self.reclaim.lock() = reclaim;
        self.cold_live_bytes.store(cold_live, Ordering::Release);
        self.raise_max_seq(max_seq);
    }

    /// End of the cold log (0 without one).
    pub fn cold_end(&self) -> u64 {
        self.cold.as_ref().map_or(0, |c| c.end.load(Ordering::Acquire))
    }

    /// The live-byte counter of the hot log, or with `cold` of the cold log.
    fn live_counter(&self, cold: bool) -> &AtomicU64 {
        if cold {
            &self.cold_live_bytes
        } else {
            &self.live_bytes
        }
    }

    /// The refresh-scan limits (`[hot, cold]`) for inserting a record that ends at `end` in
    /// its log (the cold log with `cold`). Records are applied in log order: every record
    /// the index points at ends at or below this one's end (in its log) or below the other
    /// log's end.
    fn insert_limits(&self, cold: bool, end: u64) -> [u64; 2] {
        if cold {
            [self.written_end.load(Ordering::Acquire), end]
        } else {
            [end, self.cold_end()]
        }
    }

    /// Counters and sizes; `reclaimable_bytes` as of `now` (Unix seconds) and `watermark`.
    pub fn stats(&self, now: u32, watermark: u64) -> Stats {
        let reclaimable_bytes = self.reclaim.lock().droppable_bytes(now, watermark);
        let idx = self.index.read();
        let c = &self.counters;
        Stats {
            live_keys: idx.live(),
            log_bytes: self.written_end.load(Ordering::Acquire) + self.cold_end(),
            cold_log_bytes: self.cold_end(),
            cold_garbage_bytes: self.cold_garbage_bytes(),
            index_bytes: idx.bytes(),
            lookups: c.lookups.load(Ordering::Relaxed),
            extra_reads: c.extra_reads.load(Ordering::Relaxed),
            index_capacity: idx.capacity(),
            index_stash: idx.stash_len(),
            fsyncs: c.fsyncs.load(Ordering::Relaxed),
            checkpoints: c.checkpoints.load(Ordering::Relaxed),
            checkpoint_errors: c.checkpoint_errors.load(Ordering::Relaxed),
            background_sync_errors: c.background_sync_errors.load(Ordering::Relaxed),
            index_migrating: idx.is_migrating(),
            growth_step_max_us: c.growth_step_max_us.load(Ordering::Relaxed),
            growth_scan_bytes: c.growth_scan_bytes.load(Ordering::Relaxed),
            growth_unplaced: c.growth_unplaced.load(Ordering::Relaxed),
            log_reads: self.log.reads() + self.cold.as_ref().map_or(0, |c| c.log.reads()),
            poisoned: self.poisoned.load(Ordering::Acquire),
            live_bytes: self.live_bytes.load(Ordering::Acquire)
                + self.cold_live_bytes.load(Ordering::Acquire),
            garbage_bytes: self.garbage_bytes(),
            bytes_written_user: c
                .appended_bytes
                .load(Ordering::Relaxed)
                .saturating_sub(c.cleaning_bytes.load(Ordering::Relaxed)),
            bytes_written_cleaning: c.cleaning_bytes.load(Ordering::Relaxed),
            maintenance_ops: c.maintenance_ops.load(Ordering::Relaxed),
            last_maintenance_us: c.last_maintenance_us.load(Ordering::Relaxed),
            last_lock_hold_us: c.last_lock_hold_us.load(Ordering::Relaxed),
            max_lock_hold_us: c.max_lock_hold_us.load(Ordering::Relaxed),
            last_lock_phases: c.last_lock_phases.lock().clone(),
            auto_compact_errors: c.auto_compact_errors.load(Ordering::Relaxed),
            write_stalls: c.write_stalls.load(Ordering::Relaxed),
            reclaimable_bytes,
        }
    }

    /// Log bytes (both logs) that hold no live record (superseded or deleted puts).
    pub fn garbage_bytes(&self) -> u64 {
        self.hot_garbage_bytes() + self.cold_garbage_bytes()
    }

    /// Garbage in the hot log.
    pub fn hot_garbage_bytes(&self) -> u64 {
        let end = self.written_end.load(Ordering::Acquire);
        end.saturating_sub(LOG_HEADER_BYTES).saturating_sub(self.live_bytes.load(Ordering::Acquire))
    }

    /// Garbage in the cold log: records superseded by later (hot) writes.
    pub fn cold_garbage_bytes(&self) -> u64 {
        let end = self.cold_end();
        end.saturating_sub(LOG_HEADER_BYTES).saturating_sub(self.cold_live_bytes.load(Ordering::Acquire))
    }

    /// Bytes of both logs, headers excluded.
    pub fn total_log_bytes(&self) -> u64 {
        let hot = self.applied_end.load(Ordering::Acquire).saturating_sub(LOG_HEADER_BYTES);
        hot + self.cold_end().saturating_sub(LOG_HEADER_BYTES)
    }
}

/// A state's index with the log end it reflects, its cold live bytes and its reclaim
/// estimate, taken together under the writer lock (`Inner::snapshot`).
pub(crate) struct Snapshot {
    pub index: Index,
    pub end: u64,
    pub cold_live: u64,
    pub reclaim: Reclaim,
}

/// What applying records asks of index growth: it started (start the migrator), and how
/// many scan bytes the writes are ahead of the growth scan.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Growth {
    pub started: bool,
    pub behind: u64,
}

/// A record appended (or replayed) at a log's end, as `apply_batch` needs it: what
/// it does, to which key, and its length in the log (padding before it excluded).
pub(crate) trait AppliedRecord {
    fn kind(&self) -> RecordKind;
    fn key(&self) -> &[u8];
    fn meta(&self) -> &Meta;
    fn len(&self) -> u64;
}

impl AppliedRecord for BatchOp<'_> {
    fn kind(&self) -> RecordKind {
        self.kind
    }
    fn key(&self) -> &[u8] {
        self.key
    }
    fn meta(&self) -> &Meta {
        &self.meta
    }
    fn len(&self) -> u64 {
        record_len(self.key, self.value, self.tag) as u64
    }
}

/// An index entry found for a key: its location, the byte length of the record it points
/// at, and whether that record is in the cold log.
pub(crate) type Existing = (Loc, u64, bool);

/// Bytes of the record holding `key`, `value` and `tag` (header + key + value + tag, padded).
fn record_len(key: &[u8], value: &[u8], tag: &[u8]) -> usize {
    pad_to_unit(RECORD_HEADER_BYTES + key.len() + value.len() + tag.len())
}

/// One write of a batch (`DataStore::write_batch`).
#[derive(Clone, Copy, Debug)]
pub struct BatchOp<'a> {
    kind: RecordKind,
    key: &'a [u8],
    value: &'a [u8],
    tag: &'a [u8],
    meta: Meta,
}

impl<'a> BatchOp<'a> {
    /// Store `value` under `key`, as `DataStore::store`.
    pub fn put(key: &'a [u8], value: &'a [u8], meta: Meta) -> BatchOp<'a> {
        BatchOp { kind: RecordKind::Put, key, value, tag: &[], meta }
    }

    /// Delete `key` (a tombstone), as `DataStore::delete`.
    pub fn delete(key: &'a [u8], meta: Meta) -> BatchOp<'a> {
        BatchOp { kind: RecordKind::Delete, key, value: &[], tag: &[], meta }
    }

    /// Writes `tag` (at most `TAG_BYTES_MAX` bytes, opaque to the datastore) in the same
    /// record, so it is exactly as durable as the record: iteration returns it, and the
    /// store keeps the recent ones across a reopen (`DataStore::recent_tags`). Maintenance
    /// (compaction, split, merge) copies a record with its tag.
    pub fn with_tag(mut self, tag: &'a [u8]) -> BatchOp<'a> {
        self.tag = tag;
        self
    }
}
