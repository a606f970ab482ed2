//! Guards `fawn up --memcached-auth-file`: every front-end of the cluster requires a login.
//! libmemcached's `memccp`/`memccat` (binary protocol, SASL PLAIN) store and read back a
//! value as the file's user and are refused with a wrong password; a text client is refused
//! before it logs in with memcached's `set` form and served after.
//!
//! Needs libmemcached-tools on the PATH (`scripts/test.sh` installs Debian's package).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Output};

use common::{Cluster, Shape};

const USER: &str = "fawn-user";
const PASSWORD: &str = "s3cret:with-colon";

/// Runs a libmemcached tool against `server` as `user`/`password`.
fn tool(name: &str, server: &str, password: &str, args: &[&str]) -> Output {
    Command::new(name)
        .args([&format!("--servers={server}"), "--binary", "-u", USER, "-p", password])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {name} ({e}); install Debian's libmemcached-tools"))
}

/// One request line and one reply line on a text connection.
fn exchange(conn: &mut BufReader<TcpStream>, request: &str) -> String {
    conn.get_mut().write_all(request.as_bytes()).expect("write");
    let mut line = String::new();
    conn.read_line(&mut line).expect("read");
    line
}

#[test]
fn every_frontend_requires_a_login() {
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users");
    std::fs::write(&users, format!("other:x\n{USER}:{PASSWORD}\n")).expect("user file");
    let value = dir.path().join("greeting");
    std::fs::write(&value, "hello through sasl").expect("value file");
    let args = ["--memcached-auth-file".to_string(), users.display().to_string()];
    let cluster = Cluster::start_with(Shape { frontends: 2, ..Shape::default() }, &args);

    for i in 0..2 {
        let server = cluster.frontend_memcached(i);
        let refused = tool("memccp", &server, "wrong", &[value.to_str().expect("path")]);
        assert!(!refused.status.success(), "front-end {i} took a wrong password: {refused:?}");
        let stored = tool("memccp", &server, PASSWORD, &[value.to_str().expect("path")]);
        assert!(stored.status.success(), "front-end {i}: memccp as {USER}: {stored:?}");
        let read = tool("memccat", &server, PASSWORD, &["greeting"]);
        assert!(read.status.success(), "front-end {i}: memccat as {USER}: {read:?}");
        assert_eq!(String::from_utf8_lossy(&read.stdout).trim_end(), "hello through sasl");

        let stream = TcpStream::connect(&server).expect("connect");
        let mut text = BufReader::new(stream);
        assert_eq!(exchange(&mut text, "get greeting\r\n"), "CLIENT_ERROR unauthenticated\r\n");
        let login = format!("set auth 0 0 {}\r\n{USER} {PASSWORD}\r\n", USER.len() + 1 + PASSWORD.len());
        assert_eq!(exchange(&mut text, &login), "STORED\r\n");
        let header = exchange(&mut text, "get greeting\r\n");
        assert!(header.starts_with("VALUE greeting "), "front-end {i}: {header:?}");
    }
}
