//! Guards that a copy finished under a configuration the node has since skipped past is taken
//! again. A node finished copying a range and was then cut off from the manager, which dropped
//! that sync and, epochs later, made the node sync the range again from the same source. The
//! node never saw the epochs in between: it kept its finished copy and reported it done, while
//! its source, no longer syncing it meanwhile, had let its tombstone watermark move on and
//! compacted deletes away. The resend that was to bring the node up to date came from a log
//! without them: acknowledged updates missing, replicas differing. A replica whose copy was
//! finished more than one epoch before the configuration it installs now copies afresh.

use fawn_sim::{run_seed, Config};

#[test]
fn a_copy_finished_before_missed_configurations_is_taken_again() {
    let cfg = Config { compaction: true, ..Config::default() };
    for seed in [5003, 7655] {
        let r = run_seed(seed, &cfg);
        assert!(r.violations.is_empty(), "seed {seed}: {}", r.violations.join("; "));
        assert!(r.stats.partitions > 0 && r.stats.crashes > 0, "seed {seed} did little: {:?}", r.stats);
    }
}
