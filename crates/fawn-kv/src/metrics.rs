//! Prometheus text exposition on `GET /metrics`, and a fixed-bucket latency histogram.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Upper bounds of the latency buckets, in microseconds.
const BUCKETS_US: [u64; 12] =
    [50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 1_000_000, u64::MAX];
/// Largest HTTP request head read from a scraper.
const REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;

/// A latency histogram with Prometheus-style cumulative output.
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS_US.len()],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        let us = d.as_micros() as u64;
        let i = BUCKETS_US.iter().position(|b| us <= *b).unwrap_or(BUCKETS_US.len() - 1);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Appends the histogram as `name_bucket`, `name_sum` (seconds) and `name_count`.
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, bound) in BUCKETS_US.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let le = if *bound == u64::MAX { "+Inf".to_string() } else { format!("{}", *bound as f64 / 1e6) };
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{{}}} {sum}", labels.trim_end_matches(','));
        let _ = writeln!(
            out,
            "{name}_count{{{}}} {}",
            labels.trim_end_matches(','),
            self.count.load(Ordering::Relaxed)
        );
    }
}

/// Appends one gauge or counter line.
pub fn line(out: &mut String, name: &str, labels: &str, value: u64) {
    let _ = writeln!(out, "{name}{{{}}} {value}", labels.trim_end_matches(','));
}

/// Appends one gauge line whose value is a duration given in microseconds, in seconds.
pub fn seconds_line(out: &mut String, name: &str, labels: &str, us: u64) {
    let _ = writeln!(out, "{name}{{{}}} {}", labels.trim_end_matches(','), us as f64 / 1e6);
}

/// Something that can describe itself in Prometheus text format.
pub trait Exposition: Send + Sync + 'static {
    fn metrics(&self) -> String;
}

/// Serves `GET /metrics` (any path, in fact) until shutdown.
pub async fn serve(listener: TcpListener, source: Arc<dyn Exposition>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let Ok((mut stream, _)) = accepted else { continue };
        let source = source.clone();
        tokio::spawn(async move {
            let mut head = vec![0u8; REQUEST_HEAD_BYTES_MAX];
            let _ = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut head)).await;
            let body = source.metrics();
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(reply.as_bytes()).await;
        });
    }
}
