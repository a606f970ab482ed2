//! Guards that a leaving node stays in its chains until its replacement is proven. The
//! manager used to let the leaver go at the replacement's `SyncDone`: with two other members
//! of the chain having lost their disks, not yet detected, the range's last proven replica was
//! then an empty one, and a cas after an acknowledged set answered `NotFound` (seed 1599; seed
//! 4377 the same way). Now the leaver leaves at the new tail's `TailReady`.

use fawn_sim::{run_seed, Config};

#[test]
fn a_leaver_is_let_go_only_once_its_replacement_holds_every_update() {
    // The shape the seeds were found in: crashes lose the node's data, no slow attempts.
    let cfg = Config { frontend_cache: true, late_copies: false, ..Config::memory_only() };
    for seed in [1599, 4377] {
        let r = run_seed(seed, &cfg);
        assert!(r.violations.is_empty(), "seed {seed}: {}", r.violations.join("; "));
        assert!(r.stats.answered > 0 && r.stats.crashes > 0, "seed {seed} did little: {:?}", r.stats);
    }
}
