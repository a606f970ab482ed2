//! Guards the connection bounds of one front-end and one back-end: 2,000 idle connections
//! (memcached, front-end native, back-end native) leave well-behaved clients served and the
//! processes' memory small; connections past a cap are accepted and refused with a clear
//! message (none waits in the backlog); idle ones are closed after the idle timeout.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::bounds::{closed_by_server, one_of_each, rss_bytes};
use common::procs::Procs;
use common::Memcached;
use fawn_proto::native::{decode_frame, Message, Response, WireError};

const MEMCACHED_IDLE: usize = 800;
const FRONTEND_NATIVE_IDLE: usize = 700;
const BACKEND_NATIVE_IDLE: usize = 500;
const MEMCACHED_CAP: usize = 900;
const NATIVE_CAP: usize = 800;
/// Connections opened past the idle ones on each capped listener.
const EXTRA: usize = 150;
/// Idle timeout of every listener in this test.
/// (Long enough for a loaded machine to open 2,000 connections and check them before it.)
const IDLE: Duration = Duration::from_secs(15);
/// What 2,000 idle connections may cost a role process, beyond its memory before them.
const RSS_GROWTH_MAX_BYTES: u64 = 64 << 20;

fn open(addr: &str, n: usize) -> Vec<TcpStream> {
    (0..n).map(|_| TcpStream::connect(addr).expect("connect")).collect()
}

/// A well-behaved memcached client on a fresh connection: a set and a get answered.
fn served(addr: &str, key: &str) {
    let mut mc = Memcached::connect(addr);
    assert_eq!(mc.set(key, b"value"), "STORED\r\n");
    assert_eq!(mc.get(key).as_deref(), Some(&b"value"[..]));
}

/// What the server sent on `stream` and whether it closed it, without waiting.
fn sent_and_closed(mut stream: &TcpStream) -> (Vec<u8>, bool) {
    stream.set_nonblocking(true).expect("nonblocking");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return (got, false),
            Err(_) => return (got, true),
        }
    }
}

/// Whether the connection got the memcached refusal and was closed.
fn memcached_refused(stream: &TcpStream) -> bool {
    sent_and_closed(stream) == (b"SERVER_ERROR too many open connections\r\n".to_vec(), true)
}

/// Whether the connection got the native refusal frame and was closed.
fn native_refused(stream: &TcpStream) -> bool {
    let (got, closed) = sent_and_closed(stream);
    closed
        && matches!(
            decode_frame(&got),
            Ok(Some((0, Message::Response(Response::Error(WireError::Unavailable(m))), _))) if m.contains("too many")
        )
}

#[test]
fn idle_connections_are_bounded_refused_past_the_cap_and_closed() {
    let idle_ms = IDLE.as_millis().to_string();
    let (idle_secs, mc_cap, native_cap) =
        (IDLE.as_secs().to_string(), MEMCACHED_CAP.to_string(), NATIVE_CAP.to_string());
    let procs = Procs::start(one_of_each(
        &[
            "--idle-timeout-secs",
            &idle_secs,
            "--max-connections",
            &mc_cap,
            "--native-connections-max",
            &native_cap,
            "--native-idle-timeout-ms",
            &idle_ms,
        ],
        &["--native-idle-timeout-ms", &idle_ms],
    ));
    let (fe_native, fe_mc) = procs.frontend_addrs[0].clone();
    let be_native = procs.backend_addrs[&0].clone();
    let (fe_pid, be_pid) =
        (procs.frontend_pid(0).expect("front-end"), procs.backend_pid(0).expect("back-end"));
    served(&fe_mc, "before");
    let (fe_before, be_before) = (rss_bytes(fe_pid), rss_bytes(be_pid));

    let opened = Instant::now();
    let mut idle = open(&fe_mc, MEMCACHED_IDLE);
    eprintln!("memcached: {:?}", opened.elapsed());
    idle.extend(open(&fe_native, FRONTEND_NATIVE_IDLE));
    eprintln!("front-end native: {:?}", opened.elapsed());
    idle.extend(open(&be_native, BACKEND_NATIVE_IDLE));
    eprintln!("opened {} idle connections in {:?}", idle.len(), opened.elapsed());
    // Each listener has accepted them all (the caps are not reached).
    served(&fe_mc, "during");
    eprintln!("served a client {:?} after opening", opened.elapsed());

    let (fe_rss, be_rss) = (rss_bytes(fe_pid), rss_bytes(be_pid));
    eprintln!(
        "rss with {} idle connections: front-end {} -> {} KiB, back-end {} -> {} KiB",
        idle.len(),
        fe_before >> 10,
        fe_rss >> 10,
        be_before >> 10,
        be_rss >> 10
    );
    assert!(fe_rss < fe_before + RSS_GROWTH_MAX_BYTES, "front-end RSS {fe_rss} (before {fe_before})");
    assert!(be_rss < be_before + RSS_GROWTH_MAX_BYTES, "back-end RSS {be_rss} (before {be_before})");

    let open_for = opened.elapsed();
    assert!(open_for < IDLE, "opening took {open_for:?}; the checks above ran after the idle timeout");
    let extra_mc = open(&fe_mc, EXTRA);
    let extra_native = open(&fe_native, EXTRA);
    // Refusals are written at once, accepted connections closed after the idle timeout:
    // after it, every one is closed, and only the refused ones got a message.
    std::thread::sleep(IDLE + Duration::from_millis(500));
    let refused_mc = extra_mc.iter().filter(|s| memcached_refused(s)).count();
    let refused_native = extra_native.iter().filter(|s| native_refused(s)).count();
    // The well-behaved client's connection was closed above (one slot back).
    let free_mc = MEMCACHED_CAP - MEMCACHED_IDLE;
    let free_native = NATIVE_CAP - FRONTEND_NATIVE_IDLE;
    assert!(
        (EXTRA - free_mc..=EXTRA - free_mc + 3).contains(&refused_mc),
        "memcached: {refused_mc} of {EXTRA} refused past the cap, expected about {}",
        EXTRA - free_mc
    );
    assert!(
        (EXTRA - free_native - 3..=EXTRA - free_native + 1).contains(&refused_native),
        "native: {refused_native} of {EXTRA} refused past the cap, expected about {}",
        EXTRA - free_native
    );
    // Past the idle timeout every idle connection is closed by its server.
    for s in &idle {
        s.set_nonblocking(false).expect("blocking");
    }
    let still_open = idle.iter().filter(|s| !closed_by_server(s, IDLE * 3)).count();
    assert_eq!(still_open, 0, "{still_open} idle connections still open after {:?}", IDLE * 3);
    served(&fe_mc, "after");
}
