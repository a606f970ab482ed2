//! Guards the meta commands mg/ms/md/ma/mn: reply codes, return flags in request order,
//! quiet mode, opaque, base64 keys — each expectation checked against memcached 1.6.18.

mod memcache_support;
use memcache_support::Server;

#[tokio::test]
async fn mg_hits_misses_and_return_flags() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set kk 7 0 5\r\nhello\r\n", b"STORED\r\n").await;
    c.roundtrip(b"mg kk v c f k t s O12\r\n", b"VA 5 c1 f7 kkk t-1 s5 O12\r\nhello\r\n").await;
    c.roundtrip(b"mg kk\r\n", b"HD\r\n").await;
    c.roundtrip(b"mg kk q k\r\n", b"HD kkk\r\n").await;
    c.roundtrip(b"mg nope v\r\n", b"EN\r\n").await;
    // A miss echoes only opaque and key.
    c.roundtrip(b"mg nope O9 k v c\r\n", b"EN O9 knope\r\n").await;
    // Quiet: the miss is silent; mn marks the end of the pipeline.
    c.roundtrip(b"mg nope v q\r\nmn\r\n", b"MN\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn mg_with_ttl_touches() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"ms kk 5\r\nhello\r\n", b"HD\r\n").await;
    c.roundtrip(b"mg kk v T30 t\r\n", b"VA 5 t30\r\nhello\r\n").await;
    c.roundtrip(b"mg kk t\r\n", b"HD t30\r\n").await;
    c.roundtrip(b"mg kk T-1\r\nmg kk v\r\n", b"HD\r\nEN\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn ms_modes_and_flags() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"ms m1 2 T0 F5 c\r\nhi\r\n", b"HD c1\r\n").await;
    c.roundtrip(b"ms m1 2 ME\r\nhi\r\n", b"NS\r\n").await;
    c.roundtrip(b"ms m2 2 MA\r\nhi\r\n", b"NS\r\n").await;
    c.roundtrip(b"ms m1 1 MA\r\n>\r\nms m1 1 MP\r\n<\r\n", b"HD\r\nHD\r\n").await;
    c.roundtrip(b"ms m2 1 MR\r\nx\r\n", b"NS\r\n").await;
    c.roundtrip(b"mg m1 v f\r\n", b"VA 4 f5\r\n<hi>\r\n").await;
    // Compare-and-set: mismatched cas is EX, missing key NF.
    c.roundtrip(b"ms m1 2 C999\r\nno\r\n", b"EX\r\n").await;
    c.roundtrip(b"ms m9 2 C1\r\nno\r\n", b"NF\r\n").await;
    // The double's head numbers every update, failed ones too.
    c.roundtrip(b"mg m1 c\r\n", b"HD c5\r\n").await;
    c.roundtrip(b"ms m1 2 C5 k O7\r\nok\r\n", b"HD km1 O7\r\n").await;
    // Quiet hides HD only.
    c.roundtrip(b"ms m1 2 q\r\nhi\r\nms m1 2 q ME\r\nhi\r\nmn\r\n", b"NS\r\nMN\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn md_deletes() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"ms k 1\r\na\r\n", b"HD\r\n").await;
    c.roundtrip(b"md k O1 k\r\n", b"HD O1 kk\r\n").await;
    c.roundtrip(b"md k O1 k\r\n", b"NF O1 kk\r\n").await;
    // Quiet hides HD, but a not-found is still reported.
    c.roundtrip(b"ms k 1\r\na\r\nmd k q\r\nmd k q\r\nmn\r\n", b"HD\r\nNF\r\nMN\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn ma_arithmetic_and_autovivify() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"ma cnt\r\n", b"NF\r\n").await;
    c.roundtrip(b"ma cnt N0 J5\r\n", b"HD\r\n").await;
    c.roundtrip(b"ma cnt v\r\n", b"VA 1\r\n6\r\n").await;
    c.roundtrip(b"ma cnt MD D10 v t\r\n", b"VA 1 t-1\r\n0\r\n").await;
    c.roundtrip(b"ma cnt M+ D3 v O3 k\r\n", b"VA 1 O3 kcnt\r\n3\r\n").await;
    c.roundtrip(b"ma x N0 J10 v\r\nma y N0 v\r\n", b"VA 2\r\n10\r\nVA 1\r\n0\r\n").await;
    // Quiet hides HD and VA; NF still shows.
    c.roundtrip(b"ma cnt q\r\nma cnt v q\r\nma nope q\r\nmn\r\n", b"NF\r\nMN\r\n").await;
    c.roundtrip(b"mg cnt v\r\n", b"VA 1\r\n5\r\n").await;
    c.roundtrip(
        b"ms s 1\r\nx\r\nma s\r\n",
        b"HD\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
    )
    .await;
    server.shutdown().await;
}

#[tokio::test]
async fn base64_keys() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    // "aGVsbG8=" is "hello".
    c.roundtrip(b"ms aGVsbG8= 2 b\r\nhi\r\n", b"HD\r\n").await;
    // memcached 1.6.18 returns the key of a `VA` reply decoded and without `b`, and the key of
    // other replies encoded, followed by `b`.
    c.roundtrip(b"mg aGVsbG8= b v k c\r\n", b"VA 2 khello c1\r\nhi\r\n").await;
    c.roundtrip(b"mg aGVsbG8= b k c\r\n", b"HD kaGVsbG8= b c1\r\n").await;
    c.roundtrip(b"mg hello v\r\n", b"VA 2\r\nhi\r\n").await;
    c.roundtrip(b"get hello\r\n", b"VALUE hello 0 2\r\nhi\r\nEND\r\n").await;
    c.roundtrip(b"mg !!! b v\r\n", b"CLIENT_ERROR error decoding key\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn meta_errors() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"mg\r\n", b"ERROR\r\n").await;
    c.roundtrip(b"md\r\n", b"ERROR\r\n").await;
    c.roundtrip(b"mg k zz\r\n", b"CLIENT_ERROR invalid flag\r\n").await;
    c.roundtrip(b"mg k v v\r\n", b"CLIENT_ERROR duplicate flag\r\n").await;
    c.roundtrip(b"mg k Tx\r\n", b"CLIENT_ERROR bad token in command line format\r\n").await;
    c.roundtrip(b"ma k D-1\r\n", b"CLIENT_ERROR invalid or duplicate flag\r\n").await;
    c.roundtrip(b"ma k Mx\r\n", b"CLIENT_ERROR invalid mode for ma M token\r\n").await;
    let opaque = format!("mg k O{}\r\n", "o".repeat(40));
    c.roundtrip(opaque.as_bytes(), b"CLIENT_ERROR opaque token too long\r\n").await;
    // Errors after a known length swallow the data block: framing is kept.
    c.roundtrip(b"ms k 2 zz\r\nhi\r\nmn\r\n", b"CLIENT_ERROR invalid flag\r\nMN\r\n").await;
    c.roundtrip(b"ms k 2 MX\r\nhi\r\nmn\r\n", b"CLIENT_ERROR invalid mode for ms M token\r\nMN\r\n").await;
    c.roundtrip(b"ms k 2 F-1\r\nhi\r\nmn\r\n", b"CLIENT_ERROR bad command line format\r\nMN\r\n").await;
    // A bad chunk drops `len + 2` bytes and goes on (the leftover "\n" is an empty line).
    c.roundtrip(b"ms k 1\r\nab\r\n", b"CLIENT_ERROR bad data chunk\r\nERROR\r\n").await;
    server.shutdown().await;
}
