//! Guards the back-end's `expected_keys` sizing hint: a real manager and three real back-ends
//! (R = 2, V = 2, in-process, real TCP and datastore files). Back-end 0 is started with a total
//! of `TOTAL` expected keys; each of its ranges' datastores must open with an index sized for
//! that range's share (by range width, summing to `TOTAL`) without growing, while back-end 1
//! (no hint) opens every index at the smallest table.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fawn_ds::limits::{INDEX_SIZING_LOAD, SLOTS_PER_BUCKET};
use fawn_ds::SyncPolicy;
use fawn_kv::backend::{apportion_expected_keys, expected_keys_by_range, Backend, BackendOptions};
use fawn_kv::manager::{Manager, ManagerOptions};
use fawn_ring::Range;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Keys back-end 0 expects over all its ranges.
const TOTAL: u64 = 6000;
const BACKENDS: u32 = 3;
/// Slots of an index opened without a hint (fawn-ds's smallest table: 64 buckets of 8).
const DEFAULT_SLOTS: u64 = 64 * SLOTS_PER_BUCKET as u64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_open_presized_by_their_share_of_the_hint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (stop, shutdown) = watch::channel(false);
    let mut tasks = Vec::new();

    let manager_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind manager");
    let manager_addr = manager_listener.local_addr().expect("manager addr").to_string();
    let manager = Manager::open(ManagerOptions {
        group: vec![manager_addr.clone()],
        id: 1,
        snapshot_every: fawn_kv::manager::raft::SNAPSHOT_EVERY_ENTRIES,
        data_dir: dir.path().join("manager"),
        expected_backends: BACKENDS as usize,
        replicas: 2,
        vnodes: 2,
        expected_frontends: 1,
        heartbeat: Duration::from_millis(200),
        fd_threshold: 10,
    })
    .await
    .expect("open manager");
    tasks.push(tokio::spawn(manager.clone().serve(manager_listener, shutdown.clone())));

    // The back-ends register concurrently: the ring forms once all three have.
    let mut starting = Vec::new();
    for node in 0..BACKENDS {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind back-end");
        let options = BackendOptions {
            node,
            data_dir: dir.path().join(format!("backend-{node}")),
            manager: manager_addr.clone(),
            advertise: listener.local_addr().expect("back-end addr").to_string(),
            sync: SyncPolicy::Never,
            expected_keys: if node == 0 { TOTAL } else { 0 },
            chain_timeout: Duration::from_secs(5),
            link_repair_after: fawn_kv::backend::LINK_REPAIR_AFTER,
            copy_bytes_per_s: 0,
            join_copy_bytes_per_s: 0,
        };
        starting.push(tokio::spawn(async move { (Backend::start(options).await, listener) }));
    }
    let mut backends: Vec<Arc<Backend>> = Vec::new();
    for s in starting {
        let (backend, listener) = s.await.expect("start task");
        let backend = backend.expect("back-end start");
        tasks.push(tokio::spawn(backend.clone().serve(listener, shutdown.clone())));
        backends.push(backend);
    }
    let config = manager.config();

    // The apportioning: back-end 0's ranges, in proportion to their widths, summing to TOTAL.
    let held: Vec<Range> =
        config.ranges.iter().filter(|rc| rc.path().any(|n| n == 0)).map(|rc| rc.range).collect();
    assert!(held.len() >= 2 && held.len() < config.ranges.len(), "back-end 0 holds {} ranges", held.len());
    let shares = expected_keys_by_range(TOTAL, 0, &config);
    assert_eq!(shares.len(), held.len());
    assert_eq!(shares.values().sum::<u64>(), TOTAL, "shares {shares:?}");
    let held_width: f64 = held.iter().map(|r| r.len_minus_one() as f64 + 1.0).sum();
    for r in &held {
        let exact = TOTAL as f64 * (r.len_minus_one() as f64 + 1.0) / held_width;
        assert!(
            (shares[r] as f64 - exact).abs() <= 1.0,
            "range {r}: {} keys for a share of {exact:.1}",
            shares[r]
        );
    }
    assert_eq!(apportion_expected_keys(TOTAL, &held).iter().sum::<u64>(), TOTAL);

    // Every datastore of back-end 0 opened with an index sized for its share.
    let sized_slots = |keys: u64| -> u64 {
        let slots = (keys as f64 / INDEX_SIZING_LOAD).ceil() as u64;
        slots.div_ceil(SLOTS_PER_BUCKET as u64) * SLOTS_PER_BUCKET as u64
    };
    let opened: HashMap<Range, fawn_ds::Stats> = backends[0].datastore_stats().into_iter().collect();
    assert_eq!(opened.len(), held.len());
    for (range, stats) in &opened {
        let want = shares[range];
        assert!(
            stats.index_capacity >= sized_slots(want),
            "range {range}: {} index slots for {want} expected keys",
            stats.index_capacity
        );
        // Sized for its share, not for the whole TOTAL (the default minimum aside).
        assert!(
            stats.index_capacity <= sized_slots(want).max(DEFAULT_SLOTS),
            "range {range}: {}",
            stats.index_capacity
        );
        assert!(!stats.index_migrating && stats.growth_step_max_us == 0, "range {range}: grew at open");
    }
    assert!(
        opened.values().any(|s| s.index_capacity > DEFAULT_SLOTS),
        "no range's share exceeds the default index: the test would pass without the hint"
    );

    // Without the hint (back-end 1) every index starts at the smallest table.
    for (range, stats) in backends[1].datastore_stats() {
        assert_eq!(stats.index_capacity, DEFAULT_SLOTS, "range {range} of back-end 1");
    }

    stop.send_replace(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(20), t).await;
    }
}
