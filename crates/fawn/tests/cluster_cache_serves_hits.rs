//! Guards that the front-end cache is used at all (a cache that never hits would pass every
//! coherence test): after the start-up hold, repeated gets of a key are served from the
//! cache, an update makes the next get read the tail and return the new value, and the
//! cache then serves that value.

mod common;

use std::time::Duration;

use common::procs::{ProcShape, Procs};
use common::Memcached;

/// Gets per round.
const GETS: u64 = 200;

#[test]
fn repeated_gets_hit_the_cache_and_an_update_refreshes_it() {
    let procs = Procs::start(ProcShape::default());
    let mut mc = Memcached::connect(&procs.frontend_addrs[0].1);
    assert_eq!(mc.set("hot", b"v1"), "STORED\r\n");
    // The cache takes no fill for its start-up hold (an earlier process may have left
    // updates in the chains).
    std::thread::sleep(fawn_kv::frontend::cache::UNSETTLED_UPDATE_HOLD + Duration::from_millis(200));

    let hits = |p: &Procs| p.frontend_counter_sum("cache_hits");
    let before = hits(&procs);
    for _ in 0..GETS {
        assert_eq!(mc.get("hot").as_deref(), Some(&b"v1"[..]));
    }
    let first = hits(&procs) - before;
    assert!(first >= GETS - 1, "only {first} of {GETS} gets were cache hits");

    assert_eq!(mc.set("hot", b"v2"), "STORED\r\n");
    let before = hits(&procs);
    assert_eq!(mc.get("hot").as_deref(), Some(&b"v2"[..]), "the cache served the old value");
    assert_eq!(hits(&procs), before, "the first get after an update must read the tail");
    for _ in 0..GETS {
        assert_eq!(mc.get("hot").as_deref(), Some(&b"v2"[..]));
    }
    let second = hits(&procs) - before;
    assert!(second >= GETS - 1, "only {second} of {GETS} gets after the update were cache hits");
}
