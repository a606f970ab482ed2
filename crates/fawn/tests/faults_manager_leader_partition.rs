//! Guards the manager group against a partial partition: with 3 managers and 3 back-ends,
//! each in its own network namespace, the leader's links to every back-end are cut
//! (blackhole routes, both ways) for 5 s under the mixed load (native and memcached clients),
//! then healed. The leader still reaches the other managers and the front-ends, so it keeps
//! leading; the back-ends renew their leases through a follower, which asks the leader on
//! their behalf. Every run: the history is linearizable, the final scan finds every
//! acknowledged write, and no back-end refuses a request for want of its lease (a timing goal,
//! `common::timing_goal`). Prints the longest client-visible gap and the errors.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use std::time::Duration;

use common::history::{run_scenario, Scenario};

#[test]
fn manager_leader_cut_off_from_the_backends() {
    let mut sc = Scenario::new("faults_manager_leader_partition");
    sc.shape.managers = 3;
    sc.shape.netns = true;
    sc.shape.manager_netns = true;
    sc.cooldown = Duration::from_secs(3);
    let mut refusals = 0;
    run_scenario(&sc, &[961], |f| {
        let refusals_before = f.procs.backend_counter_sum("lease_refusals");
        let leader = f.procs.leader_manager();
        f.procs.partition_manager(leader);
        f.note(format!("cut manager {} (the leader) off from every back-end", leader + 1));
        std::thread::sleep(Duration::from_millis(2500));
        let during = f.procs.leader_manager();
        f.note(format!("manager {} leads", during + 1));
        std::thread::sleep(Duration::from_millis(2500));
        f.procs.heal_manager(leader);
        f.note(format!("healed manager {}'s links", leader + 1));
        f.pause_ms(1500, 2500);
        refusals += f.procs.backend_counter_sum("lease_refusals").saturating_sub(refusals_before);
    });
    common::timing_goal(
        refusals == 0,
        &format!("{refusals} lease refusals: back-ends let their lease lapse while cut off from the leader"),
    );
}
