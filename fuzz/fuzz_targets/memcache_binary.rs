//! Fuzzes the memcached binary-protocol parser the way a connection drives it: the input is
//! split into reads at fuzzer-chosen points, and every frame, error and skipped body is
//! consumed in turn. Checks: no panic, progress on every error that does not close,
//! consumption never beyond the buffer, the buffer never above the parser's bounds, and the
//! same outcome as when the whole input arrives in one read.
//!
//! Run: `cargo +nightly fuzz run memcache_binary` (from the repository root).

#![no_main]

use fawn_proto::memcache::binary::{parse, BinParse, BinRequest};
use fawn_proto::memcache::Limits;
use libfuzzer_sys::fuzz_target;

const HEADER_BYTES: usize = 24;
/// Extras (at most 20) and key (at most 250) around a value of `value_bytes_max`.
const FRAME_OVERHEAD_BYTES: usize = HEADER_BYTES + 20 + 250;

fn limits() -> Limits {
    Limits { value_bytes_max: 4096, ..Limits::default() }
}

type Outcome = Result<BinRequest, Option<u16>>;

fn drive(chunks: &[&[u8]]) -> Vec<Outcome> {
    let limits = limits();
    let bound = limits.value_bytes_max + FRAME_OVERHEAD_BYTES;
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
            match parse(&buf, &limits) {
                BinParse::Incomplete => {
                    assert!(buf.len() <= bound, "incomplete beyond bounds: {}", buf.len());
                    break;
                }
                BinParse::Frame { request, consumed } => {
                    assert!(consumed >= HEADER_BYTES && consumed <= buf.len());
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

fuzz_target!(|data: &[u8]| {
    // The first byte picks the read size, so the fuzzer explores chunkings too.
    let Some((&size, stream)) = data.split_first() else { return };
    let size = usize::from(size).max(1);
    let chunked: Vec<&[u8]> = stream.chunks(size).collect();
    assert_eq!(drive(&[stream]), drive(&chunked), "split invariance");
});
