//! Guards meta `C` (compare cas) through the chain: clients on two front-ends increment one
//! counter with `ma <key> C<cas>` and append to one item with `ms <key> MA C<cas>`, each
//! retrying on `EX` after reading the cas again with `mg`; because the head decides the
//! compare together with the update, every success is applied exactly once and no stale
//! compare succeeds. A stale `md C` then leaves the item, a current one deletes it.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use common::{Cluster, Shape};

const CLIENTS: usize = 6;
const ROUNDS: usize = 30;

struct Conn {
    r: BufReader<TcpStream>,
}

impl Conn {
    fn new(addr: &str) -> Conn {
        Conn { r: BufReader::new(TcpStream::connect(addr).expect("connect")) }
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.r.read_line(&mut line).expect("read");
        line
    }

    fn cmd(&mut self, request: &str) -> String {
        self.r.get_mut().write_all(request.as_bytes()).expect("write");
        self.line()
    }

    /// `mg <key> c v`: the value and its cas.
    fn read(&mut self, key: &str) -> (String, u64) {
        let head = self.cmd(&format!("mg {key} c v\r\n"));
        let fields: Vec<&str> = head.split_whitespace().collect();
        assert_eq!(fields[0], "VA", "{head:?}");
        let len: usize = fields[1].parse().expect("length");
        let cas = fields[2].strip_prefix('c').and_then(|c| c.parse().ok()).expect("cas flag");
        let mut value = vec![0u8; len + 2];
        self.r.read_exact(&mut value).expect("value");
        value.truncate(len);
        (String::from_utf8(value).expect("utf-8"), cas)
    }

    /// Runs `request(cas)` with the current cas until it is not refused with `EX`; returns
    /// how many times it was.
    fn retry(&mut self, key: &str, request: impl Fn(u64) -> String, success: &str) -> u64 {
        let mut refused = 0;
        loop {
            let (_, cas) = self.read(key);
            match self.cmd(&request(cas)).as_str() {
                "EX\r\n" => refused += 1,
                reply => {
                    assert_eq!(reply, success, "{key}");
                    return refused;
                }
            }
        }
    }
}

#[test]
fn compare_cas_succeeds_once_per_version() {
    let cluster = Cluster::start(Shape { frontends: 2, ..Shape::default() });
    let addrs = [cluster.frontend_memcached(0), cluster.frontend_memcached(1)];
    let mut setup = Conn::new(&addrs[0]);
    assert_eq!(setup.cmd("set ctr 0 0 1\r\n0\r\n"), "STORED\r\n");
    assert_eq!(setup.cmd("set log 0 0 1\r\n>\r\n"), "STORED\r\n");

    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let addr = addrs[c % 2].clone();
            std::thread::spawn(move || {
                let mut conn = Conn::new(&addr);
                let mut refused = 0;
                for _ in 0..ROUNDS {
                    refused += conn.retry("ctr", |cas| format!("ma ctr C{cas}\r\n"), "HD\r\n");
                    refused += conn.retry("log", |cas| format!("ms log 1 MA C{cas}\r\n{c}\r\n"), "HD\r\n");
                }
                refused
            })
        })
        .collect();
    let refused: u64 = clients.into_iter().map(|t| t.join().expect("client")).sum();

    let mut check = Conn::new(&addrs[1]);
    let (ctr, _) = check.read("ctr");
    assert_eq!(ctr.trim_end().parse::<usize>().expect("counter"), CLIENTS * ROUNDS);
    let (log, cas) = check.read("log");
    assert_eq!(log.len(), 1 + CLIENTS * ROUNDS, "{log}");
    for c in 0..CLIENTS {
        let digit = char::from_digit(c as u32, 10).expect("digit");
        assert_eq!(log.matches(digit).count(), ROUNDS, "client {c} in {log}");
    }
    assert_eq!(check.cmd(&format!("md log C{}\r\n", cas + 1)), "EX\r\n");
    assert_eq!(check.cmd(&format!("md log C{cas}\r\n")), "HD\r\n");
    assert_eq!(check.cmd("mg log v\r\n"), "EN\r\n");
    eprintln!("compares refused and retried: {refused}");
}
