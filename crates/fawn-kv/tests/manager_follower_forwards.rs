//! Guards the followers' forwarding: three real managers over real TCP, and a caller that
//! talks to one follower only (it never follows the leader's name, as a process cut off from
//! the leader but not from that follower could not). Every report and renewal it sends is
//! answered, as the leader answers it: back-ends report, a front-end heartbeats, leases come
//! back with the leader's term. A request the follower does not pass on (a registration, a
//! change of the group) names the leader, and a request passed on to a manager that does not
//! lead is not passed on again.

mod manager_support;

use std::time::{Duration, Instant};

use fawn_client::pool::Pool;
use fawn_kv::manager::raft;
use fawn_proto::native::{ClusterConfig, NodeState, Request, Response, WireError};

const BACKENDS: u32 = 3;

/// Sends `request` to the manager at `addr` alone, retrying for a while only on time-outs,
/// "no configuration yet" (a new group commits its first one just after electing) and "no
/// leader known" (a follower learns of a new leader from its first message, which may not
/// have arrived yet).
async fn ask(pool: &Pool, addr: &str, request: Request) -> Response {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match pool.call(addr, request.clone(), Duration::from_secs(2)).await {
            Ok(Response::Error(WireError::Unavailable(_) | WireError::NotLeader { leader: None }))
            | Err(_)
                if Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(answer) => return answer,
            Err(e) => panic!("{request:?} to {addr}: {e}"),
        }
    }
}

fn config(answer: Response, what: &str) -> ClusterConfig {
    match answer {
        Response::Config(c) => c,
        other => panic!("{what}: answered {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_reaches_only_a_follower_makes_progress() {
    // Long enough that the managers' own detector fails no stand-in back-end here.
    let group = manager_support::start(BACKENDS as usize, Duration::from_secs(1), 30).await;
    let (addrs, managers) = (&group.addrs, &group.managers);
    let leader = group.leader().await;
    let follower = (leader + 1) % 3;
    let at = addrs[follower].clone();
    let pool = Pool::new(Duration::from_secs(1));

    // A registration is not passed on: the follower names the leader, where the back-ends
    // register (a process starts out talking to the leader).
    let register = Request::RegisterBackend { node: 1, addr: "127.0.0.1:2".into(), logs_complete: true };
    match ask(&pool, &at, register).await {
        Response::Error(WireError::NotLeader { leader: Some(l) }) => assert_eq!(l, addrs[leader]),
        other => panic!("RegisterBackend to a follower answered {other:?}"),
    }
    for node in 1..=BACKENDS {
        let register =
            Request::RegisterBackend { node, addr: format!("127.0.0.1:{}", 1 + node), logs_complete: true };
        let c = config(ask(&pool, &addrs[leader], register).await, "RegisterBackend");
        assert!(c.backends.iter().any(|b| b.node == node), "node {node} registered: {c:?}");
    }
    // From here on everything goes through the follower alone.
    let formed = config(ask(&pool, &at, Request::GetConfig).await, "GetConfig");
    assert!(formed.formed, "the ranges formed: {formed:?}");

    // A back-end's renewal: a lease of the leader's term, with the configuration.
    let term = match ask(&pool, &addrs[leader], Request::Status).await {
        Response::Status(s) => s.counters.iter().find(|(k, _)| k == "raft_term").map_or(0, |(_, v)| *v),
        other => panic!("Status answered {other:?}"),
    };
    assert!(term > 0);
    match ask(&pool, &at, Request::Renew).await {
        Response::Lease { term: t, config } => {
            assert!(t >= term, "lease of term {t}, the leader's is {term}");
            assert!(config.epoch >= formed.epoch);
        }
        other => panic!("Renew answered {other:?}"),
    }

    // A back-end's report is acted on: node 1's disk fails, it is degraded.
    let fault = Request::DiskFault { node: 1, reason: "no space left on device".into() };
    let c = config(ask(&pool, &at, fault).await, "DiskFault");
    let state = c.backends.iter().find(|b| b.node == 1).map(|b| b.state);
    assert_eq!(state, Some(NodeState::Degraded), "{c:?}");

    // A front-end (registered at the leader) heartbeats through the follower.
    let register = Request::RegisterFrontend {
        id: 0,
        native_addr: "127.0.0.1:9".into(),
        memcache_addr: "127.0.0.1:10".into(),
    };
    let c = config(ask(&pool, &addrs[leader], register).await, "RegisterFrontend");
    assert_eq!(c.frontends.len(), 1, "{c:?}");
    let silent_ms = (1..=BACKENDS).map(|n| (n, 0)).collect();
    match ask(&pool, &at, Request::Heartbeats { frontend: 0, silent_ms }).await {
        Response::Lease { config, .. } => assert_eq!(config.frontends.len(), 1),
        other => panic!("Heartbeats answered {other:?}"),
    }
    let flush = config(ask(&pool, &at, Request::SetFlush { at_micros: 7 }).await, "SetFlush");
    assert!(managers[leader].config().epoch >= flush.epoch, "the leader applied what the follower answered");

    // Changing the group is not passed on: the follower names the leader.
    let change = Request::ChangeManagers { id: 9, addr: "127.0.0.1:1".into(), add: true };
    match ask(&pool, &at, change).await {
        Response::Error(WireError::NotLeader { leader: Some(l) }) => assert_eq!(l, addrs[leader]),
        other => panic!("ChangeManagers to a follower answered {other:?}"),
    }

    // A request passed on to a manager that does not lead is not passed on again.
    let passed = raft::network::forward(&pool, &at, Request::Renew, Duration::from_secs(2)).await;
    assert!(
        matches!(passed, Some(Response::Error(WireError::NotLeader { .. }))),
        "a forwarded renewal at a follower answered {passed:?}"
    );
    let passed = raft::network::forward(&pool, &addrs[leader], Request::Renew, Duration::from_secs(2)).await;
    assert!(matches!(passed, Some(Response::Lease { .. })), "at the leader: {passed:?}");
}
