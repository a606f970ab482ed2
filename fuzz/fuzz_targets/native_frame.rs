//! Fuzzes the native frame decoder the way a connection's frame reader drives it: the input is
//! split into reads at fuzzer-chosen points and decoded frame after frame. Checks: no panic,
//! every decoded frame consumed whole and within the buffer, every accepted message
//! re-encodes to a frame that decodes to it again, and the same frames and end as when the
//! whole input arrives in one read.
//!
//! Run: `cargo +nightly fuzz run native_frame` (from the repository root), or scripts/fuzz.sh.

#![no_main]

use fawn_proto::native::{decode_frame, encode_frame, FrameError, Message};
use libfuzzer_sys::fuzz_target;

/// The frames decoded from `chunks` fed in turn, and how the stream ended.
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

fuzz_target!(|data: &[u8]| {
    // The first byte picks the read size, so the fuzzer explores chunkings too.
    let Some((&size, stream)) = data.split_first() else { return };
    let size = usize::from(size).max(1);
    let chunked: Vec<&[u8]> = stream.chunks(size).collect();
    let whole = drive(&[stream]);
    for (id, msg) in &whole.0 {
        let mut again = Vec::new();
        encode_frame(*id, msg, &mut again).expect("a decoded message encodes");
        let (got_id, got, used) = decode_frame(&again).expect("re-decode").expect("a whole frame");
        assert_eq!((got_id, &got, used), (*id, msg, again.len()));
    }
    assert_eq!(whole, drive(&chunked), "split invariance");
});
