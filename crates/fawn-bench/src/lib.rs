//! `fawn bench`: the load generator, peer comparisons and FAWN-DS engine benchmarks.
//!
//! Results are JSON lines on stdout, each with at least `scenario, system, metric, value, unit`
//! (plus `params`, the workload), optionally appended to a CSV file too; progress goes to stderr.
//!
//! * `memcached` / `redis`: drive one running server (any memcached-protocol server, e.g. a FAWN
//!   front-end, or any Redis) with a configurable workload ([`workload::WorkloadArgs`]).
//! * `native`: the same workloads through the Rust client (`fawn-client`) over the native protocol.
//! * `peers`: start Debian's memcached and redis-server on loopback, run the same workload against
//!   each (and against `--fawn ADDR`), and report ratios to memcached.
//! * `ds`: FAWN-DS engine benchmarks (random lookups, bulk insert vs raw sequential write, index
//!   bytes per key, extra reads, restart time, device-bound reads vs raw O_DIRECT reads, and
//!   RocksDB with the `rocksdb` feature).
//! * `files`: semi-random writes into 1..N datastores vs N raw files (Figure 9).
//! * `device`: the raw device under a directory with O_DIRECT (sequential MB/s, random 4 KiB IOPS).
//! * `failover`: clients' gaps and errors while managers freeze and a front-end dies.
//! * `report`: regenerate the tables of `docs/BENCHMARKS.md` from the kept result lines.
//!
//! The `fawn` binary embeds this as `fawn bench` through [`BenchArgs`] and [`run`].

use std::path::PathBuf;

use anyhow::{Context, Result};

pub mod cluster;
pub mod device;
pub mod distance;
pub mod ds;
pub mod failover;
pub mod files;
pub mod keydist;
pub mod launch;
pub mod loadgen;
pub mod maint;
mod memory;
pub mod native;
pub mod netbench;
pub mod output;
pub mod paper;
mod par;
pub mod plot;
mod progress;
pub mod proto;
mod raw;
pub mod report;
#[cfg(feature = "rocksdb")]
mod rocks;
pub mod servers;
pub mod workload;

/// Arguments of `fawn bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Append the JSON result lines to this file instead of printing them on stdout.
    #[arg(long, global = true)]
    pub out: Option<PathBuf>,
    /// Also append every result to this CSV file (header written if the file is new).
    #[arg(long, global = true)]
    pub csv: Option<PathBuf>,
    /// Do not print the progress line on stderr.
    #[arg(long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// What to benchmark.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum BenchCommand {
    /// Drive a running memcached-protocol server (memcached, a FAWN front-end, ...).
    Memcached(netbench::TargetArgs),
    /// Drive a running Redis server (RESP protocol).
    Redis(netbench::TargetArgs),
    /// Drive a FAWN cluster through the Rust client over the native protocol.
    Native(native::NativeArgs),
    /// Start memcached and redis-server on loopback and run the same workload against each
    /// (and against a FAWN endpoint given with --fawn); report ratios to memcached.
    Peers(netbench::PeersArgs),
    /// FAWN-DS engine benchmarks beside their baselines (raw I/O, RocksDB with --rocksdb).
    Ds(ds::DsArgs),
    /// The device under a directory, with O_DIRECT: sequential MB/s and random 4 KiB IOPS
    /// (the paper's Table 1).
    Device(device::DeviceArgs),
    /// Semi-random writes: the same bytes appended round-robin into 1..N datastores vs N raw
    /// files (the paper's Figure 9).
    Files(files::FilesArgs),
    /// Cluster benchmarks against clusters this command starts: throughput and latency
    /// (memcached protocol and native), R = 1 vs R = 3, one back-end vs local, vs memcached.
    Cluster(cluster::ClusterArgs),
    /// FAWN-DS maintenance under load: gets during split/merge/compact (Figure 14),
    /// lock hold times, write amplification, put-fraction sweep with compaction (Figure 10).
    Maint(maint::MaintArgs),
    /// Throughput vs concurrency with 0/1/5 ms between front-end and back-ends (netns + netem
    /// when the kernel has it, else a delay proxy).
    Distance(distance::DistanceArgs),
    /// The control plane failing under load: each manager of a 3-manager group frozen in
    /// turn (SIGSTOP), then a front-end killed for good; the longest gap and the errors
    /// clients saw.
    Failover(failover::FailoverArgs),
    /// The paper's evaluation end to end (Tables 1-3, Figures 9-15, failure timing): JSON, CSV
    /// and SVG plots in --out-dir.
    Paper(paper::PaperArgs),
    /// Regenerate the marked tables of docs/BENCHMARKS.md from the result files in docs/results
    /// (`--check`: fail if any is stale instead).
    Report(report::ReportArgs),
}

/// Run `fawn bench` with parsed arguments.
pub fn run(args: BenchArgs) -> Result<()> {
    let mut rep = output::Reporter::new(args.out.clone(), args.csv.clone())?;
    match &args.command {
        BenchCommand::Memcached(t) => {
            let rt = runtime(t.workload.client_threads)?;
            netbench::run_target(&rt, t, proto::Protocol::Memcached, args.quiet, &mut rep)
        }
        BenchCommand::Redis(t) => {
            let rt = runtime(t.workload.client_threads)?;
            netbench::run_target(&rt, t, proto::Protocol::Redis, args.quiet, &mut rep)
        }
        BenchCommand::Native(n) => {
            let rt = runtime(n.workload.client_threads)?;
            native::run(&rt, n, args.quiet, &mut rep)
        }
        BenchCommand::Peers(p) => {
            let rt = runtime(p.workload.client_threads)?;
            netbench::run_peers(&rt, p, args.quiet, &mut rep)
        }
        BenchCommand::Ds(d) => ds::run(d, args.quiet, &mut rep),
        BenchCommand::Device(d) => device::run(d, args.quiet, &mut rep),
        BenchCommand::Files(f) => files::run(f, args.quiet, &mut rep),
        BenchCommand::Cluster(c) => cluster::run(c, args.quiet, &mut rep),
        BenchCommand::Paper(p) => paper::run(p, args.quiet),
        BenchCommand::Distance(d) => distance::run(d, args.quiet, &mut rep),
        BenchCommand::Maint(m) => maint::run(m, args.quiet, &mut rep),
        BenchCommand::Failover(f) => failover::run(f, args.quiet, &mut rep),
        BenchCommand::Report(r) => report::run(r),
    }
}

/// A multi-threaded runtime with few workers: the load generator must leave cores to the server.
pub(crate) fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}
