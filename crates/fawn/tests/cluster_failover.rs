//! Guards chain repair and re-replication: with 4 back-ends (R=3), one back-end is frozen
//! (SIGSTOP) long enough for the manager to declare it failed while a writer keeps going. The
//! chains it was in repair themselves, a replacement replica syncs each of its ranges, and once
//! it resumes it rejoins through a fresh sync. Every acknowledged write is readable afterwards
//! and every replica of every chain holds the same data.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Cluster, Shape};
use fawn_proto::native::NodeState;

fn backend_pid(port: u16) -> i32 {
    let out = std::process::Command::new("pgrep")
        .args(["-f", &format!("backend --node 1 --listen 127.0.0.1:{port}")])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().expect("backend pid").parse().expect("pid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_backend_is_replaced_and_rejoins() {
    let cluster = Cluster::start(Shape { backends: 4, ..Shape::default() });
    let client = cluster.client().await;
    for i in 0..500u32 {
        client.put(format!("f-{i}").as_bytes(), format!("before-{i}").as_bytes()).await.expect("put");
    }

    let pid = backend_pid(cluster.base_port + 2);
    // SAFETY: signalling a process of this test's cluster.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let frozen_at = Instant::now();
    let mut acked = BTreeMap::new();
    let mut failed = 0;
    let mut i = 0u32;
    let (mut last_ok, mut longest_gap) = (Instant::now(), Duration::ZERO);
    while frozen_at.elapsed() < Duration::from_secs(5) {
        let key = format!("f-{}", i % 700);
        let value = format!("during-{i}");
        match client.put(key.as_bytes(), value.as_bytes()).await {
            Ok(_) => {
                acked.insert(key, value);
                longest_gap = longest_gap.max(last_ok.elapsed());
                last_ok = Instant::now();
            }
            Err(_) => failed += 1,
        }
        i += 1;
    }
    let config = cluster.config().await;
    let state = config.backends.iter().find(|b| b.node == 1).map(|b| b.state);
    assert_eq!(state, Some(NodeState::Failed), "the frozen node is declared failed");
    assert!(config.ranges.iter().all(|r| !r.chain.contains(&1)), "and removed from every chain");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    eprintln!(
        "puts while frozen: {} acked, {failed} failed; longest pause between acknowledged puts: {longest_gap:?}",
        acked.len()
    );

    // Wait for the rejoin and re-replication to settle: every chain back to R=3, none syncing.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = cluster.config().await;
        let settled = c.ranges.iter().all(|r| r.chain.len() == 3 && r.syncing.is_empty())
            && c.backends.iter().all(|b| b.state == NodeState::Alive);
        if settled {
            break;
        }
        assert!(Instant::now() < deadline, "cluster did not settle: {c:?}\n{}", cluster.role_logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    for (key, value) in &acked {
        let got = client.get(key.as_bytes()).await.expect("get").map(|it| it.value);
        assert_eq!(got.as_deref(), Some(value.as_bytes()), "{key} lost its acknowledged value");
    }
    assert_replicas_agree(&cluster).await;
}

async fn assert_replicas_agree(cluster: &Cluster) {
    common::agreed_digests(&cluster.config().await).await;
}
