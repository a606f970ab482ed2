//! Guards front-end crashes: with two front-ends (each owning a wedge of the key space and a
//! query cache), one is killed with kill -9 under a mixed get/put/delete load and restarted
//! 0.5–1.5 s later with the same id and addresses. Its cache starts empty and must not serve
//! anything stale; updates that were in flight through it are of unknown outcome. Every run:
//! the history is linearizable and the final scan finds every acknowledged write.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Scenario};
use rand::Rng;

#[test]
fn frontend_kill_and_restart_under_load() {
    let mut sc = Scenario::new("faults_frontend");
    sc.shape.frontends = 2;
    run_scenario(&sc, &[501], |f| {
        for _ in 0..2 {
            let id = f.rng.gen_range(0..2usize);
            f.procs.kill_frontend(id);
            f.note(format!("kill -9 frontend-{id}"));
            f.pause_ms(500, 1500);
            f.procs.restart_frontend(id);
            f.note(format!("restart frontend-{id}"));
            f.pause_ms(1500, 2500);
        }
    });
}
