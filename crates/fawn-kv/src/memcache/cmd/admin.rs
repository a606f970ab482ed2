//! `flush_all`, `version`, `verbosity`, `stats`.

use fawn_proto::memcache::{absolute_expiry, reply};

use super::{now, Ctx};
use crate::memcache::stats::Stats;
use crate::service::KvService;

/// `flush_all [delay]`: the whole cluster, not just this front-end, forgets every item stored
/// before the flush time (now, or `delay` from now).
pub(super) async fn flush_all<S: KvService>(ctx: &mut Ctx<'_, S>, delay: i32, noreply: bool) {
    Stats::incr(&ctx.stats().counters.cmd_flush);
    let now = now();
    let at = if delay <= 0 { now } else { absolute_expiry(delay, now) };
    match ctx.service().flush_all(at).await {
        Ok(()) if noreply => {}
        Ok(()) => ctx.reply(reply::OK),
        Err(error) => ctx.server_error(&error, noreply),
    }
}

pub(super) fn version<S: KvService>(ctx: &mut Ctx<'_, S>) {
    ctx.reply(b"VERSION ");
    let version = ctx.shared.config.version.clone();
    ctx.reply(version.as_bytes());
    ctx.reply(b"\r\n");
}

/// Logging verbosity is the operator's business (tracing filters); accept it like memcached.
pub(super) fn verbosity<S: KvService>(ctx: &mut Ctx<'_, S>, noreply: bool) {
    if !noreply {
        ctx.reply(reply::OK);
    }
}

pub(super) async fn stats<S: KvService>(ctx: &mut Ctx<'_, S>, group: Option<Vec<u8>>) {
    match group.as_deref() {
        None => general(ctx).await,
        Some(b"reset") => {
            ctx.stats().reset();
            ctx.reply(reply::RESET);
        }
        Some(b"settings") => settings(ctx),
        Some(b"detail") => ctx.reply(b"CLIENT_ERROR usage: stats detail on|off|dump\r\n"),
        // No slabs or item classes here: report none rather than fail monitoring tools.
        Some(b"items" | b"slabs" | b"sizes" | b"conns") => ctx.reply(reply::END),
        Some(_) => ctx.reply(reply::ERROR),
    }
}

/// General stats, in memcached's order; `curr_items` and `bytes` are the cluster's.
async fn general<S: KvService>(ctx: &mut Ctx<'_, S>) {
    let items = match ctx.service().item_stats().await {
        Ok(items) => items,
        Err(error) => return ctx.server_error(&error, false),
    };
    let shared = ctx.shared;
    let (config, stats) = (&shared.config, &shared.stats);
    let out = ctx.out();
    reply::stat(out, "pid", std::process::id());
    reply::stat(out, "uptime", stats.uptime_secs());
    reply::stat(out, "time", now());
    reply::stat(out, "version", &config.version);
    reply::stat(out, "pointer_size", usize::BITS);
    reply::stat(out, "max_connections", config.max_connections);
    stats.each(|name, value| reply::stat(out, name, value));
    reply::stat(out, "limit_maxbytes", config.limit_maxbytes);
    reply::stat(out, "threads", config.threads);
    reply::stat(out, "bytes", items.bytes);
    reply::stat(out, "curr_items", items.curr_items);
    reply::stat(out, "evictions", 0);
    out.extend_from_slice(reply::END);
}

fn settings<S: KvService>(ctx: &mut Ctx<'_, S>) {
    let config = &ctx.shared.config;
    let out = ctx.out();
    reply::stat(out, "maxbytes", config.limit_maxbytes);
    reply::stat(out, "maxconns", config.max_connections);
    reply::stat(out, "num_threads", config.threads);
    reply::stat(out, "item_size_max", config.limits.value_bytes_max);
    let idle = config.idle_timeout.map_or(0, |d| d.as_secs());
    reply::stat(out, "idle_timeout", idle);
    reply::stat(out, "cas_enabled", "yes");
    reply::stat(out, "flush_enabled", "yes");
    out.extend_from_slice(reply::END);
}
