//! Guards a join under load (paper §3.4.4): a fourth back-end with a new node id and
//! an empty data directory joins a 3-node R=3 cluster while clients run a mixed
//! get/put/delete load. Its ranges are pre-copied and it enters the chains without losing an
//! update or serving a read before it is consistent: the history is linearizable and the
//! final scan finds every acknowledged write.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Scenario};

#[test]
fn backend_join_under_load() {
    let mut sc = Scenario::new("faults_join_backend");
    sc.cooldown = std::time::Duration::from_secs(3);
    run_scenario(&sc, &[601], |f| {
        f.pause_ms(0, 1000);
        f.procs.start_new_backend(3);
        f.note("start backend-3 (join)");
        f.pause_ms(6000, 7000);
    });
}
