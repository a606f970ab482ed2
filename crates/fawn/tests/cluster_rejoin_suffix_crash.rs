//! Guards a rejoin by suffix that is cut short by a crash (rejoin): a suffix is
//! streamed in the source's log order, so a datastore holding part of one is no prefix of the
//! range's history, and asking again for "the records after its last one" could skip keys the
//! first stream had not reached yet. While a suffix is being received the range must not count
//! as a whole replica (its `REPLICA` marker is gone), so a back-end killed mid-suffix copies
//! that range in full when it restarts. 4 back-ends, R = 3, copies paced at 1 MiB/s so the
//! suffixes last seconds; the victim is killed with kill -9 while one is streaming, restarted,
//! and then every acknowledged write must read back and every replica's digest must match.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::procs::{ProcShape, Procs};
use fawn_client::ClientOptions;
use fawn_proto::native::{ClusterConfig, NodeState};
use fawn_ring::Range;

const VICTIM: u32 = 1;
const PRELOAD_KEYS: u32 = 600;
/// Written while the victim is down: ~12 MB, so each of its ranges' suffixes takes seconds.
const NEW_KEYS: u32 = 1500;
const VALUE_BYTES: usize = 8000;

fn value(tag: &str, i: u32) -> Vec<u8> {
    common::padded_value(tag, i, VALUE_BYTES)
}

/// The victim's ranges whose datastore directory exists but has no `REPLICA` marker.
fn unmarked(procs: &Procs, ranges: &[Range]) -> Vec<Range> {
    let root = procs.dir.join(format!("backend-{VICTIM}")).join("ranges");
    ranges
        .iter()
        .filter(|r| {
            let dir = root.join(r.id_string());
            dir.exists() && !dir.join("REPLICA").exists()
        })
        .copied()
        .collect()
}

fn in_every_chain(c: &ClusterConfig, ranges: &[Range]) -> bool {
    c.backends.iter().all(|b| b.state == NodeState::Alive)
        && c.ranges.iter().all(|r| r.syncing.is_empty() && r.chain.len() == 3)
        && ranges.iter().all(|range| c.ranges.iter().any(|r| r.range == *range && r.chain.contains(&VICTIM)))
}

#[test]
fn backend_killed_mid_suffix_copies_that_range_in_full() {
    let pace = ["--copy-rate-mib", "1", "--join-copy-rate-mib", "1"].map(String::from);
    let mut procs = Procs::start(ProcShape {
        backends: 4,
        replicas: 3,
        vnodes: 2,
        backend_args: pace.to_vec(),
        ..ProcShape::default()
    });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let client = rt.block_on(procs.client(ClientOptions::default()));

    let mut want: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    rt.block_on(async {
        for i in 0..PRELOAD_KEYS {
            let (k, v) = (format!("pre-{i}").into_bytes(), value("pre", i));
            client.put(&k, &v).await.expect("preload put");
            want.insert(k, v);
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let before = procs.config().expect("config");
    let victim_ranges: Vec<Range> =
        before.ranges.iter().filter(|rc| rc.chain.contains(&VICTIM)).map(|rc| rc.range).collect();
    assert!(victim_ranges.len() >= 2, "the victim replicates several ranges: {before:?}");

    procs.kill9(VICTIM);
    procs.wait_config("the victim is declared failed", |c| {
        c.backends.iter().any(|b| b.node == VICTIM && b.state == NodeState::Failed)
    });
    rt.block_on(async {
        for i in 0..NEW_KEYS {
            let (k, v) = (format!("new-{i}").into_bytes(), value("new", i));
            client.put(&k, &v).await.expect("put while the victim is down");
            want.insert(k, v);
        }
    });
    assert!(unmarked(&procs, &victim_ranges).is_empty(), "every range of the victim was a whole replica");

    // Restart; kill again as soon as a suffix stream has begun (its range lost its marker).
    procs.restart_backend(VICTIM);
    let deadline = Instant::now() + Duration::from_secs(60);
    let cut_short = loop {
        procs.assert_running();
        let mid = unmarked(&procs, &victim_ranges);
        if !mid.is_empty() {
            break mid;
        }
        assert!(
            Instant::now() < deadline,
            "no range of the restarted victim ever lost its whole-replica marker (a suffix being \
             received must not count as a whole replica)\n{}",
            procs.logs(60)
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    procs.kill9(VICTIM);
    let names: Vec<String> = cut_short.iter().map(|r| r.id_string()).collect();
    eprintln!("killed the victim while receiving the suffix of {names:?}");

    procs.wait_config("the victim is declared failed again", |c| {
        c.backends.iter().any(|b| b.node == VICTIM && b.state == NodeState::Failed)
    });
    procs.restart_backend(VICTIM);
    let after =
        procs.wait_config("the victim is back in every chain it held", |c| in_every_chain(c, &victim_ranges));

    let st = procs.backend_status(VICTIM);
    eprintln!(
        "after the second restart: {} ranges by suffix, {} in full",
        st["syncs_suffix"], st["syncs_full"]
    );
    assert!(
        st["syncs_full"] >= cut_short.len() as u64,
        "the ranges whose suffix was cut short ({names:?}) are copied in full\n{}",
        procs.logs(80)
    );
    rt.block_on(common::assert_every_write_held(&client, &want, &after));
    procs.kill_all();
}
