//! Guards the native wire format (`fawn_proto::native`): every `Message` variant survives
//! `encode_frame` → `decode_frame` unchanged; a partial frame asks for more bytes; a frame of
//! another protocol version, an oversized or undersized length, trailing or damaged body bytes
//! and random garbage are refused with an error (never a panic, never a wrong message).
//! `variant_name` matches every variant without a wildcard, so a new variant does not compile
//! until it is added to `samples`.

use fawn_proto::native::{
    decode_frame, encode_frame, BackendInfo, ChainMsg, ClusterConfig, CommittedNotice, DigestEntry,
    FrameError, FrontendInfo, Message, NodeState, NodeStatus, Origin, OutcomeEntry, RangeConfig, RecordMark,
    ReplEffect, ReqId, Request, Response, SnapshotItem, WireError, FRAME_BYTES_MAX, FRAME_HEADER_BYTES,
    PROTOCOL_VERSION,
};
use fawn_proto::op::{Item, Mutation, Outcome, Update};
use fawn_ring::{KeyId, Range};
use proptest::prelude::*;

fn range() -> Range {
    Range::new(KeyId(7), KeyId(u128::MAX - 3))
}

fn req() -> ReqId {
    ReqId { client: 0xDEAD_BEEF_0000_0001, seq: 42 }
}

fn config() -> ClusterConfig {
    let mut split = RangeConfig::new(Range::new(KeyId(1), KeyId(1 << 100)), vec![3, 1, 2]);
    split.syncing = vec![4];
    split.splitting = Some(KeyId(1 << 90));
    let mut merge = RangeConfig::new(range(), vec![1, 2, 3]);
    merge.merging = Some(KeyId(1 << 64));
    merge.merge_drained = true;
    ClusterConfig {
        epoch: 17,
        replicas: 3,
        vnodes: 2,
        backends: vec![
            BackendInfo { node: 1, addr: "127.0.0.1:7001".into(), state: NodeState::Alive, reason: None },
            BackendInfo { node: 2, addr: "127.0.0.1:7002".into(), state: NodeState::Failed, reason: None },
            BackendInfo { node: 3, addr: "127.0.0.1:7003".into(), state: NodeState::Leaving, reason: None },
            BackendInfo { node: 4, addr: "127.0.0.1:7004".into(), state: NodeState::Left, reason: None },
            BackendInfo {
                node: 5,
                addr: "127.0.0.1:7005".into(),
                state: NodeState::Degraded,
                reason: Some("no space left on device".into()),
            },
        ],
        frontends: vec![FrontendInfo {
            id: 0,
            native_addr: "127.0.0.1:8000".into(),
            memcache_addr: "127.0.0.1:11211".into(),
        }],
        frontends_expected: 1,
        flush_at_micros: 1_700_000_000_000_000,
        formed: true,
        ranges: vec![split, merge],
        wedges: vec![0],
        cluster_id: 0x5eed_c0de,
    }
}

fn update(mutation: Mutation) -> Update {
    Update { key: b"k\0\xff".to_vec(), mutation, value: vec![0xAB; 300], flags: 9, expiry: 1234 }
}

/// One sample of every `Message` variant (and of the enums inside them).
fn samples() -> Vec<Message> {
    let put = ReplEffect::Put { value: b"v".to_vec(), flags: 1, expiry: 2, state: 1 };
    let requests = vec![
        Request::Get { epoch: 1, key: b"key".to_vec(), forwarded: false },
        Request::Update {
            epoch: 2,
            req: req(),
            update: update(Mutation::Set),
            forwarded: true,
            reply_to: Some("127.0.0.1:8000".into()),
            floor: 7,
        },
        Request::Update {
            epoch: 2,
            req: req(),
            update: update(Mutation::Cas { unique: 5 }),
            forwarded: false,
            reply_to: None,
            floor: 0,
        },
        Request::Update {
            epoch: 2,
            req: req(),
            update: update(Mutation::Incr { delta: u64::MAX }),
            forwarded: false,
            reply_to: None,
            floor: 0,
        },
        Request::Update {
            epoch: 2,
            req: req(),
            update: update(Mutation::Delete),
            forwarded: false,
            reply_to: None,
            floor: 0,
        },
        Request::FlushAll { at_unix: 99 },
        Request::ItemStats,
        Request::GetConfig,
        Request::RegisterBackend { node: 7, addr: "[::1]:7007".into(), logs_complete: false },
        Request::SyncDone { node: 7, range: range() },
        Request::Leave { node: 7 },
        Request::RegisterFrontend { id: 1, native_addr: "a".into(), memcache_addr: "b".into() },
        Request::Install { config: config() },
        Request::SetFlush { at_micros: 5 },
        Request::Status,
        Request::RangeDigest { range: range(), after_key: Some(b"m".to_vec()), limit: 1000 },
        Request::Ping,
        Request::Committed {
            notices: vec![
                CommittedNotice {
                    req: req(),
                    outcome: Outcome::Counter { value: 3, cas: 4 },
                    key: b"k".to_vec(),
                },
                CommittedNotice { req: req(), outcome: Outcome::Stored { cas: 5 }, key: b"l".to_vec() },
            ],
        },
        Request::LinkCut { node: 1, peer: 2 },
        Request::TailReady { node: 1, range: range() },
        Request::SplitReady { node: 1, range: range() },
        Request::MergeReady { node: 1, range: range() },
        Request::Heartbeats { frontend: 0, silent_ms: vec![(1, 0), (2, 4_000)] },
        Request::Raft(vec![1, 2, 3]),
        Request::ChangeManagers { id: 4, addr: "127.0.0.1:7004".into(), add: true },
        Request::DiskFault { node: 3, reason: "no space left on device".into() },
        Request::FrontendRefused { frontend: 1 },
        Request::Renew,
    ];
    let responses = vec![
        Response::Get(Some(Item { value: vec![1, 2, 3], flags: 4, expiry: 5, cas: 6, state: 3 })),
        Response::Get(None),
        Response::Update(Outcome::Stored { cas: 8 }),
        Response::Update(Outcome::NotStored),
        Response::Update(Outcome::Exists),
        Response::Update(Outcome::NotFound),
        Response::Update(Outcome::Deleted),
        Response::Update(Outcome::Touched { cas: 1 }),
        Response::Update(Outcome::NonNumeric),
        Response::Ok,
        Response::ItemStats { curr_items: 10, bytes: 20 },
        Response::Config(config()),
        Response::Config(ClusterConfig::default()),
        Response::Status(NodeStatus {
            role: "backend".into(),
            epoch: 3,
            uptime_secs: 60,
            counters: vec![("gets".into(), 1)],
        }),
        Response::Digest(vec![
            DigestEntry { key: b"a".to_vec(), seq: 1, value_crc: Some(0xFFFF_FFFF) },
            DigestEntry { key: b"b".to_vec(), seq: 2, value_crc: None },
        ]),
        Response::Pong,
        Response::Error(WireError::StaleEpoch { current: 9 }),
        Response::Error(WireError::NotLeader { leader: Some("127.0.0.1:7001".into()) }),
        Response::Error(WireError::NotLeader { leader: None }),
        Response::Raft(vec![9, 8]),
        Response::Lease { term: 7, config: config() },
        Response::Error(WireError::WrongNode("node 2".into())),
        Response::Error(WireError::Unavailable("splitting".into())),
        Response::Error(WireError::TooLarge),
        Response::Error(WireError::Storage("disk".into())),
        Response::Error(WireError::Timeout),
        Response::Error(WireError::Invalid("bad".into())),
    ];
    let mark =
        RecordMark { key: b"k".to_vec(), seq: 11, delete: false, value_crc: 12, flags: 13, expiry: 14 };
    let chain = vec![
        ChainMsg::Hello { from: 3, cluster: 0x5eed },
        ChainMsg::SyncRequest { epoch: 4, range: range() },
        ChainMsg::SnapshotBegin { epoch: 4, range: range(), snapshot: 77 },
        ChainMsg::SnapshotBatch {
            range: range(),
            snapshot: 77,
            index: 0,
            records: vec![
                SnapshotItem { seq: 1, key: b"a".to_vec(), effect: put.clone() },
                SnapshotItem { seq: 2, key: b"b".to_vec(), effect: ReplEffect::Delete },
            ],
        },
        ChainMsg::SnapshotEnd {
            epoch: 4,
            range: range(),
            snapshot: 77,
            batches: 1,
            upto_seq: 2,
            dropped_seq_max: 1,
        },
        ChainMsg::CaughtUp { epoch: 4, range: range(), seq: 2 },
        ChainMsg::Replicate {
            epoch: 4,
            range: range(),
            seq: 3,
            prev_seq: 2,
            key: b"c".to_vec(),
            effect: put,
            origin: Some(Origin {
                req: req(),
                outcome: Outcome::Stored { cas: 3 },
                reply_to: Some("fe".into()),
                floor: u64::MAX,
            }),
        },
        ChainMsg::Replicate {
            epoch: 4,
            range: range(),
            seq: 4,
            prev_seq: 3,
            key: b"c".to_vec(),
            effect: ReplEffect::Delete,
            origin: None,
        },
        ChainMsg::Resend { epoch: 4, range: range(), after_seq: 1 },
        ChainMsg::Ack { epoch: 4, range: range(), seq: 4 },
        ChainMsg::SuffixSyncRequest { epoch: 4, range: range(), have_seq: 2, top: mark },
        ChainMsg::SuffixBegin { epoch: 4, range: range(), snapshot: 78, after_seq: 2 },
        ChainMsg::SuffixRefused { epoch: 4, range: range(), reason: "log gap".into() },
        ChainMsg::Outcomes {
            epoch: 4,
            range: range(),
            entries: vec![
                OutcomeEntry { req: req(), seq: 3, outcome: Outcome::Stored { cas: 3 } },
                OutcomeEntry { req: ReqId { client: 9, seq: 1 }, seq: 4, outcome: Outcome::Deleted },
            ],
        },
    ];
    requests
        .into_iter()
        .map(Message::Request)
        .chain(responses.into_iter().map(Message::Response))
        .chain(chain.into_iter().map(Message::Chain))
        .collect()
}

/// The variant of a message; exhaustive, so every new variant must be named here (and then
/// be given a sample, or `every_variant_has_a_sample` fails).
fn variant_name(m: &Message) -> &'static str {
    match m {
        Message::Request(r) => match r {
            Request::Get { .. } => "Get",
            Request::Update { .. } => "Update",
            Request::FlushAll { .. } => "FlushAll",
            Request::ItemStats => "ItemStats",
            Request::GetConfig => "GetConfig",
            Request::RegisterBackend { .. } => "RegisterBackend",
            Request::SyncDone { .. } => "SyncDone",
            Request::Leave { .. } => "Leave",
            Request::RegisterFrontend { .. } => "RegisterFrontend",
            Request::Install { .. } => "Install",
            Request::SetFlush { .. } => "SetFlush",
            Request::Status => "Status",
            Request::RangeDigest { .. } => "RangeDigest",
            Request::Ping => "Ping",
            Request::Committed { .. } => "Committed",
            Request::LinkCut { .. } => "LinkCut",
            Request::TailReady { .. } => "TailReady",
            Request::SplitReady { .. } => "SplitReady",
            Request::MergeReady { .. } => "MergeReady",
            Request::Heartbeats { .. } => "Heartbeats",
            Request::Raft(_) => "Raft",
            Request::ChangeManagers { .. } => "ChangeManagers",
            Request::DiskFault { .. } => "DiskFault",
            Request::FrontendRefused { .. } => "FrontendRefused",
            Request::Renew => "Renew",
        },
        Message::Response(r) => match r {
            Response::Get(_) => "Response::Get",
            Response::Update(_) => "Response::Update",
            Response::Ok => "Response::Ok",
            Response::ItemStats { .. } => "Response::ItemStats",
            Response::Config(_) => "Response::Config",
            Response::Status(_) => "Response::Status",
            Response::Digest(_) => "Response::Digest",
            Response::Pong => "Response::Pong",
            Response::Raft(_) => "Response::Raft",
            Response::Lease { .. } => "Response::Lease",
            Response::Error(e) => match e {
                WireError::StaleEpoch { .. } => "Error::StaleEpoch",
                WireError::WrongNode(_) => "Error::WrongNode",
                WireError::Unavailable(_) => "Error::Unavailable",
                WireError::TooLarge => "Error::TooLarge",
                WireError::Storage(_) => "Error::Storage",
                WireError::Timeout => "Error::Timeout",
                WireError::Invalid(_) => "Error::Invalid",
                WireError::NotLeader { .. } => "Error::NotLeader",
            },
        },
        Message::Chain(c) => match c {
            ChainMsg::Hello { .. } => "Hello",
            ChainMsg::SyncRequest { .. } => "SyncRequest",
            ChainMsg::SnapshotBegin { .. } => "SnapshotBegin",
            ChainMsg::SnapshotBatch { .. } => "SnapshotBatch",
            ChainMsg::SnapshotEnd { .. } => "SnapshotEnd",
            ChainMsg::CaughtUp { .. } => "CaughtUp",
            ChainMsg::Replicate { .. } => "Replicate",
            ChainMsg::Resend { .. } => "Resend",
            ChainMsg::Ack { .. } => "Ack",
            ChainMsg::SuffixSyncRequest { .. } => "SuffixSyncRequest",
            ChainMsg::SuffixBegin { .. } => "SuffixBegin",
            ChainMsg::SuffixRefused { .. } => "SuffixRefused",
            ChainMsg::Outcomes { .. } => "Outcomes",
        },
    }
}

/// Variants `variant_name` knows: 25 requests, 10 responses + 8 errors, 13 chain messages.
const VARIANTS: usize = 25 + 10 + 8 + 13;

fn frame(id: u64, m: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(id, m, &mut out).expect("encode");
    out
}

#[test]
fn every_variant_has_a_sample() {
    let mut names: Vec<&str> = samples().iter().map(variant_name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), VARIANTS, "a variant without a sample: {names:?}");
}

#[test]
fn every_variant_round_trips() {
    for (i, m) in samples().iter().enumerate() {
        let id = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let bytes = frame(id, m);
        assert_eq!(bytes[4], PROTOCOL_VERSION);
        let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        assert_eq!(len + 4, bytes.len(), "{}: length prefix", variant_name(m));
        let (got_id, got, used) = decode_frame(&bytes).expect("decode").expect("a whole frame");
        assert_eq!((got_id, &got, used), (id, m, bytes.len()), "{}", variant_name(m));
    }
}

#[test]
fn frames_back_to_back_decode_in_order() {
    let all = samples();
    let mut stream = Vec::new();
    for (i, m) in all.iter().enumerate() {
        encode_frame(i as u64, m, &mut stream).expect("encode");
    }
    let mut at = 0;
    for (i, m) in all.iter().enumerate() {
        let (id, got, used) = decode_frame(&stream[at..]).expect("decode").expect("whole frame");
        assert_eq!((id, &got), (i as u64, m));
        at += used;
    }
    assert_eq!(at, stream.len());
    assert_eq!(decode_frame(&stream[at..]), Ok(None));
}

#[test]
fn a_partial_frame_asks_for_more() {
    for m in samples() {
        let bytes = frame(1, &m);
        for cut in 0..bytes.len() {
            assert_eq!(decode_frame(&bytes[..cut]), Ok(None), "{} cut at {cut}", variant_name(&m));
        }
    }
}

#[test]
fn another_protocol_version_is_refused() {
    let mut bytes = frame(5, &Message::Request(Request::Ping));
    for v in [0, PROTOCOL_VERSION.wrapping_sub(1), PROTOCOL_VERSION.wrapping_add(1), u8::MAX] {
        bytes[4] = v;
        assert_eq!(decode_frame(&bytes), Err(FrameError::Version(v)));
    }
}

#[test]
fn lengths_outside_the_limits_are_refused() {
    let too_long = (FRAME_BYTES_MAX as u32 + 1).to_le_bytes();
    assert_eq!(decode_frame(&too_long), Err(FrameError::TooLarge(FRAME_BYTES_MAX + 1)));
    assert_eq!(decode_frame(&u32::MAX.to_le_bytes()), Err(FrameError::TooLarge(u32::MAX as usize)));
    for len in 0..(FRAME_HEADER_BYTES as u32 - 4) {
        assert_eq!(decode_frame(&len.to_le_bytes()), Err(FrameError::Short), "length {len}");
    }
    // A body over the limit is refused by the encoder (bincode's size limit stops it).
    let huge = Message::Response(Response::Get(Some(Item {
        value: vec![0; FRAME_BYTES_MAX],
        flags: 0,
        expiry: 0,
        cas: 0,
        state: 0,
    })));
    let mut out = vec![1, 2, 3];
    let refused = encode_frame(0, &huge, &mut out);
    assert!(matches!(refused, Err(FrameError::TooLarge(_) | FrameError::Body(_))));
}

#[test]
fn trailing_and_missing_body_bytes_are_refused() {
    for m in samples() {
        let bytes = frame(2, &m);
        let len = bytes.len() - 4;
        // One byte more inside the frame: the body must use exactly the frame.
        let mut longer = ((len + 1) as u32).to_le_bytes().to_vec();
        longer.extend_from_slice(&bytes[4..]);
        longer.push(0);
        assert!(matches!(decode_frame(&longer), Err(FrameError::Body(_))), "{} + 1 byte", variant_name(&m));
        // One byte less: the body ends early.
        let mut shorter = ((len - 1) as u32).to_le_bytes().to_vec();
        shorter.extend_from_slice(&bytes[4..bytes.len() - 1]);
        assert!(matches!(decode_frame(&shorter), Err(FrameError::Body(_))), "{} - 1 byte", variant_name(&m));
    }
}

#[test]
fn an_unknown_variant_tag_is_refused() {
    // bincode with varints: the first body byte is the `Message` variant index (0..=2).
    let mut bytes = frame(3, &Message::Request(Request::Ping));
    for tag in [3u8, 200] {
        bytes[FRAME_HEADER_BYTES] = tag;
        assert!(matches!(decode_frame(&bytes), Err(FrameError::Body(_))), "tag {tag}");
    }
}

proptest! {
    /// Arbitrary bytes never panic the decoder; whatever it accepts is a whole frame whose
    /// message round-trips. (Not necessarily the same bytes: bincode also accepts integers in
    /// a longer varint form than the encoder writes.)
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(Some((id, m, used))) = decode_frame(&bytes) {
            prop_assert!(used <= bytes.len());
            prop_assert_eq!(decode_frame(&frame(id, &m)).ok().flatten().map(|(_, m, _)| m), Some(m));
        }
    }

    /// A valid header in front of random body bytes: an error or a message, never a panic.
    #[test]
    fn random_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256), id in any::<u64>()) {
        let mut bytes = ((body.len() + 9) as u32).to_le_bytes().to_vec();
        bytes.push(PROTOCOL_VERSION);
        bytes.extend_from_slice(&id.to_le_bytes());
        bytes.extend_from_slice(&body);
        let _ = decode_frame(&bytes);
    }

    /// Damaging one byte of a valid frame: an error, a request for more bytes, or a message
    /// that round-trips (a value byte changed); never a panic.
    #[test]
    fn one_damaged_byte_never_panics(which in 0usize..64, at in any::<prop::sample::Index>(), x in 1u8..=255) {
        let all = samples();
        let m = &all[which % all.len()];
        let mut bytes = frame(9, m);
        let i = at.index(bytes.len());
        bytes[i] ^= x;
        if let Ok(Some((id, got, used))) = decode_frame(&bytes) {
            prop_assert!(used <= bytes.len());
            prop_assert_eq!(decode_frame(&frame(id, &got)).ok().flatten().map(|(_, m, _)| m), Some(got));
        }
    }
}
