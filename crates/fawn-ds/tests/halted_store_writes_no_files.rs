//! Guards `DataStore::halt`: a store its owner is about to remove creates no file in its
//! directory any more (no automatic checkpoint, no maintenance), although writes go on, so
//! the directory can be emptied and removed under it. The same workload on a store not halted
//! does checkpoint and compact, so the check can fail.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use fawn_ds::{DataStore, Meta, Options, SyncPolicy};

fn opts() -> Options {
    Options {
        sync: SyncPolicy::Always,
        checkpoint_every_bytes: 4096,
        auto_compact: true,
        compact_garbage_bytes: 4096,
        compact_garbage_ratio: 0.1,
        compact_check_interval: Duration::from_millis(5),
        ..Options::default()
    }
}

fn files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

/// Overwrites a few keys until the log has grown well past both the checkpoint spacing and
/// the compaction thresholds, giving the helper threads time to act.
fn churn(ds: &DataStore) {
    for i in 0..2000u32 {
        ds.store(format!("k{}", i % 8).as_bytes(), &[7u8; 200], Meta::default()).expect("store");
        if i % 200 == 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    std::thread::sleep(Duration::from_millis(100));
}

#[test]
fn a_halted_store_writes_no_files() {
    let running = tempfile::tempdir().expect("tempdir");
    let ds = DataStore::open(running.path(), opts()).expect("open");
    churn(&ds);
    let s = ds.stats();
    assert!(s.checkpoints > 0 && s.maintenance_ops > 0, "the workload makes the helpers act: {s:?}");
    drop(ds);

    let halted = tempfile::tempdir().expect("tempdir");
    let ds = DataStore::open(halted.path(), opts()).expect("open");
    ds.halt();
    let before = (files(halted.path()), ds.stats());
    churn(&ds);
    let after = ds.stats();
    assert_eq!(files(halted.path()), before.0, "no file created after halt");
    assert_eq!((after.checkpoints, after.maintenance_ops), (before.1.checkpoints, before.1.maintenance_ops));

    // The directory can now be removed while writes go on, and stays removed.
    std::fs::remove_dir_all(halted.path()).expect("remove the halted store's directory");
    churn(&ds);
    assert!(!halted.path().exists(), "nothing recreated the directory");
    ds.halt();
}
