//! Guards a manager crash: kill -9 of the manager under the mixed load, down for a time
//! shorter or longer than the back-ends' lease (1.5 s; past it they stop serving, by design)
//! and the failure-detection threshold (2 s), then a restart on its persisted configuration.
//! The cluster must resume without restarting anything else, the restarted manager must not
//! declare healthy back-ends failed, and every run: the history is linearizable and the final
//! scan finds every acknowledged write. Each round also times how long after the restart a
//! put (to a key outside the recorded ones) is acknowledged again; it must be within
//! `RESUME_MAX`, and an outage of 3 s or more must show in the back-ends' `lease_refusals`
//! (they fenced themselves while the load went on).
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below; rounds per run
//! FAWN_FAULT_ROUNDS (default 2).

mod common;

use std::time::{Duration, Instant};

use common::history::{run_scenario, Scenario};
use fawn_client::{Client, ClientOptions};
use fawn_proto::native::NodeState;
use rand::Rng;

/// After the manager restarts, a put must be acknowledged again within this.
const RESUME_MAX: Duration = Duration::from_secs(10);

/// Time until a put of `key` through a fresh client is acknowledged (`None`: not within
/// `RESUME_MAX`).
fn time_to_put(bootstrap: &[String], key: &str) -> Option<Duration> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let start = Instant::now();
    rt.block_on(async {
        let options = ClientOptions {
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_millis(500),
            ..ClientOptions::default()
        };
        while start.elapsed() < RESUME_MAX {
            if let Ok(client) = Client::connect(bootstrap, options.clone()).await {
                while start.elapsed() < RESUME_MAX {
                    let put = client.put(key.as_bytes(), b"v");
                    if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(600), put).await {
                        return Some(start.elapsed());
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    })
}

#[test]
fn manager_kill9_and_restart_under_load() {
    let mut sc = Scenario::new("faults_manager_restart");
    sc.cooldown = std::time::Duration::from_secs(4);
    sc.workload.op_deadline = std::time::Duration::from_millis(2500);
    let rounds: u32 = std::env::var("FAWN_FAULT_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    let mut failed_nodes = Vec::new();
    let mut not_resumed = Vec::new();
    let mut unfenced = Vec::new();
    run_scenario(&sc, &[901], |f| {
        for _ in 0..rounds {
            let before = f.procs.config().map(|c| c.epoch);
            let refusals_before = f.procs.backend_counter_sum("lease_refusals");
            f.procs.kill_manager();
            let killed_at = Instant::now();
            f.note(format!("kill -9 manager (epoch {before:?})"));
            match f.rng.gen_range(0..3) {
                0 => f.pause_ms(200, 1000),
                1 => f.pause_ms(1500, 2500),
                _ => f.pause_ms(3000, 5000),
            }
            let down = killed_at.elapsed();
            let refusals = f.procs.backend_counter_sum("lease_refusals").saturating_sub(refusals_before);
            f.procs.restart_manager();
            f.note(format!(
                "restart manager after {} ms down; lease refusals meanwhile: {refusals}",
                down.as_millis()
            ));
            if down >= Duration::from_secs(3) && refusals == 0 {
                unfenced.push(down);
            }
            match time_to_put(&f.procs.bootstrap(), "mgrprobe") {
                Some(d) => f.note(format!("first put acknowledged {} ms after the restart", d.as_millis())),
                None => {
                    f.note(format!("no put acknowledged within {RESUME_MAX:?} of the restart"));
                    not_resumed.push(f.log.len());
                }
            }
            f.pause_ms(2500, 4000);
            let after = f.procs.config();
            f.note(format!("manager back at epoch {:?}", after.as_ref().map(|c| c.epoch)));
            if let Some(c) = after {
                failed_nodes
                    .extend(c.backends.iter().filter(|b| b.state == NodeState::Failed).map(|b| b.node));
            }
        }
    });
    assert!(unfenced.is_empty(), "back-ends served without a manager past their lease: {unfenced:?}");
    assert!(not_resumed.is_empty(), "the cluster did not take puts again after a manager restart");
    // Every back-end kept running and answering: a restarted manager that declares them
    // failed (before it could have heartbeated them for the threshold) forces needless repairs.
    assert!(
        failed_nodes.is_empty(),
        "the restarted manager declared healthy back-ends failed: {failed_nodes:?}"
    );
}
