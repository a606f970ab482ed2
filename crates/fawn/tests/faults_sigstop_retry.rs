//! Guards exactly-once application of retried updates: a back-end is paused (SIGSTOP) for
//! 2.5–3.5 s — longer than the front-end's request timeout, so clients and front-ends resend
//! their updates (same request id) and copies pile up at the paused node, but shorter than
//! the failure detector's threshold for a silent node — then resumed, three times, under a
//! delete-heavy mixed load. Every copy of an update after the first must get the first's
//! answer and change nothing (a late copy of a delete that found nothing must not delete a
//! value written since). Every run: the history is linearizable and the final scan finds every
//! acknowledged write.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Scenario};

#[test]
fn sigstop_past_the_request_timeout_under_load() {
    let mut sc = Scenario::new("faults_sigstop_retry");
    sc.workload.get_percent = 40;
    sc.workload.put_percent = 30;
    run_scenario(&sc, &[901], |f| {
        for _ in 0..3 {
            let node = f.pick_backend();
            f.procs.stop(node);
            f.note(format!("SIGSTOP backend-{node}"));
            f.pause_ms(2500, 3500);
            f.procs.cont(node);
            f.note(format!("SIGCONT backend-{node}"));
            f.pause_ms(1000, 2000);
        }
    });
}
