//! Guards `max_seq` and `dropped_seq_max` across a merge whose merged-in store's newest
//! records were compacted away (FORMAT §7.2: `max_seq` never goes backwards). That store's
//! highest seq is then only in its `MAXSEQ` floor, not in its log: the merged store must
//! still report at least it — at once, and after a reopen that finds no checkpoint (a crash
//! right after the merge, before the new state's first checkpoint), also after a later
//! compaction of the merged store. Both merge paths: the rewrite and the append to the cold
//! log.

use fawn_ds::{DataStore, Options, SyncPolicy};

mod support;
use support::meta;

fn opts(hot_cold: bool) -> Options {
    Options { sync: SyncPolicy::Never, auto_compact: false, hot_cold, ..Options::default() }
}

/// The seq of the dropped delete: `other`'s highest, above every record left in its log.
const DROPPED_SEQ: u64 = 500;

/// A store whose highest seq (a delete, dropped by compaction under the watermark) is only
/// in its `MAXSEQ` and `DROPSEQ` files after a reopen.
fn other_store(dir: &std::path::Path, hot_cold: bool) -> DataStore {
    let ds = DataStore::open(dir, opts(hot_cold)).unwrap();
    for i in 0..20u64 {
        ds.store(format!("b-{i}").as_bytes(), &[7; 100], meta(100 + i)).unwrap();
    }
    ds.delete(b"b-3", meta(DROPPED_SEQ)).unwrap();
    ds.set_tombstone_watermark(DROPPED_SEQ);
    ds.compact().unwrap();
    assert_eq!(ds.max_seq(), DROPPED_SEQ);
    assert_eq!(ds.dropped_seq_max(), DROPPED_SEQ);
    // Without its checkpoint (which records `max_seq` too), only `MAXSEQ` holds the seq.
    let ds = reopen_without_checkpoint(ds, hot_cold);
    assert_eq!(ds.max_seq(), DROPPED_SEQ, "the floor survives a reopen");
    ds
}

/// Reopen as after a crash right after the last maintenance: no checkpoint of the new state.
fn reopen_without_checkpoint(ds: DataStore, hot_cold: bool) -> DataStore {
    let dir = ds.path().to_path_buf();
    drop(ds);
    match std::fs::remove_file(dir.join("index.ckpt")) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("removing the checkpoint: {e}"),
    }
    let ds = DataStore::open(&dir, opts(hot_cold)).unwrap();
    assert!(!ds.recovery_report().from_checkpoint);
    ds
}

fn check(ds: &DataStore, when: &str) {
    assert!(ds.max_seq() >= DROPPED_SEQ, "{when}: max_seq {} went below the merged store's", ds.max_seq());
    assert!(
        ds.dropped_seq_max() >= DROPPED_SEQ,
        "{when}: dropped_seq_max {} below the merged store's",
        ds.dropped_seq_max()
    );
    for i in 0..20u64 {
        let got = ds.lookup(format!("b-{i}").as_bytes()).unwrap();
        assert_eq!(got.is_some(), i != 3, "{when}: b-{i}");
        assert!(ds.lookup(format!("a-{i}").as_bytes()).unwrap().is_some(), "{when}: a-{i}");
    }
}

fn merge_keeps_the_floor(hot_cold: bool) {
    let base = tempfile::tempdir().unwrap();
    let other = other_store(&base.path().join("other"), hot_cold);
    let ds = DataStore::open(&base.path().join("this"), opts(hot_cold)).unwrap();
    for i in 0..20u64 {
        ds.store(format!("a-{i}").as_bytes(), &[9; 100], meta(1 + i)).unwrap();
    }
    if hot_cold {
        // Most live data cold: the merge appends `other` to the cold log.
        ds.compact_hot().unwrap();
    }
    let rep = ds.merge(&other).unwrap();
    eprintln!("hot_cold {hot_cold}: merge {:?}", rep.kind);
    check(&ds, "after the merge");
    let ds = reopen_without_checkpoint(ds, hot_cold);
    check(&ds, "reopened after the merge");
    // A compaction of the merged store must carry the floor on (its log still lacks it).
    ds.compact().unwrap();
    check(&ds, "after a compaction");
    let ds = reopen_without_checkpoint(ds, hot_cold);
    check(&ds, "reopened after the compaction");
    ds.close().unwrap();
    let ds = DataStore::open(&base.path().join("this"), opts(hot_cold)).unwrap();
    check(&ds, "reopened after close");
}

#[test]
fn rewrite_merge_keeps_the_other_stores_seq_floor() {
    merge_keeps_the_floor(false);
}

#[test]
fn append_merge_keeps_the_other_stores_seq_floor() {
    merge_keeps_the_floor(true);
}
