//! Guards read-modify-write semantics through the chain: many memcached clients run `incr`
//! loops and `gets`/`cas` retry loops on the same few keys through two front-ends at once;
//! because the head of each chain decides every update of its range, the final counters are
//! exact (no lost increments, no cas that succeeded twice on one version).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

use common::{Cluster, Shape};

const CLIENTS: usize = 8;
const INCRS_PER_CLIENT: u64 = 150;
const CAS_PER_CLIENT: u64 = 40;

struct Conn {
    r: BufReader<TcpStream>,
}

impl Conn {
    fn new(addr: &str) -> Conn {
        let s = TcpStream::connect(addr).expect("connect");
        Conn { r: BufReader::new(s) }
    }
    fn cmd(&mut self, line: &str) -> String {
        self.r.get_mut().write_all(line.as_bytes()).expect("write");
        let mut l = String::new();
        self.r.read_line(&mut l).expect("read");
        l
    }
    /// `gets key` -> (value, cas)
    fn gets(&mut self, key: &str) -> (u64, u64) {
        let head = self.cmd(&format!("gets {key}\r\n"));
        let parts: Vec<&str> = head.split_whitespace().collect();
        assert_eq!(parts[0], "VALUE", "{head}");
        let cas: u64 = parts[4].parse().expect("cas");
        let mut v = String::new();
        self.r.read_line(&mut v).expect("value");
        let mut end = String::new();
        self.r.read_line(&mut end).expect("end");
        (v.trim_end().parse().expect("number"), cas)
    }
}

#[test]
fn concurrent_incr_and_cas_through_two_frontends_are_exact() {
    let cluster = Cluster::start(Shape { frontends: 2, ..Shape::default() });
    let addrs = [cluster.frontend_memcached(0), cluster.frontend_memcached(1)];
    let mut setup = Conn::new(&addrs[0]);
    for key in ["ctr-a", "ctr-b", "cas-a"] {
        assert_eq!(setup.cmd(&format!("set {key} 0 0 1\r\n0\r\n")), "STORED\r\n");
    }

    let threads: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let addr = addrs[c % 2].clone();
            std::thread::spawn(move || {
                let mut conn = Conn::new(&addr);
                for i in 0..INCRS_PER_CLIENT {
                    let key = if i % 2 == 0 { "ctr-a" } else { "ctr-b" };
                    let reply = conn.cmd(&format!("incr {key} 1\r\n"));
                    assert!(reply.trim_end().parse::<u64>().is_ok(), "incr reply {reply:?}");
                }
                let mut cas_retries = 0u64;
                for _ in 0..CAS_PER_CLIENT {
                    loop {
                        let (v, cas) = conn.gets("cas-a");
                        let next = (v + 1).to_string();
                        let reply = conn.cmd(&format!("cas cas-a 0 0 {} {cas}\r\n{next}\r\n", next.len()));
                        match reply.as_str() {
                            "STORED\r\n" => break,
                            "EXISTS\r\n" => cas_retries += 1,
                            other => panic!("cas reply {other:?}"),
                        }
                    }
                }
                cas_retries
            })
        })
        .collect();
    let retries: u64 = threads.into_iter().map(|t| t.join().expect("client")).sum();

    let mut check = Conn::new(&addrs[1]);
    let per_key = CLIENTS as u64 * INCRS_PER_CLIENT / 2;
    assert_eq!(check.gets("ctr-a").0, per_key);
    assert_eq!(check.gets("ctr-b").0, per_key);
    assert_eq!(check.gets("cas-a").0, CLIENTS as u64 * CAS_PER_CLIENT);
    eprintln!("cas conflicts retried: {retries}");
}
