//! Guards that a failed background fsync (`SyncPolicy::Interval`) is reported, not only
//! swallowed: the store is poisoned (writes fail), and `Stats::background_sync_errors` counts
//! it (a metric); and that `create_dir_durable` creates the directories a store needs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_ds::{create_dir_durable, DataStore, FaultInjector, IoOp, Meta, Options, SyncPolicy};

#[test]
fn a_failed_background_fsync_poisons_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let fail = Arc::new(AtomicBool::new(false));
    let flag = fail.clone();
    let faults = FaultInjector::new(move |op| {
        (op == IoOp::Sync && flag.load(Ordering::Relaxed)).then(|| std::io::Error::other("injected EIO"))
    });
    let opts =
        Options { sync: SyncPolicy::Interval(Duration::from_millis(10)), faults, ..Options::default() };
    let ds = DataStore::open(dir.path(), opts).unwrap();
    ds.store(b"k", b"v", Meta::default()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(ds.stats().background_sync_errors, 0);
    fail.store(true, Ordering::Relaxed);
    ds.store(b"k2", b"v2", Meta::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while ds.stats().background_sync_errors == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stats = ds.stats();
    assert_eq!(stats.background_sync_errors, 1, "the failed background fsync was not counted");
    assert!(stats.poisoned);
    assert!(ds.store(b"k3", b"v3", Meta::default()).is_err(), "a poisoned store accepted a write");
}

#[test]
fn create_dir_durable_creates_every_missing_level() {
    let root = tempfile::tempdir().unwrap();
    let deep = root.path().join("a").join("b").join("c");
    create_dir_durable(&deep).unwrap();
    assert!(deep.is_dir());
    // Existing directories are fine.
    create_dir_durable(&deep).unwrap();
}
