//! Guards `DataStore::merge_range` (the back-end merges two adjacent ranges' stores with it
//! after a leave): neither store's leftovers of keys outside its own range come back. A
//! split leaves the split-off keys in the store that kept the log until it is compacted, so
//! when the two parts are merged back, the upper store still holds old versions of the lower
//! range's keys. A key deleted in the lower range since (its tombstone compacted away) must
//! stay deleted, an updated one must read its new value, and the lower store's own leftovers
//! of the upper range's keys must not overwrite the upper range's versions — at once and
//! after a reopen with the merged range's filter. Also: `raise_dropped_seq_max` persists.

use std::sync::Arc;

use fawn_ds::{DataStore, KeyFilter};

mod support;
use support::{manual_opts, meta};

fn prefix(p: &'static str) -> KeyFilter {
    Arc::new(move |k: &[u8]| k.starts_with(p.as_bytes()))
}

fn value(ds: &DataStore, key: &str) -> Option<Vec<u8>> {
    ds.lookup(key.as_bytes()).unwrap().map(|e| e.value)
}

/// The upper range's store: its own keys, and leftovers of the lower range from before a split.
fn upper(dir: &std::path::Path) -> DataStore {
    let ds = DataStore::open(dir, manual_opts()).unwrap();
    for i in 0..50u64 {
        ds.store(format!("hi-{i}").as_bytes(), b"upper", meta(10 + i)).unwrap();
    }
    ds.store(b"lo-1", b"before the split", meta(5)).unwrap();
    ds.store(b"lo-2", b"before the split", meta(6)).unwrap();
    ds.set_key_filter(Some(prefix("hi-")));
    ds
}

/// The lower range's store: `lo-1` deleted (tombstone compacted away), `lo-2` updated, `lo-3`
/// new, and a leftover of the upper range's `hi-7` with a higher seq than the upper's.
fn lower(dir: &std::path::Path) -> DataStore {
    let ds = DataStore::open(dir, manual_opts()).unwrap();
    ds.store(b"hi-7", b"leftover in the lower store", meta(90)).unwrap();
    ds.store(b"lo-1", b"before the split", meta(5)).unwrap();
    ds.store(b"lo-2", b"updated", meta(100)).unwrap();
    ds.store(b"lo-3", b"new", meta(101)).unwrap();
    ds.delete(b"lo-1", meta(102)).unwrap();
    ds.set_tombstone_watermark(102);
    ds.compact().unwrap();
    assert_eq!(value(&ds, "lo-1"), None);
    ds
}

fn check(ds: &DataStore, when: &str) {
    assert_eq!(value(ds, "lo-1"), None, "{when}: a key deleted in the lower range came back");
    assert_eq!(value(ds, "lo-2").as_deref(), Some(&b"updated"[..]), "{when}: lo-2");
    assert_eq!(value(ds, "lo-3").as_deref(), Some(&b"new"[..]), "{when}: lo-3");
    for i in 0..50 {
        let key = format!("hi-{i}");
        assert_eq!(value(ds, &key).as_deref(), Some(&b"upper"[..]), "{when}: {key}");
    }
    assert_eq!(ds.stats().live_keys, 52, "{when}: live keys");
}

#[test]
fn merge_range_keeps_each_side_to_its_own_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let (up_dir, lo_dir) = (tmp.path().join("upper"), tmp.path().join("lower"));
    let up = upper(&up_dir);
    let lo = lower(&lo_dir);
    up.merge_range(&lo, prefix("lo-")).unwrap();
    up.set_key_filter(None);
    check(&up, "after the merge");
    assert!(up.max_seq() >= 102, "max_seq {} below the merged-in store's", up.max_seq());
    up.raise_dropped_seq_max(103).unwrap();
    // The lower store is left as it was.
    assert_eq!(value(&lo, "hi-7").as_deref(), Some(&b"leftover in the lower store"[..]));
    drop(lo);
    drop(up);
    let up = DataStore::open(&up_dir, manual_opts()).unwrap();
    check(&up, "after a reopen");
    assert!(up.dropped_seq_max() >= 103, "the raised drop floor did not persist");
    // A compaction with no filter keeps it so (the leftovers are gone from the log).
    up.compact().unwrap();
    check(&up, "after a compaction");
}
