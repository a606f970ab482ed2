//! Guards connection handling: pipelined requests answered in order whatever the TCP
//! chunking, many concurrent clients, idle timeout, and graceful shutdown.

mod memcache_support;
use std::time::Duration;

use fawn_kv::memcache::MemcacheConfig;
use memcache_support::Server;

/// A pipeline mixing every kind of request, and its exact reply.
const PIPELINE: &[u8] = b"set a 1 0 3\r\nabc\r\nget a\r\nbogus\r\nincr n 1\r\nadd n 0 0 1\r\n5\r\n\
incr n 2\r\nset q 0 0 1 noreply\r\nx\r\nmg q v\r\nms m 2 q\r\nhi\r\nmn\r\ndelete a\r\ngets a\r\n";
const REPLIES: &[u8] = b"STORED\r\nVALUE a 1 3\r\nabc\r\nEND\r\nERROR\r\nNOT_FOUND\r\nSTORED\r\n\
7\r\nVA 1\r\nx\r\nMN\r\nDELETED\r\nEND\r\n";

#[tokio::test]
async fn pipeline_in_one_write() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(PIPELINE, REPLIES).await;
    server.shutdown().await;
}

#[tokio::test]
async fn pipeline_byte_by_byte() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    for byte in PIPELINE {
        c.send(std::slice::from_ref(byte)).await;
    }
    c.expect(REPLIES).await;
    server.shutdown().await;
}

#[tokio::test]
async fn large_pipeline_is_answered_completely() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set v 0 0 1000\r\n", b"").await;
    c.roundtrip(&[b'v'; 1000], b"").await;
    c.roundtrip(b"\r\n", b"STORED\r\n").await;
    let request = b"get v\r\n".repeat(2000);
    let mut one = b"VALUE v 0 1000\r\n".to_vec();
    one.extend_from_slice(&[b'v'; 1000]);
    one.extend_from_slice(b"\r\nEND\r\n");
    // 2 MB of replies to a 14 kB pipeline: the server must flush as it goes (its output
    // buffer is bounded), while the client is still only writing.
    c.send(&request).await;
    c.expect(&one.repeat(2000)).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_incr_exactly() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set n 0 0 1\r\n0\r\n", b"STORED\r\n").await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let mut client = server.connect().await;
        tasks.push(tokio::spawn(async move {
            for _ in 0..100 {
                client.send(b"incr n 1 noreply\r\n").await;
            }
            client.roundtrip(b"mn\r\n", b"MN\r\n").await;
        }));
    }
    for task in tasks {
        task.await.expect("client");
    }
    c.roundtrip(b"get n\r\n", b"VALUE n 0 4\r\n1600\r\nEND\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn idle_connections_are_closed() {
    let config =
        MemcacheConfig { idle_timeout: Some(Duration::from_millis(200)), ..MemcacheConfig::default() };
    let server = Server::with_config(config).await;
    let mut c = server.connect().await;
    c.roundtrip(b"mn\r\n", b"MN\r\n").await;
    c.expect_closed().await;
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_closes_connections_and_returns() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"mn\r\n", b"MN\r\n").await;
    let addr = server.addr;
    server.shutdown().await;
    c.expect_closed().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "listener closed");
}

#[tokio::test]
async fn multi_get_spanning_batches_keeps_key_order() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    // 150 keys (three read batches) of 20 kB each: a 3 MB reply streamed, in key order.
    let value = vec![b'x'; 20_000];
    let mut want = Vec::new();
    let mut keys = String::from("get");
    for i in 0..150 {
        let mut set = format!("set k{i} {i} 0 {}\r\n", value.len()).into_bytes();
        set.extend_from_slice(&value);
        set.extend_from_slice(b"\r\n");
        c.roundtrip(&set, b"STORED\r\n").await;
        keys.push_str(&format!(" k{i} missing{i}"));
        want.extend_from_slice(format!("VALUE k{i} {i} {}\r\n", value.len()).as_bytes());
        want.extend_from_slice(&value);
        want.extend_from_slice(b"\r\n");
    }
    want.extend_from_slice(b"END\r\n");
    keys.push_str("\r\n");
    c.roundtrip(keys.as_bytes(), &want).await;
    server.shutdown().await;
}

#[tokio::test]
async fn pipelined_gets_are_answered_in_order_and_see_earlier_writes() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    // Runs of gets are read concurrently; a write in between must still be seen by the
    // gets after it, and not by those before.
    let request =
        b"get a\r\nget a b\r\nset a 0 0 1\r\n1\r\nget b a\r\ngets a\r\nget a a\r\nincr a 1\r\nget a\r\n";
    let want = b"END\r\nEND\r\nSTORED\r\nVALUE a 0 1\r\n1\r\nEND\r\nVALUE a 0 1 1\r\n1\r\nEND\r\n\
VALUE a 0 1\r\n1\r\nVALUE a 0 1\r\n1\r\nEND\r\n2\r\nVALUE a 0 1\r\n2\r\nEND\r\n";
    c.roundtrip(request, want).await;
    // Many pipelined gets in one write (more than one concurrent run).
    let many = b"get a\r\n".repeat(300);
    c.roundtrip(&many, &b"VALUE a 0 1\r\n2\r\nEND\r\n".repeat(300)).await;
    assert_eq!(c.stat("cmd_get").await, "309");
    server.shutdown().await;
}
