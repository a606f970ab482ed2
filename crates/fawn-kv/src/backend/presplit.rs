//! The bulk copy of a split, done while the range still takes puts (paper §3.3.2: split runs
//! concurrently and locks only at the end).
//!
//! A range marked `splitting` at `at` is cut into `(start, at]` and `(at, end]`; the upper part
//! keeps the range's datastore and the lower one gets a copy of its keys
//! (`Backend::split_part`). As soon as a replica learns of the mark it starts that copy
//! (`DataStore::split_begin`) in the background, and its head keeps ordering updates until
//! its own copy is done (`RangeReplica::bulk_copy_pending`). Only then does the head refuse
//! puts, drain and report `SplitReady`; when the split configuration arrives each replica
//! copies just what was appended since (`DataStore::split_finish`). Puts stop for the drain
//! and that catch-up, not for the whole copy.
//!
//! A copy whose mark went away (the split was called off) is forgotten once it finished; its
//! directory goes with it. A replica object that never started a copy (created after the
//! mark) refuses puts at once, as before: the split then copies everything while puts wait.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use fawn_ds::{DataStore, Options as DsOptions, SplitInProgress};
use fawn_proto::native::ClusterConfig;
use fawn_ring::Range;

use tracing::{debug, info, warn};

use super::range::RangeReplica;
use super::{apportion_expected_keys, range_filter, Backend, CONFIG_POLL_INTERVAL};

/// A background bulk copy of a split-off part: `None` when it failed (the split then copies
/// everything).
pub(super) type PreSplit = tokio::task::JoinHandle<Option<SplitInProgress>>;

/// The end of a bulk copy (split or merge) on a blocking thread: lets the head refuse puts in
/// due time (`release_puts_block`), logs what happened to `what` of `range`, and hands the
/// begun operation on, or `None` if it failed (the split or merge then copies everything).
pub(super) fn end_bulk_copy<T>(
    rt: &tokio::runtime::Handle,
    t0: Instant,
    begun: anyhow::Result<T>,
    replicas: Vec<Arc<RangeReplica>>,
    what: &str,
    range: Range,
) -> Option<T> {
    release_puts_block(rt, t0, begun.is_ok(), replicas);
    match begun {
        Ok(b) => {
            info!(range = %range.id_string(), what, ms = t0.elapsed().as_millis() as u64, "bulk copy done");
            Some(b)
        }
        Err(e) => {
            warn!(range = %range.id_string(), what, error = %e, "bulk copy failed; the operation will copy it all");
            None
        }
    }
}

/// Lets the head of a range marked for a split or merge refuse puts (clears
/// `bulk_copy_pending` on `replicas`) once this node's bulk copy, started at `t0` when it
/// learned of the mark, is done — and, if it succeeded, once the other replicas have most
/// likely done theirs too: they learn of the mark by their own configuration poll, up to
/// `CONFIG_POLL_INTERVAL` later, and take about as long, and a replica still copying when the
/// split or merge arrives makes everyone's puts wait for it. Puts flow meanwhile, so the wait
/// only delays the split or merge; the bulk copy itself is ready for the finish at once.
fn release_puts_block(
    rt: &tokio::runtime::Handle,
    t0: Instant,
    copied: bool,
    replicas: Vec<Arc<RangeReplica>>,
) {
    let release = move || {
        for r in &replicas {
            r.bulk_copy_pending.store(false, Ordering::Release);
        }
    };
    if !copied {
        return release();
    }
    let copy = t0.elapsed();
    let wait = CONFIG_POLL_INTERVAL + copy;
    debug!(
        copy_ms = copy.as_millis() as u64,
        wait_ms = wait.as_millis() as u64,
        "bulk copy done; the range takes puts until the other replicas' should be done too"
    );
    rt.spawn(async move {
        tokio::time::sleep(wait).await;
        release();
    });
}

impl Backend {
    /// Starts the bulk copy of the lower part of every range `config` marks splitting that
    /// this node replicates in sync (unless one runs already); forgets finished copies of
    /// ranges no longer marked.
    pub(super) fn start_pre_splits(&self, config: &ClusterConfig) {
        let me = self.options.node;
        let wanted: HashSet<(Range, Range)> = config
            .ranges
            .iter()
            .filter(|rc| rc.chain.contains(&me))
            .filter_map(|rc| Some((rc.range, Range::new(rc.range.start_exclusive, rc.splitting?))))
            .collect();
        let mut copies = self.pre_splits.lock();
        copies.retain(|key, copy| wanted.contains(key) || !copy.is_finished());
        for (parent, part) in wanted {
            if copies.contains_key(&(parent, part)) {
                continue;
            }
            let Some(replica) = self.replica(&parent) else { continue };
            let dir = self.range_dir(&part);
            let options = self.split_options(&replica.store, &parent, &part);
            replica.bulk_copy_pending.store(true, Ordering::Release);
            let rt = tokio::runtime::Handle::current();
            let copy = tokio::task::spawn_blocking(move || {
                let t0 = Instant::now();
                let begun = (|| {
                    if dir.exists() {
                        // Left by an older life of this range or an interrupted split.
                        std::fs::remove_dir_all(&dir)
                            .map_err(|e| anyhow::anyhow!("emptying {}: {e}", dir.display()))?;
                    }
                    Ok::<_, anyhow::Error>(replica.store.split_begin(range_filter(part), &dir, options)?)
                })();
                let what = format!("split off {}", parent.id_string());
                end_bulk_copy(&rt, t0, begun, vec![Arc::clone(&replica)], &what, part)
            });
            copies.insert((parent, part), copy);
        }
    }

    /// The bulk copy of `part` out of `parent`, if one was started; waits for it to end.
    pub(super) async fn take_pre_split(&self, parent: &Range, part: &Range) -> Option<SplitInProgress> {
        let copy = self.pre_splits.lock().remove(&(*parent, *part))?;
        copy.await.ok().flatten()
    }

    /// Options of a split-off part's datastore: the back-end's sync policy, the index sized
    /// for the part's share of the parent's keys (no growth while it is copied).
    pub(super) fn split_options(&self, store: &DataStore, parent: &Range, part: &Range) -> DsOptions {
        let rest = Range::new(part.end_inclusive, parent.end_inclusive);
        let keys = apportion_expected_keys(store.stats().live_keys, &[*part, rest])[0];
        DsOptions { sync: self.options.sync, expected_keys: keys, ..DsOptions::default() }
    }
}
