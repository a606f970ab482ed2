//! Guards the binary protocol on a connection whose first byte is its request magic: frames
//! answered as memcached 1.6.18 answers them (status, opaque, extras, key, value), quiet
//! opcodes silent on success, and a malformed header answered and closed.

mod memcache_support;

use memcache_support::{bin_request as frame, BinReply, Server};

#[tokio::test]
async fn binary_get_set_quiet_and_errors() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    let flags = 5u32.to_be_bytes();
    c.roundtrip(&frame(0x00, b"k", b"", b"", 1), &BinReply::plain(0x00, 1, b"Not found", 1)).await;
    // setq is silent; the test service's first cas is 1.
    c.send(&frame(0x11, b"k", &[0, 0, 0, 5, 0, 0, 0, 0], b"val", 2)).await;
    let hit = BinReply { op: 0x0c, status: 0, opaque: 3, cas: 1, extras: &flags, key: b"k", value: b"val" };
    c.roundtrip(&frame(0x0c, b"k", b"", b"", 3), &hit.bytes()).await;
    // getkq: nothing on a miss; noop ends the pipeline.
    c.send(&frame(0x0d, b"nope", b"", b"", 4)).await;
    c.roundtrip(&frame(0x0a, b"", b"", b"", 5), &BinReply::plain(0x0a, 0, b"", 5)).await;
    let exists = BinReply::plain(0x02, 2, b"Data exists for key.", 6);
    c.roundtrip(&frame(0x02, b"k", &[0; 8], b"v", 6), &exists).await;
    let arith = [1u64.to_be_bytes(), 0u64.to_be_bytes()].concat();
    let arith = [&arith[..], &0u32.to_be_bytes()].concat();
    let non_numeric = BinReply::plain(0x05, 6, b"Non-numeric server-side value for incr or decr", 7);
    c.roundtrip(&frame(0x05, b"k", &arith, b"", 7), &non_numeric).await;
    // A cas on delete that is not the item's is refused and the item stays; the item's own
    // cas deletes it.
    let mut delete = frame(0x04, b"k", b"", b"", 9);
    delete[23] = 2;
    c.roundtrip(&delete, &BinReply::plain(0x04, 2, b"Data exists for key.", 9)).await;
    let hit = BinReply { op: 0x00, status: 0, opaque: 10, cas: 1, extras: &flags, key: b"", value: b"val" };
    c.roundtrip(&frame(0x00, b"k", b"", b"", 10), &hit.bytes()).await;
    delete[23] = 1;
    delete[12..16].copy_from_slice(&11u32.to_be_bytes());
    c.roundtrip(&delete, &BinReply::plain(0x04, 0, b"", 11)).await;
    c.roundtrip(&frame(0x00, b"k", b"", b"", 12), &BinReply::plain(0x00, 1, b"Not found", 12)).await;
    // A get with extras is malformed: answered, then the connection is closed.
    let invalid = BinReply::plain(0x00, 4, b"Invalid arguments", 8);
    c.roundtrip(&frame(0x00, b"k", b"abcd", b"", 8), &invalid).await;
    c.expect_closed().await;
    server.shutdown().await;
}
