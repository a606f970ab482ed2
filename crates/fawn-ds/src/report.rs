//! What a maintenance operation reports: its kind, its counts and times, and where its brief
//! lock hold went (phases, and the holding thread's CPU, run-queue and blocked time). A leaf.

use std::fs::File;
use std::time::Instant;

/// Which maintenance operation a report describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaintenanceKind {
    /// Full compaction: every log's survivors are rewritten (into a new cold log when
    /// `Options::hot_cold` is on).
    Compact,
    /// Hot compaction (`Options::hot_cold`): the hot log's survivors are appended to the
    /// cold log, which is not rewritten.
    CompactHot,
    Merge,
    Split,
}

/// What one maintenance operation did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaintenanceReport {
    pub kind: MaintenanceKind,
    /// Records read by the scans (all passes, both stores for a merge).
    pub records_scanned: u64,
    /// Records written to the new log.
    pub records_written: u64,
    pub bytes_scanned: u64,
    pub bytes_written: u64,
    /// Log bytes before (this store's log; for a merge plus the other's).
    pub log_bytes_before: u64,
    /// Log bytes of the new log right after the swap (for a split: the new store's).
    pub log_bytes_after: u64,
    /// Bytes copied while holding the lock (the last tail).
    pub locked_catch_up_bytes: u64,
    /// Wall time of the whole operation.
    pub duration_us: u64,
    /// Time spent waiting for the lock (in-flight writes finishing).
    pub lock_wait_us: u64,
    /// Time the lock was held: writers were blocked this long.
    pub lock_hold_us: u64,
    /// What the lock hold spent its time on.
    pub lock: LockPhases,
}

/// What one end-of-operation lock hold spent its time on: the phases under the lock, and
/// how the holding thread used the wall time (on a CPU, waiting for one, blocked). Times in
/// microseconds. `hold_us` minus the phases is the time between them (counters, clocks).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockPhases {
    /// Waiting for the lock (in-flight appends finishing); not part of the hold.
    pub wait_us: u64,
    /// The whole hold, from acquiring the lock to having released it.
    pub hold_us: u64,
    /// Copying the tail appended since the last unlocked catch-up pass (both stores).
    pub catch_up_us: u64,
    pub catch_up_records: u64,
    pub catch_up_bytes: u64,
    /// Writing the `MAXSEQ` floor under the lock (0: not needed, or written before it).
    pub seq_floor_us: u64,
    /// `fdatasync` of the new log's locked tail (`SyncPolicy::Always`, or when the old log
    /// was fsynced during the last passes past what the new log had durable).
    pub tail_sync_us: u64,
    /// The commit `rename`.
    pub rename_us: u64,
    /// Publishing the new state (pointer swap; the old state is freed after the release).
    pub swap_us: u64,
    /// Releasing the lock(s).
    pub release_us: u64,
    /// The holding thread's time on a CPU during the hold (`/proc/thread-self/schedstat`;
    /// these four are 0 where it cannot be read).
    pub on_cpu_us: u64,
    /// Time the holding thread was runnable but not running (descheduled) during the hold.
    pub runqueue_us: u64,
    /// The rest of the hold: the thread was blocked (I/O, a kernel lock, page writeback).
    pub blocked_us: u64,
    /// Times the thread was put back on a CPU during the hold (0 = it ran uninterrupted).
    pub switches: u64,
}

impl LockPhases {
    /// Fill the thread-accounting fields from samples taken at acquisition and release.
    pub(crate) fn account(&mut self, at_acquire: Option<SchedSample>, at_release: Option<SchedSample>) {
        if let (Some(a), Some(b)) = (at_acquire, at_release) {
            self.on_cpu_us = b.on_cpu_ns.saturating_sub(a.on_cpu_ns) / 1000;
            self.runqueue_us = b.run_delay_ns.saturating_sub(a.run_delay_ns) / 1000;
            self.switches = b.slices.saturating_sub(a.slices);
            self.blocked_us = self.hold_us.saturating_sub(self.on_cpu_us + self.runqueue_us);
        }
    }
}

/// One reading of the calling thread's scheduler statistics.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SchedSample {
    on_cpu_ns: u64,
    run_delay_ns: u64,
    slices: u64,
}

/// The calling thread's `/proc/thread-self/schedstat`, opened once (outside the lock) so a
/// sample under the lock is a single `pread`.
pub(crate) struct SchedClock {
    file: Option<File>,
}

impl SchedClock {
    pub(crate) fn open() -> SchedClock {
        SchedClock { file: File::open("/proc/thread-self/schedstat").ok() }
    }

    /// Run-queue delay and slices from the schedstat file (updated at every schedule-in, so
    /// exact for a running thread); CPU time from the thread CPU clock (the file's CPU time
    /// lags by up to a tick for a running thread).
    pub(crate) fn sample(&self) -> Option<SchedSample> {
        use std::os::unix::fs::FileExt;
        let f = self.file.as_ref()?;
        let mut buf = [0u8; 96];
        let n = f.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(buf.get(..n)?).ok()?;
        let mut it = text.split_ascii_whitespace().skip(1).map(|t| t.parse::<u64>().ok());
        let (run_delay_ns, slices) = (it.next()??, it.next()??);
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        if rc != 0 {
            return None;
        }
        let on_cpu_ns = (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64);
        Some(SchedSample { on_cpu_ns, run_delay_ns, slices })
    }
}

pub(crate) fn micros_since(t: Instant) -> u64 {
    t.elapsed().as_micros() as u64
}

impl MaintenanceReport {
    pub(crate) fn new(kind: MaintenanceKind) -> MaintenanceReport {
        MaintenanceReport {
            kind,
            records_scanned: 0,
            records_written: 0,
            bytes_scanned: 0,
            bytes_written: 0,
            log_bytes_before: 0,
            log_bytes_after: 0,
            locked_catch_up_bytes: 0,
            duration_us: 0,
            lock_wait_us: 0,
            lock_hold_us: 0,
            lock: LockPhases::default(),
        }
    }
}
