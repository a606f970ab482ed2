//! `get`, `gets`, `gat`, `gats`: one `VALUE` block per hit, then `END`.

use fawn_proto::memcache::{absolute_expiry, reply, GetCommand};
use fawn_proto::op::{is_expired, Item, Mutation, Outcome};

use super::{bare_update, now, Ctx};
use crate::memcache::stats::Stats;
use crate::service::KvService;

pub(super) async fn run<S: KvService>(ctx: &mut Ctx<'_, S>, get: GetCommand) {
    // Replies for earlier keys are kept in a side buffer so that a failure part-way replaces
    // the whole reply with one SERVER_ERROR line, rather than a truncated VALUE list.
    let mut values = Vec::new();
    for key in get.keys {
        let item = match get.touch {
            None => fetch(ctx, &key).await,
            Some(exptime) => touch_and_fetch(ctx, &key, exptime).await,
        };
        match item {
            Ok(Some(item)) => {
                let cas = get.cas.then_some(item.cas);
                reply::value(&mut values, &key, item.flags, &item.value, cas);
            }
            Ok(None) => {}
            Err(error) => return ctx.server_error(&error, false),
        }
    }
    ctx.out.extend_from_slice(&values);
    ctx.reply(reply::END);
}

/// Reads a key, counting a hit or miss. An item the service returns already expired (its
/// clock may lag ours) is a miss, as memcached counts it: `get_expired`.
pub(super) async fn fetch<S: KvService>(
    ctx: &mut Ctx<'_, S>,
    key: &[u8],
) -> Result<Option<Item>, crate::service::ServiceError> {
    let counters = &ctx.stats().counters;
    Stats::incr(&counters.cmd_get);
    let item = ctx.service().get(key).await?;
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
    Ok(live)
}

/// `gat`: read, then touch a hit at the chain head, as memcached does (so `gat -1` returns the
/// value once). The reply carries the item as touched (new expiry and cas unique). Not atomic
/// across the two steps: an update in between is overwritten only in its expiry.
pub(super) async fn touch_and_fetch<S: KvService>(
    ctx: &mut Ctx<'_, S>,
    key: &[u8],
    exptime: i32,
) -> Result<Option<Item>, crate::service::ServiceError> {
    let counters = &ctx.stats().counters;
    Stats::incr(&counters.cmd_touch);
    let item = ctx.service().get(key).await?;
    let Some(mut item) = item.filter(|item| !is_expired(item.expiry, now())) else {
        Stats::incr(&counters.touch_misses);
        return Ok(None);
    };
    let expiry = absolute_expiry(exptime, now());
    let update = bare_update(key.to_vec(), Mutation::Touch, expiry);
    if let Outcome::Touched { cas } = ctx.service().update(update).await? {
        item.expiry = expiry;
        item.cas = cas;
    }
    Stats::incr(&counters.touch_hits);
    Ok(Some(item))
}
