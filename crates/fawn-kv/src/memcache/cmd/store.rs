//! `set`, `add`, `replace`, `append`, `prepend`, `cas`: decided at the chain head.

use fawn_proto::memcache::{absolute_expiry, reply, SetMode, StoreCommand};
use fawn_proto::op::{Mutation, Outcome, Update};

use super::{bare_update, now, Ctx};
use crate::memcache::budget::reply_bytes;
use crate::memcache::stats::Stats;
use crate::memcache::Shared;
use crate::service::KvService;

pub(super) async fn run<S: KvService>(ctx: &mut Ctx<'_, S>, store: StoreCommand) {
    let counters = &ctx.stats().counters;
    Stats::incr(&counters.cmd_set);
    let is_cas = matches!(store.mode, SetMode::Cas(_));
    let update = Update {
        key: store.key,
        mutation: mutation(store.mode),
        value: store.value,
        flags: store.flags,
        expiry: absolute_expiry(store.exptime, now()),
    };
    let key = update.key.clone();
    // What a read of the key will take, unless appended to (then the read learns it).
    let whole = !matches!(store.mode, SetMode::Append | SetMode::Prepend);
    let reply = reply_bytes(&update.key, &update.value);
    let Some(outcome) = ctx.update(update, store.noreply).await else {
        return;
    };
    if let Outcome::Stored { cas } = outcome {
        ctx.shared.access.stored(&key, cas, now());
        if whole {
            ctx.shared.budget.observe(&key, reply);
        }
    }
    if is_cas {
        count_cas(ctx.stats(), &outcome);
    }
    if matches!(outcome, Outcome::Stored { .. }) {
        Stats::incr(&ctx.stats().counters.total_items);
    }
    if !store.noreply {
        ctx.reply(store_reply(&outcome));
    }
}

pub(super) fn mutation(mode: SetMode) -> Mutation {
    match mode {
        SetMode::Set => Mutation::Set,
        SetMode::Add => Mutation::Add,
        SetMode::Replace => Mutation::Replace,
        SetMode::Append => Mutation::Append,
        SetMode::Prepend => Mutation::Prepend,
        SetMode::Cas(unique) => Mutation::Cas { unique },
    }
}

fn count_cas(stats: &Stats, outcome: &Outcome) {
    let counters = &stats.counters;
    Stats::incr(match outcome {
        Outcome::Stored { .. } => &counters.cas_hits,
        Outcome::Exists => &counters.cas_badval,
        _ => &counters.cas_misses,
    });
}

/// The classic reply line for a storage outcome.
fn store_reply(outcome: &Outcome) -> &'static [u8] {
    match outcome {
        Outcome::Stored { .. } => reply::STORED,
        Outcome::Exists => reply::EXISTS,
        Outcome::NotFound => reply::NOT_FOUND,
        _ => reply::NOT_STORED,
    }
}

/// memcached drops the old item when a `set` is refused as too large, so a reader never sees
/// the stale value the client meant to overwrite. Best effort: a failure here is not reported
/// (the client already got `SERVER_ERROR object too large for cache`).
pub(in crate::memcache) async fn unlink<S: KvService>(shared: &Shared<S>, key: Vec<u8>) {
    Stats::incr(&shared.stats.counters.store_too_large);
    let _ = shared.service.update(bare_update(key, Mutation::Delete, 0)).await;
}
