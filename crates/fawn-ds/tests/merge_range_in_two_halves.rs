//! Guards the two-half merge (`merge_range_begin`, then `merge_range_finish`; a back-end
//! copies the bulk of two ranges being merged while both still take puts, and stops them only
//! for the rest): the merged store holds exactly the current state of the target's own keys
//! and the other store's selected keys — writes to both stores between the halves included,
//! leftovers of either side excluded — also after a reopen. Between the halves no other
//! maintenance may replace either log (refused, not corrupted); a merge dropped unfinished
//! leaves both stores as they were, usable and compactable again.

use std::collections::HashMap;
use std::sync::Arc;

use fawn_ds::{DataStore, Error, KeyFilter};

mod support;
use support::{manual_opts, meta};

fn prefix(p: &'static str) -> KeyFilter {
    Arc::new(move |k: &[u8]| k.starts_with(p.as_bytes()))
}

type Model = HashMap<Vec<u8>, Vec<u8>>;

/// Puts, overwrites and deletes of keys `<p>-0..200` in `ds`, mirrored in `model`.
fn churn(ds: &DataStore, p: &str, model: &mut Model, round: u64, seq: &mut u64) {
    for i in 0..300u64 {
        let key = format!("{p}-{:03}", (i * 7 + round * 11) % 200).into_bytes();
        *seq += 1;
        if i % 6 == 5 {
            ds.delete(&key, meta(*seq)).unwrap();
            model.remove(&key);
        } else {
            let value = format!("{p} round {round} write {i}").into_bytes();
            ds.store(&key, &value, meta(*seq)).unwrap();
            model.insert(key, value);
        }
    }
}

fn check(ds: &DataStore, model: &Model, when: &str) {
    for p in ["hi", "lo"] {
        for i in 0..200u64 {
            let key = format!("{p}-{i:03}").into_bytes();
            let got = ds.lookup(&key).unwrap().map(|e| e.value);
            assert_eq!(got.as_ref(), model.get(&key), "{when}: {}", String::from_utf8_lossy(&key));
        }
    }
    assert_eq!(ds.stats().live_keys, model.len() as u64, "{when}: live keys");
}

/// The upper store (`hi-` keys, plus a stale leftover `lo-` key) and the lower (`lo-` keys,
/// plus a stale leftover `hi-` key), each filtered to its own keys.
fn stores(dir: &std::path::Path, model: &mut Model, seq: &mut u64) -> (DataStore, DataStore) {
    let upper = DataStore::open(&dir.join("upper"), manual_opts()).unwrap();
    let lower = DataStore::open(&dir.join("lower"), manual_opts()).unwrap();
    upper.store(b"lo-001", b"leftover in the upper store", meta(1)).unwrap();
    lower.store(b"hi-001", b"leftover in the lower store", meta(2)).unwrap();
    *seq = 2;
    churn(&upper, "hi", model, 0, seq);
    churn(&lower, "lo", model, 0, seq);
    upper.set_key_filter(Some(prefix("hi-")));
    lower.set_key_filter(Some(prefix("lo-")));
    (upper, lower)
}

#[test]
fn writes_to_both_stores_between_the_halves_are_merged() {
    let dir = tempfile::tempdir().unwrap();
    let (mut model, mut seq) = (Model::new(), 0);
    let (upper, lower) = stores(dir.path(), &mut model, &mut seq);
    let begun = upper.merge_range_begin(&lower, prefix("lo-")).unwrap();
    churn(&upper, "hi", &mut model, 1, &mut seq);
    churn(&lower, "lo", &mut model, 1, &mut seq);
    let refused = upper.compact();
    assert!(matches!(refused, Err(Error::InvalidRequest(_))), "compaction between the halves: {refused:?}");
    assert!(matches!(lower.compact(), Err(Error::InvalidRequest(_))), "the other store too");
    churn(&lower, "lo", &mut model, 2, &mut seq);
    let report = upper.merge_range_finish(&lower, begun).unwrap();
    assert!(report.records_written > 0);
    upper.set_key_filter(None);
    check(&upper, &model, "merged");
    upper.compact().expect("maintenance runs again after the finish");
    check(&upper, &model, "merged and compacted");
    drop(lower);
    upper.close().unwrap();
    let upper = DataStore::open(&dir.path().join("upper"), manual_opts()).unwrap();
    check(&upper, &model, "reopened");
}

#[test]
fn a_merge_dropped_unfinished_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut model, mut seq) = (Model::new(), 0);
    let (upper, lower) = stores(dir.path(), &mut model, &mut seq);
    let upper_before: Vec<_> = (0..200u64)
        .map(|i| upper.lookup(format!("hi-{i:03}").as_bytes()).unwrap().map(|e| e.value))
        .collect();
    let begun = upper.merge_range_begin(&lower, prefix("lo-")).unwrap();
    drop(begun);
    let upper_after: Vec<_> = (0..200u64)
        .map(|i| upper.lookup(format!("hi-{i:03}").as_bytes()).unwrap().map(|e| e.value))
        .collect();
    assert_eq!(upper_before, upper_after);
    upper.compact().expect("the upper store compacts again");
    lower.compact().expect("the lower store compacts again");
    // And the merge can be run whole afterwards.
    upper.merge_range(&lower, prefix("lo-")).unwrap();
    upper.set_key_filter(None);
    check(&upper, &model, "merged after a dropped attempt");
}
