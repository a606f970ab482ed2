//! Guards that a copy's request outcomes survive a restart of the replica that took it. A node
//! copied a range and learnt the copied updates' outcomes from the `Outcomes` messages of the
//! stream, in memory only: its copied records had no tags, and some updates' records were not
//! in the copy at all (superseded or compacted at the source). Left the range's last replica,
//! it restarted, rebuilt its outcomes from its records' tags, and as head decided clients'
//! retries of committed updates a second time. At the end of a copy the store now keeps the
//! outcomes of updates that wrote something (FAWN-DS adopts them as tags); the seeds fail
//! without that (fault `CopiedOutcomesNotKept`). Seed 13779: the default shape, the records
//! copied; seed 3756: two replicas with compaction, a record compacted away at the source.

use fawn_sim::{replay, Config};

fn cases() -> [(u64, Config); 2] {
    [(13779, Config::default()), (3756, Config { replicas: 2, compaction: true, ..Config::default() })]
}

#[test]
fn a_copys_outcomes_survive_a_restart() {
    for (seed, cfg) in cases() {
        let stats = replay(seed, &cfg);
        assert!(stats.crashes > 0, "seed {seed} did little: {stats:?}");
    }
}

#[cfg(feature = "faults")]
#[test]
fn the_seeds_fail_when_a_copys_outcomes_are_not_kept() {
    let fault = fawn_sim::Fault::CopiedOutcomesNotKept;
    for (seed, cfg) in cases() {
        assert!(fawn_sim::fails_with(seed, &cfg, fault), "seed {seed} no longer runs the scenario");
    }
}
