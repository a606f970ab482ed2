//! Guards the fetch budget: a reply that outgrew the room its key's size hint reserved, when the
//! budget has not the rest free, is dropped and read again once room for it is free, never held
//! beyond the budget (and the answer is the whole, current value); `gat` and `mg` with `N` hold
//! room for their replies like any read; and a client that reads its replies gets small values
//! from the fair share while clients that never read hold the rest.

mod memcache_support;

use std::time::{Duration, Instant};

use fawn_kv::memcache::{MemcacheConfig, CONNECTION_FETCH_BYTES_MAX};
use fawn_kv::service::KvService;
use fawn_proto::op::{Mutation, Update};
use memcache_support::{Client, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

const MIB: usize = 1 << 20;
/// The budget of these tests: the smallest, whose fair share is 2 MiB.
const BUDGET: usize = 2 * CONNECTION_FETCH_BYTES_MAX;
const SHARE: usize = BUDGET / 8;

async fn free_bytes(client: &mut Client) -> usize {
    let text = client.stats("stats fawn\r\n").await;
    let line = text.lines().find_map(|line| line.strip_prefix("STAT fetch_budget_free_bytes "));
    line.expect("fetch_budget_free_bytes").parse().expect("a number")
}

async fn fawn_stat(client: &mut Client, name: &str) -> String {
    let text = client.stats("stats fawn\r\n").await;
    let prefix = format!("STAT {name} ");
    text.lines().find_map(|line| line.strip_prefix(&prefix)).expect("stat").to_string()
}

/// Stores `b0`..`b6`, 1 MiB each, through the server.
async fn store_big_values(client: &mut Client) {
    let big = vec![b'v'; MIB];
    for i in 0..7 {
        let mut set = format!("set b{i} 0 0 {MIB}\r\n").into_bytes();
        set.extend_from_slice(&big);
        set.extend_from_slice(b"\r\n");
        client.roundtrip(&set, b"STORED\r\n").await;
    }
}

/// A client that sends `request` and never reads (a tiny receive buffer).
async fn never_reading(server: &Server, request: &[u8]) -> tokio::net::TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let mut stream = socket.connect(server.addr).await.expect("connect");
    stream.write_all(request).await.expect("send");
    stream
}

/// Waits until the budget's free room is at most `bytes`.
async fn wait_free_at_most(client: &mut Client, bytes: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while free_bytes(client).await > bytes {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until all the budget is free again.
async fn wait_all_free(client: &mut Client) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while free_bytes(client).await < BUDGET {
        assert!(Instant::now() < deadline, "room leaked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn config(write_timeout: Duration) -> MemcacheConfig {
    MemcacheConfig { fetch_budget_bytes: BUDGET, write_timeout, ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_beyond_its_hint_without_room_is_read_again() {
    let server = Server::with_config(config(Duration::from_secs(3))).await;
    let mut client = server.connect().await;
    store_big_values(&mut client).await;
    // Set through this server: its hint is a small reply.
    client.roundtrip(b"set s 0 0 1\r\nx\r\n", b"STORED\r\n").await;
    // Grown behind this server's back (as through another front-end): the hint is now wrong.
    let grown = vec![b'g'; MIB];
    let update =
        Update { key: b"s".to_vec(), mutation: Mutation::Set, value: grown.clone(), flags: 0, expiry: 0 };
    server.service.update(update).await.expect("grown");

    // Two clients that never read hold or wait for all but the fair share until the write
    // timeout closes them.
    let hostile = [
        never_reading(&server, b"get b0 b1 b2 b3 b4 b5 b6\r\n").await,
        never_reading(&server, b"get b0 b1 b2 b3 b4 b5 b6\r\n").await,
    ];
    wait_free_at_most(&mut client, SHARE, "the never-reading clients took no room").await;

    // The read of `s` reserves its hint (from the fair share), gets 1 MiB, cannot top up:
    // dropped, read again once the hostile clients are closed.
    client.send(b"get s\r\n").await;
    let mut want = format!("VALUE s 0 {MIB}\r\n").into_bytes();
    want.extend_from_slice(&grown);
    want.extend_from_slice(b"\r\nEND\r\n");
    let mut got = vec![0u8; want.len()];
    tokio::time::timeout(Duration::from_secs(60), client.stream.read_exact(&mut got))
        .await
        .expect("answered once room was free")
        .expect("read");
    assert!(got == want, "the whole, current value");
    assert_eq!(fawn_stat(&mut client, "fetch_budget_rereads").await, "1");
    wait_all_free(&mut client).await;
    drop(hostile);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gat_and_claiming_meta_gets_hold_room() {
    let server = Server::with_config(config(Duration::from_secs(2))).await;
    let mut client = server.connect().await;
    store_big_values(&mut client).await;
    // 7 MiB of touched values, read at once, held while the client does not read.
    let hostile = never_reading(&server, b"gat 100 b0 b1 b2 b3 b4 b5 b6\r\n").await;
    wait_free_at_most(&mut client, BUDGET - 6 * MIB, "gat took no room").await;
    wait_all_free(&mut client).await;
    drop(hostile);
    // Claiming meta gets answer one by one: the kernel's buffers take a few, then one waits
    // holding its 1 MiB.
    let claims: Vec<u8> = (0..7).flat_map(|i| format!("mg b{i} v N30\r\n").into_bytes()).collect();
    let hostile = never_reading(&server, &claims).await;
    wait_free_at_most(&mut client, BUDGET - MIB, "mg N took no room").await;
    wait_all_free(&mut client).await;
    drop(hostile);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_gets_small_values_while_others_never_read() {
    // Long enough that the never-reading clients hold their room throughout.
    let server = Server::with_config(config(Duration::from_secs(60))).await;
    let mut client = server.connect().await;
    store_big_values(&mut client).await;
    client.roundtrip(b"set small 0 0 5\r\nhello\r\n", b"STORED\r\n").await;
    let hostile = [
        never_reading(&server, b"get b0 b1 b2 b3 b4 b5 b6\r\n").await,
        never_reading(&server, b"get b0 b1 b2 b3 b4 b5 b6\r\n").await,
    ];
    wait_free_at_most(&mut client, SHARE, "the never-reading clients took no room").await;
    // First come, first served, this get would wait behind the second one's 7 MiB until the
    // first is closed; from the fair share it is answered at once.
    for _ in 0..20 {
        client.roundtrip(b"get small\r\n", b"VALUE small 0 5\r\nhello\r\nEND\r\n").await;
    }
    assert!(free_bytes(&mut client).await <= SHARE, "the never-reading clients still hold the rest");
    drop(hostile);
    wait_all_free(&mut client).await;
    server.shutdown().await;
}
