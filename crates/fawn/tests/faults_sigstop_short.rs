//! Guards linearizability and durability across short pauses of a back-end (SIGSTOP, then
//! SIGCONT before any failure detector should fire: 0.2–1.2 s), three times, under a mixed
//! get/put/delete load from several clients. Operations stall behind the paused node and
//! then complete; nothing acknowledged may be lost and no read may be stale.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Scenario};

#[test]
fn short_sigstop_of_a_backend_under_load() {
    let sc = Scenario::new("faults_sigstop_short");
    run_scenario(&sc, &[101], |f| {
        for _ in 0..3 {
            let node = f.pick_backend();
            f.procs.stop(node);
            f.note(format!("SIGSTOP backend-{node}"));
            f.pause_ms(200, 1200);
            f.procs.cont(node);
            f.note(format!("SIGCONT backend-{node}"));
            f.pause_ms(500, 1500);
        }
    });
}
