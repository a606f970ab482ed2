//! Local merges of adjacent ranges into one (`RangeConfig::merging`,
//! `manager::state::merge_ready`): when a node left, the configuration replaces the two ranges
//! around each of its virtual ids by their union, and every replica merges its datastores.
//!
//! The part with the merged range's end keeps its datastore (a range's directory is named by
//! its end); every other part's records are merged into it (`DataStore::merge_range`: a full
//! rewrite in which each side keeps only its own keys, so leftovers of an earlier split do
//! not come back). Crash safety: before a part is merged in, a `MERGE_INTO` file in its
//! directory names the merge; the directory is renamed away only once the merge is durable,
//! and the merged replica serves only after that. A back-end that restarts and finds a
//! directory with that file redoes the merge (it is idempotent: the part takes no writes once
//! its range is gone from the configuration) before any replica opens the target.
//!
//! As for a split (`presplit.rs`), the bulk of the work is done while the ranges still take
//! puts: a replica that learns that a pair it holds is marked starts the merge of the lower
//! range's datastore into the upper's (`DataStore::merge_range_begin`), and each head refuses
//! puts only once that is done on its node; when the merged range is installed, only what
//! both took meanwhile is copied (`DataStore::merge_range_finish`). While begun, neither
//! datastore is compacted. A begun merge whose pair is no longer marked (called off) or that
//! the configuration replaces by other ranges is forgotten before anything else is installed
//! (its files go when its copy ends; `drop_stale_pre_merges`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use fawn_ds::{DataStore, MergeInProgress};
use fawn_proto::native::{ClusterConfig, RangeConfig};
use fawn_ring::Range;
use tracing::{debug, info, warn};

use super::presplit::end_bulk_copy;
use super::range::{blocking, RangeReplica, Route};
use super::{marked_range, parse_ranges, range_filter, ranges_text, Backend};
use crate::replica::reshape::{self, tiles, within};

/// A file in the directory of a range being merged into another: `<merged start> <merged
/// end> <part start> <part end>` (hex key ids). See the module comment.
const MERGE_MARKER: &str = "MERGE_INTO";
/// Prefix of a merged-in part's directory on its way out (renamed, then removed).
const TRASH_PREFIX: &str = ".merged-";

/// A background bulk merge of a marked pair (lower range into upper): `None` when it failed
/// (the merge then copies everything).
pub(super) type PreMerge = tokio::task::JoinHandle<Option<MergeInProgress>>;

/// The marked pairs `(lower, upper)` of `config` that `me` replicates in sync.
fn marked_pairs(config: &ClusterConfig, me: fawn_ring::NodeId) -> HashSet<(Range, Range)> {
    let mut pairs = HashSet::new();
    for lower in config.ranges.iter().filter(|rc| rc.chain.contains(&me)) {
        let Some(at) = lower.merging.filter(|at| *at == lower.range.end_inclusive) else { continue };
        let upper = config
            .ranges
            .iter()
            .find(|rc| rc.range.start_exclusive == at && rc.merging == Some(at) && rc.chain.contains(&me));
        if let Some(upper) = upper {
            pairs.insert((lower.range, upper.range));
        }
    }
    pairs
}

/// Fault injection for the crash tests: a back-end whose `FAWN_CRASH_AT` environment variable
/// names `point` aborts there, as a kill -9 would stop it (`cluster_merge_resume`).
fn crash_point(point: &str) {
    if std::env::var("FAWN_CRASH_AT").is_ok_and(|p| p == point) {
        tracing::error!(point, "FAWN_CRASH_AT: aborting here (fault injection)");
        std::process::abort();
    }
}

impl Backend {
    /// Starts the bulk merge of every marked pair of `config` this node replicates in sync
    /// (unless one runs already), and forgets finished ones of pairs no longer marked.
    pub(super) fn start_pre_merges(&self, config: &ClusterConfig) {
        let wanted = marked_pairs(config, self.options.node);
        let mut merges = self.pre_merges.lock();
        merges.retain(|pair, m| wanted.contains(pair) || !m.is_finished());
        for (lower, upper) in wanted {
            if merges.contains_key(&(lower, upper)) {
                continue;
            }
            let (Some(part), Some(target)) = (self.replica(&lower), self.replica(&upper)) else { continue };
            part.bulk_copy_pending.store(true, Ordering::Release);
            target.bulk_copy_pending.store(true, Ordering::Release);
            let rt = tokio::runtime::Handle::current();
            let merge = tokio::task::spawn_blocking(move || {
                let t0 = Instant::now();
                target.store.set_key_filter(Some(range_filter(upper)));
                let begun = target.store.merge_range_begin(&part.store, range_filter(lower));
                let what = format!("merge of {}", lower.id_string());
                let replicas = vec![Arc::clone(&part), Arc::clone(&target)];
                end_bulk_copy(&rt, t0, begun.map_err(anyhow::Error::from), replicas, &what, upper)
            });
            merges.insert((lower, upper), merge);
        }
    }

    /// Forgets the begun merges that `config` neither keeps marked nor installs as one range
    /// (the merge was called off), before anything else of it is installed. One still running
    /// is not waited for: it removes its files and lifts its stores' reservation when it ends
    /// (a split or merge of those stores meanwhile is refused and the configuration is
    /// installed again at the next poll), so a configuration that repairs a failure is not
    /// held up by a bulk copy.
    pub(super) fn drop_stale_pre_merges(&self, config: &ClusterConfig) {
        let wanted = marked_pairs(config, self.options.node);
        self.pre_merges.lock().retain(|(lower, upper), _| {
            let merged = Range::new(lower.start_exclusive, upper.end_inclusive);
            wanted.contains(&(*lower, *upper)) || config.ranges.iter().any(|rc| rc.range == merged)
        });
    }

    /// The bulk merge of `lower` into `upper`, if one was started; waits for it to end.
    async fn take_pre_merge(&self, lower: Range, upper: Range) -> Option<MergeInProgress> {
        let merge = self.pre_merges.lock().remove(&(lower, upper))?;
        merge.await.ok().flatten()
    }

    /// Merges this node's replicas of ranges that `config` merged. Runs when a configuration
    /// is installed, after `split_ranges` (which cut any held range that a configuration
    /// boundary falls inside, so each range of `config` is tiled by held parts when this node
    /// replicated all of them in sync).
    pub(super) async fn merge_ranges(&self, config: &ClusterConfig) -> anyhow::Result<()> {
        let me = self.options.node;
        for rc in &config.ranges {
            if !rc.chain.contains(&me) || self.replicas.read().contains_key(&rc.range) {
                continue;
            }
            let inside: Vec<Arc<RangeReplica>> = self
                .replicas
                .read()
                .values()
                .filter(|r| r.range != rc.range && within(&r.range, &rc.range))
                .cloned()
                .collect();
            let mut parts = Vec::new();
            for r in inside {
                if !r.route().await.is_syncing() {
                    parts.push(r);
                }
            }
            if parts.is_empty() {
                continue;
            }
            let ranges: Vec<Range> = parts.iter().map(|p| p.range).collect();
            let target = reshape::merge_target(&ranges, &rc.range)
                .and_then(|t| parts.iter().find(|p| p.range == t).cloned());
            let Some(target) = target else {
                warn!(range = %rc.range.id_string(), parts = parts.len(),
                    "the held parts of a merged range do not cover it; not merging them");
                continue;
            };
            self.merge_parts(config, rc, &target, &parts).await?;
        }
        Ok(())
    }

    async fn merge_parts(
        &self,
        config: &ClusterConfig,
        rc: &RangeConfig,
        target: &Arc<RangeReplica>,
        parts: &[Arc<RangeReplica>],
    ) -> anyhow::Result<()> {
        let t0 = Instant::now();
        for p in parts {
            p.retire().await;
        }
        let mut bytes = 0;
        for p in parts.iter().filter(|p| p.range != target.range) {
            // Its directory is discarded at the end: its store, only read from here on,
            // creates no file in it any more (`install::silence`).
            blocking(true, || p.store.halt());
            let begun = self.take_pre_merge(p.range, target.range).await;
            bytes += self.merge_part_into(&target.store, rc.range, p.range, &p.store, begun)?;
        }
        let sources: Vec<Range> = parts.iter().map(|p| p.range).filter(|r| *r != target.range).collect();
        let t_finish = Instant::now();
        self.finish_merge(&target.store, rc.range, &sources)?;
        debug!(range = %rc.range.id_string(), ms = t_finish.elapsed().as_millis() as u64, "merge made durable, parts discarded");
        let route = Route { epoch: config.epoch, me: self.options.node, rc: rc.clone() };
        let parents: Vec<&RangeReplica> = parts.iter().map(|p| &**p).collect();
        let whole =
            RangeReplica::inheriting(Arc::clone(&target.store), route, self.writes_block(), &parents).await;
        let mut map = self.replicas.write();
        for p in parts {
            map.remove(&p.range);
        }
        map.insert(rc.range, Arc::new(whole));
        info!(range = %rc.range.id_string(), parts = parts.len(), bytes, ms = t0.elapsed().as_millis() as u64,
            "ranges merged");
        Ok(())
    }

    /// Merges the datastore of `part` (a range inside `merged`, its directory marked first)
    /// into `target`'s; `begun`: the bulk of it, done while the ranges took puts. Returns the
    /// bytes written.
    fn merge_part_into(
        &self,
        target: &DataStore,
        merged: Range,
        part: Range,
        part_store: &DataStore,
        begun: Option<MergeInProgress>,
    ) -> anyhow::Result<u64> {
        let dir = self.range_dir(&part);
        write_marker(&dir, merged, part)
            .map_err(|e| anyhow::anyhow!("marking {} merged: {e}", dir.display()))?;
        crash_point("merge-marked");
        // The target keeps its keys of the merged range but none of the part's: any it holds
        // are leftovers of a split, older than the part's.
        target.set_key_filter(Some(Arc::new(move |key: &[u8]| {
            let id = fawn_ring::key_id(key);
            merged.contains(id) && !part.contains(id)
        })));
        let t0 = Instant::now();
        let halves = begun.is_some();
        let report = blocking(true, || match begun {
            Some(b) => target.merge_range_finish(part_store, b),
            None => target.merge_range(part_store, range_filter(part)),
        })
        .map_err(|e| anyhow::anyhow!("merging {} into {}: {e}", part, merged))?;
        info!(range = %merged.id_string(), part = %part.id_string(), records = report.records_written,
            bytes = report.bytes_written, halves, ms = t0.elapsed().as_millis() as u64, lock_us = report.lock_hold_us,
            "merged a range's datastore into its neighbour's");
        Ok(report.bytes_written)
    }

    /// After every part is merged into `target`: a copy of one part from before the merge is
    /// no prefix of the merged range (`raise_dropped_seq_max` above every merged record, so a
    /// rejoining replica of a part copies the merged range in full), the filter becomes the
    /// merged range's, the store is durable, and only then the parts' directories go.
    fn finish_merge(&self, target: &DataStore, merged: Range, parts: &[Range]) -> anyhow::Result<()> {
        let done = blocking(true, || {
            target.raise_dropped_seq_max(target.max_seq() + 1)?;
            target.set_key_filter(Some(range_filter(merged)));
            target.sync()
        });
        done.map_err(|e| anyhow::anyhow!("finishing the merge into {merged}: {e}"))?;
        self.mark_complete(&merged, target);
        crash_point("merge-merged");
        for part in parts {
            let dir = self.range_dir(part);
            discard(&dir).map_err(|e| anyhow::anyhow!("removing merged-in {}: {e}", dir.display()))?;
        }
        Ok(())
    }

    /// A merge cut short by a crash: a directory still marked `MERGE_INTO` is merged again
    /// into the merged range's datastore, if this node is in that range's chain (and holds no
    /// replica of it yet), before any replica opens that datastore. A marked directory of a
    /// range this node no longer replicates is removed. Also removes what a crash left of
    /// directories on their way out.
    pub(super) fn recover_merges(&self, config: &ClusterConfig) -> anyhow::Result<()> {
        let root = self.options.data_dir.join("ranges");
        let Ok(entries) = std::fs::read_dir(&root) else { return Ok(()) };
        for entry in entries.flatten() {
            let dir = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(TRASH_PREFIX) {
                let _ = std::fs::remove_dir_all(&dir);
                continue;
            }
            let Some((merged, part)) = read_marker(&dir) else { continue };
            let me = self.options.node;
            let replicated = config.ranges.iter().any(|rc| rc.range == merged && rc.chain.contains(&me));
            if !replicated || self.replicas.read().contains_key(&merged) {
                warn!(part = %part, merged = %merged, "an unfinished merge of a range this node no longer replicates; dropping the part");
                discard(&dir).map_err(|e| anyhow::anyhow!("removing {}: {e}", dir.display()))?;
                continue;
            }
            warn!(part = %part, merged = %merged, "finishing a merge cut short");
            self.redo_merge(merged, &[part])?;
        }
        Ok(())
    }

    /// A merge this node never installed: it was an in-sync replica of every part, was killed
    /// before the merge and restarted quickly enough to stay in the chain, so the configuration
    /// it fetches holds the merged range while its disk holds the parts, each directory marked a
    /// whole replica of its part. Those parts (only a set of them that tiles the merged range,
    /// with the one holding its end) are merged before any replica opens the range.
    pub(super) fn recover_unstarted_merges(&self, config: &ClusterConfig) -> anyhow::Result<()> {
        let root = self.options.data_dir.join("ranges");
        let Ok(entries) = std::fs::read_dir(&root) else { return Ok(()) };
        let marked: Vec<Range> = entries.flatten().filter_map(|e| marked_range(&e.path())).collect();
        let me = self.options.node;
        for rc in &config.ranges {
            if !rc.chain.contains(&me) || self.replicas.read().contains_key(&rc.range) {
                continue;
            }
            let inside: Vec<Range> =
                marked.iter().filter(|r| **r != rc.range && within(r, &rc.range)).copied().collect();
            let holds_end = inside.iter().any(|r| r.end_inclusive == rc.range.end_inclusive);
            if !holds_end || !tiles(&inside, &rc.range) {
                continue;
            }
            let parts: Vec<Range> =
                inside.into_iter().filter(|r| r.end_inclusive != rc.range.end_inclusive).collect();
            warn!(merged = %rc.range, parts = parts.len(), "a merge this node never installed: merging the parts first");
            self.redo_merge(rc.range, &parts)?;
        }
        Ok(())
    }

    /// Merges the parts' directories into the merged range's, with the datastores opened here
    /// (no replica holds them).
    fn redo_merge(&self, merged: Range, parts: &[Range]) -> anyhow::Result<()> {
        let target = self.open_store(&merged, false, 0)?;
        for part in parts {
            let dir = self.range_dir(part);
            let options = fawn_ds::Options { auto_compact: false, ..fawn_ds::Options::default() };
            let source = DataStore::open(&dir, options)
                .map_err(|e| anyhow::anyhow!("opening merged-in {}: {e}", dir.display()))?;
            self.merge_part_into(&target, merged, *part, &source, None)?;
        }
        self.finish_merge(&target, merged, parts)?;
        target.close().map_err(|e| anyhow::anyhow!("closing {merged}: {e}"))
    }
}

fn write_marker(dir: &Path, merged: Range, part: Range) -> std::io::Result<()> {
    let path = dir.join(MERGE_MARKER);
    std::fs::write(&path, ranges_text(&[merged, part]))?;
    std::fs::File::open(&path)?.sync_all()?;
    std::fs::File::open(dir)?.sync_all()
}

/// The merged range and the part a marker names; `None` without a (readable) marker.
fn read_marker(dir: &Path) -> Option<(Range, Range)> {
    let text = std::fs::read_to_string(dir.join(MERGE_MARKER)).ok()?;
    match parse_ranges(&text)?[..] {
        [merged, part] => Some((merged, part)),
        _ => None,
    }
}

/// Removes a directory so that a crash never leaves part of it under its own name: renamed
/// (durably) out of the way first, then removed.
fn discard(dir: &Path) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else { return Ok(()) };
    let trash: PathBuf = parent.join(format!("{TRASH_PREFIX}{}", name.to_string_lossy()));
    match std::fs::rename(dir, &trash) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    std::fs::File::open(parent)?.sync_all()?;
    std::fs::remove_dir_all(&trash)
}
