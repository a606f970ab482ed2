//! Guards that a checkpoint written while the index grows is usable after a hot compaction
//! (`compact_hot`) swapped the logs mid-growth. The hot compaction moves every hot-log entry
//! to the cold log, so the growth scan's hot-log range (positions in the replaced hot log)
//! has nothing left to do; a checkpoint of the new state must not carry that range as work,
//! or it names positions past the new, shorter hot log and is rejected at open (a full
//! rebuild of the index from the logs instead of a fast restart). Same for a full
//! compaction and for a store reopened from such a checkpoint that then keeps growing.

use fawn_ds::{DataStore, Meta, Options, SyncPolicy};

fn opts() -> Options {
    Options {
        sync: SyncPolicy::Never,
        checkpoint_every_bytes: 0,
        auto_compact: false,
        // Deterministic: growth advances only through writes.
        background_growth: false,
        hot_cold: true,
        ..Options::default()
    }
}

fn key(i: u64) -> Vec<u8> {
    format!("hc-{i:08}").into_bytes()
}

fn value(i: u64) -> Vec<u8> {
    let mut v = i.to_le_bytes().to_vec();
    v.extend_from_slice(&[0xA5; 40]);
    v
}

fn check_all(ds: &DataStore, n: u64, at: &str) {
    for i in 0..n {
        let got = ds.lookup(&key(i)).unwrap().map(|e| e.value);
        assert_eq!(got, Some(value(i)), "{at}: key {i}");
    }
    assert_eq!(ds.stats().live_keys, n, "{at}: live keys");
}

/// Insert keys from `*n` until a write leaves the index migrating; returns how many keys
/// were inserted so far.
fn insert_until_migrating(ds: &DataStore, n: &mut u64) {
    let start = *n;
    while !ds.stats().index_migrating {
        ds.store(&key(*n), &value(*n), Meta { seq: *n + 1, ..Meta::default() }).unwrap();
        *n += 1;
        assert!(*n < start + 1_000_000, "the index never started to grow");
    }
}

#[test]
fn checkpoint_after_hot_compaction_mid_growth_is_accepted() {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
    let mut ds = DataStore::open(dir.path(), opts()).unwrap();
    let mut n = 0u64;
    for round in 0..4 {
        // Grow past a couple of doublings first so the hot log is much longer than what a
        // fresh hot log holds after the compaction.
        insert_until_migrating(&ds, &mut n);
        if round % 2 == 0 {
            ds.compact_hot().unwrap();
        } else {
            ds.compact().unwrap();
        }
        // A few writes into the new hot log, the index still migrating.
        for _ in 0..10 {
            ds.store(&key(n), &value(n), Meta { seq: n + 1, ..Meta::default() }).unwrap();
            n += 1;
        }
        let migrating = ds.stats().index_migrating;
        ds.checkpoint().unwrap();
        drop(ds);
        ds = DataStore::open(dir.path(), opts()).unwrap();
        let rep = ds.recovery_report().clone();
        assert!(
            rep.from_checkpoint,
            "round {round} (migrating at checkpoint: {migrating}): checkpoint rejected: {:?}",
            rep.checkpoint_error
        );
        check_all(&ds, n, &format!("round {round} after reopen"));
        // Keep growing from the reopened state.
        for _ in 0..(n / 2) {
            ds.store(&key(n), &value(n), Meta { seq: n + 1, ..Meta::default() }).unwrap();
            n += 1;
        }
        check_all(&ds, n, &format!("round {round} after more growth"));
    }
    assert_eq!(ds.stats().growth_unplaced, 0);
}
