//! Guards the removal of a manager from the group: three real managers over real TCP, one
//! removed with `ChangeManagers` while it keeps running. The leader stops replicating to it at
//! once, so its own log never shows the removal; it must find out from the others and stop
//! standing for election (before, it started a new election, a new term, every ~0.5 s for as
//! long as it ran). The two left keep one leader and their term.

mod manager_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fawn_client::pool::Pool;
use fawn_proto::native::{Request, Response};

/// Each manager's status counters (empty if it does not answer).
async fn counters(pool: &Pool, addr: &str) -> BTreeMap<String, u64> {
    match pool.call(addr, Request::Status, Duration::from_secs(1)).await {
        Ok(Response::Status(s)) => s.counters.into_iter().collect(),
        _ => BTreeMap::new(),
    }
}

async fn counter(pool: &Pool, addr: &str, name: &str) -> u64 {
    counters(pool, addr).await.get(name).copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_manager_stops_campaigning() {
    let group = manager_support::start(3, Duration::from_millis(200), 10).await;
    let addrs = &group.addrs;
    let pool = Pool::new(Duration::from_secs(1));
    let list = addrs.join(",");
    let deadline = Instant::now() + Duration::from_secs(30);
    // Remove a follower (removing the leader works too, but then the group first elects anew).
    let leader = group.leader().await;
    let victim = (leader + 1) % 3;
    let id = victim as u64 + 1;
    let request = Request::ChangeManagers { id, addr: addrs[victim].clone(), add: false };
    let answer = fawn_kv::manager::client::call(&pool, &list, request, Duration::from_secs(10)).await;
    assert!(matches!(answer, Ok(Response::Ok)), "removing manager {id}: {answer:?}");

    // The removed manager finds out and stops: it says it was removed, and its term stays put
    // for 3 s (election time-outs are 0.2-0.35 s after a 0.35 s lease: a campaigner would have
    // moved it several times). A quiet term alone is not enough: a slow machine can keep a
    // follower from campaigning for 3 s before it has heard of its removal.
    let quiet_for = Duration::from_secs(3);
    let mut since = (Instant::now(), counter(&pool, &addrs[victim], "raft_term").await);
    loop {
        let term = counter(&pool, &addrs[victim], "raft_term").await;
        if term != since.1 {
            since = (Instant::now(), term);
        } else if since.0.elapsed() >= quiet_for && counter(&pool, &addrs[victim], "raft_removed").await == 1
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the removed manager {id} did not learn of its removal and stop: term {term}, status {:?}",
            counters(&pool, &addrs[victim]).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(counter(&pool, &addrs[victim], "raft_removed").await, 1, "it says it was removed");

    // The two left still have one leader, and their term did not move meanwhile.
    let left: Vec<&String> = addrs.iter().enumerate().filter(|(i, _)| *i != victim).map(|(_, a)| a).collect();
    let terms = each(&pool, &left, "raft_term").await;
    assert_eq!(each(&pool, &left, "raft_voters").await, vec![2, 2], "the group has two voters");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(each(&pool, &left, "raft_term").await, terms, "the remaining managers' term moved");
    let leaders = each(&pool, &left, "raft_leader").await;
    assert!(leaders[0] == leaders[1] && leaders[0] != id && leaders[0] != 0, "leaders {leaders:?}");
}

/// One counter of each manager at `addrs`.
async fn each(pool: &Pool, addrs: &[&String], name: &str) -> Vec<u64> {
    let mut v = Vec::new();
    for a in addrs {
        v.push(counter(pool, a, name).await);
    }
    v
}
