//! Guards the index against the cluster's key distribution: a back-end's datastore holds the
//! keys of one ring range, i.e. keys whose key ids share their high bits. The index must not
//! derive its bucket choice from those same bits, or a range's keys crowd into a band of
//! buckets and the table grows at a fraction of its sized load (ranges of 1/60 and 1/6 of the
//! ring are checked). With `expected_keys` = the keys stored, a
//! pre-sized index must take them all without growing, whatever part of the ring they are from.

use fawn_ds::{DataStore, Meta, Options, SyncPolicy};

fn scratch() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap()
}

/// `n` keys whose key ids lie in the first `1/parts` of the ring (the range a back-end holds).
fn keys_of_one_range(n: usize, parts: u64) -> Vec<Vec<u8>> {
    let limit = u64::MAX / parts;
    (0u64..)
        .map(|i| format!("user:{i:012}").into_bytes())
        .filter(|k| fawn_ring::key_id(k).high64() <= limit)
        .take(n)
        .collect()
}

fn fill_presized(keys: &[Vec<u8>]) -> (f64, bool) {
    let dir = scratch();
    let opts = Options {
        sync: SyncPolicy::Never,
        expected_keys: keys.len() as u64,
        checkpoint_every_bytes: 0,
        ..Options::default()
    };
    let ds = DataStore::open(dir.path(), opts).unwrap();
    let capacity = ds.stats().index_capacity;
    for (i, k) in keys.iter().enumerate() {
        ds.store(k, b"v", Meta { seq: i as u64 + 1, ..Meta::default() }).unwrap();
    }
    let st = ds.stats();
    let grew = st.index_capacity != capacity || st.index_migrating || st.growth_step_max_us != 0;
    for k in keys {
        assert!(ds.lookup(k).unwrap().is_some(), "lost {:?}", String::from_utf8_lossy(k));
    }
    (st.live_keys as f64 / st.index_capacity as f64, grew)
}

#[test]
fn presized_index_takes_one_ring_range_without_growing() {
    const N: usize = 20_000;
    for parts in [1u64, 6, 60] {
        let keys = keys_of_one_range(N, parts);
        let (load, grew) = fill_presized(&keys);
        eprintln!("1/{parts} of the ring: {N} keys, load {load:.3}, grew {grew}");
        assert!(
            !grew,
            "index sized for {N} keys grew at load {load:.3} with keys from 1/{parts} of the ring"
        );
        assert!(load > 0.9, "load {load:.3}");
    }
}
