//! Guards a manager crash: kill -9 of the manager under the mixed load, down for a time
//! shorter or longer than the back-ends' lease (1.5 s; past it they stop serving, by design)
//! and the failure-detection threshold (2 s), then a restart on its persisted configuration.
//! The cluster must resume without restarting anything else, the restarted manager must not
//! declare healthy back-ends failed, and every run: the history is linearizable and the final
//! scan finds every acknowledged write.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below; rounds per run
//! FAWN_FAULT_ROUNDS (default 2).

mod common;

use common::history::{run_scenario, Scenario};
use fawn_proto::native::NodeState;
use rand::Rng;

#[test]
fn manager_kill9_and_restart_under_load() {
    let mut sc = Scenario::new("faults_manager_restart");
    sc.cooldown = std::time::Duration::from_secs(4);
    sc.workload.op_deadline = std::time::Duration::from_millis(2500);
    let rounds: u32 = std::env::var("FAWN_FAULT_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    let mut failed_nodes = Vec::new();
    run_scenario(&sc, &[901], |f| {
        for _ in 0..rounds {
            let before = f.procs.config().map(|c| c.epoch);
            f.procs.kill_manager();
            f.note(format!("kill -9 manager (epoch {before:?})"));
            match f.rng.gen_range(0..3) {
                0 => f.pause_ms(200, 1000),
                1 => f.pause_ms(1500, 2500),
                _ => f.pause_ms(3000, 5000),
            }
            f.procs.restart_manager();
            f.note("restart manager");
            f.pause_ms(2500, 4000);
            let after = f.procs.config();
            f.note(format!("manager back at epoch {:?}", after.as_ref().map(|c| c.epoch)));
            if let Some(c) = after {
                failed_nodes
                    .extend(c.backends.iter().filter(|b| b.state == NodeState::Failed).map(|b| b.node));
            }
        }
    });
    // Every back-end kept running and answering: a restarted manager that declares them
    // failed (before it could have heartbeated them for the threshold) forces needless repairs.
    assert!(
        failed_nodes.is_empty(),
        "the restarted manager declared healthy back-ends failed: {failed_nodes:?}"
    );
}
