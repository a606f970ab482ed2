//! Update operations and their semantics, decided at the head of a chain.
//!
//! The head of a range's chain orders every update of that range, so conditional and
//! read-modify-write operations (add, replace, cas, append, prepend, incr, decr, touch) are
//! evaluated there against the head's current item, by [`decide`], and what is replicated down
//! the chain is only the resulting plain put or delete.

use serde::{Deserialize, Serialize};

/// Absolute Unix time in seconds; `0` means "never expires".
pub type UnixSeconds = u32;

/// An item as clients see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub value: Vec<u8>,
    /// memcached client flags (opaque to the server).
    pub flags: u32,
    /// Absolute expiry, `0` = never.
    pub expiry: UnixSeconds,
    /// The item's version: the sequence number the head assigned to the put that wrote it.
    /// memcached's "cas unique".
    pub cas: u64,
}

/// What an update does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mutation {
    /// Unconditional store.
    Set,
    /// Store only if the key holds no live item.
    Add,
    /// Store only if the key holds a live item.
    Replace,
    /// Append the value to a live item's value (flags and expiry unchanged).
    Append,
    /// Prepend the value to a live item's value (flags and expiry unchanged).
    Prepend,
    /// Store only if the live item's cas unique equals this.
    Cas { unique: u64 },
    /// Add to a live item holding a decimal u64 (wraps at 2^64 like memcached).
    Incr { delta: u64 },
    /// Subtract from a live item holding a decimal u64 (floors at 0 like memcached).
    Decr { delta: u64 },
    /// Change only the expiry of a live item.
    Touch,
    /// Remove the item.
    Delete,
}

/// An update request as the head receives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Update {
    pub key: Vec<u8>,
    pub mutation: Mutation,
    /// The value for Set/Add/Replace/Append/Prepend/Cas; empty otherwise.
    pub value: Vec<u8>,
    /// Flags for Set/Add/Replace/Cas.
    pub flags: u32,
    /// Absolute expiry for Set/Add/Replace/Cas/Touch (`0` = never).
    pub expiry: UnixSeconds,
}

/// The outcome reported to the client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Stored; the new item's cas unique.
    Stored { cas: u64 },
    /// add on an existing key, replace/append/prepend on a missing one.
    NotStored,
    /// cas with a stale unique.
    Exists,
    /// cas/delete/incr/decr/touch on a missing key.
    NotFound,
    /// delete succeeded.
    Deleted,
    /// incr/decr succeeded: the new value.
    Counter { value: u64, cas: u64 },
    /// touch succeeded.
    Touched { cas: u64 },
    /// incr/decr on a value that is not a decimal u64.
    NonNumeric,
}

/// What the head writes (and replicates) as the effect of an update.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    /// Nothing to write (the condition failed).
    None,
    Put { value: Vec<u8>, flags: u32, expiry: UnixSeconds },
    Delete,
}
