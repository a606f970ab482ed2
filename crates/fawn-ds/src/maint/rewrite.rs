//! Full compaction and the rewriting merges: every survivor of the source logs into a new
//! log, then the swap.

use std::sync::Arc;
use std::time::Instant;

use crate::error::Error;
use crate::files::COMPACT_FILE;
use crate::limits::LOG_HEADER_BYTES;
use crate::maint::build::{abandon, cold_for, compact_keep, fresh_inner, ColdOut, Sides};
use crate::maint::copier::{Copier, Limiter, Pending};
use crate::maint::keep::Keep;
use crate::maint::swap::finish;
use crate::report::{MaintenanceKind, MaintenanceReport};
use crate::shared::{KeyFilter, Shared};
use crate::store::Inner;

/// Full compaction of `shared` (merging `other` in, if given): every survivor of its logs
/// (cold, then hot) goes into a new log — a new cold log with `Options::hot_cold`, else the
/// new hot log — and what is appended meanwhile into the new hot log; then the swap. The
/// caller holds the maintenance locks of both.
/// `other_keys`: which of `other`'s keys are carried (`None`: all).
pub(crate) fn rewrite(
    shared: &Shared,
    other: Option<&Shared>,
    other_keys: Option<KeyFilter>,
) -> Result<MaintenanceReport, Error> {
    let begun = rewrite_begin(shared, other, other_keys)?;
    rewrite_finish(shared, other, begun)
}

/// A full compaction (or merge) whose scans of the source logs up to their ends are done:
/// the new state and the positions copied up to.
pub(crate) struct Rewrite {
    pub(crate) new: Arc<Inner>,
    pub(crate) old: Arc<Inner>,
    pub(crate) other_old: Option<Arc<Inner>>,
    pub(crate) keep_self: Keep,
    pub(crate) keep_other: Keep,
    pub(crate) rep: MaintenanceReport,
    pub(crate) pos: u64,
    pub(crate) other_pos: u64,
    pub(crate) cold_out: ColdOut,
    t0: Instant,
}

/// Step 1 of `rewrite`: scan every log to its end, unlocked, into the new cold log (or hot
/// log). On error the new files are removed.
pub(crate) fn rewrite_begin(
    shared: &Shared,
    other: Option<&Shared>,
    other_keys: Option<KeyFilter>,
) -> Result<Rewrite, Error> {
    let t0 = Instant::now();
    let kind = if other.is_some() { MaintenanceKind::Merge } else { MaintenanceKind::Compact };
    let old = shared.current();
    old.check_writable()?;
    let other_inner = other.map(|o| o.current());
    let expected = old.live_keys() + other_inner.as_ref().map_or(0, |o| o.live_keys());
    let (cold, cold_out) = if shared.opts.hot_cold {
        let (c, out) = cold_for(shared, &old, true)?;
        (Some(c), out)
    } else {
        (None, ColdOut::None)
    };
    let path = shared.dir.join(COMPACT_FILE);
    let built = fresh_inner(shared, &path, expected, Arc::clone(old.lock_file()), cold);
    let new = match built {
        Ok(n) => Arc::new(n),
        Err(e) => {
            abandon(shared, &old, cold_out);
            return Err(e);
        }
    };
    let keep_self = compact_keep(shared);
    let keep_other = Keep::Carry { filter: other_keys };
    let mut c = Copier {
        dst: &new,
        rep: MaintenanceReport::new(kind),
        limiter: Limiter::new(shared.opts.maintenance_bytes_per_sec),
        cancel: Some(&shared.cancel),
        pending: Pending::default(),
        outpaced: false,
    };
    let to_cold = new.cold().is_some();
    let scanned = (|| {
        let end = old.applied_end();
        c.copy_all(&old, end, &keep_self, to_cold)?;
        let mut other_end = LOG_HEADER_BYTES;
        if let Some(oi) = &other_inner {
            other_end = oi.applied_end();
            c.copy_all(oi, other_end, &keep_other, to_cold)?;
        }
        Ok::<_, Error>((end, other_end))
    })();
    let (pos, other_pos) = match scanned {
        Ok(p) => p,
        Err(e) => {
            abandon(shared, &old, cold_out);
            return Err(e);
        }
    };
    let rep = c.rep;
    Ok(Rewrite { new, old, other_old: other_inner, keep_self, keep_other, rep, pos, other_pos, cold_out, t0 })
}

/// Steps 2 and on of `rewrite`: catch up, then the brief lock and the swap (`finish`).
pub(crate) fn rewrite_finish(
    shared: &Shared,
    other: Option<&Shared>,
    begun: Rewrite,
) -> Result<MaintenanceReport, Error> {
    let Rewrite { new, old, other_old, keep_self, keep_other, rep, pos, other_pos, cold_out, t0 } = begun;
    let sides = Sides { shared, old, keep_self, other: other.zip(other_old), keep_other };
    let c = Copier {
        dst: &new,
        rep,
        limiter: Limiter::new(shared.opts.maintenance_bytes_per_sec),
        cancel: Some(&shared.cancel),
        pending: Pending::default(),
        outpaced: false,
    };
    finish(&sides, &new, c, pos, other_pos, cold_out, t0)
}
