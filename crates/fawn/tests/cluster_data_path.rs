//! Guards the cluster data path end to end: a real `fawn up` (manager, 3 back-ends, 2
//! front-ends, R=3, V=2) as separate processes on loopback; thousands of keys written and read
//! through the ring-aware Rust client and through each front-end (native and memcached); then
//! every replica of every chain must hold the same committed data.

mod common;

use std::time::Duration;

use common::{Cluster, Memcached, Shape};
use fawn_client::pool::Pool;
use fawn_proto::native::{Request, Response};
use fawn_ring::Ring;

const KEYS: usize = 3000;

fn value_of(i: usize) -> Vec<u8> {
    format!("value-{i}-{}", "x".repeat(i % 300)).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_serves_and_replicas_agree() {
    let cluster = Cluster::start(Shape { frontends: 2, ..Shape::default() });
    let client = cluster.client().await;

    // Concurrent puts through the ring-aware client.
    let mut tasks = Vec::new();
    for t in 0..16 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in (t..KEYS).step_by(16) {
                client.put(format!("key-{i}").as_bytes(), &value_of(i)).await.expect("put");
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    // Deletes of every 10th key.
    for i in (0..KEYS).step_by(10) {
        assert!(client.delete(format!("key-{i}").as_bytes()).await.expect("delete"));
    }
    let expected = |i: usize| (!i.is_multiple_of(10)).then(|| value_of(i));

    // Reads through the client.
    for i in 0..KEYS {
        let got = client.get(format!("key-{i}").as_bytes()).await.expect("get").map(|item| item.value);
        assert_eq!(got, expected(i), "key-{i} via client");
    }

    // Reads through each front-end's native port (forwarding when outside its wedge).
    let pool = Pool::new(Duration::from_secs(2));
    let epoch = cluster.config().await.epoch;
    for f in 0..2 {
        let addr = cluster.frontend_native(f);
        for i in (0..KEYS).step_by(7) {
            let req = Request::Get { epoch, key: format!("key-{i}").into_bytes(), forwarded: false };
            match pool.call(&addr, req, Duration::from_secs(5)).await.expect("native get") {
                Response::Get(item) => assert_eq!(item.map(|i| i.value), expected(i), "key-{i} via fe{f}"),
                other => panic!("{other:?}"),
            }
        }
    }

    // Reads through each front-end's memcached port.
    let addrs: Vec<String> = (0..2).map(|f| cluster.frontend_memcached(f)).collect();
    tokio::task::spawn_blocking(move || {
        for addr in addrs {
            let mut mc = Memcached::connect(&addr);
            for i in (0..KEYS).step_by(11) {
                assert_eq!(mc.get(&format!("key-{i}")), expected(i), "key-{i} via memcached {addr}");
            }
        }
    })
    .await
    .expect("memcached reads");

    assert_replicas_agree(&cluster, &pool).await;
}

/// Every node of every chain returns the same digest for the range.
async fn assert_replicas_agree(cluster: &Cluster, pool: &Pool) {
    let config = cluster.config().await;
    let nodes: Vec<_> = config.backends.iter().map(|b| b.node).collect();
    let ring = Ring::new(&nodes, config.vnodes, config.replicas);
    let mut total = 0;
    for (range, owner) in ring.ranges() {
        let chain = ring.chain_for_range(&owner);
        assert_eq!(chain.nodes.len(), 3);
        let mut digests = Vec::new();
        for node in &chain.nodes {
            let addr = &config.backends.iter().find(|b| b.node == *node).expect("backend").addr;
            digests.push(common::range_digest(pool, addr, range).await);
        }
        for (n, d) in chain.nodes.iter().zip(&digests).skip(1) {
            assert_eq!(
                d,
                &digests[0],
                "replica on node {n} differs from the head for range {}",
                range.id_string()
            );
        }
        total += digests[0].len();
    }
    assert_eq!(total, KEYS, "every key (live or deleted) appears in exactly one range");
}
