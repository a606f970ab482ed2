//! `fawn-sim --seeds N [--seed S]`: runs seeds S..S+N, prints one line per failing seed (enough
//! to replay it with `--seeds 1 --seed S`) and a summary.

use std::time::Instant;

use clap::Parser;

#[derive(Parser)]
#[command(about = "Deterministic simulation of a FAWN cluster under faults")]
struct Args {
    /// How many seeds to run.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Back-end nodes (one range per node).
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Replicas per range.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Keys the clients share.
    #[arg(long, default_value_t = 4)]
    keys: usize,
    /// Node crashes per run, at most.
    #[arg(long, default_value_t = 3)]
    crashes: usize,
    /// Network partitions per run, at most.
    #[arg(long, default_value_t = 2)]
    partitions: usize,
    /// Nodes joining under load per run, at most (each join splits the ranges its virtual id
    /// falls in).
    #[arg(long, default_value_t = 1)]
    joins: usize,
    /// Nodes leaving gracefully under load per run, at most (each leave merges ranges back).
    #[arg(long, default_value_t = 1)]
    leaves: usize,
    /// Half the chain-only partitions drop one direction only (`--one-way-partitions false`:
    /// every partition cuts both ways).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    one_way_partitions: bool,
    /// Now and then a client's update attempt is slow and arrives after the client timed out
    /// on it, mostly below its client's floor by then (`--late-copies false`: never).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    late_copies: bool,
    /// The percentage of update attempts that are slow, with `--late-copies`
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=100))]
    late_copy_percent: u32,
    /// Nodes learn configurations only from the manager's pushes, not by catching up when a
    /// chain message of a newer epoch arrives.
    #[arg(long)]
    no_catch_up: bool,
    /// Every crash loses the node's data (default: crashes of three kinds, process, host and
    /// disk, over datastores synced every 100 ms, a host crash losing what was not synced).
    #[arg(long)]
    no_disks: bool,
    /// No disks that fill up for a while and refuse appends.
    #[arg(long)]
    no_full_disks: bool,
    /// Request outcomes not kept with their records (default: kept and rebuilt at a restart,
    /// as the back-end's FAWN-DS keeps them in record tags).
    #[arg(long)]
    volatile_outcomes: bool,
    /// Each interval sync compacts the datastores: superseded records and old deletes
    /// dropped, which a suffix sync must notice.
    #[arg(long)]
    compaction: bool,
    /// Clients go through one front-end with the real query cache (gets served from it,
    /// updates and `Committed` notices invalidating it).
    #[arg(long)]
    frontend_cache: bool,
    /// Operations per client.
    #[arg(long, default_value_t = 40)]
    ops: usize,
    /// Print each seed's counts (operations, answered, events, crashes, cuts).
    #[arg(long)]
    verbose: bool,
    /// Print every event of the run, and a failing key's history (use with one seed).
    #[arg(long)]
    trace: bool,
    /// Re-introduce a known fault of the replica or of the front-end's cache (builds with
    /// `--features faults` only).
    #[cfg(feature = "faults")]
    #[arg(long)]
    fault: Option<String>,
}

fn main() {
    let args = Args::parse();
    #[allow(unused_mut)]
    let mut cfg = fawn_sim::Config {
        nodes: args.nodes,
        replicas: args.replicas,
        keys: args.keys,
        ops_per_client: args.ops,
        trace: args.trace,
        crashes_max: args.crashes,
        partitions_max: args.partitions,
        joins_max: args.joins,
        leaves_max: args.leaves,
        one_way_partitions: args.one_way_partitions,
        disks: !args.no_disks,
        full_disks: !args.no_full_disks,
        catch_up: !args.no_catch_up,
        volatile_outcomes: args.volatile_outcomes,
        frontend_cache: args.frontend_cache,
        late_copies: args.late_copies,
        late_copy_percent: args.late_copy_percent,
        compaction: args.compaction,
        ..Default::default()
    };
    #[cfg(feature = "faults")]
    if let Some(name) = &args.fault {
        match (fawn_sim::fault_named(name), fawn_sim::cache_fault_named(name)) {
            (Some(f), _) => cfg.fault = Some(f),
            // A cache fault needs the front-end's cache.
            (None, Some(f)) => (cfg.cache_fault, cfg.frontend_cache) = (Some(f), true),
            (None, None) => {
                eprintln!("unknown fault {name}");
                std::process::exit(2);
            }
        }
    }
    let started = Instant::now();
    let mut bad = 0u64;
    for seed in args.seed..args.seed + args.seeds {
        let r = fawn_sim::run_seed(seed, &cfg);
        if args.verbose {
            eprintln!("seed {seed}: {:?}", r.stats);
        }
        if !r.violations.is_empty() {
            bad += 1;
            println!("seed {seed}: {}", r.violations.join("; "));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!("{:.0} seeds/min", args.seeds as f64 * 60.0 / secs.max(1e-9));
    println!("{} seeds, {bad} violations", args.seeds);
    if bad > 0 {
        std::process::exit(1);
    }
}
