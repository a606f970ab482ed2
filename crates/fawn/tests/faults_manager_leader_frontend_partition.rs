//! Guards the manager group against a leader cut off from the front-ends: with 3 managers in
//! their own network namespaces, 2 front-ends and 3 back-ends under the mixed load (native and
//! memcached clients), the leader's links to the root namespace (the front-ends, the clients,
//! this test) are cut (blackhole routes, both ways) for 5 s, then healed. The leader still
//! reaches the other managers and the back-ends, so it keeps leading; the front-ends report
//! their heartbeats through a follower, which passes them on. Every run: the history is
//! linearizable and the final scan finds every acknowledged write; and (a timing goal,
//! `common::timing_goal`) no front-end is declared dead, so no wedge is lent, and no back-end
//! refuses a request for want of its lease. Prints the longest client-visible gap.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use std::time::{Duration, Instant};

use common::history::{run_scenario, Scenario};

/// How long the leader stays cut off: more than twice the silence after which the manager
/// declares a front-end dead, so a front-end whose heartbeats did not get through would lose
/// its wedge.
const CUT: Duration = Duration::from_secs(5);

#[test]
fn manager_leader_cut_off_from_the_frontends() {
    let mut sc = Scenario::new("faults_manager_leader_frontend_partition");
    sc.shape.managers = 3;
    sc.shape.frontends = 2;
    sc.shape.netns = true;
    sc.shape.manager_netns = true;
    sc.cooldown = Duration::from_secs(3);
    let mut refusals = 0;
    let mut lent = Vec::new();
    run_scenario(&sc, &[967], |f| {
        let refusals_before = f.procs.backend_counter_sum("lease_refusals");
        let leader = f.procs.leader_manager();
        f.procs.partition_manager_host(leader);
        f.note(format!("cut manager {} (the leader) off from the front-ends and clients", leader + 1));
        let until = Instant::now() + CUT;
        while Instant::now() < until {
            // Asked through the group: the cut leader is skipped after one attempt.
            if let Some(c) = f.procs.config() {
                let moved: Vec<u32> =
                    (0..c.frontends_expected).filter(|w| c.wedge_server(*w) != *w).collect();
                if !moved.is_empty() {
                    lent.push(format!("epoch {}: wedges {moved:?} lent", c.epoch));
                }
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        f.procs.heal_manager_host(leader);
        f.note(format!("healed manager {}'s links to the front-ends and clients", leader + 1));
        f.pause_ms(1500, 2500);
        refusals += f.procs.backend_counter_sum("lease_refusals").saturating_sub(refusals_before);
    });
    lent.dedup();
    common::timing_goal(
        lent.is_empty(),
        &format!("a front-end was declared dead while only the leader was cut off from it: {lent:?}"),
    );
    common::timing_goal(
        refusals == 0,
        &format!("{refusals} lease refusals: back-ends let their lease lapse while the leader was cut off"),
    );
}
