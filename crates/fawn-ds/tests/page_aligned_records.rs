//! Guards `Options::page_aligned_records`: with it, no record of at most 4 KiB crosses a
//! 4 KiB boundary of the log (single writes, batches, and compaction's copies), larger
//! records are written as usual, everything reads back after a rebuild from the log; a
//! version 1 log (written before padding existed) still opens, is not padded, and becomes
//! padded when compaction rewrites it.

use std::os::unix::fs::FileExt;

use fawn_ds::{BatchOp, DataStore, Meta, Options, Record, SyncPolicy};

const PAGE: u64 = 4096;

fn opts(aligned: bool) -> Options {
    Options {
        sync: SyncPolicy::Never,
        page_aligned_records: aligned,
        auto_compact: false,
        checkpoint_every_bytes: 0,
        ..Options::default()
    }
}

fn value(i: u64) -> Vec<u8> {
    // Sizes around the design point and beyond a page: 1..=6000 bytes.
    let len = match i % 5 {
        0 => 1000,
        1 => 256,
        2 => 3000,
        3 => (i * 37 % 6000) as usize + 1,
        _ => 4000,
    };
    (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
}

fn records(ds: &DataStore) -> Vec<Record> {
    ds.iter().map(|r| r.expect("iterate")).collect()
}

/// (records of at most a page that cross a page boundary, records checked)
fn crossings(ds: &DataStore) -> (usize, usize) {
    let recs = records(ds);
    let mut crossing = 0;
    for r in &recs {
        let len = (32 + r.key.len() + r.value.len()).div_ceil(16) as u64 * 16;
        if len <= PAGE && r.offset / PAGE != (r.offset + len - 1) / PAGE {
            crossing += 1;
        }
    }
    (crossing, recs.len())
}

fn write_all(ds: &DataStore, n: u64) {
    for i in 0..n {
        ds.store(format!("key{i}").as_bytes(), &value(i), Meta { seq: i + 1, ..Meta::default() }).unwrap();
    }
    let keys: Vec<String> = (n..2 * n).map(|i| format!("key{i}")).collect();
    let values: Vec<Vec<u8>> = (n..2 * n).map(value).collect();
    let ops: Vec<BatchOp> = (n..2 * n)
        .zip(keys.iter().zip(&values))
        .map(|(i, (k, v))| BatchOp::put(k.as_bytes(), v, Meta { seq: i + 1, ..Meta::default() }))
        .collect();
    ds.write_batch(&ops).unwrap();
}

fn check_all(ds: &DataStore, n: u64) {
    for i in 0..2 * n {
        let e = ds.lookup(format!("key{i}").as_bytes()).unwrap().unwrap_or_else(|| panic!("key{i} lost"));
        assert_eq!(e.value, value(i), "key{i}");
    }
}

/// Rewrite the log header as format version 1 (valid checksum), as an older build wrote it.
fn make_version_1(dir: &std::path::Path) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(dir.join("data.log")).unwrap();
    let mut h = [0u8; 32];
    f.read_exact_at(&mut h, 0).unwrap();
    h[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    f.write_all_at(&h, 0).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn aligned_records_never_cross_a_page_and_old_logs_still_open() {
    let n = 300;
    // Unaligned: some records cross (the baseline the option exists for).
    let plain = tempfile::tempdir().unwrap();
    let ds = DataStore::open(plain.path(), opts(false)).unwrap();
    write_all(&ds, n);
    let (crossing, total) = crossings(&ds);
    assert!(crossing > total / 10, "unaligned: only {crossing} of {total} cross");
    let plain_bytes = ds.end_offset();
    drop(ds);

    let dir = tempfile::tempdir().unwrap();
    let ds = DataStore::open(dir.path(), opts(true)).unwrap();
    write_all(&ds, n);
    assert_eq!(crossings(&ds), (0, 2 * n as usize));
    assert!(ds.end_offset() > plain_bytes, "padding must cost some space");
    check_all(&ds, n);
    drop(ds);
    // Rebuild from the log alone (no checkpoint: dropped, not closed).
    let ds = DataStore::open(dir.path(), opts(true)).unwrap();
    assert!(!ds.recovery_report().from_checkpoint);
    assert_eq!(ds.recovery_report().records_replayed, 2 * n);
    assert_eq!(ds.recovery_report().truncated_bytes, 0);
    check_all(&ds, n);
    // Opened without the option, a padded log reads the same.
    drop(ds);
    let ds = DataStore::open(dir.path(), opts(false)).unwrap();
    check_all(&ds, n);
    drop(ds);

    // A version 1 log: opens with the option, is not padded (an old reader could not skip
    // padding), and compaction rewrites it as a padded version 2 log.
    make_version_1(plain.path());
    let ds = DataStore::open(plain.path(), opts(true)).unwrap();
    check_all(&ds, n);
    for i in 2 * n..3 * n {
        ds.store(format!("key{i}").as_bytes(), &value(i), Meta { seq: i + 1, ..Meta::default() }).unwrap();
    }
    let (crossing, _) = crossings(&ds);
    assert!(crossing > 0, "a version 1 log must not get padding");
    ds.compact().unwrap();
    assert_eq!(crossings(&ds).0, 0, "compaction writes a version 2 log with padding");
    for i in 0..3 * n {
        let e = ds.lookup(format!("key{i}").as_bytes()).unwrap().unwrap_or_else(|| panic!("key{i} lost"));
        assert_eq!(e.value, value(i));
    }
    ds.close().unwrap();
    let ds = DataStore::open(plain.path(), opts(true)).unwrap();
    assert!(ds.recovery_report().from_checkpoint);
    assert_eq!(crossings(&ds).0, 0);
}
