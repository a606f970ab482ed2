//! Log record encoding and checking (layout in docs/FORMAT.md).
//!
//! Every record is checked twice: `encode` re-parses what it produced before it is appended,
//! and every read goes through `parse_header` + `verify` (pair assertions).

use crate::error::Error;
use crate::limits::{
    pad_to_unit, KEY_BYTES_MAX, OFFSET_UNIT, RECORD_HEADER_BYTES, TAG_BYTES_MAX, VALUE_BYTES_MAX,
};
use crate::types::{Meta, RecordKind};

const KIND_PUT: u8 = b'P';
const KIND_DELETE: u8 = b'D';
/// Byte 5 of every record header: record format 1 (cheap garbage detection when scanning).
const RECORD_MARKER: u8 = 0xF1;
/// Byte 5 of a put or delete whose `Meta::state` is not zero: record format 2, where byte 7
/// (the high byte of format 1's key length, always zero since keys are at most 250 bytes)
/// holds the state. A record with state 0 is always written in format 1, so logs of items
/// without state stay byte for byte what older releases wrote and read.
const RECORD_MARKER_STATE: u8 = 0xF2;
/// Byte 5 of a put or delete that carries a caller tag (`BatchOp::with_tag`): record format
/// 3, where byte 6 is the key length, byte 7 the state (zero or not), byte 11 (the high byte
/// of the value length, always zero since values are at most 1 MiB) the tag length, and the
/// tag follows the value. A record without a tag is written in format 1 or 2 as before.
const RECORD_MARKER_TAG: u8 = 0xF3;
/// Kind byte of a padding record (`Options::page_aligned_records`): fills the rest of a
/// 4 KiB page so that the next record starts on the next page. Not a put or a delete:
/// scanners skip it, the index never points at it.
const KIND_PAD: u8 = b'Z';
/// Bytes of a padding record's header (its checked part); the rest of it is zero.
pub(crate) const PAD_HEADER_BYTES: usize = 16;

/// A parsed record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub crc: u32,
    pub kind: RecordKind,
    pub key_len: usize,
    pub value_len: usize,
    /// Bytes of the caller tag after the value (0: none; format 3 only).
    pub tag_len: usize,
    pub meta: Meta,
    /// Log bytes known durable (fdatasync'ed) when this record was appended: a lower bound
    /// that lets recovery tell a torn unsynced tail from damage in synced data.
    pub durable: u64,
}

impl Header {
    /// Bytes of the whole record including padding.
    pub fn total_len(&self) -> usize {
        pad_to_unit(RECORD_HEADER_BYTES + self.key_len + self.value_len + self.tag_len)
    }
}

fn kind_byte(kind: RecordKind) -> u8 {
    match kind {
        RecordKind::Put => KIND_PUT,
        RecordKind::Delete => KIND_DELETE,
    }
}

/// Encode a record, padded to the offset unit. The result is re-checked before returning.
/// `durable` is the log offset known durable now (a multiple of the offset unit).
pub(crate) fn encode(
    kind: RecordKind,
    key: &[u8],
    value: &[u8],
    tag: &[u8],
    meta: Meta,
    durable: u64,
) -> Result<Vec<u8>, Error> {
    let mut buf = Vec::with_capacity(pad_to_unit(body_len(key, value, tag)));
    encode_into(&mut buf, kind, key, value, tag, meta, durable)?;
    Ok(buf)
}

/// Append one encoded record (as `encode`) to `out`; returns its length. On error `out` is
/// left as it was. Batches encode many records into one buffer this way (one allocation).
/// A tag longer than `TAG_BYTES_MAX` is refused.
pub(crate) fn encode_into(
    out: &mut Vec<u8>,
    kind: RecordKind,
    key: &[u8],
    value: &[u8],
    tag: &[u8],
    meta: Meta,
    durable: u64,
) -> Result<usize, Error> {
    check_tag(tag)?;
    let start = out.len();
    let total = encode_unsealed(out, kind, key, value, tag, meta, durable);
    let buf = &mut out[start..];
    let crc = crc32c::crc32c(&buf[4..body_len(key, value, tag)]);
    buf[0..4].copy_from_slice(&crc.to_le_bytes());
    if let Err(e) = check_encoded(buf, kind, key, value, tag, meta, durable) {
        out.truncate(start);
        return Err(e);
    }
    Ok(total)
}

/// A caller tag must fit record format 3 (`TAG_BYTES_MAX`).
pub(crate) fn check_tag(tag: &[u8]) -> Result<(), Error> {
    if tag.len() > TAG_BYTES_MAX {
        return Err(Error::InvalidRequest(format!("a tag of {} bytes (at most {TAG_BYTES_MAX})", tag.len())));
    }
    Ok(())
}

/// Bytes of a record's header, key, value and tag (what its checksum covers from byte 4 on).
pub(crate) fn body_len(key: &[u8], value: &[u8], tag: &[u8]) -> usize {
    RECORD_HEADER_BYTES + key.len() + value.len() + tag.len()
}

/// Append a record as `encode_into` does, but with a zero checksum: the caller fills it in
/// (`seal_records`) and then checks the record (`check_encoded`). Returns its length. The
/// tag must be at most `TAG_BYTES_MAX` bytes (the self-check fails otherwise).
pub(crate) fn encode_unsealed(
    out: &mut Vec<u8>,
    kind: RecordKind,
    key: &[u8],
    value: &[u8],
    tag: &[u8],
    meta: Meta,
    durable: u64,
) -> usize {
    let total = pad_to_unit(body_len(key, value, tag));
    let start = out.len();
    let mut h = [0u8; RECORD_HEADER_BYTES];
    h[4] = kind_byte(kind);
    h[5] = match (tag.is_empty(), meta.state) {
        (false, _) => RECORD_MARKER_TAG,
        (true, 0) => RECORD_MARKER,
        (true, _) => RECORD_MARKER_STATE,
    };
    h[6..8].copy_from_slice(&(key.len() as u16).to_le_bytes());
    h[7] = meta.state;
    h[8..12].copy_from_slice(&(value.len() as u32).to_le_bytes());
    // Format 3: the value length's high byte (zero: values are under 16 MiB) is the tag's.
    h[11] |= tag.len() as u8;
    h[12..16].copy_from_slice(&meta.flags.to_le_bytes());
    h[16..24].copy_from_slice(&meta.seq.to_le_bytes());
    h[24..28].copy_from_slice(&meta.expiry.to_le_bytes());
    h[28..32].copy_from_slice(&((durable / OFFSET_UNIT) as u32).to_le_bytes());
    // Each byte written once: header, key, value, then zeros for the padding only.
    out.reserve(total);
    out.extend_from_slice(&h);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    out.extend_from_slice(tag);
    out.resize(start + total, 0);
    total
}

/// Fill in the checksums of the records of `buf` given as (start, body length), three at a
/// time (`crc32c_3`: independent checksums overlap in the CPU; one alone waits for each
/// step's result).
pub(crate) fn seal_records(buf: &mut [u8], records: &[(usize, usize)]) {
    let body = |(start, len): (usize, usize)| start + 4..start + len;
    let mut chunks = records.chunks_exact(3);
    for c in &mut chunks {
        let crcs = crc32c_3(&buf[body(c[0])], &buf[body(c[1])], &buf[body(c[2])]);
        for (&(start, _), crc) in c.iter().zip(crcs) {
            buf[start..start + 4].copy_from_slice(&crc.to_le_bytes());
        }
    }
    for &r in chunks.remainder() {
        let crc = crc32c::crc32c(&buf[body(r)]);
        buf[r.0..r.0 + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Pair assertion, write side: an encoded record (at the start of `buf`) must parse back to
/// exactly the input, its checksum included (the checksum was computed over these very
/// bytes, so the stored one is compared with what parsing reads, not recomputed).
pub(crate) fn check_encoded(
    buf: &[u8],
    kind: RecordKind,
    key: &[u8],
    value: &[u8],
    tag: &[u8],
    meta: Meta,
    durable: u64,
) -> Result<(), Error> {
    let total = pad_to_unit(body_len(key, value, tag));
    let stored = buf.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let ok = match parse_header(buf, 0) {
        Ok(header) => {
            header.kind == kind
                && Some(header.crc) == stored
                && header.total_len() == total
                && buf.len() >= total
                && header.meta == meta
                && header.durable == durable
                && key_of(buf, &header) == key
                && value_of(buf, &header) == value
                && tag_of(buf, &header) == tag
                && buf[body_len(key, value, tag)..total].iter().all(|&b| b == 0)
        }
        Err(_) => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::corrupt(0, "record encoder self-check failed"))
    }
}

/// CRC32C (as `crc32c::crc32c`) of three buffers. With SSE 4.2 the three checksums advance
/// together over their common length (the `crc32` instruction has a latency of three cycles
/// but issues every cycle), and each finishes its own tail with the `crc32c` crate.
pub(crate) fn crc32c_3(a: &[u8], b: &[u8], c: &[u8]) -> [u32; 3] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU supports SSE 4.2 (checked just above); the function only reads
        // the slices it is given.
        return unsafe { crc32c_3_sse42(a, b, c) };
    }
    [crc32c::crc32c(a), crc32c::crc32c(b), crc32c::crc32c(c)]
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_3_sse42(a: &[u8], b: &[u8], c: &[u8]) -> [u32; 3] {
    use std::arch::x86_64::_mm_crc32_u64;
    let n = a.len().min(b.len()).min(c.len()) / 8 * 8;
    // The running state, as the crate keeps it: inverted at the start and at the end.
    let (mut sa, mut sb, mut sc) = (u64::from(u32::MAX), u64::from(u32::MAX), u64::from(u32::MAX));
    let mut i = 0;
    while i < n {
        // SAFETY: i + 8 <= n, and n is at most each slice's length.
        let (wa, wb, wc) = unsafe {
            (
                std::ptr::read_unaligned(a.as_ptr().add(i).cast::<u64>()),
                std::ptr::read_unaligned(b.as_ptr().add(i).cast::<u64>()),
                std::ptr::read_unaligned(c.as_ptr().add(i).cast::<u64>()),
            )
        };
        sa = _mm_crc32_u64(sa, u64::from_le(wa));
        sb = _mm_crc32_u64(sb, u64::from_le(wb));
        sc = _mm_crc32_u64(sc, u64::from_le(wc));
        i += 8;
    }
    // `crc32c_append(crc, rest)` continues from the finished checksum `crc` = !state.
    [
        crc32c::crc32c_append(!(sa as u32), &a[n..]),
        crc32c::crc32c_append(!(sb as u32), &b[n..]),
        crc32c::crc32c_append(!(sc as u32), &c[n..]),
    ]
}

/// Append a padding record of `len` bytes (a multiple of the offset unit, at least
/// `PAD_HEADER_BYTES`, less than a page) to `out`.
pub(crate) fn encode_pad(out: &mut Vec<u8>, len: usize) -> Result<(), Error> {
    let start = out.len();
    out.resize(start + len, 0);
    let buf = &mut out[start..];
    if len < PAD_HEADER_BYTES || !(len as u64).is_multiple_of(OFFSET_UNIT) || len >= PAD_BYTES_LIMIT {
        out.truncate(start);
        return Err(Error::corrupt(0, format!("bad padding length {len}")));
    }
    buf[4] = KIND_PAD;
    buf[5] = RECORD_MARKER;
    buf[8..12].copy_from_slice(&(len as u32).to_le_bytes());
    let crc = crc32c::crc32c(&buf[4..PAD_HEADER_BYTES]);
    buf[0..4].copy_from_slice(&crc.to_le_bytes());
    // Pair assertion, write side.
    if !matches!(pad_len(buf, 0), Ok(Some(l)) if l == len) {
        out.truncate(start);
        return Err(Error::corrupt(0, "padding encoder self-check failed"));
    }
    Ok(())
}

/// Padding records are shorter than this (they only ever fill the rest of a 4 KiB page).
const PAD_BYTES_LIMIT: usize = 4096;

/// If `buf` (at least `PAD_HEADER_BYTES`, or what is left of the log) starts with a padding
/// record, check its header and return its length; `None` for any other record.
pub(crate) fn pad_len(buf: &[u8], offset: u64) -> Result<Option<usize>, Error> {
    if buf.get(4) != Some(&KIND_PAD) {
        return Ok(None);
    }
    let Some(h) = buf.get(..PAD_HEADER_BYTES) else {
        return Err(Error::corrupt(offset, "padding header truncated"));
    };
    if h[5] != RECORD_MARKER {
        return Err(Error::corrupt(offset, "record marker missing"));
    }
    let crc = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    if crc32c::crc32c(&h[4..PAD_HEADER_BYTES]) != crc {
        return Err(Error::corrupt(offset, "padding checksum mismatch"));
    }
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
    let zeros = h[6..8].iter().chain(&h[12..16]).all(|&b| b == 0);
    if !zeros
        || !(PAD_HEADER_BYTES..PAD_BYTES_LIMIT).contains(&len)
        || !(len as u64).is_multiple_of(OFFSET_UNIT)
    {
        return Err(Error::corrupt(offset, format!("bad padding record (length {len})")));
    }
    Ok(Some(len))
}

/// Check the zero fill of a whole padding record of `len` bytes.
pub(crate) fn verify_pad(buf: &[u8], offset: u64, len: usize) -> Result<(), Error> {
    match buf.get(PAD_HEADER_BYTES..len) {
        Some(fill) if fill.iter().all(|&b| b == 0) => Ok(()),
        Some(_) => Err(Error::corrupt(offset, "padding is not zero")),
        None => Err(Error::corrupt(offset, "padding truncated")),
    }
}

/// Parse and sanity-check the fixed header at the start of `buf` (record at `offset`).
pub(crate) fn parse_header(buf: &[u8], offset: u64) -> Result<Header, Error> {
    let Some(h) = buf.get(..RECORD_HEADER_BYTES) else {
        return Err(Error::corrupt(offset, "record header truncated"));
    };
    // Format 1: no state (byte 7 is the key length's zero high byte); format 2: a non-zero
    // state in byte 7 (a zero one would have been written as format 1); format 3: any state
    // in byte 7 and a tag of 1 to `TAG_BYTES_MAX` bytes (none would be format 1 or 2).
    let (state, tag_len) = match h[5] {
        RECORD_MARKER => (0, 0),
        RECORD_MARKER_STATE if h[7] != 0 => (h[7], 0),
        RECORD_MARKER_TAG if (1..=TAG_BYTES_MAX).contains(&usize::from(h[11])) => (h[7], usize::from(h[11])),
        _ => return Err(Error::corrupt(offset, "record marker missing")),
    };
    let short_key_len = h[5] != RECORD_MARKER;
    let kind = match h[4] {
        KIND_PUT => RecordKind::Put,
        KIND_DELETE => RecordKind::Delete,
        other => return Err(Error::corrupt(offset, format!("unknown record kind {other:#04x}"))),
    };
    // In formats 2 and 3 byte 7 is the state, so the key length is byte 6 alone; in format
    // 3 byte 11 is the tag length, so the value length is bytes 8 to 10.
    let key_len = if short_key_len { u16::from(h[6]) } else { u16::from_le_bytes([h[6], h[7]]) } as usize;
    let value_len = u32::from_le_bytes([h[8], h[9], h[10], if tag_len == 0 { h[11] } else { 0 }]) as usize;
    if key_len == 0 || key_len > KEY_BYTES_MAX {
        return Err(Error::corrupt(offset, format!("bad key length {key_len}")));
    }
    if value_len > VALUE_BYTES_MAX || (kind == RecordKind::Delete && value_len != 0) {
        return Err(Error::corrupt(offset, format!("bad value length {value_len}")));
    }
    let meta = Meta {
        flags: u32::from_le_bytes([h[12], h[13], h[14], h[15]]),
        seq: u64::from_le_bytes([h[16], h[17], h[18], h[19], h[20], h[21], h[22], h[23]]),
        expiry: u32::from_le_bytes([h[24], h[25], h[26], h[27]]),
        state,
    };
    let crc = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let durable = u32::from_le_bytes([h[28], h[29], h[30], h[31]]) as u64 * OFFSET_UNIT;
    Ok(Header { durable, crc, kind, key_len, value_len, tag_len, meta })
}

/// Check the checksum and zero padding of a whole record (`buf.len() >= total_len`).
pub(crate) fn verify(buf: &[u8], offset: u64, header: &Header) -> Result<(), Error> {
    let total = header.total_len();
    let Some(rec) = buf.get(..total) else {
        return Err(Error::corrupt(offset, "record truncated"));
    };
    let body_end = RECORD_HEADER_BYTES + header.key_len + header.value_len + header.tag_len;
    if crc32c::crc32c(&rec[4..body_end]) != header.crc {
        return Err(Error::corrupt(offset, "record checksum mismatch"));
    }
    if rec[body_end..].iter().any(|&b| b != 0) {
        return Err(Error::corrupt(offset, "record padding is not zero"));
    }
    Ok(())
}

/// The key bytes of a record buffer whose header was parsed.
pub(crate) fn key_of<'a>(buf: &'a [u8], header: &Header) -> &'a [u8] {
    &buf[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + header.key_len]
}

/// The value bytes of a record buffer whose header was parsed.
pub(crate) fn value_of<'a>(buf: &'a [u8], header: &Header) -> &'a [u8] {
    let start = RECORD_HEADER_BYTES + header.key_len;
    &buf[start..start + header.value_len]
}

/// The caller tag of a record buffer whose header was parsed (empty: none).
pub(crate) fn tag_of<'a>(buf: &'a [u8], header: &Header) -> &'a [u8] {
    let start = RECORD_HEADER_BYTES + header.key_len + header.value_len;
    &buf[start..start + header.tag_len]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_roundtrips_and_bitflips_detected() {
        for len in [16usize, 32, 48, 4080] {
            let mut buf = Vec::new();
            encode_pad(&mut buf, len).unwrap();
            assert_eq!(pad_len(&buf, 0).unwrap(), Some(len));
            verify_pad(&buf, 0, len).unwrap();
            // A padding record is never a put or delete.
            assert!(parse_header(&[buf.clone(), vec![0; 32]].concat(), 0).is_err());
            for i in 0..len {
                for bit in 0..8 {
                    let mut b = buf.clone();
                    b[i] ^= 1 << bit;
                    let bad = match pad_len(&b, 0) {
                        Ok(Some(l)) => verify_pad(&b, 0, l).is_err() || l != len,
                        Ok(None) => true, // no longer a padding record: parsed as a record, which fails
                        Err(_) => true,
                    };
                    assert!(bad, "pad {len}: flip at byte {i} bit {bit} not detected");
                }
            }
        }
        for bad_len in [0usize, 8, 24, 4096] {
            assert!(encode_pad(&mut Vec::new(), bad_len).is_err());
        }
        let rec = encode(RecordKind::Put, b"k", b"v", &[], Meta::default(), 0).unwrap();
        assert_eq!(pad_len(&rec, 0).unwrap(), None);
    }

    #[test]
    fn crc32c_3_matches_the_crate() {
        let data: Vec<u8> = (0..2000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for (la, lb, lc) in
            [(0, 0, 0), (1, 9, 17), (300, 300, 300), (301, 17, 1999), (8, 16, 24), (1000, 3, 64)]
        {
            for shift in 0..3 {
                let (a, b, c) = (&data[shift..shift + la], &data[7..7 + lb], &data[1..1 + lc]);
                let want = [crc32c::crc32c(a), crc32c::crc32c(b), crc32c::crc32c(c)];
                assert_eq!(crc32c_3(a, b, c), want, "{la} {lb} {lc} shift {shift}");
            }
        }
    }

    #[test]
    fn sealed_records_equal_encoded_ones() {
        let meta = Meta { seq: 9, flags: 1, expiry: 0, state: 0 };
        let ops: Vec<(Vec<u8>, Vec<u8>)> =
            (0..7).map(|i| (format!("key-{i}").into_bytes(), vec![b'v'; 37 * i])).collect();
        let (mut sealed, mut plain, mut recs) = (Vec::new(), Vec::new(), Vec::new());
        for (k, v) in &ops {
            recs.push((sealed.len(), body_len(k, v, &[])));
            encode_unsealed(&mut sealed, RecordKind::Put, k, v, &[], meta, 64);
            encode_into(&mut plain, RecordKind::Put, k, v, &[], meta, 64).unwrap();
        }
        seal_records(&mut sealed, &recs);
        assert_eq!(sealed, plain);
        for ((k, v), &(start, _)) in ops.iter().zip(&recs) {
            check_encoded(&sealed[start..], RecordKind::Put, k, v, &[], meta, 64).unwrap();
        }
        // A wrong byte fails the self-check.
        sealed[recs[2].0 + 40] ^= 1;
        let (k, v) = &ops[2];
        assert!(check_encoded(&sealed[recs[2].0..], RecordKind::Put, k, v, &[], meta, 64).is_err());
    }

    /// A put as format 1 lays it out (docs/FORMAT.md §2.1), built by hand: what every release
    /// before the state byte wrote. It must read back, with state 0, and a record with state
    /// 0 must still be written exactly so.
    #[test]
    fn format_1_records_read_and_are_still_written() {
        let mut old = vec![0u8; 48];
        old[4] = b'P';
        old[5] = 0xF1;
        old[6..8].copy_from_slice(&3u16.to_le_bytes());
        old[8..12].copy_from_slice(&2u32.to_le_bytes());
        old[12..16].copy_from_slice(&5u32.to_le_bytes());
        old[16..24].copy_from_slice(&77u64.to_le_bytes());
        old[24..28].copy_from_slice(&99u32.to_le_bytes());
        old[28..32].copy_from_slice(&2u32.to_le_bytes());
        old[32..37].copy_from_slice(b"keyvv");
        let crc = crc32c::crc32c(&old[4..37]);
        old[0..4].copy_from_slice(&crc.to_le_bytes());
        let h = parse_header(&old, 0).unwrap();
        verify(&old, 0, &h).unwrap();
        assert_eq!(h.meta, Meta { seq: 77, flags: 5, expiry: 99, state: 0 });
        assert_eq!((key_of(&old, &h), value_of(&old, &h)), (&b"key"[..], &b"vv"[..]));
        assert_eq!(encode(RecordKind::Put, b"key", b"vv", &[], h.meta, 32).unwrap(), old);
    }

    #[test]
    fn format_2_carries_the_state_byte() {
        for state in [1u8, 2, 3, 0xFF] {
            let meta = Meta { seq: 7, flags: 3, expiry: 99, state };
            let key = vec![b'k'; KEY_BYTES_MAX];
            let buf = encode(RecordKind::Put, &key, b"value", &[], meta, 0).unwrap();
            assert_eq!((buf[5], buf[6], buf[7]), (0xF2, KEY_BYTES_MAX as u8, state));
            let h = parse_header(&buf, 0).unwrap();
            verify(&buf, 0, &h).unwrap();
            assert_eq!((h.meta, key_of(&buf, &h)), (meta, &key[..]));
        }
        // Format 2 with a zero state is never written, so it is garbage.
        let mut buf =
            encode(RecordKind::Put, b"k", b"v", &[], Meta { state: 1, ..Meta::default() }, 0).unwrap();
        buf[7] = 0;
        assert!(parse_header(&buf, 0).is_err());
    }

    /// Seeded random headers with a valid checksum (so parsing gets past it): the decoder
    /// never panics, and whatever it accepts is canonical: encoding what it read gives the
    /// same bytes. Reproduce with the printed seed.
    #[test]
    fn random_headers_decode_canonically() {
        use rand::{Rng, SeedableRng};
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let (mut accepted, mut tagged) = (0, 0);
        for _ in 0..20_000 {
            let mut buf = vec![0u8; 160];
            rng.fill(&mut buf[4..32]);
            buf[4] = [b'P', b'D', b'Z', rng.gen()][rng.gen_range(0..4)];
            buf[5] = [RECORD_MARKER, RECORD_MARKER_STATE, RECORD_MARKER_TAG, rng.gen()][rng.gen_range(0..4)];
            buf[6] = rng.gen_range(0..40);
            buf[7] = [0, 0, 1, 2, 3, rng.gen()][rng.gen_range(0..6)];
            buf[8..12].copy_from_slice(&rng.gen_range(0u32..8).to_le_bytes());
            // A tag length (format 3), around its bounds, or a stray high value-length byte.
            buf[11] = [0, 0, 1, TAG_BYTES_MAX as u8, TAG_BYTES_MAX as u8 + 1, rng.gen_range(0..48)]
                [rng.gen_range(0..6)];
            buf[28..32].fill(0);
            rng.fill(&mut buf[32..]);
            let Ok(h) = parse_header(&buf, 0) else { continue };
            let end = RECORD_HEADER_BYTES + h.key_len + h.value_len + h.tag_len;
            buf.truncate(h.total_len());
            buf[end..].fill(0);
            let crc = crc32c::crc32c(&buf[4..end]);
            buf[0..4].copy_from_slice(&crc.to_le_bytes());
            let h = parse_header(&buf, 0).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            verify(&buf, 0, &h).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            let again =
                encode(h.kind, key_of(&buf, &h), value_of(&buf, &h), tag_of(&buf, &h), h.meta, h.durable);
            assert_eq!(again.ok().as_ref(), Some(&buf), "seed {seed}");
            accepted += 1;
            tagged += usize::from(h.tag_len > 0);
        }
        assert!(accepted > 1000, "seed {seed}: only {accepted} headers accepted");
        assert!(tagged > 100, "seed {seed}: only {tagged} tagged headers accepted");
    }

    #[test]
    fn state_record_bitflips_detected() {
        let meta = Meta { seq: 7, flags: 3, expiry: 99, state: 3 };
        let buf = encode(RecordKind::Put, b"key", b"value!", &[], meta, 4096).unwrap();
        assert_every_bitflip_detected(&buf);
    }

    /// Every single-bit flip of the record in `buf` fails its header parse or its checksum.
    fn assert_every_bitflip_detected(buf: &[u8]) {
        for i in 0..buf.len() {
            for bit in 0..8 {
                let mut b = buf.to_vec();
                b[i] ^= 1 << bit;
                let bad = parse_header(&b, 0).and_then(|h| verify(&b, 0, &h));
                assert!(bad.is_err(), "flip at byte {i} bit {bit} not detected");
            }
        }
    }

    #[test]
    fn roundtrip_and_bitflips_detected() {
        let meta = Meta { seq: 7, flags: 3, expiry: 99, state: 0 };
        let buf = encode(RecordKind::Put, b"key", b"value!", &[], meta, 4096).unwrap();
        assert_eq!(buf.len() % 16, 0);
        let h = parse_header(&buf, 0).unwrap();
        verify(&buf, 0, &h).unwrap();
        assert_every_bitflip_detected(&buf);
    }

    /// Format 3 (docs/FORMAT.md §2.1): a tag after the value, any state, both kinds; every
    /// bit flip is caught, and the tag's bytes are exactly what was given.
    #[test]
    fn format_3_carries_a_tag_after_the_value() {
        for (kind, value) in [(RecordKind::Put, &b"value!"[..]), (RecordKind::Delete, &b""[..])] {
            for (state, tag_len) in [(0u8, 1usize), (0, 17), (3, 25), (0xFF, TAG_BYTES_MAX)] {
                let tag: Vec<u8> = (0..tag_len as u8).map(|i| i.wrapping_mul(37) ^ 0xA5).collect();
                let meta = Meta { seq: 1 << 52, flags: 3, expiry: 99, state };
                let buf = encode(kind, b"key", value, &tag, meta, 4096).unwrap();
                assert_eq!((buf[5], buf[6], buf[7], buf[11]), (0xF3, 3, state, tag_len as u8));
                assert_eq!(buf.len(), pad_to_unit(RECORD_HEADER_BYTES + 3 + value.len() + tag_len));
                let h = parse_header(&buf, 0).unwrap();
                verify(&buf, 0, &h).unwrap();
                assert_eq!((h.kind, h.meta, h.total_len()), (kind, meta, buf.len()));
                assert_eq!(
                    (key_of(&buf, &h), value_of(&buf, &h), tag_of(&buf, &h)),
                    (&b"key"[..], value, &tag[..])
                );
                assert_every_bitflip_detected(&buf);
            }
        }
        // A value of the largest size keeps its length in three bytes beside the tag's.
        let big = vec![7u8; VALUE_BYTES_MAX];
        let buf = encode(RecordKind::Put, b"k", &big, b"tag", Meta::default(), 0).unwrap();
        let h = parse_header(&buf, 0).unwrap();
        assert_eq!((h.value_len, h.tag_len), (VALUE_BYTES_MAX, 3));
        // Too long a tag is refused; format 3 with no tag or an oversized one is garbage.
        let long = vec![1u8; TAG_BYTES_MAX + 1];
        assert!(encode(RecordKind::Put, b"k", b"v", &long, Meta::default(), 0).is_err());
        let mut buf = encode(RecordKind::Put, b"k", b"v", b"t", Meta::default(), 0).unwrap();
        for bad in [0u8, TAG_BYTES_MAX as u8 + 1] {
            buf[11] = bad;
            assert!(parse_header(&buf, 0).is_err(), "tag length {bad}");
        }
        // Without a tag a record is written in format 1 or 2 as before.
        let plain = encode(RecordKind::Put, b"k", b"v", &[], Meta::default(), 0).unwrap();
        assert_eq!(plain[5], 0xF1);
    }
}
