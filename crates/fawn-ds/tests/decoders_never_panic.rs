//! Guards "no panic on any bytes read from disk", decoder by decoder (`fawn_ds::fuzzing`,
//! the fuzz target `ds_decode` runs the same entry points): a real datastore's log (records
//! with and without state and tags, deletes, padding), log header, `LOGS` manifest and
//! checkpoint (index image and recent tags) are damaged by seeded byte flips, splices,
//! truncations and length changes, half of them with their checksums rewritten to match so
//! that the parsers behind the checksums see the damage. Every decoder returns; what it
//! accepts round-trips. Reproduce one case with FAWN_DS_SEED=<seed>.

use fawn_ds::{fuzzing, BatchOp, DataStore, Meta, Options, SyncPolicy};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const CASES: u64 = 20_000;

/// The files of a datastore that saw every record form, a checkpoint and a compaction.
struct Files {
    log: Vec<u8>,
    /// The cold log (where a compaction moved the live records): a log of the same format.
    cold: Vec<u8>,
    checkpoint: Vec<u8>,
    manifest: Vec<u8>,
}

fn make_files() -> Files {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = Options {
        sync: SyncPolicy::Never,
        auto_compact: false,
        checkpoint_every_bytes: 0,
        page_aligned_records: true,
        ..Options::default()
    };
    let ds = DataStore::open(dir.path(), opts).expect("open");
    let keys: Vec<Vec<u8>> = (0..40u64).map(|i| format!("key-{}", i % 13).into_bytes()).collect();
    let tags: Vec<Vec<u8>> = (0..40u64).map(|i| vec![i as u8; 1 + (i % 40) as usize]).collect();
    let value = vec![0x5a; 300];
    let ops: Vec<BatchOp<'_>> = (0..40u64)
        .map(|i| {
            let meta = Meta { seq: i + 1, flags: i as u32, expiry: 0, state: (i % 3) as u8 };
            let key = &keys[i as usize];
            let op = if i % 7 == 6 {
                BatchOp::delete(key, meta)
            } else {
                BatchOp::put(key, &value[..i as usize * 7], meta)
            };
            if i % 2 == 0 {
                op.with_tag(&tags[i as usize])
            } else {
                op
            }
        })
        .collect();
    ds.write_batch(&ops).expect("write");
    ds.compact().expect("compact");
    ds.write_batch(&ops[..10]).expect("write");
    ds.checkpoint().expect("checkpoint");
    let read = |name: &str| std::fs::read(dir.path().join(name)).unwrap_or_default();
    let files = Files {
        log: read("data.log"),
        cold: read("data.cold"),
        checkpoint: read("index.ckpt"),
        manifest: read("LOGS"),
    };
    ds.close().expect("close");
    assert!(!files.log.is_empty() && !files.checkpoint.is_empty(), "the datastore wrote its files");
    files
}

fn damage(bytes: &mut Vec<u8>, rng: &mut SmallRng) {
    for _ in 0..rng.gen_range(1..4) {
        let at = rng.gen_range(0..=bytes.len());
        let last = at.min(bytes.len().saturating_sub(1));
        match rng.gen_range(0..5) {
            0 if !bytes.is_empty() => bytes[last] ^= 1 << rng.gen_range(0..8),
            1 => bytes.truncate(at),
            2 => {
                let junk: Vec<u8> = (0..rng.gen_range(1..64)).map(|_| rng.gen()).collect();
                bytes.splice(at..at, junk);
            }
            3 if !bytes.is_empty() => bytes[last] = [0, 0xff, 40, 250][rng.gen_range(0..4)],
            _ => {
                let end = (at + rng.gen_range(1..32)).min(bytes.len());
                bytes.drain(at..end);
            }
        }
    }
}

fn run_case(files: &Files, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let reseal = rng.gen_bool(0.5);
    match rng.gen_range(0..4) {
        0 => {
            let mut log = if rng.gen_bool(0.5) { files.log.clone() } else { files.cold.clone() };
            damage(&mut log, &mut rng);
            let mut records = log.get(32..).map(<[u8]>::to_vec).unwrap_or_default();
            fuzzing::log_records(&mut records, reseal);
        }
        1 => {
            let mut header = files.log.get(..32).map(<[u8]>::to_vec).unwrap_or_default();
            damage(&mut header, &mut rng);
            fuzzing::log_header(&mut header, reseal);
        }
        2 => {
            let mut manifest = files.manifest.clone();
            damage(&mut manifest, &mut rng);
            fuzzing::manifest(&mut manifest, reseal);
        }
        _ => {
            let mut ckpt = files.checkpoint.clone();
            damage(&mut ckpt, &mut rng);
            fuzzing::checkpoint(&mut ckpt, files.log.len() as u64, reseal);
        }
    }
}

#[test]
fn every_decoder_returns_on_damaged_bytes() {
    let files = make_files();
    // The undamaged files pass every decoder in full.
    for (log, records) in [(&files.log, 10), (&files.cold, 13)] {
        let mut bytes = log[32..].to_vec();
        assert_eq!(fuzzing::log_records(&mut bytes, false), records, "a log's records are accepted");
    }
    assert!(fuzzing::log_header(&mut files.log[..32].to_vec(), false), "the log header is accepted");
    assert!(fuzzing::manifest(&mut files.manifest.clone(), false), "the manifest is accepted");
    let log_len = files.log.len() as u64;
    assert!(fuzzing::checkpoint(&mut files.checkpoint.clone(), log_len, false), "the checkpoint is accepted");
    let seeds: Vec<u64> = match std::env::var("FAWN_DS_SEED") {
        Ok(s) => vec![s.parse().expect("FAWN_DS_SEED is a number")],
        Err(_) => (0..CASES).collect(),
    };
    for seed in seeds {
        let result = std::panic::catch_unwind(|| run_case(&files, seed));
        assert!(result.is_ok(), "a decoder panicked: replay with FAWN_DS_SEED={seed}");
    }
}
