//! Guards rotating the cluster CA and every certificate without a restart (SIGHUP reloads a
//! process's native TLS credentials): a TLS cluster with data (1 manager, 3 back-ends, 1
//! front-end) first trusts a second CA of its cluster next to the first (`ca.pem` holds both),
//! then gets every certificate from the second, then trusts the second alone, each step one
//! SIGHUP to every process. An admin of the new CA is served once both are trusted, one of the
//! old CA until the old CA is dropped and refused after it; then a back-end killed with
//! kill -9 and restarted rejoins its chains over handshakes of the new CA alone, and every
//! write reads back.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::procs::{start_filled, ProcShape, Procs};
use common::tls::{shared_ca_dir, TEST_CLUSTER};
use fawn_client::transport::{self, Transport};
use fawn_proto::native::{NodeState, Request, Response};
use fawn_tls::{ClusterCa, Identity, Role, TlsSetup};

const KEYS: u32 = 300;
const VICTIM: u32 = 2;

/// Every process of the cluster, as the certificates name them.
fn members() -> Vec<(Role, u32)> {
    vec![(Role::Manager, 1), (Role::Backend, 0), (Role::Backend, 1), (Role::Backend, 2), (Role::Frontend, 0)]
}

/// Sends SIGHUP to every process and waits until each has logged one more reload.
fn hangup_all(procs: &Procs, reloads_before: &mut usize) {
    procs.signal_all(libc::SIGHUP);
    let want = *reloads_before + members().len();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logs = procs.logs(100_000);
        assert!(!logs.contains("SIGHUP: reload failed"), "a reload failed:\n{logs}");
        let done = logs.matches("SIGHUP: reloaded").count();
        if done >= want {
            *reloads_before = done;
            return;
        }
        assert!(Instant::now() < deadline, "{done} of {want} reloads logged:\n{}", procs.logs(40));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Uses an admin certificate of `ca` that trusts `trusted` (a CA bundle) for this process's
/// new native connections.
fn use_admin(dir: &Path, ca: &ClusterCa, trusted: &str) {
    std::fs::create_dir_all(dir).expect("admin dir");
    std::fs::write(dir.join("ca.pem"), trusted).expect("admin ca.pem");
    let admin = Identity::new(TEST_CLUSTER, Role::Admin, 0).expect("identity");
    ca.issue(&admin).expect("issue admin").save(dir, &admin).expect("save admin");
    transport::set(Transport::Tls(TlsSetup::load_as(dir, Role::Admin, 0).expect("admin setup")));
}

/// Whether the process at `addr` answers a status request on a new connection.
fn answers(addr: &str) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    rt.block_on(async {
        let pool = fawn_client::pool::Pool::new(Duration::from_secs(2));
        matches!(pool.call(addr, Request::Status, Duration::from_secs(5)).await, Ok(Response::Status(_)))
    })
}

#[test]
fn the_ca_and_every_certificate_rotate_without_a_restart() {
    let shape = ProcShape { tls: true, ..ProcShape::default() };
    let (mut procs, rt, _client, want) = start_filled(shape, KEYS);
    let tls = procs.tls_dir().expect("tls dir");
    let config = procs.config().expect("config");
    let mut addrs: Vec<String> = config.backends.iter().map(|b| b.addr.clone()).collect();
    addrs.push(procs.manager_addr.clone());
    let old_pem = std::fs::read_to_string(tls.join("ca.pem")).expect("ca.pem");
    let old_ca = ClusterCa::load(shared_ca_dir()).expect("old CA");
    let new_ca = ClusterCa::create(TEST_CLUSTER).expect("new CA");
    let mut reloads = 0;

    // 1. Both CAs trusted everywhere.
    let both = format!("{old_pem}{}", new_ca.cert_pem());
    std::fs::write(tls.join("ca.pem"), &both).expect("bundle");
    hangup_all(&procs, &mut reloads);
    use_admin(&procs.dir.join("admin-new"), &new_ca, &both);
    for addr in &addrs {
        assert!(answers(addr), "{addr} trusts the new CA next to the old one");
    }
    // 2. Every process's certificate from the new CA.
    for (role, id) in members() {
        let identity = Identity::new(TEST_CLUSTER, role, id).expect("identity");
        new_ca.issue(&identity).expect("issue").save(&tls, &identity).expect("save");
    }
    hangup_all(&procs, &mut reloads);
    use_admin(&procs.dir.join("admin-old"), &old_ca, &both);
    for addr in &addrs {
        assert!(answers(addr), "{addr} still trusts the old CA and presents a certificate of the new one");
    }
    // 3. The new CA alone.
    std::fs::write(tls.join("ca.pem"), new_ca.cert_pem()).expect("new ca.pem");
    hangup_all(&procs, &mut reloads);

    for addr in &addrs {
        assert!(!answers(addr), "{addr} refuses an admin of the old CA after the rotation");
    }
    use_admin(&procs.dir.join("admin-new"), &new_ca, new_ca.cert_pem());
    for addr in &addrs {
        assert!(answers(addr), "{addr} serves an admin of the new CA");
    }

    procs.kill9(VICTIM);
    procs.restart_backend(VICTIM);
    let settled = procs.wait_config_installed("the victim is back in its chains", |c| {
        c.epoch > 0
            && c.backends.iter().all(|b| b.state == NodeState::Alive)
            && c.ranges
                .iter()
                .all(|r| r.syncing.is_empty() && r.unproven_tail.is_none() && r.chain.len() == 3)
    });
    let client = rt.block_on(procs.client(fawn_client::ClientOptions::default()));
    rt.block_on(common::assert_every_write_held(&client, &want, &settled));
    procs.kill_all();
}
