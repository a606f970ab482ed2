//! Guards front-end forwarding and cache coherence: with two front-ends, a put acknowledged
//! through either one is what the next get through the other returns — the owning front-end's
//! cache never serves a value older than the latest acknowledged put, even while readers
//! hammer the same keys through both front-ends.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{Cluster, Memcached, Shape};

#[test]
fn puts_through_one_frontend_are_seen_through_the_other() {
    let cluster = Cluster::start(Shape { frontends: 2, ..Shape::default() });
    let addrs = [cluster.frontend_memcached(0), cluster.frontend_memcached(1)];
    let stop = Arc::new(AtomicBool::new(false));

    // Background readers warm both caches with whatever is current.
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (addr, stop) = (addrs[r].clone(), stop.clone());
            std::thread::spawn(move || {
                let mut mc = Memcached::connect(&addr);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let _ = mc.get(&format!("coh-{}", n % 20));
                    n += 1;
                }
            })
        })
        .collect();

    let mut writers = [Memcached::connect(&addrs[0]), Memcached::connect(&addrs[1])];
    let mut checkers = [Memcached::connect(&addrs[1]), Memcached::connect(&addrs[0])];
    for round in 0..400u32 {
        let key = format!("coh-{}", round % 20);
        let side = (round % 2) as usize;
        let value = format!("round-{round}");
        assert_eq!(writers[side].set(&key, value.as_bytes()), "STORED\r\n");
        let seen = checkers[side].get(&key);
        assert_eq!(
            seen.as_deref(),
            Some(value.as_bytes()),
            "{key} after an acknowledged put in round {round}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("reader");
    }
}
