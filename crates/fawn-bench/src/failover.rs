//! `fawn bench failover`: what clients see while the control plane fails. A cluster with a
//! group of managers (3 by default) and two front-ends runs under a steady closed-loop load of
//! native clients and memcached-protocol clients (one group per front-end). Then:
//!
//! 1. each manager in turn (the leader first, then a follower, then the rest) is frozen
//!    with SIGSTOP for `--freeze-s`, then resumed; per freeze the run reports the longest gap
//!    any one client saw between two successful operations, and the operations that failed
//!    (goal: no gap over 1 s, 0 errors);
//! 2. the last front-end is killed with kill -9 for good; the run reports the gap and errors of
//!    the memcached clients of the surviving front-end, of the killed one's memcached clients
//!    (they reconnect to the survivor) and of the native clients.
//!
//! A gap is measured per client, from the start of the window (or its last success before)
//! to its next success, up to the end of the window: what one synchronous client waits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Result};
use fawn_client::{Client, ClientOptions};
use fawn_proto::native::{Request, Response};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use serde_json::json;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::cluster::Env;
use crate::launch::Cluster;
use crate::output::Reporter;
use crate::proto::{Protocol, Reply};

/// Options of `fawn bench failover`.
#[derive(clap::Args, Debug, Clone)]
pub struct FailoverArgs {
    /// The `fawn` binary (default: this one, or `fawn` next to it, or on the PATH; or $FAWN_BIN).
    #[arg(long)]
    pub fawn_bin: Option<PathBuf>,
    /// Where the cluster keeps its data (a fresh sub-directory, removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Manager port of the cluster (0: pick a free range between 10000 and 30000).
    #[arg(long, default_value_t = 0)]
    pub base_port: u16,
    /// Managers in the group (odd, at least 3: one frozen must leave a majority).
    #[arg(long, default_value_t = 3)]
    pub managers: u32,
    /// How long each manager is frozen (SIGSTOP), seconds.
    #[arg(long, default_value_t = 8.0)]
    pub freeze_s: f64,
    /// How long after each fault (the SIGCONT, the kill) still counts, seconds.
    #[arg(long, default_value_t = 3.0)]
    pub after_s: f64,
    /// Native clients, and memcached clients per front-end.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Distinct keys the clients use (half gets, half sets of 100-byte values).
    #[arg(long, default_value_t = 1000)]
    pub keys: u32,
    /// Pause of each client between operations, ms (keeps the 2-core machine from saturating,
    /// so that a gap is the fault's, not the scheduler's).
    #[arg(long, default_value_t = 2)]
    pub think_ms: u64,
    /// A client gives up on one operation after this long, ms (counted as an error).
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
}

/// Which clients a sample belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    Native,
    /// memcached-protocol clients first connected to front-end `i`.
    Memcached(u32),
}

/// One operation as a client saw it (times since the load started).
#[derive(Clone, Copy, Debug)]
struct Sample {
    call: Duration,
    ret: Duration,
    ok: bool,
}

/// One client's history.
struct History {
    group: Group,
    samples: Vec<Sample>,
}

/// A window's outcome over a set of clients.
#[derive(Debug, Default, PartialEq)]
struct Window {
    /// The longest one client waited for a success.
    longest_gap: Duration,
    /// Operations called in the window that failed.
    errors: usize,
    /// Operations that succeeded in the window.
    ok: usize,
}

/// The measure of `[from, to]` over `clients`.
fn window<'a>(clients: impl Iterator<Item = &'a History>, from: Duration, to: Duration) -> Window {
    let mut w = Window::default();
    for h in clients {
        let mut last = from;
        for s in &h.samples {
            if s.call >= from && s.call <= to && !s.ok {
                w.errors += 1;
            }
            if s.ok && s.ret >= from && s.ret <= to {
                w.ok += 1;
                w.longest_gap = w.longest_gap.max(s.ret - last);
                last = s.ret;
            }
        }
        w.longest_gap = w.longest_gap.max(to.saturating_sub(last));
    }
    w
}

/// Run `fawn bench failover`.
pub fn run(args: &FailoverArgs, quiet: bool, rep: &mut Reporter) -> Result<()> {
    ensure!(args.managers >= 3 && args.managers % 2 == 1, "--managers must be odd and at least 3");
    let mut env = Env::new(args.fawn_bin.as_deref(), args.dir.as_deref(), args.base_port, quiet)?;
    let cluster = env.start(|s| {
        s.managers = args.managers;
        s.frontends = 2;
    })?;
    let rt = crate::runtime(2)?;
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..args.clients {
        let bootstrap: Vec<String> =
            (0..cluster.spec.frontends).map(|f| cluster.spec.native_addr(f).to_string()).collect();
        let (a, halt) = (args.clone(), stop.clone());
        tasks.push(rt.spawn(async move { native_client(bootstrap, a, i as u64, origin, halt).await }));
        for f in 0..cluster.spec.frontends {
            let mut addrs: Vec<SocketAddr> =
                (0..cluster.spec.frontends).map(|g| cluster.spec.memcached_addr(g)).collect();
            addrs.rotate_left(f as usize);
            let (a, halt, seed) = (args.clone(), stop.clone(), 1000 * (u64::from(f) + 1) + i as u64);
            tasks.push(rt.spawn(async move { memcached_client(addrs, f, a, seed, origin, halt).await }));
        }
    }
    let say = |m: &str| {
        if !quiet {
            eprintln!("fawn bench failover: {m}");
        }
    };
    std::thread::sleep(Duration::from_secs(2));
    let freeze = Duration::from_secs_f64(args.freeze_s);
    let after = Duration::from_secs_f64(args.after_s);
    let mut freezes = Vec::new();
    // The leader first, then a follower, then the managers not frozen yet, whatever their
    // role then (leadership moves when a frozen manager resumes).
    let mut left: Vec<u32> = (1..=cluster.spec.managers).collect();
    let wants = [Some(true), Some(false)].into_iter().chain(std::iter::repeat(None));
    for want_leader in wants.take(left.len()) {
        let leader = current_leader(&rt, &cluster)?;
        let pick = left.iter().position(|id| want_leader.is_none_or(|w| (*id == leader) == w)).unwrap_or(0);
        let id = left.remove(pick);
        let role = if id == leader { "leader" } else { "follower" };
        let name = cluster.spec.manager_name(id);
        say(&format!("freezing {name} ({role}) for {freeze:?}"));
        let from = origin.elapsed();
        cluster.signal(&name, libc::SIGSTOP)?;
        std::thread::sleep(freeze);
        cluster.signal(&name, libc::SIGCONT)?;
        std::thread::sleep(after);
        freezes.push((id, role, from, origin.elapsed()));
    }
    let victim = cluster.spec.frontends - 1;
    say(&format!("killing frontend-{victim} for good"));
    let killed_at = origin.elapsed();
    cluster.signal(&format!("frontend-{victim}"), libc::SIGKILL)?;
    std::thread::sleep(Duration::from_secs(5) + after);
    let killed_window = (killed_at, origin.elapsed());
    stop.store(true, Ordering::Relaxed);
    let histories: Vec<History> = tasks
        .into_iter()
        .map(|t| rt.block_on(t).map_err(|e| anyhow!("a client task: {e}")))
        .collect::<Result<_>>()?;

    let base = json!({
        "managers": args.managers, "frontends": cluster.spec.frontends, "backends": cluster.spec.backends,
        "clients_native": args.clients, "clients_memcached_per_frontend": args.clients,
        "keys": args.keys, "think_ms": args.think_ms, "timeout_ms": args.timeout_ms,
        "freeze_s": args.freeze_s, "after_s": args.after_s,
    });
    for (id, role, from, to) in freezes {
        let w = window(histories.iter(), from, to);
        let mut p = base.clone();
        p["manager"] = json!(id);
        p["role"] = json!(role);
        p["ops"] = json!(w.ok);
        rep.metric("failover", "fawn", "manager_freeze_longest_gap_ms", ms(w.longest_gap), "ms", &p)?;
        rep.metric("failover", "fawn", "manager_freeze_errors", w.errors as f64, "ops", &p)?;
        say(&format!(
            "manager {id} ({role}) frozen: longest gap {:.0} ms, {} errors",
            ms(w.longest_gap),
            w.errors
        ));
    }
    for name in ["survivor_memcached", "reconnecting_memcached", "native"] {
        let member = |g: Group| match name {
            "survivor_memcached" => matches!(g, Group::Memcached(f) if f != victim),
            "reconnecting_memcached" => g == Group::Memcached(victim),
            _ => g == Group::Native,
        };
        let w = window(histories.iter().filter(|h| member(h.group)), killed_window.0, killed_window.1);
        let mut p = base.clone();
        p["clients"] = json!(name);
        p["ops"] = json!(w.ok);
        rep.metric("failover", "fawn", "frontend_kill_longest_gap_ms", ms(w.longest_gap), "ms", &p)?;
        rep.metric("failover", "fawn", "frontend_kill_errors", w.errors as f64, "ops", &p)?;
        say(&format!(
            "front-end killed, {name} clients: longest gap {:.0} ms, {} errors",
            ms(w.longest_gap),
            w.errors
        ));
    }
    drop(cluster);
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `raft_state` of a leader (`manager::RAFT_STATES`).
const LEADER: u64 = 3;

/// Manager `id`'s `raft_state`, if it answers.
async fn raft_state(cluster: &Cluster, id: u32) -> Option<u64> {
    let addr = cluster.spec.manager_addrs().get(id as usize - 1)?.to_string();
    let pool = fawn_client::pool::Pool::new(Duration::from_millis(500));
    match pool.call(&addr, Request::Status, Duration::from_millis(500)).await {
        Ok(Response::Status(s)) => s.counters.iter().find(|(n, _)| n == "raft_state").map(|(_, v)| *v),
        _ => None,
    }
}

/// The id of the manager that leads the group, waiting up to 10 s for one.
fn current_leader(rt: &tokio::runtime::Runtime, cluster: &Cluster) -> Result<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for id in 1..=cluster.spec.managers {
            if rt.block_on(raft_state(cluster, id)) == Some(LEADER) {
                return Ok(id);
            }
        }
        ensure!(Instant::now() < deadline, "no manager leads the group");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The operation a client does next: a get or a set of a random key.
fn next_op(rng: &mut SmallRng, keys: u32) -> (bool, Vec<u8>) {
    (rng.gen_bool(0.5), format!("failover-{:06}", rng.gen_range(0..keys.max(1))).into_bytes())
}

const VALUE: [u8; 100] = [b'v'; 100];

/// A ring-aware native client doing one operation at a time until `stop`.
async fn native_client(
    bootstrap: Vec<String>,
    args: FailoverArgs,
    seed: u64,
    origin: Instant,
    stop: Arc<AtomicBool>,
) -> History {
    let mut h = History { group: Group::Native, samples: Vec::new() };
    let timeout = Duration::from_millis(args.timeout_ms);
    let options = ClientOptions { request_timeout: timeout, ..ClientOptions::default() };
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut client: Option<Arc<Client>> = None;
    while !stop.load(Ordering::Relaxed) {
        let call = origin.elapsed();
        let ok = match &client {
            Some(c) => {
                let (get, key) = next_op(&mut rng, args.keys);
                let op = async {
                    if get {
                        c.get(&key).await.is_ok()
                    } else {
                        c.put(&key, &VALUE).await.is_ok()
                    }
                };
                tokio::time::timeout(timeout, op).await.unwrap_or(false)
            }
            None => {
                client = tokio::time::timeout(timeout, Client::connect(&bootstrap, options.clone()))
                    .await
                    .ok()
                    .and_then(Result::ok);
                client.is_some()
            }
        };
        h.samples.push(Sample { call, ret: origin.elapsed(), ok });
        tokio::time::sleep(Duration::from_millis(args.think_ms)).await;
    }
    h
}

/// A memcached-protocol client of front-end `home` (`addrs[0]`) doing one operation at a time
/// until `stop`; after a failure it reconnects, trying the front-ends in order.
async fn memcached_client(
    addrs: Vec<SocketAddr>,
    home: u32,
    args: FailoverArgs,
    seed: u64,
    origin: Instant,
    stop: Arc<AtomicBool>,
) -> History {
    let mut h = History { group: Group::Memcached(home), samples: Vec::new() };
    let timeout = Duration::from_millis(args.timeout_ms);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut conn: Option<BufReader<TcpStream>> = None;
    let (mut buf, mut scratch) = (Vec::new(), Vec::new());
    let mut next_addr = 0;
    while !stop.load(Ordering::Relaxed) {
        let call = origin.elapsed();
        let ok = match conn.as_mut() {
            Some(c) => {
                let (get, key) = next_op(&mut rng, args.keys);
                buf.clear();
                if get {
                    Protocol::Memcached.encode_get(&mut buf, &key);
                } else {
                    Protocol::Memcached.encode_set(&mut buf, &key, &VALUE);
                }
                let op = async {
                    c.get_mut().write_all(&buf).await?;
                    if get {
                        Protocol::Memcached.read_get(c, &mut scratch).await
                    } else {
                        Protocol::Memcached.read_set(c, &mut scratch).await
                    }
                };
                let reply = tokio::time::timeout(timeout, op).await;
                let ok = matches!(reply, Ok(Ok(Reply::Hit | Reply::Miss | Reply::Stored)));
                if !matches!(reply, Ok(Ok(_))) {
                    // A lost or late reply leaves the connection out of step: start afresh.
                    conn = None;
                }
                ok
            }
            None => {
                let addr = addrs[next_addr % addrs.len()];
                match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
                    Ok(Ok(s)) => {
                        let _ = s.set_nodelay(true);
                        conn = Some(BufReader::new(s));
                        true
                    }
                    _ => {
                        next_addr += 1;
                        false
                    }
                }
            }
        };
        h.samples.push(Sample { call, ret: origin.elapsed(), ok });
        tokio::time::sleep(Duration::from_millis(args.think_ms)).await;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(call_ms: u64, ret_ms: u64, ok: bool) -> Sample {
        Sample { call: Duration::from_millis(call_ms), ret: Duration::from_millis(ret_ms), ok }
    }

    #[test]
    fn the_gap_is_one_clients_longest_wait_and_errors_count_calls_in_the_window() {
        let a = History {
            group: Group::Native,
            samples: vec![s(0, 5, true), s(5, 300, true), s(300, 900, false)],
        };
        let b = History {
            group: Group::Memcached(0),
            samples: vec![s(0, 10, true), s(100, 150, true), s(150, 200, true), s(200, 1000, true)],
        };
        let ms = Duration::from_millis;
        // a: 100 -> 300 (200 ms), then nothing until 1000 (700 ms); b: 200 -> 1000 (800 ms).
        let w = window([&a, &b].into_iter(), ms(100), ms(1000));
        assert_eq!(w, Window { longest_gap: ms(800), errors: 1, ok: 4 });
        // Each client alone: the other's successes do not shorten its wait.
        assert_eq!(window([&a].into_iter(), ms(100), ms(1000)).longest_gap, ms(700));
        // A failure called before the window is not counted in it.
        assert_eq!(window([&a].into_iter(), ms(400), ms(1000)).errors, 0);
    }
}
