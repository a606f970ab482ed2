//! Guards the data path's linearizability with no fault at all: 16 clients (native, and
//! memcached through both front-ends, so half the keys are forwarded) hammer a few hot keys
//! with gets, gets + cas, sets and deletes, back to back, while nothing fails.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Scenario};

#[test]
fn no_fault_under_contention() {
    let mut sc = Scenario::new("faults_none");
    sc.shape.frontends = 2;
    sc.workload.think = std::time::Duration::ZERO;
    run_scenario(&sc, &[101], |f| {
        f.note("no fault: load only");
        f.pause_ms(15_000, 15_001);
    });
}
