//! Seeded never-panic property test of `decode_frame` driven as a connection's frame reader
//! drives it: streams of valid frames, damaged and truncated, split into arbitrary reads. The
//! decoder never panics, consumes whole frames within the buffer, and yields the same frames
//! and the same end however the stream is split. The seed is printed; replay a failure with
//! `FAWN_SEED=<seed> cargo test -p fawn-proto --test native_frame_stream_props`.

use fawn_proto::native::{decode_frame, encode_frame, FrameError, Message, Request, Response, WireError};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};

/// Seed used unless `FAWN_SEED` names another.
const SEED_DEFAULT: u64 = 0x5eed_f4a7;
/// Generated streams per run.
const CASES: u32 = 2_000;

fn drive(chunks: &[&[u8]]) -> (Vec<(u64, Message)>, Option<FrameError>) {
    let mut out = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            match decode_frame(&buf) {
                Ok(None) => break,
                Ok(Some((id, msg, used))) => {
                    assert!(used > 0 && used <= buf.len(), "consumed {used} of {}", buf.len());
                    buf.drain(..used);
                    out.push((id, msg));
                }
                Err(e) => return (out, Some(e)),
            }
        }
    }
    (out, None)
}

fn message() -> impl Strategy<Value = Message> {
    let key = proptest::collection::vec(any::<u8>(), 0..40);
    prop_oneof![
        Just(Message::Request(Request::GetConfig)),
        Just(Message::Request(Request::ItemStats)),
        (any::<u64>(), key.clone(), any::<bool>())
            .prop_map(|(epoch, key, forwarded)| Message::Request(Request::Get { epoch, key, forwarded })),
        key.prop_map(|k| Message::Response(Response::Error(WireError::Invalid(
            String::from_utf8_lossy(&k).into()
        )))),
    ]
}

/// A stream: valid frames, then damage (a flipped byte, a cut tail), then a read size.
fn stream() -> impl Strategy<Value = (Vec<u8>, usize)> {
    let frames = proptest::collection::vec((any::<u64>(), message()), 0..6);
    (frames, any::<Option<(prop::sample::Index, u8)>>(), any::<prop::sample::Index>(), 1usize..64).prop_map(
        |(frames, flip, cut, read)| {
            let mut bytes = Vec::new();
            for (id, m) in &frames {
                encode_frame(*id, m, &mut bytes).expect("encode");
            }
            if let (Some((at, x)), false) = (flip, bytes.is_empty()) {
                let i = at.index(bytes.len());
                bytes[i] ^= x;
            }
            let keep = bytes.len() - cut.index(bytes.len() + 1).min(bytes.len()) / 4;
            bytes.truncate(keep);
            (bytes, read)
        },
    )
}

#[test]
fn decoding_a_damaged_split_stream_never_panics_and_ignores_the_split() {
    let seed = std::env::var("FAWN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(SEED_DEFAULT);
    eprintln!("seed {seed} (replay: FAWN_SEED={seed})");
    let config = Config {
        cases: CASES,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let (cases, frames) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0usize));
    runner
        .run(&stream(), |(bytes, read)| {
            cases.set(cases.get() + 1);
            let chunks: Vec<&[u8]> = bytes.chunks(read).collect();
            let whole = drive(&[&bytes]);
            frames.set(frames.get() + whole.0.len());
            prop_assert_eq!(&whole, &drive(&chunks), "split into {}-byte reads", read);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    eprintln!("{} streams, {} frames decoded", cases.get(), frames.get());
    assert_eq!(cases.get(), CASES, "every case ran");
}
