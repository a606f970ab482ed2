//! Guards index growth by log scan against a model: seeded random sequences of inserts,
//! overwrites, deletes, batches, checkpoints, hot and full compactions and drop/close-reopen
//! that grow the index from its smallest size through several doublings, with the growth
//! scan driven by writes only (`background_growth: false`, so each case is deterministic).
//! Whenever a write leaves the index migrating, the case may checkpoint and reopen right
//! there: the checkpoint must be accepted (also after a hot compaction moved the hot log's
//! entries mid-growth), and the migration must resume from its image and lose nothing.
//! Cases run on up to 4 threads (each deterministic on its own). Reproduce one case with
//! `FAWN_DS_SEED=<seed> cargo test -p fawn-ds --test model_growth_across_reopen`.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use fawn_ds::{BatchOp, DataStore, Meta, Options, SyncPolicy};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const CASES: u64 = 24;

fn options(rng: &mut SmallRng) -> Options {
    Options {
        sync: SyncPolicy::Never,
        checkpoint_every_bytes: 0,
        auto_compact: false,
        background_growth: false,
        hot_cold: rng.gen_bool(0.7),
        page_aligned_records: rng.gen_bool(0.3),
        ..Options::default()
    }
}

/// Ordered, so that picking "a random existing key" depends on the seed alone.
type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn check_all(ds: &DataStore, model: &Model, at: &str) -> Result<(), String> {
    for (k, v) in model {
        let got = ds.lookup(k).map_err(|e| format!("{at}: lookup: {e}"))?.map(|e| e.value);
        if got.as_ref() != Some(v) {
            return Err(format!("{at}: key {:?} has {got:?}, model {v:?}", String::from_utf8_lossy(k)));
        }
    }
    let live = ds.stats().live_keys;
    if live != model.len() as u64 {
        return Err(format!("{at}: {live} live keys, model has {}", model.len()));
    }
    Ok(())
}

/// Counts of what a case exercised.
#[derive(Default)]
struct Seen {
    growths: u64,
    reopens_mid_migration: u64,
}

/// An error mapper naming where it happened.
fn e(what: &str) -> impl Fn(fawn_ds::Error) -> String + '_ {
    move |err| format!("{what}: {err}")
}

fn run_case(seed: u64, seen: &mut Seen) -> Result<(), String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() };
    let dir = dir.map_err(|e| e.to_string())?;
    let mut ds = DataStore::open(dir.path(), options(&mut rng)).map_err(e("open"))?;
    let mut model: Model = BTreeMap::new();
    let mut next_key = 0u64;
    let ops: u64 = rng.gen_range(3000..7000);
    let mut capacity = ds.stats().index_capacity;
    for step in 0..ops {
        let at = format!("step {step}");
        let meta = Meta { seq: step + 1, ..Meta::default() };
        let value: Vec<u8> = (0..rng.gen_range(1..60)).map(|_| rng.gen()).collect();
        let existing = |rng: &mut SmallRng, model: &Model| -> Option<Vec<u8>> {
            let n = model.len();
            (n > 0).then(|| model.keys().nth(rng.gen_range(0..n)).cloned()).flatten()
        };
        match rng.gen_range(0..1000) {
            0..=599 => {
                let k = format!("k{next_key}").into_bytes();
                next_key += 1;
                ds.store(&k, &value, meta).map_err(e(&at))?;
                model.insert(k, value);
            }
            600..=749 => {
                if let Some(k) = existing(&mut rng, &model) {
                    ds.store(&k, &value, meta).map_err(e(&at))?;
                    model.insert(k, value);
                }
            }
            750..=869 => {
                if let Some(k) = existing(&mut rng, &model) {
                    ds.delete(&k, meta).map_err(e(&at))?;
                    model.remove(&k);
                }
            }
            870..=959 => {
                // A batch: new keys, an overwrite and a delete of the same key within it.
                let keys: Vec<Vec<u8>> = (0..rng.gen_range(1..80))
                    .map(|_| {
                        next_key += 1;
                        format!("k{}", next_key - 1).into_bytes()
                    })
                    .collect();
                let mut batch: Vec<BatchOp> = keys.iter().map(|k| BatchOp::put(k, &value, meta)).collect();
                let old = existing(&mut rng, &model);
                if let Some(k) = &old {
                    batch.push(BatchOp::put(k, b"batched", meta));
                    batch.push(BatchOp::delete(k, meta));
                }
                ds.write_batch(&batch).map_err(e(&at))?;
                for k in keys {
                    model.insert(k, value.clone());
                }
                if let Some(k) = old {
                    model.remove(&k);
                }
            }
            960..=974 => ds.checkpoint().map_err(e(&at))?,
            975..=981 => {
                ds.compact_hot()
                    .or_else(|err| match err {
                        fawn_ds::Error::InvalidRequest(_) => ds.compact(),
                        other => Err(other),
                    })
                    .map_err(e(&at))?;
            }
            982..=985 => {
                ds.compact().map_err(e(&at))?;
            }
            986..=992 => {
                drop(ds);
                ds = DataStore::open(dir.path(), options(&mut rng)).map_err(e(&at))?;
                check_all(&ds, &model, &format!("{at} after drop-reopen"))?;
            }
            _ => {
                ds.close().map_err(e(&at))?;
                ds = DataStore::open(dir.path(), options(&mut rng)).map_err(e(&at))?;
                check_all(&ds, &model, &format!("{at} after close-reopen"))?;
            }
        }
        let st = ds.stats();
        if st.index_capacity > capacity {
            seen.growths += 1;
        }
        capacity = st.index_capacity;
        if st.index_migrating && rng.gen_bool(0.02) {
            // Checkpoint mid-migration and reopen from it.
            ds.checkpoint().map_err(e(&at))?;
            drop(ds);
            ds = DataStore::open(dir.path(), options(&mut rng)).map_err(e(&at))?;
            let rep = ds.recovery_report();
            if !rep.from_checkpoint {
                return Err(format!(
                    "{at}: the checkpoint just written was rejected: {:?}",
                    rep.checkpoint_error
                ));
            }
            if ds.stats().index_migrating {
                seen.reopens_mid_migration += 1;
            }
            check_all(&ds, &model, &format!("{at} after a reopen mid-migration"))?;
        }
        if step % 500 == 0 {
            check_all(&ds, &model, &at)?;
        }
    }
    check_all(&ds, &model, "end")?;
    let st = ds.stats();
    if st.growth_unplaced != 0 {
        return Err(format!("{} entries left for the stash by the growth scan", st.growth_unplaced));
    }
    ds.close().map_err(e("close"))?;
    let ds = DataStore::open(dir.path(), options(&mut rng)).map_err(e("final open"))?;
    check_all(&ds, &model, "final reopen")
}

#[test]
fn growth_survives_writes_maintenance_checkpoints_and_reopen_mid_migration() {
    let (first, cases) = match std::env::var("FAWN_DS_SEED") {
        Ok(s) => (s.parse().expect("FAWN_DS_SEED must be a u64"), 1),
        Err(_) => (1, CASES),
    };
    // Cases are independent (own seed, own directory, no helper threads): run them on a
    // few threads. Each case stays deterministic.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
    let next = AtomicU64::new(first);
    let seen = Mutex::new(Seen::default());
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads.min(cases as usize) {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= first + cases {
                    return;
                }
                let mut mine = Seen::default();
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| run_case(seed, &mut mine)))
                    .unwrap_or_else(|_| Err("panicked".into()));
                match result {
                    Ok(()) => {
                        let mut all = seen.lock().unwrap();
                        all.growths += mine.growths;
                        all.reopens_mid_migration += mine.reopens_mid_migration;
                    }
                    Err(e) => failures.lock().unwrap().push((seed, e)),
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort();
    if let Some((seed, e)) = failures.first() {
        panic!(
            "growth model failed for {} seed(s); first: seed {seed} (rerun with FAWN_DS_SEED={seed}): {e}",
            failures.len()
        );
    }
    let seen = seen.into_inner().unwrap();
    eprintln!(
        "{cases} cases on {threads} threads: {} growths, {} reopens mid-migration",
        seen.growths, seen.reopens_mid_migration
    );
    if cases == CASES {
        assert!(seen.growths >= 5 * CASES, "too few growths: {}", seen.growths);
        assert!(seen.reopens_mid_migration >= CASES, "too few reopens mid-migration");
    }
}
