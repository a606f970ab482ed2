//! The `LOGS` manifest: which hot and cold log files make up the datastore (docs/FORMAT.md §8).
//!
//! A maintenance operation that replaces the hot log writes, before its commit point, a
//! manifest naming both the state it starts from (`prev`) and the state it builds (`next`):
//! each state is a hot log nonce, a cold log nonce (0 = no cold log) and the cold log's
//! committed length. The commit point stays the `rename` of the new hot log over `data.log`:
//! at open, the nonce in `data.log`'s header says which of the two states is the real one,
//! and the cold log is brought to that state (a newly built cold log renamed into place,
//! appended bytes past the committed length cut, or an unused cold log removed).
//!
//! Version 2 adds each state's `max_seq` floor: a merge's new state needs the merged-in
//! store's floor, which must not become this store's before the commit point (a `MAXSEQ`
//! above the old state's records would survive a crash before it); the standing state's
//! floor counts at open like `MAXSEQ`.

use std::fs::{self, File, OpenOptions};
use std::path::Path;

use crate::error::Error;
use crate::fault::FaultInjector;
use crate::limits::LOG_HEADER_BYTES;
use crate::log::{self, LogFile};

pub(crate) const MANIFEST_FILE: &str = "LOGS";
const MANIFEST_TMP: &str = "LOGS.tmp";
/// The cold log.
pub(crate) const COLD_FILE: &str = "data.cold";
/// A cold log being built by a full compaction (renamed to `data.cold` after the commit).
pub(crate) const COLD_NEW_FILE: &str = "data.cold.compact";
const MAGIC: [u8; 8] = *b"FAWNLOGS";
/// Version 1: no floors (72 bytes); written when both floors are 0, so that builds before
/// version 2 still open such a store.
const VERSION_1: u32 = 1;
const BYTES_1: usize = 72;
/// Version 2: the two states' `max_seq` floors at 64 and 72, the CRC of bytes 0..80 at 80.
const VERSION_2: u32 = 2;
const BYTES_2: usize = 88;

/// One state of the datastore's files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LogState {
    pub hot_nonce: u64,
    /// 0: no cold log.
    pub cold_nonce: u64,
    /// Bytes of the cold log that belong to this state (0 without a cold log).
    pub cold_len: u64,
    /// A lower bound of the state's `max_seq` (0: none beyond `MAXSEQ` and the logs).
    pub seq_floor: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub next: LogState,
    pub prev: LogState,
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

pub(crate) fn encode(m: &Manifest) -> Vec<u8> {
    let floors = m.next.seq_floor != 0 || m.prev.seq_floor != 0;
    let (version, bytes) = if floors { (VERSION_2, BYTES_2) } else { (VERSION_1, BYTES_1) };
    let mut b = vec![0u8; bytes];
    b[0..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&version.to_le_bytes());
    for (i, v) in [
        m.next.hot_nonce,
        m.next.cold_nonce,
        m.next.cold_len,
        m.prev.hot_nonce,
        m.prev.cold_nonce,
        m.prev.cold_len,
    ]
    .into_iter()
    .enumerate()
    {
        b[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    let crc_at = if floors {
        b[64..72].copy_from_slice(&m.next.seq_floor.to_le_bytes());
        b[72..80].copy_from_slice(&m.prev.seq_floor.to_le_bytes());
        80
    } else {
        64
    };
    let crc = crc32c::crc32c(&b[0..crc_at]);
    b[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Where a manifest of `len` bytes holds its checksum (`None`: no manifest is that long).
fn crc_at(len: usize) -> Option<usize> {
    match len {
        BYTES_1 => Some(64),
        BYTES_2 => Some(80),
        _ => None,
    }
}

/// For the fuzz harness (`fuzzing.rs`): writes the checksum a manifest of this length has.
pub(crate) fn reseal(b: &mut [u8]) {
    if let Some(at) = crc_at(b.len()) {
        let crc = crc32c::crc32c(&b[..at]);
        b[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

pub(crate) fn decode(b: &[u8]) -> Result<Manifest, Error> {
    let bad = |why: &str| Error::corrupt(0, format!("LOGS manifest: {why}"));
    let Some(crc_at) = crc_at(b.len()) else { return Err(bad("bad magic or length")) };
    if b[0..8] != MAGIC {
        return Err(bad("bad magic or length"));
    }
    let crc = u32::from_le_bytes([b[crc_at], b[crc_at + 1], b[crc_at + 2], b[crc_at + 3]]);
    if crc != crc32c::crc32c(&b[0..crc_at]) {
        return Err(bad("checksum mismatch"));
    }
    let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    let want = if crc_at == 64 { VERSION_1 } else { VERSION_2 };
    if version != want || b[12..16] != [0; 4] || b[crc_at + 4..crc_at + 8] != [0; 4] {
        return Err(bad("unsupported version"));
    }
    let floor = |i: usize| if crc_at == 64 { 0 } else { u64_at(b, i) };
    let state = |i: usize, f: usize| LogState {
        hot_nonce: u64_at(b, i),
        cold_nonce: u64_at(b, i + 8),
        cold_len: u64_at(b, i + 16),
        seq_floor: floor(f),
    };
    Ok(Manifest { next: state(16, 64), prev: state(40, 72) })
}

/// Atomically replace the manifest: temp file, fsync, rename, fsync directory.
pub(crate) fn write(dir: &Path, m: &Manifest) -> Result<(), Error> {
    let tmp = dir.join(MANIFEST_TMP);
    let result = (|| {
        let mut f = File::create(&tmp)?;
        std::io::Write::write_all(&mut f, &encode(m))?;
        f.sync_all()?;
        fs::rename(&tmp, dir.join(MANIFEST_FILE))?;
        File::open(dir)?.sync_all()
    })();
    result.map_err(|e| Error::io("writing the LOGS manifest", e))
}

fn remove_if_present(path: &Path) -> Result<(), Error> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("removing an unused log file", e)),
    }
}

/// The nonce in a log file's header, if the file exists and has a valid one.
fn nonce_of(path: &Path) -> Option<u64> {
    let f = File::open(path).ok()?;
    let mut h = [0u8; LOG_HEADER_BYTES as usize];
    let n = std::os::unix::fs::FileExt::read_at(&f, &mut h, 0).ok()?;
    if n < h.len() {
        return None;
    }
    log::decode_header(&h).ok()
}

/// The opened cold log of the state that stands.
pub(crate) struct OpenCold {
    pub log: LogFile,
    pub nonce: u64,
    pub len: u64,
}

/// At open, before the hot log is read: settle which state stands and bring the cold log
/// to it. Returns the cold log (None without one) and the manifest's standing state.
pub(crate) fn settle(
    dir: &Path,
    hot_log: &Path,
    faults: &FaultInjector,
) -> Result<(Option<OpenCold>, Option<LogState>), Error> {
    remove_if_present(&dir.join(MANIFEST_TMP))?;
    let m = match fs::read(dir.join(MANIFEST_FILE)) {
        Ok(b) => Some(decode(&b)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io("reading the LOGS manifest", e)),
    };
    let Some(m) = m else {
        // Never compacted with a manifest: one log. A cold log being built is unreferenced.
        remove_if_present(&dir.join(COLD_NEW_FILE))?;
        remove_if_present(&dir.join(COLD_FILE))?;
        return Ok((None, None));
    };
    let hot = nonce_of(hot_log);
    let state = if hot == Some(m.next.hot_nonce) {
        m.next
    } else if hot == Some(m.prev.hot_nonce) {
        m.prev
    } else {
        return Err(Error::corrupt(0, "data.log matches neither state named by the LOGS manifest"));
    };
    let (cold_path, new_path) = (dir.join(COLD_FILE), dir.join(COLD_NEW_FILE));
    if state.cold_nonce == 0 {
        remove_if_present(&new_path)?;
        remove_if_present(&cold_path)?;
        return Ok((None, Some(state)));
    }
    if nonce_of(&cold_path) != Some(state.cold_nonce) {
        // The commit happened, the cold log's rename into place did not (yet).
        if nonce_of(&new_path) != Some(state.cold_nonce) {
            return Err(Error::corrupt(0, "the cold log named by the LOGS manifest is missing"));
        }
        fs::rename(&new_path, &cold_path).map_err(|e| Error::io("renaming the new cold log", e))?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io("syncing the directory", e))?;
    }
    remove_if_present(&new_path)?;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&cold_path)
        .map_err(|e| Error::io("opening the cold log", e))?;
    let log = LogFile::new(f, faults.clone());
    let len = log.len()?;
    if len < state.cold_len || state.cold_len < LOG_HEADER_BYTES {
        return Err(Error::corrupt(len, "the cold log is shorter than its committed length"));
    }
    if len > state.cold_len {
        // Appended by a hot compaction that did not commit.
        log.set_len(state.cold_len)
            .and_then(|()| log.sync_data())
            .map_err(|e| Error::io("cutting the cold log to its committed length", e))?;
    }
    Ok((Some(OpenCold { log, nonce: state.cold_nonce, len: state.cold_len }), Some(state)))
}
