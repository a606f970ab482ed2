//! The front-end between the clients and the chains (`Config::frontend_cache`): one front-end
//! serving every key, with the real query cache of `fawn_kv::frontend::cache` on the
//! simulated clock. As the real front-end: an update holds its key's slot from its first
//! attempt until its outcome is known or it is given up (unsettled); a get answers from the
//! cache or reads the tail and fills with the generation it saw before the read; a `Committed`
//! for an update no longer waited for invalidates the key.
//!
//! An update's outcome is the tail's `Committed` notice: the update goes to the head with the
//! front-end's `reply_to`, and a head that forwards it so does not answer it (the back-end's
//! `Ordered::Notified`; `World::on_request`). The head still answers what it decides in the
//! same step (a refusal, a remembered outcome, a failed condition). A notice can be lost (a
//! cut connection, an update resent from a log without `reply_to`): after the client's
//! time-out without one (the front-end's `COMMIT_NOTICE_WAIT_MAX`) the update is sent again
//! without `reply_to`, and the head answers that attempt (`World::on_timeout`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fawn_kv::frontend::cache::{CacheTiming, QueryCache};
use fawn_proto::native::ReqId;
use fawn_proto::op::{Item, Outcome};

use super::{Answer, Ev, Micros, World};

/// Items the simulated front-end may cache (far more than the simulator's keys: no eviction).
const CACHE_ENTRIES_MAX: usize = 1024;
const CACHE_BYTES_MAX: usize = 1 << 20;
/// The address the tails send `Committed` to.
pub(super) const FRONTEND_ADDR: &str = "frontend";

pub(super) struct Frontend {
    cache: QueryCache,
    /// Simulated now, read by the cache's clock.
    now: Arc<AtomicU64>,
    /// Updates in flight by request, with their keys.
    updates: HashMap<ReqId, Vec<u8>>,
    /// Gets reading the tail, by (client, history index): the generation seen before.
    gets: HashMap<(u32, usize), u64>,
    pub(super) hits: usize,
}

impl Frontend {
    pub(super) fn new(#[allow(unused_variables)] cfg: &crate::Config) -> Frontend {
        let now = Arc::new(AtomicU64::new(0));
        let read = now.clone();
        let clock = Arc::new(move || Duration::from_micros(read.load(Ordering::Relaxed)));
        let cache = QueryCache::simulated(CACHE_ENTRIES_MAX, CACHE_BYTES_MAX, CacheTiming::default(), clock);
        #[cfg(feature = "faults")]
        let cache = cache.with_fault(cfg.cache_fault);
        Frontend { cache, now, updates: HashMap::new(), gets: HashMap::new(), hits: 0 }
    }

    pub(super) fn set_now(&self, now: Micros) {
        self.now.store(now, Ordering::Relaxed);
    }
}

impl World {
    /// An update leaves the front-end for its first attempt.
    pub(super) fn frontend_update_starts(&mut self, req: ReqId, key: &[u8]) {
        if let Some(fe) = &mut self.frontend {
            fe.cache.start_update(key);
            fe.updates.insert(req, key.to_vec());
        }
    }

    /// A get arrives at the front-end: its answer if the cache has the key (no read of the
    /// tail), else the generation is noted for the fill.
    pub(super) fn frontend_get(&mut self, client: u32, index: usize, key: &[u8]) -> Option<Item> {
        let fe = self.frontend.as_mut()?;
        if let Some(item) = fe.cache.get(key) {
            fe.hits += 1;
            return Some(item);
        }
        fe.gets.insert((client, index), fe.cache.generation(key));
        None
    }

    /// The tail answered a get the cache did not.
    pub(super) fn frontend_read(&mut self, client: u32, index: usize, key: &[u8], item: &Option<Item>) {
        let Some(fe) = &mut self.frontend else { return };
        let Some(generation) = fe.gets.remove(&(client, index)) else { return };
        match item {
            Some(item) => fe.cache.fill(key, item.clone(), generation),
            None => fe.cache.invalidate(key),
        }
    }

    /// An operation ended at the front-end: an update with its outcome known, or given up
    /// (`unsettled`: it may still commit).
    pub(super) fn frontend_op_ends(
        &mut self,
        client: u32,
        index: usize,
        req: Option<ReqId>,
        unsettled: bool,
    ) {
        let Some(fe) = &mut self.frontend else { return };
        fe.gets.remove(&(client, index));
        if let Some(key) = req.and_then(|r| fe.updates.remove(&r)) {
            fe.cache.end_update(&key, unsettled);
        }
    }

    /// A tail's `Committed` arrives: the answer of an update still waited for, or a commit the
    /// front-end had given up on.
    pub(super) fn frontend_committed(&mut self, req: ReqId, outcome: Outcome, key: Vec<u8>) {
        let Some(fe) = &mut self.frontend else { return };
        if fe.updates.contains_key(&req) {
            self.on_answer(req.client as u32, req.seq, Answer::Update(Ok(outcome)), None);
        } else {
            fe.cache.invalidate(&key);
        }
    }

    /// Delivers a tail's `Committed` to the front-end after a network delay.
    pub(super) fn send_committed(&mut self, req: ReqId, outcome: Outcome, key: Vec<u8>) {
        if self.frontend.is_some() {
            let d = self.delay();
            self.at(d, Ev::Committed { req, outcome, key });
        }
    }
}
