//! Peer servers the benchmark starts itself on loopback: Debian's memcached and redis-server
//! (alone, or as a primary with replicas).

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How long a freshly started server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A server process we started; killed when dropped.
pub struct Server {
    pub name: &'static str,
    pub addr: SocketAddr,
    child: Child,
}

impl Server {
    /// The server's process id (for CPU accounting).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only our own child, by its handle.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An ephemeral loopback port that was free a moment ago (the server binds it next).
fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(l.local_addr().context("reading the bound port")?.port())
}

fn spawn(name: &'static str, package: &str, bin: &str, args: &[String]) -> Result<Child> {
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                anyhow::anyhow!(
                    "`{bin}` not found: {name} is needed for this benchmark; install the Debian \
                     package `{package}` (apt-get install -y {package})"
                )
            } else {
                anyhow::Error::new(e).context(format!("starting {bin}"))
            }
        })
}

/// Wait until `addr` accepts a connection; fail early (with its stderr) if the process exits.
fn wait_ready(name: &str, addr: SocketAddr, child: &mut Child) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().context("polling server process")? {
            let mut err = String::new();
            if let Some(mut s) = child.stderr.take() {
                let _ = s.read_to_string(&mut err);
            }
            bail!("{name} exited at start-up ({status}): {}", err.trim());
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{name} did not accept connections on {addr} within {READY_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(name: &'static str, package: &str, bin: &str, args: Vec<String>, port: u16) -> Result<Server> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut child = spawn(name, package, bin, &args)?;
    if let Err(e) = wait_ready(name, addr, &mut child) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    Ok(Server { name, addr, child })
}

/// memcached with `threads` worker threads and `mem_mb` of item memory, TCP only, loopback only.
pub fn start_memcached(bin: &str, threads: u32, mem_mb: u64) -> Result<Server> {
    let port = free_port()?;
    let mut args: Vec<String> =
        ["-t", &threads.to_string(), "-p", &port.to_string()].iter().map(|s| s.to_string()).collect();
    args.extend(["-l", "127.0.0.1", "-U", "0", "-m", &mem_mb.to_string(), "-c", "4096"].map(String::from));
    // memcached refuses to run as root unless told which user to be.
    if is_root() {
        args.extend(["-u".to_string(), "root".to_string()]);
    }
    start("memcached", "memcached", bin, args, port)
}

/// redis-server on loopback without persistence (memcached has none either: compare like with like).
pub fn start_redis(bin: &str) -> Result<Server> {
    let port = free_port()?;
    let args = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "no",
        "--loglevel",
        "warning",
    ]
    .map(String::from)
    .to_vec();
    start("redis", "redis-server", bin, args, port)
}

/// A Redis primary with `replicas` replicas on loopback, each persisting with an append-only
/// file synced every second: the closest thing a user would pick for a replicated, persistent
/// cache. The primary acknowledges a write before its replicas have it (asynchronous
/// replication), so it is a generous peer for a chain that acknowledges only after all replicas.
pub struct ReplicatedRedis {
    pub primary: Server,
    replicas: Vec<Server>,
    _dir: tempfile::TempDir,
}

impl ReplicatedRedis {
    /// Every process of the group (for CPU accounting).
    pub fn pids(&self) -> Vec<u32> {
        std::iter::once(&self.primary).chain(&self.replicas).map(Server::pid).collect()
    }
}

/// How long replicas may take to finish their first sync with the primary.
const REPLICA_SYNC_TIMEOUT: Duration = Duration::from_secs(30);

pub fn start_redis_replicated(bin: &str, replicas: usize) -> Result<ReplicatedRedis> {
    let dir = tempfile::Builder::new()
        .prefix("fawn-bench-redis-")
        .tempdir()
        .context("creating Redis's directory")?;
    let persistent_args = |port: u16, name: &str| -> Result<Vec<String>> {
        let data = dir.path().join(name);
        std::fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
        Ok([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &data.display().to_string(),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--protected-mode",
            "no",
            "--loglevel",
            "warning",
        ]
        .map(String::from)
        .to_vec())
    };
    let port = free_port()?;
    let primary = start("redis", "redis-server", bin, persistent_args(port, "primary")?, port)?;
    let mut group = Vec::with_capacity(replicas);
    for i in 0..replicas {
        let replica_port = free_port()?;
        let mut args = persistent_args(replica_port, &format!("replica-{i}"))?;
        args.extend(["--replicaof".to_string(), "127.0.0.1".to_string(), port.to_string()]);
        group.push(start("redis", "redis-server", bin, args, replica_port)?);
    }
    let deadline = Instant::now() + REPLICA_SYNC_TIMEOUT;
    for replica in &group {
        while !redis_info(replica.addr, "replication")?.contains("master_link_status:up") {
            if Instant::now() > deadline {
                bail!(
                    "Redis replica {} did not sync with its primary within {REPLICA_SYNC_TIMEOUT:?}",
                    replica.addr
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(ReplicatedRedis { primary, replicas: group, _dir: dir })
}

/// The text of Redis's `INFO <section>`.
fn redis_info(addr: SocketAddr, section: &str) -> Result<String> {
    use std::io::Write;
    let mut stream =
        TcpStream::connect_timeout(&addr, READY_TIMEOUT).with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(READY_TIMEOUT)).context("setting a read timeout")?;
    stream.write_all(format!("INFO {section}\r\n").as_bytes()).context("sending INFO")?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).context("reading INFO")?;
        if n == 0 {
            bail!("{addr} closed the connection during INFO");
        }
        reply.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&reply);
        let Some((header, body)) = text.split_once("\r\n") else { continue };
        let length: usize =
            header.trim_start_matches('$').parse().with_context(|| format!("bad INFO reply {header:?}"))?;
        if body.len() >= length {
            return Ok(body[..length].to_owned());
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// User + system CPU seconds used so far by process `pid` and all its descendants (a FAWN
/// cluster from `fawn up` is one process per role), from /proc (Linux).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let mut total = own_cpu_seconds(pid)?;
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for child in children(parent) {
            total += own_cpu_seconds(child).unwrap_or(0.0);
            frontier.push(child);
        }
    }
    Some(total)
}

/// [`cpu_seconds`] summed over several processes; None if `pids` is empty or one is unreadable.
pub fn cpu_seconds_all(pids: &[u32]) -> Option<f64> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().map(|&p| cpu_seconds(p)).sum()
}

/// Direct children of `pid`, from /proc/<pid>/task/*/children.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| s.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// User + system CPU seconds of one process (all its threads), from /proc/<pid>/stat.
fn own_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields after the last ')' are safe to split.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (tck > 0).then(|| (utime + stime) / tck as f64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn own_cpu_is_readable() {
        assert!(super::cpu_seconds(std::process::id()).is_some());
    }

    #[test]
    fn missing_binary_names_the_package() {
        let err = super::start_memcached("/nonexistent/memcached", 1, 64)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("apt-get install -y memcached"), "{err}");
    }
}
