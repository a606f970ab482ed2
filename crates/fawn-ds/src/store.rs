//! `DataStore`: appends, lookups, deletes, group commit, incremental index growth.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

use crate::error::Error;
use crate::index::{Candidate, GrowthWork, Index, KeyHash, Loc};
use crate::iter::Iter;
use crate::limits::{
    COLD_UNITS_BIT, DATASTORE_BYTES_MAX, KEY_BYTES_MAX, LOG_HEADER_BYTES, OFFSET_UNIT, RECORD_HEADER_BYTES,
    VALUE_BYTES_MAX,
};
use crate::log::{LogFile, Scanner};
use crate::reclaim::Reclaim;
use crate::record::{self, Header};
use crate::{Entry, Meta, Options, RecordKind, RecoveryReport, Stats, SyncPolicy};

/// A lookup's first `pread` stays inside the 4 KiB page holding the record start (a second
/// device page is only read when the record itself crosses into it), and reads as many bytes
/// as the last record a lookup read had (the guess; records of one store tend to be of one
/// size), between these bounds: one `pread` for records up to 2 KiB that fit the page...
const LOOKUP_READ_MAX: usize = 2048;
/// ...unless fewer than this many bytes are left in the page: then the record almost surely
/// crosses the boundary and the read continues into the next page (never with
/// `page_aligned_records`: no record crosses).
const LOOKUP_READ_MIN: usize = 256;
/// The first guess.
const LOOKUP_READ_GUESS: usize = 1024;
const PAGE: u64 = 4096;
/// The largest first read of a lookup (a stack buffer: no allocation but the value's).
const LOOKUP_STACK_BYTES: usize = LOOKUP_READ_MIN + LOOKUP_READ_MAX;

thread_local! {
    /// Reused candidate list of this thread's index probes.
    static CANDIDATES: std::cell::RefCell<Vec<Candidate>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A thread's candidate list, handed back to it for reuse when dropped.
struct Candidates(Vec<Candidate>);

impl std::ops::Deref for Candidates {
    type Target = [Candidate];
    fn deref(&self) -> &[Candidate] {
        &self.0
    }
}

impl IntoIterator for Candidates {
    type Item = Candidate;
    type IntoIter = CandidatesIter;
    fn into_iter(self) -> CandidatesIter {
        CandidatesIter { list: self, next: 0 }
    }
}

/// By-value iteration over a `Candidates` list (which still goes back to the pool).
struct CandidatesIter {
    list: Candidates,
    next: usize,
}

impl Iterator for CandidatesIter {
    type Item = Candidate;
    fn next(&mut self) -> Option<Candidate> {
        let c = self.list.0.get(self.next).copied();
        self.next += 1;
        c
    }
}

impl Drop for Candidates {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        // A candidate list is tiny; keep no big one around after a pathological probe.
        if v.capacity() <= 64 {
            let _ = CANDIDATES.try_with(|c| *c.borrow_mut() = v);
        }
    }
}
/// Log bytes one background growth step scans (the scanner reads 1 MiB at a time).
const GROWTH_SCAN_BYTES: u64 = 1 << 20;
/// Scanned records whose old-table entries one index-lock hold moves (tens of µs).
const GROWTH_APPLY_RECORDS: usize = 512;
/// New keys of a batch one index-lock hold inserts (`Inner::apply_batch`): a few µs of
/// lookups waiting at most (each insert costs ~0.1–0.3 µs, mostly cache misses), while the
/// lock's own cost is shared by many records.
const APPLY_RUN_RECORDS: usize = 64;
/// Automatic checkpoints are at least this many times the last checkpoint's size apart
/// (in log bytes appended), so checkpoint writes stay under ~1/32 of the log writes.
const CHECKPOINT_SPACING: u64 = 32;
/// Bytes enough for any header + key (key comparisons on the write path).
const KEY_READ_BYTES: usize = RECORD_HEADER_BYTES + KEY_BYTES_MAX;
/// First read of a key: header + keys up to 32 bytes (one cache line of key) in one go.
const KEY_READ_FIRST: usize = RECORD_HEADER_BYTES + 32;

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
    pub last_lock_phases: Mutex<crate::maint::LockPhases>,
    /// Automatic compactions that failed.
    pub auto_compact_errors: AtomicU64,
    pub write_stalls: AtomicU64,
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
    pub dir: PathBuf,
    pub opts: Options,
    pub log: Arc<LogFile>,
    /// Random id written in the log header; a checkpoint is only valid for the same log.
    pub nonce: u64,
    /// The cold log, if this store separates hot and cold records (`Options::hot_cold`).
    pub cold: Option<ColdLog>,
    /// Bytes of live records in the cold log (`live_bytes` counts the hot log's).
    pub cold_live_bytes: AtomicU64,
    pub index: RwLock<Index>,
    pub writer: Mutex<WriterState>,
    /// End of the fully appended records (readers and iterators stop here).
    pub written_end: AtomicU64,
    /// End of the records whose index update is done too (trails `written_end` briefly):
    /// maintenance scans stop here, so every record they judge is already in the index.
    pub applied_end: AtomicU64,
    pub max_seq: AtomicU64,
    /// Bytes of records that are live: the current put of every key, and delete records.
    pub live_bytes: AtomicU64,
    /// Log bytes known durable (mirror of `SyncState::synced`, readable without the lock);
    /// stamped into every record for recovery.
    pub durable: AtomicU64,
    pub poisoned: AtomicBool,
    /// This state's log was renamed into place by maintenance and the directory entry may
    /// not be durable yet: `sync_to` syncs the directory before it reports anything durable
    /// (see `maint::finish`, which clears it after its own directory sync).
    pub dir_sync_pending: AtomicBool,
    /// Expiring puts and delete records by when a full compaction may drop them.
    pub reclaim: Mutex<Reclaim>,
    sync: Mutex<SyncState>,
    sync_cv: Condvar,
    /// Serializes checkpoints; holds the log end the last one covered.
    pub ckpt: Mutex<u64>,
    pub counters: Arc<Counters>,
    /// The background index migrator (see `start_migrator`).
    migrator: Mutex<Migrator>,
    /// The growth scan's turn (one scanner at a time) and its scanner, kept between steps
    /// of one range so each log byte is read once: (migration, cold log?, scanner).
    growth: Mutex<Option<(u64, bool, Scanner)>>,
    /// A weak handle on ourselves, for spawning the migrator (set once by `DataStore::open`).
    pub this: std::sync::OnceLock<std::sync::Weak<Inner>>,
    /// The flock'ed lock file; closing it releases the directory. Shared with the `Inner`
    /// that replaces this one after maintenance.
    pub lock: Arc<File>,
    /// Bytes of the last checkpoint file written (spaces automatic checkpoints).
    pub ckpt_image_bytes: AtomicU64,
    /// Records are kept inside 4 KiB pages (`page_aligned_records`, on a log that allows it).
    pads: bool,
    /// Size of the last record a lookup read: the next lookup's first read (one `pread`
    /// for a record of the usual size).
    read_guess: AtomicUsize,
}

/// A datastore: one directory holding the log, the index checkpoint and a lock file.
/// `Send + Sync`: share it as `Arc<DataStore>`.
#[derive(Debug)]
pub struct DataStore {
    shared: Arc<Shared>,
    report: RecoveryReport,
    background: Option<Background>,
}

/// A helper thread with a stop flag.
#[derive(Debug)]
pub(crate) struct Background {
    pub stop: Arc<(Mutex<bool>, Condvar)>,
    pub handle: Option<JoinHandle<()>>,
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
            read_guess: AtomicUsize::new(LOOKUP_READ_GUESS),
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

    /// The index entries whose fragment matches (in a per-thread reused buffer: no
    /// allocation per lookup).
    fn candidates(&self, kh: KeyHash) -> Candidates {
        let mut out = CANDIDATES.try_with(|c| std::mem::take(&mut *c.borrow_mut())).unwrap_or_default();
        out.clear();
        self.index.read().find(kh, &mut out);
        Candidates(out)
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

    /// Read header + key of the record an index entry points at (offset units with the cold
    /// bit; no checksum: the value is not read)
    /// into `buf`: one short `pread` for the usual short key (writes compare keys behind
    /// fragment matches), a second one only for a long key.
    fn read_key_buf<'b>(
        &self,
        units: u32,
        buf: &'b mut [u8; KEY_READ_BYTES],
    ) -> Result<(Header, &'b [u8]), Error> {
        let (log, offset) = self.locate(units)?;
        let n = log.read_at(&mut buf[..KEY_READ_FIRST], offset)?;
        let header = record::parse_header(&buf[..n], offset)?;
        let want = RECORD_HEADER_BYTES + header.key_len;
        let mut have = n;
        if want > n && n == KEY_READ_FIRST {
            have += log.read_at(&mut buf[n..want], offset + n as u64)?;
        }
        if want > have {
            return Err(Error::corrupt(offset, "record truncated"));
        }
        Ok((header, record::key_of(&buf[..], &header)))
    }

    /// Read and fully check the record an index entry points at (offset units with the cold
    /// bit) with one `pread` into `stack` when it fits (a small record), else a second read
    /// of the rest into `heap`.
    fn read_record_buf<'b>(
        &self,
        units: u32,
        stack: &'b mut [u8; LOOKUP_STACK_BYTES],
        heap: &'b mut Vec<u8>,
    ) -> Result<(Header, &'b [u8]), Error> {
        let (log, offset) = self.locate(units)?;
        let in_page = (PAGE - offset % PAGE) as usize;
        let guess = self.read_guess.load(Ordering::Relaxed).clamp(LOOKUP_READ_MIN, LOOKUP_READ_MAX);
        // Padding is an optimisation only: a log may hold unpadded stretches (written before
        // the option was set), so a short first read is always followed up if needed.
        let first = if in_page >= LOOKUP_READ_MIN {
            in_page.min(guess)
        } else if self.pads && in_page >= RECORD_HEADER_BYTES + OFFSET_UNIT as usize {
            in_page
        } else {
            in_page + guess
        };
        let n = log.read_at(&mut stack[..first], offset)?;
        let header = record::parse_header(&stack[..n], offset)?;
        let total = header.total_len();
        if total != guess && (LOOKUP_READ_MIN..=LOOKUP_READ_MAX).contains(&total) {
            self.read_guess.store(total, Ordering::Relaxed);
        }
        let buf: &[u8] = if total <= n {
            &stack[..total]
        } else {
            heap.clear();
            heap.extend_from_slice(&stack[..n]);
            heap.resize(total, 0);
            let more = log.read_at(&mut heap[n..], offset + n as u64)?;
            if n + more < total {
                return Err(Error::corrupt(offset, "record truncated"));
            }
            &heap[..total]
        };
        record::verify(buf, offset, &header)?;
        Ok((header, buf))
    }

    /// The index location of `key`, if present. Caller holds the writer lock, so the
    /// locations stay valid until it updates the index.
    /// Also returns the byte length of the record it points at and whether it is in the
    /// cold log (live-bytes accounting).
    pub fn find_existing(&self, kh: KeyHash, key: &[u8]) -> Result<Option<Existing>, Error> {
        self.find_existing_ahead(kh, key, None)
    }

    /// `find_existing`, also prefetching the index buckets of `ahead` (a later record of a
    /// batch) while the index lock is held.
    fn find_existing_ahead(
        &self,
        kh: KeyHash,
        key: &[u8],
        ahead: Option<KeyHash>,
    ) -> Result<Option<Existing>, Error> {
        let candidates = {
            let mut out = CANDIDATES.try_with(|c| std::mem::take(&mut *c.borrow_mut())).unwrap_or_default();
            out.clear();
            let idx = self.index.read();
            idx.find(kh, &mut out);
            if let Some(a) = ahead {
                idx.prefetch(a);
            }
            Candidates(out)
        };
        for c in candidates {
            let mut buf = [0u8; KEY_READ_BYTES];
            match self.read_key_buf(c.units, &mut buf) {
                Ok((header, stored)) => {
                    if stored == key {
                        return Ok(Some((c.loc, header.total_len() as u64, c.units & COLD_UNITS_BIT != 0)));
                    }
                }
                // A damaged record (its header fails the checks): its key cannot be compared,
                // so its entry is not taken for this key and the write goes ahead (the entry
                // may belong to any key whose buckets and fragment it matches; failing here
                // would refuse writes of all of them, and poison the store in a batch). If
                // it was this key's, the key now has a readable entry too, which lookups
                // prefer; the damaged entry stays, so the damage is still reported once the
                // key is deleted.
                Err(Error::Corrupt { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Whether the index points at the record at `units` (offset units, with the cold bit
    /// for the cold log) for this key hash: the record there is the key's live version. No
    /// log read (an index entry holding exactly this position can only belong to the key
    /// stored there).
    pub fn is_live_at(&self, kh: KeyHash, units: u32) -> bool {
        self.candidates(kh).iter().any(|c| c.units == units)
    }

    pub fn lookup(&self, key: &[u8]) -> Result<Option<Entry>, Error> {
        self.check_key(key)?;
        let kh = KeyHash::of(key);
        self.counters.lookups.fetch_add(1, Ordering::Relaxed);
        let mut stack = [0u8; LOOKUP_STACK_BYTES];
        let mut heap = Vec::new();
        // A candidate whose record fails its checks may be this key's (then the damage is
        // the answer) or another key's; a readable record of this key among the others is
        // its live version (writes insert one past an unreadable entry, see
        // `find_existing_ahead`), so the error is returned only when none is found.
        let mut damaged = None;
        for c in self.candidates(kh) {
            let (header, buf) = match self.read_record_buf(c.units, &mut stack, &mut heap) {
                Ok(r) => r,
                Err(e @ Error::Corrupt { .. }) => {
                    damaged.get_or_insert(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if record::key_of(buf, &header) != key {
                self.counters.extra_reads.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if header.kind != RecordKind::Put {
                let (_, offset) = self.locate(c.units)?;
                return Err(Error::corrupt(offset, "index points at a delete record"));
            }
            return Ok(Some(Entry { value: record::value_of(buf, &header).to_vec(), meta: header.meta }));
        }
        match damaged {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// Append one record and update the index; returns the new log end.
    pub fn write(&self, kind: RecordKind, key: &[u8], value: &[u8], meta: Meta) -> Result<u64, Error> {
        self.check_key(key)?;
        self.check_value(value)?;
        self.check_writable()?;
        let buf = record::encode(kind, key, value, meta, self.durable.load(Ordering::Acquire))?;
        let kh = KeyHash::of(key);
        let mut w = self.writer.lock();
        self.check_writable()?;
        let start = w.end;
        let pad = self.padding_before(start, buf.len());
        let offset = start + pad as u64;
        let new_end = offset + buf.len() as u64;
        if new_end > DATASTORE_BYTES_MAX {
            return Err(Error::StoreFull);
        }
        let existing = self.find_existing(kh, key)?;
        if pad > 0 {
            let mut padded = Vec::with_capacity(pad + buf.len());
            record::encode_pad(&mut padded, pad)?;
            padded.extend_from_slice(&buf);
            self.append(&mut w, start, &padded)?;
        } else {
            self.append(&mut w, start, &buf)?;
        }
        self.counters.appended_bytes.fetch_add(new_end - start, Ordering::Relaxed);
        let growth = self.apply(kind, &meta, kh, existing, (offset / OFFSET_UNIT) as u32, buf.len() as u64);
        self.applied_end.store(new_end, Ordering::Release);
        self.max_seq.fetch_max(meta.seq, Ordering::AcqRel);
        drop(w);
        self.after_apply(growth);
        Ok(new_end)
    }

    /// Append a batch: every record checked and encoded into one buffer, one `pwrite`,
    /// then the index updated record by record in order (after the bytes are written, so a
    /// reader never finds an entry whose record is not there). Returns the new log end.
    /// Nothing is written when any op is invalid.
    pub fn write_batch(&self, ops: &[BatchOp<'_>]) -> Result<u64, Error> {
        for op in ops {
            self.check_key(op.key)?;
            self.check_value(op.value)?;
        }
        self.check_writable()?;
        let hashes: Vec<KeyHash> = ops.iter().map(|op| KeyHash::of(op.key)).collect();
        let bytes: usize = ops.iter().map(|op| record_len(op.key, op.value)).sum();
        let mut buf = Vec::with_capacity(bytes);
        let mut offsets = Vec::with_capacity(ops.len());
        let mut w = self.writer.lock();
        self.check_writable()?;
        let base = w.end;
        let durable = self.durable.load(Ordering::Acquire);
        // Encode three records, fill in their checksums together, check each as
        // `record::encode_into` does (while they are in the CPU cache); all before anything
        // is written.
        let mut sealing = Vec::with_capacity(3);
        for group in ops.chunks(3) {
            sealing.clear();
            for op in group {
                let pad = self.padding_before(base + buf.len() as u64, record_len(op.key, op.value));
                if pad > 0 {
                    record::encode_pad(&mut buf, pad)?;
                }
                offsets.push(base + buf.len() as u64);
                sealing.push((buf.len(), record::body_len(op.key, op.value)));
                record::encode_unsealed(&mut buf, op.kind, op.key, op.value, op.meta, durable);
            }
            record::seal_records(&mut buf, &sealing);
            for (op, &(start, _)) in group.iter().zip(&sealing) {
                record::check_encoded(&buf[start..], op.kind, op.key, op.value, op.meta, durable)?;
            }
        }
        let new_end = base + buf.len() as u64;
        if new_end > DATASTORE_BYTES_MAX {
            return Err(Error::StoreFull);
        }
        if buf.is_empty() {
            return Ok(base);
        }
        self.append(&mut w, base, &buf)?;
        self.counters.appended_bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        let max_seq = ops.iter().map(|op| op.meta.seq).max().unwrap_or(0);
        let growth = match self.apply_batch(ops, &hashes, &offsets, false) {
            Ok(g) => g,
            Err(e) => {
                // The log holds records the index does not: only a reopen (replay) can make
                // them agree again.
                self.poisoned.store(true, Ordering::Release);
                return Err(e);
            }
        };
        self.applied_end.store(new_end, Ordering::Release);
        self.max_seq.fetch_max(max_seq, Ordering::AcqRel);
        drop(w);
        self.after_apply(growth);
        Ok(new_end)
    }

    /// Point the index at the records of a batch just appended, or replayed at open (at
    /// `offsets` in the hot log, or with `cold` in the cold log), in order, as `apply` one
    /// by one would. A record whose fragment matches no index entry (a new key, almost every
    /// record of a bulk load or of a rebuild) needs no log read: such records are applied in
    /// runs under one index lock hold of at most `APPLY_RUN_RECORDS`, each found and
    /// inserted in one probe, instead of a read-lock probe plus a write-lock insert per
    /// record. A record with a fragment match goes through `find_existing` (its log read
    /// happens without the index lock) and `apply`.
    pub(crate) fn apply_batch<R: AppliedRecord>(
        &self,
        ops: &[R],
        hashes: &[KeyHash],
        offsets: &[u64],
        cold: bool,
    ) -> Result<Growth, Error> {
        let cold_bit = if cold { COLD_UNITS_BIT } else { 0 };
        let mut growth = Growth::default();
        let mut found = Vec::new();
        let mut i = 0;
        while i < ops.len() {
            let run_start = i;
            let mut live = 0u64;
            let mut matched = false;
            {
                let mut idx = self.index.write();
                let stop = (i + APPLY_RUN_RECORDS).min(ops.len());
                while i < stop {
                    if let Some(&ahead) = hashes.get(i + crate::index::PREFETCH_AHEAD) {
                        idx.prefetch(ahead);
                    }
                    let kh = hashes[i];
                    found.clear();
                    idx.find(kh, &mut found);
                    if !found.is_empty() {
                        matched = true;
                        break;
                    }
                    let len = ops[i].len();
                    // Delete of an absent key: no index change; the record counts as live.
                    if ops[i].kind() == RecordKind::Put {
                        let units = (offsets[i] / OFFSET_UNIT) as u32 | cold_bit;
                        let started = idx.insert(kh, units, self.insert_limits(cold, offsets[i] + len));
                        growth.started |= started;
                    }
                    growth.behind = idx.owe(1);
                    live += len;
                    i += 1;
                }
            }
            self.live_counter(cold).fetch_add(live, Ordering::AcqRel);
            for op in &ops[run_start..i] {
                if Reclaim::concerns(op.kind(), op.meta()) {
                    self.reclaim.lock().note(op.kind(), op.meta(), op.len());
                }
            }
            if matched {
                // After the append: an earlier op of this batch on the same key is found too.
                let op = &ops[i];
                let ahead = hashes.get(i + crate::index::PREFETCH_AHEAD).copied();
                let existing = self.find_existing_ahead(hashes[i], op.key(), ahead)?;
                let units = (offsets[i] / OFFSET_UNIT) as u32 | cold_bit;
                let g = self.apply(op.kind(), op.meta(), hashes[i], existing, units, op.len());
                growth = Growth { started: growth.started || g.started, behind: g.behind };
                i += 1;
            }
        }
        Ok(growth)
    }

    /// Bytes of padding to write at `at` before a record of `len` bytes so that it does not
    /// cross a 4 KiB boundary (0 unless `page_aligned_records` applies to this log).
    fn padding_before(&self, at: u64, len: usize) -> usize {
        if !self.pads || len as u64 > PAGE {
            return 0;
        }
        let in_page = PAGE - at % PAGE;
        if len as u64 <= in_page {
            0
        } else {
            in_page as usize
        }
    }

    /// Point the index at a record of `len` bytes just appended (or replayed) at `units`
    /// (offset units, with the cold bit for the cold log).
    /// Live bytes: a put's record is live until superseded; a delete record counts as
    /// live (it is kept until the tombstone watermark passes it).
    /// Returns what index growth asks of the caller (`after_apply`).
    pub fn apply(
        &self,
        kind: RecordKind,
        meta: &Meta,
        kh: KeyHash,
        existing: Option<Existing>,
        units: u32,
        len: u64,
    ) -> Growth {
        if Reclaim::concerns(kind, meta) {
            self.reclaim.lock().note(kind, meta, len);
        }
        let cold = units & COLD_UNITS_BIT != 0;
        self.live_counter(cold).fetch_add(len, Ordering::AcqRel);
        if let Some((_, old_len, old_cold)) = existing {
            // Saturating: a checkpoint/replay mismatch must never wrap the counter.
            let _ = self
                .live_counter(old_cold)
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(old_len)));
        }
        let existing = existing.map(|(loc, _, _)| loc);
        let mut idx = self.index.write();
        let started = match (kind, existing) {
            (RecordKind::Put, Some(loc)) => {
                idx.update(loc, kh, units);
                false
            }
            (RecordKind::Put, None) => {
                let end = (units & !COLD_UNITS_BIT) as u64 * OFFSET_UNIT + len;
                idx.insert(kh, units, self.insert_limits(cold, end))
            }
            (RecordKind::Delete, Some(loc)) => {
                idx.remove(loc, kh);
                false
            }
            (RecordKind::Delete, None) => false,
        };
        Growth { started, behind: idx.owe(1) }
    }

    /// Growth work after records were applied (no lock held): start the background migrator
    /// when growth started, and scan here when the scan fell behind the writes' share (the
    /// migrator starved), which bounds how many writes a migration can last.
    pub(crate) fn after_apply(&self, g: Growth) {
        if g.started || g.behind > 0 {
            self.start_migrator();
        }
        if g.behind > 0 {
            self.growth_step(g.behind, false);
        }
    }

    /// Bytes of padding before a record of `len` bytes at `at` in the cold log, as
    /// `padding_before` for the hot log (cold logs are always created as version 2).
    pub(crate) fn cold_padding_before(&self, at: u64, len: usize) -> usize {
        if !self.opts.page_aligned_records || len as u64 > PAGE {
            return 0;
        }
        let in_page = PAGE - at % PAGE;
        if len as u64 <= in_page {
            0
        } else {
            in_page as usize
        }
    }

    /// Append records to the cold log of a state that maintenance is building (before it is
    /// published, so no other thread writes to it), with one write, and point the index at
    /// them in order.
    pub fn write_cold_batch(&self, ops: &[BatchOp<'_>]) -> Result<(), Error> {
        let Some(cold) = &self.cold else {
            return Err(Error::InvalidRequest("this state has no cold log".into()));
        };
        let w = self.writer.lock();
        let base = cold.end.load(Ordering::Acquire);
        let mut buf = Vec::with_capacity(ops.iter().map(|op| record_len(op.key, op.value)).sum());
        let mut offsets = Vec::with_capacity(ops.len());
        for op in ops {
            let pad = self.cold_padding_before(base + buf.len() as u64, record_len(op.key, op.value));
            if pad > 0 {
                record::encode_pad(&mut buf, pad)?;
            }
            offsets.push(base + buf.len() as u64);
            // The cold log is fsynced as a whole before it is committed; the stamp is unused.
            record::encode_into(&mut buf, op.kind, op.key, op.value, op.meta, LOG_HEADER_BYTES)?;
        }
        let len = buf.len() as u64;
        if base + len > DATASTORE_BYTES_MAX {
            return Err(Error::StoreFull);
        }
        cold.log.write_all_at(&buf, base).map_err(|e| Error::io("appending to the cold log", e))?;
        cold.end.store(base + len, Ordering::Release);
        self.counters.appended_bytes.fetch_add(len, Ordering::Relaxed);
        let mut growth = Growth::default();
        for (op, &offset) in ops.iter().zip(&offsets) {
            let kh = KeyHash::of(op.key);
            // After the write: an earlier op of this batch on the same key is found too.
            let existing = self.find_existing(kh, op.key)?;
            let units = (offset / OFFSET_UNIT) as u32 | COLD_UNITS_BIT;
            let g = self.apply(op.kind, &op.meta, kh, existing, units, record_len(op.key, op.value) as u64);
            growth = Growth { started: growth.started || g.started, behind: g.behind };
            self.max_seq.fetch_max(op.meta.seq, Ordering::AcqRel);
        }
        drop(w);
        self.after_apply(growth);
        Ok(())
    }

    /// Write `buf` at the log end. On failure the partial record is cut off again; if that
    /// is impossible, or the failure was not ENOSPC, the store is poisoned.
    fn append(&self, w: &mut MutexGuard<'_, WriterState>, offset: u64, buf: &[u8]) -> Result<(), Error> {
        match self.log.write_all_at(buf, offset) {
            Ok(()) => {
                w.end = offset + buf.len() as u64;
                self.written_end.store(w.end, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                let nospace = e.raw_os_error() == Some(libc::ENOSPC);
                if self.log.set_len(offset).is_err() || !nospace {
                    self.poisoned.store(true, Ordering::Release);
                }
                Err(Error::io("appending a record", e))
            }
        }
    }

    /// One bounded step of index growth: scan up to `budget` bytes of a log sequentially
    /// (from where the last step stopped) and refresh the index entry of every put record
    /// read (give it the hash bit its bucket's next split needs, from the record's key): no
    /// random log read. Refreshes happen under the index write lock, `GROWTH_APPLY_RECORDS`
    /// records per hold; the writer lock is not needed (a writer re-finds an entry that moved
    /// under it). With `wait` false, returns at once when another thread is scanning.
    /// Returns whether a refresh scan was running.
    pub fn growth_step(&self, budget: u64, wait: bool) -> bool {
        let mut turn = if wait {
            self.growth.lock()
        } else {
            match self.growth.try_lock() {
                Some(t) => t,
                None => return true,
            }
        };
        let mut left = budget.max(1);
        loop {
            // (A separate statement: the read guard must not live through the match.)
            let work = self.index.read().growth_work();
            let job = match work {
                GrowthWork::Idle => {
                    *turn = None;
                    return false;
                }
                GrowthWork::Finish => {
                    *turn = None;
                    let mut idx = self.index.write();
                    let start = Instant::now();
                    let unplaced = idx.finish_migration();
                    drop(idx);
                    self.note_growth_hold(start);
                    self.counters.growth_unplaced.fetch_add(unplaced, Ordering::Relaxed);
                    return true;
                }
                GrowthWork::Scan(job) => job,
            };
            let scanned = self.scan_for_growth(&mut turn, &job, left);
            // The range is done and budget is left: go on (the other log, or finish).
            match left.checked_sub(scanned) {
                Some(rest) if rest > 0 && turn.as_ref().is_some_and(|t| t.2.pos >= job.limit) => left = rest,
                _ => return true,
            }
        }
    }

    /// Scan up to `budget` bytes of `job`'s range; returns the bytes scanned.
    fn scan_for_growth(
        &self,
        turn: &mut Option<(u64, bool, Scanner)>,
        job: &crate::index::ScanJob,
        budget: u64,
    ) -> u64 {
        let log = match (job.cold, &self.cold) {
            (false, _) => Arc::clone(&self.log),
            (true, Some(c)) => Arc::clone(&c.log),
            // Cold entries without a cold log cannot be placed by a scan: finish stashes them.
            (true, None) => {
                self.index.write().apply_scan(job, job.limit, &[]);
                *turn = None;
                return 0;
            }
        };
        // The scanner of the last step continues if it stopped exactly here (its buffer
        // holds what follows).
        let mut sc = match turn.take() {
            Some((gen, cold, sc)) if gen == job.gen && cold == job.cold && sc.pos == job.pos => sc,
            _ => Scanner::new(log, job.pos, job.limit),
        };
        let cold_bit = if job.cold { COLD_UNITS_BIT } else { 0 };
        let stop = job.pos.saturating_add(budget).min(job.limit);
        let mut found = Vec::with_capacity(GROWTH_APPLY_RECORDS);
        loop {
            let last = match sc.next_record() {
                Ok(Some((offset, header, bytes))) => {
                    if header.kind == RecordKind::Put {
                        let kh = KeyHash::of(record::key_of(bytes, &header));
                        found.push((kh, (offset / OFFSET_UNIT) as u32 | cold_bit));
                    }
                    sc.pos >= stop
                }
                Ok(None) => true,
                // A damaged record (bit rot in a checkpointed region is not seen at open):
                // step over it and resynchronise at the next offset unit, as recovery does,
                // so only an entry pointing at the bad record itself stays stale (stashed
                // when the scan ends). A stray match inside garbage cannot refresh an
                // entry: entries sit exactly at real record starts.
                Err(Error::Corrupt { .. }) => {
                    sc.pos += OFFSET_UNIT;
                    sc.pos >= stop
                }
                // The log cannot be read (I/O error): this log's scan ends here; entries
                // pointing into the rest stay stale and are stashed at the end.
                Err(_) => {
                    sc.pos = job.limit;
                    true
                }
            };
            if last || found.len() >= GROWTH_APPLY_RECORDS {
                let mut idx = self.index.write();
                let start = Instant::now();
                idx.apply_scan(job, sc.pos, &found);
                drop(idx);
                self.note_growth_hold(start);
                found.clear();
            }
            if last {
                break;
            }
        }
        let scanned = sc.pos - job.pos;
        self.counters.growth_scan_bytes.fetch_add(scanned, Ordering::Relaxed);
        *turn = Some((job.gen, job.cold, sc));
        scanned
    }

    /// Record how long a growth step held the index lock (the longest pause it caused).
    fn note_growth_hold(&self, start: Instant) {
        let us = start.elapsed().as_micros() as u64;
        self.counters.growth_step_max_us.fetch_max(us.max(1), Ordering::Relaxed);
    }

    /// While a refresh scan runs, a background thread does it (on the other core than the
    /// writer), so that it proceeds without slowing writes and also finishes when writes
    /// stop: the index cannot finish its current level of splits before it.
    /// Writes scan too when the scan falls behind their share (`after_apply`), which bounds
    /// the migration even if this thread is starved.
    pub(crate) fn start_migrator(&self) {
        let mut m = self.migrator.lock();
        let running = m.handle.as_ref().is_some_and(|h| !h.is_finished());
        if running
            || !self.opts.background_growth
            || m.stop.load(Ordering::Acquire)
            || !self.index.read().is_migrating()
        {
            return;
        }
        let Some(weak) = self.this.get().cloned() else { return };
        let stop = Arc::clone(&m.stop);
        let spawned = std::thread::Builder::new().name("fawn-ds-migrate".into()).spawn(move || loop {
            let Some(inner) = weak.upgrade() else { return };
            if stop.load(Ordering::Acquire) {
                return;
            }
            if !inner.growth_step(GROWTH_SCAN_BYTES, true) {
                return;
            }
            drop(inner);
        });
        // Without a thread, write-driven steps still complete the migration.
        m.handle = spawned.ok();
    }

    /// Allow helper threads again after `stop_migrator` (a maintenance that failed before
    /// its swap hands the store back).
    pub(crate) fn resume_helpers(&self) {
        self.migrator.lock().stop = Arc::new(AtomicBool::new(false));
        self.start_migrator();
    }

    /// Stop and join the helper threads (before the lock file is released).
    pub(crate) fn stop_migrator(&self) {
        let (migrator, checkpointer) = {
            let mut m = self.migrator.lock();
            m.stop.store(true, Ordering::Release);
            (m.handle.take(), m.checkpointer.take())
        };
        for h in [migrator, checkpointer].into_iter().flatten() {
            let _ = h.join();
        }
    }

    /// Make the log durable at least up to `target`. Group commit: one thread (the leader)
    /// runs `fdatasync` covering everything appended so far; others wait for it.
    pub fn sync_to(&self, target: u64) -> Result<(), Error> {
        if self.dir_sync_pending.load(Ordering::Acquire) {
            self.check_writable()?;
            if let Err(e) = crate::maint::sync_dir(&self.dir) {
                self.poisoned.store(true, Ordering::Release);
                return Err(e);
            }
            self.dir_sync_pending.store(false, Ordering::Release);
        }
        let mut s = self.sync.lock();
        loop {
            self.check_writable()?;
            if s.synced >= target {
                return Ok(());
            }
            if s.leader {
                self.sync_cv.wait(&mut s);
                continue;
            }
            s.leader = true;
            let upto = self.written_end.load(Ordering::Acquire);
            let result = MutexGuard::unlocked(&mut s, || self.log.sync_data());
            self.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
            s.leader = false;
            self.sync_cv.notify_all();
            if let Err(e) = result {
                // The kernel may have dropped the dirty pages: we cannot know what is durable.
                self.poisoned.store(true, Ordering::Release);
                return Err(Error::io("syncing the log", e));
            }
            s.synced = s.synced.max(upto);
            self.durable.fetch_max(s.synced, Ordering::AcqRel);
        }
    }

    pub(crate) fn synced(&self) -> u64 {
        self.sync.lock().synced
    }

    /// Work after a write returned from the writer lock: durability, auto checkpoint.
    pub(crate) fn after_write(&self, end: u64) -> Result<(), Error> {
        if self.opts.sync == SyncPolicy::Always {
            self.sync_to(end)?;
        }
        // Also at least CHECKPOINT_SPACING × the last image: at millions of keys a fixed
        // interval would write more checkpoint bytes than log bytes.
        let every = match self.opts.checkpoint_every_bytes {
            0 => 0,
            n => n.max(self.ckpt_image_bytes.load(Ordering::Relaxed).saturating_mul(CHECKPOINT_SPACING)),
        };
        // try_lock: a writer never waits behind a checkpoint another thread is writing.
        let last = self.ckpt.try_lock().map(|g| *g);
        if every > 0 && last.is_some_and(|last| end.saturating_sub(last) >= every) {
            self.start_auto_checkpoint();
        }
        Ok(())
    }

    /// Write an automatic checkpoint on a helper thread: at millions of keys it takes a
    /// good fraction of a second, which no writer should wait for.
    pub(crate) fn start_auto_checkpoint(&self) {
        let mut m = self.migrator.lock();
        let busy = m.checkpointer.as_ref().is_some_and(|h| !h.is_finished());
        if busy || m.stop.load(Ordering::Acquire) {
            return;
        }
        let Some(weak) = self.this.get().cloned() else { return };
        let spawned = std::thread::Builder::new().name("fawn-ds-checkpoint".into()).spawn(move || {
            if let Some(inner) = weak.upgrade() {
                if crate::checkpoint::write(&inner).is_err() {
                    inner.counters.checkpoint_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        match spawned {
            Ok(h) => m.checkpointer = Some(h),
            Err(_) => {
                self.counters.checkpoint_errors.fetch_add(1, Ordering::Relaxed);
            }
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
        record_len(self.key, self.value) as u64
    }
}

/// An index entry found for a key: its location, the byte length of the record it points
/// at, and whether that record is in the cold log.
pub(crate) type Existing = (Loc, u64, bool);

/// Bytes of the record holding `key` and `value` (header + key + value, padded).
fn record_len(key: &[u8], value: &[u8]) -> usize {
    crate::limits::pad_to_unit(RECORD_HEADER_BYTES + key.len() + value.len())
}

/// One write of a batch (`DataStore::write_batch`).
#[derive(Clone, Copy, Debug)]
pub struct BatchOp<'a> {
    kind: RecordKind,
    key: &'a [u8],
    value: &'a [u8],
    meta: Meta,
}

impl<'a> BatchOp<'a> {
    /// Store `value` under `key`, as `DataStore::store`.
    pub fn put(key: &'a [u8], value: &'a [u8], meta: Meta) -> BatchOp<'a> {
        BatchOp { kind: RecordKind::Put, key, value, meta }
    }

    /// Delete `key` (a tombstone), as `DataStore::delete`.
    pub fn delete(key: &'a [u8], meta: Meta) -> BatchOp<'a> {
        BatchOp { kind: RecordKind::Delete, key, value: &[], meta }
    }
}

/// The interval sync thread: wakes every `every`, syncs the current log if it has
/// unsynced appends.
fn spawn_interval_sync(shared: &Arc<Shared>, every: Duration) -> Result<Background, Error> {
    Background::spawn_periodic(shared, "fawn-ds-sync", every.max(Duration::from_millis(1)), |shared| {
        let inner = shared.current();
        let end = inner.written_end.load(Ordering::Acquire);
        if end > inner.synced() && !inner.poisoned.load(Ordering::Acquire) {
            // A failure poisons the store; writers see it on their next call.
            let _ = inner.sync_to(end);
        }
    })
    .map_err(|e| Error::io("starting the sync thread", e))
}

impl Background {
    /// A named thread that runs `tick` every `every` until shut down or until the store is
    /// dropped (it holds only a weak reference, so it never keeps a closed store alive).
    pub(crate) fn spawn_periodic(
        shared: &Arc<Shared>,
        name: &str,
        every: Duration,
        tick: impl Fn(&Shared) + Send + 'static,
    ) -> std::io::Result<Background> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stop2 = Arc::clone(&stop);
        let weak = Arc::downgrade(shared);
        let handle = std::thread::Builder::new().name(name.into()).spawn(move || loop {
            {
                let mut stopped = stop2.0.lock();
                if !*stopped {
                    stop2.1.wait_for(&mut stopped, every);
                }
                if *stopped {
                    return;
                }
            }
            let Some(shared) = weak.upgrade() else { return };
            tick(&shared);
        })?;
        Ok(Background { stop, handle: Some(handle) })
    }

    pub(crate) fn shutdown(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// A caller-supplied key predicate: `true` = the key belongs to this datastore.
pub type KeyFilter = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// What every handle shares: the current engine state (`Inner`, replaced atomically by
/// compaction and merge) and the maintenance settings.
pub(crate) struct Shared {
    /// The current log + index. Writers hold a read guard for the whole append, so taking
    /// the write guard (maintenance's brief lock) waits for in-flight appends and blocks
    /// new ones; readers only clone the `Arc`.
    pub cur: RwLock<Arc<Inner>>,
    pub dir: PathBuf,
    pub opts: Options,
    pub counters: Arc<Counters>,
    /// One maintenance operation at a time.
    pub maint: Mutex<()>,
    /// Delete records with `seq <=` this may be dropped by compaction.
    pub watermark: AtomicU64,
    /// Keys outside this filter are dropped by compaction.
    pub filter: RwLock<Option<KeyFilter>>,
    /// Persisted lower bound of `max_seq` (see `maint::write_seq_floor`).
    pub seq_floor: AtomicU64,
    /// Persisted upper bound of the seqs compaction dropped for age or key (see
    /// `DataStore::dropped_seq_max`).
    pub drop_floor: AtomicU64,
    /// The automatic compactor.
    pub auto: Mutex<Option<Background>>,
    /// Set when the store closes: running maintenance stops (the old state stands).
    pub cancel: AtomicBool,
    /// A merge into or out of this store is half done (`DataStore::merge_range_begin`):
    /// no other maintenance may replace its logs until it is finished or dropped.
    pub merge_reserved: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("dir", &self.dir).finish()
    }
}

impl Shared {
    pub fn current(&self) -> Arc<Inner> {
        Arc::clone(&self.cur.read())
    }
}

impl DataStore {
    /// Open (or create) the datastore in directory `dir`: lock it, load the checkpoint if
    /// valid, replay the log after it (or rebuild from the whole log), cut a torn tail.
    /// Leftovers of maintenance interrupted by a crash are removed (the old state stands).
    pub fn open(dir: &Path, options: Options) -> Result<DataStore, Error> {
        let counters = Arc::new(Counters::default());
        let (inner, report, floor) = crate::recovery::open(dir, options.clone(), Arc::clone(&counters))?;
        let drop_floor = crate::maint::read_drop_floor(dir)?;
        let inner = Arc::new(inner);
        let _ = inner.this.set(Arc::downgrade(&inner));
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
        let background = match inner.opts.sync {
            SyncPolicy::Interval(every) => Some(spawn_interval_sync(&shared, every)?),
            _ => None,
        };
        if shared.opts.auto_compact {
            *shared.auto.lock() = crate::maint::spawn_auto_compactor(&shared);
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
        if crate::maint::over_stall_limit(&self.shared) {
            self.shared.counters.write_stalls.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_micros(crate::limits::GARBAGE_STALL_US));
        }
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
        if crate::maint::over_stall_limit(&self.shared) {
            self.shared.counters.write_stalls.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_micros(crate::limits::GARBAGE_STALL_US));
        }
        let (inner, end) = {
            let cur = self.shared.cur.read();
            let end = cur.write_batch(ops)?;
            (Arc::clone(&cur), end)
        };
        inner.after_write(end)
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
        let end = inner.written_end.load(Ordering::Acquire);
        let hot = (Arc::clone(&inner.log), LOG_HEADER_BYTES, end);
        match &inner.cold {
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
        let end = inner.written_end.load(Ordering::Acquire);
        Iter::new(Arc::clone(&inner.log), offset, end)
    }

    /// Log position after the last appended record (shrinks when compaction replaces the log).
    pub fn end_offset(&self) -> u64 {
        self.shared.current().written_end.load(Ordering::Acquire)
    }

    /// Highest `meta.seq` appended or recovered (puts and deletes), 0 if none. Never goes
    /// backwards: not when compaction drops the record that held it, not after a restart
    /// (maintenance persists it in the `MAXSEQ` file).
    pub fn max_seq(&self) -> u64 {
        let inner = self.shared.current().max_seq.load(Ordering::Acquire);
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
            let end = inner.written_end.load(Ordering::Acquire);
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
        crate::checkpoint::write(&cur)
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
        self.shared.current().stats(crate::maint::now_secs(), watermark)
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

    fn stop_background(&mut self) {
        if let Some(mut bg) = self.background.take() {
            bg.shutdown();
        }
        self.shared.cancel.store(true, Ordering::Release);
        let auto = self.shared.auto.lock().take();
        if let Some(mut a) = auto {
            a.shutdown();
        }
        self.shared.current().stop_migrator();
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
