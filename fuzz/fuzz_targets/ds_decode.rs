//! Fuzzes FAWN-DS's decoders of bytes read from disk (`fawn_ds::fuzzing`): the first byte
//! picks the decoder (log records, log header, `LOGS` manifest, index checkpoint) and whether
//! the input's checksums are rewritten to match first, so that the parsers behind them see
//! arbitrary content; a checkpoint input's next 8 bytes are its log's length. Checks: no
//! panic, and what a decoder accepts round-trips through its encoder.
//!
//! Run: `cargo +nightly fuzz run ds_decode` (from the repository root), or scripts/fuzz.sh.

#![no_main]

use fawn_ds::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let reseal = pick & 0x80 != 0;
    let mut bytes = rest.to_vec();
    match pick & 0x03 {
        0 => {
            fuzzing::log_records(&mut bytes, reseal);
        }
        1 => {
            fuzzing::log_header(&mut bytes, reseal);
        }
        2 => {
            fuzzing::manifest(&mut bytes, reseal);
        }
        _ => {
            let Some((len, ckpt)) = rest.split_first_chunk::<8>() else { return };
            let mut ckpt = ckpt.to_vec();
            fuzzing::checkpoint(&mut ckpt, u64::from_le_bytes(*len), reseal);
        }
    }
});
