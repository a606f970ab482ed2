//! Client histories for linearizability checking.
//!
//! A [`Recorder`] is shared by every client of a test: each operation is stamped at invocation
//! and at return from one monotonic clock (nanoseconds since the recorder was made), and the
//! whole history is written as JSON lines in the format `tools/linearizability` reads (see
//! `tools/linearizability/history/history.go`). [`check`] runs that checker (Porcupine, per
//! key) on a written history.
//!
//! Outcomes: a get that fails tells nothing and is recorded as failed (the checker drops it);
//! a put or delete that fails or times out may still have taken effect, so it is recorded as
//! `unknown`. Put values must be unique per put ([`Recorder::unique_value`]) so that a read
//! names the write it saw.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// The operation kinds the checker's model knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get,
    Put,
    Delete,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Put => "put",
            Op::Delete => "delete",
        }
    }
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Returned. For a get: the value read (`None` = miss). For a delete: `Some("deleted")`
    /// or `Some("not_found")` (or `None` if not observed). Ignored for a put.
    Ok(Option<String>),
    /// Failed without effect (dropped by the checker).
    Failed,
    /// Timed out or failed ambiguously: may or may not have taken effect.
    Unknown,
}

/// One recorded operation.
#[derive(Clone, Debug)]
pub struct Entry {
    pub client: u64,
    pub op: Op,
    pub key: String,
    pub value: Option<String>,
    pub outcome: Outcome,
    /// Nanoseconds on the recorder's clock.
    pub call: u64,
    pub ret: u64,
}

/// An operation in flight, returned by [`Recorder::invoke`].
#[must_use = "complete the operation with Recorder::complete"]
pub struct Invocation {
    client: u64,
    op: Op,
    key: String,
    value: Option<String>,
    call: u64,
}

/// A thread-safe history recorder.
pub struct Recorder {
    start: Instant,
    /// Wall-clock time of `start`, to line history times up with the roles' logs.
    pub started_utc: String,
    entries: Mutex<Vec<Entry>>,
    next_value: AtomicU64,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            start: Instant::now(),
            started_utc: super::procs::utc_now(),
            entries: Mutex::new(Vec::new()),
            next_value: AtomicU64::new(0),
        }
    }

    /// Nanoseconds since the recorder was made (monotonic).
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// A value no other put of this recorder writes.
    pub fn unique_value(&self, client: u64) -> String {
        format!("c{client}-{}", self.next_value.fetch_add(1, Ordering::Relaxed))
    }

    /// Stamps the invocation of an operation.
    pub fn invoke(&self, client: u64, op: Op, key: &str, value: Option<String>) -> Invocation {
        assert_eq!(op == Op::Put, value.is_some(), "a put, and only a put, carries a value");
        Invocation { client, op, key: key.to_string(), value, call: self.now() }
    }

    /// Stamps the return of an operation and records it.
    pub fn complete(&self, inv: Invocation, outcome: Outcome) {
        let ret = self.now();
        let entry = Entry {
            client: inv.client,
            op: inv.op,
            key: inv.key,
            value: inv.value,
            outcome,
            call: inv.call,
            ret,
        };
        self.entries.lock().expect("recorder lock").push(entry);
    }

    /// Every operation recorded so far, in order of return.
    pub fn entries(&self) -> Vec<Entry> {
        self.entries.lock().expect("recorder lock").clone()
    }

    /// Writes the history as JSON lines.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, to_jsonl(&self.entries()))
    }

    /// Counts: (operations, acknowledged, failed, unknown).
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let e = self.entries();
        let ok = e.iter().filter(|e| matches!(e.outcome, Outcome::Ok(_))).count();
        let failed = e.iter().filter(|e| e.outcome == Outcome::Failed).count();
        (e.len(), ok, failed, e.len() - ok - failed)
    }
}

fn json_str(out: &mut String, s: Option<&str>) {
    let Some(s) = s else {
        out.push_str("null");
        return;
    };
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The history as JSON lines.
pub fn to_jsonl(entries: &[Entry]) -> String {
    let mut out = String::new();
    for e in entries {
        let _ = write!(out, "{{\"client\":{},\"op\":\"{}\",\"key\":", e.client, e.op.name());
        json_str(&mut out, Some(&e.key));
        out.push_str(",\"value\":");
        json_str(&mut out, e.value.as_deref());
        out.push_str(",\"output\":");
        let (output, ok) = match &e.outcome {
            Outcome::Ok(o) => (o.as_deref(), "true"),
            Outcome::Failed => (None, "false"),
            Outcome::Unknown => (None, "\"unknown\""),
        };
        json_str(&mut out, output);
        let _ = writeln!(out, ",\"ok\":{ok},\"call\":{},\"return\":{}}}", e.call, e.ret);
    }
    out
}

/// The final values a key may hold once every operation has ended, judged from the updates
/// alone: the value of every acknowledged update that no other acknowledged update follows in
/// real time (it may be the last to take effect), the value of every update of unknown
/// outcome (it may take effect last), and absence if no update was acknowledged. `None` in
/// the set stands for absent. A superset of the exact answer (the linearizability check of
/// the history with the final reads appended is the exact one).
pub fn allowed_final_values(entries: &[Entry]) -> BTreeMap<String, BTreeSet<Option<String>>> {
    let mut by_key: BTreeMap<String, Vec<&Entry>> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.op != Op::Get) {
        by_key.entry(e.key.clone()).or_default().push(e);
    }
    let mut out = BTreeMap::new();
    for (key, updates) in by_key {
        let acked: Vec<&&Entry> = updates.iter().filter(|e| matches!(e.outcome, Outcome::Ok(_))).collect();
        let mut allowed = BTreeSet::new();
        if acked.is_empty() {
            allowed.insert(None);
        }
        for u in &acked {
            let followed = acked.iter().any(|v| v.call > u.ret);
            if !followed {
                allowed.insert(u.value.clone());
            }
        }
        for u in updates.iter().filter(|e| e.outcome == Outcome::Unknown) {
            allowed.insert(u.value.clone());
        }
        out.insert(key, allowed);
    }
    out
}

/// The checker's verdict.
#[derive(Debug)]
pub struct Verdict {
    /// Linearizable.
    pub passed: bool,
    /// Not linearizable (false with `passed` false means undecided or a checker error).
    pub illegal: bool,
    /// The checker's output.
    pub output: String,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// Builds `lincheck` once per test process into the cargo target directory.
pub fn lincheck_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = repo_root();
        // The test executable lives in <target>/<profile>/deps.
        let exe = std::env::current_exe().expect("test executable");
        let target =
            exe.parent().and_then(Path::parent).and_then(Path::parent).expect("target dir").to_path_buf();
        let dir = target.join("lincheck");
        std::fs::create_dir_all(&dir).expect("target/lincheck");
        let bin = dir.join("lincheck");
        // Build under a unique name and rename, so concurrent test processes never see a
        // half-written binary.
        let tmp = dir.join(format!("lincheck.{}.tmp", std::process::id()));
        let out = Command::new("go")
            .args(["build", "-o"])
            .arg(&tmp)
            .arg("./cmd/lincheck")
            .current_dir(root.join("tools/linearizability"))
            .output()
            .expect("running `go build` (is Go installed?)");
        assert!(
            out.status.success(),
            "go build lincheck failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &bin).expect("install lincheck");
        bin
    })
}

/// Checks the history at `path`; writes Porcupine's visualization next to it
/// (`<path>.html`).
pub fn check(path: &Path) -> Verdict {
    let viz = path.with_extension("html");
    let out = Command::new(lincheck_binary())
        .arg("-viz")
        .arg(&viz)
        .arg("-timeout")
        .arg("120s")
        .arg(path)
        .output()
        .expect("running lincheck");
    let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Verdict { passed: out.status.code() == Some(0), illegal: out.status.code() == Some(1), output }
}

// ---------------------------------------------------------------------------------------------
// Recorded workloads and seeded fault scenarios.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use fawn_client::{Client, ClientError, ClientOptions};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::procs::{ProcShape, Procs};

/// The mixed load several clients put on a cluster.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Concurrent clients (each its own `Client`, so its own request ids and connections).
    pub clients: u64,
    /// Keys `k0..kN`: few, so that clients contend on them.
    pub keys: u32,
    /// Percent of gets and of puts; the rest are deletes.
    pub get_percent: u32,
    pub put_percent: u32,
    /// Pause between one client's operations.
    pub think: Duration,
    /// An operation not finished after this is abandoned and recorded as unknown.
    pub op_deadline: Duration,
    /// The client's per-request timeout (it retries on its own up to its retry bound).
    pub request_timeout: Duration,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            clients: 4,
            keys: 8,
            get_percent: 50,
            put_percent: 40,
            think: Duration::from_millis(2),
            op_deadline: Duration::from_secs(8),
            request_timeout: Duration::from_millis(1500),
        }
    }
}

impl Workload {
    pub fn client_options(&self) -> ClientOptions {
        ClientOptions { connect_timeout: Duration::from_secs(1), request_timeout: self.request_timeout }
    }

    pub fn key(i: u32) -> String {
        format!("k{i}")
    }
}

/// Runs one recorded operation through `client`.
pub async fn recorded_op(
    rec: &Recorder,
    client: &Client,
    client_id: u64,
    op: Op,
    key: &str,
    deadline: Duration,
) -> Outcome {
    let value = (op == Op::Put).then(|| rec.unique_value(client_id));
    let inv = rec.invoke(client_id, op, key, value.clone());
    let k = key.as_bytes();
    let outcome = match op {
        Op::Get => match tokio::time::timeout(deadline, client.get(k)).await {
            Ok(Ok(item)) => Outcome::Ok(item.map(|i| String::from_utf8_lossy(&i.value).into_owned())),
            _ => Outcome::Failed,
        },
        Op::Put => {
            let v = value.expect("put value");
            match tokio::time::timeout(deadline, client.put(k, v.as_bytes())).await {
                Ok(Ok(_)) => Outcome::Ok(None),
                Ok(Err(ClientError::NoFrontend)) => Outcome::Failed,
                _ => Outcome::Unknown,
            }
        }
        Op::Delete => match tokio::time::timeout(deadline, client.delete(k)).await {
            Ok(Ok(existed)) => Outcome::Ok(Some(if existed { "deleted" } else { "not_found" }.to_string())),
            Ok(Err(ClientError::NoFrontend)) => Outcome::Failed,
            _ => Outcome::Unknown,
        },
    };
    rec.complete(inv, outcome.clone());
    outcome
}

/// One client's loop: random operations on random keys until `stop`. After an operation of
/// unknown outcome the client continues under a new id (its old id's operation is still
/// "in flight" forever, as far as the checker knows).
pub async fn client_loop(
    rec: Arc<Recorder>,
    client: Arc<Client>,
    slot: u64,
    w: Workload,
    seed: u64,
    stop: Arc<AtomicBool>,
) {
    let mut rng = SmallRng::seed_from_u64(seed ^ (slot.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut id = slot;
    while !stop.load(Ordering::Relaxed) {
        let key = Workload::key(rng.gen_range(0..w.keys));
        let roll = rng.gen_range(0..100);
        let op = if roll < w.get_percent {
            Op::Get
        } else if roll < w.get_percent + w.put_percent {
            Op::Put
        } else {
            Op::Delete
        };
        if recorded_op(&rec, &client, id, op, &key, w.op_deadline).await == Outcome::Unknown {
            id += w.clients;
        }
        tokio::time::sleep(w.think).await;
    }
}

/// A fault scenario: a cluster shape, a workload, and faults injected while the load runs.
pub struct Scenario {
    /// Names the scenario in messages and in saved evidence.
    pub name: &'static str,
    pub shape: ProcShape,
    pub workload: Workload,
    /// Load before the faults begin.
    pub warmup: Duration,
    /// Load after the faults end (the cluster must keep serving).
    pub cooldown: Duration,
    /// How long the cluster may take to serve every key again after the load stops.
    pub settle: Duration,
}

impl Scenario {
    pub fn new(name: &'static str) -> Scenario {
        Scenario {
            name,
            shape: ProcShape::default(),
            workload: Workload::default(),
            warmup: Duration::from_millis(1500),
            cooldown: Duration::from_millis(2500),
            settle: Duration::from_secs(30),
        }
    }
}

/// The seeds to run: `FAWN_SEED` (one seed, or a comma-separated list) or `defaults`.
pub fn seeds(defaults: &[u64]) -> Vec<u64> {
    match std::env::var("FAWN_SEED") {
        Ok(s) if !s.trim().is_empty() => s
            .split(',')
            .map(|x| x.trim().parse().unwrap_or_else(|_| panic!("FAWN_SEED: bad seed {x:?}")))
            .collect(),
        _ => defaults.to_vec(),
    }
}

/// What one seed's run found.
#[derive(Debug)]
pub struct RunReport {
    pub seed: u64,
    pub operations: usize,
    pub acknowledged: usize,
    pub failed: usize,
    pub unknown: usize,
    /// Faults injected, as descriptions.
    pub faults: Vec<String>,
    pub problems: Vec<String>,
    /// Where the history and logs were saved (on failure, or when `FAWN_KEEP` is set).
    pub evidence: Option<PathBuf>,
}

/// Faults are injected from the test thread, which owns the cluster; `log` records what was
/// done (with the time since the load started).
pub struct FaultCtx<'a> {
    pub procs: &'a mut Procs,
    pub rng: SmallRng,
    started: Instant,
    pub log: Vec<String>,
}

impl FaultCtx<'_> {
    /// Records a fault description with its time.
    pub fn note(&mut self, what: impl Into<String>) {
        let what = what.into();
        let line =
            format!("t={:.2}s ({}) {what}", self.started.elapsed().as_secs_f64(), super::procs::utc_now());
        eprintln!("  fault: {line}");
        self.log.push(line);
    }

    /// Sleeps a random time in `[lo_ms, hi_ms)` milliseconds.
    pub fn pause_ms(&mut self, lo_ms: u64, hi_ms: u64) {
        let ms = self.rng.gen_range(lo_ms..hi_ms);
        std::thread::sleep(Duration::from_millis(ms));
    }

    /// A random back-end among the running ones.
    pub fn pick_backend(&mut self) -> u32 {
        let nodes: Vec<u32> =
            self.procs.backend_nodes().into_iter().filter(|n| self.procs.backend_running(*n)).collect();
        nodes[self.rng.gen_range(0..nodes.len())]
    }
}

fn evidence_dir(name: &str, seed: u64) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let target =
        exe.parent().and_then(Path::parent).and_then(Path::parent).expect("target dir").to_path_buf();
    target.join("fault-runs").join(format!("{name}-seed{seed}"))
}

/// Runs one seed of a scenario: start the cluster, run the load, inject `faults`, let the
/// load go on for the cool-down, stop it, wait for the cluster to serve every key, scan every
/// key, check the history (with the scan's reads) for linearizability and the scan against
/// the acknowledged writes.
pub fn run_seed(sc: &Scenario, seed: u64, faults: &mut dyn FnMut(&mut FaultCtx)) -> RunReport {
    eprintln!("== {} seed {seed}", sc.name);
    let mut procs = Procs::start(sc.shape.clone());
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let rec = Arc::new(Recorder::new());
    let stop = Arc::new(AtomicBool::new(false));
    let w = sc.workload.clone();
    let mut tasks = Vec::new();
    for slot in 0..w.clients {
        let client = rt.block_on(procs.client(w.client_options()));
        tasks.push(rt.spawn(client_loop(rec.clone(), client, slot, w.clone(), seed, stop.clone())));
    }
    std::thread::sleep(sc.warmup);
    let mut ctx = FaultCtx {
        procs: &mut procs,
        rng: SmallRng::seed_from_u64(seed),
        started: Instant::now() - sc.warmup,
        log: Vec::new(),
    };
    faults(&mut ctx);
    let fault_log = std::mem::take(&mut ctx.log);
    std::thread::sleep(sc.cooldown);
    let mut problems = Vec::new();
    let load_end = rec.now();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = rt.block_on(t);
    }
    let acked_after_faults = rec
        .entries()
        .iter()
        .filter(|e| {
            matches!(e.outcome, Outcome::Ok(_))
                && e.ret > load_end.saturating_sub(sc.cooldown.as_nanos() as u64)
        })
        .count();
    if acked_after_faults == 0 {
        problems.push(format!("no operation succeeded in the {:?} after the faults ended", sc.cooldown));
    }
    let dead = procs.exited();
    if !dead.is_empty() {
        problems.push(format!("processes exited on their own: {}", dead.join(", ")));
    }

    // Final scan: one client, every key, retried until the cluster serves it or `settle` ends.
    let scan_id = 1_000_000;
    let scan_client = rt.block_on(procs.client(w.client_options()));
    let settle_end = Instant::now() + sc.settle;
    let mut scanned = BTreeMap::new();
    for i in 0..w.keys {
        let key = Workload::key(i);
        loop {
            let out = rt.block_on(recorded_op(&rec, &scan_client, scan_id, Op::Get, &key, w.op_deadline));
            if let Outcome::Ok(v) = out {
                scanned.insert(key.clone(), v);
                break;
            }
            if Instant::now() > settle_end {
                problems
                    .push(format!("final scan: {key} not readable within {:?} after the load", sc.settle));
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let entries = rec.entries();
    let allowed = allowed_final_values(&entries);
    for (key, got) in &scanned {
        let allowed_here = allowed.get(key).cloned().unwrap_or_else(|| BTreeSet::from([None]));
        if !allowed_here.contains(got) {
            problems.push(format!(
                "final scan: {key} = {got:?}, but the acknowledged writes allow only {allowed_here:?} (lost or resurrected write)"
            ));
        }
    }

    let dir = evidence_dir(sc.name, seed);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("evidence dir");
    let hist = dir.join("history.jsonl");
    rec.write(&hist).expect("write history");
    let verdict = check(&hist);
    if !verdict.passed {
        problems.push(format!(
            "history {} linearizable:\n{}",
            if verdict.illegal { "NOT" } else { "could not be checked as" },
            verdict.output
        ));
    }
    let (operations, acknowledged, failed, unknown) = rec.counts();
    eprintln!(
        "   seed {seed}: {operations} ops ({acknowledged} acknowledged, {failed} failed, {unknown} unknown), {} faults, {}",
        fault_log.len(),
        if problems.is_empty() { "OK" } else { "FAILED" }
    );
    let keep = !problems.is_empty() || std::env::var_os("FAWN_KEEP").is_some();
    let evidence = if keep {
        procs.save_logs(&dir);
        let header = format!("history.jsonl time 0 = {} (UTC)\n", rec.started_utc);
        std::fs::write(dir.join("faults.txt"), header + &fault_log.join("\n") + "\n").expect("faults.txt");
        Some(dir)
    } else {
        let _ = std::fs::remove_dir_all(&dir);
        None
    };
    drop(procs);
    rt.shutdown_timeout(Duration::from_secs(2));
    RunReport { seed, operations, acknowledged, failed, unknown, faults: fault_log, problems, evidence }
}

/// Runs every seed (see [`seeds`]) and panics with the seeds, faults, problems and where the
/// evidence is if any run failed.
pub fn run_scenario(sc: &Scenario, default_seeds: &[u64], mut faults: impl FnMut(&mut FaultCtx)) {
    let mut failures = Vec::new();
    for seed in seeds(default_seeds) {
        let r = run_seed(sc, seed, &mut faults);
        if !r.problems.is_empty() {
            failures.push(format!(
                "{} seed {} (rerun: FAWN_SEED={} cargo test -p fawn --test <this test>):\n  faults: {}\n  problems:\n    {}\n  evidence (history, logs): {}",
                sc.name,
                r.seed,
                r.seed,
                r.faults.join("; "),
                r.problems.join("\n    "),
                r.evidence.map(|p| p.display().to_string()).unwrap_or_default()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
