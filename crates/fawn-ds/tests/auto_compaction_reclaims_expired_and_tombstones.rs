//! Guards space reclamation for data that is never superseded: a store whose keys
//! only expire (a memcached session store) or only receive delete records has no garbage by
//! the index's accounting, yet expired puts and tombstones under the watermark are what a
//! full compaction drops. They must count toward the automatic compaction thresholds
//! (`Stats::reclaimable_bytes`), so the automatic compactor reclaims them; unexpired data
//! and tombstones above the watermark must not trigger anything.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fawn_ds::{DataStore, Meta, Options, SyncPolicy};

const KEYS: u64 = 2_000;
const VALUE_BYTES: usize = 500;

fn opts() -> Options {
    Options {
        sync: SyncPolicy::Never,
        auto_compact: true,
        compact_garbage_bytes: 64 << 10,
        compact_garbage_ratio: 0.5,
        compact_check_interval: Duration::from_millis(10),
        ..Options::default()
    }
}

fn now() -> u32 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as u32).unwrap_or(0)
}

/// Waits until a compaction has finished and the store's logs shrank below `bytes`, or panics
/// after a while. The new log is visible before the compaction's last steps (directory sync,
/// counters), so a shrunk log alone does not mean the counters are final.
fn wait_for_log_below(ds: &DataStore, bytes: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let done = |s: &fawn_ds::Stats| s.log_bytes < bytes && s.maintenance_ops >= 1;
    while !done(&ds.stats()) {
        assert!(Instant::now() < deadline, "{what}: no automatic compaction: {:?}", ds.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn expired_puts_trigger_an_automatic_compaction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = DataStore::open(dir.path(), opts()).expect("open");
    let value = vec![b's'; VALUE_BYTES];
    // Far-future expiries: nothing to reclaim, no compaction.
    for k in 0..KEYS / 10 {
        ds.store(
            format!("kept-{k}").as_bytes(),
            &value,
            Meta { seq: k + 1, flags: 0, expiry: now() + 86_400, state: 0 },
        )
        .expect("store");
    }
    // Sessions that expired two minutes ago (a whole expiry bucket in the past).
    let past = now() - 120;
    for k in 0..KEYS {
        ds.store(
            format!("session-{k}").as_bytes(),
            &value,
            Meta { seq: KEYS + k + 1, flags: 0, expiry: past, state: 0 },
        )
        .expect("store");
    }
    let before = ds.stats();
    assert_eq!(before.garbage_bytes, 0, "nothing was superseded: {before:?}");
    wait_for_log_below(&ds, before.log_bytes / 4, "expired sessions");
    let after = ds.stats();
    assert!(after.maintenance_ops >= 1 && after.reclaimable_bytes < (64 << 10), "{after:?}");
    for k in 0..KEYS / 10 {
        assert!(ds.lookup(format!("kept-{k}").as_bytes()).expect("lookup").is_some(), "kept-{k} lost");
    }
    assert!(ds.lookup(b"session-0").expect("lookup").is_none(), "an expired put survived a full compaction");
    // Idle now: the estimate was rebuilt from what the compaction kept, so no further run.
    let ops = after.maintenance_ops;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(ds.stats().maintenance_ops, ops, "compactions keep running with nothing to reclaim");
}

#[test]
fn tombstones_under_the_watermark_trigger_an_automatic_compaction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = DataStore::open(dir.path(), opts()).expect("open");
    // Deletes of keys this store never held (as a replica can receive them): only records
    // the watermark makes droppable.
    let wide_key = |k: u64| format!("gone-{k:0>200}");
    for k in 0..KEYS {
        ds.delete(wide_key(k).as_bytes(), Meta { seq: k + 1, flags: 0, expiry: 0, state: 0 })
            .expect("delete");
    }
    let before = ds.stats();
    assert_eq!(before.reclaimable_bytes, 0, "watermark 0: no tombstone may be dropped: {before:?}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(ds.stats().maintenance_ops, 0, "compacted with nothing droppable");

    // Every replica has seen them (seq buckets are ~1 s of µs clock: a watermark far above).
    ds.set_tombstone_watermark(KEYS << 21);
    assert!(ds.stats().reclaimable_bytes >= KEYS * 200, "{:?}", ds.stats());
    wait_for_log_below(&ds, before.log_bytes / 4, "tombstones");
    assert_eq!(ds.stats().reclaimable_bytes, 0);
}
