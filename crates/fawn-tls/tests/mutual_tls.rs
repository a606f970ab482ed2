//! Guards the cluster's mutual TLS over real loopback TCP: processes with certificates of the
//! cluster's CA connect and learn each other's identity; a client without a certificate, with
//! one of another cluster's CA, or a server of another cluster is refused; credentials survive
//! a save and load with private keys readable by their owner only.

use std::os::unix::fs::PermissionsExt;

use fawn_tls::{ClusterCa, Identity, Role, TlsSetup};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::ServerName;

fn setup(ca: &ClusterCa, role: Role, node: u32) -> TlsSetup {
    let identity = Identity::new(ca.cluster(), role, node).expect("identity");
    let credentials = ca.issue(&identity).expect("issue");
    TlsSetup::new(ca.cert_pem(), &credentials, identity).expect("setup")
}

/// Runs one handshake; returns what each side learned of the other, or the first error.
async fn handshake(server: &TlsSetup, client: &TlsSetup) -> Result<(Identity, Identity), String> {
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let acceptor = server.acceptor().clone();
    let server_side = server.clone();
    let accepted = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let mut tls = acceptor.accept(tcp).await.map_err(|e| format!("server: {e}"))?;
        let peer =
            server_side.peer_identity(tls.get_ref().1.peer_certificates()).map_err(|e| e.to_string())?;
        let mut ping = [0u8; 4];
        tls.read_exact(&mut ping).await.map_err(|e| e.to_string())?;
        tls.write_all(b"pong").await.map_err(|e| e.to_string())?;
        tls.flush().await.map_err(|e| e.to_string())?;
        Ok::<_, String>(peer)
    });
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let connected = client.connector().connect(client.server_name(), tcp).await;
    let mut tls = match connected {
        Ok(tls) => tls,
        Err(e) => {
            accepted.abort();
            return Err(format!("client: {e}"));
        }
    };
    let seen_by_client =
        client.peer_identity(tls.get_ref().1.peer_certificates()).map_err(|e| e.to_string())?;
    tls.write_all(b"ping").await.map_err(|e| e.to_string())?;
    let mut pong = [0u8; 4];
    let read = tls.read_exact(&mut pong).await.map_err(|e| format!("client read: {e}"));
    let seen_by_server = accepted.await.map_err(|e| e.to_string())??;
    read?;
    assert_eq!(&pong, b"pong");
    Ok((seen_by_server, seen_by_client))
}

#[tokio::test]
async fn members_of_one_cluster_connect_and_know_each_other() {
    let ca = ClusterCa::create("alpha").expect("ca");
    let backend = setup(&ca, Role::Backend, 3);
    let frontend = setup(&ca, Role::Frontend, 0);
    let (seen_by_server, seen_by_client) = handshake(&backend, &frontend).await.expect("handshake");
    assert_eq!(seen_by_server, Identity::new("alpha", Role::Frontend, 0).expect("id"));
    assert_eq!(seen_by_client, Identity::new("alpha", Role::Backend, 3).expect("id"));
}

#[tokio::test]
async fn a_client_of_another_cluster_is_refused() {
    let ca = ClusterCa::create("alpha").expect("ca");
    let other = ClusterCa::create("alpha").expect("a second CA claiming the same name");
    let server = setup(&ca, Role::Backend, 1);
    let intruder = setup(&other, Role::Manager, 0);
    assert!(handshake(&server, &intruder).await.is_err(), "a certificate of another CA was accepted");
}

#[tokio::test]
async fn a_server_of_another_cluster_is_refused() {
    let ca = ClusterCa::create("alpha").expect("ca");
    let other = ClusterCa::create("beta").expect("ca");
    let impostor = setup(&other, Role::Backend, 1);
    let client = setup(&ca, Role::Frontend, 0);
    let error = handshake(&impostor, &client).await.expect_err("an impostor server was trusted");
    assert!(error.contains("client"), "{error}");
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let ca = ClusterCa::create("alpha").expect("ca");
    let server = setup(&ca, Role::Backend, 1);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let acceptor = server.acceptor().clone();
    let accepted = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        acceptor.accept(tcp).await.map(|_| ())
    });
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    let ca_der = tokio_rustls::rustls::pki_types::pem::PemObject::from_pem_slice(ca.cert_pem().as_bytes())
        .expect("ca der");
    roots.add(ca_der).expect("root");
    let anonymous = tokio_rustls::rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(anonymous));
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from("alpha.fawn").expect("name");
    // TLS 1.3 lets the client finish before the server checks it: the refusal shows on the
    // server, and on the client's first read.
    if let Ok(mut tls) = connector.connect(name, tcp).await {
        let _ = tls.write_all(b"ping").await;
        let mut buf = [0u8; 4];
        assert!(tls.read_exact(&mut buf).await.is_err(), "an anonymous client was served");
    }
    assert!(accepted.await.expect("join").is_err(), "the server accepted a client without a certificate");
}

#[test]
fn credentials_survive_save_and_load_with_private_keys_kept_private() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = ClusterCa::create("alpha").expect("ca");
    ca.save(dir.path()).expect("save ca");
    let identity = Identity::new("alpha", Role::Admin, 0).expect("id");
    ca.issue(&identity).expect("issue").save(dir.path(), &identity).expect("save credentials");
    for key in ["ca.key", "admin-0.key"] {
        let mode = std::fs::metadata(dir.path().join(key)).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }
    let loaded = ClusterCa::load(dir.path()).expect("load ca");
    assert_eq!(loaded.cluster(), "alpha");
    let setup = TlsSetup::load(dir.path(), identity.clone()).expect("load setup");
    assert_eq!(setup.identity(), &identity);
    let reissued = loaded.issue(&Identity::new("alpha", Role::Backend, 2).expect("id"));
    assert!(reissued.is_ok(), "a loaded CA can issue");
    assert!(
        loaded.issue(&Identity::new("beta", Role::Backend, 2).expect("id")).is_err(),
        "issued for another cluster"
    );

    std::fs::set_permissions(dir.path().join("admin-0.key"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    assert!(TlsSetup::load(dir.path(), identity.clone()).is_err(), "a world-readable key was used");
    let wrong = Identity::new("alpha", Role::Admin, 1).expect("id");
    std::fs::copy(dir.path().join("admin-0.pem"), dir.path().join("admin-1.pem")).expect("copy");
    std::fs::copy(dir.path().join("ca.key"), dir.path().join("admin-1.key")).expect("copy");
    assert!(TlsSetup::load(dir.path(), wrong).is_err(), "a certificate was accepted for another identity");
}
