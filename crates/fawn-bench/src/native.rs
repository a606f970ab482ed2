//! `fawn bench native`: the same workloads through the Rust client over FAWN's native protocol
//! (ring-aware: each request goes straight to the front-end that owns the key's wedge).
//!
//! The client multiplexes requests over pooled connections, so concurrency here is a number of
//! tasks (`--connections × --pipeline`), each issuing one request at a time.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{anyhow, ensure, Context, Result};
use fawn_client::{Client, ClientOptions};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::keydist::KeyChooser;
use crate::loadgen::{self, LoadStats};
use crate::output::Reporter;
use crate::workload::{Workload, WorkloadArgs};

/// Tasks used to preload keys.
const PRELOAD_TASKS: u64 = 32;

/// Options of `fawn bench native`.
#[derive(clap::Args, Debug, Clone)]
pub struct NativeArgs {
    /// Native addresses to bootstrap from (front-ends or the manager), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:7500")]
    pub bootstrap: Vec<SocketAddr>,
    /// Name of the system in the results.
    #[arg(long, default_value = "fawn-native")]
    pub system: String,
    /// Pid of the cluster (e.g. of `fawn up`), for ops per CPU-second.
    #[arg(long)]
    pub server_pid: Option<u32>,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// Run every workload point through the native client.
pub fn run(rt: &tokio::runtime::Runtime, args: &NativeArgs, quiet: bool, rep: &mut Reporter) -> Result<()> {
    ensure!(args.bootstrap.iter().all(|a| a.ip().is_loopback()), "--bootstrap addresses must be loopback");
    let bootstrap: Vec<String> = args.bootstrap.iter().map(|a| a.to_string()).collect();
    for w in args.workload.points()? {
        let stats = rt.block_on(measure(&bootstrap, &w, args.server_pid, quiet))?;
        crate::netbench::report(rep, &w, &args.system, &stats)?;
    }
    Ok(())
}

async fn measure(bootstrap: &[String], w: &Workload, pid: Option<u32>, quiet: bool) -> Result<LoadStats> {
    let options = ClientOptions { request_timeout: w.timeout, ..ClientOptions::default() };
    let client = Client::connect(bootstrap, options)
        .await
        .map_err(|e| anyhow!("connecting to the cluster via {bootstrap:?}: {e}"))?;
    if w.preload {
        preload(&client, w).await?;
    }
    if !quiet {
        eprintln!("fawn bench native: {}", w.scenario());
    }
    run_load(client, w, pid.as_slice()).await
}

pub(crate) async fn preload(client: &Arc<Client>, w: &Workload) -> Result<()> {
    let value = Arc::new(w.value());
    let tasks: Vec<_> = (0..PRELOAD_TASKS.min(w.keys))
        .map(|t| {
            let (client, value, w) = (client.clone(), value.clone(), w.clone());
            tokio::spawn(async move {
                let mut key = Vec::new();
                for i in (t..w.keys).step_by(PRELOAD_TASKS as usize) {
                    w.key(i, &mut key);
                    client.put(&key, &value).await.map_err(|e| anyhow!("preloading key {i}: {e}"))?;
                }
                Ok::<(), anyhow::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await.context("preload task panicked")??;
    }
    Ok(())
}

/// Shared by every task of one run.
struct Ctx {
    client: Arc<Client>,
    w: Workload,
    keys: Arc<KeyChooser>,
    value: Vec<u8>,
    start: Instant,
    warmup_end: Instant,
    end: Instant,
}

pub(crate) async fn run_load(client: Arc<Client>, w: &Workload, pids: &[u32]) -> Result<LoadStats> {
    let start = Instant::now();
    let warmup_end = start + w.warmup;
    let ctx = Arc::new(Ctx {
        client,
        start,
        w: w.clone(),
        keys: KeyChooser::new(w.keys, w.distribution, w.zipf_theta)?,
        value: w.value(),
        warmup_end,
        end: warmup_end + w.duration,
    });
    let tasks = w.connections * w.pipeline;
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..tasks).map(|_| mpsc::unbounded_channel()).unzip();
    let pacer =
        if w.rate > 0.0 { Some(loadgen::spawn_pacer(w.rate, start, ctx.end, senders)?) } else { None };
    let open = pacer.is_some();
    let handles: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(t, rx)| tokio::spawn(task(ctx.clone(), t as u64, open.then_some(rx))))
        .collect();
    tokio::time::sleep_until(warmup_end).await;
    let cpu0 = crate::servers::cpu_seconds_all(pids);
    tokio::time::sleep_until(ctx.end).await;
    let cpu1 = crate::servers::cpu_seconds_all(pids);
    let mut total = LoadStats::empty()?;
    for h in handles {
        total.merge(&h.await.context("load task panicked")??)?;
    }
    if let Some(p) = pacer {
        let _ = p.join();
    }
    total.window = ctx.end - warmup_end;
    total.server_cpu_s = cpu0.zip(cpu1).map(|(a, b)| b - a);
    Ok(total)
}

/// One client task: one request at a time, closed loop or on the pacer's schedule.
async fn task(
    ctx: Arc<Ctx>,
    t: u64,
    mut tokens: Option<mpsc::UnboundedReceiver<Instant>>,
) -> Result<LoadStats> {
    let mut rng = SmallRng::seed_from_u64(ctx.w.seed ^ t.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut stats = LoadStats::empty()?;
    let mut key = Vec::new();
    loop {
        let scheduled = match tokens.as_mut() {
            Some(rx) => match rx.recv().await {
                Some(at) => Some(at),
                None => break,
            },
            None => None,
        };
        if Instant::now() >= ctx.end {
            break;
        }
        let intended = scheduled.unwrap_or_else(Instant::now);
        let is_get = rng.gen_bool(ctx.w.get_ratio);
        let k = if is_get { ctx.keys.get_key(&mut rng) } else { ctx.keys.put_key(&mut rng) };
        ctx.w.key(k, &mut key);
        let outcome = if is_get {
            ctx.client.get(&key).await.map(|item| item.is_some())
        } else {
            ctx.client.put(&key, &ctx.value).await.map(|_| true)
        };
        let now = Instant::now();
        stats.tick(now - ctx.start, outcome.is_err());
        if now < ctx.warmup_end || now > ctx.end {
            continue;
        }
        let ns = u64::try_from((now - intended).as_nanos()).unwrap_or(u64::MAX).max(1);
        match outcome {
            Ok(hit) => {
                let hist = if is_get { &mut stats.get } else { &mut stats.set };
                hist.saturating_record(ns);
                match (is_get, hit) {
                    (true, true) => stats.hits += 1,
                    (true, false) => stats.misses += 1,
                    _ => {}
                }
            }
            Err(_) => stats.errors += 1,
        }
    }
    Ok(stats)
}
