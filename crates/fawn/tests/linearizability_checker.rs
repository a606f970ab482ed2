//! Guards the linearizability checker itself: the
//! Porcupine-based `lincheck` (tools/linearizability) must reject a history with a stale read
//! recorded through the Rust recorder, accept the same history without it, and accept a
//! history recorded from a real multi-process cluster (several clients, mixed get/put/delete
//! on a few keys, no faults), final reads included.

mod common;

use std::time::Duration;

use common::history::{check, run_seed, Entry, Op, Outcome, Recorder, Scenario};

fn entry(
    client: u64,
    op: Op,
    key: &str,
    value: Option<&str>,
    outcome: Outcome,
    call: u64,
    ret: u64,
) -> Entry {
    Entry { client, op, key: key.into(), value: value.map(Into::into), expect: None, outcome, call, ret }
}

fn write_and_check(name: &str, entries: &[Entry]) -> common::history::Verdict {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(format!("{name}.jsonl"));
    std::fs::write(&path, common::history::to_jsonl(entries)).expect("write");
    let v = check(&path);
    if v.illegal {
        assert!(path.with_extension("html").exists(), "no visualization written for {name}");
    }
    v
}

#[test]
fn checker_catches_a_stale_read() {
    let ok = |v: Option<&str>| Outcome::Ok(v.map(Into::into));
    let mut history = vec![
        entry(0, Op::Put, "k", Some("v1"), ok(None), 0, 10),
        entry(0, Op::Put, "k", Some("v2"), ok(None), 20, 30),
        entry(1, Op::Get, "k", None, ok(Some("v2")), 40, 50),
        entry(2, Op::Put, "other", Some("o1"), Outcome::Unknown, 0, 5),
        entry(2, Op::Delete, "gone", None, ok(Some("not_found")), 0, 5),
    ];
    let good = write_and_check("fresh", &history);
    assert!(good.passed, "a linearizable history was rejected:\n{}", good.output);

    // Deliberately stale: after v2 was acknowledged, a read returns v1.
    history.push(entry(3, Op::Get, "k", None, ok(Some("v1")), 60, 70));
    let bad = write_and_check("stale", &history);
    assert!(bad.illegal, "the checker accepted a stale read:\n{}", bad.output);
    assert!(bad.output.contains("NOT LINEARIZABLE: key \"k\""), "{}", bad.output);

    // A read of a value that was never written.
    let phantom = vec![entry(0, Op::Get, "k", None, ok(Some("nobody-wrote-this")), 0, 10)];
    assert!(write_and_check("phantom", &phantom).illegal);
}

#[test]
fn recorder_stamps_from_one_monotonic_clock() {
    let rec = Recorder::new();
    let a = rec.invoke(0, Op::Put, "k", Some(rec.unique_value(0)));
    let b = rec.invoke(1, Op::Get, "k", None);
    rec.complete(b, Outcome::Ok(None));
    rec.complete(a, Outcome::Unknown);
    let e = rec.entries();
    assert_eq!(e.len(), 2);
    assert!(e[0].call <= e[0].ret && e[1].call <= e[1].ret);
    assert!(e[1].call <= e[0].call, "invocation order kept");
    assert_ne!(rec.unique_value(0), rec.unique_value(0));
    let text = common::history::to_jsonl(&e);
    assert!(text.contains(r#""ok":"unknown""#) && text.contains(r#""op":"get""#), "{text}");
}

#[test]
fn real_cluster_history_is_linearizable() {
    let mut sc = Scenario::new("linearizability_checker");
    sc.warmup = Duration::from_secs(4);
    sc.cooldown = Duration::from_secs(1);
    let r = run_seed(&sc, 1, &mut |_| {});
    assert!(r.problems.is_empty(), "no-fault run failed: {:#?}", r);
    assert!(r.acknowledged > 200, "too little load to mean anything: {r:?}");
    assert_eq!(r.unknown, 0, "operations timed out on a healthy cluster: {r:?}");
}

/// The checker's own Go tests (stale reads, unknown-outcome puts either way, deletes, bad
/// input, exit codes), so that the README's test command runs them too.
#[test]
fn checker_go_tests_pass() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/linearizability");
    let out = std::process::Command::new("go")
        .args(["test", "./..."])
        .current_dir(&dir)
        .output()
        .expect("running `go test` (is Go installed?)");
    assert!(
        out.status.success(),
        "go test failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
