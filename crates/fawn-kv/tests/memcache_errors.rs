//! Guards every error path: the exact memcached error line, and what happens to the
//! connection after it (goes on with the next line; skips a refused data block; or closes, as
//! memcached 1.6.18 does for HTTP requests and overlong partial lines). Every expected reply
//! here was observed from Debian's memcached 1.6.18. A malformed request must never crash
//! the server, hang, or drop a healthy connection.

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
    // As memcached: the data line is then read as a command.
    let set = format!("set {long} 0 0 3\r\nabc\r\n");
    c.roundtrip(set.as_bytes(), b"CLIENT_ERROR bad command line format\r\nERROR\r\n").await;
    c.roundtrip(format!("set {long} 0 0 3 noreply\r\nabc\r\n").as_bytes(), b"ERROR\r\n").await;
    c.roundtrip(format!("set {ok} 0 0 1\r\na\r\n").as_bytes(), b"STORED\r\n").await;
    c.roundtrip(format!("delete {long}\r\n").as_bytes(), b"CLIENT_ERROR bad command line format\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn bad_numbers_in_commands() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    let bad_then_error = b"CLIENT_ERROR bad command line format\r\nERROR\r\n";
    c.roundtrip(b"set k x 0 1\r\na\r\n", bad_then_error).await;
    c.roundtrip(b"set k -1 0 1\r\na\r\n", bad_then_error).await;
    c.roundtrip(b"cas k 0 0 1 x\r\na\r\n", bad_then_error).await;
    c.roundtrip(b"incr k x\r\n", b"CLIENT_ERROR invalid numeric delta argument\r\n").await;
    c.roundtrip(b"decr k -1\r\n", b"CLIENT_ERROR invalid numeric delta argument\r\n").await;
    c.roundtrip(b"touch k x\r\n", b"CLIENT_ERROR invalid exptime argument\r\n").await;
    c.roundtrip(b"gat x k\r\n", b"CLIENT_ERROR invalid exptime argument\r\n").await;
    c.roundtrip(b"flush_all x\r\n", b"CLIENT_ERROR invalid exptime argument\r\n").await;
    c.roundtrip(b"verbosity x\r\n", b"CLIENT_ERROR bad command line format\r\n").await;
    let usage = b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n";
    c.roundtrip(b"delete k 1\r\n", usage).await;
    // Under noreply memcached stays silent about these, but still reads the data line as a
    // command.
    c.send(b"set k x 0 1 noreply\r\na\r\nincr k x noreply\r\n").await;
    c.roundtrip(b"mn\r\n", b"ERROR\r\nMN\r\n").await;
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
async fn bad_data_chunk_drops_the_block_and_goes_on() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set k 0 0 1\r\nz\r\n", b"STORED\r\n").await;
    // memcached takes `len + 2` bytes as the block ("abc" + "de"), refuses it, and reads on:
    // the leftover "\r\n" is an empty command line.
    let want = b"CLIENT_ERROR bad data chunk\r\nERROR\r\nVALUE k 0 1\r\nz\r\nEND\r\n";
    c.roundtrip(b"set k 0 0 3\r\nabcde\r\nget k\r\n", want).await;
    // Under noreply only the error is silent.
    c.roundtrip(b"set k 0 0 1 noreply\r\nab\r\nmn\r\n", b"ERROR\r\nMN\r\n").await;
    // `ms` reports it even in quiet mode.
    let want = b"CLIENT_ERROR bad data chunk\r\nERROR\r\nMN\r\n";
    c.roundtrip(b"ms k 2 q\r\nabc\r\nmn\r\n", want).await;
    server.shutdown().await;
}

#[tokio::test]
async fn malformed_storage_lines_keep_the_connection() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    let bad_then_error = b"CLIENT_ERROR bad command line format\r\nERROR\r\nMN\r\n";
    let error_twice = b"ERROR\r\nERROR\r\nMN\r\n";
    c.roundtrip(b"set k 0 0 -1\r\nab\r\nmn\r\n", bad_then_error).await;
    c.roundtrip(b"set k 0 0 4294967295\r\nab\r\nmn\r\n", bad_then_error).await;
    c.roundtrip(b"set k 0 0 2147483646\r\nab\r\nmn\r\n", bad_then_error).await;
    c.roundtrip(b"ms k x\r\nab\r\nmn\r\n", bad_then_error).await;
    // Too few or too many tokens, and `cas` without its unique: `ERROR`, twice.
    c.roundtrip(b"set k 0 0\r\nab\r\nmn\r\n", error_twice).await;
    c.roundtrip(b"cas k 0 0 2\r\nab\r\nmn\r\n", error_twice).await;
    c.roundtrip(b"set k 0 0 3 noreply extra\r\nabc\r\nmn\r\n", error_twice).await;
    // memcached truncates a 64-bit length into 32 bits: 4294967297 reads as 1.
    c.roundtrip(b"set k 0 0 4294967297\r\na\r\nget k\r\n", b"STORED\r\nVALUE k 0 1\r\na\r\nEND\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn http_request_line_closes_at_once() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.send(b"GET / HTTP/1.0\r\n\r\n").await;
    c.expect_closed().await;
    let mut c = server.connect().await;
    c.roundtrip(b"gxx / HTTP/1.0\r\n", b"ERROR\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn object_too_large_is_swallowed_and_unlinks_old_value() {
    let config = MemcacheConfig {
        limits: Limits { value_bytes_max: 10, ..Limits::default() },
        ..MemcacheConfig::default()
    };
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
async fn partial_line_too_long_closes_the_connection() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    // memcached waits for at most 2048 bytes of a line that is not a multi-get, then closes
    // without a word.
    c.send(&[b'x'; 4000]).await;
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
    // Counted outside memcached's field set, in `stats fawn`.
    // The fetch budget is all free once the replies are written.
    let free = fawn_kv::memcache::FETCH_BUDGET_BYTES;
    let fawn = format!(
        "STAT server_errors 9\r\nSTAT fetch_budget_waits 0\r\nSTAT fetch_budget_rereads 0\r\nSTAT fetch_budget_free_bytes {free}\r\nEND\r\n"
    );
    c.roundtrip(b"stats fawn\r\n", fawn.as_bytes()).await;
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
