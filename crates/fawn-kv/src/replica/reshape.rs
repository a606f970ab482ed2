//! Which replicas a node's split or merge makes when it installs a configuration: the pure
//! part of the back-end's `split_ranges` and `merge_ranges`, shared with the simulator.
//!
//! A range the manager split (`manager::state::split_ready`) or merged
//! (`manager::state::merge_ready`) is gone from the new configuration; each replica that held
//! it in sync cuts its datastore into the pieces where the new ranges it is a chain member of
//! overlap it ([`split_parts`]), then merges the held pieces inside each new range it does not
//! hold yet, provided they tile it ([`merge_target`]). A replica that was still syncing
//! splits and merges nothing: its new ranges sync afresh.

use fawn_proto::native::{ClusterConfig, RangeConfig};
use fawn_ring::{NodeId, Range};

/// Whether `part` lies inside `whole` (a part of it after a split, or all of it).
pub fn within(part: &Range, whole: &Range) -> bool {
    whole.is_full()
        || (whole.contains(part.end_inclusive)
            && (part.start_exclusive == whole.start_exclusive || whole.contains(part.start_exclusive)))
}

/// Where two ranges overlap, when that is one range (`None` when they do not overlap; two
/// ranges that each wrap past the other's end overlap twice, which ranges tiling the ring
/// never do with one of each other's tiles but for a ring of one or two ids).
pub fn overlap(a: &Range, b: &Range) -> Option<Range> {
    if a.is_full() {
        return Some(*b);
    }
    if b.is_full() {
        return Some(*a);
    }
    let end = if a.contains(b.end_inclusive) {
        b.end_inclusive
    } else if b.contains(a.end_inclusive) {
        a.end_inclusive
    } else {
        return None;
    };
    let start = if b.contains(a.start_exclusive) && a.start_exclusive != end {
        a.start_exclusive
    } else {
        b.start_exclusive
    };
    let piece = Range::new(start, end);
    (within(&piece, a) && within(&piece, b)).then_some(piece)
}

/// Whether `parts` cover `whole` exactly, end to end.
pub fn tiles(parts: &[Range], whole: &Range) -> bool {
    let mut at = whole.start_exclusive;
    for _ in 0..parts.len() {
        let Some(next) = parts.iter().find(|p| p.start_exclusive == at) else { return false };
        at = next.end_inclusive;
        if at == whole.end_inclusive {
            return true;
        }
    }
    false
}

/// The pieces `me`'s in-sync replica of `held` becomes in `config`: one per range of `config`
/// whose chain holds `me` and that overlaps `held`, cut to the overlap (a range of `config`
/// that also covers a neighbour of `held` — merged after the split, or before `me` installed
/// that — gets its piece, which [`merge_target`] merges next). Empty when `held` is still a
/// range of `config`, when `me` replicates none of it, or when one range of `config` covers
/// it all (a merge, not a split).
pub fn split_parts(config: &ClusterConfig, me: NodeId, held: &Range) -> Vec<RangeConfig> {
    if config.ranges.iter().any(|rc| rc.range == *held) {
        return Vec::new();
    }
    let parts: Vec<RangeConfig> = config
        .ranges
        .iter()
        .filter(|rc| rc.chain.contains(&me))
        .filter_map(|rc| Some(RangeConfig { range: overlap(&rc.range, held)?, ..rc.clone() }))
        .collect();
    if parts.iter().any(|p| p.range == *held) {
        return Vec::new();
    }
    parts
}

/// The held piece that `merged`'s replica grows from — the one with `merged`'s end (a
/// range's datastore is named by its end) — when the held pieces `parts`, all inside
/// `merged`, tile it; `None` otherwise (they cannot be merged into it).
pub fn merge_target(parts: &[Range], merged: &Range) -> Option<Range> {
    let target = parts.iter().find(|p| p.end_inclusive == merged.end_inclusive)?;
    tiles(parts, merged).then_some(*target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fawn_ring::KeyId;

    fn r(a: u128, b: u128) -> Range {
        Range::new(KeyId(a), KeyId(b))
    }

    #[test]
    fn overlaps_are_the_common_piece_in_either_order() {
        let cases = [
            (r(0, 10), r(5, 20), Some(r(5, 10))),
            (r(0, 20), r(5, 10), Some(r(5, 10))),
            (r(0, 10), r(0, 10), Some(r(0, 10))),
            (r(0, 10), r(10, 20), None),
            (r(0, 10), r(20, 30), None),
            // Wrapping past the top of the id space.
            (r(100, 5), r(3, 50), Some(r(3, 5))),
            (r(100, 5), r(90, 110), Some(r(100, 110))),
            (r(100, 5), Range::full(), Some(r(100, 5))),
        ];
        for (a, b, want) in cases {
            assert_eq!(overlap(&a, &b), want, "{a} ∩ {b}");
            assert_eq!(overlap(&b, &a), want, "{b} ∩ {a}");
        }
    }

    #[test]
    fn pieces_overlap_and_tile() {
        assert_eq!(overlap(&r(10, 30), &r(20, 40)), Some(r(20, 30)));
        assert_eq!(overlap(&r(10, 20), &r(20, 40)), None);
        assert!(within(&r(10, 20), &r(10, 30)) && !within(&r(5, 20), &r(10, 30)));
        assert!(tiles(&[r(20, 30), r(10, 20)], &r(10, 30)));
        assert!(!tiles(&[r(10, 20)], &r(10, 30)));
        assert_eq!(merge_target(&[r(10, 20), r(20, 30)], &r(10, 30)), Some(r(20, 30)));
        assert_eq!(merge_target(&[r(10, 20)], &r(10, 30)), None);
    }

    #[test]
    fn a_split_range_becomes_its_pieces_where_me_is_in_the_chain() {
        let ranges = vec![RangeConfig::new(r(10, 20), vec![1, 2]), RangeConfig::new(r(20, 30), vec![2, 3])];
        let config = ClusterConfig { ranges, ..ClusterConfig::default() };
        let parts: Vec<Range> = split_parts(&config, 2, &r(10, 30)).iter().map(|p| p.range).collect();
        assert_eq!(parts, vec![r(10, 20), r(20, 30)]);
        let parts: Vec<Range> = split_parts(&config, 1, &r(10, 30)).iter().map(|p| p.range).collect();
        assert_eq!(parts, vec![r(10, 20)]);
        assert!(split_parts(&config, 2, &r(10, 20)).is_empty(), "still a range");
        assert!(split_parts(&config, 2, &r(12, 18)).is_empty(), "inside one range: a merge");
    }
}
