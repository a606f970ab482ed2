//! Guards against a retry decided again after a crash between a resent update and the
//! `Outcomes` message after it: the receiver held the update without its request's outcome
//! and, as head later, ordered the client's retry a second time. Resent updates now carry
//! their own outcome. These seeds (three crashes at most) each decide a retry twice when
//! resent updates travel without outcomes (fault `NoOutcomesWithResend`), which the second
//! test checks.

use fawn_sim::{replay, Config};

const SEEDS: [u64; 2] = [681, 1094];

fn shape() -> Config {
    Config { partitions_max: 0, ..Config::fixed_members() }
}

#[test]
fn a_head_that_got_an_update_by_resend_from_a_node_that_then_crashed_answers_its_retry() {
    for seed in SEEDS {
        let stats = replay(seed, &shape());
        assert!(stats.answered > 0 && stats.crashes > 0, "seed {seed} did little: {stats:?}");
    }
}

#[cfg(feature = "faults")]
#[test]
fn the_seeds_fail_with_resent_updates_without_outcomes() {
    for seed in SEEDS {
        let fault = fawn_sim::Fault::NoOutcomesWithResend;
        assert!(fawn_sim::fails_with(seed, &shape(), fault), "seed {seed} no longer runs the scenario");
    }
}
