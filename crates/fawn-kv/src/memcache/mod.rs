//! The memcached text-protocol front-end (memcached 1.6 `protocol.txt`, classic and meta
//! commands), written only against [`KvService`], so it knows nothing of rings or chains.
//!
//! Shape (as in mini-redis): [`serve`] accepts connections until `shutdown` resolves; each
//! connection runs a `session::Session`, which parses requests with
//! `fawn_proto::memcache::parse`, runs them one at a time (so pipelined requests are answered
//! in order) through the handlers in [`cmd`], which write their replies into the connection
//! ([`conn`]: the socket and its buffers, a leaf that knows no commands), sent in batches.

mod access;
pub mod auth;
mod budget;
mod cmd;
mod conn;
mod session;
mod stats;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fawn_proto::memcache::{reply, Limits};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};

use crate::service::KvService;
pub use budget::{CONNECTION_FETCH_BYTES_MAX, FETCH_BUDGET_BYTES};
pub use stats::Stats;

/// A client that takes no byte of its pending replies for this long (it stopped reading) is
/// closed: what it holds (its replies, a multi-get's values) is freed.
pub const MEMCACHE_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most time from a request's first byte to its last (its data block included): a client
/// dripping a request byte by byte is closed. Leaves room for a 1 MiB value over a slow link.
pub const MEMCACHE_REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Most time a client may take over its TLS handshake; the connection holds a permit meanwhile.
pub const MEMCACHE_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of the memcached front-end.
#[derive(Debug, Clone)]
pub struct MemcacheConfig {
    /// Parser bounds: line length and the largest value (`-I` in memcached; default 1 MiB).
    pub limits: Limits,
    /// Open connections allowed at once (`-c`); one more is told
    /// `SERVER_ERROR too many open connections` and closed.
    pub max_connections: usize,
    /// Close a connection idle this long (`idle_timeout`; `None` = never, memcached's default).
    pub idle_timeout: Option<Duration>,
    /// Close a connection whose client takes no reply bytes for this long.
    pub write_timeout: Duration,
    /// Close a connection whose request takes longer than this to arrive whole.
    pub request_read_timeout: Duration,
    /// The version reported by `version` and `stats`. Clients parse the leading `x.y.z` to
    /// pick features, so it starts with the memcached release whose protocol we follow.
    pub version: String,
    /// `threads` reported by `stats`.
    pub threads: usize,
    /// Users allowed in (`None`: no authentication). Text connections must first send an
    /// authenticating `set`; binary ones SASL `PLAIN` (see [`auth`]).
    pub users: Option<Arc<auth::Users>>,
    /// TLS on this port (memcached's `-Z`; `None`: plain TCP). Every connection is TLS then:
    /// one that fails the handshake (a plaintext client, a client certificate that is missing
    /// or not of the clients' CA when one is required) is closed before it is served.
    pub tls: Option<fawn_tls::ClientTls>,
    /// At shutdown, how long connections may take to finish the request they are running
    /// (a request waiting on an unresponsive chain must not hold the process up forever).
    pub shutdown_grace: Duration,
    /// Bytes of replies all connections' reads may hold at once ([`FETCH_BUDGET_BYTES`]).
    pub fetch_budget_bytes: usize,
}

impl Default for MemcacheConfig {
    fn default() -> Self {
        MemcacheConfig {
            limits: Limits::default(),
            max_connections: 1024,
            idle_timeout: None,
            write_timeout: MEMCACHE_WRITE_TIMEOUT,
            request_read_timeout: MEMCACHE_REQUEST_READ_TIMEOUT,
            version: format!("1.6.21-fawn-{}", env!("CARGO_PKG_VERSION")),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            users: None,
            tls: None,
            shutdown_grace: Duration::from_secs(5),
            fetch_budget_bytes: FETCH_BUDGET_BYTES,
        }
    }
}

/// What every connection of one server shares.
struct Shared<S> {
    service: Arc<S>,
    config: MemcacheConfig,
    stats: Stats,
    /// The address this server listens on (`stats settings`, `stats conns`).
    listen: Option<std::net::SocketAddr>,
    /// The listening socket's descriptor (`stats conns`).
    listen_fd: i32,
    /// Items' read marks (`mg h l`, `me`).
    access: access::AccessTable,
    /// Room for values on their way from the cluster to the clients.
    budget: budget::FetchBudget,
}

/// Serves the memcached protocol on `listener` until `shutdown` resolves, then stops accepting,
/// lets each connection finish the request it is running (within `config.shutdown_grace`),
/// closes them, and returns.
///
/// Errors accepting a connection (e.g. out of file descriptors) are logged and retried after
/// a short pause; they never stop the server.
pub async fn serve<S: KvService>(
    listener: TcpListener,
    service: Arc<S>,
    config: MemcacheConfig,
    shutdown: impl Future,
) {
    let permits = Arc::new(Semaphore::new(config.max_connections));
    let listen = listener.local_addr().ok();
    let listen_fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
    let access = access::AccessTable::default();
    let budget = budget::FetchBudget::new(&config.limits, config.fetch_budget_bytes);
    let stats = Stats::new();
    let shared = Arc::new(Shared { service, config, stats, listen, listen_fd, access, budget });
    let (stop_tx, stop_rx) = watch::channel(false);
    // Each connection task holds a clone of `done_tx`; when all are dropped, all have ended.
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Ok(permit) = permits.clone().try_acquire_owned() else {
                        shared.stats.rejected_connection();
                        // A TLS client could not read the plaintext refusal: it is just closed.
                        if shared.config.tls.is_none() {
                            tokio::spawn(refuse(stream));
                        }
                        continue;
                    };
                    let shared = shared.clone();
                    let stop = stop_rx.clone();
                    let done = done_tx.clone();
                    tokio::spawn(async move {
                        if let Some(stream) = client_stream(stream, &shared).await {
                            let conn = conn::Connection::new(stream, shared.config.write_timeout);
                            session::Session::new(conn, shared, stop).run().await;
                        }
                        drop(permit);
                        drop(done);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "memcached front-end: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    // Stop listening at once: connections queued in the backlog would never be served.
    drop(listener);
    let _ = stop_tx.send(true);
    drop(done_tx);
    let grace = shared.config.shutdown_grace;
    if tokio::time::timeout(grace, done_rx.recv()).await.is_err() {
        tracing::warn!("memcached front-end: connections still busy after {grace:?}; leaving them");
    }
}

/// The accepted connection, after the TLS handshake on a TLS port; `None` if that fails or
/// takes longer than [`MEMCACHE_TLS_HANDSHAKE_TIMEOUT`] (the connection is closed).
async fn client_stream<S>(tcp: TcpStream, shared: &Shared<S>) -> Option<conn::ClientStream> {
    let Some(tls) = shared.config.tls.as_ref() else { return Some(conn::ClientStream::Plain(tcp)) };
    let peer = tcp.peer_addr().ok();
    match tokio::time::timeout(MEMCACHE_TLS_HANDSHAKE_TIMEOUT, tls.acceptor().accept(tcp)).await {
        Ok(Ok(stream)) => Some(conn::ClientStream::Tls(Box::new(stream))),
        Ok(Err(e)) => {
            Stats::incr(&shared.stats.counters.ssl_handshake_errors);
            tracing::debug!(?peer, error = %e, "memcached front-end: TLS handshake failed; closed");
            None
        }
        Err(_) => {
            Stats::incr(&shared.stats.counters.ssl_handshake_errors);
            tracing::debug!(?peer, "memcached front-end: TLS handshake timed out; closed");
            None
        }
    }
}

/// Over the connection limit: say so, as memcached does, and close.
async fn refuse(mut stream: TcpStream) {
    let _ = stream.write_all(reply::TOO_MANY_CONNECTIONS).await;
    let _ = stream.shutdown().await;
}
