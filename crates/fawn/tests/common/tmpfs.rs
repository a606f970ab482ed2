//! A small tmpfs mounted for a test (a back-end's data directory that fills up), unmounted
//! on drop. Mounting needs root: without it the test fails with the reason, never passes.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted tmpfs.
pub struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `bytes` at `path` (created if missing).
    pub fn mount(path: &Path, bytes: u64) -> Tmpfs {
        std::fs::create_dir_all(path).expect("tmpfs mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(path)
            .output()
            .unwrap_or_else(|e| panic!("cannot run mount: {e}"));
        assert!(
            out.status.success(),
            "cannot mount a {bytes}-byte tmpfs at {} (this test needs root): {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Tmpfs { path: path.to_path_buf() }
    }

    /// Free bytes on it.
    pub fn free_bytes(&self) -> u64 {
        let path = std::ffi::CString::new(self.path.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a valid C string and a zeroed struct statvfs fills.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return 0;
        }
        st.f_bavail as u64 * st.f_frsize as u64
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount").arg(&self.path).status().is_ok_and(|s| s.success());
        if !unmounted {
            // Still busy (a process not yet reaped): detach it now, freed once unused.
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}
