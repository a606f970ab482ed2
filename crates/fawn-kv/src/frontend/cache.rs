//! The front-end's query cache: bounded, and coherent because every update of a key in this
//! front-end's wedge passes through it.
//!
//! Coherence rule: a cached item must be the key's latest committed value for as long as it
//! is served. Three things guard that:
//!
//! * **Updates in flight.** An update takes an [`UpdateGuard`] before it leaves for the head
//!   and releases it once its outcome is known. While any update of a key's slot is in flight
//!   no read may fill the cache for that slot: the tail may commit the update at any moment,
//!   and the front-end learns it only later. The guard also drops the cached item and moves
//!   the slot's *generation* when it is taken and when it is released.
//! * **Generations.** A get that misses records the generation before asking the tail and
//!   fills only if it did not move: no update started or ended while it read.
//! * **Unsettled updates.** An update whose outcome the front-end never learned (it timed
//!   out, failed ambiguously, or its request was dropped) may still commit later, when a
//!   repaired chain resends it. Its slot takes no fill for [`CacheTiming::unsettled_hold`];
//!   nor does any slot in the first such period after the front-end starts (an earlier
//!   process may have left updates in the chains). A later commit still reaches the cache:
//!   the tail's `Committed` notice names the key, and any notice invalidates it.
//!
//! Together: a fill is accepted only if, during the whole read, no update of the slot that
//! could still commit was known to this front-end.

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_proto::op::Item;
use parking_lot::Mutex;

/// Generation slots (keys hash onto them; a collision only costs a skipped cache fill).
const GENERATION_SLOTS: usize = 4096;
/// Cache shards (each with its own lock and an equal share of the byte budget).
const SHARDS: usize = 16;
/// Default byte budget of the cache: keys, values and [`ENTRY_OVERHEAD_BYTES`] per item.
pub const CACHE_BYTES_DEFAULT: usize = 128 << 20;
/// What an item costs beyond its key and value: the map slot, the item's fields, the key's
/// and value's heap headers (an estimate; it keeps many tiny items from escaping the budget).
pub const ENTRY_OVERHEAD_BYTES: usize = 96;
/// How long an update whose outcome is unknown keeps its slot from being filled. It covers a
/// chain repair: failure detection, the new configuration, the head resending what its
/// successor never acknowledged. A back-end that loses the manager stops serving after its
/// lease, which is shorter.
pub const UNSETTLED_UPDATE_HOLD: Duration = Duration::from_secs(5);

const _: () = assert!(
    UNSETTLED_UPDATE_HOLD.as_millis() > crate::backend::MANAGER_LEASE.as_millis(),
    "an unsettled update must be held longer than a back-end may serve without the manager"
);

/// Timing of the cache's holds (a parameter so tests can shorten them).
#[derive(Clone, Copy, Debug)]
pub struct CacheTiming {
    /// See [`UNSETTLED_UPDATE_HOLD`].
    pub unsettled_hold: Duration,
}

impl Default for CacheTiming {
    fn default() -> Self {
        CacheTiming { unsettled_hold: UNSETTLED_UPDATE_HOLD }
    }
}

/// The cache's source of time, as the time since an origin of its own: the real monotonic
/// clock, or a simulator's (which must not read the real one).
pub type Clock = Arc<dyn Fn() -> Duration + Send + Sync>;

/// Faults that can be switched on to show the simulator finds them (a build with the `faults`
/// feature only; see `replica::machine::Fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheFault {
    /// An update leaves the key's cached item in place: later gets are served the value from
    /// before the update.
    KeepsItemOnUpdate,
    /// A fill skips the check that no update of the key was in flight or started during the
    /// read: a read that raced an update caches what the update replaced.
    FillsDuringUpdates,
}

impl CacheFault {
    /// Every fault, for tools that pick one by name.
    pub const ALL: [CacheFault; 2] = [CacheFault::KeepsItemOnUpdate, CacheFault::FillsDuringUpdates];
}

/// How keys are spread over slots and shards.
enum Spread {
    /// Seeded at random per process: a client cannot aim its keys at one slot.
    Random(RandomState),
    /// The same in every run, for a seeded simulation to replay exactly.
    Fixed(BuildHasherDefault<DefaultHasher>),
}

/// A bounded cache of items by key.
pub struct QueryCache {
    shards: Vec<Mutex<Shard>>,
    slots: Vec<Mutex<Slot>>,
    entries_per_shard_max: usize,
    bytes_per_shard_max: usize,
    timing: CacheTiming,
    /// No fill before this (a previous process's updates may still commit).
    fills_from: Duration,
    spread: Spread,
    clock: Clock,
    fault: Option<CacheFault>,
}

/// What the cache knows of the updates of the keys that hash to one slot.
#[derive(Default)]
struct Slot {
    /// Moves whenever an update of the slot starts, ends or commits elsewhere.
    generation: u64,
    /// Updates of the slot that left for the head and whose outcome is not known yet.
    updates_in_flight: u32,
    /// An update of the slot was abandoned with its outcome unknown: no fill until then.
    held_until: Option<Duration>,
}

impl Slot {
    fn fillable(&self, generation: u64, now: Duration) -> bool {
        self.generation == generation
            && self.updates_in_flight == 0
            && self.held_until.is_none_or(|until| now >= until)
    }
}

#[derive(Default)]
struct Shard {
    map: HashMap<Vec<u8>, (Item, u64)>,
    clock: u64,
    /// Sum of [`cost`] over `map`.
    bytes: usize,
}

/// Bytes an item is charged against the budget.
fn cost(key: &[u8], item: &Item) -> usize {
    key.len() + item.value.len() + ENTRY_OVERHEAD_BYTES
}

impl Shard {
    fn remove(&mut self, key: &[u8]) {
        if let Some((item, _)) = self.map.remove(key) {
            self.bytes -= cost(key, &item);
        }
    }

    fn insert(&mut self, key: &[u8], item: Item, clock: u64) {
        self.remove(key);
        self.bytes += cost(key, &item);
        self.map.insert(key.to_vec(), (item, clock));
    }

    fn clear(&mut self) {
        self.map.clear();
        self.bytes = 0;
    }

    /// Evicts an approximately least-recently-used entry: the oldest of a small sample.
    fn evict_one(&mut self) {
        const SAMPLE: usize = 8;
        let victim = self.map.iter().take(SAMPLE).min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone());
        if let Some(victim) = victim {
            self.remove(&victim);
        }
    }
}

/// An update of one key in flight at this front-end (see the module comment). Release it
/// with [`UpdateGuard::settled`] once the outcome is known; dropping it otherwise marks the
/// update unsettled.
#[must_use = "an update guard must live until the update's outcome is known"]
pub struct UpdateGuard<'c> {
    cache: &'c QueryCache,
    key: Vec<u8>,
    released: bool,
}

impl UpdateGuard<'_> {
    /// The update's outcome is known: it committed, or it was decided without a write.
    pub fn settled(mut self) {
        self.release(false);
    }

    /// The update's outcome is unknown (a time-out, an ambiguous failure): it may commit
    /// later.
    pub fn unsettled(mut self) {
        self.release(true);
    }

    fn release(&mut self, unsettled: bool) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        self.cache.end_update(&self.key, unsettled);
    }
}

impl Drop for UpdateGuard<'_> {
    fn drop(&mut self) {
        // Dropped without an outcome: the request future was cancelled mid-flight.
        self.release(true);
    }
}

impl QueryCache {
    /// A cache of at most `entries_max` items costing at most `bytes_max` bytes (see
    /// [`ENTRY_OVERHEAD_BYTES`]); 0 for either disables it.
    pub fn new(entries_max: usize, bytes_max: usize, timing: CacheTiming) -> QueryCache {
        let origin = Instant::now();
        let mut cache = Self::build(entries_max, bytes_max, timing, Arc::new(move || origin.elapsed()));
        cache.fills_from = (cache.clock)() + timing.unsettled_hold;
        cache
    }

    /// A cache for a seeded simulation: time is `clock`'s, keys spread the same in every
    /// run, and fills are taken at once: the simulated front-end is the first process of its
    /// cluster, so no earlier one can have left updates in the chains (a real front-end cannot
    /// know that, and holds fills for [`CacheTiming::unsettled_hold`] after it starts).
    pub fn simulated(entries_max: usize, bytes_max: usize, timing: CacheTiming, clock: Clock) -> QueryCache {
        let mut cache = Self::build(entries_max, bytes_max, timing, clock);
        cache.spread = Spread::Fixed(BuildHasherDefault::default());
        cache
    }

    fn build(entries_max: usize, bytes_max: usize, timing: CacheTiming, clock: Clock) -> QueryCache {
        let bytes_per_shard_max = bytes_max / SHARDS;
        QueryCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            slots: (0..GENERATION_SLOTS).map(|_| Mutex::new(Slot::default())).collect(),
            entries_per_shard_max: if bytes_per_shard_max == 0 { 0 } else { entries_max.div_ceil(SHARDS) },
            bytes_per_shard_max,
            timing,
            fills_from: clock(),
            spread: Spread::Random(RandomState::new()),
            clock,
            fault: None,
        }
    }

    /// Re-introduces `fault` (a build with the `faults` feature only; otherwise ignored).
    pub fn with_fault(mut self, fault: Option<CacheFault>) -> QueryCache {
        if cfg!(feature = "faults") {
            self.fault = fault;
        }
        self
    }

    fn faulty(&self, fault: CacheFault) -> bool {
        cfg!(feature = "faults") && self.fault == Some(fault)
    }

    fn hash(&self, key: &[u8]) -> usize {
        match &self.spread {
            Spread::Random(h) => h.hash_one(key) as usize,
            Spread::Fixed(h) => h.hash_one(key) as usize,
        }
    }

    fn slot(&self, key: &[u8]) -> parking_lot::MutexGuard<'_, Slot> {
        self.slots[self.hash(key) % GENERATION_SLOTS].lock()
    }

    fn remove(&self, key: &[u8]) {
        self.shards[self.hash(key) % SHARDS].lock().remove(key);
    }

    /// The cached item, if any.
    pub fn get(&self, key: &[u8]) -> Option<Item> {
        if self.entries_per_shard_max == 0 {
            return None;
        }
        let mut shard = self.shards[self.hash(key) % SHARDS].lock();
        shard.clock += 1;
        let clock = shard.clock;
        shard.map.get_mut(key).map(|(item, used)| {
            *used = clock;
            item.clone()
        })
    }

    /// The key's generation, to pass to [`QueryCache::fill`].
    pub fn generation(&self, key: &[u8]) -> u64 {
        self.slot(key).generation
    }

    /// An update of `key` leaves for the head: no fill of its slot until the guard is
    /// released, and the cached item is dropped now.
    pub fn begin_update(&self, key: &[u8]) -> UpdateGuard<'_> {
        self.start_update(key);
        UpdateGuard { cache: self, key: key.to_vec(), released: false }
    }

    /// [`QueryCache::begin_update`] without a guard, for a caller that cannot hold a borrow
    /// across the update (the simulator): each start must be matched by one
    /// [`QueryCache::end_update`].
    pub fn start_update(&self, key: &[u8]) {
        let mut slot = self.slot(key);
        slot.updates_in_flight += 1;
        slot.generation += 1;
        drop(slot);
        if !self.faulty(CacheFault::KeepsItemOnUpdate) {
            self.remove(key);
        }
    }

    /// An update of `key` started with [`QueryCache::start_update`] ended: its outcome is
    /// known, or (`unsettled`) it may still commit, and its slot takes no fill for
    /// [`CacheTiming::unsettled_hold`].
    pub fn end_update(&self, key: &[u8], unsettled: bool) {
        let now = (self.clock)();
        let mut slot = self.slot(key);
        assert!(slot.updates_in_flight > 0, "an update ended that never started");
        slot.updates_in_flight -= 1;
        slot.generation += 1;
        if unsettled {
            let until = now + self.timing.unsettled_hold;
            slot.held_until = Some(slot.held_until.map_or(until, |u| u.max(until)));
        }
        // Under the slot's lock (as a fill is): no fill can slip in before the removal.
        if !self.faulty(CacheFault::KeepsItemOnUpdate) {
            self.remove(key);
        }
    }

    /// Caches a value read from the tail if the read overlapped no update of the key that
    /// this front-end knew of (see the module comment) and the cache holds nothing newer.
    /// Two reads of one key can finish out of order; the later-started read must win.
    pub fn fill(&self, key: &[u8], item: Item, generation: u64) {
        if self.entries_per_shard_max == 0 {
            return;
        }
        let now = (self.clock)();
        if now < self.fills_from {
            return;
        }
        // Held across the insert: an update cannot start between the check and the fill.
        let slot = self.slot(key);
        if !slot.fillable(generation, now) && !self.faulty(CacheFault::FillsDuringUpdates) {
            return;
        }
        let mut shard = self.shards[self.hash(key) % SHARDS].lock();
        if shard.map.get(key).is_some_and(|(cached, _)| cached.cas >= item.cas) {
            return;
        }
        let charge = cost(key, &item);
        if charge > self.bytes_per_shard_max {
            // Larger than a shard's budget: never cached (the tail serves it).
            shard.remove(key);
            return;
        }
        shard.clock += 1;
        let clock = shard.clock;
        shard.remove(key);
        while shard.map.len() >= self.entries_per_shard_max || shard.bytes + charge > self.bytes_per_shard_max
        {
            shard.evict_one();
        }
        shard.insert(key, item, clock);
        debug_assert!(
            shard.bytes <= self.bytes_per_shard_max && shard.map.len() <= self.entries_per_shard_max
        );
    }

    /// `key` changed without an update in flight here (a read found it absent, a tail
    /// reported a commit this front-end had stopped waiting for): drop the cached item and
    /// move the generation.
    pub fn invalidate(&self, key: &[u8]) {
        let mut slot = self.slot(key);
        slot.generation += 1;
        drop(slot);
        self.remove(key);
    }

    /// Drops everything (after a `flush_all` or a configuration change).
    pub fn clear(&self) {
        for s in &self.slots {
            s.lock().generation += 1;
        }
        for s in &self.shards {
            s.lock().clear();
        }
    }

    /// Items cached now.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    /// Bytes the cached items cost (see [`ENTRY_OVERHEAD_BYTES`]).
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().bytes).sum()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(v: &[u8], cas: u64) -> Item {
        Item { value: v.to_vec(), flags: 0, expiry: 0, cas, state: 0 }
    }

    fn cache() -> QueryCache {
        QueryCache::new(100, 1 << 20, CacheTiming { unsettled_hold: Duration::ZERO })
    }

    #[test]
    fn a_fill_that_raced_an_update_is_dropped() {
        let c = cache();
        let g = c.generation(b"k");
        c.begin_update(b"k").settled();
        c.fill(b"k", item(b"old", 1), g);
        assert!(c.get(b"k").is_none());
        let g = c.generation(b"k");
        c.fill(b"k", item(b"new", 2), g);
        assert_eq!(c.get(b"k").unwrap().value, b"new");
    }

    #[test]
    fn no_fill_while_an_update_is_in_flight_even_if_the_read_started_after_it() {
        let c = cache();
        let update = c.begin_update(b"k");
        // The read starts after the update started and reads the tail before the update
        // reaches it: its generation did not move, but the update may commit any moment.
        let g = c.generation(b"k");
        c.fill(b"k", item(b"old", 1), g);
        assert!(c.get(b"k").is_none(), "a fill during an update in flight must be refused");
        update.settled();
        let g = c.generation(b"k");
        c.fill(b"k", item(b"new", 2), g);
        assert_eq!(c.get(b"k").unwrap().value, b"new");
    }

    #[test]
    fn an_update_dropped_without_outcome_holds_its_slot() {
        let c = QueryCache::new(100, 1 << 20, CacheTiming { unsettled_hold: Duration::from_secs(3600) });
        // Past the start-up hold of a fresh cache is not reachable here: check the slot.
        drop(c.begin_update(b"k"));
        let slot = c.slot(b"k");
        assert_eq!(slot.updates_in_flight, 0);
        assert!(!slot.fillable(slot.generation, (c.clock)()));
    }

    #[test]
    fn an_unsettled_update_holds_until_its_deadline() {
        let c = QueryCache::new(100, 1 << 20, CacheTiming { unsettled_hold: Duration::from_millis(30) });
        std::thread::sleep(Duration::from_millis(40));
        c.begin_update(b"k").unsettled();
        let g = c.generation(b"k");
        c.fill(b"k", item(b"v", 1), g);
        assert!(c.get(b"k").is_none(), "filled during the hold");
        std::thread::sleep(Duration::from_millis(40));
        c.fill(b"k", item(b"v", 1), g);
        assert_eq!(c.get(b"k").unwrap().value, b"v");
    }

    #[test]
    fn no_fill_in_the_start_up_hold() {
        let c = QueryCache::new(100, 1 << 20, CacheTiming { unsettled_hold: Duration::from_secs(3600) });
        c.fill(b"k", item(b"v", 1), c.generation(b"k"));
        assert!(c.get(b"k").is_none());
    }

    #[test]
    fn overlapping_updates_hold_until_the_last_one_ends() {
        let c = cache();
        let a = c.begin_update(b"k");
        let b = c.begin_update(b"k");
        a.settled();
        let g = c.generation(b"k");
        c.fill(b"k", item(b"v", 1), g);
        assert!(c.get(b"k").is_none());
        b.settled();
        let g = c.generation(b"k");
        c.fill(b"k", item(b"v", 1), g);
        assert!(c.get(b"k").is_some());
    }

    #[test]
    fn an_older_read_never_replaces_a_newer_one() {
        let c = cache();
        let g = c.generation(b"k");
        c.fill(b"k", item(b"new", 9), g);
        c.fill(b"k", item(b"old", 5), g);
        assert_eq!(c.get(b"k").unwrap().value, b"new");
    }

    #[test]
    fn stays_within_its_byte_budget() {
        let budget = 64 * 1024;
        let c = QueryCache::new(1_000_000, budget, CacheTiming { unsettled_hold: Duration::ZERO });
        let value = vec![7u8; 1000];
        for i in 0..10_000u32 {
            let key = i.to_le_bytes();
            c.fill(&key, item(&value, 1), c.generation(&key));
        }
        assert!(c.bytes() <= budget, "{} bytes cached", c.bytes());
        assert!(c.len() * (1000 + ENTRY_OVERHEAD_BYTES) >= budget / 2, "only {} items", c.len());
        // Refills and removals keep the count exact.
        for i in 0..10_000u32 {
            let key = i.to_le_bytes();
            c.invalidate(&key);
        }
        assert_eq!((c.len(), c.bytes()), (0, 0));
        // An item above a shard's share is not cached at all.
        let big = vec![0u8; budget];
        c.fill(b"big", item(&big, 2), c.generation(b"big"));
        assert!(c.get(b"big").is_none());
    }

    #[test]
    fn stays_bounded() {
        let c = QueryCache::new(64, 1 << 20, CacheTiming { unsettled_hold: Duration::ZERO });
        for i in 0..10_000u32 {
            let key = i.to_le_bytes();
            c.fill(&key, item(b"v", 1), c.generation(&key));
        }
        assert!(c.len() <= 64, "{}", c.len());
    }
}
