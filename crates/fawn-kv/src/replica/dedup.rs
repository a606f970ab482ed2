//! Outcomes of recently ordered requests, so that a retried update is applied once.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use fawn_proto::native::{OutcomeEntry, ReqId};
use fawn_proto::op::Outcome;

/// Request ids remembered per range for retried-update deduplication.
pub const DEDUP_ENTRIES_MAX: usize = 65_536;
/// Most parent tables a replica keeps for deduplication after splits and merges (each holds up
/// to `DEDUP_ENTRIES_MAX` entries).
pub const DEDUP_INHERITED_TABLES_MAX: usize = 4;
/// One table of request outcomes: sequence number and outcome by request id.
pub type OutcomeTable = HashMap<ReqId, (u64, Outcome)>;

/// Outcomes of recently ordered requests, so that a retried update is applied once: the
/// replica's own (first in, first out, at most `DEDUP_ENTRIES_MAX`) and, read-only and
/// shared, those of the ranges it was split or merged from. Shared rather than copied: a copy
/// would be made while the range's puts wait for the split or merge to finish.
#[derive(Default)]
pub struct Dedup {
    own: OutcomeTable,
    order: VecDeque<ReqId>,
    /// Tables of parent ranges, oldest first.
    inherited: Vec<Arc<OutcomeTable>>,
    /// Requests remembered since the latest inheritance. Once it reaches
    /// `DEDUP_ENTRIES_MAX`, a single table of that size would have evicted every inherited
    /// entry, so the inherited tables are dropped.
    since_inherited: usize,
}

impl Dedup {
    pub fn get(&self, req: &ReqId) -> Option<&(u64, Outcome)> {
        self.own.get(req).or_else(|| self.inherited.iter().rev().find_map(|t| t.get(req)))
    }

    pub fn remember(&mut self, req: ReqId, seq: u64, outcome: Outcome) {
        if self.own.insert(req, (seq, outcome)).is_none() {
            self.order.push_back(req);
            self.since_inherited += 1;
            if self.since_inherited >= DEDUP_ENTRIES_MAX {
                self.inherited.clear();
            }
        }
        while self.order.len() > DEDUP_ENTRIES_MAX {
            if let Some(old) = self.order.pop_front() {
                self.own.remove(&old);
            }
        }
    }

    /// The entries of updates with a seq in `seqs` (own and inherited), ordered by seq and
    /// request id (the same on every run, for the simulator).
    pub fn entries_in(&self, seqs: std::ops::RangeInclusive<u64>) -> Vec<OutcomeEntry> {
        let tables = std::iter::once(&self.own).chain(self.inherited.iter().map(|t| &**t));
        let mut out: Vec<OutcomeEntry> = tables
            .flat_map(|t| t.iter())
            .filter(|(_, (seq, _))| seqs.contains(seq))
            .map(|(req, (seq, outcome))| OutcomeEntry { req: *req, seq: *seq, outcome: outcome.clone() })
            .collect();
        out.sort_by_key(|e| (e.seq, e.req.client, e.req.seq));
        out.dedup_by_key(|e| e.req);
        out
    }

    /// Everything remembered, as shared tables for an heir. The own entries move into a
    /// shared table, which this (retiring) replica keeps answering from too.
    pub fn share(&mut self) -> Vec<Arc<OutcomeTable>> {
        if !self.own.is_empty() {
            self.order.clear();
            self.inherited.push(Arc::new(std::mem::take(&mut self.own)));
        }
        self.inherited.clone()
    }

    /// Takes a parent's tables (`share`), keeping at most `DEDUP_INHERITED_TABLES_MAX`.
    pub fn inherit(&mut self, tables: Vec<Arc<OutcomeTable>>) {
        for t in tables {
            if !self.inherited.iter().any(|have| Arc::ptr_eq(have, &t)) {
                self.inherited.push(t);
            }
        }
        let excess = self.inherited.len().saturating_sub(DEDUP_INHERITED_TABLES_MAX);
        self.inherited.drain(..excess);
        self.since_inherited = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_shares_parent_tables_and_drops_them_once_outgrown() {
        let stored = |n| Outcome::Stored { cas: n };
        let mut parent = Dedup::default();
        parent.remember(req(1), 10, stored(1));
        let mut left = Dedup::default();
        let mut right = Dedup::default();
        left.inherit(parent.share());
        right.inherit(parent.share());
        // Both parts and the retired parent answer from the one shared table.
        for d in [&parent, &left, &right] {
            assert_eq!(d.get(&req(1)), Some(&(10, stored(1))));
        }
        assert_eq!(left.inherited.len(), 1);
        assert!(Arc::ptr_eq(&left.inherited[0], &right.inherited[0]));
        // A merge of the two parts holds the shared table once, plus each part's own.
        left.remember(req(2), 20, stored(2));
        right.remember(req(3), 30, stored(3));
        let mut merged = Dedup::default();
        merged.inherit(left.share());
        merged.inherit(right.share());
        assert_eq!(merged.inherited.len(), 3);
        for (n, seq) in [(1, 10), (2, 20), (3, 30)] {
            assert_eq!(merged.get(&req(n)).map(|e| e.0), Some(seq));
        }
        // As many new requests as one table holds push every inherited entry out.
        for n in 0..DEDUP_ENTRIES_MAX as u64 {
            merged.remember(req(1000 + n), n, stored(n));
        }
        assert!(merged.inherited.is_empty());
        assert_eq!(merged.get(&req(1)), None);
        assert_eq!(merged.own.len(), DEDUP_ENTRIES_MAX);
    }

    #[test]
    fn dedup_keeps_at_most_the_newest_inherited_tables() {
        let mut heir = Dedup::default();
        for n in 0..(DEDUP_INHERITED_TABLES_MAX as u64 + 2) {
            let mut parent = Dedup::default();
            parent.remember(req(n), n, Outcome::Deleted);
            heir.inherit(parent.share());
        }
        assert_eq!(heir.inherited.len(), DEDUP_INHERITED_TABLES_MAX);
        assert_eq!(heir.get(&req(0)), None, "the oldest table went first");
        assert!(heir.get(&req(DEDUP_INHERITED_TABLES_MAX as u64 + 1)).is_some());
    }

    fn req(n: u64) -> ReqId {
        ReqId { client: 7, seq: n }
    }
}
