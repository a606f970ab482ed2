//! Guards adopted tags (`DataStore::adopt_tags`): tags of records the store never held (a
//! copied state whose source had compacted them away) are kept among the recent tags in seq
//! order, seqs already tagged are left as they are, and a crash right after (no close) finds
//! them again, from the checkpoint the adoption wrote, also when nothing was appended since the
//! last checkpoint.

use fawn_ds::{BatchOp, DataStore, Meta, Options, SyncPolicy};

fn opts() -> Options {
    Options { sync: SyncPolicy::Always, auto_compact: false, checkpoint_every_bytes: 0, ..Options::default() }
}

#[test]
fn adopted_tags_survive_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = DataStore::open(dir.path(), opts()).expect("open");
    let ops = [
        BatchOp::put(b"a", b"1", Meta { seq: 10, ..Meta::default() }).with_tag(b"ten"),
        BatchOp::put(b"b", b"2", Meta { seq: 30, ..Meta::default() }).with_tag(b"thirty"),
    ];
    ds.write_batch(&ops).expect("write");
    let adopted = [(20, b"twenty".to_vec()), (30, b"other".to_vec()), (5, b"five".to_vec())];
    assert_eq!(ds.adopt_tags(&adopted).expect("adopt"), 2, "seq 30 is tagged already");
    let want = vec![
        (5, b"five".to_vec()),
        (10, b"ten".to_vec()),
        (20, b"twenty".to_vec()),
        (30, b"thirty".to_vec()),
    ];
    assert_eq!(ds.recent_tags(), want);
    assert_eq!(ds.adopt_tags(&adopted).expect("adopt again"), 0);
    drop(ds);
    let ds = DataStore::open(dir.path(), opts()).expect("reopen after a crash");
    assert_eq!(ds.recent_tags(), want);
    // Adopted right after a checkpoint, with nothing appended since: still written.
    ds.checkpoint().expect("checkpoint");
    assert_eq!(ds.adopt_tags(&[(25, b"late".to_vec())]).expect("adopt"), 1);
    drop(ds);
    let ds = DataStore::open(dir.path(), opts()).expect("reopen after a second crash");
    assert_eq!(ds.recent_tags().iter().find(|t| t.0 == 25), Some(&(25, b"late".to_vec())));
}
