//! Guards membership changes under traffic: a fourth back-end joins a formed 3-back-end
//! cluster (it syncs the ranges the ring prefers it for and the chains drop the node it
//! replaces), then another back-end leaves gracefully (its replacements sync before it is
//! dropped). Writes continue throughout; afterwards every acknowledged write is readable,
//! chains are back to R in-sync replicas, and every replica of every chain agrees. The join
//! splits the ranges the joiner's virtual ids fall in: each of those ids ends a range of its
//! own, which the joiner replicates. The leave merges the ranges around the leaver's ids back
//! (under writes too): afterwards the ranges are exactly those of the remaining nodes' ring,
//! and each back-end's data directory holds exactly the ranges it replicates.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Cluster, Shape};
use fawn_client::pool::Pool;
use fawn_proto::native::{ClusterConfig, NodeState, Request, Response};

async fn wait_settled(cluster: &Cluster, what: &str, done: impl Fn(&ClusterConfig) -> bool) -> ClusterConfig {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = cluster.config().await;
        if done(&c)
            && c.ranges.iter().all(|r| {
                r.chain.len() == 3 && r.syncing.is_empty() && r.splitting.is_none() && r.merging.is_none()
            })
        {
            return c;
        }
        assert!(Instant::now() < deadline, "{what} did not settle: {c:?}\n{}", cluster.role_logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Puts for 4 s; what was acknowledged. Deletes are left out: a put that failed after the
/// head ordered it may still land, and only acknowledged values are checked.
fn spawn_writer(
    client: std::sync::Arc<fawn_client::Client>,
    tag: &'static str,
) -> tokio::task::JoinHandle<BTreeMap<String, String>> {
    tokio::spawn(async move {
        let mut acked = BTreeMap::new();
        let start = Instant::now();
        let mut i = 0u32;
        while start.elapsed() < Duration::from_secs(4) {
            let (k, v) = (format!("m-{}", i % 900), format!("{tag}-{i}"));
            if client.put(k.as_bytes(), v.as_bytes()).await.is_ok() {
                acked.insert(k, v);
            }
            i += 1;
        }
        acked
    })
}

/// The range directories in a back-end's data directory (named by their ends).
fn range_dirs(data_dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data_dir.join("ranges"))
        .expect("ranges dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The directory names of the ranges `node` replicates.
fn held_ranges(c: &ClusterConfig, node: u32) -> Vec<String> {
    let mut names: Vec<String> =
        c.ranges.iter().filter(|r| r.path().any(|n| n == node)).map(|r| r.range.id_string()).collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_then_leave_under_writes() {
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client().await;
    let mut acked = BTreeMap::new();
    for i in 0..600u32 {
        let (k, v) = (format!("m-{i}"), format!("v0-{i}"));
        client.put(k.as_bytes(), v.as_bytes()).await.expect("put");
        acked.insert(k, v);
    }

    let joiner_dir = cluster.dir.join("backend-3");
    let log = std::fs::File::create(cluster.dir.join("backend-3.log")).expect("log");
    let mut joiner = Command::new(env!("CARGO_BIN_EXE_fawn"))
        .args(["backend", "--node", "3", "--listen", &format!("127.0.0.1:{}", cluster.base_port + 4)])
        .args(["--manager", &cluster.manager_addr(), "--data-dir", &joiner_dir.display().to_string()])
        .args(cluster.transport_args(fawn_tls::Role::Backend, 3))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn joiner");

    // Keep writing while the joiner syncs.
    let writer = spawn_writer(client.clone(), "v1");
    let c = wait_settled(&cluster, "join", |c| c.ranges.iter().any(|r| r.chain.contains(&3))).await;
    assert!(c.backends.iter().any(|b| b.node == 3 && b.state == NodeState::Alive));
    let ring = fawn_ring::Ring::new(&[0, 1, 2, 3], c.vnodes, c.replicas);
    for vid in ring.vids_of(3) {
        assert!(
            c.ranges.iter().any(|r| r.range.end_inclusive == vid.id && r.chain.contains(&3)),
            "no range split off at the joiner's virtual id {:032x}: {c:?}",
            vid.id.0
        );
    }
    acked.extend(writer.await.expect("writer"));

    // Node 0 leaves gracefully, under writes.
    let writer = spawn_writer(client.clone(), "v2");
    let pool = Pool::new(Duration::from_secs(2));
    let leave = Request::Leave { node: 0 };
    let reply =
        fawn_kv::manager::client::call(&pool, &cluster.manager_addr(), leave, Duration::from_secs(2)).await;
    assert!(matches!(reply, Ok(Response::Config(_))), "{reply:?}");
    let remaining = fawn_ring::Ring::new(&[1, 2, 3], c.vnodes, c.replicas);
    let mut ends: Vec<_> = remaining.vids().iter().map(|v| v.id).collect();
    ends.sort();
    let c = wait_settled(&cluster, "leave", |c| {
        c.ranges.iter().all(|r| !r.chain.contains(&0))
            && c.ranges.iter().map(|r| r.range.end_inclusive).collect::<Vec<_>>() == ends
    })
    .await;
    assert_eq!(c.backends.iter().find(|b| b.node == 0).map(|b| b.state), Some(NodeState::Left));
    acked.extend(writer.await.expect("writer"));
    for node in 1..=3u32 {
        let dir = if node == 3 { joiner_dir.clone() } else { cluster.dir.join(format!("backend-{node}")) };
        assert_eq!(range_dirs(&dir), held_ranges(&c, node), "backend-{node}'s range directories");
    }

    for (k, v) in &acked {
        let got = client.get(k.as_bytes()).await.expect("get").map(|it| it.value);
        assert_eq!(got.as_deref(), Some(v.as_bytes()), "{k}");
    }
    for rc in &c.ranges {
        let mut digests = Vec::new();
        for node in &rc.chain {
            let addr = c.backend_addr(*node).expect("addr").to_string();
            digests.push(common::live_digest(&pool, &addr, rc.range).await);
        }
        let differing: Vec<String> = digests[0]
            .keys()
            .chain(digests.iter().skip(1).flat_map(|d| d.keys()))
            .filter(|k| digests.iter().any(|d| d.get(*k) != digests[0].get(*k)))
            .take(5)
            .map(|k| {
                let per_node: Vec<_> = digests.iter().map(|d| d.get(k)).collect();
                format!("{}: {per_node:?}", String::from_utf8_lossy(k))
            })
            .collect();
        assert!(
            differing.is_empty(),
            "replicas {:?} differ for range {} (sizes {:?}), e.g. {differing:#?}",
            rc.chain,
            rc.range.id_string(),
            digests.iter().map(|d| d.len()).collect::<Vec<_>>()
        );
    }
    let _ = joiner.kill();
    let _ = joiner.wait();
}
