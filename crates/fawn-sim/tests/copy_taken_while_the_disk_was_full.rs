//! Guards that a replica whose disk refused its copy is not taken for a copy. A node synced a
//! range while its disk was full: every resent update failed to append, yet the copy's end
//! (`SnapshotEnd`) made it report `SyncDone` and its predecessor's `CaughtUp` made it a
//! readable, proven tail holding nothing, so acknowledged writes were lost and its replica
//! differed from the others. Both ends now name the last seq sent, and are taken only once the
//! replica holds it; until then each tick asks for a resend. The seed fails when a copy's end
//! is taken unchecked (fault `IncompleteCopyAccepted`), which the second test checks.

use fawn_sim::{replay, Config};

const SEED: u64 = 315;

fn shape() -> Config {
    Config { disks: true, full_disks: true, ..Config::fixed_members() }
}

#[test]
fn a_replica_that_could_not_store_its_copy_is_not_promoted() {
    let stats = replay(SEED, &shape());
    assert!(stats.answered > 0 && stats.epochs > 10, "seed {SEED} did little: {stats:?}");
}

#[cfg(feature = "faults")]
#[test]
fn the_seed_fails_when_an_incomplete_copy_is_accepted() {
    let fault = fawn_sim::Fault::IncompleteCopyAccepted;
    assert!(fawn_sim::fails_with(SEED, &shape(), fault), "seed {SEED} no longer runs the scenario");
}
