//! Guards the failure policy with injected I/O faults: a failed fdatasync or a failed
//! (non-ENOSPC) append poisons the store — the failing call gets an error, never a false
//! success, later writes get `Error::Poisoned`, reads keep working — and a reopen recovers
//! everything acknowledged. An injected ENOSPC does not poison.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use fawn_ds::{DataStore, Error, FaultInjector, IoOp, Meta, Options, SyncPolicy};

const OK: u8 = 0;
const FAIL_SYNC: u8 = 1;
const FAIL_WRITE_EIO: u8 = 2;
const FAIL_WRITE_ENOSPC: u8 = 3;

fn faulty(mode: &Arc<AtomicU8>) -> Options {
    let mode = mode.clone();
    let faults = FaultInjector::new(move |op| match (mode.load(Ordering::Relaxed), op) {
        (FAIL_SYNC, IoOp::Sync) | (FAIL_WRITE_EIO, IoOp::Write) => {
            Some(std::io::Error::from_raw_os_error(libc::EIO))
        }
        (FAIL_WRITE_ENOSPC, IoOp::Write) => Some(std::io::Error::from_raw_os_error(libc::ENOSPC)),
        _ => None,
    });
    Options { sync: SyncPolicy::Always, faults, ..Options::default() }
}

fn m(seq: u64) -> Meta {
    Meta { seq, ..Meta::default() }
}

#[test]
fn failed_fsync_poisons_writes_but_not_reads() {
    let dir = tempfile::tempdir().unwrap();
    let mode = Arc::new(AtomicU8::new(OK));
    let ds = DataStore::open(dir.path(), faulty(&mode)).unwrap();
    ds.store(b"a", b"1", m(1)).unwrap();
    mode.store(FAIL_SYNC, Ordering::Relaxed);
    let err = ds.store(b"b", b"2", m(2)).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    mode.store(OK, Ordering::Relaxed);
    // Even though the device works again, the store stays poisoned until reopened.
    assert!(matches!(ds.store(b"c", b"3", m(3)), Err(Error::Poisoned)));
    assert!(matches!(ds.delete(b"a", m(4)), Err(Error::Poisoned)));
    assert!(matches!(ds.sync(), Err(Error::Poisoned)));
    assert!(matches!(ds.checkpoint(), Err(Error::Poisoned)));
    assert!(ds.stats().poisoned);
    assert_eq!(ds.lookup(b"a").unwrap().unwrap().value, b"1");
    assert!(matches!(ds.close(), Err(Error::Poisoned)));
    let ds = DataStore::open(dir.path(), faulty(&mode)).unwrap();
    assert_eq!(ds.lookup(b"a").unwrap().unwrap().value, b"1");
    ds.store(b"d", b"4", m(5)).unwrap();
}

#[test]
fn failed_append_poisons_and_leaves_no_partial_record() {
    let dir = tempfile::tempdir().unwrap();
    let mode = Arc::new(AtomicU8::new(OK));
    let ds = DataStore::open(dir.path(), faulty(&mode)).unwrap();
    ds.store(b"a", b"1", m(1)).unwrap();
    let end = ds.end_offset();
    mode.store(FAIL_WRITE_EIO, Ordering::Relaxed);
    assert!(matches!(ds.store(b"b", b"2", m(2)), Err(Error::Io { .. })));
    mode.store(OK, Ordering::Relaxed);
    assert!(matches!(ds.store(b"b", b"2", m(2)), Err(Error::Poisoned)));
    assert_eq!(ds.end_offset(), end);
    assert_eq!(ds.lookup(b"b").unwrap(), None);
    drop(ds);
    let ds = DataStore::open(dir.path(), faulty(&mode)).unwrap();
    assert_eq!(ds.recovery_report().truncated_bytes, 0);
    assert_eq!(ds.lookup(b"a").unwrap().unwrap().value, b"1");
}

#[test]
fn injected_enospc_is_not_poison() {
    let dir = tempfile::tempdir().unwrap();
    let mode = Arc::new(AtomicU8::new(OK));
    let ds = DataStore::open(dir.path(), faulty(&mode)).unwrap();
    mode.store(FAIL_WRITE_ENOSPC, Ordering::Relaxed);
    assert!(matches!(ds.store(b"a", b"1", m(1)), Err(Error::NoSpace)));
    mode.store(OK, Ordering::Relaxed);
    ds.store(b"a", b"1", m(1)).unwrap();
    assert_eq!(ds.lookup(b"a").unwrap().unwrap().value, b"1");
    assert!(!ds.stats().poisoned);
}

#[test]
fn interval_policy_syncs_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let opts =
        Options { sync: SyncPolicy::Interval(std::time::Duration::from_millis(20)), ..Options::default() };
    let ds = DataStore::open(dir.path(), opts).unwrap();
    ds.store(b"a", b"1", m(1)).unwrap();
    let t = std::time::Instant::now();
    while ds.stats().fsyncs == 0 {
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "background sync never ran");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
