//! Maintenance (paper §3.3.2–3.3.3): split, merge, compact, and the automatic compactor.
//!
//! Each operation is a sequential scan of a log that writes the surviving records into a
//! new log while the store keeps serving. Because the log is append-only, the scan runs
//! until it reaches the end, repeats over what was appended meanwhile until only a small
//! tail is left, then takes the store's lock (writers wait; lookups continue on the old
//! log), copies that last tail, makes the new log durable and swaps it in atomically
//! (`rename` over `data.log`, then the in-memory state), and releases the lock.
//!
//! What survives: the live put of every key (the one the index points at) and delete
//! records not superseded by a later put. Compaction also drops keys outside the key
//! filter, expired puts, and delete records at or below the tombstone watermark.
//!
//! Crash safety: before the `rename` the old `data.log` is complete and authoritative
//! (`data.log.compact` is deleted at open); after it, the new log is complete and
//! fsynced. `max_seq` survives the loss of the record that held it through the `MAXSEQ`
//! file, written (atomically) before the rename whenever the new log would lack it.
//!
//! A compaction that drops a record for its age or key (a delete at or below the watermark,
//! an expired put, an out-of-filter key) rather than because a later record of the key
//! survives raises the `DROPSEQ` floor to that record's seq, written the same way before the
//! rename: every record above the floor that was its key's latest is still in the logs
//! (`DataStore::dropped_seq_max`; a replica re-syncing only a suffix relies on it).

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::checkpoint::CHECKPOINT_FILE;
use crate::error::Error;
use crate::index::KeyHash;
use crate::limits::{COLD_UNITS_BIT, DATASTORE_BYTES_MAX, LOG_HEADER_BYTES, OFFSET_UNIT};
use crate::log::{self, LogFile, Scanner};
use crate::manifest::{self, LogState, Manifest, COLD_FILE, COLD_NEW_FILE};
use crate::record::{self, Header};
use crate::recovery::LOG_FILE;
use crate::store::{Background, BatchOp, ColdLog, Inner, KeyFilter, Shared};
use crate::{DataStore, Meta, Options, RecordKind, SyncPolicy};

/// The new log of a compaction or merge, renamed over `data.log` at the swap.
const COMPACT_FILE: &str = "data.log.compact";
/// The persisted lower bound of `max_seq`.
const SEQ_FILE: &str = "MAXSEQ";
const SEQ_TMP: &str = "MAXSEQ.tmp";
const SEQ_MAGIC: [u8; 8] = *b"FAWNSEQ\0";
const SEQ_FILE_BYTES: usize = 24;
/// The persisted drop floor (`DataStore::dropped_seq_max`), same layout as `MAXSEQ`.
const DROP_FILE: &str = "DROPSEQ";
const DROP_TMP: &str = "DROPSEQ.tmp";
const DROP_MAGIC: [u8; 8] = *b"FAWNDRP\0";
/// A split builds its datastore in `<target>` + this suffix and renames it when complete.
const SPLIT_TMP_SUFFIX: &str = ".split-tmp";
/// Unlocked catch-up passes stop once the unscanned tail is at most this many bytes...
const CATCH_UP_LOCKED_BYTES_MAX: u64 = 64 << 10;
/// ...or after this many passes (writers faster than the copy): the rest is copied locked.
const CATCH_UP_PASSES_MAX: usize = 8;
/// Rounds of (catch up, sync the new log) before the lock, until at most
/// `PRE_LOCK_UNSYNCED_BYTES_MAX` of the new log is unsynced when the lock is taken.
const PRE_LOCK_SYNC_ROUNDS_MAX: usize = 4;
/// The unsynced part of the new log at which those rounds stop.
const PRE_LOCK_UNSYNCED_BYTES_MAX: u64 = 256 << 10;
/// Unpaced passes right before the lock stop when one copied at most this many bytes...
const LAST_PASS_DONE_BYTES: u64 = 16 << 10;
/// ...or after this many.
const LAST_PASSES_MAX: usize = 4;

/// Which maintenance operation a report describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaintenanceKind {
    /// Full compaction: every log's survivors are rewritten (into a new cold log when
    /// `Options::hot_cold` is on).
    Compact,
    /// Hot compaction (`Options::hot_cold`): the hot log's survivors are appended to the
    /// cold log, which is not rewritten.
    CompactHot,
    Merge,
    Split,
}

/// What one maintenance operation did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaintenanceReport {
    pub kind: MaintenanceKind,
    /// Records read by the scans (all passes, both stores for a merge).
    pub records_scanned: u64,
    /// Records written to the new log.
    pub records_written: u64,
    pub bytes_scanned: u64,
    pub bytes_written: u64,
    /// Log bytes before (this store's log; for a merge plus the other's).
    pub log_bytes_before: u64,
    /// Log bytes of the new log right after the swap (for a split: the new store's).
    pub log_bytes_after: u64,
    /// Bytes copied while holding the lock (the last tail).
    pub locked_catch_up_bytes: u64,
    /// Wall time of the whole operation.
    pub duration_us: u64,
    /// Time spent waiting for the lock (in-flight writes finishing).
    pub lock_wait_us: u64,
    /// Time the lock was held: writers were blocked this long.
    pub lock_hold_us: u64,
    /// What the lock hold spent its time on.
    pub lock: LockPhases,
}

/// What one end-of-operation lock hold spent its time on: the phases under the lock, and
/// how the holding thread used the wall time (on a CPU, waiting for one, blocked). Times in
/// microseconds. `hold_us` minus the phases is the time between them (counters, clocks).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockPhases {
    /// Waiting for the lock (in-flight appends finishing); not part of the hold.
    pub wait_us: u64,
    /// The whole hold, from acquiring the lock to having released it.
    pub hold_us: u64,
    /// Copying the tail appended since the last unlocked catch-up pass (both stores).
    pub catch_up_us: u64,
    pub catch_up_records: u64,
    pub catch_up_bytes: u64,
    /// Writing the `MAXSEQ` floor under the lock (0: not needed, or written before it).
    pub seq_floor_us: u64,
    /// `fdatasync` of the new log's locked tail (`SyncPolicy::Always`, or when the old log
    /// was fsynced during the last passes past what the new log had durable).
    pub tail_sync_us: u64,
    /// The commit `rename`.
    pub rename_us: u64,
    /// Publishing the new state (pointer swap; the old state is freed after the release).
    pub swap_us: u64,
    /// Releasing the lock(s).
    pub release_us: u64,
    /// The holding thread's time on a CPU during the hold (`/proc/thread-self/schedstat`;
    /// these four are 0 where it cannot be read).
    pub on_cpu_us: u64,
    /// Time the holding thread was runnable but not running (descheduled) during the hold.
    pub runqueue_us: u64,
    /// The rest of the hold: the thread was blocked (I/O, a kernel lock, page writeback).
    pub blocked_us: u64,
    /// Times the thread was put back on a CPU during the hold (0 = it ran uninterrupted).
    pub switches: u64,
}

impl LockPhases {
    /// Fill the thread-accounting fields from samples taken at acquisition and release.
    fn account(&mut self, at_acquire: Option<SchedSample>, at_release: Option<SchedSample>) {
        if let (Some(a), Some(b)) = (at_acquire, at_release) {
            self.on_cpu_us = b.on_cpu_ns.saturating_sub(a.on_cpu_ns) / 1000;
            self.runqueue_us = b.run_delay_ns.saturating_sub(a.run_delay_ns) / 1000;
            self.switches = b.slices.saturating_sub(a.slices);
            self.blocked_us = self.hold_us.saturating_sub(self.on_cpu_us + self.runqueue_us);
        }
    }
}

/// One reading of the calling thread's scheduler statistics.
#[derive(Clone, Copy, Debug)]
struct SchedSample {
    on_cpu_ns: u64,
    run_delay_ns: u64,
    slices: u64,
}

/// The calling thread's `/proc/thread-self/schedstat`, opened once (outside the lock) so a
/// sample under the lock is a single `pread`.
struct SchedClock {
    file: Option<File>,
}

impl SchedClock {
    fn open() -> SchedClock {
        SchedClock { file: File::open("/proc/thread-self/schedstat").ok() }
    }

    /// Run-queue delay and slices from the schedstat file (updated at every schedule-in, so
    /// exact for a running thread); CPU time from the thread CPU clock (the file's CPU time
    /// lags by up to a tick for a running thread).
    fn sample(&self) -> Option<SchedSample> {
        use std::os::unix::fs::FileExt;
        let f = self.file.as_ref()?;
        let mut buf = [0u8; 96];
        let n = f.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(buf.get(..n)?).ok()?;
        let mut it = text.split_ascii_whitespace().skip(1).map(|t| t.parse::<u64>().ok());
        let (run_delay_ns, slices) = (it.next()??, it.next()??);
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        if rc != 0 {
            return None;
        }
        let on_cpu_ns = (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64);
        Some(SchedSample { on_cpu_ns, run_delay_ns, slices })
    }
}

fn micros_since(t: Instant) -> u64 {
    t.elapsed().as_micros() as u64
}

impl MaintenanceReport {
    fn new(kind: MaintenanceKind) -> MaintenanceReport {
        MaintenanceReport {
            kind,
            records_scanned: 0,
            records_written: 0,
            bytes_scanned: 0,
            bytes_written: 0,
            log_bytes_before: 0,
            log_bytes_after: 0,
            locked_catch_up_bytes: 0,
            duration_us: 0,
            lock_wait_us: 0,
            lock_hold_us: 0,
            lock: LockPhases::default(),
        }
    }
}

/// Which records of a source log are written to the new one.
#[derive(Clone)]
enum Keep {
    /// Compaction: drop out-of-filter keys, superseded puts, expired puts, superseded
    /// deletes and deletes at or below the watermark. `dropped`: the highest seq of a record
    /// dropped for its age or key (not because a later record of its key survives).
    Compact { watermark: u64, filter: Option<KeyFilter>, now: u32, dropped: Arc<AtomicU64> },
    /// Split / merge: the live put of each key in the filter, and its unsuperseded deletes.
    Carry { filter: Option<KeyFilter> },
}

impl Keep {
    /// Whether the record of `src` at `offset` goes into `dst`. A record dropped for its
    /// age (expired put, delete under the watermark) is still written when `dst` already
    /// holds a version of the key: a catch-up pass copied an older put before this record
    /// superseded it, and dropping this one would resurrect that put.
    fn wants(
        &self,
        src: &Inner,
        dst: &Inner,
        units: u32,
        header: &Header,
        key: &[u8],
    ) -> Result<bool, Error> {
        let keep = self.decide(src, dst, units, header, key)?;
        if let (Decision::DropTerminal, Keep::Compact { dropped, .. }) = (keep, self) {
            dropped.fetch_max(header.meta.seq, Ordering::AcqRel);
        }
        Ok(keep == Decision::Keep)
    }

    /// The highest seq a compaction with this policy dropped for age or key so far (0 for
    /// split and merge policies, which drop only superseded records and foreign keys).
    fn dropped_max(&self) -> u64 {
        match self {
            Keep::Compact { dropped, .. } => dropped.load(Ordering::Acquire),
            Keep::Carry { .. } => 0,
        }
    }

    fn decide(
        &self,
        src: &Inner,
        dst: &Inner,
        units: u32,
        header: &Header,
        key: &[u8],
    ) -> Result<Decision, Error> {
        let filter = match self {
            Keep::Compact { filter, .. } | Keep::Carry { filter } => filter,
        };
        if filter.as_ref().is_some_and(|f| !f(key)) {
            return Ok(Decision::DropTerminal);
        }
        let kh = KeyHash::of(key);
        let kept = |yes: bool| if yes { Decision::Keep } else { Decision::DropTerminal };
        match header.kind {
            RecordKind::Put => {
                if !src.is_live_at(kh, units) {
                    return Ok(Decision::DropSuperseded);
                }
                if let Keep::Compact { now, .. } = self {
                    let e = header.meta.expiry;
                    if e != 0 && e <= *now {
                        return Ok(kept(dst.find_existing(kh, key)?.is_some()));
                    }
                }
                Ok(Decision::Keep)
            }
            RecordKind::Delete => {
                // A live put of the key is later than this delete: the delete is superseded.
                if src.find_existing(kh, key)?.is_some() {
                    return Ok(Decision::DropSuperseded);
                }
                if let Keep::Compact { watermark, .. } = self {
                    if header.meta.seq <= *watermark {
                        return Ok(kept(dst.find_existing(kh, key)?.is_some()));
                    }
                }
                Ok(Decision::Keep)
            }
        }
    }
}

/// What `Keep` does with one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    Keep,
    /// A later record of the key survives (or is itself accounted for when dropped).
    DropSuperseded,
    /// Dropped for its age (expired put, delete under the watermark) or its key (filter):
    /// the key's latest state is no longer in the log.
    DropTerminal,
}

/// Paces scans to `Options::maintenance_bytes_per_sec`.
struct Limiter {
    rate: u64,
    start: Instant,
    bytes: u64,
}

impl Limiter {
    fn new(rate: u64) -> Limiter {
        Limiter { rate, start: Instant::now(), bytes: 0 }
    }

    fn account(&mut self, n: u64) {
        if self.rate == 0 {
            return;
        }
        self.bytes += n;
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        let elapsed = self.start.elapsed();
        if due > elapsed + Duration::from_millis(2) {
            std::thread::sleep(due - elapsed);
        }
    }
}

/// Copies records from one log into the log being built.
struct Copier<'a> {
    dst: &'a Inner,
    rep: MaintenanceReport,
    limiter: Limiter,
    cancel: Option<&'a std::sync::atomic::AtomicBool>,
    /// Records waiting to be appended with one write (and whether to the cold log).
    pending: Pending,
}

/// Copies collected for one batched append.
#[derive(Default)]
struct Pending {
    records: Vec<(RecordKind, Vec<u8>, Vec<u8>, Meta)>,
    bytes: usize,
    cold: bool,
}

/// Copies are appended in batches of about this many bytes (one write each).
const COPY_BATCH_BYTES: usize = 1 << 20;

impl Copier<'_> {
    /// Append the pending copies to the new log.
    fn flush(&mut self) -> Result<(), Error> {
        if self.pending.records.is_empty() {
            return Ok(());
        }
        let ops: Vec<BatchOp<'_>> = self
            .pending
            .records
            .iter()
            .map(|(kind, key, value, meta)| match kind {
                RecordKind::Put => BatchOp::put(key, value, *meta),
                RecordKind::Delete => BatchOp::delete(key, *meta),
            })
            .collect();
        let written = if self.pending.cold {
            self.dst.write_cold_batch(&ops)
        } else {
            self.dst.write_batch(&ops).map(|_| ())
        };
        drop(ops);
        self.pending.records.clear();
        self.pending.bytes = 0;
        written
    }

    /// Scan `src`'s hot log over `[from, to)` and append the records `keep` wants to the
    /// new hot log.
    fn copy(&mut self, src: &Inner, from: u64, to: u64, keep: &Keep, paced: bool) -> Result<(), Error> {
        self.copy_log(src, false, from, to, keep, paced, false)
    }

    /// Scan all of `src` (cold log, then hot log up to `to`) and append the records `keep`
    /// wants to the new cold log (`to_cold`) or hot log.
    fn copy_all(&mut self, src: &Inner, to: u64, keep: &Keep, to_cold: bool) -> Result<(), Error> {
        if src.cold.is_some() {
            self.copy_log(src, true, LOG_HEADER_BYTES, src.cold_end(), keep, true, to_cold)?;
        }
        self.copy_log(src, false, LOG_HEADER_BYTES, to, keep, true, to_cold)
    }

    #[allow(clippy::too_many_arguments)]
    fn copy_log(
        &mut self,
        src: &Inner,
        cold: bool,
        from: u64,
        to: u64,
        keep: &Keep,
        paced: bool,
        to_cold: bool,
    ) -> Result<(), Error> {
        let log = match (&src.cold, cold) {
            (Some(c), true) => Arc::clone(&c.log),
            (None, true) => return Ok(()),
            (_, false) => Arc::clone(&src.log),
        };
        let bit = if cold { COLD_UNITS_BIT } else { 0 };
        if self.pending.cold != to_cold {
            self.flush()?;
            self.pending.cold = to_cold;
        }
        let mut sc = Scanner::new(log, from, to);
        while let Some((offset, header, bytes)) = sc.next_record()? {
            if self.cancel.is_some_and(|c| c.load(Ordering::Acquire)) {
                return Err(Error::Cancelled);
            }
            let total = header.total_len() as u64;
            self.rep.records_scanned += 1;
            self.rep.bytes_scanned += total;
            let key = record::key_of(bytes, &header);
            let units = (offset / OFFSET_UNIT) as u32 | bit;
            // `wants` looks at the new log for deletes and expiring puts: it must be current.
            if header.kind == RecordKind::Delete || header.meta.expiry != 0 {
                self.flush()?;
            }
            if keep.wants(src, self.dst, units, &header, key)? {
                let value = record::value_of(bytes, &header);
                self.pending.records.push((header.kind, key.to_vec(), value.to_vec(), header.meta));
                self.pending.bytes += total as usize;
                if self.pending.bytes >= COPY_BATCH_BYTES {
                    self.flush()?;
                }
                self.rep.records_written += 1;
                self.rep.bytes_written += total;
                self.dst.counters.cleaning_bytes.fetch_add(total, Ordering::Relaxed);
            }
            if paced {
                self.limiter.account(total);
            }
        }
        self.flush()
    }

    /// Unlocked passes over `src` from `pos` until the remaining tail is small; returns
    /// the position reached.
    fn catch_up(&mut self, src: &Inner, mut pos: u64, keep: &Keep) -> Result<u64, Error> {
        for _ in 0..CATCH_UP_PASSES_MAX {
            let end = src.applied_end.load(Ordering::Acquire);
            if end.saturating_sub(pos) <= CATCH_UP_LOCKED_BYTES_MAX {
                break;
            }
            self.copy(src, pos, end, keep, true)?;
            pos = end;
        }
        Ok(pos)
    }

    /// One unpaced pass over `src` from `pos` to its current end; returns that end.
    fn last_pass(&mut self, src: &Inner, pos: u64, keep: &Keep) -> Result<u64, Error> {
        let end = src.applied_end.load(Ordering::Acquire);
        if end > pos {
            self.copy(src, pos, end, keep, false)?;
        }
        Ok(end.max(pos))
    }
}

pub(crate) fn now_secs() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs().min(u32::MAX as u64) as u32)
        .unwrap_or(0)
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io("syncing the datastore directory", e))
}

/// Remove what a compaction/merge killed before its rename left behind (open calls this).
pub(crate) fn remove_leftovers(dir: &Path) -> Result<(), Error> {
    for name in [COMPACT_FILE, SEQ_TMP, DROP_TMP] {
        match fs::remove_file(dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("removing an interrupted maintenance file", e)),
        }
    }
    Ok(())
}

/// The persisted `max_seq` floor, 0 if there is none.
pub(crate) fn read_seq_floor(dir: &Path) -> Result<u64, Error> {
    read_u64_file(dir, SEQ_MAGIC, SEQ_FILE, ("MAXSEQ", "reading MAXSEQ"))
}

/// A `MAXSEQ`-format file's value (magic, u64, CRC32C, zero padding), 0 if it is absent.
/// `names`: the file's name in errors, and the context of an I/O error.
fn read_u64_file(dir: &Path, magic: [u8; 8], file: &str, names: (&str, &'static str)) -> Result<u64, Error> {
    let (what, reading) = names;
    let bytes = match fs::read(dir.join(file)) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io(reading, e)),
    };
    if bytes.len() != SEQ_FILE_BYTES || bytes[0..8] != magic {
        return Err(Error::corrupt(0, format!("{what}: bad magic or length")));
    }
    let crc = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    if crc != crc32c::crc32c(&bytes[0..16]) || bytes[20..24] != [0; 4] {
        return Err(Error::corrupt(0, format!("{what}: checksum mismatch")));
    }
    let mut s = [0u8; 8];
    s.copy_from_slice(&bytes[8..16]);
    Ok(u64::from_le_bytes(s))
}

/// Atomically persist a `max_seq` floor: temp file, fsync, rename, fsync directory.
pub(crate) fn write_seq_floor(dir: &Path, seq: u64) -> Result<(), Error> {
    write_u64_file(dir, SEQ_MAGIC, SEQ_TMP, SEQ_FILE, seq).map_err(|e| Error::io("writing MAXSEQ", e))?;
    sync_dir(dir)
}

/// The persisted drop floor (`DataStore::dropped_seq_max`), 0 if there is none.
pub(crate) fn read_drop_floor(dir: &Path) -> Result<u64, Error> {
    read_u64_file(dir, DROP_MAGIC, DROP_FILE, ("DROPSEQ", "reading DROPSEQ"))
}

/// Atomically persist a drop floor, as `write_seq_floor`.
pub(crate) fn write_drop_floor(dir: &Path, seq: u64) -> Result<(), Error> {
    write_u64_file(dir, DROP_MAGIC, DROP_TMP, DROP_FILE, seq).map_err(|e| Error::io("writing DROPSEQ", e))?;
    sync_dir(dir)
}

/// Raises `shared`'s drop floor to `seq` (persisted first) if it is below.
fn raise_drop_floor(shared: &Shared, seq: u64) -> Result<(), Error> {
    if seq > shared.drop_floor.load(Ordering::Acquire) {
        write_drop_floor(&shared.dir, seq)?;
        shared.drop_floor.fetch_max(seq, Ordering::AcqRel);
    }
    Ok(())
}

/// magic (8) | value u64 LE (8) | crc32c of the first 16 bytes (4) | zero (4); written to
/// `tmp`, fsynced, renamed to `name` (the caller syncs the directory).
fn write_u64_file(dir: &Path, magic: [u8; 8], tmp: &str, name: &str, value: u64) -> std::io::Result<()> {
    let mut b = [0u8; SEQ_FILE_BYTES];
    b[0..8].copy_from_slice(&magic);
    b[8..16].copy_from_slice(&value.to_le_bytes());
    let crc = crc32c::crc32c(&b[0..16]);
    b[16..20].copy_from_slice(&crc.to_le_bytes());
    let tmp = dir.join(tmp);
    let mut f = File::create(&tmp)?;
    std::io::Write::write_all(&mut f, &b)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))
}

/// A new, empty log file at `path` (truncating any leftover) with a fresh nonce.
fn fresh_log(shared: &Shared, path: &Path) -> Result<(LogFile, u64), Error> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| Error::io("creating the maintenance log", e))?;
    let log = LogFile::new(f, shared.opts.faults.clone());
    // Nonce 0 means "no cold log" in the LOGS manifest.
    let nonce = crate::recovery::new_nonce().max(1);
    log.write_all_at(&log::encode_header(nonce), 0).map_err(|e| Error::io("writing the log header", e))?;
    Ok((log, nonce))
}

/// A new state: an empty hot log at `path`, the given cold log, a fresh index.
fn fresh_inner(
    shared: &Shared,
    path: &Path,
    expected_keys: u64,
    lock: Arc<File>,
    cold: Option<ColdLog>,
) -> Result<Inner, Error> {
    let (log, nonce) = fresh_log(shared, path)?;
    let mut opts = shared.opts.clone();
    // Right-size the new index: no growth while copying.
    opts.expected_keys = opts.expected_keys.max(expected_keys + expected_keys / 16);
    let counters = Arc::clone(&shared.counters);
    Ok(Inner::new(shared.dir.clone(), opts, log, nonce, lock, LOG_HEADER_BYTES, counters, cold))
}

/// How a maintenance operation makes the new state's cold log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ColdOut {
    /// The new state has no cold log (`Options::hot_cold` off).
    None,
    /// A new cold log, built as `data.cold.compact`, renamed to `data.cold` after the commit.
    Fresh,
    /// The old state's cold log, appended to in place past its committed length (the value).
    Append(u64),
}

/// The files of a state, as the LOGS manifest names them, with the state's `max_seq` floor.
fn state_of(inner: &Inner, seq_floor: u64) -> LogState {
    LogState {
        hot_nonce: inner.nonce,
        cold_nonce: inner.cold.as_ref().map_or(0, |c| c.nonce),
        cold_len: inner.cold_end(),
        seq_floor,
    }
}

/// Undo an operation that did not reach its commit point: the old state stands.
fn abandon(shared: &Shared, old: &Inner, cold_out: ColdOut) {
    let _ = fs::remove_file(shared.dir.join(COMPACT_FILE));
    match cold_out {
        ColdOut::None => {}
        ColdOut::Fresh => {
            let _ = fs::remove_file(shared.dir.join(COLD_NEW_FILE));
        }
        ColdOut::Append(len) => {
            if let Some(c) = &old.cold {
                // Readers of the old state never look past `len`.
                let _ = c.log.set_len(len);
            }
        }
    }
    old.resume_helpers();
}

/// A new cold log for a state being built: a fresh `data.cold.compact`, or the old state's
/// cold log appended to in place.
fn cold_for(shared: &Shared, old: &Inner, fresh: bool) -> Result<(ColdLog, ColdOut), Error> {
    match &old.cold {
        Some(c) if !fresh => {
            let len = c.end.load(Ordering::Acquire);
            Ok((
                ColdLog { log: Arc::clone(&c.log), nonce: c.nonce, end: AtomicU64::new(len) },
                ColdOut::Append(len),
            ))
        }
        _ => {
            let (log, nonce) = fresh_log(shared, &shared.dir.join(COLD_NEW_FILE))?;
            let cold = ColdLog { log: Arc::new(log), nonce, end: AtomicU64::new(LOG_HEADER_BYTES) };
            Ok((cold, ColdOut::Fresh))
        }
    }
}

/// The maintenance lock of `shared`, unless a merge of it is half done
/// (`DataStore::merge_range_begin`): its new log must not be replaced under it.
fn lock_maint(shared: &Shared) -> Result<parking_lot::MutexGuard<'_, ()>, Error> {
    let guard = shared.maint.lock();
    if shared.merge_reserved.load(Ordering::Acquire) {
        return Err(Error::InvalidRequest(
            "a merge of this datastore is half done (merge_range_begin): finish or drop it first".into(),
        ));
    }
    Ok(guard)
}

fn compact_keep(shared: &Shared) -> Keep {
    Keep::Compact {
        watermark: shared.watermark.load(Ordering::Acquire),
        filter: shared.filter.read().clone(),
        now: now_secs(),
        dropped: Arc::new(AtomicU64::new(0)),
    }
}

/// The two sides of an operation: this store (and the one merged in).
struct Sides<'a> {
    shared: &'a Shared,
    old: Arc<Inner>,
    keep_self: Keep,
    other: Option<(&'a Shared, Arc<Inner>)>,
    keep_other: Keep,
}

/// Full compaction of `shared` (merging `other` in, if given): every survivor of its logs
/// (cold, then hot) goes into a new log — a new cold log with `Options::hot_cold`, else the
/// new hot log — and what is appended meanwhile into the new hot log; then the swap. The
/// caller holds the maintenance locks of both.
/// `other_keys`: which of `other`'s keys are carried (`None`: all).
fn rewrite(
    shared: &Shared,
    other: Option<&Shared>,
    other_keys: Option<KeyFilter>,
) -> Result<MaintenanceReport, Error> {
    let begun = rewrite_begin(shared, other, other_keys)?;
    rewrite_finish(shared, other, begun)
}

/// A full compaction (or merge) whose scans of the source logs up to their ends are done:
/// the new state and the positions copied up to.
struct Rewrite {
    new: Arc<Inner>,
    old: Arc<Inner>,
    other_old: Option<Arc<Inner>>,
    keep_self: Keep,
    keep_other: Keep,
    rep: MaintenanceReport,
    pos: u64,
    other_pos: u64,
    cold_out: ColdOut,
    t0: Instant,
}

/// Step 1 of `rewrite`: scan every log to its end, unlocked, into the new cold log (or hot
/// log). On error the new files are removed.
fn rewrite_begin(
    shared: &Shared,
    other: Option<&Shared>,
    other_keys: Option<KeyFilter>,
) -> Result<Rewrite, Error> {
    let t0 = Instant::now();
    let kind = if other.is_some() { MaintenanceKind::Merge } else { MaintenanceKind::Compact };
    let old = shared.current();
    old.check_writable()?;
    let other_inner = other.map(|o| o.current());
    let expected = old.index.read().live() + other_inner.as_ref().map_or(0, |o| o.index.read().live());
    let (cold, cold_out) = if shared.opts.hot_cold {
        let (c, out) = cold_for(shared, &old, true)?;
        (Some(c), out)
    } else {
        (None, ColdOut::None)
    };
    let path = shared.dir.join(COMPACT_FILE);
    let built = fresh_inner(shared, &path, expected, Arc::clone(&old.lock), cold);
    let new = match built {
        Ok(n) => Arc::new(n),
        Err(e) => {
            abandon(shared, &old, cold_out);
            return Err(e);
        }
    };
    let keep_self = compact_keep(shared);
    let keep_other = Keep::Carry { filter: other_keys };
    let mut c = Copier {
        dst: &new,
        rep: MaintenanceReport::new(kind),
        limiter: Limiter::new(shared.opts.maintenance_bytes_per_sec),
        cancel: Some(&shared.cancel),
        pending: Pending::default(),
    };
    let to_cold = new.cold.is_some();
    let scanned = (|| {
        let end = old.applied_end.load(Ordering::Acquire);
        c.copy_all(&old, end, &keep_self, to_cold)?;
        let mut other_end = LOG_HEADER_BYTES;
        if let Some(oi) = &other_inner {
            other_end = oi.applied_end.load(Ordering::Acquire);
            c.copy_all(oi, other_end, &keep_other, to_cold)?;
        }
        Ok::<_, Error>((end, other_end))
    })();
    let (pos, other_pos) = match scanned {
        Ok(p) => p,
        Err(e) => {
            abandon(shared, &old, cold_out);
            return Err(e);
        }
    };
    let rep = c.rep;
    Ok(Rewrite { new, old, other_old: other_inner, keep_self, keep_other, rep, pos, other_pos, cold_out, t0 })
}

/// Steps 2 and on of `rewrite`: catch up, then the brief lock and the swap (`finish`).
fn rewrite_finish(
    shared: &Shared,
    other: Option<&Shared>,
    begun: Rewrite,
) -> Result<MaintenanceReport, Error> {
    let Rewrite { new, old, other_old, keep_self, keep_other, rep, pos, other_pos, cold_out, t0 } = begun;
    let sides = Sides { shared, old, keep_self, other: other.zip(other_old), keep_other };
    let c = Copier {
        dst: &new,
        rep,
        limiter: Limiter::new(shared.opts.maintenance_bytes_per_sec),
        cancel: Some(&shared.cancel),
        pending: Pending::default(),
    };
    finish(&sides, &new, c, pos, other_pos, cold_out, t0)
}

/// Hot compaction (`Options::hot_cold`): the hot log's survivors, as of a snapshot of the
/// index, are appended to the cold log (batched: one write per MiB), the snapshot's entries
/// are pointed at their new cold positions, and a new hot log receives what was appended
/// after the snapshot; then the swap. The cold log's old records are neither read nor
/// rewritten. Puts are moved whatever their expiry or key filter, and every delete record
/// is moved: dropping either here could resurrect an older version of the key in the cold
/// log; full compactions drop them.
///
/// With `other`, this is the append merge: after the hot log's survivors, every live put
/// and unsuperseded delete of `other` (cold log, then hot log) is appended to this store's
/// cold log too — after them, so `other`'s version of a key in both wins over this store's
/// versions written before the merge began — and the catch-up carries both stores' later
/// appends. So a merge writes this store's hot survivors plus `other`'s live data, never
/// this store's cold log (the paper's merge: one store's entries appended to the other's).
fn compact_hot(shared: &Shared, other: Option<&Shared>) -> Result<MaintenanceReport, Error> {
    let t0 = Instant::now();
    if !shared.opts.hot_cold {
        return Err(Error::InvalidRequest("hot compaction needs Options::hot_cold".into()));
    }
    let kind = if other.is_some() { MaintenanceKind::Merge } else { MaintenanceKind::CompactHot };
    let old = shared.current();
    old.check_writable()?;
    let (cold, cold_out) = cold_for(shared, &old, false)?;
    let path = shared.dir.join(COMPACT_FILE);
    let new = match fresh_inner(shared, &path, 0, Arc::clone(&old.lock), Some(cold)) {
        Ok(n) => Arc::new(n),
        Err(e) => {
            abandon(shared, &old, cold_out);
            return Err(e);
        }
    };
    let mut rep = MaintenanceReport::new(kind);
    let moved = move_hot_to_cold(shared, &old, &new, &mut rep);
    let end = match moved {
        Ok(end) => end,
        Err(e) => {
            abandon(shared, &old, cold_out);
            return Err(e);
        }
    };
    let sides = Sides {
        shared,
        old: Arc::clone(&old),
        keep_self: Keep::Carry { filter: None },
        other: other.map(|o| (o, o.current())),
        keep_other: Keep::Carry { filter: None },
    };
    let mut c = Copier {
        dst: &new,
        rep,
        limiter: Limiter::new(shared.opts.maintenance_bytes_per_sec),
        cancel: Some(&shared.cancel),
        pending: Pending::default(),
    };
    let mut other_end = LOG_HEADER_BYTES;
    if let Some((_, oi)) = &sides.other {
        other_end = oi.applied_end.load(Ordering::Acquire);
        if let Err(e) = c.copy_all(oi, other_end, &sides.keep_other, true) {
            abandon(shared, &old, cold_out);
            return Err(e);
        }
    }
    finish(&sides, &new, c, end, other_end, cold_out, t0)
}

/// Bytes a hot compaction collects before one write to the cold log.
const COLD_BATCH_BYTES: usize = 1 << 20;

/// The scan of a hot compaction: snapshot the index (with the log end it reflects), move
/// the survivors below that end to `new`'s cold log, give `new` the updated snapshot.
/// Returns the snapshot's log end (where the catch-up starts).
fn move_hot_to_cold(
    shared: &Shared,
    old: &Inner,
    new: &Inner,
    rep: &mut MaintenanceReport,
) -> Result<u64, Error> {
    let Some(cold) = &new.cold else {
        return Err(Error::InvalidRequest("hot compaction without a cold log".into()));
    };
    // A consistent snapshot, as for a checkpoint: writers pause for one copy of the index.
    // The reclaim estimate of the records below `end` moves with them (they are not
    // re-applied); what the catch-up copies later is noted again as it is applied.
    let (mut index, end, cold_live, reclaim) = {
        let w = old.writer.lock();
        let reclaim = old.reclaim.lock().clone();
        (old.index.read().clone(), w.end, old.cold_live_bytes.load(Ordering::Acquire), reclaim)
    };
    let mut limiter = Limiter::new(shared.opts.maintenance_bytes_per_sec);
    let start = cold.end.load(Ordering::Acquire);
    let mut flushed = start;
    let mut batch: Vec<u8> = Vec::with_capacity(COLD_BATCH_BYTES + crate::limits::RECORD_BYTES_MAX);
    let mut found = Vec::new();
    let mut max_seq = 0u64;
    let flush = |batch: &mut Vec<u8>, flushed: &mut u64| -> Result<(), Error> {
        cold.log.write_all_at(batch, *flushed).map_err(|e| Error::io("appending to the cold log", e))?;
        *flushed += batch.len() as u64;
        batch.clear();
        Ok(())
    };
    let mut sc = Scanner::new(Arc::clone(&old.log), LOG_HEADER_BYTES, end);
    while let Some((offset, header, bytes)) = sc.next_record()? {
        if shared.cancel.load(Ordering::Acquire) {
            return Err(Error::Cancelled);
        }
        let total = header.total_len() as u64;
        rep.records_scanned += 1;
        rep.bytes_scanned += total;
        limiter.account(total);
        let key = record::key_of(bytes, &header);
        let units = (offset / OFFSET_UNIT) as u32;
        let slot = match header.kind {
            RecordKind::Put => {
                found.clear();
                index.find(KeyHash::of(key), &mut found);
                match found.iter().find(|c| c.units == units) {
                    Some(c) => Some(c.loc),
                    None => continue, // superseded
                }
            }
            RecordKind::Delete => None,
        };
        let pad = new.cold_padding_before(flushed + batch.len() as u64, total as usize);
        if pad > 0 {
            record::encode_pad(&mut batch, pad)?;
        }
        let at = flushed + batch.len() as u64;
        if at + total > DATASTORE_BYTES_MAX {
            return Err(Error::StoreFull);
        }
        // Re-encoded: the durability stamp must not lie beyond the record's new offset.
        let value = record::value_of(bytes, &header);
        record::encode_into(&mut batch, header.kind, key, value, header.meta, LOG_HEADER_BYTES)?;
        if let Some(loc) = slot {
            index.update(loc, KeyHash::of(key), (at / OFFSET_UNIT) as u32 | COLD_UNITS_BIT);
        }
        max_seq = max_seq.max(header.meta.seq);
        rep.records_written += 1;
        rep.bytes_written += total;
        if batch.len() >= COLD_BATCH_BYTES {
            flush(&mut batch, &mut flushed)?;
        }
    }
    flush(&mut batch, &mut flushed)?;
    // Every hot entry now points into the cold log; a growing index's scan of the old hot
    // log has nothing left to find (and its positions mean nothing in the new hot log).
    let stranded = index.hot_log_replaced();
    if stranded > 0 {
        return Err(Error::corrupt(
            end,
            format!("{stranded} index entries point at hot-log records a scan of the hot log did not find"),
        ));
    }
    let moved = flushed - start;
    new.counters.appended_bytes.fetch_add(moved, Ordering::Relaxed);
    new.counters.cleaning_bytes.fetch_add(moved, Ordering::Relaxed);
    cold.end.store(flushed, Ordering::Release);
    *new.index.write() = index;
    *new.reclaim.lock() = reclaim;
    new.cold_live_bytes.store(cold_live + moved, Ordering::Release);
    new.max_seq.fetch_max(max_seq, Ordering::AcqRel);
    Ok(end)
}

/// The rest of a compaction/merge after the main scan: unlocked catch-up, the new logs made
/// durable, the LOGS manifest, rounds of catch-up + sync until little of the new log is
/// unsynced, the MAXSEQ floor if needed, a last pass; then the brief lock (the tail that
/// arrived meanwhile, MAXSEQ again only if that tail needs it, the commit `rename`, the
/// in-memory swap); then the cold log renamed into place. The old state is freed after the
/// release (the caller holds it). `MaintenanceReport::lock` says where the hold went.
fn finish(
    sides: &Sides,
    new: &Arc<Inner>,
    mut c: Copier,
    mut pos: u64,
    mut other_pos: u64,
    cold_out: ColdOut,
    t0: Instant,
) -> Result<MaintenanceReport, Error> {
    let (shared, old) = (sides.shared, &sides.old);
    let (keep_self, keep_other) = (&sides.keep_self, &sides.keep_other);
    let path = shared.dir.join(COMPACT_FILE);
    // The positions in the old hot log (and in `other`'s) below which every copy is durable
    // in the new log. A record a source log holds durably (a `sync()`, the interval thread,
    // `Always`) must be durable in the new log before the rename makes it the store's,
    // whatever the policy: the old log is gone after it, and a merged store is usually
    // dropped once the merge returns.
    let mut covered = [LOG_HEADER_BYTES; 2];
    let other_inner = sides.other.as_ref().map(|(_, oi)| oi);
    // The merged-in store's persisted `max_seq` floor (fixed: its maintenance lock is held).
    let other_floor = sides.other.as_ref().map_or(0, |(o, _)| o.seq_floor.load(Ordering::Acquire));
    let behind = |covered: [u64; 2]| {
        old.synced() > covered[0] || other_inner.is_some_and(|oi| oi.synced() > covered[1])
    };
    let result = (|| {
        pos = c.catch_up(old, pos, keep_self)?;
        if let Some((_, oi)) = &sides.other {
            other_pos = c.catch_up(oi, other_pos, keep_other)?;
            pos = c.catch_up(old, pos, keep_self)?;
        }
        // Names the new state next to the old one; the hot rename below (the commit point)
        // picks between them, so a crash before it leaves the old state. The new state's
        // `max_seq` floor includes the merged-in store's (its `MAXSEQ`: seqs of records it
        // dropped, which its log no longer shows): that floor must not reach this store's
        // `MAXSEQ` before the commit point, so the manifest carries it (§7.2, §8).
        let floor = shared.seq_floor.load(Ordering::Acquire);
        let next = state_of(new, floor.max(other_floor));
        manifest::write(&shared.dir, &Manifest { next, prev: state_of(old, floor) })?;
        if let Some(cold) = &new.cold {
            // The cold log is complete: durable before the commit point makes it the state.
            cold.log.sync_data().map_err(|e| Error::io("syncing the cold log", e))?;
        }
        sync_new(new, new.applied_end.load(Ordering::Acquire), [pos, other_pos], &mut covered)?;
        // No checkpoint of the old log may be written after the swap.
        old.stop_migrator();
        // The syncs and the join took time: catch up what was appended meanwhile, so the
        // lock only covers a small tail. Then sync what that catch-up wrote and catch up
        // again, until little of the new log is unsynced: the commit `rename` replaces an
        // existing file, and ext4 (auto_da_alloc) then starts writeback of the new file's
        // dirty pages inside the `rename` — under the lock. Measured before this loop: up
        // to 14 ms of `rename` (12 ms of it blocked) after a merge, whose long cold-log
        // sync lets much catch-up pile up unsynced (docs/BENCHMARKS.md, lock hold). Durability is unchanged: these are extra
        // syncs of records the new log holds anyway, before the commit point.
        for round in 1..=PRE_LOCK_SYNC_ROUNDS_MAX {
            if let Some((_, oi)) = &sides.other {
                other_pos = c.catch_up(oi, other_pos, keep_other)?;
            }
            pos = c.catch_up(old, pos, keep_self)?;
            let written = new.written_end.load(Ordering::Acquire);
            if written.saturating_sub(new.synced()) <= PRE_LOCK_UNSYNCED_BYTES_MAX
                || round == PRE_LOCK_SYNC_ROUNDS_MAX
            {
                break;
            }
            sync_new(new, written, [pos, other_pos], &mut covered)?;
        }
        // Under `Always` the lock must sync whatever of the new log is unsynced before the
        // commit `rename`: leave it only what the last passes and the locked tail copy
        // (measured before: 1.8–19.8 ms of `fdatasync` under the lock for up to 256 KiB).
        if shared.opts.sync == SyncPolicy::Always {
            sync_new(new, new.written_end.load(Ordering::Acquire), [pos, other_pos], &mut covered)?;
        }
        // The `MAXSEQ` floor, if the new log lacks this store's highest seq so far (its
        // record was dropped): written here, not under the lock. A floor is a lower bound
        // of `max_seq` that must not exceed the old state's: `top` is the old state's
        // `max_seq` now, which only grows, so a crash at any point after this write leaves
        // the old state (max_seq >= top) or the new one (which needs the floor) correct.
        // The lock re-checks for records that arrive meanwhile (rarely needed).
        let top = old.max_seq.load(Ordering::Acquire);
        if new.max_seq.load(Ordering::Acquire) < top && shared.seq_floor.load(Ordering::Acquire) < top {
            write_seq_floor(&shared.dir, top)?;
            shared.seq_floor.fetch_max(top, Ordering::AcqRel);
        }
        // Likewise the drop floor, for what the scans dropped so far (a floor written and
        // then abandoned by a crash before the rename is only conservative).
        raise_drop_floor(shared, drop_top(sides))?;
        // Last unpaced passes over whatever is left (the catch-up passes leave up to
        // `CATCH_UP_LOCKED_BYTES_MAX`, and the syncs let more arrive), until a pass finds
        // little: the lock then copies only what arrives during that pass. (Measured: a
        // 158 KB locked tail took 0.9 ms of CPU under the lock, and 3.9 ms when the holder
        // was descheduled meanwhile on the loaded 2-vCPU machine.)
        //
        // First give up the CPU once: when this thread runs again it starts a fresh time
        // slice, so the passes and the short hold below are less likely to be cut by a
        // preemption (a holder descheduled for 8 ms on the loaded 2-vCPU machine was the
        // remaining outlier; writers wait for the whole time the holder is off the CPU).
        // Costs a little maintenance time, never writer time: the lock is not held yet.
        std::thread::yield_now();
        for _ in 0..LAST_PASSES_MAX {
            let before = pos + other_pos;
            if let Some((_, oi)) = &sides.other {
                other_pos = c.last_pass(oi, other_pos, keep_other)?;
            }
            pos = c.last_pass(old, pos, keep_self)?;
            if pos + other_pos - before <= LAST_PASS_DONE_BYTES {
                break;
            }
        }
        // The old log was synced past what the new log has durable (records copied since the
        // last sync of the new log were made durable in the old one meanwhile): sync the new
        // log now, outside the lock; the lock re-checks for a sync of the old log since.
        if behind(covered) {
            sync_new(new, new.written_end.load(Ordering::Acquire), [pos, other_pos], &mut covered)?;
            // Writes went on during the sync: one more pass, so the lock copies little.
            if let Some((_, oi)) = &sides.other {
                other_pos = c.last_pass(oi, other_pos, keep_other)?;
            }
            pos = c.last_pass(old, pos, keep_self)?;
        }
        Ok::<_, Error>(())
    })();
    if let Err(e) = result {
        abandon(shared, old, cold_out);
        return Err(e);
    }
    // 2. The brief lock: no writer is appending to either store while it is held.
    let clock = SchedClock::open();
    let mut ph = LockPhases::default();
    let wait0 = Instant::now();
    let mut cur = shared.cur.write();
    let other_guard = sides.other.as_ref().map(|(o, _)| o.cur.write());
    let held = Instant::now();
    let at_acquire = clock.sample();
    ph.wait_us = (held - wait0).as_micros() as u64;
    c.rep.lock_wait_us = ph.wait_us;
    let swapped = (|| {
        let t = Instant::now();
        let (records0, bytes0) = (c.rep.records_scanned, c.rep.bytes_scanned);
        let end = old.applied_end.load(Ordering::Acquire);
        c.rep.locked_catch_up_bytes = end - pos;
        c.copy(old, pos, end, keep_self, false)?;
        let mut other_top = 0;
        if let Some((_, oi)) = &sides.other {
            let oend = oi.applied_end.load(Ordering::Acquire);
            c.rep.locked_catch_up_bytes += oend - other_pos;
            c.copy(oi, other_pos, oend, keep_other, false)?;
            // `other`'s highest seq in its logs is its latest record, always carried (live put
            // or delete); above that, its floor (persisted in the manifest as the new state's).
            other_top = oi.max_seq.load(Ordering::Acquire).max(other_floor);
            c.rep.log_bytes_before += oend + oi.cold_end();
        }
        c.rep.log_bytes_before += end + old.cold_end();
        ph.catch_up_us = micros_since(t);
        ph.catch_up_records = c.rep.records_scanned - records0;
        ph.catch_up_bytes = c.rep.bytes_scanned - bytes0;
        // This store's highest seq may have been in a dropped record: persist it first. (Only
        // this store's: a floor above the old state would survive a crash before the rename.)
        let t = Instant::now();
        let top = old.max_seq.load(Ordering::Acquire).max(shared.seq_floor.load(Ordering::Acquire));
        if new.max_seq.load(Ordering::Acquire) < top && shared.seq_floor.load(Ordering::Acquire) < top {
            write_seq_floor(&shared.dir, top)?;
            shared.seq_floor.fetch_max(top, Ordering::AcqRel);
            ph.seq_floor_us = micros_since(t);
        }
        // What the locked pass dropped too (rarely raises it).
        raise_drop_floor(shared, drop_top(sides))?;
        new.max_seq.fetch_max(top.max(other_top), Ordering::AcqRel);
        // Under `Always` the tail holds acknowledged-durable writes: they must be durable
        // in the new log before it replaces the old one. Otherwise the tail (at most the
        // last catch-up pass) is synced right after the lock is released, like any
        // recent write under `Interval`/`Never` (the bulk of the new log already is) —
        // unless a source log was synced past `covered` since the last sync of the new one
        // (a `sync()` or the interval thread during the last passes): then those records
        // are durable and must stay so.
        if shared.opts.sync == SyncPolicy::Always || behind(covered) {
            let t = Instant::now();
            new.sync_to(new.applied_end.load(Ordering::Acquire))?;
            ph.tail_sync_us = micros_since(t);
        }
        // The commit point.
        let t = Instant::now();
        fs::rename(&path, shared.dir.join(LOG_FILE))
            .map_err(|e| Error::io("renaming the compacted log", e))?;
        ph.rename_us = micros_since(t);
        Ok::<_, Error>(())
    })();
    if let Err(e) = swapped {
        drop(other_guard);
        drop(cur);
        abandon(shared, old, cold_out);
        return Err(e);
    }
    // Committed: the manifest's new state holds the merged-in store's floor.
    shared.seq_floor.fetch_max(other_floor, Ordering::AcqRel);
    // Under `Always`, writes acknowledged after the lock is released are durable in the new
    // log only if its name is. Instead of a directory fsync under the lock (measured: 2–12 ms
    // of it on a loaded machine), the new state is published with a pending directory sync:
    // its `sync_to` — which every `Always` write runs before it returns — syncs the directory
    // first while that is pending, and this thread does it right after the release.
    if shared.opts.sync == SyncPolicy::Always {
        new.dir_sync_pending.store(true, Ordering::Release);
    }
    let t = Instant::now();
    let _ = new.this.set(Arc::downgrade(new));
    *cur = Arc::clone(new);
    ph.swap_us = micros_since(t);
    let t = Instant::now();
    drop(other_guard);
    drop(cur);
    ph.release_us = micros_since(t);
    let hold_us = held.elapsed().as_micros() as u64;
    let at_release = clock.sample();
    ph.hold_us = hold_us;
    ph.account(at_acquire, at_release);
    c.rep.lock_hold_us = hold_us;
    c.rep.lock = ph;
    // The rename is durable once the directory is; the old checkpoint is useless now.
    let _ = fs::remove_file(shared.dir.join(CHECKPOINT_FILE));
    // The cold log of the new state under its name (open does this too after a crash).
    let cold_placed = match cold_out {
        ColdOut::Fresh => fs::rename(shared.dir.join(COLD_NEW_FILE), shared.dir.join(COLD_FILE)),
        ColdOut::None if old.cold.is_some() => fs::remove_file(shared.dir.join(COLD_FILE)),
        ColdOut::None | ColdOut::Append(_) => Ok(()),
    }
    .map_err(|e| Error::io("placing the cold log", e));
    let dir_synced = cold_placed
        .and_then(|()| new.sync_to(new.written_end.load(Ordering::Acquire)))
        .and_then(|()| sync_dir(&shared.dir))
        .map(|()| new.dir_sync_pending.store(false, Ordering::Release));
    new.start_migrator();
    new.start_auto_checkpoint();
    c.rep.log_bytes_after = new.applied_end.load(Ordering::Acquire) + new.cold_end();
    c.rep.duration_us = t0.elapsed().as_micros() as u64;
    let counters = &shared.counters;
    counters.maintenance_ops.fetch_add(1, Ordering::Relaxed);
    counters.last_maintenance_us.store(c.rep.duration_us, Ordering::Relaxed);
    counters.last_lock_hold_us.store(hold_us, Ordering::Relaxed);
    counters.max_lock_hold_us.fetch_max(hold_us, Ordering::Relaxed);
    *counters.last_lock_phases.lock() = c.rep.lock.clone();
    dir_synced?;
    Ok(c.rep)
}

/// Syncs the new log up to `upto`; the sources' positions `at` (this store's, `other`'s)
/// are then covered: every copy of a record below them is durable in the new log.
fn sync_new(new: &Inner, upto: u64, at: [u64; 2], covered: &mut [u64; 2]) -> Result<(), Error> {
    new.sync_to(upto)?;
    *covered = at;
    Ok(())
}

/// The drop floor the new state of `sides` needs: what its scans dropped for age or key, and
/// the merged-in store's own floor (its records come with their history).
fn drop_top(sides: &Sides) -> u64 {
    let other = sides.other.as_ref().map_or(0, |(o, _)| o.drop_floor.load(Ordering::Acquire));
    sides.keep_self.dropped_max().max(sides.keep_other.dropped_max()).max(other)
}

/// Merges serialize globally so that two merges in opposite directions cannot deadlock.
static MERGE_LOCK: Mutex<()> = Mutex::new(());

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
    fn merge_locked<T>(
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
            let synced = match &begun.new.cold {
                Some(cold) => cold.log.sync_data(),
                None => begun.new.log.sync_data(),
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

    /// Split: write every record this store holds for the keys where `belongs` is true —
    /// the live put of each and its delete records — into a new datastore at `target`,
    /// concurrently with stores, lookups and deletes here; the last appends are copied
    /// under a brief lock, so the new store holds exactly this store's state for those keys
    /// as of that moment. This store is not changed (set a key filter and `compact` to drop
    /// the split-off keys). The new store's `max_seq` starts at this store's. `target` must
    /// not exist; it is built in `<target>.split-tmp` and renamed when complete, so after a
    /// crash it either does not exist or is complete. Returns the new store, opened with
    /// `options`, and the report. The same as [`DataStore::split_begin`] followed at once by
    /// [`DataStore::split_finish`].
    pub fn split(
        &self,
        belongs: KeyFilter,
        target: &Path,
        options: Options,
    ) -> Result<(DataStore, MaintenanceReport), Error> {
        let begun = self.split_begin(belongs, target, options)?;
        self.split_finish(begun)
    }

    /// The first half of a split: the bulk copy of the keys `belongs` selects into
    /// `<target>.split-tmp`, concurrently with everything else. The caller may keep writing to
    /// this store and call [`DataStore::split_finish`] later, which copies only what was
    /// appended meanwhile: a caller that must stop writes for the cut (a replicated range
    /// being split) stops them only for that. Dropping the returned split removes its
    /// directory.
    pub fn split_begin(
        &self,
        belongs: KeyFilter,
        target: &Path,
        options: Options,
    ) -> Result<SplitInProgress, Error> {
        let t0 = Instant::now();
        if target.exists() {
            return Err(Error::InvalidRequest(format!("split target {} already exists", target.display())));
        }
        let _m = lock_maint(self.shared())?;
        self.split_bulk(belongs, target, options, t0)
    }

    /// The bulk copy of a split; the caller holds the maintenance lock.
    fn split_bulk(
        &self,
        belongs: KeyFilter,
        target: &Path,
        options: Options,
        t0: Instant,
    ) -> Result<SplitInProgress, Error> {
        let shared = self.shared();
        let tmp = split_tmp(target)?;
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(|e| Error::io("removing an interrupted split", e))?;
        }
        let src = shared.current();
        let build_opts = Options { sync: SyncPolicy::Never, auto_compact: false, ..options.clone() };
        let built = DataStore::open(&tmp, build_opts)?;
        let mut split = SplitInProgress {
            built: Some(built),
            tmp,
            target: target.to_path_buf(),
            src: Arc::clone(&src),
            belongs,
            pos: 0,
            rep: MaintenanceReport::new(MaintenanceKind::Split),
            options,
            t0,
        };
        let dst = split.built()?.shared().current();
        let keep = Keep::Carry { filter: Some(Arc::clone(&split.belongs)) };
        let mut c = Copier {
            dst: &dst,
            rep: MaintenanceReport::new(MaintenanceKind::Split),
            limiter: Limiter::new(shared.opts.maintenance_bytes_per_sec),
            cancel: Some(&shared.cancel),
            pending: Pending::default(),
        };
        let end = src.applied_end.load(Ordering::Acquire);
        c.copy_all(&src, end, &keep, false)?;
        split.pos = c.catch_up(&src, end, &keep)?;
        split.rep = c.rep;
        // Durable now, so that the finish (which a caller may run with writes stopped) syncs
        // only what it appends.
        split.built()?.sync()?;
        Ok(split)
    }

    /// The second half of a split begun by [`DataStore::split_begin`] on this store: copies
    /// what was appended since (unlocked passes while that is large, the rest under a brief
    /// lock), then makes the new store durable and renames it into place, as
    /// [`DataStore::split`]. If this store's log was replaced meanwhile (a compaction), the
    /// split starts over from that log.
    pub fn split_finish(&self, begun: SplitInProgress) -> Result<(DataStore, MaintenanceReport), Error> {
        let shared = self.shared();
        let _m = lock_maint(shared)?;
        let mut begun = if Arc::ptr_eq(&shared.current(), &begun.src) {
            begun
        } else {
            let (belongs, target, options, t0) =
                (Arc::clone(&begun.belongs), begun.target.clone(), begun.options.clone(), begun.t0);
            drop(begun);
            self.split_bulk(belongs, &target, options, t0)?
        };
        let src = Arc::clone(&begun.src);
        let built =
            begun.built.take().ok_or_else(|| Error::InvalidRequest("a split finished twice".into()))?;
        let dst = built.shared().current();
        let keep = Keep::Carry { filter: Some(Arc::clone(&begun.belongs)) };
        let mut c = Copier {
            dst: &dst,
            rep: std::mem::replace(&mut begun.rep, MaintenanceReport::new(MaintenanceKind::Split)),
            limiter: Limiter::new(shared.opts.maintenance_bytes_per_sec),
            cancel: Some(&shared.cancel),
            pending: Pending::default(),
        };
        let tmp = begun.tmp.clone();
        let result = (|| {
            let pos = c.catch_up(&src, begun.pos, &keep)?;
            let clock = SchedClock::open();
            let mut ph = LockPhases::default();
            let wait0 = Instant::now();
            let guard = shared.cur.write();
            let held = Instant::now();
            let at_acquire = clock.sample();
            ph.wait_us = (held - wait0).as_micros() as u64;
            c.rep.lock_wait_us = ph.wait_us;
            let (records0, bytes0) = (c.rep.records_scanned, c.rep.bytes_scanned);
            let end = src.applied_end.load(Ordering::Acquire);
            c.rep.locked_catch_up_bytes = end - pos;
            let copied = c.copy(&src, pos, end, &keep, false);
            ph.catch_up_us = micros_since(held);
            ph.catch_up_records = c.rep.records_scanned - records0;
            ph.catch_up_bytes = c.rep.bytes_scanned - bytes0;
            let cut_seq = src.max_seq.load(Ordering::Acquire).max(shared.seq_floor.load(Ordering::Acquire));
            let t = Instant::now();
            drop(guard);
            ph.release_us = micros_since(t);
            ph.hold_us = micros_since(held);
            let at_release = clock.sample();
            ph.account(at_acquire, at_release);
            c.rep.lock_hold_us = ph.hold_us;
            c.rep.lock = ph;
            copied?;
            c.rep.log_bytes_before = end + src.cold_end();
            write_seq_floor(&tmp, cut_seq)?;
            // The new store holds this store's records with their history of drops.
            let drops = shared.drop_floor.load(Ordering::Acquire);
            if drops > 0 {
                write_drop_floor(&tmp, drops)?;
            }
            Ok::<_, Error>(())
        })();
        c.rep.log_bytes_after = dst.applied_end.load(Ordering::Acquire);
        let rep = c.rep;
        drop(dst);
        let finished = result.and_then(|()| built.close());
        if let Err(e) = finished {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        // The commit point: the complete store appears under its name.
        fs::rename(&tmp, &begun.target).map_err(|e| Error::io("renaming the split datastore", e))?;
        if let Some(parent) = begun.target.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        let store = DataStore::open(&begun.target, begun.options.clone())?;
        let mut rep = rep;
        rep.duration_us = begun.t0.elapsed().as_micros() as u64;
        let counters = &shared.counters;
        counters.last_maintenance_us.store(rep.duration_us, Ordering::Relaxed);
        counters.last_lock_hold_us.store(rep.lock_hold_us, Ordering::Relaxed);
        counters.max_lock_hold_us.fetch_max(rep.lock_hold_us, Ordering::Relaxed);
        *counters.last_lock_phases.lock() = rep.lock.clone();
        Ok((store, rep))
    }
}

/// A merge whose scans are done ([`DataStore::merge_range_begin`]), to be finished with
/// [`DataStore::merge_range_finish`]. Dropped unfinished, it removes the new log and lets
/// other maintenance run on both stores again.
pub struct MergeInProgress {
    target: Arc<Shared>,
    other: Arc<Shared>,
    rewrite: Option<Rewrite>,
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

/// A split whose bulk copy is done ([`DataStore::split_begin`]), to be finished with
/// [`DataStore::split_finish`] on the same store. Dropped unfinished, it removes its
/// directory.
pub struct SplitInProgress {
    built: Option<DataStore>,
    tmp: PathBuf,
    target: PathBuf,
    src: Arc<Inner>,
    belongs: KeyFilter,
    /// The source's hot-log position copied up to.
    pos: u64,
    rep: MaintenanceReport,
    options: Options,
    t0: Instant,
}

impl SplitInProgress {
    fn built(&self) -> Result<&DataStore, Error> {
        self.built.as_ref().ok_or_else(|| Error::InvalidRequest("a split finished twice".into()))
    }

    /// Where the new store will be.
    pub fn target(&self) -> &Path {
        &self.target
    }
}

impl Drop for SplitInProgress {
    fn drop(&mut self) {
        if let Some(built) = self.built.take() {
            let _ = built.close();
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

fn split_tmp(target: &Path) -> Result<PathBuf, Error> {
    let name = target
        .file_name()
        .ok_or_else(|| Error::InvalidRequest(format!("split target {} has no name", target.display())))?;
    let mut tmp = name.to_os_string();
    tmp.push(SPLIT_TMP_SUFFIX);
    Ok(target.with_file_name(tmp))
}

/// Cost/benefit choice of the cleaning to run: a hot compaction copies the hot log's live
/// bytes to free its garbage; a full one copies all live bytes to free all garbage. The hot
/// one runs when its ratio garbage freed / bytes copied is at least the full one's.
fn clean(shared: &Shared) -> Result<MaintenanceReport, Error> {
    let inner = shared.current();
    let hot_live = inner.live_bytes.load(Ordering::Acquire) as u128;
    let hot_garbage = inner.hot_garbage_bytes() as u128;
    let all_live = hot_live + inner.cold_live_bytes.load(Ordering::Acquire) as u128;
    // Expired puts and droppable tombstones: only a full compaction frees them.
    let all_garbage = inner.garbage_bytes() as u128 + droppable_bytes(shared, &inner) as u128;
    drop(inner);
    if shared.opts.hot_cold && hot_garbage > 0 && hot_garbage * all_live >= all_garbage * hot_live {
        compact_hot(shared, None)
    } else {
        rewrite(shared, None, None)
    }
}

/// Whether a merge should append to the cold log (copying this store's hot survivors) rather
/// than rewrite both logs (copying all its survivors, minus out-of-filter keys): with
/// `hot_cold`, once most of the store's live data is cold. A store whose data is all in the
/// hot log (never cleaned) gains nothing from the append and would keep its out-of-filter
/// keys, so it is rewritten.
fn append_merge_is_cheaper(shared: &Shared) -> bool {
    let inner = shared.current();
    let hot_live = inner.live_bytes.load(Ordering::Acquire);
    let cold_live = inner.cold_live_bytes.load(Ordering::Acquire);
    shared.opts.hot_cold && inner.cold.is_some() && hot_live <= cold_live
}

/// Bytes a full compaction would drop beyond garbage: expired puts and delete records at or
/// below the tombstone watermark (an estimate, `reclaim`).
fn droppable_bytes(shared: &Shared, inner: &Inner) -> u64 {
    inner.reclaim.lock().droppable_bytes(now_secs(), shared.watermark.load(Ordering::Acquire))
}

/// Whether the store's garbage crosses both automatic-compaction thresholds (both logs
/// together: the space budget).
pub(crate) fn wants_compaction(shared: &Shared) -> bool {
    let inner = shared.current();
    let log = inner.total_log_bytes();
    let garbage = inner.garbage_bytes() + droppable_bytes(shared, &inner);
    log > 0
        && garbage >= shared.opts.compact_garbage_bytes
        && garbage as f64 >= shared.opts.compact_garbage_ratio * log as f64
}

/// Whether writers should be slowed down: automatic compaction is on and garbage is far
/// past its thresholds (`Options::stall_garbage_ratio`).
pub(crate) fn over_stall_limit(shared: &Shared) -> bool {
    let ratio = shared.opts.stall_garbage_ratio;
    if !shared.opts.auto_compact || ratio <= 0.0 || ratio >= 1.0 {
        return false;
    }
    let inner = shared.current();
    let log = inner.total_log_bytes();
    let garbage = inner.garbage_bytes();
    garbage >= shared.opts.compact_garbage_bytes.saturating_mul(2) && garbage as f64 >= ratio * log as f64
}

/// The automatic compactor: every `compact_check_interval`, compacts if the garbage
/// thresholds are crossed and no other maintenance is running.
pub(crate) fn spawn_auto_compactor(shared: &Arc<Shared>) -> Option<Background> {
    let every = shared.opts.compact_check_interval.max(Duration::from_millis(10));
    Background::spawn_periodic(shared, "fawn-ds-compact", every, |shared| {
        if !wants_compaction(shared) {
            return;
        }
        let Some(_m) = shared.maint.try_lock() else { return };
        if shared.merge_reserved.load(Ordering::Acquire) {
            return;
        }
        if clean(shared).is_err() {
            shared.counters.auto_compact_errors.fetch_add(1, Ordering::Relaxed);
        }
    })
    .ok()
}

/// Guards the directory sync that `Always` no longer does under the maintenance lock: while
/// it is pending, a write is not acknowledged before the directory is synced, and a failed
/// directory sync poisons the store instead of reporting a durable write.
#[cfg(test)]
mod pending_dir_sync_tests {
    use std::sync::atomic::Ordering;

    use crate::{DataStore, Meta, Options, SyncPolicy};

    fn meta(seq: u64) -> Meta {
        Meta { seq, ..Meta::default() }
    }

    #[test]
    fn an_always_write_waits_for_the_pending_directory_sync() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("ds");
        let opts = Options { sync: SyncPolicy::Always, auto_compact: false, ..Options::default() };
        let ds = DataStore::open(&dir, opts).expect("open");
        ds.store(b"k", b"v1", meta(1)).expect("store");
        ds.compact().expect("compact");
        let inner = ds.shared().current();
        assert!(
            !inner.dir_sync_pending.load(Ordering::Acquire),
            "compaction left its directory sync pending"
        );

        // A write arriving between the lock's release and maintenance's own directory sync,
        // here with a pending sync that succeeds: it clears the flag.
        inner.dir_sync_pending.store(true, Ordering::Release);
        ds.store(b"k", b"v2", meta(2)).expect("store with a pending directory sync");
        assert!(!inner.dir_sync_pending.load(Ordering::Acquire), "the write did not sync the directory");

        // The same with a directory that can no longer be synced (moved away): the write
        // must fail and poison the store, never be acknowledged.
        inner.dir_sync_pending.store(true, Ordering::Release);
        std::fs::rename(&dir, root.path().join("moved")).expect("move the directory");
        assert!(ds.store(b"k", b"v3", meta(3)).is_err(), "acknowledged without a durable directory entry");
        assert!(ds.stats().poisoned);
        assert!(ds.store(b"k2", b"v", meta(4)).is_err(), "a poisoned store accepted a write");
    }
}
