//! This front-end's request ids and its floor (`ReqId`): the lowest seq it may still send to
//! a head, which heads take as leave to forget its older outcomes.
//!
//! A request counts from the moment its seq is handed out until its handling ends, however it
//! ends. A copy of an attempt still on its way after that (sent, then given up on) reaches a
//! head below the floor: the head answers it from its table if it still remembers it, and
//! otherwise refuses it as stale (`Dedup::is_stale`), so it is never applied twice.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// The seqs from the floor on: whether each is still in flight. Seqs are handed out in
/// order, so the floor is the first of them and the next seq follows the last.
#[derive(Debug)]
struct Window {
    /// Seq of `open[0]`; the next seq once `open` is empty.
    base: u64,
    /// Still in flight, from `base` on; the front is always in flight.
    open: VecDeque<bool>,
}

/// Hands out request seqs and knows the floor.
#[derive(Debug)]
pub struct ReqFloor {
    window: Mutex<Window>,
    /// `window.base`, read without the lock (every update reads the floor).
    floor: AtomicU64,
}

impl Default for ReqFloor {
    fn default() -> ReqFloor {
        ReqFloor { window: Mutex::new(Window { base: 1, open: VecDeque::new() }), floor: AtomicU64::new(1) }
    }
}

impl ReqFloor {
    /// A new request's seq, counted until its `Live` is dropped. It is counted as it is
    /// handed out, and the floor never passes a seq still counted.
    pub fn start(&self) -> Live<'_> {
        let mut w = self.window.lock();
        let seq = w.base + w.open.len() as u64;
        w.open.push_back(true);
        Live { floor: self, seq }
    }

    /// The lowest seq that may still be sent.
    pub fn floor(&self) -> u64 {
        self.floor.load(Ordering::Acquire)
    }

    fn end(&self, seq: u64) {
        let mut w = self.window.lock();
        let Some(at) = seq.checked_sub(w.base) else { return };
        if let Some(open) = w.open.get_mut(at as usize) {
            *open = false;
        }
        while w.open.front() == Some(&false) {
            w.open.pop_front();
            w.base += 1;
        }
        self.floor.store(w.base, Ordering::Release);
    }
}

/// One request of this front-end, counted in the floor until dropped.
#[derive(Debug)]
pub struct Live<'a> {
    floor: &'a ReqFloor,
    seq: u64,
}

impl Live<'_> {
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl Drop for Live<'_> {
    fn drop(&mut self) {
        self.floor.end(self.seq);
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_oldest_request_in_flight_or_the_next_one() {
        let f = ReqFloor::default();
        assert_eq!(f.floor(), 1);
        let a = f.start();
        let b = f.start();
        let c = f.start();
        assert_eq!((a.seq(), b.seq(), c.seq()), (1, 2, 3));
        drop(c);
        assert_eq!(f.floor(), 1, "an earlier request is still in flight");
        drop(a);
        assert_eq!(f.floor(), 2);
        drop(b);
        assert_eq!(f.floor(), 4);
    }

    #[test]
    fn one_slow_request_holds_the_floor_until_it_ends() {
        let f = ReqFloor::default();
        let slow = f.start();
        for n in 0..1000 {
            let live = f.start();
            assert_eq!(live.seq(), 2 + n);
            drop(live);
            assert_eq!(f.floor(), 1);
        }
        let later: Vec<_> = (0..3).map(|_| f.start()).collect();
        drop(slow);
        assert_eq!(f.floor(), later[0].seq(), "the floor stops at the oldest still in flight");
        drop(later);
        assert_eq!(f.floor(), 1005);
        assert_eq!(f.start().seq(), 1005);
    }
}
