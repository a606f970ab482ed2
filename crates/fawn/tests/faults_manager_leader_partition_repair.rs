//! Guards the followers' forwarding of back-end reports: 3 managers and 4 back-ends (R=3),
//! each in its own network namespace. The leader is cut off from every back-end (blackhole
//! routes, both ways), then a back-end is killed with kill -9 under the mixed load (native
//! and memcached clients). The leader still reaches the other managers and the front-ends,
//! whose reports show the dead node silent, so it fails it and re-replicates its ranges onto
//! the spare back-end; the spare's `SyncDone` and `TailReady` reach the leader only through a
//! follower, which passes them on. The repair must complete while the cut lasts (before,
//! a follower only named the unreachable leader, and the repair waited for the heal). Every
//! run: the history is linearizable and the final scan finds every acknowledged write.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use std::time::Duration;

use common::history::{run_scenario, Scenario};
use fawn_proto::native::NodeState;

#[test]
fn repair_while_the_leader_is_cut_off_from_the_backends() {
    let mut sc = Scenario::new("faults_manager_leader_partition_repair");
    sc.shape.managers = 3;
    sc.shape.backends = 4;
    sc.shape.netns = true;
    sc.shape.manager_netns = true;
    sc.cooldown = Duration::from_secs(3);
    run_scenario(&sc, &[2303], |f| {
        let leader = f.procs.leader_manager();
        f.procs.partition_manager(leader);
        f.note(format!("cut manager {} (the leader) off from every back-end", leader + 1));
        f.pause_ms(500, 1000);
        let victim = f.pick_backend();
        f.procs.kill9(victim);
        f.note(format!("kill -9 backend-{victim}"));
        let replicas = f.procs.shape.replicas as usize;
        let repaired = f.procs.wait_config("the dead back-end's chains are repaired onto the spare", |c| {
            let failed = c.backends.iter().any(|b| b.node == victim && b.state == NodeState::Failed);
            failed
                && c.ranges.iter().all(|rc| {
                    rc.chain.len() == replicas
                        && !rc.chain.contains(&victim)
                        && rc.syncing.is_empty()
                        && rc.unproven_tail.is_none()
                })
        });
        let during = f.procs.leader_manager();
        f.note(format!("repaired at epoch {} while cut off; manager {} leads", repaired.epoch, during + 1));
        assert_eq!(during, leader, "the cut-off leader kept leading (else the test proves nothing)");
        f.procs.heal_manager(leader);
        f.note(format!("healed manager {}'s links", leader + 1));
        f.pause_ms(1000, 1500);
    });
}
