//! Command-line flags of every subcommand, and `--config FILE` (TOML whose keys are the long
//! flag names, e.g. `listen = "127.0.0.1:7401"`): the file's values come first, so flags on
//! the command line override them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use fawn_ds::SyncPolicy;
use fawn_kv::backend::BackendOptions;
use fawn_kv::frontend::cache::CacheTiming;
use fawn_kv::frontend::FrontendOptions;
use fawn_kv::local::LocalCluster;
use fawn_kv::manager::ManagerOptions;
use fawn_kv::run;
use fawn_tls::Role;

use crate::security::{AdminTransportArgs, TransportArgs};

/// FAWN: a fast, replicated, log-structured key-value store that speaks memcached.
#[derive(Parser, Debug)]
#[command(name = "fawn", version, about, long_about = None, args_override_self = true)]
pub struct Cli {
    /// Log filter (e.g. info, debug, fawn_kv=debug); FAWN_LOG overrides it.
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    pub log_json: bool,
    /// Async worker threads of this process [default: one per core]. Where several FAWN
    /// processes share one host (`fawn up`, the benchmarks), fewer workers each means fewer
    /// context switches between them.
    #[arg(long, global = true, env = "FAWN_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub worker_threads: Option<u16>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start a whole local cluster (manager, back-ends, front-ends) serving memcached.
    Up(UpArgs),
    /// Run the manager: the authoritative cluster configuration.
    Manager(ManagerArgs),
    /// Run a back-end: datastores for the ranges it replicates, chain replication.
    Backend(BackendArgs),
    /// Run a front-end: memcached and native listeners, routing and caching.
    Frontend(FrontendArgs),
    /// Print the ring, the chains and each process's health.
    Status(StatusArgs),
    /// Gracefully remove a back-end: its ranges are re-replicated elsewhere first.
    Leave(LeaveArgs),
    /// Add a manager to the manager group, or remove one, while the cluster runs.
    Managers(ManagersArgs),
    /// Create the cluster's certificate authority and issue each process's certificate.
    Ca(crate::security::CaArgs),
    /// Load generation, engine benchmarks and the paper's evaluation.
    Bench(fawn_bench::BenchArgs),
}

/// Parses the command line, expanding `--config FILE` into flags placed before the others.
pub fn parse() -> Result<Cli, clap::Error> {
    let mut argv: Vec<String> = std::env::args().collect();
    if let Some(pos) = argv.iter().position(|a| a == "--config") {
        let path = argv.get(pos + 1).cloned().unwrap_or_default();
        argv.drain(pos..(pos + 2).min(argv.len()));
        let flags = config_flags(&path).map_err(|e| {
            Cli::command().error(clap::error::ErrorKind::InvalidValue, format!("--config {path}: {e:#}"))
        })?;
        // Insert right after the subcommand name so later command-line flags override.
        let at = argv.iter().position(|a| !a.starts_with('-') && a != &argv[0]).map_or(argv.len(), |p| p + 1);
        argv.splice(at..at, flags);
    }
    let matches = Cli::command().try_get_matches_from(argv)?;
    Cli::from_arg_matches(&matches)
}

fn config_flags(path: &str) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).context("reading")?;
    let table: toml::Table = text.parse().context("parsing TOML")?;
    let mut flags = Vec::new();
    for (key, value) in table {
        let value = match value {
            toml::Value::String(s) => s,
            toml::Value::Boolean(true) => {
                flags.push(format!("--{key}"));
                continue;
            }
            toml::Value::Boolean(false) => continue,
            other => other.to_string(),
        };
        flags.push(format!("--{key}={value}"));
    }
    Ok(flags)
}

/// Parses `always`, `never` or `interval:MS`.
fn parse_sync(s: &str) -> Result<SyncPolicy, String> {
    match s {
        "always" => Ok(SyncPolicy::Always),
        "never" => Ok(SyncPolicy::Never),
        _ => s
            .strip_prefix("interval:")
            .and_then(|ms| ms.parse::<u64>().ok())
            .map(|ms| SyncPolicy::Interval(Duration::from_millis(ms)))
            .ok_or_else(|| format!("expected always, never or interval:MS, got {s:?}")),
    }
}

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Where every role keeps its data and log; kept across restarts.
    #[arg(long, default_value = "fawn-data")]
    data_dir: PathBuf,
    /// memcached address of front-end 0 (front-end i adds i to the port).
    #[arg(long, default_value = "127.0.0.1:11211")]
    memcached: String,
    /// Host the internal listeners bind to.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Manager 1's port; manager i > 1 uses BASE+250+i-1, back-end i BASE+1+i, front-end i
    /// BASE+100+i.
    #[arg(long, default_value_t = 7400)]
    base_port: u16,
    /// Managers in the manager group (an odd number): 3 keep the cluster configurable
    /// through the loss of any one.
    #[arg(long, default_value_t = 3)]
    managers: u32,
    /// Number of back-ends.
    #[arg(long, default_value_t = 3)]
    backends: u32,
    /// Number of front-ends.
    #[arg(long, default_value_t = 1)]
    frontends: u32,
    /// Replicas per key (chain length R).
    #[arg(long, default_value_t = 3)]
    replicas: u32,
    /// Virtual ids per back-end (V).
    #[arg(long, default_value_t = 2)]
    vnodes: u32,
    /// Datastore sync policy: always, never or interval:MS.
    #[arg(long, default_value = "interval:100", value_parser = parse_sync)]
    sync: SyncPolicy,
    /// Keys each back-end expects to hold, over all its ranges and replicas (0 = no hint);
    /// passed to every back-end as `--expected-keys` (see `fawn backend --help`).
    #[arg(long, value_name = "N", default_value_t = 0)]
    expected_keys: u64,
    /// Serve Prometheus /metrics on every role (manager 1 BASE+300, managers 2.. BASE+501..,
    /// back-ends BASE+301.., front-ends BASE+400..).
    #[arg(long)]
    metrics: bool,
    /// Every front-end's `--memcached-auth-file`: memcached clients must log in as a user of
    /// this file (`user:password` lines, as memcached's `-Y`).
    #[arg(long)]
    memcached_auth_file: Option<PathBuf>,
    /// Run the cluster's native connections in plain TCP. Without it, the first start creates
    /// a cluster CA and every process's certificate in `<data-dir>/tls` and all native
    /// connections are mutual TLS (`fawn status` and the other admin tools find the admin
    /// certificate there).
    #[arg(long)]
    plaintext: bool,
    /// TLS on every front-end's memcached port (as memcached's `-Z`). Each start issues the
    /// front-ends a server certificate from the cluster CA in `<data-dir>/tls` (made if
    /// missing, also with --plaintext) naming the --memcached host, localhost, 127.0.0.1 and
    /// ::1; clients verify it with `<data-dir>/tls/ca.pem`. No client certificate is asked for.
    #[arg(long)]
    memcached_tls: bool,
}

impl UpArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        // Say now, not in a front-end's log after start-up, if the file is missing; the
        // front-ends (restarted by the supervisor) get an absolute path.
        let memcached_auth_file = match &self.memcached_auth_file {
            Some(path) => Some(
                std::fs::canonicalize(path)
                    .with_context(|| format!("--memcached-auth-file {}", path.display()))?,
            ),
            None => None,
        };
        let exe = std::env::current_exe().context("finding the fawn executable")?;
        let sync = match self.sync {
            SyncPolicy::Always => "always".to_string(),
            SyncPolicy::Never => "never".to_string(),
            SyncPolicy::Interval(d) => format!("interval:{}", d.as_millis()),
        };
        let cluster = LocalCluster {
            exe,
            data_dir: self.data_dir,
            host: self.host,
            base_port: self.base_port,
            managers: self.managers.max(1),
            memcached: self.memcached,
            backends: self.backends.max(1),
            frontends: self.frontends.max(1),
            replicas: self.replicas,
            vnodes: self.vnodes,
            sync,
            expected_keys: self.expected_keys,
            metrics: self.metrics,
            extra_args: Vec::new(),
            memcached_auth_file,
            tls: !self.plaintext,
            memcached_tls: self.memcached_tls,
        };
        cluster.run(run::shutdown_on_signals()).await
    }
}

#[derive(Args, Debug)]
pub struct ManagerArgs {
    /// Address to listen on (native protocol).
    #[arg(long, default_value = "127.0.0.1:7400")]
    listen: String,
    /// Directory for the persisted configuration.
    #[arg(long, default_value = "fawn-data/manager")]
    data_dir: PathBuf,
    /// Back-ends the ring is formed from.
    #[arg(long, default_value_t = 3)]
    backends: usize,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    metrics: Option<String>,
    /// Front-ends (wedges of the key space); ids 0..N.
    #[arg(long, default_value_t = 1)]
    frontends: u32,
    /// Milliseconds between heartbeats to each back-end (t_hb). The front-ends heartbeat the
    /// back-ends and report to the manager; the manager pings a back-end itself only to
    /// confirm a reported silence, and heartbeats all of them only while no front-end
    /// reports.
    #[arg(long, default_value_t = 200)]
    heartbeat_ms: u64,
    /// Heartbeat intervals of silence (t_hb × this) after which a back-end is declared
    /// failed.
    #[arg(long, default_value_t = 10)]
    fd_threshold: u32,
    /// Replicas per key (chain length R).
    #[arg(long, default_value_t = 3)]
    replicas: u32,
    /// Virtual ids per back-end (V).
    #[arg(long, default_value_t = 2)]
    vnodes: u32,
    /// Native addresses of all the managers of a new group, comma-separated, this one
    /// included (default: a group of this manager alone). Read only at a manager's first
    /// start; later changes go through `fawn managers add|remove`.
    #[arg(long)]
    managers: Option<String>,
    /// This manager's id: its 1-based position in --managers (default: the position of
    /// --listen in the list).
    #[arg(long)]
    id: Option<u64>,
    /// Start as a new, empty member of an existing group (with --id): it forms no group of
    /// its own and waits for the leader to add it (`fawn managers add`) or, for a manager
    /// whose data directory was lost, to send it a snapshot.
    #[arg(long)]
    join: bool,
    /// Raft log entries between snapshots of the configuration; entries further behind the
    /// latest snapshot are dropped.
    #[arg(long, default_value_t = fawn_kv::manager::raft::SNAPSHOT_EVERY_ENTRIES)]
    raft_snapshot_every: u64,
    #[command(flatten)]
    transport: TransportArgs,
}

impl ManagerArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let group = match &self.managers {
            Some(list) => fawn_kv::manager::client::parse_list(list),
            None => vec![self.listen.clone()],
        };
        let id = match self.id {
            Some(id) => id,
            None if self.join => anyhow::bail!("--join needs --id"),
            None => {
                group.iter().position(|a| *a == self.listen).map(|i| i as u64 + 1).ok_or_else(|| {
                    anyhow::anyhow!("--listen {} is not in --managers: give --id", self.listen)
                })?
            }
        };
        let options = ManagerOptions {
            group: if self.join { Vec::new() } else { group },
            id,
            snapshot_every: self.raft_snapshot_every,
            data_dir: self.data_dir,
            expected_backends: self.backends,
            expected_frontends: self.frontends,
            heartbeat: Duration::from_millis(self.heartbeat_ms),
            fd_threshold: self.fd_threshold,
            replicas: self.replicas,
            vnodes: self.vnodes,
        };
        self.transport.apply(Role::Manager, u32::try_from(id).context("--id too large")?)?;
        run::apply_limits(fawn_kv::server::NativeLimits::default(), None);
        run::manager(options, &self.listen, self.metrics.as_deref(), run::shutdown_on_signals()).await
    }
}

#[derive(Args, Debug)]
pub struct BackendArgs {
    /// This back-end's node id (stable across restarts).
    #[arg(long)]
    node: u32,
    /// Address to listen on (native protocol).
    #[arg(long, default_value = "127.0.0.1:7401")]
    listen: String,
    /// Address others reach this back-end at (default: --listen).
    #[arg(long)]
    advertise: Option<String>,
    /// Native addresses of the managers, comma-separated; the leader is found and followed.
    #[arg(long, default_value = "127.0.0.1:7400")]
    manager: String,
    /// Directory for this back-end's datastores.
    #[arg(long)]
    data_dir: PathBuf,
    /// Datastore sync policy: always, never or interval:MS.
    #[arg(long, default_value = "interval:100", value_parser = parse_sync)]
    sync: SyncPolicy,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    metrics: Option<String>,
    /// Milliseconds the head waits for the tail's ack before answering "timeout".
    #[arg(long, default_value_t = 2000)]
    chain_timeout_ms: u64,
    /// Keys this back-end expects to hold in total, over all its ranges and replicas (0 = no
    /// hint: every index starts small and grows online by doubling).
    ///
    /// A sizing hint for the in-DRAM index: each range's datastore, when it is created or
    /// opened, gets the share of N matching its part of the key space among this back-end's
    /// ranges, and its index is allocated for that many keys up front: 6 bytes per slot at
    /// 93 % load, i.e. 6.45 B of DRAM per expected key, paid at start even while empty. It
    /// saves the ~10 B per key of an index grown by doubling and the growth work of a bulk
    /// load (each doubling re-reads the whole log sequentially). The index still grows
    /// online past the hint; a datastore reopened from an index checkpoint keeps its saved
    /// size. Use it when the data set size is known (bulk loads, DRAM-tight nodes); leave 0
    /// when unsure, as an overshoot holds DRAM for keys that never come. See
    /// docs/OPERATIONS.md.
    #[arg(long, value_name = "N", default_value_t = 0)]
    expected_keys: u64,
    /// Milliseconds a chain link may go without acknowledgements before this back-end, if the
    /// successor also fails a direct probe, reports the link cut to the manager, which then
    /// repairs the chains around it (0 = never: puts wait until the link heals). Keep it well
    /// above the ack latency under load. See docs/OPERATIONS.md.
    #[arg(long, default_value_t = fawn_kv::backend::LINK_REPAIR_AFTER.as_millis() as u64)]
    link_repair_ms: u64,
    /// MiB per second this back-end streams to one syncing replica of a range that has fewer
    /// than R in-sync replicas (re-replication after a failure); 0 = unlimited.
    ///
    /// Copying a range competes with gets for CPU and disk on both ends; the paper rate-limits
    /// the pre-copy so a join costs foreground traffic little. Lower it to protect latency,
    /// raise it (or 0) to get back to R replicas sooner after a failure. See
    /// docs/OPERATIONS.md.
    #[arg(long, value_name = "MIB", env = "FAWN_COPY_RATE_MIB", default_value_t = fawn_kv::backend::COPY_BYTES_PER_S_DEFAULT >> 20)]
    copy_rate_mib: u64,
    /// The same ceiling for copies to a range that already has R in-sync replicas: a joining
    /// node's pre-copy, a leaving node's replacement (MiB/s of keys + values; 0 = unlimited).
    /// Nothing is at risk while they run, so by default they go slower and take less from
    /// foreground gets (docs/BENCHMARKS.md, gets during a join).
    #[arg(long, value_name = "MIB", env = "FAWN_JOIN_COPY_RATE_MIB", default_value_t = fawn_kv::backend::JOIN_COPY_BYTES_PER_S_DEFAULT >> 20)]
    join_copy_rate_mib: u64,
    #[command(flatten)]
    native: NativeBoundsArgs,
    #[command(flatten)]
    transport: TransportArgs,
}

impl BackendArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let options = BackendOptions {
            node: self.node,
            data_dir: self.data_dir,
            manager: self.manager,
            advertise: self.advertise.unwrap_or_else(|| self.listen.clone()),
            sync: self.sync,
            expected_keys: self.expected_keys,
            chain_timeout: Duration::from_millis(self.chain_timeout_ms),
            link_repair_after: Duration::from_millis(self.link_repair_ms),
            copy_bytes_per_s: self.copy_rate_mib.saturating_mul(1 << 20),
            join_copy_bytes_per_s: self.join_copy_rate_mib.saturating_mul(1 << 20),
        };
        self.transport.apply(Role::Backend, self.node)?;
        run::apply_limits(self.native.limits(), None);
        run::backend(options, &self.listen, self.metrics.as_deref(), run::shutdown_on_signals()).await
    }
}

#[derive(Args, Debug)]
pub struct FrontendArgs {
    /// Front-end id = wedge index (0..F, registered in order).
    #[arg(long)]
    id: u32,
    /// Native-protocol address to listen on.
    #[arg(long, default_value = "127.0.0.1:7500")]
    listen: String,
    /// Native address others reach this front-end at (default: --listen).
    #[arg(long)]
    advertise: Option<String>,
    /// memcached address to listen on.
    #[arg(long, default_value = "127.0.0.1:11211")]
    memcached: String,
    /// Native addresses of the managers, comma-separated; the leader is found and followed.
    #[arg(long, default_value = "127.0.0.1:7400")]
    manager: String,
    /// Directory for the front-end's lock file.
    #[arg(long)]
    data_dir: PathBuf,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    metrics: Option<String>,
    /// Query cache capacity in items (0 disables it).
    #[arg(long, default_value_t = 100_000)]
    cache_entries: usize,
    /// Query cache capacity in bytes of keys, values and per-item overhead (0 disables it).
    #[arg(long, default_value_t = fawn_kv::frontend::cache::CACHE_BYTES_DEFAULT)]
    cache_bytes: usize,
    /// Milliseconds a key's cache slot takes no fill after an update of the key ended with its
    /// outcome unknown (it may still commit, after a chain repair); also how long after
    /// start-up the cache takes no fill at all (an earlier process may have left updates in
    /// the chains). Keep it above the back-ends' manager lease (1.5 s).
    #[arg(long, default_value_t = fawn_kv::frontend::cache::UNSETTLED_UPDATE_HOLD.as_millis() as u64)]
    cache_unsettled_hold_ms: u64,
    /// Fault injection for tests: milliseconds this front-end waits after learning an update's
    /// outcome before acting on it (0, the default, in production).
    #[arg(long, default_value_t = 0, hide = true)]
    fault_outcome_delay_ms: u64,
    /// Fault injection for tests: drop every N-th `Committed` notice this front-end receives,
    /// as if lost with its connection (0, the default, in production).
    #[arg(long, default_value_t = 0, hide = true)]
    fault_drop_notice_every: u64,
    /// Milliseconds before a request to a back-end times out.
    #[arg(long, default_value_t = 3000)]
    request_timeout_ms: u64,
    /// Most memcached connections at once.
    #[arg(long, default_value_t = 4096)]
    max_connections: usize,
    /// Seconds an idle memcached connection is kept (0 = forever).
    #[arg(long, default_value_t = 0)]
    idle_timeout_secs: u64,
    /// Milliseconds a memcached client may take to accept pending replies (it stopped
    /// reading) before its connection is closed.
    #[arg(long, default_value_t = fawn_kv::memcache::MEMCACHE_WRITE_TIMEOUT.as_millis() as u64)]
    write_timeout_ms: u64,
    /// Milliseconds a memcached request may take from its first byte to its last, data
    /// block included, before its connection is closed.
    #[arg(long, default_value_t = fawn_kv::memcache::MEMCACHE_REQUEST_READ_TIMEOUT.as_millis() as u64)]
    request_read_timeout_ms: u64,
    /// Largest value accepted, in bytes.
    #[arg(long, default_value_t = fawn_ds::limits::VALUE_BYTES_MAX)]
    value_bytes_max: usize,
    /// MiB of replies the memcached port's reads may hold at once, from the request to the
    /// back-end until the reply is written to the client. A read first reserves the size its
    /// key's reply last took (the largest value, --value-bytes-max, for a key not seen yet);
    /// clients that never read hold at most this until the write timeout closes them.
    #[arg(long, default_value_t = fawn_kv::memcache::FETCH_BUDGET_BYTES >> 20)]
    fetch_budget_mib: usize,
    /// memcached clients must authenticate as a user of this file (`user:password` lines, as
    /// memcached's `-Y`): text clients with `set <key> 0 0 <n>` + `<user> <password>`, binary
    /// clients with SASL PLAIN.
    #[arg(long)]
    memcached_auth_file: Option<PathBuf>,
    /// TLS on the memcached port (memcached's `-Z` with `ssl_chain_cert`): the server's
    /// certificate chain in this PEM file, its own certificate first. Every memcached
    /// connection is then TLS; one that fails the handshake is closed.
    #[arg(long, value_name = "FILE", requires = "memcached_tls_key")]
    memcached_tls_cert: Option<PathBuf>,
    /// The private key of --memcached-tls-cert, PEM, readable by its owner only (memcached's
    /// `ssl_key`).
    #[arg(long, value_name = "FILE", requires = "memcached_tls_cert")]
    memcached_tls_key: Option<PathBuf>,
    /// Require memcached clients to present a certificate signed by a CA in this PEM file
    /// (memcached's `ssl_ca_cert` with `ssl_verify_mode=2`). Without it, no client
    /// certificate is asked for.
    #[arg(long, value_name = "FILE", requires = "memcached_tls_cert")]
    memcached_tls_client_ca: Option<PathBuf>,
    /// Milliseconds between this front-end's heartbeats to each back-end (t_hb). Each round
    /// is reported to the manager, which declares a back-end failed after the manager's
    /// `--fd-threshold` heartbeat intervals of silence; keep it equal to the manager's
    /// `--heartbeat-ms`. The reports also renew the front-end's 1.5 s lease: at most 500.
    #[arg(long, default_value_t = 200)]
    heartbeat_ms: u64,
    #[command(flatten)]
    native: NativeBoundsArgs,
    #[command(flatten)]
    transport: TransportArgs,
}

impl FrontendArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        self.transport.apply(Role::Frontend, self.id)?;
        let options = FrontendOptions {
            id: self.id,
            manager: self.manager,
            native_advertise: self.advertise.unwrap_or_else(|| self.listen.clone()),
            memcache_advertise: self.memcached.clone(),
            cache_entries: self.cache_entries,
            cache_bytes: self.cache_bytes,
            cache_timing: CacheTiming { unsettled_hold: Duration::from_millis(self.cache_unsettled_hold_ms) },
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            fault_outcome_delay: Duration::from_millis(self.fault_outcome_delay_ms),
            fault_drop_notice_every: self.fault_drop_notice_every,
            heartbeat: Duration::from_millis(self.heartbeat_ms.max(1)),
        };
        let mut mc = memcache_config(self.max_connections, self.idle_timeout_secs, self.value_bytes_max);
        mc.write_timeout = Duration::from_millis(self.write_timeout_ms.max(1));
        mc.request_read_timeout = Duration::from_millis(self.request_read_timeout_ms.max(1));
        mc.fetch_budget_bytes = self.fetch_budget_mib.saturating_mul(1 << 20);
        if let Some(cap) = run::apply_limits(self.native.limits(), Some(mc.max_connections)) {
            mc.max_connections = cap;
        }
        if let Some(path) = &self.memcached_auth_file {
            let users = fawn_kv::memcache::auth::Users::load(path)
                .map_err(|e| anyhow::anyhow!("--memcached-auth-file {}: {e}", path.display()))?;
            mc.users = Some(std::sync::Arc::new(users));
        }
        if let (Some(cert), Some(key)) = (&self.memcached_tls_cert, &self.memcached_tls_key) {
            let client_ca = self.memcached_tls_client_ca.as_deref();
            let tls = fawn_tls::ClientTls::load(cert, key, client_ca)
                .map_err(|e| anyhow::anyhow!("--memcached-tls-cert {}: {e}", cert.display()))?;
            let reloaded = tls.clone();
            run::on_hangup("memcached TLS certificate", move || Ok(reloaded.reload()?));
            mc.tls = Some(tls);
        }
        let metrics = self.metrics.as_deref();
        let shutdown = run::shutdown_on_signals();
        run::frontend(options, &self.data_dir, &self.listen, &self.memcached, mc, metrics, shutdown).await
    }
}

fn memcache_config(
    max_connections: usize,
    idle_secs: u64,
    value_bytes_max: usize,
) -> fawn_kv::memcache::MemcacheConfig {
    let mut config = fawn_kv::memcache::MemcacheConfig {
        max_connections,
        idle_timeout: (idle_secs > 0).then(|| Duration::from_secs(idle_secs)),
        ..Default::default()
    };
    config.limits.value_bytes_max = value_bytes_max;
    config
}

/// The managers `fawn up` starts with its default ports.
const LOCAL_MANAGERS: &str = "127.0.0.1:7400,127.0.0.1:7651,127.0.0.1:7652";

/// Bounds of a role's native-protocol listener.
#[derive(Args, Debug)]
pub struct NativeBoundsArgs {
    /// Most native-protocol connections at once (lowered to fit the file-descriptor limit);
    /// one more is told `too many open connections` in an error frame and closed.
    #[arg(long, default_value_t = fawn_kv::server::NATIVE_CONNECTIONS_MAX)]
    native_connections_max: usize,
    /// Milliseconds a native connection with nothing in flight may stay silent.
    #[arg(long, default_value_t = fawn_kv::server::NATIVE_IDLE_TIMEOUT.as_millis() as u64)]
    native_idle_timeout_ms: u64,
    /// Milliseconds a native frame may take from its first byte to its last.
    #[arg(long, default_value_t = fawn_kv::server::NATIVE_FRAME_TIMEOUT.as_millis() as u64)]
    native_frame_timeout_ms: u64,
    /// Milliseconds a native peer may take to accept queued responses before it is closed.
    #[arg(long, default_value_t = fawn_kv::server::NATIVE_WRITE_TIMEOUT.as_millis() as u64)]
    native_write_timeout_ms: u64,
    /// MiB of responses all connections of one native listener may hold in the making or
    /// queued for their peers (at least 16): 3/8 for requests front-ends forward, 1/2 for
    /// clients' own gets, 1/8 for the rest. A connection that finds no room is not read until
    /// there is; peers that never read hold it until the write timeout closes them.
    #[arg(long, default_value_t = (fawn_kv::server::NATIVE_REPLY_BUDGET_BYTES >> 20) as u64)]
    native_reply_budget_mib: u64,
}

impl NativeBoundsArgs {
    fn limits(&self) -> fawn_kv::server::NativeLimits {
        fawn_kv::server::NativeLimits {
            connections_max: self.native_connections_max.max(1),
            read: fawn_client::framed::ReadTimeouts {
                idle: Duration::from_millis(self.native_idle_timeout_ms.max(1)),
                frame: Duration::from_millis(self.native_frame_timeout_ms.max(1)),
            },
            write_timeout: Duration::from_millis(self.native_write_timeout_ms.max(1)),
            reply_budget_bytes: usize::try_from(self.native_reply_budget_mib.saturating_mul(1 << 20))
                .unwrap_or(usize::MAX),
        }
    }
}

#[derive(Args, Debug)]
pub struct LeaveArgs {
    /// The back-end to remove.
    #[arg(long)]
    pub node: u32,
    /// Native addresses of the managers, comma-separated.
    #[arg(long, default_value = LOCAL_MANAGERS)]
    pub manager: String,
    #[command(flatten)]
    pub transport: AdminTransportArgs,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Native addresses of the managers, comma-separated: each is shown with its role, term
    /// and log position; the configuration comes from the leader. Default: `fawn up`'s.
    #[arg(long, default_value = LOCAL_MANAGERS)]
    pub manager: String,
    #[command(flatten)]
    pub transport: AdminTransportArgs,
}

#[derive(Args, Debug)]
pub struct ManagersArgs {
    /// `add` (the new manager must be running, started with `fawn manager --join --id ID`)
    /// or `remove`.
    #[arg(value_parser = ["add", "remove"])]
    pub action: String,
    /// The manager's id in the group.
    #[arg(long)]
    pub id: u64,
    /// The manager's native address (for `add`).
    #[arg(long, default_value = "")]
    pub addr: String,
    /// Native addresses of the current managers, comma-separated.
    #[arg(long, default_value = LOCAL_MANAGERS)]
    pub manager: String,
    #[command(flatten)]
    pub transport: AdminTransportArgs,
}
