//! The datastore directory: the name of every file in it, and the small helpers on files
//! and directories that every layer uses (directory fsync, the lock file, the `MAXSEQ` and
//! `DROPSEQ` floor files, leftovers of interrupted maintenance). A leaf above `error`.

use std::fs::{self, File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// The hot log.
pub(crate) const LOG_FILE: &str = "data.log";
/// The `flock`ed lock file.
const LOCK_FILE: &str = "LOCK";
/// The index checkpoint.
pub(crate) const CHECKPOINT_FILE: &str = "index.ckpt";
/// A checkpoint being written (renamed to `CHECKPOINT_FILE` once complete).
pub(crate) const CHECKPOINT_TMP: &str = "index.ckpt.tmp";
/// The new log of a compaction or merge, renamed over `data.log` at the swap.
pub(crate) const COMPACT_FILE: &str = "data.log.compact";
/// The persisted lower bound of `max_seq`.
const SEQ_FILE: &str = "MAXSEQ";
const SEQ_TMP: &str = "MAXSEQ.tmp";
const SEQ_MAGIC: [u8; 8] = *b"FAWNSEQ\0";
const SEQ_FILE_BYTES: usize = 24;
/// The persisted drop floor (`DataStore::dropped_seq_max`), same layout as `MAXSEQ`.
const DROP_FILE: &str = "DROPSEQ";
const DROP_TMP: &str = "DROPSEQ.tmp";
const DROP_MAGIC: [u8; 8] = *b"FAWNDRP\0";
/// A split builds its datastore in `<target>` + this suffix and renames it when complete.
const SPLIT_TMP_SUFFIX: &str = ".split-tmp";

pub(crate) fn now_secs() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs().min(u32::MAX as u64) as u32)
        .unwrap_or(0)
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io("syncing the datastore directory", e))
}

/// Creates `dir` and any missing parents, and fsyncs the parent of every directory it created,
/// so that a crash right after cannot lose the new directory's entry (and the files later
/// made durable inside it). For datastore, range and manager directories.
pub fn create_dir_durable(dir: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.exists() {
        missing.push(at);
        match at.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => at = parent,
            _ => break,
        }
    }
    fs::create_dir_all(dir)?;
    // Deepest last: each created directory's entry lives in its parent.
    for created in missing.iter().rev() {
        let parent = created.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Remove what a compaction/merge killed before its rename left behind (open calls this).
pub(crate) fn remove_leftovers(dir: &Path) -> Result<(), Error> {
    for name in [COMPACT_FILE, SEQ_TMP, DROP_TMP] {
        match fs::remove_file(dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("removing an interrupted maintenance file", e)),
        }
    }
    Ok(())
}

/// The persisted `max_seq` floor, 0 if there is none.
pub(crate) fn read_seq_floor(dir: &Path) -> Result<u64, Error> {
    read_u64_file(dir, SEQ_MAGIC, SEQ_FILE, ("MAXSEQ", "reading MAXSEQ"))
}

/// A `MAXSEQ`-format file's value (magic, u64, CRC32C, zero padding), 0 if it is absent.
/// `names`: the file's name in errors, and the context of an I/O error.
fn read_u64_file(dir: &Path, magic: [u8; 8], file: &str, names: (&str, &'static str)) -> Result<u64, Error> {
    let (what, reading) = names;
    let bytes = match fs::read(dir.join(file)) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io(reading, e)),
    };
    if bytes.len() != SEQ_FILE_BYTES || bytes[0..8] != magic {
        return Err(Error::corrupt(0, format!("{what}: bad magic or length")));
    }
    let crc = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    if crc != crc32c::crc32c(&bytes[0..16]) || bytes[20..24] != [0; 4] {
        return Err(Error::corrupt(0, format!("{what}: checksum mismatch")));
    }
    let mut s = [0u8; 8];
    s.copy_from_slice(&bytes[8..16]);
    Ok(u64::from_le_bytes(s))
}

/// Atomically persist a `max_seq` floor: temp file, fsync, rename, fsync directory.
pub(crate) fn write_seq_floor(dir: &Path, seq: u64) -> Result<(), Error> {
    write_u64_file(dir, SEQ_MAGIC, SEQ_TMP, SEQ_FILE, seq).map_err(|e| Error::io("writing MAXSEQ", e))?;
    sync_dir(dir)
}

/// The persisted drop floor (`DataStore::dropped_seq_max`), 0 if there is none.
pub(crate) fn read_drop_floor(dir: &Path) -> Result<u64, Error> {
    read_u64_file(dir, DROP_MAGIC, DROP_FILE, ("DROPSEQ", "reading DROPSEQ"))
}

/// Atomically persist a drop floor, as `write_seq_floor`.
pub(crate) fn write_drop_floor(dir: &Path, seq: u64) -> Result<(), Error> {
    write_u64_file(dir, DROP_MAGIC, DROP_TMP, DROP_FILE, seq).map_err(|e| Error::io("writing DROPSEQ", e))?;
    sync_dir(dir)
}

/// magic (8) | value u64 LE (8) | crc32c of the first 16 bytes (4) | zero (4); written to
/// `tmp`, fsynced, renamed to `name` (the caller syncs the directory).
fn write_u64_file(dir: &Path, magic: [u8; 8], tmp: &str, name: &str, value: u64) -> std::io::Result<()> {
    let mut b = [0u8; SEQ_FILE_BYTES];
    b[0..8].copy_from_slice(&magic);
    b[8..16].copy_from_slice(&value.to_le_bytes());
    let crc = crc32c::crc32c(&b[0..16]);
    b[16..20].copy_from_slice(&crc.to_le_bytes());
    let tmp = dir.join(tmp);
    let mut f = File::create(&tmp)?;
    std::io::Write::write_all(&mut f, &b)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))
}

/// Take an exclusive `flock` on `dir/LOCK` (per open file description, so a second open in
/// the same process is refused too).
pub(crate) fn lock_dir(dir: &Path) -> Result<File, Error> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(LOCK_FILE))
        .map_err(|e| Error::io("opening the lock file", e))?;
    // SAFETY: flock on a valid, owned file descriptor has no memory-safety preconditions.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(Error::Locked);
        }
        return Err(Error::io("locking the datastore directory", e));
    }
    Ok(f)
}

pub(crate) fn new_nonce() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let stack = &t as *const u64 as u64;
    let mut z = t ^ (std::process::id() as u64).rotate_left(32) ^ stack;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^ (z >> 31)
}

/// Whether a split into `target` was cut short: its `<target>.split-tmp` exists.
pub fn split_interrupted(target: &Path) -> bool {
    split_tmp(target).is_ok_and(|tmp| tmp.exists())
}

/// `<target>.split-tmp`: where a split builds the datastore it renames to `target`.
pub(crate) fn split_tmp(target: &Path) -> Result<PathBuf, Error> {
    let name = target
        .file_name()
        .ok_or_else(|| Error::InvalidRequest(format!("split target {} has no name", target.display())))?;
    let mut tmp = name.to_os_string();
    tmp.push(SPLIT_TMP_SUFFIX);
    Ok(target.with_file_name(tmp))
}
