//! Guards request outcomes that survive a restart: with one replica per range (R=1) an
//! `incr` whose reply is lost is retried after the back-end was killed with kill -9 and
//! started again on its data directory. The range's only replica keeps its place, so only
//! the outcome kept in the incremented record (FAWN-DS record format 3) can answer the retry:
//! it must get the first outcome, and the counter must be incremented once.

mod common;

use std::time::{Duration, Instant};

use common::procs::{ProcShape, Procs};
use fawn_client::pool::Pool;
use fawn_proto::native::{ReqId, Request, Response};
use fawn_proto::op::{Mutation, Outcome, Update};
use tokio::runtime::Runtime;

fn counter(mutation: Mutation, value: &[u8]) -> Update {
    Update { key: b"counter".to_vec(), mutation, value: value.to_vec(), flags: 0, expiry: 0 }
}

fn incr(delta: u64) -> Update {
    counter(Mutation::Incr { delta }, b"")
}

/// Sends `update` as request `req` through the front-end until it is answered (the back-end
/// may be restarting), for at most a minute.
fn send(procs: &Procs, rt: &Runtime, req: ReqId, update: &Update) -> Outcome {
    let pool = Pool::new(Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let epoch = procs.config().map_or(0, |c| c.epoch);
        let request = Request::Update {
            epoch,
            req,
            update: update.clone(),
            forwarded: false,
            reply_to: None,
            floor: 0,
        };
        let call = pool.call(&procs.frontend_addrs[0].0, request, Duration::from_secs(5));
        let last = match rt.block_on(call) {
            Ok(Response::Update(outcome)) => return outcome,
            other => format!("{other:?}"),
        };
        assert!(Instant::now() < deadline, "request {req:?} not answered in time: {last}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_retried_incr_is_applied_once_across_a_kill9_of_its_only_replica() {
    let shape = ProcShape { backends: 1, frontends: 1, replicas: 1, ..ProcShape::default() };
    let mut procs = Procs::start(shape);
    let node = procs.backend_nodes()[0];
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let id = |seq| ReqId { client: 0x0C0F_FEE0, seq };
    let set = counter(Mutation::Set, b"10");
    assert!(matches!(send(&procs, &rt, id(1), &set), Outcome::Stored { .. }));
    // This reply is lost on its way to the client, which will send the request again.
    let first = send(&procs, &rt, id(2), &incr(1));
    assert!(matches!(first, Outcome::Counter { value: 11, .. }), "{first:?}");

    procs.kill9(node);
    procs.restart_backend(node);

    let retry = send(&procs, &rt, id(2), &incr(1));
    assert_eq!(retry, first, "the retry gets the first outcome");
    let next = send(&procs, &rt, id(3), &incr(1));
    assert!(matches!(next, Outcome::Counter { value: 12, .. }), "the retry was applied twice: {next:?}");
}
