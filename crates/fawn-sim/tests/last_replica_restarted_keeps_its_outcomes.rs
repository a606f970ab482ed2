//! Guards the persistent-outcomes design (`Config::volatile_outcomes` off): a range's last proven
//! replica killed (`kill -9`, its log intact) and restarted keeps its place, since nothing else
//! can serve the range, and used to come back with an empty dedup table: a client's retry of a
//! set it ordered before the crash was ordered again (committed at two seqs). With each
//! request's outcome kept with its record, the reopened replica rebuilds its table from its log
//! and answers the retry. With outcomes volatile this seed still fails.

use fawn_sim::{run_seed, Config};

#[test]
fn a_last_replica_restarted_with_its_log_answers_a_retry_it_ordered_before() {
    let cfg = Config { disks: true, volatile_outcomes: false, ..Config::fixed_members() };
    let r = run_seed(1661, &cfg);
    assert!(r.violations.is_empty(), "seed 1661: {}", r.violations.join("; "));
    assert!(r.stats.answered > 0 && r.stats.crashes > 0, "seed 1661 did little: {:?}", r.stats);
}
