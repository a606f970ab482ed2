//! Split: the keys a filter selects copied into a new datastore, in two halves.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::DataStore;
use crate::error::Error;
use crate::files;
use crate::maint::build::lock_maint;
use crate::maint::copier::{Copier, Limiter, Pending};
use crate::maint::keep::Keep;
use crate::report::{micros_since, LockPhases, MaintenanceKind, MaintenanceReport, SchedClock};
use crate::shared::KeyFilter;
use crate::store::Inner;
use crate::types::{Options, SyncPolicy};

impl DataStore {
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
    pub(crate) fn split_bulk(
        &self,
        belongs: KeyFilter,
        target: &Path,
        options: Options,
        t0: Instant,
    ) -> Result<SplitInProgress, Error> {
        let shared = self.shared();
        let tmp = files::split_tmp(target)?;
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
            outpaced: false,
        };
        let end = src.applied_end();
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
            outpaced: false,
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
            let end = src.applied_end();
            c.rep.locked_catch_up_bytes = end - pos;
            let copied = c.copy(&src, pos, end, &keep, false);
            ph.catch_up_us = micros_since(held);
            ph.catch_up_records = c.rep.records_scanned - records0;
            ph.catch_up_bytes = c.rep.bytes_scanned - bytes0;
            let cut_seq = src.max_seq().max(shared.seq_floor.load(Ordering::Acquire));
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
            files::write_seq_floor(&tmp, cut_seq)?;
            // The new store holds this store's records with their history of drops.
            let drops = shared.drop_floor.load(Ordering::Acquire);
            if drops > 0 {
                files::write_drop_floor(&tmp, drops)?;
            }
            Ok::<_, Error>(())
        })();
        c.rep.log_bytes_after = dst.applied_end();
        let rep = c.rep;
        drop(dst);
        // The new store's checkpoint (written by the close) keeps this store's recent tags:
        // those of the records it took are among them (the others are harmless: a tag only
        // records what its request's outcome was).
        let tags = shared.counters.recent_tags.lock().clone();
        *built.shared().counters.recent_tags.lock() = tags;
        let finished = result.and_then(|()| built.close());
        if let Err(e) = finished {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        // The commit point: the complete store appears under its name.
        fs::rename(&tmp, &begun.target).map_err(|e| Error::io("renaming the split datastore", e))?;
        if let Some(parent) = begun.target.parent().filter(|p| !p.as_os_str().is_empty()) {
            files::sync_dir(parent)?;
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

/// A split whose bulk copy is done ([`DataStore::split_begin`]), to be finished with
/// [`DataStore::split_finish`] on the same store. Dropped unfinished, it removes its
/// directory.
pub struct SplitInProgress {
    pub(crate) built: Option<DataStore>,
    pub(crate) tmp: PathBuf,
    pub(crate) target: PathBuf,
    pub(crate) src: Arc<Inner>,
    pub(crate) belongs: KeyFilter,
    /// The source's hot-log position copied up to.
    pub(crate) pos: u64,
    pub(crate) rep: MaintenanceReport,
    pub(crate) options: Options,
    t0: Instant,
}

impl SplitInProgress {
    pub(crate) fn built(&self) -> Result<&DataStore, Error> {
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
