//! Guards the basic contract of the public API: store/lookup/delete/iterate, limits and
//! typed errors (nothing written on oversize input), reopen with and without checkpoint,
//! the directory lock, and `iter_from` on record boundaries.

use fawn_ds::{limits, DataStore, Error, Meta, Options, RecordKind, SyncPolicy};

fn meta(seq: u64) -> Meta {
    Meta { seq, flags: seq as u32 ^ 0xabcd, expiry: 7, state: 0 }
}

#[test]
fn store_lookup_delete_reopen_iterate() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options { sync: SyncPolicy::Never, ..Options::default() };
    let ds = DataStore::open(dir.path(), opts.clone()).unwrap();
    assert!(ds.recovery_report().records_replayed == 0);
    ds.store(b"a", b"1", meta(1)).unwrap();
    ds.store(b"b", b"22", meta(2)).unwrap();
    ds.store(b"a", b"333", meta(3)).unwrap();
    ds.delete(b"b", meta(4)).unwrap();
    ds.delete(b"never-there", meta(5)).unwrap();
    assert_eq!(ds.lookup(b"a").unwrap().unwrap().value, b"333");
    assert_eq!(ds.lookup(b"a").unwrap().unwrap().meta, meta(3));
    assert_eq!(ds.lookup(b"b").unwrap(), None);
    assert_eq!(ds.max_seq(), 5);
    let recs: Vec<_> = ds.iter().map(|r| r.unwrap()).collect();
    assert_eq!(recs.len(), 5);
    assert_eq!(recs[3].kind, RecordKind::Delete);
    assert_eq!(recs[3].key, b"b");
    let from: Vec<_> = ds.iter_from(recs[2].offset).map(|r| r.unwrap()).collect();
    assert_eq!(from.len(), 3);
    assert_eq!(ds.iter_from(ds.end_offset()).count(), 0);
    assert!(ds.iter_from(recs[2].offset + 16).next().unwrap().is_err());
    assert_eq!(ds.stats().live_keys, 1);

    // Second open of the same directory is refused while the first is open.
    assert!(matches!(DataStore::open(dir.path(), opts.clone()), Err(Error::Locked)));
    drop(ds);

    // Reopen without a checkpoint: rebuilt from the log.
    let ds = DataStore::open(dir.path(), opts.clone()).unwrap();
    let r = ds.recovery_report().clone();
    assert!(!r.from_checkpoint && r.records_replayed == 5, "{r:?}");
    assert_eq!(ds.lookup(b"a").unwrap().unwrap().value, b"333");
    assert_eq!(ds.lookup(b"b").unwrap(), None);
    assert_eq!(ds.max_seq(), 5);
    ds.store(b"c", b"c", meta(6)).unwrap();
    ds.close().unwrap();

    // Reopen from the checkpoint written by close.
    let ds = DataStore::open(dir.path(), opts).unwrap();
    let r = ds.recovery_report().clone();
    assert!(r.from_checkpoint && r.records_replayed == 0, "{r:?}");
    assert_eq!(ds.lookup(b"c").unwrap().unwrap().value, b"c");
    assert_eq!(ds.lookup(b"a").unwrap().unwrap().value, b"333");
    assert_eq!(ds.max_seq(), 6);
    assert_eq!(ds.stats().live_keys, 2);
}

#[test]
fn limits_are_enforced_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let ds = DataStore::open(dir.path(), Options::default()).unwrap();
    let end = ds.end_offset();
    let big_key = vec![b'k'; limits::KEY_BYTES_MAX + 1];
    let big_val = vec![0u8; limits::VALUE_BYTES_MAX + 1];
    assert!(matches!(ds.store(&big_key, b"v", meta(1)), Err(Error::KeyTooLarge { len: 251, max: 250 })));
    assert!(matches!(ds.store(b"k", &big_val, meta(1)), Err(Error::ValueTooLarge { .. })));
    assert!(matches!(ds.store(b"", b"v", meta(1)), Err(Error::EmptyKey)));
    assert!(matches!(ds.delete(&big_key, meta(1)), Err(Error::KeyTooLarge { .. })));
    assert_eq!(ds.end_offset(), end);
    // Exactly at the limits is fine.
    let max_key = vec![b'k'; limits::KEY_BYTES_MAX];
    let max_val = vec![7u8; limits::VALUE_BYTES_MAX];
    ds.store(&max_key, &max_val, meta(2)).unwrap();
    assert_eq!(ds.lookup(&max_key).unwrap().unwrap().value, max_val);
    // Smaller configured limits.
    drop(ds);
    let opts = Options { key_bytes_max: 8, value_bytes_max: 16, ..Options::default() };
    let ds = DataStore::open(dir.path(), opts).unwrap();
    assert!(matches!(ds.store(b"123456789", b"v", meta(3)), Err(Error::KeyTooLarge { max: 8, .. })));
    assert!(matches!(ds.store(b"k", &[0; 17], meta(3)), Err(Error::ValueTooLarge { max: 16, .. })));
}

#[test]
fn datastore_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<DataStore>();
    check::<fawn_ds::Iter>();
}

#[test]
fn automatic_checkpoints_run_and_are_used() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options { sync: SyncPolicy::Never, checkpoint_every_bytes: 4096, ..Options::default() };
    let ds = DataStore::open(dir.path(), opts.clone()).unwrap();
    for i in 0..500u64 {
        ds.store(format!("k{i}").as_bytes(), &[i as u8; 100], meta(i + 1)).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ds.stats().checkpoints == 0 {
        assert!(std::time::Instant::now() < deadline, "no automatic checkpoint");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(ds.stats().checkpoint_errors, 0);
    drop(ds);
    let ds = DataStore::open(dir.path(), opts).unwrap();
    let r = ds.recovery_report();
    assert!(r.from_checkpoint && r.records_replayed < 500, "{r:?}");
    assert_eq!(ds.stats().live_keys, 500);
}

#[test]
fn iteration_sees_a_consistent_prefix_while_writes_continue() {
    let dir = tempfile::tempdir().unwrap();
    let ds = std::sync::Arc::new(
        DataStore::open(dir.path(), Options { sync: SyncPolicy::Never, ..Options::default() }).unwrap(),
    );
    let writer = {
        let ds = ds.clone();
        std::thread::spawn(move || {
            for i in 0..5000u64 {
                ds.store(format!("k{i}").as_bytes(), &[i as u8; 64], meta(i + 1)).unwrap();
            }
        })
    };
    let mut seen = 0;
    for _ in 0..20 {
        let recs: Vec<_> = ds.iter().map(|r| r.unwrap()).collect();
        // Read after the call: the end `iter()` took then is at most this (the writer
        // appends meanwhile; reading it before the call made this flaky).
        let end = ds.end_offset();
        // Exactly the records up to the end seen at call time, in order, none torn.
        for (n, r) in recs.iter().enumerate() {
            assert_eq!(r.meta.seq, n as u64 + 1);
            assert_eq!(r.value, vec![(n as u64) as u8; 64]);
            assert!(r.offset < end);
        }
        assert!(recs.len() >= seen, "an iteration saw fewer records than the one before");
        seen = recs.len();
        if let Some(last) = recs.last() {
            assert_eq!(ds.iter_from(last.offset).next().unwrap().unwrap(), *last);
        }
    }
    writer.join().unwrap();
    assert_eq!(ds.iter().count(), 5000);
}
