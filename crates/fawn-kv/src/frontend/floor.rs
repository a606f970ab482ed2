//! This front-end's request ids and its floor (`ReqId`): the lowest seq it may still send to
//! a head, which heads take as leave to forget its older outcomes.
//!
//! A request counts from the moment its seq is handed out until its handling ends, however it
//! ends. A copy of an attempt still on its way after that (sent, then given up on) reaches a
//! head below the floor: the head answers it from its table if it still remembers it, and
//! otherwise refuses it as stale (`Dedup::is_stale`), so it is never applied twice.

use std::collections::BTreeSet;

use parking_lot::Mutex;

#[derive(Debug)]
struct State {
    next: u64,
    in_flight: BTreeSet<u64>,
}

/// Hands out request seqs and knows the floor.
#[derive(Debug)]
pub struct ReqFloor {
    state: Mutex<State>,
}

impl Default for ReqFloor {
    fn default() -> ReqFloor {
        ReqFloor { state: Mutex::new(State { next: 1, in_flight: BTreeSet::new() }) }
    }
}

impl ReqFloor {
    /// A new request's seq, counted until its `Live` is dropped. One lock hands it out and
    /// counts it, so no floor computed meanwhile passes it.
    pub fn start(&self) -> Live<'_> {
        let mut s = self.state.lock();
        let seq = s.next;
        s.next += 1;
        s.in_flight.insert(seq);
        Live { floor: self, seq }
    }

    /// The lowest seq that may still be sent.
    pub fn floor(&self) -> u64 {
        let s = self.state.lock();
        s.in_flight.first().copied().unwrap_or(s.next)
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
        self.floor.state.lock().in_flight.remove(&self.seq);
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
}
