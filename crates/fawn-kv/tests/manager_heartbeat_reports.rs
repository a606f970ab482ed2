//! Guards the failure detector's division of labour (paper §3.4.4): the front-ends heartbeat
//! the back-ends and report to the manager, which decides. A real manager over real TCP, a
//! scripted front-end sending `Heartbeats` reports, and stand-in back-ends that answer pings
//! (or a closed port that does not):
//! 1. while a front-end reports, the manager does not heartbeat on its own: a back-end that
//!    the report says answers stays alive even though it is unreachable;
//! 2. a back-end a front-end reports silent past the threshold but which answers the manager
//!    is not declared failed (a link between one front-end and a healthy back-end is down);
//! 3. a back-end reported silent that does not answer the manager is declared failed, well
//!    within one threshold of the report;
//! 4. once no front-end reports, the manager heartbeats itself and finds a dead back-end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_client::pool::Pool;
use fawn_kv::manager::{Manager, ManagerOptions};
use fawn_kv::server::{self, Handler};
use fawn_proto::native::{NodeState, Request, Response};
use fawn_ring::NodeId;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::watch;

const HEARTBEAT: Duration = Duration::from_millis(100);
const FD_THRESHOLD: u32 = 5;
const LIMIT: Duration = Duration::from_millis(500);

/// Per back-end, since when the scripted front-end has not heard it; `None`: stop reporting.
type Silences = Arc<Mutex<Option<Vec<(NodeId, Option<Instant>)>>>>;

/// A back-end stand-in that answers pings, noting when it last did, and accepts whatever the
/// manager pushes.
struct Answering(Arc<Mutex<Instant>>);

impl Handler for Answering {
    async fn request(self: Arc<Self>, request: Request) -> Response {
        match request {
            Request::Ping => {
                *self.0.lock() = Instant::now();
                Response::Pong
            }
            _ => Response::Ok,
        }
    }
}

/// An address nothing listens on.
async fn closed_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    l.local_addr().expect("addr").to_string()
}

/// Its address, and when it last answered a ping.
async fn answering_backend(shutdown: watch::Receiver<bool>) -> (String, Arc<Mutex<Instant>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let pong = Arc::new(Mutex::new(Instant::now()));
    tokio::spawn(server::serve(l, Arc::new(Answering(pong.clone())), shutdown));
    (addr, pong)
}

fn state_of(manager: &Manager, node: NodeId) -> NodeState {
    let c = manager.config();
    c.backends.iter().find(|b| b.node == node).map(|b| b.state).expect("node registered")
}

/// Waits until `node` is in state `want` and returns how long after `from` (when its silence
/// began) that was first seen. Measured from the caller's instant, not from this call: the
/// manager counts the silence from `from`, and a measurement that started later would make an
/// on-time decision look early.
async fn wait_for_state(
    manager: &Manager,
    node: NodeId,
    want: NodeState,
    from: Instant,
    within: Duration,
) -> Duration {
    let start = from;
    while state_of(manager, node) != want {
        assert!(
            start.elapsed() < within,
            "back-end {node} still {:?} after {within:?}",
            state_of(manager, node)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frontends_report_and_the_manager_decides() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_stop, shutdown) = watch::channel(false);
    let (stop_node2, node2_shutdown) = watch::channel(false);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind manager");
    let manager_addr = listener.local_addr().expect("addr").to_string();
    let manager = Manager::open(ManagerOptions {
        group: vec![manager_addr.clone()],
        id: 1,
        snapshot_every: fawn_kv::manager::raft::SNAPSHOT_EVERY_ENTRIES,
        data_dir: dir.path().join("manager"),
        expected_backends: 3,
        replicas: 2,
        vnodes: 2,
        expected_frontends: 1,
        heartbeat: HEARTBEAT,
        fd_threshold: FD_THRESHOLD,
    })
    .await
    .expect("open manager");
    assert!(manager.wait_leading(Duration::from_secs(5)).await, "a group of one elects itself");
    assert_eq!(HEARTBEAT * FD_THRESHOLD, LIMIT);
    tokio::spawn(manager.clone().serve(listener, shutdown.clone()));

    // The scripted front-end reports every heartbeat, for each back-end, the time since the
    // instant `silences` holds for it (none: it answered this round).
    // `reported`: when the last report began.
    let silences: Silences = Arc::new(Mutex::new(Some(vec![(0, None), (1, None), (2, None)])));
    let reported = Arc::new(Mutex::new(Instant::now()));
    let pool = Arc::new(Pool::new(Duration::from_secs(1)));
    {
        let (silences, reported) = (silences.clone(), reported.clone());
        let (pool, addr) = (pool.clone(), manager_addr.clone());
        tokio::spawn(async move {
            loop {
                let report = silences.lock().clone();
                if let Some(report) = report {
                    *reported.lock() = Instant::now();
                    let silent_ms = report
                        .iter()
                        .map(|(node, since)| (*node, since.map_or(0, |t| t.elapsed().as_millis() as u64)))
                        .collect();
                    let r = pool.call(&addr, Request::Heartbeats { frontend: 0, silent_ms }, HEARTBEAT).await;
                    assert!(matches!(r, Ok(Response::Lease { .. })), "report answered {r:?}");
                }
                tokio::time::sleep(HEARTBEAT).await;
            }
        });
    }
    tokio::time::sleep(HEARTBEAT * 2).await;

    let node2 = answering_backend(node2_shutdown).await;
    let addrs = [answering_backend(shutdown.clone()).await.0, closed_addr().await, node2.0.clone()];
    for (node, addr) in addrs.iter().enumerate() {
        let r = pool
            .call(
                &manager_addr,
                Request::RegisterBackend { node: node as NodeId, addr: addr.clone(), logs_complete: true },
                LIMIT,
            )
            .await;
        assert!(matches!(r, Ok(Response::Config(_))), "register {node}: {r:?}");
    }
    assert!(manager.config().formed, "ring formed");

    // 1. Node 1 is unreachable, but the front-end says it answers: the manager must not probe.
    tokio::time::sleep(LIMIT * 3).await;
    assert_eq!(
        state_of(&manager, 1),
        NodeState::Alive,
        "the manager heartbeated on its own while a front-end reports"
    );

    // 2. The front-end loses node 0, which the manager still reaches.
    *silences.lock() = Some(vec![(0, Some(Instant::now())), (1, None), (2, None)]);
    tokio::time::sleep(LIMIT * 2).await;
    assert_eq!(state_of(&manager, 0), NodeState::Alive, "a one-sided silence removed a healthy back-end");

    // 3. The front-end reports node 1 silent: the manager cannot reach it either. Its silence
    // began with the last report that said it answered, the last the manager heard of it (a
    // later instant would make an on-time decision look early when reports come late).
    let since = *reported.lock();
    *silences.lock() = Some(vec![(0, None), (1, Some(since)), (2, None)]);
    let took = wait_for_state(&manager, 1, NodeState::Failed, since, LIMIT * 2).await;
    eprintln!("declared failed {took:?} after the front-end last heard it");
    assert!(took >= LIMIT, "declared failed after {took:?}, before a full threshold of silence");

    // 4. No front-end reports any more, and node 2 stops answering.
    *silences.lock() = None;
    stop_node2.send_replace(true);
    wait_for_state(&manager, 2, NodeState::Failed, Instant::now(), LIMIT * 6).await;
    // Its silence began when the manager last heard of it: its last answer to a ping, or the
    // front-end's last report.
    let took = (*node2.1.lock()).max(*reported.lock()).elapsed();
    eprintln!("the manager's own heartbeats found the dead back-end in {took:?}");
    assert!(took >= LIMIT, "declared failed after {took:?}, before a full threshold of silence");
}
