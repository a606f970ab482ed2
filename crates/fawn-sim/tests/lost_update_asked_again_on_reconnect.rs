//! Guards that an update lost on a chain link is asked for again when the link comes back. A
//! middle still on an older configuration dropped an update from its new predecessor; its
//! request to catch up was lost too, on a link cut one way. The head's client retried the
//! update, which the head took as a duplicate in flight, and no later update came to show
//! the gap: the update stayed unacknowledged for ever. A replica now asks its predecessor to
//! resend what follows its last update whenever its link to it is new; the seed fails without
//! that ask (fault `NoResendAskOnConnect`), which the second test checks.

use fawn_sim::{replay, Config};

const SEED: u64 = 800;

fn shape() -> Config {
    Config { frontend_cache: true, ..Config::default() }
}

#[test]
fn an_update_dropped_before_a_cut_is_resent_after_it() {
    let stats = replay(SEED, &shape());
    assert!(stats.partitions > 0 && stats.cuts > 0, "seed {SEED} did little: {stats:?}");
}

#[cfg(feature = "faults")]
#[test]
fn the_seed_fails_without_the_ask() {
    let fault = fawn_sim::Fault::NoResendAskOnConnect;
    assert!(fawn_sim::fails_with(SEED, &shape(), fault), "seed {SEED} no longer runs the scenario");
}
