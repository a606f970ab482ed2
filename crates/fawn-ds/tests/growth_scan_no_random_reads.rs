//! Guards that online index growth reads the log sequentially, not one random `pread` per
//! refreshed entry: a store that starts with the smallest index takes 200,000 new keys
//! (about eight levels of bucket splits, by single stores and batches, with the background
//! refresh thread and without it), and its log reads stay a small fraction of the keys
//! (fragment collisions and 1 MiB scan reads), every entry is refreshed by the scan (none
//! stashed), the load stays near its target, and every key is found.

use std::time::{Duration, Instant};

use fawn_ds::{BatchOp, DataStore, Meta, Options, SyncPolicy};

const N: u64 = 200_000;

fn key(i: u64) -> Vec<u8> {
    format!("user:{i:012}").into_bytes()
}

fn scratch() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap()
}

fn fill_and_check(background: bool, batched: bool) {
    let dir = scratch();
    let opts = Options {
        sync: SyncPolicy::Never,
        checkpoint_every_bytes: 0,
        auto_compact: false,
        background_growth: background,
        ..Options::default()
    };
    let ds = DataStore::open(dir.path(), opts).unwrap();
    let start_capacity = ds.stats().index_capacity;
    let value = [7u8; 32];
    if batched {
        let keys: Vec<Vec<u8>> = (0..N).map(key).collect();
        for (c, chunk) in keys.chunks(1000).enumerate() {
            let ops: Vec<BatchOp> = chunk
                .iter()
                .enumerate()
                .map(|(j, k)| {
                    BatchOp::put(k, &value, Meta { seq: (c * 1000 + j) as u64 + 1, ..Meta::default() })
                })
                .collect();
            ds.write_batch(&ops).unwrap();
        }
    } else {
        for i in 0..N {
            ds.store(&key(i), &value, Meta { seq: i + 1, ..Meta::default() }).unwrap();
        }
    }
    // The background migrator finishes on its own; without it, more inserts do.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut extra = 0u64;
    while ds.stats().index_migrating {
        assert!(Instant::now() < deadline, "migration did not finish");
        if background {
            std::thread::sleep(Duration::from_millis(5));
        } else {
            ds.store(&key(N + extra), &value, Meta { seq: N + extra + 1, ..Meta::default() }).unwrap();
            extra += 1;
        }
    }
    let st = ds.stats();
    eprintln!(
        "background={background} batched={batched}: capacity {start_capacity} -> {}, {} log reads, \
         {} growth scan bytes, {} unplaced, worst growth lock hold {} us, {extra} extra writes",
        st.index_capacity, st.log_reads, st.growth_scan_bytes, st.growth_unplaced, st.growth_step_max_us
    );
    assert!(st.index_capacity >= 256 * start_capacity, "the index did not grow 8 levels");
    let load = st.live_keys as f64 / st.index_capacity as f64;
    assert!((0.9..=0.96).contains(&load), "load {load:.3}: the index grows a bucket at a time");
    // One read per refreshed entry would be > N; fragment collisions cost ~N / 4000 and the
    // scans ~ 8 levels x a few 1 MiB reads.
    let reads = st.log_reads;
    assert!(reads < N / 100, "{reads} log reads for {} inserts: growth reads the log randomly", N + extra);
    assert!(st.growth_scan_bytes > 0, "growth never scanned");
    assert_eq!(st.growth_unplaced, 0, "the scan left entries for the stash");
    assert_eq!(st.live_keys, N + extra);
    for i in 0..N + extra {
        assert_eq!(ds.lookup(&key(i)).unwrap().map(|e| e.value), Some(value.to_vec()), "key {i}");
    }
}

#[test]
fn growth_scans_instead_of_reading_each_key() {
    fill_and_check(true, false);
    fill_and_check(true, true);
    fill_and_check(false, false);
    fill_and_check(false, true);
}
