//! Guards against an acknowledged write lost when a new tail joins a chain shrunk to one node:
//! the lone node goes on acknowledging updates by its older configuration after the new tail's
//! copy ended, so the new tail is no copy of the range until its predecessor confirmed its
//! catch-up (`TailReady`), and the chain must not be left to it before. With a new tail that
//! reports `TailReady` at once (fault `TailReadyBeforeCaughtUp`, as the manager behaved before
//! it knew unproven tails), this seed loses an acknowledged write.

use fawn_sim::{run_seed, Config};

#[test]
fn an_update_the_lone_node_acknowledged_outlives_its_removal() {
    let cfg = Config {
        nodes: 3,
        replicas: 3,
        crashes_max: 3,
        ops_per_client: 80,
        partitions_max: 0,
        ..Config::fixed_members()
    };
    let seed = 1010;
    let r = run_seed(seed, &cfg);
    assert!(r.violations.is_empty(), "seed {seed}: {}", r.violations.join("; "));
    assert!(r.stats.answered > 0 && r.stats.crashes > 0, "seed {seed} did little: {:?}", r.stats);
}
