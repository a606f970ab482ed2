//! Guards a graceful leave under load (paper §3.4.4): one of four back-ends is drained with
//! `fawn leave` while clients run the mixed load through two front-ends; replacements sync
//! into its chains, the node leaves each chain once they are in, and the ranges around its
//! virtual ids merge back. No update is lost and no read goes backwards: the history is
//! linearizable and the final scan finds every acknowledged write.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Scenario};

#[test]
fn backend_leave_under_load() {
    let mut sc = Scenario::new("faults_leave_backend");
    sc.shape.backends = 4;
    sc.shape.frontends = 2;
    sc.cooldown = std::time::Duration::from_secs(3);
    run_scenario(&sc, &[701], |f| {
        let node = f.pick_backend();
        f.procs.leave(node);
        f.note(format!("fawn leave backend-{node}"));
        f.pause_ms(7000, 8000);
    });
}
