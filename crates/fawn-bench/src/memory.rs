//! `fawn bench cluster --sections memory`: what a back-end holds in DRAM. A cluster with the
//! `fawn up` defaults (R = 3) is loaded through the memcached protocol with half of
//! `--memory-keys` distinct keys, then all of them, as fast as the cluster takes them, so the
//! request-dedup tables are as full as sustained load makes them. Each back-end's resident
//! set (`VmRSS`) is read fresh and after each step. The line through the two loaded points
//! gives the cost per key per replica (its slope) and the fixed cost under load (its value
//! at zero keys).

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::json;

use crate::cluster::{s, workload, ClusterArgs, Env};
use crate::loadgen;
use crate::output::Reporter;
use crate::proto::Protocol;

/// Time for a back-end's memory to settle after a load step (freed buffers, idle tasks).
const SETTLE: Duration = Duration::from_secs(2);

/// Resident set size of process `pid` in bytes (`VmRSS` in /proc).
fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .with_context(|| format!("no VmRSS for process {pid}"))?;
    Ok(kib * 1024)
}

pub(crate) fn memory(
    rt: &tokio::runtime::Runtime,
    env: &mut Env,
    args: &ClusterArgs,
    rep: &mut Reporter,
) -> Result<()> {
    ensure!(args.memory_keys >= 2, "--memory-keys must be at least 2");
    let vs = args.value_sizes.first().copied().unwrap_or(256);
    let c = env.start(|spec| spec.cache_entries = Some(0))?;
    let pids: Vec<u32> = (0..c.spec.backends)
        .map(|n| c.pid(&format!("backend-{n}")).with_context(|| format!("no backend-{n}")))
        .collect::<Result<_>>()?;
    let mean_rss = || -> Result<f64> {
        let total: u64 = pids.iter().map(|p| rss_bytes(*p)).sum::<Result<u64>>()?;
        Ok(total as f64 / pids.len() as f64)
    };
    std::thread::sleep(SETTLE);
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
        std::thread::sleep(SETTLE);
        let rss = mean_rss()?;
        let params = json!({ "keys": keys, "keys_per_backend": per_backend(keys), "sets_per_s": sets_per_s });
        rep.metric(&sc, "fawn", &format!("rss_mb_at_{keys}_keys"), rss / 1e6, "MB", &params)?;
        points.push((per_backend(keys), rss));
    }
    let ((k1, r1), (k2, r2)) = (points[0], points[1]);
    let per_key = (r2 - r1) / (k2 - k1);
    let fixed = r1 - per_key * k1;
    let params =
        json!({ "backends": c.spec.backends, "replicas": c.spec.replicas, "keys": args.memory_keys });
    rep.metric(&sc, "fawn", "rss_fresh_mb", fresh / 1e6, "MB", &params)?;
    rep.metric(&sc, "fawn", "rss_fixed_under_load_mb", fixed / 1e6, "MB", &params)?;
    rep.metric(&sc, "fawn", "bytes_per_key_per_replica", per_key, "B", &params)?;
    Ok(())
}
