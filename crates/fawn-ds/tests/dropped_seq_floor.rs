//! Guards `DataStore::dropped_seq_max`, which a back-end relies on to stream a rejoining
//! replica only the records above a seq: compaction that drops only superseded records leaves
//! it at 0; dropping a delete under the watermark, an expired put or an out-of-filter key
//! raises it to that record's seq; it survives a reopen (the `DROPSEQ` file), a merge takes
//! the other store's floor, and a split's new store inherits it.

use std::sync::Arc;

use fawn_ds::{DataStore, Meta};

mod support;
use support::{manual_opts, meta};

#[test]
fn only_drops_for_age_or_key_raise_the_floor_and_it_persists() {
    let dir = tempfile::tempdir().unwrap();
    let ds = DataStore::open(dir.path(), manual_opts()).unwrap();
    assert_eq!(ds.dropped_seq_max(), 0);
    // Overwrites and a delete superseded by a later put: all garbage is superseded.
    for i in 0..50u64 {
        ds.store(format!("k{}", i % 5).as_bytes(), &[1; 64], meta(i + 1)).unwrap();
    }
    ds.delete(b"k1", meta(60)).unwrap();
    ds.store(b"k1", b"back", meta(61)).unwrap();
    ds.set_tombstone_watermark(1_000);
    ds.compact().unwrap();
    assert_eq!(ds.dropped_seq_max(), 0, "only superseded records were dropped");

    // A delete at or below the watermark is dropped for its age: the floor is its seq.
    ds.delete(b"k2", meta(70)).unwrap();
    ds.store(b"k3", b"later", meta(71)).unwrap();
    ds.compact().unwrap();
    assert!(ds.lookup(b"k2").unwrap().is_none());
    assert_eq!(ds.dropped_seq_max(), 70);

    // An expired put (its key's latest record) is dropped for its age.
    ds.store(b"gone", b"x", Meta { seq: 80, flags: 0, expiry: 5, state: 0 }).unwrap();
    ds.compact().unwrap();
    assert_eq!(ds.dropped_seq_max(), 80);

    // A delete above the watermark is kept: no change.
    ds.delete(b"k4", meta(2_000)).unwrap();
    ds.compact().unwrap();
    assert_eq!(ds.dropped_seq_max(), 80);

    // Out-of-filter keys are dropped for their key.
    ds.store(b"foreign", b"y", meta(2_001)).unwrap();
    ds.set_key_filter(Some(Arc::new(|k: &[u8]| k != b"foreign")));
    ds.compact().unwrap();
    assert_eq!(ds.dropped_seq_max(), 2_001);
    drop(ds);

    let ds = DataStore::open(dir.path(), manual_opts()).unwrap();
    assert_eq!(ds.dropped_seq_max(), 2_001, "the floor survives a reopen");

    // Split: the new store inherits the floor (its keys share this store's history).
    let target = dir.path().join("split");
    let (part, _) = ds.split(Arc::new(|k: &[u8]| k.starts_with(b"k")), &target, manual_opts()).unwrap();
    assert_eq!(part.dropped_seq_max(), 2_001);
    drop(part);

    // Merge: the merged store takes the other's floor.
    let dir2 = tempfile::tempdir().unwrap();
    let a = DataStore::open(dir2.path(), manual_opts()).unwrap();
    a.store(b"a", b"1", meta(1)).unwrap();
    a.merge(&ds).unwrap();
    assert_eq!(a.dropped_seq_max(), 2_001);
}
