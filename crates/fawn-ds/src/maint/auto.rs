//! The automatic compactor and the cost/benefit choice of the cleaning it runs.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::files;
use crate::maint::hot::compact_hot;
use crate::maint::rewrite::rewrite;
use crate::report::MaintenanceReport;
use crate::shared::{Background, Shared};
use crate::store::Inner;

/// Cost/benefit choice of the cleaning to run: a hot compaction copies the hot log's live
/// bytes to free its garbage; a full one copies all live bytes to free all garbage. The hot
/// one runs when its ratio garbage freed / bytes copied is at least the full one's.
pub(crate) fn clean(shared: &Shared) -> Result<MaintenanceReport, Error> {
    let inner = shared.current();
    let hot_live = inner.live_bytes() as u128;
    let hot_garbage = inner.hot_garbage_bytes() as u128;
    let all_live = hot_live + inner.cold_live_bytes() as u128;
    // Expired puts and droppable tombstones: only a full compaction frees them.
    let all_garbage = inner.garbage_bytes() as u128 + droppable_bytes(shared, &inner) as u128;
    drop(inner);
    if shared.opts.hot_cold && hot_garbage > 0 && hot_garbage * all_live >= all_garbage * hot_live {
        compact_hot(shared, None)
    } else {
        rewrite(shared, None, None)
    }
}

/// Whether a merge should append to the cold log (copying this store's hot survivors) rather
/// than rewrite both logs (copying all its survivors, minus out-of-filter keys): with
/// `hot_cold`, once most of the store's live data is cold. A store whose data is all in the
/// hot log (never cleaned) gains nothing from the append and would keep its out-of-filter
/// keys, so it is rewritten.
pub(crate) fn append_merge_is_cheaper(shared: &Shared) -> bool {
    let inner = shared.current();
    let hot_live = inner.live_bytes();
    let cold_live = inner.cold_live_bytes();
    shared.opts.hot_cold && inner.cold().is_some() && hot_live <= cold_live
}

/// Bytes a full compaction would drop beyond garbage: expired puts and delete records at or
/// below the tombstone watermark (an estimate, `reclaim`).
pub(crate) fn droppable_bytes(shared: &Shared, inner: &Inner) -> u64 {
    inner.droppable_bytes(files::now_secs(), shared.watermark.load(Ordering::Acquire))
}

/// Whether the store's garbage crosses both automatic-compaction thresholds (both logs
/// together: the space budget).
pub(crate) fn wants_compaction(shared: &Shared) -> bool {
    let inner = shared.current();
    let log = inner.total_log_bytes();
    let garbage = inner.garbage_bytes() + droppable_bytes(shared, &inner);
    log > 0
        && garbage >= shared.opts.compact_garbage_bytes
        && garbage as f64 >= shared.opts.compact_garbage_ratio * log as f64
}

/// The automatic compactor: every `compact_check_interval`, compacts if the garbage
/// thresholds are crossed and no other maintenance is running.
pub(crate) fn spawn_auto_compactor(shared: &Arc<Shared>) -> Option<Background> {
    let every = shared.opts.compact_check_interval.max(Duration::from_millis(10));
    Background::spawn_periodic(shared, "fawn-ds-compact", every, |shared| {
        if !wants_compaction(shared) {
            return;
        }
        let Some(_m) = shared.maint.try_lock() else { return };
        if shared.merge_reserved.load(Ordering::Acquire) {
            return;
        }
        if clean(shared).is_err() {
            shared.counters.auto_compact_errors.fetch_add(1, Ordering::Relaxed);
        }
    })
    .ok()
}
