//! The back-end: hosts one datastore per range it replicates and plays head, middle, tail or
//! syncing replica of each range's chain (paper §3.4.3–3.4.4).

mod boot;
mod drain;
mod link;
mod merge;
mod presplit;
mod range;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use fawn_client::pool::Pool;
use fawn_ds::{DataStore, Options as DsOptions, SyncPolicy};
use fawn_proto::native::{
    ChainMsg, ClusterConfig, DigestEntry, Epoch, NodeState, NodeStatus, RangeConfig, ReqId, Request,
    Response, WireError, DIGEST_PAGE_ENTRIES_MAX,
};
use fawn_proto::op::{Outcome, Update};
use fawn_ring::{key_id, KeyId, NodeId, Range};
use parking_lot::RwLock;
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, warn};

use crate::metrics::{self, Exposition, Histogram};
use crate::server::{self, Handler};
use crate::view::{fetch_config, View};
use link::{LinkOwner, Links};
use range::{blocking, suffix_plan, LinkTo, Ordered, RangeReplica, Route};

/// How often a back-end polls the manager for a newer configuration (and renews its lease).
pub const CONFIG_POLL_INTERVAL: Duration = Duration::from_millis(250);
/// A back-end that has not reached the manager for this long stops serving clients: by then
/// the manager may have declared it failed and handed its role to another node.
pub const MANAGER_LEASE: Duration = Duration::from_millis(1500);
/// How long a tail waits for a front-end to take a commit notice (it is only a shortcut: the
/// head answers too).
const COMMITTED_NOTICE_TIMEOUT: Duration = Duration::from_millis(500);
/// How often replicas retry sync requests and catch-up confirmations.
const TICK_INTERVAL: Duration = Duration::from_millis(300);
/// A successor whose chain has not acknowledged an update for this long is reported as a
/// stalled link (log line, `link_stalls` counter); puts on the ranges behind it wait.
pub const LINK_STALL: Duration = Duration::from_millis(1000);
/// Default of `BackendOptions::link_repair_after`: a stall this old, with the successor not
/// answering a direct probe, is reported to the manager as a cut link. Well above the ack
/// latency of a loaded chain (tens of ms; the chain time-out is 2 s), so a merely slow
/// successor is not cut out; a dead or stopped one is failed by the manager's detector first
/// (2 s) and the manager ignores reports about a node that misses its heartbeats.
pub const LINK_REPAIR_AFTER: Duration = Duration::from_millis(2500);
/// How long a direct probe (`Ping`) of a stalled successor may take before it counts as failed.
pub const LINK_PROBE_TIMEOUT: Duration = Duration::from_millis(1000);
/// While a reported cut lasts (probes keep failing), it is reported again this often, so the
/// manager keeps avoiding it (`manager::LINK_CUT_FORGET_AFTER`).
pub const LINK_CUT_REPORT_INTERVAL: Duration = Duration::from_millis(1000);

/// A file in a range's datastore directory that says the datastore was a whole replica of the
/// range: created when a replica starts in the chain or finishes a sync, gone with the
/// directory when a fresh copy starts. Only such a datastore may rejoin by a suffix (a
/// snapshot cut off half-way holds no prefix of the range's history). It names the range
/// (`<start> <end>`, hex key ids; rewritten when a split or merge changes the range the
/// directory holds), so that after a restart the directories of a merge this node never
/// installed can be told from leftovers of older layouts (`Backend::recover_unstarted_merges`).
/// An empty marker (written before markers named ranges) names none.
const REPLICA_MARKER: &str = "REPLICA";
/// How long a replica being replaced may stay in use by in-flight work before its datastore
/// directory is emptied anyway.
const REPLACE_WAIT: Duration = Duration::from_secs(2);

/// How long a get to a promoted tail that is still catching up waits before being refused.
const TAIL_CATCH_UP_WAIT: Duration = Duration::from_millis(500);

/// Back-end settings.
#[derive(Clone, Debug)]
pub struct BackendOptions {
    pub node: NodeId,
    pub data_dir: PathBuf,
    /// Native address of the manager.
    pub manager: String,
    /// Address other processes use to reach this back-end.
    pub advertise: String,
    pub sync: SyncPolicy,
    /// Keys this back-end expects to hold in total, over all its ranges and replicas (0 = no
    /// hint: each index starts small and grows online by doubling). A datastore created or
    /// opened for a range gets its share (`expected_keys_by_range`) as
    /// `fawn_ds::Options::expected_keys`: its index is sized for that many keys up front
    /// (6 B per slot at 93 % load, 6.45 B per key) and still grows online past it.
    pub expected_keys: u64,
    /// How long the head waits for the tail's ack before answering "timeout".
    pub chain_timeout: Duration,
    /// A chain link whose successor has not acknowledged an update for this long, and does not
    /// answer a direct probe, is reported to the manager as cut, which repairs the chains
    /// around it (`LINK_REPAIR_AFTER` by default; zero: never report, puts wait for the link).
    pub link_repair_after: Duration,
    /// Ceiling on the bytes per second (key + value) this back-end streams to one syncing
    /// successor (a joining node's pre-copy, re-replication after a failure); 0 = unlimited.
    /// Keeps foreground gets near their rate while a range is copied (paper §3.4.4).
    pub copy_bytes_per_s: u64,
    /// The same ceiling for a range that already has R in-sync replicas (a join's pre-copy,
    /// a graceful leave's replacement): nothing is at risk while it runs, so it may be slower
    /// and cost foreground gets less. 0 = unlimited.
    pub join_copy_bytes_per_s: u64,
}

/// Default for `BackendOptions::copy_bytes_per_s` (re-replication after a failure): 32 MiB/s
/// per syncing range.
pub const COPY_BYTES_PER_S_DEFAULT: u64 = 32 << 20;
/// Default for `BackendOptions::join_copy_bytes_per_s`: 4 MiB/s per syncing range. Measured at
/// max load on 2 vCPUs (docs/BENCHMARKS.md): gets during a join at 0.63 of the
/// steady rate at 32 MiB/s, 0.76–0.88 at 8 MiB/s, 0.82–0.92 at 4 MiB/s. A join risks nothing
/// while it runs (the range keeps R replicas), so it goes slow.
pub const JOIN_COPY_BYTES_PER_S_DEFAULT: u64 = 4 << 20;

/// The pace of a copy of `range` to a syncing replica: the repair rate while the range has
/// fewer than R in-sync replicas (redundancy is being restored), else the join rate.
pub fn copy_rate_for(config: &ClusterConfig, range: &Range, options: &BackendOptions) -> u64 {
    let short = config
        .ranges
        .iter()
        .find(|rc| rc.range == *range)
        .is_some_and(|rc| (rc.chain.len() as u64) < u64::from(config.replicas));
    if short {
        options.copy_bytes_per_s
    } else {
        options.join_copy_bytes_per_s
    }
}

#[derive(Default)]
struct Counters {
    gets: AtomicU64,
    updates: AtomicU64,
    replicated: AtomicU64,
    acks: AtomicU64,
    stale_epoch: AtomicU64,
    lease_refusals: AtomicU64,
    syncs_completed: AtomicU64,
    /// Syncs of this back-end's replicas done by a suffix / by a full copy, and the key +
    /// value bytes each kind received.
    syncs_suffix: AtomicU64,
    syncs_full: AtomicU64,
    sync_suffix_bytes: AtomicU64,
    sync_full_bytes: AtomicU64,
    /// Suffix syncs this back-end (as source) refused.
    suffix_refusals: Arc<AtomicU64>,
    link_stalls: AtomicU64,
    link_cuts_reported: AtomicU64,
    get_latency: Histogram,
    update_latency: Histogram,
}

/// A running back-end.
pub struct Backend {
    options: BackendOptions,
    view: RwLock<Arc<View>>,
    replicas: RwLock<HashMap<Range, Arc<RangeReplica>>>,
    install_lock: tokio::sync::Mutex<()>,
    /// Serializes configuration fetches triggered by requests (see `catch_up_to`).
    refresh_lock: tokio::sync::Mutex<()>,
    links: Links,
    pool: Pool,
    started: Instant,
    last_manager_contact: parking_lot::Mutex<Instant>,
    /// Successors whose chain has stopped acknowledging, with the time the stall began.
    stalled_links: parking_lot::Mutex<HashMap<NodeId, Instant>>,
    /// Direct probes of stalled (or reported) successors.
    link_probes: parking_lot::Mutex<HashMap<NodeId, LinkProbe>>,
    /// Peers reported to the manager as cut off, with the time of the latest report.
    reported_cuts: parking_lot::Mutex<HashMap<NodeId, Instant>>,
    /// Ranges being split or merged whose drain this node (their head) is watching
    /// (`drain.rs`).
    drain_watch: parking_lot::Mutex<std::collections::HashSet<Range>>,
    /// The epoch of the installed configuration, for puts parked until it changes
    /// (`drain.rs`).
    installed_epoch: watch::Sender<Epoch>,
    /// Bulk copies of parts being split off, by (range, part) (`presplit.rs`).
    pre_splits: parking_lot::Mutex<HashMap<(Range, Range), presplit::PreSplit>>,
    /// Bulk merges of marked pairs, by (lower, upper) (`merge.rs`).
    pre_merges: parking_lot::Mutex<HashMap<(Range, Range), merge::PreMerge>>,
    /// (range, sender) pairs for which a resend is being asked (`resend_after_catch_up`).
    resend_asks: parking_lot::Mutex<std::collections::HashSet<(Range, NodeId)>>,
    counters: Counters,
    me: Weak<Backend>,
}

impl Backend {
    /// Registers with the manager, waits for the ranges to form, opens this node's datastores.
    pub async fn start(options: BackendOptions) -> anyhow::Result<Arc<Backend>> {
        let pool = Pool::new(Duration::from_secs(2));
        let boot_id = boot::current_boot_id();
        let logs_complete = boot::logs_complete(&options.data_dir, options.sync, boot_id.as_deref());
        if !logs_complete {
            warn!(sync = ?options.sync,
                "the host restarted since this back-end last ran (or the restart cannot be told): its datastores may lack updates it acknowledged, so it resyncs its ranges before serving");
        }
        let config = register(&pool, &options, logs_complete).await?;
        // Only once the manager knows: a crash before this proves nothing at the next start.
        if let Some(boot_id) = &boot_id {
            boot::record_boot(&options.data_dir, boot_id).map_err(|e| {
                anyhow::anyhow!("recording the boot id in {}: {e}", options.data_dir.display())
            })?;
        }
        let backend = Arc::new_cyclic(|me| Backend {
            options,
            view: RwLock::new(Arc::new(View::new(ClusterConfig::default()))),
            replicas: RwLock::new(HashMap::new()),
            install_lock: tokio::sync::Mutex::new(()),
            refresh_lock: tokio::sync::Mutex::new(()),
            links: Links::default(),
            pool,
            started: Instant::now(),
            last_manager_contact: parking_lot::Mutex::new(Instant::now()),
            stalled_links: parking_lot::Mutex::new(HashMap::new()),
            link_probes: parking_lot::Mutex::new(HashMap::new()),
            reported_cuts: parking_lot::Mutex::new(HashMap::new()),
            drain_watch: parking_lot::Mutex::new(std::collections::HashSet::new()),
            installed_epoch: watch::Sender::new(0),
            pre_splits: parking_lot::Mutex::new(HashMap::new()),
            pre_merges: parking_lot::Mutex::new(HashMap::new()),
            resend_asks: parking_lot::Mutex::new(std::collections::HashSet::new()),
            counters: Counters::default(),
            me: me.clone(),
        });
        backend.install(config).await?;
        tokio::spawn(poll_config(Arc::downgrade(&backend)));
        tokio::spawn(tick(Arc::downgrade(&backend)));
        Ok(backend)
    }

    /// Serves the native protocol until shutdown, then syncs and checkpoints every datastore.
    pub async fn serve(self: Arc<Self>, listener: tokio::net::TcpListener, shutdown: watch::Receiver<bool>) {
        server::serve(listener, self.clone(), shutdown).await;
        self.flush_stores();
    }

    fn flush_stores(&self) {
        for replica in self.replicas.read().values() {
            if let Err(e) = replica.store.sync().and_then(|_| replica.store.checkpoint()) {
                error!(range = %replica.range.id_string(), error = %e, "closing datastore");
            }
        }
    }

    fn range_dir(&self, range: &Range) -> PathBuf {
        self.options.data_dir.join("ranges").join(range.id_string())
    }

    /// Opens (or creates) a range's datastore, its index sized for `expected_keys` (0 = grow).
    fn open_store(&self, range: &Range, fresh: bool, expected_keys: u64) -> anyhow::Result<DataStore> {
        let dir = self.range_dir(range);
        if fresh && dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| anyhow::anyhow!("emptying {}: {e}", dir.display()))?;
        }
        let options = DsOptions { sync: self.options.sync, expected_keys, ..DsOptions::default() };
        let store = DataStore::open(&dir, options)
            .map_err(|e| anyhow::anyhow!("opening datastore {}: {e}", dir.display()))?;
        let report = store.recovery_report();
        info!(range = %range.id_string(), fresh, expected_keys, records = report.records_replayed,
            truncated_bytes = report.truncated_bytes, "datastore open");
        Ok(store)
    }

    /// Datastore statistics of every range this back-end holds a replica of.
    pub fn datastore_stats(&self) -> Vec<(Range, fawn_ds::Stats)> {
        self.replicas.read().values().map(|r| (r.range, r.store.stats())).collect()
    }

    fn current(&self) -> Arc<View> {
        self.view.read().clone()
    }

    /// Installs a newer configuration: opens, re-wires or drops this node's replicas.
    async fn install(&self, config: ClusterConfig) -> anyhow::Result<()> {
        let _serial = self.install_lock.lock().await;
        if config.epoch <= self.current().config.epoch {
            return Ok(());
        }
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
    async fn split_ranges(&self, config: &ClusterConfig) -> anyhow::Result<()> {
        let me = self.options.node;
        let held: Vec<Arc<RangeReplica>> = self.replicas.read().values().cloned().collect();
        for old in held {
            if config.ranges.iter().any(|rc| rc.range == old.range) || old.route().await.is_syncing() {
                continue;
            }
            let parts: Vec<RangeConfig> = config
                .ranges
                .iter()
                .filter(|rc| rc.chain.contains(&me))
                .filter_map(|rc| {
                    let piece = overlap(&rc.range, &old.range)?;
                    Some(RangeConfig { range: piece, ..rc.clone() })
                })
                .collect();
            // Inside a single range of `config`: a merge, not a split.
            if parts.is_empty() || parts.iter().any(|p| p.range == old.range) {
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
    fn split_part(
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
    /// directory marked a whole replica is used.
    fn recover_split_parts(&self, config: &ClusterConfig) -> anyhow::Result<()> {
        let me = self.options.node;
        let n = config.ranges.len();
        for (i, rc) in config.ranges.iter().enumerate() {
            let missing = |r: &Range| !self.replicas.read().contains_key(r) && !self.range_dir(r).exists();
            if !rc.chain.contains(&me) || !missing(&rc.range) {
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

    /// `expected_keys` sizes the index if a datastore is opened here (0 = grow online).
    async fn install_range(&self, epoch: Epoch, rc: &RangeConfig, expected_keys: u64) -> anyhow::Result<()> {
        let route = Route { epoch, me: self.options.node, rc: rc.clone() };
        let existing = self.replicas.read().get(&rc.range).cloned();
        let fresh_sync = match (&existing, route.is_syncing()) {
            (_, false) => false,
            (None, true) => true,
            // Re-sync from scratch when the source changed or the copy was an old in-sync one.
            (Some(r), true) => {
                r.sync_status().await.is_none_or(|(src, _, _)| Some(src) != route.predecessor())
            }
        };
        match existing {
            Some(r) if !fresh_sync => r.install(route, &self.linker()).await,
            existing => {
                if fresh_sync {
                    if let Some(replica) = self.rejoin_replica(existing.as_ref(), &route, expected_keys).await
                    {
                        self.replicas.write().insert(rc.range, Arc::new(replica));
                        return Ok(());
                    }
                    info!(range = %rc.range.id_string(), from = ?route.predecessor(), "syncing a fresh copy of the range");
                }
                let store = self.open_store(&rc.range, fresh_sync, expected_keys)?;
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
    async fn rejoin_replica(
        &self,
        existing: Option<&Arc<RangeReplica>>,
        route: &Route,
        expected_keys: u64,
    ) -> Option<RangeReplica> {
        let range = route.rc.range;
        let rid = range.id_string();
        let dir = self.range_dir(&range);
        if !dir.join(REPLICA_MARKER).exists() {
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

    /// Marks `range`'s datastore as a whole replica (see `REPLICA_MARKER`). Best effort: a
    /// missing marker only costs a full copy at the next rejoin. The store is synced first: a
    /// copy's records are in the source's log order, not the range's update order, so only a
    /// durable copy may carry the marker (a power loss may then cut the log only after it,
    /// inside the live updates, which are in update order).
    fn mark_complete(&self, range: &Range, store: &DataStore) {
        let dir = self.range_dir(range);
        if marked_range(&dir) == Some(*range) {
            return;
        }
        let written = blocking(true, || {
            store.sync().map_err(std::io::Error::other)?;
            let tmp = dir.join(format!("{REPLICA_MARKER}.tmp"));
            std::fs::write(&tmp, ranges_text(&[*range]))?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, dir.join(REPLICA_MARKER))?;
            std::fs::File::open(&dir)?.sync_all()
        });
        if let Err(e) = written {
            warn!(range = %range.id_string(), error = %e, "cannot mark the datastore as a whole replica");
        }
    }

    /// Removes `range`'s whole-replica marker, durably (see `REPLICA_MARKER`).
    fn unmark_complete(&self, range: &Range) -> std::io::Result<()> {
        let dir = self.range_dir(range);
        let path = dir.join(REPLICA_MARKER);
        blocking(true, || match std::fs::remove_file(&path) {
            Ok(()) => std::fs::File::open(&dir).and_then(|d| d.sync_all()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        })
    }

    /// The source refused `range`'s suffix: replace the replica by a fresh, empty one that
    /// asks for a full snapshot. The old one is retired and, before its directory is emptied,
    /// given up to `REPLACE_WAIT` to be dropped by in-flight work (its datastore's background
    /// threads must not write into the new one's directory).
    async fn replace_with_fresh(&self, range: Range) {
        let _serial = self.install_lock.lock().await;
        let Some(old) = self.replica(&range) else { return };
        if !old.suffix_refused().await {
            return;
        }
        old.retire().await;
        self.replicas.write().remove(&range);
        let deadline = Instant::now() + REPLACE_WAIT;
        let mut old = Some(old);
        while let Some(r) = old.take() {
            match Arc::try_unwrap(r) {
                Ok(replica) => drop(replica),
                Err(r) if Instant::now() < deadline => {
                    old = Some(r);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(_) => {
                    warn!(range = %range.id_string(), "replaced replica still in use; emptying its directory anyway")
                }
            }
        }
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

    /// Datastore writes fsync (`SyncPolicy::Always`): replicas run them with `block_in_place`.
    fn writes_block(&self) -> bool {
        matches!(self.options.sync, SyncPolicy::Always)
    }

    fn linker(&self) -> Linker {
        Linker(self.me.upgrade())
    }

    /// The view to serve a request of `epoch` by: this node's own configuration, after fetching
    /// the manager's if the request is newer. A request from a sender that is behind is served
    /// by this node's newer view: the role checks (head for updates, tail for gets) use it, so
    /// a node that lost the role refuses (and `for_sender` tells the sender to refresh). Only a
    /// node that cannot reach the newer configuration refuses outright.
    async fn view_for(&self, epoch: Epoch) -> Result<Arc<View>, WireError> {
        if self.last_manager_contact.lock().elapsed() > MANAGER_LEASE {
            self.counters.lease_refusals.fetch_add(1, Ordering::Relaxed);
            return Err(WireError::Unavailable("back-end lease expired: cannot reach the manager".into()));
        }
        if epoch > self.current().config.epoch {
            self.catch_up_to(epoch).await;
        }
        let view = self.current();
        if epoch > view.config.epoch {
            self.counters.stale_epoch.fetch_add(1, Ordering::Relaxed);
            return Err(WireError::StaleEpoch { current: view.config.epoch });
        }
        Ok(view)
    }

    /// An update from a configuration newer than this node's may arrive before that
    /// configuration is installed here (its sender installed it first: the head of a range
    /// just split or merged, a new predecessor). Handled by the old view it is dropped (no
    /// such range here yet, or another predecessor), and nothing would send it again: an
    /// update is only resent on a gap, which the next update shows, and there may be no next
    /// one (a client waiting for this put). So: install the newer configuration, then ask
    /// the sender for everything after what this replica holds (duplicates are ignored).
    /// One such request per range and sender at a time.
    fn resend_after_catch_up(&self, from: NodeId, range: Range, epoch: Epoch) {
        let Some(b) = self.me.upgrade() else { return };
        if !self.resend_asks.lock().insert((range, from)) {
            return;
        }
        tokio::spawn(async move {
            b.catch_up_to(epoch).await;
            if let Some(replica) = b.replica(&range) {
                replica.ask_resend(from, &b.linker()).await;
            }
            b.resend_asks.lock().remove(&(range, from));
        });
    }

    /// Fetches and installs the manager's configuration unless one of at least `epoch` got
    /// installed while waiting: a burst of newer-epoch requests costs one fetch, not one each.
    async fn catch_up_to(&self, epoch: Epoch) {
        let _one_at_a_time = self.refresh_lock.lock().await;
        if self.current().config.epoch >= epoch {
            return;
        }
        self.fetch_and_install().await;
    }

    /// Fetches the manager's configuration and installs it if it is newer.
    async fn fetch_and_install(&self) {
        if let Ok(config) = fetch_config(&self.pool, &self.options.manager).await {
            if let Err(e) = self.install(config).await {
                error!(error = %e, "cannot install configuration");
            }
        }
    }

    fn replica(&self, range: &Range) -> Option<Arc<RangeReplica>> {
        self.replicas.read().get(range).cloned()
    }

    fn replica_for_key<'v>(
        &self,
        view: &'v View,
        key: &[u8],
    ) -> Result<(&'v RangeConfig, Arc<RangeReplica>), WireError> {
        let rc = view
            .config
            .range_of(key_id(key))
            .ok_or_else(|| WireError::Unavailable("the cluster has not formed".into()))?;
        let replica = self.replica(&rc.range).ok_or_else(|| {
            WireError::WrongNode(format!("node {} holds no replica of this key", self.options.node))
        })?;
        Ok((rc, replica))
    }

    async fn get(&self, epoch: Epoch, key: &[u8]) -> Result<Response, WireError> {
        let mut view = self.view_for(epoch).await?;
        if let Ok((_, replica)) = self.replica_for_key(&view, key) {
            if !replica.readable() && replica.wait_readable(TAIL_CATCH_UP_WAIT).await {
                // The configuration (and the lease) may have moved on while waiting: check again.
                view = self.view_for(epoch).await?;
            }
        }
        self.get_by(&view, key).map_err(|e| for_sender(e, epoch, &view))
    }

    fn get_by(&self, view: &View, key: &[u8]) -> Result<Response, WireError> {
        let (rc, replica) = self.replica_for_key(view, key)?;
        if rc.tail() != Some(self.options.node) {
            return Err(WireError::WrongNode(format!("node {} is not the tail", self.options.node)));
        }
        if !replica.readable() {
            return Err(WireError::Unavailable("new tail is catching up".into()));
        }
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        Ok(Response::Get(replica.read(key, view.config.flush_at_micros)?))
    }

    async fn update(
        &self,
        epoch: Epoch,
        req: ReqId,
        update: Update,
        reply_to: Option<String>,
    ) -> Result<Response, WireError> {
        let view = self.view_for(epoch).await?;
        let (_, replica) =
            self.replica_for_key(&view, &update.key).map_err(|e| for_sender(e, epoch, &view))?;
        self.counters.updates.fetch_add(1, Ordering::Relaxed);
        let links = self.linker();
        let ordered =
            match replica.order_update(req, &update, reply_to, view.config.flush_at_micros, &links).await {
                Err(WireError::Unavailable(why)) if replica.route().await.rc.is_reshaping() => {
                    return Err(self.park_until_reshaped(view.config.epoch, why).await);
                }
                ordered => ordered.map_err(|e| for_sender(e, epoch, &view))?,
            };
        match ordered {
            Ordered::Reply(outcome) => Ok(Response::Update(outcome)),
            Ordered::AwaitAck { seq, outcome } => {
                replica.wait_acked(seq, self.options.chain_timeout).await?;
                Ok(Response::Update(outcome))
            }
        }
    }

    fn item_stats(&self) -> Response {
        let view = self.current();
        let me = self.options.node;
        let (mut curr_items, mut bytes) = (0, 0);
        for rc in view.config.ranges.iter().filter(|rc| rc.tail() == Some(me)) {
            if let Some(r) = self.replica(&rc.range) {
                let stats = r.store.stats();
                curr_items += stats.live_keys;
                bytes += stats.log_bytes;
            }
        }
        Response::ItemStats { curr_items, bytes }
    }

    fn digest(&self, range: Range, after_key: Option<Vec<u8>>, limit: u32) -> Result<Response, WireError> {
        let replica =
            self.replica(&range).ok_or_else(|| WireError::WrongNode("range not held here".into()))?;
        let mut latest: BTreeMap<Vec<u8>, DigestEntry> = BTreeMap::new();
        for record in replica.store.iter() {
            let record = record.map_err(|e| WireError::Storage(e.to_string()))?;
            // A split range's datastore holds the other part's keys until it is compacted.
            if after_key.as_ref().is_some_and(|a| record.key <= *a) || !range.contains(key_id(&record.key)) {
                continue;
            }
            let value_crc = match record.kind {
                fawn_ds::RecordKind::Put => Some(crc32c::crc32c(&record.value)),
                fawn_ds::RecordKind::Delete => None,
            };
            let entry = DigestEntry { key: record.key.clone(), seq: record.meta.seq, value_crc };
            latest.insert(record.key, entry);
        }
        let limit = limit.min(DIGEST_PAGE_ENTRIES_MAX) as usize;
        Ok(Response::Digest(latest.into_values().take(limit).collect()))
    }

    fn status(&self) -> Response {
        let c = &self.counters;
        let replicas = self.replicas.read();
        let mut counters = vec![
            ("gets".to_string(), c.gets.load(Ordering::Relaxed)),
            ("updates".to_string(), c.updates.load(Ordering::Relaxed)),
            ("replicated".to_string(), c.replicated.load(Ordering::Relaxed)),
            ("stale_epoch".to_string(), c.stale_epoch.load(Ordering::Relaxed)),
            ("lease_refusals".to_string(), c.lease_refusals.load(Ordering::Relaxed)),
            ("syncs_completed".to_string(), c.syncs_completed.load(Ordering::Relaxed)),
            ("syncs_suffix".to_string(), c.syncs_suffix.load(Ordering::Relaxed)),
            ("syncs_full".to_string(), c.syncs_full.load(Ordering::Relaxed)),
            ("sync_suffix_bytes".to_string(), c.sync_suffix_bytes.load(Ordering::Relaxed)),
            ("sync_full_bytes".to_string(), c.sync_full_bytes.load(Ordering::Relaxed)),
            ("suffix_refusals".to_string(), c.suffix_refusals.load(Ordering::Relaxed)),
            ("link_stalls".to_string(), c.link_stalls.load(Ordering::Relaxed)),
            ("stalled_links".to_string(), self.stalled_links.lock().len() as u64),
            ("link_cuts_reported".to_string(), c.link_cuts_reported.load(Ordering::Relaxed)),
            ("cut_links".to_string(), self.reported_cuts.lock().len() as u64),
            ("ranges".to_string(), replicas.len() as u64),
        ];
        let (mut keys, mut log_bytes, mut unacked) = (0, 0, 0);
        for r in replicas.values() {
            let s = r.store.stats();
            keys += s.live_keys;
            log_bytes += s.log_bytes;
            unacked += r.unacked_len() as u64;
        }
        counters.push(("live_keys".into(), keys));
        counters.push(("log_bytes".into(), log_bytes));
        counters.push(("unacked".into(), unacked));
        Response::Status(NodeStatus {
            role: format!("backend {}", self.options.node),
            epoch: self.current().config.epoch,
            uptime_secs: self.started.elapsed().as_secs(),
            counters,
        })
    }

    /// A chain message for a range this node does not (yet) hold: maybe a newer configuration
    /// exists; fetch it so the sender's retry finds us ready.
    fn maybe_behind(&self, epoch: Epoch) {
        if epoch > self.current().config.epoch {
            if let Some(b) = self.me.upgrade() {
                tokio::spawn(async move { b.catch_up_to(epoch).await });
            }
        }
    }

    async fn on_chain(&self, from: NodeId, msg: ChainMsg) -> Result<(), WireError> {
        let links = self.linker();
        let Some(range) = chain_range(&msg) else { return Ok(()) };
        if let Some(epoch) = chain_epoch(&msg) {
            let ahead = epoch > self.current().config.epoch;
            match msg {
                ChainMsg::Replicate { .. } if ahead => self.resend_after_catch_up(from, range, epoch),
                // A tail just promoted from syncing asks its predecessor `Resend` at once; the
                // predecessor, still the tail until it installs the same configuration, would
                // resend without `CaughtUp`, and the new tail's gets would wait for its next
                // tick to ask again (~300 ms of gets of a whole range held; the dip in
                // Figure 13's get rate at the end of a join). Installing first answers it now.
                ChainMsg::Resend { .. } if ahead => self.catch_up_to(epoch).await,
                _ => self.maybe_behind(epoch),
            }
        }
        let Some(replica) = self.replica(&range) else { return Ok(()) };
        match msg {
            m @ ChainMsg::Replicate { .. } => {
                self.counters.replicated.fetch_add(1, Ordering::Relaxed);
                replica.on_replicate(from, m, &links).await?;
            }
            ChainMsg::Ack { seq, .. } => {
                self.counters.acks.fetch_add(1, Ordering::Relaxed);
                replica.on_ack(from, seq, &links).await;
            }
            ChainMsg::Resend { after_seq, .. } => replica.on_resend(from, after_seq, &links).await?,
            ChainMsg::CaughtUp { .. } => replica.on_caught_up(from, &links).await,
            ChainMsg::SyncRequest { .. } => {
                let rate = copy_rate_for(&self.current().config, &range, &self.options);
                replica.on_sync_request(from, &links, rate).await
            }
            ChainMsg::SnapshotBegin { snapshot, .. } => replica.on_snapshot_begin(from, snapshot).await?,
            ChainMsg::SuffixSyncRequest { have_seq, top, .. } => {
                let rate = copy_rate_for(&self.current().config, &range, &self.options);
                let refusals = &self.counters.suffix_refusals;
                replica.on_suffix_sync_request(from, have_seq, &top, &links, rate, refusals).await;
            }
            ChainMsg::SuffixBegin { snapshot, after_seq, .. } => {
                if replica.on_suffix_begin(from, snapshot, after_seq).await {
                    // From its first suffix record on, the store is no prefix of the range's
                    // history until the stream ends: a restart in between must copy in full,
                    // not ask for a suffix after a record from the middle of this one.
                    // (Messages of one link are handled in order: no batch is applied yet.)
                    if let Err(e) = self.unmark_complete(&range) {
                        error!(range = %range.id_string(), error = %e,
                            "cannot remove the whole-replica marker; dropping the suffix stream to ask again");
                        replica.drop_stream(snapshot).await;
                    }
                }
            }
            ChainMsg::SuffixRefused { .. } => {
                if replica.on_suffix_refused(from).await {
                    // Not holding it here: the replacement waits for the old replica to go.
                    drop(replica);
                    self.replace_with_fresh(range).await;
                }
            }
            ChainMsg::SnapshotBatch { snapshot, index, records, .. } => {
                replica.on_snapshot_batch(from, snapshot, index, &records).await?
            }
            ChainMsg::SnapshotEnd { snapshot, batches, upto_seq, .. } => {
                let followups = replica.on_snapshot_end(from, snapshot, batches, upto_seq, &links).await?;
                if followups.sync_done {
                    // The copy is whole: mark it before the manager makes it a replica.
                    self.mark_complete(&range, &replica.store);
                    self.counters.syncs_completed.fetch_add(1, Ordering::Relaxed);
                    if let Some(r) = followups.report {
                        let c = &self.counters;
                        let (n, bytes) = if r.suffix {
                            (&c.syncs_suffix, &c.sync_suffix_bytes)
                        } else {
                            (&c.syncs_full, &c.sync_full_bytes)
                        };
                        n.fetch_add(1, Ordering::Relaxed);
                        bytes.fetch_add(r.bytes, Ordering::Relaxed);
                    }
                    self.report_sync_done(range).await;
                }
            }
            ChainMsg::Hello { .. } => {}
        }
        Ok(())
    }

    async fn report_sync_done(&self, range: Range) {
        self.report(Request::SyncDone { node: self.options.node, range }, "sync completion").await;
    }

    async fn report_tail_ready(&self, range: Range) {
        self.report(Request::TailReady { node: self.options.node, range }, "the tail's readiness").await;
    }

    /// Tells the manager something it answers with the configuration, and installs that.
    /// Failures are logged; the caller's tick reports again.
    async fn report(&self, req: Request, what: &str) {
        match self.pool.call(&self.options.manager, req, Duration::from_secs(2)).await {
            Ok(Response::Config(c)) => {
                if let Err(e) = self.install(c).await {
                    error!(error = %e, "cannot install configuration");
                }
            }
            Ok(other) => warn!(?other, what, "manager did not accept the report; will retry"),
            Err(e) => warn!(error = %e, what, "cannot report to the manager; will retry"),
        }
    }

    /// Notices chain links that make no progress — a link cut between neighbours that both
    /// still reach the manager, or a stuck successor — and logs and counts each stall and its
    /// end. The updates stay unacknowledged (and their puts wait) until the link flows again
    /// or the manager changes the chain; `check_cuts` asks it to when the stall lasts.
    /// `sync_heard` lists, per syncing replica still waiting for its copy, its source (the
    /// tail) and when it last heard from it: the tail keeps no unacknowledged updates for a
    /// syncing replica, so the replica watches that link from its end — a source silent for
    /// `LINK_STALL` is a stalled link like any other.
    fn check_links(&self, sync_heard: &[(NodeId, Instant)]) {
        let view = self.current();
        let now = crate::clock::unix_micros();
        let mut oldest: HashMap<NodeId, u64> = HashMap::new();
        for (range, r) in self.replicas.read().iter() {
            let Some(seq) = r.oldest_unacked() else { continue };
            let rc = view.config.ranges.iter().find(|rc| rc.range == *range);
            let Some(succ) = rc.and_then(|rc| rc.successor(self.options.node)) else { continue };
            let age = now.saturating_sub(seq);
            let worst = oldest.entry(succ).or_default();
            *worst = (*worst).max(age);
        }
        for (source, heard) in sync_heard {
            let age = heard.elapsed().as_micros() as u64;
            let worst = oldest.entry(*source).or_default();
            *worst = (*worst).max(age);
        }
        let limit = LINK_STALL.as_micros() as u64;
        let mut stalled = self.stalled_links.lock();
        for (&peer, &age) in &oldest {
            if age >= limit && !stalled.contains_key(&peer) {
                warn!(
                    peer,
                    stalled_ms = age / 1000,
                    "chain link stalled: updates forwarded to this successor are not acknowledged, \
                     or this sync source sends nothing (link cut or stuck node); puts on those \
                     ranges wait, syncs from it make no progress"
                );
                self.counters.link_stalls.fetch_add(1, Ordering::Relaxed);
                let since =
                    Instant::now().checked_sub(Duration::from_micros(age)).unwrap_or_else(Instant::now);
                stalled.insert(peer, since);
            }
        }
        stalled.retain(|peer, since| {
            let still = oldest.get(peer).is_some_and(|age| *age >= limit);
            if !still {
                info!(peer, stalled_ms = since.elapsed().as_millis() as u64, "chain link flowing again");
            }
            still
        });
    }

    /// Starts a direct probe (`Ping` on a client connection, not the chain link) of `peer`
    /// unless one is in flight; its result lands in `link_probes`.
    fn probe_link(&self, peer: NodeId) {
        let Some(addr) = self.current().config.backend_addr(peer).map(str::to_string) else { return };
        let Some(b) = self.me.upgrade() else { return };
        {
            let mut probes = self.link_probes.lock();
            let p = probes.entry(peer).or_default();
            if p.in_flight {
                return;
            }
            p.in_flight = true;
        }
        tokio::spawn(async move {
            let started = Instant::now();
            let call = b.pool.call(&addr, Request::Ping, LINK_PROBE_TIMEOUT);
            let ok = matches!(tokio::time::timeout(LINK_PROBE_TIMEOUT, call).await, Ok(Ok(Response::Pong)));
            let mut probes = b.link_probes.lock();
            let p = probes.entry(peer).or_default();
            p.in_flight = false;
            p.last = Some((started, ok));
        });
    }

    /// The latest finished probe of `peer`: (started, answered).
    fn last_probe(&self, peer: NodeId) -> Option<(Instant, bool)> {
        self.link_probes.lock().get(&peer).and_then(|p| p.last)
    }

    /// Turns stalls into repairs: a successor stalled for `link_repair_after` that does not
    /// answer a direct probe started after the stall began is reported to the manager as a cut
    /// link; a reported peer is probed and re-reported until it answers again. A stall whose
    /// successor still answers (a slow or overloaded node) is not reported.
    fn check_cuts(&self) {
        let threshold = self.options.link_repair_after;
        if threshold.is_zero() {
            return;
        }
        let stalled: Vec<(NodeId, Instant)> =
            self.stalled_links.lock().iter().map(|(p, t)| (*p, *t)).collect();
        let reported: Vec<(NodeId, Instant)> =
            self.reported_cuts.lock().iter().map(|(p, t)| (*p, *t)).collect();
        for (peer, _) in stalled.iter().chain(&reported) {
            self.probe_link(*peer);
        }
        for (peer, since) in &stalled {
            let unanswered = self.last_probe(*peer).is_some_and(|(at, ok)| !ok && at >= *since);
            if since.elapsed() >= threshold && unanswered {
                self.report_cut(*peer);
            }
        }
        for (peer, last_report) in reported {
            if stalled.iter().any(|(p, _)| *p == peer) {
                continue;
            }
            match self.last_probe(peer) {
                Some((at, true)) if at > last_report => {
                    info!(peer, "chain neighbour answers again; no longer reporting the link cut");
                    self.reported_cuts.lock().remove(&peer);
                }
                _ => self.report_cut(peer),
            }
        }
    }

    /// Tells the manager the link to `peer` is cut (at most every `LINK_CUT_REPORT_INTERVAL`)
    /// and installs the configuration it answers with.
    fn report_cut(&self, peer: NodeId) {
        {
            let mut reported = self.reported_cuts.lock();
            let first = match reported.get(&peer) {
                Some(t) if t.elapsed() < LINK_CUT_REPORT_INTERVAL => return,
                Some(_) => false,
                None => true,
            };
            reported.insert(peer, Instant::now());
            if first {
                self.counters.link_cuts_reported.fetch_add(1, Ordering::Relaxed);
                warn!(
                    peer,
                    "chain link cut: the chain neighbour does not answer; asking the manager to repair"
                );
            }
        }
        let Some(b) = self.me.upgrade() else { return };
        tokio::spawn(async move {
            let req = Request::LinkCut { node: b.options.node, peer };
            match b.pool.call(&b.options.manager, req, Duration::from_secs(2)).await {
                Ok(Response::Config(c)) => {
                    if let Err(e) = b.install(c).await {
                        error!(error = %e, "cannot install configuration");
                    }
                }
                Ok(Response::Error(e)) => info!(peer, error = %e, "the manager did not act on the link cut"),
                Ok(other) => warn!(?other, "unexpected answer to a link-cut report"),
                Err(e) => warn!(error = %e, "cannot report the link cut; will retry"),
            }
        });
    }

    /// Periodic work: replica retries, and re-reporting syncs the manager has not recorded.
    async fn on_tick(&self) {
        let replicas: Vec<_> = self.replicas.read().values().cloned().collect();
        let mut sync_heard = Vec::new();
        for r in &replicas {
            sync_heard.extend(r.sync_heard().await);
        }
        self.check_links(&sync_heard);
        self.check_cuts();
        let links = self.linker();
        let view = self.current();
        for r in replicas {
            // A readable tail of a chain longer than R: the old tail stayed in it until this
            // node serves gets (`manager::state::tail_ready`); tell the manager it does.
            let rc = view.config.ranges.iter().find(|rc| rc.range == r.range);
            let surplus = rc.is_some_and(|rc| {
                rc.tail() == Some(self.options.node) && rc.chain.len() > view.config.replicas as usize
            });
            if surplus && r.readable() {
                self.report_tail_ready(r.range).await;
            }
            if r.ready_to_split().await {
                let req = Request::SplitReady { node: self.options.node, range: r.range };
                self.report(req, "a drained range ready to split").await;
            }
            if r.ready_to_merge().await {
                let req = Request::MergeReady { node: self.options.node, range: r.range };
                self.report(req, "a drained range ready to merge").await;
            }
            r.tick(&links).await;
            if let Some((_, _, true)) = r.sync_status().await {
                if r.route().await.is_syncing() {
                    self.report_sync_done(r.range).await;
                }
            }
        }
    }
}

/// Whether `part` lies inside `whole` (a part of it after a split, or all of it).
fn within(part: &Range, whole: &Range) -> bool {
    whole.is_full()
        || (whole.contains(part.end_inclusive)
            && (part.start_exclusive == whole.start_exclusive || whole.contains(part.start_exclusive)))
}

/// Where two ranges overlap, when that is one range (`None` when they do not overlap; two
/// ranges that each wrap past the other's end overlap twice, which ranges tiling the ring
/// never do with one of each other's tiles but for a ring of one or two ids).
fn overlap(a: &Range, b: &Range) -> Option<Range> {
    if a.is_full() {
        return Some(*b);
    }
    if b.is_full() {
        return Some(*a);
    }
    let end = if a.contains(b.end_inclusive) {
        b.end_inclusive
    } else if b.contains(a.end_inclusive) {
        a.end_inclusive
    } else {
        return None;
    };
    let start = if b.contains(a.start_exclusive) && a.start_exclusive != end {
        a.start_exclusive
    } else {
        b.start_exclusive
    };
    let piece = Range::new(start, end);
    (within(&piece, a) && within(&piece, b)).then_some(piece)
}

/// Ranges as a line of hex key ids, `<start> <end>` per range.
fn ranges_text(ranges: &[Range]) -> String {
    let ids: Vec<String> = ranges
        .iter()
        .flat_map(|r| [r.start_exclusive, r.end_inclusive])
        .map(|id| format!("{:032x}", id.0))
        .collect();
    ids.join(" ") + "\n"
}

/// The ranges `ranges_text` wrote; `None` for anything else (an empty marker too).
fn parse_ranges(text: &str) -> Option<Vec<Range>> {
    let ids: Vec<KeyId> = text
        .split_whitespace()
        .map(|h| u128::from_str_radix(h, 16).map(KeyId))
        .collect::<Result<_, _>>()
        .ok()?;
    if ids.is_empty() || !ids.len().is_multiple_of(2) {
        return None;
    }
    Some(ids.chunks(2).map(|p| Range::new(p[0], p[1])).collect())
}

/// The range a directory's `REPLICA` marker names.
fn marked_range(dir: &std::path::Path) -> Option<Range> {
    let text = std::fs::read_to_string(dir.join(REPLICA_MARKER)).ok()?;
    match parse_ranges(&text)?[..] {
        [range] => Some(range),
        _ => None,
    }
}

/// The datastore key filter of `range`'s keys.
fn range_filter(range: Range) -> fawn_ds::KeyFilter {
    Arc::new(move |key: &[u8]| range.contains(key_id(key)))
}

/// A role refusal to a sender that routed by an older configuration says so, so that it fetches
/// the newer one at once instead of backing off.
fn for_sender(e: WireError, sender_epoch: Epoch, view: &View) -> WireError {
    match e {
        WireError::WrongNode(_) if sender_epoch < view.config.epoch => {
            WireError::StaleEpoch { current: view.config.epoch }
        }
        e => e,
    }
}

fn chain_range(msg: &ChainMsg) -> Option<Range> {
    match msg {
        ChainMsg::Hello { .. } => None,
        ChainMsg::Replicate { range, .. }
        | ChainMsg::Ack { range, .. }
        | ChainMsg::Resend { range, .. }
        | ChainMsg::CaughtUp { range, .. }
        | ChainMsg::SyncRequest { range, .. }
        | ChainMsg::SnapshotBegin { range, .. }
        | ChainMsg::SnapshotBatch { range, .. }
        | ChainMsg::SnapshotEnd { range, .. }
        | ChainMsg::SuffixSyncRequest { range, .. }
        | ChainMsg::SuffixBegin { range, .. }
        | ChainMsg::SuffixRefused { range, .. } => Some(*range),
    }
}

fn chain_epoch(msg: &ChainMsg) -> Option<Epoch> {
    match msg {
        ChainMsg::Replicate { epoch, .. }
        | ChainMsg::Ack { epoch, .. }
        | ChainMsg::Resend { epoch, .. }
        | ChainMsg::CaughtUp { epoch, .. }
        | ChainMsg::SyncRequest { epoch, .. }
        | ChainMsg::SnapshotBegin { epoch, .. }
        | ChainMsg::SnapshotEnd { epoch, .. }
        | ChainMsg::SuffixSyncRequest { epoch, .. }
        | ChainMsg::SuffixBegin { epoch, .. }
        | ChainMsg::SuffixRefused { epoch, .. } => Some(*epoch),
        ChainMsg::Hello { .. } | ChainMsg::SnapshotBatch { .. } => None,
    }
}

/// A direct probe of a chain successor.
#[derive(Default)]
struct LinkProbe {
    in_flight: bool,
    /// The latest finished probe: when it started, and whether the peer answered.
    last: Option<(Instant, bool)>,
}

/// Hands replicas the links of their back-end.
struct Linker(Option<Arc<Backend>>);

impl LinkTo for Linker {
    fn link(&self, peer: NodeId) -> mpsc::Sender<ChainMsg> {
        match &self.0 {
            Some(b) => b.links.to(b, peer),
            // The back-end is shutting down: a closed queue drops the message.
            None => mpsc::channel(1).0,
        }
    }

    fn committed(&self, reply_to: &str, req: ReqId, outcome: Outcome, key: &[u8]) {
        let Some(b) = self.0.clone() else { return };
        // Only to a front-end of the configuration: an update's `reply_to` must not make this
        // node connect to any address a client names.
        if !b.current().config.lists_frontend(reply_to) {
            debug!(reply_to, "not a front-end of the configuration; no committed notice sent");
            return;
        }
        let addr = reply_to.to_string();
        let key = key.to_vec();
        tokio::spawn(async move {
            let msg = Request::Committed { req, outcome, key };
            let _ = b.pool.call(&addr, msg, COMMITTED_NOTICE_TIMEOUT).await;
        });
    }
}

impl Exposition for Backend {
    fn metrics(&self) -> String {
        let mut out = String::new();
        let node = format!("node=\"{}\",", self.options.node);
        let c = &self.counters;
        for (name, v) in [
            ("fawn_backend_gets_total", &c.gets),
            ("fawn_backend_updates_total", &c.updates),
            ("fawn_backend_replicated_total", &c.replicated),
            ("fawn_backend_acks_total", &c.acks),
            ("fawn_backend_stale_epoch_total", &c.stale_epoch),
            ("fawn_backend_lease_refusals_total", &c.lease_refusals),
            ("fawn_backend_syncs_completed_total", &c.syncs_completed),
            ("fawn_backend_syncs_suffix_total", &c.syncs_suffix),
            ("fawn_backend_syncs_full_total", &c.syncs_full),
            ("fawn_backend_sync_suffix_bytes_total", &c.sync_suffix_bytes),
            ("fawn_backend_sync_full_bytes_total", &c.sync_full_bytes),
            ("fawn_backend_suffix_refusals_total", &*c.suffix_refusals),
            ("fawn_backend_link_stalls_total", &c.link_stalls),
            ("fawn_backend_link_cuts_reported_total", &c.link_cuts_reported),
        ] {
            metrics::line(&mut out, name, &node, v.load(Ordering::Relaxed));
        }
        c.get_latency.render(&mut out, "fawn_backend_get_seconds", &node);
        c.update_latency.render(&mut out, "fawn_backend_update_seconds", &node);
        metrics::line(&mut out, "fawn_backend_chain_queue_depth", &node, self.links.queued());
        metrics::line(&mut out, "fawn_backend_epoch", &node, self.current().config.epoch);
        for r in self.replicas.read().values() {
            let s = r.store.stats();
            let labels = format!("{node}range=\"{}\",", r.range.id_string());
            metrics::line(&mut out, "fawn_datastore_live_keys", &labels, s.live_keys);
            metrics::line(&mut out, "fawn_datastore_log_bytes", &labels, s.log_bytes);
            metrics::line(&mut out, "fawn_datastore_index_bytes", &labels, s.index_bytes);
            metrics::line(&mut out, "fawn_datastore_index_slots", &labels, s.index_capacity);
            metrics::line(&mut out, "fawn_datastore_unacked_updates", &labels, r.unacked_len() as u64);
            datastore_maintenance_metrics(&mut out, &labels, &s);
        }
        out
    }
}

/// What an operator needs to see of a datastore's space and cleaning: live and
/// garbage bytes, bytes written by clients and by cleaning (their ratio is the write
/// amplification), and how long the last maintenance ran and held the writers' lock.
fn datastore_maintenance_metrics(out: &mut String, labels: &str, s: &fawn_ds::Stats) {
    for (name, v) in [
        ("fawn_datastore_live_bytes", s.live_bytes),
        ("fawn_datastore_garbage_bytes", s.garbage_bytes),
        ("fawn_datastore_reclaimable_bytes", s.reclaimable_bytes),
        ("fawn_datastore_cold_log_bytes", s.cold_log_bytes),
        ("fawn_datastore_user_written_bytes_total", s.bytes_written_user),
        ("fawn_datastore_cleaning_written_bytes_total", s.bytes_written_cleaning),
        ("fawn_datastore_maintenance_ops_total", s.maintenance_ops),
        ("fawn_datastore_auto_compact_errors_total", s.auto_compact_errors),
        ("fawn_datastore_write_stalls_total", s.write_stalls),
        ("fawn_datastore_poisoned", u64::from(s.poisoned)),
        ("fawn_datastore_background_sync_errors_total", s.background_sync_errors),
    ] {
        metrics::line(out, name, labels, v);
    }
    for (name, us) in [
        ("fawn_datastore_last_maintenance_seconds", s.last_maintenance_us),
        ("fawn_datastore_last_lock_hold_seconds", s.last_lock_hold_us),
        ("fawn_datastore_max_lock_hold_seconds", s.max_lock_hold_us),
    ] {
        metrics::seconds_line(out, name, labels, us);
    }
}

impl LinkOwner for Backend {
    fn peer_addr(&self, peer: NodeId) -> Option<String> {
        self.current().config.backend_addr(peer).map(str::to_string)
    }

    fn node_id(&self) -> NodeId {
        self.options.node
    }

    async fn on_connected(&self, peer: NodeId) -> Vec<ChainMsg> {
        let replicas: Vec<_> = self.replicas.read().values().cloned().collect();
        let mut out = Vec::new();
        for r in replicas {
            out.extend(r.resend_on_connect(peer).await);
        }
        out
    }
}

impl Handler for Backend {
    async fn request(self: Arc<Self>, request: Request) -> Response {
        let result = match request {
            Request::Get { epoch, key, .. } => {
                let start = Instant::now();
                let r = self.get(epoch, &key).await;
                self.counters.get_latency.record(start.elapsed());
                r
            }
            Request::Update { epoch, req, update, reply_to, .. } => {
                let start = Instant::now();
                let r = self.update(epoch, req, update, reply_to).await;
                self.counters.update_latency.record(start.elapsed());
                r
            }
            Request::ItemStats => Ok(self.item_stats()),
            Request::RangeDigest { range, after_key, limit } => self.digest(range, after_key, limit),
            Request::Status => Ok(self.status()),
            Request::Ping => Ok(Response::Pong),
            Request::GetConfig => Ok(Response::Config(self.current().config.clone())),
            Request::Install { config } => {
                if let Err(e) = self.install(config).await {
                    error!(error = %e, "cannot install pushed configuration");
                }
                Ok(Response::Ok)
            }
            other => Err(WireError::Invalid(format!("a back-end does not serve {other:?}"))),
        };
        result.unwrap_or_else(Response::Error)
    }

    async fn chain(self: Arc<Self>, from: NodeId, msg: ChainMsg) {
        if let Err(e) = self.on_chain(from, msg).await {
            error!(from, error = %e, "chain message failed");
        }
    }
}

/// Registers with the manager until it answers, then waits until the ranges are formed.
/// Splits `total` expected keys over `ranges` in proportion to their widths (each range's
/// share of the key-id space over the ranges' total share). The parts sum to `total` exactly
/// (cumulative rounding); `ranges` should not overlap, as a ring's ranges never do.
pub fn apportion_expected_keys(total: u64, ranges: &[Range]) -> Vec<u64> {
    // Ids in a range as f64: exact enough for proportions (53 significant bits).
    let widths: Vec<f64> = ranges.iter().map(|r| r.len_minus_one() as f64 + 1.0).collect();
    let sum: f64 = widths.iter().sum();
    let mut parts = Vec::with_capacity(ranges.len());
    let (mut cumulative, mut given) = (0.0_f64, 0_u64);
    for (i, w) in widths.iter().enumerate() {
        cumulative += w;
        let upto = if i + 1 == widths.len() {
            total
        } else {
            ((cumulative / sum * total as f64).round() as u64).min(total)
        };
        let part = upto.saturating_sub(given);
        parts.push(part);
        given += part;
    }
    parts
}

/// Each range `node` replicates in `config` (chain or syncing) with its share of the node's
/// `total` expected keys; empty when `total` is 0 (no sizing hint).
pub fn expected_keys_by_range(total: u64, node: NodeId, config: &ClusterConfig) -> HashMap<Range, u64> {
    if total == 0 {
        return HashMap::new();
    }
    let held: Vec<Range> =
        config.ranges.iter().filter(|rc| rc.path().any(|n| n == node)).map(|rc| rc.range).collect();
    held.iter().copied().zip(apportion_expected_keys(total, &held)).collect()
}

/// Registers with the manager; `logs_complete` as in `Request::RegisterBackend`.
async fn register(
    pool: &Pool,
    options: &BackendOptions,
    logs_complete: bool,
) -> anyhow::Result<ClusterConfig> {
    let request =
        Request::RegisterBackend { node: options.node, addr: options.advertise.clone(), logs_complete };
    let mut logged = false;
    loop {
        match pool.call(&options.manager, request.clone(), Duration::from_secs(5)).await {
            Ok(Response::Config(c)) if c.formed => return Ok(c),
            Ok(Response::Config(_)) => {}
            Ok(Response::Error(e)) => anyhow::bail!("the manager refused node {}: {e}", options.node),
            Ok(other) => anyhow::bail!("unexpected manager answer {other:?}"),
            Err(e) if !logged => {
                warn!(manager = %options.manager, error = %e, "manager not reachable yet; retrying");
                logged = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn poll_config(backend: Weak<Backend>) {
    loop {
        tokio::time::sleep(CONFIG_POLL_INTERVAL).await;
        let Some(b) = backend.upgrade() else { return };
        let Ok(config) = fetch_config(&b.pool, &b.options.manager).await else { continue };
        *b.last_manager_contact.lock() = Instant::now();
        let me = config.backends.iter().find(|x| x.node == b.options.node).map(|x| x.state);
        if me == Some(NodeState::Failed) {
            warn!("the manager declared this back-end failed; registering again to rejoin");
            // The process kept running: its datastores hold what it acknowledged.
            match register(&b.pool, &b.options, true).await {
                Ok(c) => {
                    let _ = b.install(c).await;
                }
                Err(e) => error!(error = %e, "rejoin refused"),
            }
            continue;
        }
        if let Err(e) = b.install(config).await {
            error!(error = %e, "cannot install configuration");
        }
    }
}

async fn tick(backend: Weak<Backend>) {
    loop {
        tokio::time::sleep(TICK_INTERVAL).await;
        let Some(b) = backend.upgrade() else { return };
        b.on_tick().await;
    }
}

#[cfg(test)]
mod tests {
    use super::apportion_expected_keys;
    use fawn_ring::{KeyId, Range};

    #[test]
    fn apportioning_follows_widths_and_sums_to_the_total() {
        let quarter = u128::MAX / 4;
        // Widths 1/4, 1/2 and 1/4 of the circle (the last one wraps).
        let ranges = [
            Range::new(KeyId(0), KeyId(quarter)),
            Range::new(KeyId(quarter), KeyId(3 * quarter)),
            Range::new(KeyId(3 * quarter), KeyId(0)),
        ];
        assert_eq!(apportion_expected_keys(1000, &ranges), vec![250, 500, 250]);
        for total in [0, 1, 2, 3, 7, 999, 1_000_001, u64::MAX / 3] {
            let parts = apportion_expected_keys(total, &ranges);
            assert_eq!(parts.iter().sum::<u64>(), total, "total {total}: {parts:?}");
        }
        // A tiny range next to a huge one still sums exactly.
        let skewed = [Range::new(KeyId(0), KeyId(1)), Range::new(KeyId(1), KeyId(0))];
        assert_eq!(apportion_expected_keys(10, &skewed), vec![0, 10]);
        assert_eq!(apportion_expected_keys(5, &[Range::full()]), vec![5]);
        assert!(apportion_expected_keys(5, &[]).is_empty());
    }
}

/// Guards `overlap`, which cuts a held range where the configuration's boundaries fall inside
/// it (a split, or a merge after a split this node had not installed yet).
#[cfg(test)]
mod overlap_tests {
    use super::overlap;
    use fawn_ring::{KeyId, Range};

    fn r(s: u128, e: u128) -> Range {
        Range::new(KeyId(s), KeyId(e))
    }

    #[test]
    fn overlaps_are_the_common_piece_in_either_order() {
        let cases = [
            (r(0, 10), r(5, 20), Some(r(5, 10))),
            (r(0, 20), r(5, 10), Some(r(5, 10))),
            (r(0, 10), r(0, 10), Some(r(0, 10))),
            (r(0, 10), r(10, 20), None),
            (r(0, 10), r(20, 30), None),
            // Wrapping past the top of the id space.
            (r(100, 5), r(3, 50), Some(r(3, 5))),
            (r(100, 5), r(90, 110), Some(r(100, 110))),
            (r(100, 5), Range::full(), Some(r(100, 5))),
        ];
        for (a, b, want) in cases {
            assert_eq!(super::overlap(&a, &b), want, "{a} ∩ {b}");
            assert_eq!(overlap(&b, &a), want, "{b} ∩ {a}");
        }
    }
}

/// Guards the choice of copy pace: a range short of R in-sync replicas is re-replicated at
/// the repair rate, a join's pre-copy into a full chain at the join rate.
#[cfg(test)]
mod copy_rate_tests {
    use super::{copy_rate_for, BackendOptions};
    use fawn_ds::SyncPolicy;
    use fawn_proto::native::{ClusterConfig, RangeConfig};
    use fawn_ring::Range;
    use std::time::Duration;

    #[test]
    fn repairs_use_the_repair_rate_and_joins_the_join_rate() {
        let options = BackendOptions {
            node: 0,
            data_dir: "unused".into(),
            manager: String::new(),
            advertise: String::new(),
            sync: SyncPolicy::Never,
            expected_keys: 0,
            chain_timeout: Duration::from_secs(1),
            link_repair_after: Duration::from_secs(1),
            copy_bytes_per_s: 32,
            join_copy_bytes_per_s: 8,
        };
        let range = Range::full();
        let config = |chain: Vec<u32>| ClusterConfig {
            replicas: 3,
            ranges: vec![RangeConfig { syncing: vec![9], ..RangeConfig::new(range, chain) }],
            ..ClusterConfig::default()
        };
        assert_eq!(copy_rate_for(&config(vec![1, 2]), &range, &options), 32, "re-replication");
        assert_eq!(copy_rate_for(&config(vec![1, 2, 3]), &range, &options), 8, "join pre-copy");
    }
}

/// Guards the operator's view of cleaning: the per-range maintenance metrics come
/// from a real datastore's stats and move when a real compaction runs.
#[cfg(test)]
mod maintenance_metrics_tests {
    use super::datastore_maintenance_metrics;
    use fawn_ds::{DataStore, Meta, Options};

    fn value_of(out: &str, name: &str) -> f64 {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .unwrap_or_else(|| panic!("{name} missing in\n{out}"));
        line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("bad line {line}"))
    }

    #[test]
    fn compaction_shows_in_the_datastore_metrics() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = Options { auto_compact: false, ..Options::default() };
        let ds = DataStore::open(dir.path(), options).expect("open");
        let value = vec![7u8; 1000];
        for round in 0..4u64 {
            for k in 0..200u64 {
                let meta = Meta { seq: round * 1000 + k + 1, flags: 0, expiry: 0 };
                ds.store(format!("key-{k}").as_bytes(), &value, meta).expect("store");
            }
        }
        let labels = "node=\"0\",range=\"r\",";
        let mut before = String::new();
        datastore_maintenance_metrics(&mut before, labels, &ds.stats());
        assert!(value_of(&before, "fawn_datastore_garbage_bytes") > 3.0 * 200.0 * 1000.0);
        assert_eq!(value_of(&before, "fawn_datastore_maintenance_ops_total"), 0.0);
        assert_eq!(value_of(&before, "fawn_datastore_cleaning_written_bytes_total"), 0.0);

        ds.compact().expect("compact");
        let mut after = String::new();
        datastore_maintenance_metrics(&mut after, labels, &ds.stats());
        assert_eq!(value_of(&after, "fawn_datastore_maintenance_ops_total"), 1.0);
        assert!(value_of(&after, "fawn_datastore_garbage_bytes") < 1000.0, "{after}");
        assert_eq!(value_of(&after, "fawn_datastore_reclaimable_bytes"), 0.0);
        assert!(value_of(&after, "fawn_datastore_live_bytes") >= 200.0 * 1000.0);
        assert!(value_of(&after, "fawn_datastore_cleaning_written_bytes_total") >= 200.0 * 1000.0);
        assert!(value_of(&after, "fawn_datastore_user_written_bytes_total") >= 800.0 * 1000.0);
        assert!(value_of(&after, "fawn_datastore_last_maintenance_seconds") > 0.0);
        assert!(value_of(&after, "fawn_datastore_last_lock_hold_seconds") > 0.0);
        assert_eq!(value_of(&after, "fawn_datastore_poisoned"), 0.0);
        assert!(after.contains("fawn_datastore_max_lock_hold_seconds{node=\"0\",range=\"r\"}"));
    }
}
