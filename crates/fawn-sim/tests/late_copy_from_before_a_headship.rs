//! Guards that a head refuses an update routed before it became head. A client's delete went
//! to a head that had just been removed and had not heard yet; it found no such key and
//! answered `NotFound` at once, a failed condition only it remembered, and the client moved on
//! to other ranges. A slow attempt of the same delete, sent earlier, reached its node after
//! that node had become head again: it knew neither the outcome nor the client's floor in
//! this range, and deleted the key, after the client had been told nothing was deleted. A
//! head now refuses (`StaleEpoch`) an update routed by a configuration older than its
//! headship; the seed fails without that (fault `OrderedAcrossHeadship`). The scenario is
//! rare: the seed runs with ten times the usual share of slow attempts.

use fawn_sim::{replay, Config};

const SEED: u64 = 6432;

fn shape() -> Config {
    Config { late_copy_percent: 20, ..Config::memory_only() }
}

#[test]
fn a_slow_attempt_from_before_a_headship_is_refused() {
    let stats = replay(SEED, &shape());
    assert!(stats.late_copies > 0 && stats.crashes > 0, "seed {SEED} did little: {stats:?}");
}

#[cfg(feature = "faults")]
#[test]
fn the_seed_fails_when_a_head_orders_it() {
    let fault = fawn_sim::Fault::OrderedAcrossHeadship;
    assert!(fawn_sim::fails_with(SEED, &shape(), fault), "seed {SEED} no longer runs the scenario");
}
