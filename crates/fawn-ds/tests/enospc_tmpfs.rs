//! Guards behaviour on a full disk: on a 1 MiB tmpfs mounted by the test, `store` returns
//! `Error::NoSpace` (not a panic, not a poisoned store), the failed record leaves no
//! partial bytes, and everything stored before is readable after reopen. Needs root to
//! mount; fails loudly (never skips) without it — CI runs as root.

use std::path::{Path, PathBuf};
use std::process::Command;

use fawn_ds::{DataStore, Error, Meta, Options, SyncPolicy};

/// Unmounts the tmpfs when the test ends, whatever happens.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Mount {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("running mount(8)");
        assert!(
            out.status.success(),
            "could not mount a tmpfs for the ENOSPC test (needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Mount(dir.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn opts() -> Options {
    Options { sync: SyncPolicy::Always, checkpoint_every_bytes: 0, ..Options::default() }
}

fn value(i: u64) -> Vec<u8> {
    vec![(i % 256) as u8; 3000 + (i as usize % 7) * 100]
}

#[test]
fn full_disk_gives_nospace_and_keeps_everything_stored() {
    let mnt = tempfile::tempdir().unwrap();
    let _mount = Mount::tmpfs(mnt.path(), "1m");
    let dir = mnt.path().join("store");
    let ds = DataStore::open(&dir, opts()).unwrap();
    let mut stored = 0u64;
    let err = loop {
        match ds.store(
            format!("k{stored}").as_bytes(),
            &value(stored),
            Meta { seq: stored + 1, ..Meta::default() },
        ) {
            Ok(()) => stored += 1,
            Err(e) => break e,
        }
        assert!(stored < 10_000, "a 1 MiB file system never filled up");
    };
    assert!(matches!(err, Error::NoSpace), "expected NoSpace, got {err:?}");
    assert!(stored > 100, "only {stored} records fit");
    let end = ds.end_offset();
    assert_eq!(std::fs::metadata(dir.join("data.log")).unwrap().len(), end, "partial record left behind");
    // Not poisoned: reads work, and a write that fits still succeeds after the failure.
    assert!(!ds.stats().poisoned);
    assert!(matches!(ds.store(b"big", &[1u8; 100_000], Meta::default()), Err(Error::NoSpace)));
    for i in 0..stored {
        assert_eq!(ds.lookup(format!("k{i}").as_bytes()).unwrap().unwrap().value, value(i));
    }
    // A checkpoint on a full disk fails cleanly (no temp file left) and is not required.
    let ck = ds.checkpoint();
    assert!(ck.is_ok() || matches!(ck, Err(Error::NoSpace)), "{ck:?}");
    assert!(!dir.join("index.ckpt.tmp").exists());
    drop(ds);
    let ds = DataStore::open(&dir, opts()).unwrap();
    assert_eq!(ds.recovery_report().truncated_bytes, 0);
    for i in 0..stored {
        assert_eq!(ds.lookup(format!("k{i}").as_bytes()).unwrap().unwrap().value, value(i), "key {i} lost");
    }
    assert_eq!(ds.stats().live_keys, stored);
}
