//! Guards the manager group against the loss of its leader: with 3 managers, kill -9 the
//! leader under the mixed load (native and memcached clients), let the others elect a new
//! one, restart the old one on its data directory (it rejoins as a follower). Every run: the
//! history is linearizable, the final scan finds every acknowledged write, a new leader is
//! elected each time, and no back-end refuses a request for want of its lease (a single
//! manager's death must be invisible to the data path; a timing goal, `common::timing_goal`).
//! Prints the longest client-visible gap.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below; rounds per run
//! FAWN_FAULT_ROUNDS (default 2).

mod common;

use common::history::{run_scenario, Scenario};

#[test]
fn manager_leader_kill9_under_load() {
    let mut sc = Scenario::new("faults_manager_leader_kill9");
    sc.shape.managers = 3;
    sc.cooldown = std::time::Duration::from_secs(3);
    let rounds: u32 = std::env::var("FAWN_FAULT_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    let mut no_new_leader = Vec::new();
    let mut refusals = 0;
    run_scenario(&sc, &[931], |f| {
        for _ in 0..rounds {
            let refusals_before = f.procs.backend_counter_sum("lease_refusals");
            let old = f.procs.leader_manager();
            f.procs.kill_manager_at(old);
            f.note(format!("kill -9 manager {} (the leader)", old + 1));
            f.pause_ms(2000, 3000);
            let new = f.procs.leader_manager();
            f.note(format!("manager {} leads", new + 1));
            if new == old {
                no_new_leader.push(old);
            }
            f.procs.restart_manager_at(old);
            f.note(format!("restart manager {}", old + 1));
            f.pause_ms(1500, 2500);
            refusals += f.procs.backend_counter_sum("lease_refusals").saturating_sub(refusals_before);
        }
    });
    assert!(no_new_leader.is_empty(), "no other manager took over from a killed leader: {no_new_leader:?}");
    common::timing_goal(refusals == 0, &format!("{refusals} lease refusals: back-ends let their lease lapse while the manager group elected a new leader"));
}
