//! Front-end wedges: the id space cut into F equal contiguous pieces, one per front-end.

use crate::{KeyId, Range};

/// First id of wedge `i` of `f`: `ceil(i · 2^128 / f)`, for `i < f`.
///
/// Ceiling (not floor) so that `id >= start(i)` ⇔ `id · f >= i · 2^128`, which is exactly the
/// test [`wedge_of`] computes; the two can never disagree on a boundary id.
fn wedge_start(i: u32, f: u32) -> u128 {
    if i == 0 {
        return 0;
    }
    let f128 = u128::from(f);
    // 2^128 = q·f + r, computed without overflowing.
    let (mut q, mut r) = (u128::MAX / f128, u128::MAX % f128 + 1);
    if r == f128 {
        q += 1;
        r = 0;
    }
    let i128 = u128::from(i);
    // i·r < f² < 2^64: no overflow. i·q < 2^128 because i < f.
    i128 * q + (i128 * r).div_ceil(f128)
}

/// The `frontends` wedges in order, as ranges `(start − 1, next start − 1]`. They partition the
/// circle; wedge 0 starts at id 0. `frontends == 0` is treated as 1 (one wedge: everything).
pub fn wedges(frontends: u32) -> Vec<Range> {
    let f = frontends.max(1);
    (0..f)
        .map(|i| {
            let start = wedge_start(i, f);
            let end = if i + 1 == f { u128::MAX } else { wedge_start(i + 1, f) - 1 };
            Range::new(KeyId(start.wrapping_sub(1)), KeyId(end))
        })
        .collect()
}

/// Index of the wedge containing `id`: `floor(id · f / 2^128)`. `frontends == 0` is treated as 1.
pub fn wedge_of(id: KeyId, frontends: u32) -> usize {
    let f = u128::from(frontends.max(1));
    // 128×32-bit multiply, keeping only the bits above 2^128.
    let hi = (id.0 >> 64) * f; // < 2^96
    let lo = (id.0 & u128::from(u64::MAX)) * f; // < 2^96
    let top = (hi + (lo >> 64)) >> 64;
    top as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges() {
        assert_eq!(wedges(1), vec![Range::full()]);
        assert_eq!(wedge_of(KeyId(u128::MAX), 1), 0);
        let w = wedges(2);
        assert_eq!(w[0].end_inclusive.0, (1u128 << 127) - 1);
        assert_eq!(wedge_of(KeyId(1 << 127), 2), 1);
        assert_eq!(wedge_of(KeyId((1 << 127) - 1), 2), 0);
        assert_eq!(wedge_of(KeyId(u128::MAX), 3), 2);
        assert_eq!(wedges(0).len(), 1);
    }
}
