//! Guards the reply budget of one back-end's native listener: 20 native clients that pipeline
//! gets of 1 MiB items straight to the back-end and never read are closed after the write
//! timeout; the back-end's memory stays under a stated bound meanwhile (without the budget
//! each could hold 64 MiB of replies: 1.3 GB); a well-behaved memcached client, whose
//! requests reach the back-end forwarded by its front-end (a share of the budget of their
//! own), keeps being served, 1 MiB gets included.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::bounds::{closed_by_server, one_of_each, RssPeak};
use common::procs::Procs;
use common::{timing_goal, Memcached};
use fawn_proto::native::{encode_frame, Message, Request};

const HOSTILE_NATIVE: usize = 20;
/// Gets of 1 MiB items each hostile client pipelines (64 MiB of replies: a connection's cap).
const GETS_EACH: usize = 64;
/// 1 MiB items the hostile clients ask for.
const ITEMS: usize = 8;
const ITEM_BYTES: usize = fawn_ds::limits::VALUE_BYTES_MAX;
/// The back-end's write timeout in this test.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// Stated bound on the back-end's resident memory while the hostile clients run: its reply
/// budget (512 MiB by default, of which clients' own gets may hold 256 MiB) and a copy of
/// what is being encoded or written, above a baseline of tens of MiB.
const RSS_MAX_BYTES: u64 = 640 << 20;
/// Slowest answer the well-behaved client may get meanwhile (generous for a loaded machine;
/// its requests never wait for the hostile clients' room).
const ANSWERED_WITHIN: Duration = Duration::from_secs(10);
/// All hostile connections are closed within this: four at a time hold the 256 MiB of
/// clients' gets, each for the write timeout after its socket filled.
const HOSTILE_CLOSED_WITHIN: Duration = Duration::from_secs(45);
/// Goal (not a bound) for closing them all, on a machine that is not overloaded.
const HOSTILE_CLOSED_GOAL: Duration = Duration::from_secs(20);

#[test]
fn native_clients_that_never_read_are_closed_and_memory_stays_bounded() {
    let timeout_ms = WRITE_TIMEOUT.as_millis().to_string();
    let procs = Procs::start(one_of_each(&[], &["--native-write-timeout-ms", &timeout_ms]));
    let mc_addr = procs.frontend_addrs[0].1.clone();
    let be_addr = procs.backend_addrs[&0].clone();
    let mut good = Memcached::connect(&mc_addr);
    good.set_timeout(ANSWERED_WITHIN * 2);
    let big = vec![b'x'; ITEM_BYTES];
    let keys: Vec<String> = (0..ITEMS).map(|i| format!("big{i}")).collect();
    for k in &keys {
        assert_eq!(good.set(k, &big), "STORED\r\n");
    }
    let epoch = procs.config().expect("config").epoch;
    let stalls = || procs.backend_status(0).get("native_write_stalls").copied().unwrap_or(0);
    let stalls_before = stalls();
    let be_peak = RssPeak::start(procs.backend_pid(0).expect("back-end"));

    let mut gets = Vec::new();
    for (i, key) in keys.iter().cycle().take(GETS_EACH).enumerate() {
        let get = Request::Get { epoch, key: key.clone().into_bytes(), forwarded: false };
        encode_frame(i as u64 + 1, &Message::Request(get), &mut gets).expect("encode");
    }
    let hostile: Vec<TcpStream> = (0..HOSTILE_NATIVE)
        .map(|_| {
            let mut s = TcpStream::connect(&be_addr).expect("connect");
            s.write_all(&gets).expect("send");
            s
        })
        .collect();

    // The well-behaved client is answered throughout, until the back-end has closed every
    // hostile connection (it counts them: `native_write_stalls`).
    let started = Instant::now();
    let (mut served, mut slowest) = (0u64, Duration::ZERO);
    loop {
        let t = Instant::now();
        let key = format!("small{}", served % 10);
        assert_eq!(good.set(&key, b"v"), "STORED\r\n", "set {served}");
        assert_eq!(good.get(&key).as_deref(), Some(&b"v"[..]), "get {served}");
        if served % 10 == 0 {
            assert_eq!(good.get(&keys[0]).as_deref(), Some(&big[..]), "1 MiB get {served}");
        }
        slowest = slowest.max(t.elapsed());
        assert!(t.elapsed() < ANSWERED_WITHIN, "the well-behaved client waited {:?}", t.elapsed());
        served += 1;
        if served % 10 == 0 {
            let peak = be_peak.peak();
            assert!(peak < RSS_MAX_BYTES, "back-end RSS reached {} MiB", peak >> 20);
            let stalls = stalls() - stalls_before;
            if stalls >= HOSTILE_NATIVE as u64 {
                break;
            }
            assert!(
                started.elapsed() < HOSTILE_CLOSED_WITHIN,
                "{stalls} of {HOSTILE_NATIVE} hostile native connections closed after {:?}",
                started.elapsed()
            );
        }
    }
    let closed_after = started.elapsed();
    let be = be_peak.stop();
    let status = procs.backend_status(0);
    eprintln!(
        "hostile native connections closed after {closed_after:?}; meanwhile the well-behaved \
         client had {served} rounds served, slowest {slowest:?}; back-end peak RSS {} MiB; \
         client-gets waits {}",
        be >> 20,
        status["reply_budget_client_gets_waits"]
    );
    // The server closed them (they see the end of the stream after what it had sent).
    let open = hostile.iter().filter(|s| !closed_by_server(s, Duration::from_secs(10))).count();
    assert_eq!(open, 0, "{open} native clients that never read are still open");
    assert!(be < RSS_MAX_BYTES, "back-end peak RSS {be} bytes");
    // The hostile clients did wait for room, and all of it came back.
    assert!(status["reply_budget_client_gets_waits"] > 0, "{status:?}");
    for share in ["forwarded", "client_gets", "other"] {
        let free = status[&format!("reply_budget_{share}_free_bytes")];
        let size = match share {
            "forwarded" => 3 * 64,
            "client_gets" => 4 * 64,
            _ => 64,
        } << 20;
        // The status request itself holds a little of `other`.
        assert!(
            free + (64 << 10) >= size,
            "share {share}: {free} of {size} bytes free after the hostile clients left"
        );
    }
    timing_goal(
        closed_after < HOSTILE_CLOSED_GOAL,
        &format!("hostile native connections closed within {HOSTILE_CLOSED_GOAL:?} (took {closed_after:?})"),
    );
}
