//! A deterministic simulator of a small FAWN cluster: the pure replica state machines of
//! `fawn_kv::replica` for every range on every node, the manager's real membership state
//! machine (`fawn_kv::manager::state`) fed with the failures, restarts and sync reports the
//! simulator produces, clients with retries, and a network that delays, cuts connections
//! (losing what was in flight) and keeps each connection in order — all in one thread, on a
//! simulated clock, from one seed. Per seed it checks the client history for
//! linearizability, that every acknowledged write is in every in-chain replica, that the
//! replicas converge, that seqs never go back and that every configuration keeps a proven
//! replica in every range.

pub mod check;
pub mod disk;
pub mod world;

use std::panic::{catch_unwind, AssertUnwindSafe};

#[cfg(feature = "faults")]
pub use fawn_kv::frontend::cache::CacheFault;
#[cfg(feature = "faults")]
pub use fawn_kv::replica::machine::Fault;

/// The shape of one run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Back-end nodes: the cluster forms one range per node, each replicated on `replicas`.
    pub nodes: usize,
    /// Replicas per range (the replication factor).
    pub replicas: usize,
    pub clients: usize,
    pub ops_per_client: usize,
    /// Keys the clients share (few keys: more contention).
    pub keys: usize,
    /// Node crashes per run, at most.
    pub crashes_max: usize,
    /// Network partitions per run, at most (`world::partition`).
    pub partitions_max: usize,
    /// Nodes that join the running cluster under load, at most (`world::membership`): the
    /// ranges their virtual ids fall in are split once their chains are whole.
    pub joins_max: usize,
    /// Nodes that leave gracefully under load, at most (`world::membership`): replaced by
    /// syncs first, then the ranges around their virtual ids are merged.
    pub leaves_max: usize,
    /// Half the chain-only partitions cut one direction only: what the cut-off nodes send
    /// over chain links is lost, what they receive arrives (`world::partition`).
    pub one_way_partitions: bool,
    /// Crashes of three kinds (process: nothing lost; host: what was not synced lost from a
    /// random point on, the last write torn; disk: everything lost), a node that kept its logs
    /// registering as the back-end does. Off: every crash loses the node's data.
    pub disks: bool,
    /// When appended records become durable.
    pub sync: disk::SyncPolicy,
    /// With `disks`: request outcomes are not kept with their records, so a replica reopened
    /// after a crash starts with an empty dedup table. Off by default: each request's outcome
    /// appended with its record is kept with it, and a reopened replica rebuilds its table from
    /// what its log kept, as the back-end's FAWN-DS does (record tags). On, runs model a
    /// back-end without that, whose restarted range's last proven replica decides a retry
    /// again (`tests/last_replica_restarted_keeps_its_outcomes.rs`).
    pub volatile_outcomes: bool,
    /// With `disks`: now and then a node's disk is full for up to a second and refuses
    /// appends (a replica whose append failed asks for a resend each tick).
    pub full_disks: bool,
    /// A node that gets an update or a `Resend` of a newer configuration than it installed
    /// fetches and installs the current one first, and asks the update's sender to resend (the
    /// back-end's `check_chain_epoch`). Off: nodes learn configurations only from the
    /// manager's pushes, for the test of a fault this masks (`NoUnackedToNewSuccessor`); runs
    /// with joins and leaves need it (an update of a just split range may otherwise wait for a
    /// client's retry).
    pub catch_up: bool,
    /// Now and then a client's update attempt is slow and arrives after the client timed out
    /// on it, mostly once its operation ended (answered or given up) and its client's floor
    /// passed it (`world::clients`): the head must answer it from what it remembers or refuse
    /// it as stale, never apply it again.
    pub late_copies: bool,
    /// With `late_copies`: the percentage of update attempts that are slow.
    pub late_copy_percent: u32,
    /// How long replicas remember request outcomes, in microseconds of seq
    /// (`Replica::with_dedup_window`; default `world::DEDUP_WINDOW`, seconds instead of the
    /// back-end's minute, so that outcomes also go by the window in longer runs).
    pub dedup_window: u64,
    /// Each interval sync of a datastore compacts it (`MemStore::compact`): superseded
    /// records and deletes at or below the replica's acknowledged seq are dropped, raising the
    /// drop floor a suffix sync is judged by. Off by default: the runs of other shapes keep
    /// their schedules.
    pub compaction: bool,
    /// Clients reach the chains through one front-end with the real query cache
    /// (`world::frontend`); off: clients send to heads and tails themselves.
    pub frontend_cache: bool,
    /// Print every event and a failing key's history to stderr.
    pub trace: bool,
    /// A fault switched on in every replica.
    #[cfg(feature = "faults")]
    pub fault: Option<Fault>,
    /// A fault switched on in the front-end's cache.
    #[cfg(feature = "faults")]
    pub cache_fault: Option<CacheFault>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            nodes: 4,
            replicas: 3,
            clients: 4,
            ops_per_client: 40,
            keys: 4,
            crashes_max: 3,
            partitions_max: 2,
            joins_max: 1,
            leaves_max: 1,
            one_way_partitions: true,
            catch_up: true,
            disks: true,
            full_disks: true,
            volatile_outcomes: false,
            sync: disk::SyncPolicy::Interval(100_000),
            frontend_cache: false,
            late_copies: true,
            late_copy_percent: 2,
            dedup_window: world::DEDUP_WINDOW,
            compaction: false,
            trace: false,
            #[cfg(feature = "faults")]
            fault: None,
            #[cfg(feature = "faults")]
            cache_fault: None,
        }
    }
}

impl Config {
    /// Every crash loses the node's data: the default shape before disks (process, host and
    /// disk crashes, full disks, outcomes kept with records) were.
    pub fn memory_only() -> Config {
        Config { disks: false, full_disks: false, volatile_outcomes: true, ..Config::default() }
    }

    /// The memory-only shape without joins, leaves, one-way partitions and late copies: the
    /// shape the earlier regression seeds were found in, which they replay.
    pub fn fixed_members() -> Config {
        Config {
            joins_max: 0,
            leaves_max: 0,
            one_way_partitions: false,
            late_copies: false,
            ..Config::memory_only()
        }
    }
}

/// What one seed found: nothing when all checks pass.
#[derive(Debug)]
pub struct SeedResult {
    pub seed: u64,
    pub violations: Vec<String>,
    pub stats: world::Stats,
}

/// Runs one seed. A panic (an invariant assertion in a replica) counts as a violation.
pub fn run_seed(seed: u64, cfg: &Config) -> SeedResult {
    let cfg = cfg.clone();
    match catch_unwind(AssertUnwindSafe(|| world::World::new(seed, cfg).run())) {
        Ok(r) => SeedResult { seed, violations: r.violations, stats: r.stats },
        Err(e) => {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            SeedResult { seed, violations: vec![format!("panic: {msg}")], stats: world::Stats::default() }
        }
    }
}

/// Runs seeds `0..seeds` in `cfg` for a bounded test: panics listing the failing ones, a line
/// each (`seed S: violations`), else returns what every run did.
pub fn run_bounded(seeds: u64, cfg: &Config) -> Vec<world::Stats> {
    let mut failing = Vec::new();
    let mut stats = Vec::new();
    for r in (0..seeds).map(|seed| run_seed(seed, cfg)) {
        if !r.violations.is_empty() {
            failing.push(format!("seed {}: {}", r.seed, r.violations.join("; ")));
        }
        stats.push(r.stats);
    }
    assert!(failing.is_empty(), "{} of {seeds} seeds failed:\n{}", failing.len(), failing.join("\n"));
    stats
}

/// Runs `seed` in `cfg` for a replay test: panics with its violations if it has any, else
/// returns what it did (for the test to check the seed still runs its scenario).
pub fn replay(seed: u64, cfg: &Config) -> world::Stats {
    let r = run_seed(seed, cfg);
    assert!(r.violations.is_empty(), "seed {seed}: {}", r.violations.join("; "));
    r.stats
}

/// Whether `seed` in `cfg` fails with `fault` switched on: a replay test's proof that its
/// seed still runs the scenario the rule it guards is for (schedules change with the code).
#[cfg(feature = "faults")]
pub fn fails_with(seed: u64, cfg: &Config, fault: Fault) -> bool {
    !run_seed(seed, &Config { fault: Some(fault), ..cfg.clone() }).violations.is_empty()
}

/// A fault by its name as printed by `{:?}` (`ForgetDedupOnPromotion`, ...).
#[cfg(feature = "faults")]
pub fn fault_named(name: &str) -> Option<Fault> {
    Fault::ALL.into_iter().find(|f| format!("{f:?}") == name)
}

/// A front-end cache fault by its name as printed by `{:?}` (`KeepsItemOnUpdate`, ...).
#[cfg(feature = "faults")]
pub fn cache_fault_named(name: &str) -> Option<CacheFault> {
    CacheFault::ALL.into_iter().find(|f| format!("{f:?}") == name)
}
