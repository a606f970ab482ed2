//! The caller tags of the most recent tagged records (`BatchOp::with_tag`), kept in memory
//! so that a reopen finds them without scanning the log back: the checkpoint stores them
//! (docs/FORMAT.md §4) and the replay of the log after it adds the rest.

use std::collections::VecDeque;

use crate::limits::{RECENT_TAGS_MAX, TAG_BYTES_MAX};

/// Bytes of an entry before its tag: the record's seq (u64) and the tag's length (u8).
const ENTRY_HEAD_BYTES: usize = 9;

/// The newest `RECENT_TAGS_MAX` tags in log order, each with its record's seq, packed in one
/// byte ring exactly as the checkpoint section stores them (`seq u64 | len u8 | tag`): a
/// 17-byte tag costs 26 bytes, where a fixed-size entry would take 56, and a checkpoint
/// copies the bytes instead of encoding entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RecentTags {
    bytes: VecDeque<u8>,
    count: usize,
}

impl RecentTags {
    /// Adds the tag of a record just appended or replayed (ignored when empty; the record
    /// codec refused any longer than `TAG_BYTES_MAX`).
    pub fn push(&mut self, seq: u64, tag: &[u8]) {
        if tag.is_empty() || tag.len() > TAG_BYTES_MAX {
            return;
        }
        if self.count == RECENT_TAGS_MAX {
            self.pop_front();
        }
        let need = self.bytes.len() + ENTRY_HEAD_BYTES + tag.len();
        if need > self.bytes.capacity() {
            // Grow by a quarter rather than doubling: a full ring stops growing once its
            // oldest entries make room, so the last doubling would mostly stay unused.
            self.bytes.reserve_exact((self.bytes.len() / 4).max(need - self.bytes.len()).max(1024));
        }
        self.bytes.extend(seq.to_le_bytes());
        self.bytes.push_back(tag.len() as u8);
        self.bytes.extend(tag.iter().copied());
        self.count += 1;
    }

    /// Drops the entries (from the oldest on) with a seq below `seq`, then gives memory back
    /// when at most a quarter of it is in use.
    pub fn forget_below(&mut self, seq: u64) {
        while self.front_seq().is_some_and(|s| s < seq) {
            self.pop_front();
        }
        if self.bytes.capacity() > 4096 && self.bytes.len() < self.bytes.capacity() / 4 {
            self.bytes.shrink_to(self.bytes.len() * 2);
        }
    }

    /// The seq of the oldest entry.
    fn front_seq(&self) -> Option<u64> {
        let mut seq = [0u8; 8];
        for (i, b) in self.bytes.iter().take(8).enumerate() {
            seq[i] = *b;
        }
        (self.count > 0).then(|| u64::from_le_bytes(seq))
    }

    fn pop_front(&mut self) {
        let len = self.bytes.get(ENTRY_HEAD_BYTES - 1).map_or(0, |&l| usize::from(l));
        self.bytes.drain(..(ENTRY_HEAD_BYTES + len).min(self.bytes.len()));
        self.count -= 1;
    }

    /// Adds `other`'s tags (a store merged into this one, whose records now are this
    /// store's): both in seq order, the newest `RECENT_TAGS_MAX` kept.
    pub fn absorb(&mut self, other: &RecentTags) {
        if other.count == 0 {
            return;
        }
        let mut all = self.to_vec();
        all.extend(other.to_vec());
        *self = RecentTags::newest_in_seq_order(all);
    }

    /// A ring of the newest `RECENT_TAGS_MAX` of `all`, in seq order (stable: entries of one
    /// seq keep their order in `all`).
    fn newest_in_seq_order(mut all: Vec<(u64, Vec<u8>)>) -> RecentTags {
        all.sort_by_key(|e| e.0);
        let mut ring = RecentTags::default();
        let skip = all.len().saturating_sub(RECENT_TAGS_MAX);
        all[skip..].iter().for_each(|(seq, tag)| ring.push(*seq, tag));
        ring
    }

    /// Adds the tags of `tags` whose seqs have none here yet (tags of records this store does
    /// not hold: `DataStore::adopt_tags`), in seq order among the others, the newest
    /// `RECENT_TAGS_MAX` kept. Returns how many were added.
    pub fn adopt(&mut self, tags: &[(u64, Vec<u8>)]) -> usize {
        let mut all = self.to_vec();
        let held: std::collections::HashSet<u64> = all.iter().map(|e| e.0).collect();
        let before = all.len();
        all.extend(tags.iter().filter(|(seq, tag)| !held.contains(seq) && !tag.is_empty()).cloned());
        let added = all.len() - before;
        if added > 0 {
            *self = RecentTags::newest_in_seq_order(all);
        }
        added
    }

    /// Every tag kept, oldest first.
    pub fn to_vec(&self) -> Vec<(u64, Vec<u8>)> {
        let mut buf = Vec::with_capacity(self.bytes.len());
        self.encode(&mut buf);
        let mut out = Vec::with_capacity(self.count);
        let mut rest = &buf[..];
        while let Some((seq, tag, next)) = split_entry(rest) {
            out.push((seq, tag.to_vec()));
            rest = next;
        }
        out
    }

    /// Appends the checkpoint section's entries: `seq u64 | len u8 | tag` each.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let (a, b) = self.bytes.as_slices();
        out.reserve(a.len() + b.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b);
    }

    /// Parses a checkpoint section written by `encode`.
    pub fn decode(mut buf: &[u8]) -> Result<RecentTags, String> {
        let mut tags = RecentTags::default();
        while !buf.is_empty() {
            let Some((seq, rest)) = buf.split_first_chunk::<8>() else {
                return Err("recent tags truncated".into());
            };
            let Some((&len, rest)) = rest.split_first() else {
                return Err("recent tags truncated".into());
            };
            let len = usize::from(len);
            if len == 0 || len > TAG_BYTES_MAX || rest.len() < len {
                return Err(format!("bad recent tag of {len} bytes"));
            }
            if tags.count == RECENT_TAGS_MAX {
                return Err("more recent tags than kept".into());
            }
            tags.push(u64::from_le_bytes(*seq), &rest[..len]);
            buf = &rest[len..];
        }
        Ok(tags)
    }

    /// Bytes of memory the ring holds.
    #[cfg(test)]
    fn capacity_bytes(&self) -> usize {
        self.bytes.capacity()
    }
}

/// The first entry of a well-formed section: (seq, tag, the rest).
fn split_entry(buf: &[u8]) -> Option<(u64, &[u8], &[u8])> {
    let (seq, rest) = buf.split_first_chunk::<8>()?;
    let (&len, rest) = rest.split_first()?;
    let (tag, rest) = rest.split_at_checked(usize::from(len))?;
    Some((u64::from_le_bytes(*seq), tag, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_and_round_trips() {
        let mut t = RecentTags::default();
        t.push(1, b"");
        for seq in 0..RECENT_TAGS_MAX as u64 + 3 {
            t.push(seq, &seq.to_le_bytes()[..1 + (seq % 8) as usize]);
        }
        assert_eq!(t.count, RECENT_TAGS_MAX);
        let all = t.to_vec();
        assert_eq!(all.len(), RECENT_TAGS_MAX);
        assert_eq!(all.first().map(|e| e.0), Some(3));
        let last = RECENT_TAGS_MAX as u64 + 2;
        assert_eq!(all.last(), Some(&(last, last.to_le_bytes()[..1 + (last % 8) as usize].to_vec())));
        let mut buf = Vec::new();
        t.encode(&mut buf);
        assert_eq!(RecentTags::decode(&buf).map(|d| d.to_vec()), Ok(all));
        // Damage is an error, never a panic.
        for cut in [1usize, 8, 9, 10] {
            assert!(RecentTags::decode(&buf[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = buf.clone();
        bad[8] = 0;
        assert!(RecentTags::decode(&bad).is_err());
    }

    #[test]
    fn absorbing_another_ring_keeps_the_newest_of_both_in_seq_order() {
        let (mut a, mut b) = (RecentTags::default(), RecentTags::default());
        for seq in 0..RECENT_TAGS_MAX as u64 {
            a.push(2 * seq, b"even");
            b.push(2 * seq + 1, b"odd");
        }
        a.absorb(&b);
        let all = a.to_vec();
        assert_eq!(all.len(), RECENT_TAGS_MAX);
        let newest = 2 * RECENT_TAGS_MAX as u64 - 1;
        assert_eq!(all.last(), Some(&(newest, b"odd".to_vec())));
        assert_eq!(all[0].0, newest + 1 - RECENT_TAGS_MAX as u64);
        assert!(all.windows(2).all(|w| w[0].0 + 1 == w[1].0));
        let mut c = RecentTags::default();
        c.absorb(&RecentTags::default());
        assert_eq!(c, RecentTags::default());
    }

    /// Forgetting below a seq drops exactly the older entries and gives the memory back.
    #[test]
    fn forgetting_below_a_seq_keeps_that_seq_and_the_newer_ones() {
        let mut t = RecentTags::default();
        for seq in 1..=10_000u64 {
            t.push(seq, &[1u8; 17]);
        }
        let full = t.capacity_bytes();
        t.forget_below(9_990);
        let kept: Vec<u64> = t.to_vec().iter().map(|e| e.0).collect();
        assert_eq!(kept, (9_990..=10_000).collect::<Vec<_>>());
        assert!(t.capacity_bytes() < full / 4, "{} of {full}", t.capacity_bytes());
        t.forget_below(0);
        assert_eq!(t.count, 11);
        t.forget_below(u64::MAX);
        assert_eq!((t.count, t.to_vec()), (0, Vec::new()));
        t.push(3, b"again");
        assert_eq!(t.to_vec(), vec![(3, b"again".to_vec())]);
    }

    /// A full ring of set-sized tags (17 bytes) holds about 26 bytes per entry, and keeps its
    /// size while new entries push the oldest out.
    #[test]
    fn a_full_ring_of_short_tags_stays_packed() {
        let mut t = RecentTags::default();
        let tag = [7u8; 17];
        for seq in 0..RECENT_TAGS_MAX as u64 {
            t.push(seq, &tag);
        }
        let full = t.capacity_bytes();
        assert!(full <= RECENT_TAGS_MAX * 26 * 5 / 4, "{full} bytes");
        for seq in 0..3 * RECENT_TAGS_MAX as u64 {
            t.push(seq, &tag);
        }
        assert_eq!(t.capacity_bytes(), full);
        assert_eq!(t.count, RECENT_TAGS_MAX);
    }
}
