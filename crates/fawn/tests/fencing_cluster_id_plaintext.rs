//! Guards the cluster id in a `--plaintext` cluster: a chain connection whose `Hello` names
//! another cluster is refused (an error frame, then closed) and its chain messages are not
//! applied; one naming this cluster is kept open.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::bounds::one_of_each;
use common::procs::Procs;
use fawn_proto::native::{decode_frame, encode_frame, ChainMsg, Message, Response};

/// Sends a `Hello` naming `cluster` and then an `Ack`, and returns what came back and whether
/// the back-end closed the connection within the wait.
fn hello(addr: &str, from: u32, cluster: u64, ack: &ChainMsg) -> (Vec<Message>, bool) {
    let mut out = Vec::new();
    encode_frame(0, &Message::Chain(ChainMsg::Hello { from, cluster }), &mut out).expect("encode");
    encode_frame(0, &Message::Chain(ack.clone()), &mut out).expect("encode");
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.write_all(&out).expect("send");
    stream.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match stream.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                break false
            }
            Err(_) => break true,
        }
    };
    let mut frames = Vec::new();
    let mut at = 0;
    while let Ok(Some((_, message, used))) = decode_frame(&got[at..]) {
        frames.push(message);
        at += used;
    }
    (frames, closed)
}

#[test]
fn a_hello_of_another_cluster_is_refused() {
    let procs = Procs::start(one_of_each(&[], &[]));
    let config = procs.config().expect("config");
    assert_ne!(config.cluster_id, 0, "the manager gives a new cluster an id");
    let backend = procs.backend_addrs[&0].clone();
    let ack = ChainMsg::Ack { epoch: config.epoch, range: config.ranges[0].range, seq: 1 };

    let (frames, closed) = hello(&backend, 1, config.cluster_id ^ 1, &ack);
    let refused = frames
        .iter()
        .any(|m| matches!(m, Message::Response(Response::Error(e)) if e.to_string().contains("refused")));
    assert!(refused && closed, "a Hello of another cluster: {frames:?}, closed: {closed}");

    let (frames, closed) = hello(&backend, 1, config.cluster_id, &ack);
    assert!(frames.is_empty() && !closed, "a Hello of this cluster: {frames:?}, closed: {closed}");
}
