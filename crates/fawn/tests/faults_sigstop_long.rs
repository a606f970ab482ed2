//! Guards fencing of a paused back-end: SIGSTOP for 4–5 s (past the failure-detection
//! threshold, so the manager declares it failed and repairs its chains around it), then
//! SIGCONT. The resumed node holds a stale configuration; it must not serve stale reads or
//! accept writes for chains it no longer belongs to (epochs fence it), and must rejoin.
//! Every run: the history is linearizable and the final scan finds every acknowledged write.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Scenario};

#[test]
fn long_sigstop_of_a_backend_under_load() {
    let mut sc = Scenario::new("faults_sigstop_long");
    sc.cooldown = std::time::Duration::from_secs(4);
    run_scenario(&sc, &[401], |f| {
        let node = f.pick_backend();
        f.procs.stop(node);
        f.note(format!("SIGSTOP backend-{node}"));
        f.pause_ms(4000, 5000);
        f.procs.cont(node);
        f.note(format!("SIGCONT backend-{node}"));
        f.pause_ms(4000, 5000);
    });
}
