//! Guards every error path: the exact memcached error line, and what happens to the
//! connection after it (goes on; skips the refused data block; or closes when framing is lost).
//! A malformed request must never crash the server, hang, or drop a healthy connection.

mod memcache_support;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fawn_kv::memcache::MemcacheConfig;
use fawn_proto::memcache::Limits;
use memcache_support::Server;

#[tokio::test]
async fn unknown_commands_are_error_and_connection_goes_on() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"foo\r\n", b"ERROR\r\n").await;
    c.roundtrip(b"\r\n", b"ERROR\r\n").await;
    c.roundtrip(b"GET k\r\n", b"ERROR\r\n").await;
    c.roundtrip(b"get\r\n", b"ERROR\r\n").await;
    c.roundtrip(b"incr k\r\n", b"ERROR\r\n").await;
    c.roundtrip(b"version\r\n", b"VERSION 1.6.21-fawn-0.1.0\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn key_over_250_bytes_is_bad_format() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    let long = "k".repeat(251);
    let ok = "k".repeat(250);
    c.roundtrip(format!("get {long}\r\n").as_bytes(), b"CLIENT_ERROR bad command line format\r\n").await;
    // The data block is skipped, so the value is never read as a command.
    let set = format!("set {long} 0 0 9\r\nflush_all\r\n");
    c.roundtrip(set.as_bytes(), b"CLIENT_ERROR bad command line format\r\n").await;
    c.roundtrip(format!("set {ok} 0 0 1\r\na\r\n").as_bytes(), b"STORED\r\n").await;
    c.roundtrip(format!("delete {long}\r\n").as_bytes(), b"CLIENT_ERROR bad command line format\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn bad_numbers_in_commands() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set k x 0 1\r\na\r\n", b"CLIENT_ERROR bad command line format\r\n").await;
    c.roundtrip(b"set k -1 0 1\r\na\r\n", b"CLIENT_ERROR bad command line format\r\n").await;
    c.roundtrip(b"cas k 0 0 1 x\r\na\r\n", b"CLIENT_ERROR bad command line format\r\n").await;
    c.roundtrip(b"incr k x\r\n", b"CLIENT_ERROR invalid numeric delta argument\r\n").await;
    c.roundtrip(b"decr k -1\r\n", b"CLIENT_ERROR invalid numeric delta argument\r\n").await;
    c.roundtrip(b"touch k x\r\n", b"CLIENT_ERROR invalid exptime argument\r\n").await;
    c.roundtrip(b"gat x k\r\n", b"CLIENT_ERROR invalid exptime argument\r\n").await;
    c.roundtrip(b"flush_all x\r\n", b"CLIENT_ERROR invalid exptime argument\r\n").await;
    c.roundtrip(b"verbosity x\r\n", b"CLIENT_ERROR bad command line format\r\n").await;
    let usage = b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n";
    c.roundtrip(b"delete k 1\r\n", usage).await;
    // Under noreply memcached stays silent even about these.
    c.send(b"set k x 0 1 noreply\r\na\r\nincr k x noreply\r\n").await;
    c.roundtrip(b"mn\r\n", b"MN\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn non_numeric_incr() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set k 0 0 3\r\nabc\r\n", b"STORED\r\n").await;
    let want = b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
    c.roundtrip(b"incr k 1\r\n", want).await;
    c.roundtrip(b"decr k 1\r\n", want).await;
    server.shutdown().await;
}

#[tokio::test]
async fn bad_data_chunk_closes_the_connection() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    // Data block longer than declared: framing is lost.
    c.roundtrip(b"set k 0 0 1\r\nab\r\n", b"CLIENT_ERROR bad data chunk\r\n").await;
    c.expect_closed().await;
    // Nothing was stored, and the server still serves others.
    let mut d = server.connect().await;
    d.roundtrip(b"get k\r\n", b"END\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn unknowable_length_closes_the_connection() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set k 0 0 -1\r\nabc\r\n", b"CLIENT_ERROR bad command line format\r\n").await;
    c.expect_closed().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set k 0 0\r\nabc\r\n", b"ERROR\r\n").await;
    c.expect_closed().await;
    server.shutdown().await;
}

#[tokio::test]
async fn object_too_large_is_swallowed_and_unlinks_old_value() {
    let config =
        MemcacheConfig { limits: Limits { max_value: 10, ..Limits::default() }, ..MemcacheConfig::default() };
    let server = Server::with_config(config).await;
    let mut c = server.connect().await;
    c.roundtrip(b"set k 0 0 2\r\nok\r\n", b"STORED\r\n").await;
    // Sent in pieces: the refused block is discarded as it arrives, never buffered whole.
    c.send(b"set k 0 0 11\r\nhello").await;
    c.expect(b"SERVER_ERROR object too large for cache\r\n").await;
    c.send(b" world\r\n").await;
    // Like memcached, the failed set removed the stale value; framing was kept.
    c.roundtrip(b"get k\r\n", b"END\r\n").await;
    c.roundtrip(b"add k 0 0 11 noreply\r\nhello world\r\nmn\r\n", b"MN\r\n").await;
    c.roundtrip(b"ms k 11\r\nhello world\r\n", b"SERVER_ERROR object too large for cache\r\n").await;
    c.roundtrip(b"set k 0 0 10\r\n0123456789\r\n", b"STORED\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn line_too_long_closes_the_connection() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.send(&[b'x'; 4000]).await;
    c.expect(b"CLIENT_ERROR line too long\r\n").await;
    c.expect_closed().await;
    // A multi-get may be long.
    let mut c = server.connect().await;
    let keys: String = (0..1000).map(|i| format!(" key{i}")).collect();
    c.roundtrip(format!("get{keys}\r\n").as_bytes(), b"END\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn cluster_failure_is_server_error_and_connection_survives() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set k 0 0 1\r\na\r\n", b"STORED\r\n").await;
    server.service.fail.store(true, Ordering::SeqCst);
    let err = b"SERVER_ERROR unavailable: no chain for range\r\n";
    c.roundtrip(b"get k\r\n", err).await;
    c.roundtrip(b"set k 0 0 1\r\nb\r\n", err).await;
    c.roundtrip(b"incr k 1\r\n", err).await;
    c.roundtrip(b"delete k\r\n", err).await;
    c.roundtrip(b"touch k 1\r\n", err).await;
    c.roundtrip(b"flush_all\r\n", err).await;
    c.roundtrip(b"stats\r\n", err).await;
    c.roundtrip(b"mg k v\r\n", err).await;
    // noreply requests stay silent, as the client reads nothing for them.
    c.send(b"set k 0 0 1 noreply\r\nb\r\n").await;
    c.roundtrip(b"mn\r\n", b"MN\r\n").await;
    server.service.fail.store(false, Ordering::SeqCst);
    c.roundtrip(b"get k\r\n", b"VALUE k 0 1\r\na\r\nEND\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn too_many_connections_are_refused_like_memcached() {
    let config = MemcacheConfig { max_connections: 2, ..MemcacheConfig::default() };
    let server = Server::with_config(config).await;
    let mut a = server.connect().await;
    let mut b = server.connect().await;
    a.roundtrip(b"mn\r\n", b"MN\r\n").await;
    b.roundtrip(b"mn\r\n", b"MN\r\n").await;
    let mut c = server.connect().await;
    c.expect(b"SERVER_ERROR too many open connections\r\n").await;
    c.expect_closed().await;
    assert_eq!(a.stat("rejected_connections").await, "1");
    drop(b);
    // The freed slot is usable again.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut d = server.connect().await;
    d.roundtrip(b"mn\r\n", b"MN\r\n").await;
    server.shutdown().await;
}
