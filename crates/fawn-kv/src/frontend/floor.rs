//! This front-end's request ids and its floor (`ReqId`): the lowest seq it may still send to
//! a head, which heads take as leave to forget its older outcomes.
//!
//! A request counts from the moment its seq is handed out. It stops counting when it ends
//! clean (one attempt sent, and its outcome came back: no other copy of it exists anywhere);
//! any other end (a second attempt, an error, a future dropped mid-flight) may leave a copy on
//! its way to a head, so it counts for `STALE_ATTEMPT_MICROS` more.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long after an unclean end a stale attempt of the request may still reach a head: as
/// long as heads remember an outcome without a floor (`DEDUP_WINDOW_MICROS`).
const STALE_ATTEMPT_MICROS: u64 = crate::replica::dedup::DEDUP_WINDOW_MICROS;
/// Most unclean ends held apart; past it a new one extends the newest's hold (which keeps the
/// floor at or below both).
const HELD_MAX: usize = 4096;

#[derive(Debug)]
struct State {
    next: u64,
    in_flight: BTreeSet<u64>,
    /// Unclean ends, `(until, seq)`, oldest first; seqs increase along it (an entry whose seq
    /// is at or above a later one's never sets the floor, so it is dropped).
    held: VecDeque<(Instant, u64)>,
}

/// Hands out request seqs and knows the floor.
#[derive(Debug)]
pub struct ReqFloor {
    state: Mutex<State>,
    hold: Duration,
}

impl Default for ReqFloor {
    fn default() -> ReqFloor {
        ReqFloor::with_hold(Duration::from_micros(STALE_ATTEMPT_MICROS))
    }
}

impl ReqFloor {
    fn with_hold(hold: Duration) -> ReqFloor {
        let state = State { next: 1, in_flight: BTreeSet::new(), held: VecDeque::new() };
        ReqFloor { state: Mutex::new(state), hold }
    }

    /// A new request's seq, counted until its `Live` ends. One lock hands it out and counts
    /// it, so no floor computed meanwhile passes it.
    pub fn start(&self) -> Live<'_> {
        let mut s = self.state.lock();
        let seq = s.next;
        s.next += 1;
        s.in_flight.insert(seq);
        Live { floor: self, seq, clean: false }
    }

    /// The lowest seq that may still be sent.
    pub fn floor(&self) -> u64 {
        let now = Instant::now();
        let mut s = self.state.lock();
        while s.held.front().is_some_and(|&(until, _)| until <= now) {
            s.held.pop_front();
        }
        let in_flight = s.in_flight.first().copied().unwrap_or(s.next);
        s.held.front().map_or(in_flight, |&(_, seq)| seq.min(in_flight))
    }

    fn end(&self, seq: u64, clean: bool) {
        let until = Instant::now() + self.hold;
        let mut s = self.state.lock();
        s.in_flight.remove(&seq);
        if clean {
            return;
        }
        while s.held.back().is_some_and(|&(_, held)| held >= seq) {
            s.held.pop_back();
        }
        let full = s.held.len() >= HELD_MAX;
        match s.held.back_mut() {
            Some(newest) if full => newest.0 = until,
            _ => s.held.push_back((until, seq)),
        }
    }
}

/// One request of this front-end, counted in the floor until dropped.
#[derive(Debug)]
pub struct Live<'a> {
    floor: &'a ReqFloor,
    seq: u64,
    clean: bool,
}

impl Live<'_> {
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The request ended clean: its one attempt was answered (a reply or the tail's notice).
    pub fn ended_clean(&mut self) {
        self.clean = true;
    }
}

impl Drop for Live<'_> {
    fn drop(&mut self) {
        self.floor.end(self.seq, self.clean);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_stays_at_a_request_in_flight_and_at_an_unclean_end_for_its_hold() {
        let f = ReqFloor::with_hold(Duration::from_millis(200));
        assert_eq!(f.floor(), 1);
        let mut a = f.start();
        let b = f.start();
        let mut c = f.start();
        assert_eq!((a.seq(), b.seq(), c.seq()), (1, 2, 3));
        assert_eq!(f.floor(), 1);
        c.ended_clean();
        drop(c);
        assert_eq!(f.floor(), 1, "an earlier request is still in flight");
        a.ended_clean();
        drop(a);
        assert_eq!(f.floor(), 2);
        // Ended unclean (a stale attempt may be on its way): held at 2 for the hold.
        let started = Instant::now();
        drop(b);
        let d = f.start();
        drop(d);
        let floor = f.floor();
        if started.elapsed() < Duration::from_millis(200) {
            assert_eq!(floor, 2);
        }
        while f.floor() == 2 {
            assert!(started.elapsed() < Duration::from_secs(60), "the hold never ended");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(started.elapsed() >= Duration::from_millis(200));
        // `d` ended unclean after `b` and holds the floor at its own seq no longer than its
        // own hold; with nothing in flight the floor is the next seq.
        while f.floor() == 4 {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(f.floor(), 5);
    }

    #[test]
    fn many_unclean_ends_are_held_in_bounded_memory_without_raising_the_floor() {
        let f = ReqFloor::with_hold(Duration::from_secs(600));
        let first = f.start();
        let first_seq = first.seq();
        drop(first);
        for _ in 0..3 * HELD_MAX {
            drop(f.start());
        }
        assert!(f.state.lock().held.len() <= HELD_MAX);
        assert_eq!(f.floor(), first_seq);
    }
}
