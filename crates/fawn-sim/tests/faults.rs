//! Guards the simulator's teeth: each fault re-introduced in the replica state machine or in
//! the front-end's query cache is found within a bounded number of seeds (seeds that pass
//! without the fault only).
#![cfg(feature = "faults")]

use fawn_sim::{run_seed, CacheFault, Config, Fault};

/// Each fault must be found among this many seeds.
const SEEDS_MAX: u64 = 2_000;

fn seeds_to_find(fault: Fault, clean: Config) -> Option<u64> {
    let faulty = Config { fault: Some(fault), ..clean.clone() };
    first_found(&faulty, &clean)
}

fn first_found(faulty: &Config, clean: &Config) -> Option<u64> {
    (0..SEEDS_MAX).find(|seed| {
        !run_seed(*seed, faulty).violations.is_empty() && run_seed(*seed, clean).violations.is_empty()
    })
}

fn found(fault: Fault) {
    found_with(fault, Config { crashes_max: 1, ..Config::default() });
}

/// As `found`, in runs shaped by `cfg` (some faults need two failures or more).
fn found_with(fault: Fault, cfg: Config) {
    match seeds_to_find(fault, cfg) {
        Some(seed) => eprintln!("{fault:?}: found at seed {seed} ({} seeds)", seed + 1),
        None => panic!("{fault:?} not found in {SEEDS_MAX} seeds"),
    }
}

#[test]
fn a_head_that_forgets_dedup_after_failover_is_found() {
    found(Fault::ForgetDedupOnPromotion);
}

#[test]
fn unacked_updates_not_resent_to_a_new_successor_are_found() {
    // Since a restarted node resyncs instead of resuming, one crash rarely leaves a middle
    // with unacknowledged updates for a new successor: up to three give a margin.
    found_with(Fault::NoUnackedToNewSuccessor, Config { crashes_max: 3, ..Config::default() });
}

#[test]
fn a_tail_that_serves_gets_before_it_caught_up_is_found() {
    found(Fault::TailReadsBeforeCaughtUp);
}

#[test]
fn applying_across_a_gap_is_found() {
    found(Fault::ApplyAcrossGap);
}

#[test]
fn an_old_tail_that_confirms_catch_up_before_stepping_down_is_found() {
    found(Fault::CaughtUpFromOldTail);
}

#[test]
fn resent_updates_without_their_request_outcomes_are_found() {
    // A retry decided twice needs a replica that got the update by resend to become head
    // later: two failures or more.
    found_with(Fault::NoOutcomesWithResend, Config { crashes_max: 3, ..Config::default() });
}

#[test]
fn a_new_tail_taken_for_a_copy_before_it_caught_up_is_found() {
    // An acknowledged write lost needs a chain shrunk to one node (no spare node to
    // re-replicate on: as many nodes as replicas), a restarted node synced behind it, and
    // that node's failure: two crashes or more, and enough writes to fall in the window.
    let cfg = Config { nodes: 3, replicas: 3, crashes_max: 3, ops_per_client: 80, ..Config::default() };
    found_with(Fault::TailReadyBeforeCaughtUp, cfg);
}

#[test]
fn a_copy_taken_though_its_appends_failed_is_found() {
    // Needs a disk that fills up while its node syncs a range.
    let cfg = Config { disks: true, full_disks: true, ..Config::default() };
    found_with(Fault::IncompleteCopyAccepted, cfg);
}

/// A front-end cache fault, in runs through the cached front-end with one crash at most.
fn cache_fault_found(fault: CacheFault) {
    let clean = Config { crashes_max: 1, frontend_cache: true, ..Config::default() };
    let faulty = Config { cache_fault: Some(fault), ..clean.clone() };
    match first_found(&faulty, &clean) {
        Some(seed) => eprintln!("{fault:?}: found at seed {seed} ({} seeds)", seed + 1),
        None => panic!("{fault:?} not found in {SEEDS_MAX} seeds"),
    }
}

#[test]
fn a_front_end_cache_that_keeps_an_item_across_an_update_is_found() {
    cache_fault_found(CacheFault::KeepsItemOnUpdate);
}

#[test]
fn a_front_end_cache_filled_by_a_read_that_raced_an_update_is_found() {
    cache_fault_found(CacheFault::FillsDuringUpdates);
}
