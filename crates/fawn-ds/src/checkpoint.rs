//! Index checkpoints: an image of the index plus the log position it covers, checksummed,
//! written to a temp file, fsynced, renamed over the old one, directory fsynced. Pure encode
//! and decode plus the atomic file replacement; `Inner::write_checkpoint` takes the snapshot.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use crate::error::Error;
use crate::files::{CHECKPOINT_FILE, CHECKPOINT_TMP};
use crate::index::{image, Index};
use crate::limits::{LOG_HEADER_BYTES, OFFSET_UNIT};
use crate::tags::RecentTags;

const MAGIC: [u8; 8] = *b"FAWNCKPT";
const TRAILER_MAGIC: [u8; 4] = *b"FCKE";
/// Ends a version 8 checkpoint, after its recent tags section, that section's length and
/// its checksum.
const TAGS_MAGIC: [u8; 4] = *b"FTGE";
/// Version 2 added `live_bytes`, version 3 the cold log (hot/cold separation: its nonce,
/// length and live bytes; index offsets with the cold bit), version 4 the primary bucket from
/// the low key-id bits (docs/FORMAT.md §1), version 5 the growth scan state instead of a
/// bucket migration point, version 6 the origin table size of stash entries (entries a
/// growth scan could not place keep their old bucket), version 7 the linear-hashing index
/// (level, split pointer, 13-bit fragments with split bits, refresh scan state). An older
/// checkpoint is rejected (the index is rebuilt from the logs once, which also recomputes
/// the live bytes). Version 8 added the recent tags section at the end (version 7 is read
/// as having no tags).
const VERSION: u32 = 8;
/// The oldest version still read.
const VERSION_READ_MIN: u32 = 7;
const HEADER_BYTES: usize = 96;
/// Bytes covered by the header checksum (which follows them).
const HEADER_CRC_AT: usize = 88;
/// Where the header holds the image's length.
const IMAGE_LEN_AT: usize = 48;

/// What a valid checkpoint holds.
pub(crate) struct Loaded {
    pub index: Index,
    pub covered_end: u64,
    pub max_seq: u64,
    pub live_bytes: u64,
    pub cold_live_bytes: u64,
    pub tags: RecentTags,
}

/// The header fields besides the nonce and the image.
pub(crate) struct Sums {
    pub covered_end: u64,
    pub max_seq: u64,
    pub live_bytes: u64,
    pub cold_nonce: u64,
    pub cold_len: u64,
    pub cold_live: u64,
}

/// The checkpoint of `index` and `tags` (those of the records it covers, as
/// `RecentTags::encode` wrote them) for the log with `nonce`.
pub(crate) fn encode(nonce: u64, sums: &Sums, index: &Index, tags: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_BYTES];
    image::write(index, &mut out);
    let image_len = (out.len() - HEADER_BYTES) as u64;
    out[0..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&VERSION.to_le_bytes());
    out[12..16].copy_from_slice(&(OFFSET_UNIT as u32).to_le_bytes());
    out[16..24].copy_from_slice(&nonce.to_le_bytes());
    out[24..32].copy_from_slice(&sums.covered_end.to_le_bytes());
    out[32..40].copy_from_slice(&sums.max_seq.to_le_bytes());
    out[40..48].copy_from_slice(&index.live().to_le_bytes());
    out[IMAGE_LEN_AT..IMAGE_LEN_AT + 8].copy_from_slice(&image_len.to_le_bytes());
    out[56..64].copy_from_slice(&sums.live_bytes.to_le_bytes());
    out[64..72].copy_from_slice(&sums.cold_nonce.to_le_bytes());
    out[72..80].copy_from_slice(&sums.cold_len.to_le_bytes());
    out[80..88].copy_from_slice(&sums.cold_live.to_le_bytes());
    let hcrc = crc32c::crc32c(&out[0..HEADER_CRC_AT]);
    out[HEADER_CRC_AT..HEADER_CRC_AT + 4].copy_from_slice(&hcrc.to_le_bytes());
    let icrc = crc32c::crc32c(&out[HEADER_BYTES..]);
    out.extend_from_slice(&icrc.to_le_bytes());
    out.extend_from_slice(&TRAILER_MAGIC);
    let tags_at = out.len();
    out.extend_from_slice(tags);
    let tags_len = (out.len() - tags_at) as u32;
    let tcrc = crc32c::crc32c(&out[tags_at..]);
    out.extend_from_slice(&tags_len.to_le_bytes());
    out.extend_from_slice(&tcrc.to_le_bytes());
    out.extend_from_slice(&TAGS_MAGIC);
    out
}

/// Splits a version 8 checkpoint's recent tags off its end: (the rest, the tags).
fn split_tags(buf: &[u8]) -> Result<(&[u8], RecentTags), String> {
    let n = buf.len();
    if n < HEADER_BYTES + 8 + 12 || buf[n - 4..] != TAGS_MAGIC {
        return Err("recent tags trailer missing".into());
    }
    let tags_len = u32_at(buf, n - 12) as usize;
    let Some(tags_at) = (n - 12).checked_sub(tags_len).filter(|&at| at >= HEADER_BYTES + 8) else {
        return Err("recent tags longer than the file".into());
    };
    let section = &buf[tags_at..n - 12];
    if u32_at(buf, n - 8) != crc32c::crc32c(section) {
        return Err("recent tags checksum mismatch".into());
    }
    Ok((&buf[..tags_at], RecentTags::decode(section)?))
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Parse and validate a checkpoint for the log with `nonce` and length `log_len`, and the
/// cold log `(nonce, length)` (`(0, 0)` without one).
pub(crate) fn decode(buf: &[u8], nonce: u64, log_len: u64, cold: (u64, u64)) -> Result<Loaded, String> {
    if buf.len() < HEADER_BYTES + 8 || buf[0..8] != MAGIC {
        return Err("bad magic or too short".into());
    }
    let version = u32_at(buf, 8);
    if !(VERSION_READ_MIN..=VERSION).contains(&version) {
        return Err(format!("unsupported version {version}"));
    }
    if u32_at(buf, HEADER_CRC_AT) != crc32c::crc32c(&buf[0..HEADER_CRC_AT]) || u32_at(buf, 92) != 0 {
        return Err("header checksum mismatch".into());
    }
    let (buf, tags) = if version >= 8 { split_tags(buf)? } else { (buf, RecentTags::default()) };
    if u32_at(buf, 12) as u64 != OFFSET_UNIT {
        return Err(format!("unsupported unit {}", u32_at(buf, 12)));
    }
    if u64_at(buf, 16) != nonce {
        return Err("checkpoint belongs to a different log file".into());
    }
    let covered_end = u64_at(buf, 24);
    if covered_end < LOG_HEADER_BYTES || covered_end > log_len || !covered_end.is_multiple_of(OFFSET_UNIT) {
        return Err(format!("covers log end {covered_end}, but the log has {log_len} bytes"));
    }
    let image_len = u64_at(buf, IMAGE_LEN_AT);
    if image_len != (buf.len() - HEADER_BYTES - 8) as u64 {
        return Err("image length does not match the file size".into());
    }
    let image_bytes = &buf[HEADER_BYTES..buf.len() - 8];
    let trailer = &buf[buf.len() - 8..];
    if trailer[4..8] != TRAILER_MAGIC || u32_at(trailer, 0) != crc32c::crc32c(image_bytes) {
        return Err("image checksum mismatch".into());
    }
    if (u64_at(buf, 64), u64_at(buf, 72)) != cold {
        return Err("checkpoint belongs to a different cold log".into());
    }
    let first = (LOG_HEADER_BYTES / OFFSET_UNIT) as u32;
    let bounds = image::Bounds { first, end: covered_end / OFFSET_UNIT, cold_end: cold.1 / OFFSET_UNIT };
    let index = image::read(image_bytes, bounds)?;
    if index.live() != u64_at(buf, 40) {
        return Err("live key count does not match the image".into());
    }
    Ok(Loaded {
        index,
        covered_end,
        max_seq: u64_at(buf, 32),
        live_bytes: u64_at(buf, 56),
        cold_live_bytes: u64_at(buf, 80),
        tags,
    })
}

/// For the fuzz harness (`fuzzing.rs`): writes the image length and the three checksums of
/// the version 8 layout that the input's own lengths call for (the recent tags section's,
/// the image's, the header's), so that `decode`'s parsers see arbitrary content.
pub(crate) fn reseal(buf: &mut [u8]) {
    let n = buf.len();
    if n < HEADER_BYTES + 8 + 12 {
        return;
    }
    let mut end = n;
    let tags_len = u32_at(buf, n - 12) as usize;
    if let Some(at) = (n - 12).checked_sub(tags_len).filter(|&at| at >= HEADER_BYTES + 8) {
        let crc = crc32c::crc32c(&buf[at..n - 12]);
        buf[n - 8..n - 4].copy_from_slice(&crc.to_le_bytes());
        end = at;
    }
    let crc = crc32c::crc32c(&buf[HEADER_BYTES..end - 8]);
    buf[end - 8..end - 4].copy_from_slice(&crc.to_le_bytes());
    let image_len = (end - 8 - HEADER_BYTES) as u64;
    buf[IMAGE_LEN_AT..IMAGE_LEN_AT + 8].copy_from_slice(&image_len.to_le_bytes());
    let crc = crc32c::crc32c(&buf[..HEADER_CRC_AT]);
    buf[HEADER_CRC_AT..HEADER_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Atomically replace the checkpoint file: temp file, fsync, rename, fsync directory.
pub(crate) fn replace_file(dir: &Path, bytes: &[u8]) -> Result<(), Error> {
    let tmp = dir.join(CHECKPOINT_TMP);
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, dir.join(CHECKPOINT_FILE))?;
        File::open(dir)?.sync_all()
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io("writing the index checkpoint", e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums() -> Sums {
        Sums { covered_end: 64, max_seq: 9, live_bytes: 0, cold_nonce: 0, cold_len: 0, cold_live: 0 }
    }

    /// Version 8 carries the recent tags; version 7 (written before them) still loads, with
    /// none; a damaged tags section rejects the checkpoint (the logs rebuild it).
    #[test]
    fn recent_tags_round_trip_and_version_7_reads_without_them() {
        let mut tags = RecentTags::default();
        tags.push(5, b"first");
        tags.push(9, &[7u8; crate::limits::TAG_BYTES_MAX]);
        let index = Index::for_keys(0);
        let mut section = Vec::new();
        tags.encode(&mut section);
        let v8 = encode(42, &sums(), &index, &section);
        let loaded = decode(&v8, 42, 64, (0, 0)).expect("v8");
        assert_eq!((loaded.tags, loaded.max_seq), (tags.clone(), 9));
        // The same checkpoint as version 7 wrote it: no tags section.
        let mut v7 = v8[..v8.len() - 12 - section.len()].to_vec();
        v7[8..12].copy_from_slice(&7u32.to_le_bytes());
        let hcrc = crc32c::crc32c(&v7[0..HEADER_CRC_AT]);
        v7[HEADER_CRC_AT..HEADER_CRC_AT + 4].copy_from_slice(&hcrc.to_le_bytes());
        assert_eq!(decode(&v7, 42, 64, (0, 0)).expect("v7").tags, RecentTags::default());
        for at in [v8.len() - 1, v8.len() - 6, v8.len() - 10, v8.len() - 13] {
            let mut bad = v8.clone();
            bad[at] ^= 1;
            assert!(decode(&bad, 42, 64, (0, 0)).is_err(), "flip at {at} of {}", v8.len());
        }
        assert!(decode(&v8[..v8.len() - 1], 42, 64, (0, 0)).is_err());
    }
}
