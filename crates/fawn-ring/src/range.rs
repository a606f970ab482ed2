//! Ranges of the circular key-id space.

use serde::{Deserialize, Serialize};

use crate::KeyId;

/// A range `(start_exclusive, end_inclusive]` of the circular `u128` key-id space.
///
/// * `start < end`: the plain interval `start < id <= end`.
/// * `start > end`: the range wraps past `u128::MAX` to 0: `id > start || id <= end`.
/// * `start == end`: the full circle (a ring with a single virtual id owns everything).
///
/// There is no empty range: every range the ring hands out owns at least one id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Range {
    pub start_exclusive: KeyId,
    pub end_inclusive: KeyId,
}

impl Range {
    /// The range `(start_exclusive, end_inclusive]`.
    pub fn new(start_exclusive: KeyId, end_inclusive: KeyId) -> Range {
        Range { start_exclusive, end_inclusive }
    }

    /// The whole id space. Represented as `(x, x]`; we use `x = u128::MAX`.
    pub fn full() -> Range {
        Range::new(KeyId(u128::MAX), KeyId(u128::MAX))
    }

    /// Whether this range is the full circle.
    pub fn is_full(&self) -> bool {
        self.start_exclusive == self.end_inclusive
    }

    /// Whether `id` lies in `(start_exclusive, end_inclusive]` (wrapping).
    pub fn contains(&self, id: KeyId) -> bool {
        let (s, e, x) = (self.start_exclusive.0, self.end_inclusive.0, id.0);
        match s.cmp(&e) {
            std::cmp::Ordering::Less => s < x && x <= e,
            std::cmp::Ordering::Greater => x > s || x <= e,
            std::cmp::Ordering::Equal => true,
        }
    }

    /// How many ids the range holds, minus one (so the full circle, 2^128 ids, fits in a u128).
    ///
    /// Used by tests and balance statistics; `len_minus_one() + 1` overflows only for the full circle.
    pub fn len_minus_one(&self) -> u128 {
        if self.is_full() {
            return u128::MAX;
        }
        self.end_inclusive.0.wrapping_sub(self.start_exclusive.0).wrapping_sub(1)
    }

    /// A stable short name usable as a file or directory name: 32 lowercase hex digits of the end.
    ///
    /// The end is the owning virtual id, which never changes while that virtual id exists, so a
    /// range keeps its name when a join shrinks it (the paper's split keeps the owner's datastore).
    pub fn id_string(&self) -> String {
        format!("{:032x}", self.end_inclusive.0)
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({:032x}, {:032x}]", self.start_exclusive.0, self.end_inclusive.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_wrapping_and_full() {
        let plain = Range::new(KeyId(10), KeyId(20));
        assert!(!plain.contains(KeyId(10)));
        assert!(plain.contains(KeyId(11)));
        assert!(plain.contains(KeyId(20)));
        assert!(!plain.contains(KeyId(21)));

        let wrap = Range::new(KeyId(20), KeyId(10));
        assert!(wrap.contains(KeyId(u128::MAX)));
        assert!(wrap.contains(KeyId(0)));
        assert!(wrap.contains(KeyId(10)));
        assert!(!wrap.contains(KeyId(15)));
        assert!(!wrap.contains(KeyId(20)));

        let full = Range::new(KeyId(5), KeyId(5));
        assert!(full.contains(KeyId(5)) && full.contains(KeyId(0)));
        assert_eq!(full.len_minus_one(), u128::MAX);
        assert_eq!(plain.len_minus_one(), 9);
        assert_eq!(wrap.len_minus_one(), u128::MAX - 10);
    }

    #[test]
    fn id_string_is_fixed_width_hex() {
        let r = Range::new(KeyId(0), KeyId(0xab));
        assert_eq!(r.id_string(), "000000000000000000000000000000ab");
    }
}
