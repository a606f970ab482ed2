//! `fawn bench cluster --sections memory`: what a back-end holds in DRAM. A cluster with the
//! `fawn up` defaults (R = 3) is loaded through the memcached protocol with half of
//! `--memory-keys` distinct keys, then all of them, as fast as the cluster takes them, so the
//! request-dedup tables are as full as sustained load makes them. Each back-end's resident
//! set (`VmRSS`) is read fresh and after each step. The line through the two loaded points
//! gives the cost per key per replica (its slope) and the fixed cost under load (its value
//! at zero keys).

use std::time::Duration;

use anyhow::{Context, Result};

/// Time for a back-end's memory to settle after a load step (freed buffers, idle tasks).
pub(crate) const SETTLE: Duration = Duration::from_secs(2);

/// Resident set size of process `pid` in bytes (`VmRSS` in /proc).
pub(crate) fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .with_context(|| format!("no VmRSS for process {pid}"))?;
    Ok(kib * 1024)
}

/// The line through two (keys per back-end, bytes) points: bytes per key (its slope) and
/// the fixed bytes (its value at zero keys).
pub(crate) fn fit((k1, r1): (f64, f64), (k2, r2): (f64, f64)) -> (f64, f64) {
    let per_key = (r2 - r1) / (k2 - k1);
    (per_key, r1 - per_key * k1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fit_recovers_a_line() {
        let (per_key, fixed) =
            super::fit((1000.0, 20_000.0 + 8.0 * 1000.0), (3000.0, 20_000.0 + 8.0 * 3000.0));
        assert!((per_key - 8.0).abs() < 1e-9 && (fixed - 20_000.0).abs() < 1e-6);
    }

    #[test]
    fn this_process_has_a_resident_set() {
        assert!(super::rss_bytes(std::process::id()).unwrap() > 0);
    }
}
