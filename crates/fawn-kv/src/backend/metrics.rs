//! The back-end's Prometheus metrics.

use super::*;
use crate::metrics::{self, Exposition};

impl Exposition for Backend {
    fn metrics(&self) -> String {
        let mut out = String::new();
        let node = format!("node=\"{}\",", self.options.node);
        let c = &self.counters;
        for (name, v) in [
            ("fawn_backend_gets_total", &c.gets),
            ("fawn_backend_updates_total", &c.updates),
            ("fawn_backend_replicated_total", &c.replicated),
            ("fawn_backend_acks_total", &c.acks),
            ("fawn_backend_stale_epoch_total", &c.stale_epoch),
            ("fawn_backend_lease_refusals_total", &c.lease_refusals),
            ("fawn_backend_stale_leases_total", &c.stale_leases),
            ("fawn_backend_syncs_completed_total", &c.syncs_completed),
            ("fawn_backend_syncs_suffix_total", &c.syncs_suffix),
            ("fawn_backend_syncs_full_total", &c.syncs_full),
            ("fawn_backend_sync_suffix_bytes_total", &c.sync_suffix_bytes),
            ("fawn_backend_sync_full_bytes_total", &c.sync_full_bytes),
            ("fawn_backend_suffix_refusals_total", &*c.suffix_refusals),
            ("fawn_backend_link_stalls_total", &c.link_stalls),
            ("fawn_backend_link_cuts_reported_total", &c.link_cuts_reported),
            ("fawn_backend_disk_faults_total", &c.disk_faults),
        ] {
            metrics::line(&mut out, name, &node, v.load(Ordering::Relaxed));
        }
        c.get_latency.render(&mut out, "fawn_backend_get_seconds", &node);
        c.update_latency.render(&mut out, "fawn_backend_update_seconds", &node);
        metrics::line(&mut out, "fawn_backend_chain_queue_depth", &node, self.links.queued());
        let budget = &self.reply_budget;
        for share in server::Share::ALL {
            let labels = format!("{node}share=\"{}\",", share.name());
            metrics::line(
                &mut out,
                "fawn_backend_reply_budget_free_bytes",
                &labels,
                budget.free_bytes(share) as u64,
            );
            metrics::line(&mut out, "fawn_backend_reply_budget_waits_total", &labels, budget.waits(share));
        }
        metrics::line(&mut out, "fawn_backend_native_write_stalls_total", &node, budget.stalled_closed());
        metrics::line(&mut out, "fawn_backend_epoch", &node, self.current().config.epoch);
        for r in self.replicas.read().values() {
            let s = r.store.stats();
            let labels = format!("{node}range=\"{}\",", r.range.id_string());
            metrics::line(&mut out, "fawn_datastore_live_keys", &labels, s.live_keys);
            metrics::line(&mut out, "fawn_datastore_log_bytes", &labels, s.log_bytes);
            metrics::line(&mut out, "fawn_datastore_index_bytes", &labels, s.index_bytes);
            metrics::line(&mut out, "fawn_datastore_index_slots", &labels, s.index_capacity);
            metrics::line(&mut out, "fawn_datastore_unacked_updates", &labels, r.unacked_len() as u64);
            datastore_maintenance_metrics(&mut out, &labels, &s);
        }
        out
    }
}

/// What an operator needs to see of a datastore's space and cleaning: live and
/// garbage bytes, bytes written by clients and by cleaning (their ratio is the write
/// amplification), and how long the last maintenance ran and held the writers' lock.
pub(super) fn datastore_maintenance_metrics(out: &mut String, labels: &str, s: &fawn_ds::Stats) {
    for (name, v) in [
        ("fawn_datastore_live_bytes", s.live_bytes),
        ("fawn_datastore_garbage_bytes", s.garbage_bytes),
        ("fawn_datastore_reclaimable_bytes", s.reclaimable_bytes),
        ("fawn_datastore_cold_log_bytes", s.cold_log_bytes),
        ("fawn_datastore_user_written_bytes_total", s.bytes_written_user),
        ("fawn_datastore_cleaning_written_bytes_total", s.bytes_written_cleaning),
        ("fawn_datastore_maintenance_ops_total", s.maintenance_ops),
        ("fawn_datastore_auto_compact_errors_total", s.auto_compact_errors),
        ("fawn_datastore_write_stalls_total", s.write_stalls),
        ("fawn_datastore_poisoned", u64::from(s.poisoned)),
        ("fawn_datastore_background_sync_errors_total", s.background_sync_errors),
    ] {
        metrics::line(out, name, labels, v);
    }
    for (name, us) in [
        ("fawn_datastore_last_maintenance_seconds", s.last_maintenance_us),
        ("fawn_datastore_last_lock_hold_seconds", s.last_lock_hold_us),
        ("fawn_datastore_max_lock_hold_seconds", s.max_lock_hold_us),
    ] {
        metrics::seconds_line(out, name, labels, us);
    }
}

/// Guards the operator's view of cleaning: the per-range maintenance metrics come
/// from a real datastore's stats and move when a real compaction runs.
#[cfg(test)]
mod maintenance_metrics_tests {
    use super::datastore_maintenance_metrics;
    use fawn_ds::{DataStore, Meta, Options};

    fn value_of(out: &str, name: &str) -> f64 {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .unwrap_or_else(|| panic!("{name} missing in\n{out}"));
        line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("bad line {line}"))
    }

    #[test]
    fn compaction_shows_in_the_datastore_metrics() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = Options { auto_compact: false, ..Options::default() };
        let ds = DataStore::open(dir.path(), options).expect("open");
        let value = vec![7u8; 1000];
        for round in 0..4u64 {
            for k in 0..200u64 {
                let meta = Meta { seq: round * 1000 + k + 1, flags: 0, expiry: 0, state: 0 };
                ds.store(format!("key-{k}").as_bytes(), &value, meta).expect("store");
            }
        }
        let labels = "node=\"0\",range=\"r\",";
        let mut before = String::new();
        datastore_maintenance_metrics(&mut before, labels, &ds.stats());
        assert!(value_of(&before, "fawn_datastore_garbage_bytes") > 3.0 * 200.0 * 1000.0);
        assert_eq!(value_of(&before, "fawn_datastore_maintenance_ops_total"), 0.0);
        assert_eq!(value_of(&before, "fawn_datastore_cleaning_written_bytes_total"), 0.0);

        ds.compact().expect("compact");
        let mut after = String::new();
        datastore_maintenance_metrics(&mut after, labels, &ds.stats());
        assert_eq!(value_of(&after, "fawn_datastore_maintenance_ops_total"), 1.0);
        assert!(value_of(&after, "fawn_datastore_garbage_bytes") < 1000.0, "{after}");
        assert_eq!(value_of(&after, "fawn_datastore_reclaimable_bytes"), 0.0);
        assert!(value_of(&after, "fawn_datastore_live_bytes") >= 200.0 * 1000.0);
        assert!(value_of(&after, "fawn_datastore_cleaning_written_bytes_total") >= 200.0 * 1000.0);
        assert!(value_of(&after, "fawn_datastore_user_written_bytes_total") >= 800.0 * 1000.0);
        assert!(value_of(&after, "fawn_datastore_last_maintenance_seconds") > 0.0);
        assert!(value_of(&after, "fawn_datastore_last_lock_hold_seconds") > 0.0);
        assert_eq!(value_of(&after, "fawn_datastore_poisoned"), 0.0);
        assert!(after.contains("fawn_datastore_max_lock_hold_seconds{node=\"0\",range=\"r\"}"));
    }
}
