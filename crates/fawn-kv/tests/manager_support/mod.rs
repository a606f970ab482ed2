//! Shared by the `manager_*` tests: a group of three real managers over real TCP, in this
//! process, each with its own data directory.

use std::sync::Arc;
use std::time::Duration;

use fawn_kv::manager::{raft, Manager, ManagerOptions};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// A running group; dropping it stops the managers' listeners and removes their data.
pub struct Group {
    pub addrs: Vec<String>,
    pub managers: Vec<Arc<Manager>>,
    _stop: watch::Sender<bool>,
    _dir: TempDir,
}

/// Starts three managers forming a ring of `expected_backends` back-ends (R = 3, 2 virtual
/// ids each, one front-end), whose failure detector runs every `heartbeat` and fails a node
/// after `fd_threshold` silent beats.
pub async fn start(expected_backends: usize, heartbeat: Duration, fd_threshold: u32) -> Group {
    let dir = tempfile::tempdir().expect("tempdir");
    let (stop, shutdown) = watch::channel(false);
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.expect("bind manager"));
    }
    let addrs: Vec<String> = listeners.iter().map(|l| l.local_addr().expect("addr").to_string()).collect();
    let mut managers = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let m = Manager::open(ManagerOptions {
            group: addrs.clone(),
            id: i as u64 + 1,
            snapshot_every: raft::SNAPSHOT_EVERY_ENTRIES,
            data_dir: dir.path().join(format!("manager-{}", i + 1)),
            expected_backends,
            replicas: 3,
            vnodes: 2,
            expected_frontends: 1,
            heartbeat,
            fd_threshold,
        })
        .await
        .expect("open manager");
        tokio::spawn(m.clone().serve(listener, shutdown.clone()));
        managers.push(m);
    }
    Group { addrs, managers, _stop: stop, _dir: dir }
}

impl Group {
    /// The index of the manager that leads, once one does and every manager knows it (at
    /// most 30 s). One that believes it leads is not enough: a leader deposed by an election
    /// it has not heard of yet still believes it does.
    pub async fn leader(&self) -> usize {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let agreed =
                |i: &usize| self.managers.iter().all(|m| m.known_leader().as_ref() == Some(&self.addrs[*i]));
            if let Some(i) = (0..self.managers.len()).filter(|i| self.managers[*i].is_leader()).find(agreed) {
                return i;
            }
            assert!(std::time::Instant::now() < deadline, "no manager leads");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
