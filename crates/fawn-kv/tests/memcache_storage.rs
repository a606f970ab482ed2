//! Guards the storage and retrieval commands: byte-exact replies of set/add/replace/append/
//! prepend/cas/get/gets, `noreply`, flags and expiry as memcached 1.6 gives them.

mod memcache_support;
use memcache_support::{now, Server};

#[tokio::test]
async fn set_get_roundtrip_with_flags() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set k 42 0 5\r\nhello\r\n", b"STORED\r\n").await;
    c.roundtrip(b"get k\r\n", b"VALUE k 42 5\r\nhello\r\nEND\r\n").await;
    c.roundtrip(b"get nope\r\n", b"END\r\n").await;
    // Empty values and the largest flags value.
    c.roundtrip(b"set e 4294967295 0 0\r\n\r\n", b"STORED\r\n").await;
    c.roundtrip(b"get e\r\n", b"VALUE e 4294967295 0\r\n\r\nEND\r\n").await;
    // Values may hold any bytes, including CRLF.
    c.roundtrip(b"set b 0 0 4\r\na\r\nb\r\n", b"STORED\r\n").await;
    c.roundtrip(b"get b\r\n", b"VALUE b 0 4\r\na\r\nb\r\nEND\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn multi_get_returns_hits_in_order() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set a 1 0 1\r\nA\r\nset c 3 0 1\r\nC\r\n", b"STORED\r\nSTORED\r\n").await;
    c.roundtrip(b"get a b c\r\n", b"VALUE a 1 1\r\nA\r\nVALUE c 3 1\r\nC\r\nEND\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn gets_and_cas() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set k 0 0 1\r\na\r\n", b"STORED\r\n").await;
    // The test double's head assigns cas uniques 1, 2, ...
    c.roundtrip(b"gets k\r\n", b"VALUE k 0 1 1\r\na\r\nEND\r\n").await;
    c.roundtrip(b"cas k 0 0 1 99\r\nb\r\n", b"EXISTS\r\n").await;
    c.roundtrip(b"cas k 5 0 1 1\r\nb\r\n", b"STORED\r\n").await;
    c.roundtrip(b"gets k\r\n", b"VALUE k 5 1 3\r\nb\r\nEND\r\n").await;
    c.roundtrip(b"cas nope 0 0 1 1\r\nb\r\n", b"NOT_FOUND\r\n").await;
    c.roundtrip(b"cas k 0 0 1 3 noreply\r\nc\r\nget k\r\n", b"VALUE k 0 1\r\nc\r\nEND\r\n").await;
    assert_eq!(c.stat("cas_hits").await, "2");
    assert_eq!(c.stat("cas_badval").await, "1");
    assert_eq!(c.stat("cas_misses").await, "1");
    server.shutdown().await;
}

#[tokio::test]
async fn add_and_replace_conditions() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"replace k 0 0 1\r\na\r\n", b"NOT_STORED\r\n").await;
    c.roundtrip(b"add k 0 0 1\r\na\r\n", b"STORED\r\n").await;
    c.roundtrip(b"add k 0 0 1\r\nb\r\n", b"NOT_STORED\r\n").await;
    c.roundtrip(b"replace k 0 0 1\r\nc\r\n", b"STORED\r\n").await;
    c.roundtrip(b"get k\r\n", b"VALUE k 0 1\r\nc\r\nEND\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn append_prepend_keep_flags() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"append k 0 0 1\r\na\r\n", b"NOT_STORED\r\n").await;
    c.roundtrip(b"prepend k 0 0 1\r\na\r\n", b"NOT_STORED\r\n").await;
    c.roundtrip(b"set k 7 0 3\r\nmid\r\n", b"STORED\r\n").await;
    c.roundtrip(b"append k 9 0 1\r\n>\r\n", b"STORED\r\n").await;
    c.roundtrip(b"prepend k 9 0 1\r\n<\r\n", b"STORED\r\n").await;
    c.roundtrip(b"get k\r\n", b"VALUE k 7 5\r\n<mid>\r\nEND\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn noreply_suppresses_storage_replies() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.send(b"set k 0 0 1 noreply\r\na\r\nadd k 0 0 1 noreply\r\nb\r\n").await;
    c.send(b"replace k 0 0 1 noreply\r\nc\r\nappend k 0 0 1 noreply\r\nd\r\n").await;
    c.send(b"prepend k 0 0 1 noreply\r\ne\r\n").await;
    c.roundtrip(b"get k\r\n", b"VALUE k 0 3\r\necd\r\nEND\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn exptime_relative_absolute_and_negative() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    // Negative: stored but immediately expired.
    c.roundtrip(b"set neg 0 -1 1\r\na\r\nget neg\r\n", b"STORED\r\nEND\r\n").await;
    // Over 30 days is an absolute Unix time: one in the past is expired at once...
    c.roundtrip(b"set past 0 2592001 1\r\na\r\nget past\r\n", b"STORED\r\nEND\r\n").await;
    // ...and one in the future is live.
    let future = now() + 3600;
    let set = format!("set fut 0 {future} 1\r\na\r\nget fut\r\n");
    c.roundtrip(set.as_bytes(), b"STORED\r\nVALUE fut 0 1\r\na\r\nEND\r\n").await;
    // Relative: gone after it elapses.
    c.roundtrip(b"set rel 0 1 1\r\na\r\nget rel\r\n", b"STORED\r\nVALUE rel 0 1\r\na\r\nEND\r\n").await;
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    c.roundtrip(b"get rel\r\n", b"END\r\n").await;
    // An expired item does not block add.
    c.roundtrip(b"add rel 0 0 1\r\nb\r\n", b"STORED\r\n").await;
    server.shutdown().await;
}
