//! Guards crash atomicity of maintenance: a child process (this test binary re-executed)
//! runs writer threads that print every acknowledged write while another thread runs
//! compact, merge, split or hot compactions (alternating with full ones) back to back, with
//! hot/cold separation on or off (so full compactions also fold a cold log back); the parent SIGKILLs it at a random moment —
//! most kills land inside a maintenance operation — and checks on reopen that every
//! acknowledged write is there exactly (each thread's one in-flight op may or may not be),
//! that `max_seq` did not go backwards, that a merge is all-or-nothing (and all once it
//! reported done), that merged keys survive later compactions, and that every split
//! store that exists opens and holds only its keys with valid values (and exists once the
//! split reported done). Reproduce with FAWN_DS_SEED=<seed>.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_ds::{DataStore, Meta, Options, SyncPolicy};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod support;
use support::mix;

const CHILD_DIR_ENV: &str = "FAWN_DS_MCRASH_CHILD_DIR";
const CHILD_BASE_ENV: &str = "FAWN_DS_MCRASH_CHILD_BASE";
const CHILD_POLICY_ENV: &str = "FAWN_DS_MCRASH_CHILD_POLICY";
const CHILD_MODE_ENV: &str = "FAWN_DS_MCRASH_CHILD_MODE";
const CHILD_HOT_COLD_ENV: &str = "FAWN_DS_MCRASH_CHILD_HOT_COLD";
const THREADS: u64 = 3;
const KEYS_PER_THREAD: u64 = 64;
const MERGE_KEYS: u64 = 40;
const ROUNDS: u64 = 160;

/// Operation `seq` of a round starting at `base`: (key, is_delete); thread t owns keys ≡ t.
fn op(base: u64, seq: u64) -> (u64, bool) {
    let t = (seq - base) % THREADS;
    let h = mix(seq);
    (t + THREADS * ((h >> 8) % KEYS_PER_THREAD), h.is_multiple_of(6))
}

fn key_bytes(k: u64) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

fn value_for(k: u64, seq: u64) -> Vec<u8> {
    let len = (mix(k ^ (seq << 16)) % 2000) as usize;
    (0..len).map(|i| (mix(seq ^ (i as u64) << 40) >> 56) as u8).collect()
}

fn meta_for(seq: u64) -> Meta {
    Meta { seq, flags: (seq as u32).wrapping_mul(7), expiry: 0, state: 0 }
}

/// Merged keys of the round at `base`: i -> Some(value) or None (deleted in the other store).
fn merge_item(base: u64, i: u64) -> Option<Vec<u8>> {
    (i % 7 != 3).then(|| format!("merged {base} {i}").into_bytes())
}

fn merge_key(base: u64, i: u64) -> Vec<u8> {
    format!("o{base}-{i}").into_bytes()
}

fn split_belongs(key: &[u8]) -> bool {
    std::str::from_utf8(key)
        .ok()
        .and_then(|s| s.strip_prefix("key-")?.parse::<u64>().ok())
        .is_some_and(|k| k % 2 == 0)
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).expect("print");
}

fn child_maintenance(ds: &DataStore, dir: &Path, base: u64, mode: &str, stop: &AtomicBool) {
    let quiet = Options { sync: SyncPolicy::Never, auto_compact: false, ..Options::default() };
    for n in 0.. {
        if stop.load(Ordering::Acquire) {
            return;
        }
        say("BEGIN");
        match mode {
            "merge" if n == 0 => {
                let other =
                    DataStore::open(&dir.join(format!("other-{base}")), quiet.clone()).expect("other");
                for i in 0..MERGE_KEYS {
                    let seq = base + 1_000_000 + i;
                    other.store(&merge_key(base, i), b"first", Meta { seq, ..Meta::default() }).expect("o");
                    let meta = Meta { seq: seq + MERGE_KEYS, ..Meta::default() };
                    match merge_item(base, i) {
                        Some(v) => other.store(&merge_key(base, i), &v, meta).expect("o"),
                        None => other.delete(&merge_key(base, i), meta).expect("o"),
                    }
                }
                say(&format!("MERGE-START {base}"));
                ds.merge(&other).expect("merge");
                say(&format!("MERGE-DONE {base}"));
            }
            "split" => {
                let target = dir.join(format!("split-{base}-{n}"));
                let (s, _) = ds.split(Arc::new(split_belongs), &target, quiet.clone()).expect("split");
                drop(s);
                say(&format!("SPLIT-DONE {}", target.display()));
            }
            "hot" if n % 3 != 2 => {
                ds.compact_hot().expect("compact_hot");
                say(&format!("COMPACT-DONE {n}"));
            }
            _ => {
                ds.compact().expect("compact");
                say(&format!("COMPACT-DONE {n}"));
            }
        }
    }
}

/// Child mode: write and maintain until killed. A no-op when run as an ordinary test.
#[test]
fn crash_child_maintainer() {
    let (Ok(dir), Ok(base)) = (std::env::var(CHILD_DIR_ENV), std::env::var(CHILD_BASE_ENV)) else { return };
    let base: u64 = base.parse().expect("base");
    let mode = std::env::var(CHILD_MODE_ENV).unwrap_or_default();
    let sync = match std::env::var(CHILD_POLICY_ENV).as_deref() {
        Ok("interval") => SyncPolicy::Interval(Duration::from_millis(5)),
        Ok("never") => SyncPolicy::Never,
        _ => SyncPolicy::Always,
    };
    let dir = Path::new(&dir);
    let hot_cold = std::env::var(CHILD_HOT_COLD_ENV).as_deref() == Ok("1");
    let opts = Options {
        sync,
        checkpoint_every_bytes: 64 << 10,
        auto_compact: false,
        hot_cold,
        ..Options::default()
    };
    let ds = Arc::new(DataStore::open(&dir.join("main"), opts).expect("child open"));
    say("READY");
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let ds = ds.clone();
            std::thread::spawn(move || {
                for i in 0.. {
                    let seq = base + t + THREADS * i;
                    let (k, del) = op(base, seq);
                    let r = if del {
                        ds.delete(&key_bytes(k), meta_for(seq))
                    } else {
                        ds.store(&key_bytes(k), &value_for(k, seq), meta_for(seq))
                    };
                    r.expect("child write");
                    say(&format!("ACK {seq}"));
                }
            })
        })
        .collect();
    child_maintenance(&ds, dir, base, &mode, &stop);
    stop.store(true, Ordering::Release);
    for t in writers {
        let _ = t.join();
    }
}

/// Run one child until a random kill point; returns its complete output lines.
fn run_child(
    dir: &Path,
    base: u64,
    policy: &str,
    mode: &str,
    hot_cold: bool,
    rng: &mut SmallRng,
) -> Vec<String> {
    // Every other merge round lives longer, so that some merges complete before the kill
    // (a merge writes and syncs a whole new state: tens of ms on a busy machine).
    let max_delay_us = if mode == "merge" && rng.gen_bool(0.5) { 400_000 } else { 60_000 };
    let env = [
        (CHILD_DIR_ENV, dir.display().to_string()),
        (CHILD_BASE_ENV, base.to_string()),
        (CHILD_POLICY_ENV, policy.to_string()),
        (CHILD_MODE_ENV, mode.to_string()),
        (CHILD_HOT_COLD_ENV, if hot_cold { "1" } else { "0" }.to_string()),
    ];
    let run_for = Duration::from_micros(rng.gen_range(1_000..max_delay_us));
    support::run_until_killed("crash_child_maintainer", &env, run_for)
}

fn tagged<'a>(lines: &'a [String], tag: &str) -> impl Iterator<Item = &'a str> {
    let tag = format!("{tag} ");
    lines.iter().filter_map(move |l| l.rfind(tag.as_str()).map(|p| &l[p + tag.len()..]))
}

type State = HashMap<u64, Option<u64>>;

fn verify_writes(ds: &DataStore, model: &mut State, base: u64, acks: &[u64]) -> Result<(), String> {
    let mut done = [0u64; THREADS as usize];
    for &seq in acks {
        let (k, del) = op(base, seq);
        model.insert(k, if del { None } else { Some(seq) });
        done[((seq - base) % THREADS) as usize] += 1;
    }
    let inflight: HashMap<u64, (u64, bool)> = (0..THREADS)
        .map(|t| {
            let seq = base + t + THREADS * done[t as usize];
            let (k, del) = op(base, seq);
            (k, (seq, del))
        })
        .collect();
    for k in 0..THREADS * KEYS_PER_THREAD {
        let got = ds.lookup(&key_bytes(k)).map_err(|e| format!("lookup {k}: {e}"))?;
        if let Some(e) = &got {
            if e.value != value_for(k, e.meta.seq) || e.meta != meta_for(e.meta.seq) {
                return Err(format!("key {k}: garbage at seq {}", e.meta.seq));
            }
        }
        let got_seq = got.map(|e| e.meta.seq);
        let acked = model.get(&k).copied().flatten();
        let inflight_state = inflight.get(&k).map(|&(s, del)| if del { None } else { Some(s) });
        if got_seq == acked {
            continue;
        }
        if Some(got_seq) == inflight_state {
            model.insert(k, got_seq);
            continue;
        }
        return Err(format!(
            "key {k}: store has {got_seq:?}, acknowledged {acked:?}, in flight {inflight_state:?}"
        ));
    }
    Ok(())
}

/// Returns how many of the merge's live keys the store holds (all-or-nothing checked).
fn verify_merge(ds: &DataStore, base: u64) -> Result<u64, String> {
    let (mut live, mut present) = (0, 0);
    for i in 0..MERGE_KEYS {
        let got = ds.lookup(&merge_key(base, i)).map_err(|e| e.to_string())?.map(|e| e.value);
        let want = merge_item(base, i);
        if want.is_some() {
            live += 1;
        }
        match (&got, &want) {
            (None, _) => {}
            (Some(g), Some(w)) if g == w => present += 1,
            _ => return Err(format!("merged key {i} of round {base}: wrong value or resurrected")),
        }
    }
    if present != 0 && present != live {
        return Err(format!("merge of round {base} is partial: {present} of {live} keys"));
    }
    Ok(present)
}

fn verify_splits(dir: &Path, done: &[&str]) -> Result<u64, String> {
    let mut found = 0;
    for d in done {
        if !Path::new(d).is_dir() {
            return Err(format!("split {d} reported done but missing"));
        }
    }
    let entries = std::fs::read_dir(dir).map_err(|e| e.to_string())?;
    for e in entries {
        let p = e.map_err(|e| e.to_string())?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
        if !name.starts_with("split-") {
            continue;
        }
        if !name.ends_with(".split-tmp") {
            let opts = Options { sync: SyncPolicy::Never, auto_compact: false, ..Options::default() };
            let s = DataStore::open(&p, opts).map_err(|e| format!("split {name} does not open: {e}"))?;
            for r in s.iter() {
                let r = r.map_err(|e| format!("split {name}: {e}"))?;
                let k: u64 = std::str::from_utf8(&r.key)
                    .ok()
                    .and_then(|s| s.strip_prefix("key-")?.parse().ok())
                    .ok_or("foreign key in split")?;
                if !split_belongs(&r.key)
                    || (r.kind == fawn_ds::RecordKind::Put && r.value != value_for(k, r.meta.seq))
                {
                    return Err(format!("split {name}: foreign key or garbage at {}", r.offset));
                }
            }
            found += 1;
        }
        std::fs::remove_dir_all(&p).map_err(|e| e.to_string())?;
    }
    Ok(found)
}

#[test]
fn sigkill_during_maintenance_leaves_old_or_new_state() {
    let seed: u64 = std::env::var("FAWN_DS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5EED_3333);
    eprintln!("maintenance crash test seed {seed} (FAWN_DS_SEED={seed} to reproduce)");
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let main = dir.path().join("main");
    let never = || Options { sync: SyncPolicy::Never, auto_compact: false, ..Options::default() };
    let mut model = State::new();
    let mut merged_rounds: Vec<u64> = Vec::new();
    let (mut acks_total, mut during, mut merges_whole, mut splits_seen) = (0usize, 0u64, 0u64, 0u64);
    let mut top_seq = 0u64;
    let started = Instant::now();
    for round in 0..ROUNDS {
        let base = {
            let ds = DataStore::open(&main, never()).expect("open");
            (ds.max_seq() + 1).max(top_seq + 1)
        };
        let mode = ["compact", "merge", "split", "hot"][(round % 4) as usize];
        let policy = ["always", "interval", "never"][(round % 3) as usize];
        let hot_cold = mode == "hot" || (round / 4) % 2 == 0;
        let lines = run_child(dir.path(), base, policy, mode, hot_cold, &mut rng);
        let acks: Vec<u64> = tagged(&lines, "ACK").filter_map(|s| s.parse().ok()).collect();
        acks_total += acks.len();
        let ctx = format!("seed {seed} round {round} ({mode}, {policy}, hot/cold {hot_cold})");
        let ds = DataStore::open(&main, never()).unwrap_or_else(|e| panic!("{ctx}: reopen failed: {e}"));
        if let Some(&m) = acks.iter().max() {
            top_seq = top_seq.max(m);
        }
        if ds.max_seq() < top_seq {
            panic!("{ctx}: max_seq {} went below acknowledged {top_seq}", ds.max_seq());
        }
        top_seq = ds.max_seq();
        verify_writes(&ds, &mut model, base, &acks).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let ended = ["COMPACT-DONE", "SPLIT-DONE", "MERGE-DONE"].iter().map(|t| tagged(&lines, t).count());
        let begun = lines.iter().filter(|l| l.ends_with("BEGIN")).count();
        let ended = ended.collect::<Vec<_>>().into_iter();
        during += u64::from(begun > ended.sum::<usize>());
        if mode == "merge" && tagged(&lines, "MERGE-START").next().is_some() {
            let present = verify_merge(&ds, base).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let done = tagged(&lines, "MERGE-DONE").next().is_some();
            if done && present == 0 {
                panic!("{ctx}: merge reported done but its keys are missing");
            }
            if present > 0 {
                merges_whole += 1;
                merged_rounds.push(base);
            }
        }
        for &b in &merged_rounds {
            if verify_merge(&ds, b).unwrap_or_else(|e| panic!("{ctx}: {e}")) == 0 {
                panic!("{ctx}: keys merged in round base {b} were lost");
            }
        }
        let done: Vec<&str> = tagged(&lines, "SPLIT-DONE").collect();
        splits_seen += verify_splits(dir.path(), &done).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    }
    eprintln!(
        "{ROUNDS} kills ({during} inside a maintenance operation), {acks_total} acknowledged writes verified, \
         {merges_whole} merges found whole, {splits_seen} split stores checked, {:?}",
        started.elapsed()
    );
    assert!(acks_total > ROUNDS as usize, "children wrote too little to test anything");
    assert!(merges_whole > 0, "no merge ever completed: the kills were all too early");
}
