//! Guards a back-end whose disk fills while it keeps running: its data directory is a small
//! tmpfs, so its datastores fail writes with ENOSPC, yet it answers pings and the failure
//! detector never removes it (before, every put to its ranges then stalled for good). Under
//! the mixed, linearizability-checked load, a filler client writes 64 KiB values to fresh
//! keys until the tmpfs is full (no process is killed). The back-end must report the fault,
//! the manager take it out of its chains (`Degraded`, with the reason, in `fawn status`), and
//! puts to a range it was a middle or tail replica of resume (a probe puts there every 50 ms);
//! the history stays linearizable, and every acknowledged write — of the load (the final
//! scan) and of the filler (read back) — is held.
//! Needs root (mount -t tmpfs); fails with the reason otherwise.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::history::{run_scenario, FaultCtx, Scenario};
use common::probe::Probe;
use common::procs::fawn_binary;
use fawn_client::{Client, ClientOptions};
use fawn_proto::native::NodeState;

/// The back-end whose data directory is the tmpfs.
const VICTIM: u32 = 1;
/// The tmpfs: a few MiB above what the victim's datastores need empty, so the filler fills
/// it in seconds.
const TMPFS_BYTES: u64 = 24 << 20;
const FILL_VALUE_BYTES: usize = 64 << 10;
/// Concurrent filler puts.
const FILLERS: usize = 4;
/// The tmpfs must be full, and the fault reported, within this of the filler's start.
const FILL_MAX: Duration = Duration::from_secs(60);
/// Goal: puts to the probe's range are acknowledged again within this of the fault.
const RESUME_GOAL: Duration = Duration::from_secs(5);
/// Bound: past this without an acknowledged probe put, the test fails whatever the load.
const RESUME_MAX: Duration = Duration::from_secs(30);

/// Writes `FILL_VALUE_BYTES` values to fresh keys from `FILLERS` tasks until stopped; the
/// keys whose put was acknowledged, each with the value written.
struct Filler {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<String>>>,
    thread: std::thread::JoinHandle<()>,
}

/// The value the filler writes under `key`: the key, repeated.
fn fill_value(key: &str) -> Vec<u8> {
    key.bytes().cycle().take(FILL_VALUE_BYTES).collect()
}

impl Filler {
    fn start(bootstrap: Vec<String>) -> Filler {
        let stop = Arc::new(AtomicBool::new(false));
        let acked: Arc<Mutex<Vec<String>>> = Arc::default();
        let (s, ack) = (stop.clone(), acked.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let options = ClientOptions {
                    connect_timeout: Duration::from_secs(1),
                    request_timeout: Duration::from_millis(1500),
                    ..ClientOptions::default()
                };
                let Ok(client) = Client::connect(&bootstrap, options).await else { return };
                let client = Arc::new(client);
                let tasks: Vec<_> = (0..FILLERS)
                    .map(|t| {
                        let (client, s, ack) = (client.clone(), s.clone(), ack.clone());
                        tokio::spawn(async move {
                            let mut i = 0u64;
                            while !s.load(Ordering::Relaxed) {
                                i += 1;
                                let key = format!("fill-{t}-{i}");
                                if client.put(key.as_bytes(), &fill_value(&key)).await.is_ok() {
                                    ack.lock().expect("lock").push(key);
                                } else {
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                }
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    let _ = t.await;
                }
            })
        });
        Filler { stop, acked, thread }
    }

    fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let acked = self.acked.lock().expect("lock").clone();
        acked
    }
}

/// A key of a range the victim replicates other than as its head (the stalled case), else
/// of any range it replicates.
fn probe_key(f: &mut FaultCtx) -> String {
    let config = f.procs.config().expect("configuration");
    let held = |r: &&fawn_proto::native::RangeConfig| r.chain.contains(&VICTIM);
    let rc = config
        .ranges
        .iter()
        .filter(held)
        .find(|r| r.head() != Some(VICTIM))
        .or_else(|| config.ranges.iter().find(held))
        .expect("the victim replicates a range");
    (0..1_000_000)
        .map(|j| format!("probe{j}"))
        .find(|k| config.range_of(fawn_ring::key_id(k.as_bytes())).is_some_and(|r| r.range == rc.range))
        .expect("a probe key in the range")
}

/// Polls `cond` every 100 ms until it holds (the time it did) or `limit` passes.
fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return Some(Instant::now());
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `fawn status` against the cluster, its output.
fn fawn_status(f: &FaultCtx) -> String {
    let out = std::process::Command::new(fawn_binary())
        .args(["status", "--plaintext", "--manager", &f.procs.manager_addr])
        .output()
        .expect("run fawn status");
    assert!(out.status.success(), "fawn status failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Reads back every acknowledged filler write; the keys that do not hold their value.
fn missing_fills(f: &FaultCtx, keys: &[String]) -> BTreeMap<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let client = f.procs.client(ClientOptions::default()).await;
        let mut missing = BTreeMap::new();
        for key in keys {
            match client.get(key.as_bytes()).await {
                Ok(Some(item)) if item.value == fill_value(key) => {}
                Ok(Some(item)) => {
                    missing.insert(key.clone(), format!("another value ({} bytes)", item.value.len()));
                }
                other => {
                    missing.insert(key.clone(), format!("{other:?}"));
                }
            }
        }
        missing
    })
}

#[test]
fn a_full_disk_takes_its_backend_out_of_the_chains_and_puts_resume() {
    let mut sc = Scenario::new("faults_disk_full");
    sc.shape.backends = 4;
    sc.shape.backend_tmpfs = Some((VICTIM, TMPFS_BYTES));
    sc.cooldown = Duration::from_secs(3);
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let fails = failures.clone();
    run_scenario(&sc, &[2401], move |f| {
        let fail = |f: &mut FaultCtx, msg: String| {
            f.note(msg.clone());
            fails.lock().expect("lock").push(msg);
        };
        let free_before = f.procs.tmpfs.as_ref().expect("the victim's tmpfs").free_bytes();
        let key = probe_key(f);
        let probe = Probe::start(f.procs.bootstrap(), key.clone());
        let filler = Filler::start(f.procs.bootstrap());
        f.note(format!("filling backend-{VICTIM}'s tmpfs ({free_before} bytes free); probe key {key}"));
        let faulted = wait_for(FILL_MAX, || f.procs.backend_status(VICTIM).get("disk_faults") >= Some(&1));
        let Some(full_at) = faulted else {
            let free = f.procs.tmpfs.as_ref().map_or(0, |t| t.free_bytes());
            fail(
                f,
                format!("backend-{VICTIM} reported no disk fault within {FILL_MAX:?} ({free} bytes free)"),
            );
            filler.finish();
            probe.finish();
            return;
        };
        f.note(format!("backend-{VICTIM} reports a disk fault"));
        let config = f.procs.wait_config("the victim is degraded", |c| {
            c.backends.iter().any(|b| b.node == VICTIM && b.state == NodeState::Degraded)
        });
        let reason = config.backends.iter().find(|b| b.node == VICTIM).and_then(|b| b.reason.clone());
        f.note(format!(
            "degraded at epoch {} after {} ms: {reason:?}",
            config.epoch,
            full_at.elapsed().as_millis()
        ));
        if !reason.as_deref().is_some_and(|r| r.contains("no space left on device")) {
            fail(f, format!("the degraded node's reason does not name the full disk: {reason:?}"));
        }
        let resumed = wait_for(RESUME_MAX, || probe.acked().iter().any(|t| *t > full_at));
        // A little more filler load on the repaired chains, then the checks.
        std::thread::sleep(Duration::from_secs(1));
        let filled = filler.finish();
        let acked = probe.finish();
        match resumed {
            Some(_) => {
                let first = acked.iter().find(|t| **t > full_at).expect("an acknowledged put");
                let took = first.duration_since(full_at);
                f.note(format!(
                    "probe puts acknowledged again {} ms after the fault was reported",
                    took.as_millis()
                ));
                common::timing_goal(
                    took <= RESUME_GOAL,
                    &format!(
                        "puts resumed {} ms after the disk filled (goal {RESUME_GOAL:?})",
                        took.as_millis()
                    ),
                );
            }
            None => {
                fail(f, format!("no put to the range of {key} succeeded within {RESUME_MAX:?} of the fault"))
            }
        }
        let status = fawn_status(f);
        let line = status.lines().find(|l| l.contains(&format!("backend-{VICTIM} "))).unwrap_or_default();
        if !(line.contains("Degraded") && line.contains("no space left on device")) {
            fail(
                f,
                format!("fawn status does not show backend-{VICTIM} degraded with the reason:\n{status}"),
            );
        }
        f.note(format!("fawn status: {}", line.trim()));
        let missing = missing_fills(f, &filled);
        f.note(format!("{} acknowledged filler writes read back, {} missing", filled.len(), missing.len()));
        if !missing.is_empty() {
            let some: Vec<String> = missing.iter().take(5).map(|(k, why)| format!("{k}: {why}")).collect();
            fail(f, format!("{} acknowledged filler writes lost: {}", missing.len(), some.join("; ")));
        }
    });
    let failures = failures.lock().expect("lock");
    assert!(failures.is_empty(), "full disk:\n{}", failures.join("\n"));
}
