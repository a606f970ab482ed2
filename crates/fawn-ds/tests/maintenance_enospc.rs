//! Guards maintenance against a full disk: when an append of a compaction, merge or split
//! fails (injected ENOSPC), the operation returns a typed error, leaves no new log or split
//! directory behind, and the store keeps serving reads and writes with its old contents,
//! including after a reopen; a later compaction succeeds.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use fawn_ds::{DataStore, Error, FaultInjector, IoOp, Meta, Options, SyncPolicy};

#[test]
fn enospc_during_maintenance_keeps_the_old_state() {
    let dir = tempfile::tempdir().unwrap();
    let full = Arc::new(AtomicBool::new(false));
    // Once armed, the 4th append from then on fails: inside the maintenance copy (after the
    // new logs' headers; copies are appended in batches of 1 MiB, and the live data below is
    // ~5 MiB).
    let countdown = Arc::new(AtomicU64::new(0));
    let faults = {
        let (full, countdown) = (full.clone(), countdown.clone());
        FaultInjector::new(move |op| {
            let armed = full.load(Ordering::Acquire) && op == IoOp::Write;
            (armed && countdown.fetch_add(1, Ordering::AcqRel) >= 3)
                .then(|| std::io::Error::from_raw_os_error(libc::ENOSPC))
        })
    };
    let opts = Options { sync: SyncPolicy::Never, auto_compact: false, faults, ..Options::default() };
    let path = dir.path().join("a");
    let ds = DataStore::open(&path, opts.clone()).unwrap();
    for i in 0..2000u64 {
        let value = vec![i as u8; 16 << 10];
        ds.store(format!("k{}", i % 300).as_bytes(), &value, Meta { seq: i + 1, ..Meta::default() }).unwrap();
    }
    let want: Vec<_> = (0..300).map(|k| ds.lookup(format!("k{k}").as_bytes()).unwrap()).collect();
    let arm = || {
        countdown.store(0, Ordering::Release);
        full.store(true, Ordering::Release);
    };

    arm();
    assert!(matches!(ds.compact(), Err(Error::NoSpace)), "compaction must report the full disk");
    full.store(false, Ordering::Release);
    assert!(!path.join("data.log.compact").exists(), "a failed compaction left its log");

    let other = DataStore::open(&dir.path().join("b"), opts.clone()).unwrap();
    for i in 0..100u64 {
        other.store(format!("o{i}").as_bytes(), b"x", Meta { seq: 5000 + i, ..Meta::default() }).unwrap();
    }
    arm();
    assert!(matches!(ds.merge(&other), Err(Error::NoSpace)));
    full.store(false, Ordering::Release);
    assert!(ds.lookup(b"o1").unwrap().is_none(), "a failed merge is visible");

    arm();
    let target = dir.path().join("s");
    let belongs = Arc::new(|k: &[u8]| k.last().is_some_and(|c| c % 2 == 1));
    assert!(matches!(ds.split(belongs, &target, opts.clone()), Err(Error::NoSpace)));
    full.store(false, Ordering::Release);
    assert!(!target.exists() && !dir.path().join("s.split-tmp").exists(), "a failed split left a directory");

    // The store still serves the old contents, and writes work.
    for (k, w) in want.iter().enumerate() {
        assert_eq!(&ds.lookup(format!("k{k}").as_bytes()).unwrap(), w);
    }
    ds.store(b"after", b"ok", Meta { seq: 9000, ..Meta::default() }).unwrap();
    assert_eq!(ds.max_seq(), 9000);
    drop(ds);
    let ds = DataStore::open(&path, opts).unwrap();
    for (k, w) in want.iter().enumerate() {
        assert_eq!(&ds.lookup(format!("k{k}").as_bytes()).unwrap(), w);
    }
    assert_eq!(ds.lookup(b"after").unwrap().unwrap().value, b"ok");
    let rep = ds.compact().expect("compaction after the disk has room again");
    assert!(rep.log_bytes_after < rep.log_bytes_before);
    assert_eq!(ds.stats().live_keys, 301);
}
