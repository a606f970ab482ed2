//! Guards TLS on the memcached port: a plaintext client is closed unanswered, a rustls client
//! that trusts the CA is served in the text and the binary protocol, logins included; with a
//! CA for clients, a client without a certificate of that CA is refused and one with it served;
//! `stats settings` describes the port's TLS.

mod memcache_support;

use std::sync::Arc;

use fawn_kv::memcache::auth::Users;
use fawn_kv::memcache::MemcacheConfig;
use fawn_tls::{ClientTls, ClusterCa, Identity, Role};
use memcache_support::tls::{connect_tls, connector, roundtrip, stats_settings, write_tls_files, WAIT};
use memcache_support::{bin_request, show, BinReply, Server};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn ca() -> ClusterCa {
    ClusterCa::create("mctest").expect("CA")
}

/// A server whose port is TLS with a certificate of `ca` for the loopback names.
async fn tls_server(ca: &ClusterCa, client_ca: Option<&str>, users: Option<Users>) -> Server {
    let names = fawn_tls::clients::memcached_names("127.0.0.1");
    let server = ca.issue_memcached(&names).expect("server certificate");
    let tls = ClientTls::new(&server.cert_pem, &server.key_pem, client_ca).expect("TLS config");
    let config = MemcacheConfig { tls: Some(tls), users: users.map(Arc::new), ..MemcacheConfig::default() };
    Server::with_config(config).await
}

/// Everything until the server closes (or resets) the connection.
async fn until_closed<S: AsyncRead + Unpin>(stream: &mut S) -> Vec<u8> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(WAIT, stream.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the server kept the connection open; got {:?}", show(&got));
    got
}

#[tokio::test]
async fn plaintext_is_closed_and_tls_clients_are_served() {
    let ca = ca();
    let users = Users::parse(b"alice:secret\n");
    let server = tls_server(&ca, None, Some(users)).await;

    // A plaintext client gets no reply, only (at most) a TLS alert, and the connection closed.
    let mut plain = TcpStream::connect(server.addr).await.expect("connect");
    plain.write_all(b"version\r\nget k\r\n").await.expect("write");
    let got = until_closed(&mut plain).await;
    assert!(!got.windows(7).any(|w| w == b"VERSION"), "plaintext answered: {:?}", show(&got));

    let connector = connector(&ca, None);
    let mut text = connect_tls(&server, &connector).await.expect("TLS handshake");
    roundtrip(&mut text, b"get k\r\n", b"CLIENT_ERROR unauthenticated\r\n").await;
    roundtrip(&mut text, b"set a 0 0 12\r\nalice secret\r\n", b"STORED\r\n").await;
    roundtrip(&mut text, b"set k 0 0 5\r\nhello\r\nget k\r\n", b"STORED\r\nVALUE k 0 5\r\nhello\r\nEND\r\n")
        .await;
    // A reply larger than TLS's record and buffer sizes arrives whole.
    let big = vec![b'x'; 300_000];
    let mut request = format!("set big 0 0 {}\r\n", big.len()).into_bytes();
    request.extend_from_slice(&big);
    request.extend_from_slice(b"\r\nget big\r\n");
    let mut want = b"STORED\r\n".to_vec();
    want.extend_from_slice(format!("VALUE big 0 {}\r\n", big.len()).as_bytes());
    want.extend_from_slice(&big);
    want.extend_from_slice(b"\r\nEND\r\n");
    roundtrip(&mut text, &request, &want).await;

    let mut binary = connect_tls(&server, &connector).await.expect("TLS handshake");
    let auth = bin_request(0x21, b"PLAIN", b"", b"\0alice\0secret", 0);
    roundtrip(&mut binary, &auth, &BinReply::plain(0x21, 0, b"Authenticated", 0)).await;
    let get = bin_request(0x00, b"k", b"", b"", 7);
    let found =
        BinReply { op: 0x00, status: 0, opaque: 7, cas: 0, extras: &[0; 4], key: b"", value: b"hello" };
    binary.write_all(&get).await.expect("write");
    let mut header = [0u8; 24];
    tokio::time::timeout(WAIT, binary.read_exact(&mut header)).await.expect("in time").expect("read");
    let mut body = vec![0u8; u32::from_be_bytes(header[8..12].try_into().expect("4 bytes")) as usize];
    binary.read_exact(&mut body).await.expect("body");
    // The cas is the server's; everything else as expected.
    let mut want = found.bytes();
    want[16..24].copy_from_slice(&header[16..24]);
    assert_eq!(show(&[&header[..], &body].concat()), show(&want));

    server.shutdown().await;
}

#[tokio::test]
async fn a_client_ca_makes_client_certificates_required() {
    let ca = ca();
    let server = tls_server(&ca, Some(ca.cert_pem()), None).await;

    // Without a certificate: TLS 1.3 completes the client's side of the handshake before the
    // server checks; the server's refusal then ends the connection unanswered.
    if let Ok(mut anonymous) = connect_tls(&server, &connector(&ca, None)).await {
        let _ = anonymous.write_all(b"version\r\n").await;
        let _ = anonymous.flush().await;
        let mut got = Vec::new();
        let read = tokio::time::timeout(WAIT, anonymous.read_to_end(&mut got)).await.expect("closed in time");
        assert!(
            read.is_err() || got.is_empty(),
            "a client without a certificate was served: {:?}",
            show(&got)
        );
    }

    // A certificate of another CA is refused the same way.
    let stranger = ClusterCa::create("other").expect("CA");
    let foreign = stranger.issue(&Identity::new("other", Role::Admin, 0).expect("id")).expect("cert");
    if let Ok(mut wrong) = connect_tls(&server, &connector(&ca, Some(&foreign))).await {
        let _ = wrong.write_all(b"version\r\n").await;
        let mut got = Vec::new();
        let read = tokio::time::timeout(WAIT, wrong.read_to_end(&mut got)).await.expect("closed in time");
        assert!(read.is_err() || got.is_empty(), "a certificate of another CA was served: {:?}", show(&got));
    }

    let client = ca.issue(&Identity::new("mctest", Role::Admin, 0).expect("id")).expect("cert");
    let mut good = connect_tls(&server, &connector(&ca, Some(&client))).await.expect("TLS handshake");
    roundtrip(&mut good, b"set k 0 0 2\r\nok\r\nget k\r\n", b"STORED\r\nVALUE k 0 2\r\nok\r\nEND\r\n").await;
    server.shutdown().await;
}

/// `stats settings` tells a client what memcached would: TLS on, the files it was started
/// with, and `ssl_verify_mode` 2 (a certificate required) with a client CA; a plain port
/// reads off.
#[tokio::test]
async fn stats_settings_describe_the_tls_port() {
    let ca = ca();
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = write_tls_files(&ca, dir.path());
    let client_ca = dir.path().join("ca.crt");
    std::fs::write(&client_ca, ca.cert_pem()).expect("write CA");
    let tls = ClientTls::load(&cert, &key, Some(&client_ca)).expect("TLS files");
    let server = Server::with_config(MemcacheConfig { tls: Some(tls), ..MemcacheConfig::default() }).await;
    let client = ca.issue(&Identity::new("mctest", Role::Admin, 0).expect("id")).expect("cert");
    let mut conn = connect_tls(&server, &connector(&ca, Some(&client))).await.expect("TLS handshake");
    let settings = stats_settings(&mut conn).await;
    let want = [
        ("ssl_enabled", "yes".to_string()),
        ("ssl_chain_cert", cert.display().to_string()),
        ("ssl_key", key.display().to_string()),
        ("ssl_verify_mode", "2".to_string()),
        ("ssl_ca_cert", client_ca.display().to_string()),
    ];
    for (name, value) in &want {
        assert!(settings.contains(&format!("STAT {name} {value}\r\n")), "{name}: {settings}");
    }
    server.shutdown().await;

    let plain = Server::with_config(MemcacheConfig::default()).await;
    let mut conn = TcpStream::connect(plain.addr).await.expect("connect");
    let settings = stats_settings(&mut conn).await;
    for line in
        ["ssl_enabled no", "ssl_chain_cert (null)", "ssl_key (null)", "ssl_verify_mode 0", "ssl_ca_cert NULL"]
    {
        assert!(settings.contains(&format!("STAT {line}\r\n")), "{line}: {settings}");
    }
    plain.shutdown().await;
}
