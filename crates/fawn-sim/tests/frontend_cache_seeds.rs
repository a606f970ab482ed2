//! Guards the front-end's cache coherence: with the clients going through a front-end with
//! the real query cache, a bounded run of seeds (cuts, partitions, up to three crashes) finds
//! no violation, and the cache did answer gets in them (else the run would prove nothing).

use fawn_sim::{run_bounded, Config};

/// Seeds per `cargo test` run (a few seconds); `fawn-sim --frontend-cache --seeds N` runs more.
const SEEDS: u64 = 4_000;

#[test]
fn seeds_through_the_cached_front_end_find_no_violation() {
    let stats = run_bounded(SEEDS, &Config { frontend_cache: true, ..Config::default() });
    let hits: usize = stats.iter().map(|s| s.cache_hits).sum();
    assert!(hits as u64 >= SEEDS, "the cache answered only {hits} gets in {SEEDS} seeds");
}
