//! One replicated range on one back-end: its datastore and its place in the range's chain.
//!
//! The head orders updates (assigns sequence numbers and decides conditional mutations);
//! every node keeps the updates it forwarded until the tail's ack comes back ("sent" list).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fawn_ds::{DataStore, Meta};
use fawn_proto::native::{ChainMsg, Epoch, ReplEffect, ReqId, WireError};
use fawn_proto::op::{decide, Effect, Item, Outcome, Update};
use fawn_ring::Range;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use crate::clock::{flushed, next_seq, unix_now};

/// Request ids remembered per range for retried-update deduplication.
pub const DEDUP_ENTRIES_MAX: usize = 65_536;

/// Head-side ordering state.
#[derive(Default)]
struct Order {
    last_seq: u64,
    recent: HashMap<ReqId, (u64, Outcome)>,
    recent_order: VecDeque<ReqId>,
}

impl Order {
    fn remember(&mut self, req: ReqId, seq: u64, outcome: Outcome) {
        if self.recent.insert(req, (seq, outcome)).is_none() {
            self.recent_order.push_back(req);
        }
        while self.recent_order.len() > DEDUP_ENTRIES_MAX {
            if let Some(old) = self.recent_order.pop_front() {
                self.recent.remove(&old);
            }
        }
    }
}

/// What the head must do after ordering an update.
pub enum Ordered {
    /// Reply now (nothing to write, and nothing earlier is uncommitted).
    Reply(Outcome),
    /// Wait until `seq` is acknowledged by the tail, then reply.
    AwaitAck { seq: u64, outcome: Outcome },
}

/// One range's replica.
pub struct RangeReplica {
    pub range: Range,
    pub store: Arc<DataStore>,
    order: tokio::sync::Mutex<Order>,
    apply: tokio::sync::Mutex<()>,
    acked: AtomicU64,
    waiters: Mutex<BTreeMap<u64, Vec<oneshot::Sender<()>>>>,
    unacked: Mutex<BTreeMap<u64, ChainMsg>>,
}

impl RangeReplica {
    pub fn new(range: Range, store: DataStore) -> RangeReplica {
        let last = store.max_seq();
        RangeReplica {
            range,
            store: Arc::new(store),
            order: tokio::sync::Mutex::new(Order { last_seq: last, ..Order::default() }),
            apply: tokio::sync::Mutex::new(()),
            acked: AtomicU64::new(last),
            waiters: Mutex::new(BTreeMap::new()),
            unacked: Mutex::new(BTreeMap::new()),
        }
    }

    /// The visible item for `key` (absent if deleted, expired or flushed).
    pub fn read(&self, key: &[u8], flush_at: u32) -> Result<Option<Item>, WireError> {
        let entry = self.store.lookup(key).map_err(storage)?;
        let now = unix_now();
        Ok(entry.and_then(|e| {
            let item = Item { value: e.value, flags: e.meta.flags, expiry: e.meta.expiry, cas: e.meta.seq };
            let hidden = fawn_proto::op::is_expired(item.expiry, now) || flushed(item.cas, flush_at, now);
            (!hidden).then_some(item)
        }))
    }

    /// Head: decide and append an update, and hand it to the link to the successor
    /// (`None` when the head is also the tail). Sending happens under the ordering lock, so
    /// the successor receives the range's updates in sequence order.
    pub async fn order_update(
        &self,
        epoch: Epoch,
        req: ReqId,
        update: &Update,
        flush_at: u32,
        successor: Option<&mpsc::Sender<ChainMsg>>,
    ) -> Result<Ordered, WireError> {
        let mut order = self.order.lock().await;
        if let Some((seq, outcome)) = order.recent.get(&req) {
            return Ok(Ordered::AwaitAck { seq: *seq, outcome: outcome.clone() });
        }
        let current = self.read(&update.key, flush_at)?;
        let seq = next_seq(order.last_seq.max(self.store.max_seq()));
        let (outcome, effect) = decide(update, current.as_ref(), unix_now(), seq);
        let effect = match effect {
            Effect::None => {
                // A failed condition was judged against the head's state, which may hold
                // updates not yet committed: reply only once they are.
                let pending = order.last_seq;
                return Ok(Ordered::AwaitAck { seq: pending, outcome });
            }
            Effect::Put { value, flags, expiry } => ReplEffect::Put { value, flags, expiry },
            Effect::Delete => ReplEffect::Delete,
        };
        let prev_seq = order.last_seq;
        self.write(&update.key, &effect, seq)?;
        order.last_seq = seq;
        order.remember(req, seq, outcome.clone());
        let Some(successor) = successor else {
            self.on_ack(seq);
            return Ok(Ordered::Reply(outcome));
        };
        let msg =
            ChainMsg::Replicate { epoch, range: self.range, seq, prev_seq, key: update.key.clone(), effect };
        self.unacked.lock().insert(seq, msg.clone());
        // A dead link keeps the message in `unacked`; the link resends it on reconnect.
        let _ = successor.send(msg).await;
        Ok(Ordered::AwaitAck { seq, outcome })
    }

    /// Waits until `seq` is acknowledged by the tail.
    pub async fn wait_acked(&self, seq: u64, timeout: Duration) -> Result<(), WireError> {
        let rx = {
            let mut waiters = self.waiters.lock();
            if self.acked.load(Ordering::Acquire) >= seq {
                return Ok(());
            }
            let (tx, rx) = oneshot::channel();
            waiters.entry(seq).or_default().push(tx);
            rx
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(WireError::Timeout),
        }
    }

    /// Records that everything up to `seq` is stored at the tail.
    pub fn on_ack(&self, seq: u64) {
        self.acked.fetch_max(seq, Ordering::AcqRel);
        let mut unacked = self.unacked.lock();
        let rest = unacked.split_off(&(seq + 1));
        *unacked = rest;
        drop(unacked);
        let mut waiters = self.waiters.lock();
        let rest = waiters.split_off(&(seq + 1));
        let done = std::mem::replace(&mut *waiters, rest);
        drop(waiters);
        for tx in done.into_values().flatten() {
            let _ = tx.send(());
        }
    }

    /// Highest sequence number known stored at the tail.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Acquire)
    }

    /// Mid or tail: apply one replicated update. Returns what to do next.
    pub async fn apply_replicate(&self, seq: u64, prev_seq: u64, key: &[u8], effect: &ReplEffect) -> Applied {
        let _serial = self.apply.lock().await;
        let have = self.store.max_seq();
        if seq <= have {
            return Applied::Duplicate { have };
        }
        if prev_seq > have {
            return Applied::Gap { have };
        }
        match self.write(key, effect, seq) {
            Ok(()) => Applied::Stored,
            Err(e) => Applied::Failed(e),
        }
    }

    /// Remembers a forwarded update until its ack arrives.
    pub fn remember_forwarded(&self, seq: u64, msg: ChainMsg) {
        self.unacked.lock().insert(seq, msg);
    }

    /// Number of updates forwarded but not yet acknowledged.
    pub fn unacked_len(&self) -> usize {
        self.unacked.lock().len()
    }

    /// Updates forwarded but not acknowledged, in order (resent after a reconnect).
    pub fn unacked(&self) -> Vec<ChainMsg> {
        self.unacked.lock().values().cloned().collect()
    }

    /// Every update in the log with a sequence number above `after`, as chain messages.
    pub fn updates_after(&self, epoch: Epoch, after: u64) -> Result<Vec<ChainMsg>, WireError> {
        let mut out = Vec::new();
        let mut prev = after;
        for record in self.store.iter() {
            let record = record.map_err(storage)?;
            if record.meta.seq <= prev {
                continue;
            }
            let effect = match record.kind {
                fawn_ds::RecordKind::Put => ReplEffect::Put {
                    value: record.value,
                    flags: record.meta.flags,
                    expiry: record.meta.expiry,
                },
                fawn_ds::RecordKind::Delete => ReplEffect::Delete,
            };
            out.push(ChainMsg::Replicate {
                epoch,
                range: self.range,
                seq: record.meta.seq,
                prev_seq: prev,
                key: record.key,
                effect,
            });
            prev = record.meta.seq;
        }
        Ok(out)
    }

    fn write(&self, key: &[u8], effect: &ReplEffect, seq: u64) -> Result<(), WireError> {
        let result = match effect {
            ReplEffect::Put { value, flags, expiry } => {
                let meta = Meta { seq, flags: *flags, expiry: *expiry };
                blocking(|| self.store.store(key, value, meta))
            }
            ReplEffect::Delete => blocking(|| self.store.delete(key, Meta { seq, ..Meta::default() })),
        };
        result.map_err(storage)
    }
}

/// The result of applying a replicated update.
pub enum Applied {
    Stored,
    Duplicate { have: u64 },
    Gap { have: u64 },
    Failed(WireError),
}

/// Runs a possibly-fsyncing storage call without stalling other tasks on this worker.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

fn storage(e: fawn_ds::Error) -> WireError {
    match e {
        fawn_ds::Error::KeyTooLarge { .. } | fawn_ds::Error::ValueTooLarge { .. } => WireError::TooLarge,
        other => WireError::Storage(other.to_string()),
    }
}
