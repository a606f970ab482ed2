//! The caller tags of the most recent tagged records (`BatchOp::with_tag`), kept in memory
//! so that a reopen finds them without scanning the log back: the checkpoint stores them
//! (docs/FORMAT.md §4) and the replay of the log after it adds the rest.

use std::collections::VecDeque;

use crate::limits::{RECENT_TAGS_MAX, TAG_BYTES_MAX};

/// One kept tag, inline (no allocation per record written): its record's seq, its length
/// and its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Kept {
    seq: u64,
    len: u8,
    bytes: [u8; TAG_BYTES_MAX],
}

impl Kept {
    fn tag(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// The newest `RECENT_TAGS_MAX` tags in log order, each with its record's seq.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RecentTags {
    entries: VecDeque<Kept>,
}

impl RecentTags {
    /// Adds the tag of a record just appended or replayed (ignored when empty; the record
    /// codec refused any longer than `TAG_BYTES_MAX`).
    pub fn push(&mut self, seq: u64, tag: &[u8]) {
        if tag.is_empty() || tag.len() > TAG_BYTES_MAX {
            return;
        }
        if self.entries.len() == RECENT_TAGS_MAX {
            self.entries.pop_front();
        }
        let mut kept = Kept { seq, len: tag.len() as u8, bytes: [0; TAG_BYTES_MAX] };
        kept.bytes[..tag.len()].copy_from_slice(tag);
        self.entries.push_back(kept);
    }

    /// Every tag kept, oldest first.
    pub fn to_vec(&self) -> Vec<(u64, Vec<u8>)> {
        self.entries.iter().map(|k| (k.seq, k.tag().to_vec())).collect()
    }

    /// Appends the checkpoint section's entries: `seq u64 | len u8 | tag` each.
    pub fn encode(&self, out: &mut Vec<u8>) {
        for k in &self.entries {
            out.extend_from_slice(&k.seq.to_le_bytes());
            out.push(k.len);
            out.extend_from_slice(k.tag());
        }
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
            if tags.entries.len() == RECENT_TAGS_MAX {
                return Err("more recent tags than kept".into());
            }
            tags.push(u64::from_le_bytes(*seq), &rest[..len]);
            buf = &rest[len..];
        }
        Ok(tags)
    }
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
        assert_eq!(t.entries.len(), RECENT_TAGS_MAX);
        assert_eq!(t.entries.front().map(|e| e.seq), Some(3));
        let mut buf = Vec::new();
        t.encode(&mut buf);
        assert_eq!(RecentTags::decode(&buf), Ok(t));
        // Damage is an error, never a panic.
        for cut in [1usize, 8, 9, 10] {
            assert!(RecentTags::decode(&buf[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = buf.clone();
        bad[8] = 0;
        assert!(RecentTags::decode(&bad).is_err());
    }
}
