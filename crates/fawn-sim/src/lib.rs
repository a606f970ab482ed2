//! A deterministic simulator of one FAWN range's chain: the pure replica state machines of
//! `fawn_kv::replica`, a manager that drops failed nodes and re-adds restarted ones, clients
//! with retries, and a network that delays, cuts connections (losing what was in flight) and
//! keeps each connection in order — all in one thread, on a simulated clock, from one seed.
//! Per seed it checks the client history for linearizability, that every acknowledged write
//! is in every in-chain replica, that the replicas converge and that seqs never go back.

pub mod check;
pub mod world;

use std::panic::{catch_unwind, AssertUnwindSafe};

#[cfg(feature = "faults")]
pub use fawn_kv::replica::machine::Fault;

/// The shape of one run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Replicas in the chain at the start.
    pub replicas: usize,
    pub clients: usize,
    pub ops_per_client: usize,
    /// Keys the clients share (few keys: more contention).
    pub keys: usize,
    /// Node crashes per run, at most.
    pub crashes_max: usize,
    /// Print every event and a failing key's history to stderr.
    pub trace: bool,
    /// A fault switched on in every replica.
    #[cfg(feature = "faults")]
    pub fault: Option<Fault>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            replicas: 3,
            clients: 4,
            ops_per_client: 40,
            keys: 3,
            crashes_max: 3,
            trace: false,
            #[cfg(feature = "faults")]
            fault: None,
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

/// A fault by its name as printed by `{:?}` (`ForgetDedupOnPromotion`, ...).
#[cfg(feature = "faults")]
pub fn fault_named(name: &str) -> Option<Fault> {
    Fault::ALL.into_iter().find(|f| format!("{f:?}") == name)
}
