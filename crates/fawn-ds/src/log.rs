//! The log file: positional I/O, the file header, fault injection and a sequential scanner.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::Error;
use crate::fault::{FaultInjector, IoOp};
use crate::limits::{DATASTORE_BYTES_MAX, LOG_HEADER_BYTES, OFFSET_UNIT, RECORD_HEADER_BYTES};
use crate::record::{self, Header};

const LOG_MAGIC: [u8; 8] = *b"FAWNLOG\0";
/// Version written into new logs. 2 = may hold padding records (`Options::page_aligned_records`);
/// version 1 logs (no padding) still open and are never padded (a version 1 reader would
/// take padding for damage), until compaction rewrites them as version 2.
pub(crate) const LOG_VERSION: u32 = 2;
/// Oldest log version this code opens.
const LOG_VERSION_MIN: u32 = 1;

/// The open log file.
#[derive(Debug)]
pub(crate) struct LogFile {
    file: File,
    faults: FaultInjector,
    /// Format version of this log (`LOG_VERSION` for a log created now).
    version: u32,
    /// `read_at` calls (`Stats::log_reads`).
    reads: AtomicU64,
}

impl LogFile {
    pub fn new(file: File, faults: FaultInjector) -> LogFile {
        // Lookups are random reads: readahead would only multiply device reads. Scans use
        // 1 MiB reads and do not need it. Advisory; failure is harmless.
        // SAFETY: posix_fadvise on a valid owned descriptor has no memory-safety preconditions.
        let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        LogFile { file, faults, version: LOG_VERSION, reads: AtomicU64::new(0) }
    }

    /// The same log, marked as having the format `version` (from its header).
    pub fn with_version(self, version: u32) -> LogFile {
        LogFile { version, ..self }
    }

    /// Whether padding records may be written to this log (version 2 and later).
    pub fn allows_padding(&self) -> bool {
        self.version >= 2
    }

    /// `read_at` calls so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Read up to `buf.len()` bytes at `offset`; returns how many were read (short at EOF).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize, Error> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io("reading the log", e)),
            }
        }
        Ok(done)
    }

    pub fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.faults.check(IoOp::Write)?;
        self.file.write_all_at(buf, offset)
    }

    pub fn sync_data(&self) -> io::Result<()> {
        self.faults.check(IoOp::Sync)?;
        self.file.sync_data()
    }

    pub fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    pub fn len(&self) -> Result<u64, Error> {
        let m = self.file.metadata().map_err(|e| Error::io("reading log metadata", e))?;
        Ok(m.len())
    }
}

/// The 32-byte log file header.
pub(crate) fn encode_header(nonce: u64) -> [u8; LOG_HEADER_BYTES as usize] {
    let mut h = [0u8; LOG_HEADER_BYTES as usize];
    h[0..8].copy_from_slice(&LOG_MAGIC);
    h[8..12].copy_from_slice(&LOG_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(OFFSET_UNIT as u32).to_le_bytes());
    h[16..24].copy_from_slice(&nonce.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The version field of a log header that `decode_header` accepted.
pub(crate) fn header_version(h: &[u8]) -> u32 {
    match h.get(8..12) {
        Some(w) => u32::from_le_bytes([w[0], w[1], w[2], w[3]]),
        None => LOG_VERSION_MIN,
    }
}

/// Check a log header; returns the log's nonce (ties checkpoints to this log).
pub(crate) fn decode_header(h: &[u8]) -> Result<u64, Error> {
    if h.len() < LOG_HEADER_BYTES as usize || h[0..8] != LOG_MAGIC {
        return Err(Error::corrupt(0, "not a FAWN-DS log (bad magic)"));
    }
    let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    if word(28) != crc32c::crc32c(&h[0..28]) {
        return Err(Error::corrupt(0, "log header checksum mismatch"));
    }
    if !(LOG_VERSION_MIN..=LOG_VERSION).contains(&word(8)) {
        return Err(Error::corrupt(0, format!("unsupported log version {}", word(8))));
    }
    if word(12) as u64 != OFFSET_UNIT {
        return Err(Error::corrupt(0, format!("unsupported offset unit {}", word(12))));
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&h[16..24]);
    Ok(u64::from_le_bytes(n))
}

/// What follows a bad record.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ValidAfter {
    pub records: u64,
    pub max_durable: u64,
}

/// A checked record in the scanner's buffer: offset, header, whole record bytes.
pub(crate) type RawRecord<'a> = (u64, Header, &'a [u8]);

/// Bytes read per refill when scanning.
const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// Reads records in log order from `pos` up to `end`, through a buffer.
pub(crate) struct Scanner {
    log: Arc<LogFile>,
    pub pos: u64,
    end: u64,
    buf: Vec<u8>,
    buf_start: u64,
}

impl std::fmt::Debug for Scanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scanner").field("pos", &self.pos).field("end", &self.end).finish()
    }
}

impl Scanner {
    pub fn new(log: Arc<LogFile>, pos: u64, end: u64) -> Scanner {
        Scanner { log, pos, end, buf: Vec::new(), buf_start: 0 }
    }

    /// Make `[at, at+n)` available in the buffer (fewer bytes if `end` comes first).
    fn fill(&mut self, at: u64, n: usize) -> Result<&[u8], Error> {
        let have = at >= self.buf_start && at + n as u64 <= self.buf_start + self.buf.len() as u64;
        if !have {
            let want = (n.max(SCAN_CHUNK_BYTES) as u64).min(self.end.saturating_sub(at)) as usize;
            self.buf.resize(want, 0);
            let got = self.log.read_at(&mut self.buf, at)?;
            self.buf.truncate(got);
            self.buf_start = at;
        }
        let from = (at - self.buf_start) as usize;
        let to = (from + n).min(self.buf.len());
        Ok(&self.buf[from..to])
    }

    /// The next record at `pos`, checked; `Ok(None)` exactly at `end`. On error `pos` stays
    /// at the bad record.
    pub fn next_record(&mut self) -> Result<Option<RawRecord<'_>>, Error> {
        let Some((at, header, total)) = self.next_header()? else { return Ok(None) };
        let bytes = self.fill(at, total)?;
        if bytes.len() < total {
            return Err(Error::corrupt(at, "record truncated"));
        }
        record::verify(bytes, at, &header)?;
        self.pos = at + total as u64;
        let from = (at - self.buf_start) as usize;
        Ok(Some((at, header, &self.buf[from..from + total])))
    }

    /// The next record's header and key, **without checking its checksum**: for passes
    /// whose result is only an estimate (sizing the index before a rebuild), where a
    /// damaged record costs accuracy, never data. Saves checksumming every value. The
    /// header's own fields are still checked, and a record must fit before `end`.
    pub fn next_key_unchecked(&mut self) -> Result<Option<(Header, &[u8])>, Error> {
        let Some((at, header, total)) = self.next_header()? else { return Ok(None) };
        let want = RECORD_HEADER_BYTES + header.key_len;
        if self.fill(at, want)?.len() < want {
            return Err(Error::corrupt(at, "record truncated"));
        }
        self.pos = at + total as u64;
        let from = (at - self.buf_start) as usize;
        Ok(Some((header, &self.buf[from + RECORD_HEADER_BYTES..from + want])))
    }

    /// Skip padding, then parse the header at `pos` and check that the record it describes
    /// fits: its offset, header and length (`Ok(None)` exactly at `end`).
    fn next_header(&mut self) -> Result<Option<(u64, Header, usize)>, Error> {
        // Padding before a page-aligned record: checked, then skipped.
        while self.pos < self.end && self.skip_padding()? {}
        let at = self.pos;
        if at >= self.end {
            return Ok(None);
        }
        if !at.is_multiple_of(OFFSET_UNIT) {
            return Err(Error::corrupt(at, "offset is not a record boundary"));
        }
        let header = record::parse_header(self.fill(at, RECORD_HEADER_BYTES)?, at)?;
        if header.durable > at {
            return Err(Error::corrupt(at, "record claims durability beyond its own offset"));
        }
        let total = header.total_len();
        if at + total as u64 > self.end {
            return Err(Error::corrupt(at, "record extends past the end of the log"));
        }
        if at + total as u64 > DATASTORE_BYTES_MAX {
            return Err(Error::corrupt(at, "record beyond the addressable log size"));
        }
        Ok(Some((at, header, total)))
    }

    /// If a padding record starts at `pos`, check it and move past it.
    fn skip_padding(&mut self) -> Result<bool, Error> {
        let at = self.pos;
        if !at.is_multiple_of(OFFSET_UNIT) {
            return Err(Error::corrupt(at, "offset is not a record boundary"));
        }
        let Some(len) = record::pad_len(self.fill(at, record::PAD_HEADER_BYTES)?, at)? else {
            return Ok(false);
        };
        if at + len as u64 > self.end {
            return Err(Error::corrupt(at, "padding extends past the end of the log"));
        }
        record::verify_pad(self.fill(at, len)?, at, len)?;
        self.pos = at + len as u64;
        Ok(true)
    }

    /// After a bad record at `bad`: the valid records found at unit boundaries after it
    /// (resynchronising past garbage), and the highest durable offset they carry.
    pub fn valid_after(&mut self, bad: u64) -> Result<ValidAfter, Error> {
        let mut found = ValidAfter::default();
        self.pos = bad + OFFSET_UNIT;
        while self.pos < self.end {
            match self.next_record() {
                Ok(Some((_, header, _))) => {
                    found.records += 1;
                    found.max_durable = found.max_durable.max(header.durable);
                }
                Ok(None) => break,
                Err(Error::Corrupt { .. }) => self.pos += OFFSET_UNIT,
                Err(e) => return Err(e),
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Meta, RecordKind};
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    const SEED: u64 = 0x5ca77e;

    /// A log of random puts and deletes after a log header's worth of zeros; the records'
    /// (kind, key) in order.
    fn random_log(rng: &mut SmallRng) -> (Vec<u8>, Vec<(RecordKind, Vec<u8>)>) {
        let mut bytes = vec![0u8; LOG_HEADER_BYTES as usize];
        let mut records = Vec::new();
        for seq in 1..=rng.gen_range(1..200u64) {
            let key: Vec<u8> = (0..rng.gen_range(1..40)).map(|_| rng.gen()).collect();
            let (kind, value) = if rng.gen_bool(0.2) {
                (RecordKind::Delete, Vec::new())
            } else {
                (RecordKind::Put, vec![rng.gen(); rng.gen_range(0..3000)])
            };
            let rec = record::encode(kind, &key, &value, &[], Meta { seq, ..Meta::default() }, 0).unwrap();
            bytes.extend_from_slice(&rec);
            records.push((kind, key));
        }
        (bytes, records)
    }

    fn scanner_over(bytes: &[u8]) -> Scanner {
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, bytes).unwrap();
        let log = Arc::new(LogFile::new(file, FaultInjector::default()));
        Scanner::new(log, LOG_HEADER_BYTES, bytes.len() as u64)
    }

    /// On an intact log the unchecked key pass (index sizing) sees exactly the records
    /// written, in order, and ends at the log's end.
    #[test]
    fn unchecked_keys_are_the_records_written() {
        let mut rng = SmallRng::seed_from_u64(SEED);
        for case in 0..50 {
            let (bytes, records) = random_log(&mut rng);
            let mut sc = scanner_over(&bytes);
            let mut got = Vec::new();
            while let Some((header, key)) = sc.next_key_unchecked().unwrap() {
                got.push((header.kind, key.to_vec()));
            }
            assert_eq!(got, records, "seed {SEED:#x}, case {case}");
            assert_eq!(sc.pos, bytes.len() as u64, "seed {SEED:#x}, case {case}");
        }
    }

    /// Damaged logs (random bytes overwritten, or cut short) end the unchecked pass with an
    /// error or at the end, never a panic, and it never reads past the end it was given.
    #[test]
    fn unchecked_keys_survive_damage() {
        let mut rng = SmallRng::seed_from_u64(SEED + 1);
        for case in 0..300 {
            let (mut bytes, records) = random_log(&mut rng);
            for _ in 0..rng.gen_range(1..8) {
                let at = rng.gen_range(LOG_HEADER_BYTES as usize..bytes.len());
                bytes[at] = rng.gen();
            }
            if rng.gen_bool(0.3) {
                bytes.truncate(rng.gen_range(LOG_HEADER_BYTES as usize..=bytes.len()));
            }
            let mut sc = scanner_over(&bytes);
            let mut seen = 0;
            while let Ok(Some(_)) = sc.next_key_unchecked() {
                seen += 1;
                assert!(
                    seen <= records.len() + bytes.len() / OFFSET_UNIT as usize,
                    "seed {SEED:#x}, case {case}"
                );
            }
            assert!(sc.pos <= bytes.len() as u64, "seed {SEED:#x}, case {case}");
        }
    }
}
