//! The checks at the end of a seed: the replicas of each chain converged and hold every
//! acknowledged update, no request was decided twice, no client waited too long, and the
//! history (with a final read of every key) is linearizable.

use crate::disk::DiskStore;
use fawn_kv::replica::machine::{Action, Event, Replica};
use fawn_proto::native::ReplEffect;
use fawn_proto::op::Outcome;

use super::clients::parse_value;
use super::partition::PARTITION_MAX;
use super::{key_bytes, RangeIx, World, DEDUP_LOST, MS, WAIT_MAX};
use crate::check::{Op, OpKind, OpResult};

impl World {
    pub(super) fn final_checks(&mut self) {
        let mut problems = Vec::new();
        let ranges: Vec<RangeIx> =
            self.config().ranges.iter().filter_map(|rc| self.range_ix(&rc.range)).collect();
        for ix in ranges {
            self.check_range(ix, &mut problems);
        }
        self.check_orderings(&mut problems);
        // Answered operations only: a client gives up after a few quick refusals too. A range
        // may wait out a partition (its last proven replica cut off), so runs with partitions
        // allow that much longer.
        let wait_max = if self.partitions > 0 { WAIT_MAX + PARTITION_MAX } else { WAIT_MAX };
        for op in &self.history {
            let waited = op.ret.map_or(0, |(t, _)| t - op.call);
            if waited > wait_max {
                problems.push(format!(
                    "client {} waited {} ms for {:?} (liveness)",
                    op.client,
                    waited / MS,
                    op.kind
                ));
            }
        }
        for key in crate::check::violations(&self.history) {
            if self.cfg.trace {
                let ops: Vec<Op> = self.history.iter().filter(|o| o.key == key).cloned().collect();
                let upto = crate::check::first_failing_time(&ops);
                eprintln!("history of key {key}, fails by time {upto}:");
                for op in ops.iter().filter(|o| o.call <= upto) {
                    eprintln!("history: {op:?}");
                }
            }
            problems.push(format!("key {key}: history not linearizable"));
        }
        self.violations.extend(problems);
    }

    /// The live replicas of range `ix`'s final chain: identical, nothing unacknowledged,
    /// every acknowledged write of its keys; then a final read of each of its keys at the
    /// tail joins the history.
    fn check_range(&mut self, ix: RangeIx, problems: &mut Vec<String>) {
        let Some(rc) = self.range_config(ix).cloned() else { return };
        let live: Vec<&Replica<DiskStore>> = rc
            .chain
            .iter()
            .filter_map(|n| self.nodes.get(n).filter(|n| n.alive)?.replicas.get(&ix))
            .collect();
        // Live items only: compaction drops old tombstones on its own schedule per replica.
        let items = |r: &Replica<DiskStore>| -> Vec<(Vec<u8>, (u64, ReplEffect))> {
            let contents = r.store().mem().contents();
            let live = contents.filter(|(_, (_, e))| *e != ReplEffect::Delete);
            live.map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        if let Some(first) = live.first() {
            let contents = items(first);
            for r in &live[1..] {
                if items(r) != contents {
                    problems.push(format!(
                        "range {ix}: replicas {} and {} differ after settling",
                        first.route().me,
                        r.route().me
                    ));
                }
            }
        }
        let keys: Vec<u32> = (0..self.cfg.keys as u32).filter(|k| self.range_of_key(*k) == ix).collect();
        for r in &live {
            if r.unacked_len() > 0 {
                let (me, n) = (r.route().me, r.unacked_len());
                problems.push(format!("node {me} range {ix} still has {n} unacked updates"));
            }
            for (key, seq) in self.acked.iter().filter(|(k, _)| keys.contains(k)) {
                let bytes = key_bytes(*key);
                // No record at all: a later delete whose tombstone compaction dropped (a lost
                // write the final reads at the tail find too).
                let deleted_after = self.applied_deletes.get(&bytes).is_some_and(|d| d > seq);
                let held = r.store().mem().seq_of(&bytes);
                if held.is_some_and(|s| s < *seq) || (held.is_none() && !deleted_after) {
                    problems.push(format!("node {} lost acknowledged seq {seq} of key {key}", r.route().me));
                }
            }
        }
        let Some(tail) = rc.tail().and_then(|t| self.nodes.get_mut(&t)?.replicas.get_mut(&ix)) else {
            return;
        };
        for key in keys {
            let actions = tail.step(Event::Get { token: 0, key: key_bytes(key), now: 0 });
            let item = match actions.as_slice() {
                [Action::GetReply { result: Ok(item), .. }] => item.clone(),
                other => {
                    problems.push(format!("the final tail of range {ix} refused a get: {other:?}"));
                    continue;
                }
            };
            let value = item.and_then(|i| parse_value(&i.value));
            let at = self.now + 1;
            self.history.push(Op {
                client: u32::MAX,
                key,
                kind: OpKind::Get,
                call: at,
                ret: Some((at, OpResult::Read(value))),
            });
        }
    }

    /// No request committed at two seqs, and its answer is what it committed as. (A split or
    /// merge copies a committed update into another range at the same seq: one commit.)
    fn check_orderings(&self, problems: &mut Vec<String>) {
        // In request order: a seed's report must replay exactly.
        let mut ordered: Vec<_> = self.ordered.iter().collect();
        ordered.sort_by_key(|(r, _)| (r.client, r.seq));
        for (req, seqs) in ordered {
            let mut committed: Vec<&(RangeIx, u64, Outcome)> =
                seqs.iter().filter(|(ix, s, _)| self.committed.contains(&(*ix, *s))).collect();
            committed.sort_by_key(|(_, s, _)| *s);
            committed.dedup_by_key(|(_, s, _)| *s);
            if committed.len() > 1 {
                problems.push(format!("{DEDUP_LOST}: {req:?} committed twice: {committed:?}"));
            }
            let answer = self.answered.get(req);
            if let (Some((_, seq, outcome)), Some(answer)) = (committed.first(), answer) {
                if answer != outcome {
                    problems.push(format!(
                        "{DEDUP_LOST}: {req:?} committed at seq {seq} as {outcome:?}, answered {answer:?}"
                    ));
                }
            }
        }
    }
}
