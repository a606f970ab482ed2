//! Guards that a replica whose disk refused its copy is not taken for a copy. A node synced a
//! range while its disk was full: every resent update failed to append, yet the copy's end
//! (`SnapshotEnd`) made it report `SyncDone` and its predecessor's `CaughtUp` made it a
//! readable, proven tail holding nothing, so acknowledged writes were lost and its replica
//! differed from the others. Both ends now name the last seq sent, and are taken only once the
//! replica holds it; until then each tick asks for a resend.

use fawn_sim::{run_seed, Config};

#[test]
fn a_replica_that_could_not_store_its_copy_is_not_promoted() {
    let cfg = Config { disks: true, full_disks: true, ..Config::fixed_members() };
    let r = run_seed(5, &cfg);
    assert!(r.violations.is_empty(), "seed 5: {}", r.violations.join("; "));
    assert!(r.stats.answered > 0 && r.stats.epochs > 10, "seed 5 did little: {:?}", r.stats);
}
