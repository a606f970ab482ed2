//! Guards exactly-once updates: a retried request (same request id) is answered with its
//! first outcome and never decided again — a retried delete that first found nothing must not
//! erase a put acknowledged in between (found by the fault tests: retries queued behind a
//! stopped head), and a retried put must not overwrite a later put.

mod common;

use std::time::Duration;

use common::{Cluster, Shape};
use fawn_client::pool::Pool;
use fawn_proto::native::{ReqId, Request, Response};
use fawn_proto::op::{Mutation, Outcome, Update};

fn update(key: &[u8], mutation: Mutation, value: &[u8]) -> Update {
    Update { key: key.to_vec(), mutation, value: value.to_vec(), flags: 0, expiry: 0 }
}

async fn send(pool: &Pool, cluster: &Cluster, req: ReqId, u: Update) -> Outcome {
    let epoch = cluster.config().await.epoch;
    let request = Request::Update { epoch, req, update: u, forwarded: false, reply_to: None, floor: 0 };
    match pool.call(&cluster.frontend_native(0), request, Duration::from_secs(5)).await.expect("update") {
        Response::Update(outcome) => outcome,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_requests_keep_their_first_outcome() {
    let cluster = Cluster::start(Shape::default());
    let pool = Pool::new(Duration::from_secs(2));
    let client = cluster.client().await;
    let id = |seq| ReqId { client: 0xfeed, seq };

    let delete = update(b"dd", Mutation::Delete, b"");
    assert_eq!(send(&pool, &cluster, id(1), delete.clone()).await, Outcome::NotFound);
    client.put(b"dd", b"acknowledged").await.expect("put");
    assert_eq!(send(&pool, &cluster, id(1), delete).await, Outcome::NotFound, "the retry answers as before");
    let got = client.get(b"dd").await.expect("get").map(|i| i.value);
    assert_eq!(got.as_deref(), Some(&b"acknowledged"[..]), "and does not delete again");

    let first = send(&pool, &cluster, id(2), update(b"pp", Mutation::Set, b"first")).await;
    client.put(b"pp", b"second").await.expect("put");
    assert_eq!(send(&pool, &cluster, id(2), update(b"pp", Mutation::Set, b"first")).await, first);
    let got = client.get(b"pp").await.expect("get").map(|i| i.value);
    assert_eq!(got.as_deref(), Some(&b"second"[..]), "a retried put is not applied twice");
}
