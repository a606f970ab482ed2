//! memcached's read-side item marks for `mg h` (fetched before) and `mg l` (seconds since
//! last access), and `me`'s `fetch=` and `la=`.
//!
//! Where they live: in this front-end's memory, not with the item. They change on every
//! read, and keeping them with the item would turn each read into a replicated write through
//! the chain head. memcached keeps them in its own memory too and loses them on restart.
//! Limits, all documented in PROTOCOL.md:
//! - each front-end sees only the reads it serves: an item read through another front-end
//!   reads as not fetched here;
//! - bounded ([`ACCESS_ENTRIES_MAX`] slots, one word each, chosen by the key's hash): an item
//!   whose slot another key took since, or one first seen here (stored through another
//!   front-end or before a restart), starts as not fetched and accessed now;
//! - a mark belongs to one version of the item (its cas): any rewrite starts afresh, except
//!   the rewrites this front-end makes for an access-state update (`md I`, a win), which
//!   carry the marks over, as memcached keeps them on the same item.
//!
//! Every cache hit records a read, so the table has no lock: a slot is one atomic word, and a
//! read of an item already read twice only loads it.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use fawn_proto::op::UnixSeconds;

/// Slots of the table, one item each (8 bytes a slot: 1 MiB in all). An item is kept in the
/// slot its key hashes to, so two keys sharing a slot take turns (each return starts afresh).
pub const ACCESS_ENTRIES_MAX: usize = 1 << 17;
const _: () = assert!(ACCESS_ENTRIES_MAX.is_power_of_two());

// One slot is one word, so a read updates it with one compare-and-swap and no lock:
// - bits 0..24: the last access time, Unix seconds modulo 2^24 (194 days; an item idle longer
//   reports its idle time modulo that);
// - bit 24: fetched; bit 25: active (bumped since it was first fetched, see [`bump`]);
// - bits 26..46: the item version's cas modulo 2^20 (a rewrite starts afresh unless it lands
//   exactly a multiple of 2^20 writes of the range later);
// - bits 46..64: 18 bits of the key's hash, never all zero (an empty slot matches no key).
const LAST_MASK: u64 = (1 << 24) - 1;
const FETCHED: u64 = 1 << 24;
const ACTIVE: u64 = 1 << 25;
const CAS_SHIFT: u32 = 26;
const CAS_MASK: u64 = ((1 << 20) - 1) << CAS_SHIFT;
const KEY_SHIFT: u32 = 46;
const KEY_MASK: u64 = !0 << KEY_SHIFT;
const IDENT_MASK: u64 = KEY_MASK | CAS_MASK;
const _: () = assert!(LAST_MASK < FETCHED && ACTIVE < 1 << CAS_SHIFT && CAS_MASK < 1 << KEY_SHIFT);

/// The marks of an item as a reader sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marks {
    pub fetched: bool,
    pub idle_secs: u32,
}

pub struct AccessTable {
    slots: Box<[AtomicU64]>,
}

impl Default for AccessTable {
    fn default() -> Self {
        AccessTable { slots: (0..ACCESS_ENTRIES_MAX).map(|_| AtomicU64::new(0)).collect() }
    }
}

/// Where a key's marks live and what identifies its version there.
struct Place<'a> {
    slot: &'a AtomicU64,
    key_tag: u64,
    ident: u64,
}

impl AccessTable {
    /// An item version stored through this front-end at `now`.
    pub fn stored(&self, key: &[u8], cas: u64, now: UnixSeconds) {
        let place = self.place(key, cas);
        place.slot.store(fresh(place.ident, now), Relaxed);
    }

    /// A read of the item version `cas` whose marks the reader does not want (`get`): once
    /// the item is active this only loads its slot (no clock, no write).
    pub fn read(&self, key: &[u8], cas: u64, clock: fn() -> UnixSeconds) {
        let place = self.place(key, cas);
        let word = place.slot.load(Relaxed);
        if word & IDENT_MASK != place.ident || word & ACTIVE == 0 {
            place.update(clock(), true);
        }
    }

    /// A read of the item version `cas`: its marks as they were before, then the bump.
    pub fn fetched(&self, key: &[u8], cas: u64, now: UnixSeconds) -> Marks {
        self.place(key, cas).update(now, true)
    }

    /// The marks of the item version `cas`, without reading it (`me`, `mg u`).
    pub fn peek(&self, key: &[u8], cas: u64, now: UnixSeconds) -> Marks {
        self.place(key, cas).update(now, false)
    }

    /// The key's item was rewritten by this front-end only to change its access state: its
    /// marks carry over to the new version `cas`.
    pub fn carried(&self, key: &[u8], cas: u64) {
        let place = self.place(key, cas);
        let _ = place.slot.fetch_update(Relaxed, Relaxed, |word| {
            (word & KEY_MASK == place.key_tag).then_some(word & !CAS_MASK | place.ident & CAS_MASK)
        });
    }

    fn place(&self, key: &[u8], cas: u64) -> Place<'_> {
        // A fixed hasher: the slot of a key does not change between runs, so which keys share
        // a slot is reproducible. A client choosing keys that share a slot only resets marks.
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
        let slot = &self.slots[hash as usize & (ACCESS_ENTRIES_MAX - 1)];
        let key_tag = (hash & KEY_MASK).max(1 << KEY_SHIFT);
        Place { slot, key_tag, ident: key_tag | (cas << CAS_SHIFT) & CAS_MASK }
    }
}

impl Place<'_> {
    /// The marks before, then (if `bump`) the read recorded; a slot holding another key or
    /// version starts afresh at `now`.
    fn update(&self, now: UnixSeconds, bump_it: bool) -> Marks {
        let mut word = self.slot.load(Relaxed);
        loop {
            let base = if word & IDENT_MASK == self.ident { word } else { fresh(self.ident, now) };
            let next = if bump_it { bump(base, now) } else { base };
            if next == word {
                return marks(base, now);
            }
            match self.slot.compare_exchange_weak(word, next, Relaxed, Relaxed) {
                Ok(_) => return marks(base, now),
                Err(current) => word = current,
            }
        }
    }
}

fn fresh(ident: u64, now: UnixSeconds) -> u64 {
    ident | u64::from(now) & LAST_MASK
}

fn marks(word: u64, now: UnixSeconds) -> Marks {
    let idle = u64::from(now).wrapping_sub(word) & LAST_MASK;
    Marks { fetched: word & FETCHED != 0, idle_secs: idle as u32 }
}

/// memcached's segmented LRU bump: the first read marks the item fetched; the next one
/// makes it active and moves its access time to now; reads of an active item change nothing
/// (memcached's LRU maintainer clears the active mark as the item ages, FAWN has no LRU).
fn bump(word: u64, now: UnixSeconds) -> u64 {
    if word & FETCHED == 0 {
        word | FETCHED
    } else if word & ACTIVE == 0 {
        word & !LAST_MASK | ACTIVE | u64::from(now) & LAST_MASK
    } else {
        word
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
    fn one_concurrent_first_read_sees_the_item_unfetched() {
        let table = AccessTable::default();
        table.stored(b"k", 3, 100);
        let unfetched = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        if !table.fetched(b"k", 3, 100).fetched {
                            unfetched.fetch_add(1, Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(unfetched.into_inner(), 1);
    }

    #[test]
    fn plain_reads_bump_as_marked_reads_do() {
        let table = AccessTable::default();
        table.stored(b"k", 5, 100);
        table.read(b"k", 5, || 104);
        table.read(b"k", 5, || 107);
        // Active now: later reads do not ask the clock.
        table.read(b"k", 5, || unreachable!("an active item's read needs no clock"));
        assert_eq!(table.peek(b"k", 5, 110), Marks { fetched: true, idle_secs: 3 });
        // A never stored key reads as first seen.
        table.read(b"other", 1, || 200);
        assert_eq!(table.peek(b"other", 1, 201), Marks { fetched: true, idle_secs: 1 });
    }

    #[test]
    fn idle_time_wraps_only_past_its_field() {
        let table = AccessTable::default();
        let stored = (1 << 24) - 2;
        table.stored(b"k", 1, stored);
        assert_eq!(table.peek(b"k", 1, stored + 5).idle_secs, 5);
    }
}
