//! A cluster of individually started processes — the manager, each back-end and each
//! front-end its own `fawn <role>` child on free loopback ports — so that tests can kill -9,
//! pause (SIGSTOP), resume (SIGCONT) and restart single nodes. With `ProcShape::netns` each
//! back-end runs in its own network namespace (see `netns`) so that links between back-ends
//! can be cut; the manager and front-ends then listen on the bridge address. Every process logs to
//! `<dir>/<name>.log` (appended across restarts, with a marker line per start); everything
//! is killed on drop.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_client::{Client, ClientOptions};
use fawn_kv::launch::{BackendCommand, FrontendCommand, ManagerCommand, RingShape};
use fawn_kv::manager::client as manager_client;
use fawn_proto::native::{ClusterConfig, NodeStatus, Request, Response};

/// The `fawn` binary the roles run: `FAWN_BIN` if set (e.g. an older build, to show that a
/// scenario catches a bug it fixed), else this package's.
pub fn fawn_binary() -> PathBuf {
    std::env::var_os("FAWN_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_fawn")), PathBuf::from)
}

/// Namespace node id of manager 0 (`netns`); manager `i` is this + `i`, clear of back-end ids.
pub const MANAGER_NETNS_NODE: u32 = 200;

/// How long a cluster gets to form (every back-end and front-end registered).
pub const FORM_TIMEOUT: Duration = Duration::from_secs(60);

/// Shape of a process cluster.
#[derive(Clone, Debug)]
pub struct ProcShape {
    pub backends: u32,
    pub frontends: u32,
    pub replicas: u32,
    pub vnodes: u32,
    /// Back-end sync policy: `always`, `never` or `interval:MS`.
    pub sync: String,
    /// Extra flags for every front-end (e.g. `--cache-entries 0`).
    pub frontend_args: Vec<String>,
    /// Extra flags for every back-end (e.g. `--link-repair-ms 0`).
    pub backend_args: Vec<String>,
    /// Each back-end in its own network namespace (needs root), for [`Procs::cut`].
    pub netns: bool,
    /// With `netns`, each manager in its own namespace too (node [`MANAGER_NETNS_NODE`] + i),
    /// for [`Procs::partition_manager`].
    pub manager_netns: bool,
    /// Managers in the manager group (an odd number).
    pub managers: u32,
    /// Extra flags for every manager (e.g. `--raft-snapshot-every 2`).
    pub manager_args: Vec<String>,
    /// Mutual TLS between every process, this test's client included (admin 0): the test
    /// binary's CA ([`super::tls`]) and certificates in `<dir>/tls` ([`Procs::tls_dir`]).
    /// Off: every role gets `--plaintext`, and so does this process unless another cluster of
    /// this binary uses TLS.
    pub tls: bool,
    /// Back-end `node`'s data directory is a tmpfs of this many bytes (`.0`, `.1`), mounted
    /// before it starts and unmounted when the cluster is dropped (needs root).
    pub backend_tmpfs: Option<(u32, u64)>,
}

impl Default for ProcShape {
    fn default() -> Self {
        ProcShape {
            backends: 3,
            frontends: 1,
            replicas: 3,
            vnodes: 2,
            sync: "interval:100".into(),
            // For diagnosis, e.g. FAWN_FRONTEND_ARGS="--cache-entries 0".
            frontend_args: std::env::var("FAWN_FRONTEND_ARGS")
                .map(|s| s.split_whitespace().map(String::from).collect())
                .unwrap_or_default(),
            // E.g. FAWN_BACKEND_ARGS="--link-repair-ms 0" (the behaviour before link repair).
            backend_args: std::env::var("FAWN_BACKEND_ARGS")
                .map(|s| s.split_whitespace().map(String::from).collect())
                .unwrap_or_default(),
            netns: false,
            manager_netns: false,
            managers: 1,
            manager_args: Vec::new(),
            tls: false,
            backend_tmpfs: None,
        }
    }
}

/// One role process.
struct Proc {
    name: String,
    /// Arguments of `ip` placed before the `fawn` command (`netns exec <ns>`), if any.
    prefix: Vec<String>,
    args: Vec<String>,
    /// Extra environment variables of this start (cleared by `restart_backend`).
    env: Vec<(String, String)>,
    child: Option<Child>,
    paused: bool,
}

impl Proc {
    fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: signalling our own child process.
            unsafe { libc::kill(pid, sig) };
        }
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }
}

/// A cluster of separately started processes.
pub struct Procs {
    pub dir: PathBuf,
    pub shape: ProcShape,
    /// The managers' native addresses, comma-separated, as every role is given them.
    pub manager_addr: String,
    /// Each manager's native address (manager `i` has id `i + 1`).
    pub manager_addrs: Vec<String>,
    /// Back-end native address by node id.
    pub backend_addrs: BTreeMap<u32, String>,
    /// Front-end (native, memcached) addresses by id.
    pub frontend_addrs: Vec<(String, String)>,
    managers: Vec<Proc>,
    backends: BTreeMap<u32, Proc>,
    frontends: Vec<Proc>,
    /// The back-ends' namespaces (with `ProcShape::netns`); dropped after every process.
    pub netns: Option<super::netns::Netns>,
    /// The tmpfs of `ProcShape::backend_tmpfs`: unmounted after every process was killed
    /// (`Drop`) and before the directory is removed.
    pub tmpfs: Option<super::tmpfs::Tmpfs>,
    _tmp: tempfile::TempDir,
}

/// What `start_filled` returns: the cluster, a runtime, a client, and the keys written.
pub type Filled = (Procs, tokio::runtime::Runtime, Arc<Client>, BTreeMap<Vec<u8>, Vec<u8>>);

/// A started cluster of `shape` processes, a runtime and a client of it, and the `keys`
/// keys written through it (`put_padded_keys`).
pub fn start_filled(shape: ProcShape, keys: u32) -> Filled {
    let procs = Procs::start(shape);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let client = rt.block_on(procs.client(ClientOptions::default()));
    let want = rt.block_on(super::put_padded_keys(&client, keys));
    (procs, rt, client, want)
}

/// `n` distinct free loopback ports (all held until every one is chosen), below Linux's
/// ephemeral range (32768+) so that no outgoing connection takes one before its role binds it.
pub fn free_ports(n: usize) -> Vec<u16> {
    let mut state = u64::from(std::process::id())
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    let mut listeners: Vec<TcpListener> = Vec::new();
    while listeners.len() < n {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let port = 10_000 + ((state >> 33) % 22_000) as u16;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            listeners.push(l);
        }
    }
    listeners.iter().map(|l| l.local_addr().expect("local addr").port()).collect()
}

impl Procs {
    /// Starts the manager, the back-ends and the front-ends and waits until the cluster has
    /// formed and answers a put and a get.
    pub fn start(shape: ProcShape) -> Procs {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let m = shape.managers.max(1) as usize;
        let tls_dir = shape.tls.then(|| dir.join("tls"));
        if let Some(tls) = &tls_dir {
            use fawn_tls::Role;
            let mut members: Vec<(Role, u32)> = (1..=m as u32).map(|id| (Role::Manager, id)).collect();
            members.extend((0..shape.backends).map(|node| (Role::Backend, node)));
            members.extend((0..shape.frontends).map(|id| (Role::Frontend, id)));
            super::tls::provision(tls, &members);
        }
        let n = m + shape.backends as usize + 2 * shape.frontends as usize;
        let ports = free_ports(n);
        let mut netns = shape.netns.then(super::netns::Netns::create);
        let host = netns.as_ref().map_or_else(|| "127.0.0.1".to_string(), |x| x.host_ip());
        let in_ns = shape.netns && shape.manager_netns;
        let manager_addrs: Vec<String> = (0..m)
            .map(|i| {
                let ip = match netns.as_mut() {
                    Some(x) if in_ns => x.node(MANAGER_NETNS_NODE + i as u32).1,
                    _ => host.clone(),
                };
                format!("{ip}:{}", ports[i])
            })
            .collect();
        let manager_prefixes: Vec<Vec<String>> = (0..m)
            .map(|i| match netns.as_mut() {
                Some(x) if in_ns => x.exec_prefix(MANAGER_NETNS_NODE + i as u32),
                _ => Vec::new(),
            })
            .collect();
        let manager_addr = manager_addrs.join(",");
        let backend_addrs: BTreeMap<u32, String> = (0..shape.backends)
            .map(|i| {
                let ip = netns.as_mut().map_or_else(|| "127.0.0.1".to_string(), |x| x.node(i).1);
                (i, format!("{ip}:{}", ports[m + i as usize]))
            })
            .collect();
        let fe_base = m + shape.backends as usize;
        let frontend_addrs: Vec<(String, String)> = (0..shape.frontends as usize)
            .map(|i| {
                (
                    format!("{host}:{}", ports[fe_base + 2 * i]),
                    format!("127.0.0.1:{}", ports[fe_base + 2 * i + 1]),
                )
            })
            .collect();
        let managers = (0..m)
            .map(|i| Proc {
                name: manager_name(m, i),
                prefix: manager_prefixes[i].clone(),
                args: ManagerCommand {
                    listen: manager_addrs[i].clone(),
                    group: Some(manager_addr.clone()),
                    data_dir: dir.join(manager_name(m, i)),
                    ring: RingShape {
                        backends: shape.backends,
                        frontends: shape.frontends,
                        replicas: shape.replicas,
                        vnodes: shape.vnodes,
                    },
                    tls_dir: tls_dir.clone(),
                }
                .args()
                .into_iter()
                .chain(shape.manager_args.iter().cloned())
                .collect(),
                env: Vec::new(),
                child: None,
                paused: false,
            })
            .collect();
        let mut procs = Procs {
            dir,
            shape: shape.clone(),
            manager_addr,
            manager_addrs,
            backend_addrs: BTreeMap::new(),
            frontend_addrs: frontend_addrs.clone(),
            managers,
            backends: BTreeMap::new(),
            frontends: Vec::new(),
            netns,
            tmpfs: None,
            _tmp: tmp,
        };
        let mut managers = std::mem::take(&mut procs.managers);
        for p in &mut managers {
            procs.spawn(p);
        }
        procs.managers = managers;
        for (node, addr) in backend_addrs {
            procs.add_backend(node, addr);
        }
        for (i, (native, memcached)) in frontend_addrs.iter().enumerate() {
            let mut args = FrontendCommand {
                id: i as u32,
                listen: native.clone(),
                memcached: memcached.clone(),
                managers: procs.manager_addr.clone(),
                data_dir: procs.dir.join(format!("frontend-{i}")),
                cache_entries: None,
                request_timeout_ms: Some(1500),
                memcached_auth_file: None,
                memcached_tls: None,
                tls_dir: procs.tls_dir(),
            }
            .args();
            args.extend(shape.frontend_args.iter().cloned());
            let mut p = Proc {
                name: format!("frontend-{i}"),
                prefix: Vec::new(),
                args,
                env: Vec::new(),
                child: None,
                paused: false,
            };
            procs.spawn(&mut p);
            procs.frontends.push(p);
        }
        procs.wait_formed();
        procs
    }

    /// Where the CA and every process's credentials are, under TLS.
    pub fn tls_dir(&self) -> Option<PathBuf> {
        self.shape.tls.then(|| self.dir.join("tls"))
    }

    fn add_backend(&mut self, node: u32, addr: String) {
        if let Some(tls) = self.tls_dir() {
            super::tls::provision(&tls, &[(fawn_tls::Role::Backend, node)]);
        }
        let prefix = self.netns.as_mut().map(|x| x.exec_prefix(node)).unwrap_or_default();
        if let Some((_, bytes)) = self.shape.backend_tmpfs.filter(|(n, _)| *n == node) {
            self.tmpfs = Some(super::tmpfs::Tmpfs::mount(&self.dir.join(format!("backend-{node}")), bytes));
        }
        let mut p = Proc {
            name: format!("backend-{node}"),
            prefix,
            args: BackendCommand {
                node,
                listen: addr.clone(),
                advertise: None,
                managers: self.manager_addr.clone(),
                data_dir: self.dir.join(format!("backend-{node}")),
                sync: self.shape.sync.clone(),
                expected_keys: None,
                tls_dir: self.tls_dir(),
            }
            .args(),
            env: Vec::new(),
            child: None,
            paused: false,
        };
        p.args.extend(self.shape.backend_args.iter().cloned());
        self.spawn(&mut p);
        self.backends.insert(node, p);
        self.backend_addrs.insert(node, addr);
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    fn spawn(&self, p: &mut Proc) {
        assert!(p.child.is_none(), "{} is already running", p.name);
        let mut log =
            OpenOptions::new().create(true).append(true).open(self.log_path(&p.name)).expect("open role log");
        let _ = writeln!(log, "===== test harness {}: starting {} {}", utc_now(), p.name, p.args.join(" "));
        // `ip netns exec` execs the command, so the child's pid is the role's own.
        let bin = fawn_binary();
        let mut cmd = if p.prefix.is_empty() {
            Command::new(&bin)
        } else {
            let mut c = Command::new("ip");
            c.args(&p.prefix).arg(&bin);
            c
        };
        let child = cmd
            .args(&p.args)
            .env("FAWN_LOG", std::env::var("FAWN_TEST_LOG").unwrap_or_else(|_| "info".into()))
            .envs(p.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", p.name));
        p.child = Some(child);
        p.paused = false;
    }

    /// The process id of front-end `i`, if it runs.
    pub fn frontend_pid(&self, i: usize) -> Option<i32> {
        self.frontends.get(i).and_then(Proc::pid)
    }

    /// The process id of back-end `node`, if it runs.
    pub fn backend_pid(&self, node: u32) -> Option<i32> {
        self.backends.get(&node).and_then(Proc::pid)
    }

    /// Appends a marker line to a role's log (to line up faults with log lines).
    pub fn mark(&self, name: &str, what: &str) {
        if let Ok(mut log) = OpenOptions::new().append(true).open(self.log_path(name)) {
            let _ = writeln!(log, "===== test harness {}: {what}", utc_now());
        }
    }

    /// The configuration as the manager has it (`None` if the manager does not answer).
    pub fn config(&self) -> Option<ClusterConfig> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let pool = fawn_client::pool::Pool::new(Duration::from_secs(1));
            match manager_client::call(&pool, &self.manager_addr, Request::GetConfig, Duration::from_secs(2))
                .await
            {
                Ok(Response::Config(c)) => Some(c),
                _ => None,
            }
        })
    }

    /// The sum of one `Status` counter (e.g. `link_stalls`, `lease_refusals`) over every
    /// back-end that answers.
    pub fn backend_counter_sum(&self, name: &str) -> u64 {
        counter_sum(self.backend_addrs.values(), name)
    }

    /// The sum of one `Status` counter (e.g. `cache_hits`) over every front-end that answers.
    pub fn frontend_counter_sum(&self, name: &str) -> u64 {
        counter_sum(self.frontend_addrs.iter().map(|(native, _)| native), name)
    }

    /// Asks the manager to drain back-end `node` gracefully (`fawn leave`); panics unless
    /// the manager accepts.
    pub fn leave(&self, node: u32) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let pool = fawn_client::pool::Pool::new(Duration::from_secs(2));
            match manager_client::call(
                &pool,
                &self.manager_addr,
                Request::Leave { node },
                Duration::from_secs(5),
            )
            .await
            {
                Ok(Response::Config(_)) | Ok(Response::Ok) => {}
                other => panic!("leave of back-end {node}: {other:?}"),
            }
        })
    }

    /// One back-end's `Status` counters (panics if it does not answer).
    pub fn backend_status(&self, node: u32) -> BTreeMap<String, u64> {
        match self.node_status(node) {
            Ok(s) => s.counters.into_iter().collect(),
            Err(e) => panic!("status of back-end {node}: {e}"),
        }
    }

    fn node_status(&self, node: u32) -> Result<NodeStatus, String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let addr = self.backend_addrs.get(&node).ok_or("no such back-end")?;
        rt.block_on(async {
            let pool = fawn_client::pool::Pool::new(Duration::from_secs(2));
            match pool.call(addr, Request::Status, Duration::from_secs(5)).await {
                Ok(Response::Status(s)) => Ok(s),
                other => Err(format!("({addr}): {other:?}")),
            }
        })
    }

    /// Waits up to 60 s, checking that every process still runs, until the manager's
    /// configuration satisfies `ok` (`what` names the wait in the failure message).
    pub fn wait_config(&mut self, what: &str, mut ok: impl FnMut(&ClusterConfig) -> bool) -> ClusterConfig {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.assert_running();
            if let Some(c) = self.config() {
                if ok(&c) {
                    return c;
                }
            }
            assert!(Instant::now() < deadline, "timed out waiting until {what}\n{}", self.logs(60));
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// [`Self::wait_config`], then also until every back-end in a chain or sync of that
    /// configuration has installed it and the manager still holds it: a back-end that was
    /// just restarted has not registered yet, so the manager's configuration can look settled
    /// while that back-end is about to rejoin and copy its ranges afresh.
    pub fn wait_config_installed(
        &mut self,
        what: &str,
        mut ok: impl FnMut(&ClusterConfig) -> bool,
    ) -> ClusterConfig {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let c = self.wait_config(what, &mut ok);
            let members: BTreeSet<u32> =
                c.ranges.iter().flat_map(|r| r.chain.iter().chain(r.syncing.iter()).copied()).collect();
            let installed = members.iter().all(|n| self.backend_epoch(*n).is_some_and(|e| e >= c.epoch));
            if installed && self.config().is_some_and(|now| now.epoch == c.epoch) {
                return c;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting until {what} is installed\n{}",
                self.logs(60)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The configuration epoch back-end `node` has installed, if it answers.
    fn backend_epoch(&self, node: u32) -> Option<u64> {
        self.node_status(node).ok().map(|s| s.epoch)
    }

    fn wait_formed(&mut self) {
        let deadline = Instant::now() + FORM_TIMEOUT;
        loop {
            self.assert_running();
            let formed =
                self.config().is_some_and(|c| c.formed && c.frontends.len() as u32 >= self.shape.frontends);
            let memcached_up =
                self.frontend_addrs.iter().all(|(_, m)| std::net::TcpStream::connect(m.as_str()).is_ok());
            if formed && memcached_up && self.probe() {
                return;
            }
            assert!(Instant::now() < deadline, "cluster did not form in {FORM_TIMEOUT:?}\n{}", self.logs(40));
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A put and a get of a probe key through a fresh client.
    fn probe(&self) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let bootstrap = self.bootstrap();
        rt.block_on(async move {
            let Ok(c) = Client::connect(&bootstrap, ClientOptions::default()).await else { return false };
            c.put(b"__probe", b"1").await.is_ok() && c.get(b"__probe").await.is_ok()
        })
    }

    /// Panics (with logs) if a process that should be running has exited.
    pub fn assert_running(&mut self) {
        let mut dead = Vec::new();
        for p in self.managers.iter_mut().chain(self.backends.values_mut()).chain(self.frontends.iter_mut()) {
            if let Some(child) = p.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    dead.push(format!("{} exited: {status}", p.name));
                    p.child = None;
                }
            }
        }
        assert!(dead.is_empty(), "{}\n{}", dead.join("\n"), self.logs(40));
    }

    /// Names of processes that were running and have exited since (and forgets them).
    pub fn exited(&mut self) -> Vec<String> {
        let mut dead = Vec::new();
        for p in self.managers.iter_mut().chain(self.backends.values_mut()).chain(self.frontends.iter_mut()) {
            if let Some(child) = p.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    dead.push(format!("{} ({status})", p.name));
                    p.child = None;
                }
            }
        }
        dead
    }

    /// Native addresses of every front-end, for clients to bootstrap from.
    pub fn bootstrap(&self) -> Vec<String> {
        let mut b: Vec<String> = self.frontend_addrs.iter().map(|(n, _)| n.clone()).collect();
        b.extend(self.manager_addrs.iter().cloned());
        b
    }

    /// A ring-aware client (call inside a tokio runtime).
    pub async fn client(&self, options: ClientOptions) -> Arc<Client> {
        Client::connect(&self.bootstrap(), options).await.expect("client connects")
    }

    fn backend(&mut self, node: u32) -> &mut Proc {
        self.backends.get_mut(&node).unwrap_or_else(|| panic!("no back-end {node}"))
    }

    /// Back-end node ids started so far.
    pub fn backend_nodes(&self) -> Vec<u32> {
        self.backends.keys().copied().collect()
    }

    /// Whether a back-end process is running (possibly paused).
    pub fn backend_running(&self, node: u32) -> bool {
        self.backends.get(&node).is_some_and(|p| p.child.is_some())
    }

    /// kill -9 a back-end.
    pub fn kill9(&mut self, node: u32) {
        self.mark(&format!("backend-{node}"), "kill -9");
        self.backend(node).kill9();
    }

    /// SIGSTOP a back-end.
    pub fn stop(&mut self, node: u32) {
        self.mark(&format!("backend-{node}"), "SIGSTOP");
        let p = self.backend(node);
        p.signal(libc::SIGSTOP);
        p.paused = true;
    }

    /// SIGCONT a back-end.
    pub fn cont(&mut self, node: u32) {
        let p = self.backend(node);
        p.signal(libc::SIGCONT);
        p.paused = false;
        self.mark(&format!("backend-{node}"), "SIGCONT");
    }

    /// Starts a killed back-end again on its old data directory and address.
    pub fn restart_backend(&mut self, node: u32) {
        self.restart_backend_with_env(node, &[]);
    }

    /// `restart_backend` with extra environment variables (e.g. `FAWN_CRASH_AT`).
    pub fn restart_backend_with_env(&mut self, node: u32, env: &[(&str, &str)]) {
        let mut p = std::mem::replace(self.backend(node), placeholder());
        p.kill9();
        p.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.spawn(&mut p);
        self.backends.insert(node, p);
    }

    /// Waits up to `secs` for a back-end to exit on its own (a `FAWN_CRASH_AT` abort).
    pub fn wait_exit(&mut self, node: u32, secs: u64) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while std::time::Instant::now() < deadline {
            let p = self.backend(node);
            if let Some(child) = p.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    p.child = None;
                    return true;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        false
    }

    /// Starts a back-end with a node id never used before, on a fresh data directory and a
    /// free port (a join).
    pub fn start_new_backend(&mut self, node: u32) {
        assert!(!self.backends.contains_key(&node), "back-end {node} exists already");
        let port = free_ports(1)[0];
        let ip = self.netns.as_mut().map_or_else(|| "127.0.0.1".to_string(), |x| x.node(node).1);
        self.add_backend(node, format!("{ip}:{port}"));
    }

    /// kill -9 the (first) manager.
    pub fn kill_manager(&mut self) {
        self.kill_manager_at(0);
    }

    /// Starts the killed (first) manager again on its data directory and address.
    pub fn restart_manager(&mut self) {
        self.restart_manager_at(0);
    }

    /// kill -9 manager `i` (id `i + 1`).
    pub fn kill_manager_at(&mut self, i: usize) {
        self.mark(&self.managers[i].name.clone(), "kill -9");
        self.managers[i].kill9();
    }

    /// SIGSTOP manager `i`.
    pub fn stop_manager(&mut self, i: usize) {
        self.mark(&self.managers[i].name.clone(), "SIGSTOP");
        self.managers[i].signal(libc::SIGSTOP);
        self.managers[i].paused = true;
    }

    /// SIGCONT manager `i`.
    pub fn cont_manager(&mut self, i: usize) {
        self.managers[i].signal(libc::SIGCONT);
        self.managers[i].paused = false;
        self.mark(&self.managers[i].name.clone(), "SIGCONT");
    }

    /// Starts manager `i` again on its data directory and address.
    pub fn restart_manager_at(&mut self, i: usize) {
        let mut p = std::mem::replace(&mut self.managers[i], placeholder());
        p.kill9();
        self.spawn(&mut p);
        self.managers[i] = p;
    }

    /// Starts manager `i` again with its data directory wiped (a lost disk): it joins the
    /// group as an empty member (`--join`) and catches up from the leader's snapshot.
    pub fn restart_manager_empty(&mut self, i: usize) {
        let mut p = std::mem::replace(&mut self.managers[i], placeholder());
        p.kill9();
        let dir = self.dir.join(&p.name);
        let _ = std::fs::remove_dir_all(&dir);
        if !p.args.iter().any(|a| a == "--join") {
            p.args.extend(["--join".to_string(), "--id".to_string(), (i + 1).to_string()]);
        }
        self.spawn(&mut p);
        self.managers[i] = p;
    }

    /// Manager `i`'s data directory.
    pub fn manager_dir(&self, i: usize) -> PathBuf {
        self.dir.join(&self.managers[i].name)
    }

    /// Each manager's status counters (`raft_state`, `raft_term`, ...); `None` for one
    /// that does not answer within 500 ms.
    pub fn manager_statuses(&self) -> Vec<Option<BTreeMap<String, u64>>> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let pool = fawn_client::pool::Pool::new(Duration::from_millis(500));
            let mut out = Vec::new();
            for addr in &self.manager_addrs {
                out.push(match pool.call(addr, Request::Status, Duration::from_millis(500)).await {
                    Ok(Response::Status(s)) => Some(s.counters.into_iter().collect()),
                    _ => None,
                });
            }
            out
        })
    }

    /// Index of the manager that leads the group, waiting up to 10 s for one.
    pub fn leader_manager(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let leader = self
                .manager_statuses()
                .iter()
                .position(|s| s.as_ref().is_some_and(|c| c.get("raft_state") == Some(&3)));
            if let Some(i) = leader {
                return i;
            }
            assert!(Instant::now() < deadline, "no manager leads the group\n{}", self.logs(40));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn netns_mut(&mut self) -> &mut super::netns::Netns {
        self.netns.as_mut().expect("link cuts need ProcShape::netns")
    }

    /// Cuts the link between back-ends `a` and `b` (both directions; each still reaches the
    /// manager, the front-ends and the other back-ends).
    pub fn cut(&mut self, a: u32, b: u32) {
        self.netns_mut().cut(a, b);
        for n in [a, b] {
            self.mark(&format!("backend-{n}"), &format!("link cut backend-{a} <-> backend-{b}"));
        }
    }

    /// Heals a cut.
    pub fn heal(&mut self, a: u32, b: u32) {
        self.netns_mut().heal(a, b);
        for n in [a, b] {
            self.mark(&format!("backend-{n}"), &format!("link healed backend-{a} <-> backend-{b}"));
        }
    }

    /// Cuts manager `i` (in its own namespace: `ProcShape::manager_netns`) off from every
    /// back-end, both directions; it still reaches the other managers, the front-ends and the
    /// clients.
    pub fn partition_manager(&mut self, i: usize) {
        let name = self.managers[i].name.clone();
        for node in self.backend_nodes() {
            self.netns_mut().cut(MANAGER_NETNS_NODE + i as u32, node);
        }
        self.mark(&name, "cut off from every back-end");
    }

    /// Heals [`Procs::partition_manager`].
    pub fn heal_manager(&mut self, i: usize) {
        let name = self.managers[i].name.clone();
        for node in self.backend_nodes() {
            self.netns_mut().heal(MANAGER_NETNS_NODE + i as u32, node);
        }
        self.mark(&name, "link to every back-end healed");
    }

    /// Cuts manager `i` (in its own namespace: `ProcShape::manager_netns`) off from the
    /// front-ends, the clients and the test (everything in the root namespace), both
    /// directions; it still reaches the other managers and every back-end. The test cannot
    /// ask it for its status until [`Procs::heal_manager_host`].
    pub fn partition_manager_host(&mut self, i: usize) {
        let name = self.managers[i].name.clone();
        self.netns_mut().cut_host(MANAGER_NETNS_NODE + i as u32);
        self.mark(&name, "cut off from the front-ends and clients");
    }

    /// Heals [`Procs::partition_manager_host`].
    pub fn heal_manager_host(&mut self, i: usize) {
        let name = self.managers[i].name.clone();
        self.netns_mut().heal_host(MANAGER_NETNS_NODE + i as u32);
        self.mark(&name, "link to the front-ends and clients healed");
    }

    /// kill -9 a front-end.
    pub fn kill_frontend(&mut self, id: usize) {
        self.mark(&format!("frontend-{id}"), "kill -9");
        self.frontends[id].kill9();
    }

    /// Starts a killed front-end again with the same id and addresses.
    pub fn restart_frontend(&mut self, id: usize) {
        let mut p = std::mem::replace(&mut self.frontends[id], placeholder());
        p.kill9();
        self.spawn(&mut p);
        self.frontends[id] = p;
    }

    /// The last `lines` lines of every role's log.
    pub fn logs(&self, lines: usize) -> String {
        let mut out = String::new();
        let mut names: Vec<String> = self.managers.iter().map(|p| p.name.clone()).collect();
        names.extend(self.backends.values().map(|p| p.name.clone()));
        names.extend(self.frontends.iter().map(|p| p.name.clone()));
        for name in names {
            let text = std::fs::read_to_string(self.log_path(&name)).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            out += &format!("--- {name}.log (last {lines} lines)\n");
            for l in &all[all.len().saturating_sub(lines)..] {
                out += l;
                out.push('\n');
            }
        }
        out
    }

    /// Copies every log (and any other file under the cluster's directory named `*.log`) to
    /// `to`, so evidence outlives the temporary directory.
    pub fn save_logs(&self, to: &Path) {
        let _ = std::fs::create_dir_all(to);
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    let _ = std::fs::copy(&p, to.join(e.file_name()));
                }
            }
        }
    }

    /// Sends `signal` to every process of the cluster.
    pub fn signal_all(&self, signal: i32) {
        for p in self.frontends.iter().chain(self.backends.values()).chain(self.managers.iter()) {
            p.signal(signal);
        }
    }

    /// kill -9 everything (resuming paused processes first).
    pub fn kill_all(&mut self) {
        for p in self.frontends.iter_mut().chain(self.backends.values_mut()).chain(self.managers.iter_mut()) {
            if p.paused {
                p.signal(libc::SIGCONT);
            }
            p.kill9();
        }
    }
}

/// The wall-clock time as the roles' logs print it (`2026-01-02T03:04:05.678901Z`), so that
/// harness markers line up with log lines.
pub fn utc_now() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = now.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        now.subsec_micros()
    )
}

fn placeholder() -> Proc {
    Proc {
        name: String::new(),
        prefix: Vec::new(),
        args: Vec::new(),
        env: Vec::new(),
        child: None,
        paused: false,
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// The sum of one `Status` counter over the processes at `addrs` that answer.
fn counter_sum<'a>(addrs: impl Iterator<Item = &'a String>, name: &str) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let pool = fawn_client::pool::Pool::new(Duration::from_secs(1));
        let mut total = 0;
        for addr in addrs {
            if let Ok(Response::Status(s)) = pool.call(addr, Request::Status, Duration::from_secs(2)).await {
                total += s.counters.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v);
            }
        }
        total
    })
}

/// The name (log file, data directory) of manager `i` of `count`: `manager` alone, else
/// `manager-<id>`.
fn manager_name(count: usize, i: usize) -> String {
    if count == 1 {
        "manager".to_string()
    } else {
        format!("manager-{}", i + 1)
    }
}
