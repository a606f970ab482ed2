//! `fawn bench files`: the paper's Figure 9 — semi-random writes. A back-end appends to one log
//! per range it hosts (R·V of them), so its device sees appends spread over many files. We write
//! the same bytes round-robin into 1..N FAWN-DS datastores and into N raw files, end with a sync
//! of every file (so the bytes reach the device), and compare MB/s.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use fawn_ds::{DataStore, Meta, Options, SyncPolicy};
use serde_json::json;

use crate::output::Reporter;

/// Options of `fawn bench files`.
#[derive(clap::Args, Debug, Clone)]
pub struct FilesArgs {
    /// Numbers of files (datastores) to spread the writes over; one point each.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
    pub files: Vec<usize>,
    /// MB written per point.
    #[arg(long, default_value_t = 256)]
    pub mb: u64,
    /// Value size of each record, bytes.
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// Directory for the files (a fresh sub-directory is made and removed). Default: temp dir.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// One point: how many records, and their sizes.
struct Point {
    files: usize,
    records: u64,
    value: Vec<u8>,
}

/// Run every point.
pub fn run(args: &FilesArgs, quiet: bool, rep: &mut Reporter) -> Result<()> {
    ensure!(args.files.iter().all(|&n| (1..=4096).contains(&n)), "--files values must be in 1..=4096");
    ensure!(args.mb >= 1 && (8..=1 << 20).contains(&args.value_size), "--mb >= 1, --value-size in 8..=1 MiB");
    let parent = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let work =
        tempfile::Builder::new().prefix("fawn-bench-files-").tempdir_in(&parent).context("work dir")?;
    // Record bytes in the log: header + key + value, padded; close enough to size the run.
    let approx_record = (args.value_size + 64) as u64;
    for &files in &args.files {
        let p =
            Point { files, records: args.mb * 1_000_000 / approx_record, value: vec![b'v'; args.value_size] };
        if !quiet {
            eprintln!("fawn bench files: {} MB over {files} files", args.mb);
        }
        let dir = work.path().join(format!("n{files}"));
        let (store_mb_s, record) = datastores(&dir, &p)?;
        let raw_mb_s = raw_files(&dir, &p, record)?;
        let sc = format!("files/n{files}/v{}", args.value_size);
        let params = json!({"files": files, "mb": args.mb, "value_size": args.value_size});
        rep.metric(&sc, "fawn-ds", "semi_random_write_mb_per_s", store_mb_s, "MB/s", &params)?;
        rep.metric(&sc, "raw", "semi_random_write_mb_per_s", raw_mb_s, "MB/s", &params)?;
        rep.metric(&sc, "fawn-ds", "semi_random_write_vs_raw", store_mb_s / raw_mb_s, "ratio", &params)?;
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

/// Round-robin stores into `p.files` datastores, then sync them all. Returns (MB/s of log
/// bytes, average record bytes).
fn datastores(dir: &std::path::Path, p: &Point) -> Result<(f64, usize)> {
    let per_store = p.records / p.files as u64 + 1;
    let opts = Options { sync: SyncPolicy::Never, expected_keys: per_store, ..Options::default() };
    let stores = (0..p.files)
        .map(|i| DataStore::open(&dir.join(format!("ds{i}")), opts.clone()).context("opening a datastore"))
        .collect::<Result<Vec<_>>>()?;
    let base: u64 = stores.iter().map(|s| s.stats().log_bytes).sum();
    let start = Instant::now();
    for i in 0..p.records {
        let key = format!("fawnbench:{i:012}");
        stores[(i % p.files as u64) as usize]
            .store(key.as_bytes(), &p.value, Meta { seq: i + 1, ..Meta::default() })
            .with_context(|| format!("storing record {i}"))?;
    }
    for s in &stores {
        s.sync().context("syncing a datastore")?;
    }
    let took = start.elapsed().as_secs_f64();
    let bytes: u64 = stores.iter().map(|s| s.stats().log_bytes).sum::<u64>() - base;
    for s in stores {
        s.close().context("closing a datastore")?;
    }
    Ok((bytes as f64 / 1e6 / took, (bytes / p.records.max(1)) as usize))
}

/// The same number of records of the same size, appended round-robin to `p.files` raw files.
fn raw_files(dir: &std::path::Path, p: &Point, record: usize) -> Result<f64> {
    let files = (0..p.files)
        .map(|i| {
            let path = dir.join(format!("raw{i}.dat"));
            File::create(&path).with_context(|| format!("creating {}", path.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let buf = vec![b'r'; record.max(1)];
    let mut offsets = vec![0u64; p.files];
    let start = Instant::now();
    for i in 0..p.records {
        let f = (i % p.files as u64) as usize;
        files[f].write_all_at(&buf, offsets[f]).context("raw append")?;
        offsets[f] += buf.len() as u64;
    }
    for f in &files {
        f.sync_data().context("fdatasync")?;
    }
    let took = start.elapsed().as_secs_f64();
    Ok((p.records * buf.len() as u64) as f64 / 1e6 / took)
}
