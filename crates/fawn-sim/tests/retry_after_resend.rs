//! Guards against a retry decided twice: a replica that received an update by a resend or a
//! copy (no origin on it) and later became head must still recognise a retry of its request.
//! These seeds (three crashes at most) each replayed such an interleaving before request
//! outcomes travelled with resends.

use fawn_sim::{run_seed, Config};

#[test]
fn a_head_that_got_an_update_by_resend_answers_its_retry() {
    for seed in [85, 608, 1711, 7956] {
        let r = run_seed(seed, &Config::default());
        assert!(r.violations.is_empty(), "seed {seed}: {}", r.violations.join("; "));
        assert!(r.stats.answered > 0, "seed {seed} did little: {:?}", r.stats);
    }
}
