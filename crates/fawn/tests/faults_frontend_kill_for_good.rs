//! Guards front-end failover: with two front-ends and three managers under the mixed load (native clients, and
//! memcached clients on each front-end), front-end 1 is killed with kill -9 and never comes
//! back. The manager declares it dead and lends its wedge to front-end 0. The survivor's
//! clients (native, and memcached through front-end 0) must reach every key again: from one
//! second after the wedge moved none of their operations fails. Every run: the history is
//! linearizable and the final scan, through the survivor, finds every acknowledged write.
//! The killed process's ports refuse connections, so the wedge must move well before the 2 s
//! heartbeat silence (a timing goal, `common::timing_goal`): the survivor, refused when it
//! forwards, tells the manager group, whose leader finds the ports refusing too.
//! Prints the longest time the survivor's clients went without an acknowledgement, and their
//! errors. Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use std::time::{Duration, Instant};

use common::history::{gap_and_errors, run_scenario, Entry, Outcome, Protocol, Scenario};

/// The dead front-end.
const DEAD: usize = 1;
/// How long after the wedge moved the survivor's clients may still fail (a native client
/// refreshes its configuration only after an attempt at the dead front-end fails).
const SETTLE_AFTER_MOVE: Duration = Duration::from_secs(1);
/// The wedge of a front-end whose ports refuse connections moves within this of the kill:
/// half the silence after which a front-end is declared dead otherwise.
const MOVED_WITHIN: Duration = Duration::from_secs(1);

#[test]
fn frontend_killed_for_good_lends_its_wedge() {
    let mut sc = Scenario::new("faults_frontend_kill_for_good");
    sc.shape.frontends = 2;
    sc.shape.managers = 3;
    sc.cooldown = Duration::from_secs(3);
    let clients = sc.workload.clients;
    let protocols = sc.workload.protocols.clone();
    let survivor = |e: &Entry| {
        let slot = e.client % clients;
        protocols[slot as usize % protocols.len()] != Protocol::Memcached(DEAD)
    };
    // Per seed: from the first fault to the wedge's move.
    let mut moved_after = Vec::new();
    let reports = run_scenario(&sc, &[2301], |f| {
        let start = Instant::now();
        f.procs.kill_frontend(DEAD);
        f.note(format!("kill -9 frontend-{DEAD} for good"));
        f.procs.wait_config("the dead front-end's wedge is lent to front-end 0", |c| {
            c.wedge_server(DEAD as u32) == 0
        });
        moved_after.push(start.elapsed());
        f.note(format!(
            "wedge {DEAD} served by frontend-0 ({} ms after the kill)",
            start.elapsed().as_millis()
        ));
        f.pause_ms(3000, 4000);
    });
    let mut late_failures = Vec::new();
    for (r, moved) in reports.iter().zip(&moved_after) {
        let ours: Vec<Entry> = r.history.iter().filter(|e| survivor(e)).cloned().collect();
        let (from, to) = r.fault_window;
        let (gap, errors) = gap_and_errors(&ours, from, to);
        let settled = from + (*moved + SETTLE_AFTER_MOVE).as_nanos() as u64;
        let late: Vec<&Entry> = ours
            .iter()
            .filter(|e| e.call >= settled && e.call <= to && !matches!(e.outcome, Outcome::Ok(_)))
            .collect();
        eprintln!(
            "seed {}: wedge moved {} ms after the kill; survivor's clients: longest gap {} ms, {errors} operations failed from the kill on, {} from {} ms after the move on",
            r.seed,
            moved.as_millis(),
            gap.as_millis(),
            late.len(),
            SETTLE_AFTER_MOVE.as_millis()
        );
        if !late.is_empty() {
            late_failures.push(format!("seed {}: {late:?}", r.seed));
        }
    }
    let slow: Vec<u128> = moved_after.iter().filter(|m| **m > MOVED_WITHIN).map(|m| m.as_millis()).collect();
    common::timing_goal(
        slow.is_empty(),
        &format!(
            "the refused front-end's wedge moved {slow:?} ms after the kill, not within {} ms",
            MOVED_WITHIN.as_millis()
        ),
    );
    assert!(
        late_failures.is_empty(),
        "the survivor's clients still failed after the wedge moved:\n{}",
        late_failures.join("\n")
    );
}
