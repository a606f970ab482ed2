//! Guards a syncing replica that restarts in the middle of its range copy. A fourth
//! back-end joins a 3-node R=3 cluster holding ~40 MB; its copies are paced to 1 MiB/s per
//! range so that each takes seconds. In the second half of the copy the joiner is killed
//! (kill -9) and restarted at once on its old address: its ranges start over empty and ask
//! their tails for a new snapshot while the tails' first snapshot streams are still running
//! on the same links. The joiner must take only the snapshot it asked for: before snapshot
//! messages carried a stream id, the old stream's records and its end marker were taken as
//! the new stream's, the sync "finished" with the middle of the range missing, and the new
//! tail answered "not found" for acknowledged writes. After the syncs finish, every key
//! written before the join must read back its value.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::procs::{ProcShape, Procs};
use fawn_client::ClientOptions;
use fawn_proto::native::{Request, Response};
use fawn_ring::key_id;

const KEYS: u32 = 40_000;
const VALUE_BYTES: usize = 1000;
/// Concurrent writers while preloading.
const WRITERS: u32 = 32;
/// How long the syncs may take to finish after the restart.
const SYNC_TIMEOUT: Duration = Duration::from_secs(90);

fn key(i: u32) -> String {
    format!("key-{i:06}")
}

fn value(i: u32) -> Vec<u8> {
    let mut v = format!("value-{i:06}-").into_bytes();
    v.resize(VALUE_BYTES, b'x' + (i % 3) as u8);
    v
}

/// The keys back-end `node` holds (its `live_keys` status counter), 0 if it does not answer.
fn live_keys(procs: &Procs, node: u32) -> u64 {
    let addr = procs.backend_addrs[&node].clone();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let pool = fawn_client::pool::Pool::new(Duration::from_secs(1));
        match pool.call(&addr, Request::Status, Duration::from_secs(2)).await {
            Ok(Response::Status(s)) => {
                s.counters.iter().find(|(k, _)| k == "live_keys").map(|(_, v)| *v).unwrap_or(0)
            }
            _ => 0,
        }
    })
}

#[test]
fn syncing_replica_restarts_mid_copy() {
    let shape = ProcShape {
        vnodes: 1,
        // A join's pre-copy is paced at the join rate (the ranges still have R replicas).
        backend_args: vec!["--join-copy-rate-mib".into(), "1".into(), "--copy-rate-mib".into(), "1".into()],
        ..ProcShape::default()
    };
    let mut procs = Procs::start(shape);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let options = ClientOptions {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    let client = rt.block_on(procs.client(options.clone()));

    let started = Instant::now();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let client = Arc::clone(&client);
            tasks.push(tokio::spawn(async move {
                for i in (w..KEYS).step_by(WRITERS as usize) {
                    let mut attempts = 0;
                    while let Err(e) = client.put(key(i).as_bytes(), &value(i)).await {
                        attempts += 1;
                        assert!(attempts < 10, "preload put {} failed: {e}", key(i));
                    }
                }
            }));
        }
        for t in tasks {
            t.await.expect("writer");
        }
    });
    eprintln!("preloaded {KEYS} keys in {:.1}s", started.elapsed().as_secs_f64());

    procs.start_new_backend(3);
    let join = Instant::now();
    // Wait until the joiner is syncing, then until it holds three quarters of the keys of the
    // ranges it syncs: every copy of more than half of that is in its second half.
    let expected = loop {
        let c = procs.config().expect("manager answers");
        if c.ranges.iter().any(|r| r.syncing.contains(&3)) {
            let syncing =
                |i: u32| c.range_of(key_id(key(i).as_bytes())).is_some_and(|r| r.syncing.contains(&3));
            break (0..KEYS).filter(|i| syncing(*i)).count() as u64;
        }
        assert!(join.elapsed() < Duration::from_secs(30), "the joiner never started syncing");
        std::thread::sleep(Duration::from_millis(50));
    };
    loop {
        let held = live_keys(&procs, 3);
        if held * 4 >= expected * 3 {
            eprintln!(
                "joiner holds {held} of {expected} keys {:.1}s after the join",
                join.elapsed().as_secs_f64()
            );
            break;
        }
        assert!(join.elapsed() < Duration::from_secs(120), "the copy stalled at {held} of {expected} keys");
        std::thread::sleep(Duration::from_millis(50));
    }
    procs.kill9(3);
    procs.restart_backend(3);
    eprintln!("joiner killed and restarted {:.1}s after the join", join.elapsed().as_secs_f64());

    let deadline = Instant::now() + SYNC_TIMEOUT;
    loop {
        let c = procs.config().expect("manager answers");
        let holding = c.ranges.iter().filter(|r| r.chain.contains(&3)).count();
        if holding > 0 && c.ranges.iter().all(|r| r.syncing.is_empty()) {
            eprintln!(
                "syncs done {:.1}s after the join; node 3 in {holding} chains",
                join.elapsed().as_secs_f64()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "syncs not finished within {SYNC_TIMEOUT:?}: {c:?}\n{}",
            procs.logs(40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let client = rt.block_on(procs.client(options));
    let mut missing = Vec::new();
    rt.block_on(async {
        for i in 0..KEYS {
            let want = value(i);
            let mut got = None;
            for _ in 0..20 {
                match client.get(key(i).as_bytes()).await {
                    Ok(item) => {
                        got = Some(item.map(|it| it.value));
                        break;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
            match got {
                Some(Some(v)) if v == want => {}
                other => missing.push((key(i), other.map(|o| o.map(|v| v.len())))),
            }
        }
    });
    let logs = if missing.is_empty() { String::new() } else { procs.logs(60) };
    if !missing.is_empty() || std::env::var_os("FAWN_KEEP").is_some() {
        let dir = std::env::temp_dir().join("fawn-faults_sync_restart_mid_copy");
        procs.save_logs(&dir);
        eprintln!("logs saved in {}", dir.display());
    }
    drop(procs);
    rt.shutdown_timeout(Duration::from_secs(2));
    assert!(
        missing.is_empty(),
        "{} of {KEYS} acknowledged writes lost after the joiner restarted mid-copy (first: {:?})\n{logs}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}
