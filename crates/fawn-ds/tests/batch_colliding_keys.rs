//! Guards keys that share a fragment and candidate buckets, written and overwritten in one
//! batch: each keeps its own latest value, after the write and after a reopen (the replay
//! applies the batch again). Within a batch, an index entry that points at a record of the
//! same batch is compared with that record's key in memory instead of read back; an entry
//! of another key with the same fragment must never be taken for this key's.

use fawn_ds::{BatchOp, DataStore, Options, SyncPolicy};

mod support;
use support::{meta, mix};

fn opts() -> Options {
    Options {
        sync: SyncPolicy::Never,
        checkpoint_every_bytes: 0,
        auto_compact: false,
        hot_cold: false,
        // The smallest table (64 buckets) for the few keys here.
        expected_keys: 0,
        ..Options::default()
    }
}

/// (fragment, first hash value) of `key`, as docs/FORMAT.md §1 defines them.
fn place(key: &[u8]) -> (u16, u64) {
    let low = fawn_ring::key_id(key).low64();
    let frag = ((low >> (64 - fawn_ds::limits::INDEX_FRAGMENT_BITS)) as u16).max(1);
    (frag, mix(low & 0x0000_FFFF_FFFF_FFFF))
}

/// `n` keys with one fragment and the same two buckets in a table of 64, agreeing on the
/// hash bits the index keeps for growth too (so each finds the others as candidates).
fn colliding(n: usize) -> Vec<Vec<u8>> {
    let mut found: std::collections::HashMap<(u16, u64), Vec<Vec<u8>>> = Default::default();
    for i in 0u64.. {
        let k = format!("c-{i}").into_bytes();
        let (frag, v1) = place(&k);
        let same = found.entry((frag, v1 % 256)).or_default();
        same.push(k);
        if same.len() == n {
            return same.clone();
        }
    }
    unreachable!()
}

#[test]
fn colliding_keys_overwritten_in_one_batch_keep_their_own_values() {
    let dir = tempfile::tempdir().unwrap();
    let keys = colliding(3);
    let (a, b, c) = (&keys[0], &keys[1], &keys[2]);
    let ds = DataStore::open(dir.path(), opts()).unwrap();
    ds.store(a, b"a0", meta(1)).unwrap();
    let batch = [
        BatchOp::put(b, b"b1", meta(2)),
        BatchOp::put(a, b"a1", meta(3)),
        BatchOp::put(b, b"b2", meta(4)),
        BatchOp::put(a, b"a2", meta(5)),
        BatchOp::put(c, b"c1", meta(6)),
        BatchOp::delete(b, meta(7)),
        BatchOp::put(b, b"b3", meta(8)),
    ];
    ds.write_batch(&batch).unwrap();
    let expect = [(a, b"a2"), (b, b"b3"), (c, b"c1")];
    let check = |ds: &DataStore, when: &str| {
        for (k, v) in expect {
            let got = ds.lookup(k).unwrap().map(|e| e.value);
            assert_eq!(got.as_deref(), Some(&v[..]), "{} {when}", String::from_utf8_lossy(k));
        }
        assert_eq!(ds.stats().live_keys, 3, "{when}");
    };
    check(&ds, "after the batch");
    ds.close().unwrap();
    let ds = DataStore::open(dir.path(), opts()).unwrap();
    check(&ds, "after a reopen");
}
