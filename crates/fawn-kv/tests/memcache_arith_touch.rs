//! Guards the read-modify-write and expiry commands: incr/decr (wrap, floor, noreply),
//! delete, touch, gat/gats — byte-exact replies and the stats counters they move.

mod memcache_support;
use std::time::Duration;

use memcache_support::Server;

#[tokio::test]
async fn incr_decr_wrap_and_floor() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"incr n 1\r\n", b"NOT_FOUND\r\n").await;
    c.roundtrip(b"set n 5 0 2\r\n10\r\n", b"STORED\r\n").await;
    c.roundtrip(b"incr n 5\r\n", b"15\r\n").await;
    c.roundtrip(b"decr n 100\r\n", b"0\r\n").await;
    c.roundtrip(b"set n 0 0 20\r\n18446744073709551615\r\n", b"STORED\r\n").await;
    c.roundtrip(b"incr n 2\r\n", b"1\r\n").await;
    c.send(b"incr n 10 noreply\r\ndecr n 1 noreply\r\n").await;
    // Flags are kept by incr/decr.
    c.roundtrip(b"set f 9 0 1\r\n1\r\nincr f 1\r\n", b"STORED\r\n2\r\n").await;
    // As memcached 1.6.18: a shorter result keeps the item's length, padded with spaces.
    let want = format!("VALUE n 0 20\r\n{:<20}\r\nVALUE f 9 1\r\n2\r\nEND\r\n", 10);
    c.roundtrip(b"get n f\r\n", want.as_bytes()).await;
    c.roundtrip(
        b"set d 0 0 3\r\n100\r\ndecr d 1\r\nget d\r\n",
        b"STORED\r\n99\r\nVALUE d 0 3\r\n99 \r\nEND\r\n",
    )
    .await;
    c.roundtrip(b"incr d 1000\r\nget d\r\n", b"1099\r\nVALUE d 0 4\r\n1099\r\nEND\r\n").await;
    assert_eq!(c.stat("incr_hits").await, "5");
    assert_eq!(c.stat("incr_misses").await, "1");
    assert_eq!(c.stat("decr_hits").await, "3");
    server.shutdown().await;
}

#[tokio::test]
async fn delete_forms() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"delete k\r\n", b"NOT_FOUND\r\n").await;
    c.roundtrip(b"set k 0 0 1\r\na\r\ndelete k\r\n", b"STORED\r\nDELETED\r\n").await;
    c.roundtrip(b"set k 0 0 1\r\na\r\ndelete k 0\r\n", b"STORED\r\nDELETED\r\n").await;
    c.send(b"set k 0 0 1 noreply\r\na\r\ndelete k noreply\r\ndelete k 0 noreply\r\n").await;
    c.roundtrip(b"get k\r\n", b"END\r\n").await;
    assert_eq!(c.stat("delete_hits").await, "3");
    assert_eq!(c.stat("delete_misses").await, "2");
    server.shutdown().await;
}

#[tokio::test]
async fn touch_changes_expiry() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"touch k 10\r\n", b"NOT_FOUND\r\n").await;
    c.roundtrip(b"set k 0 1 1\r\na\r\ntouch k 0\r\n", b"STORED\r\nTOUCHED\r\n").await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    c.roundtrip(b"get k\r\n", b"VALUE k 0 1\r\na\r\nEND\r\n").await;
    c.send(b"touch k -1 noreply\r\n").await;
    c.roundtrip(b"get k\r\n", b"END\r\n").await;
    assert_eq!(c.stat("touch_hits").await, "2");
    assert_eq!(c.stat("touch_misses").await, "1");
    server.shutdown().await;
}

#[tokio::test]
async fn gat_and_gats_touch_and_return() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set a 3 0 1\r\nA\r\n", b"STORED\r\n").await;
    c.roundtrip(b"gat 100 a b\r\n", b"VALUE a 3 1\r\nA\r\nEND\r\n").await;
    // Touch writes through the chain, so the item has a new cas unique: the double's head
    // hands out 1, 2, ... per update (set a = 1, touch a = 2, this touch = 3).
    c.roundtrip(b"gats 0 a\r\n", b"VALUE a 3 1 3\r\nA\r\nEND\r\n").await;
    // Like memcached, gat returns the item it read, then the new exptime applies.
    c.roundtrip(b"gat -1 a\r\nget a\r\n", b"VALUE a 3 1\r\nA\r\nEND\r\nEND\r\n").await;
    server.shutdown().await;
}
