//! Guards a quick crash-restart of a back-end: kill -9 and start again on the same data
//! directory within 0.1–0.8 s (possibly before any failure detector fires), under a mixed
//! get/put/delete load. The restarted node recovers its datastores and takes its place in
//! its chains again without losing or resurrecting anything: the history is linearizable and
//! the final scan finds every acknowledged write.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Scenario};

#[test]
fn quick_backend_crash_restart_under_load() {
    let mut sc = Scenario::new("faults_restart_backend");
    sc.cooldown = std::time::Duration::from_secs(4);
    run_scenario(&sc, &[301], |f| {
        for _ in 0..2 {
            let node = f.pick_backend();
            f.procs.kill9(node);
            f.note(format!("kill -9 backend-{node}"));
            f.pause_ms(100, 800);
            f.procs.restart_backend(node);
            f.note(format!("restart backend-{node}"));
            f.pause_ms(2000, 3000);
        }
    });
}
