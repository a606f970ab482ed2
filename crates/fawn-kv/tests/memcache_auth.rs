//! Guards authentication with a user file: text clients log in with a `set` whose data is
//! `<user> <password>` (replies as memcached 1.6.18 `-Y` gives them), binary clients with
//! SASL PLAIN; nothing else runs before that.

mod memcache_support;

use std::sync::Arc;

use fawn_kv::memcache::auth::Users;
use fawn_kv::memcache::MemcacheConfig;
use memcache_support::{bin_request, BinReply, Server};

async fn server() -> Server {
    let users = Some(Arc::new(Users::parse(b"alice:secret\nbob:hunter2\n")));
    Server::with_config(MemcacheConfig { users, ..MemcacheConfig::default() }).await
}

#[tokio::test]
async fn text_clients_log_in_with_a_set() {
    let server = server().await;
    let mut c = server.connect().await;
    c.roundtrip(b"get k\r\n", b"CLIENT_ERROR unauthenticated\r\n").await;
    c.roundtrip(b"version\r\n", b"CLIENT_ERROR unauthenticated\r\n").await;
    c.roundtrip(b"set x 0 0 11\r\nalice wrong\r\n", b"CLIENT_ERROR authentication failure\r\n").await;
    // noreply does not silence the login's STORED.
    c.roundtrip(b"set x 0 0 14 noreply\r\nalice  secret \r\n", b"STORED\r\n").await;
    c.roundtrip(b"set k 0 0 1\r\na\r\nget k x\r\n", b"STORED\r\nVALUE k 0 1\r\na\r\nEND\r\n").await;
    server.shutdown().await;
}

fn frame(op: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
    bin_request(op, key, b"", value, 0)
}

fn reply(op: u8, status: u16, value: &[u8]) -> Vec<u8> {
    BinReply::plain(op, status, value, 0)
}

#[tokio::test]
async fn binary_clients_log_in_with_sasl_plain() {
    let server = server().await;
    let mut c = server.connect().await;
    c.roundtrip(&frame(0x20, b"", b""), &reply(0x20, 0, b"PLAIN")).await;
    c.roundtrip(&frame(0x21, b"PLAIN", b"\0bob\0wrong"), &reply(0x21, 0x20, b"Auth failure.")).await;
    c.roundtrip(&frame(0x21, b"PLAIN", b"\0bob\0hunter2"), &reply(0x21, 0, b"Authenticated")).await;
    c.roundtrip(&frame(0x00, b"k", b""), &reply(0x00, 1, b"Not found")).await;
    // Before authentication a request is refused and the connection closed.
    let mut d = server.connect().await;
    d.roundtrip(&frame(0x00, b"k", b""), &reply(0x00, 0x20, b"Auth failure.")).await;
    d.expect_closed().await;
    server.shutdown().await;
}
