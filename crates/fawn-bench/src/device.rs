//! `fawn bench device`: the paper's Table 1 on this machine — what the device under the chosen
//! directory can do, measured with O_DIRECT (no page cache) on the same file system FAWN-DS uses.

use std::path::PathBuf;

use anyhow::{ensure, Context, Result};
use serde_json::json;

use crate::output::Reporter;
use crate::raw;

/// Options of `fawn bench device`.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Directory whose device to measure (a scratch file is created and removed). Default: the
    /// system temp directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Size of the scratch file, MiB.
    #[arg(long, default_value_t = 1024)]
    pub file_mb: u64,
    /// Chunk of the sequential reads and writes, KiB.
    #[arg(long, default_value_t = 1024)]
    pub chunk_kb: usize,
    /// Concurrency levels of the random 4 KiB reads and writes.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub threads: Vec<usize>,
    /// Random operations per measurement.
    #[arg(long, default_value_t = 20_000)]
    pub count: u64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// Measure sequential write/read MB/s and random 4 KiB read/write IOPS.
pub fn run(args: &DeviceArgs, quiet: bool, rep: &mut Reporter) -> Result<()> {
    ensure!(
        args.file_mb >= 1 && args.chunk_kb >= 4 && args.chunk_kb.is_multiple_of(4),
        "--file-mb >= 1, --chunk-kb a multiple of 4"
    );
    let parent = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let work =
        tempfile::Builder::new().prefix("fawn-bench-device-").tempdir_in(&parent).context("work dir")?;
    let file = work.path().join("scratch.dat");
    let (size, chunk) = (args.file_mb << 20, args.chunk_kb << 10);
    let scenario = "device";
    let params =
        json!({"file_mb": args.file_mb, "chunk_kb": args.chunk_kb, "dir": parent.display().to_string()});
    if !quiet {
        eprintln!("fawn bench device: sequential write/read of {} MiB in {}", args.file_mb, parent.display());
    }
    let took = raw::direct_seq_write(&file, size, chunk)?;
    rep.metric(
        scenario,
        "raw",
        "seq_write_mb_per_s",
        size as f64 / 1e6 / took.as_secs_f64(),
        "MB/s",
        &params,
    )?;
    let (bytes, took) = raw::direct_seq_read(&file, chunk)?;
    rep.metric(
        scenario,
        "raw",
        "seq_read_mb_per_s",
        bytes as f64 / 1e6 / took.as_secs_f64(),
        "MB/s",
        &params,
    )?;
    for &t in &args.threads {
        if !quiet {
            eprintln!("fawn bench device: random 4 KiB reads and writes, {t} threads");
        }
        let p = json!({"file_mb": args.file_mb, "threads": t, "count": args.count});
        let r = raw::direct_random_reads(&file, t, args.count, args.seed)?;
        rep.metric(scenario, "raw", &format!("rand_read_4k_iops_t{t}"), r.ops_per_s(), "ops/s", &p)?;
        rep.metric(scenario, "raw", &format!("rand_read_4k_p50_us_t{t}"), r.us(0.5), "us", &p)?;
        let w = raw::direct_random_writes(&file, t, args.count, args.seed)?;
        rep.metric(scenario, "raw", &format!("rand_write_4k_iops_t{t}"), w.ops_per_s(), "ops/s", &p)?;
        rep.metric(scenario, "raw", &format!("rand_write_4k_p50_us_t{t}"), w.us(0.5), "us", &p)?;
    }
    Ok(())
}
