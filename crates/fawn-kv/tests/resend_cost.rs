//! Measures (ignored by default: it writes 1 M records) what one `Resend` costs the replica
//! asked for it, on a datastore of 1 M records with 100 unacknowledged updates: served from
//! the in-memory unacknowledged list, against the log scan a resend used to make (the
//! datastore's `updates_after`). Prints both; asserts only that the resend sent them all.
//! Run: `cargo test -p fawn-kv --test resend_cost -- --ignored --nocapture`
//! (the dev profile is optimized).

use std::sync::Arc;
use std::time::Instant;

use fawn_ds::{DataStore, Meta, Options};
use fawn_kv::replica::machine::{Action, ClientUpdate, Event, Replica};
use fawn_kv::replica::route::Route;
use fawn_kv::replica::store::ReplicaStore;
use fawn_proto::native::{ChainMsg, RangeConfig, ReqId};
use fawn_proto::op::{Mutation, Update};
use fawn_ring::Range;

const RECORDS: u64 = 1_000_000;
const UNACKED: u64 = 100;

#[test]
#[ignore]
fn one_resend_on_a_million_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = DataStore::open(dir.path(), Options::default()).expect("open");
    let t0 = Instant::now();
    for i in 1..=RECORDS {
        ds.store(format!("key-{i}").as_bytes(), &[b'v'; 100], Meta { seq: i, ..Meta::default() })
            .expect("store");
    }
    println!("wrote {RECORDS} records in {:?}", t0.elapsed());
    let route = Route { epoch: 1, me: 1, rc: RangeConfig::new(Range::full(), vec![1, 2, 3]) };
    let mut head = Replica::new(Arc::new(ds), route);
    let after_seq = head.store().max_seq();
    for i in 0..UNACKED {
        let update = Update {
            key: format!("new-{i}").into(),
            mutation: Mutation::Set,
            value: "v".into(),
            flags: 0,
            expiry: 0,
        };
        let u = ClientUpdate {
            req: ReqId { client: 1, seq: i + 1 },
            update,
            reply_to: None,
            now: 0,
            now_micros: 0,
            flush_at: 0,
            bulk_copy_pending: false,
            floor: 0,
            epoch: 1,
        };
        head.step(Event::Update(u));
    }
    let t = Instant::now();
    let out = head
        .step(Event::Chain { from: 2, msg: ChainMsg::Resend { epoch: 1, range: Range::full(), after_seq } });
    let resend = t.elapsed();
    let sent =
        out.iter().filter(|a| matches!(a, Action::Send { msg: ChainMsg::Replicate { .. }, .. })).count();
    assert_eq!(sent as u64, UNACKED);
    let t = Instant::now();
    let scanned = head.store().updates_after(after_seq).expect("scan");
    let scan = t.elapsed();
    assert_eq!(scanned.len() as u64, UNACKED);
    println!(
        "one resend of {UNACKED} unacknowledged updates on {RECORDS} records: {resend:?}; \
         the log scan it used to make: {scan:?}"
    );
}
