//! Guards the simulator's teeth: each fault re-introduced in the replica state machine or in
//! the front-end's query cache is found within a bounded number of seeds (seeds that pass
//! without the fault only).
#![cfg(feature = "faults")]

use fawn_sim::{run_seed, CacheFault, Config, Fault};

/// Each fault must be found among this many seeds.
const SEEDS_MAX: u64 = 2_000;

/// Requires `faulty` to fail a seed that `clean` passes among the first `SEEDS_MAX`; `name`
/// is the fault's, for the messages.
fn first_found(name: &str, faulty: &Config, clean: &Config) {
    let found = (0..SEEDS_MAX).find(|seed| {
        !run_seed(*seed, faulty).violations.is_empty() && run_seed(*seed, clean).violations.is_empty()
    });
    match found {
        Some(seed) => eprintln!("{name}: found at seed {seed} ({} seeds)", seed + 1),
        None => panic!("{name} not found in {SEEDS_MAX} seeds"),
    }
}

/// In runs whose crashes all lose the node's data (the shape the faults were first sought in).
fn found(fault: Fault) {
    found_with(fault, Config { crashes_max: 1, ..Config::memory_only() });
}

/// As `found`, in runs shaped by `cfg` (some faults need two failures or more).
fn found_with(fault: Fault, cfg: Config) {
    first_found(&format!("{fault:?}"), &Config { fault: Some(fault), ..cfg.clone() }, &cfg);
}

#[test]
fn a_head_that_forgets_dedup_after_failover_is_found() {
    found(Fault::ForgetDedupOnPromotion);
}

#[test]
fn unacked_updates_not_resent_to_a_new_successor_are_found() {
    // Since a restarted node resyncs instead of resuming, one crash rarely leaves a middle
    // with unacknowledged updates for a new successor: up to three give a margin. The
    // back-end's catch-up masks this fault in the simulated interleavings: the new successor's
    // `Resend` of the new epoch makes the middle install it and resend before it could forget
    // to send them; so the fault is sought with nodes that learn configurations only from the
    // manager's pushes.
    found_with(
        Fault::NoUnackedToNewSuccessor,
        Config { crashes_max: 3, catch_up: false, ..Config::memory_only() },
    );
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
    // The promoted tail asks its predecessor for a resend in the epoch that promoted it, and
    // the back-end's catch-up makes the old tail install that epoch, and step down, before it
    // answers: the fault is masked. (A syncing replica once caught up by such resends, whose
    // `CaughtUp` could arrive after its promotion; it now syncs by a snapshot stream.) So
    // the fault is sought with nodes that learn configurations only from the manager's
    // pushes.
    found_with(
        Fault::CaughtUpFromOldTail,
        Config { crashes_max: 1, catch_up: false, ..Config::memory_only() },
    );
}

#[test]
fn resent_updates_without_their_request_outcomes_are_found() {
    // A retry decided twice needs a replica that got the update by resend to become head
    // later: two failures or more.
    found_with(Fault::NoOutcomesWithResend, Config { crashes_max: 3, ..Config::memory_only() });
}

#[test]
fn a_new_tail_taken_for_a_copy_before_it_caught_up_is_found() {
    // An acknowledged write lost needs a chain shrunk to one node (no spare node to
    // re-replicate on: as many nodes as replicas), a restarted node synced behind it, and
    // that node's failure: two crashes or more, and enough writes to fall in the window.
    let cfg = Config { nodes: 3, replicas: 3, crashes_max: 3, ops_per_client: 80, ..Config::memory_only() };
    found_with(Fault::TailReadyBeforeCaughtUp, cfg);
}

#[test]
fn a_copy_taken_though_its_appends_failed_is_found() {
    // Needs a disk that fills up while its node syncs a range (the default shape has them).
    let cfg = Config::default();
    found_with(Fault::IncompleteCopyAccepted, cfg);
}

#[test]
fn a_split_or_merge_heir_that_forgets_its_parents_requests_is_found() {
    // Needs a split or merge (a join or a leave) between an update's ordering and its retry.
    let cfg = Config { crashes_max: 1, joins_max: 1, leaves_max: 1, ..Config::memory_only() };
    found_with(Fault::HeirForgetsRequests, cfg);
}

/// A front-end cache fault, in runs through the cached front-end with one crash at most.
fn cache_fault_found(fault: CacheFault) {
    let clean = Config { crashes_max: 1, frontend_cache: true, ..Config::memory_only() };
    first_found(&format!("{fault:?}"), &Config { cache_fault: Some(fault), ..clean.clone() }, &clean);
}

#[test]
fn a_front_end_cache_that_keeps_an_item_across_an_update_is_found() {
    cache_fault_found(CacheFault::KeepsItemOnUpdate);
}

#[test]
fn a_front_end_cache_filled_by_a_read_that_raced_an_update_is_found() {
    cache_fault_found(CacheFault::FillsDuringUpdates);
}

#[test]
fn a_head_that_orders_a_stale_copy_again_is_found() {
    // Needs a late copy of an attempt that timed out reaching its head after the client's
    // next update there raised its floor past it (the head forgot its outcome).
    found(Fault::StaleCopyOrdered);
}

#[test]
fn a_suffix_granted_past_a_dropped_record_is_found() {
    // Needs a replica rejoining by a suffix while its source's compaction dropped a delete
    // above the rejoiner's last record.
    let cfg = Config { compaction: true, ..Config::memory_only() };
    found_with(Fault::SuffixPastDroppedRecord, cfg);
}

#[test]
fn a_copy_that_does_not_take_its_sources_drop_floor_is_found() {
    // Needs a full copy from a source whose compaction dropped a delete, then a rejoin by a
    // suffix from that copy below the dropped delete.
    let cfg = Config { compaction: true, ..Config::memory_only() };
    found_with(Fault::CopyWithoutDropFloor, cfg);
}
