//! Guards maintenance under live traffic against a model: writer threads run seeded random
//! store / delete / lookup sequences on their own keys and check after every step that the
//! store shows exactly their model, while another thread interleaves compact (with rising
//! tombstone watermarks), split (the split store must hold, for every key, a version between
//! the last one acknowledged before the split began and the last one started before it
//! returned) and merge (another store's keys, deletes included, all appear and stay), and
//! the automatic compactor runs with tiny thresholds. Cases alternate hot/cold separation on
//! (then hot compactions and the cost/benefit `clean` are interleaved too) and off. At the end: iteration replays to the
//! model with per-key increasing seqs, `max_seq` equals the highest seq written, and both
//! hold again after a reopen. Reproduce with `FAWN_DS_SEED=<seed>`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fawn_ds::{DataStore, Meta, Options, RecordKind, SyncPolicy};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const CASES: u64 = 6;
const WRITERS: usize = 3;
const KEYS_PER_WRITER: usize = 40;
const CASE_DURATION: Duration = Duration::from_millis(1500);

type Value = Option<(Vec<u8>, u64)>; // (value, seq); None = absent

/// Every version a key went through: index 0 is "absent" (never written).
struct History {
    versions: Mutex<Vec<Value>>,
    acked: AtomicUsize,
}

fn key_of(w: usize, k: usize) -> Vec<u8> {
    format!("w{w}-{k:03}").into_bytes()
}

fn value(rng: &mut SmallRng, seq: u64) -> Vec<u8> {
    let len = if rng.gen_bool(0.05) { rng.gen_range(1500..2500) } else { rng.gen_range(0..300) };
    let mut v = seq.to_le_bytes().to_vec();
    v.extend((0..len).map(|_| rng.gen::<u8>()));
    v
}

fn scratch(tag: &str) -> tempfile::TempDir {
    let shm = std::path::PathBuf::from("/dev/shm");
    let base = if shm.is_dir() { shm } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix(tag).tempdir_in(base).expect("tempdir")
}

/// The value of an expired put (expiry 1 = 1970): fixed bytes, so a check can tell it.
fn expiring_value(seq: u64) -> Vec<u8> {
    let mut v = seq.to_le_bytes().to_vec();
    v.extend_from_slice(b"expiring");
    v
}

fn is_expiring(v: &Value) -> bool {
    v.as_ref().is_some_and(|(v, s)| *v == expiring_value(*s))
}

/// The store shows `want`, or nothing if `want` is an expired put (compaction drops those).
fn matches(have: &Value, want: &Value) -> bool {
    have == want || (have.is_none() && is_expiring(want))
}

fn got(ds: &DataStore, key: &[u8]) -> Result<Value, String> {
    let e = ds.lookup(key).map_err(|e| format!("lookup: {e}"))?;
    Ok(e.map(|e| (e.value, e.meta.seq)))
}

fn writer(
    ds: Arc<DataStore>,
    w: usize,
    seed: u64,
    seq: Arc<AtomicU64>,
    hist: Arc<Vec<History>>,
    stop: Arc<AtomicBool>,
) -> Result<HashMap<Vec<u8>, Value>, String> {
    let mut rng = SmallRng::seed_from_u64(seed ^ (w as u64) << 32);
    let mut model: HashMap<Vec<u8>, Value> = HashMap::new();
    let mut step = 0u64;
    while !stop.load(Ordering::Acquire) {
        step += 1;
        let k = rng.gen_range(0..KEYS_PER_WRITER);
        let key = key_of(w, k);
        let h = &hist[w * KEYS_PER_WRITER + k];
        match rng.gen_range(0..10) {
            0..=5 => {
                let s = seq.fetch_add(1, Ordering::AcqRel) + 1;
                // Some puts expired long ago: compaction may drop them, never resurrect
                // what they superseded.
                let expiring = rng.gen_bool(0.05);
                let v = if expiring { expiring_value(s) } else { value(&mut rng, s) };
                h.versions.lock().unwrap().push(Some((v.clone(), s)));
                let meta = Meta { seq: s, flags: s as u32, expiry: u32::from(expiring), state: 0 };
                ds.store(&key, &v, meta).map_err(|e| format!("writer {w} step {step} store: {e}"))?;
                h.acked.fetch_add(1, Ordering::AcqRel);
                model.insert(key.clone(), Some((v, s)));
            }
            6..=7 => {
                let s = seq.fetch_add(1, Ordering::AcqRel) + 1;
                h.versions.lock().unwrap().push(None);
                let meta = Meta { seq: s, flags: 0, expiry: 0, state: 0 };
                ds.delete(&key, meta).map_err(|e| format!("writer {w} step {step} delete: {e}"))?;
                h.acked.fetch_add(1, Ordering::AcqRel);
                model.insert(key.clone(), None);
            }
            _ => {}
        }
        // After every step the visible contents equal the model (this key and another).
        for key in [key, key_of(w, rng.gen_range(0..KEYS_PER_WRITER))] {
            let want = model.get(&key).cloned().flatten();
            let have = got(&ds, &key).map_err(|e| format!("writer {w} step {step}: {e}"))?;
            if !matches(&have, &want) {
                return Err(format!(
                    "writer {w} step {step}: key {} has seq {:?}, model seq {:?}",
                    String::from_utf8_lossy(&key),
                    have.map(|v| v.1),
                    want.map(|v| v.1)
                ));
            }
        }
    }
    Ok(model)
}

/// Split off writer 0's even keys and check the cut (see the file comment).
fn split_and_check(ds: &DataStore, hist: &[History], target: &std::path::Path) -> Result<(), String> {
    let picks: Vec<usize> = (0..KEYS_PER_WRITER).step_by(2).collect();
    let lower: Vec<usize> = picks.iter().map(|&k| hist[k].acked.load(Ordering::Acquire)).collect();
    let belongs = |key: &[u8]| {
        let s = std::str::from_utf8(key).unwrap_or("");
        s.strip_prefix("w0-").and_then(|n| n.parse::<usize>().ok()).is_some_and(|n| n % 2 == 0)
    };
    let opts = Options { sync: SyncPolicy::Never, auto_compact: false, ..Options::default() };
    let (split, _) = ds.split(Arc::new(belongs), target, opts).map_err(|e| format!("split: {e}"))?;
    for (i, &k) in picks.iter().enumerate() {
        let versions = hist[k].versions.lock().unwrap();
        let upper = versions.len(); // versions started before the split returned
        let have = got(&split, &key_of(0, k))?;
        // Index 0 of `versions` is the first write; "absent" before it is version -1.
        let candidates = std::iter::once(None).chain(versions.iter().cloned()).collect::<Vec<_>>();
        let ok = (lower[i]..=upper).any(|j| matches(&have, &candidates[j]));
        if !ok {
            return Err(format!(
                "split: key w0-{k} holds seq {:?}, not a version in [{}, {upper}]",
                have.map(|v| v.1),
                lower[i]
            ));
        }
    }
    for r in split.iter() {
        let r = r.map_err(|e| format!("split iter: {e}"))?;
        if !belongs(&r.key) {
            return Err(format!("split store holds a foreign key {:?}", String::from_utf8_lossy(&r.key)));
        }
    }
    Ok(())
}

/// Build a store with known content (puts and deletes) and merge it in.
fn merge_and_check(
    ds: &DataStore,
    round: usize,
    other_dir: &std::path::Path,
    seq: &AtomicU64,
    merged: &mut HashMap<Vec<u8>, Value>,
) -> Result<(), String> {
    let opts = Options { sync: SyncPolicy::Never, auto_compact: false, ..Options::default() };
    let other = DataStore::open(other_dir, opts).map_err(|e| format!("other open: {e}"))?;
    let mut mine = HashMap::new();
    for i in 0..60u64 {
        let key = format!("m{round}-{}", i % 25).into_bytes();
        let s = seq.fetch_add(1, Ordering::AcqRel) + 1;
        if i % 11 == 3 {
            other.delete(&key, Meta { seq: s, ..Meta::default() }).map_err(|e| e.to_string())?;
            mine.insert(key, None);
        } else {
            let v = format!("merged {round} {i}").into_bytes();
            other.store(&key, &v, Meta { seq: s, ..Meta::default() }).map_err(|e| e.to_string())?;
            mine.insert(key, Some((v, s)));
        }
    }
    ds.merge(&other).map_err(|e| format!("merge: {e}"))?;
    if ds.max_seq() < other.max_seq() {
        return Err("merge lowered max_seq below the other store's".into());
    }
    merged.extend(mine);
    check_static(ds, merged).map_err(|e| format!("after merge {round}: {e}"))
}

fn check_static(ds: &DataStore, merged: &HashMap<Vec<u8>, Value>) -> Result<(), String> {
    for (k, want) in merged {
        if &got(ds, k)? != want {
            return Err(format!("merged key {} lost or wrong", String::from_utf8_lossy(k)));
        }
    }
    Ok(())
}

fn run_case(seed: u64) -> Result<(), String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = scratch("model-maint");
    let path = dir.path().join("store");
    let hot_cold = seed.is_multiple_of(2);
    let opts = Options {
        sync: SyncPolicy::Never,
        hot_cold,
        checkpoint_every_bytes: if rng.gen_bool(0.5) { 32 << 10 } else { 0 },
        auto_compact: true,
        compact_garbage_bytes: 64 << 10,
        compact_garbage_ratio: 0.3,
        compact_check_interval: Duration::from_millis(rng.gen_range(5..50)),
        ..Options::default()
    };
    let ds = Arc::new(DataStore::open(&path, opts.clone()).map_err(|e| e.to_string())?);
    let seq = Arc::new(AtomicU64::new(0));
    let hist: Arc<Vec<History>> = Arc::new(
        (0..WRITERS * KEYS_PER_WRITER)
            .map(|_| History { versions: Mutex::new(Vec::new()), acked: AtomicUsize::new(0) })
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (ds, seq, hist, stop) = (ds.clone(), seq.clone(), hist.clone(), stop.clone());
            std::thread::spawn(move || writer(ds, w, seed, seq, hist, stop))
        })
        .collect();
    let mut merged = HashMap::new();
    let started = Instant::now();
    let mut maint_result = Ok(());
    let mut round = 0;
    while started.elapsed() < CASE_DURATION && maint_result.is_ok() {
        round += 1;
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..30)));
        maint_result = match rng.gen_range(0..if hot_cold { 6 } else { 4 }) {
            0 => ds.compact().map(|_| ()).map_err(|e| format!("compact: {e}")),
            1 => {
                // Every tombstone issued so far may go: deletes still in flight are the hard case.
                ds.set_tombstone_watermark(seq.load(Ordering::Acquire));
                ds.compact().map(|_| ()).map_err(|e| format!("compact: {e}"))
            }
            2 => split_and_check(&ds, &hist, &dir.path().join(format!("split{round}"))),
            4 => ds.compact_hot().map(|_| ()).map_err(|e| format!("compact_hot: {e}")),
            5 => ds.clean().map(|_| ()).map_err(|e| format!("clean: {e}")),
            _ => merge_and_check(&ds, round, &dir.path().join(format!("other{round}")), &seq, &mut merged),
        }
        .map_err(|e| format!("maintenance round {round}: {e}"));
        if maint_result.is_ok() {
            maint_result = check_static(&ds, &merged).map_err(|e| format!("round {round}: {e}"));
        }
    }
    stop.store(true, Ordering::Release);
    let mut model: HashMap<Vec<u8>, Value> = HashMap::new();
    for w in writers {
        model.extend(w.join().map_err(|_| "writer panicked".to_string())??);
    }
    maint_result?;
    model.extend(merged);
    let stats = ds.stats();
    if stats.maintenance_ops == 0 {
        return Err("no maintenance ran".into());
    }
    let top = seq.load(Ordering::Acquire);
    let ds = Arc::into_inner(ds).ok_or("store still shared")?;
    let mut ds = ds;
    for pass in 0..2 {
        for (k, want) in &model {
            if !matches(&got(&ds, k)?, want) {
                return Err(format!("final pass {pass}: key {} wrong", String::from_utf8_lossy(k)));
            }
        }
        // Replaying the iteration gives the model; each key's seqs increase.
        let mut state: HashMap<Vec<u8>, (RecordKind, u64)> = HashMap::new();
        for r in ds.iter() {
            let r = r.map_err(|e| format!("iter: {e}"))?;
            if let Some(&(_, prev)) = state.get(&r.key) {
                if r.meta.seq <= prev {
                    return Err(format!("pass {pass}: iteration out of seq order for a key"));
                }
            }
            state.insert(r.key, (r.kind, r.meta.seq));
        }
        for (k, want) in &model {
            let replayed = state.get(k).filter(|(kind, _)| *kind == RecordKind::Put).map(|&(_, s)| s);
            let dropped_expired = replayed.is_none() && is_expiring(want);
            if replayed != want.as_ref().map(|v| v.1) && !dropped_expired {
                return Err(format!("pass {pass}: replay of {} disagrees", String::from_utf8_lossy(k)));
            }
        }
        if ds.max_seq() != top {
            return Err(format!("pass {pass}: max_seq {} != highest written {top}", ds.max_seq()));
        }
        drop(ds);
        ds = DataStore::open(&path, opts.clone()).map_err(|e| format!("reopen: {e}"))?;
    }
    eprintln!(
        "seed {seed} (hot/cold {hot_cold}): {round} maintenance rounds, {} ops by the store ({} automatic or \
         manual), cold log {} B",
        top, stats.maintenance_ops, stats.cold_log_bytes
    );
    if hot_cold && stats.cold_log_bytes == 0 {
        return Err("hot/cold on, but no cold log was ever built".into());
    }
    Ok(())
}

#[test]
fn maintenance_interleaved_with_writers_matches_the_model() {
    let (first, cases) = match std::env::var("FAWN_DS_SEED") {
        Ok(s) => (s.parse().expect("FAWN_DS_SEED must be a u64"), 1),
        Err(_) => (0xFA57_3000, CASES),
    };
    for seed in first..first + cases {
        eprintln!("model_concurrent_maintenance seed {seed} (FAWN_DS_SEED={seed} to reproduce)");
        if let Err(e) = run_case(seed) {
            panic!("seed {seed} (rerun with FAWN_DS_SEED={seed}): {e}");
        }
    }
}
