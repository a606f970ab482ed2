//! Counters for `stats`, shared by all connections of one server.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

/// Declares the counters once: the struct fields, `reset` and lookup by `stats` name.
macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// Server-wide counters (relaxed atomics: they are statistics, not synchronisation).
        #[derive(Debug, Default)]
        pub struct Counters {
            $(pub $name: AtomicU64,)*
        }

        impl Counters {
            /// `stats reset` clears the command and traffic counters, not the gauges.
            fn reset(&self) {
                $(self.$name.store(0, Relaxed);)*
            }

            fn get(&self, name: &str) -> Option<u64> {
                match name {
                    $(stringify!($name) => Some(self.$name.load(Relaxed)),)*
                    _ => None,
                }
            }
        }
    };
}

counters!(
    cmd_get,
    cmd_set,
    cmd_flush,
    cmd_touch,
    cmd_meta,
    get_hits,
    get_misses,
    get_expired,
    get_flushed,
    delete_misses,
    delete_hits,
    incr_misses,
    incr_hits,
    decr_misses,
    decr_hits,
    cas_misses,
    cas_hits,
    cas_badval,
    touch_hits,
    touch_misses,
    store_too_large,
    server_errors,
    fetch_budget_waits,
    fetch_budget_rereads,
    ssl_handshake_errors,
    bytes_read,
    bytes_written,
    total_items,
);

/// memcached's `ITEM_UPDATE_INTERVAL`: its relative clock starts this far before its uptime.
const ITEM_UPDATE_INTERVAL_SECS: u64 = 60;

/// Everything `stats` reports that the front-end itself knows.
#[derive(Debug)]
pub struct Stats {
    started: Instant,
    pub counters: Counters,
    curr_connections: AtomicU64,
    total_connections: AtomicU64,
    rejected_connections: AtomicU64,
    /// Open connections by socket descriptor, for `stats conns`.
    conns: Mutex<BTreeMap<i32, ConnEntry>>,
    /// `stats settings` `oldest`: when the last `flush_all` served here takes effect, on
    /// memcached's relative clock (see [`Stats::flushed`]); 0 before any.
    oldest: AtomicU64,
    /// When the TLS certificates were last read (`refresh_certs`), on memcached's relative
    /// clock: 0 for the read at start, as memcached counts it.
    certs_read: AtomicU64,
}

/// What `stats conns` shows of one connection.
#[derive(Debug, Clone)]
pub struct ConnEntry {
    pub peer: Option<SocketAddr>,
    pub activity: Arc<Activity>,
}

/// Updated by the connection's session as it works.
#[derive(Debug, Default)]
pub struct Activity {
    /// Seconds since the server started, at the connection's last request.
    pub last_cmd_secs: AtomicU64,
    /// Running requests (else waiting for input).
    pub busy: AtomicBool,
}

impl Default for Stats {
    fn default() -> Self {
        Self::new()
    }
}

impl Stats {
    pub fn new() -> Self {
        Stats {
            started: Instant::now(),
            counters: Counters::default(),
            curr_connections: AtomicU64::new(0),
            total_connections: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            conns: Mutex::new(BTreeMap::new()),
            oldest: AtomicU64::new(0),
            certs_read: AtomicU64::new(0),
        }
    }

    /// A `flush_all` served here, taking effect `delay_secs` from now. memcached's clock
    /// runs [`ITEM_UPDATE_INTERVAL_SECS`] ahead of its uptime, and with cas enabled its
    /// `oldest` is the flush time less one second: the same arithmetic on this front-end's
    /// uptime. (A flush through another front-end is not seen here.)
    pub fn flushed(&self, delay_secs: u64) {
        let at = self.relative_now() + delay_secs;
        self.oldest.store(at.saturating_sub(1), Relaxed);
    }

    pub fn oldest(&self) -> u64 {
        self.oldest.load(Relaxed)
    }

    /// The TLS certificates were read again now.
    pub fn certs_refreshed(&self) {
        self.certs_read.store(self.relative_now(), Relaxed);
    }

    /// `time_since_server_cert_refresh`: seconds since the certificates were last read, on
    /// memcached's relative clock (so it starts at [`ITEM_UPDATE_INTERVAL_SECS`], as there).
    pub fn secs_since_certs_read(&self) -> u64 {
        self.relative_now().saturating_sub(self.certs_read.load(Relaxed))
    }

    fn relative_now(&self) -> u64 {
        self.uptime_secs() + ITEM_UPDATE_INTERVAL_SECS
    }

    /// Lists an open connection for `stats conns`; its session updates the returned state.
    pub fn register(&self, fd: i32, peer: Option<SocketAddr>) -> Arc<Activity> {
        let activity = Arc::new(Activity::default());
        activity.last_cmd_secs.store(self.uptime_secs(), Relaxed);
        self.conns.lock().insert(fd, ConnEntry { peer, activity: activity.clone() });
        activity
    }

    pub fn deregister(&self, fd: i32) {
        self.conns.lock().remove(&fd);
    }

    /// The open connections, by descriptor.
    pub fn conns(&self) -> Vec<(i32, ConnEntry)> {
        self.conns.lock().iter().map(|(fd, entry)| (*fd, entry.clone())).collect()
    }

    pub fn incr(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    pub fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Relaxed);
    }

    pub fn connection_opened(&self) {
        self.curr_connections.fetch_add(1, Relaxed);
        self.total_connections.fetch_add(1, Relaxed);
    }

    pub fn connection_closed(&self) {
        self.curr_connections.fetch_sub(1, Relaxed);
    }

    pub fn rejected_connection(&self) {
        self.rejected_connections.fetch_add(1, Relaxed);
        self.total_connections.fetch_add(1, Relaxed);
    }

    pub fn uptime_secs(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    pub fn reset(&self) {
        self.counters.reset();
        self.rejected_connections.store(0, Relaxed);
    }

    /// A counter or connection gauge by its `stats` name.
    pub fn get(&self, name: &str) -> Option<u64> {
        let gauge = match name {
            "curr_connections" => &self.curr_connections,
            "total_connections" => &self.total_connections,
            "rejected_connections" => &self.rejected_connections,
            _ => return self.counters.get(name),
        };
        Some(gauge.load(Relaxed))
    }
}
