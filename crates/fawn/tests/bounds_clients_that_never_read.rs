//! Guards the output bounds of one front-end: 200 memcached clients that send multi-gets of
//! 1 MiB items and never read are closed after the write timeout; the front-end's memory
//! stays under a stated bound meanwhile (its fetch budget); a well-behaved client's sets are
//! answered promptly throughout (updates take no room in the fetch budget, so they never queue
//! behind the hostile reads), and it is served again, gets too, once the hostile clients are
//! gone.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::bounds::{closed_by_server, one_of_each, RssPeak};
use common::procs::Procs;
use common::Memcached;

const HOSTILE_MEMCACHED: usize = 200;
/// 1 MiB items the hostile clients ask for.
const ITEMS: usize = 8;
const ITEM_BYTES: usize = fawn_ds::limits::VALUE_BYTES_MAX;
/// The write timeout of both roles in this test.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// The front-end's fetch budget in this test (`--fetch-budget-mib`; the default is larger).
const FETCH_BUDGET_MIB: &str = "128";
/// Stated bound on either role's resident memory while the hostile clients run: the
/// front-end's fetch budget (128 MiB here; values are held once more while being copied into
/// a reply) and the values it caches (8 MiB) above its baseline. Measured: front-end 199–306
/// MiB, back-end 78–144 MiB.
const RSS_MAX_BYTES: u64 = 512 << 20;
/// Slowest answer the well-behaved client's sets may get meanwhile (generous for a loaded
/// machine: they wait behind at most the fetch budget on the front-end's connection to the
/// back-end; measured 0.1–1.4 s).
const SET_ANSWERED_WITHIN: Duration = Duration::from_secs(10);
/// All hostile connections are closed within this: the budget lets 16 of them (8 MiB each)
/// hold replies at a time, each for the write timeout (measured 11–14 s).
const HOSTILE_CLOSED_WITHIN: Duration = Duration::from_secs(45);

#[test]
fn clients_that_never_read_are_closed_and_memory_stays_bounded() {
    let timeout_ms = WRITE_TIMEOUT.as_millis().to_string();
    let procs = Procs::start(one_of_each(
        &[
            "--write-timeout-ms",
            &timeout_ms,
            "--native-write-timeout-ms",
            &timeout_ms,
            "--fetch-budget-mib",
            FETCH_BUDGET_MIB,
        ],
        &["--native-write-timeout-ms", &timeout_ms],
    ));
    let mc_addr = procs.frontend_addrs[0].1.clone();
    let mut good = Memcached::connect(&mc_addr);
    good.set_timeout(SET_ANSWERED_WITHIN * 2);
    let big = vec![b'x'; ITEM_BYTES];
    let keys: Vec<String> = (0..ITEMS).map(|i| format!("big{i}")).collect();
    for k in &keys {
        assert_eq!(good.set(k, &big), "STORED\r\n");
    }
    let connections_before = good.stat("curr_connections").expect("curr_connections");
    let fe_peak = RssPeak::start(procs.frontend_pid(0).expect("front-end"));
    let be_peak = RssPeak::start(procs.backend_pid(0).expect("back-end"));

    let multi_get = format!("get {}\r\n", keys.join(" "));
    let hostile: Vec<TcpStream> = (0..HOSTILE_MEMCACHED)
        .map(|_| {
            let mut s = TcpStream::connect(&mc_addr).expect("connect");
            s.write_all(multi_get.as_bytes()).expect("send");
            s
        })
        .collect();

    // A well-behaved client's sets are answered throughout, until the front-end has closed
    // every hostile connection.
    let started = Instant::now();
    let (mut served, mut slowest) = (0, Duration::ZERO);
    loop {
        let set_started = Instant::now();
        let key = format!("small{}", served % 10);
        assert_eq!(good.set(&key, b"v"), "STORED\r\n", "set {served}");
        slowest = slowest.max(set_started.elapsed());
        assert!(set_started.elapsed() < SET_ANSWERED_WITHIN, "a set took {:?}", set_started.elapsed());
        served += 1;
        if served % 20 == 0 && good.stat("curr_connections") == Some(connections_before) {
            break;
        }
        assert!(
            started.elapsed() < HOSTILE_CLOSED_WITHIN,
            "hostile memcached connections still open after {:?}",
            started.elapsed()
        );
    }
    eprintln!(
        "hostile memcached connections closed after {:?}; meanwhile the well-behaved client had \
         {served} sets stored, slowest {slowest:?}",
        started.elapsed()
    );
    let (fe, be) = (fe_peak.stop(), be_peak.stop());
    eprintln!("peak rss: front-end {} MiB, back-end {} MiB", fe >> 20, be >> 20);
    // The server closed them (they see the end of the stream after what it had sent; reading
    // earlier would have made them readers).
    let within = Duration::from_secs(10);
    let memcached_open = hostile.iter().filter(|s| !closed_by_server(s, within)).count();
    assert_eq!(memcached_open, 0, "{memcached_open} memcached clients that never read are still open");
    assert!(fe < RSS_MAX_BYTES, "front-end peak RSS {fe} bytes");
    assert!(be < RSS_MAX_BYTES, "back-end peak RSS {be} bytes");
    // Once they are gone, the well-behaved client is served again.
    assert_eq!(good.set("after", b"v"), "STORED\r\n");
    assert_eq!(good.get("after").as_deref(), Some(&b"v"[..]));
    assert_eq!(good.get(&keys[0]).as_deref(), Some(&big[..]));
}
