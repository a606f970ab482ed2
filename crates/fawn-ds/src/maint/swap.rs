//! The end of every compaction and merge: catch up, make the new state durable, take the
//! brief lock, commit (`rename`), publish the new state.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::error::Error;
use crate::files::{self, CHECKPOINT_FILE, COMPACT_FILE, LOG_FILE};
use crate::limits::LOG_HEADER_BYTES;
use crate::maint::build::{abandon, raise_drop_floor, state_of, ColdOut, Sides};
use crate::maint::copier::Copier;
use crate::manifest::{self, Manifest, COLD_FILE, COLD_NEW_FILE};
use crate::report::{micros_since, LockPhases, MaintenanceReport, SchedClock};
use crate::store::Inner;
use crate::types::SyncPolicy;

/// Rounds of (catch up, sync the new log) before the lock, until at most
/// `PRE_LOCK_UNSYNCED_BYTES_MAX` of the new log is unsynced when the lock is taken.
pub(crate) const PRE_LOCK_SYNC_ROUNDS_MAX: usize = 4;
/// The unsynced part of the new log at which those rounds stop.
pub(crate) const PRE_LOCK_UNSYNCED_BYTES_MAX: u64 = 256 << 10;
/// Unpaced passes right before the lock stop when one copied at most this many bytes...
pub(crate) const LAST_PASS_DONE_BYTES: u64 = 16 << 10;
/// ...or after this many.
pub(crate) const LAST_PASSES_MAX: usize = 4;

/// The rest of a compaction/merge after the main scan, in three phases: `before_lock`
/// (unlocked catch-up, the LOGS manifest, the new logs made durable, the floors, the last
/// passes), `lock_and_commit` (the brief lock: the tail that arrived meanwhile, MAXSEQ again
/// only if that tail needs it, the commit `rename`, the in-memory swap) and `after_commit`
/// (the cold log renamed into place, the directory synced, helpers restarted, counters). The
/// old state is freed after the release (the caller holds it). `MaintenanceReport::lock`
/// says where the hold went. Until the commit `rename`, a failure leaves the old state.
pub(crate) fn finish(
    sides: &Sides,
    new: &Arc<Inner>,
    c: Copier,
    pos: u64,
    other_pos: u64,
    cold_out: ColdOut,
    t0: Instant,
) -> Result<MaintenanceReport, Error> {
    let mut swap = Swap {
        sides,
        new,
        c,
        pos,
        other_pos,
        covered: [LOG_HEADER_BYTES; 2],
        compact_path: sides.shared.dir.join(COMPACT_FILE),
        // Fixed: the merged-in store's maintenance lock is held.
        other_floor: sides.other.as_ref().map_or(0, |(o, _)| o.seq_floor.load(Ordering::Acquire)),
    };
    if let Err(e) = swap.before_lock() {
        abandon(sides.shared, &sides.old, cold_out);
        return Err(e);
    }
    swap.lock_and_commit(cold_out)?;
    swap.after_commit(cold_out, t0)
}

/// A compaction or merge from its main scan to its end: the new state, the copier and the
/// positions in the source logs it has copied up to.
struct Swap<'a> {
    sides: &'a Sides<'a>,
    new: &'a Arc<Inner>,
    c: Copier<'a>,
    /// Copied up to here in this store's hot log...
    pos: u64,
    /// ...and in the merged-in store's.
    other_pos: u64,
    /// The positions in the old hot log (and in `other`'s) below which every copy is durable
    /// in the new log. A record a source log holds durably (a `sync()`, the interval thread,
    /// `Always`) must be durable in the new log before the rename makes it the store's,
    /// whatever the policy: the old log is gone after it, and a merged store is usually
    /// dropped once the merge returns.
    covered: [u64; 2],
    /// The new hot log's name until the commit `rename`.
    compact_path: PathBuf,
    /// The merged-in store's persisted `max_seq` floor (0 without one).
    other_floor: u64,
}

impl Swap<'_> {
    /// Phase 1, unlocked: everything that can be done before the lock, so that the lock
    /// covers only a small tail and no `fdatasync` that could have been done before it.
    fn before_lock(&mut self) -> Result<(), Error> {
        self.catch_up()?;
        self.write_manifest()?;
        if let Some(cold) = self.new.cold() {
            // The cold log is complete: durable before the commit point makes it the state.
            cold.log.sync_data().map_err(|e| Error::io("syncing the cold log", e))?;
        }
        self.sync_new(self.new.applied_end())?;
        // No checkpoint of the old log may be written after the swap.
        self.sides.old.stop_migrator();
        self.catch_up_and_sync()?;
        // Under `Always` the lock must sync whatever of the new log is unsynced before the
        // commit `rename`: leave it only what the last passes and the locked tail copy, since
        // an `fdatasync` under the lock is writer-visible latency.
        if self.sides.shared.opts.sync == SyncPolicy::Always {
            self.sync_new(self.new.written_end())?;
        }
        self.persist_seq_floor()?;
        // Likewise the drop floor, for what the scans dropped so far (a floor written and
        // then abandoned by a crash before the rename is only conservative).
        raise_drop_floor(self.sides.shared, drop_top(self.sides))?;
        self.last_passes()?;
        self.sync_if_behind()
    }

    /// Unlocked catch-up passes over both stores (this store's again after `other`'s).
    fn catch_up(&mut self) -> Result<(), Error> {
        let sides = self.sides;
        self.pos = self.c.catch_up(&sides.old, self.pos, &sides.keep_self)?;
        if let Some((_, oi)) = &sides.other {
            self.other_pos = self.c.catch_up(oi, self.other_pos, &sides.keep_other)?;
            self.pos = self.c.catch_up(&sides.old, self.pos, &sides.keep_self)?;
        }
        Ok(())
    }

    /// Names the new state next to the old one; the hot rename (the commit point) picks
    /// between them, so a crash before it leaves the old state. The new state's `max_seq`
    /// floor includes the merged-in store's (its `MAXSEQ`: seqs of records it dropped, which
    /// its log no longer shows): that floor must not reach this store's `MAXSEQ` before the
    /// commit point, so the manifest carries it (docs/FORMAT.md §7.2, §8).
    fn write_manifest(&self) -> Result<(), Error> {
        let shared = self.sides.shared;
        let floor = shared.seq_floor.load(Ordering::Acquire);
        let next = state_of(self.new, floor.max(self.other_floor));
        manifest::write(&shared.dir, &Manifest { next, prev: state_of(&self.sides.old, floor) })
    }

    /// The syncs and the join took time: catch up what was appended meanwhile, so the lock
    /// only covers a small tail. Then sync what that catch-up wrote and catch up again, until
    /// little of the new log is unsynced: the commit `rename` replaces an existing file, and
    /// ext4 (auto_da_alloc) then starts writeback of the new file's dirty pages inside the
    /// `rename`, under the lock; a merge, whose long cold-log sync lets much catch-up pile
    /// up, would otherwise pay for it there. Durability is unchanged: these are extra syncs
    /// of records the new log holds anyway, before the commit point.
    fn catch_up_and_sync(&mut self) -> Result<(), Error> {
        let sides = self.sides;
        for round in 1..=PRE_LOCK_SYNC_ROUNDS_MAX {
            if let Some((_, oi)) = &sides.other {
                self.other_pos = self.c.catch_up(oi, self.other_pos, &sides.keep_other)?;
            }
            self.pos = self.c.catch_up(&sides.old, self.pos, &sides.keep_self)?;
            let written = self.new.written_end();
            if written.saturating_sub(self.new.synced()) <= PRE_LOCK_UNSYNCED_BYTES_MAX
                || round == PRE_LOCK_SYNC_ROUNDS_MAX
            {
                return Ok(());
            }
            self.sync_new(written)?;
        }
        Ok(())
    }

    /// The `MAXSEQ` floor, if the new log lacks this store's highest seq so far (its record
    /// was dropped): written here, not under the lock. A floor is a lower bound of `max_seq`
    /// that must not exceed the old state's: `top` is the old state's `max_seq` now, which
    /// only grows, so a crash at any point after this write leaves the old state
    /// (max_seq >= top) or the new one (which needs the floor) correct. The lock re-checks
    /// for records that arrive meanwhile (rarely needed).
    fn persist_seq_floor(&self) -> Result<(), Error> {
        let shared = self.sides.shared;
        let top = self.sides.old.max_seq();
        if self.new.max_seq() < top && shared.seq_floor.load(Ordering::Acquire) < top {
            files::write_seq_floor(&shared.dir, top)?;
            shared.seq_floor.fetch_max(top, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Last unpaced passes over whatever is left (the catch-up passes leave up to
    /// `CATCH_UP_LOCKED_BYTES_MAX`, and the syncs let more arrive), until a pass finds
    /// little: the lock then copies only what arrives during that pass, because the locked
    /// copy's CPU time (and any preemption of the holder meanwhile) is writer latency.
    ///
    /// First give up the CPU once: when this thread runs again it starts a fresh time slice,
    /// so the passes and the short hold after them are less likely to be cut by a preemption
    /// (writers wait for the whole time the holder is off the CPU). Costs a little
    /// maintenance time, never writer time: the lock is not held yet.
    fn last_passes(&mut self) -> Result<(), Error> {
        std::thread::yield_now();
        for _ in 0..LAST_PASSES_MAX {
            let before = self.pos + self.other_pos;
            self.last_pass()?;
            if self.pos + self.other_pos - before <= LAST_PASS_DONE_BYTES {
                break;
            }
        }
        Ok(())
    }

    /// One unpaced pass over both stores (`other` first).
    fn last_pass(&mut self) -> Result<(), Error> {
        let sides = self.sides;
        if let Some((_, oi)) = &sides.other {
            self.other_pos = self.c.last_pass(oi, self.other_pos, &sides.keep_other)?;
        }
        self.pos = self.c.last_pass(&sides.old, self.pos, &sides.keep_self)?;
        Ok(())
    }

    /// The old log was synced past what the new log has durable (records copied since the
    /// last sync of the new log were made durable in the old one meanwhile): sync the new log
    /// now, outside the lock; the lock re-checks for a sync of the old log since.
    fn sync_if_behind(&mut self) -> Result<(), Error> {
        if self.behind() {
            self.sync_new(self.new.written_end())?;
            // Writes went on during the sync: one more pass, so the lock copies little.
            self.last_pass()?;
        }
        Ok(())
    }

    /// A source log was synced past `covered` since the last sync of the new log.
    fn behind(&self) -> bool {
        let sides = self.sides;
        sides.old.synced() > self.covered[0]
            || sides.other.as_ref().is_some_and(|(_, oi)| oi.synced() > self.covered[1])
    }

    /// Syncs the new log up to `upto`; the positions copied up to are then covered.
    fn sync_new(&mut self, upto: u64) -> Result<(), Error> {
        sync_new(self.new, upto, [self.pos, self.other_pos], &mut self.covered)
    }

    /// Phase 2, the brief lock: no writer is appending to either store while it is held.
    /// Copies the tail, commits (`rename`) and publishes the new state; on an error before
    /// the commit the old state stands (`abandon`).
    fn lock_and_commit(&mut self, cold_out: ColdOut) -> Result<(), Error> {
        let (shared, old) = (self.sides.shared, &self.sides.old);
        let clock = SchedClock::open();
        let mut ph = LockPhases::default();
        let wait0 = Instant::now();
        let mut cur = shared.cur.write();
        let other_guard = self.sides.other.as_ref().map(|(o, _)| o.cur.write());
        let held = Instant::now();
        let at_acquire = clock.sample();
        ph.wait_us = (held - wait0).as_micros() as u64;
        self.c.rep.lock_wait_us = ph.wait_us;
        if let Err(e) = self.locked_commit(&mut ph) {
            drop(other_guard);
            drop(cur);
            abandon(shared, old, cold_out);
            return Err(e);
        }
        self.publish(&mut cur, &mut ph);
        let t = Instant::now();
        drop(other_guard);
        drop(cur);
        ph.release_us = micros_since(t);
        let hold_us = held.elapsed().as_micros() as u64;
        let at_release = clock.sample();
        ph.hold_us = hold_us;
        ph.account(at_acquire, at_release);
        self.c.rep.lock_hold_us = hold_us;
        self.c.rep.lock = ph;
        Ok(())
    }

    /// Under the lock: the last tail of both stores, the floors that tail needs, the tail
    /// made durable if it must be, and the commit `rename`.
    fn locked_commit(&mut self, ph: &mut LockPhases) -> Result<(), Error> {
        let sides = self.sides;
        let (shared, old, new) = (sides.shared, &sides.old, self.new);
        let c = &mut self.c;
        let t = Instant::now();
        let (records0, bytes0) = (c.rep.records_scanned, c.rep.bytes_scanned);
        let end = old.applied_end();
        c.rep.locked_catch_up_bytes = end - self.pos;
        c.copy(old, self.pos, end, &sides.keep_self, false)?;
        let mut other_top = 0;
        if let Some((_, oi)) = &sides.other {
            let oend = oi.applied_end();
            c.rep.locked_catch_up_bytes += oend - self.other_pos;
            c.copy(oi, self.other_pos, oend, &sides.keep_other, false)?;
            // `other`'s highest seq in its logs is its latest record, always carried (live put
            // or delete); above that, its floor (persisted in the manifest as the new state's).
            other_top = oi.max_seq().max(self.other_floor);
            c.rep.log_bytes_before += oend + oi.cold_end();
        }
        c.rep.log_bytes_before += end + old.cold_end();
        ph.catch_up_us = micros_since(t);
        ph.catch_up_records = c.rep.records_scanned - records0;
        ph.catch_up_bytes = c.rep.bytes_scanned - bytes0;
        // This store's highest seq may have been in a dropped record: persist it first. (Only
        // this store's: a floor above the old state would survive a crash before the rename.)
        let t = Instant::now();
        let top = old.max_seq().max(shared.seq_floor.load(Ordering::Acquire));
        if new.max_seq() < top && shared.seq_floor.load(Ordering::Acquire) < top {
            files::write_seq_floor(&shared.dir, top)?;
            shared.seq_floor.fetch_max(top, Ordering::AcqRel);
            ph.seq_floor_us = micros_since(t);
        }
        // What the locked pass dropped too (rarely raises it).
        raise_drop_floor(shared, drop_top(sides))?;
        new.raise_max_seq(top.max(other_top));
        // Under `Always` the tail holds acknowledged-durable writes: they must be durable
        // in the new log before it replaces the old one. Otherwise the tail (at most the
        // last catch-up pass) is synced right after the lock is released, like any
        // recent write under `Interval`/`Never` (the bulk of the new log already is) —
        // unless a source log was synced past `covered` since the last sync of the new one
        // (a `sync()` or the interval thread during the last passes): then those records
        // are durable and must stay so.
        if shared.opts.sync == SyncPolicy::Always || self.behind() {
            let t = Instant::now();
            new.sync_to(new.applied_end())?;
            ph.tail_sync_us = micros_since(t);
        }
        // The commit point.
        let t = Instant::now();
        fs::rename(&self.compact_path, shared.dir.join(LOG_FILE))
            .map_err(|e| Error::io("renaming the compacted log", e))?;
        ph.rename_us = micros_since(t);
        Ok(())
    }

    /// Under the lock, after the commit: the new state becomes the current one.
    fn publish(&self, cur: &mut Arc<Inner>, ph: &mut LockPhases) {
        let shared = self.sides.shared;
        // Committed: the manifest's new state holds the merged-in store's floor.
        shared.seq_floor.fetch_max(self.other_floor, Ordering::AcqRel);
        // Under `Always`, writes acknowledged after the lock is released are durable in the
        // new log only if its name is. A directory fsync under the lock would be writer
        // latency, so the new state is published with a pending directory sync instead: its
        // `sync_to`, which every `Always` write runs before it returns, syncs the directory
        // first while that is pending, and this thread does it right after the release.
        if shared.opts.sync == SyncPolicy::Always {
            self.new.set_dir_sync_pending(true);
        }
        // The merged-in store's records are this store's now, and so are their tags: kept
        // before any checkpoint of the new state can be written.
        if let Some((other, _)) = &self.sides.other {
            shared.counters.recent_tags.lock().absorb(&other.counters.recent_tags.lock());
        }
        let t = Instant::now();
        self.new.register();
        *cur = Arc::clone(self.new);
        ph.swap_us = micros_since(t);
    }

    /// Phase 3, after the release: the cold log placed under its name, the directory synced,
    /// the new state's helpers started, the counters; returns the report.
    fn after_commit(mut self, cold_out: ColdOut, t0: Instant) -> Result<MaintenanceReport, Error> {
        let (shared, old, new) = (self.sides.shared, &self.sides.old, self.new);
        // The rename is durable once the directory is; the old checkpoint is useless now.
        let _ = fs::remove_file(shared.dir.join(CHECKPOINT_FILE));
        // The cold log of the new state under its name (open does this too after a crash).
        let cold_placed = match cold_out {
            ColdOut::Fresh => fs::rename(shared.dir.join(COLD_NEW_FILE), shared.dir.join(COLD_FILE)),
            ColdOut::None if old.cold().is_some() => fs::remove_file(shared.dir.join(COLD_FILE)),
            ColdOut::None | ColdOut::Append(_) => Ok(()),
        }
        .map_err(|e| Error::io("placing the cold log", e));
        let dir_synced = cold_placed
            .and_then(|()| new.sync_to(new.written_end()))
            .and_then(|()| files::sync_dir(&shared.dir))
            .map(|()| new.set_dir_sync_pending(false));
        new.start_migrator();
        new.start_auto_checkpoint();
        let rep = &mut self.c.rep;
        rep.log_bytes_after = new.applied_end() + new.cold_end();
        rep.duration_us = t0.elapsed().as_micros() as u64;
        let counters = &shared.counters;
        counters.maintenance_ops.fetch_add(1, Ordering::Relaxed);
        counters.last_maintenance_us.store(rep.duration_us, Ordering::Relaxed);
        counters.last_lock_hold_us.store(rep.lock_hold_us, Ordering::Relaxed);
        counters.max_lock_hold_us.fetch_max(rep.lock_hold_us, Ordering::Relaxed);
        *counters.last_lock_phases.lock() = rep.lock.clone();
        dir_synced?;
        Ok(self.c.rep)
    }
}

/// Syncs the new log up to `upto`; the sources' positions `at` (this store's, `other`'s)
/// are then covered: every copy of a record below them is durable in the new log.
pub(crate) fn sync_new(new: &Inner, upto: u64, at: [u64; 2], covered: &mut [u64; 2]) -> Result<(), Error> {
    new.sync_to(upto)?;
    *covered = at;
    Ok(())
}

/// The drop floor the new state of `sides` needs: what its scans dropped for age or key, and
/// the merged-in store's own floor (its records come with their history).
pub(crate) fn drop_top(sides: &Sides) -> u64 {
    let other = sides.other.as_ref().map_or(0, |(o, _)| o.drop_floor.load(Ordering::Acquire));
    sides.keep_self.dropped_max().max(sides.keep_other.dropped_max()).max(other)
}
