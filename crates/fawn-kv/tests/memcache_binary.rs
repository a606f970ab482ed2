//! Guards the binary protocol on a connection whose first byte is its request magic: frames
//! answered as memcached 1.6.18 answers them (status, opaque, extras, key, value), quiet
//! opcodes silent on success, and a malformed header answered and closed.

mod memcache_support;

use memcache_support::Server;

fn frame(op: u8, key: &[u8], extras: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
    let mut out = vec![0x80, op];
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.extend_from_slice(&[extras.len() as u8, 0, 0, 0]);
    out.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    [out, extras.to_vec(), key.to_vec(), value.to_vec()].concat()
}

fn reply(op: u8, status: u16, cas: u64, extras: &[u8], key: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
    let mut out = vec![0x81, op];
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.extend_from_slice(&[extras.len() as u8, 0]);
    out.extend_from_slice(&status.to_be_bytes());
    out.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&cas.to_be_bytes());
    [out, extras.to_vec(), key.to_vec(), value.to_vec()].concat()
}

#[tokio::test]
async fn binary_get_set_quiet_and_errors() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    let flags = 5u32.to_be_bytes();
    c.roundtrip(&frame(0x00, b"k", b"", b"", 1), &reply(0x00, 1, 0, b"", b"", b"Not found", 1)).await;
    // setq is silent; the test service's first cas is 1.
    c.send(&frame(0x11, b"k", &[0, 0, 0, 5, 0, 0, 0, 0], b"val", 2)).await;
    c.roundtrip(&frame(0x0c, b"k", b"", b"", 3), &reply(0x0c, 0, 1, &flags, b"k", b"val", 3)).await;
    // getkq: nothing on a miss; noop ends the pipeline.
    c.send(&frame(0x0d, b"nope", b"", b"", 4)).await;
    c.roundtrip(&frame(0x0a, b"", b"", b"", 5), &reply(0x0a, 0, 0, b"", b"", b"", 5)).await;
    let exists = reply(0x02, 2, 0, b"", b"", b"Data exists for key.", 6);
    c.roundtrip(&frame(0x02, b"k", &[0; 8], b"v", 6), &exists).await;
    let arith = [1u64.to_be_bytes(), 0u64.to_be_bytes()].concat();
    let arith = [&arith[..], &0u32.to_be_bytes()].concat();
    let non_numeric = reply(0x05, 6, 0, b"", b"", b"Non-numeric server-side value for incr or decr", 7);
    c.roundtrip(&frame(0x05, b"k", &arith, b"", 7), &non_numeric).await;
    // A cas on delete would need a conditional delete: refused, not applied unconditionally.
    let mut delete = frame(0x04, b"k", b"", b"", 9);
    delete[23] = 1;
    c.roundtrip(&delete, &reply(0x04, 4, 0, b"", b"", b"Invalid arguments", 9)).await;
    c.roundtrip(&frame(0x00, b"k", b"", b"", 10), &reply(0x00, 0, 1, &flags, b"", b"val", 10)).await;
    // A get with extras is malformed: answered, then the connection is closed.
    let invalid = reply(0x00, 4, 0, b"", b"", b"Invalid arguments", 8);
    c.roundtrip(&frame(0x00, b"k", b"abcd", b"", 8), &invalid).await;
    c.expect_closed().await;
    server.shutdown().await;
}
