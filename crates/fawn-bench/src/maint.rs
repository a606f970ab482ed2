//! `fawn bench maint`: FAWN-DS maintenance under load.
//!
//! * `fig14`: get rate over time (100 ms buckets) while split, merge and compact run, at the
//!   maximum get rate and at ~30 % of it (the paper's Figure 14).
//! * `lock`: the distribution of the end-of-operation lock hold time on a large store (1 GiB
//!   by default) while gets and puts run.
//! * `wa`: write amplification ((user + cleaning bytes) / user bytes) and space overhead
//!   (largest log / live bytes) for a long update run over a key set, uniform and Zipfian,
//!   with hot/cold separation off and on (same garbage thresholds = same space budget).
//! * `sweep`: aggregate query rate as the put fraction goes from 0 to 1 with automatic
//!   compaction running (the paper's Figure 10).
//!
//! Every store uses `SyncPolicy::Never` (replication is the durability story; the device
//! write path is what `ds` and `files` measure) and lives in a fresh temporary directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use fawn_ds::{DataStore, LockPhases, MaintenanceKind, MaintenanceReport, Meta, Options, SyncPolicy};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::keydist::Zipfian;
use crate::output::Reporter;

/// Options of `fawn bench maint`.
#[derive(clap::Args, Debug, Clone)]
pub struct MaintArgs {
    /// Experiments to run: fig14, lock, wa, sweep.
    #[arg(long, value_delimiter = ',', default_value = "fig14,lock,wa,sweep")]
    pub experiments: Vec<String>,
    /// Live data of the fig14 and sweep stores, MiB.
    #[arg(long, default_value_t = 256)]
    pub store_mib: u64,
    /// Live data of the lock-time store, MiB.
    #[arg(long, default_value_t = 1024)]
    pub lock_store_mib: u64,
    /// Sync policy of the `lock` store after its fill: `never`, or `always` (every put
    /// fdatasynced by group commit; the locked tail is then fdatasynced under the lock).
    #[arg(long, default_value = "never", value_parser = ["never", "always"])]
    pub lock_sync: String,
    /// Maintenance operations timed by `lock` (compactions, plus split+merge pairs).
    #[arg(long, default_value_t = 9)]
    pub lock_runs: usize,
    /// Value size, bytes.
    #[arg(long, default_value_t = 1000)]
    pub value_size: usize,
    /// Get (or mixed) threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Maintenance scan rate limits for fig14, MiB/s (0 = unlimited); one run each.
    #[arg(long, value_delimiter = ',', default_value = "0,64")]
    pub maint_rates_mib: Vec<u64>,
    /// Seconds of idle gets before and between the fig14 operations.
    #[arg(long, default_value_t = 2.0)]
    pub idle_seconds: f64,
    /// Live data of the write-amplification key set, MiB.
    #[arg(long, default_value_t = 64)]
    pub wa_store_mib: u64,
    /// Garbage fractions of the log at which the write-amplification run cleans (one run each).
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5")]
    pub wa_garbage_ratios: Vec<f64>,
    /// User bytes written by the write-amplification run, in multiples of the live data.
    #[arg(long, default_value_t = 8.0)]
    pub wa_fills: f64,
    /// Seconds per put-fraction point of `sweep`.
    #[arg(long, default_value_t = 3.0)]
    pub sweep_seconds: f64,
    /// Hot/cold separation settings `sweep` runs with, one full sweep each (e.g. `true,false`).
    #[arg(long, value_delimiter = ',', default_value = "true")]
    pub sweep_hot_cold: Vec<bool>,
    /// Directory for the stores (a fresh sub-directory is made and removed). Default: temp dir.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

fn key(i: u64) -> Vec<u8> {
    format!("key{i:012}").into_bytes()
}

fn opts(keys: u64) -> Options {
    Options { sync: SyncPolicy::Never, auto_compact: false, expected_keys: keys, ..Options::default() }
}

/// Keys whose live records make up `mib` MiB.
fn keys_for(mib: u64, value_size: usize) -> u64 {
    let record = (32 + 15 + value_size).div_ceil(16) * 16;
    (mib << 20) / record as u64
}

fn fill(ds: &DataStore, keys: u64, value: &[u8], seq: &AtomicU64) -> Result<()> {
    for i in 0..keys {
        let s = seq.fetch_add(1, Ordering::Relaxed) + 1;
        ds.store(&key(i), value, Meta { seq: s, ..Meta::default() })?;
    }
    Ok(())
}

/// Run every selected experiment.
pub fn run(args: &MaintArgs, quiet: bool, rep: &mut Reporter) -> Result<()> {
    ensure!((16..=1 << 20).contains(&args.value_size), "--value-size must be in 16..=1 MiB");
    ensure!(args.threads >= 1 && args.store_mib >= 1 && args.wa_store_mib >= 1, "sizes must be >= 1");
    let parent = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    for e in &args.experiments {
        let work =
            tempfile::Builder::new().prefix("fawn-bench-maint-").tempdir_in(&parent).context("work dir")?;
        if !quiet {
            eprintln!("fawn bench maint: {e}");
        }
        match e.as_str() {
            "fig14" => fig14(args, work.path(), rep)?,
            "lock" => lock(args, work.path(), quiet, rep)?,
            "wa" => wa(args, work.path(), quiet, rep)?,
            "sweep" => sweep(args, work.path(), rep)?,
            other => anyhow::bail!("unknown experiment {other:?} (fig14, lock, wa, sweep)"),
        }
    }
    Ok(())
}

const PHASES: [&str; 4] = ["idle", "split", "merge", "compact"];

/// Get threads at full speed (`per_thread_rate` 0) or paced; counts into `done`.
fn spawn_getters(
    ds: &Arc<DataStore>,
    threads: usize,
    keys: u64,
    per_thread_rate: f64,
    stop: &Arc<AtomicBool>,
    done: &Arc<AtomicU64>,
    seed: u64,
) -> Vec<std::thread::JoinHandle<Result<()>>> {
    (0..threads)
        .map(|t| {
            let (ds, stop, done) = (ds.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed ^ t as u64);
                let start = Instant::now();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let k = key(rng.gen_range(0..keys));
                    ds.lookup(&k)?;
                    n += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                    if per_thread_rate > 0.0 {
                        let due = Duration::from_secs_f64(n as f64 / per_thread_rate);
                        let el = start.elapsed();
                        if due > el {
                            std::thread::sleep(due - el);
                        }
                    }
                }
                Ok(())
            })
        })
        .collect()
}

fn fig14(args: &MaintArgs, dir: &Path, rep: &mut Reporter) -> Result<()> {
    let keys = keys_for(args.store_mib, args.value_size);
    let value = vec![b'v'; args.value_size];
    for &rate_mib in &args.maint_rates_mib {
        let mut idle_rate = 0.0;
        for load in ["high", "30pct"] {
            let a_dir = dir.join(format!("a-{load}-{rate_mib}"));
            let o = Options { maintenance_bytes_per_sec: rate_mib << 20, ..opts(keys) };
            let ds = Arc::new(DataStore::open(&a_dir, o)?);
            let seq = AtomicU64::new(0);
            fill(&ds, keys, &value, &seq)?;
            // 20 % garbage for compaction to reclaim.
            fill(&ds, keys / 5, &value, &seq)?;
            let per_thread = if load == "high" { 0.0 } else { 0.3 * idle_rate / args.threads as f64 };
            let stop = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicU64::new(0));
            let phase = Arc::new(AtomicU8::new(0));
            let getters = spawn_getters(&ds, args.threads, keys, per_thread, &stop, &done, args.seed);
            // Sampler: 100 ms buckets.
            let sampler = {
                let (stop, done, phase) = (stop.clone(), done.clone(), phase.clone());
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    let start = Instant::now();
                    let mut last = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(100));
                        let now = done.load(Ordering::Relaxed);
                        out.push((
                            start.elapsed().as_secs_f64(),
                            (now - last) as f64 * 10.0,
                            phase.load(Ordering::Relaxed),
                        ));
                        last = now;
                    }
                    out
                })
            };
            let idle = Duration::from_secs_f64(args.idle_seconds);
            std::thread::sleep(idle);
            let split_dir = dir.join(format!("b-{load}-{rate_mib}"));
            let quarter = |k: &[u8]| k.last().is_some_and(|&c| c % 4 == 0);
            phase.store(1, Ordering::Relaxed);
            let (b, split_rep) = ds.split(Arc::new(quarter), &split_dir, opts(keys / 4))?;
            phase.store(0, Ordering::Relaxed);
            std::thread::sleep(idle / 2);
            ds.set_key_filter(Some(Arc::new(move |k: &[u8]| !quarter(k))));
            phase.store(2, Ordering::Relaxed);
            let merge_rep = ds.merge(&b)?;
            phase.store(0, Ordering::Relaxed);
            ds.set_key_filter(None);
            drop(b);
            std::thread::sleep(idle / 2);
            fill(&ds, keys / 5, &value, &seq)?;
            phase.store(3, Ordering::Relaxed);
            let compact_rep = ds.compact()?;
            phase.store(0, Ordering::Relaxed);
            std::thread::sleep(idle / 2);
            stop.store(true, Ordering::Relaxed);
            for g in getters {
                g.join().map_err(|_| anyhow::anyhow!("get thread panicked"))??;
            }
            let timeline = sampler.join().map_err(|_| anyhow::anyhow!("sampler panicked"))?;
            let sc = format!("maint/fig14/{load}/rate{rate_mib}");
            let params = json!({"store_mib": args.store_mib, "value_size": args.value_size, "threads": args.threads,
            "keys": keys, "load": load, "paced_per_thread": per_thread, "maint_rate_mib_s": rate_mib});
            for &(t, rate, p) in &timeline {
                let mut pp = params.clone();
                pp["t_s"] = json!((t * 10.0).round() / 10.0);
                pp["phase"] = json!(PHASES[p as usize]);
                rep.metric(&sc, "fawn-ds", "get_rate", rate, "ops/s", &pp)?;
            }
            let mean = |p: u8| {
                // Skip the first idle bucket (threads warming up).
                let v: Vec<f64> = timeline.iter().skip(1).filter(|x| x.2 == p).map(|x| x.1).collect();
                if v.is_empty() {
                    0.0
                } else {
                    v.iter().sum::<f64>() / v.len() as f64
                }
            };
            let idle_mean = mean(0);
            if load == "high" {
                idle_rate = idle_mean;
            }
            rep.metric(&sc, "fawn-ds", "idle_get_rate", idle_mean, "ops/s", &params)?;
            for (p, r) in [(1u8, &split_rep), (2, &merge_rep), (3, &compact_rep)] {
                let name = PHASES[p as usize];
                rep.metric(&sc, "fawn-ds", &format!("{name}_get_rate"), mean(p), "ops/s", &params)?;
                let ratio = if idle_mean > 0.0 { mean(p) / idle_mean } else { 0.0 };
                rep.metric(&sc, "fawn-ds", &format!("{name}_get_rate_vs_idle"), ratio, "ratio", &params)?;
                report_op(rep, &sc, name, r, &params)?;
            }
        }
    }
    Ok(())
}

fn report_op(
    rep: &mut Reporter,
    sc: &str,
    name: &str,
    r: &MaintenanceReport,
    params: &serde_json::Value,
) -> Result<()> {
    rep.metric(sc, "fawn-ds", &format!("{name}_seconds"), r.duration_us as f64 / 1e6, "s", params)?;
    rep.metric(sc, "fawn-ds", &format!("{name}_lock_hold"), r.lock_hold_us as f64 / 1e3, "ms", params)?;
    rep.metric(sc, "fawn-ds", &format!("{name}_bytes_written"), r.bytes_written as f64, "bytes", params)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn lock(args: &MaintArgs, dir: &Path, quiet: bool, rep: &mut Reporter) -> Result<()> {
    let keys = keys_for(args.lock_store_mib, args.value_size);
    let value = vec![b'v'; args.value_size];
    let always = args.lock_sync == "always";
    let seq = Arc::new(AtomicU64::new(0));
    // Filled unsynced (1 GiB of fdatasync'd puts would take long), then reopened with the
    // policy under test.
    let filled = DataStore::open(&dir.join("a"), opts(keys))?;
    fill(&filled, keys, &value, &seq)?;
    filled.close()?;
    let store_opts = |keys: u64| {
        let o = opts(keys);
        if always {
            Options { sync: SyncPolicy::Always, ..o }
        } else {
            o
        }
    };
    let ds = Arc::new(DataStore::open(&dir.join("a"), store_opts(keys))?);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let getters = spawn_getters(&ds, 1, keys, 0.0, &stop, &done, args.seed);
    // One updater at a steady 10,000 puts/s: the tail the lock must catch up.
    let putter = {
        let (ds, stop, seq, value) = (ds.clone(), stop.clone(), seq.clone(), value.clone());
        std::thread::spawn(move || -> Result<()> {
            let mut rng = SmallRng::seed_from_u64(7);
            let start = Instant::now();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let s = seq.fetch_add(1, Ordering::Relaxed) + 1;
                ds.store(&key(rng.gen_range(0..keys)), &value, Meta { seq: s, ..Meta::default() })?;
                n += 1;
                let due = Duration::from_secs_f64(n as f64 / 10_000.0);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            Ok(())
        })
    };
    let mut holds = Vec::new();
    let mut by_kind: Vec<(&str, f64)> = Vec::new();
    // (operation number, kind, what its lock hold spent its time on)
    let mut phases: Vec<(usize, &str, LockPhases)> = Vec::new();
    for i in 0..args.lock_runs {
        let r = if i % 3 == 2 {
            let target = dir.join(format!("split{i}"));
            let half = |k: &[u8]| k.last().is_some_and(|&c| c % 2 == 0);
            let (b, r) = ds.split(Arc::new(half), &target, store_opts(keys / 2))?;
            holds.push(r.lock_hold_us as f64 / 1e3);
            by_kind.push(("split", r.lock_hold_us as f64 / 1e3));
            phases.push((by_kind.len(), "split", r.lock.clone()));
            let m = ds.merge(&b)?;
            drop(b);
            std::fs::remove_dir_all(&target).ok();
            m
        } else {
            ds.compact()?
        };
        let kind = if i % 3 == 2 { "merge" } else { "compact" };
        if !quiet {
            let p = &r.lock;
            eprintln!(
                "  {kind}: {:.1} s, lock held {:.2} ms (catch-up {} B {} us, rename {} us, \
                 cpu {} us, runqueue {} us, blocked {} us)",
                r.duration_us as f64 / 1e6,
                r.lock_hold_us as f64 / 1e3,
                p.catch_up_bytes,
                p.catch_up_us,
                p.rename_us,
                p.on_cpu_us,
                p.runqueue_us,
                p.blocked_us
            );
        }
        holds.push(r.lock_hold_us as f64 / 1e3);
        by_kind.push((kind, r.lock_hold_us as f64 / 1e3));
        phases.push((by_kind.len(), kind, r.lock.clone()));
    }
    stop.store(true, Ordering::Relaxed);
    for g in getters {
        g.join().map_err(|_| anyhow::anyhow!("get thread panicked"))??;
    }
    putter.join().map_err(|_| anyhow::anyhow!("put thread panicked"))??;
    holds.sort_by(f64::total_cmp);
    let sc = format!("maint/lock/{}mib{}", args.lock_store_mib, if always { "/always" } else { "" });
    let params = json!({"store_mib": args.lock_store_mib, "value_size": args.value_size, "keys": keys, "sync": args.lock_sync,
        "ops": holds.len(), "puts_per_s": 10_000, "get_threads": 1, "holds_ms": by_kind});
    for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)] {
        rep.metric(&sc, "fawn-ds", &format!("lock_hold_{name}"), percentile(&holds, q), "ms", &params)?;
    }
    rep.metric(&sc, "fawn-ds", "lock_hold_max", holds.last().copied().unwrap_or(0.0), "ms", &params)?;
    // The breakdown of the slowest holds, slowest first (value = the hold, ms).
    phases.sort_by_key(|p| std::cmp::Reverse(p.2.hold_us));
    for (rank, (op, kind, p)) in phases.iter().take(LOCK_SLOWEST_REPORTED).enumerate() {
        let params = json!({"store_mib": args.lock_store_mib, "rank": rank + 1, "op": op, "kind": kind,
            "phases_us": phases_json(p)});
        rep.metric(&sc, "fawn-ds", "lock_hold_slowest", p.hold_us as f64 / 1e3, "ms", &params)?;
    }
    // Where the time of all holds went, summed (µs): shows which phase dominates overall.
    let sum = |f: fn(&LockPhases) -> u64| phases.iter().map(|(_, _, p)| f(p)).sum::<u64>();
    let totals = json!({
        "hold": sum(|p| p.hold_us), "catch_up": sum(|p| p.catch_up_us),
        "seq_floor": sum(|p| p.seq_floor_us), "tail_sync": sum(|p| p.tail_sync_us),
        "rename": sum(|p| p.rename_us), "swap": sum(|p| p.swap_us),
        "release": sum(|p| p.release_us), "on_cpu": sum(|p| p.on_cpu_us),
        "runqueue": sum(|p| p.runqueue_us), "blocked": sum(|p| p.blocked_us),
    });
    let params = json!({"store_mib": args.lock_store_mib, "ops": phases.len(), "phases_us": totals});
    rep.metric(&sc, "fawn-ds", "lock_hold_total", sum(|p| p.hold_us) as f64 / 1e3, "ms", &params)?;
    Ok(())
}

/// Slowest lock holds whose breakdown `lock` reports.
const LOCK_SLOWEST_REPORTED: usize = 5;

fn phases_json(p: &LockPhases) -> serde_json::Value {
    json!({
        "wait": p.wait_us, "hold": p.hold_us, "catch_up": p.catch_up_us,
        "catch_up_records": p.catch_up_records, "catch_up_bytes": p.catch_up_bytes,
        "seq_floor": p.seq_floor_us, "tail_sync": p.tail_sync_us, "rename": p.rename_us,
        "swap": p.swap_us, "release": p.release_us,
        "unaccounted": p.hold_us.saturating_sub(
            p.catch_up_us + p.seq_floor_us + p.tail_sync_us + p.rename_us + p.swap_us
                + p.release_us),
        "on_cpu": p.on_cpu_us, "runqueue": p.runqueue_us, "blocked": p.blocked_us, "switches": p.switches,
    })
}

fn wa(args: &MaintArgs, dir: &Path, quiet: bool, rep: &mut Reporter) -> Result<()> {
    let keys = keys_for(args.wa_store_mib, args.value_size);
    let value = vec![b'w'; args.value_size];
    for (dist, ratio, hot_cold) in ["uniform", "zipfian"]
        .into_iter()
        .flat_map(|d| args.wa_garbage_ratios.iter().flat_map(move |&r| [(d, r, false), (d, r, true)]))
    {
        {
            // Cleaning is triggered by the update loop itself the moment garbage (both logs)
            // reaches `ratio` of the logs (the space budget: logs <= live / (1 - ratio)), so
            // the budget holds exactly however fast the updates come. What runs is the
            // automatic compactor's choice (`clean`): a full compaction, or with hot/cold
            // separation a hot one when it frees more per byte copied.
            let o = Options { hot_cold, ..opts(keys) };
            let tag = if hot_cold { "hotcold" } else { "single" };
            let ds = DataStore::open(&dir.join(format!("{dist}-{ratio}-{tag}")), o.clone())?;
            let seq = AtomicU64::new(0);
            fill(&ds, keys, &value, &seq)?;
            let live = ds.stats().live_bytes;
            let zipf = Zipfian::new(keys, 0.99)?;
            let mut rng = SmallRng::seed_from_u64(args.seed);
            let updates = (args.wa_fills * keys as f64) as u64;
            let mut max_log = 0u64;
            let (mut hot_ops, mut full_ops) = (0u64, 0u64);
            let start = Instant::now();
            for i in 0..updates {
                let k = if dist == "uniform" {
                    rng.gen_range(0..keys)
                } else {
                    // Scatter the ranks so hot keys are not neighbours in the key space.
                    (zipf.sample(&mut rng).wrapping_mul(0x9E37_79B9_7F4A_7C15)) % keys
                };
                let s = seq.fetch_add(1, Ordering::Relaxed) + 1;
                ds.store(&key(k), &value, Meta { seq: s, ..Meta::default() })?;
                if i % 64 == 0 {
                    let st = ds.stats();
                    max_log = max_log.max(st.log_bytes);
                    if st.garbage_bytes as f64 >= ratio * st.log_bytes as f64 {
                        match ds.clean()?.kind {
                            MaintenanceKind::CompactHot => hot_ops += 1,
                            _ => full_ops += 1,
                        }
                    }
                }
            }
            let secs = start.elapsed().as_secs_f64();
            let st = ds.stats();
            max_log = max_log.max(st.log_bytes);
            let wa = (st.bytes_written_user + st.bytes_written_cleaning) as f64
                / st.bytes_written_user.max(1) as f64;
            let sc = format!("maint/wa/{dist}/r{ratio}/{tag}");
            let params = json!({"live_mib": args.wa_store_mib, "value_size": args.value_size, "keys": keys,
            "updates": updates, "fills": args.wa_fills, "theta": if dist == "zipfian" { 0.99 } else { 0.0 },
            "garbage_ratio": ratio, "budget_log_over_live": 1.0 / (1.0 - ratio), "hot_cold": hot_cold});
            if !quiet {
                eprintln!(
                    "  {dist} r{ratio} {tag}: WA {wa:.2}, max log / live {:.2}, {full_ops} full + {hot_ops} hot \
                     compactions, {secs:.1} s",
                    max_log as f64 / live as f64,
                );
            }
            rep.metric(&sc, "fawn-ds", "write_amplification", wa, "ratio", &params)?;
            rep.metric(
                &sc,
                "fawn-ds",
                "space_overhead_max",
                max_log as f64 / live as f64 - 1.0,
                "ratio",
                &params,
            )?;
            rep.metric(&sc, "fawn-ds", "compactions", st.maintenance_ops as f64, "count", &params)?;
            rep.metric(&sc, "fawn-ds", "full_compactions", full_ops as f64, "count", &params)?;
            rep.metric(&sc, "fawn-ds", "hot_compactions", hot_ops as f64, "count", &params)?;
            rep.metric(&sc, "fawn-ds", "update_rate", updates as f64 / secs, "ops/s", &params)?;
        }
    }
    Ok(())
}

fn sweep(args: &MaintArgs, dir: &Path, rep: &mut Reporter) -> Result<()> {
    for &hot_cold in &args.sweep_hot_cold {
        sweep_one(args, &dir.join(if hot_cold { "hot-cold" } else { "one-log" }), hot_cold, rep)?;
    }
    Ok(())
}

/// One sweep over the put fractions on one store (garbage accumulates across points).
fn sweep_one(args: &MaintArgs, dir: &Path, hot_cold: bool, rep: &mut Reporter) -> Result<()> {
    let keys = keys_for(args.store_mib, args.value_size);
    let value = vec![b's'; args.value_size];
    let o = Options {
        auto_compact: true,
        compact_check_interval: Duration::from_millis(100),
        hot_cold,
        ..opts(keys)
    };
    let ds = Arc::new(DataStore::open(&dir.join("a"), o.clone())?);
    let seq = Arc::new(AtomicU64::new(0));
    fill(&ds, keys, &value, &seq)?;
    for tenth in 0..=10u32 {
        let frac = tenth as f64 / 10.0;
        let st0 = ds.stats();
        let (before, stalls_before) = (st0.maintenance_ops, st0.write_stalls);
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..args.threads)
            .map(|t| {
                let (ds, stop, done, seq, value) =
                    (ds.clone(), stop.clone(), done.clone(), seq.clone(), value.clone());
                let seed = args.seed ^ ((tenth as u64) << 8) ^ t as u64;
                std::thread::spawn(move || -> Result<()> {
                    let mut rng = SmallRng::seed_from_u64(seed);
                    while !stop.load(Ordering::Relaxed) {
                        let k = key(rng.gen_range(0..keys));
                        if rng.gen_bool(frac) {
                            let s = seq.fetch_add(1, Ordering::Relaxed) + 1;
                            ds.store(&k, &value, Meta { seq: s, ..Meta::default() })?;
                        } else {
                            ds.lookup(&k)?;
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        let start = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(args.sweep_seconds));
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().map_err(|_| anyhow::anyhow!("worker panicked"))??;
        }
        let rate = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
        let st = ds.stats();
        let sc = format!("maint/sweep/put{tenth:02}");
        let params = json!({"put_fraction": frac, "store_mib": args.store_mib, "value_size": args.value_size,
            "threads": args.threads, "garbage_ratio": o.compact_garbage_ratio, "garbage_bytes": o.compact_garbage_bytes,
            "hot_cold": hot_cold});
        let cleaning = st.bytes_written_cleaning - st0.bytes_written_cleaning;
        rep.metric(&sc, "fawn-ds", "cleaning_bytes", cleaning as f64, "bytes", &params)?;
        rep.metric(&sc, "fawn-ds", "query_rate", rate, "ops/s", &params)?;
        rep.metric(&sc, "fawn-ds", "compactions", (st.maintenance_ops - before) as f64, "count", &params)?;
        rep.metric(
            &sc,
            "fawn-ds",
            "write_stalls",
            (st.write_stalls - stalls_before) as f64,
            "count",
            &params,
        )?;
        rep.metric(
            &sc,
            "fawn-ds",
            "log_over_live",
            st.log_bytes as f64 / st.live_bytes.max(1) as f64,
            "ratio",
            &params,
        )?;
    }
    Ok(())
}
