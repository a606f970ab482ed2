//! The in-DRAM hash index: key fragment + log offset per slot, bucketized cuckoo hashing
//! over a linear-hashing table that grows one bucket at a time.
//!
//! Slot = 6 bytes: a 32-bit log offset in `OFFSET_UNIT`s (0 = empty: offset 0 is the log
//! header, so no valid bit is needed) and a 16-bit tag: a 13-bit key fragment and 3 bits of
//! growth state (below). A bucket holds 8 slots: 8 tags in one 16-byte group of a tag array, 8
//! offsets in one 32-byte group of an offset array (both cache-line aligned).
//!
//! **Addressing.** A key has a 64-bit hash `v1` and a fragment `f`; its second hash is
//! `v2 = v1 ^ alt(f)` (partial-key cuckoo hashing: from either value and the fragment the other
//! follows, so displacing an entry needs no log read). The table is at *level* `L` with
//! *split pointer* `p`: it has `2^L + p` buckets, and a value `v` lives in bucket
//! `v mod 2^(L+1)` if `v mod 2^L < p`, else `v mod 2^L` (linear hashing). A key's two
//! candidate buckets are those of `v1` and `v2`.
//!
//! **Growth, a bucket at a time.** When the load passes `INDEX_LOAD_MAX`, bucket `p` splits:
//! each entry in it moves to bucket `p + 2^L` or stays, by bit `L` of the value that placed
//! it; `p` advances, and when it reaches `2^L` the level goes up. So the table is always
//! within one bucket of its target load (6 B / 0.94 = 6.4 B per key), never half empty as a
//! doubling table is, and no step touches more than two buckets.
//!
//! **Where the split bit comes from.** A slot cannot hold its key's hash, so each slot keeps
//! the two hash bits its next splits need: `P[k mod 2]` = bit `k` of its placing value for
//! `k ∈ {j−1, j}`, and the parity bit `F = j mod 2`. During level `L` every entry knows
//! bit `L` (`j ≥ L`). Bit `L+1` is needed only once the level advances, and arrives by a
//! **refresh scan**: when a level starts, every entry is *stale* (`j = L`); a background
//! scan reads the logs sequentially below limits recorded then and, for each put record,
//! rewrites the entry at exactly that record's position from the record's key (`j = L+1`,
//! fresh). Writers refresh the entries they touch (they know the key). The level may end only
//! after the scan: entries still stale then (their records could not be read) go to the
//! stash, keeping the hash bits they know (`StashEntry`). A displaced entry's bits follow it
//! (`Table::other`). No operation ever rehashes the whole table.

use crate::limits::{
    COLD_UNITS_BIT, INDEX_FRAGMENT_BITS, INDEX_LOAD_MAX, INDEX_SIZING_LOAD, LOG_HEADER_BYTES,
    SLOTS_PER_BUCKET,
};

/// Words (u16) per slot in the checkpoint image: its tag, and its offset's low and high
/// halves (a bucket's 8 tags first, then its 8 offsets).
const WORDS_PER_SLOT: usize = 3;
const WORDS_PER_BUCKET: usize = WORDS_PER_SLOT * SLOTS_PER_BUCKET;
/// In DRAM the tags and the offsets live in separate cache-line-aligned arrays: a bucket's
/// 8 tags (16 bytes) never straddle a line, so a probe, and the check for a free slot (an
/// empty slot's tag is 0, no key's is), read one line; its offsets (32 bytes, one line too)
/// are read only on a match.
const BUCKETS_PER_TAG_LINE: usize = 4;
const BUCKETS_PER_UNIT_LINE: usize = 2;

/// The tags of 4 buckets.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct TagLine([u16; BUCKETS_PER_TAG_LINE * SLOTS_PER_BUCKET]);

/// The offsets of 2 buckets.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct UnitLine([u32; BUCKETS_PER_UNIT_LINE * SLOTS_PER_BUCKET]);

const _: () = assert!(std::mem::size_of::<TagLine>() == 64 && std::mem::size_of::<UnitLine>() == 64);

/// Up to `CHUNK_BUCKETS` buckets: their tag and offset lines.
#[derive(Clone, Debug, Default)]
struct Chunk {
    tags: Vec<TagLine>,
    units: Vec<UnitLine>,
}

impl Chunk {
    /// Buckets the lines allocated so far hold (a multiple of 4).
    fn buckets(&self) -> usize {
        self.tags.len() * BUCKETS_PER_TAG_LINE
    }

    /// Add room for 4 more buckets, growing the allocations by a quarter at a time (at most
    /// a quarter of a chunk is ever allocated and unused).
    fn grow(&mut self) {
        if self.tags.len() == self.tags.capacity() {
            let want = (self.tags.len() / 4).max(4).min(CHUNK_TAG_LINES - self.tags.len());
            self.tags.reserve_exact(want);
            self.units.reserve_exact(want * 2);
        }
        self.tags.push(TagLine([0; BUCKETS_PER_TAG_LINE * SLOTS_PER_BUCKET]));
        self.units.push(UnitLine([0; BUCKETS_PER_UNIT_LINE * SLOTS_PER_BUCKET]));
        self.units.push(UnitLine([0; BUCKETS_PER_UNIT_LINE * SLOTS_PER_BUCKET]));
    }

    fn bytes(&self) -> usize {
        (self.tags.capacity() + self.units.capacity()) * 64
    }
}
/// Cuckoo walk steps (each looks at up to 16 other buckets) before an entry goes to the
/// stash.
const KICKS_MAX: usize = 64;
/// Entries ahead whose buckets a batch loop prefetches.
pub(crate) const PREFETCH_AHEAD: usize = 8;
/// Writes scan the log themselves only when the refresh scan is this far behind their share
/// (1/8 of the scan for small logs); normally the background thread keeps it ahead.
const WRITE_SLACK_BYTES: u64 = 4 << 20;

fn write_slack(scan_bytes: u64) -> u64 {
    (scan_bytes / 8).clamp(1, WRITE_SLACK_BYTES)
}
/// Placeable stash entries tolerated before buckets split early (each costs a compare per
/// lookup).
const STASH_ENTRIES_GROW_AT: usize = 16;
/// Bucket splits one insert may do (bounds its work when the stash asks for growth).
const SPLITS_PER_INSERT_MAX: usize = 4;
/// Smallest and largest table: `2^LEVEL_MIN` and `2^LEVEL_MAX` buckets.
const LEVEL_MIN: u32 = 6;
const LEVEL_MAX: u32 = 40;
/// Buckets per allocation: the table grows a bucket at a time, so it is stored in chunks
/// (the last one grows by a quarter at a time up to this size) instead of one vector that
/// would double.
const CHUNK_BUCKETS: usize = 1024;
const CHUNK_TAG_LINES: usize = CHUNK_BUCKETS / BUCKETS_PER_TAG_LINE;
const SLOTS_PER_CHUNK: usize = CHUNK_BUCKETS * SLOTS_PER_BUCKET;

/// Tag layout: bits 0–1 `P`, bit 2 `F`, bits 3–15 the fragment.
const TAG_PARITY_SHIFT: u32 = 2;
const FRAG_SHIFT: u32 = 3;
const FRAG_MASK: u16 = (1 << INDEX_FRAGMENT_BITS) - 1;
const _: () = assert!(INDEX_FRAGMENT_BITS + FRAG_SHIFT == 16);
const _: () = assert!(CHUNK_BUCKETS.is_power_of_two() && (1 << LEVEL_MIN) <= CHUNK_BUCKETS);
const _: () = assert!((1usize << LEVEL_MIN).is_multiple_of(BUCKETS_PER_TAG_LINE));

/// What the index needs of a key: its primary hash and its fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyHash {
    pub h: u64,
    pub frag: u16,
}

impl KeyHash {
    /// Hash from the low 48 bits of the key id (mixed), fragment from the top bits of the
    /// low 64 (disjoint from the hash's). Never from the high bits: they place the key on the
    /// ring, so the keys of one datastore (one ring range) share them and would crowd into a
    /// band of buckets.
    ///
    /// The fragment is never 0 (0 becomes 1), so no occupied slot has tag 0: an empty
    /// slot is told by its tag alone.
    pub fn of(key: &[u8]) -> KeyHash {
        let low = fawn_ring::key_id(key).low64();
        let frag = ((low >> (64 - INDEX_FRAGMENT_BITS)) as u16).max(1);
        KeyHash { h: mix(low & 0x0000_FFFF_FFFF_FFFF), frag }
    }

    /// The key's second hash value.
    fn v2(self) -> u64 {
        self.h ^ alt(self.frag)
    }
}

/// Where a candidate entry lives (valid while the caller holds the writer lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    Slot { slot: usize, units: u32 },
    Stash { i: usize, units: u32 },
}

impl Loc {
    /// The log position the entry held when it was found.
    fn units(self) -> u32 {
        match self {
            Loc::Slot { units, .. } | Loc::Stash { units, .. } => units,
        }
    }
}

/// An entry's place in the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    Slot(usize),
    Stash(usize),
}

/// A cache prefetch hint for the line holding `p` (no effect on other targets).
#[inline]
fn prefetch_read(p: *const u16) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and does not access memory
    // semantically; `p` points into a live slice anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// 1 if `units` names a record in the cold log.
#[inline]
fn cold_bit(units: u32) -> u64 {
    (units & COLD_UNITS_BIT != 0) as u64
}

/// Which log an entry points into: `HOT` or `COLD`.
#[inline]
fn log_of(units: u32) -> usize {
    cold_bit(units) as usize
}

/// A fragment match: a log offset (in units) to read and compare keys at.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate {
    pub loc: Loc,
    pub units: u32,
}

/// A stash entry: an entry no bucket could take, or one whose record a refresh scan could
/// not read. It keeps the low `nbits` bits of its placing value `v` (64 once a writer or a
/// scan saw its key): a key may own it only if its fragment matches and one of its two hash
/// values agrees with `v` on those bits, which keeps an unreadable record out of the way of
/// all but ~2^-(nbits+13) of the other keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StashEntry {
    v: u64,
    nbits: u32,
    frag: u16,
    units: u32,
}

impl StashEntry {
    /// Whether the entry knows enough of its hash to go back into a bucket at `level` as a
    /// fresh entry (bits up to `level + 1`).
    fn placeable(&self, level: u32) -> bool {
        self.nbits >= level + 2
    }

    #[inline]
    fn may_hold(&self, kh: KeyHash) -> bool {
        let m = low_mask(self.nbits);
        self.frag == kh.frag && ((kh.h ^ self.v) & m == 0 || (kh.v2() ^ self.v) & m == 0)
    }
}

/// The low `n` bits set.
#[inline]
fn low_mask(n: u32) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// The difference between a key's two hash values, from its fragment alone.
#[inline]
fn alt(frag: u16) -> u64 {
    mix(frag as u64 ^ 0x5bd1_e995_0000_0000)
}

#[inline]
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Bit `k` of `v`.
#[inline]
fn bit(v: u64, k: u32) -> u16 {
    ((v >> k) & 1) as u16
}

/// The tag of an entry with fragment `frag` placed by value `v` that knows `v`'s bits up to
/// `j`: `P[k mod 2]` = bit `k` for `k ∈ {j−1, j}`, `F = j mod 2`.
#[inline]
fn tag_for(frag: u16, v: u64, j: u32) -> u16 {
    let p = bit(v, j - 1) << ((j - 1) & 1) | bit(v, j) << (j & 1);
    frag << FRAG_SHIFT | ((j & 1) as u16) << TAG_PARITY_SHIFT | p
}

/// The table: linear hashing over 8-slot buckets, two choices per key, plus a small stash.
#[derive(Clone, Debug)]
pub(crate) struct Table {
    chunks: Vec<Chunk>,
    level: u32,
    split: u64,
    /// Entries in slots.
    len: u64,
    stash: Vec<StashEntry>,
    /// Entries (slots and stash) pointing into the cold log.
    cold: u64,
    /// Slot entries not yet refreshed at this level, per log (`[HOT, COLD]`).
    stale: [u64; 2],
    rng: u64,
}

impl Table {
    pub fn with_buckets(buckets: u64) -> Table {
        let buckets = buckets.clamp(1 << LEVEL_MIN, 1 << LEVEL_MAX);
        let level = 63 - buckets.leading_zeros();
        let mut chunks = Vec::new();
        let mut left = buckets as usize;
        while left > 0 {
            let n = left.min(CHUNK_BUCKETS).next_multiple_of(BUCKETS_PER_TAG_LINE);
            let lines = n / BUCKETS_PER_TAG_LINE;
            chunks.push(Chunk {
                tags: vec![TagLine([0; BUCKETS_PER_TAG_LINE * SLOTS_PER_BUCKET]); lines],
                units: vec![UnitLine([0; BUCKETS_PER_UNIT_LINE * SLOTS_PER_BUCKET]); lines * 2],
            });
            left -= n.min(left);
        }
        Table {
            chunks,
            level,
            split: buckets - (1 << level),
            len: 0,
            stash: Vec::new(),
            cold: 0,
            stale: [0; 2],
            rng: 0x2545_F491_4F6C_DD1D,
        }
    }

    pub fn for_keys(keys: u64) -> Table {
        let slots = (keys as f64 / INDEX_SIZING_LOAD).ceil() as u64;
        Table::with_buckets(slots.div_ceil(SLOTS_PER_BUCKET as u64))
    }

    fn buckets(&self) -> u64 {
        (1u64 << self.level) + self.split
    }

    fn capacity(&self) -> u64 {
        self.buckets() * SLOTS_PER_BUCKET as u64
    }

    /// The bucket of value `v` (needs `v`'s bits up to `level`).
    #[inline]
    fn addr(&self, v: u64) -> u64 {
        let low = v & low_mask(self.level);
        if low < self.split {
            v & low_mask(self.level + 1)
        } else {
            low
        }
    }

    /// The parity bit of an entry refreshed at this level.
    #[inline]
    fn fresh_parity(&self) -> u16 {
        ((self.level + 1) & 1) as u16
    }

    #[inline]
    fn is_stale(&self, tag: u16) -> bool {
        (tag >> TAG_PARITY_SHIFT) & 1 != self.fresh_parity()
    }

    /// The tag of a fresh entry with fragment `frag` placed by value `v`.
    #[inline]
    fn fresh_tag(&self, frag: u16, v: u64) -> u16 {
        tag_for(frag, v, self.level + 1)
    }

    /// The bits an entry in bucket `b` with tag `tag` knows of its placing value, and how
    /// many (`level + 1` stale, `level + 2` fresh).
    fn known(&self, b: u64, tag: u16) -> (u64, u32) {
        let l = self.level;
        let mut v = b;
        if b < (1 << l) && b >= self.split {
            v |= (bit_of_tag(tag, l) as u64) << l;
        }
        if self.is_stale(tag) {
            return (v, l + 1);
        }
        (v | (bit_of_tag(tag, l + 1) as u64) << (l + 1), l + 2)
    }

    /// An entry in bucket `b` with tag `tag`: its other bucket and its tag there.
    fn other(&self, b: u64, tag: u16) -> (u64, u16) {
        let (v, n) = self.known(b, tag);
        let a = alt(tag >> FRAG_SHIFT);
        let j = n - 1;
        let flip = bit(a, j - 1) << ((j - 1) & 1) | bit(a, j) << (j & 1);
        (self.addr((v ^ a) & low_mask(n)), tag ^ flip)
    }

    #[inline]
    fn tag(&self, slot: usize) -> u16 {
        let p = SlotPos::of(slot);
        self.chunks[p.chunk].tags[p.tag_line].0[p.tag_at]
    }

    #[inline]
    fn get(&self, slot: usize) -> (u32, u16) {
        let p = SlotPos::of(slot);
        let c = &self.chunks[p.chunk];
        (c.units[p.unit_line].0[p.unit_at], c.tags[p.tag_line].0[p.tag_at])
    }

    #[inline]
    fn set(&mut self, slot: usize, units: u32, tag: u16) {
        debug_assert_eq!(units == 0, tag == 0, "a slot is empty exactly when its tag is 0");
        let p = SlotPos::of(slot);
        let c = &mut self.chunks[p.chunk];
        c.tags[p.tag_line].0[p.tag_at] = tag;
        c.units[p.unit_line].0[p.unit_at] = units;
    }

    /// The two buckets of a key (equal now and then).
    #[inline]
    fn buckets_of(&self, kh: KeyHash) -> [u64; 2] {
        [self.addr(kh.h), self.addr(kh.v2())]
    }

    /// The tags an entry of key hash `kh` may have in each of its buckets: fresh or stale,
    /// placed by `v1` (bucket 1) or `v2` (bucket 2); both values when the buckets coincide.
    /// Comparing whole tags filters on the fragment and on up to two more hash bits.
    #[inline]
    fn tags_of(&self, kh: KeyHash) -> ([u64; 2], [[u16; 4]; 2]) {
        let (v1, v2) = (kh.h, kh.v2());
        let (b1, b2) = (self.addr(v1), self.addr(v2));
        let l = self.level;
        let t = |v| [tag_for(kh.frag, v, l + 1), tag_for(kh.frag, v, l)];
        let ([f1, s1], [f2, s2]) = (t(v1), t(v2));
        if b1 == b2 {
            ([b1, b2], [[f1, s1, f2, s2]; 2])
        } else {
            ([b1, b2], [[f1, s1, f1, s1], [f2, s2, f2, s2]])
        }
    }

    /// The slots whose tag an entry of key hash `kh` may have (see `tags_of`).
    #[inline]
    fn matching_slots(&self, kh: KeyHash) -> impl Iterator<Item = usize> + '_ {
        let (buckets, tags) = self.tags_of(kh);
        let nbuckets = if buckets[0] == buckets[1] { 1 } else { 2 };
        buckets.into_iter().zip(tags).take(nbuckets).flat_map(move |(b, want)| {
            let first = b as usize * SLOTS_PER_BUCKET;
            (first..first + SLOTS_PER_BUCKET).filter(move |&slot| want.contains(&self.tag(slot)))
        })
    }

    fn find(&self, kh: KeyHash, out: &mut Vec<Candidate>) {
        for slot in self.matching_slots(kh) {
            let units = self.get(slot).0;
            out.push(Candidate { loc: Loc::Slot { slot, units }, units });
        }
        for (i, e) in self.stash.iter().enumerate() {
            if e.may_hold(kh) {
                out.push(Candidate { loc: Loc::Stash { i, units: e.units }, units: e.units });
            }
        }
    }

    fn try_put(&mut self, b: u64, units: u32, tag: u16) -> bool {
        for i in 0..SLOTS_PER_BUCKET {
            let slot = b as usize * SLOTS_PER_BUCKET + i;
            if self.tag(slot) == 0 {
                self.set(slot, units, tag);
                self.len += 1;
                return true;
            }
        }
        false
    }

    fn next_rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Insert a new entry (the caller checked the key is not present): one of its two
    /// buckets, else a cuckoo random walk, else the stash.
    fn insert(&mut self, kh: KeyHash, units: u32) {
        self.cold += cold_bit(units);
        self.place(kh.h, kh.frag, units);
    }

    /// Put a fresh entry placed by value `v` (bits up to `level + 1` known) in a slot, or
    /// the stash. Its log counts (`cold`) are the caller's.
    fn place(&mut self, v: u64, frag: u16, units: u32) {
        let [(b1, t1), (b2, t2)] = self.fresh_homes(v, frag);
        if self.try_put(b1, units, t1) || self.try_put(b2, units, t2) {
            return;
        }
        // A cuckoo walk with one step of lookahead: before displacing anyone, look for a
        // resident of the full bucket(s) whose other bucket has room (those buckets are
        // prefetched together, so a step costs about one memory latency). A plain random walk
        // is a chain of dependent misses at the load this table keeps: the buckets a level
        // has not split yet hold twice the keys of the split ones, so they are nearly all full.
        let mut homes = [(b1, t1), (b2, t2)];
        let mut nhomes = if b2 == b1 { 1 } else { 2 };
        let mut units = units;
        for _ in 0..KICKS_MAX {
            if self.move_one_resident(&homes[..nhomes], units) {
                return;
            }
            let (b, tag) = homes[(self.next_rand() % nhomes as u64) as usize];
            let slot = b as usize * SLOTS_PER_BUCKET + (self.next_rand() % SLOTS_PER_BUCKET as u64) as usize;
            let (vu, vt) = self.get(slot);
            self.set(slot, units, tag);
            units = vu;
            let (ob, ot) = self.other(b, vt);
            if self.try_put(ob, units, ot) {
                return;
            }
            (homes[0], nhomes) = ((ob, ot), 1);
        }
        let (b, tag) = homes[0];
        if self.is_stale(tag) {
            self.stale[log_of(units)] -= 1;
        }
        let e = self.stash_entry(b, tag, units);
        self.stash.push(e);
    }

    /// The two buckets of a fresh entry placed by value `v`, each with the tag it has there.
    #[inline]
    fn fresh_homes(&self, v: u64, frag: u16) -> [(u64, u16); 2] {
        let v2 = v ^ alt(frag);
        [(self.addr(v), self.fresh_tag(frag, v)), (self.addr(v2), self.fresh_tag(frag, v2))]
    }

    /// The stash entry of an entry in bucket `b` with tag `tag`: the hash bits it knows.
    fn stash_entry(&self, b: u64, tag: u16, units: u32) -> StashEntry {
        let (v, nbits) = self.known(b, tag);
        StashEntry { v, nbits, frag: tag >> FRAG_SHIFT, units }
    }

    /// The entry `units` may go in any of the full buckets `homes` (with the tag it would
    /// have there): move one of their residents to its other bucket if that has room, and
    /// put the entry in its slot. Returns whether it did.
    fn move_one_resident(&mut self, homes: &[(u64, u16)], units: u32) -> bool {
        let mut moves = [(0usize, 0u64, 0u16, 0u16); 2 * SLOTS_PER_BUCKET];
        let mut n = 0;
        for &(b, new_tag) in homes {
            for i in 0..SLOTS_PER_BUCKET {
                let slot = b as usize * SLOTS_PER_BUCKET + i;
                let (ob, ot) = self.other(b, self.tag(slot));
                if ob != b {
                    self.prefetch_bucket(ob, false);
                    moves[n] = (slot, ob, ot, new_tag);
                    n += 1;
                }
            }
        }
        for &(slot, ob, ot, new_tag) in &moves[..n] {
            let (vu, _) = self.get(slot);
            if self.try_put(ob, vu, ot) {
                self.set(slot, units, new_tag);
                return true;
            }
        }
        false
    }

    /// Ask the CPU to start loading the two buckets of `kh` (a hint: the index is far larger
    /// than the caches, so each probe is a DRAM miss; issuing the next few early overlaps
    /// them).
    #[inline]
    fn prefetch(&self, kh: KeyHash) {
        for b in self.buckets_of(kh) {
            self.prefetch_bucket(b, true);
        }
    }

    /// Prefetch the line of bucket `b`'s tags (and, with `units`, of its offsets).
    #[inline]
    fn prefetch_bucket(&self, b: u64, units: bool) {
        let p = SlotPos::of(b as usize * SLOTS_PER_BUCKET);
        if let Some(c) = self.chunks.get(p.chunk) {
            if let Some(line) = c.tags.get(p.tag_line) {
                prefetch_read(line.0.as_ptr());
            }
            if let Some(line) = c.units.get(p.unit_line).filter(|_| units) {
                prefetch_read(line.0.as_ptr() as *const u16);
            }
        }
    }

    /// The entry of key hash `kh` at exactly log position `units`, if the table holds it.
    fn find_exact(&self, kh: KeyHash, units: u32) -> Option<Where> {
        if let Some(slot) = self.matching_slots(kh).find(|&slot| self.get(slot).0 == units) {
            return Some(Where::Slot(slot));
        }
        self.stash.iter().position(|e| e.units == units && e.may_hold(kh)).map(Where::Stash)
    }

    /// Rewrite the tag of the entry in `slot`, which belongs to key hash `kh`, as fresh.
    fn refresh_slot(&mut self, slot: usize, kh: KeyHash) {
        let b = (slot / SLOTS_PER_BUCKET) as u64;
        let (units, tag) = self.get(slot);
        let v = if self.addr(kh.h) == b { kh.h } else { kh.v2() };
        debug_assert_eq!(self.addr(v), b, "an entry sits in neither of its key's buckets");
        if self.addr(v) != b {
            return;
        }
        if self.is_stale(tag) {
            self.stale[log_of(units)] -= 1;
        }
        self.set(slot, units, self.fresh_tag(kh.frag, v));
    }

    /// Point the stash entry `i`, which belongs to key hash `kh`, at `units` (and remember
    /// the whole hash: it can be placed again at any level).
    fn refresh_stash(&mut self, i: usize, kh: KeyHash, units: u32) {
        let Some(e) = self.stash.get_mut(i) else { return };
        let was = std::mem::replace(&mut e.units, units);
        (e.v, e.nbits) = (kh.h, 64);
        self.cold = self.cold - cold_bit(was) + cold_bit(units);
    }

    /// Point the slot entry of key hash `kh` at another record.
    fn update_slot(&mut self, slot: usize, kh: KeyHash, units: u32) {
        let (was, tag) = self.get(slot);
        if was == 0 || units == 0 {
            return;
        }
        self.cold = self.cold - cold_bit(was) + cold_bit(units);
        if self.is_stale(tag) {
            self.stale[log_of(was)] -= 1;
            self.stale[log_of(units)] += 1;
        }
        self.set(slot, units, tag);
        self.refresh_slot(slot, kh);
    }

    fn take_at(&mut self, w: Where) {
        match w {
            Where::Slot(slot) => self.clear_slot(slot),
            Where::Stash(i) => self.remove_stash(i),
        }
    }

    fn clear_slot(&mut self, slot: usize) {
        let (units, tag) = self.get(slot);
        if units != 0 {
            self.cold -= cold_bit(units);
            if self.is_stale(tag) {
                self.stale[log_of(units)] -= 1;
            }
            self.set(slot, 0, 0);
            self.len -= 1;
        }
    }

    fn remove_stash(&mut self, i: usize) {
        if i < self.stash.len() {
            let e = self.stash.swap_remove(i);
            self.cold -= cold_bit(e.units);
        }
    }

    /// Make room for bucket `buckets()` (the lines of 4 buckets at a time; see
    /// `Chunk::grow`).
    fn push_bucket(&mut self) {
        let b = self.buckets() as usize;
        let (chunk, in_chunk) = (b / CHUNK_BUCKETS, b % CHUNK_BUCKETS);
        if chunk == self.chunks.len() {
            self.chunks.push(Chunk::default());
        }
        if let Some(c) = self.chunks.get_mut(chunk) {
            if in_chunk >= c.buckets() {
                c.grow();
            }
        }
    }

    /// Split bucket `split` into itself and bucket `split + 2^level`, by bit `level` of each
    /// entry's placing value. Returns whether that ended the level (every entry is then
    /// stale: the caller starts a refresh scan). The caller checked that a level may end.
    fn split_one(&mut self) -> bool {
        let (l, p) = (self.level, self.split);
        let to = (1u64 << l) + p;
        debug_assert_eq!(to, self.buckets());
        self.push_bucket();
        for i in 0..SLOTS_PER_BUCKET {
            let slot = p as usize * SLOTS_PER_BUCKET + i;
            let (units, tag) = self.get(slot);
            if units != 0 && bit_of_tag(tag, l) == 1 {
                self.set(to as usize * SLOTS_PER_BUCKET + i, units, tag);
                self.set(slot, 0, 0);
            }
        }
        self.split += 1;
        if self.split & 63 == 0 && !self.stash.is_empty() {
            self.place_stash();
        }
        if self.split < 1 << l {
            return false;
        }
        debug_assert_eq!(self.stale, [0, 0], "a level ended with stale entries");
        #[cfg(debug_assertions)]
        self.assert_counts();
        self.level += 1;
        self.split = 0;
        let stash_cold: u64 = self.stash.iter().map(|e| cold_bit(e.units)).sum();
        let cold_slots = self.cold - stash_cold;
        self.stale = [self.len - cold_slots, cold_slots];
        self.place_stash();
        true
    }

    /// Insert again, with cuckoo displacement, the stash entries that know enough of their
    /// hash (the table changed since they failed; a new random walk usually succeeds).
    fn reinsert_stash(&mut self) {
        let l = self.level;
        let (retry, keep): (Vec<StashEntry>, Vec<StashEntry>) =
            std::mem::take(&mut self.stash).into_iter().partition(|e| e.placeable(l));
        self.stash = keep;
        for e in retry {
            self.place(e.v, e.frag, e.units);
        }
    }

    /// Move stash entries that know enough of their hash back into a bucket with room.
    fn place_stash(&mut self) {
        let mut i = 0;
        while i < self.stash.len() {
            let e = self.stash[i];
            if e.placeable(self.level) {
                let [(b1, t1), (b2, t2)] = self.fresh_homes(e.v, e.frag);
                if self.try_put(b1, e.units, t1) || self.try_put(b2, e.units, t2) {
                    self.stash.swap_remove(i);
                    continue;
                }
            }
            i += 1;
        }
    }

    /// Move every stale slot entry to the stash (the end of a refresh scan: their records
    /// could not be read). Returns how many moved.
    fn stash_stale(&mut self) -> u64 {
        if self.stale == [0, 0] {
            return 0;
        }
        let mut moved = 0;
        for slot in 0..self.capacity() as usize {
            let (units, tag) = self.get(slot);
            if units != 0 && self.is_stale(tag) {
                let e = self.stash_entry((slot / SLOTS_PER_BUCKET) as u64, tag, units);
                self.clear_slot(slot);
                self.cold += cold_bit(units);
                self.stash.push(e);
                moved += 1;
            }
        }
        debug_assert_eq!(self.stale, [0, 0]);
        moved
    }

    /// Recount entries, cold entries and stale entries from the slots: the running counts
    /// must never drift (checked at every level's end and refresh's end in debug builds).
    #[cfg(any(test, debug_assertions))]
    fn assert_counts(&self) {
        let (mut len, mut cold, mut stale) = (0, 0, [0u64; 2]);
        for slot in 0..self.capacity() as usize {
            let (units, tag) = self.get(slot);
            if units != 0 {
                len += 1;
                cold += cold_bit(units);
                if self.is_stale(tag) {
                    stale[log_of(units)] += 1;
                }
            }
        }
        cold += self.stash.iter().map(|e| cold_bit(e.units)).sum::<u64>();
        assert_eq!((len, cold, stale), (self.len, self.cold, self.stale), "index counts drifted");
    }

    fn bytes(&self) -> u64 {
        let lines: usize = self.chunks.iter().map(Chunk::bytes).sum();
        (lines
            + self.chunks.capacity() * std::mem::size_of::<Chunk>()
            + self.stash.capacity() * std::mem::size_of::<StashEntry>()) as u64
    }

    fn entries(&self) -> u64 {
        self.len + self.stash.len() as u64
    }

    /// Stash entries a split could place: not those that know too little of their hash
    /// (their records were unreadable; splitting would not help them).
    fn stash_to_place(&self) -> usize {
        if self.stash.len() <= STASH_ENTRIES_GROW_AT {
            return self.stash.len();
        }
        self.stash.iter().filter(|e| e.placeable(self.level)).count()
    }

    /// Whether a bucket should split now.
    fn wants_split(&self) -> bool {
        self.entries() as f64 > INDEX_LOAD_MAX * self.capacity() as f64
            || self.stash_to_place() > STASH_ENTRIES_GROW_AT
    }

    /// Whether the next split ends the level.
    fn split_ends_level(&self) -> bool {
        self.split + 1 == 1 << self.level
    }
}

/// Where a slot's tag and offset are: its chunk, and the line and index in it of each.
#[derive(Clone, Copy)]
struct SlotPos {
    chunk: usize,
    tag_line: usize,
    tag_at: usize,
    unit_line: usize,
    unit_at: usize,
}

impl SlotPos {
    #[inline]
    fn of(slot: usize) -> SlotPos {
        let in_chunk = slot % SLOTS_PER_CHUNK;
        let per_tag_line = BUCKETS_PER_TAG_LINE * SLOTS_PER_BUCKET;
        let per_unit_line = BUCKETS_PER_UNIT_LINE * SLOTS_PER_BUCKET;
        SlotPos {
            chunk: slot / SLOTS_PER_CHUNK,
            tag_line: in_chunk / per_tag_line,
            tag_at: in_chunk % per_tag_line,
            unit_line: in_chunk / per_unit_line,
            unit_at: in_chunk % per_unit_line,
        }
    }
}

/// Bit `k` of the placing value, from a tag that knows it.
#[inline]
fn bit_of_tag(tag: u16, k: u32) -> u16 {
    (tag >> (k & 1)) & 1
}

/// Which log a refresh scan walks: `scan[HOT]` the hot log, `scan[COLD]` the cold log.
const HOT: usize = 0;
const COLD: usize = 1;

/// The part of one log a refresh scan still has to read: records in `[pos, limit)` (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ScanRange {
    pos: u64,
    limit: u64,
}

/// A refresh scan in progress: the logs are read sequentially below the limits recorded
/// when the level started, and each put record's entry gets its next hash bit.
///
/// Invariant: an entry stays stale only while the record it points at lies below its log's
/// limit and has not been scanned (inserts and writes make their entries fresh).
#[derive(Clone, Debug)]
struct Refresh {
    scan: [ScanRange; 2],
    /// Scan bytes each record written owes, so that write-driven steps alone finish the scan
    /// after 3/4 of the entry count at the level's start of writes (a level lasts about as
    /// many inserts as there were entries when it started).
    per_write: u64,
    /// Scan bytes owed by writes so far, and scanned so far (by anyone); not persisted.
    due: u64,
    done: u64,
    /// How far behind the scan may be before writes scan (`write_slack`).
    slack: u64,
}

impl Refresh {
    fn new(scan: [ScanRange; 2], per_write: u64) -> Refresh {
        let slack = write_slack(scan.iter().map(|s| s.limit.saturating_sub(s.pos)).sum());
        Refresh { scan, per_write, due: 0, done: 0, slack }
    }
}

/// A range of a log for a growth step to scan (`Index::growth_work`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ScanJob {
    /// Which refresh this job belongs to (a stale job's results are dropped).
    pub gen: u64,
    pub cold: bool,
    pub pos: u64,
    pub limit: u64,
}

/// What index growth needs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GrowthWork {
    /// No refresh scan running.
    Idle,
    /// Read these records and hand their key hashes to `apply_scan`.
    Scan(ScanJob),
    /// No stale entry is left, or the scans are done: `finish_migration`.
    Finish,
}

/// The whole index: the table plus, after a level started, its refresh scan.
#[derive(Clone, Debug)]
pub(crate) struct Index {
    cur: Table,
    refresh: Option<Refresh>,
    /// Refresh scans started by this index (tags scan jobs).
    gen: u64,
}

impl Index {
    pub fn for_keys(keys: u64) -> Index {
        Index { cur: Table::for_keys(keys), refresh: None, gen: 0 }
    }

    /// Live entries (one per live key).
    pub fn live(&self) -> u64 {
        self.cur.entries()
    }

    /// DRAM used by the index, from the sizes of its allocations.
    pub fn bytes(&self) -> u64 {
        self.cur.bytes()
    }

    /// Slots of the table.
    pub fn capacity(&self) -> u64 {
        self.cur.capacity()
    }

    /// Entries in the stash.
    pub fn stash_len(&self) -> u64 {
        self.cur.stash.len() as u64
    }

    /// Whether a refresh scan is running.
    pub fn is_migrating(&self) -> bool {
        self.refresh.is_some()
    }

    /// Start loading the buckets `kh` will probe (see `Table::prefetch`).
    pub fn prefetch(&self, kh: KeyHash) {
        self.cur.prefetch(kh);
    }

    /// All entries whose fragment matches, slots first.
    pub fn find(&self, kh: KeyHash, out: &mut Vec<Candidate>) {
        self.cur.find(kh, out);
    }

    /// Where the entry `loc` named (when it was found) is now. A location is only a hint: an
    /// insert may have displaced the entry or split its bucket since. The entry itself is
    /// identified by its key hash and log position (one entry per position).
    fn resolve(&self, loc: Loc, kh: KeyHash) -> Option<Loc> {
        let t = &self.cur;
        let holds = match loc {
            Loc::Slot { slot, units } => slot < t.capacity() as usize && t.get(slot).0 == units,
            Loc::Stash { i, units } => t.stash.get(i).is_some_and(|e| e.units == units),
        };
        if holds {
            return Some(loc);
        }
        let mut out = Vec::new();
        self.find(kh, &mut out);
        out.into_iter().find(|c| c.units == loc.units()).map(|c| c.loc)
    }

    /// Point the entry of key hash `kh` found at `loc` at a new record.
    pub fn update(&mut self, loc: Loc, kh: KeyHash, units: u32) {
        match self.resolve(loc, kh) {
            Some(Loc::Slot { slot, .. }) => self.cur.update_slot(slot, kh, units),
            Some(Loc::Stash { i, .. }) => self.cur.refresh_stash(i, kh, units),
            // Cannot happen (writers are serialized and growth only moves entries); never
            // lose the key if it did.
            None => self.cur.insert(kh, units),
        }
    }

    /// Remove the entry of key hash `kh` found at `loc` (delete).
    pub fn remove(&mut self, loc: Loc, kh: KeyHash) {
        match self.resolve(loc, kh) {
            Some(Loc::Slot { slot, .. }) => self.cur.take_at(Where::Slot(slot)),
            Some(Loc::Stash { i, .. }) => self.cur.take_at(Where::Stash(i)),
            None => {}
        }
    }

    /// Insert a key that is not present, then split buckets while the table is over its
    /// load. When a split ends a level, a refresh scan starts, of the logs below `limits`
    /// (hot, cold: byte offsets below which every record the index points at lies); returns
    /// whether one started. A level ends only after its own refresh scan finished: until
    /// then the last bucket of the level does not split (writes then scan, see `owe`).
    pub fn insert(&mut self, kh: KeyHash, units: u32, limits: [u64; 2]) -> bool {
        self.cur.insert(kh, units);
        let mut started = false;
        for _ in 0..SPLITS_PER_INSERT_MAX {
            if self.cur.stash_to_place() > STASH_ENTRIES_GROW_AT {
                self.cur.reinsert_stash();
            }
            if !self.cur.wants_split() || (self.cur.split_ends_level() && self.refresh.is_some()) {
                break;
            }
            if self.cur.split_one() {
                started |= self.start_refresh(limits);
            }
        }
        started
    }

    fn start_refresh(&mut self, limits: [u64; 2]) -> bool {
        if self.cur.stale == [0, 0] {
            return false;
        }
        let scan =
            limits.map(|limit| ScanRange { pos: LOG_HEADER_BYTES, limit: limit.max(LOG_HEADER_BYTES) });
        let bytes: u64 = scan.iter().map(|s| s.limit - s.pos).sum();
        let per_write = bytes.saturating_mul(4).div_ceil(3 * self.cur.len.max(1));
        self.gen += 1;
        self.refresh = Some(Refresh::new(scan, per_write));
        true
    }

    /// Account `records` written during a refresh; returns the scan bytes the writes are
    /// ahead of the scan when that is more than the slack (else 0, as when not refreshing):
    /// what the writer should scan itself.
    pub fn owe(&mut self, records: u64) -> u64 {
        match &mut self.refresh {
            Some(r) => {
                r.due = r.due.saturating_add(r.per_write.saturating_mul(records));
                let behind = r.due.saturating_sub(r.done);
                if behind >= r.slack {
                    behind
                } else {
                    0
                }
            }
            None => 0,
        }
    }

    /// Stale entries still pointing into a log that is being replaced: after a hot
    /// compaction moved (and so refreshed) every hot-log entry of this index, this is 0 and
    /// the hot-log scan range is closed (it names positions of the replaced log).
    pub fn hot_log_replaced(&mut self) -> u64 {
        let Some(r) = &mut self.refresh else { return 0 };
        let left = self.cur.stale[HOT];
        if left == 0 {
            r.scan[HOT].pos = r.scan[HOT].limit;
        }
        left
    }

    /// The next piece of growth work.
    pub fn growth_work(&self) -> GrowthWork {
        let Some(r) = &self.refresh else { return GrowthWork::Idle };
        for (log, s) in r.scan.iter().enumerate() {
            if self.cur.stale[log] > 0 && s.pos < s.limit {
                let (pos, limit) = (s.pos, s.limit);
                return GrowthWork::Scan(ScanJob { gen: self.gen, cold: log == COLD, pos, limit });
            }
        }
        GrowthWork::Finish
    }

    /// Results of scanning `[job.pos, upto)`: `found` holds the key hash and position
    /// (offset units, with the cold bit) of each put record read. The entry at exactly that
    /// position belongs to that record's key: it is refreshed. Returns how many entries were.
    pub fn apply_scan(&mut self, job: &ScanJob, upto: u64, found: &[(KeyHash, u32)]) -> u64 {
        if job.gen != self.gen {
            return 0;
        }
        let Some(r) = self.refresh.as_mut() else { return 0 };
        let s = &mut r.scan[if job.cold { COLD } else { HOT }];
        r.done = r.done.saturating_add(upto.saturating_sub(s.pos.max(job.pos)));
        s.pos = s.pos.max(upto.min(s.limit));
        let mut refreshed = 0;
        for (i, &(kh, units)) in found.iter().enumerate() {
            if let Some(&(next, _)) = found.get(i + PREFETCH_AHEAD) {
                self.cur.prefetch(next);
            }
            match self.cur.find_exact(kh, units) {
                Some(Where::Slot(slot)) => self.cur.refresh_slot(slot, kh),
                Some(Where::Stash(i)) => self.cur.refresh_stash(i, kh, units),
                None => continue,
            }
            refreshed += 1;
        }
        refreshed
    }

    /// End the refresh scan: entries it did not refresh (their records could not be read)
    /// go to the stash, keeping the hash bits they know (see `StashEntry`). Returns how many.
    pub fn finish_migration(&mut self) -> u64 {
        if self.refresh.take().is_none() {
            return 0;
        }
        #[cfg(debug_assertions)]
        self.cur.assert_counts();
        self.cur.stash_stale()
    }
}

/// Checkpoint image of the index (format in docs/FORMAT.md).
pub(crate) mod image;

#[cfg(test)]
mod tests;
