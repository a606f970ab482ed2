//! Guards that a replica whose append failed keeps asking for the update until it holds it. A
//! tail's disk was full when its head's update arrived; its one resend ask was lost to a
//! one-way partition (what it sent was dropped, what it received arrived), no later update
//! came to show the gap, and the head, whose link to it never broke, never sent the update
//! again: it stayed unacknowledged for good and the replicas differed. Each tick now asks
//! again while an update the predecessor sent is missing.
//!
//! Since the simulator syncs by snapshot streams, seed 2335 runs another schedule, without a
//! partition, and no seed of this shape among 14,000 finds the rule undone; the rule itself
//! is guarded by the unit test
//! `a_replica_that_could_not_append_an_update_asks_each_tick_until_it_holds_it`
//! (`replica::machine`). The seed stays as a run of the disk modes with full disks.

use fawn_sim::{run_seed, Config};

#[test]
fn a_lost_resend_ask_after_a_failed_append_is_asked_again() {
    // The disk modes, in the shape the seed was found in (no late copies yet).
    let cfg = Config { late_copies: false, ..Config::default() };
    let r = run_seed(2335, &cfg);
    assert!(r.violations.is_empty(), "seed 2335: {}", r.violations.join("; "));
    assert!(r.stats.answered > 0 && r.stats.crashes > 0, "seed 2335 did little: {:?}", r.stats);
}
