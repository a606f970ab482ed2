//! `fawn bench paper`: the paper's evaluation (SOSP'09 §4) end to end on this machine, with the
//! peers beside FAWN in the same run. Writes `results.jsonl`, `results.csv` and one SVG per
//! figure into `--out-dir`:
//!
//! | file | what |
//! |---|---|
//! | `table1_device.svg` | Table 1: sequential MB/s, random 4 KiB IOPS of the device |
//! | `table2_reads_vs_size.svg` | Table 2: FAWN-DS random lookups/s vs datastore size (256 B, 1 KiB; optionally in a memory cgroup) |
//! | `bulk_store.svg` | bulk store MB/s vs raw sequential write |
//! | `fig09_semi_random.svg` | Figure 9: writes into 1..N datastores vs N raw files |
//! | `fig10_put_fraction.svg` | Figure 10: cluster ops/s vs put fraction, FAWN and memcached |
//! | `fig11_get_rate.svg` | Figure 11: cluster get rate over time, 256 B and 1 KiB (front-end cache off, as in the paper) |
//! | `fig13_join.svg` | Figure 13: get rate while a 4th back-end joins, at max and ~30 % load |
//! | `fig15_latency_cdf.svg` | Figure 15: get latency CDFs, normal and during a join, low and high load |
//! | `failure.svg` | failure: get rate while a back-end is frozen (SIGSTOP) and its ranges repair |
//! | `resize_puts.svg` | membership changes: put rate while a 5th back-end joins (ranges split) and leaves (ranges merge); the slowest put per phase is in `results.jsonl` |
//! | `table3_qpcs.svg` | Table 3 analogue: queries per CPU-second, FAWN vs memcached vs Redis (and embedded FAWN-DS, RocksDB with the `rocksdb` feature) |
//! | `distance.svg` | throughput vs concurrency with +0/1/5 ms between front-end and back-ends |
//!
//! `--quick` shrinks every size so the whole run takes a few minutes on 2 cores.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::cluster::{self, drive, s, workload, Env};
use crate::launch::{self, Cluster};
use crate::loadgen::{LoadStats, TIMELINE_BUCKET};
use crate::output::Reporter;
use crate::plot::{self, Scale, Series};
use crate::proto::Protocol;
use crate::{device, ds, files, netbench, servers};

/// Options of `fawn bench paper`.
#[derive(clap::Args, Debug, Clone)]
pub struct PaperArgs {
    /// Small sizes and short runs: the whole evaluation in a few minutes.
    #[arg(long)]
    pub quick: bool,
    /// Where results.jsonl, results.csv and the SVG plots go (existing results files there are
    /// replaced).
    #[arg(long, default_value = "fawn-bench-results")]
    pub out_dir: PathBuf,
    /// Scratch directory for datastores and clusters (on the device to measure). Default: the
    /// system temp directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Also run Table 2 inside a memory cgroup with this limit (e.g. 256M) to show the cliff
    /// when the datastore outgrows the page cache (needs a writable /sys/fs/cgroup: root).
    #[arg(long)]
    pub memcap: Option<String>,
    /// Skip these parts: device, table2, files, fig10, fig11, join, failure, resize, table3,
    /// distance, cluster.
    #[arg(long, value_delimiter = ',')]
    pub skip: Vec<String>,
    /// The `fawn` binary (default: this one, `fawn` next to it, $FAWN_BIN, or on the PATH).
    #[arg(long)]
    pub fawn_bin: Option<PathBuf>,
    /// Manager port of the clusters (0: pick free ranges between 10000 and 30000, below the ephemeral ports).
    #[arg(long, default_value_t = 0)]
    pub base_port: u16,
    /// memcached binary.
    #[arg(long, default_value = "memcached")]
    pub memcached_bin: String,
    /// redis-server binary.
    #[arg(long, default_value = "redis-server")]
    pub redis_bin: String,
    /// Tiny sizes for the test suite (implies --quick).
    #[arg(long, hide = true)]
    pub smoke: bool,
    /// Only redraw the Table 2 and bulk-store plots from an earlier run's results.jsonl.
    #[arg(long)]
    pub replot_table2: Option<PathBuf>,
}

/// Every size the run depends on.
struct Sizes {
    device_mb: u64,
    device_count: u64,
    /// Table 2 key counts (datastore size = keys × record size).
    table2_keys: Vec<u64>,
    ds_duration: f64,
    files: Vec<usize>,
    files_mb: u64,
    keys: u64,
    duration: f64,
    warmup: f64,
    timeline_s: f64,
    join_s: f64,
    cluster_duration: f64,
    distance_conns: Vec<usize>,
    distance_gets: Vec<f64>,
}

impl Sizes {
    fn new(quick: bool, smoke: bool) -> Sizes {
        if smoke {
            Sizes {
                device_mb: 8,
                device_count: 200,
                table2_keys: vec![100, 2_000],
                ds_duration: 0.2,
                files: vec![1, 4],
                files_mb: 2,
                keys: 2_000,
                duration: 1.0,
                warmup: 0.3,
                timeline_s: 2.0,
                join_s: 4.0,
                cluster_duration: 0.0,
                distance_conns: vec![1, 8],
                distance_gets: vec![1.0],
            }
        } else if quick {
            Sizes {
                device_mb: 128,
                device_count: 5_000,
                table2_keys: vec![40, 4_000, 40_000, 400_000],
                ds_duration: 1.0,
                files: vec![1, 4, 16, 64],
                files_mb: 32,
                keys: 20_000,
                duration: 3.0,
                warmup: 1.0,
                timeline_s: 8.0,
                join_s: 12.0,
                cluster_duration: 2.0,
                distance_conns: vec![1, 16, 128],
                distance_gets: vec![1.0, 0.0],
            }
        } else {
            Sizes {
                device_mb: 1024,
                device_count: 20_000,
                table2_keys: vec![40, 4_000, 40_000, 400_000, 4_000_000],
                ds_duration: 3.0,
                files: vec![1, 4, 16, 64, 256],
                files_mb: 256,
                keys: 100_000,
                duration: 8.0,
                warmup: 2.0,
                timeline_s: 30.0,
                join_s: 40.0,
                cluster_duration: 8.0,
                distance_conns: vec![1, 4, 16, 64, 256],
                distance_gets: vec![1.0, 0.0],
            }
        }
    }
}

/// Run the evaluation.
pub fn run(args: &PaperArgs, quiet: bool) -> Result<()> {
    if let Some(from) = &args.replot_table2 {
        return replot_table2(from, &args.out_dir);
    }
    let quick = args.quick || args.smoke;
    let z = Sizes::new(quick, args.smoke);
    std::fs::create_dir_all(&args.out_dir).with_context(|| format!("creating {}", args.out_dir.display()))?;
    let (jsonl, csv) = (args.out_dir.join("results.jsonl"), args.out_dir.join("results.csv"));
    for f in [&jsonl, &csv] {
        if f.exists() {
            std::fs::remove_file(f).with_context(|| format!("replacing {}", f.display()))?;
        }
    }
    let mut rep = Reporter::new(Some(jsonl), Some(csv))?;
    let mut env = Env::new(args.fawn_bin.as_deref(), args.dir.as_deref(), args.base_port, quiet)?;
    let scratch = env.work.path().to_path_buf();
    let started = Instant::now();
    let mut failed = Vec::new();
    let parts: [(&str, Part); 11] = [
        ("device", table1),
        ("table2", table2),
        ("files", fig9),
        ("fig10", fig10),
        ("fig11", fig11),
        ("join", join),
        ("failure", failure),
        ("resize", resize),
        ("table3", table3),
        ("distance", distance_part),
        ("cluster", cluster_part),
    ];
    let mut ctx = Ctx { args, z: &z, env: &mut env, rep: &mut rep, scratch, out: &args.out_dir, quiet };
    for (name, part) in parts {
        if args.skip.iter().any(|x| x == name) {
            continue;
        }
        ctx.env.say(&format!("paper: {name} ({:.0} s so far)", started.elapsed().as_secs_f64()));
        let t = Instant::now();
        if let Err(e) = part(&mut ctx) {
            eprintln!("fawn bench paper: {name} failed: {e:#}");
            failed.push(format!("{name}: {e:#}"));
        }
        ctx.rep.metric(
            "paper",
            "bench",
            &format!("{name}_elapsed_s"),
            t.elapsed().as_secs_f64(),
            "s",
            &json!({}),
        )?;
    }
    ctx.rep.metric(
        "paper",
        "bench",
        "total_elapsed_s",
        started.elapsed().as_secs_f64(),
        "s",
        &json!({"quick": quick}),
    )?;
    if !failed.is_empty() {
        bail!("{} part(s) failed:\n{}", failed.len(), failed.join("\n"));
    }
    ctx.env.say(&format!(
        "paper: done in {:.0} s; results in {}",
        started.elapsed().as_secs_f64(),
        args.out_dir.display()
    ));
    Ok(())
}

type Part = fn(&mut Ctx) -> Result<()>;

struct Ctx<'a> {
    args: &'a PaperArgs,
    z: &'a Sizes,
    env: &'a mut Env,
    rep: &'a mut Reporter,
    scratch: PathBuf,
    out: &'a Path,
    quiet: bool,
}

impl Ctx<'_> {
    fn write(&self, name: &str, svg: String) -> Result<()> {
        let p = self.out.join(name);
        std::fs::write(&p, svg).with_context(|| format!("writing {}", p.display()))
    }

    fn find(&self, sc: &str, sys: &str, m: &str) -> f64 {
        self.rep.find(sc, sys, m).unwrap_or(f64::NAN)
    }

    /// Timing flags for a cluster workload.
    fn timing(&self) -> Vec<String> {
        vec![
            s("--duration"),
            s(self.z.duration),
            s("--warmup"),
            s(self.z.warmup),
            s("--keys"),
            s(self.z.keys),
        ]
    }
}

fn table1(c: &mut Ctx) -> Result<()> {
    let a = device::DeviceArgs {
        dir: Some(c.scratch.clone()),
        file_mb: c.z.device_mb,
        chunk_kb: 1024,
        threads: vec![1, 4],
        count: c.z.device_count,
        seed: 42,
    };
    device::run(&a, c.quiet, c.rep)?;
    let f = |m: &str| {
        c.rep.lines().iter().rev().find(|l| l.scenario == "device" && l.metric == m).map(|l| l.value)
    };
    let cats = vec![s("seq write MB/s"), s("seq read MB/s"), s("rand read kIOPS"), s("rand write kIOPS")];
    let mut series = Vec::new();
    for t in [1, 4] {
        let v = vec![
            if t == 1 { f("seq_write_mb_per_s").unwrap_or(f64::NAN) } else { f64::NAN },
            if t == 1 { f("seq_read_mb_per_s").unwrap_or(f64::NAN) } else { f64::NAN },
            f(&format!("rand_read_4k_iops_t{t}")).unwrap_or(f64::NAN) / 1e3,
            f(&format!("rand_write_4k_iops_t{t}")).unwrap_or(f64::NAN) / 1e3,
        ];
        series.push((format!("{t} thread(s)"), v));
    }
    c.write(
        "table1_device.svg",
        plot::bar_chart("Table 1: the device (O_DIRECT)", "MB/s or kIOPS", &cats, &series, Scale::Linear),
    )
}

/// Run `f` with this process in a memory cgroup limited to `limit` bytes (v2 if the unified
/// hierarchy has the memory controller, else v1), then move back and remove the cgroup.
fn in_memory_cgroup<T>(limit: u64, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let pid = std::process::id();
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").is_ok_and(|c| c.contains("memory"));
    let self_cg = std::fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    let (root, limit_file, orig) = if v2 {
        let orig = self_cg.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/").to_string();
        (PathBuf::from("/sys/fs/cgroup"), "memory.max", orig)
    } else {
        let orig = self_cg
            .lines()
            .find_map(|l| {
                let mut it = l.splitn(3, ':');
                let (_, ctl, path) = (it.next()?, it.next()?, it.next()?);
                ctl.split(',').any(|c| c == "memory").then(|| path.to_string())
            })
            .context("no memory controller in /proc/self/cgroup (cgroup v1 or v2 needed for --memcap)")?;
        (PathBuf::from("/sys/fs/cgroup/memory"), "memory.limit_in_bytes", orig)
    };
    let cg = root.join(format!("fawn-bench-{pid}"));
    std::fs::create_dir_all(&cg)
        .with_context(|| format!("creating cgroup {} (root needed)", cg.display()))?;
    std::fs::write(cg.join(limit_file), limit.to_string())
        .with_context(|| format!("setting {limit_file}"))?;
    std::fs::write(cg.join("cgroup.procs"), pid.to_string()).context("moving into the cgroup")?;
    let out = f();
    let back = root.join(orig.trim_start_matches('/')).join("cgroup.procs");
    let moved =
        std::fs::write(&back, pid.to_string()).with_context(|| format!("moving back to {}", back.display()));
    if let Err(e) = std::fs::remove_dir(&cg) {
        eprintln!("fawn bench paper: could not remove cgroup {}: {e}", cg.display());
    }
    moved?;
    out
}

fn parse_bytes(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    Ok(num.parse::<u64>().with_context(|| format!("bad size {s:?} (e.g. 256M)"))? * mul)
}

fn ds_args(c: &Ctx, keys: u64, vs: usize) -> ds::DsArgs {
    ds::DsArgs {
        dir: Some(c.scratch.clone()),
        keys,
        full: false,
        value_sizes: vec![vs],
        threads: 2,
        duration: c.z.ds_duration,
        sync: fawn_ds::SyncPolicy::Never,
        batch_bytes: 1 << 20,
        page_aligned: false,
        device_reads: 0,
        presize: false,
        rocksdb: false,
        keep: false,
        seed: 42,
    }
}

fn table2(c: &mut Ctx) -> Result<()> {
    let mut series = Vec::new();
    let mut bulk: Vec<(String, Vec<f64>)> =
        vec![(s("FAWN-DS bulk store"), vec![]), (s("raw sequential write"), vec![])];
    let mut cats = Vec::new();
    for vs in [256usize, 1024] {
        let mut pts = Vec::new();
        for &k in &c.z.table2_keys {
            ds::run(&ds_args(c, k, vs), c.quiet, c.rep)?;
            let sc = format!("ds/v{vs}/n{k}");
            pts.push((c.find(&sc, "fawn-ds", "log_bytes") / 1e6, c.find(&sc, "fawn-ds", "lookup_ops_per_s")));
        }
        let big = format!("ds/v{vs}/n{}", c.z.table2_keys.last().copied().unwrap_or(0));
        cats.push(format!("{vs} B"));
        bulk[0].1.push(c.find(&big, "fawn-ds", "bulk_insert_mb_per_s"));
        bulk[1].1.push(c.find(&big, "raw", "seq_write_mb_per_s"));
        series.push(Series::new(format!("{vs} B"), pts));
    }
    if let Some(cap) = &c.args.memcap {
        let limit = parse_bytes(cap)?;
        for vs in [256usize, 1024] {
            let mut pts = Vec::new();
            // Up to twice the cap in datastore bytes: far enough past it to show the cliff.
            // (Inserting inside the cgroup is slow: dirty pages are throttled to the cap.)
            let rec = vs as u64 + 40;
            let mut keys: Vec<u64> = c.z.table2_keys.iter().copied().filter(|&k| k * rec <= limit).collect();
            keys.push(limit / rec * 3 / 2);
            keys.push(2 * limit / rec);
            keys.sort_unstable();
            keys.dedup();
            for k in keys {
                let tmp = c.scratch.join("memcap.jsonl");
                let _ = std::fs::remove_file(&tmp);
                let mut sub = Reporter::new(Some(tmp.clone()), None)?;
                let a = ds_args(c, k, vs);
                let quiet = c.quiet;
                in_memory_cgroup(limit, || ds::run(&a, quiet, &mut sub))?;
                for l in sub.lines() {
                    let mut l = l.clone();
                    l.scenario = format!("memcap-{cap}/{}", l.scenario);
                    c.rep.emit(l)?;
                }
                let sc = format!("memcap-{cap}/ds/v{vs}/n{k}");
                pts.push((
                    c.find(&sc, "fawn-ds", "log_bytes") / 1e6,
                    c.find(&sc, "fawn-ds", "lookup_ops_per_s"),
                ));
            }
            series.push(Series::new(format!("{vs} B, {cap} cgroup"), pts));
        }
    }
    c.write(
        "table2_reads_vs_size.svg",
        plot::line_chart(
            "Table 2: FAWN-DS random lookups vs datastore size",
            "datastore size (MB, log)",
            "lookups/s (2 threads, log)",
            &series,
            Scale::Log10,
            Scale::Log10,
        ),
    )?;
    c.write(
        "bulk_store.svg",
        plot::bar_chart("Bulk store vs raw sequential write", "MB/s", &cats, &bulk, Scale::Linear),
    )
}

/// Table 2 and bulk-store plots from the `ds/...` and `memcap-*/ds/...` lines of a results file.
fn replot_table2(from: &Path, out: &Path) -> Result<()> {
    let text = std::fs::read_to_string(from).with_context(|| format!("reading {}", from.display()))?;
    let lines: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let get = |sc: &str, sys: &str, m: &str| {
        lines
            .iter()
            .rev()
            .find(|l| l["scenario"] == sc && l["system"] == sys && l["metric"] == m)
            .and_then(|l| l["value"].as_f64())
    };
    let mut series = Vec::new();
    let mut bulk: Vec<(String, Vec<f64>)> =
        vec![(s("FAWN-DS bulk store"), vec![]), (s("raw sequential write"), vec![])];
    let mut cats = Vec::new();
    let prefixes: Vec<String> = {
        let mut p: Vec<String> = lines
            .iter()
            .filter_map(|l| l["scenario"].as_str())
            .filter_map(|sc| sc.find("ds/v").map(|i| sc[..i].to_string()))
            .collect();
        p.sort();
        p.dedup();
        p
    };
    for pre in &prefixes {
        for vs in [256usize, 1024] {
            let head = format!("{pre}ds/v{vs}/n");
            let mut keys: Vec<u64> = lines
                .iter()
                .filter_map(|l| l["scenario"].as_str())
                .filter_map(|sc| sc.strip_prefix(head.as_str()).and_then(|k| k.parse().ok()))
                .collect();
            keys.sort_unstable();
            keys.dedup();
            let pts: Vec<(f64, f64)> = keys
                .iter()
                .filter_map(|k| {
                    let sc = format!("{head}{k}");
                    Some((get(&sc, "fawn-ds", "log_bytes")? / 1e6, get(&sc, "fawn-ds", "lookup_ops_per_s")?))
                })
                .collect();
            if pts.is_empty() {
                continue;
            }
            let cap = pre.trim_end_matches('/').trim_start_matches("memcap-");
            let name = if pre.is_empty() { format!("{vs} B") } else { format!("{vs} B, {cap} cgroup") };
            series.push(Series::new(name, pts));
            if pre.is_empty() {
                if let Some(k) = keys.last() {
                    let sc = format!("{head}{k}");
                    cats.push(format!("{vs} B"));
                    bulk[0].1.push(get(&sc, "fawn-ds", "bulk_insert_mb_per_s").unwrap_or(f64::NAN));
                    bulk[1].1.push(get(&sc, "raw", "seq_write_mb_per_s").unwrap_or(f64::NAN));
                }
            }
        }
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let t2 = plot::line_chart(
        "Table 2: FAWN-DS random lookups vs datastore size",
        "datastore size (MB, log)",
        "lookups/s (2 threads, log)",
        &series,
        Scale::Log10,
        Scale::Log10,
    );
    std::fs::write(out.join("table2_reads_vs_size.svg"), t2).context("writing the Table 2 plot")?;
    let b = plot::bar_chart("Bulk store vs raw sequential write", "MB/s", &cats, &bulk, Scale::Linear);
    std::fs::write(out.join("bulk_store.svg"), b).context("writing the bulk-store plot")
}

fn fig9(c: &mut Ctx) -> Result<()> {
    let a = files::FilesArgs {
        files: c.z.files.clone(),
        mb: c.z.files_mb,
        value_size: 256,
        dir: Some(c.scratch.clone()),
    };
    files::run(&a, c.quiet, c.rep)?;
    let series: Vec<Series> = ["fawn-ds", "raw"]
        .iter()
        .map(|sys| {
            let pts = c
                .z
                .files
                .iter()
                .map(|&n| (n as f64, c.find(&format!("files/n{n}/v256"), sys, "semi_random_write_mb_per_s")))
                .collect();
            Series::new(if *sys == "raw" { "raw files" } else { "FAWN-DS" }, pts)
        })
        .collect();
    c.write(
        "fig09_semi_random.svg",
        plot::line_chart(
            "Figure 9: semi-random writes",
            "files (log)",
            "MB/s",
            &series,
            Scale::Log10,
            Scale::Linear,
        ),
    )
}

/// Start memcached -t 1, run `w`, stop it.
fn memcached_run(c: &Ctx, rt: &tokio::runtime::Runtime, w: &crate::workload::Workload) -> Result<LoadStats> {
    let m = servers::start_memcached(&c.args.memcached_bin, 1, netbench::memcached_mb(w))?;
    rt.block_on(drive(m.addr, Protocol::Memcached, w, &[m.pid()], "memcached", c.quiet))
}

fn fig10(c: &mut Ctx) -> Result<()> {
    let rt = crate::runtime(1)?;
    let ratios: [f64; 6] = [1.0, 0.9, 0.75, 0.5, 0.25, 0.0];
    let cl = c.env.start(|_| {})?;
    let pids = cl.pids();
    let mut fawn = Vec::new();
    let mut mc = Vec::new();
    for (i, g) in ratios.iter().enumerate() {
        let mut e = c.timing();
        e.extend([
            s("--get-ratio"),
            s(g),
            s("--scenario"),
            format!("fig10/put{}", ((1.0 - g) * 100.0).round()),
        ]);
        if i > 0 {
            e.push(s("--no-preload"));
        }
        let w = workload(&e)?;
        let st =
            rt.block_on(drive(cl.spec.memcached_addr(0), Protocol::Memcached, &w, &pids, "fawn", c.quiet))?;
        netbench::report(c.rep, &w, "fawn", &st)?;
        fawn.push((1.0 - g, st.ops() as f64 / st.window.as_secs_f64()));
        let mut e = c.timing();
        e.extend([
            s("--get-ratio"),
            s(g),
            s("--scenario"),
            format!("fig10/put{}", ((1.0 - g) * 100.0).round()),
        ]);
        let w = workload(&e)?;
        let st = memcached_run(c, &rt, &w)?;
        netbench::report(c.rep, &w, "memcached", &st)?;
        mc.push((1.0 - g, st.ops() as f64 / st.window.as_secs_f64()));
    }
    drop(cl);
    let series = vec![Series::new("FAWN cluster (R=3)", fawn), Series::new("memcached -t 1", mc)];
    c.write(
        "fig10_put_fraction.svg",
        plot::line_chart(
            "Figure 10: throughput vs put fraction (256 B)",
            "fraction of puts",
            "ops/s",
            &series,
            Scale::Linear,
            Scale::Linear,
        ),
    )
}

/// The timeline of a run as (seconds, ops/s) points; also emitted as result lines.
fn timeline(
    c: &mut Ctx,
    sc: &str,
    sys: &str,
    st: &LoadStats,
    p: &serde_json::Value,
) -> Result<Vec<(f64, f64)>> {
    let b = TIMELINE_BUCKET.as_secs_f64();
    // Average into 0.5 s points to keep the files small.
    let per = ((0.5 / b).round() as usize).max(1);
    let mut pts = Vec::new();
    for (i, chunk) in st.timeline.chunks(per).enumerate() {
        let t = (i * per) as f64 * b;
        let rate = chunk.iter().sum::<u64>() as f64 / (chunk.len() as f64 * b);
        let mut p = p.clone();
        p["t_s"] = json!(t);
        c.rep.metric(sc, sys, "timeline_ops_per_s", rate, "ops/s", &p)?;
        pts.push((t, rate));
    }
    Ok(pts)
}

fn fig11(c: &mut Ctx) -> Result<()> {
    let rt = crate::runtime(1)?;
    let mut series = Vec::new();
    for vs in [256usize, 1024] {
        // As in the paper (§4.2), the front-end cache is off: every get reaches a back-end.
        let cl = c.env.start(|s| s.cache_entries = Some(0))?;
        let pids = cl.pids();
        let sc = format!("fig11/get/v{vs}");
        let mut e = c.timing();
        e.extend([
            s("--get-ratio"),
            s(1),
            s("--value-size"),
            s(vs),
            s("--duration"),
            s(c.z.timeline_s),
            s("--scenario"),
            sc.clone(),
        ]);
        let w = workload(&e)?;
        let st =
            rt.block_on(drive(cl.spec.memcached_addr(0), Protocol::Memcached, &w, &pids, "fawn", c.quiet))?;
        netbench::report(c.rep, &w, "fawn", &st)?;
        let pts = timeline(c, &sc, "fawn", &st, &w.params())?;
        series.push(Series::new(format!("{vs} B"), pts));
    }
    c.write(
        "fig11_get_rate.svg",
        plot::line_chart(
            "Figure 11: cluster get rate over time",
            "time (s, warm-up included)",
            "gets/s",
            &series,
            Scale::Linear,
            Scale::Linear,
        ),
    )
}

/// Run `w` on a helper thread while `event` runs here with the cluster; return both results.
fn under_load<T>(
    cl: &mut Cluster,
    w: &crate::workload::Workload,
    quiet: bool,
    event: impl FnOnce(&mut Cluster, Instant) -> Result<T>,
) -> Result<(LoadStats, T)> {
    let (addr, pids): (SocketAddr, Vec<u32>) = (cl.spec.memcached_addr(0), cl.pids());
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        let load = sc.spawn(|| -> Result<LoadStats> {
            let rt = crate::runtime(1)?;
            rt.block_on(crate::loadgen::run(addr, Protocol::Memcached, w, "under load", &pids, quiet))
        });
        let ev = event(cl, t0);
        let st = load.join().map_err(|_| anyhow::anyhow!("load thread panicked"))??;
        Ok((st, ev?))
    })
}

/// Poll the manager until `done(config)` or `timeout`; seconds since `t0` when it held.
fn wait_config(
    cl: &Cluster,
    t0: Instant,
    timeout: Duration,
    done: impl Fn(&fawn_proto::native::ClusterConfig) -> bool,
) -> Result<Option<f64>> {
    let rt = launch::small_runtime()?;
    rt.block_on(async {
        let client = cl.manager_client().await?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if client.refresh().await.is_ok() && done(&client.config()) {
                return Ok(Some(t0.elapsed().as_secs_f64()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(None)
    })
}

fn join(c: &mut Ctx) -> Result<()> {
    let rt = crate::runtime(1)?;
    let mut rate_series = Vec::new();
    let mut cdfs = Vec::new();
    let mut max_rate: f64 = 0.0;
    for load in ["high", "low"] {
        // Cache off: with every key cached the join would not touch the gets at all.
        let mut cl = c.env.start(|s| s.cache_entries = Some(0))?;
        let pids = cl.pids();
        // Preload, and measure the maximum (closed loop) or the ~30 % open-loop baseline.
        let mut e = c.timing();
        e.extend([s("--get-ratio"), s(1), s("--scenario"), format!("join/{load}/normal")]);
        if load == "low" {
            e.extend([s("--rate"), s((0.3 * max_rate).round().max(100.0)), s("--pipeline"), s(8)]);
        }
        let w = workload(&e)?;
        let st =
            rt.block_on(drive(cl.spec.memcached_addr(0), Protocol::Memcached, &w, &pids, "fawn", c.quiet))?;
        netbench::report(c.rep, &w, "fawn", &st)?;
        if load == "high" {
            max_rate = st.ops() as f64 / st.window.as_secs_f64();
        }
        cdfs.push(Series::new(format!("normal, {load} load"), plot::cdf_points(&st.get)));
        // The join: a 4th back-end id starts a few seconds into the measured window.
        let mut e = c.timing();
        e.extend([
            s("--get-ratio"),
            s(1),
            s("--no-preload"),
            s("--duration"),
            s(c.z.join_s),
            s("--timeout"),
            s(30),
            s("--scenario"),
            format!("join/{load}/during-join"),
        ]);
        if load == "low" {
            e.extend([s("--rate"), s((0.3 * max_rate).round().max(100.0)), s("--pipeline"), s(8)]);
        }
        let w = workload(&e)?;
        // At least 2 s of steady rate before it (4 s at full size): it is the baseline of the
        // ratio below, and one 0.5 s bucket alone is too noisy a baseline on a shared machine.
        let lead = Duration::from_secs_f64(c.z.warmup + (c.z.join_s / 10.0).max(2.0));
        let join_s = c.z.join_s;
        let (st, (t_start, t_done)) = under_load(&mut cl, &w, c.quiet, |cl, t0| {
            std::thread::sleep(lead);
            let t_start = t0.elapsed().as_secs_f64();
            cl.add_backend(3)?;
            let done = wait_config(cl, t0, Duration::from_secs_f64(join_s), |cfg| launch::joined(cfg, 3))?;
            Ok((t_start, done))
        })?;
        let sc = format!("join/{load}/during-join");
        netbench::report(c.rep, &w, "fawn", &st)?;
        let p = w.params();
        c.rep.metric(&sc, "fawn", "join_started_at_s", t_start, "s", &p)?;
        match t_done {
            Some(t) => {
                c.rep.metric(&sc, "fawn", "join_done_at_s", t, "s", &p)?;
                c.rep.metric(&sc, "fawn", "join_duration_s", t - t_start, "s", &p)?;
            }
            None => c.rep.metric(&sc, "fawn", "join_unfinished", 1.0, "bool", &p)?,
        }
        let pts = timeline(c, &sc, "fawn", &st, &p)?;
        // The join goal: the rate during the join (pre-copy) vs the steady rate before it.
        let mean = |from: f64, to: f64| {
            let v: Vec<f64> = pts.iter().filter(|(t, _)| *t >= from && *t < to).map(|x| x.1).collect();
            v.iter().sum::<f64>() / v.len().max(1) as f64
        };
        let steady = mean(c.z.warmup, t_start);
        let during = mean(t_start, t_done.unwrap_or(t_start + 0.5).max(t_start + 0.5));
        if steady > 0.0 {
            c.rep.metric(&sc, "fawn", "rate_during_join_vs_steady", during / steady, "ratio", &p)?;
        }
        rate_series.push(Series::new(
            format!(
                "{load} load (join {:.1}..{} s)",
                t_start,
                t_done.map_or("-".into(), |t| format!("{t:.1}"))
            ),
            pts,
        ));
        cdfs.push(Series::new(format!("during join, {load} load"), plot::cdf_points(&st.get)));
    }
    c.write(
        "fig13_join.svg",
        plot::line_chart(
            "Figure 13: get rate while a 4th back-end joins",
            "time (s)",
            "gets/s",
            &rate_series,
            Scale::Linear,
            Scale::Linear,
        ),
    )?;
    c.write(
        "fig15_latency_cdf.svg",
        plot::line_chart(
            "Figure 15: get latency CDF",
            "latency (µs, log)",
            "fraction of gets",
            &cdfs,
            Scale::Log10,
            Scale::Linear,
        ),
    )
}

fn failure(c: &mut Ctx) -> Result<()> {
    let rt = crate::runtime(1)?;
    // 4 back-ends so R = 3 can be restored without the frozen one.
    // Cache off, so gets of the frozen node's ranges really wait for the repair.
    let mut cl = c.env.start(|s| {
        s.backends = 4;
        s.cache_entries = Some(0);
    })?;
    let pids = cl.pids();
    let mut e = c.timing();
    e.extend([
        s("--get-ratio"),
        s(1),
        s("--duration"),
        s(1),
        s("--warmup"),
        s(0),
        s("--scenario"),
        s("failure/preload"),
    ]);
    let w = workload(&e)?;
    rt.block_on(drive(cl.spec.memcached_addr(0), Protocol::Memcached, &w, &pids, "fawn", c.quiet))?;
    let bytes_before = cl.backend_bytes();
    let victim = "backend-1";
    let mut e = c.timing();
    let total = c.z.join_s + 5.0;
    e.extend([
        s("--get-ratio"),
        s(0.9),
        s("--rate"),
        s(2000),
        s("--connections"),
        s(16),
        s("--no-preload"),
        s("--duration"),
        s(total),
        s("--warmup"),
        s(1),
        s("--timeout"),
        s(30),
        s("--scenario"),
        s("failure/sigstop"),
    ]);
    let w = workload(&e)?;
    let probe_addr = cl.spec.native_addr(0);
    let (st, (t_stop, t_detect, t_puts, t_rerep, moved)) = under_load(&mut cl, &w, c.quiet, |cl, t0| {
        std::thread::sleep(Duration::from_secs(3));
        let t_stop = t0.elapsed().as_secs_f64();
        cl.signal(victim, libc::SIGSTOP)?;
        let limit = Duration::from_secs_f64(total - 4.0);
        let detect = wait_config(cl, t0, limit, |cfg| launch::is_failed(cfg, 1))?;
        let puts = probe_puts_ok(probe_addr, t0, limit)?;
        let rerep = wait_config(cl, t0, limit, |cfg| launch::fully_replicated(cfg, 3))?;
        let moved = cl.backend_bytes().saturating_sub(bytes_before);
        Ok((t_stop, detect, puts, rerep, moved))
    })?;
    cl.signal(victim, libc::SIGCONT)?;
    drop(cl);
    let sc = "failure/sigstop";
    netbench::report(c.rep, &w, "fawn", &st)?;
    let p = json!({"backends": 4, "replicas": 3, "keys": c.z.keys, "heartbeat_ms": 200, "fd_threshold": 10});
    c.rep.metric(sc, "fawn", "stopped_at_s", t_stop, "s", &p)?;
    for (m, v) in [
        ("time_to_detect_s", t_detect),
        ("time_to_accept_puts_s", t_puts),
        ("time_to_rereplicate_s", t_rerep),
    ] {
        match v {
            Some(t) => c.rep.metric(sc, "fawn", m, t - t_stop, "s", &p)?,
            None => c.rep.metric(sc, "fawn", &format!("{m}_timed_out"), 1.0, "bool", &p)?,
        }
    }
    c.rep.metric(sc, "fawn", "bytes_moved", moved as f64, "B", &p)?;
    if let (Some(d), Some(u)) = (t_detect, t_puts) {
        c.rep.metric(sc, "fawn", "puts_ok_after_detection_s", u - d, "s", &p)?;
    }
    if let (Some(d), Some(r)) = (t_detect, t_rerep) {
        c.rep.metric(
            sc,
            "fawn",
            "rereplication_mb_per_s",
            moved as f64 / 1e6 / (r - d).max(1e-3),
            "MB/s",
            &p,
        )?;
    }
    let pts = timeline(c, sc, "fawn", &st, &p)?;
    let errs: Vec<(f64, f64)> = st
        .timeline_errors
        .chunks(5)
        .enumerate()
        .map(|(i, ch)| (i as f64 * 0.5, ch.iter().sum::<u64>() as f64 / 0.5))
        .collect();
    c.write(
        "failure.svg",
        plot::line_chart(
            &format!(
                "Back-end frozen at {t_stop:.1} s: detected +{}, puts ok +{}, R=3 again +{}",
                rel(t_detect, t_stop),
                rel(t_puts, t_stop),
                rel(t_rerep, t_stop)
            ),
            "time (s)",
            "ops/s (offered 2000/s, 90 % gets)",
            &[Series::new("completed", pts), Series::new("errors", errs)],
            Scale::Linear,
            Scale::Linear,
        ),
    )
}

/// Puts while a back-end joins (its virtual ids split ranges) and then leaves (the ranges merge
/// back), against a steady run: a range refuses puts from the moment its head learns of the
/// split or merge until the new ranges are installed, and the front-end retries meanwhile, so
/// the slowest put of a phase is the longest stall a client saw.
fn resize(c: &mut Ctx) -> Result<()> {
    let mut cl = c.env.start(|s| s.backends = 4)?;
    let newcomer = 4;
    let mut series = Vec::new();
    for phase in ["steady", "join", "leave"] {
        let sc = format!("resize/{phase}");
        let mut e = c.timing();
        e.extend([
            s("--get-ratio"),
            s(0),
            s("--rate"),
            s(2000),
            s("--connections"),
            s(16),
            s("--duration"),
            s(c.z.join_s / 2.0),
            s("--warmup"),
            s(1),
            s("--timeout"),
            s(30),
            s("--scenario"),
            sc.clone(),
        ]);
        if phase != "steady" {
            e.push(s("--no-preload"));
        }
        let w = workload(&e)?;
        if phase == "steady" {
            let rt = crate::runtime(1)?;
            rt.block_on(crate::loadgen::preload(cl.spec.memcached_addr(0), Protocol::Memcached, &w))?;
        }
        let bytes_before = cl.backend_bytes();
        let limit = Duration::from_secs_f64(c.z.join_s / 2.0);
        let (st, (t_start, t_done)) = under_load(&mut cl, &w, c.quiet, |cl, t0| {
            std::thread::sleep(Duration::from_secs(3));
            let t_start = t0.elapsed().as_secs_f64();
            let done = match phase {
                "join" => {
                    cl.add_backend(newcomer)?;
                    wait_config(cl, t0, limit, |cfg| {
                        launch::joined(cfg, newcomer) && cfg.ranges.iter().all(|r| r.splitting.is_none())
                    })?
                }
                "leave" => {
                    ask_to_leave(cl.spec.manager_addr(), newcomer)?;
                    wait_config(cl, t0, limit, |cfg| {
                        launch::has_left(cfg, newcomer)
                            && launch::fully_replicated(cfg, 3)
                            && cfg.ranges.iter().all(|r| r.merging.is_none())
                    })?
                }
                _ => Some(t_start),
            };
            Ok((t_start, done))
        })?;
        netbench::report(c.rep, &w, "fawn", &st)?;
        let p = w.params();
        c.rep.metric(&sc, "fawn", "ranges_bytes_before", bytes_before as f64, "B", &p)?;
        if phase != "steady" {
            c.rep.metric(&sc, "fawn", &format!("{phase}_started_at_s"), t_start, "s", &p)?;
            match t_done {
                Some(t) => c.rep.metric(&sc, "fawn", &format!("{phase}_duration_s"), t - t_start, "s", &p)?,
                None => c.rep.metric(&sc, "fawn", &format!("{phase}_unfinished"), 1.0, "bool", &p)?,
            }
        }
        let pts = timeline(c, &sc, "fawn", &st, &p)?;
        series.push(Series::new(format!("{phase} (event at {t_start:.1} s)"), pts));
    }
    c.write(
        "resize_puts.svg",
        plot::line_chart(
            "Puts (2000/s offered) while a 5th back-end joins, then leaves",
            "time (s)",
            "puts/s",
            &series,
            Scale::Linear,
            Scale::Linear,
        ),
    )
}

/// Asks the manager to take `node` out of the cluster gracefully (its ranges merge back).
fn ask_to_leave(manager: SocketAddr, node: u32) -> Result<()> {
    use fawn_proto::native::{Request, Response};
    let rt = launch::small_runtime()?;
    rt.block_on(async {
        let pool = fawn_client::pool::Pool::new(Duration::from_secs(2));
        match pool.call(&manager.to_string(), Request::Leave { node }, Duration::from_secs(2)).await {
            Ok(Response::Config(_)) => Ok(()),
            other => bail!("the manager refused the leave of back-end {node}: {other:?}"),
        }
    })
}

fn rel(t: Option<f64>, t0: f64) -> String {
    t.map_or("(timed out)".into(), |t| format!("{:.2} s", t - t0))
}

/// Seconds since `t0` at which a round of puts to 200 keys (spread over every range) all
/// succeeded within 1 s each (called once the failure is detected); None on timeout.
fn probe_puts_ok(addr: SocketAddr, t0: Instant, timeout: Duration) -> Result<Option<f64>> {
    let rt = launch::small_runtime()?;
    rt.block_on(async {
        let options = fawn_client::ClientOptions {
            request_timeout: Duration::from_secs(1),
            ..fawn_client::ClientOptions::default()
        };
        let client = fawn_client::Client::connect(&[addr.to_string()], options)
            .await
            .map_err(|e| anyhow::anyhow!("probe client: {e}"))?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let _ = client.refresh().await;
            let puts = (0..200).map(|i| {
                let client = client.clone();
                async move {
                    let key = format!("probe:{i:04}");
                    tokio::time::timeout(Duration::from_secs(1), client.put(key.as_bytes(), b"x")).await
                }
            });
            let results = futures_join_all(puts).await;
            if results.iter().all(|r| matches!(r, Ok(Ok(_)))) {
                return Ok(Some(t0.elapsed().as_secs_f64()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(None)
    })
}

/// Await every future concurrently (tasks on the current runtime).
async fn futures_join_all<F, T>(futs: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        if let Ok(v) = h.await {
            out.push(v);
        }
    }
    out
}

fn table3(c: &mut Ctx) -> Result<()> {
    let rt = crate::runtime(1)?;
    let mut cats = Vec::new();
    let mut vals: Vec<(String, Vec<f64>)> =
        vec![(s("FAWN cluster"), vec![]), (s("memcached -t 1"), vec![]), (s("redis"), vec![])];
    for (g, name) in [(1.0, "gets"), (0.9, "90% gets")] {
        for vs in [256usize, 1024] {
            let sc = format!("table3/g{}/v{vs}", (g * 100.0) as u32);
            cats.push(format!("{name}, {vs} B"));
            let mut e = c.timing();
            e.extend([s("--get-ratio"), s(g), s("--value-size"), s(vs), s("--scenario"), sc.clone()]);
            let w = workload(&e)?;
            let cl = c.env.start(|_| {})?;
            let pids = cl.pids();
            let st = rt.block_on(drive(
                cl.spec.memcached_addr(0),
                Protocol::Memcached,
                &w,
                &pids,
                "fawn",
                c.quiet,
            ))?;
            drop(cl);
            netbench::report(c.rep, &w, "fawn", &st)?;
            let st = memcached_run(c, &rt, &w)?;
            netbench::report(c.rep, &w, "memcached", &st)?;
            let r = servers::start_redis(&c.args.redis_bin)?;
            let st = rt.block_on(drive(r.addr, Protocol::Redis, &w, &[r.pid()], "redis", c.quiet))?;
            drop(r);
            netbench::report(c.rep, &w, "redis", &st)?;
            for (i, sys) in ["fawn", "memcached", "redis"].iter().enumerate() {
                vals[i].1.push(c.find(&sc, sys, "ops_per_cpu_s"));
            }
            for sys in ["fawn", "redis"] {
                let v = c.find(&sc, sys, "ops_per_cpu_s") / c.find(&sc, "memcached", "ops_per_cpu_s");
                c.rep.metric(&sc, sys, "ops_per_cpu_s_vs_memcached", v, "ratio", &w.params())?;
            }
        }
    }
    // Embedded engines, gets only: lookups per busy lookup-thread second (2 threads, both busy
    // the whole time, so this is lookups per CPU-second). RocksDB with the `rocksdb` feature.
    let rocks = cfg!(feature = "rocksdb");
    let mut emb = vec![(s("FAWN-DS embedded"), vec![f64::NAN; cats.len()])];
    if rocks {
        emb.push((s("RocksDB embedded"), vec![f64::NAN; cats.len()]));
    }
    for (i, vs) in [256usize, 1024].into_iter().enumerate() {
        let mut a = ds_args(c, c.z.keys, vs);
        a.rocksdb = rocks;
        ds::run(&a, c.quiet, c.rep)?;
        let sc = format!("ds/v{vs}/n{}", c.z.keys);
        for (j, sys) in ["fawn-ds", "rocksdb"].iter().enumerate().take(emb.len()) {
            let v = c.find(&sc, sys, "lookup_ops_per_s") / a.threads as f64;
            c.rep.metric(
                &format!("table3/g100/v{vs}"),
                sys,
                "ops_per_cpu_s",
                v,
                "ops/cpu-s",
                &json!({"embedded": true, "threads": a.threads}),
            )?;
            emb[j].1[i] = v;
        }
    }
    vals.extend(emb);
    c.write(
        "table3_qpcs.svg",
        plot::bar_chart(
            "Table 3 analogue: queries per CPU-second (server processes)",
            "ops per CPU-second",
            &cats,
            &vals,
            Scale::Linear,
        ),
    )
}

fn distance_part(c: &mut Ctx) -> Result<()> {
    let a = crate::distance::DistanceArgs {
        delays_ms: vec![0.0, 1.0, 5.0],
        connections: c.z.distance_conns.clone(),
        get_ratios: c.z.distance_gets.clone(),
        // Preloading through a 5 ms chain is slow (one RTT per hop per set): keep it small.
        keys: c.z.keys.min(10_000),
        duration: c.z.duration.min(3.0),
        warmup: c.z.warmup.min(1.0),
        svg: Some(c.out.join("distance.svg")),
        fawn_bin: Some(c.env.bin.clone()),
        dir: Some(c.scratch.clone()),
    };
    crate::distance::run(&a, c.quiet, c.rep)
}

fn cluster_part(c: &mut Ctx) -> Result<()> {
    if c.z.cluster_duration <= 0.0 {
        return Ok(());
    }
    let a = cluster::ClusterArgs {
        fawn_bin: Some(c.env.bin.clone()),
        dir: Some(c.scratch.clone()),
        base_port: c.args.base_port,
        sections: vec![s("throughput"), s("replicas"), s("local"), s("peers")],
        value_sizes: vec![256, 1024],
        keys: c.z.keys,
        connections: 64,
        duration: c.z.cluster_duration,
        warmup: c.z.warmup,
        memcached_bin: c.args.memcached_bin.clone(),
        redis_bin: c.args.redis_bin.clone(),
        no_redis: false,
        memory_keys: 1_000_000,
    };
    cluster::run(&a, c.quiet, c.rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("256M").ok(), Some(256 << 20));
        assert_eq!(parse_bytes("1g").ok(), Some(1 << 30));
        assert_eq!(parse_bytes("4096").ok(), Some(4096));
        assert!(parse_bytes("lots").is_err());
    }
}
