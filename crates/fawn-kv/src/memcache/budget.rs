//! The byte budget for values in flight from the cluster to this server's clients, shared by
//! all its connections.
//!
//! A read reserves room for its reply before it is sent: what this server last saw that key's
//! reply take (its size class, [`SizeHints`]), or the largest possible reply for a key it has
//! not seen. When the value arrives, the read keeps the room its reply really takes: the
//! excess goes back, and a reply larger than its room is topped up if the budget has the room
//! free at once; if not, the value is dropped and read again once room for it is reserved.
//! The room is given back once the reply has been written to the client's socket. So the
//! replies held for clients never take more than the budget: clients that ask for many large
//! values and never read hold at most the budget between them until the write timeout closes
//! them, and cannot queue more than it on the front-end's connections to the back-ends, ahead
//! of other clients' requests. Updates take no budget: they carry their own value in the
//! request, and must never wait behind hostile reads.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

use fawn_proto::memcache::{Limits, KEY_BYTES_MAX};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default bytes of replies (values, keys and their headers) that this server's reads may hold
/// at once, from the moment a read is sent to the cluster until its reply is written to the
/// client's socket (`MemcacheConfig::fetch_budget_bytes`).
pub const FETCH_BUDGET_BYTES: usize = 512 * 1024 * 1024;
/// Most bytes one connection reserves for one batch of concurrent reads: a connection that
/// holds room and needs more first writes out what it holds, so it never waits holding room.
pub const CONNECTION_FETCH_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Bytes of a `VALUE` line and its `\r\n`s around a key and its value (at most).
pub const REPLY_HEADER_BYTES_MAX: usize = 64;
/// Keys whose last reply size this server remembers (by hash: keys sharing a slot share a
/// hint), one byte each.
pub const SIZE_HINT_SLOTS: usize = 1 << 16;
/// The smallest room a read reserves: a longest key, its header and a small value.
const HINT_ROOM_MIN_BYTES: usize = 512;
/// The largest size class a hint records (256 TiB: beyond any reply).
const HINT_CLASS_MAX: u32 = 40;

/// The budget's part kept for connections whose client has read everything sent to it: one
/// such connection's read of at most `FAIR_SHARE_READ_BYTES_MAX` that finds the rest taken
/// waits only behind other such reads, not behind reads of clients that leave replies unread.
pub const FAIR_SHARE_DIVISOR: usize = 8;
/// The largest reply a read served from the fair share may take.
pub const FAIR_SHARE_READ_BYTES_MAX: usize = 64 * 1024;
/// The smallest budget: the fair share and a whole connection's batch beside it.
const BUDGET_BYTES_MIN: usize = 2 * CONNECTION_FETCH_BYTES_MAX;
const _: () = assert!(BUDGET_BYTES_MIN <= FETCH_BUDGET_BYTES);
const _: () = assert!(BUDGET_BYTES_MIN - BUDGET_BYTES_MIN / FAIR_SHARE_DIVISOR >= CONNECTION_FETCH_BYTES_MAX);
const _: () = assert!(BUDGET_BYTES_MIN / FAIR_SHARE_DIVISOR >= FAIR_SHARE_READ_BYTES_MAX);
const _: () = assert!(CONNECTION_FETCH_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(KEY_BYTES_MAX + REPLY_HEADER_BYTES_MAX <= HINT_ROOM_MIN_BYTES);
const _: () = assert!(SIZE_HINT_SLOTS.is_power_of_two());
const _: () =
    assert!((HINT_ROOM_MIN_BYTES << (HINT_CLASS_MAX - 1)) >> (HINT_CLASS_MAX - 1) == HINT_ROOM_MIN_BYTES);

/// The shared budget, in bytes: the fair share, and the rest for any read.
pub(super) struct FetchBudget {
    bytes: Arc<Semaphore>,
    /// The size of `bytes`: no reservation from it asks for more.
    total: usize,
    /// The fair share (see [`FAIR_SHARE_DIVISOR`]).
    share: Arc<Semaphore>,
    /// The largest possible reply: the room of a read of a key without a hint.
    per_key: usize,
    hints: SizeHints,
}

impl FetchBudget {
    /// A budget of `total_bytes` in all, raised to `BUDGET_BYTES_MIN` if below it (a
    /// connection's batch must always fit beside the fair share).
    pub fn new(limits: &Limits, total_bytes: usize) -> Self {
        let per_key = limits.value_bytes_max + KEY_BYTES_MAX + REPLY_HEADER_BYTES_MAX;
        // A value limit above the per-connection bound still reads one key at a time.
        let per_key = per_key.min(CONNECTION_FETCH_BYTES_MAX);
        let all = total_bytes.clamp(BUDGET_BYTES_MIN, Semaphore::MAX_PERMITS);
        let share = all / FAIR_SHARE_DIVISOR;
        let total = all - share;
        FetchBudget {
            bytes: Arc::new(Semaphore::new(total)),
            total,
            share: Arc::new(Semaphore::new(share)),
            per_key,
            hints: SizeHints::new(),
        }
    }

    /// Bytes of the budget not held by any read now (the fair share's included).
    pub fn available(&self) -> usize {
        self.bytes.available_permits() + self.share.available_permits()
    }

    /// Whether a read of `bytes` may be served from the fair share.
    pub fn fits_share(&self, bytes: usize) -> bool {
        bytes <= FAIR_SHARE_READ_BYTES_MAX
    }

    /// `bytes` (at most `FAIR_SHARE_READ_BYTES_MAX`) of the fair share, waiting for them behind
    /// other reads from it only.
    pub async fn reserve_share(&self, bytes: usize) -> OwnedSemaphorePermit {
        let bytes = u32::try_from(bytes.min(FAIR_SHARE_READ_BYTES_MAX)).unwrap_or(u32::MAX);
        // The semaphore is never closed.
        match self.share.clone().acquire_many_owned(bytes).await {
            Ok(permit) => permit,
            Err(_) => unreachable!("the fetch budget's semaphore is never closed"),
        }
    }

    /// The room a read of `key` reserves first: its hint, else the largest possible reply.
    pub fn room_for(&self, key: &[u8]) -> usize {
        self.hints.room(key).map_or(self.per_key, |room| room.min(self.per_key))
    }

    /// The first rooms of reading `keys`, together.
    pub fn rooms(&self, keys: &[Vec<u8>]) -> usize {
        keys.iter().map(|key| self.room_for(key)).sum()
    }

    /// The room a read reserves when its hint may be wrong: the largest possible reply.
    pub fn room_max(&self) -> usize {
        self.per_key
    }

    /// How many of `keys` (at least one, at most `keys_max`) one connection reads at once:
    /// their first rooms together stay within `CONNECTION_FETCH_BYTES_MAX`.
    pub fn batch_len(&self, keys: &[Vec<u8>], keys_max: usize) -> usize {
        let mut room = 0;
        let fitting = keys.iter().take(keys_max).take_while(|key| {
            room += self.room_for(key);
            room <= CONNECTION_FETCH_BYTES_MAX
        });
        fitting.count().max(1)
    }

    /// `bytes` of room, if they are free now.
    pub fn try_reserve(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        self.bytes.clone().try_acquire_many_owned(self.permits(bytes)).ok()
    }

    /// `bytes` of room, waiting for them (in turn: first come, first served).
    pub async fn reserve(&self, bytes: usize) -> OwnedSemaphorePermit {
        // The semaphore is never closed.
        match self.bytes.clone().acquire_many_owned(self.permits(bytes)).await {
            Ok(permit) => permit,
            Err(_) => unreachable!("the fetch budget's semaphore is never closed"),
        }
    }

    /// Makes `room` exactly `used` bytes: gives back the excess, or tops it up if its part of
    /// the budget has the rest free now (room of the fair share only up to
    /// `FAIR_SHARE_READ_BYTES_MAX`). `Err(room)` if not (the reply does not fit).
    pub fn fit(
        &self,
        mut room: OwnedSemaphorePermit,
        used: usize,
    ) -> Result<OwnedSemaphorePermit, OwnedSemaphorePermit> {
        let held = room.num_permits();
        if used <= held {
            drop(room.split(held - used));
            return Ok(room);
        }
        let from_share = Arc::ptr_eq(room.semaphore(), &self.share);
        let allowed = if from_share { used <= FAIR_SHARE_READ_BYTES_MAX } else { used - held <= self.total };
        let more = u32::try_from(used - held).ok().filter(|_| allowed);
        match more.and_then(|more| room.semaphore().clone().try_acquire_many_owned(more).ok()) {
            Some(more) => {
                room.merge(more);
                Ok(room)
            }
            None => Err(room),
        }
    }

    /// Remembers the room `key`'s reply took (`used` bytes; 0 for a miss).
    pub fn observe(&self, key: &[u8], used: usize) {
        self.hints.record(key, used);
    }

    fn permits(&self, bytes: usize) -> u32 {
        // At most the whole budget, which fits in a u32 (checked when the semaphore is made).
        u32::try_from(bytes.min(self.total)).unwrap_or(u32::MAX)
    }
}

/// The room a reply for `key` with `value` takes.
pub(super) fn reply_bytes(key: &[u8], value: &[u8]) -> usize {
    key.len() + value.len() + REPLY_HEADER_BYTES_MAX
}

/// The size class of the last reply seen for each key, by the key's hash: slot value 0 is
/// unknown, `c` ≥ 1 a room of `HINT_ROOM_MIN_BYTES << (c - 1)`. A hint only sizes the first
/// reservation: a wrong one (the value grew through another front-end, or keys share a slot)
/// costs a top-up or a second read, never the bound.
struct SizeHints {
    slots: Box<[AtomicU8]>,
    /// Seeded per process, so a client cannot aim keys at one slot.
    hasher: std::collections::hash_map::RandomState,
}

impl SizeHints {
    fn new() -> Self {
        let slots = (0..SIZE_HINT_SLOTS).map(|_| AtomicU8::new(0)).collect();
        SizeHints { slots, hasher: Default::default() }
    }

    fn slot(&self, key: &[u8]) -> &AtomicU8 {
        // Masked to the table, a power of two.
        let index = self.hasher.hash_one(key) as usize & (SIZE_HINT_SLOTS - 1);
        &self.slots[index]
    }

    fn room(&self, key: &[u8]) -> Option<usize> {
        match self.slot(key).load(Relaxed) {
            0 => None,
            class => Some(HINT_ROOM_MIN_BYTES << (class - 1)),
        }
    }

    fn record(&self, key: &[u8], used: usize) {
        let class = used.div_ceil(HINT_ROOM_MIN_BYTES).max(1).next_power_of_two().trailing_zeros() + 1;
        let class = class.min(HINT_CLASS_MAX);
        self.slot(key).store(u8::try_from(class).unwrap_or(u8::MAX), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_is_the_smallest_class_that_holds_the_reply() {
        let hints = SizeHints::new();
        assert_eq!(hints.room(b"k"), None);
        for (used, room) in [(0, 512), (330, 512), (512, 512), (513, 1024), (1_048_890, 2 << 20)] {
            hints.record(b"k", used);
            assert_eq!(hints.room(b"k"), Some(room), "{used} bytes");
        }
    }

    #[test]
    fn a_reply_larger_than_its_room_is_topped_up_only_from_free_room() {
        let budget = FetchBudget::new(&Limits::default(), BUDGET_BYTES_MIN);
        let share = BUDGET_BYTES_MIN / FAIR_SHARE_DIVISOR;
        let room = budget.try_reserve(1000).unwrap();
        let room = budget.fit(room, 600).unwrap();
        assert_eq!(room.num_permits(), 600);
        let room = budget.fit(room, 5000).unwrap();
        assert_eq!(budget.available(), BUDGET_BYTES_MIN - 5000);
        let _rest = budget.try_reserve(budget.available() - share).unwrap();
        let room = budget.fit(room, 6000).unwrap_err();
        assert_eq!(room.num_permits(), 5000);
        // The fair share tops up its own room, and only up to its largest read.
        let room = budget.fit(budget.share.clone().try_acquire_many_owned(100).unwrap(), 2000).unwrap();
        assert_eq!(budget.available(), share - 2000);
        let room = budget.fit(room, FAIR_SHARE_READ_BYTES_MAX + 1).unwrap_err();
        assert_eq!(room.num_permits(), 2000);
    }
}
