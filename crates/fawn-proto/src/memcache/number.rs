//! Decimal fields parsed exactly as memcached 1.6's `safe_strto*` helpers parse them, since
//! clients and test suites depend on which odd inputs are accepted: C `strtol`/`strtoull`
//! rules (leading white space, an optional sign, at least one digit, and then either the end
//! of the token or a white-space byte, after which anything is ignored), 64-bit range checks,
//! and the silent truncation memcached applies when storing into a 32-bit field.

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// `strtoull`-style scan: sign and magnitude, or `None` for no digits, a 64-bit overflow, or a
/// non-space byte right after the digits.
fn scan(token: &[u8]) -> Option<(bool, u64)> {
    let start = token.iter().position(|b| !is_c_space(*b))?;
    let rest = &token[start..];
    let (negative, digits) = match rest.split_first() {
        Some((b'-', tail)) => (true, tail),
        Some((b'+', tail)) => (false, tail),
        _ => (false, rest),
    };
    let end = digits.iter().position(|b| !b.is_ascii_digit()).unwrap_or(digits.len());
    if end == 0 || !digits[end..].first().is_none_or(|b| is_c_space(*b)) {
        return None;
    }
    let mut magnitude: u64 = 0;
    for d in &digits[..end] {
        magnitude = magnitude.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some((negative, magnitude))
}

/// memcached's `safe_strtoull` (cas uniques, deltas, counters): a `-` is refused when the
/// result would read as negative in 64-bit signed arithmetic (so `-0` is accepted).
pub fn strtoull(token: &[u8]) -> Option<u64> {
    let (negative, magnitude) = scan(token)?;
    let value = if negative { magnitude.wrapping_neg() } else { magnitude };
    if negative && (value as i64) < 0 {
        return None;
    }
    Some(value)
}

/// memcached's `safe_strtoul` into a 32-bit field (client flags): the 64-bit value is
/// truncated, so `4294967296` stores as `0`.
pub fn strtoul32(token: &[u8]) -> Option<u32> {
    strtoull(token).map(|value| value as u32)
}

/// memcached's `safe_strtol` into a 32-bit field (exptime, data length): a 64-bit `strtol`,
/// then truncated, so `4294967297` reads as `1`.
pub fn strtol32(token: &[u8]) -> Option<i32> {
    let (negative, magnitude) = scan(token)?;
    let value =
        if negative { 0i64.checked_sub_unsigned(magnitude)? } else { i64::try_from(magnitude).ok()? };
    Some(value as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_what_strtol_accepts() {
        assert_eq!(strtoull(b"+3"), Some(3));
        assert_eq!(strtoull(b"01"), Some(1));
        assert_eq!(strtoull(b"-0"), Some(0));
        assert_eq!(strtoull(b"5\tjunk"), Some(5));
        assert_eq!(strtoull(b"18446744073709551615"), Some(u64::MAX));
        for bad in [&b""[..], b"-1", b"x", b"5a", b"18446744073709551616", b"+", b" "] {
            assert_eq!(strtoull(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn truncates_into_32_bits_like_memcached() {
        assert_eq!(strtoul32(b"4294967296"), Some(0));
        assert_eq!(strtoul32(b"18446744073709551615"), Some(u32::MAX));
        assert_eq!(strtol32(b"4294967297"), Some(1));
        assert_eq!(strtol32(b"4294967295"), Some(-1));
        assert_eq!(strtol32(b"2147483648"), Some(i32::MIN));
        assert_eq!(strtol32(b"-2147483649"), Some(i32::MAX));
        assert_eq!(strtol32(b"-9223372036854775808"), Some(0));
        assert_eq!(strtol32(b"9223372036854775808"), None);
    }
}
