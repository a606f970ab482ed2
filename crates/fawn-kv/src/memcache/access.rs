//! memcached's read-side item marks for `mg h` (fetched before) and `mg l` (seconds since
//! last access), and `me`'s `fetch=` and `la=`.
//!
//! Where they live: in this front-end's memory, not with the item. They change on every
//! read, and keeping them with the item would turn each read into a replicated write through
//! the chain head. memcached keeps them in its own memory too and loses them on restart.
//! Limits, all documented in PROTOCOL.md:
//! - each front-end sees only the reads it serves: an item read through another front-end
//!   reads as not fetched here;
//! - bounded ([`ACCESS_ENTRIES_MAX`] items); a forgotten item, or one first seen here (stored
//!   through another front-end or before a restart), starts as not fetched and accessed now;
//! - a mark belongs to one version of the item (its cas): any rewrite starts afresh, except
//!   the rewrites this front-end makes for an access-state update (`md I`, a win), which
//!   carry the marks over, as memcached keeps them on the same item.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use fawn_proto::op::UnixSeconds;
use parking_lot::Mutex;

/// Items whose marks one front-end keeps (about 40 bytes each with the map's overhead).
pub const ACCESS_ENTRIES_MAX: usize = 1 << 16;
/// Shards of the table, each with its own lock and an equal share of the entries.
const SHARDS: usize = 16;
const _: () = assert!(ACCESS_ENTRIES_MAX.is_multiple_of(SHARDS));

/// One item version's marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Access {
    cas: u64,
    /// When it was stored or last bumped (Unix seconds).
    last: UnixSeconds,
    fetched: bool,
    /// Bumped since it was first fetched: later reads leave `last` alone (see [`bump`]).
    active: bool,
}

/// The marks of an item as a reader sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marks {
    pub fetched: bool,
    pub idle_secs: u32,
}

pub struct AccessTable {
    hasher: RandomState,
    shards: Vec<Mutex<HashMap<u64, Access>>>,
}

impl Default for AccessTable {
    fn default() -> Self {
        AccessTable { hasher: RandomState::new(), shards: (0..SHARDS).map(|_| Mutex::default()).collect() }
    }
}

impl AccessTable {
    /// An item version stored through this front-end at `now`.
    pub fn stored(&self, key: &[u8], cas: u64, now: UnixSeconds) {
        self.with(key, |map, hash| {
            map.insert(hash, Access { cas, last: now, fetched: false, active: false });
        });
    }

    /// A read of the item version `cas`: its marks as they were before, then the bump.
    pub fn fetched(&self, key: &[u8], cas: u64, now: UnixSeconds) -> Marks {
        self.with(key, |map, hash| {
            let access = entry(map, hash, cas, now);
            let marks = marks(access, now);
            bump(access, now);
            marks
        })
    }

    /// The marks of the item version `cas`, without reading it (`me`).
    pub fn peek(&self, key: &[u8], cas: u64, now: UnixSeconds) -> Marks {
        self.with(key, |map, hash| marks(entry(map, hash, cas, now), now))
    }

    /// The key's item was rewritten by this front-end only to change its access state: its
    /// marks carry over to the new version `cas`.
    pub fn carried(&self, key: &[u8], cas: u64) {
        self.with(key, |map, hash| {
            if let Some(access) = map.get_mut(&hash) {
                access.cas = cas;
            }
        });
    }

    fn with<T>(&self, key: &[u8], f: impl FnOnce(&mut HashMap<u64, Access>, u64) -> T) -> T {
        let hash = self.hasher.hash_one(key);
        let mut map = self.shards[hash as usize % SHARDS].lock();
        if map.len() >= ACCESS_ENTRIES_MAX / SHARDS && !map.contains_key(&hash) {
            // Full: forget an arbitrary item (it reads as first seen if it comes back).
            if let Some(victim) = map.keys().next().copied() {
                map.remove(&victim);
            }
        }
        f(&mut map, hash)
    }
}

/// The marks of `cas`, started afresh if the table knew none or another version's.
fn entry(map: &mut HashMap<u64, Access>, hash: u64, cas: u64, now: UnixSeconds) -> &mut Access {
    let access = map.entry(hash).or_insert(Access { cas, last: now, fetched: false, active: false });
    if access.cas != cas {
        *access = Access { cas, last: now, fetched: false, active: false };
    }
    access
}

fn marks(access: &Access, now: UnixSeconds) -> Marks {
    Marks { fetched: access.fetched, idle_secs: now.saturating_sub(access.last) }
}

/// memcached's segmented LRU bump: the first read marks the item fetched; the next one
/// makes it active and moves its access time to now; reads of an active item change nothing
/// (memcached's LRU maintainer clears the active mark as the item ages, FAWN has no LRU).
fn bump(access: &mut Access, now: UnixSeconds) {
    if !access.fetched {
        access.fetched = true;
    } else if !access.active {
        access.active = true;
        access.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_follow_memcached_reads() {
        let table = AccessTable::default();
        table.stored(b"k", 7, 100);
        assert_eq!(table.peek(b"k", 7, 103), Marks { fetched: false, idle_secs: 3 });
        assert_eq!(table.fetched(b"k", 7, 105), Marks { fetched: false, idle_secs: 5 });
        // The second read bumps the access time; later ones do not.
        assert_eq!(table.fetched(b"k", 7, 106), Marks { fetched: true, idle_secs: 6 });
        assert_eq!(table.fetched(b"k", 7, 110), Marks { fetched: true, idle_secs: 4 });
        // A carried-over version keeps its marks; any other version starts afresh.
        table.carried(b"k", 8);
        assert_eq!(table.peek(b"k", 8, 110), Marks { fetched: true, idle_secs: 4 });
        assert_eq!(table.fetched(b"k", 9, 120), Marks { fetched: false, idle_secs: 0 });
    }

    #[test]
    fn table_stays_bounded() {
        let table = AccessTable::default();
        for i in 0..(ACCESS_ENTRIES_MAX as u64 * 2) {
            table.fetched(&i.to_le_bytes(), i, 1);
        }
        let held: usize = table.shards.iter().map(|shard| shard.lock().len()).sum();
        assert!(held <= ACCESS_ENTRIES_MAX, "{held} entries");
    }
}
