//! Peer servers the benchmark starts itself on loopback: Debian's memcached and redis-server.

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
