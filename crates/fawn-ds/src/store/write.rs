//! The write path of `Inner`: appends (single and batched), padding, index updates.

use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;

use super::{record_len, AppliedRecord, BatchOp, Existing, Growth, Inner, WriterState, PAGE};
use crate::error::Error;
use crate::index::{KeyHash, PREFETCH_AHEAD};
use crate::limits::{COLD_UNITS_BIT, DATASTORE_BYTES_MAX, LOG_HEADER_BYTES, OFFSET_UNIT};
use crate::reclaim::Reclaim;
use crate::record;
use crate::types::{Meta, RecordKind};

/// New keys of a batch one index-lock hold inserts (`Inner::apply_batch`): few enough that
/// a lookup waits only a few µs behind the hold (an insert is a handful of cache misses),
/// many enough that the lock's own cost is shared by many records.
const APPLY_RUN_RECORDS: usize = 64;

/// The key and length of the op among `ops` (applied at `offsets`, ascending, in the cold
/// log with `cold`) whose record is at `units`, if one is: the record there holds its key.
fn earlier_op<'a, R: AppliedRecord>(
    ops: &'a [R],
    offsets: &[u64],
    cold: bool,
    units: u32,
) -> Option<(&'a [u8], u64)> {
    if (units & COLD_UNITS_BIT != 0) != cold {
        return None;
    }
    let offset = (units & !COLD_UNITS_BIT) as u64 * OFFSET_UNIT;
    let j = offsets.binary_search(&offset).ok()?;
    let op = ops.get(j)?;
    Some((op.key(), op.len()))
}

impl Inner {
    /// Append one record and update the index; returns the new log end.
    pub fn write(&self, kind: RecordKind, key: &[u8], value: &[u8], meta: Meta) -> Result<u64, Error> {
        self.check_key(key)?;
        self.check_value(value)?;
        self.check_writable()?;
        let buf = record::encode(kind, key, value, &[], meta, self.durable.load(Ordering::Acquire))?;
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
    /// Nothing is written when any op is invalid. The ops' tags are kept as the latest
    /// (`Counters::recent_tags`).
    pub fn write_batch(&self, ops: &[BatchOp<'_>]) -> Result<u64, Error> {
        self.append_batch(ops, true)
    }

    /// `write_batch` of maintenance copies: their tags are in the log again, but are not
    /// the latest (each was kept when its record was first written).
    pub(crate) fn write_copies(&self, ops: &[BatchOp<'_>]) -> Result<u64, Error> {
        self.append_batch(ops, false)
    }

    fn append_batch(&self, ops: &[BatchOp<'_>], keep_tags: bool) -> Result<u64, Error> {
        for op in ops {
            self.check_key(op.key)?;
            self.check_value(op.value)?;
            record::check_tag(op.tag)?;
        }
        self.check_writable()?;
        let hashes: Vec<KeyHash> = ops.iter().map(|op| KeyHash::of(op.key)).collect();
        let bytes: usize = ops.iter().map(|op| record_len(op.key, op.value, op.tag)).sum();
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
                let pad = self.padding_before(base + buf.len() as u64, record_len(op.key, op.value, op.tag));
                if pad > 0 {
                    record::encode_pad(&mut buf, pad)?;
                }
                offsets.push(base + buf.len() as u64);
                sealing.push((buf.len(), record::body_len(op.key, op.value, op.tag)));
                record::encode_unsealed(&mut buf, op.kind, op.key, op.value, op.tag, op.meta, durable);
            }
            record::seal_records(&mut buf, &sealing);
            for (op, &(start, _)) in group.iter().zip(&sealing) {
                record::check_encoded(&buf[start..], op.kind, op.key, op.value, op.tag, op.meta, durable)?;
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
        if keep_tags && ops.iter().any(|op| !op.tag.is_empty()) {
            let mut tags = self.counters.recent_tags.lock();
            ops.iter().for_each(|op| tags.push(op.meta.seq, op.tag));
        }
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
                    if let Some(&ahead) = hashes.get(i + PREFETCH_AHEAD) {
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
                // After the append: an earlier op of this batch on the same key is found too,
                // and compared with the op's key instead of read back.
                let op = &ops[i];
                let ahead = hashes.get(i + PREFETCH_AHEAD).copied();
                let earlier = |units: u32| earlier_op(ops, &offsets[..i], cold, units);
                let existing = self.find_existing_ahead(hashes[i], op.key(), ahead, earlier)?;
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
    pub(super) fn padding_before(&self, at: u64, len: usize) -> usize {
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
        let mut buf = Vec::with_capacity(ops.iter().map(|op| record_len(op.key, op.value, op.tag)).sum());
        let mut offsets = Vec::with_capacity(ops.len());
        for op in ops {
            let pad = self.cold_padding_before(base + buf.len() as u64, record_len(op.key, op.value, op.tag));
            if pad > 0 {
                record::encode_pad(&mut buf, pad)?;
            }
            offsets.push(base + buf.len() as u64);
            // The cold log is fsynced as a whole before it is committed; the stamp is unused.
            record::encode_into(&mut buf, op.kind, op.key, op.value, op.tag, op.meta, LOG_HEADER_BYTES)?;
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
            let g = self.apply(
                op.kind,
                &op.meta,
                kh,
                existing,
                units,
                record_len(op.key, op.value, op.tag) as u64,
            );
            growth = Growth { started: growth.started || g.started, behind: g.behind };
            self.max_seq.fetch_max(op.meta.seq, Ordering::AcqRel);
        }
        drop(w);
        self.after_apply(growth);
        Ok(())
    }

    /// Write `buf` at the log end. On failure the partial record is cut off again; if that
    /// is impossible, or the failure was not ENOSPC, the store is poisoned.
    pub(super) fn append(
        &self,
        w: &mut MutexGuard<'_, WriterState>,
        offset: u64,
        buf: &[u8],
    ) -> Result<(), Error> {
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
}
