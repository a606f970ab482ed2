//! Property tests of the memcached parser: it never panics on any bytes, it reports only
//! bounded, in-range consumption, and a valid request stream yields the same frames however
//! it is split into reads (split invariance), as a connection sees it.

use fawn_proto::memcache::{parse, Command, Limits, Parse};
use proptest::prelude::*;

mod support;
use support::split;

/// What a connection would produce from a stream fed in `chunks`: the frames, and the
/// error replies in order.
fn drive(chunks: &[&[u8]], limits: &Limits) -> Vec<Result<Command, Vec<u8>>> {
    let mut out = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut swallow = 0usize;
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            let skip = swallow.min(buf.len());
            buf.drain(..skip);
            swallow -= skip;
            if swallow > 0 {
                break;
            }
            match parse(&buf, limits) {
                Parse::Incomplete => break,
                Parse::Frame { command, consumed } => {
                    assert!(consumed > 0 && consumed <= buf.len());
                    buf.drain(..consumed);
                    out.push(Ok(command));
                }
                Parse::Invalid(invalid) => {
                    assert!(invalid.consumed <= buf.len());
                    out.push(Err(invalid.reply.unwrap_or_default().to_vec()));
                    if invalid.close {
                        return out;
                    }
                    assert!(invalid.consumed > 0, "progress on a non-fatal error");
                    buf.drain(..invalid.consumed);
                    swallow = invalid.swallow;
                }
            }
        }
    }
    out
}

fn key() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_:.-]{1,20}"
}

/// One well-formed request (classic or meta), possibly with an error the parser must report.
fn request() -> impl Strategy<Value = Vec<u8>> {
    let value = proptest::collection::vec(any::<u8>(), 0..40);
    prop_oneof![
        (key(), key()).prop_map(|(a, b)| format!("get {a} {b}\r\n").into_bytes()),
        (key(), any::<u32>(), -10i32..100, value.clone(), any::<bool>()).prop_map(|(k, f, e, v, nr)| {
            let noreply = if nr { " noreply" } else { "" };
            let mut r = format!("set {k} {f} {e} {}{noreply}\r\n", v.len()).into_bytes();
            r.extend_from_slice(&v);
            r.extend_from_slice(b"\r\n");
            r
        }),
        (key(), value.clone()).prop_map(|(k, v)| {
            let mut r = format!("ms {k} {} T10 F3 c k\r\n", v.len()).into_bytes();
            r.extend_from_slice(&v);
            r.extend_from_slice(b"\r\n");
            r
        }),
        (key(), any::<u64>()).prop_map(|(k, d)| format!("incr {k} {d}\r\n").into_bytes()),
        key().prop_map(|k| format!("mg {k} v c f k O1 q\r\n").into_bytes()),
        key().prop_map(|k| format!("delete {k} noreply\r\n").into_bytes()),
        key().prop_map(|k| format!("ma {k} N0 J5 D2 v\r\n").into_bytes()),
        Just(b"bogus command\r\n".to_vec()),
        Just(b"set k x 0 3\r\nabc\r\n".to_vec()),
        Just(b"set big 0 0 70\r\n".iter().chain([b'z'; 70].iter()).chain(b"\r\n").copied().collect()),
        Just(b"flush_all 10 noreply\r\nversion\r\nmn\r\n".to_vec()),
    ]
}

fn limits() -> Limits {
    // A small value limit so the "too large, swallow" path is exercised.
    Limits { value_bytes_max: 64, ..Limits::default() }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_panics_on_random_bytes(data in proptest::collection::vec(any::<u8>(), 0..600),
                                    cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        drive(&split(&data, &cuts), &limits());
    }

    #[test]
    fn never_panics_on_near_miss_text(
        lines in proptest::collection::vec(
            "(get|gets|gat|set|cas|add|incr|decr|touch|delete|flush_all|verbosity|stats|mg|ms|md|ma|mn)( [-a-zA-Z0-9=+]{0,12}){0,7}(\r\n|\n|\r)",
            1..6),
        cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        let data: Vec<u8> = lines.concat().into_bytes();
        drive(&split(&data, &cuts), &limits());
    }

    #[test]
    fn split_invariance(reqs in proptest::collection::vec(request(), 1..8),
                        cuts in proptest::collection::vec(any::<usize>(), 0..10)) {
        let stream: Vec<u8> = reqs.concat();
        let whole = drive(&[&stream], &limits());
        let chunked = drive(&split(&stream, &cuts), &limits());
        prop_assert_eq!(&whole, &chunked);
        let bytewise: Vec<&[u8]> = stream.chunks(1).collect();
        prop_assert_eq!(&whole, &drive(&bytewise, &limits()));
        // Every well-formed request gives exactly one frame or error reply slot.
        prop_assert!(whole.len() >= reqs.len());
    }
}
