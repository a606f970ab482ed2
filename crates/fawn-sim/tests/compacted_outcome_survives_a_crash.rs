//! Guards the simulator's disk model: a request outcome survives a crash as FAWN-DS keeps it,
//! in its recent tags (written to the checkpoint), not only while its record is in the log.
//! Node 1 took a copy of a range whose latest record, a committed delete, its source had
//! compacted away; its store kept the delete's outcome. A crash of its process then kept
//! only outcomes up to the highest record left, so the delete's was gone, and as the range's
//! last replica node 1 answered the client's retry `NotFound` after it had committed as
//! `Deleted` (seed 1005). Seed 1457 (longer runs) failed by the same loss, seen as a key's
//! history that is not linearizable. The disk now keeps every outcome up to what survived of
//! the log.

use fawn_sim::{replay, Config};

#[test]
fn an_outcome_whose_record_was_compacted_survives_a_crash() {
    let two_replicas = Config { replicas: 2, compaction: true, ..Config::default() };
    let long_runs = Config { ops_per_client: 100, compaction: true, ..Config::default() };
    for (seed, cfg) in [(1005, two_replicas), (1457, long_runs)] {
        let stats = replay(seed, &cfg);
        assert!(stats.crashes > 0, "seed {seed} did little: {stats:?}");
    }
}
