//! The public value types of FAWN-DS: options, record metadata, what `open` found, and the
//! counters of `stats`. A leaf: it imports only limits, fault injection and the report types.

use std::time::Duration;

use crate::fault::FaultInjector;
use crate::limits;
use crate::report::LockPhases;

/// When appended records are made durable with `fdatasync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Never sync explicitly (rely on replication and the OS writeback).
    Never,
    /// A background thread syncs this often when there are unsynced appends.
    Interval(Duration),
    /// `store`/`delete` return only once their record is durable. Concurrent writers share
    /// one `fdatasync` (group commit).
    Always,
}

/// Options of a datastore.
#[derive(Clone, Debug)]
pub struct Options {
    /// Durability policy. Default `Interval(100 ms)`: a process crash loses nothing (the
    /// page cache survives it), a power loss loses at most ~100 ms of acknowledged writes.
    /// Use `Always` when the store is the only copy.
    pub sync: SyncPolicy,
    /// Write an index checkpoint (on a helper thread) after this many log bytes since the
    /// last one, or 32 × the last checkpoint's size if that is more (so checkpoints add at
    /// most ~3 % to the bytes written, and a restart replays at most that much log)
    /// (0 = only on `checkpoint()`/`close()`). Default 64 MiB.
    pub checkpoint_every_bytes: u64,
    /// Largest accepted key (capped at `limits::KEY_BYTES_MAX`). Default 250.
    pub key_bytes_max: usize,
    /// Largest accepted value (capped at `limits::VALUE_BYTES_MAX`). Default 1 MiB.
    pub value_bytes_max: usize,
    /// Size the index for this many keys up front (0 = start small and grow). Growth is
    /// incremental, but a right-sized index avoids it and keeps DRAM/key minimal.
    pub expected_keys: u64,
    /// Damage to log data that had been fsynced (a bad record followed by records written
    /// after it was durable) makes open fail with `Error::Corrupt` unless this is set; then
    /// the log is truncated at the bad record, the cut bytes are kept in
    /// `data.log.cut-<offset>` and the loss is reported in the `RecoveryReport`. Damage
    /// only in never-synced data is always cut like a torn tail. Default false.
    pub salvage: bool,
    /// Fault injection for tests (fails appends/fsyncs on demand). Default: none.
    pub faults: FaultInjector,
    /// Compact automatically on a background thread when garbage (log bytes not holding a
    /// live record) reaches both `compact_garbage_bytes` and `compact_garbage_ratio` of
    /// the log. Default true.
    pub auto_compact: bool,
    /// Garbage bytes that trigger an automatic compaction. Default 64 MiB.
    pub compact_garbage_bytes: u64,
    /// Garbage fraction of the log that triggers an automatic compaction. Default 0.5
    /// (the log may grow to ~2× its live data: 100 % space overhead at most).
    pub compact_garbage_ratio: f64,
    /// How often the automatic compactor checks the thresholds, and the least time between
    /// two automatic compactions' starts. Default 1 s.
    pub compact_check_interval: Duration,
    /// Backpressure: while automatic compaction is on and garbage is at least this fraction
    /// of the log (and at least twice `compact_garbage_bytes`), each `store`/`delete` first
    /// sleeps `limits::GARBAGE_STALL_US` so that compaction can catch up with the writers.
    /// Default 0.75 (the log at 4× its live data); 0 or ≥ 1 = never.
    pub stall_garbage_ratio: f64,
    /// Rate limit of maintenance scans (split, merge, compact), bytes read per second;
    /// 0 = unlimited. Default 0. Keeps foreground latency when the device is the bottleneck.
    pub maintenance_bytes_per_sec: u64,
    /// Hot/cold separation: records that survive a compaction go to a cold log
    /// (`data.cold`), new writes to the hot log (`data.log`). When the garbage thresholds
    /// are crossed, the automatic compactor picks the cheaper cleaning per byte reclaimed:
    /// a *hot* compaction (only the hot log's survivors are appended to the cold log; the
    /// cold log is not rewritten) or a *full* one (both logs' survivors into a new cold
    /// log). Under skewed updates most garbage is in the hot log, so cold data stops being
    /// re-copied; under uniform updates it falls back to full compactions. Same space
    /// budget either way (the thresholds apply to both logs together). Default true.
    /// When false, no cold log is created (an existing one is folded back into the hot log
    /// by the next compaction).
    pub hot_cold: bool,
    /// Never write a record of at most 4 KiB across a 4 KiB boundary of the log: a record
    /// that would cross one is preceded by a padding record filling the rest of the page,
    /// so a lookup that goes to the device reads one page, not two. Costs log space (about
    /// half a record per page that would have been crossed: measured in docs/BENCHMARKS.md)
    /// and applies to logs created by this version (format 2); older logs are not padded
    /// until compaction rewrites them. Default false (see docs/FORMAT.md for why).
    pub page_aligned_records: bool,
    /// Run index growth (the sequential log scan that moves entries into the larger table)
    /// on a helper thread, so writes do not pay for it. Default true. When false, writes do
    /// all of it (each write scans its share once the scan falls behind): slower growth,
    /// but deterministic, which tests use.
    pub background_growth: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            sync: SyncPolicy::Interval(Duration::from_millis(100)),
            checkpoint_every_bytes: 64 << 20,
            key_bytes_max: limits::KEY_BYTES_MAX,
            value_bytes_max: limits::VALUE_BYTES_MAX,
            expected_keys: 0,
            salvage: false,
            faults: FaultInjector::default(),
            auto_compact: true,
            compact_garbage_bytes: 64 << 20,
            compact_garbage_ratio: 0.5,
            compact_check_interval: Duration::from_secs(1),
            maintenance_bytes_per_sec: 0,
            stall_garbage_ratio: 0.75,
            hot_cold: true,
            page_aligned_records: false,
            background_growth: true,
        }
    }
}

/// Per-record metadata stored in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Meta {
    /// Caller-supplied sequence number (chain replication orders updates with it).
    pub seq: u64,
    /// memcached client flags.
    pub flags: u32,
    /// Absolute expiry in Unix seconds, 0 = never. Stored, not enforced by this crate.
    pub expiry: u32,
    /// The caller's item state bits (memcached's stale and token-sent marks), opaque to this
    /// crate; 0 for an item without state (record formats in docs/FORMAT.md).
    pub state: u8,
}

/// A stored value with its metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub value: Vec<u8>,
    pub meta: Meta,
}

/// Kind of a log record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    Put,
    /// A tombstone: the key is deleted as of this record.
    Delete,
}

/// One record of the log, as returned by iteration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub kind: RecordKind,
    pub key: Vec<u8>,
    /// Empty for deletes.
    pub value: Vec<u8>,
    /// The caller tag written with it (`BatchOp::with_tag`); empty for none.
    pub tag: Vec<u8>,
    pub meta: Meta,
    /// Offset of this record in the log (a record boundary, usable with `iter_from`).
    pub offset: u64,
}

/// What `open` found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The index came from a valid checkpoint (then only the log after it was replayed).
    pub from_checkpoint: bool,
    /// Log records replayed into the index.
    pub records_replayed: u64,
    /// Bytes cut off the end of the log (torn tail, or corruption with `salvage`).
    pub truncated_bytes: u64,
    /// Valid-looking records lost with the truncated bytes (0 for a pure torn tail, where
    /// only the one unacknowledged torn record is lost; counted for `salvage`).
    pub dropped_records_estimate: u64,
    /// Why the checkpoint was not used, if one existed and was rejected.
    pub checkpoint_error: Option<String>,
    /// Offset of the first bad record found, if any.
    pub corrupt_offset: Option<u64>,
    /// Log end after recovery.
    pub log_end: u64,
    /// Wall time of recovery in microseconds.
    pub duration_us: u64,
}

/// Counters and sizes, cheap to read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Keys with a live (non-deleted) value.
    pub live_keys: u64,
    /// Bytes of the logs (the hot log's end offset plus the cold log's, if any).
    pub log_bytes: u64,
    /// Bytes of the cold log (0 without hot/cold separation).
    pub cold_log_bytes: u64,
    /// Garbage in the cold log (records superseded by hot writes); part of `garbage_bytes`.
    pub cold_garbage_bytes: u64,
    /// DRAM of the index, from the capacities of its allocations (table chunks and stash).
    pub index_bytes: u64,
    /// `lookup` calls.
    pub lookups: u64,
    /// Log reads that found a different key behind a matching fragment.
    pub extra_reads: u64,
    /// Slots of the index table (it grows a bucket of 8 slots at a time).
    pub index_capacity: u64,
    /// Index entries in the stash (no bucket had room, or growth could not refresh them):
    /// each costs a compare per lookup. A handful in a healthy store.
    pub index_stash: u64,
    /// `fdatasync` calls on the log (group commit makes this lower than `Always` writes).
    pub fsyncs: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Auto-checkpoints that failed (the writes themselves succeeded).
    pub checkpoint_errors: u64,
    /// Background fsyncs (`SyncPolicy::Interval`) that failed. The first poisons the store
    /// (writes fail from then on) and is logged; see also `poisoned`.
    pub background_sync_errors: u64,
    /// An index refresh scan is running (the logs are read once per level of growth, to
    /// give every entry the hash bit its bucket's next split needs).
    pub index_migrating: bool,
    /// Longest single index growth step (microseconds) — the worst growth pause a writer saw.
    pub growth_step_max_us: u64,
    /// Log bytes read by index growth (a sequential scan of the logs; no random reads).
    pub growth_scan_bytes: u64,
    /// Index entries growth could not refresh by its scan (their records were unreadable):
    /// kept in the stash, matched on the fragment and the hash bits they still know. 0 in a
    /// healthy store.
    pub growth_unplaced: u64,
    /// `pread` calls on the current state's log files (lookups, key comparisons, scans).
    pub log_reads: u64,
    /// Writes are refused after a failed write/fsync.
    pub poisoned: bool,
    /// Bytes of live records (both logs): the current put of every key plus delete records.
    pub live_bytes: u64,
    /// Log bytes (both logs) holding no live record (superseded or deleted puts): what
    /// compaction frees.
    pub garbage_bytes: u64,
    /// Bytes appended by `store`/`delete` since open.
    pub bytes_written_user: u64,
    /// Bytes appended by maintenance (compact, merge, split copies) since open.
    pub bytes_written_cleaning: u64,
    /// Compactions and merges completed since open.
    pub maintenance_ops: u64,
    /// Wall time of the last split/merge/compact (microseconds).
    pub last_maintenance_us: u64,
    /// How long the last split/merge/compact held the datastore lock at its end
    /// (microseconds): writers wait this long.
    pub last_lock_hold_us: u64,
    /// Longest such lock hold since open (microseconds).
    pub max_lock_hold_us: u64,
    /// What the last lock hold spent its time on (phases and the holding thread's CPU,
    /// run-queue and blocked time).
    pub last_lock_phases: LockPhases,
    /// Automatic compactions that failed (the store keeps its old log).
    pub auto_compact_errors: u64,
    /// Writes that were slowed down because garbage passed `stall_garbage_ratio`.
    pub write_stalls: u64,
    /// Estimated bytes of expired puts and of delete records at or below the tombstone
    /// watermark: not garbage (each is its key's latest record), but a full compaction drops
    /// them, and they count toward the automatic compaction thresholds. An estimate: see
    /// docs/FORMAT.md §7.4.
    pub reclaimable_bytes: u64,
}
