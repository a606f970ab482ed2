//! A data directory lock: one process per data directory.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Holds an exclusive `flock` on `<dir>/LOCK` for as long as it lives.
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Creates `dir` if needed (durably: its parent is fsynced) and locks it, or says which
    /// process holds it.
    pub fn acquire(dir: &Path) -> anyhow::Result<DirLock> {
        fawn_ds::create_dir_durable(dir)?;
        let path = dir.join("LOCK");
        let mut file = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&path)?;
        // SAFETY: flock on a file descriptor we own; no memory is shared.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let holder = fs::read_to_string(&path).unwrap_or_default();
            anyhow::bail!(
                "data directory {} is in use by another process (pid {})",
                dir.display(),
                holder.trim()
            );
        }
        file.set_len(0)?;
        write!(file, "{}", std::process::id())?;
        Ok(DirLock { _file: file })
    }
}
