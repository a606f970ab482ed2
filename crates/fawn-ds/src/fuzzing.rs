//! Entry points for the fuzz targets (`fuzz/fuzz_targets/ds_decode.rs`) and the seeded
//! never-panic test (`tests/decoders_never_panic.rs`): every decoder of bytes read from disk
//! driven the way recovery drives it, with the checks that must hold for any input. Not an
//! API: hidden from the documentation, and nothing else calls it.
//!
//! Checksums guard every format, so random bytes almost never get past them. With `reseal`
//! each entry point first writes the checksums the input's own lengths call for, so the
//! parsers behind them see arbitrary content that passes.

use crate::checkpoint::{self, Sums};
use crate::limits::{DATASTORE_BYTES_MAX, LOG_HEADER_BYTES, OFFSET_UNIT, RECORD_HEADER_BYTES};
use crate::{log, manifest, record};

/// Walks `buf` as a log's records from its start, the way a scan does (a padding record
/// skipped, anything else parsed and verified), until the end or the first error. Returns
/// the records accepted. Each accepted record re-encodes to exactly its bytes.
pub fn log_records(buf: &mut [u8], reseal: bool) -> usize {
    let mut at = 0;
    let mut accepted = 0;
    while at < buf.len() {
        if reseal {
            reseal_record(&mut buf[at..]);
        }
        let rest = &buf[at..];
        match record::pad_len(rest, at as u64) {
            Ok(Some(len)) => {
                if record::verify_pad(rest, at as u64, len).is_err() {
                    break;
                }
                at += len;
                continue;
            }
            Ok(None) => {}
            Err(_) => break,
        }
        let Ok(header) = record::parse_header(rest, at as u64) else { break };
        if record::verify(rest, at as u64, &header).is_err() {
            break;
        }
        let total = header.total_len();
        let again = record::encode(
            header.kind,
            record::key_of(rest, &header),
            record::value_of(rest, &header),
            record::tag_of(rest, &header),
            header.meta,
            header.durable,
        );
        assert_eq!(again.as_deref().ok(), Some(&rest[..total]), "a verified record re-encodes to its bytes");
        accepted += 1;
        at += total;
    }
    accepted
}

/// Writes the checksum a record at the start of `buf` would have, if its header's lengths
/// fit in `buf` (a padding record's covers its 16-byte header).
fn reseal_record(buf: &mut [u8]) {
    if buf.len() < RECORD_HEADER_BYTES {
        return;
    }
    let body_end = match record::parse_header(buf, 0) {
        Ok(h) => RECORD_HEADER_BYTES + h.key_len + h.value_len + h.tag_len,
        Err(_) if buf[4] == b'Z' => record::PAD_HEADER_BYTES,
        Err(_) => return,
    };
    if body_end <= buf.len() {
        let crc = crc32c::crc32c(&buf[4..body_end]);
        buf[0..4].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Decodes `buf` as a log file's header; an accepted one is that of the nonce it names.
/// Returns whether it was accepted.
pub fn log_header(buf: &mut [u8], reseal: bool) -> bool {
    if reseal && buf.len() >= LOG_HEADER_BYTES as usize {
        let crc = crc32c::crc32c(&buf[..28]);
        buf[28..32].copy_from_slice(&crc.to_le_bytes());
    }
    let Ok(nonce) = log::decode_header(buf) else { return false };
    let again = log::encode_header(nonce);
    assert_eq!(log::decode_header(&again).ok(), Some(nonce), "a log header round-trips");
    true
}

/// Decodes `buf` as a `LOGS` manifest; an accepted one round-trips through its encoder.
/// Returns whether it was accepted.
pub fn manifest(buf: &mut [u8], reseal: bool) -> bool {
    if reseal {
        manifest::reseal(buf);
    }
    let Ok(m) = manifest::decode(buf) else { return false };
    let again = manifest::decode(&manifest::encode(&m));
    assert_eq!(again.ok(), Some(m), "a manifest round-trips");
    true
}

/// Decodes `buf` as an index checkpoint for a log of `log_len` bytes (the nonce and cold
/// log it names taken as the expected ones: those checks are equality tests). An accepted
/// checkpoint re-encodes to one that decodes to the same sums, live keys and tags. Returns
/// whether it was accepted.
pub fn checkpoint(buf: &mut [u8], log_len: u64, reseal: bool) -> bool {
    if reseal {
        checkpoint::reseal(buf);
    }
    let (Some(nonce), Some(cold)) = (u64_at(buf, 16), u64_at(buf, 64).zip(u64_at(buf, 72))) else {
        return false;
    };
    let log_len = LOG_HEADER_BYTES + (log_len % DATASTORE_BYTES_MAX) / OFFSET_UNIT * OFFSET_UNIT;
    let Ok(loaded) = checkpoint::decode(buf, nonce, log_len, cold) else { return false };
    let sums = Sums {
        covered_end: loaded.covered_end,
        max_seq: loaded.max_seq,
        live_bytes: loaded.live_bytes,
        cold_nonce: cold.0,
        cold_len: cold.1,
        cold_live: loaded.cold_live_bytes,
    };
    let mut tags = Vec::new();
    loaded.tags.encode(&mut tags);
    let bytes = checkpoint::encode(nonce, &sums, &loaded.index, &tags);
    let again = match checkpoint::decode(&bytes, nonce, log_len, cold) {
        Ok(again) => again,
        Err(e) => panic!("a re-encoded checkpoint is refused: {e}"),
    };
    assert_eq!(
        (again.covered_end, again.max_seq, again.live_bytes, again.cold_live_bytes, again.index.live()),
        (loaded.covered_end, loaded.max_seq, loaded.live_bytes, loaded.cold_live_bytes, loaded.index.live())
    );
    assert_eq!(again.tags, loaded.tags, "recent tags round-trip");
    true
}

fn u64_at(b: &[u8], i: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?))
}
