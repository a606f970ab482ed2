//! A one-line progress report on stderr while a run is going.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// Counters the connections bump and the progress line reads.
#[derive(Default, Debug)]
pub struct Counters {
    pub done: AtomicU64,
    pub errors: AtomicU64,
}

/// Print progress every second until `end` (in place on a terminal; every 5 s otherwise, so logs
/// stay readable). Does nothing when `quiet`.
pub fn spawn(
    label: String,
    counters: Arc<Counters>,
    warmup_end: Instant,
    end: Instant,
    quiet: bool,
) -> Option<tokio::task::JoinHandle<()>> {
    if quiet {
        return None;
    }
    Some(tokio::spawn(async move {
        let tty = std::io::stderr().is_terminal();
        let every = if tty { 1 } else { 5 };
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let (mut last, mut n) = (0u64, 0u64);
        loop {
            tick.tick().await;
            let now = Instant::now();
            if now >= end {
                break;
            }
            let done = counters.done.load(Ordering::Relaxed);
            let errors = counters.errors.load(Ordering::Relaxed);
            n += 1;
            if n % every == 0 {
                let phase = if now < warmup_end { "warmup" } else { "measure" };
                let left = end.saturating_duration_since(now).as_secs();
                let line = format!(
                    "{label}: {phase} {:>9} ops/s, {errors} errors, {left}s left",
                    (done - last) / every
                );
                let mut err = std::io::stderr().lock();
                let _ = if tty { write!(err, "\r\x1b[2K{line}") } else { writeln!(err, "{line}") };
                let _ = err.flush();
                last = done;
            }
        }
        if tty {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }))
}
