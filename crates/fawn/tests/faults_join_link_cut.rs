//! Guards a cut link between a tail and its syncing replica during a join (a
//! partition between two chain neighbours must not break linearizability, and the tail keeps
//! no unacknowledged updates for a syncing replica, so the tail's own stall check never sees
//! it). A fourth back-end joins a 3-node R=3 cluster under the mixed load while its links to
//! every tail it must copy from are cut (blackhole routes both ways, set before it starts:
//! network namespaces, needs root; it still reaches the manager and the front-ends). Cutting
//! all of them keeps the joiner out of every chain while the cuts last, so the only link
//! between it and a source is the sync's: a cut found through a chain in which the two are
//! neighbours (the older stall check) cannot stand in for the one under test. The joiner
//! notices its silent sources, probes them and reports the cuts; the manager must drop its
//! syncs within `LINK_STALL + LINK_REPAIR_AFTER + REPAIR_SLACK` of its registration and start
//! none across the cuts while they last. After the heal the join is retried and must complete
//! within `JOIN_MAX`. Every run: the history is linearizable and the final scan finds every
//! acknowledged write.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::history::{run_scenario, FaultCtx, Scenario};
use fawn_kv::backend::{LINK_REPAIR_AFTER, LINK_STALL};
use fawn_proto::native::{ClusterConfig, NodeState, RangeConfig};
use fawn_ring::Ring;

/// The joiner's id.
const JOINER: u32 = 3;
/// Registration to repair: the source silent for `LINK_STALL`, then `LINK_REPAIR_AFTER` with a
/// failed probe, plus slack for the 300 ms tick, the probe's 1 s time-out and the manager's
/// ping of the source.
const REPAIR_SLACK: Duration = Duration::from_secs(4);
/// Heal to a complete join: the manager forgets a cut 3 s after its last report, then the
/// syncs run (small data) and the old tails step down.
const JOIN_MAX: Duration = Duration::from_secs(30);

/// Ranges the ring with the joiner prefers it for, by their current tail.
fn join_sources(config: &ClusterConfig) -> BTreeSet<u32> {
    let mut nodes: Vec<u32> = config.backends.iter().map(|b| b.node).collect();
    nodes.push(JOINER);
    let ring = Ring::new(&nodes, config.vnodes, config.replicas);
    config
        .ranges
        .iter()
        .filter(|rc| ring.chain(rc.range.end_inclusive).contains(JOINER))
        .filter_map(|rc| rc.tail())
        .collect()
}

/// Ranges that sync the joiner from one of `sources`.
fn syncing_across(config: &ClusterConfig, sources: &[u32]) -> usize {
    let across =
        |rc: &&RangeConfig| rc.tail().is_some_and(|t| sources.contains(&t)) && rc.syncing.contains(&JOINER);
    config.ranges.iter().filter(across).count()
}

/// Whether the join is complete: the joiner is in the chain of every range the ring prefers it
/// for, and nothing syncs.
fn joined(config: &ClusterConfig) -> bool {
    let nodes: Vec<u32> =
        config.backends.iter().filter(|b| b.state == NodeState::Alive).map(|b| b.node).collect();
    let ring = Ring::new(&nodes, config.vnodes, config.replicas);
    nodes.contains(&JOINER)
        && config.ranges.iter().all(|rc| {
            rc.syncing.is_empty()
                && (!ring.chain(rc.range.end_inclusive).contains(JOINER) || rc.chain.contains(&JOINER))
        })
}

/// Polls the manager's configuration until `done` holds or `limit` passes; the time it took.
fn wait_for(f: &mut FaultCtx, limit: Duration, done: impl Fn(&ClusterConfig) -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f.procs.config().is_some_and(|c| done(&c)) {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn join_with_its_link_to_a_source_tail_cut() {
    let mut sc = Scenario::new("faults_join_link_cut");
    sc.shape.netns = true;
    sc.cooldown = Duration::from_secs(3);
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let fails = failures.clone();
    let repair_max = LINK_STALL + LINK_REPAIR_AFTER + REPAIR_SLACK;
    run_scenario(&sc, &[901], move |f| {
        let fail = |f: &mut FaultCtx, msg: String| {
            f.note(msg.clone());
            fails.lock().expect("lock").push(msg);
        };
        let config = f.procs.config().expect("the manager answers");
        let sources: Vec<u32> = join_sources(&config).into_iter().collect();
        assert!(!sources.is_empty(), "the joiner would hold no range: {config:?}");
        for &source in &sources {
            f.procs.cut(JOINER, source);
            f.note(format!("cut backend-{JOINER} <-> backend-{source} (a tail it must copy from)"));
        }
        f.pause_ms(0, 500);
        f.procs.start_new_backend(JOINER);
        f.note(format!("start backend-{JOINER} (join)"));
        let registered =
            wait_for(f, Duration::from_secs(20), |c| c.backends.iter().any(|b| b.node == JOINER));
        if registered.is_none() {
            fail(f, format!("backend-{JOINER} did not register"));
            return;
        }
        let stuck = f.procs.config().map_or(0, |c| syncing_across(&c, &sources));
        f.note(format!("registered; {stuck} range(s) sync backend-{JOINER} across a cut"));
        match wait_for(f, repair_max, |c| syncing_across(c, &sources) == 0) {
            Some(took) => f.note(format!(
                "repaired {} ms after registration: no sync across the cut",
                took.as_millis()
            )),
            None => fail(
                f,
                format!(
                    "the manager did not drop the syncs of backend-{JOINER} across the cuts within {repair_max:?} of the join (cut not detected or not repaired)"
                ),
            ),
        }
        // While the cut lasts, nothing syncs across it again.
        let hold_end = Instant::now() + Duration::from_secs(3);
        while Instant::now() < hold_end {
            if f.procs.config().is_some_and(|c| syncing_across(&c, &sources) > 0) {
                fail(f, format!("a sync started across a cut link of backend-{JOINER}"));
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for &source in &sources {
            f.procs.heal(JOINER, source);
            f.note(format!("heal backend-{JOINER} <-> backend-{source}"));
        }
        match wait_for(f, JOIN_MAX, joined) {
            Some(took) => f.note(format!("join complete {} ms after the heal", took.as_millis())),
            None => fail(f, format!("the join did not complete within {JOIN_MAX:?} after the heal")),
        }
    });
    let failures = failures.lock().expect("lock");
    assert!(failures.is_empty(), "join with a cut link:\n{}", failures.join("\n"));
}
