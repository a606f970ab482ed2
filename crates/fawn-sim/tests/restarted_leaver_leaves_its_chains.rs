//! Guards against a leaving node whose process restarts (here on an empty disk) keeping its
//! chain positions: the manager took its registration as a no-op, so it stayed the tail of a
//! range and the sync source of its replacement, which copied nothing and then served a read
//! that missed an acknowledged write. The manager now fails a restarted leaver out of its
//! chains, and it goes on leaving (`manager::state::register_backend`).

use fawn_sim::{run_seed, Config};

#[test]
fn a_restarted_leaver_serves_nothing_it_lost() {
    let cfg = Config { joins_max: 1, leaves_max: 1, ..Config::fixed_members() };
    let seed = 3941;
    let r = run_seed(seed, &cfg);
    assert!(r.violations.is_empty(), "seed {seed}: {}", r.violations.join("; "));
    assert!(r.stats.leaves == 1 && r.stats.crashes > 0, "seed {seed} did little: {:?}", r.stats);
}
