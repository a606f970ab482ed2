//! The byte budget for values in flight from the cluster to this server's clients, shared by
//! all its connections.
//!
//! A read reserves room for the largest value it may return before it is sent, keeps the
//! room its reply actually takes once the value arrives, and gives it back once that reply
//! has been written to the client's socket. So clients that ask for many large values and
//! never read hold at most the budget between them until the write timeout closes them;
//! they cannot queue more than the budget of values on the front-end's connections to the
//! back-ends, ahead of other clients' requests. Updates take no budget: they carry their own
//! value in the request, and must never wait behind hostile reads.

use std::sync::Arc;

use fawn_proto::memcache::{Limits, KEY_BYTES_MAX};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default bytes of replies (values, keys and their headers) that this server's reads may hold
/// at once, from the moment a read is sent to the cluster until its reply is written to the
/// client's socket (`MemcacheConfig::fetch_budget_bytes`). Each read in flight holds its
/// largest possible reply (about 1 MiB by default), so this also caps the reads in flight:
/// 512 MiB lets 32 connections pipeline 16 full-path gets each.
pub const FETCH_BUDGET_BYTES: usize = 512 * 1024 * 1024;
/// Most bytes one connection reserves for one batch of concurrent reads: a connection that
/// holds room and needs more first writes out what it holds, so it never waits holding room.
pub const CONNECTION_FETCH_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Bytes of a `VALUE` line and its `\r\n`s around a key and its value (at most).
pub const REPLY_HEADER_BYTES_MAX: usize = 64;

const _: () = assert!(CONNECTION_FETCH_BYTES_MAX <= FETCH_BUDGET_BYTES);
const _: () = assert!(CONNECTION_FETCH_BYTES_MAX <= u32::MAX as usize);

/// The shared budget, in bytes.
pub(super) struct FetchBudget {
    bytes: Arc<Semaphore>,
    /// Room reserved per key read: its largest possible reply.
    per_key: usize,
    /// Keys one connection reads at once.
    keys_per_batch: usize,
}

impl FetchBudget {
    /// A budget of `total_bytes`, raised to `CONNECTION_FETCH_BYTES_MAX` if below it (a read
    /// must always fit).
    pub fn new(limits: &Limits, total_bytes: usize) -> Self {
        let per_key = limits.value_bytes_max + KEY_BYTES_MAX + REPLY_HEADER_BYTES_MAX;
        // A value limit above the per-connection bound still reads one key at a time.
        let per_key = per_key.min(CONNECTION_FETCH_BYTES_MAX);
        let total_bytes = total_bytes.clamp(CONNECTION_FETCH_BYTES_MAX, Semaphore::MAX_PERMITS);
        FetchBudget {
            bytes: Arc::new(Semaphore::new(total_bytes)),
            per_key,
            keys_per_batch: (CONNECTION_FETCH_BYTES_MAX / per_key).max(1),
        }
    }

    /// Keys one connection may read at once.
    pub fn keys_per_batch(&self) -> usize {
        self.keys_per_batch
    }

    /// Bytes of the budget not held by any read now.
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }

    /// Room for reading `keys` keys, if it is free now.
    pub fn try_reserve(&self, keys: usize) -> Option<OwnedSemaphorePermit> {
        self.bytes.clone().try_acquire_many_owned(self.room(keys)).ok()
    }

    /// Room for reading `keys` keys, waiting for it (in turn: first come, first served).
    pub async fn reserve(&self, keys: usize) -> OwnedSemaphorePermit {
        // The semaphore is never closed.
        match self.bytes.clone().acquire_many_owned(self.room(keys)).await {
            Ok(permit) => permit,
            Err(_) => unreachable!("the fetch budget's semaphore is never closed"),
        }
    }

    fn room(&self, keys: usize) -> u32 {
        let keys = keys.clamp(1, self.keys_per_batch);
        // At most CONNECTION_FETCH_BYTES_MAX, checked above to fit.
        u32::try_from(keys * self.per_key).unwrap_or(u32::MAX)
    }
}

/// Keeps `used` bytes of `room` (what the replies take) and returns the rest to the budget.
pub(super) fn keep(mut room: OwnedSemaphorePermit, used: usize) -> OwnedSemaphorePermit {
    let excess = room.num_permits().saturating_sub(used);
    drop(room.split(excess));
    room
}

/// The room a reply for `key` with `value` takes.
pub(super) fn reply_bytes(key: &[u8], value: &[u8]) -> usize {
    key.len() + value.len() + REPLY_HEADER_BYTES_MAX
}
