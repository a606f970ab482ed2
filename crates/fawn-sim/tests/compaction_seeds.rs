//! Guards the replica protocol over compacting stores: with each interval sync dropping
//! superseded records and deletes under the tombstone watermark (the shape that found the
//! most sync bugs), a bounded run of seeds (cuts, partitions, up to three crashes, a join and
//! a leave) finds no violation, and compaction did drop records in it.

use fawn_sim::{run_bounded, Config};

/// Seeds per `cargo test` run (seconds); `fawn-sim --compaction --seeds N` runs more.
const SEEDS: u64 = 4_000;

#[test]
fn seeds_over_compacting_stores_find_no_violation() {
    let stats = run_bounded(SEEDS, &Config { compaction: true, ..Config::default() });
    let compacted: usize = stats.iter().map(|s| s.compacted).sum();
    assert!(compacted as u64 >= SEEDS, "compaction dropped only {compacted} records in {SEEDS} seeds");
}
