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
    run_scenario(&sc, &[241], |f| f.kill9_and_restart_backend());
}
