//! Durable small files of the manager group's replica.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

/// Durably replaces `dir/name` with `bytes`: write a temporary file, fsync it, rename it
/// over the old one, fsync the directory. A crash leaves the old or the new file, whole.
pub fn replace(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

/// The contents of `dir/name`, or `None` if there is no such file.
pub fn read(dir: &Path, name: &str) -> std::io::Result<Option<Vec<u8>>> {
    match fs::read(dir.join(name)) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
