//! Guards the front-end cache's coherence rule under real thread races: writers run updates
//! that commit at a random moment inside their in-flight window (as a tail commits before the
//! front-end hears of it), readers miss, travel to the "tail" and back and fill, or hit. No read may
//! return a version older than one a read that finished before it started returned. A cache
//! that lets a read started during an update in flight fill the old value fails this within
//! a fraction of a second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_kv::frontend::cache::{CacheTiming, QueryCache};
use fawn_proto::op::Item;
use rand::{Rng, SeedableRng};

const WRITERS: u64 = 2;
const READERS: u64 = 4;
/// The race runs at least this long and until the readers have seen `HITS_MIN` hits (a loaded
/// machine can preempt writers inside their window, so time alone may not exercise hits), but no
/// longer than `RUN_MAX`.
const RUN: Duration = Duration::from_millis(1500);
const RUN_MAX: Duration = Duration::from_secs(30);
const HITS_MIN: u64 = 100;
const KEY: &[u8] = b"hot";

fn item(version: u64) -> Item {
    Item { value: version.to_le_bytes().to_vec(), flags: 0, expiry: 0, cas: version, state: 0 }
}

fn spin(rng: &mut impl Rng, max_us: u64) {
    let until = Instant::now() + Duration::from_micros(rng.gen_range(0..=max_us));
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

#[test]
fn no_read_goes_backwards_while_fills_race_updates() {
    let cache = Arc::new(QueryCache::new(1000, 1 << 20, CacheTiming { unsettled_hold: Duration::ZERO }));
    // The tail's committed version of the key.
    let tail = Arc::new(AtomicU64::new(0));
    // The newest version any finished read returned.
    let returned_max = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let hits = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let (cache, tail, stop) = (cache.clone(), tail.clone(), stop.clone());
        threads.push(std::thread::spawn(move || -> Option<String> {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(w);
            while !stop.load(Ordering::Relaxed) {
                let guard = cache.begin_update(KEY);
                // The update on its way down the chain (longer than a get's trip to the tail).
                spin(&mut rng, 400);
                tail.fetch_add(1, Ordering::SeqCst);
                // The commit notice on its way back to the front-end.
                spin(&mut rng, 400);
                guard.settled();
                // Time with no update of this writer in flight, when reads may fill.
                spin(&mut rng, 600);
            }
            None
        }));
    }
    for r in 0..READERS {
        let (cache, tail, returned_max, stop, hits) =
            (cache.clone(), tail.clone(), returned_max.clone(), stop.clone(), hits.clone());
        threads.push(std::thread::spawn(move || -> Option<String> {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(100 + r);
            while !stop.load(Ordering::Relaxed) {
                let floor = returned_max.load(Ordering::SeqCst);
                let got = match cache.get(KEY) {
                    Some(i) => {
                        hits.fetch_add(1, Ordering::Relaxed);
                        i.cas
                    }
                    None => {
                        let generation = cache.generation(KEY);
                        // The request on its way to the tail, and the answer on its way back.
                        spin(&mut rng, 100);
                        let version = tail.load(Ordering::SeqCst);
                        spin(&mut rng, 100);
                        cache.fill(KEY, item(version), generation);
                        version
                    }
                };
                if got < floor {
                    return Some(format!("a read returned version {got} after a read had returned {floor}"));
                }
                returned_max.fetch_max(got, Ordering::SeqCst);
                // The answer on its way to the client, and the client's next request.
                spin(&mut rng, 50);
            }
            None
        }));
    }
    let started = Instant::now();
    std::thread::sleep(RUN);
    while hits.load(Ordering::Relaxed) < HITS_MIN && started.elapsed() < RUN_MAX {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let mut problems = Vec::new();
    for t in threads {
        if let Some(p) = t.join().expect("thread") {
            problems.push(p);
        }
    }
    assert!(problems.is_empty(), "{problems:?}");
    assert!(hits.load(Ordering::Relaxed) > 0, "the cache never served a hit: the race was not exercised");
}
