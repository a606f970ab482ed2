//! Guards against a head that waits for ever for an ack lost with a broken connection after
//! its successor's own successor changed: the middle replica forgot the acks it had (they
//! counted per successor), so on reconnecting it re-sent none, and with no later update in the
//! range (only retries, answered from dedup, and deletes of missing keys) nothing else would
//! acknowledge them. This seed (one crash) left a client waiting 8 s before.

use fawn_sim::{run_seed, Config};

#[test]
fn a_middle_replica_resends_an_ack_its_former_successor_sent() {
    let cfg = Config { crashes_max: 1, partitions_max: 0, ..Config::fixed_members() };
    let r = run_seed(3980, &cfg);
    assert!(r.violations.is_empty(), "seed 3980: {}", r.violations.join("; "));
    assert!(r.stats.answered > 0 && r.stats.crashes > 0, "seed 3980 did little: {:?}", r.stats);
}
