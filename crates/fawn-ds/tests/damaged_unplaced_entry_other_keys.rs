//! Guards the keys that share an index entry's fragment (and candidate buckets) with a
//! record whose header is damaged, after index growth could not place that entry (its
//! record is unreadable, so it stays in the stash; bit rot inside a checkpointed region is
//! not seen at open). Such a key must still be writable — with `store`, `delete` and
//! `write_batch` (which used to fail, and to poison the store in a batch) — and read back,
//! also after a reopen; every other record must stay readable, the damaged keys must still
//! report the damage, and a key that only shares the fragment must read as absent, not as
//! damaged. The colliding keys are found with the index hash of docs/FORMAT.md §1.

use std::os::unix::fs::FileExt;

use fawn_ds::limits::SLOTS_PER_BUCKET;
use fawn_ds::{BatchOp, DataStore, Error, Options, SyncPolicy};

mod support;
use support::meta;

fn opts() -> Options {
    Options {
        sync: SyncPolicy::Never,
        checkpoint_every_bytes: 0,
        auto_compact: false,
        hot_cold: false,
        // The smallest table (64 buckets): the damaged entries come from it.
        expected_keys: 0,
        background_growth: true,
        ..Options::default()
    }
}

/// Buckets of the first table (`Options::expected_keys` 0).
const FIRST_BUCKETS: u64 = 64;

fn key(i: u64) -> Vec<u8> {
    format!("k-{i:05}").into_bytes()
}

fn value(i: u64, round: u64) -> Vec<u8> {
    format!("value {i} round {round} {}", "y".repeat((i % 40) as usize)).into_bytes()
}

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hash bits an entry the growth scan could not refresh keeps: it was stale at level 7
/// (the first level after the first table's), so it knows its placing value's low 8 bits.
const UNPLACED_BITS: u32 = 8;

/// (fragment, both hash values) of `key`.
fn place(key: &[u8]) -> (u16, [u64; 2]) {
    let low = fawn_ring::key_id(key).low64();
    let frag = ((low >> (64 - fawn_ds::limits::INDEX_FRAGMENT_BITS)) as u16).max(1);
    let v1 = mix(low & 0x0000_FFFF_FFFF_FFFF);
    let v2 = v1 ^ mix(frag as u64 ^ 0x5bd1_e995_0000_0000);
    (frag, [v1, v2])
}

/// Keys `c-<n>` that the entry of `of` may belong to as far as the index can tell (same
/// fragment, a hash value agreeing with its own on the bits it kept), and one key with the
/// same fragment but no such agreement.
fn colliders(of: &[u8], want: usize) -> (Vec<Vec<u8>>, Vec<u8>) {
    let (frag, vs) = place(of);
    let mask = (1u64 << UNPLACED_BITS) - 1;
    let (mut same, mut other) = (Vec::new(), None);
    for n in 0u64.. {
        let k = format!("c-{n}").into_bytes();
        let (f, [v1, _]) = place(&k);
        if f != frag {
            continue;
        }
        if vs.iter().any(|v| (v ^ v1) & mask == 0) {
            same.push(k);
        } else if other.is_none() {
            other = Some(k);
        }
        if same.len() == want && other.is_some() {
            break;
        }
    }
    (same, other.unwrap())
}

fn assert_corrupt(got: Result<Option<fawn_ds::Entry>, Error>, what: &str) {
    assert!(matches!(got, Err(Error::Corrupt { .. })), "{what}: {got:?}");
}

#[test]
fn keys_colliding_with_an_unplaced_damaged_entry_stay_usable() {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
    const FIRST: u64 = 200;
    const MORE: u64 = 3000;
    let damaged = [10u64, 20, 30];
    let offsets = {
        let ds = DataStore::open(dir.path(), opts()).unwrap();
        for i in 0..FIRST {
            ds.store(&key(i), &value(i, 0), meta(i + 1)).unwrap();
        }
        assert_eq!(ds.stats().index_capacity, FIRST_BUCKETS * SLOTS_PER_BUCKET as u64);
        let mut offsets = Vec::new();
        for r in ds.iter() {
            let r = r.unwrap();
            if damaged.iter().any(|&i| r.key == key(i)) {
                offsets.push(r.offset);
            }
        }
        ds.close().unwrap();
        offsets
    };
    assert_eq!(offsets.len(), damaged.len());
    // Damage each record's header (its marker byte): the record cannot even be parsed.
    let log = std::fs::OpenOptions::new().read(true).write(true).open(dir.path().join("data.log")).unwrap();
    for at in offsets {
        let mut b = [0u8];
        log.read_exact_at(&mut b, at + 5).unwrap();
        log.write_all_at(&[b[0] ^ 0xFF], at + 5).unwrap();
    }
    drop(log);

    let ds = DataStore::open(dir.path(), opts()).unwrap();
    assert!(ds.recovery_report().from_checkpoint, "{:?}", ds.recovery_report().checkpoint_error);
    let mut seq = 10_000;
    // Grow the index past the first table: the damaged entries cannot be placed.
    for i in FIRST..FIRST + MORE {
        seq += 1;
        ds.store(&key(i), &value(i, 0), meta(seq)).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while ds.stats().index_migrating {
        assert!(std::time::Instant::now() < deadline, "the migration did not finish");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let st = ds.stats();
    assert!(st.growth_unplaced >= damaged.len() as u64, "unplaced {}", st.growth_unplaced);
    assert!(st.index_capacity > FIRST_BUCKETS * SLOTS_PER_BUCKET as u64);

    let (same, other) = colliders(&key(damaged[0]), 3);
    let (c_store, c_batch, c_delete) = (&same[0], &same[1], &same[2]);
    // Absent, and the damaged entry may be theirs: the damage is the honest answer.
    assert_corrupt(ds.lookup(c_store), "absent colliding key");
    // Only the fragment in common: absent.
    assert_eq!(ds.lookup(&other).unwrap(), None, "key sharing only the fragment");

    seq += 1;
    ds.store(c_store, b"stored", meta(seq)).expect("store of a colliding key");
    seq += 1;
    ds.store(c_delete, b"to delete", meta(seq)).expect("store of a colliding key");
    seq += 1;
    ds.delete(c_delete, meta(seq)).expect("delete of a colliding key");
    seq += 1;
    let normal = key(FIRST + MORE);
    let batch =
        [BatchOp::put(c_batch, b"batched", meta(seq)), BatchOp::put(&normal, b"normal", meta(seq + 1))];
    seq += 2;
    ds.write_batch(&batch).expect("batch with a colliding key");
    assert!(!ds.stats().poisoned);
    seq += 1;
    ds.store(&other, b"other", meta(seq)).expect("store of a key sharing the fragment");
    // The damaged key itself is written again: the new version is what it reads.
    let rewritten = damaged[1];
    seq += 1;
    ds.store(&key(rewritten), &value(rewritten, 1), meta(seq)).expect("rewrite of a damaged key");

    let check = |ds: &DataStore, when: &str| {
        assert_eq!(ds.lookup(c_store).unwrap().map(|e| e.value), Some(b"stored".to_vec()), "{when}");
        assert_eq!(ds.lookup(c_batch).unwrap().map(|e| e.value), Some(b"batched".to_vec()), "{when}");
        assert_eq!(ds.lookup(&normal).unwrap().map(|e| e.value), Some(b"normal".to_vec()), "{when}");
        assert_eq!(ds.lookup(&other).unwrap().map(|e| e.value), Some(b"other".to_vec()), "{when}");
        // Deleted; the damaged entry may still be this key's for all the index knows.
        assert_corrupt(ds.lookup(c_delete), when);
        for i in 0..FIRST + MORE {
            let got = ds.lookup(&key(i));
            if i == rewritten {
                assert_eq!(got.unwrap().map(|e| e.value), Some(value(i, 1)), "{when}: key {i}");
            } else if damaged.contains(&i) {
                assert_corrupt(got, &format!("{when}: damaged key {i}"));
            } else {
                assert_eq!(got.unwrap().map(|e| e.value), Some(value(i, 0)), "{when}: key {i}");
            }
        }
    };
    check(&ds, "before reopen");
    ds.close().unwrap();

    let ds = DataStore::open(dir.path(), opts()).unwrap();
    assert!(ds.recovery_report().from_checkpoint, "{:?}", ds.recovery_report().checkpoint_error);
    check(&ds, "after reopen");
    // Still writable after the reopen, in a batch too.
    seq += 1;
    ds.write_batch(&[BatchOp::put(c_store, b"again", meta(seq))]).unwrap();
    assert_eq!(ds.lookup(c_store).unwrap().map(|e| e.value), Some(b"again".to_vec()));
    assert!(!ds.stats().poisoned);
}
