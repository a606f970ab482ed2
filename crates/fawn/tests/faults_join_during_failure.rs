//! Guards two membership changes at once ("a join while another node fails is either
//! handled or queued safely"): a fifth back-end joins a 4-node R=3 cluster under a mixed
//! get/put/delete load, and while the join is under way (its registration, pre-copies, the
//! chain changes that follow; the seed picks the moment) one of the old back-ends — possibly
//! the tail a new replica copies from — is killed with kill -9, and restarted a few seconds
//! later. The manager must repair the failed node's chains, complete the join, and take the
//! failed node back; the history is linearizable and the final scan finds every acknowledged
//! write.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Scenario};
use fawn_proto::native::NodeState;
use rand::Rng;

#[test]
fn backend_fails_during_a_join() {
    let mut sc = Scenario::new("faults_join_during_failure");
    sc.shape.backends = 4;
    sc.cooldown = std::time::Duration::from_secs(4);
    run_scenario(&sc, &[1101], |f| {
        f.pause_ms(0, 500);
        f.procs.start_new_backend(4);
        f.note("start backend-4 (join)");
        f.pause_ms(0, 1500);
        let victim = f.rng.gen_range(0..4);
        f.procs.kill9(victim);
        f.note(format!("kill -9 backend-{victim} during the join"));
        f.pause_ms(3000, 5000);
        f.procs.restart_backend(victim);
        f.note(format!("restart backend-{victim}"));
        // Both changes complete: every node alive, every chain at R with no sync left, and
        // the new node serving in some chain.
        f.procs.wait_config("the join and the repair complete", |c| {
            c.backends.iter().all(|b| b.state == NodeState::Alive)
                && c.ranges.iter().all(|r| r.chain.len() == 3 && r.syncing.is_empty())
                && c.ranges.iter().any(|r| r.chain.contains(&4))
        });
        f.note("join complete, every chain at R");
        f.pause_ms(1000, 2000);
    });
}
