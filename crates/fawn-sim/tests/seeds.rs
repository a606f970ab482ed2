//! Guards the replica protocol: a bounded run of seeds (faults: connection cuts, partitions, one
//! node crash and restart per seed, process, host or disk, disks that fill up, late copies of
//! client attempts) finds no violation, and a seed replays exactly.

use fawn_sim::{run_bounded, run_seed, Config};

/// Seeds per `cargo test` run (a few seconds); `fawn-sim --seeds N` runs more.
const SEEDS: u64 = 10_000;

fn one_crash() -> Config {
    Config { crashes_max: 1, ..Config::default() }
}

#[test]
fn bounded_seeds_find_no_violation() {
    run_bounded(SEEDS, &one_crash());
}

#[test]
fn a_seed_replays_exactly() {
    let cfg = Config::default();
    for seed in [3, 434, 895] {
        let (a, b) = (run_seed(seed, &cfg), run_seed(seed, &cfg));
        assert_eq!(format!("{:?}", a), format!("{:?}", b), "seed {seed} ran differently twice");
        assert!(a.stats.answered > 0 && a.stats.events > 1000, "seed {seed} did little: {:?}", a.stats);
    }
}
