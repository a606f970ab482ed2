//! Guards rejoin by suffix ("a failed node that comes back with its old data rejoins
//! with only the missing suffix copied where possible"): 4 back-ends, R=3. One back-end is
//! killed with kill -9 after a preload; while it is declared failed, keys are added, some
//! preloaded keys overwritten and deleted — in one range the very key of the victim's last
//! record, which the source then finds only by a scan of its log, not as the key's current
//! version; then, in another of its ranges, its datastore gets an
//! extra record after its last one — an update a head appended and never forwarded before it
//! died. The node restarts on its data directory. It must rejoin every range: the clean ones
//! by a suffix that moves far fewer bytes than a full copy, the one with the uncommitted
//! record by a full copy (the source refuses the suffix); the uncommitted update must not
//! reappear, every acknowledged write is readable, and every replica's digest matches.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::procs::{ProcShape, Procs};
use fawn_client::ClientOptions;
use fawn_ds::{DataStore, Meta, Options};
use fawn_proto::native::NodeState;
use fawn_ring::{key_id, Range};

const VICTIM: u32 = 1;
const PRELOAD_KEYS: u32 = 3000;
const VALUE_BYTES: usize = 500;
const NEW_KEYS: u32 = 60;
/// Preloaded keys overwritten / deleted while the victim is down (low numbers: never the
/// last record of a range, which is among the last keys written).
const CHANGED_KEYS: u32 = 20;

fn value(tag: &str, i: u32) -> Vec<u8> {
    common::padded_value(tag, i, VALUE_BYTES)
}

#[test]
fn restarted_backend_rejoins_by_suffix_and_drops_its_uncommitted_record() {
    let mut procs = Procs::start(ProcShape { backends: 4, replicas: 3, vnodes: 2, ..ProcShape::default() });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let client = rt.block_on(procs.client(ClientOptions::default()));

    // Final expected state: key -> value (None = deleted).
    let mut want: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
    rt.block_on(async {
        for i in 0..PRELOAD_KEYS {
            let (k, v) = (format!("pre-{i}").into_bytes(), value("pre", i));
            client.put(&k, &v).await.expect("preload put");
            want.insert(k, Some(v));
        }
    });
    // Let the last acks reach every replica.
    std::thread::sleep(Duration::from_millis(500));
    let before = procs.config().expect("config");
    let victim_ranges: Vec<Range> =
        before.ranges.iter().filter(|rc| rc.chain.contains(&VICTIM)).map(|rc| rc.range).collect();
    assert!(victim_ranges.len() >= 2, "the victim replicates several ranges: {before:?}");

    // The victim's last record in a second range: the last preloaded key there.
    let overwritten_range = victim_ranges[1];
    let overwritten_key = (0..PRELOAD_KEYS)
        .rev()
        .map(|i| format!("pre-{i}").into_bytes())
        .find(|k| overwritten_range.contains(key_id(k)))
        .expect("a preloaded key in the range");

    procs.kill9(VICTIM);
    procs.wait_config("the victim is declared failed", |c| {
        c.backends.iter().any(|b| b.node == VICTIM && b.state == NodeState::Failed)
    });

    rt.block_on(async {
        for i in 0..NEW_KEYS {
            let (k, v) = (format!("new-{i}").into_bytes(), value("new", i));
            client.put(&k, &v).await.expect("put while the victim is down");
            want.insert(k, Some(v));
        }
        let v = value("overwritten", 0);
        client.put(&overwritten_key, &v).await.expect("overwrite the victim's last record");
        want.insert(overwritten_key.clone(), Some(v));
        for i in 0..CHANGED_KEYS {
            let k = format!("pre-{i}").into_bytes();
            if i % 2 == 0 {
                assert!(client.delete(&k).await.expect("delete"));
                want.insert(k, None);
            } else {
                let v = value("changed", i);
                client.put(&k, &v).await.expect("overwrite");
                want.insert(k, Some(v));
            }
        }
    });

    // An update the victim appended as head and never forwarded: a record after its last one.
    let ghost_range = victim_ranges[0];
    let ghost_key = (0..)
        .map(|n| format!("ghost-{n}").into_bytes())
        .find(|k| ghost_range.contains(key_id(k)))
        .expect("a key in the range");
    {
        let dir = procs.dir.join(format!("backend-{VICTIM}")).join("ranges").join(ghost_range.id_string());
        let ds = DataStore::open(&dir, Options::default()).expect("open the victim's datastore");
        let seq = ds.max_seq() + 1;
        ds.store(&ghost_key, b"never committed", Meta { seq, flags: 0, expiry: 0, state: 0 }).expect("ghost");
        ds.close().expect("close");
    }

    procs.restart_backend(VICTIM);
    let after = procs.wait_config("the victim is back in every chain it held", |c| {
        c.backends.iter().all(|b| b.state == NodeState::Alive)
            && c.ranges.iter().all(|r| r.syncing.is_empty() && r.chain.len() == 3)
            && victim_ranges
                .iter()
                .all(|range| c.ranges.iter().any(|r| r.range == *range && r.chain.contains(&VICTIM)))
    });

    rt.block_on(async {
        assert_eq!(
            client.get(&ghost_key).await.expect("get ghost"),
            None,
            "the uncommitted update reappeared"
        );
        for (k, v) in &want {
            let got = client.get(k).await.expect("get").map(|it| it.value);
            assert_eq!(&got, v, "{}", String::from_utf8_lossy(k));
        }
        let digests = common::agreed_digests(&after).await;
        assert!(!digests[&ghost_range].contains_key(&ghost_key), "the uncommitted record is in the chain");
    });
    // How each range was copied.
    let st = procs.backend_status(VICTIM);
    let (suffix, full) = (st["syncs_suffix"], st["syncs_full"]);
    let (suffix_bytes, full_bytes) = (st["sync_suffix_bytes"], st["sync_full_bytes"]);
    eprintln!(
        "victim ranges {}: {suffix} by suffix ({suffix_bytes} B), {full} in full ({full_bytes} B)",
        victim_ranges.len()
    );
    assert_eq!(full, 1, "only the range with the uncommitted record is copied in full\n{}", procs.logs(80));
    assert_eq!(
        suffix,
        victim_ranges.len() as u64 - 1,
        "every other range rejoins by suffix\n{}",
        procs.logs(80)
    );
    let refusals: u64 = procs.backend_counter_sum("suffix_refusals");
    assert!(refusals >= 1, "the source refused the suffix of the range with the uncommitted record");
    // What a full copy of the suffix-synced ranges would have moved (key + value bytes).
    let full_copy: u64 = want
        .iter()
        .filter(|(k, v)| {
            v.is_some() && victim_ranges.iter().any(|r| *r != ghost_range && r.contains(key_id(k)))
        })
        .map(|(k, v)| (k.len() + v.as_ref().map_or(0, Vec::len)) as u64)
        .sum();
    assert!(
        suffix_bytes * 10 < full_copy,
        "a suffix moved {suffix_bytes} B, a full copy of those ranges is {full_copy} B"
    );

    procs.kill_all();
}
