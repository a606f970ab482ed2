//! Outcomes of recently ordered requests, so that a retried update is applied once.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use fawn_proto::native::{OutcomeEntry, ReqId};
use fawn_proto::op::Outcome;
use hashbrown::HashTable;

/// Most request ids remembered per range for retried-update deduplication (the bound under a
/// sustained high update rate; below it, `DEDUP_WINDOW_MICROS` decides). Half the usable
/// capacity of a hash table of 2^17 buckets: a table that drops its oldest entry for each new
/// one then rehashes in place when deletion markers fill it, instead of doubling (hashbrown
/// grows a table more than half full).
pub const DEDUP_ENTRIES_MAX: usize = (1 << 17) / 8 * 7 / 2;
// A replica reopened on its FAWN-DS rebuilds this table from the tags of the latest records
// (`ReplicaStore::kept_outcomes`): the datastore keeps at least as many as the table holds.
const _: () = assert!(DEDUP_ENTRIES_MAX <= fawn_ds::limits::RECENT_TAGS_MAX);
// Entries are found by the low 32 bits of their serial number (`OutcomeTable::by_req`).
const _: () = assert!(DEDUP_ENTRIES_MAX < u32::MAX as usize);
/// How long an outcome is remembered, in microseconds of seq (seqs are microsecond
/// timestamps): longer than any client retries one request (a front-end: 6 attempts of 3 s;
/// the native client: 9 attempts of 5 s with backoff, under a minute). Older entries are
/// dropped as newer requests are remembered.
pub const DEDUP_WINDOW_MICROS: u64 = 60_000_000;
/// Most clients whose floor a replica knows (`Dedup::raise_floor`). Past it a new client's
/// floor is ignored (its outcomes go by the window and the count), so a stream of short-lived
/// clients cannot grow the map without bound. A known floor is never dropped: it is what
/// refuses a stale copy of a request whose outcome went (`Dedup::is_stale`).
pub const FLOOR_CLIENTS_MAX: usize = 4096;
/// Most parent tables a replica keeps for deduplication after splits and merges (each holds up
/// to `DEDUP_ENTRIES_MAX` entries).
pub const DEDUP_INHERITED_TABLES_MAX: usize = 4;

/// One remembered outcome: the seq of the request's update and its outcome, kept compact for
/// the common one (`Stored` with the update's own seq as cas).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remembered {
    seq: u64,
    /// `None`: `Outcome::Stored { cas: seq }`.
    other: Option<Box<Outcome>>,
}

impl Remembered {
    fn new(seq: u64, outcome: Outcome) -> Remembered {
        let other = (outcome != Outcome::Stored { cas: seq }).then(|| Box::new(outcome));
        Remembered { seq, other }
    }

    fn outcome(&self) -> Outcome {
        self.other.as_deref().cloned().unwrap_or(Outcome::Stored { cas: self.seq })
    }
}

/// One entry of an `OutcomeTable`: 40 bytes.
#[derive(Debug)]
struct Entry {
    req: ReqId,
    /// The table's clock when the entry was made.
    at: u64,
    kept: Remembered,
}

/// Request outcomes in the order remembered (first in, first out), found by request id
/// through a hash table of 4-byte serial numbers: about 52 bytes an entry when full, where a
/// map from id to outcome plus a queue of ids took about 100.
#[derive(Debug, Default)]
pub struct OutcomeTable {
    entries: VecDeque<Entry>,
    /// The serial number of `entries[0]`; the next entries count up from it.
    first: u64,
    /// The low 32 bits of each entry's serial number, by the hash of its request id.
    by_req: HashTable<u32>,
    hasher: RandomState,
}

impl OutcomeTable {
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry with serial number (low bits) `serial`.
    fn at(entries: &VecDeque<Entry>, first: u64, serial: u32) -> &Entry {
        &entries[serial.wrapping_sub(first as u32) as usize]
    }

    fn find(&self, req: &ReqId) -> Option<&Entry> {
        let hash = self.hasher.hash_one(req);
        let serial = self.by_req.find(hash, |&s| Self::at(&self.entries, self.first, s).req == *req)?;
        Some(Self::at(&self.entries, self.first, *serial))
    }

    fn get(&self, req: &ReqId) -> Option<&Remembered> {
        self.find(req).map(|e| &e.kept)
    }

    fn pop_front(&mut self) {
        let Some(front) = self.entries.front() else { return };
        let hash = self.hasher.hash_one(front.req);
        let first = self.first as u32;
        if let Ok(found) = self.by_req.find_entry(hash, |&s| s == first) {
            found.remove();
        }
        self.entries.pop_front();
        self.first += 1;
    }

    /// Replaces `req`'s outcome (keeping its place and date), or remembers it as the newest
    /// entry, dated `at`. True if it was new.
    fn insert(&mut self, req: ReqId, at: u64, kept: Remembered) -> bool {
        let hash = self.hasher.hash_one(req);
        let (entries, first) = (&mut self.entries, self.first);
        if let Some(&s) = self.by_req.find(hash, |&s| Self::at(entries, first, s).req == req) {
            let i = s.wrapping_sub(first as u32) as usize;
            entries[i].kept = kept;
            return false;
        }
        if entries.len() == entries.capacity() {
            // Grow by half rather than doubling: a full table stops at `DEDUP_ENTRIES_MAX`.
            let room =
                (entries.len() / 2).max(64).min(DEDUP_ENTRIES_MAX.saturating_sub(entries.len()).max(1));
            entries.reserve_exact(room);
        }
        let serial = (first + entries.len() as u64) as u32;
        entries.push_back(Entry { req, at, kept });
        let hasher = &self.hasher;
        self.by_req.insert_unique(hash, serial, |&s| hasher.hash_one(Self::at(entries, first, s).req));
        true
    }

    /// Gives memory back when at most a quarter of it is in use (after a burst).
    fn shrink(&mut self) {
        if self.entries.capacity() > 1024 && self.entries.len() < self.entries.capacity() / 4 {
            let keep = self.entries.len() * 2;
            self.entries.shrink_to(keep);
            let (entries, first, hasher) = (&self.entries, self.first, &self.hasher);
            self.by_req.shrink_to(keep, |&s| hasher.hash_one(Self::at(entries, first, s).req));
        }
    }

    fn iter(&self) -> impl Iterator<Item = (&ReqId, &Remembered)> {
        self.entries.iter().map(|e| (&e.req, &e.kept))
    }

    /// Bytes of memory the table holds (both of its parts).
    #[cfg(test)]
    fn capacity_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>() + self.by_req.capacity() * 8 / 7 * 5
    }
}

/// Outcomes of recently ordered requests, so that a retried update is applied once: the
/// replica's own (first in, first out, for its window, `DEDUP_WINDOW_MICROS` unless set, and
/// at most `DEDUP_ENTRIES_MAX`) and, read-only and shared, those of the ranges it was split or
/// merged from. Shared rather than copied: a copy would be made while the range's puts wait
/// for the split or merge to finish.
pub struct Dedup {
    own: OutcomeTable,
    /// How long an outcome is remembered, in microseconds of seq.
    window: u64,
    /// The highest seq remembered: the time of this table (no clock in the state machine).
    clock: u64,
    /// Tables of parent ranges, oldest first.
    inherited: Vec<Arc<OutcomeTable>>,
    /// Requests remembered since the latest inheritance. Once it reaches
    /// `DEDUP_ENTRIES_MAX`, a single table of that size would have evicted every inherited
    /// entry, so the inherited tables are dropped.
    since_inherited: usize,
    /// Each client's floor (`ReqId`): its outcomes below it are never asked for again.
    floors: HashMap<u64, u64>,
}

impl Default for Dedup {
    fn default() -> Dedup {
        Dedup {
            own: OutcomeTable::default(),
            window: DEDUP_WINDOW_MICROS,
            clock: 0,
            inherited: Vec::new(),
            since_inherited: 0,
            floors: HashMap::new(),
        }
    }
}

impl Dedup {
    /// Remembers outcomes for `micros` of seq instead of `DEDUP_WINDOW_MICROS`: a simulated
    /// cluster, whose runs last seconds, sees outcomes go by the window too. It must stay
    /// longer than any client retries one request, or a retry is decided again.
    pub fn set_window(&mut self, micros: u64) {
        self.window = micros;
    }

    /// The seq and outcome remembered for `req`.
    pub fn get(&self, req: &ReqId) -> Option<(u64, Outcome)> {
        let found = self.own.get(req).or_else(|| self.inherited.iter().rev().find_map(|t| t.get(req)));
        found.map(|r| (r.seq, r.outcome()))
    }

    /// Moves this table's clock to `now_micros` (the head's time): what is remembered next
    /// is dated at least this late, also when its seq is an older one.
    pub fn advance(&mut self, now_micros: u64) {
        self.clock = self.clock.max(now_micros);
    }

    /// The floor known for `client` (0: none).
    pub fn floor_of(&self, client: u64) -> u64 {
        self.floors.get(&client).copied().unwrap_or(0)
    }

    /// `client` will never send a request below `floor` again (`ReqId`): its outcomes below
    /// it may go. They go from the front of the table (oldest first), so an entry another
    /// client may still ask for holds back those behind it until it goes by its own rule.
    pub fn raise_floor(&mut self, client: u64, floor: u64) {
        if floor == 0 || self.floor_of(client) >= floor {
            return;
        }
        if self.floors.len() >= FLOOR_CLIENTS_MAX && !self.floors.contains_key(&client) {
            return;
        }
        self.floors.insert(client, floor);
        self.forget_old();
        self.own.shrink();
    }

    /// Knows `other`'s floors too (a split or merge heir its parent's): each client's higher
    /// one, within `FLOOR_CLIENTS_MAX`. A floor is the client's own, whatever range it was
    /// learnt in.
    pub fn take_floors(&mut self, other: &Dedup) {
        let mut floors: Vec<(u64, u64)> = other.floors.iter().map(|(c, f)| (*c, *f)).collect();
        // In client order: which floors fit is the same on every run.
        floors.sort_unstable();
        for (client, floor) in floors {
            if self.floor_of(client) < floor
                && (self.floors.len() < FLOOR_CLIENTS_MAX || self.floors.contains_key(&client))
            {
                self.floors.insert(client, floor);
            }
        }
        self.forget_old();
    }

    /// `req` is below its client's floor: the client no longer sends it, so this is a stale
    /// copy of an attempt it gave up on, whose outcome may be forgotten. Not to be decided
    /// again unless remembered (`get`).
    pub fn is_stale(&self, req: &ReqId) -> bool {
        req.seq < self.floor_of(req.client)
    }

    /// Drops entries from the front while one is over the count bound, older than the
    /// window, or below its client's floor.
    fn forget_old(&mut self) {
        let expired = |at: u64| at.saturating_add(self.window) < self.clock;
        while let Some(front) = self.own.entries.front() {
            let below_floor = front.req.seq < self.floor_of(front.req.client);
            if self.own.len() < DEDUP_ENTRIES_MAX && !expired(front.at) && !below_floor {
                break;
            }
            self.own.pop_front();
        }
    }

    /// The lowest seq an outcome kept with its record may have and still be remembered here:
    /// that of the oldest entry of each table (entries of records come in seq order). A
    /// datastore need keep no older record tags for a reopen (`ReplicaStore::forget_outcomes_below`).
    pub fn oldest_seq(&self) -> Option<u64> {
        let tables = std::iter::once(&self.own).chain(self.inherited.iter().map(|t| &**t));
        tables.filter_map(|t| t.entries.front().map(|e| e.kept.seq)).min()
    }

    /// Remembers `req`'s outcome; `seq` is its update's (or, for an outcome that wrote
    /// nothing, the seq it was decided after), and dates the entry unless the clock is later.
    pub fn remember(&mut self, req: ReqId, seq: u64, outcome: Outcome) {
        self.clock = self.clock.max(seq);
        // Room first: the table never holds more than `DEDUP_ENTRIES_MAX`, even for a moment.
        self.forget_old();
        if self.own.insert(req, self.clock, Remembered::new(seq, outcome)) {
            self.since_inherited += 1;
            if self.since_inherited >= DEDUP_ENTRIES_MAX {
                self.inherited.clear();
            }
        }
        self.own.shrink();
    }
    /// The entries of updates with a seq in `seqs` (own and inherited), ordered by seq and
    /// request id (the same on every run, for the simulator).
    pub fn entries_in(&self, seqs: std::ops::RangeInclusive<u64>) -> Vec<OutcomeEntry> {
        let tables = std::iter::once(&self.own).chain(self.inherited.iter().map(|t| &**t));
        let mut out: Vec<OutcomeEntry> = tables
            .flat_map(|t| t.iter())
            .filter(|(_, r)| seqs.contains(&r.seq))
            .map(|(req, r)| OutcomeEntry { req: *req, seq: r.seq, outcome: r.outcome() })
            .collect();
        out.sort_by_key(|e| (e.seq, e.req.client, e.req.seq));
        out.dedup_by_key(|e| e.req);
        out
    }

    /// Everything remembered, as shared tables for an heir. The own entries move into a
    /// shared table, which this (retiring) replica keeps answering from too.
    pub fn share(&mut self) -> Vec<Arc<OutcomeTable>> {
        if !self.own.is_empty() {
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
            assert_eq!(d.get(&req(1)), Some((10, stored(1))));
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

    #[test]
    fn dedup_forgets_outcomes_older_than_its_window_and_gives_the_memory_back() {
        let mut d = Dedup::default();
        let start = 1_000_000;
        for n in 0..10_000u64 {
            d.remember(req(n), start + n, Outcome::Stored { cas: start + n });
        }
        d.remember(req(10_000), start + 10_000, Outcome::NotStored);
        assert_eq!(d.get(&req(7)), Some((start + 7, Outcome::Stored { cas: start + 7 })));
        assert_eq!(d.get(&req(10_000)), Some((start + 10_000, Outcome::NotStored)));
        let grown = d.own.capacity_bytes();
        // One request a window later pushes all the others out.
        let later = start + 10_000 + DEDUP_WINDOW_MICROS + 1;
        d.remember(req(20_000), later, Outcome::Deleted);
        assert_eq!(d.get(&req(10_000)), None);
        d.remember(req(20_000), later, Outcome::Deleted);
        assert_eq!(d.get(&req(20_000)), Some((later, Outcome::Deleted)));
        assert_eq!(d.own.len(), 1);
        assert!(d.own.capacity_bytes() < grown / 4, "{} of {grown}", d.own.capacity_bytes());
        // Within the window, nothing goes but past the count bound.
        d.remember(req(20_001), later + DEDUP_WINDOW_MICROS, Outcome::Deleted);
        assert!(d.get(&req(20_000)).is_some());
    }

    #[test]
    fn a_window_set_shorter_forgets_sooner() {
        let mut d = Dedup::default();
        d.set_window(1_000);
        d.remember(req(1), 10_000, Outcome::Deleted);
        d.remember(req(2), 11_000, Outcome::Deleted);
        assert!(d.get(&req(1)).is_some(), "exactly a window old: kept");
        d.remember(req(3), 11_001, Outcome::Deleted);
        assert_eq!(d.get(&req(1)), None);
        assert!(d.get(&req(2)).is_some());
    }

    #[test]
    fn a_full_table_keeps_its_size_while_old_entries_make_room_for_new_ones() {
        let mut d = Dedup::default();
        for n in 0..DEDUP_ENTRIES_MAX as u64 {
            d.remember(req(n), n, Outcome::Stored { cas: n });
        }
        // Deletion markers make it grow once, to 2^17 buckets, where it rehashes in place.
        let churn = |d: &mut Dedup, from: u64| {
            for n in from..from + 2 * DEDUP_ENTRIES_MAX as u64 {
                d.remember(req(n), n, Outcome::Stored { cas: n });
                assert!(d.own.len() <= DEDUP_ENTRIES_MAX);
            }
        };
        let most = (1usize << 17) / 8 * 7;
        let mut grown = 0;
        for round in 0..4u64 {
            churn(&mut d, (1 + 2 * round) * DEDUP_ENTRIES_MAX as u64);
            assert!(d.own.by_req.capacity() <= most, "{} buckets' worth", d.own.by_req.capacity());
            assert_eq!(d.own.entries.capacity(), DEDUP_ENTRIES_MAX);
            grown = grown.max(d.own.by_req.capacity());
        }
        assert!(grown <= most);
        assert!(d.own.capacity_bytes() <= 3_000_000, "{} bytes", d.own.capacity_bytes());
        assert_eq!(d.get(&req(0)), None);
        assert!(d.get(&req(9 * DEDUP_ENTRIES_MAX as u64 - 1)).is_some());
    }

    #[test]
    fn an_outcome_decided_after_an_old_seq_is_dated_by_the_clock() {
        let mut d = Dedup::default();
        let now = 5 * DEDUP_WINDOW_MICROS;
        d.advance(now);
        d.remember(req(1), 0, Outcome::NotFound);
        d.remember(req(2), now + 1, Outcome::Stored { cas: now + 1 });
        assert_eq!(d.get(&req(1)), Some((0, Outcome::NotFound)));
    }

    #[test]
    fn a_stored_outcome_with_another_cas_is_kept_as_it_is() {
        let mut d = Dedup::default();
        d.remember(req(1), 10, Outcome::Stored { cas: 9 });
        assert_eq!(d.get(&req(1)), Some((10, Outcome::Stored { cas: 9 })));
        assert_eq!(std::mem::size_of::<Remembered>(), 16);
        assert_eq!(std::mem::size_of::<Entry>(), 40);
    }

    /// A client's floor takes exactly its outcomes below it: one at the floor may still be
    /// retried and must stay (a rule that forgot it too would apply that retry twice).
    #[test]
    fn a_client_floor_forgets_only_that_client_s_outcomes_below_it() {
        let mut d = Dedup::default();
        let other = |n| ReqId { client: 8, seq: n };
        for n in 1..=10u64 {
            d.remember(req(n), n, Outcome::Stored { cas: n });
        }
        d.remember(other(1), 11, Outcome::Deleted);
        d.remember(req(11), 12, Outcome::Stored { cas: 12 });
        d.raise_floor(7, 6);
        assert_eq!(d.floor_of(7), 6);
        for n in 1..6 {
            assert_eq!(d.get(&req(n)), None, "{n} is below the floor");
        }
        for n in 6..=11 {
            assert!(d.get(&req(n)).is_some(), "{n} is at or above the floor");
        }
        assert_eq!(d.oldest_seq(), Some(6));
        // A floor never goes down; the other client's entry (no floor) now leads the table
        // and holds back what is behind it until its own rule takes it.
        d.raise_floor(7, 3);
        assert_eq!(d.floor_of(7), 6);
        d.raise_floor(7, 100);
        assert_eq!(d.get(&req(10)), None);
        assert_eq!(d.get(&other(1)), Some((11, Outcome::Deleted)));
        assert!(d.get(&req(11)).is_some(), "behind an entry another client may still ask for");
        d.raise_floor(8, 2);
        assert_eq!(d.get(&req(11)), None);
        assert!(d.own.is_empty());
        assert_eq!(d.oldest_seq(), None);
        // A retry of a forgotten request is, to the table, a new one.
        d.remember(req(12), 13, Outcome::NotStored);
        assert_eq!(d.get(&req(12)), Some((13, Outcome::NotStored)));
    }

    /// An heir of a split or merge must know its parent's floors: the parent forgot a
    /// client's outcomes below its floor, and a stale copy of one of those requests reaching
    /// the heir would otherwise be decided again.
    #[test]
    fn an_heir_takes_its_parent_s_floors_and_refuses_what_they_make_stale() {
        let mut parent = Dedup::default();
        parent.remember(req(1), 1, Outcome::Deleted);
        parent.raise_floor(7, 2);
        assert_eq!(parent.get(&req(1)), None);
        let mut heir = Dedup::default();
        heir.raise_floor(7, 1);
        heir.raise_floor(9, 5);
        heir.inherit(parent.share());
        heir.take_floors(&parent);
        assert!(heir.is_stale(&req(1)), "the parent's floor came with it");
        assert_eq!((heir.floor_of(7), heir.floor_of(9)), (2, 5));
        // A lower floor of the parent does not lower the heir's.
        let mut other = Dedup::default();
        other.raise_floor(9, 3);
        heir.take_floors(&other);
        assert_eq!(heir.floor_of(9), 5);
    }

    #[test]
    fn past_the_most_clients_a_new_floor_is_ignored_and_known_ones_stay() {
        let mut d = Dedup::default();
        d.remember(req(1), 1, Outcome::Deleted);
        for client in 100..100 + FLOOR_CLIENTS_MAX as u64 {
            d.raise_floor(client, 5);
        }
        assert_eq!(d.floors.len(), FLOOR_CLIENTS_MAX);
        d.raise_floor(7, 5);
        assert_eq!(d.floors.len(), FLOOR_CLIENTS_MAX);
        assert_eq!((d.floor_of(7), d.floor_of(100)), (0, 5));
        assert!(d.get(&req(1)).is_some() && !d.is_stale(&req(1)));
        assert!(d.is_stale(&ReqId { client: 100, seq: 4 }) && !d.is_stale(&ReqId { client: 100, seq: 5 }));
        d.raise_floor(100, 9);
        assert_eq!(d.floor_of(100), 9);
    }

    fn req(n: u64) -> ReqId {
        ReqId { client: 7, seq: n }
    }
}
