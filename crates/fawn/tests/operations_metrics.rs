//! Guards docs/OPERATIONS.md's metrics table: every metric a `fawn up --metrics` cluster exposes
//! (manager, back-ends, front-ends, after some traffic) is listed there.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Cluster, Memcached, Shape};

#[test]
fn every_exposed_metric_is_documented() {
    let cluster = Cluster::start_with(Shape::default(), &["--metrics".to_string()]);
    let mut client = Memcached::connect(&format!("127.0.0.1:{}", cluster.memcached_port));
    assert_eq!(client.set("documented", b"value").trim(), "STORED");
    assert_eq!(client.get("documented").as_deref(), Some(&b"value"[..]));

    let addrs = metrics_addrs(&cluster);
    assert!(addrs.len() >= 3, "expected a metrics listener per role, found {addrs:?}");
    let mut names = BTreeSet::new();
    for addr in &addrs {
        names.extend(metric_names(&scrape(addr)));
    }
    for prefix in ["fawn_manager_", "fawn_backend_", "fawn_datastore_", "fawn_frontend_"] {
        assert!(names.iter().any(|n| n.starts_with(prefix)), "no {prefix}* metric in {names:?}");
    }
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/OPERATIONS.md"))
        .expect("read docs/OPERATIONS.md");
    let missing: Vec<&String> = names.iter().filter(|name| !doc.contains(&format!("`{name}`"))).collect();
    assert!(missing.is_empty(), "metrics exposed but not in docs/OPERATIONS.md's table: {missing:?}");
}

/// The `/metrics` addresses the roles logged at start-up.
fn metrics_addrs(cluster: &Cluster) -> Vec<String> {
    let mut addrs = Vec::new();
    for entry in std::fs::read_dir(&cluster.dir).expect("data dir").flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            let log = strip_ansi(&std::fs::read_to_string(&path).unwrap_or_default());
            for line in log.lines().filter(|l| l.contains("metrics at /metrics")) {
                if let Some(addr) = line.split("listen=").nth(1) {
                    addrs.push(addr.trim().to_owned());
                }
            }
        }
    }
    addrs
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn scrape(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let (_head, body) = response.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP body from {addr}"));
    body.to_owned()
}

/// Metric family names: histogram series are folded into their family.
fn metric_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(|name| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix).filter(|family| family.ends_with("_seconds")))
                .unwrap_or(name)
                .to_owned()
        })
        .collect()
}
