//! Guards: front-end wedges partition the circle into F contiguous pieces of (almost) equal size,
//! and `wedge_of` agrees with `Range::contains` everywhere, including at every boundary. If they
//! disagreed two front-ends would each forward a key to the other forever.

use fawn_ring::{wedge_of, wedges, KeyId};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn wedges_partition_and_agree_with_wedge_of(
        f in prop_oneof![1u32..20, any::<u32>()],
        random in proptest::collection::vec(any::<u128>(), 0..64),
    ) {
        // Building all wedges for huge f is slow; check the boundaries of a few around samples.
        let f_small = f.min(4096);
        let w = wedges(f_small);
        prop_assert_eq!(w.len(), f_small as usize);
        prop_assert!(w[0].contains(KeyId(0)));
        prop_assert_eq!(w[w.len() - 1].end_inclusive.0, u128::MAX);
        let ideal = u128::MAX / u128::from(f_small);
        for i in 0..w.len() {
            let next = w[(i + 1) % w.len()];
            prop_assert_eq!(w[i].end_inclusive, next.start_exclusive);
            let size = w[i].len_minus_one();
            prop_assert!(size.abs_diff(ideal) <= 1, "wedge {} size {} ideal {}", i, size, ideal);
            let (first, last) = (w[i].start_exclusive.0.wrapping_add(1), w[i].end_inclusive.0);
            let n = w.len();
            prop_assert_eq!(wedge_of(KeyId(first), f_small), i);
            prop_assert_eq!(wedge_of(KeyId(last), f_small), i);
            prop_assert_eq!(wedge_of(KeyId(first.wrapping_sub(1)), f_small), (i + n - 1) % n);
            prop_assert_eq!(wedge_of(KeyId(last.wrapping_add(1)), f_small), (i + 1) % n);
        }
        for id in random {
            let i = wedge_of(KeyId(id), f_small);
            prop_assert!(w[i].contains(KeyId(id)));
            prop_assert!(wedge_of(KeyId(id), f) < f as usize);
        }
    }
}
