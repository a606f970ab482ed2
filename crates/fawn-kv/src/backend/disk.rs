//! A datastore that cannot be written (a full disk, an I/O error, a store poisoned by a
//! failed fsync) on a node that otherwise runs: the failure detector never removes such a node
//! (it answers pings), yet every put to its ranges waits for it. The node reports it to the
//! manager (`Request::DiskFault`), which takes it out of its chains and re-replicates them
//! elsewhere (`manager::state::degrade_node`).
//!
//! The fault is sticky for the life of the process: a disk that got room again (the node's
//! dropped replicas free theirs) does not make the node a replica again by itself, or a node
//! on a nearly full disk would flap in and out of its chains. It rejoins when the operator
//! restarts it (it registers again: docs/OPERATIONS.md, "A degraded back-end").
//!
//! A disk already faulty at start (its markers or a datastore cannot be written) does not stop
//! the process: it starts with the fault, opens no copy of a range it would have to sync,
//! serves what it can still open, and reports the fault like one found later.

use super::*;

/// While the configuration does not show this node degraded, its disk fault is reported
/// again this often (the manager may have been changing leaders).
pub const DISK_FAULT_REPORT_INTERVAL: Duration = Duration::from_millis(1000);

/// This node's disk fault: the reason, and when it was last reported.
pub(super) struct DiskFault {
    pub reason: String,
    reported_at: Option<Instant>,
}

/// The reason of a failed write of this node's data directory: "no space left on device"
/// (as `fawn_ds::Error::NoSpace` names it) or the I/O error, and what was being written.
pub(super) fn io_fault_reason(e: &std::io::Error, what: &str) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => format!("{} ({what})", fawn_ds::Error::NoSpace),
        _ => format!("I/O error: {e} ({what})"),
    }
}

/// Whether `e` (from opening or creating a datastore) is the disk's fault — no room, an I/O
/// error, a poisoned store — rather than what it holds (corrupt data is not).
pub(super) fn is_disk_error(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some()
            || matches!(
                c.downcast_ref::<fawn_ds::Error>(),
                Some(fawn_ds::Error::NoSpace | fawn_ds::Error::Io { .. } | fawn_ds::Error::Poisoned)
            )
    })
}

/// A fault found before the back-end runs (at start), to start with.
pub(super) fn fault_at_start(reason: String, counters: &Counters) -> Option<DiskFault> {
    error!(reason, "this back-end's disk cannot be written: starting degraded");
    counters.disk_faults.fetch_add(1, Ordering::Relaxed);
    Some(DiskFault { reason, reported_at: None })
}

impl Backend {
    /// Records a fault found while opening or creating a datastore (the first one is kept).
    pub(super) fn note_disk_fault(&self, reason: String) {
        let mut fault = self.disk_fault.lock();
        if fault.is_none() {
            error!(reason, "a datastore cannot be opened or created: asking the manager to take this back-end out of its chains");
            self.counters.disk_faults.fetch_add(1, Ordering::Relaxed);
            *fault = Some(DiskFault { reason, reported_at: None });
        }
    }

    /// Notices a datastore of `replicas` that failed a write (the first one found is the
    /// reason) and tells the manager, until the configuration shows this node degraded.
    pub(super) fn check_disk(&self, replicas: &[Arc<RangeReplica>]) {
        let mut fault = self.disk_fault.lock();
        if fault.is_none() {
            let Some((range, why)) = replicas.iter().find_map(|r| r.write_fault().map(|w| (r.range, w)))
            else {
                return;
            };
            let reason = format!("{why} (datastore of range {})", range.id_string());
            error!(
                reason,
                "a datastore cannot be written: asking the manager to take this back-end out of its chains"
            );
            self.counters.disk_faults.fetch_add(1, Ordering::Relaxed);
            *fault = Some(DiskFault { reason, reported_at: None });
        }
        let Some(f) = fault.as_mut() else { return };
        if self.degraded_in(&self.current().config) {
            return;
        }
        if f.reported_at.is_some_and(|t| t.elapsed() < DISK_FAULT_REPORT_INTERVAL) {
            return;
        }
        f.reported_at = Some(Instant::now());
        let req = Request::DiskFault { node: self.options.node, reason: f.reason.clone() };
        drop(fault);
        let Some(b) = self.me.upgrade() else { return };
        tokio::spawn(async move { b.report(req, "a datastore write fault").await });
    }

    /// Whether `config` shows this node degraded.
    pub(super) fn degraded_in(&self, config: &ClusterConfig) -> bool {
        config.backends.iter().any(|b| b.node == self.options.node && b.state == NodeState::Degraded)
    }

    /// The reason of this node's disk fault, if it has one.
    pub fn disk_fault(&self) -> Option<String> {
        self.disk_fault.lock().as_ref().map(|f| f.reason.clone())
    }
}
