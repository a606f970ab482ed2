//! Guards the design's failure bound (DESIGN §7: at most R−1 simultaneous failures per
//! chain): with R=3 on three back-ends, two are killed with kill -9 0–1 s apart under a mixed
//! get/put/delete load, so every chain is left with one live replica. The cluster must keep
//! serving from the survivor and, when both are restarted on their data directories, resync
//! them. Every run: the history is linearizable and the final scan finds every acknowledged
//! write.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Scenario};

#[test]
fn kill9_two_of_three_backends_under_load() {
    let mut sc = Scenario::new("faults_kill9_two_backends");
    sc.cooldown = std::time::Duration::from_secs(4);
    run_scenario(&sc, &[801], |f| {
        let first = f.pick_backend();
        f.procs.kill9(first);
        f.note(format!("kill -9 backend-{first}"));
        f.pause_ms(0, 1000);
        let second = f.pick_backend();
        f.procs.kill9(second);
        f.note(format!("kill -9 backend-{second}"));
        f.pause_ms(4000, 5000);
        f.procs.restart_backend(first);
        f.note(format!("restart backend-{first}"));
        f.pause_ms(1000, 2000);
        f.procs.restart_backend(second);
        f.note(format!("restart backend-{second}"));
        f.pause_ms(3000, 4000);
    });
}
