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

use super::*;

/// While the configuration does not show this node degraded, its disk fault is reported
/// again this often (the manager may have been changing leaders).
pub const DISK_FAULT_REPORT_INTERVAL: Duration = Duration::from_millis(1000);

/// This node's disk fault: the reason, and when it was last reported.
pub(super) struct DiskFault {
    pub reason: String,
    reported_at: Option<Instant>,
}

impl Backend {
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
