//! Checkpoint image of the index (format in docs/FORMAT.md).

use super::*;
use crate::limits::OFFSET_UNIT;

const STASH_ENTRY_BYTES: usize = 18;

/// Serialize: level, split pointer, stash length, every bucket's words, the stash; then
/// a flag (0 = no refresh scan, 1 = scanning) and, when scanning, the scan state (hot
/// pos, hot limit, cold pos, cold limit, bytes per write).
pub fn write(index: &Index, out: &mut Vec<u8>) {
    let t = &index.cur;
    out.extend_from_slice(&(t.level as u64).to_le_bytes());
    out.extend_from_slice(&t.split.to_le_bytes());
    out.extend_from_slice(&(t.stash.len() as u64).to_le_bytes());
    out.reserve(t.buckets() as usize * WORDS_PER_BUCKET * 2 + t.stash.len() * STASH_ENTRY_BYTES);
    for b in 0..t.buckets() as usize {
        let slots = b * SLOTS_PER_BUCKET..(b + 1) * SLOTS_PER_BUCKET;
        for slot in slots.clone() {
            out.extend_from_slice(&t.tag(slot).to_le_bytes());
        }
        for slot in slots {
            // Low half first, then high half: the same bytes as a little-endian u32.
            out.extend_from_slice(&t.get(slot).0.to_le_bytes());
        }
    }
    for e in &t.stash {
        out.extend_from_slice(&e.v.to_le_bytes());
        out.extend_from_slice(&e.nbits.to_le_bytes());
        out.extend_from_slice(&e.units.to_le_bytes());
        out.extend_from_slice(&e.frag.to_le_bytes());
    }
    match &index.refresh {
        None => out.extend_from_slice(&0u64.to_le_bytes()),
        Some(r) => {
            out.extend_from_slice(&1u64.to_le_bytes());
            for (s, stale) in r.scan.iter().zip(t.stale) {
                // A log no stale entry points into needs no more scanning: its range is
                // written as done, so the image names no positions in it (a hot
                // compaction may have replaced that log since the level started, or
                // open cut a torn tail below the range's limit).
                let pos = if stale == 0 { s.limit } else { s.pos };
                out.extend_from_slice(&pos.to_le_bytes());
                out.extend_from_slice(&s.limit.to_le_bytes());
            }
            out.extend_from_slice(&r.per_write.to_le_bytes());
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
/// hot log end and the cold log end (units).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub first: u32,
    pub end: u64,
    pub cold_end: u64,
}

impl Bounds {
    /// Whether an offset (in units, with the cold bit) points inside `[first, end)` units
    /// of the hot log, or (cold bit set) `[first, cold_end)` units of the cold log.
    fn holds(&self, units: u32) -> bool {
        let cold = units & COLD_UNITS_BIT != 0;
        let (u, end) = if cold { (units & !COLD_UNITS_BIT, self.cold_end) } else { (units, self.end) };
        u >= self.first && (u as u64) < end
    }
}

/// Read the table and validate every entry against `bounds`.
fn get_table(r: &mut Reader, bounds: Bounds) -> Result<Table, String> {
    let level = r.u64()?;
    let split = r.u64()?;
    let stash_len = r.u64()?;
    if !(LEVEL_MIN as u64..LEVEL_MAX as u64).contains(&level) || split >= 1 << level || stash_len > (1 << 24)
    {
        return Err(format!("implausible table: level {level}, split {split}, stash {stash_len}"));
    }
    // The words must all be there before the table is allocated: a damaged header must
    // not make us allocate terabytes.
    let buckets = (1u64 << level) + split;
    let raw = r.take((buckets as usize).saturating_mul(WORDS_PER_BUCKET * 2))?;
    let mut t = Table::with_buckets(buckets);
    let word = |i: usize| u16::from_le_bytes([raw[2 * i], raw[2 * i + 1]]);
    for slot in 0..t.capacity() as usize {
        let (b, i) = (slot / SLOTS_PER_BUCKET, slot % SLOTS_PER_BUCKET);
        let at = b * WORDS_PER_BUCKET;
        let tag = word(at + i);
        let units = word(at + SLOTS_PER_BUCKET + 2 * i) as u32
            | (word(at + SLOTS_PER_BUCKET + 2 * i + 1) as u32) << 16;
        if (units == 0) != (tag == 0) {
            return Err(format!("slot {slot}: offset {units} with tag {tag}"));
        }
        if units == 0 {
            continue;
        }
        t.set(slot, units, tag);
        if !bounds.holds(units) {
            return Err(format!("slot {slot} points outside the covered log"));
        }
        t.len += 1;
        t.cold += cold_bit(units);
        if t.is_stale(tag) {
            t.stale[log_of(units)] += 1;
        }
    }
    for _ in 0..stash_len {
        let b = r.take(STASH_ENTRY_BYTES)?;
        let v = u64::from_le_bytes(b[0..8].try_into().map_err(|_| "short stash entry")?);
        let nbits = u32::from_le_bytes(b[8..12].try_into().map_err(|_| "short stash entry")?);
        let units = u32::from_le_bytes(b[12..16].try_into().map_err(|_| "short stash entry")?);
        let frag = u16::from_le_bytes([b[16], b[17]]);
        if units == 0 || !bounds.holds(units) || !(1..=64).contains(&nbits) || frag == 0 || frag > FRAG_MASK {
            return Err("bad stash entry".into());
        }
        t.cold += cold_bit(units);
        t.stash.push(StashEntry { v, nbits, frag, units });
    }
    Ok(t)
}

/// Parse an image; `bounds.end` is the covered log end in units, `bounds.cold_end` the
/// cold log's (0 without one).
pub fn read(buf: &[u8], bounds: Bounds) -> Result<Index, String> {
    let mut r = Reader { buf, pos: 0 };
    let cur = get_table(&mut r, bounds)?;
    let refresh = match r.u64()? {
        0 => None,
        1 => {
            let first = bounds.first as u64 * OFFSET_UNIT;
            let mut scan = [ScanRange::default(); 2];
            for (s, end) in scan.iter_mut().zip([bounds.end, bounds.cold_end]) {
                (s.pos, s.limit) = (r.u64()?, r.u64()?);
                // An empty range needs no log; a scan never passes the covered end.
                let ok = s.pos >= s.limit || (first <= s.pos && s.limit <= end.saturating_mul(OFFSET_UNIT));
                if !ok {
                    return Err(format!("refresh scan [{}, {}) outside the covered log", s.pos, s.limit));
                }
            }
            let per_write = r.u64()?;
            Some(Refresh::new(scan, per_write))
        }
        n => return Err(format!("bad refresh flag {n}")),
    };
    if r.pos != buf.len() {
        return Err("trailing bytes after index image".into());
    }
    if refresh.is_none() && cur.stale != [0, 0] {
        return Err("stale index entries without a refresh scan".into());
    }
    let gen = refresh.is_some() as u64;
    Ok(Index { cur, refresh, gen })
}
