//! Guards "no panics on bad file content": seeded random damage (byte flips, zeroed
//! ranges, truncations, random garbage) to the log and the checkpoint. Every open must
//! return `Ok` or a typed error; when it opens, lookups and iteration return values or
//! typed errors, never panic, and with `salvage` every open succeeds.
//! Reproduce with FAWN_DS_SEED=<seed>.

use std::os::unix::fs::FileExt;
use std::path::Path;

use fawn_ds::{DataStore, Meta, Options, SyncPolicy};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const CASES: u64 = 2000;

fn opts(salvage: bool) -> Options {
    Options { sync: SyncPolicy::Never, checkpoint_every_bytes: 0, salvage, ..Options::default() }
}

fn damage(path: &Path, rng: &mut SmallRng) {
    let Ok(f) = std::fs::OpenOptions::new().read(true).write(true).open(path) else { return };
    let len = f.metadata().unwrap().len();
    if len == 0 {
        return;
    }
    for _ in 0..rng.gen_range(1..4) {
        let at = rng.gen_range(0..len);
        match rng.gen_range(0..4) {
            0 => f.write_all_at(&[rng.gen()], at).unwrap(),
            1 => f.write_all_at(&vec![0u8; rng.gen_range(1..600)], at).unwrap(),
            2 => f.set_len(at).unwrap(),
            _ => f
                .write_all_at(&(0..rng.gen_range(1..300)).map(|_| rng.gen()).collect::<Vec<u8>>(), at)
                .unwrap(),
        }
    }
}

fn exercise(ds: &DataStore) {
    for i in 0..60u32 {
        let _ = ds.lookup(format!("k{i}").as_bytes());
    }
    for r in ds.iter() {
        if r.is_err() {
            break;
        }
    }
    let _ = ds.store(b"after-damage", b"v", Meta::default());
}

/// Returns whether the strict open succeeded.
fn run_case(seed: u64) -> bool {
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir_in(if Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" }).unwrap();
    {
        let ds = DataStore::open(dir.path(), opts(false)).unwrap();
        for i in 0..rng.gen_range(1..60u32) {
            let v: Vec<u8> = (0..rng.gen_range(0..400)).map(|_| rng.gen()).collect();
            ds.store(format!("k{i}").as_bytes(), &v, Meta { seq: i as u64, ..Meta::default() }).unwrap();
            if rng.gen_bool(0.05) {
                ds.checkpoint().unwrap();
            }
        }
        if rng.gen_bool(0.5) {
            ds.close().unwrap();
        }
    }
    let target = if rng.gen_bool(0.7) { "data.log" } else { "index.ckpt" };
    damage(&dir.path().join(target), &mut rng);
    let strict = DataStore::open(dir.path(), opts(false));
    let strict_ok = strict.is_ok();
    if let Ok(ds) = strict {
        exercise(&ds);
    }
    // Salvage always opens unless the log header itself is damaged.
    match DataStore::open(dir.path(), opts(true)) {
        Ok(ds) => exercise(&ds),
        Err(fawn_ds::Error::Corrupt { offset: 0, .. }) => {}
        Err(e) => panic!("seed {seed}: salvage open failed: {e}"),
    }
    strict_ok
}

#[test]
fn random_damage_never_panics() {
    let (first, cases) = match std::env::var("FAWN_DS_SEED") {
        Ok(s) => (s.parse().expect("FAWN_DS_SEED must be a u64"), 1),
        Err(_) => (0xBAD_F11E, CASES),
    };
    let mut opened = 0;
    for seed in first..first + cases {
        let r = std::panic::catch_unwind(|| run_case(seed));
        assert!(r.is_ok(), "panic for seed {seed} (rerun with FAWN_DS_SEED={seed})");
        opened += r.unwrap_or(false) as u64;
    }
    eprintln!("{cases} damaged stores: {opened} opened strictly, the rest refused with typed errors");
}
