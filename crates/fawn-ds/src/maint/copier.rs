//! The copier: scans a source log and appends the records the survivor policy keeps to the
//! state being built, in batches, paced to `Options::maintenance_bytes_per_sec`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::limits::{COLD_UNITS_BIT, LOG_HEADER_BYTES, OFFSET_UNIT};
use crate::log::Scanner;
use crate::maint::keep::Keep;
use crate::record;
use crate::report::MaintenanceReport;
use crate::store::{BatchOp, Inner};
use crate::types::{Meta, RecordKind};

/// Unlocked catch-up passes stop once the unscanned tail is at most this many bytes...
pub(crate) const CATCH_UP_LOCKED_BYTES_MAX: u64 = 64 << 10;
/// ...or once a pass finds no less to copy than the one before (writers outpace the copy:
/// each further pass would be longer, without end), or after this many passes: the last
/// unpaced passes and the locked copy take the rest.
pub(crate) const CATCH_UP_PASSES_MAX: usize = 8;

/// Paces scans to `Options::maintenance_bytes_per_sec`.
pub(crate) struct Limiter {
    pub(crate) rate: u64,
    pub(crate) start: Instant,
    pub(crate) bytes: u64,
}

impl Limiter {
    pub(crate) fn new(rate: u64) -> Limiter {
        Limiter { rate, start: Instant::now(), bytes: 0 }
    }

    pub(crate) fn account(&mut self, n: u64) {
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
pub(crate) struct Copier<'a> {
    pub(crate) dst: &'a Inner,
    pub(crate) rep: MaintenanceReport,
    pub(crate) limiter: Limiter,
    pub(crate) cancel: Option<&'a std::sync::atomic::AtomicBool>,
    /// Records waiting to be appended with one write (and whether to the cold log).
    pub(crate) pending: Pending,
    /// A catch-up pass found no less to copy than the one before: no more catch-up passes.
    pub(crate) outpaced: bool,
}

/// Copies collected for one batched append.
#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) records: Vec<Copied>,
    pub(crate) bytes: usize,
    pub(crate) cold: bool,
}

/// Kind, key, value, tag and meta of a record copied, waiting to be appended.
pub(crate) type Copied = (RecordKind, Vec<u8>, Vec<u8>, Vec<u8>, Meta);

/// Copies are appended in batches of about this many bytes (one write each).
pub(crate) const COPY_BATCH_BYTES: usize = 1 << 20;

impl Copier<'_> {
    /// Append the pending copies to the new log.
    pub(crate) fn flush(&mut self) -> Result<(), Error> {
        if self.pending.records.is_empty() {
            return Ok(());
        }
        let ops: Vec<BatchOp<'_>> = self
            .pending
            .records
            .iter()
            .map(|(kind, key, value, tag, meta)| match kind {
                RecordKind::Put => BatchOp::put(key, value, *meta).with_tag(tag),
                RecordKind::Delete => BatchOp::delete(key, *meta).with_tag(tag),
            })
            .collect();
        let written = if self.pending.cold {
            self.dst.write_cold_batch(&ops)
        } else {
            self.dst.write_copies(&ops).map(|_| ())
        };
        drop(ops);
        self.pending.records.clear();
        self.pending.bytes = 0;
        written
    }

    /// Scan `src`'s hot log over `[from, to)` and append the records `keep` wants to the
    /// new hot log.
    pub(crate) fn copy(
        &mut self,
        src: &Inner,
        from: u64,
        to: u64,
        keep: &Keep,
        paced: bool,
    ) -> Result<(), Error> {
        self.copy_log(src, false, from, to, keep, paced, false)
    }

    /// Scan all of `src` (cold log, then hot log up to `to`) and append the records `keep`
    /// wants to the new cold log (`to_cold`) or hot log.
    pub(crate) fn copy_all(&mut self, src: &Inner, to: u64, keep: &Keep, to_cold: bool) -> Result<(), Error> {
        if src.cold().is_some() {
            self.copy_log(src, true, LOG_HEADER_BYTES, src.cold_end(), keep, true, to_cold)?;
        }
        self.copy_log(src, false, LOG_HEADER_BYTES, to, keep, true, to_cold)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn copy_log(
        &mut self,
        src: &Inner,
        cold: bool,
        from: u64,
        to: u64,
        keep: &Keep,
        paced: bool,
        to_cold: bool,
    ) -> Result<(), Error> {
        let log = match (src.cold(), cold) {
            (Some(c), true) => Arc::clone(&c.log),
            (None, true) => return Ok(()),
            (_, false) => Arc::clone(src.log()),
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
                let tag = record::tag_of(bytes, &header).to_vec();
                self.pending.records.push((header.kind, key.to_vec(), value.to_vec(), tag, header.meta));
                self.pending.bytes += total as usize;
                if self.pending.bytes >= COPY_BATCH_BYTES {
                    self.flush()?;
                }
                self.rep.records_written += 1;
                self.rep.bytes_written += total;
                self.dst.counters().cleaning_bytes.fetch_add(total, Ordering::Relaxed);
            }
            if paced {
                self.limiter.account(total);
            }
        }
        self.flush()
    }

    /// Unlocked passes over `src` from `pos` until the remaining tail is small; returns
    /// the position reached.
    pub(crate) fn catch_up(&mut self, src: &Inner, mut pos: u64, keep: &Keep) -> Result<u64, Error> {
        let mut behind_before = u64::MAX;
        for _ in 0..CATCH_UP_PASSES_MAX {
            let behind = src.applied_end().saturating_sub(pos);
            if self.outpaced || behind <= CATCH_UP_LOCKED_BYTES_MAX {
                break;
            }
            if behind >= behind_before {
                self.outpaced = true;
                break;
            }
            behind_before = behind;
            let end = pos + behind;
            self.copy(src, pos, end, keep, true)?;
            pos = end;
        }
        Ok(pos)
    }

    /// One unpaced pass over `src` from `pos` to its current end; returns that end.
    pub(crate) fn last_pass(&mut self, src: &Inner, pos: u64, keep: &Keep) -> Result<u64, Error> {
        let end = src.applied_end();
        if end > pos {
            self.copy(src, pos, end, keep, false)?;
        }
        Ok(end.max(pos))
    }
}
