//! Guards against an acknowledged write lost when a new tail joins a chain shrunk to one node:
//! the lone node goes on acknowledging updates by its older configuration after the new tail's
//! copy ended, so the new tail is no copy of the range until its predecessor confirmed its
//! catch-up (`TailReady`), and the chain must not be left to it before. These seeds (three
//! crashes at most) each lost an acknowledged write (an acknowledged delete came back) before.

use fawn_sim::{run_seed, Config};

#[test]
fn an_update_the_lone_node_acknowledged_outlives_its_removal() {
    for seed in [431, 6816, 10000, 10659, 14855] {
        let r = run_seed(seed, &Config::default());
        assert!(r.violations.is_empty(), "seed {seed}: {}", r.violations.join("; "));
        assert!(r.stats.answered > 0 && r.stats.crashes > 0, "seed {seed} did little: {:?}", r.stats);
    }
}
