//! Guards that a restarted back-end never decides a client's retry a second time. A head killed
//! (`kill -9`: its logs intact) and restarted before the failure detector noticed used to
//! register as usual and resume its chain positions with an empty dedup table (request outcomes
//! live only in memory): the client's retry of an update it ordered before the crash was
//! ordered again, here a set committed at two seqs and answered with the second. The manager now
//! fails a registering node that is still alive in a chain first, so it rejoins as a syncing
//! replica behind a head that remembers the outcomes.

use fawn_sim::{run_seed, Config};

#[test]
fn a_head_restarted_with_its_logs_answers_a_retry_it_ordered_before() {
    let cfg = Config { disks: true, ..Config::fixed_members() };
    let r = run_seed(4554, &cfg);
    assert!(r.violations.is_empty(), "seed 4554: {}", r.violations.join("; "));
    assert!(r.stats.answered > 0 && r.stats.crashes > 0, "seed 4554 did little: {:?}", r.stats);
}
