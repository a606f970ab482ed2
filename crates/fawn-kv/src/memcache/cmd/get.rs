//! `get`, `gets`, `gat`, `gats`: one `VALUE` block per hit, then `END`.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use fawn_proto::memcache::{absolute_expiry, reply, GetCommand};
use fawn_proto::op::{is_expired, Guarded, Item, Mutation, Outcome};

use super::{bare_update, now, Ctx, Flow};
use crate::memcache::access::Marks;
use crate::memcache::budget::reply_bytes;
#[cfg(doc)]
use crate::memcache::budget::FetchBudget;
use crate::memcache::stats::Stats;
use crate::service::{KvService, ServiceError};

/// Reads of one multi-get in flight at once (each may be a round trip to another chain's tail).
const READ_FAN_OUT: usize = 64;

type ReadResult = Result<Option<Item>, ServiceError>;

/// Answers in batches of at most [`READ_FAN_OUT`] keys (fewer if the fetch budget's
/// per-connection bound asks for it, see [`FetchBudget::batch_len`]), flushing as the reply grows, so memory per request stays
/// bounded. If the cluster fails part-way, the hits so far are followed by
/// `SERVER_ERROR <message>` instead of `END` (as memcached ends a multi-get it cannot finish).
pub(super) async fn run<S: KvService>(ctx: &mut Ctx<'_, S>, get: GetCommand) {
    let mut rest = &get.keys[..];
    while !rest.is_empty() {
        let (batch, after) = rest.split_at(ctx.shared.budget.batch_len(rest, READ_FAN_OUT));
        rest = after;
        let items = match get.touch {
            None => read_batch(ctx, batch).await,
            Some(exptime) => {
                let mut items = Vec::with_capacity(batch.len());
                for key in batch {
                    items.push(touch_and_fetch(ctx, key, exptime).await);
                }
                items
            }
        };
        for (key, item) in batch.iter().zip(items) {
            match item {
                Ok(Some(item)) => {
                    read(ctx, key, &item);
                    let cas = get.cas.then_some(item.cas);
                    reply::value(ctx.out(), key, item.flags, &item.value, cas);
                }
                Ok(None) => {}
                Err(error) => return ctx.server_error(&error, false),
            }
        }
        ctx.flush_if_full().await;
        if ctx.is_broken() {
            return;
        }
    }
    ctx.reply(reply::END);
}

/// A run of pipelined plain gets (at most a few dozen keys in all, see the connection):
/// every key is read concurrently, then each request is answered in order.
pub(in crate::memcache) async fn run_pipelined<S: KvService>(
    ctx: &mut Ctx<'_, S>,
    gets: Vec<GetCommand>,
) -> Flow {
    let keys: Vec<Vec<u8>> = gets.iter().flat_map(|get| get.keys.iter().cloned()).collect();
    let mut results = read_batch(ctx, &keys).await.into_iter();
    for get in gets {
        let mut failed = None;
        for key in &get.keys {
            match results.next() {
                Some(Ok(Some(item))) if failed.is_none() => {
                    read(ctx, key, &item);
                    let cas = get.cas.then_some(item.cas);
                    reply::value(ctx.out(), key, item.flags, &item.value, cas);
                }
                Some(Err(error)) if failed.is_none() => failed = Some(error),
                _ => {}
            }
        }
        match failed {
            Some(error) => ctx.server_error(&error, false),
            None => ctx.reply(reply::END),
        }
        ctx.flush_if_full().await;
        if ctx.is_broken() {
            return Flow::Close;
        }
    }
    Flow::Continue
}

/// Reads the keys (a batch of [`FetchBudget::batch_len`]), concurrently when there are
/// several, results in key order. Their replies' room in the budget is held until the
/// connection writes its pending replies, which the caller appends them to. If the replies
/// outgrew their first room and the budget has not the rest free, they are dropped and the
/// keys read again one by one, each with room for what it took.
async fn read_batch<S: KvService>(ctx: &mut Ctx<'_, S>, keys: &[Vec<u8>]) -> Vec<ReadResult> {
    if let [key] = keys {
        return vec![fetch(ctx, key).await];
    }
    let first = ctx.shared.budget.rooms(keys);
    let room = ctx.reserve_reads(first).await;
    let service = ctx.service();
    let results = join_all(keys.iter().map(|key| service.get(key)).collect()).await;
    let used = keys.iter().zip(&results).map(|(key, result)| observe(ctx, key, result)).sum();
    if ctx.hold(room, used).is_err() {
        // Dropped before waiting for room: no reply is held beyond the budget.
        drop(results);
        let mut again = Vec::with_capacity(keys.len());
        for key in keys {
            again.push(fetch(ctx, key).await);
        }
        return again;
    }
    results.into_iter().map(|result| result.map(|item| count_read(ctx.stats(), item))).collect()
}

/// The room a read's reply takes in the fetch budget, remembered as the key's size hint.
pub(super) fn observe<S>(ctx: &Ctx<'_, S>, key: &[u8], result: &Result<Option<Item>, ServiceError>) -> usize {
    match result {
        Ok(item) => {
            let used = item.as_ref().map_or(0, |item| reply_bytes(key, &item.value));
            ctx.shared.budget.observe(key, used);
            used
        }
        Err(_) => 0,
    }
}

/// Polls every future in this task until all are done; outputs in input order. (Spawning a
/// task per key would cost more than a cached read itself.)
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    // Every slot is filled once the poll above is ready.
    outputs.into_iter().flatten().collect()
}

/// A hit was read: its marks before this read (`mg h l`), then the read is recorded.
pub(super) fn seen<S>(ctx: &Ctx<'_, S>, key: &[u8], item: &Item) -> Marks {
    ctx.shared.access.fetched(key, item.cas, now())
}

/// A hit was read by a command that reports no marks: the read is recorded (cheaply).
pub(super) fn read<S>(ctx: &Ctx<'_, S>, key: &[u8], item: &Item) {
    ctx.shared.access.read(key, item.cas, now);
}

/// Reads a key, counting a hit or miss; its reply's room in the fetch budget is held until
/// the connection writes its pending replies. A reply that outgrew its first room (its size
/// hint) when the budget has not the rest free is dropped and read again with room for the
/// largest reply.
pub(super) async fn fetch<S: KvService>(ctx: &mut Ctx<'_, S>, key: &[u8]) -> ReadResult {
    let mut first = ctx.shared.budget.room_for(key);
    loop {
        let room = ctx.reserve_reads(first).await;
        let result = ctx.service().get(key).await;
        let used = observe(ctx, key, &result);
        match ctx.hold(room, used) {
            Ok(()) => {}
            // Larger than any reservation: held as it is.
            Err(room) if first >= ctx.shared.budget.room_max() => ctx.hold_as_is(room),
            Err(_) => {
                drop(result);
                first = ctx.shared.budget.room_max();
                continue;
            }
        }
        return result.map(|item| count_read(ctx.stats(), item));
    }
}

/// Counts one key of a read. An item the service returns already expired (its clock may lag
/// ours) is a miss, as memcached counts it: `get_expired`.
fn count_read(stats: &Stats, item: Option<Item>) -> Option<Item> {
    let counters = &stats.counters;
    Stats::incr(&counters.cmd_get);
    let live = match item {
        Some(item) if is_expired(item.expiry, now()) => {
            Stats::incr(&counters.get_expired);
            None
        }
        other => other,
    };
    Stats::incr(match live {
        Some(_) => &counters.get_hits,
        None => &counters.get_misses,
    });
    live
}

/// Attempts of an atomic `gat` before falling back to a plain touch.
const GAT_ATTEMPTS: usize = 3;

/// `gat`: read the item, then touch it with the new expiry, guarded by the version read (its
/// cas), so the reply's value and cas unique belong together even if another
/// client updates the key in between (then it is re-read). Like memcached, the item read is
/// returned even if the new exptime expires it at once (`gat -1`).
pub(super) async fn touch_and_fetch<S: KvService>(
    ctx: &mut Ctx<'_, S>,
    key: &[u8],
    exptime: i32,
) -> ReadResult {
    // A touch is not repeated to fit a reply: room for the largest one, reserved first.
    let room = ctx.reserve_reads(ctx.shared.budget.room_max()).await;
    let result = touch_then_read(ctx, key, exptime).await;
    let used = observe(ctx, key, &result);
    ctx.hold_largest(room, used);
    result
}

async fn touch_then_read<S: KvService>(ctx: &mut Ctx<'_, S>, key: &[u8], exptime: i32) -> ReadResult {
    let counters = &ctx.stats().counters;
    Stats::incr(&counters.cmd_touch);
    let expiry = absolute_expiry(exptime, now());
    for _ in 0..GAT_ATTEMPTS {
        let Some(mut item) = live(ctx.service().get(key).await?) else {
            Stats::incr(&counters.touch_misses);
            return Ok(None);
        };
        // A touch guarded by the version read: it keeps the value, flags and access marks.
        let mutation = Mutation::IfCas { unique: item.cas, then: Guarded::Touch };
        match ctx.service().update(bare_update(key.to_vec(), mutation, expiry)).await? {
            Outcome::Touched { cas } => {
                Stats::incr(&counters.touch_hits);
                item.expiry = expiry;
                item.cas = cas;
                return Ok(Some(item));
            }
            // Changed since read: read again.
            Outcome::Exists => continue,
            _ => {
                Stats::incr(&counters.touch_misses);
                return Ok(None);
            }
        }
    }
    fallback_touch(ctx, key, expiry).await
}

/// Under heavy contention: a plain touch, then a read of whatever is current.
async fn fallback_touch<S: KvService>(ctx: &mut Ctx<'_, S>, key: &[u8], expiry: u32) -> ReadResult {
    let counters = &ctx.stats().counters;
    let outcome = ctx.service().update(bare_update(key.to_vec(), Mutation::Touch, expiry)).await?;
    if !matches!(outcome, Outcome::Touched { .. }) {
        Stats::incr(&counters.touch_misses);
        return Ok(None);
    }
    Stats::incr(&counters.touch_hits);
    Ok(live(ctx.service().get(key).await?))
}

fn live(item: Option<Item>) -> Option<Item> {
    item.filter(|item| !is_expired(item.expiry, now()))
}
