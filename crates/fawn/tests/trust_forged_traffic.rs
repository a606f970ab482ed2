//! Guards the trust boundary of a TLS cluster against a hostile client speaking the native
//! protocol: without a certificate, with a certificate of another CA (claiming the same
//! cluster name), and with valid certificates of the wrong role or node, each forged frame
//! (a configuration `Install` dropping every range, a chain link as another back-end, `Leave`,
//! `RegisterBackend` over another node, a front-end's heartbeats, an update naming
//! `reply_to`) is refused with a closed connection and a log line, and afterwards the
//! cluster's membership is unchanged and every acknowledged write reads back. Positive
//! controls (the same helper with the right certificate) show each refusal is a refusal.

mod common;

use std::time::Duration;

use common::procs::{start_filled, ProcShape};
use fawn_client::framed::FrameReader;
use fawn_client::transport::Transport;
use fawn_proto::native::{encode_frame, ChainMsg, ClusterConfig, Message, ReqId, Request, Response};
use fawn_proto::op::{Mutation, Update};
use fawn_tls::{ClusterCa, Identity, Role, TlsSetup};
use tokio::io::AsyncWriteExt;

/// How long a refused connection may take to close, and an accepted one is watched.
const WAIT: Duration = Duration::from_secs(3);

/// What a peer saw after sending its frames.
#[derive(Debug)]
enum Seen {
    /// The connection could not be made (TCP or the TLS handshake failed).
    NoConnection(String),
    /// Responses read, and whether the server closed the connection within [`WAIT`].
    Answered { responses: Vec<Response>, closed: bool },
}

impl Seen {
    fn refused(&self) -> bool {
        match self {
            Seen::NoConnection(reason) => !reason.is_empty(),
            Seen::Answered { responses, closed } => {
                *closed
                    && responses
                        .iter()
                        .all(|r| matches!(r, Response::Error(e) if e.to_string().contains("refused")))
            }
        }
    }
}

fn credentials(ca: &ClusterCa, role: Role, node: u32) -> Transport {
    impostor(ca, ca, role, node)
}

/// A peer with a certificate of `issuer` that trusts `trusted` (the cluster's CA, so that it
/// gets as far as presenting its certificate to the cluster's server).
fn impostor(issuer: &ClusterCa, trusted: &ClusterCa, role: Role, node: u32) -> Transport {
    let identity = Identity::new(issuer.cluster(), role, node).expect("identity");
    let creds = issuer.issue(&identity).expect("issue");
    Transport::Tls(TlsSetup::new(trusted.cert_pem(), &creds, identity).expect("setup"))
}

async fn send(transport: &Transport, addr: &str, frames: &[Message]) -> Seen {
    let stream = match transport.connect(addr, WAIT).await {
        Ok(s) => s,
        Err(e) => return Seen::NoConnection(e.to_string()),
    };
    let (reader, mut writer) = stream.into_split();
    let mut bytes = Vec::new();
    for (id, frame) in frames.iter().enumerate() {
        encode_frame(id as u64 + 1, frame, &mut bytes).expect("encode");
    }
    if let Err(e) = writer.write_all(&bytes).await {
        return Seen::NoConnection(format!("write: {e}"));
    }
    let mut frames = FrameReader::new(reader);
    let mut responses = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, frames.next()).await {
            Err(_) => return Seen::Answered { responses, closed: false },
            Ok(Ok(Some((_, Message::Response(r))))) => responses.push(r),
            Ok(Ok(Some(_))) => {}
            // Closed (cleanly, or reset: under TLS 1.3 a refused client learns it on reading).
            Ok(Ok(None)) | Ok(Err(_)) => return Seen::Answered { responses, closed: true },
        }
    }
}

fn request(r: Request) -> Message {
    Message::Request(r)
}

/// A configuration newer than the cluster's that holds no range: installed, it would make a
/// back-end drop every range it has.
fn empty_install(config: &ClusterConfig) -> Message {
    let mut forged = config.clone();
    forged.epoch += 100;
    forged.ranges.clear();
    request(Request::Install { config: forged })
}

#[test]
fn forged_frames_are_refused_and_change_nothing() {
    let mut shape = ProcShape { tls: true, ..ProcShape::default() };
    shape.backends = 3;
    let (procs, rt, client, want) = start_filled(shape, 200);
    let before = procs.config().expect("config");
    let (backend0, manager, frontend) = (
        procs.backend_addrs[&0].as_str(),
        procs.manager_addrs[0].as_str(),
        procs.frontend_addrs[0].0.as_str(),
    );
    let ca = ClusterCa::load(common::tls::shared_ca_dir()).expect("test CA");
    let stranger_ca = ClusterCa::create(common::tls::TEST_CLUSTER).expect("another CA, same name");
    let update_with_reply_to = request(Request::Update {
        epoch: before.epoch,
        req: ReqId { client: 99, seq: 1 },
        update: Update {
            key: b"forged".to_vec(),
            mutation: Mutation::Set,
            value: b"x".to_vec(),
            flags: 0,
            expiry: 0,
        },
        forwarded: true,
        reply_to: Some("127.0.0.1:9".into()),
        floor: 0,
    });
    let hello_as = |node| Message::Chain(ChainMsg::Hello { from: node, cluster: before.cluster_id });
    let forged_ack = Message::Chain(ChainMsg::Ack {
        epoch: before.epoch,
        range: before.ranges[0].range,
        seq: u64::MAX / 2,
    });

    let cases: Vec<(&str, Transport, &str, Vec<Message>)> = vec![
        ("no certificate: Install", Transport::Plain, backend0, vec![empty_install(&before)]),
        (
            "another CA's manager: Install",
            impostor(&stranger_ca, &ca, Role::Manager, 1),
            backend0,
            vec![empty_install(&before)],
        ),
        (
            "another CA's admin: Leave",
            impostor(&stranger_ca, &ca, Role::Admin, 0),
            manager,
            vec![request(Request::Leave { node: 0 })],
        ),
        ("back-end 1: Install", credentials(&ca, Role::Backend, 1), backend0, vec![empty_install(&before)]),
        (
            "back-end 1: Hello as node 2",
            credentials(&ca, Role::Backend, 1),
            backend0,
            vec![hello_as(2), forged_ack.clone()],
        ),
        (
            "front-end 0: Hello as node 1",
            credentials(&ca, Role::Frontend, 0),
            backend0,
            vec![hello_as(1), forged_ack],
        ),
        (
            "front-end 0: Leave",
            credentials(&ca, Role::Frontend, 0),
            manager,
            vec![request(Request::Leave { node: 0 })],
        ),
        (
            "back-end 1: Leave",
            credentials(&ca, Role::Backend, 1),
            manager,
            vec![request(Request::Leave { node: 1 })],
        ),
        (
            "back-end 1: RegisterBackend as node 0",
            credentials(&ca, Role::Backend, 1),
            manager,
            vec![request(Request::RegisterBackend {
                node: 0,
                addr: "127.0.0.1:9".into(),
                logs_complete: true,
            })],
        ),
        (
            "back-end 2: Heartbeats as front-end 0",
            credentials(&ca, Role::Backend, 2),
            manager,
            vec![request(Request::Heartbeats {
                frontend: 0,
                silent_ms: vec![(0, 60_000), (1, 60_000), (2, 60_000)],
            })],
        ),
        ("admin: Install", credentials(&ca, Role::Admin, 0), frontend, vec![empty_install(&before)]),
        (
            "back-end 2: Update with reply_to",
            credentials(&ca, Role::Backend, 2),
            backend0,
            vec![update_with_reply_to],
        ),
    ];
    for (what, transport, addr, frames) in &cases {
        let seen = rt.block_on(send(transport, addr, frames));
        assert!(seen.refused(), "{what}: not refused: {seen:?}");
    }

    // Positive controls: the same helper, with the right certificate, is served.
    let own_hello = rt.block_on(send(&credentials(&ca, Role::Backend, 1), backend0, &[hello_as(1)]));
    assert!(matches!(own_hello, Seen::Answered { closed: false, .. }), "back-end 1 as itself: {own_hello:?}");
    let status = rt.block_on(send(&credentials(&ca, Role::Admin, 0), backend0, &[request(Request::Status)]));
    assert!(
        matches!(&status, Seen::Answered { responses, .. } if matches!(responses.first(), Some(Response::Status(_)))),
        "admin status: {status:?}"
    );

    // Nothing changed: same members in the same states, every range still there, every
    // acknowledged write held on every replica.
    std::thread::sleep(Duration::from_secs(2));
    let after = procs.config().expect("config");
    let members = |c: &ClusterConfig| {
        c.backends.iter().map(|b| (b.node, b.addr.clone(), format!("{:?}", b.state))).collect::<Vec<_>>()
    };
    assert_eq!(members(&after), members(&before), "membership changed");
    assert_eq!(after.ranges.len(), before.ranges.len(), "ranges changed");
    rt.block_on(common::assert_every_write_held(&client, &want, &after));
    let logs = procs.logs(400);
    assert!(logs.contains("native request refused"), "no refusal in the logs:\n{logs}");
    assert!(logs.contains("TLS handshake failed"), "no handshake refusal in the logs:\n{logs}");
}
