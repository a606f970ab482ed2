//! Opening a datastore: lock the directory, check the log header, load the checkpoint if
//! valid, replay the log after it (or all of it), and deal with a bad tail.
//!
//! Corruption policy (docs/FORMAT.md §5): at the first record that fails its checks (offset
//! X), the rest of the log is scanned for valid records. Every record carries the log
//! offset that was durable when it was appended. If some later record says X was already
//! durable, the damage hit synced data: open fails with `Error::Corrupt` naming X, unless
//! `Options::salvage` is set. Otherwise everything from X on may simply not have reached
//! the disk before a crash (a torn tail, possibly with holes from out-of-order writeback):
//! it is truncated and reported. Cut records are counted and their bytes kept.

use std::fs::{self, File, OpenOptions};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::checkpoint;
use crate::error::Error;
use crate::files::{self, CHECKPOINT_FILE, LOG_FILE};
use crate::index::KeyHash;
use crate::limits::LOG_HEADER_BYTES;
use crate::log::{self, LogFile, Scanner};
use crate::record;
use crate::store::{AppliedRecord, ColdLog, Counters, Inner};
use crate::types::{Meta, Options, RecordKind, RecoveryReport};

/// Rebuilds of logs larger than this first estimate the key count to size the index.
const PRESIZE_LOG_BYTES_MIN: u64 = 1 << 20;

/// Returns the engine state, the report and the persisted `max_seq` floor.
pub(crate) fn open(
    dir: &Path,
    opts: Options,
    counters: Arc<Counters>,
) -> Result<(Inner, RecoveryReport, u64), Error> {
    let t0 = Instant::now();
    files::create_dir_durable(dir).map_err(|e| Error::io("creating the datastore directory", e))?;
    let lock = files::lock_dir(dir)?;
    // A compaction or merge killed before its rename: the old log stands, drop the new one.
    files::remove_leftovers(dir)?;
    // Which hot/cold state stands after an interrupted maintenance (the LOGS manifest); its
    // `max_seq` floor (a merge's) counts like `MAXSEQ`.
    let (cold, state) = crate::manifest::settle(dir, &dir.join(LOG_FILE), &opts.faults)?;
    let floor = files::read_seq_floor(dir)?.max(state.map_or(0, |s| s.seq_floor));
    let mut report = RecoveryReport::default();
    let (log, nonce, len) = open_log(dir, &opts, &mut report)?;
    let cold = cold.map(|c| ColdLog { log: Arc::new(c.log), nonce: c.nonce, end: AtomicU64::new(c.len) });
    let inner = Inner::new(dir.to_path_buf(), opts, log, nonce, Arc::new(lock), len, counters, cold);
    let start = load_checkpoint(&inner, len, &mut report);
    if !report.from_checkpoint {
        let cold_len = inner.cold_end().saturating_sub(LOG_HEADER_BYTES);
        // Small logs replay quickly even with growth; large ones get an index sized up front.
        if len - start + cold_len > PRESIZE_LOG_BYTES_MIN {
            presize_index(&inner, start, len);
        }
        replay_cold(&inner, &mut report)?;
    }
    let end = replay(&inner, start, len, &mut report)?;
    // The previous process may have died with appends still only in the page cache: make
    // them durable now, so later `Always` writes never sit behind a non-durable hole.
    inner.log().sync_data().map_err(|e| Error::io("syncing the log at open", e))?;
    inner.set_recovered_end(end);
    inner.sync_to(end)?;
    report.log_end = end;
    report.duration_us = t0.elapsed().as_micros() as u64;
    Ok((inner, report, floor))
}

/// Open or create the log; returns it with its nonce and length.
fn open_log(dir: &Path, opts: &Options, report: &mut RecoveryReport) -> Result<(LogFile, u64, u64), Error> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(LOG_FILE))
        .map_err(|e| Error::io("opening the log", e))?;
    let log = LogFile::new(f, opts.faults.clone());
    let len = log.len()?;
    if len >= LOG_HEADER_BYTES {
        let mut h = [0u8; LOG_HEADER_BYTES as usize];
        log.read_at(&mut h, 0)?;
        let nonce = log::decode_header(&h)?;
        return Ok((log.with_version(log::header_version(&h)), nonce, len));
    }
    // New log, or one whose creation was torn (no record can exist before the header).
    report.truncated_bytes = len;
    let nonce = files::new_nonce();
    let init = || -> std::io::Result<()> {
        log.set_len(0)?;
        log.write_all_at(&log::encode_header(nonce), 0)?;
        log.sync_data()?;
        File::open(dir)?.sync_all()
    };
    init().map_err(|e| Error::io("creating the log", e))?;
    // An old checkpoint cannot match the new nonce, but remove it to avoid confusion.
    let _ = fs::remove_file(dir.join(CHECKPOINT_FILE));
    Ok((log, nonce, LOG_HEADER_BYTES))
}

/// Load a valid checkpoint into `inner`; returns where replay starts.
fn load_checkpoint(inner: &Inner, log_len: u64, report: &mut RecoveryReport) -> u64 {
    let bytes = match fs::read(inner.dir().join(CHECKPOINT_FILE)) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return LOG_HEADER_BYTES,
        Err(e) => {
            report.checkpoint_error = Some(format!("reading the checkpoint: {e}"));
            return LOG_HEADER_BYTES;
        }
    };
    let cold = inner.cold().map_or((0, 0), |c| (c.nonce, c.end.load(Ordering::Acquire)));
    match checkpoint::decode(&bytes, inner.nonce(), log_len, cold) {
        Ok(loaded) => {
            let covered_end = loaded.covered_end;
            inner.restore_checkpoint(loaded);
            report.from_checkpoint = true;
            covered_end
        }
        Err(reason) => {
            report.checkpoint_error = Some(reason);
            LOG_HEADER_BYTES
        }
    }
}

/// Before a rebuild from the log, size the index for the number of distinct keys stored
/// (HyperLogLog estimate over one sequential pass), so replay never grows the table.
/// The pass reads headers and keys without checking checksums (the replay that follows
/// checks every record): a damaged value costs nothing, a damaged key skews the estimate
/// by one, and a damaged header stops the pass early, as before (the index then grows
/// during replay). Skipping the checksums makes this pass a copy out of the page cache.
fn presize_index(inner: &Inner, start: u64, len: u64) {
    const P: u32 = 14;
    let mut regs = vec![0u8; 1 << P];
    let mut puts = 0u64;
    let mut parts = vec![(Arc::clone(inner.log()), start, len)];
    if let Some(c) = inner.cold() {
        parts.push((Arc::clone(&c.log), LOG_HEADER_BYTES, c.end.load(Ordering::Acquire)));
    }
    for (log, from, to) in parts {
        let mut sc = Scanner::new(log, from, to);
        while let Ok(Some((header, key))) = sc.next_key_unchecked() {
            if header.kind == RecordKind::Put {
                puts += 1;
                let h = fawn_ring::key_id(key).low64();
                let rank = ((h << P) | (1 << (P - 1))).leading_zeros() + 1;
                let r = &mut regs[(h >> (64 - P)) as usize];
                *r = (*r).max(rank as u8);
            }
        }
    }
    let m = regs.len() as f64;
    let sum: f64 = regs.iter().map(|&r| (-(r as f64)).exp2()).sum();
    let zeros = regs.iter().filter(|&&r| r == 0).count();
    let mut est = 0.7213 / (1.0 + 1.079 / m) * m * m / sum;
    if est <= 2.5 * m && zeros > 0 {
        est = m * (m / zeros as f64).ln(); // linear counting for small sets
    }
    // +2 %: the estimate's error is ~0.8 %; the growth threshold leaves more headroom.
    let keys = ((est * 1.02) as u64).min(puts);
    if keys > inner.opts().expected_keys {
        inner.presize_index(keys);
    }
}

/// Replay records from `start`; returns the log end after dealing with a bad tail.
/// Records are applied `REPLAY_BATCH_RECORDS` at a time, as a write batch is
/// (`Inner::apply_batch`): one index lock hold and prefetching across many records, instead
/// of two lock holds and a cold probe per record.
fn replay(inner: &Inner, start: u64, len: u64, report: &mut RecoveryReport) -> Result<u64, Error> {
    let mut sc = Scanner::new(Arc::clone(inner.log()), start, len);
    let mut batch = ReplayBatch::default();
    loop {
        let stop = batch.read(&mut sc)?;
        // Everything before the end (or the bad record) is in the index before the tail is
        // dealt with.
        batch.apply(inner, false, report)?;
        match stop {
            BatchEnd::Full => {}
            BatchEnd::LogEnd => return Ok(len),
            BatchEnd::Bad { offset, reason } => {
                return cut_bad_tail(inner, &mut sc, offset, reason, len, report)
            }
        }
    }
}

/// Why `ReplayBatch::read` stopped.
enum BatchEnd {
    /// `REPLAY_BATCH_RECORDS` records read; more may follow.
    Full,
    /// The end of the range.
    LogEnd,
    /// A record that fails its checks, at `offset`.
    Bad { offset: u64, reason: String },
}

/// Records replayed per `Inner::apply_batch` call.
const REPLAY_BATCH_RECORDS: usize = 256;

/// Records read back from the log, waiting to be applied: their keys in one arena.
#[derive(Default)]
struct ReplayBatch {
    keys: Vec<u8>,
    /// Kind, meta, key span in `keys` and record length of each record.
    records: Vec<(RecordKind, Meta, std::ops::Range<usize>, u64)>,
    hashes: Vec<KeyHash>,
    offsets: Vec<u64>,
    /// Seq and tag of each tagged record, in order.
    tags: Vec<(u64, Vec<u8>)>,
}

impl ReplayBatch {
    fn clear(&mut self) {
        self.keys.clear();
        self.records.clear();
        self.hashes.clear();
        self.offsets.clear();
        self.tags.clear();
    }

    fn push(&mut self, offset: u64, header: &record::Header, key: &[u8]) {
        let span = self.keys.len()..self.keys.len() + key.len();
        self.keys.extend_from_slice(key);
        self.records.push((header.kind, header.meta, span, header.total_len() as u64));
        self.hashes.push(KeyHash::of(key));
        self.offsets.push(offset);
    }

    /// Read the next records into the (cleared) batch; I/O errors are returned.
    fn read(&mut self, sc: &mut Scanner) -> Result<BatchEnd, Error> {
        self.clear();
        loop {
            match sc.next_record() {
                Ok(Some((offset, header, bytes))) => {
                    self.push(offset, &header, record::key_of(bytes, &header));
                    if header.tag_len > 0 {
                        self.tags.push((header.meta.seq, record::tag_of(bytes, &header).to_vec()));
                    }
                    if self.offsets.len() == REPLAY_BATCH_RECORDS {
                        return Ok(BatchEnd::Full);
                    }
                }
                Ok(None) => return Ok(BatchEnd::LogEnd),
                Err(Error::Corrupt { offset, reason }) => return Ok(BatchEnd::Bad { offset, reason }),
                Err(e) => return Err(e),
            }
        }
    }

    /// Apply the batch's records (from the cold log with `cold`).
    fn apply(&self, inner: &Inner, cold: bool, report: &mut RecoveryReport) -> Result<(), Error> {
        if self.records.is_empty() {
            return Ok(());
        }
        let records: Vec<Replayed<'_>> = self
            .records
            .iter()
            .map(|(kind, meta, span, len)| Replayed {
                kind: *kind,
                meta: *meta,
                key: &self.keys[span.clone()],
                len: *len,
            })
            .collect();
        let growth = inner.apply_batch(&records, &self.hashes, &self.offsets, cold)?;
        let max_seq = records.iter().map(|r| r.meta.seq).max().unwrap_or(0);
        inner.raise_max_seq(max_seq);
        inner.after_apply(growth);
        if !self.tags.is_empty() {
            let mut tags = inner.counters().recent_tags.lock();
            self.tags.iter().for_each(|(seq, tag)| tags.push(*seq, tag));
        }
        report.records_replayed += records.len() as u64;
        Ok(())
    }
}

/// A record of a `ReplayBatch`, as `Inner::apply_batch` takes it.
struct Replayed<'a> {
    kind: RecordKind,
    meta: Meta,
    key: &'a [u8],
    len: u64,
}

impl AppliedRecord for Replayed<'_> {
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
        self.len
    }
}

/// Replay the whole cold log (before the hot log: every cold record is older), in batches
/// as `replay` does. The cold log was fsynced up to its committed length before that length
/// was committed, so any bad record in it is damage to durable data: open fails.
fn replay_cold(inner: &Inner, report: &mut RecoveryReport) -> Result<(), Error> {
    let Some(cold) = inner.cold() else { return Ok(()) };
    let mut sc = Scanner::new(Arc::clone(&cold.log), LOG_HEADER_BYTES, cold.end.load(Ordering::Acquire));
    let mut batch = ReplayBatch::default();
    loop {
        let stop = batch.read(&mut sc)?;
        batch.apply(inner, true, report)?;
        match stop {
            BatchEnd::Full => {}
            BatchEnd::LogEnd => return Ok(()),
            BatchEnd::Bad { offset, reason } => return Err(Error::Corrupt { offset, reason }),
        }
    }
}

/// Before `salvage` cuts acknowledged records off the log, copy the bytes to
/// `data.log.cut-<offset>` so an operator can still inspect or recover them by hand.
fn keep_cut_bytes(inner: &Inner, from: u64, len: u64) -> Result<(), Error> {
    let path = inner.dir().join(format!("{LOG_FILE}.cut-{from}"));
    let ctx = |e| Error::io("saving the salvaged log tail", e);
    let mut out = File::create(&path).map_err(ctx)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = from;
    while at < len {
        let n = inner.log().read_at(&mut buf[..((len - at) as usize).min(1 << 20)], at)?;
        if n == 0 {
            break;
        }
        std::io::Write::write_all(&mut out, &buf[..n]).map_err(ctx)?;
        at += n as u64;
    }
    out.sync_all().map_err(ctx)?;
    File::open(inner.dir()).and_then(|d| d.sync_all()).map_err(ctx)
}

/// The record at `bad` failed its checks: truncate a torn tail, refuse mid-log damage.
fn cut_bad_tail(
    inner: &Inner,
    sc: &mut Scanner,
    bad: u64,
    reason: String,
    len: u64,
    report: &mut RecoveryReport,
) -> Result<u64, Error> {
    report.corrupt_offset = Some(bad);
    let after = sc.valid_after(bad)?;
    // A later record stamped with a durable offset beyond `bad` proves the bad bytes had
    // been fsynced: this is damage to synced (acknowledged) data, not a torn tail.
    if after.max_durable > bad && !inner.opts().salvage {
        return Err(Error::corrupt(
            bad,
            format!(
                "{reason}; {} valid records follow, written after this offset was fsynced, so this is not a torn \
                 tail (open with Options::salvage to truncate here; the cut bytes are kept)",
                after.records
            ),
        ));
    }
    if after.records > 0 {
        keep_cut_bytes(inner, bad, len)?;
    }
    inner
        .log()
        .set_len(bad)
        .and_then(|()| inner.log().sync_data())
        .map_err(|e| Error::io("truncating the log tail", e))?;
    report.truncated_bytes += len - bad;
    // The bad record itself plus every valid one after it.
    report.dropped_records_estimate = 1 + after.records;
    Ok(bad)
}
