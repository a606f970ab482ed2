//! Guards the cluster under a random sequence of faults, one at a time, each chosen by the
//! seed: kill -9 + restart of a back-end, a short or long SIGSTOP of a back-end, a kill -9 +
//! restart of a front-end. At most one back-end is down at once (R=3 tolerates two). Every
//! run: the history is linearizable and the final scan finds every acknowledged write.
//! Clients abandon an operation after 2.5 s here, so updates caught by a fault are recorded
//! as of unknown outcome (they may still take effect) and the checker must account for them.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below; scripts/soak.sh
//! runs many.

mod common;

use common::history::{run_scenario, Scenario};
use rand::Rng;

#[test]
fn random_faults_under_load() {
    let mut sc = Scenario::new("faults_mixed");
    sc.shape.frontends = 2;
    sc.cooldown = std::time::Duration::from_secs(4);
    sc.workload.op_deadline = std::time::Duration::from_millis(2500);
    let rounds: u32 = std::env::var("FAWN_FAULT_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    run_scenario(&sc, &[701], |f| {
        for _ in 0..rounds {
            match f.rng.gen_range(0..5) {
                0 => {
                    let node = f.pick_backend();
                    f.procs.kill9(node);
                    f.note(format!("kill -9 backend-{node}"));
                    f.pause_ms(3000, 5000);
                    f.procs.restart_backend(node);
                    f.note(format!("restart backend-{node}"));
                }
                1 => {
                    let node = f.pick_backend();
                    f.procs.kill9(node);
                    f.note(format!("kill -9 backend-{node}"));
                    f.pause_ms(100, 800);
                    f.procs.restart_backend(node);
                    f.note(format!("quick restart backend-{node}"));
                }
                2 => {
                    let node = f.pick_backend();
                    f.procs.stop(node);
                    f.note(format!("SIGSTOP backend-{node}"));
                    f.pause_ms(200, 1200);
                    f.procs.cont(node);
                    f.note(format!("SIGCONT backend-{node}"));
                }
                3 => {
                    let node = f.pick_backend();
                    f.procs.stop(node);
                    f.note(format!("SIGSTOP backend-{node} (long)"));
                    f.pause_ms(3000, 5000);
                    f.procs.cont(node);
                    f.note(format!("SIGCONT backend-{node}"));
                }
                _ => {
                    let id = f.rng.gen_range(0..2usize);
                    f.procs.kill_frontend(id);
                    f.note(format!("kill -9 frontend-{id}"));
                    f.pause_ms(500, 1500);
                    f.procs.restart_frontend(id);
                    f.note(format!("restart frontend-{id}"));
                }
            }
            f.pause_ms(2000, 4000);
        }
    });
}
