//! Guards the key-count estimate that sizes the index before a rebuild from the log (a
//! pass over headers and keys that skips checksums): the estimate must count distinct
//! keys, not records, and cover the whole log, so the rebuilt index is sized once, at its
//! sizing load, instead of growing during replay (a grown table sits at ~0.94 load, one
//! sized for every record ~0.7 here).

use fawn_ds::{DataStore, Meta};

mod support;
use support::no_checkpoint_opts;

const KEYS: u64 = 60_000;
/// Overwrites of existing keys: records the estimate must not count as keys.
const OVERWRITES: u64 = 25_000;

#[test]
fn rebuild_sizes_the_index_for_distinct_keys() {
    let dir = tempfile::tempdir().unwrap();
    let ds = DataStore::open(dir.path(), no_checkpoint_opts()).unwrap();
    let value = [b'v'; 64];
    for seq in 1..=KEYS + OVERWRITES {
        let key = format!("key:{:08}", (seq - 1) % KEYS);
        ds.store(key.as_bytes(), &value, Meta { seq, ..Meta::default() }).unwrap();
    }
    drop(ds);

    let ds = DataStore::open(dir.path(), no_checkpoint_opts()).unwrap();
    assert!(!ds.recovery_report().from_checkpoint, "the reopen must rebuild from the log");
    let st = ds.stats();
    assert_eq!(st.live_keys, KEYS);
    let load = st.live_keys as f64 / st.index_capacity as f64;
    assert!(
        (0.85..0.93).contains(&load),
        "rebuilt index at load {load:.3} ({} slots for {} keys): not sized from the key estimate",
        st.index_capacity,
        st.live_keys
    );
    assert!(!st.index_migrating && st.growth_step_max_us == 0, "the index grew during replay");
    for k in (0..KEYS).step_by(997) {
        let got = ds.lookup(format!("key:{k:08}").as_bytes()).unwrap().map(|e| e.value);
        assert_eq!(got.as_deref(), Some(&value[..]), "key {k}");
    }
}
