//! `flush_all`, `version`, `verbosity`, `stats`.

use fawn_proto::memcache::{absolute_expiry, reply};

use super::{now, Ctx};
use crate::memcache::stats::Stats;
use crate::service::{KvService, ServiceError};

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
        Some(b"fawn") => fawn(ctx),
        Some(b"detail") => ctx.reply(b"CLIENT_ERROR usage: stats detail on|off|dump\r\n"),
        // No slabs or item classes here: report none rather than fail monitoring tools.
        Some(b"items" | b"slabs" | b"sizes" | b"conns") => ctx.reply(reply::END),
        Some(_) => ctx.reply(reply::ERROR),
    }
}

/// memcached 1.6.18's general stats, names and order as it sends them.
const GENERAL: [&str; 92] = [
    "pid",
    "uptime",
    "time",
    "version",
    "libevent",
    "pointer_size",
    "rusage_user",
    "rusage_system",
    "max_connections",
    "curr_connections",
    "total_connections",
    "rejected_connections",
    "connection_structures",
    "response_obj_oom",
    "response_obj_count",
    "response_obj_bytes",
    "read_buf_count",
    "read_buf_bytes",
    "read_buf_bytes_free",
    "read_buf_oom",
    "reserved_fds",
    "cmd_get",
    "cmd_set",
    "cmd_flush",
    "cmd_touch",
    "cmd_meta",
    "get_hits",
    "get_misses",
    "get_expired",
    "get_flushed",
    "delete_misses",
    "delete_hits",
    "incr_misses",
    "incr_hits",
    "decr_misses",
    "decr_hits",
    "cas_misses",
    "cas_hits",
    "cas_badval",
    "touch_hits",
    "touch_misses",
    "store_too_large",
    "store_no_memory",
    "auth_cmds",
    "auth_errors",
    "bytes_read",
    "bytes_written",
    "limit_maxbytes",
    "accepting_conns",
    "listen_disabled_num",
    "time_in_listen_disabled_us",
    "threads",
    "conn_yields",
    "hash_power_level",
    "hash_bytes",
    "hash_is_expanding",
    "slab_reassign_rescues",
    "slab_reassign_chunk_rescues",
    "slab_reassign_evictions_nomem",
    "slab_reassign_inline_reclaim",
    "slab_reassign_busy_items",
    "slab_reassign_busy_deletes",
    "slab_reassign_running",
    "slabs_moved",
    "lru_crawler_running",
    "lru_crawler_starts",
    "lru_maintainer_juggles",
    "malloc_fails",
    "log_worker_dropped",
    "log_worker_written",
    "log_watcher_skipped",
    "log_watcher_sent",
    "log_watchers",
    "unexpected_napi_ids",
    "round_robin_fallback",
    "bytes",
    "curr_items",
    "total_items",
    "slab_global_page_pool",
    "expired_unfetched",
    "evicted_unfetched",
    "evicted_active",
    "evictions",
    "reclaimed",
    "crawler_reclaimed",
    "crawler_items_checked",
    "lrutail_reflocked",
    "moves_to_cold",
    "moves_to_warm",
    "moves_within_lru",
    "direct_reclaims",
    "lru_bumps_dropped",
];

/// General stats: memcached's field set in its order. `curr_items` and `bytes` are the
/// cluster's; the counters are this front-end's. Fields about memcached's own memory manager,
/// hash table, slab mover, LRU, logger and SASL have no meaning here (FAWN-DS keeps a log and
/// a compact index per back-end and never evicts) and read `0`; `libevent` reads `tokio`.
async fn general<S: KvService>(ctx: &mut Ctx<'_, S>) {
    let stats = match general_stats(ctx).await {
        Ok(stats) => stats,
        Err(error) => return ctx.server_error(&error, false),
    };
    let out = ctx.out();
    for (name, value) in stats {
        reply::stat(out, name, value);
    }
    out.extend_from_slice(reply::END);
}

/// The general stats as name and value, for the text and the binary protocol.
pub(super) async fn general_stats<S: KvService>(
    ctx: &Ctx<'_, S>,
) -> Result<Vec<(&'static str, String)>, ServiceError> {
    let items = ctx.service().item_stats().await?;
    let (config, stats) = (&ctx.shared.config, &ctx.shared.stats);
    let (user, system) = cpu_times();
    let value = |name: &str| -> String {
        match name {
            "pid" => std::process::id().to_string(),
            "uptime" => stats.uptime_secs().to_string(),
            "time" => now().to_string(),
            "version" => config.version.clone(),
            "libevent" => "tokio".into(),
            "pointer_size" => usize::BITS.to_string(),
            "rusage_user" => user.clone(),
            "rusage_system" => system.clone(),
            "max_connections" => config.max_connections.to_string(),
            "connection_structures" => stats.get("curr_connections").unwrap_or(0).to_string(),
            "limit_maxbytes" => config.limit_maxbytes.to_string(),
            "accepting_conns" => "1".into(),
            "threads" => config.threads.to_string(),
            "bytes" => items.bytes.to_string(),
            "curr_items" => items.curr_items.to_string(),
            other => stats.get(other).unwrap_or(0).to_string(),
        }
    };
    Ok(GENERAL.iter().map(|name| (*name, value(name))).collect())
}

/// This process's user and system CPU seconds, as memcached prints them (`%ld.%06ld`).
fn cpu_times() -> (String, String) {
    // SAFETY: getrusage only writes into the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let show = |t: libc::timeval| format!("{}.{:06}", t.tv_sec, t.tv_usec);
    (show(usage.ru_utime), show(usage.ru_stime))
}

/// Counters FAWN adds to memcached's: `server_errors` (requests answered `SERVER_ERROR`
/// because the cluster could not serve them).
fn fawn<S: KvService>(ctx: &mut Ctx<'_, S>) {
    let errors = ctx.stats().get("server_errors").unwrap_or(0);
    let out = ctx.out();
    reply::stat(out, "server_errors", errors);
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
