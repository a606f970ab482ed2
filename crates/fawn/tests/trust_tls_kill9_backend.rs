//! Guards the data path over mutual TLS: every native connection of the cluster (front-end to
//! back-end, chain links, the manager group's Raft traffic, leases, heartbeats, the test's own
//! native clients) is TLS with certificates of one CA. 16 clients (native, and memcached
//! through both front-ends) run a mixed load on hot keys while a back-end is killed with
//! kill -9 and restarted (its chain links reconnect and it resyncs over TLS). The history is
//! linearizable and the final scan finds every acknowledged write.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Scenario};

#[test]
fn kill9_backend_under_load_over_tls() {
    let mut sc = Scenario::new("trust_tls_kill9_backend");
    sc.shape.tls = true;
    sc.shape.frontends = 2;
    sc.shape.managers = 3;
    sc.cooldown = std::time::Duration::from_secs(4);
    run_scenario(&sc, &[241], |f| {
        let node = f.pick_backend();
        f.procs.kill9(node);
        f.note(format!("kill -9 backend-{node}"));
        f.pause_ms(4000, 6000);
        f.procs.restart_backend(node);
        f.note(format!("restart backend-{node} on its data directory"));
        f.pause_ms(4000, 5000);
    });
}
