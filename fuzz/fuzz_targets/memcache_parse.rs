//! Fuzzes the memcached text-protocol parser the way a connection drives it: the input is
//! split into reads at fuzzer-chosen points, and every frame, error and swallowed block is
//! consumed in turn. Checks: no panic, progress on every non-fatal error, consumption never
//! beyond the buffer, the buffer never above the parser's bounds, and the same outcome as
//! when the whole input arrives in one read.
//!
//! Run: `cargo +nightly fuzz run memcache_parse` (from the repository root).

#![no_main]

use fawn_proto::memcache::{parse, Command, Limits, Parse};
use libfuzzer_sys::fuzz_target;

fn limits() -> Limits {
    Limits { line_bytes_max: 2048, get_line_bytes_max: 8192, value_bytes_max: 4096 }
}

fn drive(chunks: &[&[u8]]) -> Vec<Result<Command, Vec<u8>>> {
    let limits = limits();
    let bound = limits.get_line_bytes_max + limits.value_bytes_max + 2048 + 2;
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
                Parse::Incomplete => {
                    assert!(buf.len() <= bound, "incomplete beyond bounds: {}", buf.len());
                    break;
                }
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
                    assert!(invalid.consumed > 0);
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
