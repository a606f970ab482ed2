//! Guards ranges split on join ("local split of the affected ranges"): a fifth
//! back-end joins a 4-back-end cluster (R = 3); each of its virtual ids must end a range of
//! its own that it replicates, and every acknowledged write must read back. Then a split cut
//! short by a crash: a replica of a split-off part is killed with kill -9 and left with the
//! on-disk state such a crash leaves (the part's directory missing, an unfinished
//! `.split-tmp` beside it, the directory of the range it was split from intact) and
//! restarted at once. It is failed and re-added as a syncing replica (its request outcomes
//! are gone), and must rebuild the part from that directory rather than serve it empty or
//! copy it whole: every key reads back and every replica's digest matches.

mod common;

use common::procs::{start_filled, ProcShape};
use fawn_proto::native::{ClusterConfig, NodeState};
use fawn_ring::Ring;

const JOINER: u32 = 4;
const KEYS: u32 = 1500;

fn settled(c: &ClusterConfig) -> bool {
    c.backends.iter().all(|b| b.state == NodeState::Alive)
        && c.ranges.iter().all(|r| {
            r.syncing.is_empty() && r.unproven_tail.is_none() && r.splitting.is_none() && r.chain.len() == 3
        })
}

#[test]
fn join_splits_ranges_and_a_split_cut_short_is_finished_after_a_crash() {
    let shape =
        ProcShape { backends: 4, replicas: 3, vnodes: 2, sync: "always".into(), ..ProcShape::default() };
    let (mut procs, rt, client, want) = start_filled(shape, KEYS);
    let before = procs.config().expect("config").ranges.len();

    procs.start_new_backend(JOINER);
    let c = procs.wait_config("the join splits and settles", |c| {
        settled(c) && c.backends.iter().any(|b| b.node == JOINER)
    });
    let ring = Ring::new(&[0, 1, 2, 3, JOINER], c.vnodes, c.replicas);
    let parts: Vec<_> = ring
        .vids_of(JOINER)
        .into_iter()
        .map(|vid| c.ranges.iter().find(|r| r.range.end_inclusive == vid.id).cloned())
        .collect();
    assert!(
        parts.iter().all(|p| p.as_ref().is_some_and(|p| p.chain.contains(&JOINER))),
        "each of the joiner's virtual ids ends a range it replicates: {c:?}"
    );
    assert_eq!(c.ranges.len(), before + 2, "two virtual ids, two splits: {c:?}");

    // A part (other than the joiner's copy) and an old replica of it that also replicates
    // the part above it, whose directory is the one the part was split from.
    let (part, victim, above) = parts
        .iter()
        .flatten()
        .find_map(|p| {
            let above = c.ranges.iter().find(|r| r.range.start_exclusive == p.range.end_inclusive)?;
            let victim = p.chain.iter().copied().find(|n| *n != JOINER && above.chain.contains(n))?;
            Some((p.range, victim, above.range))
        })
        .expect("a replica of a split-off part that also holds the range above it");
    procs.kill9(victim);
    let ranges_dir = procs.dir.join(format!("backend-{victim}")).join("ranges");
    let part_dir = ranges_dir.join(part.id_string());
    std::fs::remove_dir_all(&part_dir).expect("remove the part's directory");
    std::fs::create_dir_all(ranges_dir.join(format!("{}.split-tmp", part.id_string()))).expect("split-tmp");
    assert!(
        ranges_dir.join(above.id_string()).join("REPLICA").exists(),
        "the range above is a whole replica"
    );
    procs.restart_backend(victim);
    // A restarted back-end still in a chain is failed and re-added by the manager (its request
    // outcomes are gone), so the epoch moves before the cluster settles again.
    let after = procs.wait_config_installed("the victim is back", |x| x.epoch > c.epoch && settled(x));

    rt.block_on(common::assert_every_write_held(&client, &want, &after));
    rt.block_on(common::agreed_digests(&after));
    // Re-added to the part as a syncing replica, it finishes the split from the range above
    // (the `.split-tmp` shows the split was under way) and fetches only the suffix. The
    // manager may re-replicate the part on another node instead; then there is nothing to
    // finish.
    let logs = procs.logs(400);
    let recovered = logs.contains("finishing the split that made it");
    let back_in_part = after.ranges.iter().any(|r| r.range == part && r.chain.contains(&victim));
    eprintln!(
        "victim {victim}, part {}: back in the part: {back_in_part}, finished the split after the crash: {recovered}",
        part.id_string()
    );
    assert!(recovered || !back_in_part, "{logs}");
    procs.kill_all();
}
