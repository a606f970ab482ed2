//! Guards durability against process crashes: a child process
//! (this test binary re-executed with an env var) runs 4 writer threads that print every
//! acknowledged write; the parent SIGKILLs it at a random moment, reopens the store and
//! checks that every acknowledged write is present with its exact value and metadata, that
//! the only other state allowed is each thread's one in-flight operation, and that the log
//! holds no garbage. Hundreds of kill points per run. Most rounds use `Always`; every
//! third uses `Interval(5 ms)` or `Never`, which must lose nothing to a *process* crash
//! either (the page cache survives it). About half the rounds write with `write_batch`
//! (batches of 1..8 ops, all acknowledged when the batch returns): then a prefix of each
//! thread's in-flight batch may be present, nothing else. Half the children pad records to
//! 4 KiB pages (`page_aligned_records`). Reproduce with FAWN_DS_SEED=<seed>.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use fawn_ds::{BatchOp, DataStore, Meta, Options, RecordKind, SyncPolicy};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod support;
use support::mix;

const CHILD_DIR_ENV: &str = "FAWN_DS_CRASH_CHILD_DIR";
const CHILD_BASE_ENV: &str = "FAWN_DS_CRASH_CHILD_BASE";
const CHILD_POLICY_ENV: &str = "FAWN_DS_CRASH_CHILD_POLICY";
const CHILD_BATCH_ENV: &str = "FAWN_DS_CRASH_CHILD_BATCH";
const CHILD_ALIGN_ENV: &str = "FAWN_DS_CRASH_CHILD_ALIGN";
const THREADS: u64 = 4;
const KEYS_PER_THREAD: u64 = 64;
const ROUNDS: u64 = 200;

/// The operation with sequence number `seq` in a round starting at `base`: (key, is_delete).
/// Thread t issues seqs base+t, base+t+THREADS, ... and owns keys ≡ t (mod THREADS), so
/// per-key order is the thread's program order.
fn op(base: u64, seq: u64) -> (u64, bool) {
    let t = (seq - base) % THREADS;
    let h = mix(seq);
    (t + THREADS * ((h >> 8) % KEYS_PER_THREAD), h.is_multiple_of(5))
}

fn key_bytes(k: u64) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

/// The value a put of key `k` at `seq` carries: any other bytes are garbage.
fn value_for(k: u64, seq: u64) -> Vec<u8> {
    let len = (mix(k ^ (seq << 16)) % 3000) as usize;
    (0..len).map(|i| (mix(seq ^ (i as u64) << 40) >> 56) as u8).collect()
}

/// Ops in the batch that starts with `seq` (1 when not batching).
fn batch_len(batching: bool, seq: u64) -> u64 {
    if batching {
        1 + mix(seq ^ 0xBA7C) % 8
    } else {
        1
    }
}

/// The seq of thread `t`'s `i`-th op.
fn seq_of(base: u64, t: u64, i: u64) -> u64 {
    base + t + THREADS * i
}

fn meta_for(seq: u64) -> Meta {
    Meta { seq, flags: (seq as u32).wrapping_mul(7), expiry: 0, state: 0 }
}

/// Child mode: write until killed. A no-op when run as an ordinary test.
#[test]
fn crash_child_writer() {
    let (Ok(dir), Ok(base)) = (std::env::var(CHILD_DIR_ENV), std::env::var(CHILD_BASE_ENV)) else { return };
    let base: u64 = base.parse().expect("base");
    let sync = match std::env::var(CHILD_POLICY_ENV).as_deref() {
        Ok("interval") => SyncPolicy::Interval(std::time::Duration::from_millis(5)),
        Ok("never") => SyncPolicy::Never,
        _ => SyncPolicy::Always,
    };
    let batching = std::env::var(CHILD_BATCH_ENV).is_ok_and(|v| v == "1");
    let page_aligned_records = std::env::var(CHILD_ALIGN_ENV).is_ok_and(|v| v == "1");
    let opts = Options { sync, checkpoint_every_bytes: 64 << 10, page_aligned_records, ..Options::default() };
    let ds = std::sync::Arc::new(DataStore::open(Path::new(&dir), opts).expect("child open"));
    println!("READY");
    std::io::stdout().flush().expect("flush");
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let ds = ds.clone();
            std::thread::spawn(move || {
                let mut i = 0;
                loop {
                    let n = batch_len(batching, seq_of(base, t, i));
                    let seqs: Vec<u64> = (i..i + n).map(|j| seq_of(base, t, j)).collect();
                    if batching {
                        let items: Vec<(Vec<u8>, Option<Vec<u8>>, Meta)> = seqs
                            .iter()
                            .map(|&seq| {
                                let (k, del) = op(base, seq);
                                (key_bytes(k), (!del).then(|| value_for(k, seq)), meta_for(seq))
                            })
                            .collect();
                        let ops: Vec<BatchOp> = items
                            .iter()
                            .map(|(k, v, m)| match v {
                                Some(v) => BatchOp::put(k, v, *m),
                                None => BatchOp::delete(k, *m),
                            })
                            .collect();
                        ds.write_batch(&ops).expect("child batch");
                    } else {
                        let seq = seqs[0];
                        let (k, del) = op(base, seq);
                        let r = if del {
                            ds.delete(&key_bytes(k), meta_for(seq))
                        } else {
                            ds.store(&key_bytes(k), &value_for(k, seq), meta_for(seq))
                        };
                        r.expect("child write");
                    }
                    let mut out = std::io::stdout().lock();
                    for seq in seqs {
                        writeln!(out, "ACK {seq}").expect("ack");
                    }
                    out.flush().expect("ack");
                    i += n;
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

/// Run one child until a random kill point; returns the acknowledged seqs.
fn run_child(dir: &Path, base: u64, policy: &str, batching: bool, rng: &mut SmallRng) -> Vec<u64> {
    let align = if rng.gen_bool(0.5) { "1" } else { "0" };
    let env = [
        (CHILD_DIR_ENV, dir.display().to_string()),
        (CHILD_BASE_ENV, base.to_string()),
        (CHILD_POLICY_ENV, policy.to_string()),
        (CHILD_BATCH_ENV, if batching { "1" } else { "0" }.to_string()),
        (CHILD_ALIGN_ENV, align.to_string()),
    ];
    let run_for = Duration::from_micros(rng.gen_range(0..30_000));
    // The test harness prints "test crash_child_writer ... " without a newline, so the
    // child's own lines are matched at the end of a line.
    support::run_until_killed("crash_child_writer", &env, run_for)
        .iter()
        .filter_map(|s| s.rfind("ACK ").map(|pos| s[pos + 4..].parse::<u64>().expect("ack seq")))
        .collect()
}

type State = HashMap<u64, Option<u64>>; // key -> seq of its live put (None: absent)

/// Check the reopened store against the acknowledged state plus in-flight ops; then adopt
/// what the store holds for the in-flight keys.
/// `from`: log offset up to which earlier rounds already checked the records.
fn verify(
    ds: &DataStore,
    model: &mut State,
    base: u64,
    acks: &[u64],
    batching: bool,
    from: u64,
) -> Result<(), String> {
    let mut done_per_thread = [0u64; THREADS as usize];
    for &seq in acks {
        let (k, del) = op(base, seq);
        model.insert(k, if del { None } else { Some(seq) });
        done_per_thread[((seq - base) % THREADS) as usize] += 1;
    }
    let mut got_state = State::new();
    for k in 0..THREADS * KEYS_PER_THREAD {
        let got = ds.lookup(&key_bytes(k)).map_err(|e| format!("lookup {k}: {e}"))?;
        if let Some(e) = &got {
            if e.value != value_for(k, e.meta.seq) || e.meta != meta_for(e.meta.seq) {
                return Err(format!("key {k}: garbage value or meta at seq {}", e.meta.seq));
            }
        }
        got_state.insert(k, got.map(|e| e.meta.seq));
    }
    // Per thread (each owns its keys): the store must hold the acknowledged state plus a
    // prefix of the thread's in-flight batch (one op when not batching). A batch whose acks
    // were cut mid-print was acknowledged in full: its prefix is at least the printed part.
    for t in 0..THREADS {
        let done = done_per_thread[t as usize];
        let mut start = 0;
        while start + batch_len(batching, seq_of(base, t, start)) <= done {
            start += batch_len(batching, seq_of(base, t, start));
        }
        let len = batch_len(batching, seq_of(base, t, start));
        let mine = |k: &u64| k % THREADS == t;
        let mut state: State = model.iter().filter(|(k, _)| mine(k)).map(|(&k, &v)| (k, v)).collect();
        // `state` holds the acknowledged ops (a cut batch's printed part too): try every
        // longer prefix of the in-flight batch.
        let acked_before: State = state.clone();
        let mut matched = None;
        for p in 0..=len {
            if start + p >= done {
                let agree = (0..THREADS * KEYS_PER_THREAD)
                    .filter(mine)
                    .all(|k| got_state.get(&k).copied().flatten() == state.get(&k).copied().flatten());
                if agree {
                    matched = Some(state.clone());
                    break;
                }
            }
            if p < len {
                let seq = seq_of(base, t, start + p);
                if start + p >= done {
                    let (k, del) = op(base, seq);
                    state.insert(k, if del { None } else { Some(seq) });
                }
            }
        }
        let Some(state) = matched else {
            let diff: Vec<String> = (0..THREADS * KEYS_PER_THREAD)
                .filter(mine)
                .filter(|k| got_state.get(k).copied().flatten() != acked_before.get(k).copied().flatten())
                .map(|k| {
                    format!(
                        "key {k}: store {:?} acked {:?}",
                        got_state.get(&k).copied().flatten(),
                        acked_before.get(&k)
                    )
                })
                .collect();
            return Err(format!(
                "thread {t}: store state is not the acknowledged state plus a prefix of the in-flight batch \
                 (ops {start}..{} of which {done} acknowledged): {diff:?}",
                start + len
            ));
        };
        for (k, v) in state {
            model.insert(k, v);
        }
    }
    // No garbage anywhere in the log.
    for r in ds.iter_from(from.min(ds.end_offset())) {
        let r = r.map_err(|e| format!("iter: {e}"))?;
        let k: u64 = std::str::from_utf8(&r.key)
            .ok()
            .and_then(|s| s.strip_prefix("key-")?.parse().ok())
            .ok_or("bad key in log")?;
        if r.kind == RecordKind::Put && r.value != value_for(k, r.meta.seq) {
            return Err(format!("garbage record at offset {}", r.offset));
        }
    }
    Ok(())
}

#[test]
fn sigkill_at_random_points_loses_no_acknowledged_write() {
    let seed: u64 = std::env::var("FAWN_DS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0xC0FFEE);
    eprintln!("crash test seed {seed} (FAWN_DS_SEED={seed} to reproduce)");
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut model = State::new();
    let (mut total_acks, mut truncations) = (0, 0);
    let started = Instant::now();
    for round in 0..ROUNDS {
        let (base, checked) = {
            let ds = DataStore::open(dir.path(), Options { sync: SyncPolicy::Never, ..Options::default() })
                .expect("open");
            (ds.max_seq() + 1, ds.end_offset())
        };
        let policy = match round % 6 {
            2 => "interval",
            5 => "never",
            _ => "always",
        };
        let batching = rng.gen_bool(0.5);
        let acks = run_child(dir.path(), base, policy, batching, &mut rng);
        total_acks += acks.len();
        let ds = DataStore::open(dir.path(), Options { sync: SyncPolicy::Never, ..Options::default() })
            .unwrap_or_else(|e| panic!("seed {seed} round {round} ({policy}): reopen failed: {e}"));
        truncations += (ds.recovery_report().truncated_bytes > 0) as u32;
        if let Err(e) = verify(&ds, &mut model, base, &acks, batching, checked) {
            panic!("seed {seed} round {round} ({policy}, batching {batching}): {e}");
        }
    }
    eprintln!(
        "{ROUNDS} kills, {total_acks} acknowledged writes verified, {truncations} torn tails cut, {:?}",
        started.elapsed()
    );
    assert!(total_acks > ROUNDS as usize, "children wrote too little to test anything");
}
