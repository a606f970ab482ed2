//! Guards durability against process crashes: a child process
//! (this test binary re-executed with an env var) runs 4 writer threads that print every
//! acknowledged write; the parent SIGKILLs it at a random moment, reopens the store and
//! checks that every acknowledged write is present with its exact value and metadata, that
//! the only other state allowed is each thread's one in-flight operation, and that the log
//! holds no garbage. Hundreds of kill points per run. Most rounds use `Always`; every
//! third uses `Interval(5 ms)` or `Never`, which must lose nothing to a *process* crash
//! either (the page cache survives it). Reproduce with FAWN_DS_SEED=<seed>.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fawn_ds::{DataStore, Meta, Options, RecordKind, SyncPolicy};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const CHILD_DIR_ENV: &str = "FAWN_DS_CRASH_CHILD_DIR";
const CHILD_BASE_ENV: &str = "FAWN_DS_CRASH_CHILD_BASE";
const CHILD_POLICY_ENV: &str = "FAWN_DS_CRASH_CHILD_POLICY";
const THREADS: u64 = 4;
const KEYS_PER_THREAD: u64 = 64;
const ROUNDS: u64 = 200;

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

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

fn meta_for(seq: u64) -> Meta {
    Meta { seq, flags: (seq as u32).wrapping_mul(7), expiry: 0 }
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
    let opts = Options { sync, checkpoint_every_bytes: 64 << 10, ..Options::default() };
    let ds = std::sync::Arc::new(DataStore::open(Path::new(&dir), opts).expect("child open"));
    println!("READY");
    std::io::stdout().flush().expect("flush");
    let threads: Vec<_> = (0..THREADS)
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
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ACK {seq}").and_then(|()| out.flush()).expect("ack");
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

/// Run one child until a random kill point; returns the acknowledged seqs.
fn run_child(dir: &Path, base: u64, policy: &str, rng: &mut SmallRng) -> Vec<u64> {
    let exe = std::env::current_exe().expect("current exe");
    let mut child = Command::new(exe)
        .args(["crash_child_writer", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_BASE_ENV, base.to_string())
        .env(CHILD_POLICY_ENV, policy)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut acks = Vec::new();
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                // A line cut by the kill has no newline: that ack was not fully given.
                Ok(_) if line.last() != Some(&b'\n') => break,
                Ok(_) => {}
            }
            // The test harness prints "test crash_child_writer ... " without a newline, so
            // the child's own lines are matched at the end of a line.
            let s = String::from_utf8_lossy(&line);
            let s = s.trim_end();
            if s.ends_with("READY") {
                let _ = tx.send(());
            } else if let Some(pos) = s.rfind("ACK ") {
                acks.push(s[pos + 4..].parse::<u64>().expect("ack seq"));
            }
        }
        acks
    });
    rx.recv_timeout(Duration::from_secs(20)).expect("child never became ready");
    std::thread::sleep(Duration::from_micros(rng.gen_range(0..30_000)));
    child.kill().expect("SIGKILL child");
    child.wait().expect("reap child");
    reader.join().expect("reader thread")
}

type State = HashMap<u64, Option<u64>>; // key -> seq of its live put (None: absent)

/// Check the reopened store against the acknowledged state plus in-flight ops; then adopt
/// what the store holds for the in-flight keys.
/// `from`: log offset up to which earlier rounds already checked the records.
fn verify(ds: &DataStore, model: &mut State, base: u64, acks: &[u64], from: u64) -> Result<(), String> {
    let mut done_per_thread = [0u64; THREADS as usize];
    for &seq in acks {
        let (k, del) = op(base, seq);
        model.insert(k, if del { None } else { Some(seq) });
        done_per_thread[((seq - base) % THREADS) as usize] += 1;
    }
    // Each thread's next op may or may not have reached the log.
    let inflight: HashMap<u64, (u64, bool)> = (0..THREADS)
        .map(|t| {
            let seq = base + t + THREADS * done_per_thread[t as usize];
            let (k, del) = op(base, seq);
            (k, (seq, del))
        })
        .collect();
    for k in 0..THREADS * KEYS_PER_THREAD {
        let got = ds.lookup(&key_bytes(k)).map_err(|e| format!("lookup {k}: {e}"))?;
        if let Some(e) = &got {
            if e.value != value_for(k, e.meta.seq) || e.meta != meta_for(e.meta.seq) {
                return Err(format!("key {k}: garbage value or meta at seq {}", e.meta.seq));
            }
        }
        let got_seq = got.map(|e| e.meta.seq);
        let acked = model.get(&k).copied().flatten();
        let inflight_state = inflight.get(&k).map(|&(seq, del)| if del { None } else { Some(seq) });
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
        let acks = run_child(dir.path(), base, policy, &mut rng);
        total_acks += acks.len();
        let ds = DataStore::open(dir.path(), Options { sync: SyncPolicy::Never, ..Options::default() })
            .unwrap_or_else(|e| panic!("seed {seed} round {round} ({policy}): reopen failed: {e}"));
        truncations += (ds.recovery_report().truncated_bytes > 0) as u32;
        if let Err(e) = verify(&ds, &mut model, base, &acks, checked) {
            panic!("seed {seed} round {round} ({policy}): {e}");
        }
    }
    eprintln!(
        "{ROUNDS} kills, {total_acks} acknowledged writes verified, {truncations} torn tails cut, {:?}",
        started.elapsed()
    );
    assert!(total_acks > ROUNDS as usize, "children wrote too little to test anything");
}
