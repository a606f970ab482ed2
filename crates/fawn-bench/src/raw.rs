//! Raw file I/O baselines on the same file system: sequential writes with a given sync policy,
//! O_DIRECT random 4 KiB reads, and page-cache eviction.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fawn_ds::SyncPolicy;
use rand::Rng;

use crate::par::{self, ParResult, Until};

/// Block size of the raw random reads (a flash page / the OS page).
pub const BLOCK: usize = 4096;

/// How long a sequential write took.
#[derive(Clone, Copy, Debug)]
pub struct SeqWriteTimes {
    /// Until the last write returned (and any syncs the policy asked for on the way).
    pub written: Duration,
    /// Until the final fdatasync after it returned: every byte durable.
    pub durable: Duration,
}

/// Up to `n` bytes from the start of `path` (at least one byte): real data for a baseline.
pub fn file_prefix(path: &Path, n: usize) -> Result<Vec<u8>> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; n.max(1)];
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], got as u64).with_context(|| format!("reading {}", path.display()))? {
            0 => break,
            k => got += k,
        }
    }
    if got == 0 {
        bail!("{} is empty", path.display());
    }
    buf.truncate(got);
    Ok(buf)
}

/// Write `total` bytes sequentially to a new file at `path` in writes of `chunk.len()` bytes
/// (the last one shorter), syncing as `sync` says (`Always`: after every write), then
/// fdatasync once more. Returns the times until the last write and until that final sync.
pub fn seq_write_bytes(path: &Path, chunk: &[u8], total: u64, sync: SyncPolicy) -> Result<SeqWriteTimes> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    let start = Instant::now();
    let mut last_sync = start;
    let mut off = 0u64;
    while off < total {
        let n = (chunk.len() as u64).min(total - off) as usize;
        f.write_all_at(&chunk[..n], off).with_context(|| format!("writing {}", path.display()))?;
        off += n as u64;
        let due = match sync {
            SyncPolicy::Never => false,
            SyncPolicy::Always => true,
            SyncPolicy::Interval(every) => last_sync.elapsed() >= every,
        };
        if due {
            f.sync_data().context("fdatasync")?;
            last_sync = Instant::now();
        }
    }
    let written = start.elapsed();
    f.sync_data().context("fdatasync")?;
    Ok(SeqWriteTimes { written, durable: start.elapsed() })
}

/// Read all of `path` once (1 MiB reads) so that its pages are in the page cache.
pub fn warm(path: &Path) -> Result<()> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        match f.read_at(&mut buf, off).with_context(|| format!("reading {}", path.display()))? {
            0 => return Ok(()),
            n => off += n as u64,
        }
    }
}

/// Drop the cached pages of `path` (after syncing it, since dirty pages cannot be dropped), so the
/// next reads go to the device. Per-file `posix_fadvise(DONTNEED)` rather than `drop_caches`:
/// it does not disturb the other processes of a shared machine.
pub fn evict(path: &Path) -> Result<()> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    f.sync_all().with_context(|| format!("syncing {}", path.display()))?;
    // SAFETY: a valid open fd; offset 0 / len 0 means the whole file.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        bail!("posix_fadvise(DONTNEED) on {} failed: errno {rc}", path.display());
    }
    Ok(())
}

/// A buffer of `len` bytes aligned to [`BLOCK`] for O_DIRECT.
struct Aligned {
    buf: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let buf: Vec<u8> = (0..len + BLOCK).map(|i| (i % 251) as u8).collect();
        let off = buf.as_ptr().align_offset(BLOCK);
        Aligned { buf, off, len }
    }

    fn get(&mut self) -> &mut [u8] {
        &mut self.buf[self.off..self.off + self.len]
    }
}

fn open_direct(path: &Path, write: bool) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .create(write)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("opening {} with O_DIRECT (unsupported on tmpfs)", path.display()))
}

fn blocks_of(f: &File, path: &Path) -> Result<u64> {
    let blocks = f.metadata().context("stat")?.len() / BLOCK as u64;
    if blocks == 0 {
        bail!("{} is smaller than one block", path.display());
    }
    Ok(blocks)
}

/// `count` O_DIRECT random 4 KiB reads of `path` from `threads` threads.
pub fn direct_random_reads(path: &Path, threads: usize, count: u64, seed: u64) -> Result<ParResult> {
    direct_random(path, threads, count, seed, false)
}

/// `count` O_DIRECT random 4 KiB writes inside the existing file `path` from `threads` threads.
pub fn direct_random_writes(path: &Path, threads: usize, count: u64, seed: u64) -> Result<ParResult> {
    direct_random(path, threads, count, seed, true)
}

fn direct_random(path: &Path, threads: usize, count: u64, seed: u64, write: bool) -> Result<ParResult> {
    let f = open_direct(path, write)?;
    let blocks = blocks_of(&f, path)?;
    par::run(threads, Until::Count(count), seed, |rng| {
        thread_local! {
            static BUF: std::cell::RefCell<Aligned> = std::cell::RefCell::new(Aligned::new(BLOCK));
        }
        let off = rng.gen_range(0..blocks) * BLOCK as u64;
        BUF.with(|b| {
            let mut b = b.borrow_mut();
            if write {
                f.write_all_at(b.get(), off).with_context(|| format!("O_DIRECT write at {off}"))
            } else {
                f.read_exact_at(b.get(), off).with_context(|| format!("O_DIRECT read at {off}"))
            }
        })
    })
}

/// Write `size` bytes sequentially with O_DIRECT in `chunk`-byte writes, then fdatasync.
pub fn direct_seq_write(path: &Path, size: u64, chunk: usize) -> Result<Duration> {
    let f = open_direct(path, true)?;
    let mut buf = Aligned::new(chunk);
    let start = Instant::now();
    let mut off = 0;
    while off < size {
        f.write_all_at(buf.get(), off).with_context(|| format!("O_DIRECT write at {off}"))?;
        off += chunk as u64;
    }
    f.sync_data().context("fdatasync")?;
    Ok(start.elapsed())
}

/// Read all of `path` sequentially with O_DIRECT in `chunk`-byte reads. Returns (bytes, time).
pub fn direct_seq_read(path: &Path, chunk: usize) -> Result<(u64, Duration)> {
    let f = open_direct(path, false)?;
    let size = f.metadata().context("stat")?.len() / chunk as u64 * chunk as u64;
    let mut buf = Aligned::new(chunk);
    let start = Instant::now();
    let mut off = 0;
    while off < size {
        f.read_exact_at(buf.get(), off).with_context(|| format!("O_DIRECT read at {off}"))?;
        off += chunk as u64;
    }
    Ok((size, start.elapsed()))
}
