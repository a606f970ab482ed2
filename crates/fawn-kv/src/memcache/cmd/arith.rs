//! `incr`/`decr <key> <delta> [noreply]`: read-modify-write decided at the chain head.

use fawn_proto::memcache::reply;
use fawn_proto::op::{Mutation, Outcome};

use super::{bare_update, Ctx};
use crate::memcache::stats::Stats;
use crate::service::KvService;

pub(super) async fn run<S: KvService>(
    ctx: &mut Ctx<'_, S>,
    key: Vec<u8>,
    incr: bool,
    delta: u64,
    noreply: bool,
) {
    let mutation = if incr { Mutation::Incr { delta } } else { Mutation::Decr { delta } };
    let Some(outcome) = ctx.update(bare_update(key, mutation, 0), noreply).await else {
        return;
    };
    count(ctx.stats(), incr, &outcome);
    if noreply {
        return;
    }
    match outcome {
        Outcome::Counter { value, .. } => reply::number(ctx.out(), value),
        Outcome::NonNumeric => ctx.reply(reply::NON_NUMERIC),
        _ => ctx.reply(reply::NOT_FOUND),
    }
}

fn count(stats: &Stats, incr: bool, outcome: &Outcome) {
    let c = &stats.counters;
    let hit = matches!(outcome, Outcome::Counter { .. });
    Stats::incr(match (incr, hit) {
        (true, true) => &c.incr_hits,
        (true, false) => &c.incr_misses,
        (false, true) => &c.decr_hits,
        (false, false) => &c.decr_misses,
    });
}
