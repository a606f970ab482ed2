//! Guards the recovery policy for damaged files (docs/FORMAT.md §Recovery):
//! - a torn tail (cut mid-record, or garbage appended) is truncated and reported, and every
//!   record before it survives;
//! - a flipped byte in synced data (later records prove it was fsynced) refuses to open
//!   with `Error::Corrupt` naming the record's offset; with `salvage` the log is truncated
//!   there, the loss reported and the cut bytes kept;
//! - damage in the unsynced region followed by valid unsynced records (what out-of-order
//!   writeback leaves after a power loss) is cut like a torn tail, with the loss reported;
//! - a damaged checkpoint falls back to rebuilding from the log, reported;
//! - a damaged log header refuses to open.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use fawn_ds::{DataStore, Error, Meta, Options};

mod support;
use support::no_checkpoint_opts;

const N: u64 = 200;

fn value(i: u64) -> Vec<u8> {
    vec![(i % 251) as u8; (i * 37 % 500) as usize + 1]
}

/// Fill a store with N keys, fsyncing after the first half; returns the record offsets.
fn fill(dir: &Path, checkpoint_at: Option<u64>) -> Vec<u64> {
    let ds = DataStore::open(dir, no_checkpoint_opts()).unwrap();
    for i in 0..N {
        if i == N / 2 {
            ds.sync().unwrap();
        }
        ds.store(format!("k{i}").as_bytes(), &value(i), Meta { seq: i + 1, ..Meta::default() }).unwrap();
        if checkpoint_at == Some(i) {
            ds.checkpoint().unwrap();
        }
    }
    let offsets = ds.iter().map(|r| r.unwrap().offset).collect();
    ds.sync().unwrap();
    offsets
}

fn log_path(dir: &Path) -> std::path::PathBuf {
    dir.join("data.log")
}

fn flip_byte(path: &Path, at: u64) {
    let f = OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x20], at).unwrap();
}

fn check_keys(ds: &DataStore, present: std::ops::Range<u64>) {
    for i in 0..N {
        let got = ds.lookup(format!("k{i}").as_bytes()).unwrap();
        if present.contains(&i) {
            assert_eq!(got.map(|e| e.value), Some(value(i)), "key {i} lost");
        } else {
            assert_eq!(got, None, "key {i} should be gone");
        }
    }
}

#[test]
fn torn_tail_is_truncated_and_reported() {
    for cut in [1u64, 7, 16, 33] {
        let dir = tempfile::tempdir().unwrap();
        let offsets = fill(dir.path(), None);
        let len = std::fs::metadata(log_path(dir.path())).unwrap().len();
        let f = OpenOptions::new().write(true).open(log_path(dir.path())).unwrap();
        f.set_len(len - cut).unwrap();
        let ds = DataStore::open(dir.path(), no_checkpoint_opts()).unwrap();
        let r = ds.recovery_report().clone();
        let last = *offsets.last().unwrap();
        assert_eq!(r.corrupt_offset, Some(last), "cut {cut}: {r:?}");
        assert_eq!(r.truncated_bytes, len - cut - last);
        assert_eq!(r.dropped_records_estimate, 1);
        check_keys(&ds, 0..N - 1);
        // The store keeps working after the cut, and the next open is clean.
        ds.store(b"after", b"x", Meta::default()).unwrap();
        drop(ds);
        let ds = DataStore::open(dir.path(), no_checkpoint_opts()).unwrap();
        assert_eq!(ds.recovery_report().truncated_bytes, 0);
        assert!(ds.lookup(b"after").unwrap().is_some());
    }
}

#[test]
fn garbage_after_the_last_record_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), Some(N / 2));
    let len = std::fs::metadata(log_path(dir.path())).unwrap().len();
    let f = OpenOptions::new().write(true).open(log_path(dir.path())).unwrap();
    let garbage: Vec<u8> = (0..4000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    f.write_all_at(&garbage, len).unwrap();
    let ds = DataStore::open(dir.path(), no_checkpoint_opts()).unwrap();
    let r = ds.recovery_report().clone();
    assert!(r.from_checkpoint, "{r:?}");
    assert_eq!((r.corrupt_offset, r.truncated_bytes), (Some(len), 4000), "{r:?}");
    check_keys(&ds, 0..N);
}

#[test]
fn flipped_byte_in_synced_data_refuses_to_open_then_salvage_reports_loss() {
    let dir = tempfile::tempdir().unwrap();
    let offsets = fill(dir.path(), None);
    let bad = offsets[N as usize / 4];
    flip_byte(&log_path(dir.path()), bad + 40); // inside the key/value
    match DataStore::open(dir.path(), no_checkpoint_opts()) {
        Err(Error::Corrupt { offset, reason }) => {
            assert_eq!(offset, bad);
            assert!(reason.contains("salvage"), "{reason}");
        }
        other => panic!("expected Corrupt at {bad}, got {other:?}"),
    }
    // The refused open changed nothing: the same error again.
    assert!(matches!(DataStore::open(dir.path(), no_checkpoint_opts()), Err(Error::Corrupt { .. })));
    let ds = DataStore::open(dir.path(), Options { salvage: true, ..no_checkpoint_opts() }).unwrap();
    let r = ds.recovery_report().clone();
    assert_eq!(r.corrupt_offset, Some(bad));
    assert_eq!(r.dropped_records_estimate, N - N / 4, "{r:?}");
    check_keys(&ds, 0..N / 4);
    // The cut bytes are kept for the operator.
    let kept = std::fs::metadata(dir.path().join(format!("data.log.cut-{bad}"))).unwrap().len();
    assert_eq!(kept, r.truncated_bytes);
}

#[test]
fn damage_in_the_unsynced_tail_is_cut_like_a_torn_write() {
    let dir = tempfile::tempdir().unwrap();
    let offsets = fill(dir.path(), None);
    let bad = offsets[3 * N as usize / 4];
    // A hole of zeros, as a page lost in writeback leaves it, with valid records after it.
    let f = OpenOptions::new().write(true).open(log_path(dir.path())).unwrap();
    f.write_all_at(&[0u8; 64], bad).unwrap();
    let ds = DataStore::open(dir.path(), no_checkpoint_opts()).unwrap();
    let r = ds.recovery_report().clone();
    assert_eq!(r.corrupt_offset, Some(bad), "{r:?}");
    assert_eq!(r.dropped_records_estimate, N - 3 * N / 4, "{r:?}");
    check_keys(&ds, 0..3 * N / 4);
    assert!(dir.path().join(format!("data.log.cut-{bad}")).exists());
}

#[test]
fn flipped_header_byte_mid_log_is_caught_too() {
    // A flip in the length field makes the record look longer; it must not be mistaken
    // for a torn tail that swallows the rest of the log.
    let dir = tempfile::tempdir().unwrap();
    let offsets = fill(dir.path(), None);
    let bad = offsets[10];
    flip_byte(&log_path(dir.path()), bad + 10);
    assert!(
        matches!(DataStore::open(dir.path(), no_checkpoint_opts()), Err(Error::Corrupt { offset, .. }) if offset == bad)
    );
}

#[test]
fn corrupt_checkpoint_falls_back_to_the_log() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), Some(N - 1));
    let ckpt = dir.path().join("index.ckpt");
    let len = std::fs::metadata(&ckpt).unwrap().len();
    for at in [3, 30, len / 2, len - 2] {
        flip_byte(&ckpt, at);
        let ds = DataStore::open(dir.path(), no_checkpoint_opts()).unwrap();
        let r = ds.recovery_report().clone();
        assert!(!r.from_checkpoint && r.checkpoint_error.is_some(), "flip at {at}: {r:?}");
        assert_eq!(r.records_replayed, N);
        check_keys(&ds, 0..N);
        drop(ds);
        flip_byte(&ckpt, at); // restore
    }
    let ds = DataStore::open(dir.path(), no_checkpoint_opts()).unwrap();
    assert!(ds.recovery_report().from_checkpoint);
    drop(ds);
    std::fs::write(&ckpt, b"short").unwrap();
    let ds = DataStore::open(dir.path(), no_checkpoint_opts()).unwrap();
    assert!(ds.recovery_report().checkpoint_error.is_some());
    check_keys(&ds, 0..N);
}

#[test]
fn checkpoint_of_another_log_is_rejected() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    fill(a.path(), Some(N - 1));
    fill(b.path(), None);
    std::fs::copy(a.path().join("index.ckpt"), b.path().join("index.ckpt")).unwrap();
    let ds = DataStore::open(b.path(), no_checkpoint_opts()).unwrap();
    let r = ds.recovery_report();
    assert!(!r.from_checkpoint && r.checkpoint_error.as_deref().unwrap_or("").contains("different log"));
}

#[test]
fn damaged_log_header_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), None);
    flip_byte(&log_path(dir.path()), 2);
    assert!(matches!(
        DataStore::open(dir.path(), no_checkpoint_opts()),
        Err(Error::Corrupt { offset: 0, .. })
    ));
}
