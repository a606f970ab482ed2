//! Guards the read bounds of one front-end and one back-end: clients that drip a request a
//! byte at a time (memcached and native, to both roles) are closed once a request takes
//! longer than the request timeout to arrive, while a well-behaved client keeps being served.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::bounds::{closed_by_server, one_of_each};
use common::procs::Procs;
use common::Memcached;
use fawn_proto::native::{encode_frame, Message, Request};

const DRIP_MEMCACHED: usize = 100;
const DRIP_NATIVE_PER_ROLE: usize = 50;
/// Time allowed for one request (memcached) or frame (native) to arrive whole.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1500);
/// One byte per this, per connection.
const DRIP_EVERY: Duration = Duration::from_millis(200);

#[test]
fn slow_drip_clients_are_closed() {
    let timeout_ms = REQUEST_TIMEOUT.as_millis().to_string();
    let procs = Procs::start(one_of_each(
        &["--request-read-timeout-ms", &timeout_ms, "--native-frame-timeout-ms", &timeout_ms],
        &["--native-frame-timeout-ms", &timeout_ms],
    ));
    let mc_addr = procs.frontend_addrs[0].1.clone();
    let mut memcached_request = b"set drip 0 0 64\r\n".to_vec();
    memcached_request.extend_from_slice(&[b'd'; 64]);
    memcached_request.extend_from_slice(b"\r\n");
    let mut native_request = Vec::new();
    let get = Request::Get { epoch: 0, key: vec![b'k'; 64], forwarded: false };
    encode_frame(1, &Message::Request(get), &mut native_request).expect("encode");

    let mut drips: Vec<(TcpStream, &[u8])> = Vec::new();
    for _ in 0..DRIP_MEMCACHED {
        drips.push((TcpStream::connect(&mc_addr).expect("connect"), &memcached_request));
    }
    for addr in [&procs.frontend_addrs[0].0, &procs.backend_addrs[&0]] {
        for _ in 0..DRIP_NATIVE_PER_ROLE {
            drips.push((TcpStream::connect(addr).expect("connect"), &native_request));
        }
    }
    let mut good = Memcached::connect(&mc_addr);
    // Drip for twice the timeout; no request completes meanwhile (each is longer than
    // the bytes dripped), and a well-behaved client is served between drips.
    let started = Instant::now();
    let mut step = 0;
    while started.elapsed() < REQUEST_TIMEOUT * 2 {
        for (stream, request) in drips.iter_mut() {
            let _ = stream.write_all(&request[step..][..1]);
        }
        step += 1;
        assert_eq!(good.set("good", b"v"), "STORED\r\n");
        assert_eq!(good.get("good").as_deref(), Some(&b"v"[..]));
        std::thread::sleep(DRIP_EVERY);
    }
    assert!(step < memcached_request.len().min(native_request.len()), "a dripped request completed");
    let open = drips.iter().filter(|(s, _)| !closed_by_server(s, REQUEST_TIMEOUT)).count();
    assert_eq!(open, 0, "{open} of {} slow-drip connections still open", drips.len());
}
