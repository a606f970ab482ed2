//! Guards that a compaction never makes a synced write non-durable (any policy, here
//! `SyncPolicy::Never` with explicit `sync()`): a record written and synced in the old log
//! while the compaction runs is copied into the new log by a late catch-up pass; the new
//! log must be synced over that copy before the `rename` that replaces the old log, or a
//! power loss right after the rename loses a write whose `sync()` had returned. The same
//! for a merge: a write synced in the merged-in store during the merge is in the merged
//! store after such a power loss.
//!
//! Deterministic: the fault-injection hook (called before every log fsync) sees the
//! compaction thread's first fsync of the new state and, right there, has another thread
//! store a key and `sync()`; the hook also records how much of the new log each of the
//! compaction thread's fsyncs covers before the rename. The power loss is then simulated
//! on a copy of the directory: the new log cut to what was fsynced before the rename.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::ThreadId;

use fawn_ds::{DataStore, FaultInjector, IoOp, Meta, Options, SyncPolicy};

const KEYS: u64 = 2000;

fn key(i: u64) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

fn value(i: u64) -> Vec<u8> {
    format!("value-{i}-{}", "v".repeat(60)).into_bytes()
}

/// What the hook shares with the test.
#[derive(Default)]
struct Probe {
    /// The thread running the compaction.
    maint: Mutex<Option<ThreadId>>,
    /// The first fsync of the compaction thread was seen (the late write happens once).
    fired: AtomicBool,
    /// Bytes of `data.log.compact` when the compaction thread last fsynced before the rename.
    synced_new: AtomicU64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Compact,
    CompactHot,
    /// Merge another store in; the late write goes to that store.
    Merge,
}

fn run(hot_cold: bool, op: Op) {
    let shm = Path::new("/dev/shm");
    let scratch = || if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
    let dir = scratch();
    let probe = Arc::new(Probe::default());
    // The late writer: on a signal from the hook, store key `KEYS` and sync, then answer.
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let go_tx = Mutex::new(go_tx);
    let done_rx = Mutex::new(done_rx);
    let hook = {
        let probe = Arc::clone(&probe);
        let compact_file = dir.path().join("data.log.compact");
        FaultInjector::new(move |op| {
            let me = std::thread::current().id();
            if op != IoOp::Sync || *probe.maint.lock().unwrap() != Some(me) {
                return None;
            }
            // Only fsyncs before the rename (the new log still has its temporary name).
            let Ok(meta) = std::fs::metadata(&compact_file) else { return None };
            probe.synced_new.fetch_max(meta.len(), Ordering::AcqRel);
            if !probe.fired.swap(true, Ordering::AcqRel) {
                go_tx.lock().unwrap().send(()).unwrap();
                done_rx.lock().unwrap().recv().unwrap();
            }
            None
        })
    };
    let opts = Options {
        sync: SyncPolicy::Never,
        checkpoint_every_bytes: 0,
        auto_compact: false,
        hot_cold,
        faults: hook,
        ..Options::default()
    };
    let ds = Arc::new(DataStore::open(dir.path(), opts.clone()).unwrap());
    for i in 0..KEYS {
        ds.store(&key(i), &value(i), Meta { seq: i + 1, ..Meta::default() }).unwrap();
        if i % 3 == 0 {
            // Garbage, so the compaction has something to drop.
            ds.store(&key(i), &value(i), Meta { seq: i + 1, ..Meta::default() }).unwrap();
        }
    }
    ds.sync().unwrap();
    let other_dir = scratch();
    let other = Arc::new(
        DataStore::open(other_dir.path(), Options { faults: FaultInjector::default(), ..opts.clone() })
            .unwrap(),
    );
    let late = {
        let target = Arc::clone(if op == Op::Merge { &other } else { &ds });
        std::thread::spawn(move || {
            if go_rx.recv().is_ok() {
                target.store(&key(KEYS), &value(KEYS), Meta { seq: KEYS + 1, ..Meta::default() }).unwrap();
                target.sync().unwrap();
                done_tx.send(()).unwrap();
            }
        })
    };
    let maint = {
        let (ds, other, probe) = (Arc::clone(&ds), Arc::clone(&other), Arc::clone(&probe));
        std::thread::spawn(move || {
            *probe.maint.lock().unwrap() = Some(std::thread::current().id());
            let r = match op {
                Op::Compact => ds.compact(),
                Op::CompactHot => ds.compact_hot(),
                Op::Merge => ds.merge(&other),
            };
            *probe.maint.lock().unwrap() = None;
            r.unwrap();
        })
    };
    maint.join().unwrap();
    late.join().unwrap();
    assert!(probe.fired.load(Ordering::Acquire), "the compaction never fsynced its new log");
    let synced = probe.synced_new.load(Ordering::Acquire);
    // Power loss right after the rename: the new log holds only what was fsynced before it.
    let lost = scratch();
    copy_files_settled(dir.path(), lost.path());
    let log = std::fs::OpenOptions::new().write(true).open(lost.path().join("data.log")).unwrap();
    assert!(log.metadata().unwrap().len() >= synced);
    log.set_len(synced).unwrap();
    drop(log);
    drop(ds);
    let reopened =
        DataStore::open(lost.path(), Options { faults: FaultInjector::default(), ..opts }).unwrap();
    for i in 0..=KEYS {
        let got = reopened.lookup(&key(i)).unwrap().map(|e| e.value);
        assert_eq!(
            got,
            Some(value(i)),
            "key {i} (synced{}) lost by a power loss right after the compaction's rename \
             (hot_cold {hot_cold}, {op:?})",
            if i == KEYS { " during the compaction" } else { " before it" }
        );
    }
}

#[test]
fn full_compaction_keeps_a_write_synced_during_it() {
    run(false, Op::Compact);
}

#[test]
fn full_compaction_with_a_cold_log_keeps_a_write_synced_during_it() {
    run(true, Op::Compact);
}

#[test]
fn hot_compaction_keeps_a_write_synced_during_it() {
    run(true, Op::CompactHot);
}

#[test]
fn merge_keeps_a_write_synced_in_the_merged_store_during_it() {
    run(false, Op::Merge);
}

/// Copies the store's files (not its lock or checkpoint) from `from` into `to`. The store is
/// still open, so a background task may rename or remove a file between the listing and its
/// copy (a temporary `*.tmp`); then the whole copy is taken again from a fresh listing.
fn copy_files_settled(from: &std::path::Path, to: &std::path::Path) {
    for _attempt in 0..20 {
        let mut vanished = false;
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            if name == "LOCK" || name == "index.ckpt" {
                continue;
            }
            match std::fs::copy(entry.path(), to.join(&name)) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => vanished = true,
                Err(e) => panic!("copying {name:?}: {e}"),
            }
        }
        if !vanished {
            return;
        }
        for entry in std::fs::read_dir(to).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the store's files kept changing while copying them");
}
