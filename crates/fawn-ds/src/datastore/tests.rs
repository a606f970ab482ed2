//! Guards the directory sync that `Always` no longer does under the maintenance lock: while
//! it is pending, a write is not acknowledged before the directory is synced, and a failed
//! directory sync poisons the store instead of reporting a durable write.

use crate::datastore::DataStore;
use crate::types::{Meta, Options, SyncPolicy};

fn meta(seq: u64) -> Meta {
    Meta { seq, ..Meta::default() }
}

#[test]
fn an_always_write_waits_for_the_pending_directory_sync() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("ds");
    let opts = Options { sync: SyncPolicy::Always, auto_compact: false, ..Options::default() };
    let ds = DataStore::open(&dir, opts).expect("open");
    ds.store(b"k", b"v1", meta(1)).expect("store");
    ds.compact().expect("compact");
    let inner = ds.shared().current();
    assert!(!inner.dir_sync_pending(), "compaction left its directory sync pending");

    // A write arriving between the lock's release and maintenance's own directory sync,
    // here with a pending sync that succeeds: it clears the flag.
    inner.set_dir_sync_pending(true);
    ds.store(b"k", b"v2", meta(2)).expect("store with a pending directory sync");
    assert!(!inner.dir_sync_pending(), "the write did not sync the directory");

    // The same with a directory that can no longer be synced (moved away): the write
    // must fail and poison the store, never be acknowledged.
    inner.set_dir_sync_pending(true);
    std::fs::rename(&dir, root.path().join("moved")).expect("move the directory");
    assert!(ds.store(b"k", b"v3", meta(3)).is_err(), "acknowledged without a durable directory entry");
    assert!(ds.stats().poisoned);
    assert!(ds.store(b"k2", b"v", meta(4)).is_err(), "a poisoned store accepted a write");
}
