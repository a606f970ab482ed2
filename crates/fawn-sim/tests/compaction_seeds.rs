//! Guards the replica protocol over compacting stores: with each interval sync dropping
//! superseded records and deletes under the tombstone watermark (the shape that found the
//! most sync bugs), a bounded run of seeds (cuts, partitions, up to three crashes, a join and
//! a leave) finds no violation, and compaction did drop records in it.

use fawn_sim::{run_seed, Config};

/// Seeds per `cargo test` run (seconds); `fawn-sim --compaction --seeds N` runs more.
const SEEDS: u64 = 4_000;

#[test]
fn seeds_over_compacting_stores_find_no_violation() {
    let cfg = Config { compaction: true, ..Config::default() };
    let mut compacted = 0;
    let failing: Vec<String> = (0..SEEDS)
        .map(|seed| run_seed(seed, &cfg))
        .inspect(|r| compacted += r.stats.compacted)
        .filter(|r| !r.violations.is_empty())
        .map(|r| format!("seed {}: {}", r.seed, r.violations.join("; ")))
        .collect();
    assert!(failing.is_empty(), "{} of {SEEDS} seeds failed:\n{}", failing.len(), failing.join("\n"));
    assert!(compacted as u64 >= SEEDS, "compaction dropped only {compacted} records in {SEEDS} seeds");
}
