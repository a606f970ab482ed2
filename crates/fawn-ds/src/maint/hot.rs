//! Hot compaction and the append merge: the hot log's survivors (and a merged-in store's
//! live records) appended to the cold log, then the swap.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::error::Error;
use crate::files::COMPACT_FILE;
use crate::index::KeyHash;
use crate::limits::{COLD_UNITS_BIT, DATASTORE_BYTES_MAX, LOG_HEADER_BYTES, OFFSET_UNIT, RECORD_BYTES_MAX};
use crate::log::Scanner;
use crate::maint::build::{abandon, cold_for, fresh_inner, Sides};
use crate::maint::copier::{Copier, Limiter, Pending};
use crate::maint::keep::Keep;
use crate::maint::swap::finish;
use crate::record;
use crate::report::{MaintenanceKind, MaintenanceReport};
use crate::shared::Shared;
use crate::store::{Inner, Snapshot};
use crate::types::RecordKind;

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
pub(crate) fn compact_hot(shared: &Shared, other: Option<&Shared>) -> Result<MaintenanceReport, Error> {
    let t0 = Instant::now();
    if !shared.opts.hot_cold {
        return Err(Error::InvalidRequest("hot compaction needs Options::hot_cold".into()));
    }
    let kind = if other.is_some() { MaintenanceKind::Merge } else { MaintenanceKind::CompactHot };
    let old = shared.current();
    old.check_writable()?;
    let (cold, cold_out) = cold_for(shared, &old, false)?;
    let path = shared.dir.join(COMPACT_FILE);
    let new = match fresh_inner(shared, &path, 0, Arc::clone(old.lock_file()), Some(cold)) {
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
        outpaced: false,
    };
    let mut other_end = LOG_HEADER_BYTES;
    if let Some((_, oi)) = &sides.other {
        other_end = oi.applied_end();
        if let Err(e) = c.copy_all(oi, other_end, &sides.keep_other, true) {
            abandon(shared, &old, cold_out);
            return Err(e);
        }
    }
    finish(&sides, &new, c, end, other_end, cold_out, t0)
}

/// Bytes a hot compaction collects before one write to the cold log.
pub(crate) const COLD_BATCH_BYTES: usize = 1 << 20;

/// The scan of a hot compaction: snapshot the index (with the log end it reflects), move
/// the survivors below that end to `new`'s cold log, give `new` the updated snapshot.
/// Returns the snapshot's log end (where the catch-up starts).
pub(crate) fn move_hot_to_cold(
    shared: &Shared,
    old: &Inner,
    new: &Inner,
    rep: &mut MaintenanceReport,
) -> Result<u64, Error> {
    let Some(cold) = new.cold() else {
        return Err(Error::InvalidRequest("hot compaction without a cold log".into()));
    };
    // A consistent snapshot, as for a checkpoint: writers pause for one copy of the index.
    // The reclaim estimate of the records below `end` moves with them (they are not
    // re-applied); what the catch-up copies later is noted again as it is applied.
    let Snapshot { mut index, end, cold_live, reclaim } = old.snapshot();
    let mut limiter = Limiter::new(shared.opts.maintenance_bytes_per_sec);
    let start = cold.end.load(Ordering::Acquire);
    let mut flushed = start;
    let mut batch: Vec<u8> = Vec::with_capacity(COLD_BATCH_BYTES + RECORD_BYTES_MAX);
    let mut found = Vec::new();
    let mut max_seq = 0u64;
    let flush = |batch: &mut Vec<u8>, flushed: &mut u64| -> Result<(), Error> {
        cold.log.write_all_at(batch, *flushed).map_err(|e| Error::io("appending to the cold log", e))?;
        *flushed += batch.len() as u64;
        batch.clear();
        Ok(())
    };
    let mut sc = Scanner::new(Arc::clone(old.log()), LOG_HEADER_BYTES, end);
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
        let tag = record::tag_of(bytes, &header);
        record::encode_into(&mut batch, header.kind, key, value, tag, header.meta, LOG_HEADER_BYTES)?;
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
    new.counters().appended_bytes.fetch_add(moved, Ordering::Relaxed);
    new.counters().cleaning_bytes.fetch_add(moved, Ordering::Relaxed);
    cold.end.store(flushed, Ordering::Release);
    new.install_moved(index, reclaim, cold_live + moved, max_seq);
    Ok(end)
}
