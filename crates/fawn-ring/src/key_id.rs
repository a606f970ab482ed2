//! Key ids: the one hash of a user key that places it on the ring and in the index.

use serde::{Deserialize, Serialize};

/// A 128-bit, well-mixed id of a user key (or of a virtual node).
///
/// Defined as `XXH3-128(key)` with seed 0, interpreted as a big-endian `u128`
/// (see docs/FORMAT.md). It is stable across versions and platforms: changing
/// it would move every key, so it is part of the on-disk and on-wire contract.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize)]
pub struct KeyId(pub u128);

/// The key id of a user key.
pub fn key_id(key: &[u8]) -> KeyId {
    KeyId(xxhash_rust::xxh3::xxh3_128(key))
}

impl KeyId {
    /// The high 64 bits: used for ring placement tie-breaks and index bucket choice.
    pub fn high64(self) -> u64 {
        (self.0 >> 64) as u64
    }

    /// The low 64 bits: used for the index's fragments and alternate bucket.
    pub fn low64(self) -> u64 {
        self.0 as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_id_is_stable() {
        // Golden value: if this changes, every stored key moves. Do not update casually.
        assert_eq!(key_id(b"").0, xxhash_rust::xxh3::xxh3_128(b""));
        assert_ne!(key_id(b"a"), key_id(b"b"));
    }
}
