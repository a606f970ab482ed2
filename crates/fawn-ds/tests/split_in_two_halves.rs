//! Guards the two-half split (`split_begin`, then `split_finish`; a back-end copies the bulk
//! of a range being split while it still takes puts, and stops them only for the rest): the
//! finished store holds exactly the source's current state of the selected keys — puts,
//! overwrites and deletes made between the halves included, none of the other keys — also
//! after a reopen, and its `max_seq` is the source's at the cut. A compaction of the source
//! between the halves (its log replaced) makes the finish start over rather than copy from a
//! position in a log that is gone. A split dropped unfinished leaves no directory behind.

use std::collections::HashMap;
use std::sync::Arc;

use fawn_ds::{DataStore, KeyFilter};

mod support;
use support::{manual_opts, meta};

fn evens() -> KeyFilter {
    Arc::new(|k: &[u8]| k.last().is_some_and(|b| b % 2 == 0))
}

/// Applies puts, overwrites and deletes to `ds` and the model of the even keys.
fn churn(ds: &DataStore, model: &mut HashMap<Vec<u8>, Vec<u8>>, round: u64, seq: &mut u64) {
    for i in 0..400u64 {
        let key = format!("key-{:04}", (i * 7 + round * 13) % 600).into_bytes();
        *seq += 1;
        let even = key.last().is_some_and(|b| b % 2 == 0);
        if i % 5 == 4 {
            ds.delete(&key, meta(*seq)).unwrap();
            if even {
                model.remove(&key);
            }
        } else {
            let value = format!("round {round} write {i}").into_bytes();
            ds.store(&key, &value, meta(*seq)).unwrap();
            if even {
                model.insert(key, value);
            }
        }
    }
}

fn check(ds: &DataStore, model: &HashMap<Vec<u8>, Vec<u8>>, when: &str) {
    let mut live = 0;
    for i in 0..600u64 {
        let key = format!("key-{i:04}").into_bytes();
        let got = ds.lookup(&key).unwrap().map(|e| e.value);
        let even = key.last().is_some_and(|b| b % 2 == 0);
        let want = if even { model.get(&key).cloned() } else { None };
        assert_eq!(got, want, "{when}: key {}", String::from_utf8_lossy(&key));
        live += want.is_some() as u64;
    }
    assert_eq!(ds.stats().live_keys, live, "{when}: live keys");
}

/// A source store with a first round of writes, and its model of the even keys.
fn source(dir: &std::path::Path) -> (DataStore, HashMap<Vec<u8>, Vec<u8>>, u64) {
    let src = DataStore::open(&dir.join("src"), manual_opts()).unwrap();
    let (mut model, mut seq) = (HashMap::new(), 0);
    churn(&src, &mut model, 0, &mut seq);
    (src, model, seq)
}

fn run(compact_between: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (src, mut model, mut seq) = source(dir.path());
    let target = dir.path().join("part");
    let begun = src.split_begin(evens(), &target, manual_opts()).unwrap();
    assert!(!target.exists(), "the target appears only when the split finishes");
    churn(&src, &mut model, 1, &mut seq);
    if compact_between {
        src.compact().unwrap();
    }
    churn(&src, &mut model, 2, &mut seq);
    let (part, report) = src.split_finish(begun).unwrap();
    assert!(report.records_written > 0);
    assert_eq!(part.max_seq(), src.max_seq(), "the part continues from the source's seq");
    check(&part, &model, "finished");
    part.close().unwrap();
    let part = DataStore::open(&target, manual_opts()).unwrap();
    check(&part, &model, "reopened");
}

#[test]
fn writes_between_the_halves_reach_the_part() {
    run(false);
}

#[test]
fn a_compaction_between_the_halves_starts_the_copy_over() {
    run(true);
}

#[test]
fn a_split_dropped_unfinished_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (src, model, _) = source(dir.path());
    let target = dir.path().join("part");
    let begun = src.split_begin(evens(), &target, manual_opts()).unwrap();
    drop(begun);
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("src")], "left behind: {names:?}");
    // And the same target can be split again.
    let (part, _) = src.split(evens(), &target, manual_opts()).unwrap();
    check(&part, &model, "split again");
}
