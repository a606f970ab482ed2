//! The log file: positional I/O, the file header, fault injection and a sequential scanner.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::Error;
use crate::limits::{DATASTORE_BYTES_MAX, LOG_HEADER_BYTES, OFFSET_UNIT, RECORD_HEADER_BYTES};
use crate::record::{self, Header};

const LOG_MAGIC: [u8; 8] = *b"FAWNLOG\0";
/// Version written into new logs. 2 = may hold padding records (`Options::page_aligned_records`);
/// version 1 logs (no padding) still open and are never padded (a version 1 reader would
/// take padding for damage), until compaction rewrites them as version 2.
pub(crate) const LOG_VERSION: u32 = 2;
/// Oldest log version this code opens.
const LOG_VERSION_MIN: u32 = 1;

/// An I/O operation a `FaultInjector` may fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    /// Appending a record to the log.
    Write,
    /// `fdatasync` of the log.
    Sync,
}

type FaultFn = dyn Fn(IoOp) -> Option<io::Error> + Send + Sync;

/// Test hook: called before every log append and fsync; returning an error makes that
/// operation fail as if the device had. Costs one branch on the hot path when unset.
#[derive(Clone, Default)]
pub struct FaultInjector(Option<Arc<FaultFn>>);

impl FaultInjector {
    /// A hook that fails an operation whenever `f` returns `Some(error)`.
    pub fn new(f: impl Fn(IoOp) -> Option<io::Error> + Send + Sync + 'static) -> FaultInjector {
        FaultInjector(Some(Arc::new(f)))
    }

    fn check(&self, op: IoOp) -> io::Result<()> {
        match self.0.as_ref().and_then(|f| f(op)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl std::fmt::Debug for FaultInjector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "FaultInjector(set)" } else { "FaultInjector(none)" })
    }
}

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
const SCAN_CHUNK: usize = 1 << 20;

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
            let want = (n.max(SCAN_CHUNK) as u64).min(self.end.saturating_sub(at)) as usize;
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
        let bytes = self.fill(at, total)?;
        if bytes.len() < total {
            return Err(Error::corrupt(at, "record truncated"));
        }
        record::verify(bytes, at, &header)?;
        self.pos = at + total as u64;
        let from = (at - self.buf_start) as usize;
        Ok(Some((at, header, &self.buf[from..from + total])))
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
