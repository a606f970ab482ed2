//! The in-DRAM hash index: key fragment + log offset per slot, bucketized cuckoo hashing.
//!
//! Slot = 6 bytes: a 32-bit log offset in `OFFSET_UNIT`s (0 = empty: offset 0 is the log
//! header, so no valid bit is needed) and a 16-bit key fragment. A bucket holds 4 slots.
//! A key has two candidate buckets: `b1 = fastrange(mix(low 48 bits of key id), B)` and
//! `b2 = alt(b1, fragment)` (partial-key cuckoo hashing: the alternate bucket is computed
//! from the bucket and the fragment alone, so displacing an entry needs no log read).
//! The table runs up to `INDEX_MAX_LOAD`; entries a cuckoo walk cannot place go to a small
//! stash, which also triggers growth.
//!
//! Growth is incremental: a new table of twice the buckets becomes current and the old one
//! is migrated. A slot does not hold its key's hash, so a migrated entry's new bucket needs
//! the key: instead of reading it from the log per entry (a random read each), growth
//! **scans the logs sequentially** below limits recorded when growth started, and for each
//! put record moves the old entry at exactly that record's position (if any) into the new
//! table (`growth_work` / `apply_scan`; the store runs the scan, see `Inner::growth_step`).
//! Writes that touch an entry still in the old table move or remove it themselves (they
//! know the key). Entries only ever leave the old table, so when the scans end it is empty
//! but for entries whose records could not be read, which go to the stash
//! (`finish_migration`). Lookups probe both tables until then. No operation ever rehashes the
//! whole table.

use crate::limits::{COLD_UNITS_BIT, INDEX_MAX_LOAD, INDEX_SIZING_LOAD, LOG_HEADER_BYTES, SLOTS_PER_BUCKET};

/// Words (u16) per slot: offset low, offset high, fragment.
const WORDS_PER_SLOT: usize = 3;
const WORDS_PER_BUCKET: usize = WORDS_PER_SLOT * SLOTS_PER_BUCKET;
/// Cuckoo displacements tried before an entry goes to the stash.
const MAX_KICKS: usize = 256;
/// A growing table gets this many times the buckets.
const GROWTH_FACTOR: u64 = 2;
/// Entries ahead whose buckets a batch loop prefetches.
pub(crate) const PREFETCH_AHEAD: usize = 8;
/// Writes scan the log themselves only when the growth scan is this far behind their share
/// (1/8 of the scan for small logs); normally the background migrator keeps it ahead.
const WRITE_SLACK_BYTES: u64 = 4 << 20;

fn write_slack(scan_bytes: u64) -> u64 {
    (scan_bytes / 8).clamp(1, WRITE_SLACK_BYTES)
}
/// Stash entries tolerated before the table grows (each costs a compare per lookup).
const STASH_GROW_AT: usize = 16;
/// Smallest table (buckets).
const MIN_BUCKETS: u64 = 64;
/// Stash bucket value meaning "bucket unknown": matches on fragment alone. Only read from
/// version 5 checkpoints (later ones keep an unplaced entry's bucket, see `StashEntry`).
const ANY_BUCKET: u64 = u64::MAX;

/// What the index needs of a key: its primary hash and its fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyHash {
    pub h: u64,
    pub frag: u16,
}

impl KeyHash {
    /// Bucket choice from the low 48 bits of the key id (mixed), fragment from the top 16
    /// bits of the low 64 (disjoint from the bucket bits). Never from the high bits: they
    /// place the key on the ring, so the keys of one datastore (one ring range) share them and
    /// would crowd into a band of buckets (the table then grew at 43–68 % load).
    pub fn of(key: &[u8]) -> KeyHash {
        let low = fawn_ring::key_id(key).low64();
        KeyHash { h: mix(low & 0x0000_FFFF_FFFF_FFFF), frag: (low >> 48) as u16 }
    }
}

/// Where a candidate entry lives (valid while the caller holds the writer lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    Slot { old: bool, slot: usize, units: u32 },
    Stash { old: bool, i: usize, units: u32 },
}

impl Loc {
    /// The log position the entry held when it was found.
    fn units(self) -> u32 {
        match self {
            Loc::Slot { units, .. } | Loc::Stash { units, .. } => units,
        }
    }
}

/// An entry's place inside one table.
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

/// A fragment match: a log offset (in units) to read and compare keys at.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate {
    pub loc: Loc,
    pub units: u32,
}

/// A stash entry. `origin` 0: `bucket` is one of the entry's two buckets in this table.
/// `origin` n > 0: an entry a growth scan could not place (its record was unreadable), so
/// its bucket in this table is unknown; `bucket` is one of its two buckets in the table of
/// n buckets it came from (a key can own it only if its primary bucket there is `bucket` or
/// `bucket`'s alternate). Keeping that, rather than matching on the fragment alone, keeps
/// the unreadable record out of the way of all but ~2 / (n × 65536) of the other keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StashEntry {
    bucket: u64,
    origin: u64,
    frag: u16,
    units: u32,
}

impl StashEntry {
    /// Whether a key with hash `kh`, whose buckets in this table are `b1` and `b2`, may own
    /// this entry.
    #[inline]
    fn may_hold(&self, kh: KeyHash, b1: u64, b2: u64) -> bool {
        if self.frag != kh.frag {
            return false;
        }
        match self.origin {
            0 => self.bucket == b1 || self.bucket == b2 || self.bucket == ANY_BUCKET,
            n => {
                let p = fastrange(kh.h, n);
                p == self.bucket || p == alt_in(n, self.bucket, self.frag)
            }
        }
    }

    /// An entry of a table of `buckets` buckets that no scan could place, for the stash of
    /// the next table.
    fn unplaced(self, buckets: u64) -> StashEntry {
        if self.origin != 0 || self.bucket == ANY_BUCKET {
            self
        } else {
            StashEntry { origin: buckets, ..self }
        }
    }
}

#[inline]
fn fastrange(x: u64, n: u64) -> u64 {
    ((x as u128 * n as u128) >> 64) as u64
}

/// The other bucket of an entry in bucket `b` of a table of `buckets` buckets with fragment
/// `frag` (an involution).
#[inline]
fn alt_in(buckets: u64, b: u64, frag: u16) -> u64 {
    let hf = fastrange(mix(frag as u64), buckets);
    (hf + buckets - b) % buckets
}

#[inline]
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One cuckoo table.
#[derive(Clone, Debug)]
pub(crate) struct Table {
    words: Vec<u16>,
    buckets: u64,
    len: u64,
    stash: Vec<StashEntry>,
    /// Entries (slots and stash) pointing into the cold log.
    cold: u64,
    rng: u64,
}

impl Table {
    pub fn with_buckets(buckets: u64) -> Table {
        let buckets = buckets.max(MIN_BUCKETS);
        let words = vec![0u16; buckets as usize * WORDS_PER_BUCKET];
        Table { words, buckets, len: 0, stash: Vec::new(), cold: 0, rng: 0x2545_F491_4F6C_DD1D }
    }

    pub fn for_keys(keys: u64) -> Table {
        let slots = (keys as f64 / INDEX_SIZING_LOAD).ceil() as u64;
        Table::with_buckets(slots.div_ceil(SLOTS_PER_BUCKET as u64))
    }

    fn capacity(&self) -> u64 {
        self.buckets * SLOTS_PER_BUCKET as u64
    }

    fn primary(&self, h: u64) -> u64 {
        fastrange(h, self.buckets)
    }

    /// The other bucket of an entry in bucket `b` with fragment `frag` (an involution).
    fn alt(&self, b: u64, frag: u16) -> u64 {
        alt_in(self.buckets, b, frag)
    }

    #[inline]
    fn get(&self, slot: usize) -> (u32, u16) {
        let w = &self.words[slot * WORDS_PER_SLOT..slot * WORDS_PER_SLOT + WORDS_PER_SLOT];
        (w[0] as u32 | (w[1] as u32) << 16, w[2])
    }

    #[inline]
    fn set(&mut self, slot: usize, units: u32, frag: u16) {
        let w = &mut self.words[slot * WORDS_PER_SLOT..slot * WORDS_PER_SLOT + WORDS_PER_SLOT];
        w[0] = units as u16;
        w[1] = (units >> 16) as u16;
        w[2] = frag;
    }

    fn find(&self, kh: KeyHash, old: bool, out: &mut Vec<Candidate>) {
        let b1 = self.primary(kh.h);
        let b2 = self.alt(b1, kh.frag);
        for b in [b1, b2] {
            for i in 0..SLOTS_PER_BUCKET {
                let slot = b as usize * SLOTS_PER_BUCKET + i;
                let (units, frag) = self.get(slot);
                if units != 0 && frag == kh.frag {
                    out.push(Candidate { loc: Loc::Slot { old, slot, units }, units });
                }
            }
            if b2 == b1 {
                break;
            }
        }
        for (i, e) in self.stash.iter().enumerate() {
            if e.may_hold(kh, b1, b2) {
                out.push(Candidate { loc: Loc::Stash { old, i, units: e.units }, units: e.units });
            }
        }
    }

    fn try_put(&mut self, b: u64, units: u32, frag: u16) -> bool {
        for i in 0..SLOTS_PER_BUCKET {
            let slot = b as usize * SLOTS_PER_BUCKET + i;
            if self.get(slot).0 == 0 {
                self.set(slot, units, frag);
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

    /// Insert a new entry (the caller checked the key is not present).
    fn insert(&mut self, kh: KeyHash, units: u32) {
        let b1 = self.primary(kh.h);
        self.insert_at(b1, kh.frag, units);
    }

    /// Ask the CPU to start loading the two buckets of `kh` (a hint: the index is far larger
    /// than the caches, so each probe is a DRAM miss; issuing the next few early overlaps
    /// them).
    #[inline]
    fn prefetch(&self, kh: KeyHash) {
        let b1 = self.primary(kh.h);
        let b2 = self.alt(b1, kh.frag);
        for b in [b1, b2] {
            let at = b as usize * WORDS_PER_BUCKET;
            if let Some(w) = self.words.get(at..at + WORDS_PER_BUCKET) {
                prefetch_read(w.as_ptr());
                prefetch_read(w[WORDS_PER_BUCKET - 1..].as_ptr());
            }
        }
    }

    /// The entry of key hash `kh` at exactly log position `units`, if this table holds it.
    fn find_exact(&self, kh: KeyHash, units: u32) -> Option<Where> {
        let b1 = self.primary(kh.h);
        let b2 = self.alt(b1, kh.frag);
        for b in [b1, b2] {
            for i in 0..SLOTS_PER_BUCKET {
                let slot = b as usize * SLOTS_PER_BUCKET + i;
                if self.get(slot) == (units, kh.frag) {
                    return Some(Where::Slot(slot));
                }
            }
        }
        self.stash.iter().position(|e| e.units == units && e.may_hold(kh, b1, b2)).map(Where::Stash)
    }

    fn take_at(&mut self, w: Where) {
        match w {
            Where::Slot(slot) => self.clear_slot(slot),
            Where::Stash(i) => self.remove_stash(i),
        }
    }

    /// Insert an entry whose bucket pair contains `b`: cuckoo random walk, then stash.
    fn insert_at(&mut self, b1: u64, frag: u16, units: u32) {
        self.cold += cold_bit(units);
        let b2 = self.alt(b1, frag);
        if self.try_put(b1, units, frag) || self.try_put(b2, units, frag) {
            return;
        }
        let (mut b, mut frag, mut units) = (if self.next_rand() & 1 == 0 { b1 } else { b2 }, frag, units);
        for _ in 0..MAX_KICKS {
            let i = (self.next_rand() % SLOTS_PER_BUCKET as u64) as usize;
            let slot = b as usize * SLOTS_PER_BUCKET + i;
            let (vu, vf) = self.get(slot);
            self.set(slot, units, frag);
            (units, frag) = (vu, vf);
            b = self.alt(b, frag);
            if self.try_put(b, units, frag) {
                return;
            }
        }
        self.stash.push(StashEntry { bucket: b, origin: 0, frag, units });
    }

    fn clear_slot(&mut self, slot: usize) {
        let units = self.get(slot).0;
        if units != 0 {
            self.cold -= cold_bit(units);
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

    fn push_stash(&mut self, e: StashEntry) {
        self.cold += cold_bit(e.units);
        self.stash.push(e);
    }

    /// Point an occupied slot at another record.
    fn set_units(&mut self, slot: usize, units: u32) {
        let (was, frag) = self.get(slot);
        if was != 0 && units != 0 {
            self.cold = self.cold - cold_bit(was) + cold_bit(units);
            self.set(slot, units, frag);
        }
    }

    fn set_stash_units(&mut self, i: usize, units: u32) {
        if let Some(e) = self.stash.get_mut(i) {
            let was = std::mem::replace(&mut e.units, units);
            self.cold = self.cold - cold_bit(was) + cold_bit(units);
        }
    }

    fn bytes(&self) -> u64 {
        (self.words.capacity() * std::mem::size_of::<u16>()
            + self.stash.capacity() * std::mem::size_of::<StashEntry>()) as u64
    }

    fn entries(&self) -> u64 {
        self.len + self.stash.len() as u64
    }

    /// Stash entries a growth could place: not those a growth scan already failed to
    /// place (their records are unreadable, growing again would not help).
    fn stash_to_place(&self) -> usize {
        if self.stash.len() <= STASH_GROW_AT {
            return self.stash.len();
        }
        self.stash.iter().filter(|e| e.origin == 0 && e.bucket != ANY_BUCKET).count()
    }
}

/// Which log a growth scan walks: `scan[HOT]` the hot log, `scan[COLD]` the cold log.
const HOT: usize = 0;
const COLD: usize = 1;

/// The part of one log a growth scan still has to read: records in `[pos, limit)` (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ScanRange {
    pos: u64,
    limit: u64,
}

/// An old table being migrated into the current one by a sequential scan of the logs.
///
/// Invariant: entries only ever leave the old table (inserts go to the current table; a
/// write that updates or deletes a key whose entry is still here moves or removes it), so
/// every entry left points below its log's scan limit, at a record the scan has not passed
/// yet (or at one it could not read: those are stashed when the scan ends).
#[derive(Clone, Debug)]
struct Migration {
    table: Table,
    scan: [ScanRange; 2],
    /// Scan bytes each record written owes, so that write-driven steps alone finish the scan
    /// after 3/4 of the old table's entry count of writes (the new table is then ~70 % full).
    per_write: u64,
    /// Scan bytes owed by writes so far, and scanned so far (by anyone); not persisted.
    due: u64,
    done: u64,
    /// How far behind the scan may be before writes scan (`write_slack`).
    slack: u64,
}

impl Migration {
    /// Old-table entries pointing into each log (`[HOT, COLD]`).
    fn left(&self) -> [u64; 2] {
        let cold = self.table.cold;
        [self.table.entries() - cold, cold]
    }
}

/// A range of a log for a growth step to scan (`Index::growth_work`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ScanJob {
    /// Which migration this job belongs to (a stale job's results are dropped).
    pub gen: u64,
    pub cold: bool,
    pub pos: u64,
    pub limit: u64,
}

/// What index growth needs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GrowthWork {
    /// Not migrating.
    Idle,
    /// Read these records and hand their key hashes to `apply_scan`.
    Scan(ScanJob),
    /// The old table is empty, or both scans are done: `finish_migration`.
    Finish,
}

/// The whole index: the current table plus, while growing, the old one.
#[derive(Clone, Debug)]
pub(crate) struct Index {
    cur: Table,
    old: Option<Migration>,
    /// Migrations started by this index (tags scan jobs).
    gen: u64,
}

impl Index {
    pub fn for_keys(keys: u64) -> Index {
        Index { cur: Table::for_keys(keys), old: None, gen: 0 }
    }

    /// Live entries (one per live key).
    pub fn live(&self) -> u64 {
        self.cur.entries() + self.old.as_ref().map_or(0, |m| m.table.entries())
    }

    /// DRAM used by the index, from the sizes of its allocations.
    pub fn bytes(&self) -> u64 {
        self.cur.bytes() + self.old.as_ref().map_or(0, |m| m.table.bytes())
    }

    /// Slots of the current table.
    pub fn capacity(&self) -> u64 {
        self.cur.capacity()
    }

    pub fn is_migrating(&self) -> bool {
        self.old.is_some()
    }

    /// Start loading the buckets `kh` will probe (see `Table::prefetch`).
    pub fn prefetch(&self, kh: KeyHash) {
        self.cur.prefetch(kh);
        if let Some(m) = &self.old {
            m.table.prefetch(kh);
        }
    }

    /// All entries whose fragment matches, current table first.
    pub fn find(&self, kh: KeyHash, out: &mut Vec<Candidate>) {
        self.cur.find(kh, false, out);
        if let Some(m) = &self.old {
            m.table.find(kh, true, out);
        }
    }

    fn table(&self, old: bool) -> Option<&Table> {
        if old {
            self.old.as_ref().map(|m| &m.table)
        } else {
            Some(&self.cur)
        }
    }

    fn table_mut(&mut self, old: bool) -> Option<&mut Table> {
        if old {
            self.old.as_mut().map(|m| &mut m.table)
        } else {
            Some(&mut self.cur)
        }
    }

    /// Where the entry `loc` named (when it was found) is now. A location is only a hint: a
    /// growth step (which does not take the writer lock) may have moved the entry to the
    /// current table, or displaced it within it, since. The entry itself is identified by
    /// its key hash and log position (one entry per position).
    fn resolve(&self, loc: Loc, kh: KeyHash) -> Option<Loc> {
        let holds = match loc {
            Loc::Slot { old, slot, units } => {
                self.table(old).is_some_and(|t| slot < t.capacity() as usize && t.get(slot).0 == units)
            }
            Loc::Stash { old, i, units } => {
                self.table(old).and_then(|t| t.stash.get(i)).is_some_and(|e| e.units == units)
            }
        };
        if holds {
            return Some(loc);
        }
        let mut out = Vec::new();
        self.find(kh, &mut out);
        out.into_iter().find(|c| c.units == loc.units()).map(|c| c.loc)
    }

    /// Take the entry at `loc` out of its table.
    fn take(&mut self, loc: Loc) {
        match loc {
            Loc::Slot { old, slot, .. } => {
                if let Some(t) = self.table_mut(old) {
                    t.clear_slot(slot);
                }
            }
            Loc::Stash { old, i, .. } => {
                if let Some(t) = self.table_mut(old) {
                    t.remove_stash(i);
                }
            }
        }
    }

    /// Point the entry of key hash `kh` found at `loc` at a new record. An entry still in
    /// the old table moves to the current one (its bucket there is known from `kh`).
    pub fn update(&mut self, loc: Loc, kh: KeyHash, units: u32) {
        match self.resolve(loc, kh) {
            Some(l @ (Loc::Slot { old: true, .. } | Loc::Stash { old: true, .. })) => {
                self.take(l);
                self.cur.insert(kh, units);
            }
            Some(Loc::Slot { slot, .. }) => self.cur.set_units(slot, units),
            Some(Loc::Stash { i, .. }) => self.cur.set_stash_units(i, units),
            // Cannot happen (writers are serialized and growth only moves entries); never
            // lose the key if it did.
            None => self.cur.insert(kh, units),
        }
    }

    /// Remove the entry of key hash `kh` found at `loc` (delete).
    pub fn remove(&mut self, loc: Loc, kh: KeyHash) {
        if let Some(l) = self.resolve(loc, kh) {
            self.take(l);
        }
    }

    /// Insert a key that is not present. When the table is full, growth starts: a table
    /// of `GROWTH_FACTOR` times the buckets becomes current and the old one is migrated by
    /// scanning the logs below `limits` (hot, cold: byte offsets below which every record
    /// the index points at lies). Returns whether growth started.
    pub fn insert(&mut self, kh: KeyHash, units: u32, limits: [u64; 2]) -> bool {
        self.cur.insert(kh, units);
        let full = self.cur.entries() as f64 > INDEX_MAX_LOAD * self.cur.capacity() as f64;
        if self.old.is_some() || !(full || self.cur.stash_to_place() > STASH_GROW_AT) {
            return false;
        }
        // A batch may have overfilled the table (into the stash) while the last migration
        // was still running: then size for twice the entries.
        let mut buckets = self.cur.buckets * GROWTH_FACTOR;
        if self.cur.entries() > self.cur.capacity() {
            buckets = buckets.max(Table::for_keys(self.cur.entries() * GROWTH_FACTOR).buckets);
        }
        let bigger = Table::with_buckets(buckets);
        let table = std::mem::replace(&mut self.cur, bigger);
        let scan =
            limits.map(|limit| ScanRange { pos: LOG_HEADER_BYTES, limit: limit.max(LOG_HEADER_BYTES) });
        let bytes: u64 = scan.iter().map(|s| s.limit - s.pos).sum();
        let per_write = bytes.saturating_mul(4).div_ceil(3 * table.entries().max(1));
        self.gen += 1;
        let slack = write_slack(bytes);
        self.old = Some(Migration { table, scan, per_write, due: 0, done: 0, slack });
        true
    }

    /// Account `records` written during a migration; returns the scan bytes the writes are
    /// ahead of the scan when that is more than the slack (else 0, as when not migrating):
    /// what the writer should scan itself.
    pub fn owe(&mut self, records: u64) -> u64 {
        match &mut self.old {
            Some(m) => {
                m.due = m.due.saturating_add(m.per_write.saturating_mul(records));
                let behind = m.due.saturating_sub(m.done);
                if behind >= m.slack {
                    behind
                } else {
                    0
                }
            }
            None => 0,
        }
    }

    /// Old-table entries still pointing into a log that is being replaced: after a hot
    /// compaction moved every hot-log entry of this index to the cold log, this is 0 and
    /// the hot-log scan range is closed (it names positions of the replaced log).
    pub fn hot_log_replaced(&mut self) -> u64 {
        let Some(m) = &mut self.old else { return 0 };
        let left = m.left()[HOT];
        if left == 0 {
            m.scan[HOT].pos = m.scan[HOT].limit;
        }
        left
    }

    /// The next piece of growth work.
    pub fn growth_work(&self) -> GrowthWork {
        let Some(m) = &self.old else { return GrowthWork::Idle };
        let left = m.left();
        for (log, s) in m.scan.iter().enumerate() {
            if left[log] > 0 && s.pos < s.limit {
                let (pos, limit) = (s.pos, s.limit);
                return GrowthWork::Scan(ScanJob { gen: self.gen, cold: log == COLD, pos, limit });
            }
        }
        GrowthWork::Finish
    }

    /// Results of scanning `[job.pos, upto)`: `found` holds the key hash and position
    /// (offset units, with the cold bit) of each put record read. An old-table entry at
    /// exactly that position belongs to that record's key: it moves to the current table.
    /// Returns how many entries moved.
    pub fn apply_scan(&mut self, job: &ScanJob, upto: u64, found: &[(KeyHash, u32)]) -> u64 {
        if job.gen != self.gen {
            return 0;
        }
        let Some(m) = self.old.as_mut() else { return 0 };
        let s = &mut m.scan[if job.cold { COLD } else { HOT }];
        m.done = m.done.saturating_add(upto.saturating_sub(s.pos.max(job.pos)));
        s.pos = s.pos.max(upto.min(s.limit));
        let mut moved = 0;
        for (i, &(kh, units)) in found.iter().enumerate() {
            if let Some(&(next, _)) = found.get(i + PREFETCH_AHEAD) {
                m.table.prefetch(next);
                self.cur.prefetch(next);
            }
            if let Some(w) = m.table.find_exact(kh, units) {
                m.table.take_at(w);
                self.cur.insert(kh, units);
                moved += 1;
            }
        }
        moved
    }

    /// End the migration: entries the scan did not place (their records could not be read)
    /// go to the current table's stash, keeping the bucket they had in the old table (see
    /// `StashEntry`: they match the keys whose bucket pair there holds it). Returns the
    /// emptied old table (freeing tens of MB takes milliseconds: the caller frees it outside
    /// the locks) and how many entries were stashed that way.
    pub fn finish_migration(&mut self) -> (Option<Table>, u64) {
        let Some(m) = self.old.take() else { return (None, 0) };
        let t = &m.table;
        let mut left = 0;
        for slot in 0..t.capacity() as usize {
            let (units, frag) = t.get(slot);
            if units != 0 {
                let bucket = (slot / SLOTS_PER_BUCKET) as u64;
                self.cur.push_stash(StashEntry { bucket, origin: t.buckets, frag, units });
                left += 1;
            }
        }
        for e in &t.stash {
            self.cur.push_stash(e.unplaced(t.buckets));
            left += 1;
        }
        (Some(m.table), left)
    }
}

/// Checkpoint image of the index (format in docs/FORMAT.md).
pub(crate) mod image {
    use super::*;
    use crate::limits::OFFSET_UNIT;

    fn put_table(t: &Table, out: &mut Vec<u8>) {
        out.extend_from_slice(&t.buckets.to_le_bytes());
        out.extend_from_slice(&(t.stash.len() as u64).to_le_bytes());
        out.reserve(t.words.len() * 2);
        for w in &t.words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        for e in &t.stash {
            out.extend_from_slice(&e.bucket.to_le_bytes());
            out.extend_from_slice(&e.origin.to_le_bytes());
            out.extend_from_slice(&e.units.to_le_bytes());
            out.extend_from_slice(&e.frag.to_le_bytes());
        }
    }

    /// Serialize: current table, then a flag (0 = not migrating, 1 = migrating) and, when
    /// migrating, the scan state (hot pos, hot limit, cold pos, cold limit, bytes per
    /// write) and the old table.
    pub fn write(index: &Index, out: &mut Vec<u8>) {
        put_table(&index.cur, out);
        match &index.old {
            None => out.extend_from_slice(&0u64.to_le_bytes()),
            Some(m) => {
                out.extend_from_slice(&1u64.to_le_bytes());
                for (s, left) in m.scan.iter().zip(m.left()) {
                    // A log no old-table entry points into needs no more scanning: its range
                    // is written as done, so the image names no positions in it (a hot
                    // compaction may have replaced that log since growth started, or open
                    // cut a torn tail below the range's limit).
                    let pos = if left == 0 { s.limit } else { s.pos };
                    out.extend_from_slice(&pos.to_le_bytes());
                    out.extend_from_slice(&s.limit.to_le_bytes());
                }
                out.extend_from_slice(&m.per_write.to_le_bytes());
                put_table(&m.table, out);
            }
        }
    }

    struct Reader<'a> {
        buf: &'a [u8],
        pos: usize,
    }

    impl Reader<'_> {
        fn take(&mut self, n: usize) -> Result<&[u8], String> {
            let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
            let end = end.ok_or_else(|| "index image truncated".to_string())?;
            let s = &self.buf[self.pos..end];
            self.pos = end;
            Ok(s)
        }
        fn u64(&mut self) -> Result<u64, String> {
            let b = self.take(8)?;
            Ok(u64::from_le_bytes(b.try_into().map_err(|_| "short u64")?))
        }
    }

    /// What an image is checked against: the first record's offset units, the covered
    /// hot log end and the cold log end (units), and whether stash entries carry their
    /// origin table size (checkpoint version 6 on; version 5 entries do not).
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Bounds {
        pub first: u32,
        pub end: u64,
        pub cold_end: u64,
        pub stash_origins: bool,
    }

    /// Validate every slot: an offset must point inside `[first, end)` units of the hot
    /// log, or (cold bit set) `[first, cold_end)` units of the cold log.
    fn get_table(r: &mut Reader, bounds: Bounds) -> Result<Table, String> {
        let Bounds { first, end, cold_end, stash_origins } = bounds;
        let buckets = r.u64()?;
        let stash_len = r.u64()?;
        if !(MIN_BUCKETS..=(1 << 40)).contains(&buckets) || stash_len > (1 << 20) {
            return Err(format!("implausible table size {buckets} / stash {stash_len}"));
        }
        let nwords = buckets as usize * WORDS_PER_BUCKET;
        let raw = r.take(nwords * 2)?;
        let mut t = Table::with_buckets(buckets);
        for (w, c) in t.words.iter_mut().zip(raw.chunks_exact(2)) {
            *w = u16::from_le_bytes([c[0], c[1]]);
        }
        let check = |units: u32| {
            let cold = units & crate::limits::COLD_UNITS_BIT != 0;
            let (u, end) =
                if cold { (units & !crate::limits::COLD_UNITS_BIT, cold_end) } else { (units, end) };
            units == 0 || (u >= first && (u as u64) < end)
        };
        for slot in 0..(buckets as usize * SLOTS_PER_BUCKET) {
            let (units, _) = t.get(slot);
            if !check(units) {
                return Err(format!("slot {slot} points outside the covered log"));
            }
            if units != 0 {
                t.len += 1;
                t.cold += cold_bit(units);
            }
        }
        for _ in 0..stash_len {
            let bucket = r.u64()?;
            let origin = if stash_origins { r.u64()? } else { 0 };
            let b = r.take(6)?;
            let units = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let frag = u16::from_le_bytes([b[4], b[5]]);
            let bucket_ok = match origin {
                0 => bucket < buckets || bucket == ANY_BUCKET,
                n => (MIN_BUCKETS..=(1 << 40)).contains(&n) && bucket < n,
            };
            if units == 0 || !check(units) || !bucket_ok {
                return Err("bad stash entry".into());
            }
            t.push_stash(StashEntry { bucket, origin, frag, units });
        }
        Ok(t)
    }

    /// Parse an image; `bounds.end` is the covered log end in units, `bounds.cold_end` the
    /// cold log's (0 without one).
    pub fn read(buf: &[u8], bounds: Bounds) -> Result<Index, String> {
        let Bounds { first: first_units, end: end_units, cold_end: cold_end_units, .. } = bounds;
        let mut r = Reader { buf, pos: 0 };
        let cur = get_table(&mut r, bounds)?;
        let old = match r.u64()? {
            0 => None,
            1 => {
                let first = first_units as u64 * OFFSET_UNIT;
                let mut scan = [ScanRange::default(); 2];
                for (s, end) in scan.iter_mut().zip([end_units, cold_end_units]) {
                    (s.pos, s.limit) = (r.u64()?, r.u64()?);
                    // An empty range needs no log; a scan never passes the covered end.
                    let ok =
                        s.pos >= s.limit || (first <= s.pos && s.limit <= end.saturating_mul(OFFSET_UNIT));
                    if !ok {
                        return Err(format!("growth scan [{}, {}) outside the covered log", s.pos, s.limit));
                    }
                }
                let per_write = r.u64()?;
                let table = get_table(&mut r, bounds)?;
                let slack = write_slack(scan.iter().map(|s| s.limit.saturating_sub(s.pos)).sum());
                Some(Migration { table, scan, per_write, due: 0, done: 0, slack })
            }
            n => return Err(format!("bad migration flag {n}")),
        };
        if r.pos != buf.len() {
            return Err("trailing bytes after index image".into());
        }
        let gen = old.is_some() as u64;
        Ok(Index { cur, old, gen })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kh(i: u64) -> KeyHash {
        KeyHash::of(&i.to_le_bytes())
    }

    #[test]
    fn fills_past_90_percent_and_finds_everything() {
        let mut t = Table::with_buckets(4096);
        let n = (t.capacity() as f64 * 0.95) as u64;
        for i in 0..n {
            t.insert(kh(i), i as u32 + 2);
        }
        assert!(t.stash.len() < 8, "stash {}", t.stash.len());
        let mut out = Vec::new();
        for i in 0..n {
            out.clear();
            t.find(kh(i), false, &mut out);
            assert!(out.iter().any(|c| c.units == i as u32 + 2), "lost {i}");
        }
    }

    /// A pretend log: key i's record is one unit at units i + 2 (right after the header).
    fn units_of(i: u64) -> u32 {
        i as u32 + 2
    }

    /// Scan up to `bytes` of the pretend log the way the store does; returns whether
    /// migration was in progress.
    fn scan_step(idx: &mut Index, bytes: u64) -> bool {
        match idx.growth_work() {
            GrowthWork::Idle => false,
            GrowthWork::Finish => {
                let (_, left) = idx.finish_migration();
                assert_eq!(left, 0, "the scan left entries behind");
                true
            }
            GrowthWork::Scan(job) => {
                let upto = (job.pos + bytes).min(job.limit);
                let found: Vec<_> =
                    (job.pos / OFFSET_UNIT..upto / OFFSET_UNIT).map(|u| (kh(u - 2), u as u32)).collect();
                idx.apply_scan(&job, upto, &found);
                true
            }
        }
    }

    use crate::limits::OFFSET_UNIT;

    #[test]
    fn grows_by_log_scan_and_image_roundtrips() {
        let mut idx = Index::for_keys(0);
        let n = 20_000u64;
        let mut grew = 0;
        for i in 0..n {
            let end = (units_of(i) as u64 + 1) * OFFSET_UNIT;
            grew += idx.insert(kh(i), units_of(i), [end, 0]) as u32;
            // Overwrite an earlier key now and then: a write moves it out of the old table.
            if i % 7 == 0 && i > 0 {
                let j = i / 2;
                let mut out = Vec::new();
                idx.find(kh(j), &mut out);
                let c = out.iter().find(|c| c.units == units_of(j)).copied().expect("present");
                idx.update(c.loc, kh(j), units_of(j));
            }
            let owed = idx.owe(1);
            if owed > 0 {
                scan_step(&mut idx, owed);
            }
        }
        assert!(grew >= 5, "grew {grew} times");
        assert_eq!(idx.live(), n);
        let mut img = Vec::new();
        image::write(&idx, &mut img);
        let bounds = image::Bounds { first: 2, end: n + 2, cold_end: 0, stash_origins: true };
        let mut back = image::read(&img, bounds).unwrap();
        assert_eq!(back.is_migrating(), idx.is_migrating());
        while scan_step(&mut back, 4096) {}
        assert!(!back.is_migrating());
        assert_eq!(back.live(), n);
        let mut out = Vec::new();
        for i in 0..n {
            out.clear();
            back.find(kh(i), &mut out);
            assert!(out.iter().any(|c| c.units == units_of(i)), "lost {i}");
        }
        assert!(image::read(&img[..img.len() - 1], bounds).is_err());
    }

    #[test]
    fn unscanned_entries_are_stashed_not_lost() {
        let mut idx = Index::for_keys(0);
        let mut i = 0u64;
        while !idx.insert(kh(i), units_of(i), [(units_of(i) as u64 + 1) * OFFSET_UNIT, 0]) {
            i += 1;
        }
        // The scan reads nothing (as if every record failed its checksum).
        while let GrowthWork::Scan(job) = idx.growth_work() {
            idx.apply_scan(&job, job.limit, &[]);
        }
        let (old, left) = idx.finish_migration();
        assert!(old.is_some() && left > 0);
        assert_eq!(idx.live(), i + 1);
        let mut out = Vec::new();
        for j in 0..=i {
            out.clear();
            idx.find(kh(j), &mut out);
            assert!(out.iter().any(|c| c.units == units_of(j)), "lost {j}");
        }
    }
}
