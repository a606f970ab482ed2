//! Guards caller tags (`BatchOp::with_tag`, record format 3): they read back with their
//! records, and `recent_tags` finds them again after a clean close (from the checkpoint),
//! after a crash (checkpoint plus the log after it), after a torn tail (the cut record's tag
//! is gone with it) and after a compaction and a rebuild from the logs; a log written
//! without tags still opens, with none.

use std::fs::OpenOptions;

use fawn_ds::{BatchOp, DataStore, Meta, Options, SyncPolicy};

fn opts() -> Options {
    Options { sync: SyncPolicy::Never, auto_compact: false, checkpoint_every_bytes: 0, ..Options::default() }
}

fn tag(seq: u64) -> Vec<u8> {
    let mut t = seq.to_le_bytes().to_vec();
    t.extend_from_slice(&[0xAB; 9][..(seq % 10) as usize]);
    t
}

/// Writes seqs `from..to`: every third untagged, the others tagged; deletes among them.
fn write(ds: &DataStore, from: u64, to: u64) -> Vec<(u64, Vec<u8>)> {
    let keys: Vec<Vec<u8>> = (from..to).map(|s| format!("key-{}", s % 7).into_bytes()).collect();
    let tags: Vec<Vec<u8>> = (from..to).map(tag).collect();
    let ops: Vec<BatchOp<'_>> = (from..to)
        .zip(keys.iter().zip(&tags))
        .map(|(seq, (key, t))| {
            let meta = Meta { seq, ..Meta::default() };
            let op =
                if seq % 5 == 0 { BatchOp::delete(key, meta) } else { BatchOp::put(key, b"value", meta) };
            if seq % 3 == 0 {
                op
            } else {
                op.with_tag(t)
            }
        })
        .collect();
    ds.write_batch(&ops).expect("write");
    (from..to).filter(|s| s % 3 != 0).map(|s| (s, tag(s))).collect()
}

#[test]
fn tags_survive_close_crash_torn_tail_and_compaction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = DataStore::open(dir.path(), opts()).expect("open");
    let mut want = write(&ds, 1, 40);
    assert_eq!(ds.recent_tags(), want);
    // Iteration returns each record's tag.
    let tagged: Vec<(u64, Vec<u8>)> = ds
        .iter()
        .map(|r| r.expect("iter"))
        .filter(|r| !r.tag.is_empty())
        .map(|r| (r.meta.seq, r.tag))
        .collect();
    assert_eq!(tagged, want);
    ds.close().expect("close");

    // A clean close: the checkpoint holds them.
    let ds = DataStore::open(dir.path(), opts()).expect("reopen");
    assert!(ds.recovery_report().from_checkpoint);
    assert_eq!(ds.recent_tags(), want);
    // A crash: the checkpoint's tags plus those of the log after it.
    want.extend(write(&ds, 40, 60));
    drop(ds);
    let ds = DataStore::open(dir.path(), opts()).expect("reopen after a crash");
    assert!(ds.recovery_report().from_checkpoint);
    assert_eq!(ds.recent_tags(), want);
    // A torn tail: the last record (seq 61, tagged) is cut, and its tag with it.
    let before = ds.end_offset();
    want.extend(write(&ds, 60, 62));
    drop(ds);
    let log = OpenOptions::new().write(true).open(dir.path().join("data.log")).expect("log");
    log.set_len(before + (log.metadata().expect("len").len() - before) / 2 + 8).expect("tear");
    drop(log);
    let ds = DataStore::open(dir.path(), opts()).expect("reopen after a torn tail");
    assert!(ds.recovery_report().truncated_bytes > 0);
    assert_eq!(want.pop().map(|t| t.0), Some(61));
    assert_eq!(ds.recent_tags(), want);
    assert_eq!(ds.max_seq(), 60);

    // Compaction copies records with their tags: a rebuild from the logs finds them.
    ds.compact().expect("compact");
    ds.close().expect("close");
    std::fs::remove_file(dir.path().join("index.ckpt")).expect("drop the checkpoint");
    let ds = DataStore::open(dir.path(), opts()).expect("rebuild");
    assert!(!ds.recovery_report().from_checkpoint);
    let survivors = ds.recent_tags();
    assert!(!survivors.is_empty() && survivors.iter().all(|t| want.contains(t)), "{survivors:?}");
}

#[test]
fn a_log_without_tags_opens_with_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = DataStore::open(dir.path(), opts()).expect("open");
    for seq in 1..20u64 {
        ds.store(format!("k{seq}").as_bytes(), b"v", Meta { seq, ..Meta::default() }).expect("store");
    }
    let bytes = std::fs::read(dir.path().join("data.log")).expect("read");
    // Each record is 48 bytes after the 32-byte log header; byte 5 is its format marker.
    let markers: Vec<u8> = bytes[32..].chunks(48).map(|r| r[5]).collect();
    assert_eq!(markers, vec![0xF1; 19], "untagged records are written in format 1");
    drop(ds);
    let ds = DataStore::open(dir.path(), opts()).expect("reopen");
    assert!(ds.recent_tags().is_empty());
    assert_eq!(ds.lookup(b"k7").expect("lookup").map(|e| e.meta.seq), Some(7));
}
