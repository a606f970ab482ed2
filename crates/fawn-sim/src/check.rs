//! Client histories and a per-key register linearizability checker.
//!
//! Every written value is unique, so a register's state is the id of the write whose value it
//! holds. A history is linearizable when each key's operations can be put in an order that
//! respects real time (an operation that returned before another was called comes first) and
//! in which each completed operation's result is what the register gives. Operations without
//! an answer (the client gave up) may take effect at any time after their call, or never.
//! The search is Wing & Gong's, with the visited (done set, state) pairs remembered.

use std::collections::{BTreeMap, HashSet};

/// A value: (client, that client's write number). Unique per write.
pub type Value = (u32, u32);

/// What a client did to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Set(Value),
    Delete,
    /// Store `new` if the key holds `old`.
    Cas {
        old: Value,
        new: Value,
    },
    Get,
}

/// What the client was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpResult {
    Stored,
    Deleted,
    NotFound,
    Exists,
    Read(Option<Value>),
}

/// One client operation: called at `call`, answered at `ret` (`None`: never answered).
#[derive(Clone, Debug)]
pub struct Op {
    pub client: u32,
    pub key: u32,
    pub kind: OpKind,
    pub call: u64,
    pub ret: Option<(u64, OpResult)>,
}

/// The register after `op` from `state`, or `None` if its result contradicts `state`.
fn apply(state: Option<Value>, op: &Op) -> Option<Option<Value>> {
    let result = op.ret.map(|(_, r)| r);
    match (op.kind, result) {
        (OpKind::Set(v), None | Some(OpResult::Stored)) => Some(Some(v)),
        (OpKind::Delete, None) => Some(None),
        (OpKind::Delete, Some(OpResult::Deleted)) => state.map(|_| None),
        (OpKind::Delete, Some(OpResult::NotFound)) => state.is_none().then_some(None),
        (OpKind::Cas { old, new }, None) => Some(if state == Some(old) { Some(new) } else { state }),
        (OpKind::Cas { old, new }, Some(OpResult::Stored)) => (state == Some(old)).then_some(Some(new)),
        (OpKind::Cas { old, .. }, Some(OpResult::Exists)) => state.filter(|s| *s != old).map(Some),
        (OpKind::Cas { .. }, Some(OpResult::NotFound)) => state.is_none().then_some(None),
        (OpKind::Get, Some(OpResult::Read(v))) => (v == state).then_some(state),
        _ => None,
    }
}

/// Whether one key's operations are linearizable from an empty register.
pub fn linearizable(ops: &[Op]) -> bool {
    // Gets never answered constrain nothing.
    let ops: Vec<&Op> = ops.iter().filter(|o| o.ret.is_some() || o.kind != OpKind::Get).collect();
    let n = ops.len();
    let mut seen: HashSet<(Vec<u64>, Option<Value>)> = HashSet::new();
    let mut done = vec![0u64; n.div_ceil(64)];
    search(&ops, &mut done, None, &mut seen)
}

fn is_done(done: &[u64], i: usize) -> bool {
    done[i / 64] & (1 << (i % 64)) != 0
}

fn search(
    ops: &[&Op],
    done: &mut Vec<u64>,
    state: Option<Value>,
    seen: &mut HashSet<(Vec<u64>, Option<Value>)>,
) -> bool {
    let open = |i: &usize| !is_done(done, *i);
    let first_ret = (0..ops.len()).filter(open).filter_map(|i| ops[i].ret.map(|(t, _)| t)).min();
    let Some(first_ret) = first_ret else { return true };
    if !seen.insert((done.clone(), state)) {
        return false;
    }
    for i in 0..ops.len() {
        if is_done(done, i) || ops[i].call > first_ret {
            continue;
        }
        let Some(next) = apply(state, ops[i]) else { continue };
        done[i / 64] |= 1 << (i % 64);
        let ok = search(ops, done, next, seen);
        done[i / 64] &= !(1 << (i % 64));
        if ok {
            return true;
        }
    }
    false
}

/// The earliest time by which one key's history (answers after it unknown) is not
/// linearizable, to show the short prefix of a failing history.
pub fn first_failing_time(ops: &[Op]) -> u64 {
    let mut times: Vec<u64> = ops.iter().filter_map(|o| o.ret.map(|(t, _)| t)).collect();
    times.sort_unstable();
    let cut = |t: u64| -> Vec<Op> {
        ops.iter()
            .filter(|o| o.call <= t)
            .map(|o| Op { ret: o.ret.filter(|(r, _)| *r <= t), ..o.clone() })
            .collect()
    };
    let i = times.partition_point(|t| linearizable(&cut(*t)));
    times.get(i).copied().unwrap_or(u64::MAX)
}

/// The keys whose operations in `history` are not linearizable.
pub fn violations(history: &[Op]) -> Vec<u32> {
    let mut by_key: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
    for op in history {
        by_key.entry(op.key).or_default().push(op.clone());
    }
    by_key.into_iter().filter(|(_, ops)| !linearizable(ops)).map(|(k, _)| k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(kind: OpKind, call: u64, ret: u64, result: OpResult) -> Op {
        Op { client: 0, key: 0, kind, call, ret: Some((ret, result)) }
    }

    #[test]
    fn a_read_of_an_overwritten_value_after_the_overwrite_is_caught() {
        let a = op(OpKind::Set((1, 1)), 0, 1, OpResult::Stored);
        let b = op(OpKind::Set((2, 1)), 2, 3, OpResult::Stored);
        let stale = op(OpKind::Get, 4, 5, OpResult::Read(Some((1, 1))));
        assert!(!linearizable(&[a.clone(), b.clone(), stale]));
        let concurrent = op(OpKind::Get, 2, 5, OpResult::Read(Some((1, 1))));
        assert!(linearizable(&[a, b, concurrent]));
    }

    #[test]
    fn an_unanswered_write_may_or_may_not_have_happened() {
        let lost = Op { client: 0, key: 0, kind: OpKind::Set((1, 1)), call: 0, ret: None };
        let saw = op(OpKind::Get, 5, 6, OpResult::Read(Some((1, 1))));
        let empty = op(OpKind::Get, 1, 2, OpResult::Read(None));
        assert!(linearizable(&[lost.clone(), empty.clone(), saw.clone()]));
        let gone = op(OpKind::Get, 7, 8, OpResult::Read(None));
        assert!(!linearizable(&[lost, empty, saw, gone]), "a value that came and went without a delete");
    }

    #[test]
    fn a_cas_that_reports_exists_must_not_have_written() {
        let a = op(OpKind::Set((1, 1)), 0, 1, OpResult::Stored);
        let cas = op(OpKind::Cas { old: (1, 1), new: (2, 1) }, 2, 3, OpResult::Exists);
        let saw = op(OpKind::Get, 4, 5, OpResult::Read(Some((2, 1))));
        assert!(!linearizable(&[a, cas, saw]));
    }
}
