//! `flush_all`, `version`, `verbosity`, `stats`, `refresh_certs`.

use fawn_proto::memcache::{absolute_expiry, reply};

use super::{now, Ctx};
use crate::memcache::stats::Stats;
use crate::service::{ItemStats, KvService, ServiceError};

/// `flush_all [delay]`: the whole cluster, not just this front-end, forgets every item stored
/// before the flush time (now, or `delay` from now).
pub(super) async fn flush_all<S: KvService>(ctx: &mut Ctx<'_, S>, delay: i32, noreply: bool) {
    Stats::incr(&ctx.stats().counters.cmd_flush);
    let now = now();
    let at = if delay <= 0 { now } else { absolute_expiry(delay, now) };
    match ctx.service().flush_all(at).await {
        Ok(()) if noreply => ctx.stats().flushed(u64::from(at.saturating_sub(now))),
        Ok(()) => {
            ctx.stats().flushed(u64::from(at.saturating_sub(now)));
            ctx.reply(reply::OK);
        }
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

/// `refresh_certs`: read the TLS port's certificate, key and client CA files again, for every
/// later handshake (certificate rotation without a restart). On an error the certificates in
/// use are kept. The replies are memcached's: `OK` (not sent under `noreply`), or one line
/// starting `Error` (sent even under `noreply`, as memcached does).
pub(super) fn refresh_certs<S: KvService>(ctx: &mut Ctx<'_, S>, noreply: bool) {
    let Some(tls) = ctx.shared.config.tls.as_ref() else {
        return ctx.reply(b"Error TLS not enabled\r\n");
    };
    match tls.reload() {
        Ok(()) => {
            ctx.stats().certs_refreshed();
            tracing::info!("memcached front-end: TLS certificates read again");
            if !noreply {
                ctx.reply(reply::OK);
            }
        }
        Err(error) => {
            tracing::warn!(%error, "memcached front-end: refresh_certs failed; the certificates in use are kept");
            let line = format!("Error loading the certificates: {}\r\n", one_line(&error.to_string()));
            ctx.reply(line.as_bytes());
        }
    }
}

/// An error message fit for one reply line.
fn one_line(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
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
        Some(b"items") => classes(ctx, items).await,
        Some(b"slabs") => classes(ctx, slabs).await,
        Some(b"conns") => conns(ctx),
        Some(b"sizes") => ctx.reply(b"STAT sizes_status disabled\r\nEND\r\n"),
        Some(_) => ctx.reply(reply::ERROR),
    }
}

/// memcached 1.6.18's general stats, names and order as it sends them; the [`TLS_ONLY`] ones
/// only on a TLS port, as there.
const GENERAL: [&str; 94] = [
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
    "ssl_handshake_errors",
    "time_since_server_cert_refresh",
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

/// General stats memcached sends only when TLS is enabled.
const TLS_ONLY: [&str; 2] = ["ssl_handshake_errors", "time_since_server_cert_refresh"];

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
            "limit_maxbytes" => ctx.service().capacity_bytes().to_string(),
            "accepting_conns" => "1".into(),
            "threads" => config.threads.to_string(),
            "bytes" => items.bytes.to_string(),
            "curr_items" => items.curr_items.to_string(),
            "time_since_server_cert_refresh" => stats.secs_since_certs_read().to_string(),
            other => stats.get(other).unwrap_or(0).to_string(),
        }
    };
    let shown = |name: &&&str| config.tls.is_some() || !TLS_ONLY.contains(*name);
    Ok(GENERAL.iter().filter(shown).map(|name| (*name, value(name))).collect())
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
/// because the cluster could not serve them), `fetch_budget_waits` (reads that waited for
/// room in the fetch budget), `fetch_budget_rereads` (replies larger than their first room,
/// with no room free to top it up, dropped and read again) and `fetch_budget_free_bytes`
/// (the room free now).
fn fawn<S: KvService>(ctx: &mut Ctx<'_, S>) {
    let errors = ctx.stats().get("server_errors").unwrap_or(0);
    let waits = ctx.stats().get("fetch_budget_waits").unwrap_or(0);
    let rereads = ctx.stats().get("fetch_budget_rereads").unwrap_or(0);
    let free = ctx.shared.budget.available();
    let out = ctx.out();
    reply::stat(out, "server_errors", errors);
    reply::stat(out, "fetch_budget_waits", waits);
    reply::stat(out, "fetch_budget_rereads", rereads);
    reply::stat(out, "fetch_budget_free_bytes", free);
    out.extend_from_slice(reply::END);
}

/// A value of `stats settings`: what FAWN has, or a fixed text for a setting of a memcached
/// subsystem FAWN does not have (see [`SETTINGS`]).
enum Setting {
    Fawn,
    Fixed(&'static str),
}

use Setting::{Fawn, Fixed};

/// memcached 1.6.18's `stats settings`, names and order as it sends them. `Fawn` values are
/// this front-end's (`oldest`: its last `flush_all`, see `Stats::flushed`); `verbosity`
/// reads 0 (it is accepted and ignored); the `ssl_*` lines describe the port's TLS (the
/// files it was started with, `ssl_verify_mode` 2 when client certificates are required).
/// FAWN has no slab allocator, LRU, crawler, logger, extstore, UDP or unix socket: their
/// switches read off (`no`, `NULL`) and their tunables memcached's defaults, so parsers see
/// the types they expect.
const SETTINGS: [(&str, Setting); 76] = [
    ("maxbytes", Fawn),
    ("maxconns", Fawn),
    ("tcpport", Fawn),
    ("udpport", Fixed("0")),
    ("inter", Fawn),
    ("verbosity", Fixed("0")),
    ("oldest", Fawn),
    // A full datastore refuses writes; FAWN never evicts (memcached's `-M`).
    ("evictions", Fixed("off")),
    ("domain_socket", Fixed("NULL")),
    ("umask", Fixed("700")),
    ("shutdown_command", Fixed("no")),
    ("growth_factor", Fixed("1.25")),
    ("chunk_size", Fixed("48")),
    ("num_threads", Fawn),
    ("num_threads_per_udp", Fawn),
    ("stat_key_prefix", Fixed(":")),
    ("detail_enabled", Fixed("no")),
    ("reqs_per_event", Fixed("20")),
    ("cas_enabled", Fixed("yes")),
    // tokio's listener backlog.
    ("tcp_backlog", Fixed("1024")),
    // The first byte of a connection picks text or binary, as memcached's default.
    ("binding_protocol", Fixed("auto-negotiate")),
    ("auth_enabled_sasl", Fawn),
    ("auth_enabled_ascii", Fawn),
    ("item_size_max", Fawn),
    // One connection over the limit is told so and closed at once.
    ("maxconns_fast", Fixed("yes")),
    ("hashpower_init", Fixed("0")),
    ("slab_reassign", Fixed("no")),
    ("slab_automove", Fixed("0")),
    ("slab_automove_ratio", Fixed("0.80")),
    ("slab_automove_window", Fixed("30")),
    ("slab_chunk_max", Fixed("524288")),
    ("lru_crawler", Fixed("no")),
    ("lru_crawler_sleep", Fixed("100")),
    ("lru_crawler_tocrawl", Fixed("0")),
    ("tail_repair_time", Fixed("0")),
    ("flush_enabled", Fixed("yes")),
    ("dump_enabled", Fixed("no")),
    // Keys are placed on the ring and in the index by XXH3-128.
    ("hash_algorithm", Fixed("xxh3")),
    ("lru_maintainer_thread", Fixed("no")),
    ("lru_segmented", Fixed("no")),
    ("hot_lru_pct", Fixed("20")),
    ("warm_lru_pct", Fixed("40")),
    ("hot_max_factor", Fixed("0.20")),
    ("warm_max_factor", Fixed("2.00")),
    ("temp_lru", Fixed("no")),
    ("temporary_ttl", Fixed("61")),
    ("idle_timeout", Fawn),
    ("watcher_logbuf_size", Fixed("262144")),
    ("worker_logbuf_size", Fixed("65536")),
    ("read_buf_mem_limit", Fixed("0")),
    ("track_sizes", Fixed("no")),
    ("inline_ascii_response", Fixed("no")),
    ("ext_item_size", Fixed("512")),
    ("ext_item_age", Fixed("4294967295")),
    ("ext_low_ttl", Fixed("0")),
    ("ext_recache_rate", Fixed("2000")),
    ("ext_wbuf_size", Fixed("4194304")),
    ("ext_compact_under", Fixed("0")),
    ("ext_drop_under", Fixed("0")),
    ("ext_max_sleep", Fixed("1000000")),
    ("ext_max_frag", Fixed("0.80")),
    ("slab_automove_freeratio", Fixed("0.010")),
    ("ext_drop_unread", Fixed("no")),
    ("ssl_enabled", Fawn),
    ("ssl_chain_cert", Fawn),
    ("ssl_key", Fawn),
    ("ssl_verify_mode", Fawn),
    ("ssl_keyformat", Fixed("1")),
    ("ssl_ciphers", Fixed("NULL")),
    ("ssl_ca_cert", Fawn),
    ("ssl_wbuf_size", Fixed("16384")),
    ("ssl_session_cache", Fixed("no")),
    ("ssl_kernel_tls", Fixed("no")),
    ("ssl_min_version", Fixed("tlsv1.2")),
    ("num_napi_ids", Fixed("(null)")),
    ("memory_file", Fixed("(null)")),
];

fn settings<S: KvService>(ctx: &mut Ctx<'_, S>) {
    let (config, listen) = (&ctx.shared.config, ctx.shared.listen);
    let yes_no = |on: bool| if on { "yes" } else { "no" }.to_string();
    let value = |name: &str| -> String {
        match name {
            "maxbytes" => ctx.service().capacity_bytes().to_string(),
            "maxconns" => config.max_connections.to_string(),
            "tcpport" => listen.map_or(0, |a| a.port()).to_string(),
            "oldest" => ctx.stats().oldest().to_string(),
            "inter" => listen.map_or_else(|| "NULL".into(), |a| a.ip().to_string()),
            "num_threads" => config.threads.to_string(),
            "num_threads_per_udp" => config.threads.to_string(),
            "auth_enabled_sasl" | "auth_enabled_ascii" => yes_no(config.users.is_some()),
            "item_size_max" => config.limits.value_bytes_max.to_string(),
            "idle_timeout" => config.idle_timeout.map_or(0, |d| d.as_secs()).to_string(),
            "ssl_enabled" => yes_no(config.tls.is_some()),
            // memcached's SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, or none.
            "ssl_verify_mode" => {
                if config.tls.as_ref().is_some_and(|tls| tls.requires_client_certs()) { "2" } else { "0" }
                    .into()
            }
            "ssl_chain_cert" => tls_file(config, |f| Some(&f.chain), "(null)"),
            "ssl_key" => tls_file(config, |f| Some(&f.key), "(null)"),
            "ssl_ca_cert" => tls_file(config, |f| f.client_ca.as_deref(), "NULL"),
            other => {
                debug_assert!(false, "stats setting {other} has no FAWN value");
                "0".into()
            }
        }
    };
    let lines: Vec<(&str, String)> = SETTINGS
        .iter()
        .map(|(name, setting)| match setting {
            Fawn => (*name, value(name)),
            Fixed(text) => (*name, text.to_string()),
        })
        .collect();
    let out = ctx.out();
    for (name, value) in lines {
        reply::stat(out, name, value);
    }
    out.extend_from_slice(reply::END);
}

/// The path of one of the TLS files, or what memcached prints when it has none.
fn tls_file(
    config: &crate::memcache::MemcacheConfig,
    pick: impl Fn(&fawn_tls::ClientTlsFiles) -> Option<&std::path::Path>,
    none: &str,
) -> String {
    let files = config.tls.as_ref().and_then(|tls| tls.files());
    files.and_then(pick).map_or_else(|| none.to_string(), |path| path.display().to_string())
}

/// memcached's `stats conns`: the listening socket, then each connection by descriptor, with
/// its peer, the listener, its state (`conn_parse_cmd` while running requests, else
/// `conn_waiting`) and the seconds since its last request.
fn conns<S: KvService>(ctx: &mut Ctx<'_, S>) {
    let (stats, listen_fd) = (&ctx.shared.stats, ctx.shared.listen_fd);
    let listen = ctx.shared.listen.map_or_else(|| "tcp:unknown".to_string(), |a| format!("tcp:{a}"));
    let uptime = stats.uptime_secs();
    let mut lines: Vec<StatLine> = vec![
        (format!("{listen_fd}:addr"), listen.clone()),
        (format!("{listen_fd}:state"), "conn_listening".into()),
        (format!("{listen_fd}:secs_since_last_cmd"), uptime.to_string()),
    ];
    for (fd, entry) in stats.conns() {
        let peer = entry.peer.map_or_else(|| "tcp:unknown".to_string(), |a| format!("tcp:{a}"));
        let busy = entry.activity.busy.load(std::sync::atomic::Ordering::Relaxed);
        let last = entry.activity.last_cmd_secs.load(std::sync::atomic::Ordering::Relaxed);
        lines.push((format!("{fd}:addr"), peer));
        lines.push((format!("{fd}:listen_addr"), listen.clone()));
        lines.push((format!("{fd}:state"), if busy { "conn_parse_cmd" } else { "conn_waiting" }.into()));
        lines.push((format!("{fd}:secs_since_last_cmd"), uptime.saturating_sub(last).to_string()));
    }
    let out = ctx.out();
    for (name, value) in lines {
        reply::stat(out, &name, value);
    }
    out.extend_from_slice(reply::END);
}

/// A `STAT` line's name and value.
type StatLine = (String, String);

/// `stats items` and `stats slabs` describe memcached's slab classes. FAWN stores every item
/// in a log, in one "class": it reports class 1 holding the cluster's items (none when the
/// cluster has none, as memcached omits empty classes), with this front-end's command counters.
async fn classes<S: KvService>(ctx: &mut Ctx<'_, S>, lines: fn(&Ctx<'_, S>, ItemStats) -> Vec<StatLine>) {
    let items = match ctx.service().item_stats().await {
        Ok(items) => items,
        Err(error) => return ctx.server_error(&error, false),
    };
    let lines = lines(ctx, items);
    let out = ctx.out();
    for (name, value) in lines {
        reply::stat(out, &name, value);
    }
    out.extend_from_slice(reply::END);
}

/// memcached 1.6.18's per-class item fields, in order. Only `number` (the cluster's live
/// items) and `mem_requested` (their key and value bytes) have FAWN values; the LRU segment
/// counts, ages and eviction, reclaim and crawler counters read 0 (no LRU, no eviction).
const ITEM_FIELDS: [&str; 28] = [
    "number",
    "number_hot",
    "number_warm",
    "number_cold",
    "age_hot",
    "age_warm",
    "age",
    "mem_requested",
    "evicted",
    "evicted_nonzero",
    "evicted_time",
    "outofmemory",
    "tailrepairs",
    "reclaimed",
    "expired_unfetched",
    "evicted_unfetched",
    "evicted_active",
    "crawler_reclaimed",
    "crawler_items_checked",
    "lrutail_reflocked",
    "moves_to_cold",
    "moves_to_warm",
    "moves_within_lru",
    "direct_reclaims",
    "hits_to_hot",
    "hits_to_warm",
    "hits_to_cold",
    "hits_to_temp",
];

fn items<S: KvService>(_ctx: &Ctx<'_, S>, items: ItemStats) -> Vec<StatLine> {
    if items.curr_items == 0 {
        return Vec::new();
    }
    let value = |name: &str| match name {
        "number" => items.curr_items,
        "mem_requested" => items.bytes,
        _ => 0,
    };
    ITEM_FIELDS.iter().map(|name| (format!("items:1:{name}"), value(name).to_string())).collect()
}

/// memcached 1.6.18's per-class slab fields, in order. The chunk and page geometry has no
/// FAWN meaning (records are appended to a log) and reads 0 but for `used_chunks` (the
/// cluster's live items); the command counters are this front-end's. `total_malloced` is
/// the cluster's live key and value bytes.
const SLAB_FIELDS: [&str; 15] = [
    "chunk_size",
    "chunks_per_page",
    "total_pages",
    "total_chunks",
    "used_chunks",
    "free_chunks",
    "free_chunks_end",
    "get_hits",
    "cmd_set",
    "delete_hits",
    "incr_hits",
    "decr_hits",
    "cas_hits",
    "cas_badval",
    "touch_hits",
];

fn slabs<S: KvService>(ctx: &Ctx<'_, S>, items: ItemStats) -> Vec<StatLine> {
    let stats = ctx.stats();
    let mut lines = Vec::new();
    if items.curr_items > 0 {
        let value = |name: &str| match name {
            "used_chunks" => items.curr_items,
            "chunk_size" | "chunks_per_page" | "total_pages" | "total_chunks" | "free_chunks"
            | "free_chunks_end" => 0,
            counter => stats.get(counter).unwrap_or(0),
        };
        lines.extend(SLAB_FIELDS.iter().map(|name| (format!("1:{name}"), value(name).to_string())));
    }
    lines.push(("active_slabs".into(), u64::from(items.curr_items > 0).to_string()));
    lines.push(("total_malloced".into(), items.bytes.to_string()));
    lines
}
