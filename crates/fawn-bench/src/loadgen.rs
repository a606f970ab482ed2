//! The load generator: many connections, each a writer task and a reader task, so that requests
//! can be pipelined (up to `pipeline` in flight) and, in open-loop mode, sent on schedule whether
//! or not earlier ones were answered.
//!
//! Latency is measured from a request's *intended* start: in closed loop that is when it is
//! issued; in open loop it is its scheduled time, so a server that falls behind is charged for
//! the queueing it causes (no coordinated omission). Open-loop send times come from a pacer
//! thread (see [`spawn_pacer`]) because tokio's timer only has 1 ms granularity, which would
//! batch sends into bursts and charge the server for the generator's own slop.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use hdrhistogram::Histogram;
use rand::{rngs::SmallRng, Rng, SeedableRng};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use crate::keydist::KeyChooser;
use crate::progress::{self, Counters};
use crate::proto::{Protocol, Reply};
use crate::workload::Workload;

/// Flush the write buffer at least this often (bytes), even when more permits are free.
const WRITE_BUF_FLUSH_BYTES: usize = 64 * 1024;
/// Keys written per round trip while preloading.
const PRELOAD_BATCH: u64 = 128;
/// Connections used for preloading (more would not help one server on 2 cores).
const PRELOAD_CONNECTIONS: usize = 8;
/// Highest latency the histograms track, ns (a larger one is clamped, not dropped).
const HIST_NS_MAX: u64 = 60_000_000_000;
/// Width of one bucket of [`LoadStats::timeline`].
pub const TIMELINE_BUCKET: Duration = Duration::from_millis(100);
/// Longest timeline kept (buckets beyond it are not counted).
const TIMELINE_BUCKETS_MAX: usize = 36_000;

/// What a run measured.
#[derive(Debug)]
pub struct LoadStats {
    /// Get latencies, ns.
    pub get: Histogram<u64>,
    /// Set latencies, ns.
    pub set: Histogram<u64>,
    pub hits: u64,
    pub misses: u64,
    pub errors: u64,
    /// The measured window (after warm-up).
    pub window: Duration,
    /// CPU seconds the server process used during the window, if we know its pid.
    pub server_cpu_s: Option<f64>,
    /// Completions (any outcome) per [`TIMELINE_BUCKET`] since the run started, warm-up
    /// included: the throughput-over-time curves of the paper's Figures 11 and 13.
    pub timeline: Vec<u64>,
    /// Error replies per [`TIMELINE_BUCKET`], same origin.
    pub timeline_errors: Vec<u64>,
}

fn new_hist() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, HIST_NS_MAX, 3).context("creating latency histogram")
}

impl LoadStats {
    pub(crate) fn empty() -> Result<LoadStats> {
        Ok(LoadStats {
            get: new_hist()?,
            set: new_hist()?,
            hits: 0,
            misses: 0,
            errors: 0,
            window: Duration::ZERO,
            server_cpu_s: None,
            timeline: Vec::new(),
            timeline_errors: Vec::new(),
        })
    }

    pub(crate) fn merge(&mut self, o: &LoadStats) -> Result<()> {
        self.get.add(&o.get).context("merging histograms")?;
        self.set.add(&o.set).context("merging histograms")?;
        self.hits += o.hits;
        self.misses += o.misses;
        self.errors += o.errors;
        add_into(&mut self.timeline, &o.timeline);
        add_into(&mut self.timeline_errors, &o.timeline_errors);
        Ok(())
    }

    /// Count one completion at `since_start` in the timeline (and as an error if `error`).
    pub(crate) fn tick(&mut self, since_start: Duration, error: bool) {
        let b = (since_start.as_nanos() / TIMELINE_BUCKET.as_nanos()) as usize;
        if b >= TIMELINE_BUCKETS_MAX {
            return;
        }
        if self.timeline.len() <= b {
            self.timeline.resize(b + 1, 0);
            self.timeline_errors.resize(b + 1, 0);
        }
        self.timeline[b] += 1;
        if error {
            self.timeline_errors[b] += 1;
        }
    }

    /// Operations completed in the measured window.
    pub fn ops(&self) -> u64 {
        self.get.len() + self.set.len()
    }
}

fn add_into(a: &mut Vec<u64>, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// Everything a connection needs, shared.
struct RunCtx {
    addr: SocketAddr,
    proto: Protocol,
    w: Workload,
    keys: Arc<KeyChooser>,
    value: Vec<u8>,
    start: Instant,
    warmup_end: Instant,
    end: Instant,
    /// Open loop (a pacer thread hands out send times) or closed loop.
    open_loop: bool,
    counters: Arc<Counters>,
    /// TLS to the server, if the workload asks for it.
    tls: Option<TlsConnector>,
}

/// One request in flight: what to parse and when it was meant to start.
struct InFlight {
    is_get: bool,
    intended: Instant,
}

/// The reading half of a connection (plain TCP or TLS).
type OwnedReadHalf = Box<dyn AsyncRead + Unpin + Send>;
/// The writing half of a connection.
type OwnedWriteHalf = Box<dyn AsyncWrite + Unpin + Send>;

/// A TLS client trusting the workload's CA (`Workload::tls_ca`), if it has one.
fn tls_connector(w: &Workload) -> Result<Option<TlsConnector>> {
    let Some(path) = &w.tls_ca else { return Ok(None) };
    let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        roots.add(cert.with_context(|| format!("a certificate in {}", path.display()))?)?;
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Some(TlsConnector::from(Arc::new(config))))
}

/// Connect with TCP_NODELAY (we batch ourselves; Nagle would add 40 ms stalls), then the TLS
/// handshake if `tls` is given (the server's certificate must name `addr`'s IP).
async fn connect(addr: SocketAddr, tls: Option<&TlsConnector>) -> Result<(OwnedReadHalf, OwnedWriteHalf)> {
    let s = TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
    s.set_nodelay(true).context("setting TCP_NODELAY")?;
    let Some(tls) = tls else {
        let (r, w) = s.into_split();
        return Ok((Box::new(r), Box::new(w)));
    };
    let stream = tls.connect(ServerName::IpAddress(addr.ip().into()), s).await.context("TLS handshake")?;
    let (r, w) = tokio::io::split(stream);
    Ok((Box::new(r), Box::new(w)))
}

/// Write every key `0..keys` once, so gets hit. Fails if the server refuses any set.
pub async fn preload(addr: SocketAddr, proto: Protocol, w: &Workload) -> Result<()> {
    let conns = PRELOAD_CONNECTIONS.min(w.connections).max(1);
    let value = Arc::new(w.value());
    let tls = tls_connector(w)?;
    let mut tasks = Vec::new();
    for c in 0..conns {
        let (w, value) = (w.clone(), value.clone());
        let stream = connect(addr, tls.as_ref()).await?;
        tasks.push(tokio::spawn(async move {
            preload_conn(addr, stream, proto, &w, &value, c as u64, conns as u64).await
        }));
    }
    for t in tasks {
        t.await.context("preload task panicked")??;
    }
    Ok(())
}

async fn preload_conn(
    addr: SocketAddr,
    (r, mut wr): (OwnedReadHalf, OwnedWriteHalf),
    proto: Protocol,
    w: &Workload,
    value: &[u8],
    first: u64,
    step: u64,
) -> Result<()> {
    let mut r = BufReader::with_capacity(64 * 1024, r);
    let (mut buf, mut key, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
    let mut next = first;
    while next < w.keys {
        buf.clear();
        let mut n = 0;
        while n < PRELOAD_BATCH && next < w.keys {
            w.key(next, &mut key);
            proto.encode_set(&mut buf, &key, value);
            next += step;
            n += 1;
        }
        wr.write_all(&buf).await.context("sending preload batch")?;
        wr.flush().await.context("sending preload batch")?;
        for _ in 0..n {
            let reply = tokio::time::timeout(w.timeout, proto.read_set(&mut r, &mut scratch))
                .await
                .map_err(|_| anyhow!("no reply from {addr} within {:?} while preloading", w.timeout))??;
            if reply != Reply::Stored {
                anyhow::bail!(
                    "{addr} refused a preload set ({:?}); is the server's memory big enough for {} keys of {} B?",
                    String::from_utf8_lossy(&scratch),
                    w.keys,
                    w.value_size
                );
            }
        }
    }
    Ok(())
}

/// Run one workload point against `addr` and return what it measured.
///
/// `server_pids` (each with its descendants) are sampled from /proc to report the server's CPU
/// seconds.
pub async fn run(
    addr: SocketAddr,
    proto: Protocol,
    w: &Workload,
    label: &str,
    server_pids: &[u32],
    quiet: bool,
) -> Result<LoadStats> {
    // Fail fast on an unreachable server instead of after the whole run's duration.
    let ctx = Arc::new(make_ctx(addr, proto, w)?);
    drop(connect(addr, ctx.tls.as_ref()).await?);
    let bar = progress::spawn(label.to_string(), ctx.counters.clone(), ctx.warmup_end, ctx.end, quiet);
    let (senders, mut receivers): (Vec<_>, Vec<_>) = (0..w.connections)
        .map(|_| {
            let (tx, rx) = mpsc::unbounded_channel();
            (tx, Some(rx))
        })
        .unzip();
    let pacer = if ctx.open_loop { Some(spawn_pacer(w.rate, ctx.start, ctx.end, senders)?) } else { None };
    let conns: Vec<_> = (0..w.connections)
        .map(|c| {
            let tokens = if ctx.open_loop { receivers[c].take() } else { None };
            tokio::spawn(run_conn(ctx.clone(), c, tokens))
        })
        .collect();
    tokio::time::sleep_until(ctx.warmup_end).await;
    let cpu0 = crate::servers::cpu_seconds_all(server_pids);
    tokio::time::sleep_until(ctx.end).await;
    let cpu1 = crate::servers::cpu_seconds_all(server_pids);
    let mut total = LoadStats::empty()?;
    for c in conns {
        let stats = c.await.context("connection task panicked")??;
        total.merge(&stats)?;
    }
    if let Some(b) = bar {
        let _ = b.await;
    }
    if let Some(p) = pacer {
        let _ = p.join();
    }
    total.window = ctx.end - ctx.warmup_end;
    total.server_cpu_s = cpu0.zip(cpu1).map(|(a, b)| b - a);
    Ok(total)
}

fn make_ctx(addr: SocketAddr, proto: Protocol, w: &Workload) -> Result<RunCtx> {
    let keys = KeyChooser::new(w.keys, w.distribution, w.zipf_theta)?;
    let start = Instant::now();
    let warmup_end = start + w.warmup;
    Ok(RunCtx {
        addr,
        proto,
        w: w.clone(),
        keys,
        value: w.value(),
        start,
        warmup_end,
        end: warmup_end + w.duration,
        open_loop: w.rate > 0.0,
        counters: Arc::new(Counters::default()),
        tls: tls_connector(w)?,
    })
}

async fn run_conn(
    ctx: Arc<RunCtx>,
    conn: usize,
    tokens: Option<mpsc::UnboundedReceiver<Instant>>,
) -> Result<LoadStats> {
    let (r, wr) = connect(ctx.addr, ctx.tls.as_ref()).await?;
    let (tx, rx) = mpsc::unbounded_channel(); // bounded in practice by the semaphore
    let sem = Arc::new(Semaphore::new(ctx.w.pipeline));
    let writer = tokio::spawn(write_loop(ctx.clone(), wr, tx, sem.clone(), conn, tokens));
    match read_loop(&ctx, r, rx, &sem).await {
        Ok(stats) => {
            writer.await.context("writer task panicked")??;
            Ok(stats)
        }
        Err(e) => {
            // The writer may be parked on a permit the reader will never return.
            writer.abort();
            Err(e)
        }
    }
}

async fn write_loop(
    ctx: Arc<RunCtx>,
    mut wr: OwnedWriteHalf,
    tx: mpsc::UnboundedSender<InFlight>,
    sem: Arc<Semaphore>,
    conn: usize,
    mut tokens: Option<mpsc::UnboundedReceiver<Instant>>,
) -> Result<()> {
    let mut rng = SmallRng::seed_from_u64(ctx.w.seed ^ (conn as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let (mut buf, mut key) = (Vec::with_capacity(WRITE_BUF_FLUSH_BYTES), Vec::new());
    loop {
        let scheduled = match tokens.as_mut() {
            Some(rx) => match rx.recv().await {
                Some(t) => Some(t),
                None => break, // the pacer stopped: the run is over
            },
            None => None,
        };
        if Instant::now() >= ctx.end {
            break;
        }
        acquire(&sem, &mut wr, &mut buf).await?;
        let intended = scheduled.unwrap_or_else(Instant::now);
        let is_get = rng.gen_bool(ctx.w.get_ratio);
        let k = if is_get { ctx.keys.get_key(&mut rng) } else { ctx.keys.put_key(&mut rng) };
        ctx.w.key(k, &mut key);
        if is_get {
            ctx.proto.encode_get(&mut buf, &key);
        } else {
            ctx.proto.encode_set(&mut buf, &key, &ctx.value);
        }
        if tx.send(InFlight { is_get, intended }).is_err() {
            break; // the reader failed; its error is the one reported
        }
        if ctx.open_loop || buf.len() >= WRITE_BUF_FLUSH_BYTES {
            flush(&mut wr, &mut buf).await?;
        }
    }
    flush(&mut wr, &mut buf).await
}

/// Hand out send times at `rate` per second in total, round-robin over the connections, from a
/// dedicated thread that sleeps with the OS's ~50-100 µs precision instead of tokio's 1 ms.
/// Each token is the request's scheduled start; latency is charged from it. Stops at `end`.
pub(crate) fn spawn_pacer(
    rate: f64,
    start: Instant,
    end: Instant,
    conns: Vec<mpsc::UnboundedSender<Instant>>,
) -> Result<std::thread::JoinHandle<()>> {
    let (start, end) = (start.into_std(), end.into_std());
    let step = Duration::from_secs_f64(1.0 / rate);
    std::thread::Builder::new()
        .name("bench-pacer".into())
        .spawn(move || {
            let mut k: u64 = 0;
            loop {
                let now = std::time::Instant::now();
                if now >= end {
                    break;
                }
                // Send every token that is due (several if we overslept).
                let mut next = start + step.mul_f64(k as f64);
                while next <= now {
                    let _ = conns[(k % conns.len() as u64) as usize].send(Instant::from_std(next));
                    k += 1;
                    next = start + step.mul_f64(k as f64);
                }
                std::thread::sleep(next.saturating_duration_since(std::time::Instant::now()));
            }
        })
        .context("starting the pacer thread")
}

/// Take one in-flight permit; if none is free, first send what is buffered (the responses that
/// return permits may depend on it).
async fn acquire(sem: &Semaphore, wr: &mut OwnedWriteHalf, buf: &mut Vec<u8>) -> Result<()> {
    match sem.try_acquire() {
        Ok(p) => p.forget(),
        Err(_) => {
            flush(wr, buf).await?;
            sem.acquire().await.context("semaphore closed")?.forget();
        }
    }
    Ok(())
}

async fn flush(wr: &mut OwnedWriteHalf, buf: &mut Vec<u8>) -> Result<()> {
    if !buf.is_empty() {
        wr.write_all(buf).await.context("sending requests")?;
        // TLS may keep the last records until flushed.
        wr.flush().await.context("sending requests")?;
        buf.clear();
    }
    Ok(())
}

async fn read_loop(
    ctx: &RunCtx,
    r: OwnedReadHalf,
    mut rx: mpsc::UnboundedReceiver<InFlight>,
    sem: &Semaphore,
) -> Result<LoadStats> {
    let mut r = BufReader::with_capacity(64 * 1024, r);
    let mut scratch = Vec::new();
    let mut stats = LoadStats::empty()?;
    while let Some(f) = rx.recv().await {
        let read = async {
            if f.is_get {
                ctx.proto.read_get(&mut r, &mut scratch).await
            } else {
                ctx.proto.read_set(&mut r, &mut scratch).await
            }
        };
        let reply = tokio::time::timeout(ctx.w.timeout, read)
            .await
            .map_err(|_| anyhow!("no reply from {} within {:?}", ctx.addr, ctx.w.timeout))?
            .with_context(|| format!("reading a reply from {}", ctx.addr))?;
        let now = Instant::now();
        sem.add_permits(1);
        ctx.counters.done.fetch_add(1, Ordering::Relaxed);
        record(ctx, &mut stats, &f, reply, now);
    }
    Ok(stats)
}

/// Count a completed request if it completed inside the measured window.
fn record(ctx: &RunCtx, stats: &mut LoadStats, f: &InFlight, reply: Reply, now: Instant) {
    if reply == Reply::Error {
        ctx.counters.errors.fetch_add(1, Ordering::Relaxed);
    }
    stats.tick(now - ctx.start, reply == Reply::Error);
    if now < ctx.warmup_end || now > ctx.end {
        return;
    }
    let ns = u64::try_from((now - f.intended).as_nanos()).unwrap_or(u64::MAX);
    let hist = if f.is_get { &mut stats.get } else { &mut stats.set };
    hist.saturating_record(ns.max(1));
    match reply {
        Reply::Hit => stats.hits += 1,
        Reply::Miss => stats.misses += 1,
        Reply::Error => stats.errors += 1,
        Reply::Stored => {}
    }
}
