//! `fawn bench memcached|redis|peers`: drive network key-value servers and report.

use std::net::SocketAddr;

use anyhow::{ensure, Context, Result};
use hdrhistogram::Histogram;

use crate::loadgen::{self, LoadStats};
use crate::output::Reporter;
use crate::proto::Protocol;
use crate::servers;
use crate::workload::{Workload, WorkloadArgs};

/// Drive one server that is already running.
#[derive(clap::Args, Debug, Clone)]
pub struct TargetArgs {
    /// Address of the server (loopback unless --allow-remote).
    #[arg(long, default_value = "127.0.0.1:11211")]
    pub target: SocketAddr,
    /// Name of the system in the results (default: the protocol's name).
    #[arg(long)]
    pub system: Option<String>,
    /// Pid of the server process, to report its CPU seconds and ops per CPU-second.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Allow a non-loopback target (a benchmark is a load test: aim it on purpose).
    #[arg(long)]
    pub allow_remote: bool,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// Start the peers on loopback and run the same workload against each.
#[derive(clap::Args, Debug, Clone)]
pub struct PeersArgs {
    /// A FAWN front-end's memcached endpoint to run the same workload against.
    #[arg(long)]
    pub fawn: Option<SocketAddr>,
    /// Pid of the FAWN process behind --fawn (for ops per CPU-second).
    #[arg(long)]
    pub fawn_pid: Option<u32>,
    /// memcached binary.
    #[arg(long, default_value = "memcached")]
    pub memcached_bin: String,
    /// redis-server binary.
    #[arg(long, default_value = "redis-server")]
    pub redis_bin: String,
    /// memcached worker threads (1 matches Redis's single thread).
    #[arg(long, default_value_t = 1)]
    pub memcached_threads: u32,
    /// Skip Redis.
    #[arg(long)]
    pub no_redis: bool,
    /// Runs per system, interleaved; the median run is reported (with min/max ops/s).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// Ratios reported against the memcached baseline.
const RATIO_METRICS: [&str; 3] = ["ops_per_s", "get_p99_us", "ops_per_cpu_s"];

/// Run every workload point against a running server.
pub fn run_target(
    rt: &tokio::runtime::Runtime,
    args: &TargetArgs,
    proto: Protocol,
    quiet: bool,
    rep: &mut Reporter,
) -> Result<()> {
    ensure!(
        args.allow_remote || args.target.ip().is_loopback(),
        "refusing to load {} (not loopback) without --allow-remote",
        args.target
    );
    let system = args.system.clone().unwrap_or_else(|| proto_name(proto).to_string());
    for w in args.workload.points()? {
        let stats = rt.block_on(measure(args.target, proto, &w, &system, args.server_pid, quiet))?;
        report(rep, &w, &system, &stats)?;
    }
    Ok(())
}

/// Start memcached and Redis, run every point against each (and against --fawn), report ratios.
pub fn run_peers(
    rt: &tokio::runtime::Runtime,
    args: &PeersArgs,
    quiet: bool,
    rep: &mut Reporter,
) -> Result<()> {
    if let Some(f) = args.fawn {
        ensure!(f.ip().is_loopback(), "--fawn must be a loopback address, got {f}");
    }
    ensure!(args.repeat >= 1, "--repeat must be at least 1");
    let mut systems = vec!["memcached"];
    if !args.no_redis {
        systems.push("redis");
    }
    if args.fawn.is_some() {
        systems.push("fawn");
    }
    for w in args.workload.points()? {
        // Interleave the systems (A B C A B C ...) so a slow phase of a shared machine hits
        // all of them, then report each system's median run.
        let mut runs: Vec<Vec<LoadStats>> = systems.iter().map(|_| Vec::new()).collect();
        for _ in 0..args.repeat {
            for (i, system) in systems.iter().enumerate() {
                runs[i].push(run_peer(rt, args, system, &w, quiet)?);
            }
        }
        for (system, stats) in systems.iter().zip(runs) {
            report_median(rep, &w, system, stats)?;
        }
        report_ratios(rep, &w)?;
    }
    Ok(())
}

/// One measured run against one peer. A server we start is stopped before the next one starts:
/// they must not share the 2 cores.
fn run_peer(
    rt: &tokio::runtime::Runtime,
    args: &PeersArgs,
    system: &str,
    w: &Workload,
    quiet: bool,
) -> Result<LoadStats> {
    let (server, addr, proto, pid) = match system {
        "memcached" => {
            let s = servers::start_memcached(&args.memcached_bin, args.memcached_threads, memcached_mb(w))?;
            let (addr, pid) = (s.addr, s.pid());
            (Some(s), addr, Protocol::Memcached, Some(pid))
        }
        "redis" => {
            let s = servers::start_redis(&args.redis_bin)?;
            let (addr, pid) = (s.addr, s.pid());
            (Some(s), addr, Protocol::Redis, Some(pid))
        }
        _ => {
            let addr = args.fawn.context("no --fawn address")?;
            (None, addr, Protocol::Memcached, args.fawn_pid)
        }
    };
    let stats = rt
        .block_on(measure(addr, proto, w, system, pid, quiet))
        .with_context(|| format!("benchmarking {system} at {addr}"))?;
    drop(server);
    Ok(stats)
}

/// Report the run with the median throughput, plus the spread when there were several.
fn report_median(rep: &mut Reporter, w: &Workload, system: &str, mut runs: Vec<LoadStats>) -> Result<()> {
    let ops = |s: &LoadStats| s.ops() as f64 / s.window.as_secs_f64();
    runs.sort_by(|a, b| ops(a).total_cmp(&ops(b)));
    let (lo, hi) = (runs.first().map(ops), runs.last().map(ops));
    let n = runs.len();
    let median = runs.swap_remove(n / 2);
    report(rep, w, system, &median)?;
    if let (true, Some(lo), Some(hi)) = (n > 1, lo, hi) {
        let (sc, p) = (w.scenario(), w.params());
        rep.metric(&sc, system, "ops_per_s_min", lo, "ops/s", &p)?;
        rep.metric(&sc, system, "ops_per_s_max", hi, "ops/s", &p)?;
        rep.metric(&sc, system, "runs", n as f64, "count", &p)?;
    }
    Ok(())
}

/// Item memory for memcached: room for every key twice over, at least 64 MiB.
pub(crate) fn memcached_mb(w: &Workload) -> u64 {
    let per_item = w.value_size as u64 + 100; // key, header, slab slack
    (2 * w.keys * per_item / (1 << 20)).max(64)
}

/// Preload (if asked), then run the measured workload.
async fn measure(
    addr: SocketAddr,
    proto: Protocol,
    w: &Workload,
    system: &str,
    pid: Option<u32>,
    quiet: bool,
) -> Result<LoadStats> {
    if w.preload {
        loadgen::preload(addr, proto, w)
            .await
            .with_context(|| format!("preloading {} keys into {system} at {addr}", w.keys))?;
    }
    let label = format!("{system} {}", w.scenario());
    loadgen::run(addr, proto, w, &label, pid.as_slice(), quiet).await
}

fn proto_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Memcached => "memcached",
        Protocol::Redis => "redis",
    }
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// Emit every metric of one run.
pub fn report(rep: &mut Reporter, w: &Workload, system: &str, s: &LoadStats) -> Result<()> {
    let (sc, p) = (w.scenario(), w.params());
    let secs = s.window.as_secs_f64();
    rep.metric(&sc, system, "ops_per_s", s.ops() as f64 / secs, "ops/s", &p)?;
    for (name, h) in [("get", &s.get), ("set", &s.set)] {
        if h.is_empty() {
            continue;
        }
        rep.metric(&sc, system, &format!("{name}_ops_per_s"), h.len() as f64 / secs, "ops/s", &p)?;
        for (m, q) in [("p50", 0.5), ("p99", 0.99), ("p999", 0.999)] {
            rep.metric(&sc, system, &format!("{name}_{m}_us"), us(h, q), "us", &p)?;
        }
        rep.metric(&sc, system, &format!("{name}_mean_us"), h.mean() / 1000.0, "us", &p)?;
        rep.metric(&sc, system, &format!("{name}_max_us"), h.max() as f64 / 1000.0, "us", &p)?;
    }
    if !s.get.is_empty() {
        let hit = s.hits as f64 / (s.hits + s.misses).max(1) as f64;
        rep.metric(&sc, system, "get_hit_ratio", hit, "ratio", &p)?;
    }
    rep.metric(&sc, system, "errors", s.errors as f64, "count", &p)?;
    if let Some(cpu) = s.server_cpu_s.filter(|&c| c > 0.0) {
        rep.metric(&sc, system, "server_cpu_s", cpu, "s", &p)?;
        rep.metric(&sc, system, "ops_per_cpu_s", s.ops() as f64 / cpu, "ops/cpu-s", &p)?;
    }
    Ok(())
}

/// `<metric>_vs_memcached` for every other system of this scenario that reported the metric.
fn report_ratios(rep: &mut Reporter, w: &Workload) -> Result<()> {
    let (sc, p) = (w.scenario(), w.params());
    for system in ["redis", "fawn"] {
        for m in RATIO_METRICS {
            let (Some(base), Some(v)) = (rep.find(&sc, "memcached", m), rep.find(&sc, system, m)) else {
                continue;
            };
            if base > 0.0 {
                rep.metric(&sc, system, &format!("{m}_vs_memcached"), v / base, "ratio", &p)?;
            }
        }
    }
    Ok(())
}
