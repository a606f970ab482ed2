//! What every handle of one datastore shares: the current engine state (`Inner`, replaced
//! atomically by maintenance), the maintenance settings and floors, and the helper threads
//! (`Background`). Also the policies the data path asks of maintenance (write stalls).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::store::{Counters, Inner};
use crate::types::Options;

/// A helper thread with a stop flag.
#[derive(Debug)]
pub(crate) struct Background {
    pub stop: Arc<(Mutex<bool>, Condvar)>,
    pub handle: Option<JoinHandle<()>>,
}
impl Background {
    /// A named thread that runs `tick` every `every` until shut down or until the store is
    /// dropped (it holds only a weak reference, so it never keeps a closed store alive).
    pub(crate) fn spawn_periodic(
        shared: &Arc<Shared>,
        name: &str,
        every: Duration,
        tick: impl Fn(&Shared) + Send + 'static,
    ) -> std::io::Result<Background> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stop2 = Arc::clone(&stop);
        let weak = Arc::downgrade(shared);
        let handle = std::thread::Builder::new().name(name.into()).spawn(move || loop {
            {
                let mut stopped = stop2.0.lock();
                if !*stopped {
                    stop2.1.wait_for(&mut stopped, every);
                }
                if *stopped {
                    return;
                }
            }
            let Some(shared) = weak.upgrade() else { return };
            tick(&shared);
        })?;
        Ok(Background { stop, handle: Some(handle) })
    }

    pub(crate) fn shutdown(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// A caller-supplied key predicate: `true` = the key belongs to this datastore.
pub type KeyFilter = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// What every handle shares: the current engine state (`Inner`, replaced atomically by
/// compaction and merge) and the maintenance settings.
pub(crate) struct Shared {
    /// The current log + index. Writers hold a read guard for the whole append, so taking
    /// the write guard (maintenance's brief lock) waits for in-flight appends and blocks
    /// new ones; readers only clone the `Arc`.
    pub cur: RwLock<Arc<Inner>>,
    pub dir: PathBuf,
    pub opts: Options,
    pub counters: Arc<Counters>,
    /// One maintenance operation at a time.
    pub maint: Mutex<()>,
    /// Delete records with `seq <=` this may be dropped by compaction.
    pub watermark: AtomicU64,
    /// Keys outside this filter are dropped by compaction.
    pub filter: RwLock<Option<KeyFilter>>,
    /// Persisted lower bound of `max_seq` (the `MAXSEQ` file, `files::write_seq_floor`).
    pub seq_floor: AtomicU64,
    /// Persisted upper bound of the seqs compaction dropped for age or key (see
    /// `DataStore::dropped_seq_max`).
    pub drop_floor: AtomicU64,
    /// The automatic compactor.
    pub auto: Mutex<Option<Background>>,
    /// Set when the store closes: running maintenance stops (the old state stands).
    pub cancel: AtomicBool,
    /// A merge into or out of this store is half done (`DataStore::merge_range_begin`):
    /// no other maintenance may replace its logs until it is finished or dropped.
    pub merge_reserved: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("dir", &self.dir).finish()
    }
}

impl Shared {
    /// The current engine state.
    pub fn current(&self) -> Arc<Inner> {
        Arc::clone(&self.cur.read())
    }

    /// Whether writers should be slowed down: automatic compaction is on and garbage is far
    /// past its thresholds (`Options::stall_garbage_ratio`).
    pub(crate) fn over_stall_limit(&self) -> bool {
        let ratio = self.opts.stall_garbage_ratio;
        if !self.opts.auto_compact || ratio <= 0.0 || ratio >= 1.0 {
            return false;
        }
        let inner = self.current();
        let log = inner.total_log_bytes();
        let garbage = inner.garbage_bytes();
        garbage >= self.opts.compact_garbage_bytes.saturating_mul(2) && garbage as f64 >= ratio * log as f64
    }
}
