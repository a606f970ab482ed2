//! `fawn bench cluster`: the cluster benchmarks (throughput and latency, R = 1 vs R = 3,
//! one back-end vs local, GET/SET vs memcached), each against a cluster this
//! command starts itself (real processes on loopback, see [`crate::launch`]):
//!
//! * `throughput`: get and put throughput and p50/p99/p99.9 at each value size with many
//!   connections, through the memcached protocol and through the native client;
//! * `replicas`: put latency and throughput at R = 1 vs R = 3 (1 and 32 connections);
//! * `local`: one back-end served over the network (front-end without cache + back-end, R = 1) vs the same
//!   datastore engine read locally by 2 threads;
//! * `peers`: GET/SET vs Debian's `memcached -t 1`, with and without pipelining, for cache-hit
//!   gets (keys fit the front-end cache) and full-path gets (`--cache-entries 0`);
//! * `memory` (not in the default): each back-end's resident memory, fresh and loaded
//!   ([`crate::memory`]).
//!
//! Every run reports ops/s, latency percentiles and ops per CPU-second of all cluster processes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use clap::Parser;
use fawn_client::{Client, ClientOptions};
use fawn_ds::{DataStore, Meta, Options, SyncPolicy};
use rand::Rng;
use serde_json::json;

use crate::launch::{self, Cluster, ClusterSpec};
use crate::loadgen::{self, LoadStats};
use crate::output::Reporter;
use crate::par::{self, Until};
use crate::proto::Protocol;
use crate::workload::{Workload, WorkloadArgs};
use crate::{memory, native, netbench, servers};

/// Options of `fawn bench cluster`.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// The `fawn` binary (default: this one, or `fawn` next to it, or on the PATH; or $FAWN_BIN).
    #[arg(long)]
    pub fawn_bin: Option<PathBuf>,
    /// Where the clusters keep their data (a fresh sub-directory, removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Manager port of the clusters (0: pick a free range between 10000 and 30000, below the ephemeral ports).
    #[arg(long, default_value_t = 0)]
    pub base_port: u16,
    /// Which experiments to run: throughput, replicas, local, peers; and, not in the default,
    /// tls (gets and puts with the roles' native connections in plain TCP, then mutual TLS),
    /// memcached-tls (gets and sets with the memcached port in plain TCP, then TLS) and memory
    /// (each back-end's resident memory, fresh and after --memory-keys keys).
    #[arg(long, value_delimiter = ',', default_value = "throughput,replicas,local,peers")]
    pub sections: Vec<String>,
    /// Value sizes of the throughput section.
    #[arg(long = "value-size", value_delimiter = ',', default_value = "256,1024")]
    pub value_sizes: Vec<usize>,
    /// Keys preloaded (fits the front-end's default cache of 100 000 entries).
    #[arg(long, default_value_t = 50_000)]
    pub keys: u64,
    /// Concurrent connections (memcached) or tasks (native) of the throughput runs.
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 8.0)]
    pub duration: f64,
    /// Warm-up seconds per run.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// memcached binary (peers section).
    #[arg(long, default_value = "memcached")]
    pub memcached_bin: String,
    /// redis-server binary (peers section: a primary with two replicas, append-only files
    /// synced every second).
    #[arg(long, default_value = "redis-server")]
    pub redis_bin: String,
    /// Leave the replicated Redis out of the peers section.
    #[arg(long)]
    pub no_redis: bool,
    /// Distinct keys the memory section loads (half of them first).
    #[arg(long, default_value_t = 1_000_000)]
    pub memory_keys: u64,
}

/// Parse workload flags the way the command line would (the defaults stay in one place). A flag
/// given again replaces its earlier value.
pub(crate) fn workload(args: &[String]) -> Result<Workload> {
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        let value = it.next_if(|v| !v.starts_with("--")).cloned();
        match flags.iter_mut().find(|(f, _)| f == a) {
            Some(slot) => slot.1 = value,
            None => flags.push((a.clone(), value)),
        }
    }
    let args: Vec<String> = flags.into_iter().flat_map(|(f, v)| std::iter::once(f).chain(v)).collect();
    #[derive(Parser)]
    struct W {
        #[command(flatten)]
        w: WorkloadArgs,
    }
    let argv = std::iter::once("w".to_string()).chain(args.iter().cloned());
    let parsed = W::try_parse_from(argv).map_err(|e| anyhow!("workload {args:?}: {e}"))?;
    parsed.w.points()?.into_iter().next().context("empty workload")
}

/// Preload (if the workload says so) and run it against a memcached-protocol or Redis server.
pub(crate) async fn drive(
    addr: SocketAddr,
    proto: Protocol,
    w: &Workload,
    pids: &[u32],
    label: &str,
    quiet: bool,
) -> Result<LoadStats> {
    if w.preload {
        loadgen::preload(addr, proto, w).await.with_context(|| format!("preloading {label} at {addr}"))?;
    }
    loadgen::run(addr, proto, w, label, pids, quiet).await.with_context(|| format!("benchmarking {label}"))
}

/// The same through the native client (bootstrapped from a front-end's native address).
pub(crate) async fn drive_native(addr: SocketAddr, w: &Workload, pids: &[u32]) -> Result<LoadStats> {
    let options = ClientOptions { request_timeout: w.timeout, ..ClientOptions::default() };
    let client: Arc<Client> = Client::connect(&[addr.to_string()], options)
        .await
        .map_err(|e| anyhow!("connecting the native client to {addr}: {e}"))?;
    if w.preload {
        native::preload(&client, w).await?;
    }
    native::run_load(client, w, pids).await
}

/// Shared state of one `cluster`/`paper` invocation: binary, scratch directory, port picking.
pub(crate) struct Env {
    pub bin: PathBuf,
    pub work: tempfile::TempDir,
    next: u32,
    base_port: u16,
    pub quiet: bool,
}

impl Env {
    pub fn new(bin: Option<&Path>, dir: Option<&Path>, base_port: u16, quiet: bool) -> Result<Env> {
        let bin = launch::find_fawn_bin(bin)?;
        let parent = dir.map(Path::to_path_buf).unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
        // FAWN_BENCH_KEEP=1 keeps the clusters' directories (their logs) for a post-mortem.
        let keep = std::env::var_os("FAWN_BENCH_KEEP").is_some();
        let work = tempfile::Builder::new()
            .prefix("fawn-bench-cluster-")
            .disable_cleanup(keep)
            .tempdir_in(&parent)
            .with_context(|| format!("creating a work directory in {}", parent.display()))?;
        Ok(Env { bin, work, next: 0, base_port, quiet })
    }

    /// A fresh cluster spec (own directory and port range) with the `fawn up` defaults.
    pub fn spec(&mut self) -> Result<ClusterSpec> {
        self.next += 1;
        let base = if self.base_port != 0 {
            // Consecutive clusters use different ranges: ports of a stopped one may linger.
            self.base_port + ((self.next % 8) as u16) * 400
        } else {
            launch::free_base_port(u64::from(std::process::id()) * 31 + u64::from(self.next))?
        };
        let dir = self.work.path().join(format!("c{}", self.next));
        Ok(ClusterSpec::new(self.bin.clone(), dir, base))
    }

    pub fn start(&mut self, f: impl FnOnce(&mut ClusterSpec)) -> Result<Cluster> {
        let mut spec = self.spec()?;
        f(&mut spec);
        self.say(&format!(
            "starting a cluster: {} back-ends, R={}, cache={:?}, ports {}..",
            spec.backends, spec.replicas, spec.cache_entries, spec.base_port
        ));
        Cluster::start(spec)
    }

    pub fn say(&self, msg: &str) {
        if !self.quiet {
            eprintln!("fawn bench: {msg}");
        }
    }
}

/// Run `fawn bench cluster`.
pub fn run(args: &ClusterArgs, quiet: bool, rep: &mut Reporter) -> Result<()> {
    let known = ["throughput", "replicas", "local", "peers", "tls", "memcached-tls", "memory"];
    for s in &args.sections {
        ensure!(known.contains(&s.as_str()), "unknown section {s:?} (known: {known:?})");
    }
    let mut env = Env::new(args.fawn_bin.as_deref(), args.dir.as_deref(), args.base_port, quiet)?;
    let rt = crate::runtime(1)?;
    let has = |s: &str| args.sections.iter().any(|x| x == s);
    if has("throughput") {
        throughput(&rt, &mut env, args, rep)?;
    }
    if has("replicas") {
        replicas(&rt, &mut env, args, rep)?;
    }
    if has("local") {
        local(&rt, &mut env, args, rep)?;
    }
    if has("peers") {
        peers(&rt, &mut env, args, rep)?;
    }
    if has("tls") {
        tls(&rt, &mut env, args, rep)?;
    }
    if has("memcached-tls") {
        memcached_tls(&rt, &mut env, args, rep)?;
    }
    if has("memory") {
        memory(&rt, &mut env, args, rep)?;
    }
    Ok(())
}

/// Gets (front-end cache off, so each one crosses a front-end to back-end connection) and puts
/// (through chains of 3) with the cluster's native connections in plain TCP, then in mutual
/// TLS: what TLS costs in operations per second and per CPU-second of the cluster.
fn tls(rt: &tokio::runtime::Runtime, env: &mut Env, args: &ClusterArgs, rep: &mut Reporter) -> Result<()> {
    plain_then_tls(rt, env, args, rep, "cluster/tls", |spec, on| spec.tls = on)
}

/// Gets (front-end cache off) and sets through the memcached port in plain TCP, then in TLS
/// (rustls on both ends, the load generator trusting the port's CA): what the client-facing
/// TLS costs in operations per second and per CPU-second of the cluster.
fn memcached_tls(
    rt: &tokio::runtime::Runtime,
    env: &mut Env,
    args: &ClusterArgs,
    rep: &mut Reporter,
) -> Result<()> {
    plain_then_tls(rt, env, args, rep, "cluster/memcached-tls", |spec, on| spec.memcached_tls = on)
}

/// Gets and puts through the memcached port of a cluster (cache off) with `set_tls(false)`,
/// then of one with `set_tls(true)`, as scenarios under `prefix`, and their ratios.
fn plain_then_tls(
    rt: &tokio::runtime::Runtime,
    env: &mut Env,
    args: &ClusterArgs,
    rep: &mut Reporter,
    prefix: &str,
    set_tls: fn(&mut ClusterSpec, bool),
) -> Result<()> {
    let vs = args.value_sizes.first().copied().unwrap_or(256);
    let systems = [("fawn-plaintext", false), ("fawn-tls", true)];
    for (system, tls) in systems {
        let c = env.start(|s| {
            set_tls(s, tls);
            s.cache_entries = Some(0);
        })?;
        let pids = c.pids();
        for (op, g) in [("get", "1"), ("put", "0")] {
            let mut e = load_args(vs, g, args.connections);
            e.extend([s("--scenario"), format!("{prefix}/{op}/v{vs}")]);
            if let Some(ca) = c.spec.memcached_ca() {
                e.extend([s("--tls-ca"), ca.display().to_string()]);
            }
            if op == "put" {
                e.push(s("--no-preload"));
            }
            memcached_run(rt, env, &c, &pids, args, &e, system, rep)?;
        }
    }
    tls_ratios(rep, prefix, vs, systems.map(|(system, _)| system))
}

/// Reports TLS's throughput and throughput per CPU-second relative to plain TCP, for the gets
/// and puts of `prefix`.
fn tls_ratios(rep: &mut Reporter, prefix: &str, vs: usize, [plain, tls]: [&str; 2]) -> Result<()> {
    for op in ["get", "put"] {
        let sc = format!("{prefix}/{op}/v{vs}");
        for m in ["ops_per_s", "ops_per_cpu_s"] {
            if let (Some(a), Some(b)) = (rep.find(&sc, plain, m), rep.find(&sc, tls, m)) {
                if a > 0.0 {
                    rep.metric(&sc, tls, &format!("{m}_tls_vs_plaintext"), b / a, "ratio", &json!({}))?;
                }
            }
        }
    }
    Ok(())
}

/// One memcached-protocol run of the workload `extra` describes against front-end 0 of `c`,
/// reported as `system`.
#[allow(clippy::too_many_arguments)]
fn memcached_run(
    rt: &tokio::runtime::Runtime,
    env: &Env,
    c: &Cluster,
    pids: &[u32],
    args: &ClusterArgs,
    extra: &[String],
    system: &str,
    rep: &mut Reporter,
) -> Result<()> {
    let w = w_of(args, extra)?;
    let st =
        rt.block_on(drive(c.spec.memcached_addr(0), Protocol::Memcached, &w, pids, system, env.quiet))?;
    netbench::report(rep, &w, system, &st)
}

fn timing(args: &ClusterArgs) -> Vec<String> {
    vec!["--duration".into(), args.duration.to_string(), "--warmup".into(), args.warmup.to_string()]
}

fn w_of(args: &ClusterArgs, extra: &[String]) -> Result<Workload> {
    let mut v = timing(args);
    v.extend(["--keys".into(), args.keys.to_string()]);
    v.extend(extra.iter().cloned());
    workload(&v)
}

pub(crate) fn s(x: impl ToString) -> String {
    x.to_string()
}

/// The load generator's flags for one value size, get ratio ("1": gets only, "0": sets only) and
/// connection count, with a 20 s request time-out.
fn load_args(vs: usize, get_ratio: &str, connections: usize) -> Vec<String> {
    vec![
        s("--value-size"),
        s(vs),
        s("--get-ratio"),
        s(get_ratio),
        s("--connections"),
        s(connections),
        s("--timeout"),
        s(20),
    ]
}

/// Get-only and put-only at each value size, memcached protocol and native, `fawn up` defaults.
fn throughput(
    rt: &tokio::runtime::Runtime,
    env: &mut Env,
    args: &ClusterArgs,
    rep: &mut Reporter,
) -> Result<()> {
    let c = env.start(|_| {})?;
    wait_until_cache_fills();
    let pids = c.pids();
    for &vs in &args.value_sizes {
        for (op, g) in [("get", "1"), ("put", "0")] {
            let sc = format!("cluster/{op}/v{vs}/c{}", args.connections);
            let extra = load_args(vs, g, args.connections);
            let mut e = extra.clone();
            e.extend([s("--scenario"), format!("{sc}/memcached-protocol")]);
            if op == "put" {
                e.push(s("--no-preload"));
            }
            memcached_run(rt, env, &c, &pids, args, &e, "fawn", rep)?;
            let mut e = extra;
            e.extend([s("--scenario"), format!("{sc}/native")]);
            // The native client is already loaded with the same keys: no second preload.
            e.push(s("--no-preload"));
            let w = w_of(args, &e)?;
            env.say(&w.scenario());
            let st = rt.block_on(drive_native(c.spec.native_addr(0), &w, &pids))?;
            netbench::report(rep, &w, "fawn-native", &st)?;
        }
    }
    Ok(())
}

/// Put latency and throughput with R = 1 and R = 3 (3 back-ends each).
fn replicas(
    rt: &tokio::runtime::Runtime,
    env: &mut Env,
    args: &ClusterArgs,
    rep: &mut Reporter,
) -> Result<()> {
    for r in [1u32, 3] {
        let c = env.start(|s| s.replicas = r)?;
        let pids = c.pids();
        for conns in [1usize, 32] {
            let w = w_of(
                args,
                &[
                    s("--get-ratio"),
                    s(0),
                    s("--no-preload"),
                    s("--connections"),
                    s(conns),
                    s("--timeout"),
                    s(20),
                    s("--scenario"),
                    format!("cluster/put-replicas/c{conns}/r{r}"),
                ],
            )?;
            let st = rt.block_on(drive(
                c.spec.memcached_addr(0),
                Protocol::Memcached,
                &w,
                &pids,
                "fawn",
                env.quiet,
            ))?;
            netbench::report(rep, &w, "fawn", &st)?;
        }
    }
    for conns in [1usize, 32] {
        let sc = format!("cluster/put-replicas/c{conns}");
        let p = json!({"connections": conns});
        for m in ["set_p50_us", "set_p99_us", "ops_per_s"] {
            let find = |r: u32| rep.find(&format!("cluster/put-replicas/c{conns}/r{r}"), "fawn", m);
            if let (Some(a), Some(b)) = (find(1), find(3)) {
                if a > 0.0 {
                    rep.metric(&sc, "fawn", &format!("{m}_r3_vs_r1"), b / a, "ratio", &p)?;
                }
            }
        }
    }
    Ok(())
}

/// One back-end over the network (R = 1) vs the same engine locally.
fn local(rt: &tokio::runtime::Runtime, env: &mut Env, args: &ClusterArgs, rep: &mut Reporter) -> Result<()> {
    let vs = 256usize;
    // No front-end cache: every get reaches the back-end's datastore.
    let c = env.start(|s| {
        s.backends = 1;
        s.replicas = 1;
        s.cache_entries = Some(0);
    })?;
    let pids = c.pids();
    let mut net = Vec::new();
    for (pipe, preload) in [(1usize, true), (8, false)] {
        let mut e = vec![
            s("--get-ratio"),
            s(1),
            s("--value-size"),
            s(vs),
            s("--connections"),
            s(32),
            s("--pipeline"),
            s(pipe),
            s("--scenario"),
            format!("cluster/one-backend/get/v{vs}/c32/p{pipe}"),
        ];
        if !preload {
            e.push(s("--no-preload"));
        }
        let w = w_of(args, &e)?;
        let st =
            rt.block_on(drive(c.spec.memcached_addr(0), Protocol::Memcached, &w, &pids, "fawn", env.quiet))?;
        netbench::report(rep, &w, "fawn", &st)?;
        net.push((pipe, st.ops() as f64 / st.window.as_secs_f64()));
    }
    drop(c);
    env.say("the same datastore locally");
    let dir = env.work.path().join("local-ds");
    let store = DataStore::open(&dir, Options { sync: SyncPolicy::Never, ..Options::default() })
        .context("opening a local datastore")?;
    let w = w_of(args, &[s("--value-size"), s(vs)])?;
    let (mut key, value) = (Vec::new(), w.value());
    for i in 0..w.keys {
        w.key(i, &mut key);
        store
            .store(&key, &value, Meta { seq: i + 1, ..Meta::default() })
            .context("loading the local store")?;
    }
    let n = w.keys;
    let until = Until::Elapsed(Duration::from_secs_f64(args.duration));
    let r = par::run(2, until, 42, |rng| {
        let mut k = Vec::new();
        w.key(rng.gen_range(0..n), &mut k);
        store.lookup(&k).context("local lookup")?.context("local lookup found nothing")?;
        Ok(())
    })?;
    store.close().context("closing the local store")?;
    let sc = format!("cluster/one-backend/local/v{vs}");
    let p = json!({"keys": n, "value_size": vs, "threads": 2});
    rep.metric(&sc, "fawn-ds", "get_ops_per_s", r.ops_per_s(), "ops/s", &p)?;
    rep.metric(&sc, "fawn-ds", "get_p50_us", r.us(0.5), "us", &p)?;
    rep.metric(&sc, "fawn-ds", "get_p99_us", r.us(0.99), "us", &p)?;
    for (pipe, ops) in net {
        rep.metric(&sc, "fawn", &format!("network_p{pipe}_vs_local"), ops / r.ops_per_s(), "ratio", &p)?;
    }
    Ok(())
}

/// A new front-end takes no cache fill for its start-up hold (an earlier process may have left
/// updates in the chains): cache-hit runs start after it, so they measure a warm cache.
fn wait_until_cache_fills() {
    std::thread::sleep(fawn_kv::frontend::cache::UNSETTLED_UPDATE_HOLD);
}

/// The replicated Redis peer's system name in the results.
const REDIS_REPLICATED: &str = "redis-replicated";

/// GET/SET vs memcached -t 1 and vs Redis with two replicas, pipelined or not, cache-hit and
/// full-path gets, per value size.
fn peers(rt: &tokio::runtime::Runtime, env: &mut Env, args: &ClusterArgs, rep: &mut Reporter) -> Result<()> {
    for &vs in &args.value_sizes {
        peers_at(rt, env, args, rep, vs)?;
    }
    Ok(())
}

fn peers_at(
    rt: &tokio::runtime::Runtime,
    env: &mut Env,
    args: &ClusterArgs,
    rep: &mut Reporter,
    vs: usize,
) -> Result<()> {
    let points: Vec<(&str, &str, usize)> =
        vec![("get", "1", 1), ("get", "1", 16), ("set", "0", 1), ("set", "0", 16)];
    let conns = 32usize;
    let mk = |op: &str, g: &str, pipe: usize, sys: &str, preload: bool| -> Result<Workload> {
        let mut e = vec![
            s("--get-ratio"),
            s(g),
            s("--connections"),
            s(conns),
            s("--pipeline"),
            s(pipe),
            s("--value-size"),
            s(vs),
            s("--timeout"),
            s(30),
            s("--scenario"),
            format!("cluster/vs-memcached/{op}/v{vs}/c{conns}/p{pipe}/{sys}"),
        ];
        if !preload {
            e.push(s("--no-preload"));
        }
        w_of(args, &e)
    };
    // memcached first, its own process, nothing else running.
    for (op, g, pipe) in &points {
        let w = mk(op, g, *pipe, "memcached", true)?;
        let m = servers::start_memcached(&args.memcached_bin, 1, netbench::memcached_mb(&w))?;
        let st = rt.block_on(drive(m.addr, Protocol::Memcached, &w, &[m.pid()], "memcached", env.quiet))?;
        netbench::report(rep, &w, "memcached", &st)?;
    }
    if !args.no_redis {
        for (op, g, pipe) in &points {
            let w = mk(op, g, *pipe, REDIS_REPLICATED, true)?;
            let group = servers::start_redis_replicated(&args.redis_bin, 2)?;
            let pids = group.pids();
            let st = rt.block_on(drive(
                group.primary.addr,
                Protocol::Redis,
                &w,
                &pids,
                REDIS_REPLICATED,
                env.quiet,
            ))?;
            netbench::report(rep, &w, REDIS_REPLICATED, &st)?;
        }
    }
    for (system, cache) in [("fawn-cache-hit", None), ("fawn-cache-miss", Some(0u64))] {
        let c = env.start(|s| s.cache_entries = cache)?;
        if cache.is_none() {
            wait_until_cache_fills();
        }
        let pids = c.pids();
        for (i, (op, g, pipe)) in points.iter().enumerate() {
            let w = mk(op, g, *pipe, "fawn", i == 0)?;
            let st = rt.block_on(drive(
                c.spec.memcached_addr(0),
                Protocol::Memcached,
                &w,
                &pids,
                system,
                env.quiet,
            ))?;
            netbench::report(rep, &w, system, &st)?;
            for (peer, suffix) in [("memcached", "memcached"), (REDIS_REPLICATED, "redis_replicated")] {
                let peer_scenario = format!("cluster/vs-memcached/{op}/v{vs}/c{conns}/p{pipe}/{peer}");
                for m in ["ops_per_s", "ops_per_cpu_s"] {
                    if let (Some(b), Some(v)) =
                        (rep.find(&peer_scenario, peer, m), rep.find(&w.scenario(), system, m))
                    {
                        if b > 0.0 {
                            let name = format!("{m}_vs_{suffix}");
                            rep.metric(&w.scenario(), system, &name, v / b, "ratio", &w.params())?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Each back-end's resident memory, fresh and after loading half of `--memory-keys` keys,
/// then all ([`crate::memory`]).
fn memory(rt: &tokio::runtime::Runtime, env: &mut Env, args: &ClusterArgs, rep: &mut Reporter) -> Result<()> {
    ensure!(args.memory_keys >= 2, "--memory-keys must be at least 2");
    let vs = args.value_sizes.first().copied().unwrap_or(256);
    let c = env.start(|spec| spec.cache_entries = Some(0))?;
    let pids: Vec<u32> = (0..c.spec.backends)
        .map(|n| c.pid(&format!("backend-{n}")).with_context(|| format!("no backend-{n}")))
        .collect::<Result<_>>()?;
    let mean_rss = || -> Result<f64> {
        let total: u64 = pids.iter().map(|p| memory::rss_bytes(*p)).sum::<Result<u64>>()?;
        Ok(total as f64 / pids.len() as f64)
    };
    std::thread::sleep(memory::SETTLE);
    let fresh = mean_rss()?;
    let sc = format!("cluster/memory/v{vs}");
    let per_backend = |keys: u64| keys as f64 * f64::from(c.spec.replicas) / f64::from(c.spec.backends);
    let mut points = Vec::new();
    for keys in [args.memory_keys / 2, args.memory_keys] {
        let w = workload(&[
            s("--keys"),
            s(keys),
            s("--value-size"),
            s(vs),
            s("--connections"),
            s(args.connections),
            s("--timeout"),
            s(20),
        ])?;
        env.say(&format!("memory: loading {keys} keys of {vs} B"));
        let started = std::time::Instant::now();
        rt.block_on(loadgen::preload(c.spec.memcached_addr(0), Protocol::Memcached, &w))?;
        let sets_per_s = keys as f64 / started.elapsed().as_secs_f64();
        std::thread::sleep(memory::SETTLE);
        let rss = mean_rss()?;
        let params = json!({ "keys": keys, "keys_per_backend": per_backend(keys), "sets_per_s": sets_per_s });
        rep.metric(&sc, "fawn", &format!("rss_mb_at_{keys}_keys"), rss / 1e6, "MB", &params)?;
        points.push((per_backend(keys), rss));
    }
    let (per_key, fixed) = memory::fit(points[0], points[1]);
    let params =
        json!({ "backends": c.spec.backends, "replicas": c.spec.replicas, "keys": args.memory_keys });
    rep.metric(&sc, "fawn", "rss_fresh_mb", fresh / 1e6, "MB", &params)?;
    rep.metric(&sc, "fawn", "rss_fixed_under_load_mb", fixed / 1e6, "MB", &params)?;
    rep.metric(&sc, "fawn", "bytes_per_key_per_replica", per_key, "B", &params)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_flag_replaces_an_earlier_one() {
        let w =
            workload(&[s("--duration"), s(1), s("--no-preload"), s("--duration"), s(3), s("--keys"), s(7)])
                .expect("valid workload");
        assert_eq!(w.duration, Duration::from_secs(3));
        assert_eq!(w.keys, 7);
        assert!(!w.preload);
        assert!(workload(&[s("--bogus")]).is_err());
    }
}
