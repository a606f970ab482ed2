//! The back-end: hosts one datastore per range it replicates and plays head, middle, tail or
//! syncing replica of each range's chain (paper §3.4.3–3.4.4).

mod boot;
mod disk;
mod drain;
mod fence;
mod handler;
mod health;
mod install;
mod link;
mod merge;
mod metrics;
mod presplit;
mod range;

pub use disk::DISK_FAULT_REPORT_INTERVAL;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use fawn_client::pool::Pool;
use fawn_client::rpc::OneWay;
use fawn_ds::{DataStore, Options as DsOptions, SyncPolicy};
use fawn_proto::native::{
    ChainMsg, ClusterConfig, CommittedNotice, DigestEntry, Epoch, NodeState, NodeStatus, RangeConfig, ReqId,
    Request, Response, WireError, COMMITTED_NOTICES_MAX, DIGEST_PAGE_ENTRIES_MAX,
};
use fawn_proto::op::Update;
use fawn_ring::{key_id, KeyId, NodeId, Range};
use parking_lot::RwLock;
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, warn};

use crate::manager::client::{self as manager_client, Held};
use crate::metrics::Histogram;
use crate::server::{self, Handler};
use crate::view::View;
use health::LinkProbe;
use link::{LinkOwner, Links};
use range::{blocking, suffix_plan, ClientReq, LinkTo, Ordered, RangeReplica, Route};

/// How often a back-end polls the manager for a newer configuration (and renews its lease).
pub const CONFIG_POLL_INTERVAL: Duration = Duration::from_millis(250);
/// A back-end that has not reached the manager for this long stops serving clients: by then
/// the manager may have declared it failed and handed its role to another node.
pub const MANAGER_LEASE: Duration = Duration::from_millis(1500);
/// How long one lease renewal may wait for the manager group (across its members).
const RENEW_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a tail waits for room to queue a commit notice to a front-end (a notice that
/// does not go makes the front-end ask the head again).
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

/// How long a get to a promoted tail that is still catching up waits before being refused.
const TAIL_CATCH_UP_WAIT: Duration = Duration::from_millis(500);

/// Back-end settings.
#[derive(Clone, Debug)]
pub struct BackendOptions {
    pub node: NodeId,
    pub data_dir: PathBuf,
    /// Native addresses of the manager group, comma-separated (`manager::client`).
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
/// Default for `BackendOptions::join_copy_bytes_per_s`: 4 MiB/s per syncing range. A join risks
/// nothing while it runs (the range keeps R replicas), so it goes slow and leaves the CPU and
/// the disk to foreground gets (docs/BENCHMARKS.md, gets during a join).
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
    /// Leases from the manager group older in term or epoch than the one held: ignored.
    stale_leases: AtomicU64,
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
    /// Datastore write faults noticed (at most one per process: the fault is sticky).
    disk_faults: AtomicU64,
    get_latency: Histogram,
    update_latency: Histogram,
}

/// A running back-end.
pub struct Backend {
    options: BackendOptions,
    /// The cluster this node's data directory belongs to (`fence`; 0 only before the first
    /// formed configuration of a manager group that predates cluster ids).
    cluster: u64,
    view: RwLock<Arc<View>>,
    replicas: RwLock<HashMap<Range, Arc<RangeReplica>>>,
    install_lock: tokio::sync::Mutex<()>,
    /// Serializes configuration fetches triggered by requests (see `catch_up_to`).
    refresh_lock: tokio::sync::Mutex<()>,
    links: Links,
    pool: Pool,
    started: Instant,
    last_manager_contact: parking_lot::Mutex<Instant>,
    /// The newest manager-group term a lease was taken in (`renew`).
    lease_term: AtomicU64,
    /// Successors whose chain has stopped acknowledging, with the time the stall began.
    stalled_links: parking_lot::Mutex<HashMap<NodeId, Instant>>,
    /// Direct probes of stalled (or reported) successors.
    link_probes: parking_lot::Mutex<HashMap<NodeId, LinkProbe>>,
    /// Peers reported to the manager as cut off, with the time of the latest report.
    reported_cuts: parking_lot::Mutex<HashMap<NodeId, Instant>>,
    /// A datastore of this node failed a write (`disk.rs`).
    disk_fault: parking_lot::Mutex<Option<disk::DiskFault>>,
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
    /// The native listener's reply budget (its free room and waits are metrics).
    reply_budget: Arc<server::ReplyBudget>,
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
        let recorded = fence::recorded(&options.data_dir)?;
        let config = register(&pool, &options, logs_complete, recorded).await?;
        let cluster = recorded.unwrap_or(config.cluster_id);
        // A disk that cannot take these small files is faulty: the back-end starts degraded
        // (`disk.rs`). Unrecorded, the cluster id is still checked at every install of this
        // process, and the old boot id (or none) proves nothing at the next start.
        let counters = Counters::default();
        let mut disk_fault = None;
        if recorded.is_none() && cluster != 0 {
            if let Err(e) = fence::record(&options.data_dir, cluster) {
                disk_fault =
                    disk::fault_at_start(disk::io_fault_reason(&e, "recording the cluster id"), &counters);
            }
        }
        // Only once the manager knows: a crash before this proves nothing at the next start.
        if let (Some(boot_id), None) = (&boot_id, &disk_fault) {
            if let Err(e) = boot::record_boot(&options.data_dir, boot_id) {
                disk_fault =
                    disk::fault_at_start(disk::io_fault_reason(&e, "recording the boot id"), &counters);
            }
        }
        let backend = Arc::new_cyclic(|me| Backend {
            options,
            cluster,
            view: RwLock::new(Arc::new(View::new(ClusterConfig::default()))),
            replicas: RwLock::new(HashMap::new()),
            install_lock: tokio::sync::Mutex::new(()),
            refresh_lock: tokio::sync::Mutex::new(()),
            links: Links::default(),
            pool,
            started: Instant::now(),
            last_manager_contact: parking_lot::Mutex::new(Instant::now()),
            lease_term: AtomicU64::new(0),
            stalled_links: parking_lot::Mutex::new(HashMap::new()),
            link_probes: parking_lot::Mutex::new(HashMap::new()),
            reported_cuts: parking_lot::Mutex::new(HashMap::new()),
            disk_fault: parking_lot::Mutex::new(disk_fault),
            drain_watch: parking_lot::Mutex::new(std::collections::HashSet::new()),
            installed_epoch: watch::Sender::new(0),
            pre_splits: parking_lot::Mutex::new(HashMap::new()),
            pre_merges: parking_lot::Mutex::new(HashMap::new()),
            resend_asks: parking_lot::Mutex::new(std::collections::HashSet::new()),
            counters,
            reply_budget: Arc::default(),
            me: me.clone(),
        });
        backend.install(config).await?;
        tokio::spawn(poll_config(Arc::downgrade(&backend)));
        tokio::spawn(tick(Arc::downgrade(&backend)));
        Ok(backend)
    }

    /// Serves the native protocol until shutdown, then syncs and checkpoints every datastore.
    pub async fn serve(self: Arc<Self>, listener: tokio::net::TcpListener, shutdown: watch::Receiver<bool>) {
        let budget = self.reply_budget.clone();
        server::serve_within(listener, self.clone(), server::limits(), budget, shutdown).await;
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
            std::fs::remove_dir_all(&dir).map_err(|e| {
                let what = format!("emptying {}: {e}", dir.display());
                anyhow::Error::new(e).context(what)
            })?;
        }
        let options = DsOptions { sync: self.options.sync, expected_keys, ..DsOptions::default() };
        let store = DataStore::open(&dir, options).map_err(|e| {
            let what = format!("opening datastore {}: {e}", dir.display());
            anyhow::Error::new(e).context(what)
        })?;
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

    /// Marks `replica`'s finished copy a whole replica, unless an install replaced it since:
    /// its directory may then hold the replacement's fresh copy, which the marker would call
    /// whole. Returns whether it was marked; a replaced copy is not reported either. Under the
    /// install lock, which every replacement holds while it empties the directory.
    async fn mark_copy_complete(&self, range: &Range, replica: &Arc<RangeReplica>) -> bool {
        let _serial = self.install_lock.lock().await;
        let current = self.holds(range, replica);
        if current {
            self.mark_complete(range, &replica.store);
        }
        current
    }

    /// [`Self::unmark_complete`] for `replica`, unless an install replaced it since (the
    /// marker then is the replacement's), under the install lock as `mark_copy_complete`.
    async fn unmark_copy(&self, range: &Range, replica: &Arc<RangeReplica>) -> std::io::Result<()> {
        let _serial = self.install_lock.lock().await;
        if self.holds(range, replica) {
            self.unmark_complete(range)?;
        }
        Ok(())
    }

    /// Whether `replica` is still this node's replica of `range` (no install replaced it).
    fn holds(&self, range: &Range, replica: &Arc<RangeReplica>) -> bool {
        self.replica(range).is_some_and(|r| Arc::ptr_eq(&r, replica))
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
        if let Some(config) = self.renew().await {
            if let Err(e) = self.install(config).await {
                error!(error = %e, "cannot install configuration");
            }
        }
    }

    /// Renews the lease with the manager group and returns the configuration it came with.
    /// The lease runs from when the request was sent, not from when the answer arrived: the
    /// leader's answer says its group still led at some moment after the send, no later. A
    /// lease older in term or epoch than what this node held is ignored
    /// (`manager::client::accept_lease`).
    async fn renew(&self) -> Option<ClusterConfig> {
        let held = Held { term: self.lease_term.load(Ordering::SeqCst), epoch: self.current().config.epoch };
        let sent = Instant::now();
        let lease = manager_client::renew(&self.pool, &self.options.manager, Request::Renew, RENEW_TIMEOUT)
            .await
            .ok()?;
        if !manager_client::accept_lease(held, &lease) {
            self.counters.stale_leases.fetch_add(1, Ordering::Relaxed);
            warn!(?held, term = lease.term, epoch = lease.config.epoch, "ignoring an older lease");
            return None;
        }
        self.lease_term.fetch_max(lease.term, Ordering::SeqCst);
        let mut contact = self.last_manager_contact.lock();
        *contact = (*contact).max(sent);
        Some(lease.config)
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

    async fn report_sync_done(&self, range: Range) {
        self.report(Request::SyncDone { node: self.options.node, range }, "sync completion").await;
    }

    async fn report_tail_ready(&self, range: Range) {
        self.report(Request::TailReady { node: self.options.node, range }, "the tail's readiness").await;
    }

    /// Tells the manager something it answers with the configuration, and installs that.
    /// Failures are logged; the caller's tick reports again.
    async fn report(&self, req: Request, what: &str) {
        match crate::manager::client::call(&self.pool, &self.options.manager, req, Duration::from_secs(2))
            .await
        {
            Ok(Response::Config(c)) => {
                if let Err(e) = self.install(c).await {
                    error!(error = %e, "cannot install configuration");
                }
            }
            Ok(other) => warn!(?other, what, "manager did not accept the report; will retry"),
            Err(e) => warn!(error = %e, what, "cannot report to the manager; will retry"),
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
            match crate::manager::client::call(&b.pool, &b.options.manager, req, Duration::from_secs(2)).await
            {
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
        self.check_disk(&replicas);
        let links = self.linker();
        let view = self.current();
        for r in replicas {
            // The range's unproven tail caught up, or a readable tail of a chain longer than R
            // (the old tail stayed in it): tell the manager (`manager::state::tail_ready`).
            let rc = view.config.ranges.iter().find(|rc| rc.range == r.range);
            let surplus = rc.is_some_and(|rc| {
                rc.tail() == Some(self.options.node) && rc.chain.len() > view.config.replicas as usize
            });
            if (surplus && r.readable()) || r.reports_tail_ready().await {
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

    fn committed(&self, reply_to: &str, notices: Vec<CommittedNotice>) {
        let Some(b) = self.0.clone() else { return };
        // Only to a front-end of the configuration: an update's `reply_to` must not make this
        // node connect to any address a client names.
        if !b.current().config.lists_frontend(reply_to) {
            debug!(reply_to, "not a front-end of the configuration; no committed notice sent");
            return;
        }
        // One-way: queued on the pooled connection if it has room, else by a task that
        // connects or waits for room. A notice lost here makes the front-end ask the head.
        let mut notices = notices;
        let mut waiting = Vec::new();
        while !notices.is_empty() {
            let rest = notices.split_off(notices.len().min(COMMITTED_NOTICES_MAX));
            let msg = match OneWay::new(Request::Committed { notices }) {
                Ok(msg) => msg,
                Err(e) => {
                    warn!(error = %e, "committed notices not encodable");
                    return;
                }
            };
            match b.pool.live(reply_to) {
                Some(conn) => {
                    if let Err(msg) = conn.send_now(msg) {
                        waiting.push(msg);
                    }
                }
                None => waiting.push(msg),
            }
            notices = rest;
        }
        if waiting.is_empty() {
            return;
        }
        let addr = reply_to.to_string();
        tokio::spawn(async move {
            for msg in waiting {
                let sent = match b.pool.get(&addr).await {
                    Ok(conn) => conn.send(msg, COMMITTED_NOTICE_TIMEOUT).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = sent {
                    debug!(reply_to = addr, error = %e, "committed notices not sent");
                }
            }
        });
    }
}

impl LinkOwner for Backend {
    fn peer_addr(&self, peer: NodeId) -> Option<String> {
        self.current().config.backend_addr(peer).map(str::to_string)
    }

    fn node_id(&self) -> NodeId {
        self.options.node
    }

    fn cluster_id(&self) -> u64 {
        self.current().config.cluster_id
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

/// Registers with the manager; `logs_complete` as in `Request::RegisterBackend`. A data
/// directory that belongs to a cluster (`recorded`) first checks that the managers serve that
/// one, so that a wrong `--manager` neither registers there nor installs its configuration.
async fn register(
    pool: &Pool,
    options: &BackendOptions,
    logs_complete: bool,
    recorded: Option<u64>,
) -> anyhow::Result<ClusterConfig> {
    let registration =
        Request::RegisterBackend { node: options.node, addr: options.advertise.clone(), logs_complete };
    let mut checked = recorded.is_none();
    let mut registered = false;
    let mut logged = false;
    loop {
        // Registered once: wait for the ranges to form by fetching the configuration. A
        // registration repeated once they formed would be taken for a new process, which
        // the manager fails and re-adds to resync.
        let request = if checked && !registered { registration.clone() } else { Request::GetConfig };
        match crate::manager::client::call(pool, &options.manager, request, Duration::from_secs(5)).await {
            Ok(Response::Config(c)) => {
                fence::check(recorded, c.cluster_id)
                    .map_err(|e| anyhow::anyhow!("node {}: {e}", options.node))?;
                if !checked {
                    checked = true;
                    continue;
                }
                registered = true;
                if c.formed {
                    return Ok(c);
                }
            }
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
        let Some(config) = b.renew().await else { continue };
        let me = config.backends.iter().find(|x| x.node == b.options.node).map(|x| x.state);
        if me == Some(NodeState::Failed) {
            warn!("the manager declared this back-end failed; registering again to rejoin");
            // The process kept running: its datastores hold what it acknowledged.
            match register(&b.pool, &b.options, true, Some(b.cluster).filter(|c| *c != 0)).await {
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
