//! Incremental index growth: the refresh scan of the logs, in bounded steps, on the
//! migrator thread or in writers that get ahead of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::Inner;
use crate::error::Error;
use crate::index::{GrowthWork, KeyHash, ScanJob};
use crate::limits::{COLD_UNITS_BIT, OFFSET_UNIT};
use crate::log::Scanner;
use crate::record;
use crate::types::RecordKind;

/// Log bytes one background growth step scans (the scanner reads 1 MiB at a time).
const GROWTH_SCAN_BYTES: u64 = 1 << 20;
/// Scanned records whose old-table entries one index-lock hold moves (tens of µs).
const GROWTH_APPLY_RECORDS: usize = 512;

impl Inner {
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
    pub(super) fn scan_for_growth(
        &self,
        turn: &mut Option<(u64, bool, Scanner)>,
        job: &ScanJob,
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
    pub(super) fn note_growth_hold(&self, start: Instant) {
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
}
