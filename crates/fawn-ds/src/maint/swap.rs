//! The end of every compaction and merge: catch up, make the new state durable, take the
//! brief lock, commit (`rename`), publish the new state.

use std::fs;
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

/// The rest of a compaction/merge after the main scan: unlocked catch-up, the new logs made
/// durable, the LOGS manifest, rounds of catch-up + sync until little of the new log is
/// unsynced, the MAXSEQ floor if needed, a last pass; then the brief lock (the tail that
/// arrived meanwhile, MAXSEQ again only if that tail needs it, the commit `rename`, the
/// in-memory swap); then the cold log renamed into place. The old state is freed after the
/// release (the caller holds it). `MaintenanceReport::lock` says where the hold went.
pub(crate) fn finish(
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
            files::write_seq_floor(&shared.dir, top)?;
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
            files::write_seq_floor(&shared.dir, top)?;
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
        .and_then(|()| files::sync_dir(&shared.dir))
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
