//! Guards `fawn up --memcached-tls`: pymemcache, running the example of docs/OPERATIONS.md,
//! logs in and stores and reads a value over TLS, trusting the cluster CA; a plaintext client
//! on the same port is closed unanswered.
//!
//! Needs pymemcache: in `$FAWN_PYTHON`, else in the repository's `.venv` (which
//! `scripts/test.sh` makes), else in `python3`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Cluster, Shape};

const USER: &str = "tls-user";
const PASSWORD: &str = "tls-secret";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("FAWN_PYTHON") {
        return python.into();
    }
    let venv = repo().join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

#[test]
fn pymemcache_is_served_over_tls() {
    let example = repo().join("docs/examples/pymemcache_tls.py");
    let script = std::fs::read_to_string(&example).expect("the example");
    let operations = std::fs::read_to_string(repo().join("docs/OPERATIONS.md")).expect("OPERATIONS.md");
    assert!(operations.contains(&script), "docs/OPERATIONS.md must show {} as it is", example.display());

    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users");
    std::fs::write(&users, format!("{USER}:{PASSWORD}\n")).expect("user file");
    let args = ["--memcached-tls".to_string(), "--memcached-auth-file".into(), users.display().to_string()];
    let cluster = Cluster::start_with(Shape::default(), &args);
    let port = cluster.memcached_port.to_string();
    let ca = cluster.dir.join("tls/ca.pem");

    let run = Command::new(python())
        .arg(&example)
        .args(["127.0.0.1", &port, ca.to_str().expect("path"), USER, PASSWORD])
        .output()
        .expect("run python (set FAWN_PYTHON to an interpreter with pymemcache)");
    assert!(
        run.status.success() && run.stdout.starts_with(b"ok"),
        "the pymemcache example failed (does {} have pymemcache?): {run:?}\n{}",
        python().display(),
        cluster.role_logs()
    );

    let mut plain = TcpStream::connect(cluster.frontend_memcached(0)).expect("connect");
    plain.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    plain.write_all(b"version\r\n").expect("write");
    let mut got = Vec::new();
    let closed = plain.read_to_end(&mut got);
    assert!(
        !got.windows(7).any(|w| w == b"VERSION"),
        "a plaintext client was answered: {}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        closed.is_ok() || closed.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the plaintext connection was not closed: {closed:?}"
    );
}
