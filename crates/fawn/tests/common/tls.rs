//! One cluster CA for every cluster a test binary starts, and this test process talking to
//! them as its admin: tests in one binary run at once, and a process has one transport.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use fawn_tls::{ClusterCa, Role, TlsSetup};

/// The name of the test clusters' CA.
pub const TEST_CLUSTER: &str = "test";

/// The shared CA's directory (`ca.pem`, `ca.key`, `admin-0.*`), made on first use; from then
/// on this process's native connections are mutual TLS as admin 0.
pub fn shared_ca_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir").keep();
        ClusterCa::ensure(&dir, TEST_CLUSTER, &[(Role::Admin, 0)]).expect("test CA");
        let admin = TlsSetup::load_as(&dir, Role::Admin, 0).expect("admin credentials");
        fawn_client::transport::set(fawn_client::transport::Transport::Tls(admin));
        dir
    })
}

/// Puts the shared CA into `tls_dir` (a cluster's `--tls-dir`) and issues `members` there.
pub fn provision(tls_dir: &Path, members: &[(Role, u32)]) {
    let shared = shared_ca_dir();
    if !tls_dir.join("ca.pem").exists() {
        std::fs::create_dir_all(tls_dir).expect("tls dir");
        let ca = ClusterCa::load(shared).expect("load test CA");
        ca.save(tls_dir).expect("copy test CA");
    }
    ClusterCa::ensure(tls_dir, TEST_CLUSTER, members).expect("certificates");
}
