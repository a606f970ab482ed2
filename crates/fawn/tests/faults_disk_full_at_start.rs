//! Guards a back-end restarted on a disk that is already full: it must start degraded, not
//! exit. Its data directory is a small tmpfs; it is killed, a junk file fills the tmpfs, and
//! it is started again. It must keep running, report the fault (the manager marks it
//! `Degraded`, with the reason, in `fawn status`), be taken out of its chains so that puts to
//! every range succeed through the other nodes, and every acknowledged write — before and
//! after the restart — must be read back.
//! Needs root (mount -t tmpfs); fails with the reason otherwise.

mod common;

use std::io::Write;

use common::procs::{fawn_binary, start_filled, ProcShape};
use fawn_proto::native::NodeState;

/// The back-end whose data directory is the tmpfs.
const VICTIM: u32 = 1;
const TMPFS_BYTES: u64 = 24 << 20;
/// Keys written before the restart, and after it.
const KEYS_BEFORE: u32 = 200;
const KEYS_AFTER: u32 = 200;

/// Fills the file system of `dir` with a junk file until a write fails for want of room.
fn fill(dir: &std::path::Path) {
    let mut junk = std::fs::File::create(dir.join("junk")).expect("create the junk file");
    for chunk in [1usize << 20, 4 << 10, 512] {
        let buf = vec![0x5a; chunk];
        loop {
            match junk.write_all(&buf).and_then(|_| junk.flush()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", dir.display()),
            }
        }
    }
}

#[test]
fn a_backend_restarted_on_a_full_disk_starts_degraded() {
    let shape = ProcShape { backends: 4, backend_tmpfs: Some((VICTIM, TMPFS_BYTES)), ..ProcShape::default() };
    let (mut procs, rt, client, mut want) = start_filled(shape, KEYS_BEFORE);
    procs.kill9(VICTIM);
    let tmpfs = procs.tmpfs.as_ref().expect("the victim's tmpfs");
    fill(&procs.dir.join(format!("backend-{VICTIM}")));
    let free = tmpfs.free_bytes();
    assert!(free < 4096, "the tmpfs still has {free} bytes free");
    procs.restart_backend(VICTIM);

    // It runs (`wait_config` fails if any process exited) and is degraded for the full disk.
    let config = procs.wait_config("the restarted back-end is degraded and out of every chain", |c| {
        c.backends.iter().any(|b| b.node == VICTIM && b.state == NodeState::Degraded)
            && c.ranges.iter().all(|rc| !rc.chain.contains(&VICTIM) && rc.syncing.is_empty())
            && c.ranges.iter().all(|rc| rc.chain.len() == 3 && rc.unproven_tail.is_none())
    });
    let reason = config.backends.iter().find(|b| b.node == VICTIM).and_then(|b| b.reason.clone());
    assert!(
        reason.as_deref().is_some_and(|r| r.contains("no space left on device")),
        "the degraded node's reason does not name the full disk: {reason:?}"
    );
    assert!(procs.backend_status(VICTIM).get("disk_faults") >= Some(&1), "no disk fault counted");

    let out = std::process::Command::new(fawn_binary())
        .args(["status", "--plaintext", "--manager", &procs.manager_addr])
        .output()
        .expect("run fawn status");
    let status = String::from_utf8_lossy(&out.stdout);
    let line = status.lines().find(|l| l.contains(&format!("backend-{VICTIM} "))).unwrap_or_default();
    assert!(
        line.contains("Degraded") && line.contains("no space left on device"),
        "fawn status does not show backend-{VICTIM} degraded with the reason:\n{status}"
    );

    // Puts to every range go through the other nodes; nothing acknowledged is lost.
    rt.block_on(async {
        for i in 0..KEYS_AFTER {
            let (k, v) = (format!("after-{i}").into_bytes(), common::padded_value("w", i, 200));
            client.put(&k, &v).await.unwrap_or_else(|e| panic!("put after the restart: {e}"));
            want.insert(k, v);
        }
        for (k, v) in &want {
            let got =
                client.get(k).await.unwrap_or_else(|e| panic!("get {}: {e}", String::from_utf8_lossy(k)));
            assert_eq!(got.map(|i| i.value).as_ref(), Some(v), "key {}", String::from_utf8_lossy(k));
        }
    });
    procs.assert_running();
}
