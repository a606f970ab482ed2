//! Durability of `Inner`: group commit (`sync_to`) and automatic checkpoints.

use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;

use super::Inner;
use crate::checkpoint;
use crate::error::Error;
use crate::files;
use crate::types::SyncPolicy;

/// Automatic checkpoints are at least this many times the last checkpoint's size apart
/// (in log bytes appended), so checkpoint writes stay under ~1/32 of the log writes.
const CHECKPOINT_SPACING: u64 = 32;

impl Inner {
    /// Make the log durable at least up to `target`. Group commit: one thread (the leader)
    /// runs `fdatasync` covering everything appended so far; others wait for it.
    pub fn sync_to(&self, target: u64) -> Result<(), Error> {
        if self.dir_sync_pending.load(Ordering::Acquire) {
            self.check_writable()?;
            if let Err(e) = files::sync_dir(&self.dir) {
                self.poisoned.store(true, Ordering::Release);
                return Err(e);
            }
            self.dir_sync_pending.store(false, Ordering::Release);
        }
        let mut s = self.sync.lock();
        loop {
            self.check_writable()?;
            if s.synced >= target {
                return Ok(());
            }
            if s.leader {
                self.sync_cv.wait(&mut s);
                continue;
            }
            s.leader = true;
            let upto = self.written_end.load(Ordering::Acquire);
            let result = MutexGuard::unlocked(&mut s, || self.log.sync_data());
            self.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
            s.leader = false;
            self.sync_cv.notify_all();
            if let Err(e) = result {
                // The kernel may have dropped the dirty pages: we cannot know what is durable.
                self.poisoned.store(true, Ordering::Release);
                return Err(Error::io("syncing the log", e));
            }
            s.synced = s.synced.max(upto);
            self.durable.fetch_max(s.synced, Ordering::AcqRel);
        }
    }

    pub(crate) fn synced(&self) -> u64 {
        self.sync.lock().synced
    }

    /// Work after a write returned from the writer lock: durability, auto checkpoint.
    pub(crate) fn after_write(&self, end: u64) -> Result<(), Error> {
        if self.opts.sync == SyncPolicy::Always {
            self.sync_to(end)?;
        }
        // Also at least CHECKPOINT_SPACING × the last image: at millions of keys a fixed
        // interval would write more checkpoint bytes than log bytes.
        let every = match self.opts.checkpoint_every_bytes {
            0 => 0,
            n => n.max(self.ckpt_image_bytes.load(Ordering::Relaxed).saturating_mul(CHECKPOINT_SPACING)),
        };
        // try_lock: a writer never waits behind a checkpoint another thread is writing.
        let last = self.ckpt.try_lock().map(|g| *g);
        if every > 0 && last.is_some_and(|last| end.saturating_sub(last) >= every) {
            self.start_auto_checkpoint();
        }
        Ok(())
    }

    /// Write an automatic checkpoint on a helper thread: at millions of keys it takes a
    /// good fraction of a second, which no writer should wait for.
    pub(crate) fn start_auto_checkpoint(&self) {
        let mut m = self.migrator.lock();
        let busy = m.checkpointer.as_ref().is_some_and(|h| !h.is_finished());
        if busy || m.stop.load(Ordering::Acquire) {
            return;
        }
        let Some(weak) = self.this.get().cloned() else { return };
        let spawned = std::thread::Builder::new().name("fawn-ds-checkpoint".into()).spawn(move || {
            if let Some(inner) = weak.upgrade() {
                if inner.write_checkpoint().is_err() {
                    inner.counters.checkpoint_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        match spawned {
            Ok(h) => m.checkpointer = Some(h),
            Err(_) => {
                self.counters.checkpoint_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Write a checkpoint of the current index. Skipped when nothing was appended since the last.
    pub(crate) fn write_checkpoint(&self) -> Result<(), Error> {
        self.checkpoint_unless_current(true)
    }

    /// Write a checkpoint of the current index and recent tags, also when nothing was appended
    /// since the last one (tags were adopted: `DataStore::adopt_tags`).
    pub(crate) fn write_checkpoint_of_tags(&self) -> Result<(), Error> {
        self.checkpoint_unless_current(false)
    }

    fn checkpoint_unless_current(&self, skip_current: bool) -> Result<(), Error> {
        let mut last = self.ckpt.lock();
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        // Snapshot under the writer lock: index, end and max seq must agree.
        let (index, end, max_seq, live_bytes, cold_live, tags) = {
            let w = self.writer.lock();
            let index = self.index.read().clone();
            let live = self.live_bytes.load(Ordering::Acquire);
            let cold_live = self.cold_live_bytes.load(Ordering::Acquire);
            // The tags as the checkpoint stores them: one copy of their bytes.
            let mut tags = Vec::new();
            self.counters.recent_tags.lock().encode(&mut tags);
            (index, w.end, self.max_seq.load(Ordering::Acquire), live, cold_live, tags)
        };
        if skip_current && end == *last {
            return Ok(());
        }
        // The checkpoint must only cover durable log bytes: otherwise a power loss could leave
        // a checkpoint pointing at records that never reached the disk.
        self.sync_to(end)?;
        let cold = self.cold.as_ref().map_or((0, 0), |c| (c.nonce, c.end.load(Ordering::Acquire)));
        let sums = checkpoint::Sums {
            covered_end: end,
            max_seq,
            live_bytes,
            cold_nonce: cold.0,
            cold_len: cold.1,
            cold_live,
        };
        let bytes = checkpoint::encode(self.nonce, &sums, &index, &tags);
        drop(index);
        checkpoint::replace_file(&self.dir, &bytes)?;
        self.ckpt_image_bytes.store(bytes.len() as u64, Ordering::Relaxed);
        *last = end;
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
