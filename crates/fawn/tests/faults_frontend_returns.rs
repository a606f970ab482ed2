//! Guards the hand-back of a lent wedge: with two front-ends and three managers under the
//! mixed load, front-end 1 is killed with kill -9, stays down until the manager lends its wedge
//! to front-end 0, and is then restarted with the same id and addresses; it must take its
//! wedge back. Around both moves each key's updates pass a different front-end, so a cache
//! that served a wedge it no longer owned, or filled from updates another front-end still had
//! in flight, would return stale values. Every run: the history is linearizable and the final
//! scan finds every acknowledged write. Seeds: FAWN_SEED (one or a comma-separated list), else
//! the default below.

mod common;

use std::time::Duration;

use common::history::{run_scenario, Scenario};

#[test]
fn frontend_returns_and_takes_its_wedge_back() {
    let mut sc = Scenario::new("faults_frontend_returns");
    sc.shape.frontends = 2;
    sc.shape.managers = 3;
    sc.cooldown = Duration::from_secs(3);
    run_scenario(&sc, &[2311], |f| {
        f.procs.kill_frontend(1);
        f.note("kill -9 frontend-1");
        f.procs.wait_config("wedge 1 lent to front-end 0", |c| c.wedge_server(1) == 0);
        f.note("wedge 1 served by frontend-0");
        f.pause_ms(500, 2000);
        f.procs.restart_frontend(1);
        f.note("restart frontend-1");
        f.procs.wait_config("front-end 1 took its wedge back", |c| c.wedge_server(1) == 1);
        f.note("wedge 1 served by frontend-1 again");
        f.pause_ms(2000, 3000);
    });
}
