//! A FAWN cluster the benchmark starts itself, one process per role (like `fawn up`, but with
//! the knobs the experiments need: front-end cache size, back-end advertise addresses, adding a
//! back-end later, freezing one with SIGSTOP). Every process is our child and is signalled only
//! through its own handle; everything is stopped when the [`Cluster`] is dropped.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use fawn_client::{Client, ClientOptions};
use fawn_kv::launch::{BackendCommand, FrontendCommand, ManagerCommand, MemcachedTlsFiles, RingShape};
use fawn_proto::native::{ClusterConfig, NodeState};

/// How long a cluster may take to form and accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Grace between SIGTERM and SIGKILL when stopping.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// The `fawn` binary.
    pub bin: PathBuf,
    /// Data directory (one sub-directory per role; logs beside them).
    pub dir: PathBuf,
    /// Manager port; back-end i listens on base+1+i, front-end i (native) on base+100+i,
    /// memcached of front-end i on base+200+i; managers 2.. of a group on base+20+id.
    pub base_port: u16,
    /// Managers in the manager group (1: a group of one).
    pub managers: u32,
    pub backends: u32,
    pub frontends: u32,
    pub replicas: u32,
    pub vnodes: u32,
    pub sync: String,
    /// Front-end query cache entries (None: the front-end's default).
    pub cache_entries: Option<u64>,
    /// Port each back-end advertises instead of its listen port (a delay proxy in front of it).
    pub backend_advertise: Option<Vec<u16>>,
    /// Mutual TLS between the roles (and from this process): a CA and certificates in
    /// `<dir>/tls`. Off: `--plaintext`.
    pub tls: bool,
    /// TLS on the front-ends' memcached ports, with a certificate of a CA in `<dir>/mctls`
    /// (its certificate: [`ClusterSpec::memcached_ca`]).
    pub memcached_tls: bool,
}

impl ClusterSpec {
    /// A spec with the `fawn up` defaults (3 back-ends, R = 3, V = 2, 1 front-end).
    pub fn new(bin: PathBuf, dir: PathBuf, base_port: u16) -> ClusterSpec {
        ClusterSpec {
            bin,
            dir,
            base_port,
            managers: 1,
            backends: 3,
            frontends: 1,
            replicas: 3,
            vnodes: 2,
            sync: "interval:100".into(),
            cache_entries: None,
            backend_advertise: None,
            tls: false,
            memcached_tls: false,
        }
    }

    /// The CA certificate memcached clients trust when `memcached_tls` is on.
    pub fn memcached_ca(&self) -> Option<PathBuf> {
        self.memcached_tls.then(|| self.dir.join("mctls").join("ca.crt"))
    }

    /// Under `memcached_tls`: a CA and a certificate for the loopback names, as the front-ends'
    /// `--memcached-tls-cert` and `--memcached-tls-key`.
    fn memcached_tls_files(&self) -> Result<Option<MemcachedTlsFiles>> {
        let Some(ca_path) = self.memcached_ca() else { return Ok(None) };
        let dir = self.dir.join("mctls");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca = fawn_tls::ClusterCa::create("bench-memcached")?;
        let server = ca.issue_memcached(&fawn_tls::clients::memcached_names("127.0.0.1"))?;
        let (cert, key) = (dir.join("memcached.crt"), dir.join("memcached.key"));
        std::fs::write(&ca_path, ca.cert_pem())?;
        std::fs::write(&cert, &server.cert_pem)?;
        std::fs::write(&key, &server.key_pem)?;
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        Ok(Some(MemcachedTlsFiles { cert, key }))
    }

    /// The roles' `--tls-dir`, when TLS is on.
    pub fn tls_dir(&self) -> Option<PathBuf> {
        self.tls.then(|| self.dir.join("tls"))
    }

    pub fn manager_addr(&self) -> SocketAddr {
        loopback(self.base_port)
    }

    /// Every manager's address; manager `id` (1-based) is element `id - 1`.
    pub fn manager_addrs(&self) -> Vec<SocketAddr> {
        (1..=self.managers.max(1))
            .map(|id| if id == 1 { self.manager_addr() } else { loopback(self.base_port + 20 + id as u16) })
            .collect()
    }

    /// The managers' addresses as every role is given them (comma-separated).
    pub fn managers_list(&self) -> String {
        self.manager_addrs().iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(",")
    }

    /// The role name (log file, data directory) of manager `id`.
    pub fn manager_name(&self, id: u32) -> String {
        if self.managers <= 1 {
            "manager".to_string()
        } else {
            format!("manager-{id}")
        }
    }

    pub fn backend_addr(&self, node: u32) -> SocketAddr {
        loopback(self.base_port + 1 + node as u16)
    }

    pub fn native_addr(&self, i: u32) -> SocketAddr {
        loopback(self.base_port + 100 + i as u16)
    }

    pub fn memcached_addr(&self, i: u32) -> SocketAddr {
        loopback(self.base_port + 200 + i as u16)
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// One running role.
struct Role {
    name: String,
    child: Child,
}

/// A running cluster.
pub struct Cluster {
    pub spec: ClusterSpec,
    roles: Vec<Role>,
}

/// The `fawn` binary to run: `explicit`, else this executable when it is `fawn`, else `fawn`
/// next to this executable (or one directory up: `target/release/examples/bench`, test
/// binaries in `target/debug/deps`), else `fawn` on the PATH.
pub fn find_fawn_bin(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Ok(env) = std::env::var("FAWN_BIN") {
        return Ok(PathBuf::from(env));
    }
    let exe = std::env::current_exe().context("locating the current executable")?;
    if exe.file_name().is_some_and(|n| n == "fawn") {
        return Ok(exe);
    }
    let mut dir = exe.parent();
    for _ in 0..2 {
        let Some(d) = dir else { break };
        let candidate = d.join("fawn");
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = d.parent();
    }
    Ok(PathBuf::from("fawn"))
}

/// A base port such that base..base+400 looks free now (checks the ports the cluster uses).
/// Below Linux's ephemeral range (32768+): an outgoing connection of the cluster itself could
/// otherwise take a port a role has yet to bind.
pub fn free_base_port(seed: u64) -> Result<u16> {
    for attempt in 0..200u64 {
        let base = 10_000 + ((seed.wrapping_mul(7919).wrapping_add(attempt * 1009)) % 20_000) as u16;
        let base = base - base % 10;
        let ports = (0..16).chain(21..26).chain(50..58).chain(100..104).chain(200..204);
        if ports.map(|o| base + o).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return Ok(base);
        }
    }
    bail!("no free port range found for a benchmark cluster")
}

impl Cluster {
    /// Start manager, back-ends and front-ends and wait until the ring is formed and every
    /// front-end accepts memcached connections.
    pub fn start(spec: ClusterSpec) -> Result<Cluster> {
        ensure!(spec.backends >= 1 && spec.frontends >= 1, "a cluster needs back-ends and front-ends");
        std::fs::create_dir_all(&spec.dir).with_context(|| format!("creating {}", spec.dir.display()))?;
        let mut c = Cluster { spec, roles: Vec::new() };
        let s = c.spec.clone();
        let mut members: Vec<(fawn_tls::Role, u32)> =
            (1..=s.managers.max(1)).map(|id| (fawn_tls::Role::Manager, id)).collect();
        members.push((fawn_tls::Role::Admin, 0));
        c.ensure_credentials(&members)?;
        let ring = RingShape {
            backends: s.backends,
            frontends: s.frontends,
            replicas: s.replicas,
            vnodes: s.vnodes,
        };
        for (i, addr) in s.manager_addrs().into_iter().enumerate() {
            let name = s.manager_name(i as u32 + 1);
            let manager = ManagerCommand {
                listen: addr.to_string(),
                group: (s.managers > 1).then(|| s.managers_list()),
                data_dir: s.dir.join(&name),
                ring,
                tls_dir: s.tls_dir(),
            };
            c.spawn(&name, manager.args())?;
        }
        for addr in s.manager_addrs() {
            wait_port(addr, &mut c.roles)?;
        }
        for node in 0..s.backends {
            c.add_backend(node)?;
        }
        let memcached_tls = s.memcached_tls_files()?;
        for i in 0..s.frontends {
            let frontend = FrontendCommand {
                id: i,
                listen: s.native_addr(i).to_string(),
                memcached: s.memcached_addr(i).to_string(),
                managers: s.managers_list(),
                data_dir: s.dir.join(format!("frontend-{i}")),
                cache_entries: s.cache_entries,
                request_timeout_ms: None,
                memcached_auth_file: None,
                memcached_tls: memcached_tls.clone(),
                tls_dir: s.tls_dir(),
            };
            c.ensure_credentials(&[(fawn_tls::Role::Frontend, i)])?;
            c.spawn(&format!("frontend-{i}"), frontend.args())?;
        }
        for i in 0..s.frontends {
            wait_port(s.memcached_addr(i), &mut c.roles)?;
        }
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let rt = small_runtime()?;
            if let Ok(cfg) = rt.block_on(c.config()) {
                if cfg.formed && cfg.frontends.len() == s.frontends as usize {
                    break;
                }
            }
            ensure!(Instant::now() < deadline, "the cluster did not form within {START_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(c)
    }

    /// Start back-end `node` (after formation it joins as a syncing replica).
    pub fn add_backend(&mut self, node: u32) -> Result<()> {
        let s = self.spec.clone();
        let backend = BackendCommand {
            node,
            listen: s.backend_addr(node).to_string(),
            advertise: s
                .backend_advertise
                .as_ref()
                .and_then(|a| a.get(node as usize))
                .map(|port| loopback(*port).to_string()),
            managers: s.managers_list(),
            data_dir: s.dir.join(format!("backend-{node}")),
            sync: s.sync.clone(),
            expected_keys: None,
            tls_dir: s.tls_dir(),
        };
        self.ensure_credentials(&[(fawn_tls::Role::Backend, node)])?;
        let args = backend.args();
        self.spawn(&format!("backend-{node}"), args)?;
        wait_port(s.backend_addr(node), &mut self.roles)
    }

    /// Under TLS: the CA (created on first use) and `members`' credentials, and this process
    /// talking to the cluster as its admin.
    fn ensure_credentials(&self, members: &[(fawn_tls::Role, u32)]) -> Result<()> {
        let Some(dir) = self.spec.tls_dir() else {
            fawn_client::transport::set(fawn_client::transport::Transport::Plain);
            return Ok(());
        };
        let cluster = format!("bench-{:08x}", rand::random::<u32>());
        fawn_tls::ClusterCa::ensure(&dir, &cluster, members)
            .with_context(|| format!("creating certificates in {}", dir.display()))?;
        let admin = fawn_tls::TlsSetup::load_as(&dir, fawn_tls::Role::Admin, 0)?;
        fawn_client::transport::set(fawn_client::transport::Transport::Tls(admin));
        Ok(())
    }

    fn spawn(&mut self, name: &str, args: Vec<String>) -> Result<()> {
        let log_path = self.spec.dir.join(format!("{name}.log"));
        let log =
            std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let child = Command::new(&self.spec.bin)
            .args(&args)
            // Quiet by default; FAWN_BENCH_ROLE_LOG (e.g. `info`) shows what the roles did.
            .env("FAWN_LOG", std::env::var("FAWN_BENCH_ROLE_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("cloning a log handle")?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                anyhow!(
                    "starting {name} with {}: {e} (build the fawn binary first: cargo build --release -p fawn, \
                     or pass --fawn-bin / set FAWN_BIN)",
                    self.spec.bin.display()
                )
            })?;
        self.roles.push(Role { name: name.to_string(), child });
        Ok(())
    }

    /// Pids of every role (for CPU accounting).
    pub fn pids(&self) -> Vec<u32> {
        self.roles.iter().map(|r| r.child.id()).collect()
    }

    /// Pid of one role, e.g. `backend-2`.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.roles.iter().find(|r| r.name == name).map(|r| r.child.id())
    }

    /// Send `sig` to one role (our own child, by its pid).
    pub fn signal(&self, name: &str, sig: i32) -> Result<()> {
        let pid = self.pid(name).with_context(|| format!("no role {name}"))?;
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let rc = unsafe { libc::kill(pid as i32, sig) };
        ensure!(rc == 0, "signalling {name} ({pid}): {}", std::io::Error::last_os_error());
        Ok(())
    }

    /// The manager's current configuration.
    pub async fn config(&self) -> Result<ClusterConfig> {
        let client = self.manager_client().await?;
        Ok(client.config())
    }

    /// A client bootstrapped from the manager (its `refresh` re-reads the configuration).
    pub async fn manager_client(&self) -> Result<Arc<Client>> {
        let options =
            ClientOptions { request_timeout: Duration::from_millis(500), ..ClientOptions::default() };
        let bootstrap: Vec<String> = self.spec.manager_addrs().iter().map(SocketAddr::to_string).collect();
        Client::connect(&bootstrap, options)
            .await
            .map_err(|e| anyhow!("asking the managers at {}: {e}", self.spec.managers_list()))
    }

    /// Bytes on disk under every back-end's data directory.
    pub fn backend_bytes(&self) -> u64 {
        (0..64u32)
            .map(|n| self.spec.dir.join(format!("backend-{n}")))
            .filter(|p| p.exists())
            .map(|p| dir_bytes(&p))
            .sum()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for r in self.roles.iter_mut().rev() {
            let pid = r.child.id() as i32;
            // SAFETY: signals to our own children. A stopped process must be continued to
            // handle SIGTERM.
            unsafe {
                libc::kill(pid, libc::SIGCONT);
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + STOP_GRACE;
        for r in self.roles.iter_mut() {
            while matches!(r.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }
}

/// Is back-end `node` declared failed in `cfg`?
pub fn is_failed(cfg: &ClusterConfig, node: u32) -> bool {
    cfg.backends.iter().any(|b| b.node == node && b.state == NodeState::Failed)
}

/// Every range has `r` in-sync replicas and nothing syncing.
pub fn fully_replicated(cfg: &ClusterConfig, r: usize) -> bool {
    !cfg.ranges.is_empty() && cfg.ranges.iter().all(|rc| rc.chain.len() == r && rc.syncing.is_empty())
}

/// Back-end `node` has left gracefully and is in no chain.
pub fn has_left(cfg: &ClusterConfig, node: u32) -> bool {
    cfg.backends.iter().any(|b| b.node == node && b.state == NodeState::Left)
        && cfg.ranges.iter().all(|rc| !rc.path().any(|n| n == node))
}

/// Some range lists `node` in its chain (in sync), and nothing is syncing.
pub fn joined(cfg: &ClusterConfig, node: u32) -> bool {
    cfg.ranges.iter().any(|rc| rc.chain.contains(&node)) && cfg.ranges.iter().all(|rc| rc.syncing.is_empty())
}

fn dir_bytes(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else { return 0 };
    rd.filter_map(|e| e.ok())
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Wait until `addr` accepts TCP connections; fail if a role exits meanwhile.
fn wait_port(addr: SocketAddr, roles: &mut [Role]) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        for r in roles.iter_mut() {
            if let Ok(Some(st)) = r.child.try_wait() {
                bail!(
                    "{} exited during start-up ({st}); see {}.log in the cluster directory",
                    r.name,
                    r.name
                );
            }
        }
        ensure!(Instant::now() < deadline, "{addr} did not accept connections within {START_TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A one-thread runtime for short blocking queries.
pub fn small_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting a tokio runtime")
}
