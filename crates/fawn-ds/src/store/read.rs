//! The read path of `Inner`: index probes, key comparisons and lookups.

use std::sync::atomic::Ordering;

use super::{Existing, Inner, PAGE};
use crate::error::Error;
use crate::index::{Candidate, KeyHash};
use crate::limits::{COLD_UNITS_BIT, KEY_BYTES_MAX, OFFSET_UNIT, RECORD_HEADER_BYTES};
use crate::record::{self, Header};
use crate::types::{Entry, RecordKind};

/// A lookup's first `pread` stays inside the 4 KiB page holding the record start (a second
/// device page is only read when the record itself crosses into it), and reads as many bytes
/// as the last record a lookup read had (the guess; records of one store tend to be of one
/// size), between these bounds: one `pread` for records up to 2 KiB that fit the page...
const LOOKUP_READ_BYTES_MAX: usize = 2048;
/// ...unless fewer than this many bytes are left in the page: then the record almost surely
/// crosses the boundary and the read continues into the next page (never with
/// `page_aligned_records`: no record crosses).
const LOOKUP_READ_BYTES_MIN: usize = 256;
/// The first guess.
pub(super) const LOOKUP_READ_BYTES_GUESS: usize = 1024;
/// The largest first read of a lookup (a stack buffer: no allocation but the value's).
const LOOKUP_STACK_BYTES: usize = LOOKUP_READ_BYTES_MIN + LOOKUP_READ_BYTES_MAX;

/// Bytes enough for any header + key (key comparisons on the write path).
const KEY_READ_BYTES: usize = RECORD_HEADER_BYTES + KEY_BYTES_MAX;
/// First read of a key: header + keys up to 32 bytes (one cache line of key) in one go.
const KEY_READ_FIRST_BYTES: usize = RECORD_HEADER_BYTES + 32;

thread_local! {
    /// Reused candidate list of this thread's index probes.
    static CANDIDATES: std::cell::RefCell<Vec<Candidate>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A thread's candidate list, handed back to it for reuse when dropped.
struct Candidates(Vec<Candidate>);

impl std::ops::Deref for Candidates {
    type Target = [Candidate];
    fn deref(&self) -> &[Candidate] {
        &self.0
    }
}

impl IntoIterator for Candidates {
    type Item = Candidate;
    type IntoIter = CandidatesIter;
    fn into_iter(self) -> CandidatesIter {
        CandidatesIter { list: self, next: 0 }
    }
}

/// By-value iteration over a `Candidates` list (which still goes back to the pool).
struct CandidatesIter {
    list: Candidates,
    next: usize,
}

impl Iterator for CandidatesIter {
    type Item = Candidate;
    fn next(&mut self) -> Option<Candidate> {
        let c = self.list.0.get(self.next).copied();
        self.next += 1;
        c
    }
}

impl Drop for Candidates {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        // A candidate list is tiny; keep no big one around after a pathological probe.
        if v.capacity() <= 64 {
            let _ = CANDIDATES.try_with(|c| *c.borrow_mut() = v);
        }
    }
}

impl Inner {
    /// The index entries whose fragment matches (in a per-thread reused buffer: no
    /// allocation per lookup).
    fn candidates(&self, kh: KeyHash) -> Candidates {
        let mut out = CANDIDATES.try_with(|c| std::mem::take(&mut *c.borrow_mut())).unwrap_or_default();
        out.clear();
        self.index.read().find(kh, &mut out);
        Candidates(out)
    }

    /// Read header + key of the record an index entry points at (offset units with the cold
    /// bit; no checksum: the value is not read)
    /// into `buf`: one short `pread` for the usual short key (writes compare keys behind
    /// fragment matches), a second one only for a long key.
    pub(super) fn read_key_buf<'b>(
        &self,
        units: u32,
        buf: &'b mut [u8; KEY_READ_BYTES],
    ) -> Result<(Header, &'b [u8]), Error> {
        let (log, offset) = self.locate(units)?;
        let n = log.read_at(&mut buf[..KEY_READ_FIRST_BYTES], offset)?;
        let header = record::parse_header(&buf[..n], offset)?;
        let want = RECORD_HEADER_BYTES + header.key_len;
        let mut have = n;
        if want > n && n == KEY_READ_FIRST_BYTES {
            have += log.read_at(&mut buf[n..want], offset + n as u64)?;
        }
        if want > have {
            return Err(Error::corrupt(offset, "record truncated"));
        }
        Ok((header, record::key_of(&buf[..], &header)))
    }

    /// Read and fully check the record an index entry points at (offset units with the cold
    /// bit) with one `pread` into `stack` when it fits (a small record), else a second read
    /// of the rest into `heap`.
    pub(super) fn read_record_buf<'b>(
        &self,
        units: u32,
        stack: &'b mut [u8; LOOKUP_STACK_BYTES],
        heap: &'b mut Vec<u8>,
    ) -> Result<(Header, &'b [u8]), Error> {
        let (log, offset) = self.locate(units)?;
        let in_page = (PAGE - offset % PAGE) as usize;
        let guess =
            self.read_guess.load(Ordering::Relaxed).clamp(LOOKUP_READ_BYTES_MIN, LOOKUP_READ_BYTES_MAX);
        // Padding is an optimisation only: a log may hold unpadded stretches (written before
        // the option was set), so a short first read is always followed up if needed.
        let first = if in_page >= LOOKUP_READ_BYTES_MIN {
            in_page.min(guess)
        } else if self.pads && in_page >= RECORD_HEADER_BYTES + OFFSET_UNIT as usize {
            in_page
        } else {
            in_page + guess
        };
        let n = log.read_at(&mut stack[..first], offset)?;
        let header = record::parse_header(&stack[..n], offset)?;
        let total = header.total_len();
        if total != guess && (LOOKUP_READ_BYTES_MIN..=LOOKUP_READ_BYTES_MAX).contains(&total) {
            self.read_guess.store(total, Ordering::Relaxed);
        }
        let buf: &[u8] = if total <= n {
            &stack[..total]
        } else {
            heap.clear();
            heap.extend_from_slice(&stack[..n]);
            heap.resize(total, 0);
            let more = log.read_at(&mut heap[n..], offset + n as u64)?;
            if n + more < total {
                return Err(Error::corrupt(offset, "record truncated"));
            }
            &heap[..total]
        };
        record::verify(buf, offset, &header)?;
        Ok((header, buf))
    }

    /// The index location of `key`, if present. Caller holds the writer lock, so the
    /// locations stay valid until it updates the index.
    /// Also returns the byte length of the record it points at and whether it is in the
    /// cold log (live-bytes accounting).
    pub fn find_existing(&self, kh: KeyHash, key: &[u8]) -> Result<Option<Existing>, Error> {
        self.find_existing_ahead(kh, key, None, |_| None)
    }

    /// `find_existing`, also prefetching the index buckets of `ahead` (a later record of a
    /// batch) while the index lock is held. `known` gives the key and record length at a
    /// position when the caller holds them (a record earlier in the same batch): such a
    /// candidate is compared without reading the log.
    pub(super) fn find_existing_ahead<'k>(
        &self,
        kh: KeyHash,
        key: &[u8],
        ahead: Option<KeyHash>,
        known: impl Fn(u32) -> Option<(&'k [u8], u64)>,
    ) -> Result<Option<Existing>, Error> {
        let candidates = {
            let mut out = CANDIDATES.try_with(|c| std::mem::take(&mut *c.borrow_mut())).unwrap_or_default();
            out.clear();
            let idx = self.index.read();
            idx.find(kh, &mut out);
            if let Some(a) = ahead {
                idx.prefetch(a);
            }
            Candidates(out)
        };
        for c in candidates {
            if let Some((stored, len)) = known(c.units) {
                if stored == key {
                    return Ok(Some((c.loc, len, c.units & COLD_UNITS_BIT != 0)));
                }
                continue;
            }
            let mut buf = [0u8; KEY_READ_BYTES];
            match self.read_key_buf(c.units, &mut buf) {
                Ok((header, stored)) => {
                    if stored == key {
                        return Ok(Some((c.loc, header.total_len() as u64, c.units & COLD_UNITS_BIT != 0)));
                    }
                }
                // A damaged record (its header fails the checks): its key cannot be compared,
                // so its entry is not taken for this key and the write goes ahead (the entry
                // may belong to any key whose buckets and fragment it matches; failing here
                // would refuse writes of all of them, and poison the store in a batch). If
                // it was this key's, the key now has a readable entry too, which lookups
                // prefer; the damaged entry stays, so the damage is still reported once the
                // key is deleted.
                Err(Error::Corrupt { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Whether the index points at the record at `units` (offset units, with the cold bit
    /// for the cold log) for this key hash: the record there is the key's live version. No
    /// log read (an index entry holding exactly this position can only belong to the key
    /// stored there).
    pub fn is_live_at(&self, kh: KeyHash, units: u32) -> bool {
        self.candidates(kh).iter().any(|c| c.units == units)
    }

    pub fn lookup(&self, key: &[u8]) -> Result<Option<Entry>, Error> {
        self.check_key(key)?;
        let kh = KeyHash::of(key);
        self.counters.lookups.fetch_add(1, Ordering::Relaxed);
        let mut stack = [0u8; LOOKUP_STACK_BYTES];
        let mut heap = Vec::new();
        // A candidate whose record fails its checks may be this key's (then the damage is
        // the answer) or another key's; a readable record of this key among the others is
        // its live version (writes insert one past an unreadable entry, see
        // `find_existing_ahead`), so the error is returned only when none is found.
        let mut damaged = None;
        for c in self.candidates(kh) {
            let (header, buf) = match self.read_record_buf(c.units, &mut stack, &mut heap) {
                Ok(r) => r,
                Err(e @ Error::Corrupt { .. }) => {
                    damaged.get_or_insert(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if record::key_of(buf, &header) != key {
                self.counters.extra_reads.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if header.kind != RecordKind::Put {
                let (_, offset) = self.locate(c.units)?;
                return Err(Error::corrupt(offset, "index points at a delete record"));
            }
            return Ok(Some(Entry { value: record::value_of(buf, &header).to_vec(), meta: header.meta }));
        }
        match damaged {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }
}
