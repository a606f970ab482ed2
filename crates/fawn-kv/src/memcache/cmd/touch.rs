//! `touch <key> <exptime> [noreply]`.

use fawn_proto::memcache::{absolute_expiry, reply};
use fawn_proto::op::{Mutation, Outcome};

use super::{bare_update, now, Ctx};
use crate::memcache::stats::Stats;
use crate::service::KvService;

pub(super) async fn run<S: KvService>(ctx: &mut Ctx<'_, S>, key: Vec<u8>, exptime: i32, noreply: bool) {
    Stats::incr(&ctx.stats().counters.cmd_touch);
    let expiry = absolute_expiry(exptime, now());
    let Some(outcome) = ctx.update(bare_update(key, Mutation::Touch, expiry), noreply).await else {
        return;
    };
    let touched = matches!(outcome, Outcome::Touched { .. });
    let counters = &ctx.stats().counters;
    Stats::incr(if touched { &counters.touch_hits } else { &counters.touch_misses });
    if !noreply {
        ctx.reply(if touched { reply::TOUCHED } else { reply::NOT_FOUND });
    }
}
