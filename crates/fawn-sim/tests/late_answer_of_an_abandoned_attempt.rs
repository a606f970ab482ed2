//! Guards the simulated client's model of a call that timed out: its answer is dropped, as
//! the RPC layer and the front-end drop it. A leaving head decided a cas as `NotFound` (a
//! failed condition: nothing written, remembered only by that head) and its answer was
//! slow; the client had already retried, the head left, and the retry was decided again at
//! the merged range's new head as `Exists`. The client took the first, abandoned attempt's
//! answer, which no real client does, and the check reported the retry decided again
//! (seed 871).

use fawn_sim::{run_seed, Config};

#[test]
fn a_client_takes_only_the_answer_of_the_attempt_it_waits_for() {
    // The shape the seed was found in: crashes lose the node's data, no slow attempts.
    let cfg = Config { late_copies: false, ..Config::memory_only() };
    let r = run_seed(871, &cfg);
    assert!(r.violations.is_empty(), "seed 871: {}", r.violations.join("; "));
    assert!(r.stats.answered > 0, "seed 871 did little: {:?}", r.stats);
}
