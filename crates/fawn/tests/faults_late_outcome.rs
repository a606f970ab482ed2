//! Guards the front-end cache against reads going backwards: the front-end acts on each
//! update's outcome 2 ms late (`--fault-outcome-delay-ms`, as when the tail's `Committed`
//! notice and the head's answer are slow), so for 2 ms the tail serves a new value that the
//! front-end does not know is committed. 16 memcached clients read a few hot keys (80 %
//! gets, the rest gets + cas, sets, deletes). A cache that fills from a read overlapping an
//! update in flight serves the old value after a read already returned the new one, which
//! the checker rejects (it did in the first seed with the in-flight check removed).
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Protocol, Scenario};

#[test]
fn cache_stays_coherent_when_outcomes_arrive_late() {
    let mut sc = Scenario::new("faults_late_outcome");
    sc.shape.frontend_args.extend(["--fault-outcome-delay-ms".to_string(), "2".to_string()]);
    sc.workload.think = std::time::Duration::ZERO;
    sc.workload.protocols = vec![Protocol::Memcached(0)];
    // Read-mostly, as a cache is used: a stale item would live until the key's next update.
    sc.workload.get_percent = 80;
    sc.workload.cas_percent = 8;
    sc.workload.put_percent = 10;
    run_scenario(&sc, &[111], |f| {
        f.note("every update's outcome acted on 2 ms late");
        f.pause_ms(20_000, 20_001);
    });
}
