//! Guards against a retry decided twice: a replica promoted to head must still recognise a
//! retry of a request its predecessor ordered. These seeds (three crashes at most) each
//! decide a retry twice when a promoted head forgets its dedup table (fault
//! `ForgetDedupOnPromotion`).

use fawn_sim::{run_seed, Config};

#[test]
fn a_head_that_got_an_update_by_resend_answers_its_retry() {
    for seed in [0, 7, 15, 33] {
        let r = run_seed(seed, &Config { partitions_max: 0, ..Config::fixed_members() });
        assert!(r.violations.is_empty(), "seed {seed}: {}", r.violations.join("; "));
        assert!(r.stats.answered > 0, "seed {seed} did little: {:?}", r.stats);
    }
}
