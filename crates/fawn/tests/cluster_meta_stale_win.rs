//! Guards memcached's win token through the chain: clients on two front-ends race `mg` on an
//! item invalidated with `md I`, and `mg N` on a missing key; because the head decides who
//! wins and stores the mark with the item, exactly one client per round is told `W` and
//! every other one `Z`, whichever front-end it asked.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Barrier};

use common::{Cluster, Shape};

const CLIENTS: usize = 6;
const ROUNDS: usize = 15;

struct Conn {
    r: BufReader<TcpStream>,
}

impl Conn {
    fn new(addr: &str) -> Conn {
        Conn { r: BufReader::new(TcpStream::connect(addr).expect("connect")) }
    }

    fn cmd(&mut self, request: &str) -> String {
        self.r.get_mut().write_all(request.as_bytes()).expect("write");
        let mut line = String::new();
        self.r.read_line(&mut line).expect("read");
        line
    }

    /// `mg <key> v <flags>`: the reply line's flags after the length; the value is read past.
    fn mg(&mut self, key: &str, flags: &str) -> Vec<String> {
        let head = self.cmd(&format!("mg {key} v {flags}\r\n"));
        let fields: Vec<String> = head.split_whitespace().map(str::to_string).collect();
        assert_eq!(fields[0], "VA", "{head:?}");
        let len: usize = fields[1].parse().expect("length");
        let mut value = vec![0u8; len + 2];
        self.r.read_exact(&mut value).expect("value");
        fields[2..].to_vec()
    }
}

/// Whether a reply says won (`W`) or already taken (`Z`); never both, never neither.
fn won(flags: &[String]) -> bool {
    let (w, z) = (flags.iter().any(|f| f == "W"), flags.iter().any(|f| f == "Z"));
    assert!(w != z, "{flags:?}");
    w
}

#[test]
fn one_winner_per_invalidation_and_per_vivify() {
    let cluster = Cluster::start(Shape { frontends: 2, ..Shape::default() });
    let addrs = [cluster.frontend_memcached(0), cluster.frontend_memcached(1)];
    let mut admin = Conn::new(&addrs[0]);
    assert_eq!(admin.cmd("set item 0 0 1\r\na\r\n"), "STORED\r\n");
    // Two barrier waits a round: the round is set up, every client has answered.
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (addr, barrier) = (addrs[c % 2].clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut conn = Conn::new(&addr);
                let mut wins = Vec::new();
                for round in 0..ROUNDS {
                    barrier.wait();
                    let stale = conn.mg("item", "");
                    assert!(stale.iter().any(|f| f == "X"), "{stale:?}");
                    let vivified = conn.mg(&format!("fresh-{round}"), "N30");
                    wins.push((won(&stale), won(&vivified)));
                    barrier.wait();
                }
                wins
            })
        })
        .collect();
    for _ in 0..ROUNDS {
        assert_eq!(admin.cmd("md item I\r\n"), "HD\r\n");
        barrier.wait();
        barrier.wait();
    }
    let wins: Vec<Vec<(bool, bool)>> = clients.into_iter().map(|t| t.join().expect("client")).collect();
    for round in 0..ROUNDS {
        let stale_winners = wins.iter().filter(|w| w[round].0).count();
        let vivify_winners = wins.iter().filter(|w| w[round].1).count();
        assert_eq!((stale_winners, vivify_winners), (1, 1), "round {round}");
    }
    // After the last round the token is taken: a reader on either front-end sees `Z X`.
    for addr in &addrs {
        assert_eq!(Conn::new(addr).mg("item", ""), ["Z", "X"]);
    }
}
