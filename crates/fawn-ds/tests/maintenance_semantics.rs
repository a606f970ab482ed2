//! Guards what compact / split / merge keep and drop, deterministically: superseded puts,
//! expired puts and out-of-filter keys are dropped; delete records are kept until the
//! tombstone watermark passes them; split and merge carry delete records; `max_seq` never
//! goes backwards, also across a restart after the record holding it was dropped; the
//! stats account live and garbage bytes; maintenance leftovers are ignored at open.

use std::collections::HashMap;
use std::sync::Arc;

use fawn_ds::{DataStore, Error, Meta, Options, RecordKind};

mod support;
use support::manual_opts;

fn meta(seq: u64) -> Meta {
    Meta { seq, flags: seq as u32, expiry: 0, state: 0 }
}

/// Replay the iteration: key -> (kind, seq) of the last record, checking per-key seq order.
fn replay(ds: &DataStore) -> HashMap<Vec<u8>, (RecordKind, u64)> {
    let mut out: HashMap<Vec<u8>, (RecordKind, u64)> = HashMap::new();
    for r in ds.iter() {
        let r = r.expect("iter");
        if let Some(&(_, prev)) = out.get(&r.key) {
            assert!(r.meta.seq > prev, "key {:?}: seq {} after {}", r.key, r.meta.seq, prev);
        }
        out.insert(r.key, (r.kind, r.meta.seq));
    }
    out
}

#[test]
fn compact_drops_garbage_keeps_tombstones_until_the_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let ds = DataStore::open(dir.path(), manual_opts()).unwrap();
    for i in 0..100u64 {
        ds.store(format!("k{}", i % 10).as_bytes(), &[i as u8; 100], meta(i + 1)).unwrap();
    }
    ds.delete(b"k3", meta(101)).unwrap();
    ds.delete(b"never-existed", meta(102)).unwrap();
    // Expired long ago; and the highest seq is held by a put that compaction drops.
    ds.store(b"old", b"x", Meta { seq: 103, flags: 0, expiry: 5, state: 0 }).unwrap();
    let before = ds.stats();
    assert!(before.garbage_bytes > before.live_bytes, "{before:?}");
    let rep = ds.compact().unwrap();
    assert!(rep.log_bytes_after < rep.log_bytes_before / 3, "{rep:?}");
    assert_eq!(ds.max_seq(), 103);
    let state = replay(&ds);
    assert_eq!(state.len(), 11, "9 live keys + 2 tombstones: {state:?}");
    assert_eq!(state[&b"k3".to_vec()], (RecordKind::Delete, 101));
    assert!(ds.lookup(b"old").unwrap().is_none());
    assert_eq!(ds.lookup(b"k9").unwrap().unwrap().meta.seq, 100);
    let after = ds.stats();
    assert_eq!(after.garbage_bytes, 0, "{after:?}");
    assert!(after.bytes_written_cleaning > 0 && after.maintenance_ops == 1);

    // Watermark below the tombstones keeps them; above drops them.
    ds.set_tombstone_watermark(101);
    ds.compact().unwrap();
    let state = replay(&ds);
    assert!(!state.contains_key(b"k3".as_slice()));
    assert_eq!(state[&b"never-existed".to_vec()], (RecordKind::Delete, 102));
    ds.set_tombstone_watermark(200);
    ds.compact().unwrap();
    assert_eq!(replay(&ds).len(), 9);
    assert_eq!(ds.max_seq(), 103, "max_seq went backwards");
    drop(ds);
    let ds = DataStore::open(dir.path(), manual_opts()).unwrap();
    assert_eq!(ds.max_seq(), 103, "max_seq went backwards after a restart");
    assert_eq!(ds.stats().live_keys, 9);
}

#[test]
fn key_filter_drops_out_of_range_keys_at_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let ds = DataStore::open(dir.path(), manual_opts()).unwrap();
    for i in 0..50u64 {
        ds.store(format!("{}{i}", if i % 2 == 0 { "a" } else { "b" }).as_bytes(), b"v", meta(i + 1)).unwrap();
    }
    ds.delete(b"b999", meta(60)).unwrap();
    ds.set_key_filter(Some(Arc::new(|k: &[u8]| k.starts_with(b"a"))));
    ds.compact().unwrap();
    let state = replay(&ds);
    assert_eq!(state.len(), 25);
    assert!(state.keys().all(|k| k.starts_with(b"a")));
    assert!(ds.lookup(b"b1").unwrap().is_none());
    assert_eq!(ds.max_seq(), 60);
}

#[test]
fn split_and_merge_carry_delete_records_and_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let ds = DataStore::open(&dir.path().join("a"), manual_opts()).unwrap();
    for i in 0..200u64 {
        ds.store(format!("k{}", i % 40).as_bytes(), &i.to_le_bytes(), meta(i + 1)).unwrap();
    }
    for i in (0..40u64).step_by(7) {
        ds.delete(format!("k{i}").as_bytes(), meta(300 + i)).unwrap();
    }
    let whole = replay(&ds);
    let low = |k: &[u8]| k.len() == 2; // k0..k9
    let target = dir.path().join("b");
    let (b, rep) = ds.split(Arc::new(low), &target, manual_opts()).unwrap();
    assert!(rep.records_written > 0 && rep.lock_hold_us < 1_000_000);
    let got = replay(&b);
    let want: HashMap<_, _> = whole.iter().filter(|(k, _)| low(k)).map(|(k, v)| (k.clone(), *v)).collect();
    assert_eq!(got, want, "split store differs");
    assert_eq!(b.max_seq(), ds.max_seq(), "split store starts at the source's max_seq");
    assert!(matches!(ds.split(Arc::new(low), &target, manual_opts()), Err(Error::InvalidRequest(_))));

    // Drop the split-off keys from the source, then merge them back.
    ds.set_key_filter(Some(Arc::new(move |k: &[u8]| !low(k))));
    ds.compact().unwrap();
    assert!(replay(&ds).keys().all(|k| !low(k)));
    ds.set_key_filter(None);
    let rep = ds.merge(&b).unwrap();
    assert!(rep.records_written > 0);
    assert_eq!(replay(&ds), whole, "merge did not restore the whole store");
    assert!(matches!(ds.merge(&ds), Err(Error::InvalidRequest(_))));
    drop(ds);
    let ds = DataStore::open(&dir.path().join("a"), manual_opts()).unwrap();
    assert_eq!(replay(&ds), whole, "merged state lost at reopen");
    for (k, (kind, seq)) in &whole {
        let got = ds.lookup(k).unwrap().map(|e| e.meta.seq);
        assert_eq!(got, (*kind == RecordKind::Put).then_some(*seq));
    }
}

#[test]
fn leftovers_of_interrupted_maintenance_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    {
        let ds = DataStore::open(dir.path(), manual_opts()).unwrap();
        ds.store(b"k", b"v", meta(1)).unwrap();
    }
    std::fs::write(dir.path().join("data.log.compact"), b"half a log").unwrap();
    std::fs::write(dir.path().join("MAXSEQ.tmp"), b"junk").unwrap();
    let ds = DataStore::open(dir.path(), manual_opts()).unwrap();
    assert_eq!(ds.lookup(b"k").unwrap().unwrap().value, b"v");
    assert!(!dir.path().join("data.log.compact").exists());
    drop(ds);
    // A damaged MAXSEQ is a typed error, not a panic and not a silent max_seq of 0.
    std::fs::write(dir.path().join("MAXSEQ"), [7u8; 24]).unwrap();
    assert!(matches!(DataStore::open(dir.path(), manual_opts()), Err(Error::Corrupt { .. })));
}

#[test]
fn automatic_compaction_runs_on_garbage_thresholds() {
    let dir = tempfile::tempdir().unwrap();
    let o = Options {
        auto_compact: true,
        compact_garbage_bytes: 64 << 10,
        compact_garbage_ratio: 0.5,
        compact_check_interval: std::time::Duration::from_millis(20),
        ..manual_opts()
    };
    let ds = DataStore::open(dir.path(), o).unwrap();
    for i in 0..4000u64 {
        ds.store(format!("k{}", i % 20).as_bytes(), &[1u8; 200], meta(i + 1)).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ds.stats().maintenance_ops == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let s = ds.stats();
    assert!(s.maintenance_ops >= 1, "no automatic compaction: {s:?}");
    assert!(s.log_bytes < 200 << 10, "{s:?}");
    assert_eq!(s.live_keys, 20);
    assert_eq!(ds.max_seq(), 4000);
}

#[test]
fn writers_are_slowed_down_when_garbage_runs_far_ahead_of_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let o = Options {
        auto_compact: true,
        compact_garbage_bytes: 16 << 10,
        // The compactor never gets to run during this test: garbage piles up.
        compact_check_interval: std::time::Duration::from_secs(3600),
        stall_garbage_ratio: 0.75,
        ..manual_opts()
    };
    let ds = DataStore::open(dir.path(), o).unwrap();
    for i in 0..400u64 {
        ds.store(b"same", &[0u8; 500], meta(i + 1)).unwrap();
    }
    let s = ds.stats();
    // 400 records of 544 B: garbage passes 32 KiB and 75 % of the log after ~60 writes.
    assert!(s.write_stalls > 300 && s.write_stalls < 400, "{s:?}");
    ds.compact().unwrap();
    ds.store(b"same", b"v", meta(401)).unwrap();
    assert_eq!(ds.stats().write_stalls, s.write_stalls, "no stall once compacted");
}
