//! Guards the batched rebuild from the log (recovery replays records in batches through the
//! same path as `write_batch`): keys written, overwritten and deleted several times inside
//! one replay batch, and across batch boundaries, come back with their last value, and the
//! live/garbage byte accounting after the rebuild equals the accounting before it.

use std::collections::BTreeMap;

use fawn_ds::{DataStore, Meta};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod support;
use support::no_checkpoint_opts;

const SEED: u64 = 0x7e91a7;
const OPS: u64 = 5_000;
/// Few keys for many ops: most records repeat a key seen a few records earlier.
const KEYS: u64 = 300;

#[test]
fn rebuild_from_log_matches_the_store_before() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let ds = DataStore::open(dir.path(), no_checkpoint_opts()).unwrap();
    for seq in 1..=OPS {
        // Runs of the same few keys, so repeats fall inside one replay batch too.
        let key = format!("key:{}", (seq / 7 + rng.gen_range(0..3)) % KEYS).into_bytes();
        let meta = Meta { seq, ..Meta::default() };
        if rng.gen_bool(0.25) {
            ds.delete(&key, meta).unwrap();
            model.remove(&key);
        } else {
            let value = format!("v{seq}-{}", "x".repeat(rng.gen_range(0..64))).into_bytes();
            ds.store(&key, &value, meta).unwrap();
            model.insert(key, value);
        }
    }
    let before = ds.stats();
    drop(ds);

    let ds = DataStore::open(dir.path(), no_checkpoint_opts()).unwrap();
    let report = ds.recovery_report();
    assert!(!report.from_checkpoint, "seed {SEED}: the reopen must rebuild from the log");
    assert_eq!(report.records_replayed, OPS, "seed {SEED}");
    for k in 0..KEYS {
        let key = format!("key:{k}").into_bytes();
        let got = ds.lookup(&key).unwrap().map(|e| e.value);
        assert_eq!(got.as_ref(), model.get(&key), "seed {SEED}: key {k}");
    }
    let after = ds.stats();
    assert_eq!(after.live_keys, model.len() as u64, "seed {SEED}");
    assert_eq!(after.live_keys, before.live_keys, "seed {SEED}");
    assert_eq!(after.live_bytes, before.live_bytes, "seed {SEED}: live bytes after the rebuild");
    assert_eq!(after.garbage_bytes, before.garbage_bytes, "seed {SEED}: garbage bytes after the rebuild");
}
