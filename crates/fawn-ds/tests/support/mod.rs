//! Shared support of the fawn-ds integration tests: the usual options, metadata, a mixing
//! function for deterministic pseudo-random choices, and the kill -9 child harness. Each test
//! file uses a part of it (`mod support;`), hence `dead_code` is allowed here.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use fawn_ds::{Meta, Options, SyncPolicy};

/// No fsync and no automatic compaction: what a test that drives maintenance itself wants.
pub fn manual_opts() -> Options {
    Options { sync: SyncPolicy::Never, auto_compact: false, ..Options::default() }
}

/// No fsync and no automatic checkpoint: a reopen rebuilds the index from the log.
pub fn no_checkpoint_opts() -> Options {
    Options { sync: SyncPolicy::Never, checkpoint_every_bytes: 0, ..Options::default() }
}

/// Metadata with only a seq.
pub fn meta(seq: u64) -> Meta {
    Meta { seq, ..Meta::default() }
}

/// SplitMix64's finaliser: a deterministic pseudo-random function of `z`.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Runs the test `child_test` of this test binary in a child process with `env` set, waits
/// until the child prints a line ending in `READY`, lets it run for `run_for`, kills it with
/// SIGKILL and returns every line it completed (trimmed; a line cut by the kill is dropped:
/// whatever it announced was not fully said). The child test must do nothing unless its
/// environment says it is the child.
pub fn run_until_killed(child_test: &str, env: &[(&str, String)], run_for: Duration) -> Vec<String> {
    let exe = std::env::current_exe().expect("current exe");
    let mut cmd = Command::new(exe);
    cmd.args([child_test, "--exact", "--nocapture", "--test-threads=1"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut lines = Vec::new();
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) if line.last() != Some(&b'\n') => break, // cut by the kill
                Ok(_) => {}
            }
            let s = String::from_utf8_lossy(&line).trim_end().to_string();
            if s.ends_with("READY") {
                let _ = tx.send(());
            }
            lines.push(s);
        }
        lines
    });
    rx.recv_timeout(Duration::from_secs(20)).expect("child never became ready");
    std::thread::sleep(run_for);
    child.kill().expect("SIGKILL child");
    child.wait().expect("reap child");
    reader.join().expect("reader thread")
}
