//! Guards failure handling (DESIGN §5 "Failure"): a back-end is killed with kill -9
//! under a mixed get/put/delete load; the manager must detect it, repair its chains and keep
//! serving with the survivors (R=3, one failure), and when the node is restarted on its old
//! data directory it must rejoin and resync. Every run: the history is linearizable and the
//! final scan finds every acknowledged write.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Scenario};

#[test]
fn kill9_backend_then_restart_under_load() {
    let mut sc = Scenario::new("faults_kill9_backend");
    sc.cooldown = std::time::Duration::from_secs(4);
    run_scenario(&sc, &[201], |f| f.kill9_and_restart_backend());
}
