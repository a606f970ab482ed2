//! `fawn bench distance`: how throughput depends on concurrency when the front-end is some
//! network distance away from the back-ends (after fawn-as-a-service.md, whose one synchronous
//! client over a data-centre network got ~27 ops/s).
//!
//! The intended set-up is network namespaces joined by veth pairs with `tc netem` delay. The
//! command probes for netem first; where the kernel lacks it (CONFIG_NET_SCH_NETEM off and no
//! modules, as on the Firecracker VM these numbers come from) it says so in the results and uses
//! a delay proxy instead: every back-end advertises the port of a user-space TCP proxy that
//! holds each chunk for half the added round-trip time in each direction, so front-end →
//! back-end, back-end → back-end (chain) and manager → back-end traffic all pay the distance,
//! and the client → front-end hop does not. The front-end cache is off so that every get
//! crosses the distance. The proxy runs on its own thread of this process;
//! tokio's timer rounds sleeps up to 1 ms, so the measured latency (reported) is what counts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::cluster::{drive, s, workload, Env};
use crate::netbench;
use crate::output::Reporter;
use crate::plot::{self, Scale, Series};
use crate::proto::Protocol;

/// Options of `fawn bench distance`.
#[derive(clap::Args, Debug, Clone)]
pub struct DistanceArgs {
    /// Added round-trip times between front-end and back-ends, ms.
    #[arg(long, value_delimiter = ',', default_value = "0,1,5")]
    pub delays_ms: Vec<f64>,
    /// Concurrency levels (memcached connections, one request in flight each).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
    pub connections: Vec<usize>,
    /// Get ratios to run (1 = gets, 0 = puts).
    #[arg(long, value_delimiter = ',', default_value = "1,0")]
    pub get_ratios: Vec<f64>,
    /// Keys preloaded.
    #[arg(long, default_value_t = 20_000)]
    pub keys: u64,
    /// Measured seconds per point.
    #[arg(long, default_value_t = 3.0)]
    pub duration: f64,
    /// Warm-up seconds per point.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Also write distance.svg here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// The `fawn` binary.
    #[arg(long)]
    pub fawn_bin: Option<PathBuf>,
    /// Scratch directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Can this kernel do `tc qdisc ... netem` inside a fresh network namespace? (None: yes;
/// Some(reason): no.) The probe namespace is removed again.
pub fn netem_unavailable() -> Option<String> {
    let ns = format!("fawnbench-probe-{}", std::process::id());
    let run = |args: &[&str]| -> Result<(), String> {
        let out = Command::new(args[0])
            .args(&args[1..])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{}: {e}", args[0]))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("`{}`: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
        }
    };
    if let Err(e) = run(&["ip", "netns", "add", &ns]) {
        return Some(format!("network namespaces unavailable: {e}"));
    }
    let r = run(&["ip", "netns", "exec", &ns, "ip", "link", "set", "lo", "up"]).and_then(|_| {
        run(&["ip", "netns", "exec", &ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"])
    });
    let _ = run(&["ip", "netns", "del", &ns]);
    r.err().map(|e| format!("namespaces and veth work, but netem does not: {e}"))
}

/// A TCP proxy on `listen` forwarding to `target`, holding every chunk `one_way` in each direction.
async fn proxy(listen: TcpListener, target: SocketAddr, one_way: Duration, bytes: Arc<AtomicU64>) {
    loop {
        let Ok((inbound, _)) = listen.accept().await else { continue };
        let bytes = bytes.clone();
        tokio::spawn(async move {
            let Ok(outbound) = TcpStream::connect(target).await else { return };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = outbound.into_split();
            tokio::spawn(pump(ri, wo, one_way, bytes.clone()));
            tokio::spawn(pump(ro, wi, one_way, bytes));
        });
    }
}

/// Copy `r` to `w`, each chunk delivered `delay` after it was read, in order.
async fn pump(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    bytes: Arc<AtomicU64>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, chunk)) = rx.recv().await {
            // tokio's timer fires on 1 ms ticks even for a deadline already due: skip it then.
            if at > Instant::now() {
                tokio::time::sleep_until(at).await;
            }
            if w.write_all(&chunk).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                bytes.fetch_add(n as u64, Ordering::Relaxed);
                if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// Run the experiment.
pub fn run(args: &DistanceArgs, quiet: bool, rep: &mut Reporter) -> Result<()> {
    let reason = netem_unavailable();
    let method = if reason.is_some() { "delay-proxy" } else { "delay-proxy (netem available but not used)" };
    let p = json!({"method": method, "netem": reason.clone().unwrap_or_else(|| "available".into())});
    rep.metric("distance", "host", "netem_available", if reason.is_none() { 1.0 } else { 0.0 }, "bool", &p)?;
    if let Some(r) = &reason {
        if !quiet {
            eprintln!("fawn bench distance: {r}; using a user-space delay proxy");
        }
    }
    let mut env = Env::new(args.fawn_bin.as_deref(), args.dir.as_deref(), 0, quiet)?;
    // The proxies get their own thread, away from the load generator's.
    let proxy_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("delay-proxy")
        .enable_all()
        .build()
        .context("starting the proxy runtime")?;
    let rt = crate::runtime(1)?;
    let mut series = Vec::new();
    for &d in &args.delays_ms {
        let mut spec = env.spec()?;
        let one_way = Duration::from_secs_f64(d / 2000.0);
        let bytes = Arc::new(AtomicU64::new(0));
        // Proxy i listens on base+50+i and forwards to back-end i's real port.
        let mut proxies = Vec::new();
        for node in 0..spec.backends {
            let listen_port = spec.base_port + 50 + node as u16;
            let l = proxy_rt
                .block_on(TcpListener::bind(("127.0.0.1", listen_port)))
                .with_context(|| format!("binding the delay proxy on {listen_port}"))?;
            proxies.push(proxy_rt.spawn(proxy(l, spec.backend_addr(node), one_way, bytes.clone())));
        }
        // No front-end cache: every get crosses the distance to a back-end.
        spec.cache_entries = Some(0);
        spec.backend_advertise = Some((0..spec.backends).map(|n| spec.base_port + 50 + n as u16).collect());
        env.say(&format!("distance: +{d} ms RTT between front-end and back-ends"));
        let cl = crate::launch::Cluster::start(spec)?;
        let pids = cl.pids();
        for &g in &args.get_ratios {
            let op = if g >= 1.0 {
                "get"
            } else if g <= 0.0 {
                "put"
            } else {
                "mixed"
            };
            let mut pts = Vec::new();
            for (i, &c) in args.connections.iter().enumerate() {
                let sc = format!("distance/rtt{d}ms/{op}/c{c}");
                let mut e = vec![
                    s("--keys"),
                    s(args.keys),
                    s("--duration"),
                    s(args.duration),
                    s("--warmup"),
                    s(args.warmup),
                    s("--get-ratio"),
                    s(g),
                    s("--connections"),
                    s(c),
                    s("--timeout"),
                    s(30),
                    s("--scenario"),
                    sc.clone(),
                ];
                if i > 0 || g < 1.0 {
                    e.push(s("--no-preload"));
                }
                let w = workload(&e)?;
                let st = rt.block_on(drive(
                    cl.spec.memcached_addr(0),
                    Protocol::Memcached,
                    &w,
                    &pids,
                    "fawn",
                    quiet,
                ))?;
                netbench::report(rep, &w, "fawn", &st)?;
                let mut p = w.params();
                p["added_rtt_ms"] = json!(d);
                p["method"] = json!(method);
                rep.metric(&sc, "fawn", "added_rtt_ms", d, "ms", &p)?;
                pts.push((c as f64, st.ops() as f64 / st.window.as_secs_f64()));
                // What the proxy really added (its timer rounds up): the one-connection median
                // latency minus the same without delay.
                let m = format!("{}_p50_us", if g > 0.0 { "get" } else { "set" });
                let base = rep.find(&format!("distance/rtt{}ms/{op}/c{c}", args.delays_ms[0]), "fawn", &m);
                if let (Some(b), Some(v)) = (base, rep.find(&sc, "fawn", &m)) {
                    rep.metric(&sc, "fawn", "effective_added_latency_ms", (v - b) / 1000.0, "ms", &p)?;
                }
            }
            series.push(Series::new(format!("{op}, +{d} ms RTT"), pts));
        }
        drop(cl);
        for h in proxies {
            h.abort();
        }
        rep.metric(
            &format!("distance/rtt{d}ms"),
            "proxy",
            "bytes_proxied",
            bytes.load(Ordering::Relaxed) as f64,
            "B",
            &p,
        )?;
    }
    if let Some(path) = &args.svg {
        let title = format!("Throughput vs concurrency, front-end to back-ends +0/1/5 ms ({method})");
        let svg = plot::line_chart(
            &title,
            "concurrent connections (log)",
            "ops/s",
            &series,
            Scale::Log10,
            Scale::Log10,
        );
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
