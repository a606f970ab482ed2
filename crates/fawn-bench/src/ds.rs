//! `fawn bench ds`: FAWN-DS engine benchmarks, each beside its baseline in one run.
//!
//! Per value size: bulk insert vs a raw sequential write of the same bytes with the same sync
//! policy; index DRAM bytes per live key; random lookups with the data in page cache (and
//! RocksDB with the same keys and values, with the `rocksdb` feature); extra log reads per 1000
//! lookups; restart time with and without a checkpoint; lookups that go to the device vs raw
//! O_DIRECT 4 KiB random reads of the same log file at the same concurrency.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use fawn_ds::{BatchOp, DataStore, Meta, Options, SyncPolicy};
use rand::Rng;
use serde_json::json;

use crate::output::Reporter;
use crate::par::{self, ParResult, Until};
use crate::raw;

/// Log and checkpoint file names inside a datastore directory (docs/FORMAT.md).
const LOG_FILE: &str = "data.log";
const CHECKPOINT_FILE: &str = "index.ckpt";
/// Keys of the `--full` run (the 10 M).
const FULL_KEYS: u64 = 10_000_000;

/// Options of `fawn bench ds`.
#[derive(clap::Args, Debug, Clone)]
pub struct DsArgs {
    /// Directory to create the datastores in (a fresh sub-directory is made and removed).
    /// Default: the system temp directory. Must be on the device you want to measure.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Number of keys (default sized to finish in minutes on 2 cores).
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// The full run: 10 M keys (overrides --keys).
    #[arg(long)]
    pub full: bool,
    /// Value sizes in bytes (at least 8); one set of runs per size.
    #[arg(long = "value-size", value_delimiter = ',', default_value = "256,1024")]
    pub value_sizes: Vec<usize>,
    /// Threads doing lookups (and raw reads).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Seconds of random lookups with the data in page cache.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Sync policy of the bulk insert and of its raw baseline: never | always | interval:MS.
    #[arg(long, default_value = "never", value_parser = parse_sync)]
    pub sync: SyncPolicy,
    /// Bulk insert in `write_batch` calls of about this many log bytes each (one append and,
    /// under `always`, one fdatasync per batch); the raw baseline writes in chunks of the same
    /// size. 0 = one `store` call per record and one raw write per record.
    #[arg(long, default_value_t = 1 << 20)]
    pub batch_bytes: usize,
    /// Write the store with `page_aligned_records` (no record crosses a 4 KiB page).
    #[arg(long)]
    pub page_aligned: bool,
    /// Lookups (and raw reads) that go to the device; 0 skips that comparison.
    #[arg(long, default_value_t = 20_000)]
    pub device_reads: u64,
    /// Size the index for all keys up front (default: start small and grow online, as a
    /// back-end does).
    #[arg(long)]
    pub presize: bool,
    /// Also benchmark RocksDB with the same keys and values (needs the `rocksdb` feature).
    #[arg(long)]
    pub rocksdb: bool,
    /// Keep the datastores afterwards.
    #[arg(long)]
    pub keep: bool,
    /// Seed of the key choices.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// Parse `never`, `always` or `interval:MS`.
pub fn parse_sync(s: &str) -> Result<SyncPolicy, String> {
    match s {
        "never" => Ok(SyncPolicy::Never),
        "always" => Ok(SyncPolicy::Always),
        _ => s
            .strip_prefix("interval:")
            .and_then(|ms| ms.parse::<u64>().ok())
            .map(|ms| SyncPolicy::Interval(Duration::from_millis(ms)))
            .ok_or_else(|| format!("expected never | always | interval:MS, got {s:?}")),
    }
}

fn sync_name(s: SyncPolicy) -> String {
    match s {
        SyncPolicy::Never => "never".into(),
        SyncPolicy::Always => "always".into(),
        SyncPolicy::Interval(d) => format!("interval:{}", d.as_millis()),
    }
}

/// One value size's run: its names and parameters.
struct Ctx<'a> {
    args: &'a DsArgs,
    keys: u64,
    value_size: usize,
    dir: PathBuf,
    scenario: String,
    params: serde_json::Value,
}

impl Ctx<'_> {
    fn store_dir(&self) -> PathBuf {
        self.dir.join("fawn-ds")
    }

    fn options(&self) -> Options {
        Options {
            sync: self.args.sync,
            expected_keys: if self.args.presize { self.keys } else { 0 },
            page_aligned_records: self.args.page_aligned,
            ..Options::default()
        }
    }

    fn metric(&self, rep: &mut Reporter, system: &str, metric: &str, value: f64, unit: &str) -> Result<()> {
        rep.metric(&self.scenario, system, metric, value, unit, &self.params)
    }
}

/// Run every benchmark for every value size.
pub fn run(args: &DsArgs, quiet: bool, rep: &mut Reporter) -> Result<()> {
    ensure!(
        args.value_sizes.iter().all(|&v| (8..=1 << 20).contains(&v)),
        "--value-size must be in 8..=1048576"
    );
    ensure!(args.threads >= 1 && args.duration > 0.0, "--threads must be >= 1 and --duration > 0");
    if args.rocksdb && !cfg!(feature = "rocksdb") {
        bail!("--rocksdb needs a build with the `rocksdb` feature (cargo build --features rocksdb)");
    }
    let keys = if args.full { FULL_KEYS } else { args.keys };
    ensure!(keys >= 1, "--keys must be at least 1");
    let parent = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let base = tempfile::Builder::new()
        .prefix("fawn-bench-ds-")
        .tempdir_in(&parent)
        .with_context(|| format!("creating a work directory in {}", parent.display()))?;
    for &value_size in &args.value_sizes {
        let dir = base.path().join(format!("v{value_size}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let ctx = Ctx {
            args,
            keys,
            value_size,
            scenario: scenario_name(args, value_size, keys),
            params: json!({
                "keys": keys, "value_size": value_size, "threads": args.threads,
                "sync": sync_name(args.sync), "presize": args.presize, "batch_bytes": args.batch_bytes, "page_aligned": args.page_aligned,
            }),
            dir,
        };
        bench_value_size(&ctx, quiet, rep)?;
    }
    if args.keep {
        let kept = base.keep();
        eprintln!("fawn bench ds: kept {}", kept.display());
    }
    Ok(())
}

/// E.g. `ds/v256/n1000000`, with `/presize` and `/sync-always` when those differ from the default.
fn scenario_name(args: &DsArgs, value_size: usize, keys: u64) -> String {
    let mut s = format!("ds/v{value_size}/n{keys}");
    if args.presize {
        s.push_str("/presize");
    }
    if args.page_aligned {
        s.push_str("/aligned");
    }
    if args.sync != SyncPolicy::Never {
        s.push_str(&format!("/sync-{}", sync_name(args.sync)));
    }
    s
}

fn say(quiet: bool, msg: &str) {
    if !quiet {
        eprintln!("fawn bench ds: {msg}");
    }
}

fn bench_value_size(ctx: &Ctx, quiet: bool, rep: &mut Reporter) -> Result<()> {
    say(quiet, &format!("{}: bulk insert of {} keys", ctx.scenario, ctx.keys));
    let store = DataStore::open(&ctx.store_dir(), ctx.options()).context("opening the datastore")?;
    bulk_insert(ctx, &store, rep)?;
    index_stats(ctx, &store, rep)?;
    say(quiet, &format!("{}: random lookups, data in page cache", ctx.scenario));
    let warm = lookups(ctx, &store, Until::Elapsed(Duration::from_secs_f64(ctx.args.duration)))?;
    report_lookups(ctx, rep, "fawn-ds", "lookup", &warm)?;
    extra_reads(ctx, &store, rep)?;
    say(quiet, &format!("{}: restarts", ctx.scenario));
    let store = restarts(ctx, store, rep)?;
    if ctx.args.device_reads > 0 {
        say(quiet, &format!("{}: reads from the device", ctx.scenario));
        device_reads(ctx, &store, rep)?;
    }
    store.close().context("closing the datastore")?;
    if ctx.args.rocksdb {
        say(quiet, &format!("{}: rocksdb", ctx.scenario));
        rocks(ctx, rep, &warm)?;
    }
    if !ctx.args.keep {
        std::fs::remove_dir_all(&ctx.dir).with_context(|| format!("removing {}", ctx.dir.display()))?;
    }
    Ok(())
}

/// The key of index `i` (the same bytes for every system; `bulk_insert` formats it too).
fn key(i: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(KEY_PREFIX.len() + KEY_DIGITS);
    push_key(&mut k, i);
    k
}

const KEY_PREFIX: &[u8] = b"fawnbench:";
const KEY_DIGITS: usize = 12;

/// Append `key(i)` (`fawnbench:` and `i` in 12 zero-padded decimal digits) to `out` without
/// the formatting machinery: the bulk insert builds keys inside its timed loop, and this is
/// the bench's cost, not the store's.
fn push_key(out: &mut Vec<u8>, i: u64) {
    out.extend_from_slice(KEY_PREFIX);
    let mut digits = [b'0'; KEY_DIGITS];
    let mut n = i;
    for d in digits.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
    if n > 0 {
        // More than 12 digits (never in practice): as `format!` would print it.
        out.extend_from_slice(i.to_string().as_bytes());
        return;
    }
    out.extend_from_slice(&digits);
}

/// A value whose first 8 bytes are the key index, so lookups can check they got the right one.
fn value_for(i: u64, template: &mut [u8]) -> &[u8] {
    template[..8].copy_from_slice(&i.to_le_bytes());
    template
}

fn template(size: usize) -> Vec<u8> {
    (0..size).map(|i| b'a' + (i % 26) as u8).collect()
}

fn check_value(i: u64, value: Option<&[u8]>) -> Result<()> {
    match value {
        Some(v) if v.len() >= 8 && v[..8] == i.to_le_bytes() => Ok(()),
        Some(_) => bail!("lookup of key {i} returned another key's value"),
        None => bail!("lookup of key {i} found nothing"),
    }
}

/// Bulk insert, then the raw baseline: the same number of bytes written sequentially in
/// writes of the batch size (one per record without batching) with the same sync policy, from
/// a buffer holding the start of the store's own log. Both are timed twice: when the last
/// write returns (page-cache speed when nothing syncs) and after a final fdatasync (durable
/// MB/s, the headline: with a log larger than the dirty-page limits the device sets it).
fn bulk_insert(ctx: &Ctx, store: &DataStore, rep: &mut Reporter) -> Result<()> {
    let mut tpl = template(ctx.value_size);
    let start = Instant::now();
    let batch_bytes = ctx.args.batch_bytes;
    if batch_bytes == 0 {
        for i in 0..ctx.keys {
            store
                .store(&key(i), value_for(i, &mut tpl), Meta { seq: i + 1, ..Meta::default() })
                .with_context(|| format!("storing key {i}"))?;
        }
    } else {
        // Keys and values of one batch, built before the call (the caller's data) in one
        // reused arena, so the bench itself allocates nothing per record.
        let per_batch = (batch_bytes / (ctx.value_size + 64)).max(1) as u64;
        let mut arena: Vec<u8> = Vec::new();
        let mut spans: Vec<(usize, usize, usize)> = Vec::new();
        let mut first = 0;
        while first < ctx.keys {
            let last = (first + per_batch).min(ctx.keys);
            arena.clear();
            spans.clear();
            for i in first..last {
                let k = arena.len();
                push_key(&mut arena, i);
                let v = arena.len();
                arena.extend_from_slice(value_for(i, &mut tpl));
                spans.push((k, v, arena.len()));
            }
            let ops: Vec<BatchOp> = (first..last)
                .zip(&spans)
                .map(|(i, &(k, v, e))| {
                    BatchOp::put(&arena[k..v], &arena[v..e], Meta { seq: i + 1, ..Meta::default() })
                })
                .collect();
            store.write_batch(&ops).with_context(|| format!("storing keys {first}..{last}"))?;
            first = last;
        }
    }
    let cached = start.elapsed().as_secs_f64();
    store.sync().context("syncing the datastore")?;
    let took = start.elapsed().as_secs_f64();
    let log_bytes = store.stats().log_bytes;
    let mb = log_bytes as f64 / 1e6;
    ctx.metric(rep, "fawn-ds", "bulk_insert_mb_per_s", mb / took, "MB/s")?;
    ctx.metric(rep, "fawn-ds", "bulk_insert_ops_per_s", ctx.keys as f64 / took, "ops/s")?;
    ctx.metric(rep, "fawn-ds", "bulk_insert_pagecache_mb_per_s", mb / cached, "MB/s")?;

    let chunk = if batch_bytes == 0 { (log_bytes / ctx.keys).max(1) as usize } else { batch_bytes };
    let log = ctx.store_dir().join(LOG_FILE);
    let pattern = raw::file_prefix(&log, chunk)?;
    let raw_path = ctx.dir.join("raw-seq.dat");
    let t = raw::seq_write_bytes(&raw_path, &pattern, log_bytes, ctx.args.sync)?;
    std::fs::remove_file(&raw_path).with_context(|| format!("removing {}", raw_path.display()))?;
    // The raw file's pages may have pushed the log out of the page cache (at GB sizes):
    // bring it back for the page-cache lookups that follow.
    raw::warm(&log)?;
    let (raw_cached, raw_took) = (t.written.as_secs_f64(), t.durable.as_secs_f64());
    ctx.metric(rep, "raw", "seq_write_mb_per_s", mb / raw_took, "MB/s")?;
    ctx.metric(rep, "raw", "seq_write_pagecache_mb_per_s", mb / raw_cached, "MB/s")?;
    ctx.metric(rep, "raw", "seq_write_chunk_bytes", chunk as f64, "B")?;
    ctx.metric(rep, "fawn-ds", "bulk_insert_vs_raw_pagecache", raw_cached / cached, "ratio")?;
    ctx.metric(rep, "fawn-ds", "bulk_insert_vs_raw", raw_took / took, "ratio")
}

fn index_stats(ctx: &Ctx, store: &DataStore, rep: &mut Reporter) -> Result<()> {
    let s = store.stats();
    ensure!(s.live_keys == ctx.keys, "datastore reports {} live keys, expected {}", s.live_keys, ctx.keys);
    ctx.metric(rep, "fawn-ds", "index_bytes_per_key", s.index_bytes as f64 / s.live_keys as f64, "B")?;
    ctx.metric(rep, "fawn-ds", "index_bytes", s.index_bytes as f64, "B")?;
    ctx.metric(rep, "fawn-ds", "log_bytes", s.log_bytes as f64, "B")?;
    // Log bytes beyond the records themselves (page-alignment padding), as a fraction.
    let record = (32 + key(0).len() + ctx.value_size).div_ceil(16) as u64 * 16;
    let unpadded = (32 + record * ctx.keys) as f64;
    ctx.metric(rep, "fawn-ds", "log_padding_overhead", s.log_bytes as f64 / unpadded - 1.0, "ratio")?;
    ctx.metric(rep, "fawn-ds", "index_capacity_slots", s.index_capacity as f64, "slots")?;
    // A refresh scan (once per doubling of the keys) reads the log; it allocates nothing.
    ctx.metric(rep, "fawn-ds", "index_migrating", f64::from(u8::from(s.index_migrating)), "bool")?;
    ctx.metric(rep, "fawn-ds", "index_stash_entries", s.index_stash as f64, "count")?;
    ctx.metric(rep, "fawn-ds", "index_growth_step_max_us", s.growth_step_max_us as f64, "us")
}

/// Random lookups of existing keys, each checked.
fn lookups(ctx: &Ctx, store: &DataStore, until: Until) -> Result<ParResult> {
    let n = ctx.keys;
    par::run(ctx.args.threads, until, ctx.args.seed, |rng| {
        let i = rng.gen_range(0..n);
        let entry = store.lookup(&key(i)).with_context(|| format!("looking up key {i}"))?;
        check_value(i, entry.as_ref().map(|e| e.value.as_slice()))
    })
}

fn report_lookups(ctx: &Ctx, rep: &mut Reporter, system: &str, name: &str, r: &ParResult) -> Result<()> {
    ctx.metric(rep, system, &format!("{name}_ops_per_s"), r.ops_per_s(), "ops/s")?;
    ctx.metric(rep, system, &format!("{name}_p50_us"), r.us(0.5), "us")?;
    ctx.metric(rep, system, &format!("{name}_p99_us"), r.us(0.99), "us")
}

/// Extra log reads per 1000 lookups, from the store's own counters over all lookups so far.
fn extra_reads(ctx: &Ctx, store: &DataStore, rep: &mut Reporter) -> Result<()> {
    let s = store.stats();
    let per_k = 1000.0 * s.extra_reads as f64 / s.lookups.max(1) as f64;
    ctx.metric(rep, "fawn-ds", "extra_reads_per_1000_lookups", per_k, "reads")?;
    ctx.metric(rep, "fawn-ds", "lookups_counted", s.lookups as f64, "count")
}

/// Close and reopen with the checkpoint, then again without it. Returns the reopened store.
fn restarts(ctx: &Ctx, store: DataStore, rep: &mut Reporter) -> Result<DataStore> {
    store.close().context("closing the datastore")?;
    let (store, took) = timed_open(ctx)?;
    ensure!(store.recovery_report().from_checkpoint, "reopen after close did not use the checkpoint");
    ctx.metric(rep, "fawn-ds", "restart_with_checkpoint_s", took, "s")?;
    store.close().context("closing the datastore")?;
    let ckpt = ctx.store_dir().join(CHECKPOINT_FILE);
    std::fs::remove_file(&ckpt).with_context(|| format!("removing {}", ckpt.display()))?;
    let (store, took) = timed_open(ctx)?;
    let report = store.recovery_report().clone();
    ensure!(!report.from_checkpoint, "reopen without a checkpoint file claims to use one");
    ctx.metric(rep, "fawn-ds", "restart_without_checkpoint_s", took, "s")?;
    ctx.metric(rep, "fawn-ds", "restart_records_replayed", report.records_replayed as f64, "count")?;
    ensure!(store.stats().live_keys == ctx.keys, "keys lost across restart");
    Ok(store)
}

fn timed_open(ctx: &Ctx) -> Result<(DataStore, f64)> {
    let start = Instant::now();
    let store = DataStore::open(&ctx.store_dir(), ctx.options()).context("reopening the datastore")?;
    Ok((store, start.elapsed().as_secs_f64()))
}

/// Lookups after evicting the log from the page cache, vs raw O_DIRECT 4 KiB reads of it.
fn device_reads(ctx: &Ctx, store: &DataStore, rep: &mut Reporter) -> Result<()> {
    let log = ctx.store_dir().join(LOG_FILE);
    let count = ctx.args.device_reads;
    raw::evict(&log)?;
    let cold = lookups(ctx, store, Until::Count(count))?;
    report_lookups(ctx, rep, "fawn-ds", "device_lookup", &cold)?;
    raw::evict(&log)?;
    let direct = raw::direct_random_reads(&log, ctx.args.threads, count, ctx.args.seed)?;
    report_lookups(ctx, rep, "raw", "direct_4k_read", &direct)?;
    ctx.metric(rep, "fawn-ds", "device_lookup_vs_raw", cold.ops_per_s() / direct.ops_per_s(), "ratio")
}

#[cfg(feature = "rocksdb")]
fn rocks(ctx: &Ctx, rep: &mut Reporter, fawn: &ParResult) -> Result<()> {
    let path = ctx.dir.join("rocksdb");
    let db = crate::rocks::Rocks::open(&path, ctx.args.sync)?;
    let mut tpl = template(ctx.value_size);
    let start = Instant::now();
    for i in 0..ctx.keys {
        db.put(&key(i), value_for(i, &mut tpl))?;
    }
    db.finish_load()?;
    let took = start.elapsed().as_secs_f64();
    ctx.metric(rep, "rocksdb", "bulk_insert_ops_per_s", ctx.keys as f64 / took, "ops/s")?;
    let n = ctx.keys;
    let until = Until::Elapsed(Duration::from_secs_f64(ctx.args.duration));
    let r = par::run(ctx.args.threads, until, ctx.args.seed, |rng| {
        let i = rng.gen_range(0..n);
        check_value(i, db.get(&key(i))?.as_deref())
    })?;
    report_lookups(ctx, rep, "rocksdb", "lookup", &r)?;
    ctx.metric(rep, "fawn-ds", "lookup_vs_rocksdb", fawn.ops_per_s() / r.ops_per_s(), "ratio")
}

#[cfg(not(feature = "rocksdb"))]
fn rocks(_: &Ctx, _: &mut Reporter, _: &ParResult) -> Result<()> {
    bail!("built without the `rocksdb` feature")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sync() {
        assert_eq!(parse_sync("never"), Ok(SyncPolicy::Never));
        assert_eq!(parse_sync("interval:50"), Ok(SyncPolicy::Interval(Duration::from_millis(50))));
        assert!(parse_sync("sometimes").is_err());
    }

    #[test]
    fn keys_are_the_formatted_ones() {
        for i in [0, 7, 42, 999_999_999_999, 1_000_000_000_000, u64::MAX] {
            assert_eq!(key(i), format!("fawnbench:{i:012}").into_bytes(), "{i}");
        }
    }
}
