//! Guards certificate rotation on the memcached TLS port: `refresh_certs` makes later
//! handshakes present the certificate now in the files, keeps open connections served, keeps
//! the certificate in use when the files are bad, and answers as memcached does (`OK`, quiet
//! under `noreply`; an `Error` line otherwise, also on a port without TLS); the TLS-only
//! general stats count failed handshakes and the time since the last refresh.

mod memcache_support;

use fawn_kv::memcache::MemcacheConfig;
use fawn_tls::{ClientTls, ClusterCa};
use memcache_support::tls::{connect_tls, connector, roundtrip, stats_reply, write_tls_files, WAIT};
use memcache_support::{show, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::CertificateDer;

/// The certificate the server presented on a fresh connection.
async fn served_certificate(server: &Server, ca: &ClusterCa) -> CertificateDer<'static> {
    let tls = connect_tls(server, &connector(ca, None)).await.expect("TLS handshake");
    let certs = tls.get_ref().1.peer_certificates().expect("the server presents a certificate");
    certs[0].clone().into_owned()
}

/// One general stat's value.
fn stat(stats: &str, name: &str) -> Option<u64> {
    let prefix = format!("STAT {name} ");
    stats.lines().find_map(|line| line.strip_prefix(&prefix)).map(|v| v.parse().expect("a number"))
}

#[tokio::test]
async fn refresh_certs_rotates_the_served_certificate() {
    let ca = ClusterCa::create("mctest").expect("CA");
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = write_tls_files(&ca, dir.path());
    let tls = ClientTls::load(&cert, &key, None).expect("TLS files");
    let server = Server::with_config(MemcacheConfig { tls: Some(tls), ..MemcacheConfig::default() }).await;
    let first = served_certificate(&server, &ca).await;
    let mut open = connect_tls(&server, &connector(&ca, None)).await.expect("TLS handshake");
    roundtrip(&mut open, b"set k 0 0 2\r\nv1\r\n", b"STORED\r\n").await;

    // New files: later handshakes present the new certificate; the open connection carries on.
    write_tls_files(&ca, dir.path());
    assert_eq!(served_certificate(&server, &ca).await, first, "served before refresh_certs");
    roundtrip(&mut open, b"refresh_certs\r\n", b"OK\r\n").await;
    let second = served_certificate(&server, &ca).await;
    assert_ne!(second, first, "refresh_certs did not take the new certificate");
    roundtrip(&mut open, b"get k\r\n", b"VALUE k 0 2\r\nv1\r\nEND\r\n").await;

    // Bad files: an error line, even under noreply, and the certificate in use is kept.
    std::fs::write(&cert, b"not a certificate\n").expect("spoil the certificate file");
    for request in [&b"refresh_certs\r\n"[..], b"refresh_certs noreply\r\n"] {
        open.write_all(request).await.expect("write");
        let line = read_line(&mut open).await;
        assert!(line.starts_with("Error loading the certificates: "), "reply: {line:?}");
    }
    assert_eq!(served_certificate(&server, &ca).await, second, "a bad file replaced the certificate");

    // Good files again, quietly.
    write_tls_files(&ca, dir.path());
    roundtrip(&mut open, b"refresh_certs noreply\r\nversion\r\n", b"VERSION ").await;
    let _version = read_line(&mut open).await;
    assert_ne!(served_certificate(&server, &ca).await, second, "the quiet refresh_certs did nothing");

    // TLS-only general stats: a plaintext client is a failed handshake; the refresh is recent.
    let mut plain = TcpStream::connect(server.addr).await.expect("connect");
    plain.write_all(b"version\r\n").await.expect("write");
    let mut ignored = Vec::new();
    let _ = tokio::time::timeout(WAIT, plain.read_to_end(&mut ignored)).await.expect("closed in time");
    let stats = stats_reply(&mut open, b"stats\r\n").await;
    assert!(stat(&stats, "ssl_handshake_errors").is_some_and(|n| n >= 1), "{stats}");
    // memcached's relative clock starts 60 s before its uptime: a refresh just now reads
    // under 60 only if it was counted.
    assert!(stat(&stats, "time_since_server_cert_refresh").is_some_and(|s| s < 60), "{stats}");
    server.shutdown().await;
}

#[tokio::test]
async fn refresh_certs_without_tls_is_an_error() {
    let server = Server::with_config(MemcacheConfig::default()).await;
    let mut conn = TcpStream::connect(server.addr).await.expect("connect");
    roundtrip(&mut conn, b"refresh_certs\r\n", b"Error TLS not enabled\r\n").await;
    let stats = stats_reply(&mut conn, b"stats\r\n").await;
    assert!(!stats.contains("ssl_handshake_errors"), "TLS-only stats on a plain port: {stats}");
    assert!(!stats.contains("time_since_server_cert_refresh"), "{stats}");
    server.shutdown().await;
}

/// One reply line, without its line end.
async fn read_line<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        let n =
            tokio::time::timeout(WAIT, stream.read(&mut byte)).await.expect("reply in time").expect("read");
        assert!(n > 0, "closed mid-line: {:?}", show(&line));
        line.push(byte[0]);
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).expect("text")
}
