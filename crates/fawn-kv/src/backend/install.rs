//! Installing a configuration: opening, splitting, rejoining and replacing the replicas this
//! node holds in it.

use super::*;
use crate::replica::reshape;
use crate::replica::sync::{finished_copy_outdated, suffix_covers};

impl Backend {
    /// Installs a newer configuration: opens, re-wires or drops this node's replicas.
    pub(super) async fn install(&self, config: ClusterConfig) -> anyhow::Result<()> {
        let _serial = self.install_lock.lock().await;
        if config.epoch <= self.current().config.epoch {
            return Ok(());
        }
        fence::check(Some(self.cluster).filter(|c| *c != 0), config.cluster_id)
            .map_err(|e| anyhow::anyhow!("not installing epoch {}: {e}", config.epoch))?;
        let me = self.options.node;
        let epoch = config.epoch;
        let sizing = expected_keys_by_range(self.options.expected_keys, me, &config);
        self.drop_stale_pre_merges(&config);
        self.split_ranges(&config).await?;
        self.merge_ranges(&config).await?;
        self.recover_merges(&config)?;
        self.recover_unstarted_merges(&config)?;
        self.recover_split_parts(&config)?;
        // Replicas of ranges gone from the configuration (a split or merge this node had no
        // part in).
        let mut dropped: Vec<Range> = self
            .replicas
            .read()
            .keys()
            .filter(|r| !config.ranges.iter().any(|rc| rc.range == **r))
            .copied()
            .collect();
        for rc in &config.ranges {
            if rc.path().any(|n| n == me) {
                let expected_keys = sizing.get(&rc.range).copied().unwrap_or(0);
                self.install_range(epoch, rc, expected_keys).await?;
            } else if self.replicas.read().contains_key(&rc.range) {
                dropped.push(rc.range);
            }
        }
        info!(epoch, "configuration installed");
        self.pool.retain_members(&config, &crate::manager::client::parse_list(&self.options.manager));
        *self.view.write() = Arc::new(View::new(config));
        self.installed_epoch.send_replace(epoch);
        let view = self.current();
        self.start_pre_splits(&view.config);
        self.start_pre_merges(&view.config);
        self.watch_drains();
        // Freed only after the new view is in place: a request still routed by the old one
        // then hears "stale epoch" (and retries at once), not "no replica here".
        for range in dropped {
            let removed = self.replicas.write().remove(&range);
            if let Some(old) = removed {
                info!(range = %old.range.id_string(), "no longer a replica of this range; freeing it");
                self.silence(&old).await;
                drop(old);
                // A range's directory is named by its end, which a held part of it may share.
                if !self.replicas.read().keys().any(|r| r.end_inclusive == range.end_inclusive) {
                    let _ = std::fs::remove_dir_all(self.range_dir(&range));
                }
            }
        }
        Ok(())
    }

    /// Splits this node's replicas of ranges `config` split (`manager::state::split_ready`:
    /// the head drained the chain first, so every in-sync replica holds the same final
    /// contents and nothing is in flight). Each part this node replicates gets its keys'
    /// datastore: the part with the range's end keeps the range's (a directory is named by
    /// the range's end; its key filter lets compaction drop the other parts' keys), the others
    /// are copied out of it (`DataStore::split`, a sequential scan). A replica that was still
    /// syncing splits nothing: its parts sync afresh. A part is where a range of `config`
    /// overlaps the held one: a range of `config` that also covers a neighbour of the held one
    /// (it was merged after the split, or before this node installed that) gets it as a piece
    /// that `merge_ranges` merges next.
    pub(super) async fn split_ranges(&self, config: &ClusterConfig) -> anyhow::Result<()> {
        let me = self.options.node;
        let held: Vec<Arc<RangeReplica>> = self.replicas.read().values().cloned().collect();
        for old in held {
            let parts = reshape::split_parts(config, me, &old.range);
            if parts.is_empty() || old.route().await.is_syncing() {
                continue;
            }
            old.retire().await;
            let t0 = Instant::now();
            let mut replicas = Vec::new();
            for rc in &parts {
                let t_part = Instant::now();
                let begun = self.take_pre_split(&old.range, &rc.range).await;
                let waited_ms = t_part.elapsed().as_millis() as u64;
                let store = self.split_part(&old.store, &old.range, &rc.range, begun)?;
                debug!(range = %rc.range.id_string(), waited_ms, ms = t_part.elapsed().as_millis() as u64, "split part ready");
                let route = Route { epoch: config.epoch, me, rc: rc.clone() };
                let part = RangeReplica::inheriting(store, route, self.writes_block(), &[&old]).await;
                replicas.push(Arc::new(part));
            }
            info!(range = %old.range.id_string(), parts = parts.len(), ms = t0.elapsed().as_millis() as u64,
                "range split");
            let mut map = self.replicas.write();
            map.remove(&old.range);
            for r in replicas {
                map.insert(r.range, r);
            }
        }
        Ok(())
    }

    /// The datastore of `part`, a part of `parent` whose datastore is `store`: `store` itself
    /// for the part with `parent`'s end (now filtered to the part's keys), else a copy of the
    /// part's keys in the part's own directory, marked a whole replica.
    /// `begun`: the bulk copy of the part made while the range still took puts, if any
    /// (`presplit.rs`); only what was appended since is copied then.
    pub(super) fn split_part(
        &self,
        store: &Arc<DataStore>,
        parent: &Range,
        part: &Range,
        begun: Option<fawn_ds::SplitInProgress>,
    ) -> anyhow::Result<Arc<DataStore>> {
        if part.end_inclusive == parent.end_inclusive {
            store.set_key_filter(Some(range_filter(*part)));
            self.mark_complete(part, store);
            return Ok(Arc::clone(store));
        }
        let dir = self.range_dir(part);
        let begun = begun.filter(|b| b.target() == dir.as_path() && !dir.exists());
        if begun.is_none() && dir.exists() {
            // Left by an older life of this range or an interrupted split: the parent is whole.
            std::fs::remove_dir_all(&dir).map_err(|e| anyhow::anyhow!("emptying {}: {e}", dir.display()))?;
        }
        let (copy, report) = blocking(true, || match begun {
            Some(b) => store.split_finish(b),
            None => store.split(range_filter(*part), &dir, self.split_options(store, parent, part)),
        })
        .map_err(|e| anyhow::anyhow!("splitting into {}: {e}", dir.display()))?;
        info!(range = %part.id_string(), from = %parent.id_string(), records = report.records_written,
            bytes = report.bytes_written, "split off a range's datastore");
        self.mark_complete(part, &copy);
        Ok(Arc::new(copy))
    }

    /// A split cut short by a crash: this node is an in-sync replica of a part that has no
    /// directory while the directory of the range it was split from survives — named by that
    /// range's end, the end of the first part above it that has a directory. The part is
    /// copied out of it before any replica opens (and filters) that datastore. Only a
    /// directory marked a whole replica is used. A node re-added as a syncing replica (a
    /// restart while still in the chain fails it first) does the same when the part's
    /// `.split-tmp` shows the split was under way, and then fetches only the suffix; without
    /// that sign a syncing replica's missing directory is an ordinary fresh copy.
    pub(super) fn recover_split_parts(&self, config: &ClusterConfig) -> anyhow::Result<()> {
        let me = self.options.node;
        let n = config.ranges.len();
        for (i, rc) in config.ranges.iter().enumerate() {
            let missing = |r: &Range| !self.replicas.read().contains_key(r) && !self.range_dir(r).exists();
            let resumable = rc.chain.contains(&me)
                || (rc.syncing.contains(&me) && fawn_ds::split_interrupted(&self.range_dir(&rc.range)));
            if !resumable || !missing(&rc.range) {
                continue;
            }
            // The first range above it, in ring order, with a directory.
            let Some(parent) = (1..n).map(|k| &config.ranges[(i + k) % n]).find(|r| !missing(&r.range))
            else {
                continue;
            };
            let dir = self.range_dir(&parent.range);
            if !dir.join(REPLICA_MARKER).exists() {
                continue;
            }
            let whole = Range::new(rc.range.start_exclusive, parent.range.end_inclusive);
            // Looked up first: the replicas' lock is not held while a datastore opens.
            let held =
                self.replicas.read().values().find(|r| r.range.end_inclusive == whole.end_inclusive).cloned();
            let store = match held {
                Some(r) => Arc::clone(&r.store),
                None => Arc::new(self.open_store(&parent.range, false, 0)?),
            };
            warn!(range = %rc.range.id_string(), from = %parent.range.id_string(),
                "no datastore for a range this node replicates: finishing the split that made it");
            self.split_part(&store, &whole, &rc.range, None)?;
        }
        Ok(())
    }

    /// Stops `old`, a replica about to be replaced or freed, from writing files in its
    /// datastore's directory, which the caller then empties: its steps (the end of a copy
    /// writes a checkpoint) and its store's helper threads, which a task still holding it
    /// would keep running. A file created meanwhile fails the removal (and was reported as a
    /// disk fault) or lands in the directory of the store that replaces it. A store another
    /// held replica shares is left running.
    async fn silence(&self, old: &Arc<RangeReplica>) {
        old.retire().await;
        let shared =
            self.replicas.read().values().any(|r| !Arc::ptr_eq(r, old) && Arc::ptr_eq(&r.store, &old.store));
        if !shared {
            blocking(true, || old.store.halt());
        }
    }

    /// `expected_keys` sizes the index if a datastore is opened here (0 = grow online).
    pub(super) async fn install_range(
        &self,
        epoch: Epoch,
        rc: &RangeConfig,
        expected_keys: u64,
    ) -> anyhow::Result<()> {
        let route = Route { epoch, me: self.options.node, rc: rc.clone() };
        let existing = self.replicas.read().get(&rc.range).cloned();
        let fresh_sync = match (&existing, route.is_syncing()) {
            (_, false) => false,
            (None, true) => true,
            // Re-sync from scratch when the source changed, the copy was an old in-sync one, or
            // a finished copy is outdated (`replica::sync::finished_copy_outdated`).
            (Some(r), true) => {
                let outdated = finished_copy_outdated(r.route().await.epoch, route.epoch);
                r.sync_status()
                    .await
                    .is_none_or(|(src, _, done)| Some(src) != route.predecessor() || (done && outdated))
            }
        };
        match existing {
            Some(r) if !fresh_sync => r.install(route, &self.linker()).await,
            // A copy on a faulty disk could not be written: none is started (the manager takes
            // this node out of the sync once it hears of the fault, `disk.rs`).
            _ if fresh_sync && self.disk_fault().is_some() => {
                warn!(range = %rc.range.id_string(), "this back-end's disk is faulty: not syncing a copy of the range");
            }
            existing => {
                if fresh_sync {
                    if let Some(replica) = self.rejoin_replica(existing.as_ref(), &route, expected_keys).await
                    {
                        self.replicas.write().insert(rc.range, Arc::new(replica));
                        return Ok(());
                    }
                    info!(range = %rc.range.id_string(), from = ?route.predecessor(), "syncing a fresh copy of the range");
                    if let Some(old) = &existing {
                        self.silence(old).await;
                    }
                }
                let store = match self.open_store(&rc.range, fresh_sync, expected_keys) {
                    Ok(store) => store,
                    // Served by no replica here: the manager takes this node out of the chain
                    // unless it is the range's last proven replica (then the range waits).
                    Err(e) if disk::is_disk_error(&e) => {
                        self.note_disk_fault(e.to_string());
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                };
                if !route.is_syncing() {
                    self.mark_complete(&rc.range, &store);
                }
                let replica = Arc::new(RangeReplica::new(store, route, self.writes_block()));
                self.replicas.write().insert(rc.range, replica);
            }
        }
        Ok(())
    }

    /// A syncing replica of `route`'s range that keeps the datastore this node had for it
    /// (`existing`'s, else the one on disk) and asks for only the suffix after its last
    /// record; `None` when there is none to keep (the caller copies the range in full).
    pub(super) async fn rejoin_replica(
        &self,
        existing: Option<&Arc<RangeReplica>>,
        route: &Route,
        expected_keys: u64,
    ) -> Option<RangeReplica> {
        let range = route.rc.range;
        let rid = range.id_string();
        // The directory is named by the range's end, which a range merged into this one may
        // share: only a whole replica of a range holding this one may rejoin it.
        let held = marked_range(&self.range_dir(&range));
        if !held.is_some_and(|held| suffix_covers(&held, &range)) {
            return None;
        }
        // A replica that was syncing holds part of a snapshot, never a prefix.
        let was_syncing = match existing {
            Some(r) => r.sync_status().await.is_some(),
            None => false,
        };
        if was_syncing {
            return None;
        }
        let store = match existing {
            Some(r) => {
                // Declared failed while running: this replica may still be ordering updates
                // by its old route. Stop that before reading its last record.
                r.retire().await;
                Arc::clone(&r.store)
            }
            None => match self.open_store(&range, false, expected_keys) {
                Ok(s) => Arc::new(s),
                Err(e) => {
                    warn!(range = %rid, error = %e, "cannot open the old datastore; copying the range in full");
                    return None;
                }
            },
        };
        match blocking(true, || suffix_plan(&store)) {
            Ok(Some(plan)) => {
                info!(range = %rid, from = ?route.predecessor(), have_seq = plan.have_seq,
                    "rejoining with the old datastore: asking for the suffix after its last record");
                Some(RangeReplica::rejoining(store, route.clone(), self.writes_block(), plan))
            }
            Ok(None) => {
                info!(range = %rid, "the old datastore is empty or lacks the record of its highest seq; copying the range in full");
                None
            }
            Err(e) => {
                warn!(range = %rid, error = %e, "cannot read the old datastore; copying the range in full");
                None
            }
        }
    }

    /// The source refused `range`'s suffix: replace the replica by a fresh, empty one that
    /// asks for a full snapshot. The old one is silenced (`silence`) before its directory is
    /// emptied.
    pub(super) async fn replace_with_fresh(&self, range: Range) {
        let _serial = self.install_lock.lock().await;
        let Some(old) = self.replica(&range) else { return };
        if !old.suffix_refused().await {
            return;
        }
        self.replicas.write().remove(&range);
        self.silence(&old).await;
        drop(old);
        let view = self.current();
        let Some(rc) = view.config.ranges.iter().find(|rc| rc.range == range) else { return };
        if !rc.syncing.contains(&self.options.node) {
            return;
        }
        let route = Route { epoch: view.config.epoch, me: self.options.node, rc: rc.clone() };
        let expected_keys =
            expected_keys_by_range(self.options.expected_keys, self.options.node, &view.config)
                .get(&range)
                .copied()
                .unwrap_or(0);
        info!(range = %range.id_string(), from = ?route.predecessor(), "suffix refused: syncing a fresh copy of the range");
        match self.open_store(&range, true, expected_keys) {
            Ok(store) => {
                let replica = RangeReplica::new(store, route, self.writes_block());
                self.replicas.write().insert(range, Arc::new(replica));
            }
            Err(e) => error!(range = %range.id_string(), error = %e, "cannot create a fresh datastore"),
        }
    }
}
