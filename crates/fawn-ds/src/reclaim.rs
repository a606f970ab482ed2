//! What a full compaction could free beyond superseded records: expired puts and delete
//! records at or below the tombstone watermark. Neither is garbage by the index's
//! accounting (an expired put is still the key's live version; a delete record is kept
//! until the watermark passes it), so without this a store whose keys only expire — a
//! memcached session store — or only get deleted would never trigger a compaction.
//!
//! Estimates, by design: a record is noted when it is appended or replayed and never
//! un-noted when superseded (it is then counted as garbage too), so the estimate can run
//! ahead of what a compaction frees; a full compaction rebuilds it exactly from what it
//! keeps. Records covered by an index checkpoint at open are not noted until the next full
//! compaction (under-counting only delays a compaction).

use std::collections::BTreeMap;

use crate::types::{Meta, RecordKind};

/// Expiry times are grouped into buckets of 2^6 = 64 s: a datastore holding TTLs spread over
/// memcached's 30-day maximum keeps at most ~40 k buckets.
const EXPIRY_BUCKET_SHIFT: u32 = 6;
/// Tombstone seqs (hybrid clocks in µs) are grouped into buckets of 2^20 µs ≈ 1 s.
const TOMBSTONE_BUCKET_SHIFT: u32 = 20;

/// Bytes of records a full compaction may drop, by when they become droppable.
#[derive(Clone, Debug, Default)]
pub(crate) struct Reclaim {
    /// Put records with an expiry, by expiry bucket.
    expiring: BTreeMap<u32, u64>,
    /// Delete records, by seq bucket.
    tombstones: BTreeMap<u64, u64>,
}

impl Reclaim {
    /// Whether a record of this kind and meta is ever noted (callers skip the lock if not).
    pub fn concerns(kind: RecordKind, meta: &Meta) -> bool {
        kind == RecordKind::Delete || meta.expiry != 0
    }

    /// A record of `len` bytes was appended (or replayed).
    pub fn note(&mut self, kind: RecordKind, meta: &Meta, len: u64) {
        match kind {
            RecordKind::Delete => {
                *self.tombstones.entry(meta.seq >> TOMBSTONE_BUCKET_SHIFT).or_default() += len
            }
            RecordKind::Put if meta.expiry != 0 => {
                *self.expiring.entry(meta.expiry >> EXPIRY_BUCKET_SHIFT).or_default() += len
            }
            RecordKind::Put => {}
        }
    }

    /// Bytes of puts whose whole expiry bucket is at or before `now` (Unix seconds).
    pub fn expired_bytes(&self, now: u32) -> u64 {
        // Bucket b holds expiries in [b << s, ((b + 1) << s) - 1]: all expired iff the last
        // one is <= now, i.e. b < (now + 1) >> s.
        let first_live = (u64::from(now) + 1) >> EXPIRY_BUCKET_SHIFT;
        self.expiring.range(..first_live.min(u64::from(u32::MAX)) as u32).map(|(_, b)| b).sum()
    }

    /// Bytes of delete records whose whole seq bucket is at or below `watermark`.
    pub fn droppable_tombstone_bytes(&self, watermark: u64) -> u64 {
        let first_kept = watermark.saturating_add(1) >> TOMBSTONE_BUCKET_SHIFT;
        self.tombstones.range(..first_kept).map(|(_, b)| b).sum()
    }

    /// Everything a full compaction at `now` with `watermark` is estimated to drop.
    pub fn droppable_bytes(&self, now: u32, watermark: u64) -> u64 {
        self.expired_bytes(now) + self.droppable_tombstone_bytes(watermark)
    }
}

#[cfg(test)]
mod tests {
    use super::Reclaim;
    use crate::types::{Meta, RecordKind};

    #[test]
    fn buckets_count_only_once_wholly_past() {
        let mut r = Reclaim::default();
        let put = |expiry| Meta { seq: 1, flags: 0, expiry, state: 0 };
        r.note(RecordKind::Put, &put(0), 100); // never expires: not noted
        r.note(RecordKind::Put, &put(640), 10); // bucket [640, 703]
        r.note(RecordKind::Put, &put(700), 20); // same bucket
        r.note(RecordKind::Put, &put(704), 40); // bucket [704, 767]
        assert_eq!(r.expired_bytes(639), 0);
        assert_eq!(r.expired_bytes(702), 0, "700 has not expired yet");
        assert_eq!(r.expired_bytes(703), 30);
        assert_eq!(r.expired_bytes(767), 70);
        assert_eq!(r.expired_bytes(u32::MAX), 70);

        let del = |seq| Meta { seq, flags: 0, expiry: 0, state: 0 };
        r.note(RecordKind::Delete, &del(5), 7); // bucket 0: seqs [0, 2^20 - 1]
        r.note(RecordKind::Delete, &del(1 << 20), 9); // bucket 1
        assert_eq!(r.droppable_tombstone_bytes(0), 0);
        assert_eq!(r.droppable_tombstone_bytes((1 << 20) - 2), 0);
        assert_eq!(r.droppable_tombstone_bytes((1 << 20) - 1), 7);
        assert_eq!(r.droppable_tombstone_bytes(u64::MAX), 16);
        assert_eq!(r.droppable_bytes(703, (1 << 20) - 1), 37);
        assert!(Reclaim::concerns(RecordKind::Delete, &del(1)));
        assert!(!Reclaim::concerns(RecordKind::Put, &put(0)));
    }
}
