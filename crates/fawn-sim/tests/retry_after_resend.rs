//! Guards against a retry decided twice: a replica promoted to head must still recognise a
//! retry of a request its predecessor ordered. These seeds (three crashes at most) each
//! decide a retry twice when a promoted head forgets its dedup table (fault
//! `ForgetDedupOnPromotion`), which the second test checks.

use fawn_sim::{replay, Config};

const SEEDS: [u64; 4] = [0, 7, 15, 33];

fn shape() -> Config {
    Config { partitions_max: 0, ..Config::fixed_members() }
}

#[test]
fn a_head_that_got_an_update_by_resend_answers_its_retry() {
    for seed in SEEDS {
        let stats = replay(seed, &shape());
        assert!(stats.answered > 0, "seed {seed} did little: {stats:?}");
    }
}

#[cfg(feature = "faults")]
#[test]
fn the_seeds_fail_with_a_head_that_forgets_dedup() {
    for seed in SEEDS {
        let fault = fawn_sim::Fault::ForgetDedupOnPromotion;
        assert!(fawn_sim::fails_with(seed, &shape(), fault), "seed {seed} no longer runs the scenario");
    }
}
