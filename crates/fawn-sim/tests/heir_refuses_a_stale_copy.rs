//! Guards that a split or merge heir refuses a stale copy of a request its parent forgot. A
//! client's attempt was slow and arrived at its old head after the client's floor had passed
//! it; the range had been merged meanwhile, so the node routed it by its key to the merged
//! range, whose replica had taken over its parents' outcomes but not their clients' floors:
//! the parent had forgotten the request below the floor, and the heir ordered it a second
//! time. An heir now takes its parents' floors too.

use fawn_sim::{run_seed, Config};

#[test]
fn an_heir_refuses_a_slow_attempt_its_parent_forgot() {
    let r = run_seed(1524, &Config::memory_only());
    assert!(r.violations.is_empty(), "seed 1524: {}", r.violations.join("; "));
    assert!(r.stats.late_copies > 0 && r.stats.merges > 0, "seed 1524 did little: {:?}", r.stats);
}
