//! Guards that `Update.reply_to` cannot make a back-end connect to any address a client
//! names: a tail sends its `Committed` notice only to front-ends of its configuration. An
//! update naming a stranger's address is applied and answered by the head as usual, but the
//! stranger never gets a connection. (That the real front-end still gets its notices is not
//! asserted here: nothing counts them. With one replica the head is the tail and answers
//! every update itself; in a longer chain it leaves a front-end's to the tail's notice.)

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::bounds::one_of_each;
use common::procs::Procs;
use fawn_client::pool::Pool;
use fawn_proto::native::{ReqId, Request, Response};
use fawn_proto::op::{Mutation, Outcome, Update};

fn set(key: &[u8]) -> Update {
    Update { key: key.to_vec(), mutation: Mutation::Set, value: b"v".to_vec(), flags: 0, expiry: 0 }
}

#[test]
fn committed_notices_go_only_to_front_ends_of_the_configuration() {
    let procs = Procs::start(one_of_each(&[], &[]));
    let stranger = TcpListener::bind("127.0.0.1:0").expect("bind");
    stranger.set_nonblocking(true).expect("nonblocking");
    let stranger_addr = stranger.local_addr().expect("addr").to_string();
    let epoch = procs.config().expect("config").epoch;
    let backend = procs.backend_addrs[&0].clone();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let pool = Pool::new(Duration::from_secs(2));
    let update = |seq, reply_to: &str| {
        let req = Request::Update {
            epoch,
            req: ReqId { client: 7, seq },
            update: set(format!("reply-to-{seq}").as_bytes()),
            forwarded: true,
            reply_to: Some(reply_to.to_string()),
            floor: 0,
        };
        match rt.block_on(pool.call(&backend, req, Duration::from_secs(5))) {
            Ok(Response::Update(Outcome::Stored { .. })) => {}
            other => panic!("update {seq}: {other:?}"),
        }
    };
    for seq in 1..=20 {
        update(seq, &stranger_addr);
    }
    std::thread::sleep(Duration::from_millis(500));
    match stranger.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the back-end connected to an address that is no front-end: {other:?}"),
    }
    // The address the front-end advertises is the one the configuration lists.
    let frontend = procs.frontend_addrs[0].0.clone();
    assert!(procs.config().expect("config").lists_frontend(&frontend));
    update(21, &frontend);
}
