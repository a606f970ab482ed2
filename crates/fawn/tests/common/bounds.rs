//! Support for the resource-bound tests: resident memory of a role process sampled while
//! hostile clients run, and whether a server has closed a connection.

#![allow(dead_code)]

use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One manager, one back-end, one front-end (one replica, one virtual id), with extra flags.
pub fn one_of_each(frontend_args: &[&str], backend_args: &[&str]) -> super::procs::ProcShape {
    let owned = |args: &[&str]| args.iter().map(|a| a.to_string()).collect();
    super::procs::ProcShape {
        backends: 1,
        replicas: 1,
        vnodes: 1,
        frontend_args: owned(frontend_args),
        backend_args: owned(backend_args),
        ..super::procs::ProcShape::default()
    }
}

/// Resident set size of process `pid` in bytes (`VmRSS` of /proc), 0 if it is gone.
pub fn rss_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Samples a process's RSS every 50 ms on a thread until dropped or [`RssPeak::stop`]ped.
pub struct RssPeak {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RssPeak {
    pub fn start(pid: i32) -> RssPeak {
        let peak = Arc::new(AtomicU64::new(rss_bytes(pid)));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(rss_bytes(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        RssPeak { peak, stop, thread: Some(thread) }
    }

    /// The highest RSS seen so far, in bytes.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Stops sampling; returns the peak.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak()
    }
}

impl Drop for RssPeak {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Whether the server closed `stream` within `within`: reads (discarding whatever it still
/// sends) until end of stream or a reset.
pub fn closed_by_server(mut stream: &TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        stream.set_read_timeout(Some(left.min(Duration::from_millis(500)))).expect("timeout");
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
}

/// Everything the server sent on `stream` before closing it (at most `within` spent).
pub fn read_until_closed(mut stream: &TcpStream, within: Duration) -> Vec<u8> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        stream.set_read_timeout(Some(left.max(Duration::from_millis(1)))).expect("timeout");
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    out
}
