//! `fawn up`: a whole cluster on this machine as real processes (a group of managers,
//! back-ends, front-ends), each a child running the `fawn` binary in its role.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::launch::{
    with_metrics, BackendCommand, FrontendCommand, ManagerCommand, MemcachedTlsFiles, RingShape,
};

/// How long `fawn up` waits for the cluster to accept memcached connections.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause before an exited role is restarted (also the supervision poll interval).
pub const RESTART_PAUSE: Duration = Duration::from_millis(1000);
/// How long a child gets to exit after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(15);

/// Shape and placement of a local cluster.
#[derive(Clone, Debug)]
pub struct LocalCluster {
    /// The `fawn` executable to run the roles with.
    pub exe: PathBuf,
    pub data_dir: PathBuf,
    pub host: String,
    /// Manager 1's port; manager i > 1 listens on base+250+i-1, back-end i on base+1+i,
    /// front-end i on base+100+i.
    pub base_port: u16,
    /// Managers in the manager group (an odd number; 3 survive the loss of one).
    pub managers: u32,
    /// memcached address of front-end 0; front-end i uses its port + i.
    pub memcached: String,
    pub backends: u32,
    pub frontends: u32,
    pub replicas: u32,
    pub vnodes: u32,
    /// Sync policy for back-end datastores (`always`, `never`, `interval:MS`).
    pub sync: String,
    /// `--expected-keys` of every back-end: keys each one expects to hold (0 = no hint).
    pub expected_keys: u64,
    /// Serve `/metrics` on every role: manager 1 BASE+300, manager i > 1 BASE+500+i-1,
    /// back-end i BASE+301+i, front-end i BASE+400+i.
    pub metrics: bool,
    /// Extra flags for every role (e.g. log format).
    pub extra_args: Vec<String>,
    /// `--memcached-auth-file` of every front-end: memcached clients must log in.
    pub memcached_auth_file: Option<PathBuf>,
    /// Mutual TLS between the roles: the first start creates a CA and every role's
    /// certificate in `<data_dir>/tls` ([`LocalCluster::tls_dir`]); `false`: `--plaintext`.
    pub tls: bool,
    /// TLS on every front-end's memcached port, with a server certificate that each start
    /// issues from the cluster CA in `<data_dir>/tls` (created if missing, also under
    /// `--plaintext`) for the memcached host and the loopback names.
    pub memcached_tls: bool,
}

/// One started role.
struct Role {
    name: String,
    child: Child,
    /// The arguments it was started with, to restart it.
    args: Vec<String>,
}

/// Addresses of a running local cluster.
#[derive(Clone, Debug)]
pub struct Addresses {
    /// The managers' addresses, comma-separated, as the other roles are given them.
    pub manager: String,
    /// Manager i + 1's address.
    pub managers: Vec<String>,
    pub backends: Vec<String>,
    pub frontends_native: Vec<String>,
    pub frontends_memcached: Vec<String>,
}

impl LocalCluster {
    /// The addresses every role will listen on.
    pub fn addresses(&self) -> anyhow::Result<Addresses> {
        let at = |port: u32| -> anyhow::Result<String> {
            let port = u16::try_from(port).context("port out of range: lower --base-port")?;
            Ok(format!("{}:{port}", self.host))
        };
        let base = u32::from(self.base_port);
        let (mc_host, mc_port) = self
            .memcached
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_string(), p.parse::<u32>().ok()?)))
            .context("--memcached must be HOST:PORT")?;
        let managers: Vec<String> = (0..self.managers.max(1))
            .map(|i| if i == 0 { at(base) } else { at(base + 250 + i) })
            .collect::<Result<_, _>>()?;
        Ok(Addresses {
            manager: managers.join(","),
            managers,
            backends: (0..self.backends).map(|i| at(base + 1 + i)).collect::<Result<_, _>>()?,
            frontends_native: (0..self.frontends).map(|i| at(base + 100 + i)).collect::<Result<_, _>>()?,
            frontends_memcached: (0..self.frontends).map(|i| format!("{mc_host}:{}", mc_port + i)).collect(),
        })
    }

    /// Starts every role, waits until the cluster serves memcached, runs until `shutdown`,
    /// then stops the roles front to back.
    pub async fn run(&self, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
        let addrs = self.addresses()?;
        std::fs::create_dir_all(&self.data_dir)
            .with_context(|| format!("creating data directory {}", self.data_dir.display()))?;
        let mut roles = Vec::new();
        let started = self.start_all(&addrs, &mut roles).await;
        let outcome = match started {
            Ok(()) => {
                print_ready(&addrs, &self.data_dir, self.memcached_tls);
                if let Some(dir) = self.tls_dir() {
                    println!("  native mutual TLS  CA and certificates in {}", dir.display());
                }
                if self.memcached_tls {
                    println!(
                        "  memcached TLS      clients verify with {}",
                        self.credentials_dir().join("ca.pem").display()
                    );
                }
                if self.metrics {
                    println!(
                        "  metrics            http://{}:{}..{}/metrics",
                        self.host,
                        self.base_port + 300,
                        self.base_port + 400 + self.frontends as u16 - 1
                    );
                }
                supervise(self, &mut roles, &mut shutdown).await
            }
            Err(e) => Err(e),
        };
        stop_all(&mut roles).await;
        outcome
    }

    /// Where the CA and the roles' credentials are, when TLS is on.
    pub fn tls_dir(&self) -> Option<PathBuf> {
        self.tls.then(|| self.credentials_dir())
    }

    /// Where the CA and certificates are kept (used only with TLS on either kind of port).
    fn credentials_dir(&self) -> PathBuf {
        self.data_dir.join("tls")
    }

    /// Creates the CA (a new cluster name) on first start, and whatever credentials a role
    /// of this shape lacks, admin 0 (for `fawn status`) included; with `memcached_tls`, a new
    /// memcached server certificate.
    fn ensure_credentials(&self) -> anyhow::Result<()> {
        if !self.tls && !self.memcached_tls {
            return Ok(());
        }
        let dir = self.credentials_dir();
        use fawn_tls::Role as R;
        let mut members = Vec::new();
        if self.tls {
            members.push((R::Admin, 0));
            members.extend((1..=self.managers.max(1)).map(|id| (R::Manager, id)));
            members.extend((0..self.backends).map(|node| (R::Backend, node)));
            members.extend((0..self.frontends).map(|id| (R::Frontend, id)));
        }
        let cluster = format!("fawn-{:08x}", rand::random::<u32>());
        let ca = fawn_tls::ClusterCa::ensure(&dir, &cluster, &members)
            .with_context(|| format!("creating the cluster CA and certificates in {}", dir.display()))?;
        if self.memcached_tls {
            let host = self.memcached.rsplit_once(':').map_or("", |(host, _)| host);
            fawn_tls::clients::issue_memcached_into(&dir, host)
                .with_context(|| format!("issuing the memcached certificate in {}", dir.display()))?;
        }
        info!(cluster = ca.cluster(), dir = %dir.display(), "cluster CA and certificates ready");
        Ok(())
    }

    /// Every front-end's memcached certificate and key, when memcached TLS is on.
    fn memcached_tls_files(&self) -> Option<MemcachedTlsFiles> {
        let dir = self.credentials_dir();
        let stem = fawn_tls::clients::MEMCACHED_CERT_STEM;
        self.memcached_tls.then(|| MemcachedTlsFiles {
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}.key")),
        })
    }

    async fn start_all(&self, addrs: &Addresses, roles: &mut Vec<Role>) -> anyhow::Result<()> {
        self.ensure_credentials()?;
        let tls_dir = self.tls_dir();
        let ring = RingShape {
            backends: self.backends,
            frontends: self.frontends,
            replicas: self.replicas,
            vnodes: self.vnodes,
        };
        for (i, addr) in addrs.managers.iter().enumerate() {
            // Manager 1 keeps the single manager's name and directory of earlier versions.
            let name = if i == 0 { "manager".to_string() } else { format!("manager-{}", i + 1) };
            if i > 0 {
                share_legacy_config(&self.data_dir.join("manager"), &self.data_dir.join(&name))?;
            }
            let command = ManagerCommand {
                listen: addr.clone(),
                group: Some(addrs.manager.clone()),
                data_dir: self.data_dir.join(&name),
                ring,
                tls_dir: tls_dir.clone(),
            };
            let metrics_at = if i == 0 { 300 } else { 500 + i as u32 };
            roles.push(self.spawn(&name, self.with_metrics(command.args(), metrics_at))?);
        }
        for (i, addr) in addrs.backends.iter().enumerate() {
            let command = BackendCommand {
                node: i as u32,
                listen: addr.clone(),
                advertise: None,
                managers: addrs.manager.clone(),
                data_dir: self.data_dir.join(format!("backend-{i}")),
                sync: self.sync.clone(),
                expected_keys: Some(self.expected_keys),
                tls_dir: tls_dir.clone(),
            };
            roles.push(
                self.spawn(&format!("backend-{i}"), self.with_metrics(command.args(), 301 + i as u32))?,
            );
        }
        for i in 0..self.frontends as usize {
            let command = FrontendCommand {
                id: i as u32,
                listen: addrs.frontends_native[i].clone(),
                memcached: addrs.frontends_memcached[i].clone(),
                managers: addrs.manager.clone(),
                data_dir: self.data_dir.join(format!("frontend-{i}")),
                cache_entries: None,
                request_timeout_ms: None,
                memcached_auth_file: self.memcached_auth_file.clone(),
                memcached_tls: self.memcached_tls_files(),
                tls_dir: tls_dir.clone(),
            };
            roles.push(
                self.spawn(&format!("frontend-{i}"), self.with_metrics(command.args(), 400 + i as u32))?,
            );
        }
        wait_ready(&addrs.frontends_memcached, roles).await
    }

    /// Adds `--metrics HOST:BASE+offset` when metrics are on.
    fn with_metrics(&self, args: Vec<String>, offset: u32) -> Vec<String> {
        let addr = self.metrics.then(|| format!("{}:{}", self.host, u32::from(self.base_port) + offset));
        with_metrics(args, addr)
    }

    fn spawn(&self, name: &str, mut args: Vec<String>) -> anyhow::Result<Role> {
        args.extend(self.extra_args.iter().cloned());
        self.spawn_args(name, args, false)
    }

    fn spawn_args(&self, name: &str, args: Vec<String>, append_log: bool) -> anyhow::Result<Role> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(append_log)
            .write(true)
            .truncate(!append_log)
            .open(self.data_dir.join(format!("{name}.log")))
            .with_context(|| format!("creating the log file of {name}"))?;
        let child = Command::new(&self.exe)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name} ({})", self.exe.display()))?;
        info!(role = name, pid = child.id(), "started");
        Ok(Role { name: name.to_string(), child, args })
    }
}

/// A data directory from a single-manager version holds the configuration in
/// `manager/cluster-config.json`; a new group's first leader starts from the file in its own
/// directory, so every new manager of the group gets a copy (whichever wins the first
/// election keeps the cluster's configuration).
fn share_legacy_config(first: &Path, dir: &Path) -> anyhow::Result<()> {
    const LEGACY: &str = "cluster-config.json";
    if !first.join(LEGACY).exists() || dir.join("raft").exists() || dir.join(LEGACY).exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    std::fs::copy(first.join(LEGACY), dir.join(LEGACY))
        .with_context(|| format!("copying the saved configuration to {}", dir.display()))?;
    Ok(())
}

async fn wait_ready(memcached: &[String], roles: &mut [Role]) -> anyhow::Result<()> {
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    for addr in memcached {
        loop {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                break;
            }
            if let Some(dead) = first_exited(roles) {
                anyhow::bail!("{dead} exited during start-up; see its log in the data directory");
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "the cluster did not accept memcached connections on {addr} within {STARTUP_TIMEOUT:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

fn first_exited(roles: &mut [Role]) -> Option<String> {
    roles.iter_mut().find_map(|r| match r.child.try_wait() {
        Ok(Some(status)) => Some(format!("{} ({status})", r.name)),
        _ => None,
    })
}

/// Restarts any role that exits (a crashed back-end rejoins and resyncs; the cluster keeps
/// serving meanwhile), until shutdown.
async fn supervise(
    cluster: &LocalCluster,
    roles: &mut [Role],
    shutdown: &mut watch::Receiver<bool>,
) -> anyhow::Result<()> {
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|v| *v) => return Ok(()),
            _ = tokio::time::sleep(RESTART_PAUSE) => {}
        }
        for role in roles.iter_mut() {
            if let Ok(Some(status)) = role.child.try_wait() {
                error!(role = %role.name, %status, "a cluster process exited; restarting it");
                let restarted = cluster.spawn_args(&role.name, role.args.clone(), true)?;
                *role = restarted;
            }
        }
    }
}

/// SIGTERM front-ends, then back-ends, then the managers; SIGKILL whatever outlives the grace.
async fn stop_all(roles: &mut [Role]) {
    for role in roles.iter_mut().rev() {
        if let Some(pid) = role.child.id() {
            // SAFETY: sending a signal to our own child process.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        match tokio::time::timeout(STOP_GRACE, role.child.wait()).await {
            Ok(_) => info!(role = %role.name, "stopped"),
            Err(_) => {
                warn!(role = %role.name, "did not stop in time; killing");
                let _ = role.child.kill().await;
            }
        }
    }
}

fn print_ready(addrs: &Addresses, data_dir: &Path, memcached_tls: bool) {
    println!("fawn up: cluster ready");
    for (i, m) in addrs.managers.iter().enumerate() {
        println!("  manager-{}          {m}", i + 1);
    }
    for (i, b) in addrs.backends.iter().enumerate() {
        println!("  backend-{i}          {b}");
    }
    for (i, (n, m)) in addrs.frontends_native.iter().zip(&addrs.frontends_memcached).enumerate() {
        println!("  frontend-{i}         native {n}   memcached {m}");
    }
    println!("  data and logs      {}", data_dir.display());
    if let Some((host, port)) = addrs.frontends_memcached[0].rsplit_once(':') {
        let requests = "set hello 0 0 5\\r\\nworld\\r\\nget hello\\r\\n";
        if memcached_tls {
            let ca = data_dir.join("tls/ca.pem");
            println!(
                "Try:   printf '{requests}quit\\r\\n' | openssl s_client -quiet -ign_eof -CAfile {} -connect {host}:{port}",
                ca.display()
            );
        } else {
            println!("Try:   printf '{requests}' | nc {host} {port}");
        }
    }
    println!("Stop with Ctrl-C; data is kept for the next `fawn up`.");
}
