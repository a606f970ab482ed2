//! The state a maintenance operation builds: fresh logs, the new `Inner`, its cold log, and
//! the undo when the operation stops before its commit point.

use std::fs::{self, File, OpenOptions};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::Error;
use crate::files::{self, COMPACT_FILE};
use crate::limits::LOG_HEADER_BYTES;
use crate::log::{self, LogFile};
use crate::maint::keep::Keep;
use crate::manifest::{LogState, COLD_NEW_FILE};
use crate::shared::Shared;
use crate::store::{ColdLog, Inner};

/// A new, empty log file at `path` (truncating any leftover) with a fresh nonce.
pub(crate) fn fresh_log(shared: &Shared, path: &Path) -> Result<(LogFile, u64), Error> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| Error::io("creating the maintenance log", e))?;
    let log = LogFile::new(f, shared.opts.faults.clone());
    // Nonce 0 means "no cold log" in the LOGS manifest.
    let nonce = files::new_nonce().max(1);
    log.write_all_at(&log::encode_header(nonce), 0).map_err(|e| Error::io("writing the log header", e))?;
    Ok((log, nonce))
}

/// A new state: an empty hot log at `path`, the given cold log, a fresh index.
pub(crate) fn fresh_inner(
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
pub(crate) enum ColdOut {
    /// The new state has no cold log (`Options::hot_cold` off).
    None,
    /// A new cold log, built as `data.cold.compact`, renamed to `data.cold` after the commit.
    Fresh,
    /// The old state's cold log, appended to in place past its committed length (the value).
    Append(u64),
}

/// The files of a state, as the LOGS manifest names them, with the state's `max_seq` floor.
pub(crate) fn state_of(inner: &Inner, seq_floor: u64) -> LogState {
    LogState {
        hot_nonce: inner.nonce(),
        cold_nonce: inner.cold().map_or(0, |c| c.nonce),
        cold_len: inner.cold_end(),
        seq_floor,
    }
}

/// Undo an operation that did not reach its commit point: the old state stands.
pub(crate) fn abandon(shared: &Shared, old: &Inner, cold_out: ColdOut) {
    let _ = fs::remove_file(shared.dir.join(COMPACT_FILE));
    match cold_out {
        ColdOut::None => {}
        ColdOut::Fresh => {
            let _ = fs::remove_file(shared.dir.join(COLD_NEW_FILE));
        }
        ColdOut::Append(len) => {
            if let Some(c) = old.cold() {
                // Readers of the old state never look past `len`.
                let _ = c.log.set_len(len);
            }
        }
    }
    old.resume_helpers();
}

/// A new cold log for a state being built: a fresh `data.cold.compact`, or the old state's
/// cold log appended to in place.
pub(crate) fn cold_for(shared: &Shared, old: &Inner, fresh: bool) -> Result<(ColdLog, ColdOut), Error> {
    match old.cold() {
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
pub(crate) fn lock_maint(shared: &Shared) -> Result<parking_lot::MutexGuard<'_, ()>, Error> {
    let guard = shared.maint.lock();
    if shared.merge_reserved.load(Ordering::Acquire) {
        return Err(Error::InvalidRequest(
            "a merge of this datastore is half done (merge_range_begin): finish or drop it first".into(),
        ));
    }
    Ok(guard)
}

pub(crate) fn compact_keep(shared: &Shared) -> Keep {
    Keep::Compact {
        watermark: shared.watermark.load(Ordering::Acquire),
        filter: shared.filter.read().clone(),
        now: files::now_secs(),
        dropped: Arc::new(AtomicU64::new(0)),
    }
}

/// The two sides of an operation: this store (and the one merged in).
pub(crate) struct Sides<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) old: Arc<Inner>,
    pub(crate) keep_self: Keep,
    pub(crate) other: Option<(&'a Shared, Arc<Inner>)>,
    pub(crate) keep_other: Keep,
}

/// Raises `shared`'s drop floor to `seq` (persisted first) if it is below.
pub(crate) fn raise_drop_floor(shared: &Shared, seq: u64) -> Result<(), Error> {
    if seq > shared.drop_floor.load(Ordering::Acquire) {
        files::write_drop_floor(&shared.dir, seq)?;
        shared.drop_floor.fetch_max(seq, Ordering::AcqRel);
    }
    Ok(())
}
