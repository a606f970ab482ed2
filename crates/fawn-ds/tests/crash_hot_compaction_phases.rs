//! Guards crash atomicity of a hot compaction (hot/cold separation) at every I/O step: a
//! child process (this test binary re-executed) builds a store — with or without an
//! existing cold log — and runs `compact_hot` while a writer thread keeps appending and
//! printing every acknowledged write; the fault injector SIGKILLs the child at the k-th
//! log write/fsync issued by the compacting thread (then a few writes after it returns), for
//! k = 1, 2, ... until a compaction completes. Before reopening, the parent classifies the files (killed before the LOGS
//! manifest named the new state, after it but before the commit rename, or after the
//! commit), then checks that reopen shows exactly the acknowledged state (the one write in
//! flight may or may not be there), that lookups agree with a replay of `iter()` (cold log,
//! then hot), and that all three phases were hit. It also recreates the on-disk state of a
//! crash between the commit and the renaming of a new cold log into place.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fawn_ds::{DataStore, FaultInjector, Meta, Options, RecordKind, SyncPolicy};

const CHILD_DIR_ENV: &str = "FAWN_DS_HOTCRASH_DIR";
const CHILD_KILL_ENV: &str = "FAWN_DS_HOTCRASH_KILL_AT";
const CHILD_MODE_ENV: &str = "FAWN_DS_HOTCRASH_MODE";
const SETUP_KEYS: u64 = 300;
const WRITER_KEYS: u64 = 40;
const COMPACTOR: &str = "hot-compactor";
const MAX_KILL_POINTS: u64 = 200;
const POST_WRITES: u64 = 6;

fn key(k: u64) -> Vec<u8> {
    format!("key-{k:05}").into_bytes()
}

fn wkey(i: u64) -> Vec<u8> {
    format!("w-{:03}", i % WRITER_KEYS).into_bytes()
}

fn value(k: u64, version: u64) -> Vec<u8> {
    let mut v = format!("{k}/{version}/").into_bytes();
    v.resize(100 + (k % 7) as usize * 40, b'a' + (version % 26) as u8);
    v
}

/// The deterministic setup: (key, Some(version) | None = deleted) after it, in write order.
/// With `cold_first`, a first hot compaction runs halfway (so the one under test appends
/// to an existing cold log instead of creating one).
fn setup_ops(cold_first: bool) -> Vec<(u64, Option<u64>, bool)> {
    let mut ops = Vec::new();
    for k in 0..SETUP_KEYS {
        ops.push((k, Some(1), false));
    }
    for k in (0..SETUP_KEYS).step_by(2) {
        ops.push((k, Some(2), false));
    }
    for k in (0..SETUP_KEYS).step_by(9) {
        ops.push((k, None, false));
    }
    // The bool marks "run compact_hot after this op".
    if let Some(last) = ops.last_mut() {
        last.2 = cold_first;
    }
    for k in (0..SETUP_KEYS).step_by(3) {
        ops.push((k, Some(3), false));
    }
    for k in (0..SETUP_KEYS).step_by(11) {
        ops.push((k, None, false));
    }
    ops
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).expect("print");
}

fn opts(faults: FaultInjector) -> Options {
    Options {
        sync: SyncPolicy::Always,
        auto_compact: false,
        checkpoint_every_bytes: 0,
        hot_cold: true,
        faults,
        ..Options::default()
    }
}

/// Child mode: set up, then compact while writing, until killed. A no-op as a plain test.
#[test]
fn crash_child_hot_compactor() {
    let (Ok(dir), Ok(kill_at)) = (std::env::var(CHILD_DIR_ENV), std::env::var(CHILD_KILL_ENV)) else {
        return;
    };
    let kill_at: u64 = kill_at.parse().expect("kill point");
    let cold_first = std::env::var(CHILD_MODE_ENV).as_deref() == Ok("append");
    let armed = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let (a, c) = (armed.clone(), count.clone());
    let faults = FaultInjector::new(move |_op| {
        let compactor = std::thread::current().name() == Some(COMPACTOR);
        if compactor && a.load(Ordering::Acquire) && c.fetch_add(1, Ordering::AcqRel) + 1 == kill_at {
            // SAFETY: kill(2) on our own pid; no memory is touched.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        None
    });
    let ds = Arc::new(DataStore::open(Path::new(&dir), opts(faults)).expect("child open"));
    let mut seq = 0;
    for (k, version, then_compact) in setup_ops(cold_first) {
        seq += 1;
        let meta = Meta { seq, ..Meta::default() };
        match version {
            Some(v) => ds.store(&key(k), &value(k, v), meta).expect("setup store"),
            None => ds.delete(&key(k), meta).expect("setup delete"),
        }
        if then_compact {
            ds.compact_hot().expect("first hot compaction");
        }
    }
    say("SETUP-DONE");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (ds, stop) = (ds.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Acquire) {
                i += 1;
                ds.store(&wkey(i), &value(i, i), Meta { seq: seq + i, ..Meta::default() }).expect("write");
                say(&format!("ACK {i}"));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    let compactor = {
        let ds = ds.clone();
        std::thread::Builder::new()
            .name(COMPACTOR.into())
            .spawn(move || {
                armed.store(true, Ordering::Release);
                ds.compact_hot().expect("hot compaction");
                // More counted I/O (a write and an fsync each): kills here land after the
                // whole commit. Several, because the compaction's own count of I/O varies
                // by a few from run to run (how much tail the writer left to catch up).
                for i in 0..POST_WRITES {
                    let meta = Meta { seq: u64::MAX / 2 + i, ..Meta::default() };
                    ds.store(b"post", b"after", meta).expect("post");
                }
                armed.store(false, Ordering::Release);
            })
            .expect("spawn compactor")
    };
    compactor.join().expect("compactor");
    say("COMPACTED");
    std::thread::sleep(Duration::from_millis(10));
    stop.store(true, Ordering::Release);
    writer.join().expect("writer");
    say("EXIT");
}

fn run_child(dir: &Path, kill_at: u64, mode: &str) -> Vec<String> {
    let exe = std::env::current_exe().expect("current exe");
    let out = Command::new(exe)
        .args(["crash_child_hot_compactor", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_KILL_ENV, kill_at.to_string())
        .env(CHILD_MODE_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child")
        .wait_with_output()
        .expect("child output");
    let mut lines = Vec::new();
    for line in BufReader::new(&out.stdout[..]).split(b'\n') {
        // A line cut by the kill has no newline and is not complete: `split` still yields
        // it, so only lines followed by a newline count (all but a trailing partial one).
        lines.push(String::from_utf8_lossy(&line.expect("read")).trim_end().to_string());
    }
    if !out.stdout.ends_with(b"\n") {
        lines.pop();
    }
    lines
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// The nonce in a log file's header (docs/FORMAT.md §2), if the file has one.
fn nonce(path: &Path) -> Option<u64> {
    std::fs::read(path).ok().filter(|b| b.len() >= 32).map(|b| u64_at(&b, 16))
}

/// Where the kill landed, from the files (docs/FORMAT.md §8: `LOGS`, version 1 or 2, holds
/// the new state's hot nonce at bytes 16..24).
fn phase(dir: &Path) -> &'static str {
    let next_hot = std::fs::read(dir.join("LOGS"))
        .ok()
        .filter(|b| b.len() == 72 || b.len() == 88)
        .map(|b| u64_at(&b, 16));
    let hot = nonce(&dir.join("data.log"));
    let new_hot = nonce(&dir.join("data.log.compact"));
    match next_hot {
        Some(n) if Some(n) == hot && new_hot.is_none() => "committed",
        Some(n) if Some(n) == new_hot => "manifest-written",
        _ => "before-manifest",
    }
}

/// The expected contents: the setup's final state plus the writer's keys.
fn verify(ds: &DataStore, mode: &str, lines: &[String], ctx: &str) {
    let mut want: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
    for (k, version, _) in setup_ops(mode == "append") {
        want.insert(key(k), version.map(|v| value(k, v)));
    }
    let acked: u64 = lines.iter().filter_map(|l| l.split("ACK ").nth(1)?.parse().ok()).max().unwrap_or(0);
    // Per writer key: the last acknowledged write, and the one write that may be in flight.
    let mut in_flight: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    for i in 1..=acked {
        want.insert(wkey(i), Some(value(i, i)));
    }
    in_flight.insert(wkey(acked + 1), value(acked + 1, acked + 1));
    for (k, v) in &want {
        let got = ds.lookup(k).unwrap_or_else(|e| panic!("{ctx}: lookup: {e}")).map(|e| e.value);
        let ok = got == *v || in_flight.get(k).is_some_and(|f| got.as_ref() == Some(f));
        assert!(ok, "{ctx}: key {} holds {:?}", String::from_utf8_lossy(k), got.map(|g| g.len()));
    }
    // A replay of the iteration (cold log, then hot) agrees with the lookups.
    let mut replay: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
    for r in ds.iter() {
        let r = r.unwrap_or_else(|e| panic!("{ctx}: iter: {e}"));
        replay.insert(r.key, (r.kind == RecordKind::Put).then_some(r.value));
    }
    for (k, v) in &replay {
        let got = ds.lookup(k).unwrap_or_else(|e| panic!("{ctx}: lookup: {e}")).map(|e| e.value);
        assert_eq!(got, *v, "{ctx}: replay of {} disagrees with lookup", String::from_utf8_lossy(k));
    }
    assert!(replay.len() >= want.len(), "{ctx}: iteration lost keys");
}

#[test]
fn hot_compaction_killed_at_every_io_step_recovers_the_acknowledged_state() {
    let mut seen: HashMap<(&str, &str), u64> = HashMap::new();
    for mode in ["fresh", "append"] {
        let mut completed = false;
        for kill_at in 1..=MAX_KILL_POINTS {
            let tmp = tempfile::tempdir().expect("tempdir");
            let dir = tmp.path().join("store");
            let lines = run_child(&dir, kill_at, mode);
            let ctx = format!("{mode} mode, killed at compactor I/O #{kill_at}");
            assert!(
                lines.iter().any(|l| l.ends_with("SETUP-DONE")),
                "{ctx}: child failed during setup: {lines:?}"
            );
            let done = lines.iter().any(|l| l.ends_with("EXIT"));
            let at = if done { "completed" } else { phase(&dir) };
            *seen.entry((mode, at)).or_default() += 1;
            let ds = DataStore::open(&dir, opts(FaultInjector::default()))
                .unwrap_or_else(|e| panic!("{ctx} ({at}): reopen: {e}"));
            verify(&ds, mode, &lines, &format!("{ctx} ({at})"));
            let cold = ds.stats().cold_log_bytes;
            drop(ds);
            if done {
                assert!(cold > 0, "{ctx}: a completed hot compaction left no cold log");
                if mode == "fresh" {
                    // The state of a crash between the commit and the new cold log's rename.
                    std::fs::rename(dir.join("data.cold"), dir.join("data.cold.compact")).expect("rename");
                    let ds = DataStore::open(&dir, opts(FaultInjector::default()))
                        .unwrap_or_else(|e| panic!("{ctx}: reopen with the cold log unplaced: {e}"));
                    verify(&ds, mode, &lines, &format!("{ctx} (cold log not yet renamed)"));
                }
                completed = true;
                break;
            }
        }
        assert!(completed, "{mode}: no hot compaction completed within {MAX_KILL_POINTS} kill points");
        for phase in ["before-manifest", "manifest-written", "committed"] {
            assert!(seen.contains_key(&(mode, phase)), "{mode}: no kill landed in phase {phase}: {seen:?}");
        }
    }
    eprintln!("kills by (mode, phase): {seen:?}");
}
