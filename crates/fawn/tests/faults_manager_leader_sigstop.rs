//! Guards the manager group against a frozen leader (a hung host, a partition): with 3
//! managers, SIGSTOP the leader for 5 s under the mixed load (native and memcached clients),
//! then SIGCONT it (it finds a newer term and follows). Every run: the history is
//! linearizable, the final scan finds every acknowledged write, another manager leads while
//! the old one is frozen, and no back-end refuses a request for want of its lease (a timing
//! goal, `common::timing_goal`). Prints the longest client-visible gap (the goal, measured by
//! `fawn bench`, is under 1 s).
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use std::time::Duration;

use common::history::{run_scenario, Scenario};

#[test]
fn manager_leader_sigstop_5s_under_load() {
    let mut sc = Scenario::new("faults_manager_leader_sigstop");
    sc.shape.managers = 3;
    sc.cooldown = Duration::from_secs(3);
    let mut stayed_leader = Vec::new();
    let mut refusals = 0;
    run_scenario(&sc, &[941], |f| {
        let refusals_before = f.procs.backend_counter_sum("lease_refusals");
        let old = f.procs.leader_manager();
        f.procs.stop_manager(old);
        f.note(format!("SIGSTOP manager {} (the leader)", old + 1));
        std::thread::sleep(Duration::from_millis(2500));
        let during = f.procs.leader_manager();
        f.note(format!("manager {} leads", during + 1));
        if during == old {
            stayed_leader.push(old);
        }
        std::thread::sleep(Duration::from_millis(2500));
        f.procs.cont_manager(old);
        f.note(format!("SIGCONT manager {}", old + 1));
        f.pause_ms(1500, 2500);
        refusals += f.procs.backend_counter_sum("lease_refusals").saturating_sub(refusals_before);
    });
    assert!(stayed_leader.is_empty(), "no other manager took over from a frozen leader");
    common::timing_goal(
        refusals == 0,
        &format!(
            "{refusals} lease refusals: back-ends let their lease lapse while the manager leader was frozen"
        ),
    );
}
