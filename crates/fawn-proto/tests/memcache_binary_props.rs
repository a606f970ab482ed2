//! Property tests of the memcached binary-protocol parser: it never panics on any bytes,
//! consumes only what is in the buffer, makes progress on every error it survives, and a
//! stream of frames yields the same requests however it is split into reads.

use fawn_proto::memcache::binary::{parse, BinParse, BinRequest, REQUEST_MAGIC};
use fawn_proto::memcache::Limits;
use proptest::prelude::*;

mod support;
use support::split;

fn limits() -> Limits {
    Limits { value_bytes_max: 64, ..Limits::default() }
}

/// What a connection would get from a stream fed in `chunks`: requests, and error statuses.
fn drive(chunks: &[&[u8]]) -> Vec<Result<BinRequest, Option<u16>>> {
    let (mut out, mut buf, mut swallow) = (Vec::new(), Vec::new(), 0usize);
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            let skip = swallow.min(buf.len());
            buf.drain(..skip);
            swallow -= skip;
            match parse(&buf, &limits()) {
                _ if swallow > 0 => break,
                BinParse::Incomplete => break,
                BinParse::Frame { request, consumed } => {
                    assert!(consumed >= 24 && consumed <= buf.len());
                    buf.drain(..consumed);
                    out.push(Ok(request));
                }
                BinParse::Invalid(invalid) => {
                    assert!(invalid.consumed <= buf.len());
                    out.push(Err(invalid.reply.map(|(_, _, status)| status as u16)));
                    if invalid.close {
                        return out;
                    }
                    assert!(invalid.consumed > 0, "progress on an error that does not close");
                    buf.drain(..invalid.consumed);
                    swallow = invalid.swallow;
                }
            }
        }
    }
    out
}

/// A frame with a real or random opcode and lengths that are mostly, not always, right.
fn frame() -> impl Strategy<Value = Vec<u8>> {
    let opcode = prop_oneof![0x00u8..0x25, any::<u8>()];
    let lengths = (0usize..4, 0usize..24, 0usize..80, any::<bool>());
    (opcode, lengths, any::<u32>()).prop_map(|(op, (extras, key, value, honest), opaque)| {
        let extras = [0, 4, 8, 20][extras];
        let body = extras + key + value;
        let declared = if honest { body } else { body + 3 };
        let mut out = vec![REQUEST_MAGIC, op];
        out.extend_from_slice(&(key as u16).to_be_bytes());
        out.extend_from_slice(&[extras as u8, 0, 0, 0]);
        out.extend_from_slice(&(declared as u32).to_be_bytes());
        out.extend_from_slice(&opaque.to_be_bytes());
        out.extend_from_slice(&[0; 8]);
        out.resize(24 + body, b'k');
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_panics_on_random_bytes(data in proptest::collection::vec(any::<u8>(), 0..600),
                                    cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        drive(&split(&data, &cuts));
    }

    #[test]
    fn split_invariance(frames in proptest::collection::vec(frame(), 1..8),
                        cuts in proptest::collection::vec(any::<usize>(), 0..10)) {
        let stream: Vec<u8> = frames.concat();
        let whole = drive(&[&stream]);
        prop_assert_eq!(&whole, &drive(&split(&stream, &cuts)));
        let bytewise: Vec<&[u8]> = stream.chunks(1).collect();
        prop_assert_eq!(&whole, &drive(&bytewise));
    }
}
