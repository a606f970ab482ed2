//! The command lines that start each role as a process: the one place that knows which flags a
//! manager, a back-end and a front-end are started with. `fawn up` ([`crate::local`]), the
//! benchmarks' clusters and the multi-process tests all build their processes from these, so a
//! new flag a role needs is added once.

use std::path::PathBuf;

/// The ring every manager of a cluster is started with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingShape {
    pub backends: u32,
    pub frontends: u32,
    pub replicas: u32,
    pub vnodes: u32,
}

/// `fawn manager`.
#[derive(Clone, Debug)]
pub struct ManagerCommand {
    pub listen: String,
    /// Every manager of a new group, comma-separated (`None`: a group of this one alone).
    pub group: Option<String>,
    pub data_dir: PathBuf,
    pub ring: RingShape,
    /// `--tls-dir` (`None`: `--plaintext`).
    pub tls_dir: Option<PathBuf>,
}

impl ManagerCommand {
    pub fn args(&self) -> Vec<String> {
        let mut args = vec!["manager".to_string(), "--listen".into(), self.listen.clone()];
        if let Some(group) = &self.group {
            args.extend(["--managers".into(), group.clone()]);
        }
        args.extend([
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--backends".into(),
            self.ring.backends.to_string(),
            "--frontends".into(),
            self.ring.frontends.to_string(),
            "--replicas".into(),
            self.ring.replicas.to_string(),
            "--vnodes".into(),
            self.ring.vnodes.to_string(),
        ]);
        with_transport(args, self.tls_dir.as_deref())
    }
}

/// `fawn backend`.
#[derive(Clone, Debug)]
pub struct BackendCommand {
    pub node: u32,
    pub listen: String,
    /// The address others reach it at, when not `listen`.
    pub advertise: Option<String>,
    /// The managers' addresses, comma-separated.
    pub managers: String,
    pub data_dir: PathBuf,
    /// `always`, `never` or `interval:MS`.
    pub sync: String,
    pub expected_keys: Option<u64>,
    /// `--tls-dir` (`None`: `--plaintext`).
    pub tls_dir: Option<PathBuf>,
}

impl BackendCommand {
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "backend".to_string(),
            "--node".into(),
            self.node.to_string(),
            "--listen".into(),
            self.listen.clone(),
            "--manager".into(),
            self.managers.clone(),
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--sync".into(),
            self.sync.clone(),
        ];
        if let Some(advertise) = &self.advertise {
            args.extend(["--advertise".into(), advertise.clone()]);
        }
        if let Some(keys) = self.expected_keys {
            args.extend(["--expected-keys".into(), keys.to_string()]);
        }
        with_transport(args, self.tls_dir.as_deref())
    }
}

/// `fawn frontend`.
#[derive(Clone, Debug)]
pub struct FrontendCommand {
    pub id: u32,
    /// The native-protocol address.
    pub listen: String,
    pub memcached: String,
    /// The managers' addresses, comma-separated.
    pub managers: String,
    pub data_dir: PathBuf,
    pub cache_entries: Option<u64>,
    pub request_timeout_ms: Option<u64>,
    pub memcached_auth_file: Option<PathBuf>,
    /// TLS on the memcached port (`None`: plain TCP).
    pub memcached_tls: Option<MemcachedTlsFiles>,
    /// `--tls-dir` (`None`: `--plaintext`).
    pub tls_dir: Option<PathBuf>,
}

/// A front-end's `--memcached-tls-cert` and `--memcached-tls-key`.
#[derive(Clone, Debug)]
pub struct MemcachedTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl FrontendCommand {
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "frontend".to_string(),
            "--id".into(),
            self.id.to_string(),
            "--listen".into(),
            self.listen.clone(),
            "--memcached".into(),
            self.memcached.clone(),
            "--manager".into(),
            self.managers.clone(),
            "--data-dir".into(),
            self.data_dir.display().to_string(),
        ];
        if let Some(entries) = self.cache_entries {
            args.extend(["--cache-entries".into(), entries.to_string()]);
        }
        if let Some(ms) = self.request_timeout_ms {
            args.extend(["--request-timeout-ms".into(), ms.to_string()]);
        }
        if let Some(path) = &self.memcached_auth_file {
            args.extend(["--memcached-auth-file".into(), path.display().to_string()]);
        }
        if let Some(tls) = &self.memcached_tls {
            args.extend(["--memcached-tls-cert".into(), tls.cert.display().to_string()]);
            args.extend(["--memcached-tls-key".into(), tls.key.display().to_string()]);
        }
        with_transport(args, self.tls_dir.as_deref())
    }
}

/// Adds `--tls-dir DIR` to a role's command line, or `--plaintext` without one: a role
/// refuses to start with neither.
fn with_transport(mut args: Vec<String>, tls_dir: Option<&std::path::Path>) -> Vec<String> {
    match tls_dir {
        Some(dir) => args.extend(["--tls-dir".into(), dir.display().to_string()]),
        None => args.push("--plaintext".into()),
    }
    args
}

/// Adds `--metrics ADDR` to a role's command line.
pub fn with_metrics(mut args: Vec<String>, addr: Option<String>) -> Vec<String> {
    if let Some(addr) = addr {
        args.extend(["--metrics".into(), addr]);
    }
    args
}
