//! Prompt drain reports for ranges being split or merged.
//!
//! A range marked `splitting` or `merging` refuses puts at its head until the manager installs
//! the new ranges, and the manager does that only once the head says it is drained
//! (`Request::SplitReady` / `Request::MergeReady`). The periodic tick would say so up to
//! `TICK_INTERVAL` late, and a head whose merge waits on the other range's head would learn of
//! the merge only at its next configuration poll: all of that is time clients' puts wait.
//! So a head of a marked range watches it closely: it reports the drain within
//! `DRAIN_WATCH_POLL` of it happening, and while a merge waits on the other head it asks the
//! manager for the configuration every `MERGE_WAIT_POLL`. The tick and the poll stay the
//! fallback once the watch gives up (`DRAIN_WATCH_MAX`). The other replicas install the split
//! or merge when the head's first update after it reaches them, so they need no watch of their
//! own.
//!
//! A put the head refuses meanwhile is not refused at once: the front-end would back off
//! exponentially (25, 50, 100 ms ...) and so wait up to twice as long as the range was blocked.
//! It is parked until a newer configuration is installed here (at most `PUT_PARK_MAX`) and then
//! answered `StaleEpoch`, which a front-end retries at once with the new configuration.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_proto::native::{Epoch, Request, WireError};
use fawn_ring::Range;
use tracing::debug;

use super::Backend;

/// How often a watched head checks whether it has drained.
const DRAIN_WATCH_POLL: Duration = Duration::from_millis(2);
/// How often a drained head of a range being merged asks the manager whether the merge is on.
const MERGE_WAIT_POLL: Duration = Duration::from_millis(20);
/// A watch ends after this long (a bulk copy of a very large range may take that); the tick
/// and the configuration poll carry on from there.
const DRAIN_WATCH_MAX: Duration = Duration::from_secs(600);
/// Longest a put refused by a range being split or merged waits here for the new
/// configuration before it is answered `Unavailable` (well under a front-end's request
/// time-out, 3 s by default).
const PUT_PARK_MAX: Duration = Duration::from_millis(500);

impl Backend {
    /// Starts a watch for every range that this node heads in the installed configuration and
    /// that is being split or merged (one watch per range at a time).
    pub(super) fn watch_drains(&self) {
        let Some(me) = self.me.upgrade() else { return };
        let view = self.current();
        for rc in &view.config.ranges {
            if !rc.is_reshaping()
                || rc.head() != Some(self.options.node)
                || !self.drain_watch.lock().insert(rc.range)
            {
                continue;
            }
            let (b, range) = (Arc::clone(&me), rc.range);
            tokio::spawn(async move {
                b.watch_drain(range).await;
                b.drain_watch.lock().remove(&range);
            });
        }
    }

    /// Reports `range` drained as soon as it is, then, while its merge waits on the other
    /// head, polls the manager until the configuration no longer marks it. Ends when the range
    /// is gone (split or merged here), unmarked, or no longer headed here.
    async fn watch_drain(&self, range: Range) {
        let started = Instant::now();
        let mut last_fetch: Option<Instant> = None;
        while started.elapsed() < DRAIN_WATCH_MAX {
            let Some(r) = self.replica(&range) else { return };
            let route = r.route().await;
            if !route.rc.is_reshaping() || !route.is_head() {
                return;
            }
            let poll_due = last_fetch.is_none_or(|t| t.elapsed() >= MERGE_WAIT_POLL);
            if r.ready_to_split().await {
                debug!(range = %range.id_string(), ms = started.elapsed().as_millis() as u64, "drained for a split");
                let req = Request::SplitReady { node: self.options.node, range };
                self.report(req, "a drained range ready to split").await;
            } else if r.ready_to_merge().await {
                debug!(range = %range.id_string(), ms = started.elapsed().as_millis() as u64, "drained for a merge");
                let req = Request::MergeReady { node: self.options.node, range };
                self.report(req, "a drained range ready to merge").await;
            } else if route.rc.merge_drained && poll_due {
                last_fetch = Some(Instant::now());
                self.fetch_and_install().await;
            }
            // While the bulk copy runs nothing can happen soon: look less often.
            let pause =
                if r.bulk_copy_pending.load(Ordering::Acquire) { MERGE_WAIT_POLL } else { DRAIN_WATCH_POLL };
            tokio::time::sleep(pause).await;
        }
    }

    /// Waits until a configuration newer than `refused_at` is installed (or `PUT_PARK_MAX`
    /// passes), for a put refused because its range is being split or merged: the answer
    /// sends the front-end to the new configuration at once.
    pub(super) async fn park_until_reshaped(&self, refused_at: Epoch, why: String) -> WireError {
        let mut installed = self.installed_epoch.subscribe();
        let newer = tokio::time::timeout(PUT_PARK_MAX, installed.wait_for(|e| *e > refused_at)).await;
        match newer {
            Ok(Ok(current)) => WireError::StaleEpoch { current: *current },
            _ => WireError::Unavailable(why),
        }
    }
}
