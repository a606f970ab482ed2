//! Guards a manager whose disk was lost: with 3 managers under the mixed load (native and
//! memcached clients), kill -9 a follower, wipe its data directory and start it again as an
//! empty member (`--join`): it must catch up from the leader and count again, shown by then
//! killing the leader, after which the rejoined manager and the remaining one must elect a
//! leader between them. Snapshots are taken every 2 entries and older entries dropped, so
//! the empty manager must install the leader's snapshot. Every run: the history is
//! linearizable, the final scan finds every acknowledged write, and no back-end refuses a
//! request for want of its lease (a timing goal, `common::timing_goal`).
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use std::time::{Duration, Instant};

use common::history::{run_scenario, Scenario};

#[test]
fn manager_restarts_with_an_empty_data_dir_under_load() {
    let mut sc = Scenario::new("faults_manager_empty_restart");
    sc.shape.managers = 3;
    sc.shape.manager_args = vec!["--raft-snapshot-every".into(), "2".into()];
    sc.cooldown = Duration::from_secs(3);
    let mut problems = Vec::new();
    let mut refusals = 0;
    run_scenario(&sc, &[951], |f| {
        let refusals_before = f.procs.backend_counter_sum("lease_refusals");
        let leader = f.procs.leader_manager();
        let wiped = (leader + 1) % 3;
        f.procs.restart_manager_empty(wiped);
        f.note(format!("manager {} restarted with an empty data directory (--join)", wiped + 1));
        // It has caught up once its applied index reaches the leader's.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = f.procs.manager_statuses();
            let applied = |i: usize| s[i].as_ref().and_then(|c| c.get("raft_applied_index").copied());
            if applied(wiped).is_some_and(|w| w > 0 && Some(w) >= applied(leader)) {
                f.note(format!("manager {} caught up to index {:?}", wiped + 1, applied(wiped)));
                let snapshot = f.procs.manager_dir(wiped).join("raft").join("raft-snapshot.json");
                if !snapshot.exists() {
                    problems.push(format!(
                        "the wiped manager caught up without a snapshot ({})",
                        snapshot.display()
                    ));
                }
                break;
            }
            if Instant::now() > deadline {
                problems.push(format!("the wiped manager did not catch up: {s:?}"));
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        f.procs.kill_manager_at(leader);
        f.note(format!("kill -9 manager {} (the leader)", leader + 1));
        f.pause_ms(1500, 2000);
        let new = f.procs.leader_manager();
        f.note(format!("manager {} leads", new + 1));
        if new == leader {
            problems.push("the killed leader still leads".to_string());
        }
        f.procs.restart_manager_at(leader);
        f.note(format!("restart manager {}", leader + 1));
        f.pause_ms(1000, 1500);
        refusals += f.procs.backend_counter_sum("lease_refusals").saturating_sub(refusals_before);
    });
    assert!(problems.is_empty(), "{problems:?}");
    common::timing_goal(
        refusals == 0,
        &format!(
            "{refusals} lease refusals: back-ends let their lease lapse while the manager group changed"
        ),
    );
}
