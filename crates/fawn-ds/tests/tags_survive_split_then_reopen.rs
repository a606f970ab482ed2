//! Guards that a split's new store keeps the recent tags of the records it took: reopened
//! from its checkpoint, it still finds the outcome each of its records carries.

use std::sync::Arc;

use fawn_ds::{BatchOp, DataStore, Meta, Options, SyncPolicy};

fn opts() -> Options {
    Options { sync: SyncPolicy::Never, auto_compact: false, checkpoint_every_bytes: 0, ..Options::default() }
}

#[test]
fn a_split_off_store_finds_its_tags_after_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = DataStore::open(&dir.path().join("parent"), opts()).expect("open");
    let keys: Vec<String> =
        (1..=40u64).map(|s| format!("{}-{s}", if s % 2 == 0 { "hi" } else { "lo" })).collect();
    let tags: Vec<Vec<u8>> = (1..=40u64).map(|s| format!("outcome of {s}").into_bytes()).collect();
    let ops: Vec<BatchOp<'_>> = keys
        .iter()
        .zip(&tags)
        .zip(1u64..)
        .map(|((k, t), seq)| BatchOp::put(k.as_bytes(), b"v", Meta { seq, ..Meta::default() }).with_tag(t))
        .collect();
    ds.write_batch(&ops).expect("write");

    let target = dir.path().join("child");
    let (child, _) = ds.split(Arc::new(|k: &[u8]| k.starts_with(b"hi-")), &target, opts()).expect("split");
    child.close().expect("close");
    let child = DataStore::open(&target, opts()).expect("reopen");
    assert!(child.recovery_report().from_checkpoint);
    let kept = child.recent_tags();
    for seq in (2..=40u64).step_by(2) {
        let want = (seq, format!("outcome of {seq}").into_bytes());
        assert!(kept.contains(&want), "the tag of seq {seq} is lost: {} kept", kept.len());
    }
}
