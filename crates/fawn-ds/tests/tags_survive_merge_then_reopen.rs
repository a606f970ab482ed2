//! Guards that a merge keeps the merged-in store's recent tags: the target, reopened from a
//! checkpoint written after the merge, finds the outcomes of both stores' records.

use std::sync::Arc;

use fawn_ds::{BatchOp, DataStore, Meta, Options, SyncPolicy};

fn opts() -> Options {
    Options { sync: SyncPolicy::Never, auto_compact: false, checkpoint_every_bytes: 0, ..Options::default() }
}

/// Writes tagged puts of `prefix`-keys with `seqs`; returns their (seq, tag).
fn write(ds: &DataStore, prefix: &str, seqs: impl Iterator<Item = u64>) -> Vec<(u64, Vec<u8>)> {
    let seqs: Vec<u64> = seqs.collect();
    let keys: Vec<String> = seqs.iter().map(|s| format!("{prefix}-{s}")).collect();
    let tags: Vec<Vec<u8>> = seqs.iter().map(|s| format!("outcome of {s}").into_bytes()).collect();
    let ops: Vec<BatchOp<'_>> = keys
        .iter()
        .zip(&tags)
        .zip(&seqs)
        .map(|((k, t), &seq)| BatchOp::put(k.as_bytes(), b"v", Meta { seq, ..Meta::default() }).with_tag(t))
        .collect();
    ds.write_batch(&ops).expect("write");
    seqs.into_iter().zip(tags).collect()
}

#[test]
fn a_merge_target_finds_both_stores_tags_after_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (up_dir, lo_dir) = (dir.path().join("up"), dir.path().join("lo"));
    let up = DataStore::open(&up_dir, opts()).expect("open up");
    let lo = DataStore::open(&lo_dir, opts()).expect("open lo");
    let mut want = write(&up, "up", (1..=30).map(|s| 2 * s));
    want.extend(write(&lo, "lo", (1..=30).map(|s| 2 * s + 1)));
    want.sort();

    up.merge_range(&lo, Arc::new(|k: &[u8]| k.starts_with(b"lo-"))).expect("merge");
    // A write after the merge, so the checkpoint the close writes covers the merged log.
    want.extend(write(&up, "up", 100..101));
    up.close().expect("close");
    let up = DataStore::open(&up_dir, opts()).expect("reopen");
    assert!(up.recovery_report().from_checkpoint);
    assert_eq!(up.recent_tags(), want);
}
