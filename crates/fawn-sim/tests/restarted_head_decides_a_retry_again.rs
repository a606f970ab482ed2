//! Open bug, shown by the disk model: a head killed (`kill -9`: its logs intact) and restarted
//! before the failure detector noticed registers as usual and resumes its chain positions with
//! an empty dedup table (request outcomes live only in memory). The client's retry of an update
//! it ordered before the crash is ordered a second time: here a set committed at two seqs and
//! answered with the second (in other seeds a delete answered `NotFound` after it deleted).
//! A replica that rejoins by a suffix sync lacks the outcomes of what it kept as well (only the
//! suffix's travel). Ignored until fixed; the guard is this seed passing.

use fawn_sim::{run_seed, Config};

#[test]
#[ignore = "open bug: a restarted replica forgets its request outcomes"]
fn a_head_restarted_with_its_logs_answers_a_retry_it_ordered_before() {
    let cfg = Config { disks: true, ..Config::default() };
    let r = run_seed(4554, &cfg);
    assert!(r.violations.is_empty(), "seed 4554: {}", r.violations.join("; "));
    assert!(r.stats.answered > 0 && r.stats.crashes > 0, "seed 4554 did little: {:?}", r.stats);
}
