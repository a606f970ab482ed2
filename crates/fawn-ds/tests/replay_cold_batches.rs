//! Guards the batched rebuild of a hot/cold store from its logs (the cold log is replayed
//! in batches through the same path as the hot log, with cold offsets and cold byte
//! counts): keys compacted into the cold log, then overwritten or deleted in the hot log,
//! some of them several times within one replay batch, come back with their last value;
//! the live, cold-live and garbage byte counts after the rebuild equal those before it.

use std::collections::BTreeMap;

use fawn_ds::{DataStore, Meta, Options, SyncPolicy};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SEED: u64 = 0xc01d_ba7c;
/// Spans several replay batches (256 records) of the cold log.
const KEYS: u64 = 2_000;
const HOT_OPS: u64 = 3_000;

fn opts() -> Options {
    Options {
        sync: SyncPolicy::Never,
        checkpoint_every_bytes: 0,
        auto_compact: false,
        hot_cold: true,
        ..Options::default()
    }
}

/// Delete `key` with probability `p_delete`, else put a fresh value; the model follows.
fn write(ds: &DataStore, model: &mut Model, rng: &mut SmallRng, seq: u64, key: Vec<u8>, p_delete: f64) {
    let meta = Meta { seq, ..Meta::default() };
    if rng.gen_bool(p_delete) {
        ds.delete(&key, meta).unwrap();
        model.remove(&key);
    } else {
        let value = format!("v{seq}-{}", "x".repeat(rng.gen_range(0..200))).into_bytes();
        ds.store(&key, &value, meta).unwrap();
        model.insert(key, value);
    }
}

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

#[test]
fn rebuild_of_cold_and_hot_logs_matches_the_store_before() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut model = Model::new();
    let ds = DataStore::open(dir.path(), opts()).unwrap();
    let mut seq = 0;
    // Puts, overwrites (runs of one key inside a batch) and deletes; compaction moves the
    // survivors to the cold log.
    for i in 0..KEYS * 2 {
        seq += 1;
        let key = format!("key:{}", (i / 3 + rng.gen_range(0..2)) % KEYS).into_bytes();
        write(&ds, &mut model, &mut rng, seq, key, 0.1);
    }
    ds.compact().unwrap();
    assert!(ds.stats().cold_log_bytes > 0, "seed {SEED:#x}: compaction made no cold log");
    for _ in 0..HOT_OPS {
        seq += 1;
        let key = format!("key:{}", rng.gen_range(0..KEYS)).into_bytes();
        write(&ds, &mut model, &mut rng, seq, key, 0.2);
    }
    let before = ds.stats();
    drop(ds);
    // Compaction checkpoints: remove the image so the reopen replays both logs.
    let _ = std::fs::remove_file(dir.path().join("index.ckpt"));

    let ds = DataStore::open(dir.path(), opts()).unwrap();
    let report = ds.recovery_report();
    assert!(!report.from_checkpoint, "seed {SEED:#x}: the reopen must rebuild from the logs");
    for k in 0..KEYS {
        let key = format!("key:{k}").into_bytes();
        let got = ds.lookup(&key).unwrap().map(|e| e.value);
        assert_eq!(got.as_ref(), model.get(&key), "seed {SEED:#x}: key {k}");
    }
    let after = ds.stats();
    assert_eq!(after.live_keys, model.len() as u64, "seed {SEED:#x}");
    assert_eq!(after.live_bytes, before.live_bytes, "seed {SEED:#x}: live bytes");
    assert_eq!(after.garbage_bytes, before.garbage_bytes, "seed {SEED:#x}: garbage bytes");
    assert_eq!(after.cold_garbage_bytes, before.cold_garbage_bytes, "seed {SEED:#x}: cold garbage bytes");
    assert_eq!(after.cold_log_bytes, before.cold_log_bytes, "seed {SEED:#x}");
    assert_eq!(ds.max_seq(), seq, "seed {SEED:#x}: max seq after the rebuild");
}
