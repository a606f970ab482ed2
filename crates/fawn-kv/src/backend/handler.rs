//! Requests and chain messages: a client's get or update routed to its range's replica,
//! status and digests, and chain messages to the replica they are for.

use super::*;
use crate::replica::sync::CopyEnd;
use crate::server::Answer;

impl Backend {
    pub(super) async fn get(&self, epoch: Epoch, key: &[u8]) -> Result<Response, WireError> {
        let mut view = self.view_for(epoch).await?;
        if let Ok((_, replica)) = self.replica_for_key(&view, key) {
            if !replica.readable() && replica.wait_readable(TAIL_CATCH_UP_WAIT).await {
                // The configuration (and the lease) may have moved on while waiting: check again.
                view = self.view_for(epoch).await?;
            }
        }
        self.get_by(&view, key).map_err(|e| for_sender(e, epoch, &view))
    }

    pub(super) fn get_by(&self, view: &View, key: &[u8]) -> Result<Response, WireError> {
        let (rc, replica) = self.replica_for_key(view, key)?;
        if rc.tail() != Some(self.options.node) {
            return Err(WireError::WrongNode(format!("node {} is not the tail", self.options.node)));
        }
        if !replica.readable() {
            return Err(WireError::Unavailable("new tail is catching up".into()));
        }
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        Ok(Response::Get(replica.read(key, view.config.flush_at_micros)?))
    }

    pub(super) async fn update(
        &self,
        epoch: Epoch,
        (req, floor): (ReqId, u64),
        update: Update,
        reply_to: Option<String>,
    ) -> Result<Response, WireError> {
        let view = self.view_for(epoch).await?;
        let (_, replica) =
            self.replica_for_key(&view, &update.key).map_err(|e| for_sender(e, epoch, &view))?;
        self.counters.updates.fetch_add(1, Ordering::Relaxed);
        let links = self.linker();
        let ordered = match replica
            .order_update(
                ClientReq { req, floor, epoch },
                &update,
                reply_to,
                view.config.flush_at_micros,
                &links,
            )
            .await
        {
            Err(WireError::Unavailable(why)) if replica.route().await.rc.is_reshaping() => {
                return Err(self.park_until_reshaped(view.config.epoch, why).await);
            }
            ordered => ordered.map_err(|e| for_sender(e, epoch, &view))?,
        };
        match ordered {
            Ordered::Reply(outcome) => Ok(Response::Update(outcome)),
            Ordered::AwaitAck(rx) => {
                Ok(Response::Update(replica.wait_reply(req, rx, self.options.chain_timeout).await?))
            }
            // `order_update` always answers: only `order_updates` leaves one to the notice.
            Ordered::Notified => Err(WireError::Invalid("update answered by its notice".into())),
        }
    }

    /// Updates that arrived together on one connection, in order: grouped by the range
    /// they are for (each range's order kept; ranges are independent) and ordered as one
    /// step per range. One answer each, in order.
    pub(super) async fn updates_together(self: &Arc<Self>, requests: Vec<Request>) -> Vec<Answer> {
        let start = Instant::now();
        let mut answers: Vec<Option<Answer>> = requests.iter().map(|_| None).collect();
        let mut groups: Vec<UpdateGroup> = Vec::new();
        for (i, request) in requests.into_iter().enumerate() {
            let Request::Update { epoch, req, update, reply_to, floor, .. } = request else {
                answers[i] = Some(Answer::Later(Box::pin(self.clone().request(request))));
                continue;
            };
            self.counters.updates.fetch_add(1, Ordering::Relaxed);
            let view = match self.view_for(epoch).await {
                Ok(view) => view,
                Err(e) => {
                    answers[i] = Some(self.answered(start, Err(e)));
                    continue;
                }
            };
            let replica = match self.replica_for_key(&view, &update.key) {
                Ok((_, replica)) => replica,
                Err(e) => {
                    answers[i] = Some(self.answered(start, Err(for_sender(e, epoch, &view))));
                    continue;
                }
            };
            let same = |g: &UpdateGroup| {
                Arc::ptr_eq(&g.replica, &replica) && g.view.config.epoch == view.config.epoch
            };
            let at = match groups.iter().position(same) {
                Some(at) => at,
                None => {
                    groups.push(UpdateGroup { replica, view, items: Vec::new() });
                    groups.len() - 1
                }
            };
            groups[at].items.push((i, (ClientReq { req, floor, epoch }, update, reply_to)));
        }
        let links = self.linker();
        for UpdateGroup { replica, view, items } in groups {
            let (slots, updates): (Vec<_>, Vec<_>) =
                items.into_iter().map(|(i, u)| ((i, u.0.epoch, u.0.req), u)).unzip();
            // The tail sends `Committed` only to a front-end of its configuration (`Linker`):
            // an update naming any other address is answered here.
            let reaches = |to: &str| view.config.lists_frontend(to);
            let results = replica.order_updates(updates, view.config.flush_at_micros, &links, reaches).await;
            for ((i, epoch, req), result) in slots.into_iter().zip(results) {
                let answer = match result {
                    Err(WireError::Unavailable(why)) if replica.route().await.rc.is_reshaping() => {
                        let (me, refused_at) = (self.clone(), view.config.epoch);
                        Answer::Later(Box::pin(async move {
                            let refused = me.park_until_reshaped(refused_at, why).await;
                            me.counters.update_latency.record(start.elapsed());
                            Response::Error(refused)
                        }))
                    }
                    Err(e) => self.answered(start, Err(for_sender(e, epoch, &view))),
                    Ok(Ordered::Reply(outcome)) => self.answered(start, Ok(Response::Update(outcome))),
                    // Its latency here is the time to order and forward it.
                    Ok(Ordered::Notified) => {
                        self.counters.update_latency.record(start.elapsed());
                        Answer::Notified
                    }
                    Ok(Ordered::AwaitAck(rx)) => {
                        let (me, replica) = (self.clone(), replica.clone());
                        Answer::Later(Box::pin(async move {
                            let r = replica.wait_reply(req, rx, me.options.chain_timeout).await;
                            me.counters.update_latency.record(start.elapsed());
                            r.map(Response::Update).unwrap_or_else(Response::Error)
                        }))
                    }
                };
                answers[i] = Some(answer);
            }
        }
        let missing = || Answer::Now(Response::Error(WireError::Invalid("update not handled".into())));
        answers.into_iter().map(|a| a.unwrap_or_else(missing)).collect()
    }

    /// An update's answer now, its latency recorded.
    fn answered(&self, start: Instant, result: Result<Response, WireError>) -> Answer {
        self.counters.update_latency.record(start.elapsed());
        Answer::Now(result.unwrap_or_else(Response::Error))
    }

    pub(super) fn item_stats(&self) -> Response {
        let view = self.current();
        let me = self.options.node;
        let (mut curr_items, mut bytes) = (0, 0);
        for rc in view.config.ranges.iter().filter(|rc| rc.tail() == Some(me)) {
            if let Some(r) = self.replica(&rc.range) {
                let stats = r.store.stats();
                curr_items += stats.live_keys;
                bytes += stats.log_bytes;
            }
        }
        Response::ItemStats { curr_items, bytes }
    }

    pub(super) fn digest(
        &self,
        range: Range,
        after_key: Option<Vec<u8>>,
        limit: u32,
    ) -> Result<Response, WireError> {
        let replica =
            self.replica(&range).ok_or_else(|| WireError::WrongNode("range not held here".into()))?;
        let mut latest: BTreeMap<Vec<u8>, DigestEntry> = BTreeMap::new();
        for record in replica.store.iter() {
            let record = record.map_err(|e| WireError::Storage(e.to_string()))?;
            // A split range's datastore holds the other part's keys until it is compacted.
            if after_key.as_ref().is_some_and(|a| record.key <= *a) || !range.contains(key_id(&record.key)) {
                continue;
            }
            let value_crc = match record.kind {
                fawn_ds::RecordKind::Put => Some(crc32c::crc32c(&record.value)),
                fawn_ds::RecordKind::Delete => None,
            };
            let entry = DigestEntry { key: record.key.clone(), seq: record.meta.seq, value_crc };
            latest.insert(record.key, entry);
        }
        let limit = limit.min(DIGEST_PAGE_ENTRIES_MAX) as usize;
        Ok(Response::Digest(latest.into_values().take(limit).collect()))
    }

    pub(super) fn status(&self) -> Response {
        let c = &self.counters;
        let replicas = self.replicas.read();
        let mut counters = vec![
            ("gets".to_string(), c.gets.load(Ordering::Relaxed)),
            ("updates".to_string(), c.updates.load(Ordering::Relaxed)),
            ("replicated".to_string(), c.replicated.load(Ordering::Relaxed)),
            ("stale_epoch".to_string(), c.stale_epoch.load(Ordering::Relaxed)),
            ("lease_refusals".to_string(), c.lease_refusals.load(Ordering::Relaxed)),
            ("stale_leases".to_string(), c.stale_leases.load(Ordering::Relaxed)),
            ("syncs_completed".to_string(), c.syncs_completed.load(Ordering::Relaxed)),
            ("syncs_suffix".to_string(), c.syncs_suffix.load(Ordering::Relaxed)),
            ("syncs_full".to_string(), c.syncs_full.load(Ordering::Relaxed)),
            ("sync_suffix_bytes".to_string(), c.sync_suffix_bytes.load(Ordering::Relaxed)),
            ("sync_full_bytes".to_string(), c.sync_full_bytes.load(Ordering::Relaxed)),
            ("suffix_refusals".to_string(), c.suffix_refusals.load(Ordering::Relaxed)),
            ("link_stalls".to_string(), c.link_stalls.load(Ordering::Relaxed)),
            ("stalled_links".to_string(), self.stalled_links.lock().len() as u64),
            ("link_cuts_reported".to_string(), c.link_cuts_reported.load(Ordering::Relaxed)),
            ("cut_links".to_string(), self.reported_cuts.lock().len() as u64),
            ("disk_faults".to_string(), c.disk_faults.load(Ordering::Relaxed)),
            ("ranges".to_string(), replicas.len() as u64),
        ];
        let (mut keys, mut log_bytes, mut unacked) = (0, 0, 0);
        for r in replicas.values() {
            let s = r.store.stats();
            keys += s.live_keys;
            log_bytes += s.log_bytes;
            unacked += r.unacked_len() as u64;
        }
        let budget = &self.reply_budget;
        for share in crate::server::Share::ALL {
            counters
                .push((format!("reply_budget_{}_free_bytes", share.name()), budget.free_bytes(share) as u64));
            counters.push((format!("reply_budget_{}_waits", share.name()), budget.waits(share)));
        }
        counters.push(("native_write_stalls".into(), budget.stalled_closed()));
        counters.push(("live_keys".into(), keys));
        counters.push(("log_bytes".into(), log_bytes));
        counters.push(("unacked".into(), unacked));
        Response::Status(NodeStatus {
            role: format!("backend {}", self.options.node),
            epoch: self.current().config.epoch,
            uptime_secs: self.started.elapsed().as_secs(),
            counters,
        })
    }

    /// A chain message for a range this node does not (yet) hold: maybe a newer configuration
    /// exists; fetch it so the sender's retry finds us ready.
    pub(super) fn maybe_behind(&self, epoch: Epoch) {
        if epoch > self.current().config.epoch {
            if let Some(b) = self.me.upgrade() {
                tokio::spawn(async move { b.catch_up_to(epoch).await });
            }
        }
    }

    /// Chain messages that arrived together from `from`, in order. Replicated updates and
    /// acks are gathered per range (each range's own order kept; ranges are independent) and
    /// handled as one step each: a range's updates with one append and their sends queued
    /// together, its acks as the highest one (acks are cumulative). Any other message first
    /// has everything before it handled.
    pub(super) async fn on_chain_batch(&self, from: NodeId, msgs: Vec<ChainMsg>) {
        let mut runs: Vec<(Range, Run)> = Vec::new();
        for msg in msgs {
            let Some(range) = chain_range(&msg) else { continue };
            let at = runs.iter().position(|(r, _)| *r == range);
            match msg {
                ChainMsg::Replicate { .. } | ChainMsg::Ack { .. } => {
                    let same_kind = at.is_none_or(|i| {
                        matches!(
                            (&runs[i].1, &msg),
                            (Run::Replicates(_), ChainMsg::Replicate { .. })
                                | (Run::Ack(_), ChainMsg::Ack { .. })
                        )
                    });
                    if !same_kind {
                        self.run_chain(from, std::mem::take(&mut runs)).await;
                    }
                    self.check_chain_epoch(from, range, &msg).await;
                    if let ChainMsg::Ack { .. } = msg {
                        self.counters.acks.fetch_add(1, Ordering::Relaxed);
                    }
                    let at = runs.iter().position(|(r, _)| *r == range);
                    match (at, msg) {
                        (Some(i), ChainMsg::Ack { seq, .. }) => {
                            if let Run::Ack(top) = &mut runs[i].1 {
                                *top = (*top).max(seq);
                            }
                        }
                        (Some(i), m) => {
                            if let Run::Replicates(v) = &mut runs[i].1 {
                                v.push(m);
                            }
                        }
                        (None, ChainMsg::Ack { seq, .. }) => runs.push((range, Run::Ack(seq))),
                        (None, m) => runs.push((range, Run::Replicates(vec![m]))),
                    }
                }
                other => {
                    self.run_chain(from, std::mem::take(&mut runs)).await;
                    if let Err(e) = self.on_chain(from, other).await {
                        error!(from, error = %e, "chain message failed");
                    }
                }
            }
        }
        self.run_chain(from, runs).await
    }

    /// Hands each range's gathered updates or ack to its replica.
    async fn run_chain(&self, from: NodeId, runs: Vec<(Range, Run)>) {
        let links = self.linker();
        for (range, run) in runs {
            let Some(replica) = self.replica(&range) else { continue };
            match run {
                Run::Replicates(msgs) => {
                    self.counters.replicated.fetch_add(msgs.len() as u64, Ordering::Relaxed);
                    if let Err(e) = replica.on_replicates(from, msgs, &links).await {
                        error!(from, error = %e, "chain message failed");
                    }
                }
                Run::Ack(seq) => replica.on_ack(from, seq, &links).await,
            }
        }
    }

    /// A chain message of an epoch ahead of this node's: fetch the newer configuration (and
    /// for an update, ask for it again once installed).
    async fn check_chain_epoch(&self, from: NodeId, range: Range, msg: &ChainMsg) {
        if let Some(epoch) = chain_epoch(msg) {
            let ahead = epoch > self.current().config.epoch;
            match msg {
                ChainMsg::Replicate { .. } if ahead => self.resend_after_catch_up(from, range, epoch),
                // A tail just promoted from syncing asks its predecessor `Resend` at once; the
                // predecessor, still the tail until it installs the same configuration, would
                // resend without `CaughtUp`, and the new tail's gets of the whole range would
                // wait for its next tick to ask again. Installing first answers it now.
                ChainMsg::Resend { .. } if ahead => self.catch_up_to(epoch).await,
                _ => self.maybe_behind(epoch),
            }
        }
    }

    pub(super) async fn on_chain(&self, from: NodeId, msg: ChainMsg) -> Result<(), WireError> {
        let links = self.linker();
        let Some(range) = chain_range(&msg) else { return Ok(()) };
        self.check_chain_epoch(from, range, &msg).await;
        let Some(replica) = self.replica(&range) else { return Ok(()) };
        match msg {
            m @ ChainMsg::Replicate { .. } => {
                self.counters.replicated.fetch_add(1, Ordering::Relaxed);
                replica.on_replicates(from, vec![m], &links).await?;
            }
            ChainMsg::Ack { seq, .. } => {
                self.counters.acks.fetch_add(1, Ordering::Relaxed);
                replica.on_ack(from, seq, &links).await;
            }
            m @ (ChainMsg::Resend { .. } | ChainMsg::CaughtUp { .. } | ChainMsg::Outcomes { .. }) => {
                replica.on_chain(from, m, &links).await
            }
            ChainMsg::SyncRequest { .. } => {
                let rate = copy_rate_for(&self.current().config, &range, &self.options);
                replica.on_sync_request(from, &links, rate).await
            }
            ChainMsg::SnapshotBegin { snapshot, .. } => replica.on_snapshot_begin(from, snapshot).await?,
            ChainMsg::SuffixSyncRequest { have_seq, top, .. } => {
                let rate = copy_rate_for(&self.current().config, &range, &self.options);
                let refusals = &self.counters.suffix_refusals;
                replica.on_suffix_sync_request(from, have_seq, &top, &links, rate, refusals).await;
            }
            ChainMsg::SuffixBegin { snapshot, after_seq, .. } => {
                if replica.on_suffix_begin(from, snapshot, after_seq).await {
                    // From its first suffix record on, the store is no prefix of the range's
                    // history until the stream ends: a restart in between must copy in full,
                    // not ask for a suffix after a record from the middle of this one.
                    // (Messages of one link are handled in order: no batch is applied yet.)
                    if let Err(e) = self.unmark_copy(&range, &replica).await {
                        error!(range = %range.id_string(), error = %e,
                            "cannot remove the whole-replica marker; dropping the suffix stream to ask again");
                        replica.drop_stream(snapshot).await;
                    }
                }
            }
            ChainMsg::SuffixRefused { .. } => {
                if replica.on_suffix_refused(from).await {
                    // Not holding it here: the replacement waits for the old replica to go.
                    drop(replica);
                    self.replace_with_fresh(range).await;
                }
            }
            ChainMsg::SnapshotBatch { snapshot, index, records, .. } => {
                replica.on_snapshot_batch(from, snapshot, index, &records).await?
            }
            ChainMsg::SnapshotEnd { snapshot, batches, upto_seq, dropped_seq_max, .. } => {
                let end = CopyEnd { snapshot, batches, upto_seq, dropped_seq_max };
                let followups = replica.on_snapshot_end(from, end, &links).await?;
                // The copy is whole: marked before the manager makes it a replica.
                if followups.sync_done && self.mark_copy_complete(&range, &replica).await {
                    self.counters.syncs_completed.fetch_add(1, Ordering::Relaxed);
                    if let Some(r) = followups.report {
                        let c = &self.counters;
                        let (n, bytes) = if r.suffix {
                            (&c.syncs_suffix, &c.sync_suffix_bytes)
                        } else {
                            (&c.syncs_full, &c.sync_full_bytes)
                        };
                        n.fetch_add(1, Ordering::Relaxed);
                        bytes.fetch_add(r.bytes, Ordering::Relaxed);
                    }
                    self.report_sync_done(range).await;
                }
            }
            ChainMsg::Hello { .. } => {}
        }
        Ok(())
    }
}

/// A client update as the head orders it: who sent it, the update and the front-end to tell
/// when it commits.
type HeadUpdate = (ClientReq, Update, Option<String>);

/// The updates of one batch for one range, with their places in the batch and epochs.
struct UpdateGroup {
    replica: Arc<RangeReplica>,
    view: Arc<View>,
    items: Vec<(usize, HeadUpdate)>,
}

/// One range's part of a batch of chain messages.
enum Run {
    /// Replicated updates, in order.
    Replicates(Vec<ChainMsg>),
    /// The highest ack.
    Ack(u64),
}

/// A role refusal to a sender that routed by an older configuration says so, so that it fetches
/// the newer one at once instead of backing off.
pub(super) fn for_sender(e: WireError, sender_epoch: Epoch, view: &View) -> WireError {
    match e {
        WireError::WrongNode(_) if sender_epoch < view.config.epoch => {
            WireError::StaleEpoch { current: view.config.epoch }
        }
        e => e,
    }
}

pub(super) fn chain_range(msg: &ChainMsg) -> Option<Range> {
    match msg {
        ChainMsg::Hello { .. } => None,
        ChainMsg::Replicate { range, .. }
        | ChainMsg::Ack { range, .. }
        | ChainMsg::Resend { range, .. }
        | ChainMsg::CaughtUp { range, .. }
        | ChainMsg::SyncRequest { range, .. }
        | ChainMsg::SnapshotBegin { range, .. }
        | ChainMsg::SnapshotBatch { range, .. }
        | ChainMsg::SnapshotEnd { range, .. }
        | ChainMsg::SuffixSyncRequest { range, .. }
        | ChainMsg::SuffixBegin { range, .. }
        | ChainMsg::SuffixRefused { range, .. }
        | ChainMsg::Outcomes { range, .. } => Some(*range),
    }
}

pub(super) fn chain_epoch(msg: &ChainMsg) -> Option<Epoch> {
    match msg {
        ChainMsg::Replicate { epoch, .. }
        | ChainMsg::Ack { epoch, .. }
        | ChainMsg::Resend { epoch, .. }
        | ChainMsg::CaughtUp { epoch, .. }
        | ChainMsg::SyncRequest { epoch, .. }
        | ChainMsg::SnapshotBegin { epoch, .. }
        | ChainMsg::SnapshotEnd { epoch, .. }
        | ChainMsg::SuffixSyncRequest { epoch, .. }
        | ChainMsg::SuffixBegin { epoch, .. }
        | ChainMsg::SuffixRefused { epoch, .. }
        | ChainMsg::Outcomes { epoch, .. } => Some(*epoch),
        ChainMsg::Hello { .. } | ChainMsg::SnapshotBatch { .. } => None,
    }
}

impl Handler for Backend {
    fn cluster_id(&self) -> Option<u64> {
        let view = self.current();
        (view.config.epoch > 0).then_some(view.config.cluster_id)
    }

    async fn request(self: Arc<Self>, request: Request) -> Response {
        let result = match request {
            Request::Get { epoch, key, .. } => {
                let start = Instant::now();
                let r = self.get(epoch, &key).await;
                self.counters.get_latency.record(start.elapsed());
                r
            }
            Request::Update { epoch, req, update, reply_to, floor, .. } => {
                let start = Instant::now();
                let r = self.update(epoch, (req, floor), update, reply_to).await;
                self.counters.update_latency.record(start.elapsed());
                r
            }
            Request::ItemStats => Ok(self.item_stats()),
            Request::RangeDigest { range, after_key, limit } => self.digest(range, after_key, limit),
            Request::Status => Ok(self.status()),
            Request::Ping => Ok(Response::Pong),
            Request::GetConfig => Ok(Response::Config(self.current().config.clone())),
            // A pushed configuration is only a prompt: the node fetches the configuration from
            // the manager group (a linearizable read from its leader) and installs that, so no
            // single frame can make it drop ranges or delete data.
            Request::Install { config } => {
                self.catch_up_to(config.epoch).await;
                Ok(Response::Ok)
            }
            other => Err(WireError::Invalid(format!("a back-end does not serve {other:?}"))),
        };
        result.unwrap_or_else(Response::Error)
    }

    async fn chain(self: Arc<Self>, from: NodeId, msg: ChainMsg) {
        if let Err(e) = self.on_chain(from, msg).await {
            error!(from, error = %e, "chain message failed");
        }
    }

    async fn updates(self: Arc<Self>, requests: Vec<Request>) -> Vec<Answer> {
        self.updates_together(requests).await
    }

    async fn chain_batch(self: Arc<Self>, from: NodeId, msgs: Vec<ChainMsg>) {
        self.on_chain_batch(from, msgs).await
    }
}
