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
//! Growth is incremental: a new table of twice the buckets is allocated and each later
//! write migrates `MIGRATE_BUCKETS_PER_STEP` old buckets (a migrated entry's new bucket
//! needs its key id, read from the log). Lookups probe both tables until the old one is
//! empty. No operation ever rehashes the whole table.

use crate::limits::{INDEX_MAX_LOAD, INDEX_SIZING_LOAD, SLOTS_PER_BUCKET};

/// Words (u16) per slot: offset low, offset high, fragment.
const WORDS_PER_SLOT: usize = 3;
const WORDS_PER_BUCKET: usize = WORDS_PER_SLOT * SLOTS_PER_BUCKET;
/// Cuckoo displacements tried before an entry goes to the stash.
const MAX_KICKS: usize = 256;
/// Old-table buckets migrated per write during growth.
pub(crate) const MIGRATE_BUCKETS_PER_STEP: u64 = 8;
/// Stash entries tolerated before the table grows (each costs a compare per lookup).
const STASH_GROW_AT: usize = 16;
/// Smallest table (buckets).
const MIN_BUCKETS: u64 = 64;
/// Stash bucket value meaning "bucket unknown": matches on fragment alone.
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
    Slot { old: bool, slot: usize },
    Stash { old: bool, i: usize },
}

/// A fragment match: a log offset (in units) to read and compare keys at.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate {
    pub loc: Loc,
    pub units: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StashEntry {
    bucket: u64,
    frag: u16,
    units: u32,
}

#[inline]
fn fastrange(x: u64, n: u64) -> u64 {
    ((x as u128 * n as u128) >> 64) as u64
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
    rng: u64,
}

impl Table {
    pub fn with_buckets(buckets: u64) -> Table {
        let buckets = buckets.max(MIN_BUCKETS);
        let words = vec![0u16; buckets as usize * WORDS_PER_BUCKET];
        Table { words, buckets, len: 0, stash: Vec::new(), rng: 0x2545_F491_4F6C_DD1D }
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
        let hf = fastrange(mix(frag as u64), self.buckets);
        (hf + self.buckets - b) % self.buckets
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
                    out.push(Candidate { loc: Loc::Slot { old, slot }, units });
                }
            }
            if b2 == b1 {
                break;
            }
        }
        for (i, e) in self.stash.iter().enumerate() {
            let bucket_ok = e.bucket == b1 || e.bucket == b2 || e.bucket == ANY_BUCKET;
            if e.frag == kh.frag && bucket_ok {
                out.push(Candidate { loc: Loc::Stash { old, i }, units: e.units });
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

    /// Insert an entry whose bucket pair contains `b`: cuckoo random walk, then stash.
    fn insert_at(&mut self, b1: u64, frag: u16, units: u32) {
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
        self.stash.push(StashEntry { bucket: b, frag, units });
    }

    fn clear_slot(&mut self, slot: usize) {
        self.set(slot, 0, 0);
        self.len -= 1;
    }

    fn bytes(&self) -> u64 {
        (self.words.capacity() * std::mem::size_of::<u16>()
            + self.stash.capacity() * std::mem::size_of::<StashEntry>()) as u64
    }

    fn entries(&self) -> u64 {
        self.len + self.stash.len() as u64
    }
}

/// An old table being migrated into the current one.
#[derive(Clone, Debug)]
struct Migration {
    table: Table,
    /// Buckets below this are already moved (empty).
    next: u64,
}

/// Entries taken out of the old table by one migration step, to be re-inserted.
#[derive(Debug, Default)]
pub(crate) struct MigrationBatch {
    pub entries: Vec<(u16, u32)>,
    /// Old-table buckets covered by this batch end here.
    upto: u64,
    take_stash: bool,
}

/// The whole index: the current table plus, while growing, the old one.
#[derive(Clone, Debug)]
pub(crate) struct Index {
    cur: Table,
    old: Option<Migration>,
}

impl Index {
    pub fn for_keys(keys: u64) -> Index {
        Index { cur: Table::for_keys(keys), old: None }
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

    /// All entries whose fragment matches, current table first.
    pub fn find(&self, kh: KeyHash, out: &mut Vec<Candidate>) {
        self.cur.find(kh, false, out);
        if let Some(m) = &self.old {
            m.table.find(kh, true, out);
        }
    }

    fn table_mut(&mut self, old: bool) -> Option<&mut Table> {
        if old {
            self.old.as_mut().map(|m| &mut m.table)
        } else {
            Some(&mut self.cur)
        }
    }

    /// Point an existing entry at a new record.
    pub fn update(&mut self, loc: Loc, units: u32) {
        match loc {
            Loc::Slot { old, slot } => {
                if let Some(t) = self.table_mut(old) {
                    let frag = t.get(slot).1;
                    t.set(slot, units, frag);
                }
            }
            Loc::Stash { old, i } => {
                if let Some(e) = self.table_mut(old).and_then(|t| t.stash.get_mut(i)) {
                    e.units = units;
                }
            }
        }
    }

    /// Remove an entry (delete).
    pub fn remove(&mut self, loc: Loc) {
        match loc {
            Loc::Slot { old, slot } => {
                if let Some(t) = self.table_mut(old) {
                    t.clear_slot(slot);
                }
            }
            Loc::Stash { old, i } => {
                if let Some(t) = self.table_mut(old) {
                    if i < t.stash.len() {
                        t.stash.swap_remove(i);
                    }
                }
            }
        }
    }

    /// Insert a key that is not present. Starts growth when the table is full.
    pub fn insert(&mut self, kh: KeyHash, units: u32) {
        self.cur.insert(kh, units);
        let full = self.cur.entries() as f64 > INDEX_MAX_LOAD * self.cur.capacity() as f64;
        if self.old.is_none() && (full || self.cur.stash.len() > STASH_GROW_AT) {
            let bigger = Table::with_buckets(self.cur.buckets * 2);
            let old = std::mem::replace(&mut self.cur, bigger);
            self.old = Some(Migration { table: old, next: 0 });
        }
    }

    /// Copy out the entries of the next few old buckets (no change yet).
    pub fn migration_batch(&self, buckets: u64) -> Option<MigrationBatch> {
        let m = self.old.as_ref()?;
        let upto = (m.next + buckets).min(m.table.buckets);
        let mut entries = Vec::new();
        for slot in (m.next as usize * SLOTS_PER_BUCKET)..(upto as usize * SLOTS_PER_BUCKET) {
            let (units, frag) = m.table.get(slot);
            if units != 0 {
                entries.push((frag, units));
            }
        }
        let take_stash = upto == m.table.buckets;
        if take_stash {
            entries.extend(m.table.stash.iter().map(|e| (e.frag, e.units)));
        }
        Some(MigrationBatch { entries, upto, take_stash })
    }

    /// Move a batch: `rehashed[i]` is the primary hash of `batch.entries[i]` (None when its
    /// record could not be read: it then goes to the stash and matches on fragment alone).
    /// Returns the emptied old table when migration is complete: freeing tens of MB takes
    /// milliseconds, so the caller frees it outside the locks.
    pub fn apply_migration(&mut self, batch: &MigrationBatch, rehashed: &[Option<u64>]) -> Option<Table> {
        let m = self.old.as_mut()?;
        let from = m.next as usize * SLOTS_PER_BUCKET;
        for slot in from..(batch.upto as usize * SLOTS_PER_BUCKET) {
            if m.table.get(slot).0 != 0 {
                m.table.clear_slot(slot);
            }
        }
        m.next = batch.upto;
        let done = batch.take_stash;
        for (&(frag, units), h) in batch.entries.iter().zip(rehashed) {
            match h {
                Some(h) => self.cur.insert(KeyHash { h: *h, frag }, units),
                None => self.cur.stash.push(StashEntry { bucket: ANY_BUCKET, frag, units }),
            }
        }
        if done {
            return self.old.take().map(|m| m.table);
        }
        None
    }
}

/// Checkpoint image of the index (format in docs/FORMAT.md).
pub(crate) mod image {
    use super::*;

    fn put_table(t: &Table, out: &mut Vec<u8>) {
        out.extend_from_slice(&t.buckets.to_le_bytes());
        out.extend_from_slice(&(t.stash.len() as u64).to_le_bytes());
        out.reserve(t.words.len() * 2);
        for w in &t.words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        for e in &t.stash {
            out.extend_from_slice(&e.bucket.to_le_bytes());
            out.extend_from_slice(&e.units.to_le_bytes());
            out.extend_from_slice(&e.frag.to_le_bytes());
        }
    }

    /// Serialize: current table, then a flag and the old table + migration point.
    pub fn write(index: &Index, out: &mut Vec<u8>) {
        put_table(&index.cur, out);
        match &index.old {
            None => out.extend_from_slice(&0u64.to_le_bytes()),
            Some(m) => {
                out.extend_from_slice(&(m.next + 1).to_le_bytes());
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

    /// Validate every slot: an offset must point inside `[first, end)` units of the hot
    /// log, or (cold bit set) `[first, cold_end)` units of the cold log.
    fn get_table(r: &mut Reader, first: u32, end: u64, cold_end: u64) -> Result<Table, String> {
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
            }
        }
        for _ in 0..stash_len {
            let bucket = r.u64()?;
            let b = r.take(6)?;
            let units = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let frag = u16::from_le_bytes([b[4], b[5]]);
            if units == 0 || !check(units) || (bucket >= buckets && bucket != ANY_BUCKET) {
                return Err("bad stash entry".into());
            }
            t.stash.push(StashEntry { bucket, frag, units });
        }
        Ok(t)
    }

    /// Parse an image; `end_units` is the covered log end in units, `cold_end_units` the
    /// cold log's (0 without one).
    pub fn read(buf: &[u8], first_units: u32, end_units: u64, cold_end_units: u64) -> Result<Index, String> {
        let mut r = Reader { buf, pos: 0 };
        let cur = get_table(&mut r, first_units, end_units, cold_end_units)?;
        let next = r.u64()?;
        let old = if next == 0 {
            None
        } else {
            let table = get_table(&mut r, first_units, end_units, cold_end_units)?;
            if next - 1 > table.buckets {
                return Err("bad migration point".into());
            }
            Some(Migration { table, next: next - 1 })
        };
        if r.pos != buf.len() {
            return Err("trailing bytes after index image".into());
        }
        Ok(Index { cur, old })
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

    #[test]
    fn grows_incrementally_and_image_roundtrips() {
        let mut idx = Index::for_keys(0);
        let n = 20_000u64;
        let mut hashes = std::collections::HashMap::new();
        for i in 0..n {
            let k = kh(i);
            hashes.insert(i as u32 + 2, k.h);
            idx.insert(k, i as u32 + 2);
            if let Some(batch) = idx.migration_batch(MIGRATE_BUCKETS_PER_STEP) {
                let re: Vec<_> = batch.entries.iter().map(|(_, u)| hashes.get(u).copied()).collect();
                let _ = idx.apply_migration(&batch, &re);
            }
        }
        assert_eq!(idx.live(), n);
        let mut img = Vec::new();
        image::write(&idx, &mut img);
        let back = image::read(&img, 2, n + 2, 0).unwrap();
        let mut out = Vec::new();
        for i in 0..n {
            out.clear();
            back.find(kh(i), &mut out);
            assert!(out.iter().any(|c| c.units == i as u32 + 2));
        }
        assert!(image::read(&img[..img.len() - 1], 2, n + 2, 0).is_err());
    }
}
