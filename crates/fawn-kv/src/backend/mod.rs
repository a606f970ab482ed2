//! The back-end: hosts one datastore per range it replicates and plays head, middle or tail
//! of each range's chain (paper §3.4.3).

mod link;
mod range;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_ds::{DataStore, Options as DsOptions, SyncPolicy};
use fawn_proto::native::{
    ChainMsg, ClusterConfig, DigestEntry, Epoch, NodeStatus, ReqId, Request, Response, WireError,
    DIGEST_PAGE_ENTRIES_MAX,
};
use fawn_proto::op::Update;
use fawn_ring::{key_id, Chain, NodeId, Range};
use parking_lot::RwLock;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::metrics::{self, Exposition, Histogram};
use crate::server::{self, Handler};
use crate::view::{fetch_config, View};
use fawn_client::pool::Pool;
use link::{LinkOwner, Links};
use range::{Applied, Ordered, RangeReplica};

/// How often a back-end polls the manager for a newer configuration.
pub const CONFIG_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Least time between two resend requests for one range.
const RESEND_REQUEST_INTERVAL: Duration = Duration::from_millis(500);

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
    /// How long the head waits for the tail's ack before answering "timeout".
    pub chain_timeout: Duration,
}

#[derive(Default)]
struct Counters {
    gets: AtomicU64,
    updates: AtomicU64,
    replicated: AtomicU64,
    acks: AtomicU64,
    stale_epoch: AtomicU64,
    resend_requests: AtomicU64,
    get_latency: Histogram,
    update_latency: Histogram,
}

/// A running back-end.
pub struct Backend {
    options: BackendOptions,
    view: RwLock<Arc<View>>,
    replicas: RwLock<HashMap<Range, Arc<RangeReplica>>>,
    links: Links,
    pool: Pool,
    started: Instant,
    counters: Counters,
    last_resend: parking_lot::Mutex<HashMap<Range, Instant>>,
}

impl Backend {
    /// Registers with the manager, waits for the ring to form, opens this node's datastores.
    pub async fn start(options: BackendOptions) -> anyhow::Result<Arc<Backend>> {
        let pool = Pool::new(Duration::from_secs(2));
        let config = register(&pool, &options).await?;
        let view = Arc::new(View::new(config));
        let backend = Arc::new(Backend {
            options,
            view: RwLock::new(view.clone()),
            replicas: RwLock::new(HashMap::new()),
            links: Links::default(),
            pool,
            started: Instant::now(),
            counters: Counters::default(),
            last_resend: parking_lot::Mutex::new(HashMap::new()),
        });
        backend.open_ranges(&view)?;
        tokio::spawn(poll_config(Arc::downgrade(&backend)));
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

    fn open_ranges(&self, view: &View) -> anyhow::Result<()> {
        let me = self.options.node;
        for (range, _) in view.ring.ranges_of_node(me) {
            if self.replicas.read().contains_key(&range) {
                continue;
            }
            let dir = self.options.data_dir.join("ranges").join(range.id_string());
            let options = DsOptions { sync: self.options.sync, ..DsOptions::default() };
            let store = DataStore::open(&dir, options)
                .map_err(|e| anyhow::anyhow!("opening datastore {}: {e}", dir.display()))?;
            let report = store.recovery_report();
            info!(range = %range.id_string(), records = report.records_replayed,
                truncated_bytes = report.truncated_bytes, "datastore open");
            self.replicas.write().insert(range, Arc::new(RangeReplica::new(range, store)));
        }
        Ok(())
    }

    fn current(&self) -> Arc<View> {
        self.view.read().clone()
    }

    fn install(&self, config: ClusterConfig) {
        if config.epoch <= self.current().config.epoch {
            return;
        }
        let view = Arc::new(View::new(config));
        if let Err(e) = self.open_ranges(&view) {
            error!(error = %e, "cannot open datastores of the new configuration");
            return;
        }
        info!(epoch = view.config.epoch, "configuration installed");
        *self.view.write() = view;
    }

    /// The view matching a request's epoch, refreshing from the manager if the request is newer.
    async fn view_for(&self, epoch: Epoch) -> Result<Arc<View>, WireError> {
        let view = self.current();
        if epoch > view.config.epoch {
            if let Ok(config) = fetch_config(&self.pool, &self.options.manager).await {
                self.install(config);
            }
        }
        let view = self.current();
        if epoch != view.config.epoch {
            self.counters.stale_epoch.fetch_add(1, Ordering::Relaxed);
            return Err(WireError::StaleEpoch { current: view.config.epoch });
        }
        Ok(view)
    }

    fn replica(&self, range: &Range) -> Option<Arc<RangeReplica>> {
        self.replicas.read().get(range).cloned()
    }

    fn my_chain(&self, view: &View, key: &[u8]) -> Result<(Chain, Arc<RangeReplica>), WireError> {
        let chain = view
            .ring
            .try_chain(key_id(key))
            .ok_or_else(|| WireError::Unavailable("the ring has no back-ends".into()))?;
        let replica = self.replica(&chain.range).ok_or_else(|| {
            WireError::WrongNode(format!("node {} holds no replica of this key", self.options.node))
        })?;
        Ok((chain, replica))
    }

    async fn get(&self, epoch: Epoch, key: &[u8]) -> Result<Response, WireError> {
        let view = self.view_for(epoch).await?;
        let (chain, replica) = self.my_chain(&view, key)?;
        if !chain.is_tail(self.options.node) {
            return Err(WireError::WrongNode(format!("node {} is not the tail", self.options.node)));
        }
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        Ok(Response::Get(replica.read(key, view.config.flush_at_unix)?))
    }

    async fn update(
        self: &Arc<Self>,
        epoch: Epoch,
        req: ReqId,
        update: Update,
    ) -> Result<Response, WireError> {
        let view = self.view_for(epoch).await?;
        let (chain, replica) = self.my_chain(&view, &update.key)?;
        let me = self.options.node;
        if !chain.is_head(me) {
            return Err(WireError::WrongNode(format!("node {me} is not the head")));
        }
        self.counters.updates.fetch_add(1, Ordering::Relaxed);
        let link = chain.successor(me).map(|s| self.links.to(self, s));
        let ordered = replica
            .order_update(view.config.epoch, req, &update, view.config.flush_at_unix, link.as_ref())
            .await?;
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
        for (range, chain) in view.ring.ranges_of_node(me) {
            if let (true, Some(r)) = (chain.is_tail(me), self.replica(&range)) {
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
            if after_key.as_ref().is_some_and(|a| record.key <= *a) {
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
            ("acks".to_string(), c.acks.load(Ordering::Relaxed)),
            ("stale_epoch".to_string(), c.stale_epoch.load(Ordering::Relaxed)),
            ("resend_requests".to_string(), c.resend_requests.load(Ordering::Relaxed)),
            ("ranges".to_string(), replicas.len() as u64),
        ];
        let (mut keys, mut log_bytes) = (0, 0);
        for r in replicas.values() {
            let s = r.store.stats();
            keys += s.live_keys;
            log_bytes += s.log_bytes;
        }
        counters.push(("live_keys".into(), keys));
        counters.push(("log_bytes".into(), log_bytes));
        Response::Status(NodeStatus {
            role: format!("backend {}", self.options.node),
            epoch: self.current().config.epoch,
            uptime_secs: self.started.elapsed().as_secs(),
            counters,
        })
    }

    async fn on_replicate(self: &Arc<Self>, msg: ChainMsg) {
        let ChainMsg::Replicate { epoch, range, seq, prev_seq, ref key, ref effect } = msg else { return };
        let (Some(replica), Some(chain)) = (self.replica(&range), self.current().chain_of(&range)) else {
            warn!(range = %range.id_string(), "replicated update for a range not held here");
            return;
        };
        let me = self.options.node;
        let Some(pred) = chain.predecessor(me) else { return };
        match replica.apply_replicate(seq, prev_seq, key, effect).await {
            Applied::Stored => {
                self.counters.replicated.fetch_add(1, Ordering::Relaxed);
                match chain.successor(me) {
                    None => {
                        replica.on_ack(seq);
                        let _ = self.links.to(self, pred).send(ChainMsg::Ack { epoch, range, seq }).await;
                    }
                    Some(succ) => {
                        replica.remember_forwarded(seq, msg.clone());
                        let _ = self.links.to(self, succ).send(msg).await;
                    }
                }
            }
            Applied::Duplicate { have } => {
                if chain.is_tail(me) {
                    let _ = self.links.to(self, pred).send(ChainMsg::Ack { epoch, range, seq: have }).await;
                }
            }
            Applied::Gap { have } => self.request_resend(range, epoch, have, pred).await,
            Applied::Failed(e) => {
                error!(range = %range.id_string(), error = %e, "cannot apply replicated update")
            }
        }
    }

    async fn request_resend(self: &Arc<Self>, range: Range, epoch: Epoch, have: u64, pred: NodeId) {
        {
            let mut last = self.last_resend.lock();
            let now = Instant::now();
            if last.get(&range).is_some_and(|t| now.duration_since(*t) < RESEND_REQUEST_INTERVAL) {
                return;
            }
            last.insert(range, now);
        }
        self.counters.resend_requests.fetch_add(1, Ordering::Relaxed);
        warn!(range = %range.id_string(), after = have, "gap in replicated updates; asking for a resend");
        let _ = self.links.to(self, pred).send(ChainMsg::Resend { epoch, range, after_seq: have }).await;
    }

    async fn on_ack(self: &Arc<Self>, epoch: Epoch, range: Range, seq: u64) {
        let (Some(replica), Some(chain)) = (self.replica(&range), self.current().chain_of(&range)) else {
            return;
        };
        self.counters.acks.fetch_add(1, Ordering::Relaxed);
        replica.on_ack(seq);
        if let Some(pred) = chain.predecessor(self.options.node) {
            let _ = self.links.to(self, pred).send(ChainMsg::Ack { epoch, range, seq }).await;
        }
    }

    async fn on_resend(self: &Arc<Self>, epoch: Epoch, range: Range, after_seq: u64) {
        let (Some(replica), Some(chain)) = (self.replica(&range), self.current().chain_of(&range)) else {
            return;
        };
        let Some(succ) = chain.successor(self.options.node) else { return };
        match replica.updates_after(epoch, after_seq) {
            Ok(msgs) => {
                info!(range = %range.id_string(), after_seq, count = msgs.len(), "resending updates");
                let link = self.links.to(self, succ);
                for m in msgs {
                    let _ = link.send(m).await;
                }
            }
            Err(e) => error!(error = %e, "cannot read updates to resend"),
        }
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
            ("fawn_backend_resend_requests_total", &c.resend_requests),
        ] {
            metrics::line(&mut out, name, &node, v.load(Ordering::Relaxed));
        }
        c.get_latency.render(&mut out, "fawn_backend_get_seconds", &node);
        c.update_latency.render(&mut out, "fawn_backend_update_seconds", &node);
        metrics::line(&mut out, "fawn_backend_chain_queue_depth", &node, self.links.queued());
        for r in self.replicas.read().values() {
            let s = r.store.stats();
            let labels = format!("{node}range=\"{}\",", r.range.id_string());
            metrics::line(&mut out, "fawn_datastore_live_keys", &labels, s.live_keys);
            metrics::line(&mut out, "fawn_datastore_log_bytes", &labels, s.log_bytes);
            metrics::line(&mut out, "fawn_datastore_index_bytes", &labels, s.index_bytes);
            metrics::line(&mut out, "fawn_datastore_unacked_updates", &labels, r.unacked_len() as u64);
        }
        out
    }
}

impl LinkOwner for Backend {
    fn peer_addr(&self, peer: NodeId) -> Option<String> {
        self.current().config.backends.iter().find(|b| b.node == peer).map(|b| b.addr.clone())
    }

    fn node_id(&self) -> NodeId {
        self.options.node
    }

    fn on_connected(&self, peer: NodeId) -> Vec<ChainMsg> {
        let view = self.current();
        let me = self.options.node;
        let mut out = Vec::new();
        for (range, chain) in view.ring.ranges_of_node(me) {
            let Some(replica) = self.replica(&range) else { continue };
            if chain.successor(me) == Some(peer) {
                out.extend(replica.unacked());
            }
            if chain.predecessor(me) == Some(peer) {
                let seq = if chain.is_tail(me) { replica.store.max_seq() } else { replica.acked() };
                out.push(ChainMsg::Ack { epoch: view.config.epoch, range, seq });
            }
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
            Request::Update { epoch, req, update, .. } => {
                let start = Instant::now();
                let r = self.update(epoch, req, update).await;
                self.counters.update_latency.record(start.elapsed());
                r
            }
            Request::ItemStats => Ok(self.item_stats()),
            Request::RangeDigest { range, after_key, limit } => self.digest(range, after_key, limit),
            Request::Status => Ok(self.status()),
            Request::Ping => Ok(Response::Pong),
            Request::GetConfig => Ok(Response::Config(self.current().config.clone())),
            other => Err(WireError::Invalid(format!("a back-end does not serve {other:?}"))),
        };
        result.unwrap_or_else(Response::Error)
    }

    async fn chain(self: Arc<Self>, msg: ChainMsg) {
        match msg {
            ChainMsg::Hello { .. } => {}
            m @ ChainMsg::Replicate { .. } => self.on_replicate(m).await,
            ChainMsg::Ack { epoch, range, seq } => self.on_ack(epoch, range, seq).await,
            ChainMsg::Resend { epoch, range, after_seq } => self.on_resend(epoch, range, after_seq).await,
        }
    }
}

/// Registers with the manager until it answers, then waits until the ring is formed.
async fn register(pool: &Pool, options: &BackendOptions) -> anyhow::Result<ClusterConfig> {
    let request = Request::RegisterBackend { node: options.node, addr: options.advertise.clone() };
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

async fn poll_config(backend: std::sync::Weak<Backend>) {
    loop {
        tokio::time::sleep(CONFIG_POLL_INTERVAL).await;
        let Some(b) = backend.upgrade() else { return };
        if let Ok(config) = fetch_config(&b.pool, &b.options.manager).await {
            b.install(config);
        }
    }
}

impl View {
    /// The chain of one of the ring's ranges.
    pub fn chain_of(&self, range: &Range) -> Option<Chain> {
        self.chains.get(range).cloned()
    }
}
