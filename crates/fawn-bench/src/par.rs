//! Run a closure on N threads, by count or for a duration, timing every call.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use rand::{rngs::SmallRng, SeedableRng};

/// When a parallel run stops.
#[derive(Clone, Copy, Debug)]
pub enum Until {
    /// This many calls in total, split evenly over the threads.
    Count(u64),
    /// Until this much wall time has passed.
    Elapsed(Duration),
}

/// What a parallel run measured.
pub struct ParResult {
    pub ops: u64,
    pub elapsed: Duration,
    /// Per-call latency, ns.
    pub hist: Histogram<u64>,
}

impl ParResult {
    pub fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    /// Latency at quantile `q`, µs.
    pub fn us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1000.0
    }
}

/// Call `f(rng)` from `threads` threads until `until`. The first error stops the run.
pub fn run<F>(threads: usize, until: Until, seed: u64, f: F) -> Result<ParResult>
where
    F: Fn(&mut SmallRng) -> Result<()> + Sync,
{
    let threads = threads.max(1);
    let start = Instant::now();
    let results: Vec<Result<(u64, Histogram<u64>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                let quota = match until {
                    Until::Count(n) => Some(n / threads as u64 + u64::from((t as u64) < n % threads as u64)),
                    Until::Elapsed(_) => None,
                };
                let deadline = match until {
                    Until::Elapsed(d) => Some(start + d),
                    Until::Count(_) => None,
                };
                s.spawn(move || worker(f, seed.wrapping_add(t as u64), quota, deadline))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("worker panicked"))))
            .collect()
    });
    let elapsed = start.elapsed();
    let mut hist = new_hist()?;
    let mut ops = 0;
    for r in results {
        let (n, h) = r?;
        ops += n;
        hist.add(&h).context("merging histograms")?;
    }
    Ok(ParResult { ops, elapsed, hist })
}

fn new_hist() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).context("creating histogram")
}

fn worker<F>(f: &F, seed: u64, quota: Option<u64>, deadline: Option<Instant>) -> Result<(u64, Histogram<u64>)>
where
    F: Fn(&mut SmallRng) -> Result<()>,
{
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut hist = new_hist()?;
    let mut n = 0u64;
    loop {
        if quota.is_some_and(|q| n >= q) {
            break;
        }
        let t0 = Instant::now();
        if deadline.is_some_and(|d| t0 >= d) {
            break;
        }
        f(&mut rng)?;
        let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        hist.saturating_record(ns.max(1));
        n += 1;
    }
    Ok((n, hist))
}
