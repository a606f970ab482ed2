//! Guards the append merge (paper §3.3.2): with hot/cold separation, `merge(other)`
//! appends `other`'s live entries (and its unsuperseded deletes) after this store's hot
//! survivors in the cold log, without reading or rewriting this store's cold log; `other`'s
//! version of a key in both stores wins; the result survives a reopen.

use fawn_ds::{DataStore, Options, SyncPolicy};

mod support;
use support::meta;

const COLD_KEYS: u64 = 2_000;
const HOT_KEYS: u64 = 40;
const OTHER_KEYS: u64 = 200;
const VALUE_BYTES: usize = 1_000;

fn opts() -> Options {
    Options { sync: SyncPolicy::Never, auto_compact: false, hot_cold: true, ..Options::default() }
}

fn value(tag: u8) -> Vec<u8> {
    vec![tag; VALUE_BYTES]
}

fn check(ds: &DataStore, when: &str) {
    for k in 0..COLD_KEYS {
        let key = format!("cold-{k}");
        let got = ds.lookup(key.as_bytes()).expect("lookup");
        match k {
            // Overwritten by `other` (its put wins) and deleted by `other` (its delete wins).
            0 => assert_eq!(got.map(|e| e.value), Some(value(9)), "{when}: {key}"),
            1 => assert_eq!(got, None, "{when}: {key} deleted in other"),
            _ => assert_eq!(got.map(|e| e.value), Some(value(1)), "{when}: {key}"),
        }
    }
    for k in 0..HOT_KEYS {
        let key = format!("hot-{k}");
        assert_eq!(
            ds.lookup(key.as_bytes()).expect("lookup").map(|e| e.value),
            Some(value(2)),
            "{when}: {key}"
        );
    }
    for k in 0..OTHER_KEYS {
        let key = format!("other-{k}");
        assert_eq!(
            ds.lookup(key.as_bytes()).expect("lookup").map(|e| e.value),
            Some(value(3)),
            "{when}: {key}"
        );
    }
    assert_eq!(ds.lookup(b"after-merge").expect("lookup").map(|e| e.value), Some(value(4)), "{when}");
}

#[test]
fn merge_appends_other_to_the_cold_log_without_rewriting_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    let a = DataStore::open(&a_dir, opts()).expect("open a");
    let mut seq = 0;
    let mut next = || {
        seq += 1;
        meta(seq)
    };
    for k in 0..COLD_KEYS {
        a.store(format!("cold-{k}").as_bytes(), &value(1), next()).expect("store");
    }
    a.compact().expect("compact a: its data goes to the cold log");
    let cold_before = a.stats().cold_log_bytes;
    assert!(cold_before >= COLD_KEYS * VALUE_BYTES as u64, "cold log {cold_before} B");
    for k in 0..HOT_KEYS {
        a.store(format!("hot-{k}").as_bytes(), &value(2), next()).expect("store");
    }

    let b = DataStore::open(&b_dir, opts()).expect("open b");
    for k in 0..OTHER_KEYS {
        b.store(format!("other-{k}").as_bytes(), &value(3), next()).expect("store");
    }
    b.store(b"cold-0", &value(9), next()).expect("store");
    b.delete(b"cold-1", next()).expect("delete");
    // Half of `other` goes to its cold log: the merge reads both of its logs.
    b.compact().expect("compact b");

    let rep = a.merge(&b).expect("merge");
    a.store(b"after-merge", &value(4), next()).expect("store after merge");

    // Written: a's hot survivors and b's live data, not a's cold log.
    let appended = (HOT_KEYS + OTHER_KEYS + 2) * (VALUE_BYTES as u64 + 64);
    assert!(
        rep.bytes_written <= appended,
        "merge wrote {} B; a's cold log alone is {cold_before} B, the append {appended} B at most",
        rep.bytes_written
    );
    let cold_after = a.stats().cold_log_bytes;
    assert!(
        cold_after > cold_before && cold_after <= cold_before + appended,
        "cold {cold_before} -> {cold_after}"
    );
    check(&a, "after merge");
    assert_eq!(b.lookup(b"other-0").expect("lookup").map(|e| e.value), Some(value(3)), "other is unchanged");

    drop(a);
    let a = DataStore::open(&a_dir, opts()).expect("reopen a");
    check(&a, "after reopen");
}
