//! `delete <key> [noreply]`.

use fawn_proto::memcache::reply;
use fawn_proto::op::{Mutation, Outcome};

use super::{bare_update, Ctx};
use crate::memcache::stats::Stats;
use crate::service::KvService;

pub(super) async fn run<S: KvService>(ctx: &mut Ctx<'_, S>, key: Vec<u8>, noreply: bool) {
    let Some(outcome) = ctx.update(bare_update(key, Mutation::Delete, 0), noreply).await else {
        return;
    };
    let deleted = matches!(outcome, Outcome::Deleted);
    let counters = &ctx.stats().counters;
    Stats::incr(if deleted { &counters.delete_hits } else { &counters.delete_misses });
    if !noreply {
        ctx.reply(if deleted { reply::DELETED } else { reply::NOT_FOUND });
    }
}
