//! `fawn bench memcached|redis|peers`: drive network key-value servers and report.

use std::net::SocketAddr;

use anyhow::{ensure, Context, Result};
use hdrhistogram::Histogram;

use crate::loadgen::{self, LoadStats};
use crate::output::Reporter;
use crate::proto::Protocol;
use crate::servers::{self, Server};
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
    for w in args.workload.points()? {
        {
            let mc = servers::start_memcached(&args.memcached_bin, args.memcached_threads, memcached_mb(&w))?;
            run_server(rt, &mc, Protocol::Memcached, &w, quiet, rep)?;
        } // each server is stopped before the next starts: they must not share the 2 cores
        if !args.no_redis {
            let redis = servers::start_redis(&args.redis_bin)?;
            run_server(rt, &redis, Protocol::Redis, &w, quiet, rep)?;
        }
        if let Some(addr) = args.fawn {
            let stats = rt.block_on(measure(addr, Protocol::Memcached, &w, "fawn", args.fawn_pid, quiet))?;
            report(rep, &w, "fawn", &stats)?;
        }
        report_ratios(rep, &w)?;
    }
    Ok(())
}

/// Item memory for memcached: room for every key twice over, at least 64 MiB.
fn memcached_mb(w: &Workload) -> u64 {
    let per_item = w.value_size as u64 + 100; // key, header, slab slack
    (2 * w.keys * per_item / (1 << 20)).max(64)
}

fn run_server(
    rt: &tokio::runtime::Runtime,
    server: &Server,
    proto: Protocol,
    w: &Workload,
    quiet: bool,
    rep: &mut Reporter,
) -> Result<()> {
    let stats = rt
        .block_on(measure(server.addr, proto, w, server.name, Some(server.pid()), quiet))
        .with_context(|| format!("benchmarking {}", server.name))?;
    report(rep, w, server.name, &stats)
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
    loadgen::run(addr, proto, w, &label, pid, quiet).await
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
