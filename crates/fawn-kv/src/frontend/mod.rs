//! The front-end: owns a wedge of the key space, routes gets to tails and updates to heads,
//! forwards requests outside its wedge to the owning front-end, and keeps a coherent query
//! cache (paper §3.4.1–3.4.2). It implements [`KvService`] for the memcached server.

pub mod cache;
mod floor;
mod heartbeat;
mod ownership;
mod refusal;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_client::pool::Pool;
use fawn_client::retry::{Attempt, Next, Retry, RetryPolicy};
use fawn_proto::native::{
    ClusterConfig, CommittedNotice, Epoch, NodeStatus, ReqId, Request, Response, WireError,
};
use fawn_proto::op::{is_expired, Item, Outcome, Update};
use fawn_ring::key_id;
use parking_lot::RwLock;
use tokio::sync::{oneshot, watch};
use tracing::{debug, info, warn};

use crate::clock::{flushed, unix_now};
use crate::metrics::{self, Exposition, Histogram};
use crate::server::{self, Handler};
use crate::service::{ItemStats, KvService, ServiceError};
use crate::view::{fetch_config, View};
use cache::{CacheTiming, QueryCache};
use ownership::Ownership;

/// How often a front-end polls the manager for a newer configuration.
pub const CONFIG_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Retries of a request to a back-end or a peer front-end before answering "unavailable": short,
/// since a memcached client waits behind it on its connection and has its own timeout.
pub const ROUTE_RETRY: RetryPolicy = RetryPolicy {
    attempts_max: 6,
    backoff_start: Duration::from_millis(25),
    backoff_max: Duration::from_secs(1),
};
/// Longest wait for the tail's `Committed` notice of an update (at most half the request
/// timeout) before asking the head for its outcome instead: the head does not answer an
/// update it forwarded with our `reply_to`, and a notice can be lost (a dropped connection, or
/// a chain repair that resent the update from a log, which keeps no `reply_to`).
pub const COMMIT_NOTICE_WAIT_MAX: Duration = Duration::from_secs(1);

/// Front-end settings.
#[derive(Clone, Debug)]
pub struct FrontendOptions {
    /// Front-end id = the index of its own wedge; ids are 0..F. It serves other wedges too
    /// while their front-ends are declared dead (`ClusterConfig::wedges`).
    pub id: u32,
    /// Native addresses of the manager group, comma-separated (`manager::client`).
    pub manager: String,
    /// Native address other processes use to reach this front-end.
    pub native_advertise: String,
    /// memcached address clients use.
    pub memcache_advertise: String,
    /// Query cache capacity in items (0 disables it).
    pub cache_entries: usize,
    /// Query cache capacity in bytes (0 disables it; see `cache::ENTRY_OVERHEAD_BYTES`).
    pub cache_bytes: usize,
    /// The query cache's holds after an update of unknown outcome and after start-up.
    pub cache_timing: CacheTiming,
    /// Fault injection for tests (zero in production): an update's outcome is acted on this
    /// much later, widening the window in which the tail has committed an update that this
    /// front-end does not know of yet (its cache must stay coherent through it).
    pub fault_outcome_delay: Duration,
    /// Fault injection for tests (0 in production): every this many `Committed` notices
    /// received, one is dropped, as if lost with its connection, so the update's waiter must
    /// fall back to asking the head (`COMMIT_NOTICE_WAIT_MAX`).
    pub fault_drop_notice_every: u64,
    /// Time-out of one request to a back-end.
    pub request_timeout: Duration,
    /// Interval between this front-end's heartbeats to each back-end (t_hb); each round is
    /// reported to the manager, which declares failures.
    pub heartbeat: Duration,
}

#[derive(Default)]
struct Counters {
    gets: AtomicU64,
    cache_hits: AtomicU64,
    updates: AtomicU64,
    forwarded: AtomicU64,
    retries: AtomicU64,
    /// Updates whose tail's notice did not come in time: asked of the head again.
    notice_timeouts: AtomicU64,
    /// `Committed` notices received.
    committed_notices: AtomicU64,
    /// Leases from the manager group older in term or epoch than the one held: ignored.
    stale_leases: AtomicU64,
    get_latency: Histogram,
    update_latency: Histogram,
}

/// A running front-end.
pub struct Frontend {
    options: FrontendOptions,
    view: RwLock<Arc<View>>,
    pool: Pool,
    cache: QueryCache,
    /// Which wedges it serves, its lease, and when the cache may be used for them.
    ownership: Ownership,
    client_id: u64,
    /// Hands out this front-end's request seqs and knows its floor (`ReqId`).
    floor: floor::ReqFloor,
    started: Instant,
    counters: Counters,
    /// Updates waiting for the tail's `Committed` notice, by request id.
    committed: CommitWaiters,
    /// Serializes configuration fetches, so that a burst of requests refused for a stale epoch
    /// costs the manager one fetch, not one per request.
    refresh_lock: tokio::sync::Mutex<()>,
    /// When this front-end last reported a peer refusing connections (`refusal`).
    refusal_reported: parking_lot::Mutex<Option<Instant>>,
}

impl Frontend {
    /// Registers with the manager and waits until the ring is formed.
    pub async fn start(options: FrontendOptions) -> anyhow::Result<Arc<Frontend>> {
        // A round is the wait, the pings (each up to the interval) and the report: three of
        // them must fit in the lease they renew.
        anyhow::ensure!(
            options.heartbeat * 3 <= crate::manager::FRONTEND_LEASE,
            "--heartbeat-ms {} is too long: a front-end's heartbeat reports renew its {} ms lease (at most {} ms)",
            options.heartbeat.as_millis(),
            crate::manager::FRONTEND_LEASE.as_millis(),
            (crate::manager::FRONTEND_LEASE / 3).as_millis()
        );
        let pool = Pool::new(Duration::from_secs(2));
        let (config, registered) = register(&pool, &options).await?;
        let frontend = Arc::new(Frontend {
            cache: QueryCache::new(options.cache_entries, options.cache_bytes, options.cache_timing),
            ownership: Ownership::new(options.id, options.cache_timing.unsettled_hold, registered),
            options,
            view: RwLock::new(Arc::new(View::new(config))),
            pool,
            client_id: rand::random(),
            floor: floor::ReqFloor::default(),
            started: Instant::now(),
            counters: Counters::default(),
            committed: CommitWaiters::default(),
            refresh_lock: tokio::sync::Mutex::new(()),
            refusal_reported: parking_lot::Mutex::new(None),
        });
        tokio::spawn(poll_config(Arc::downgrade(&frontend)));
        let heartbeat = frontend.options.heartbeat;
        tokio::spawn(heartbeat::heartbeat_backends(Arc::downgrade(&frontend), heartbeat));
        Ok(frontend)
    }

    /// Serves the native protocol until shutdown.
    pub async fn serve_native(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        shutdown: watch::Receiver<bool>,
    ) {
        server::serve(listener, self, shutdown).await
    }

    /// The configuration this front-end routes by.
    pub fn config(&self) -> ClusterConfig {
        self.current().config.clone()
    }

    fn current(&self) -> Arc<View> {
        self.view.read().clone()
    }

    fn install(&self, config: ClusterConfig) {
        // Checked and replaced under the lock: a push and a poll installing at once must not
        // leave the older of the two.
        let mut view = self.view.write();
        let old = &view.config;
        if config.epoch <= old.epoch {
            return;
        }
        if config.flush_at_micros != old.flush_at_micros || config.backends != old.backends {
            self.cache.clear();
        }
        self.ownership.moving(old, &config, &self.cache);
        info!(epoch = config.epoch, "configuration installed");
        self.pool.retain_members(&config, &crate::manager::client::parse_list(&self.options.manager));
        *view = Arc::new(View::new(config));
    }

    async fn refresh(&self) {
        match fetch_config(&self.pool, &self.options.manager).await {
            Ok(config) => self.install(config),
            Err(e) => warn!(error = %e, "cannot fetch configuration from the manager"),
        }
    }

    /// Fetches the configuration unless this front-end already moved past `seen` (the epoch it
    /// routed a refused request by) while waiting for another request's fetch.
    async fn refresh_after(&self, seen: Epoch) {
        let _one_at_a_time = self.refresh_lock.lock().await;
        if self.current().config.epoch > seen {
            return;
        }
        self.refresh().await;
    }

    /// Whether another registered front-end serves `key`'s wedge (a key of a wedge whose
    /// front-end never registered is routed here).
    fn served_elsewhere(&self, view: &View, key: &[u8]) -> bool {
        !self.ownership.serves(&view.config, view.config.wedge_of(key_id(key)))
            && server_addr(view, key).is_some()
    }

    /// A request another front-end forwarded here must be for a wedge this one serves: the
    /// updates of a key pass one front-end. If not, the sender or this front-end routes by an
    /// old configuration; the refusal makes the sender fetch the newest and route again.
    async fn check_forwarded(&self, forwarded: bool, epoch: Epoch, key: &[u8]) -> Result<(), WireError> {
        if !forwarded {
            return Ok(());
        }
        let wedge = |v: &View| v.config.wedge_of(key_id(key));
        let mut view = self.current();
        if !self.ownership.serves(&view.config, wedge(&view)) && view.config.epoch <= epoch {
            self.refresh_after(view.config.epoch).await;
            view = self.current();
        }
        if self.ownership.serves(&view.config, wedge(&view)) {
            return Ok(());
        }
        if view.config.epoch > epoch {
            return Err(WireError::StaleEpoch { current: view.config.epoch });
        }
        Err(WireError::WrongNode(format!(
            "front-end {} does not serve wedge {}",
            self.options.id,
            wedge(&view)
        )))
    }

    /// Reads `key` as the cluster's linearizable view (cache, or the chain's tail).
    pub async fn route_get(&self, key: &[u8], forwarded: bool) -> Result<Option<Item>, WireError> {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        if !forwarded && self.served_elsewhere(&self.current(), key) {
            self.counters.forwarded.fetch_add(1, Ordering::Relaxed);
            let make = |epoch| Request::Get { epoch, key: key.to_vec(), forwarded: true };
            return match self.call_with_retries(|v| server_addr(v, key), make).await? {
                Response::Get(item) => Ok(item),
                other => Err(unexpected(other)),
            };
        }
        let now = unix_now();
        let wedge = |v: &View| v.config.wedge_of(key_id(key));
        let view = self.current();
        if !self.ownership.caches(&view.config, wedge(&view)) {
            return self.read_tail(key, now).await;
        }
        if let Some(item) = self.cache.get(key) {
            if self.visible(&item, now) {
                self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(item));
            }
            self.cache.invalidate(key);
            return Ok(None);
        }
        let generation = self.cache.generation(key);
        let item = self.read_tail(key, now).await?;
        let view = self.current();
        match &item {
            Some(item) if self.ownership.fills(&view.config, wedge(&view)) => {
                self.cache.fill(key, item.clone(), generation)
            }
            Some(_) => {}
            // The key is absent now: no read that started earlier may cache a value.
            None => self.cache.invalidate(key),
        }
        Ok(item)
    }

    /// Reads `key` at its chain's tail, as visible at `now` (unix seconds).
    async fn read_tail(&self, key: &[u8], now: u32) -> Result<Option<Item>, WireError> {
        let id = key_id(key);
        let tail =
            |v: &View| v.config.range_of(id).and_then(|rc| v.backend_addr(rc.tail()?).map(str::to_string));
        let make = |epoch| Request::Get { epoch, key: key.to_vec(), forwarded: true };
        match self.call_with_retries(tail, make).await? {
            // The tail filters too; this covers a tail that has not yet installed the
            // configuration with the latest flush_all.
            Response::Get(item) => Ok(item.filter(|i| self.visible(i, now))),
            other => Err(unexpected(other)),
        }
    }

    /// Applies an update at the head of the key's chain (or via the owning front-end).
    /// `live`: the request is this front-end's own (`floor`), not one it routes for another
    /// client; it counts in the floor until this returns.
    pub async fn route_update(
        &self,
        req: ReqId,
        update: Update,
        forwarded: bool,
        live: Option<floor::Live<'_>>,
    ) -> Result<Outcome, WireError> {
        self.counters.updates.fetch_add(1, Ordering::Relaxed);
        if !forwarded && self.served_elsewhere(&self.current(), &update.key) {
            self.counters.forwarded.fetch_add(1, Ordering::Relaxed);
            let key = update.key.clone();
            let make = |epoch| Request::Update {
                epoch,
                req,
                update: update.clone(),
                forwarded: true,
                reply_to: None,
                // The owning front-end does not know this one's floor.
                floor: 0,
            };
            return match self.call_with_retries(|v| server_addr(v, &key), make).await? {
                Response::Update(outcome) => Ok(outcome),
                other => Err(unexpected(other)),
            };
        }
        let key = update.key.clone();
        // Held until the outcome is known: no get fills the key's cache slot meanwhile.
        let guard = self.cache.begin_update(&key);
        let id = key_id(&key);
        // Only under the lease: once it lapses the wedge may be lent to another front-end, which
        // would not know of this update (`ownership`).
        let head = |v: &View| {
            if !self.ownership.leased() {
                return None;
            }
            v.config.range_of(id).and_then(|rc| v.backend_addr(rc.head()?).map(str::to_string))
        };
        // The tail tells us `Committed` as soon as it stores the update (paper §3.4.3); the
        // head answers only a failure. Removed when this request ends, also if its future is
        // dropped mid-flight.
        let (waiting, committed) = self.committed.wait(req);
        let notice = async {
            match committed.await {
                Ok(outcome) => outcome,
                // Replaced by another wait for the same request: that one gets the notice.
                Err(_) => std::future::pending().await,
            }
        };
        tokio::pin!(notice);
        let reply_to = Some(self.options.native_advertise.clone());
        // Another client's request carries no floor: only that client knows its own.
        let floor = || if live.is_some() { self.floor.floor() } else { 0 };
        let with_reply_to = |reply_to: Option<String>| {
            let (update, floor) = (&update, &floor);
            move |epoch| Request::Update {
                epoch,
                req,
                update: update.clone(),
                forwarded: true,
                reply_to: reply_to.clone(),
                floor: floor(),
            }
        };
        let outcome = |r: Result<Response, WireError>| {
            r.and_then(|resp| match resp {
                Response::Update(outcome) => Ok(outcome),
                other => Err(unexpected(other)),
            })
        };
        let notice_wait = COMMIT_NOTICE_WAIT_MAX.min(self.options.request_timeout / 2);
        // Each select polls its branches in this order (`biased`: no random draw per
        // update); either answer is the update's outcome.
        let result = tokio::select! {
            biased;
            o = &mut notice => Ok(o),
            r = self.call_with_retries(&head, with_reply_to(reply_to)) => outcome(r),
            () = tokio::time::sleep(notice_wait) => {
                self.counters.notice_timeouts.fetch_add(1, Ordering::Relaxed);
                tokio::select! {
                    biased;
                    o = &mut notice => Ok(o),
                    // The head answers a retry once the update is committed, without applying
                    // it again (its outcome is remembered with the request id).
                    r = self.call_with_retries(&head, with_reply_to(None)) => outcome(r),
                }
            }
        };
        drop(waiting);
        drop(live);
        if !self.options.fault_outcome_delay.is_zero() {
            tokio::time::sleep(self.options.fault_outcome_delay).await;
        }
        // Releasing the guard invalidates; the written value is never installed: concurrent
        // updates of one key can finish here in a different order than the head applied
        // them, and a delete's outcome carries no sequence number to order it by. The next
        // get refills the cache from the tail. Any error may hide an earlier attempt that
        // reached the head and commits later.
        match &result {
            Ok(_) => guard.settled(),
            Err(_) => guard.unsettled(),
        }
        result
    }

    fn visible(&self, item: &Item, now: u32) -> bool {
        !is_expired(item.expiry, now) && !flushed(item.cas, self.current().config.flush_at_micros)
    }

    /// Sends a request to the address `target` picks from the current view, retrying by
    /// [`ROUTE_RETRY`] with a configuration refresh before each retry.
    async fn call_with_retries(
        &self,
        target: impl Fn(&View) -> Option<String>,
        make: impl Fn(u64) -> Request,
    ) -> Result<Response, WireError> {
        let mut retry = Retry::new(ROUTE_RETRY);
        loop {
            let view = self.current();
            let routed_by = view.config.epoch;
            let result = match target(&view) {
                Some(addr) => {
                    match self.pool.call(&addr, make(routed_by), self.options.request_timeout).await {
                        Ok(resp) => Ok(resp),
                        Err(e) => {
                            self.peer_unreachable(&view, &addr, &e).await;
                            Err(e.to_string())
                        }
                    }
                }
                None => Err("no route".to_owned()),
            };
            let next = match &result {
                Ok(Response::Error(e)) => retry.after(Attempt::Refused(e), routed_by),
                Ok(_) => retry.after(Attempt::Answered, routed_by),
                Err(_) => retry.after(Attempt::Unreachable, routed_by),
            };
            if next == Next::Stop {
                return match result {
                    Ok(Response::Error(e)) => Err(e),
                    Ok(resp) => {
                        if retry.attempts() > 1 {
                            debug!(attempts = retry.attempts(), "answered after retries");
                        }
                        Ok(resp)
                    }
                    Err(reason) => Err(WireError::Unavailable(reason)),
                };
            }
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            if let Next::RetryAfter(wait) = next {
                tokio::time::sleep(wait).await;
            }
            self.refresh_after(routed_by).await;
        }
    }

    async fn cluster_item_stats(&self) -> Result<(u64, u64), WireError> {
        let view = self.current();
        let (mut items, mut bytes) = (0, 0);
        for b in &view.config.backends {
            match self.pool.call(&b.addr, Request::ItemStats, self.options.request_timeout).await {
                Ok(Response::ItemStats { curr_items, bytes: b }) => {
                    items += curr_items;
                    bytes += b;
                }
                Ok(other) => return Err(unexpected(other)),
                Err(e) => return Err(WireError::Unavailable(e.to_string())),
            }
        }
        Ok((items, bytes))
    }

    /// `flush_all`: at `at_unix` (seconds), or right now if that is not in the future.
    async fn flush(&self, at_unix: u32) -> Result<(), WireError> {
        let at_micros =
            if at_unix <= unix_now() { crate::clock::unix_micros() } else { u64::from(at_unix) * 1_000_000 };
        let flush = Request::SetFlush { at_micros };
        match crate::manager::client::call(
            &self.pool,
            &self.options.manager,
            flush,
            self.options.request_timeout,
        )
        .await
        {
            Ok(Response::Config(c)) => self.install(c),
            Ok(Response::Error(e)) => return Err(e),
            Ok(other) => return Err(unexpected(other)),
            Err(e) => return Err(WireError::Unavailable(e.to_string())),
        }
        // Tell the other front-ends now rather than at their next poll.
        for f in self.current().config.frontends.iter().filter(|f| f.id != self.options.id) {
            let _ = self
                .pool
                .call(&f.native_addr, Request::SetFlush { at_micros }, self.options.request_timeout)
                .await;
        }
        Ok(())
    }

    fn status(&self) -> Response {
        let c = &self.counters;
        let counters = vec![
            ("gets".to_string(), c.gets.load(Ordering::Relaxed)),
            ("cache_hits".to_string(), c.cache_hits.load(Ordering::Relaxed)),
            ("updates".to_string(), c.updates.load(Ordering::Relaxed)),
            ("forwarded".to_string(), c.forwarded.load(Ordering::Relaxed)),
            ("retries".to_string(), c.retries.load(Ordering::Relaxed)),
            ("notice_timeouts".to_string(), c.notice_timeouts.load(Ordering::Relaxed)),
            ("committed_notices".to_string(), c.committed_notices.load(Ordering::Relaxed)),
            ("stale_leases".to_string(), c.stale_leases.load(Ordering::Relaxed)),
        ];
        Response::Status(NodeStatus {
            role: format!("frontend {}", self.options.id),
            epoch: self.current().config.epoch,
            uptime_secs: self.started.elapsed().as_secs(),
            counters,
        })
    }
}

/// Updates waiting for the tail's `Committed` notice, by request id.
#[derive(Default)]
struct CommitWaiters(parking_lot::Mutex<std::collections::HashMap<ReqId, oneshot::Sender<Outcome>>>);

impl CommitWaiters {
    /// Registers `req`; the entry goes when the returned guard is dropped.
    fn wait(&self, req: ReqId) -> (CommitWait<'_>, oneshot::Receiver<Outcome>) {
        let (tx, rx) = oneshot::channel();
        self.0.lock().insert(req, tx);
        (CommitWait { waiters: self, req }, rx)
    }

    /// The waiter for `req`, if one is still waiting.
    fn take(&self, req: &ReqId) -> Option<oneshot::Sender<Outcome>> {
        self.0.lock().remove(req)
    }
}

/// Removes its request's entry from [`CommitWaiters`] when dropped.
struct CommitWait<'a> {
    waiters: &'a CommitWaiters,
    req: ReqId,
}

impl Drop for CommitWait<'_> {
    fn drop(&mut self) {
        self.waiters.take(&self.req);
    }
}

/// The native address of the front-end serving `key`'s wedge in `view`.
fn server_addr(view: &View, key: &[u8]) -> Option<String> {
    view.config.frontend_for(key_id(key)).map(|f| f.native_addr.clone())
}

fn unexpected(resp: Response) -> WireError {
    WireError::Invalid(format!("unexpected response {resp:?}"))
}

fn service_error(e: WireError) -> ServiceError {
    match e {
        WireError::TooLarge => ServiceError::TooLarge,
        WireError::Timeout => ServiceError::Timeout,
        WireError::Storage(m) | WireError::Invalid(m) => ServiceError::Backend(m),
        other => ServiceError::Unavailable(other.to_string()),
    }
}

impl Exposition for Frontend {
    fn metrics(&self) -> String {
        let mut out = String::new();
        let labels = format!("frontend=\"{}\",", self.options.id);
        let c = &self.counters;
        for (name, v) in [
            ("fawn_frontend_gets_total", &c.gets),
            ("fawn_frontend_cache_hits_total", &c.cache_hits),
            ("fawn_frontend_updates_total", &c.updates),
            ("fawn_frontend_forwarded_total", &c.forwarded),
            ("fawn_frontend_retries_total", &c.retries),
            ("fawn_frontend_notice_timeouts_total", &c.notice_timeouts),
            ("fawn_frontend_stale_leases_total", &c.stale_leases),
        ] {
            metrics::line(&mut out, name, &labels, v.load(Ordering::Relaxed));
        }
        c.get_latency.render(&mut out, "fawn_frontend_get_seconds", &labels);
        c.update_latency.render(&mut out, "fawn_frontend_update_seconds", &labels);
        metrics::line(&mut out, "fawn_frontend_epoch", &labels, self.current().config.epoch);
        metrics::line(&mut out, "fawn_frontend_cache_bytes", &labels, self.cache.bytes() as u64);
        let wedges = self.ownership.wedges_served(&self.current().config);
        metrics::line(&mut out, "fawn_frontend_wedges_served", &labels, wedges);
        metrics::line(&mut out, "fawn_frontend_lease_lapses_total", &labels, self.ownership.lapses());
        out
    }
}

impl KvService for Frontend {
    async fn get(&self, key: &[u8]) -> Result<Option<Item>, ServiceError> {
        let start = Instant::now();
        let r = self.route_get(key, false).await.map_err(service_error);
        self.counters.get_latency.record(start.elapsed());
        r
    }

    async fn update(&self, update: Update) -> Result<Outcome, ServiceError> {
        let start = Instant::now();
        let live = self.floor.start();
        let req = ReqId { client: self.client_id, seq: live.seq() };
        let r = self.route_update(req, update, false, Some(live)).await.map_err(service_error);
        self.counters.update_latency.record(start.elapsed());
        r
    }

    async fn flush_all(&self, at_unix: u32) -> Result<(), ServiceError> {
        self.flush(at_unix).await.map_err(service_error)
    }

    async fn item_stats(&self) -> Result<ItemStats, ServiceError> {
        let (curr_items, bytes) = self.cluster_item_stats().await.map_err(service_error)?;
        Ok(ItemStats { curr_items, bytes })
    }

    /// Each range is one datastore (stored R times), whose hot and cold logs can each grow
    /// to `DATASTORE_BYTES_MAX`. The disks' own sizes are not known here.
    fn capacity_bytes(&self) -> u64 {
        let ranges = self.current().config.ranges.len() as u64;
        ranges.saturating_mul(2 * fawn_ds::limits::DATASTORE_BYTES_MAX)
    }
}

impl Frontend {
    /// A tail's `Committed` notices: each wakes its update's wait.
    fn take_notices(&self, notices: Vec<CommittedNotice>) {
        for CommittedNotice { req, outcome, key } in notices {
            let seen = self.counters.committed_notices.fetch_add(1, Ordering::Relaxed) + 1;
            let every = self.options.fault_drop_notice_every;
            if every > 0 && seen.is_multiple_of(every) {
                continue;
            }
            match self.committed.take(&req) {
                Some(tx) => {
                    let _ = tx.send(outcome);
                }
                // An update this process stopped waiting for, or sent before it
                // restarted, committed: its key's cached item may be older.
                None => self.cache.invalidate(&key),
            }
        }
    }
}

impl Handler for Frontend {
    fn one_way(&self, request: Request) {
        match request {
            Request::Committed { notices } => self.take_notices(notices),
            other => debug!(request = ?other, "one-way request not taken here; dropped"),
        }
    }

    async fn request(self: Arc<Self>, request: Request) -> Response {
        let result = match request {
            Request::Get { epoch, key, forwarded } => {
                match self.check_forwarded(forwarded, epoch, &key).await {
                    Ok(()) => self.route_get(&key, forwarded).await.map(Response::Get),
                    Err(e) => Err(e),
                }
            }
            Request::Update { epoch, req, update, forwarded, .. } => {
                match self.check_forwarded(forwarded, epoch, &update.key).await {
                    Ok(()) => self.route_update(req, update, forwarded, None).await.map(Response::Update),
                    Err(e) => Err(e),
                }
            }
            Request::GetConfig => Ok(Response::Config(self.config())),
            Request::Committed { notices } => {
                self.take_notices(notices);
                Ok(Response::Ok)
            }
            // A pushed configuration is only a prompt to fetch it from the manager group (see
            // the back-end's handler).
            Request::Install { config } => {
                self.refresh_after(config.epoch.saturating_sub(1)).await;
                Ok(Response::Ok)
            }
            Request::FlushAll { at_unix } => self.flush(at_unix).await.map(|_| Response::Ok),
            Request::SetFlush { .. } => {
                self.refresh().await;
                Ok(Response::Ok)
            }
            Request::ItemStats => self
                .cluster_item_stats()
                .await
                .map(|(curr_items, bytes)| Response::ItemStats { curr_items, bytes }),
            Request::Status => Ok(self.status()),
            Request::Ping => Ok(Response::Pong),
            Request::FrontendRefused { frontend } => self.report_refused(frontend).await,
            other => Err(WireError::Invalid(format!("a front-end does not serve {other:?}"))),
        };
        result.unwrap_or_else(Response::Error)
    }
}

/// Registers with the manager group until the ring is formed; returns the configuration and
/// when the answered registration was sent (the start of the front-end's lease).
async fn register(pool: &Pool, options: &FrontendOptions) -> anyhow::Result<(ClusterConfig, Instant)> {
    let mut logged = false;
    loop {
        let sent = Instant::now();
        match register_once(pool, options).await {
            Ok(Response::Config(c)) if c.formed && c.frontends.len() as u32 == c.frontends_expected => {
                return Ok((c, sent))
            }
            Ok(Response::Config(_)) => {}
            Ok(Response::Error(e)) => anyhow::bail!("the manager refused front-end {}: {e}", options.id),
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

/// One registration: the front-end's addresses, and a claim on its own wedge.
async fn register_once(
    pool: &Pool,
    options: &FrontendOptions,
) -> Result<Response, fawn_client::rpc::RpcError> {
    let request = Request::RegisterFrontend {
        id: options.id,
        native_addr: options.native_advertise.clone(),
        memcache_addr: options.memcache_advertise.clone(),
    };
    crate::manager::client::call(pool, &options.manager, request, Duration::from_secs(5)).await
}

async fn poll_config(frontend: std::sync::Weak<Frontend>) {
    loop {
        tokio::time::sleep(CONFIG_POLL_INTERVAL).await;
        let Some(f) = frontend.upgrade() else { return };
        f.refresh().await;
    }
}
