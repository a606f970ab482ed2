//! TLS clients for the memcached port's tests: a rustls client trusting a test CA, and the
//! certificate files a server loads.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fawn_tls::ClusterCa;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use super::{show, Server};

/// How long a handshake or a reply may take before a test fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// Issues a memcached server certificate of `ca` for the loopback names and writes it to
/// `dir` as `mc.crt` and `mc.key` (owner-only, as `ClientTls::load` requires).
pub fn write_tls_files(ca: &ClusterCa, dir: &Path) -> (PathBuf, PathBuf) {
    let creds = ca.issue_memcached(&fawn_tls::clients::memcached_names("127.0.0.1")).expect("cert");
    let (cert, key) = (dir.join("mc.crt"), dir.join("mc.key"));
    std::fs::write(&cert, &creds.cert_pem).expect("write cert");
    std::fs::write(&key, &creds.key_pem).expect("write key");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    (cert, key)
}

/// A client trusting `ca`, presenting `credentials` if given.
pub fn connector(ca: &ClusterCa, credentials: Option<&fawn_tls::Credentials>) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).expect("CA PEM")).expect("root");
    let builder = ClientConfig::builder().with_root_certificates(roots);
    let config = match credentials {
        Some(c) => {
            let cert = CertificateDer::from_pem_slice(c.cert_pem.as_bytes()).expect("cert PEM");
            let key = PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).expect("key PEM");
            builder.with_client_auth_cert(vec![cert], key).expect("client cert")
        }
        None => builder.with_no_client_auth(),
    };
    TlsConnector::from(Arc::new(config))
}

pub async fn connect_tls(
    server: &Server,
    connector: &TlsConnector,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(server.addr).await?;
    let name = ServerName::IpAddress(server.addr.ip().into());
    tokio::time::timeout(WAIT, connector.connect(name, tcp)).await.expect("handshake in time")
}

/// Sends `request` and reads exactly `want.len()` bytes back.
pub async fn roundtrip<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, request: &[u8], want: &[u8]) {
    stream.write_all(request).await.expect("write");
    stream.flush().await.expect("flush");
    let mut got = vec![0u8; want.len()];
    tokio::time::timeout(WAIT, stream.read_exact(&mut got)).await.expect("reply in time").expect("read");
    assert_eq!(show(&got), show(want));
}

/// The reply to `stats settings`, up to its `END`.
pub async fn stats_settings<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) -> String {
    stats_reply(stream, b"stats settings\r\n").await
}

/// The reply to a `stats` request, up to its `END`.
pub async fn stats_reply<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, request: &[u8]) -> String {
    stream.write_all(request).await.expect("write");
    stream.flush().await.expect("flush");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"END\r\n") {
        let n =
            tokio::time::timeout(WAIT, stream.read(&mut buf)).await.expect("reply in time").expect("read");
        assert!(n > 0, "closed before END: {:?}", show(&got));
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(got).expect("text")
}
