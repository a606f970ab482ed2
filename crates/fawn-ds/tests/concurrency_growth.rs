//! Guards online index growth under concurrency: while one writer inserts enough keys to
//! double the index several times (write-driven and background migration steps), reader
//! threads keep looking up keys already acknowledged and must always find them with the
//! right value — no key may be invisible mid-migration. After writes stop, the background
//! migrator finishes the migration on its own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_ds::{DataStore, Meta, Options, SyncPolicy};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const KEYS: u64 = 60_000;
const READERS: u64 = 3;

fn key(i: u64) -> Vec<u8> {
    format!("grow-{i}").into_bytes()
}

#[test]
fn readers_always_find_acknowledged_keys_while_the_index_grows() {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
    let opts = Options { sync: SyncPolicy::Never, ..Options::default() };
    let ds = Arc::new(DataStore::open(dir.path(), opts).unwrap());
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (ds, acked, stop) = (ds.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(r);
                let mut checked = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let n = acked.load(Ordering::Acquire);
                    if n == 0 {
                        continue;
                    }
                    let i = rng.gen_range(0..n);
                    let got = ds.lookup(&key(i)).unwrap();
                    assert_eq!(
                        got.map(|e| e.value),
                        Some(i.to_le_bytes().to_vec()),
                        "key {i} of {n} not found"
                    );
                    checked += 1;
                }
                checked
            })
        })
        .collect();
    let mut saw_migration = 0;
    for i in 0..KEYS {
        ds.store(&key(i), &i.to_le_bytes(), Meta { seq: i + 1, ..Meta::default() }).unwrap();
        acked.store(i + 1, Ordering::Release);
        saw_migration += ds.stats().index_migrating as u64;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while ds.stats().index_migrating {
        assert!(Instant::now() < deadline, "migration did not finish after writes stopped");
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    let checked: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    let st = ds.stats();
    eprintln!(
        "{KEYS} keys, {saw_migration} writes during migration, {checked} concurrent lookups checked, {:.2} B/key, worst step {} us",
        st.index_bytes as f64 / st.live_keys as f64,
        st.growth_step_max_us
    );
    assert!(saw_migration > 0 && checked > 0);
    for i in 0..KEYS {
        assert!(ds.lookup(&key(i)).unwrap().is_some());
    }
}
