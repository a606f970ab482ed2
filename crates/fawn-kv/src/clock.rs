//! Wall-clock helpers. Sequence numbers are hybrid: `max(previous + 1, now in microseconds)`,
//! so they order a range's updates and also tell roughly when an item was stored (`flush_all`).

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch.
pub fn unix_now() -> u32 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as u32).unwrap_or(0)
}

/// Microseconds since the Unix epoch.
pub fn unix_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// The next sequence number after `last`.
pub fn next_seq(last: u64) -> u64 {
    (last + 1).max(unix_micros())
}

/// Is an item stored with sequence `seq` hidden by a `flush_all` at `flush_at_micros`?
pub fn flushed(seq: u64, flush_at_micros: u64) -> bool {
    flush_at_micros != 0 && unix_micros() >= flush_at_micros && seq < flush_at_micros
}
