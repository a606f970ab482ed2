//! Guards `write_batch`'s contract: an invalid op rejects the whole batch with nothing
//! written; a batch under `Always` costs one fdatasync and is durable when it returns; ops
//! apply in order (repeated keys, put after delete); an empty batch is a no-op; the
//! records survive a reopen without a checkpoint (replay) and iterate in batch order.

use fawn_ds::{BatchOp, DataStore, Error, Meta, Options, RecordKind, SyncPolicy};

fn meta(seq: u64) -> Meta {
    Meta { seq, flags: seq as u32, expiry: 0, state: 0 }
}

#[test]
fn batches_are_checked_whole_ordered_and_group_committed() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || Options { sync: SyncPolicy::Always, checkpoint_every_bytes: 0, ..Options::default() };
    let ds = DataStore::open(dir.path(), opts()).unwrap();

    let long = vec![b'k'; 251];
    let bad = [BatchOp::put(b"a", b"1", meta(1)), BatchOp::put(&long, b"2", meta(2))];
    assert!(matches!(ds.write_batch(&bad), Err(Error::KeyTooLarge { .. })));
    let empty_key = [BatchOp::put(b"a", b"1", meta(1)), BatchOp::delete(b"", meta(2))];
    assert!(matches!(ds.write_batch(&empty_key), Err(Error::EmptyKey)));
    let before = ds.end_offset();
    ds.write_batch(&[]).unwrap();
    assert_eq!(ds.end_offset(), before, "rejected or empty batches must write nothing");
    assert_eq!(ds.lookup(b"a").unwrap(), None);

    let fsyncs = ds.stats().fsyncs;
    let big = vec![7u8; 5000];
    let ops = [
        BatchOp::put(b"a", b"first", meta(1)),
        BatchOp::put(b"b", &big, meta(2)),
        BatchOp::put(b"a", b"second", meta(3)),
        BatchOp::delete(b"b", meta(4)),
        BatchOp::delete(b"c", meta(5)),
        BatchOp::put(b"d", b"", meta(6)),
        BatchOp::delete(b"d", meta(7)),
        BatchOp::put(b"d", b"again", meta(8)),
    ];
    ds.write_batch(&ops).unwrap();
    assert_eq!(ds.stats().fsyncs, fsyncs + 1, "one fdatasync per batch under Always");
    let check = |ds: &DataStore| {
        assert_eq!(ds.lookup(b"a").unwrap().map(|e| (e.value, e.meta)), Some((b"second".to_vec(), meta(3))));
        assert_eq!(ds.lookup(b"b").unwrap(), None);
        assert_eq!(ds.lookup(b"c").unwrap(), None);
        assert_eq!(ds.lookup(b"d").unwrap().map(|e| e.value), Some(b"again".to_vec()));
        assert_eq!(ds.stats().live_keys, 2);
        assert_eq!(ds.max_seq(), 8);
        let seqs: Vec<(u64, RecordKind)> =
            ds.iter().map(|r| r.unwrap()).map(|r| (r.meta.seq, r.kind)).collect();
        let want: Vec<(u64, RecordKind)> = (1..=8)
            .map(|s| (s, if [4, 5, 7].contains(&s) { RecordKind::Delete } else { RecordKind::Put }))
            .collect();
        assert_eq!(seqs, want);
    };
    check(&ds);
    // Dropped, not closed: no checkpoint, so the reopen replays the batch from the log.
    drop(ds);
    let ds = DataStore::open(dir.path(), opts()).unwrap();
    assert!(!ds.recovery_report().from_checkpoint);
    check(&ds);
    // Garbage accounting: 8 records appended, 2 live puts + 3 tombstones counted live.
    let s = ds.stats();
    assert!(s.garbage_bytes > 5000, "superseded 5000-byte put must count as garbage: {s:?}");
    ds.close().unwrap();
}
