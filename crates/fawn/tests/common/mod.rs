//! Shared helpers for multi-process cluster tests: a `fawn up` cluster on loopback with
//! free ports and a temporary data directory, stopped (SIGTERM, then SIGKILL) on drop. Its
//! native connections are mutual TLS, with the test binary's CA ([`tls`]), as `fawn up`'s
//! are by default; this process talks to it as admin 0.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fawn_client::{Client, ClientOptions};
use fawn_proto::native::ClusterConfig;

/// A running `fawn up`.
pub struct Cluster {
    child: Option<Child>,
    pub dir: PathBuf,
    pub base_port: u16,
    pub memcached_port: u16,
    pub frontends: u32,
    args: Vec<String>,
    _tmp: Option<tempfile::TempDir>,
}

/// Shape of a test cluster.
#[derive(Clone, Debug)]
pub struct Shape {
    pub backends: u32,
    pub frontends: u32,
    pub replicas: u32,
    pub vnodes: u32,
}

impl Default for Shape {
    fn default() -> Self {
        Shape { backends: 3, frontends: 1, replicas: 3, vnodes: 2 }
    }
}

fn port_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A base port with the manager, back-end, front-end and memcached ports all free.
fn free_base(shape: &Shape) -> u16 {
    let seed = std::process::id() as u64 ^ Instant::now().elapsed().as_nanos() as u64;
    for attempt in 0..200u64 {
        // Below Linux's ephemeral range (32768+), so no outgoing connection takes a role's port.
        let base = 10_000 + ((seed.wrapping_mul(7919) + attempt * 331) % 20_000) as u16;
        let mut ports = vec![base, base + 200, base + 251, base + 252];
        ports.extend((0..shape.backends as u16).map(|i| base + 1 + i));
        ports.extend((0..shape.frontends as u16).map(|i| base + 100 + i));
        ports.extend((0..shape.frontends as u16).map(|i| base + 200 + i));
        if ports.iter().all(|p| port_free(*p)) {
            return base;
        }
    }
    panic!("no free port range found");
}

impl Cluster {
    /// Starts a cluster in a fresh temporary directory.
    pub fn start(shape: Shape) -> Cluster {
        Cluster::start_with(shape, &[])
    }

    /// [`Cluster::start`] with more `fawn up` flags.
    pub fn start_with(shape: Shape, extra_args: &[String]) -> Cluster {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        let mut c = Cluster::start_in_with(&dir, shape, None, extra_args);
        if std::env::var_os("FAWN_KEEP").is_some() {
            eprintln!("FAWN_KEEP: the cluster's directory stays: {}", tmp.keep().display());
        } else {
            c._tmp = Some(tmp);
        }
        c
    }

    /// Starts (or restarts) a cluster on `dir`, reusing `base_port` if given.
    pub fn start_in(dir: &Path, shape: Shape, base_port: Option<u16>) -> Cluster {
        Cluster::start_in_with(dir, shape, base_port, &[])
    }

    fn start_in_with(dir: &Path, shape: Shape, base_port: Option<u16>, extra_args: &[String]) -> Cluster {
        let base = base_port.unwrap_or_else(|| free_base(&shape));
        let memcached_port = base + 200;
        let mut args = vec![
            "up".to_string(),
            "--data-dir".into(),
            dir.display().to_string(),
            "--base-port".into(),
            base.to_string(),
            "--memcached".into(),
            format!("127.0.0.1:{memcached_port}"),
            "--backends".into(),
            shape.backends.to_string(),
            "--frontends".into(),
            shape.frontends.to_string(),
            "--replicas".into(),
            shape.replicas.to_string(),
            "--vnodes".into(),
            shape.vnodes.to_string(),
        ];
        args.extend_from_slice(extra_args);
        let mut cluster = Cluster {
            child: None,
            dir: dir.to_path_buf(),
            base_port: base,
            memcached_port,
            frontends: shape.frontends,
            args,
            _tmp: None,
        };
        cluster.spawn();
        cluster
    }

    fn spawn(&mut self) {
        std::fs::create_dir_all(&self.dir).expect("data dir");
        if !self.args.iter().any(|a| a == "--plaintext") {
            // `fawn up` issues the roles' certificates with the CA it finds there.
            tls::provision(&self.dir.join("tls"), &[]);
        }
        let log = std::fs::File::create(self.dir.join("up.log")).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_fawn"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn fawn up");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let log = std::fs::read_to_string(self.dir.join("up.log")).unwrap_or_default();
            if log.contains("cluster ready") {
                return;
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("fawn up exited with {status} during start-up:\n{log}\n{}", self.role_logs());
            }
            assert!(Instant::now() < deadline, "cluster not ready in time:\n{log}\n{}", self.role_logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every role's log, for failure messages.
    pub fn role_logs(&self) -> String {
        let mut out = String::new();
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    let text = std::fs::read_to_string(&p).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(30).collect();
                    out += &format!("--- {} (last lines)\n", p.display());
                    for l in tail.into_iter().rev() {
                        out += l;
                        out.push('\n');
                    }
                }
            }
        }
        out
    }

    /// Graceful stop (SIGTERM to `fawn up`, which stops its roles), waiting for exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops and starts again on the same directory and ports.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// The flags a role started by hand beside this cluster needs: `--tls-dir` with a
    /// certificate for `role` `id` issued there.
    pub fn transport_args(&self, role: fawn_tls::Role, id: u32) -> Vec<String> {
        let dir = self.dir.join("tls");
        tls::provision(&dir, &[(role, id)]);
        vec!["--tls-dir".into(), dir.display().to_string()]
    }

    /// The managers `fawn up` started (3, comma-separated).
    pub fn manager_addr(&self) -> String {
        let b = self.base_port;
        format!("127.0.0.1:{b},127.0.0.1:{},127.0.0.1:{}", b + 251, b + 252)
    }

    pub fn frontend_native(&self, i: u32) -> String {
        format!("127.0.0.1:{}", self.base_port + 100 + i as u16)
    }

    pub fn frontend_memcached(&self, i: u32) -> String {
        format!("127.0.0.1:{}", self.memcached_port + i as u16)
    }

    /// A ring-aware Rust client.
    pub async fn client(&self) -> std::sync::Arc<Client> {
        Client::connect(&[self.frontend_native(0)], ClientOptions::default()).await.expect("client connects")
    }

    /// The configuration as the manager has it.
    pub async fn config(&self) -> ClusterConfig {
        let request = fawn_proto::native::Request::GetConfig;
        let pool = fawn_client::pool::Pool::new(Duration::from_secs(2));
        match fawn_kv::manager::client::call(&pool, &self.manager_addr(), request, Duration::from_secs(2))
            .await
        {
            Ok(fawn_proto::native::Response::Config(c)) => c,
            other => panic!("config: {other:?}"),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A tiny blocking memcached text-protocol client for tests.
pub struct Memcached {
    stream: std::io::BufReader<std::net::TcpStream>,
}

impl Memcached {
    pub fn connect(addr: &str) -> Memcached {
        let s = std::net::TcpStream::connect(addr).expect("connect memcached");
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        Memcached { stream: std::io::BufReader::new(s) }
    }

    /// How long a reply may take before the client panics (10 s by default).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.stream.get_ref().set_read_timeout(Some(timeout)).expect("timeout");
    }

    fn line(&mut self) -> String {
        use std::io::BufRead;
        let mut l = String::new();
        self.stream.read_line(&mut l).expect("read line");
        l
    }

    fn send(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.stream.get_mut().write_all(bytes).expect("write");
    }

    /// `set`; returns the reply line.
    pub fn set(&mut self, key: &str, value: &[u8]) -> String {
        let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
        self.send(&req);
        self.line()
    }

    /// One `stats` value (e.g. `curr_connections`).
    pub fn stat(&mut self, name: &str) -> Option<u64> {
        self.send(b"stats\r\n");
        let mut found = None;
        loop {
            let line = self.line();
            if line == "END\r\n" || line.is_empty() {
                return found;
            }
            if line.starts_with("SERVER_ERROR") || line.starts_with("ERROR") {
                return None;
            }
            let mut words = line.split_whitespace();
            if words.nth(1) == Some(name) {
                found = words.next().and_then(|v| v.parse().ok());
            }
        }
    }

    /// `get`; returns the value if any.
    pub fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        use std::io::Read;
        self.send(format!("get {key}\r\n").as_bytes());
        let first = self.line();
        if first == "END\r\n" {
            return None;
        }
        let len: usize = first.trim_end().rsplit(' ').next().and_then(|n| n.parse().ok()).expect(&first);
        let mut buf = vec![0; len + 2];
        self.stream.read_exact(&mut buf).expect("value");
        buf.truncate(len);
        assert_eq!(self.line(), "END\r\n");
        Some(buf)
    }
}
pub mod bounds;
pub mod history;
pub mod memc;
pub mod netns;
pub mod probe;
pub mod procs;
pub mod tls;
pub mod tmpfs;

/// A range's committed contents on one back-end, key -> latest record (paged `RangeDigest`).
pub async fn range_digest(
    pool: &fawn_client::pool::Pool,
    addr: &str,
    range: fawn_ring::Range,
) -> std::collections::BTreeMap<Vec<u8>, fawn_proto::native::DigestEntry> {
    use fawn_proto::native::{Request, Response};
    let mut out = std::collections::BTreeMap::new();
    let mut after = None;
    loop {
        let req = Request::RangeDigest { range, after_key: after.clone(), limit: 10_000 };
        let page = match pool.call(addr, req, Duration::from_secs(10)).await.expect("digest") {
            Response::Digest(page) => page,
            other => panic!("{other:?}"),
        };
        let Some(last) = page.last() else { return out };
        after = Some(last.key.clone());
        for e in page {
            out.insert(e.key.clone(), e);
        }
    }
}

/// Key -> (sequence number, value checksum) of a range's live items on one back-end: a
/// re-synced replica has no history of keys deleted before its snapshot, so compare these.
pub async fn live_digest(
    pool: &fawn_client::pool::Pool,
    addr: &str,
    range: fawn_ring::Range,
) -> std::collections::BTreeMap<Vec<u8>, (u64, u32)> {
    range_digest(pool, addr, range)
        .await
        .into_iter()
        .filter_map(|(k, e)| Some((k, (e.seq, e.value_crc?))))
        .collect()
}

/// Checks that every replica in each range's chain holds the same live items (panics naming
/// the node and range otherwise) and returns each range's digest.
pub async fn agreed_digests(
    config: &fawn_proto::native::ClusterConfig,
) -> std::collections::HashMap<fawn_ring::Range, std::collections::BTreeMap<Vec<u8>, (u64, u32)>> {
    let pool = fawn_client::pool::Pool::new(Duration::from_secs(2));
    let mut out = std::collections::HashMap::new();
    for rc in &config.ranges {
        let mut first = None;
        for node in &rc.chain {
            let addr = config.backend_addr(*node).expect("addr");
            let d = live_digest(&pool, addr, rc.range).await;
            match &first {
                None => first = Some(d),
                Some(f) => {
                    assert_eq!(&d, f, "replica on node {node} differs for range {}", rc.range.id_string())
                }
            }
        }
        out.insert(rc.range, first.unwrap_or_default());
    }
    out
}

/// Every key of `want` reads back with its value through `client`, every chain's replicas
/// agree ([`agreed_digests`]), and each range holds exactly `want`'s keys in it (not
/// counting the harness's `__` keys).
pub async fn assert_every_write_held(
    client: &Client,
    want: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
    config: &ClusterConfig,
) {
    for (k, v) in want {
        let got = client.get(k).await.expect("get").map(|it| it.value);
        assert_eq!(got.as_ref(), Some(v), "{}", String::from_utf8_lossy(k));
    }
    for (range, digest) in agreed_digests(config).await {
        let keys = want.keys().filter(|k| range.contains(fawn_ring::key_id(k))).count();
        let held = digest.keys().filter(|k| !k.starts_with(b"__")).count();
        assert_eq!(held, keys, "range {} holds every key", range.id_string());
    }
}

/// Puts `k-0` .. `k-{keys-1}` with 200-byte values (`padded_value("v", i, 200)`); what was
/// written.
pub async fn put_padded_keys(client: &Client, keys: u32) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
    let mut want = std::collections::BTreeMap::new();
    for i in 0..keys {
        let (k, v) = (format!("k-{i}").into_bytes(), padded_value("v", i, 200));
        client.put(&k, &v).await.expect("put");
        want.insert(k, v);
    }
    want
}

/// A value of `len` bytes that names its key: `<tag>-<i>-` padded with dots.
pub fn padded_value(tag: &str, i: u32, len: usize) -> Vec<u8> {
    let mut v = format!("{tag}-{i}-").into_bytes();
    v.resize(len, b'.');
    v
}

/// Checks a timing goal of a fault scenario (for example "no back-end's lease lapsed while the
/// manager group elected a leader"). Timing depends on the machine: on one so overloaded that
/// runnable threads wait seconds for a core (1-minute load average above twice the cores),
/// a miss is printed, not failed; correctness checks never get this allowance.
pub fn timing_goal(met: bool, goal: &str) {
    if met {
        return;
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|l| l.parse::<f64>().ok()));
    match load {
        Some(load) if load > 2.0 * cores => {
            eprintln!("TIMING GOAL MISSED on an overloaded machine (load {load} on {cores} cores), not failing: {goal}")
        }
        _ => panic!("timing goal missed: {goal}"),
    }
}
