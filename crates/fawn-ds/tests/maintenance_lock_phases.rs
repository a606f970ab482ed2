//! Guards the lock-hold breakdown of maintenance and the MAXSEQ floor written before the
//! lock: a compaction whose store's newest record is dropped (its key is out of the key
//! filter) persists `max_seq` without doing so under the lock, the report's phases fit in
//! the hold and equal what `stats()` exposes, and `max_seq` survives a reopen.

use std::sync::Arc;

use fawn_ds::{DataStore, Meta, Options, SyncPolicy};

fn opts() -> Options {
    Options { sync: SyncPolicy::Never, auto_compact: false, hot_cold: true, ..Options::default() }
}

#[test]
fn compaction_floor_written_before_the_lock_and_phases_reported() {
    let dir = tempfile::tempdir().unwrap();
    let top = {
        let ds = DataStore::open(dir.path(), opts()).unwrap();
        for i in 0..2000u64 {
            ds.store(
                format!("k{:05}", i % 500).as_bytes(),
                &[i as u8; 200],
                Meta { seq: i + 1, ..Meta::default() },
            )
            .unwrap();
        }
        // The newest record: a key compaction drops, so the new log lacks the highest seq.
        ds.store(b"out-of-range", b"v", Meta { seq: 5000, ..Meta::default() }).unwrap();
        ds.set_key_filter(Some(Arc::new(|k: &[u8]| k.starts_with(b"k"))));
        let rep = ds.compact().unwrap();
        let p = &rep.lock;
        assert_eq!(p.seq_floor_us, 0, "the MAXSEQ floor was written under the lock: {p:?}");
        assert_eq!(p.hold_us, rep.lock_hold_us);
        assert_eq!(p.wait_us, rep.lock_wait_us);
        assert_eq!(p.catch_up_bytes, rep.locked_catch_up_bytes, "{p:?}");
        let phases = p.catch_up_us + p.seq_floor_us + p.tail_sync_us + p.rename_us + p.swap_us + p.release_us;
        assert!(phases <= p.hold_us, "phases {phases} us exceed the hold: {p:?}");
        // Linux: the thread accounting is read; CPU + run queue + blocked covers the hold.
        assert!(p.on_cpu_us + p.runqueue_us + p.blocked_us >= p.hold_us, "{p:?}");
        let stats = ds.stats();
        assert_eq!(&stats.last_lock_phases, p);
        assert_eq!(stats.last_lock_hold_us, rep.lock_hold_us);
        assert!(ds.lookup(b"out-of-range").unwrap().is_none());
        assert_eq!(ds.max_seq(), 5000);
        ds.max_seq()
    };
    let ds = DataStore::open(dir.path(), opts()).unwrap();
    assert!(ds.max_seq() >= top, "max_seq went back from {top} to {}", ds.max_seq());
    assert!(ds.lookup(b"k00499").unwrap().is_some());
}
