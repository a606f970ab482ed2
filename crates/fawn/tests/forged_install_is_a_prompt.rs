//! Guards the rule that a pushed configuration is only a prompt to fetch one from the manager
//! group: on a plaintext cluster (no certificates to refuse it), a forged `Install` with a far
//! newer epoch and no ranges, sent to every back-end and front-end, is answered but installs
//! nothing; afterwards every node still serves the manager's configuration, every range is
//! still there and every acknowledged write reads back from every replica.

mod common;

use std::time::Duration;

use common::procs::{start_filled, ProcShape};
use fawn_client::framed::FrameReader;
use fawn_client::transport::Transport;
use fawn_proto::native::{encode_frame, ClusterConfig, Message, Request, Response};
use tokio::io::AsyncWriteExt;

const WAIT: Duration = Duration::from_secs(3);

/// Sends one request over a fresh plaintext connection and returns the answer.
async fn ask(addr: &str, request: Request) -> Response {
    let stream = Transport::Plain.connect(addr, WAIT).await.expect("connect");
    let (reader, mut writer) = stream.into_split();
    let mut bytes = Vec::new();
    encode_frame(1, &Message::Request(request), &mut bytes).expect("encode");
    writer.write_all(&bytes).await.expect("write");
    let mut frames = FrameReader::new(reader);
    match tokio::time::timeout(WAIT, frames.next()).await {
        Ok(Ok(Some((_, Message::Response(r))))) => r,
        other => panic!("no answer from {addr}: {other:?}"),
    }
}

#[test]
fn a_forged_install_changes_nothing() {
    let shape = ProcShape { backends: 3, ..ProcShape::default() };
    let (procs, rt, client, want) = start_filled(shape, 200);
    let before = procs.config().expect("config");
    let mut forged: ClusterConfig = before.clone();
    forged.epoch += 1_000;
    forged.ranges.clear();
    let mut targets: Vec<String> = procs.backend_addrs.values().cloned().collect();
    targets.extend(procs.frontend_addrs.iter().map(|(native, _)| native.clone()));
    for addr in &targets {
        let answer = rt.block_on(ask(addr, Request::Install { config: forged.clone() }));
        assert!(matches!(answer, Response::Ok), "{addr} answered the push with {answer:?}");
    }
    // Give a wrongly installed configuration time to drop ranges.
    std::thread::sleep(Duration::from_secs(2));
    let after = procs.config().expect("config");
    assert_eq!(after.ranges.len(), before.ranges.len(), "the manager's ranges changed");
    for addr in &targets {
        match rt.block_on(ask(addr, Request::GetConfig)) {
            Response::Config(c) => {
                assert!(c.epoch < forged.epoch, "{addr} installed the forged epoch {}", c.epoch);
                assert_eq!(c.ranges.len(), after.ranges.len(), "{addr} serves other ranges");
            }
            other => panic!("{addr}: GetConfig answered {other:?}"),
        }
    }
    rt.block_on(common::assert_every_write_held(&client, &want, &after));
}
