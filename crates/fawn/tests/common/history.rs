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
    /// Store if the key still holds the value (and so the cas unique) read before it.
    Cas,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Put => "put",
            Op::Delete => "delete",
            Op::Cas => "cas",
        }
    }
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Returned. For a get: the value read (`None` = miss). For a delete: `Some("deleted")`
    /// or `Some("not_found")` (or `None` if not observed). For a cas: `Some("stored")`,
    /// `Some("exists")` or `Some("not_found")`. Ignored for a put.
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
    /// For a cas: the value its unique was read with.
    pub expect: Option<String>,
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
    expect: Option<String>,
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
        Invocation { client, op, key: key.to_string(), value, expect: None, call: self.now() }
    }

    /// Stamps the invocation of a cas that writes `value` if the key still holds `expect`.
    pub fn invoke_cas(&self, client: u64, key: &str, value: String, expect: String) -> Invocation {
        Invocation {
            client,
            op: Op::Cas,
            key: key.to_string(),
            value: Some(value),
            expect: Some(expect),
            call: self.now(),
        }
    }

    /// Stamps the return of an operation and records it.
    pub fn complete(&self, inv: Invocation, outcome: Outcome) {
        let ret = self.now();
        let entry = Entry {
            client: inv.client,
            op: inv.op,
            key: inv.key,
            value: inv.value,
            expect: inv.expect,
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
        if e.expect.is_some() {
            out.push_str(",\"expect\":");
            json_str(&mut out, e.expect.as_deref());
        }
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
    // A cas that answered `exists` or `not_found` wrote nothing.
    let wrote_or_may_have = |e: &&Entry| match (e.op, &e.outcome) {
        (Op::Get, _) => false,
        (Op::Cas, Outcome::Ok(out)) => out.as_deref() == Some("stored"),
        _ => true,
    };
    for e in entries.iter().filter(wrote_or_may_have) {
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

use fawn_proto::op::{Mutation, Update};

use super::memc::{CasReply, MemcClient, MemcError};
use super::procs::{ProcShape, Procs};

/// How one recorded client reaches the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// The ring-aware Rust client (native protocol, straight to the key's front-end).
    Native,
    /// The memcached text protocol through front-end `i % frontends` (keys outside its wedge
    /// are forwarded to their owner).
    Memcached(usize),
}

/// The mixed load several clients put on a cluster. The default is the one the stale-read
/// hunt needed: many clients on few hot keys, every kind of update, every client-facing
/// protocol, the cache on.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Concurrent clients (each with its own connection(s) and request ids).
    pub clients: u64,
    /// Client `i` speaks `protocols[i % len]`.
    pub protocols: Vec<Protocol>,
    /// Hot keys at a time: few, so that clients contend on them.
    pub keys: u32,
    /// Every key is replaced by a fresh one this often (short per-key histories keep the
    /// check fast however long the run); `None` keeps `k0..kN` for the whole run.
    pub key_rotation: Option<Duration>,
    /// Percent of gets, of gets followed by a cas with the unique read, and of sets; the
    /// rest are deletes.
    pub get_percent: u32,
    pub cas_percent: u32,
    pub put_percent: u32,
    /// Pause between one client's operations.
    pub think: Duration,
    /// An operation not finished after this is abandoned and recorded as unknown.
    pub op_deadline: Duration,
    /// The client's per-request timeout (the native client retries on its own up to its
    /// retry bound).
    pub request_timeout: Duration,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            clients: 16,
            protocols: vec![Protocol::Native, Protocol::Memcached(0), Protocol::Memcached(1)],
            keys: 8,
            key_rotation: Some(Duration::from_secs(1)),
            get_percent: 40,
            cas_percent: 25,
            put_percent: 25,
            think: Duration::from_millis(2),
            op_deadline: Duration::from_secs(8),
            request_timeout: Duration::from_millis(1500),
        }
    }
}

impl Workload {
    pub fn client_options(&self) -> ClientOptions {
        ClientOptions {
            connect_timeout: Duration::from_secs(1),
            request_timeout: self.request_timeout,
            ..ClientOptions::default()
        }
    }

    pub fn key(i: u32) -> String {
        format!("k{i}")
    }

    /// The name of hot key `i` at `now` nanoseconds into the run.
    pub fn key_at(&self, i: u32, now: u64) -> String {
        match self.key_rotation {
            Some(every) => format!("k{i}.{}", now / every.as_nanos().max(1) as u64),
            None => Workload::key(i),
        }
    }
}

/// One recorded client: a connection of one protocol.
pub enum KvClient {
    Native(Arc<Client>),
    Memcached(MemcClient),
}

/// A failed update: certainly without effect, or perhaps applied.
enum UpdateFail {
    NoEffect,
    Ambiguous,
}

impl KvClient {
    /// Client `slot` of `w` on `procs`.
    pub async fn connect(procs: &Procs, w: &Workload, slot: u64) -> KvClient {
        match w.protocols[slot as usize % w.protocols.len()] {
            Protocol::Native => KvClient::Native(procs.client(w.client_options()).await),
            Protocol::Memcached(i) => {
                let addr = &procs.frontend_addrs[i % procs.frontend_addrs.len()].1;
                KvClient::Memcached(MemcClient::new(addr, w.op_deadline))
            }
        }
    }

    /// The value and its cas unique; `Err` tells nothing.
    async fn get(&mut self, key: &str, with_cas: bool) -> Result<Option<(String, u64)>, ()> {
        match self {
            KvClient::Native(c) => c
                .get(key.as_bytes())
                .await
                .map(|item| item.map(|i| (String::from_utf8_lossy(&i.value).into_owned(), i.cas)))
                .map_err(drop),
            KvClient::Memcached(c) => c.get(key, with_cas).await.map_err(drop),
        }
    }

    async fn update(&mut self, key: &str, mutation: Mutation, value: &str) -> Result<Outcome, UpdateFail> {
        match self {
            KvClient::Native(c) => {
                let update = Update {
                    key: key.as_bytes().to_vec(),
                    mutation,
                    value: value.as_bytes().to_vec(),
                    flags: 0,
                    expiry: 0,
                };
                match c.update(update).await {
                    Ok(outcome) => Ok(native_outcome(mutation, &outcome)),
                    Err(ClientError::NoFrontend) => Err(UpdateFail::NoEffect),
                    Err(_) => Err(UpdateFail::Ambiguous),
                }
            }
            KvClient::Memcached(c) => {
                let reply = match mutation {
                    Mutation::Set => c.set(key, value).await.map(|()| None),
                    Mutation::Delete => {
                        c.delete(key).await.map(|existed| Some(if existed { "deleted" } else { "not_found" }))
                    }
                    Mutation::Cas { unique } => c.cas(key, value, unique).await.map(|r| {
                        Some(match r {
                            CasReply::Stored => "stored",
                            CasReply::Exists => "exists",
                            CasReply::NotFound => "not_found",
                        })
                    }),
                    other => unreachable!("the workload does not send {other:?}"),
                };
                match reply {
                    Ok(out) => Ok(Outcome::Ok(out.map(str::to_string))),
                    Err(MemcError::NotSent(_)) => Err(UpdateFail::NoEffect),
                    Err(MemcError::Ambiguous(_)) => Err(UpdateFail::Ambiguous),
                }
            }
        }
    }
}

fn native_outcome(mutation: Mutation, outcome: &fawn_proto::op::Outcome) -> Outcome {
    use fawn_proto::op::Outcome as O;
    let said = match (mutation, outcome) {
        (Mutation::Set, _) => return Outcome::Ok(None),
        (Mutation::Delete, O::Deleted) => "deleted",
        (Mutation::Delete, _) => "not_found",
        (_, O::Stored { .. }) => "stored",
        (_, O::Exists) => "exists",
        _ => "not_found",
    };
    Outcome::Ok(Some(said.to_string()))
}

/// Runs one recorded operation (a get, a set, a delete, or a `gets` followed by a cas with
/// the unique it read, recorded as two operations).
pub async fn recorded_op(
    rec: &Recorder,
    client: &mut KvClient,
    client_id: u64,
    op: Op,
    key: &str,
    deadline: Duration,
) -> Outcome {
    if op == Op::Get || op == Op::Cas {
        let inv = rec.invoke(client_id, Op::Get, key, None);
        let read = tokio::time::timeout(deadline, client.get(key, op == Op::Cas)).await;
        let (outcome, seen) = match read {
            Ok(Ok(item)) => (Outcome::Ok(item.as_ref().map(|(v, _)| v.clone())), item),
            _ => (Outcome::Failed, None),
        };
        rec.complete(inv, outcome.clone());
        let Some((expect, unique)) = seen.filter(|_| op == Op::Cas) else { return outcome };
        let value = rec.unique_value(client_id);
        let inv = rec.invoke_cas(client_id, key, value.clone(), expect);
        let done = tokio::time::timeout(deadline, client.update(key, Mutation::Cas { unique }, &value)).await;
        let outcome = update_outcome(done);
        rec.complete(inv, outcome.clone());
        return outcome;
    }
    let (mutation, value) = match op {
        Op::Put => (Mutation::Set, Some(rec.unique_value(client_id))),
        _ => (Mutation::Delete, None),
    };
    let inv = rec.invoke(client_id, op, key, value.clone());
    let done =
        tokio::time::timeout(deadline, client.update(key, mutation, value.as_deref().unwrap_or(""))).await;
    let outcome = update_outcome(done);
    rec.complete(inv, outcome.clone());
    outcome
}

fn update_outcome(done: Result<Result<Outcome, UpdateFail>, tokio::time::error::Elapsed>) -> Outcome {
    match done {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(UpdateFail::NoEffect)) => Outcome::Failed,
        Ok(Err(UpdateFail::Ambiguous)) | Err(_) => Outcome::Unknown,
    }
}

/// One client's loop: random operations on random hot keys until `stop`. After an operation
/// of unknown outcome the client continues under a new id (its old id's operation is still
/// "in flight" forever, as far as the checker knows).
pub async fn client_loop(
    rec: Arc<Recorder>,
    mut client: KvClient,
    slot: u64,
    w: Workload,
    seed: u64,
    stop: Arc<AtomicBool>,
) {
    let mut rng = SmallRng::seed_from_u64(seed ^ (slot.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut id = slot;
    while !stop.load(Ordering::Relaxed) {
        let key = w.key_at(rng.gen_range(0..w.keys), rec.now());
        let roll = rng.gen_range(0..100);
        let op = if roll < w.get_percent {
            Op::Get
        } else if roll < w.get_percent + w.cas_percent {
            Op::Cas
        } else if roll < w.get_percent + w.cas_percent + w.put_percent {
            Op::Put
        } else {
            Op::Delete
        };
        if recorded_op(&rec, &mut client, id, op, &key, w.op_deadline).await == Outcome::Unknown {
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
    /// The longest time, from the first fault to the end of the load, in which no operation
    /// was acknowledged (to any client): the client-visible gap the faults caused.
    pub longest_gap: Duration,
    /// Operations that failed (without effect or with unknown effect) in that window.
    pub errors_in_faults: usize,
    pub problems: Vec<String>,
    /// Where the history and logs were saved (on failure, or when `FAWN_KEEP` is set).
    pub evidence: Option<PathBuf>,
    /// Every recorded operation, for a scenario's own measures (e.g. one group of clients).
    pub history: Vec<Entry>,
    /// From the first fault to the end of the load, in recorder nanoseconds.
    pub fault_window: (u64, u64),
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

    /// Kills a random back-end with kill -9, waits past failure detection and chain repair,
    /// restarts it on its data directory (it rejoins and resyncs) and lets it catch up.
    pub fn kill9_and_restart_backend(&mut self) {
        let node = self.pick_backend();
        self.procs.kill9(node);
        self.note(format!("kill -9 backend-{node}"));
        // Past the failure-detection threshold (~2 s) and the chain repair.
        self.pause_ms(4000, 6000);
        self.procs.restart_backend(node);
        self.note(format!("restart backend-{node} on its data directory"));
        self.pause_ms(4000, 5000);
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
        let client = rt.block_on(KvClient::connect(&procs, &w, slot));
        tasks.push(rt.spawn(client_loop(rec.clone(), client, slot, w.clone(), seed, stop.clone())));
    }
    std::thread::sleep(sc.warmup);
    let mut ctx = FaultCtx {
        procs: &mut procs,
        rng: SmallRng::seed_from_u64(seed),
        started: Instant::now() - sc.warmup,
        log: Vec::new(),
    };
    let faults_start = rec.now();
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
    let (longest_gap, errors_in_faults) = gap_and_errors(&rec.entries(), faults_start, load_end);
    let cache_hits = procs.frontend_counter_sum("cache_hits");
    let dead = procs.exited();
    if !dead.is_empty() {
        problems.push(format!("processes exited on their own: {}", dead.join(", ")));
    }

    // Final scan: one client, every key, retried until the cluster serves it or `settle` ends.
    let scan_id = 1_000_000;
    let mut scan_client = KvClient::Native(rt.block_on(procs.client(w.client_options())));
    let settle_end = Instant::now() + sc.settle;
    let mut scanned = BTreeMap::new();
    let keys: BTreeSet<String> = rec.entries().into_iter().map(|e| e.key).collect();
    for key in keys {
        loop {
            let out = rt.block_on(recorded_op(&rec, &mut scan_client, scan_id, Op::Get, &key, w.op_deadline));
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
        "   seed {seed}: {operations} ops ({acknowledged} acknowledged, {failed} failed, {unknown} unknown), {cache_hits} cache hits, {} faults, {}",
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
    eprintln!(
        "   seed {seed}: longest gap without an acknowledged operation {} ms; {errors_in_faults} operations failed from the first fault on",
        longest_gap.as_millis()
    );
    RunReport {
        seed,
        operations,
        acknowledged,
        failed,
        unknown,
        faults: fault_log,
        longest_gap,
        errors_in_faults,
        problems,
        evidence,
        history: entries,
        fault_window: (faults_start, load_end),
    }
}

/// The longest span in `[from, to]` (recorder nanoseconds) with no operation acknowledged,
/// and how many operations called in it did not succeed.
pub fn gap_and_errors(entries: &[Entry], from: u64, to: u64) -> (Duration, usize) {
    let mut acks: Vec<u64> = entries
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Ok(_)) && e.ret >= from && e.ret <= to)
        .map(|e| e.ret)
        .collect();
    acks.sort_unstable();
    let mut last = from;
    let mut longest = 0;
    for t in acks.into_iter().chain([to]) {
        longest = longest.max(t.saturating_sub(last));
        last = t;
    }
    let errors = entries
        .iter()
        .filter(|e| e.call >= from && e.call <= to && !matches!(e.outcome, Outcome::Ok(_)))
        .count();
    (Duration::from_nanos(longest), errors)
}

/// Runs every seed (see [`seeds`]) and panics with the seeds, faults, problems and where the
/// evidence is if any run failed.
pub fn run_scenario(
    sc: &Scenario,
    default_seeds: &[u64],
    mut faults: impl FnMut(&mut FaultCtx),
) -> Vec<RunReport> {
    let mut failures = Vec::new();
    let mut reports = Vec::new();
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
                r.evidence.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
            ));
        }
        reports.push(r);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    reports
}
