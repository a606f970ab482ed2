//! The front-end's query cache: bounded, and coherent because every update of a key in this
//! front-end's wedge passes through it.
//!
//! Coherence rule: a get that misses records the key's *generation* before asking the tail;
//! every update bumps the generation when it starts and when it ends. The get's answer is
//! cached only if the generation did not move meanwhile, so a slow read can never overwrite a
//! newer value.

use std::collections::HashMap;
use std::hash::BuildHasher;

use fawn_proto::op::Item;
use parking_lot::Mutex;

/// Generation slots (keys hash onto them; a collision only costs a skipped cache fill).
const GENERATION_SLOTS: usize = 4096;
/// Cache shards (each with its own lock).
const SHARDS: usize = 16;

/// A bounded cache of items by key.
pub struct QueryCache {
    shards: Vec<Mutex<Shard>>,
    generations: Vec<Mutex<u64>>,
    entries_per_shard_max: usize,
    hasher: std::collections::hash_map::RandomState,
}

#[derive(Default)]
struct Shard {
    map: HashMap<Vec<u8>, (Item, u64)>,
    clock: u64,
}

impl QueryCache {
    /// A cache of at most `entries_max` items (0 disables it).
    pub fn new(entries_max: usize) -> QueryCache {
        QueryCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            generations: (0..GENERATION_SLOTS).map(|_| Mutex::new(0)).collect(),
            entries_per_shard_max: entries_max.div_ceil(SHARDS),
            hasher: Default::default(),
        }
    }

    fn hash(&self, key: &[u8]) -> usize {
        self.hasher.hash_one(key) as usize
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
        *self.generations[self.hash(key) % GENERATION_SLOTS].lock()
    }

    /// Caches a value read from the tail if no update touched the key since `generation`
    /// and the cache holds nothing newer. Two reads of one key can finish out of order (an
    /// update may commit without passing this front-end's cache, e.g. when it was sent through
    /// a predecessor of this process that crashed); the later-started read must win.
    pub fn fill(&self, key: &[u8], item: Item, generation: u64) {
        let gen = self.generations[self.hash(key) % GENERATION_SLOTS].lock();
        if *gen != generation || self.entries_per_shard_max == 0 {
            return;
        }
        let shard = self.shards[self.hash(key) % SHARDS].lock();
        if shard.map.get(key).is_some_and(|(cached, _)| cached.cas >= item.cas) {
            return;
        }
        drop(shard);
        self.insert(key, item);
    }

    /// An update of `key` starts or ends: drop the cached item and move the generation.
    pub fn invalidate(&self, key: &[u8]) {
        let mut gen = self.generations[self.hash(key) % GENERATION_SLOTS].lock();
        *gen += 1;
        self.shards[self.hash(key) % SHARDS].lock().map.remove(key);
    }

    fn insert(&self, key: &[u8], item: Item) {
        if self.entries_per_shard_max == 0 {
            return;
        }
        let mut shard = self.shards[self.hash(key) % SHARDS].lock();
        shard.clock += 1;
        let clock = shard.clock;
        if shard.map.len() >= self.entries_per_shard_max && !shard.map.contains_key(key) {
            evict_oldest(&mut shard.map);
        }
        shard.map.insert(key.to_vec(), (item, clock));
    }

    /// Drops everything (after a `flush_all` or a configuration change).
    pub fn clear(&self) {
        for g in &self.generations {
            *g.lock() += 1;
        }
        for s in &self.shards {
            s.lock().map.clear();
        }
    }
}

/// Evicts an approximately least-recently-used entry: the oldest of a small sample.
fn evict_oldest(map: &mut HashMap<Vec<u8>, (Item, u64)>) {
    const SAMPLE: usize = 8;
    if let Some(victim) = map.iter().take(SAMPLE).min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone()) {
        map.remove(&victim);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(v: &[u8], cas: u64) -> Item {
        Item { value: v.to_vec(), flags: 0, expiry: 0, cas }
    }

    #[test]
    fn a_fill_that_raced_an_update_is_dropped() {
        let c = QueryCache::new(100);
        let g = c.generation(b"k");
        c.invalidate(b"k");
        c.fill(b"k", item(b"old", 1), g);
        assert!(c.get(b"k").is_none());
        let g = c.generation(b"k");
        c.fill(b"k", item(b"new", 2), g);
        assert_eq!(c.get(b"k").unwrap().value, b"new");
    }

    #[test]
    fn an_older_read_never_replaces_a_newer_one() {
        let c = QueryCache::new(100);
        let g = c.generation(b"k");
        c.fill(b"k", item(b"new", 9), g);
        c.fill(b"k", item(b"old", 5), g);
        assert_eq!(c.get(b"k").unwrap().value, b"new");
    }

    #[test]
    fn stays_bounded() {
        let c = QueryCache::new(64);
        for i in 0..10_000u32 {
            let key = i.to_le_bytes();
            c.fill(&key, item(b"v", 1), c.generation(&key));
        }
        let total: usize = c.shards.iter().map(|s| s.lock().map.len()).sum();
        assert!(total <= 64, "{total}");
    }
}
