//! Guards that a replica rejoining a merged range never does so by a suffix after one part's
//! records. A node crashed holding ranges that were merged while it was down; back, it was
//! added to the merged range as a syncing replica, kept the stores of its parts merged into
//! one, and asked for the suffix after their highest seq, so it never got the records of the
//! other part below that seq: acknowledged updates lost. A kept store now rejoins by a suffix
//! only a range inside the one it was a whole replica of; a merged range is copied in full.

use fawn_sim::{replay, Config};

#[test]
fn a_merged_range_is_not_rejoined_by_the_suffix_after_one_parts_records() {
    let cfg = Config { crashes_max: 1, ..Config::default() };
    let stats = replay(3328, &cfg);
    assert!(stats.answered > 0 && stats.crashes > 0, "seed 3328 did little: {stats:?}");
}
